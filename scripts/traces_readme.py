"""Regenerates traces/README.md from the shipped traces themselves.

Run from the repository root: ``.venv/bin/python scripts/traces_readme.py``.
Every figure in the README is read from a trace file or computed by the
profiler's physics check on it.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from tf_grpc_bench import calibration, capture_cpu, trace_files, trace_summary
from tf_grpc_bench.host import CPU_COUNT_EXTRA, CPU_MODEL_EXTRA
from tf_grpc_bench.profiler.metadata import KERNEL_EXTRA
from tf_grpc_bench.profiler.physics import check_physics
from tf_grpc_bench.sizes import SizeCategory

ROOT = Path(__file__).resolve().parent.parent
HEADER = """# Shipped traces

Real traces captured on a 2-core machine without GPU (each table names its processor) by `tf-grpc-bench capture`
(the recorder each used is in its table), one process per TensorFlow task on localhost, synthetic input images, 2 ps +
2 workers (+ the chief for TF2), synchronous training, batch 4 per worker. Message sizes follow the models'
parameters, not the image size, so small images give faithful traffic on a CPU. `tf-grpc-bench replay` with no
argument replays `resnet50-tf2ps`. All were made by
[`scripts/capture_shipped_traces.sh`](../scripts/capture_shipped_traces.sh) (a name ending in a CPU model, such as
`resnet50-tf2ps-intel-xeon`, is the same job captured on that CPU by `--other-cpu`); this file by
`scripts/traces_readme.py`. Each names its capture machine (CPU model, count, kernel) and how busy its cores were over
its steps ("capture CPU").
Each records its compute calibration (a local training step of its model, timed on the capture machine before its
training): a replay on another machine scales the trace's compute by its own step over that one, so a shipped trace
predicts training on the machine that replays it (`--compute auto`, the default; `--compute recorded` keeps the
capture machine's compute; [docs/fidelity.md](../docs/fidelity.md), "Compute from another machine").

Inspect one with `tf-grpc-bench inspect resnet50-tf2ps` (a shipped trace's name or any trace file's path).

"""


def _calibration(extra: tuple[tuple[str, str], ...]) -> str:
    recorded = calibration.from_extra(extra)
    if recorded is None:
        return "not recorded"
    line = calibration.calibration_line(extra).removeprefix("compute calibration: ")
    line = line.split(" (a replay on another machine")[0]
    if not recorded.parts:
        line += (
            " (one process, the whole step: captured before calibrations timed the job's "
            "workers at once, by kind of work)"
        )
    return line


def _capture_cpu(extra: tuple[tuple[str, str], ...]) -> str:
    recorded = capture_cpu.from_extra(extra)
    return (
        "not recorded (captured before captures recorded it)"
        if recorded is None
        else recorded.text()
    )


def describe(path: Path) -> str:
    trace = trace_files.read_trace(path)
    meta = trace.metadata
    steps = trace.steps
    summaries = [trace_summary.summarize_rpcs(step.rpcs) for step in steps]
    first = summaries[0]
    categories = dict(first.category_counts)
    report = check_physics(trace)
    step_ms = statistics.median(step.duration_ns for step in steps) / 1e6
    extra = dict(meta.extra)
    machine = (
        f"{extra.get(CPU_MODEL_EXTRA) or 'not recorded'}, {extra.get(CPU_COUNT_EXTRA) or '?'} CPUs"
    )
    lines = [
        f"## {path.stem}",
        "",
        "```sh",
        " ".join(meta.command),
        "```",
        "",
        "| | |",
        "|---|---|",
        f"| model | {meta.model}, {meta.trainable_parameters:,} trainable parameters |",
        f"| setup | {meta.strategy}, {'synchronous' if meta.synchronous else 'asynchronous'}, "
        f"TensorFlow {meta.tensorflow_version}, input {'x'.join(map(str, meta.input_shape))} |",
        f"| tasks | {', '.join(f'{t.job}:{t.index}' for t in trace.tasks)} |",
        f"| recorder | `{meta.capture_method}` |",
        f"| captured on | {machine}, kernel {extra.get(KERNEL_EXTRA) or 'not recorded'}, "
        f"{meta.created_utc} |",
        f"| compute calibration | {_calibration(meta.extra)} |",
        f"| capture CPU | {_capture_cpu(meta.extra)} |",
        f"| steady steps | {len(steps)} (start-up: {len(trace.startup.rpcs)} RPCs, kept apart) |",
        f"| per step | {first.rpc_count} RPCs ({', '.join(f'{m} {c}' for m, c in first.rpcs_per_method)}), "
        f"{first.request_bytes:,} B requests, {first.response_bytes:,} B responses |",
        f"| size categories per step | small {categories[SizeCategory.SMALL]}, medium "
        f"{categories[SizeCategory.MEDIUM]}, large {categories[SizeCategory.LARGE]} |",
        f"| step time during capture | {step_ms:.0f} ms (median) |",
        f"| file | {path.stat().st_size:,} B |",
        "",
        "Physics check (`tf_grpc_bench.profiler.physics.check_physics`): tensor bytes moved per step against "
        "2 x trainable bytes x workers, and every trainable variable crossing once each way per worker:",
        "",
        "```",
        report.format(),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    order = [
        "resnet50-tf2ps",
        "inceptionv3-tf2ps",
        "vgg16-tf2ps",
        "alexnet-tf2ps",
        "resnet50-tf1ps",
    ]
    # Then the same jobs captured on other CPU models (capture_shipped_traces.sh --other-cpu).
    shipped = {name.removesuffix(trace_files.SUFFIX) for name in trace_files.shipped_trace_names()}
    order += sorted(shipped - set(order))
    sections = [describe(trace_files.shipped_trace_path(name)) for name in order]
    notes = """## Reading the physics figures

"Other tensors" are tensors that are not trainable variables: batch-normalisation moving statistics (read by the
workers, updated on the ps), the step counter and the loss. They are why ResNet-50 and Inception-v3 move 0.1-0.2%
more than 2 x parameters x 4 B x workers; models without batch normalisation (VGG-16, AlexNet) match to a few
hundred bytes.
"""
    (ROOT / "traces" / "README.md").write_text(HEADER + "\n".join(sections) + notes)


if __name__ == "__main__":
    main()
