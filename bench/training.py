"""Training the fidelity benches set predictions against: the same job uncaptured and captured.

bench/fidelity.py (its own-machine and cross-machine modes), bench/calibration.py
and bench/scaling.py run real distributed training with these: ``train_uncaptured``
(the launcher's job with no recorder, ``python -m tf_grpc_bench.profiler.uncaptured``)
and ``capture``/``capture_job`` (``tf-grpc-bench capture``), on an emulated link or
loopback, with the job's shape as both take it (``job_arguments``); then what a
capture did with the machine and its captured critical path (``capture_facts``),
training's round (``round_seconds``) and the link's bound (``link_bound_seconds``).
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import stop_process, tf_grpc_bench_command

from tf_grpc_bench import capture_cpu, trace_files
from tf_grpc_bench.capture_cpu import CaptureCpu
from tf_grpc_bench.critical_path import (
    CapturedSegment,
    captured_critical_paths,
    captured_path_segments,
)
from tf_grpc_bench.dependencies import is_sync_token, source_op
from tf_grpc_bench.errors import TraceError
from tf_grpc_bench.netns.links import parse_profile
from tf_grpc_bench.trace import Rpc, Trace


@dataclass(frozen=True, slots=True, kw_only=True)
class Uncaptured:
    """Training with no recorder (``python -m tf_grpc_bench.profiler.uncaptured``): the same
    launcher, tasks and link as the capture, its rounds timed by its own step markers."""

    round_s: float
    #: The job's tasks' CPU seconds per round (None: not sampled).
    tasks_cpu_per_round_s: float | None
    rounds: int
    #: Its steady rounds, in order (() where only the median is known).
    rounds_s: tuple[float, ...] = ()

    @property
    def each_round_s(self) -> tuple[float, ...]:
        """Its rounds, or its median alone where they are not known."""
        return self.rounds_s or (self.round_s,)


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureFacts:
    """What one capture's training did with the machine (docs/fidelity.md, Limits)."""

    link: str
    round_s: float
    #: The trace's capture CPU (``capture_cpu``), None where it records none.
    cpu: CaptureCpu | None
    #: The job's tasks' CPU seconds per round.
    tasks_cpu_per_round_s: float | None
    #: Means over the worker-steps of the captured critical path (``inspect``'s).
    path_compute_s: float | None
    path_communication_s: float | None
    #: Of ``path_compute_s``, the time one of the worker's own sends (a tensor it answered
    #: with: a gradient the ps pulled) was leaving it: compute or the link's queue.
    path_compute_sending_s: float | None = None
    #: Of ``path_compute_s``, the stretches right before the worker's pull of TF1's sync
    #: token (``sync_token_q``), which a ps gives only once every worker's gradients reached
    #: it and were applied: under the sync-token rule the ps's apply after the round's last
    #: gradient (the wait for the other workers is communication).
    path_compute_before_token_s: float | None = None
    #: The same training with no recorder, run beside the capture (just before or after it).
    uncaptured: Uncaptured | None = None


def run(command: list[str]) -> str:
    """Run one capture, training or comparison, and return what it printed; stopped
    (Ctrl-C, SIGTERM, SIGHUP), stop it too, so that it tears down its training tasks and
    namespaces instead of outliving us."""
    print("+", " ".join(command), file=sys.stderr, flush=True)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        stop_process(process, timeout_s=120.0)
        raise
    if process.returncode != 0:
        raise SystemExit(f"failed ({process.returncode}): {stderr.strip()[-2000:]}")
    return stdout


def capture(
    model: str,
    setup: str,
    steps: int,
    output: Path,
    profile: str | None,
    *,
    workers: int = 2,
    ps: int = 2,
    prefix: tuple[str, ...] = (),
) -> Trace:
    """Capture ``model`` (on ``profile``'s link, or loopback); ``prefix`` starts the command
    (``bench/calibration.py``: inside a CPU cgroup)."""
    shape = job_arguments(model, setup, steps, workers=workers, ps=ps)
    return capture_job(shape, output, profile, prefix=prefix)


def capture_job(
    shape: list[str], output: Path, profile: str | None, *, prefix: tuple[str, ...] = ()
) -> Trace:
    """Capture the job of ``shape`` (``job_arguments``) on ``profile``'s link, or loopback."""
    command = [
        *prefix,
        *tf_grpc_bench_command("capture", *shape, "--output", str(output), "--quiet"),
    ]
    if profile is not None:
        command += ["--network", profile]
    run(command)
    return trace_files.read_trace(output)


def job_arguments(
    model: str,
    setup: str,
    steps: int,
    *,
    workers: int = 2,
    ps: int = 2,
    batch_size: int = 4,
    input_size: int = 32,
) -> list[str]:
    """The job's shape as ``capture`` and ``profiler.uncaptured`` both take it."""
    return [
        "--model", model, "--setup", setup, "--ps", str(ps), "--workers", str(workers),
        "--steps", str(steps), "--warmup-steps", "2", "--batch-size", str(batch_size),
        "--input-size", str(input_size),
    ]  # fmt: skip


def train_uncaptured(
    arguments: list[str], profile: str | None, *, prefix: tuple[str, ...] = ()
) -> Uncaptured:
    """Run the job of ``arguments`` (``job_arguments``) with no recorder, on ``profile``'s
    link (None: loopback), as ``capture`` would place it; its median steady round."""
    command = [*prefix, sys.executable, "-m", "tf_grpc_bench.profiler.uncaptured", *arguments]
    if profile is not None:
        command += ["--network", profile]
    printed = json.loads(run(command).strip().splitlines()[-1])
    return Uncaptured(
        round_s=printed["round_ns"] / 1e9,
        tasks_cpu_per_round_s=printed.get("tasks_cpu_per_round_s"),
        rounds=len(printed["rounds_ns"]),
        rounds_s=tuple(ns / 1e9 for ns in printed["rounds_ns"]),
    )


def capture_facts(trace: Trace, link: str, uncaptured: Uncaptured | None = None) -> CaptureFacts:
    """What ``trace``'s capture (on ``link``) did with the machine, and its captured path;
    ``uncaptured`` is the same training run with no recorder."""
    cpu = capture_cpu.from_extra(trace.metadata.extra)
    per_round = None
    if cpu is not None and trace.steps:
        per_round = cpu.tasks_cores * cpu.span_ns / 1e9 / len(trace.steps)
    try:
        paths = [path for _, _, path in captured_critical_paths(trace)]
        segmented = captured_path_segments(trace)
    except TraceError:
        paths, segmented = [], []
    sending = [
        _overlap_ns(
            [(seg.start_ns, seg.end_ns) for seg in segments if seg.rpc_index < 0],
            _sends_of(trace.steps[number].rpcs, worker),
        )
        for number, worker, segments in segmented
    ]
    before_token = [
        _compute_before_token_ns(trace.steps[number].rpcs, segments)
        for number, _, segments in segmented
    ]
    compute = statistics.mean(p.compute_ns for p in paths) / 1e9 if paths else None
    communication = statistics.mean(p.communication_ns for p in paths) / 1e9 if paths else None
    return CaptureFacts(
        link=link,
        round_s=round_seconds(trace),
        cpu=cpu,
        tasks_cpu_per_round_s=per_round,
        path_compute_s=compute,
        path_communication_s=communication,
        path_compute_sending_s=statistics.mean(sending) / 1e9 if sending else None,
        path_compute_before_token_s=statistics.mean(before_token) / 1e9 if before_token else None,
        uncaptured=uncaptured,
    )


def _compute_before_token_ns(rpcs: tuple[Rpc, ...], segments: tuple[CapturedSegment, ...]) -> int:
    """The compute stretches of a captured path that lead straight into a pull of TF1's sync
    token."""
    total = 0
    for before, after in itertools.pairwise(segments):
        if before.rpc_index < 0 <= after.rpc_index:
            tensor = rpcs[after.rpc_index].tensor
            if tensor is not None and is_sync_token(source_op(tensor.edge_name)):
                total += before.end_ns - before.start_ns
    return total


def _sends_of(rpcs: tuple[Rpc, ...], task: int) -> list[tuple[int, int]]:
    """When ``task``'s answers were leaving it: response start to arrival of every call
    it answered with data (a tensor pulled from it)."""
    return [
        (rpc.response_start_ns, rpc.end_ns)
        for rpc in rpcs
        if rpc.callee_task == task and rpc.response_bytes > 0 and rpc.end_ns > rpc.response_start_ns
    ]


def _overlap_ns(spans: list[tuple[int, int]], others: list[tuple[int, int]]) -> int:
    """How much of ``spans`` (disjoint) the union of ``others`` covers."""
    merged: list[list[int]] = []
    for start, end in sorted(others):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(
        max(0, min(end, stop) - max(start, begin)) for start, end in spans for begin, stop in merged
    )


def round_seconds(trace: Trace) -> float:
    return statistics.median(rounds_seconds(trace))


def rounds_seconds(trace: Trace) -> tuple[float, ...]:
    """A capture's rounds (its trace's steps), in order."""
    return tuple(step.duration_ns / 1e9 for step in trace.steps)


def link_bound_seconds(trace: Trace, profile: str) -> float | None:
    """The heavier direction's tensor bytes of a round (ps host <-> worker host) over the
    rate, plus twice the link's one-way delay (a round's weights cross to the workers,
    then its gradients back: at least one crossing each); None without either."""
    link = parse_profile(profile)
    rate, delay_s = link.rate_bits_per_s, 2 * link.delay_ns / 1e9
    if rate is None:
        return delay_s or None
    ps = set(trace.tasks_of_job("ps"))
    down, up = [], []
    for step in trace.steps:
        to_workers = to_ps = 0
        for rpc in step.rpcs:
            caller_on_ps, callee_on_ps = rpc.caller_task in ps, rpc.callee_task in ps
            if caller_on_ps == callee_on_ps:
                continue  # same host
            # The response travels from the callee's host to the caller's, the request back.
            if callee_on_ps:
                to_workers += rpc.response_bytes
                to_ps += rpc.request_bytes
            else:
                to_ps += rpc.response_bytes
                to_workers += rpc.request_bytes
        down.append(to_workers)
        up.append(to_ps)
    return max(statistics.median(down), statistics.median(up)) * 8 / rate + delay_s


# --------------------------------------------------------------------------
# Repeated runs of one side: pooled, and how far apart they were.

#: How far from 1 a fidelity ratio is judged (issue 42: within 5% of uncaptured training).
JUDGED = 0.05


@dataclass(frozen=True, slots=True)
class Runs:
    """Repeated runs of one side of a comparison (training uncaptured or captured, the same
    job on the same link): each run's rounds, in the order the runs were made."""

    rounds_s: tuple[tuple[float, ...], ...]

    @property
    def median_s(self) -> float:
        """The pooled estimate: the median of every run's rounds together (each run weighs
        by its rounds, and one run's slow stretch moves it less than a median of medians)."""
        return statistics.median(itertools.chain.from_iterable(self.rounds_s))

    @property
    def medians_s(self) -> tuple[float, ...]:
        return tuple(statistics.median(rounds) for rounds in self.rounds_s)

    @property
    def spread(self) -> float | None:
        """How far the runs' medians were apart: the largest over the smallest, less 1
        (None with one run)."""
        medians = self.medians_s
        return max(medians) / min(medians) - 1 if len(medians) > 1 else None

    @property
    def moved(self) -> bool:
        """Its runs' medians were further apart than the 5% a ratio is judged by: one pair's
        ratio cannot tell a prediction's error from the reference's own spread."""
        return self.spread is not None and self.spread > JUDGED

    @property
    def rounds_spreads(self) -> tuple[float | None, ...]:
        """Each run's spread within itself (``rounds_spread``)."""
        return tuple(rounds_spread(rounds) for rounds in self.rounds_s)


def rounds_spread(rounds_s: Sequence[float]) -> float | None:
    """One run's rounds' interquartile range over their median (None under 4 rounds)."""
    if len(rounds_s) < 4:
        return None
    low, _, high = statistics.quantiles(rounds_s, n=4, method="inclusive")
    return (high - low) / statistics.median(rounds_s)


def uncaptured_runs(runs: Sequence[Uncaptured]) -> Runs:
    return Runs(tuple(run.each_round_s for run in runs))


def pooled_uncaptured(runs: Sequence[Uncaptured]) -> Uncaptured:
    """Uncaptured runs of the same job on the same link as one: the median of their rounds
    pooled (``Runs.median_s``), the mean of their tasks' CPU per round."""
    cpu = [run.tasks_cpu_per_round_s for run in runs if run.tasks_cpu_per_round_s is not None]
    return Uncaptured(
        round_s=uncaptured_runs(runs).median_s,
        tasks_cpu_per_round_s=statistics.mean(cpu) if cpu else None,
        rounds=sum(run.rounds for run in runs),
        rounds_s=tuple(itertools.chain.from_iterable(run.each_round_s for run in runs)),
    )


def percent(spread: float | None) -> str:
    return "-" if spread is None else f"{spread:.1%}"
