"""How the replay scales with workers and ps, and what a larger cluster's step is on a link.

Issue 13, item 3.  Two tables, written into the ``## Scaling`` section of
``docs/scaling.md`` (the page that explains them):

1. **Loopback.**  The shipped ResNet-50 trace as a what-if
   (``replay resnet50-tf2ps --workers W --ps P --benchmark ps-throughput``,
   communication only by default: ``--compute none``) for every W of
   ``--loopback-workers`` (1, 2, 4) and P of ``--loopback-ps`` (1, 2): RPCs/s,
   MB/s, the replayed step, and the CPU the replay used: cores per worker
   process, per ps process, and in all against the machine's cores.  A row is
   marked CPU-bound when the replay's processes together keep at least
   ``CPU_BOUND_SHARE`` of the cores busy, or a single process (one Python
   interpreter, one GIL) at least ``PROCESS_BOUND_CORES`` of a core.  Every
   row for each K of ``--loopback-procs`` (1, 2): client processes per worker
   (``--procs-per-worker K``).
2. **A ps server's memory**: one ``tf-grpc-bench serve`` process holding every
   variable while ``--memory-workers`` (1, 2, 4) what-if workers replay one pass
   against it: its resident memory once listening and at its peak (VmHWM).
3. **What-if on emulated links** (root: network namespaces).  The same trace at
   ``--sweep-workers`` (2, 4, 8) workers and ``--sweep-ps`` (2) ps across each
   of ``--profiles`` (1gbit, 5gbit), with ``network compare`` (ps on one
   emulated host, workers on another): the predicted step (dependencies pacing,
   compute kept), the link's bound (the heavier direction's bytes of the
   derived round over the rate) and the replay's CPU; next to it, for the W of
   ``--training-workers`` (2, 4), real training of the same job
   (``capture --model resnet50 --setup tf2-ps --ps 2 --workers W --network
   PROFILE``, ``bench/fidelity.py``'s runner) and the ratio.

Usage: ``sudo .venv/bin/python bench/scaling.py`` (the second table needs root
and the profiler extra; ``--no-links`` runs only the first).  A reduced run to
check the script: ``sudo .venv/bin/python bench/scaling.py --loopback-workers 1
--loopback-ps 1 --duration 3 --sweep-workers 2 --profiles 5gbit
--training-workers '' --sweep-steps 2 --no-readme``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    LOOPBACK,
    ROOT,
    command_line,
    free_port,
    load_average,
    machine_line,
    stop_process,
    table_head,
    table_row,
    tf_grpc_bench_command,
    wait_listening,
    write_section,
)
from fidelity import Prediction, predict
from training import capture, link_bound_seconds, round_seconds

from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.core.whatif import WhatIf, derive_trace
from tf_grpc_bench.units import format_seconds

SECTION = "## Scaling"
TRACE = "resnet50-tf2ps"
MODEL = "resnet50"
#: Share of the machine's cores the replay's processes may use before a row is CPU-bound.
CPU_BOUND_SHARE = 0.85
#: Cores one process (one interpreter) may use before it is its own bound.
PROCESS_BOUND_CORES = 0.9


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopbackRow:
    workers: int
    ps: int
    #: Client processes per worker (``--procs-per-worker``).
    procs: int
    rpcs_per_s: float
    mb_per_s: float
    step_s: float | None
    #: Cores used per client process and per ps process (averages), and by all of them.
    worker_cores: float
    ps_cores: float
    total_cores: float
    cpu_count: int

    @property
    def cpu_bound(self) -> str:
        """Why the row is CPU-bound ("" if it is not)."""
        if self.cpu_count and self.total_cores >= CPU_BOUND_SHARE * self.cpu_count:
            return f"machine ({self.total_cores:.2f} of {self.cpu_count} cores)"
        if max(self.worker_cores, self.ps_cores) >= PROCESS_BOUND_CORES:
            which = "client" if self.worker_cores >= self.ps_cores else "ps"
            return f"one {which} process ({max(self.worker_cores, self.ps_cores):.2f} core)"
        return ""


def loopback_row(document: dict[str, Any], workers: int, ps: int, procs: int = 1) -> LoopbackRow:
    """A row from a what-if replay's result document (JSON as written)."""
    (benchmark,) = document["benchmarks"]
    stats = benchmark["statistics"]
    parameters = benchmark.get("parameters") or {}
    clients = int(parameters.get("client_processes") or workers * procs)
    client = stats.get("client_cpu_utilization") or 0.0
    server = stats.get("server_cpu_utilization") or 0.0
    prediction = stats.get("prediction") or {}
    step_ns = prediction.get("step_ns")
    if step_ns is None:
        step_ns = (stats.get("step_time_ns") or {}).get("p50_ns")
    return LoopbackRow(
        workers=workers,
        ps=ps,
        procs=procs,
        rpcs_per_s=stats.get("rpcs_per_s") or 0.0,
        mb_per_s=stats.get("bandwidth_mb_per_s") or 0.0,
        step_s=None if step_ns is None else step_ns / 1e9,
        worker_cores=client / clients,
        ps_cores=server / ps,
        total_cores=client + server,
        cpu_count=int(document["machine"]["cpu_count"]),
    )


def run_replay(arguments: list[str], output_dir: Path) -> dict[str, Any]:
    """One ``tf-grpc-bench replay`` into ``output_dir``; its result document."""
    command = tf_grpc_bench_command(
        "replay", *arguments, "--quiet", "--output-dir", str(output_dir)
    )
    print("+", " ".join(command), file=sys.stderr, flush=True)
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"failed ({completed.returncode}): {completed.stderr.strip()[-2000:]}")
    (path,) = sorted(output_dir.rglob("results.json"))
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def measure_loopback(args: argparse.Namespace, scratch: Path) -> list[LoopbackRow]:
    rows = []
    for ps in _counts(args.loopback_ps):
        for workers in _counts(args.loopback_workers):
            for procs in _counts(args.loopback_procs):
                folder = scratch / f"loopback-{workers}w{ps}ps{procs}k"
                document = run_replay(
                    [
                        TRACE, "--workers", str(workers), "--ps", str(ps),
                        "--procs-per-worker", str(procs),
                        "--benchmark", "ps-throughput", "--compute", args.compute,
                        "--warmup", str(args.warmup), "--duration", str(args.duration),
                        "--runs", "1",
                    ],
                    folder,
                )  # fmt: skip
                rows.append(loopback_row(document, workers, ps, procs))
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRow:
    """One ps server process (``tf-grpc-bench serve``) serving W workers' what-if replay."""

    workers: int
    #: Resident memory once listening, and its peak (VmHWM) after the replay, in bytes.
    idle_bytes: int
    peak_bytes: int
    threads: int
    #: Bytes the server received in the replay's one measured pass.
    received_bytes: int


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _kib(value: str) -> int:
    return int(value.split()[0]) * 1024


def measure_server_memory(workers: int, scratch: Path) -> MemoryRow:
    """Peak memory of one ps server while W what-if workers replay one pass against it."""
    port = free_port()
    server = subprocess.Popen(
        tf_grpc_bench_command("serve", "--port", str(port), "--host", LOOPBACK),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, server, timeout_s=60.0)
        idle = _kib(_status(server.pid)["VmRSS"])
        document = run_replay(
            [
                TRACE, "--workers", str(workers), "--ps", "1", "--benchmark", "ps-throughput",
                "--compute", "none", "--passes", "1", "--warmup", "0", "--runs", "1",
                "--target", f"{LOOPBACK}:{port}",
            ],
            scratch / f"memory-{workers}w",
        )  # fmt: skip
        status = _status(server.pid)
        (benchmark,) = document["benchmarks"]
        received = sum(run["server_received_bytes"] for run in benchmark["runs"])
        return MemoryRow(
            workers=workers,
            idle_bytes=idle,
            peak_bytes=_kib(status["VmHWM"]),
            threads=int(status["Threads"]),
            received_bytes=received,
        )
    finally:
        stop_process(server)


def memory_table(rows: list[MemoryRow]) -> list[str]:
    lines = [
        f"One ps server process (`tf-grpc-bench serve`) holding every variable of {TRACE} while W "
        "what-if workers replay one pass (5 steps, `--compute none`) against it: resident memory "
        "once listening, its peak (VmHWM), threads after the pass, and what it received.",
        "",
        *table_head("workers", "idle RSS", "peak RSS", "peak - idle", "threads", "received"),
    ]
    for row in rows:
        lines.append(
            table_row(
                str(row.workers),
                f"{row.idle_bytes / 2**20:.0f} MiB",
                f"{row.peak_bytes / 2**20:.0f} MiB",
                f"{(row.peak_bytes - row.idle_bytes) / 2**20:.0f} MiB",
                str(row.threads),
                f"{row.received_bytes / 1e9:.2f} GB",
            )
        )
    return lines


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkRow:
    profile: str
    workers: int
    ps: int
    link_bound_s: float | None
    replay: Prediction | None
    #: Real training's median round on the link (None: not run at this size).
    training_s: float | None


def measure_links(args: argparse.Namespace, scratch: Path, logdir: Path) -> list[LinkRow]:
    trace_path = trace_files.shipped_trace_path(TRACE)
    trace = trace_files.read_trace(trace_path)
    training_sizes = set(_counts(args.training_workers))
    rows = []
    for profile in args.profiles.split(","):
        for workers in _counts(args.sweep_workers):
            derived = derive_trace(trace, WhatIf(workers=workers, ps=args.sweep_ps))
            replay = predict(
                trace_path,
                profile,
                logdir / f"{profile}-{workers}w{args.sweep_ps}ps",
                length=("--steps", str(args.sweep_steps)),
                extra=("--workers", str(workers), "--ps", str(args.sweep_ps)),
            )
            training = None
            if workers in training_sizes:
                trained = capture(
                    MODEL,
                    "tf2-ps",
                    args.training_steps,
                    scratch / f"training-{profile}-{workers}w.tfgbtrace",
                    profile,
                    workers=workers,
                    ps=args.sweep_ps,
                )
                training = round_seconds(trained)
            rows.append(
                LinkRow(
                    profile=profile,
                    workers=workers,
                    ps=args.sweep_ps,
                    link_bound_s=link_bound_seconds(derived, profile),
                    replay=replay,
                    training_s=training,
                )
            )
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def loopback_table(rows: list[LoopbackRow], compute: str) -> list[str]:
    lines = [
        f"Loopback: the shipped {TRACE} trace as a what-if of W workers and P ps, PS throughput, "
        f"`--compute {compute}`, K client processes per worker (`--procs-per-worker K`). Cores: "
        "CPU time over the run's wall time, per client process and "
        "per ps process (averages) and for all of them; CPU-bound: the replay's processes keep "
        f">= {CPU_BOUND_SHARE:.0%} of the machine's cores busy, or one process >= "
        f"{PROCESS_BOUND_CORES} of a core (one interpreter).",
        "",
        *table_head(
            "workers", "ps", "K", "RPCs/s", "MB/s", "replayed step", "cores / client",
            "cores / ps", "cores in all", "CPU-bound",
        ),
    ]  # fmt: skip
    for row in rows:
        lines.append(
            table_row(
                str(row.workers),
                str(row.ps),
                str(row.procs),
                f"{row.rpcs_per_s:,.0f}",
                f"{row.mb_per_s:,.0f}",
                format_seconds(row.step_s),
                f"{row.worker_cores:.2f}",
                f"{row.ps_cores:.2f}",
                f"{row.total_cores:.2f} of {row.cpu_count}",
                row.cpu_bound or "no",
            )
        )
    return lines


def links_table(rows: list[LinkRow]) -> list[str]:
    lines = [
        f"What-if on emulated links: the {TRACE} trace (captured with 2 workers and 2 ps) replayed "
        "as W workers and P ps across the link (`network compare`: ps on one emulated host, "
        "workers on the other), predicted step (dependencies pacing, compute kept); the link's "
        "bound is the heavier direction's bytes of the derived round over the rate. Training: "
        "real tf2-ps training of the same model with W workers and P ps on the same link "
        "(median steady round).",
        "",
        *table_head(
            "link", "workers", "ps", "link bound", "what-if replay", "replay cores",
            "training round", "replay / training",
        ),
    ]  # fmt: skip
    for row in rows:
        replay = row.replay
        ratio = "-"
        if replay is not None and row.training_s:
            ratio = f"{replay.step_s / row.training_s:.2f}"
        lines.append(
            table_row(
                row.profile,
                str(row.workers),
                str(row.ps),
                format_seconds(row.link_bound_s),
                "failed" if replay is None else format_seconds(replay.step_s),
                "-" if replay is None else f"{replay.cpu_cores:.2f}",
                format_seconds(row.training_s),
                ratio,
            )
        )
    return lines


def report(
    loopback: list[LoopbackRow],
    memory: list[MemoryRow],
    links: list[LinkRow],
    *,
    compute: str,
    command: str,
    before: str,
    after: str,
) -> str:
    lines = [SECTION, "", f"`{command}`", "", machine_line(before, after), ""]
    if loopback:
        lines += [*loopback_table(loopback, compute), ""]
    if memory:
        lines += [*memory_table(memory), ""]
    if links:
        lines += [*links_table(links), ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loopback-workers", default="1,2,4")
    parser.add_argument("--loopback-ps", default="1,2")
    parser.add_argument("--loopback-procs", default="1,2", help="client processes per worker")
    parser.add_argument("--compute", default="none", help="loopback replays' --compute")
    parser.add_argument("--warmup", type=float, default=2.0, help="loopback warm-up seconds")
    parser.add_argument("--duration", type=float, default=10.0, help="loopback seconds per run")
    parser.add_argument("--memory-workers", default="1,2,4", help="'' to skip server memory")
    parser.add_argument("--no-links", action="store_true", help="skip the emulated links")
    parser.add_argument("--profiles", default="1gbit,5gbit")
    parser.add_argument("--sweep-workers", default="2,4,8")
    parser.add_argument("--sweep-ps", type=int, default=2)
    parser.add_argument("--sweep-steps", type=int, default=4, help="replayed steps per worker")
    parser.add_argument("--training-workers", default="2,4", help="'' for no training")
    parser.add_argument("--training-steps", type=int, default=8, help="steady training rounds")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument("--logdir", default="runs/scaling", help="where the link replays go")
    args = parser.parse_args()
    if not args.no_links and os.geteuid() != 0:
        raise SystemExit("the emulated links need root (or give --no-links)")
    command = command_line("bench/scaling.py", sys.argv[1:])
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="tfgb-scaling-") as scratch:
        loopback = measure_loopback(args, Path(scratch))
        memory = [measure_server_memory(w, Path(scratch)) for w in _counts(args.memory_workers)]
        links = [] if args.no_links else measure_links(args, Path(scratch), Path(args.logdir))
    body = report(
        loopback,
        memory,
        links,
        compute=args.compute,
        command=command,
        before=before,
        after=load_average(),
    )
    print(body)
    if not args.no_readme:
        write_section(ROOT / "docs" / "scaling.md", SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
