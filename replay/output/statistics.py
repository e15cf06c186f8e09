"""Figures derived from raw measurements: per-run rates, latency summaries, CPU use.  Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tf_grpc_bench.replay.core.measurement import (
    BenchmarkResult,
    CallSample,
    LatencySummary,
    RunMeasurement,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStatistics:
    """Figures of one measured run."""

    run_index: int
    rpc_count: int
    duration_ns: int
    rpcs_per_s: float
    #: Request plus response bytes per second.
    bytes_per_s: float
    #: MB (10**6 bytes) per second.
    bandwidth_mb_per_s: float
    latency: LatencySummary
    step_time: LatencySummary
    client_cpu_ns: int
    server_cpu_ns: int
    partial: bool


def run_statistics(run: RunMeasurement) -> RunStatistics:
    """The per-run figures ``BenchmarkResult`` averages over runs."""
    seconds = run.duration_ns / 1e9
    moved = run.request_bytes + run.response_bytes
    return RunStatistics(
        run_index=run.run_index,
        rpc_count=run.rpc_count,
        duration_ns=run.duration_ns,
        rpcs_per_s=run.rpc_count / seconds if seconds else math.nan,
        bytes_per_s=moved / seconds if seconds else math.nan,
        bandwidth_mb_per_s=moved / seconds / 1e6 if seconds else math.nan,
        latency=LatencySummary.from_samples([s.latency_ns for s in run.samples]),
        step_time=LatencySummary.from_samples(run.step_times_ns),
        client_cpu_ns=run.client_cpu_ns,
        server_cpu_ns=run.server_cpu_ns,
        partial=run.partial,
    )


def cpu_utilization(cpu_ns: int, result: BenchmarkResult) -> float:
    """CPU time over measured wall time (1.0 = one core busy all run); NaN if no time."""
    wall_ns = sum(run.duration_ns for run in result.runs)
    return cpu_ns / wall_ns if wall_ns else math.nan


def calls_in_flight(samples: Sequence[CallSample]) -> list[int]:
    """For each sample of one run, how many of the run's calls (every worker's) were open
    when it was issued, itself included: issued at or before its start and not yet
    answered (a call answered at exactly that instant is no longer open)."""
    starts = np.sort(np.asarray([s.start_ns for s in samples], dtype=np.int64))
    ends = np.sort(np.asarray([s.start_ns + s.latency_ns for s in samples], dtype=np.int64))
    return [
        max(
            1,
            int(np.searchsorted(starts, s.start_ns, side="right"))
            - int(np.searchsorted(ends, s.start_ns, side="right")),
        )
        for s in samples
    ]


def median_in_flight(result: BenchmarkResult) -> float:
    """The median, over every measured call of every run, of ``calls_in_flight``; NaN
    without calls.  1 for a benchmark that makes one call at a time."""
    counts = [count for run in result.runs for count in calls_in_flight(run.samples)]
    return float(np.median(counts)) if counts else math.nan
