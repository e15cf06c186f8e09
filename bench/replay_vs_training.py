"""Does the replay keep up with TensorFlow?  Capture a training job, replay its trace, in one run.

Replay keeps up with TensorFlow (docs/design.md#figures-the-project-holds-itself-to):
a captured ResNet-50 step replayed on loopback should take no longer than
TensorFlow's own C++ runtime took to move the same tensors.
This script, in one run and on one machine:

1. captures real distributed training (``tf-grpc-bench capture``, default
   ResNet-50, tf2-ps, 2 ps + 2 workers, synchronous) and takes the median
   steady step time TensorFlow needed (compute included: the step time is
   an upper bound of what TensorFlow spent moving the tensors);
2. replays that trace's PS-throughput benchmark (``tf-grpc-bench replay
   --benchmark ps-throughput``: every worker process replays its per-step
   RPCs against the ps server processes, as fast as possible) and takes the
   median replayed step time;
3. prints both, their ratio, and the load, and rewrites the
   ``## Replay against training`` section of ``docs/performance.md``.

Usage: ``.venv/bin/python bench/replay_vs_training.py [--model resnet50] [--no-readme]``
(needs the profiler extra: ``pip install -e '.[profiler]'``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import (
    ROOT,
    command_line,
    load_average,
    tf_grpc_bench_command,
    utc_minute,
    write_section,
)

from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.output import document as results_module
from tf_grpc_bench.replay.output.document_reader import read_document

SECTION = "## Replay against training"


def run(argv: list[str]) -> None:
    print("+", shlex.join(argv), flush=True)
    subprocess.run(argv, check=True)


def load() -> str:
    return load_average(digits=1, separator=" ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--input-size", default="32")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    loads = [load()]
    with tempfile.TemporaryDirectory(prefix="tfgb-vs-training-") as scratch:
        trace_path = Path(scratch) / "captured.tfgbtrace"
        capture = tf_grpc_bench_command(
            "capture",
            "--model",
            args.model,
            "--setup",
            "tf2-ps",
            "--ps",
            "2",
            "--workers",
            "2",
            "--steps",
            str(args.steps),
            "--batch-size",
            "4",
            "--input-size",
            args.input_size,
            "--output",
            str(trace_path),
            "--quiet",
        )
        run(capture)
        loads.append(load())
        trace = trace_files.read_trace(trace_path)
        training_ms = statistics.median(step.duration_ns for step in trace.steps) / 1e6
        step_bytes = statistics.median(
            sum(r.request_bytes + r.response_bytes for r in step.rpcs) for step in trace.steps
        )
        replay = tf_grpc_bench_command(
            "replay",
            str(trace_path),
            "--benchmark",
            "ps-throughput",
            # As fast as possible, communication only: what the section compares.
            "--pacing",
            "asap",
            "--duration",
            str(args.duration),
            "--runs",
            str(args.runs),
            "--warmup",
            "1",
            "--output-dir",
            str(Path(scratch) / "runs"),
            "--quiet",
        )
        run(replay)
        loads.append(load())
        document_path = next((Path(scratch) / "runs").glob(f"*/{results_module.RESULTS_FILE_NAME}"))
        document = read_document(document_path)
        result = next(r for r in document.benchmarks if r.benchmark is Benchmark.PS_THROUGHPUT)
        replay_ms = statistics.median(result.step_times_ns) / 1e6
    ratio = replay_ms / training_ms
    print(f"TensorFlow step (compute + communication): {training_ms:.0f} ms")
    print(f"replayed step (communication only):        {replay_ms:.0f} ms  ratio {ratio:.2f}")
    section = "\n".join(
        [
            SECTION,
            "",
            "Written by `bench/replay_vs_training.py`: in one run, real distributed training is "
            "captured and its trace replayed through the PS-throughput benchmark (every worker a "
            "process replaying its per-step RPCs against the ps server processes, as fast as "
            "possible). TensorFlow's step time includes compute, so it bounds from above what "
            "TensorFlow spent moving the tensors; the target is a replayed step no longer "
            "than that.",
            "",
            "```sh",
            command_line(__file__, sys.argv[1:]),
            "```",
            "",
            f"Run {utc_minute()}, "
            f"{os.cpu_count()} CPUs, load average before / after capture / after replay: "
            f"{' | '.join(loads)}.",
            "",
            "| | median step | |",
            "|---|---|---|",
            f"| TensorFlow training, {args.model} tf2-ps 2 ps + 2 workers, batch 4 "
            f"({len(trace.steps)} steps) | {training_ms:.0f} ms "
            f"| {step_bytes / 1e6:.1f} MB per step on the wire |",
            f"| replay of its trace, PS throughput ({len(result.step_times_ns)} steps over "
            f"{args.runs} runs) | {replay_ms:.0f} ms | {ratio:.2f} x TensorFlow's step |",
            "",
            "Both sides share the same cores: during the replay, 2 worker processes and 2 ps "
            "server processes; during training, 5 TensorFlow processes and the recording proxy.",
            "",
        ]
    )
    if not args.no_readme:
        write_section(ROOT / "docs" / "performance.md", SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
