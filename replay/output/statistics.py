"""Figures derived from raw measurements: per-run rates, latency summaries, CPU use.  Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tf_grpc_bench.replay.core.measurement import (
    BenchmarkResult,
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
