"""Training as users run it: the launcher's job with no recorder, its rounds timed by its own log.

    python -m tf_grpc_bench.profiler.uncaptured --model resnet50 --setup tf2-ps --ps 2 \\
        --workers 2 --steps 10 --batch-size 4 --input-size 32 --network 5gbit

runs the same job ``tf-grpc-bench capture`` runs (``launch.job.TrainingJob``,
the same tasks, placement and emulated hosts), but with nothing loaded into
its tasks: no recorder library, no proxy, no trace.  Its rounds are timed by
the training's own step log: the driving tasks' step markers (one ``write`` of
a JSON line per step, done by the training loop itself; the launcher reads the
file ten times a second, as it does under capture).  The tasks' CPU is sampled
from outside (``cpu_sampler``, ``/proc``: nothing is sent to the tasks), so the
CPU-seconds a round costs each task can be set against a capture's
(``capture_cpu`` in its trace).

Prints one JSON object (``UncapturedRun.as_json``): the steady rounds, their
median, the machine's and each task's CPU over them, the CPU model.  This is
what bench/fidelity.py and bench/capture_overhead.py compare a capture and a
replay's prediction with: training with no capture's cost in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tf_grpc_bench import host, lifetime
from tf_grpc_bench.capture_cpu import CaptureCpu
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.profiler.assembly.steps import step_windows
from tf_grpc_bench.profiler.cpu_sampler import CpuSampler, summarize
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.hosts import (
    NetworkRequest,
    TaskHosts,
    check_network_allowed,
    emulated_hosts,
)
from tf_grpc_bench.profiler.launch.job import TrainingJob
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.launch.plan import TaskSpec, plan_tasks

#: Longest a job may run, start-up included (as ``capture --timeout`` would stop it).
DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True, kw_only=True)
class UncapturedRun:
    """One uncaptured run: its steady rounds (a synchronous step of every worker, as a
    capture's trace has them) and the CPU its tasks used over them."""

    config: TrainingConfig
    #: The link profile the tasks ran on (None: loopback, one host).
    network: str | None
    rounds_ns: tuple[int, ...]
    #: The machine's and each task's CPU over the steady rounds (None: not sampled).
    cpu: CaptureCpu | None
    cpu_model: str
    #: CPU seconds this process (the launcher: its polling of the step markers and task
    #: processes, the CPU sampler) used from the job's start to its end.
    launcher_cpu_s: float | None = None

    @property
    def round_ns(self) -> int:
        """The median steady round."""
        return int(statistics.median(self.rounds_ns))

    def task_cpu_per_round_s(self) -> dict[str, float]:
        """Each task's CPU seconds per steady round."""
        if self.cpu is None or not self.rounds_ns:
            return {}
        seconds = self.cpu.span_ns / 1e9
        return {name: cores * seconds / len(self.rounds_ns) for name, cores in self.cpu.task_cores}

    def as_json(self) -> dict[str, Any]:
        per_task = self.task_cpu_per_round_s()
        return {
            "model": self.config.model,
            "setup": self.config.setup,
            "ps": self.config.ps,
            "workers": self.config.workers,
            "network": self.network,
            "rounds_ns": list(self.rounds_ns),
            "round_ns": self.round_ns if self.rounds_ns else None,
            "task_cpu_per_round_s": {name: round(value, 4) for name, value in per_task.items()},
            "tasks_cpu_per_round_s": round(sum(per_task.values()), 4) if per_task else None,
            "busy_cores": None if self.cpu is None else round(self.cpu.busy_cores, 3),
            "cores": None if self.cpu is None else self.cpu.cores,
            "cpu_model": self.cpu_model,
            "launcher_cpu_s": None
            if self.launcher_cpu_s is None
            else round(self.launcher_cpu_s, 4),
        }


def steady_rounds(markers: Sequence[StepMarker]) -> tuple[int, ...]:
    """The steady rounds of a job's step markers, in order: each step number's span, from
    its earliest start to its latest end (the windows a capture's trace steps are)."""
    return tuple(window.end_ns - window.start_ns for window in step_windows(markers))


@contextlib.contextmanager
def _placed(
    config: TrainingConfig, network: NetworkRequest | None
) -> Iterator[tuple[list[TaskSpec], TaskHosts | None]]:
    """The job's tasks, on emulated hosts of ``network`` (built for the block) or loopback."""
    planned = plan_tasks(config)
    if network is None:
        yield planned, None
        return
    check_network_allowed("preload")
    with emulated_hosts(network, [task.key for task in planned]) as hosts:
        placed = [
            dataclasses.replace(
                task, advertised_address=f"{hosts.address(task.key)}:{task.bind_port}"
            )
            for task in planned
        ]
        yield placed, hosts


def train_uncaptured(
    config: TrainingConfig,
    *,
    network: NetworkRequest | None = None,
    workdir: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> UncapturedRun:
    """Run ``config`` with no recorder (on ``network``'s emulated hosts, placed as a capture
    places them) to its end, and time its steady rounds from its step markers.

    CaptureError when the job fails or hangs (every task is stopped first);
    NetworkError without root for ``network``.
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tfgb-train-")))
        tasks, hosts = stack.enter_context(_placed(config, network))
        prefixes = None if hosts is None else {task.key: hosts.prefix(task.key) for task in tasks}
        job = stack.enter_context(TrainingJob(config, tasks, workdir, prefixes=prefixes))
        sampler = CpuSampler(lambda: {f"{job_}:{i}": pid for (job_, i), pid in job.pids().items()})
        own_begin = time.process_time()
        job.start()
        sampler.start()
        try:
            outcome = job.wait(timeout_s)
        finally:
            sampler.stop()
        launcher_cpu_s = time.process_time() - own_begin
        markers = [marker for marker in outcome.markers if marker.phase == "steady"]
        windows = [(w.start_ns, w.end_ns) for w in step_windows(markers)]
        names = [task.name for task in tasks]
        return UncapturedRun(
            config=config,
            network=None if network is None else network.profile.name,
            rounds_ns=steady_rounds(markers),
            cpu=summarize(sampler.samples, windows, names),
            cpu_model=host.cpu_model(),
            launcher_cpu_s=launcher_cpu_s,
        )


def _arguments(argv: Sequence[str] | None) -> Any:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tf_grpc_bench.profiler.uncaptured",
        description="Run the launcher's training job with no recorder; time its rounds "
        "(one JSON line).",
    )
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--setup", default="tf2-ps")
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="steady steps per worker")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--input-size", type=int, default=None)
    parser.add_argument("--keras", default=None)
    parser.add_argument("--network", default=None, metavar="PROFILE")
    parser.add_argument("--layout", default="ps-together")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from tf_grpc_bench.cli import quiet_grpc_core

    args = _arguments(argv)
    # The tasks' environment as under ``tf-grpc-bench capture``, less the recorder's.
    quiet_grpc_core()
    try:
        config = TrainingConfig(
            model=args.model,
            setup=args.setup,
            ps=args.ps,
            workers=args.workers,
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            batch_size=args.batch_size,
            input_size=args.input_size,
            keras_flavour=args.keras,
        )
        network = None if args.network is None else NetworkRequest.parse(args.network, args.layout)
        with lifetime.interrupt_on_signals():
            run = train_uncaptured(config, network=network, timeout_s=args.timeout)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return int(error.exit_code)
    except KeyboardInterrupt as stopped:
        signum = lifetime.signal_of(stopped)
        print(f"interrupted ({lifetime.signal_name(signum)})", file=sys.stderr)
        return int(lifetime.exit_status(signum))
    print(json.dumps(run.as_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
