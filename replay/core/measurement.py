"""What a benchmark run measured: raw samples, and the statistics derived from them.

This is the contract between the drivers (which fill ``RunMeasurement``) and
the outputs (JSON results, TensorBoard, terminal table), which only read
``BenchmarkResult``.  Pure data and arithmetic: no gRPC, no clocks, no IO.

Units live in names: ``*_ns`` nanoseconds, ``*_bytes`` bytes, ``*_per_s``
per second.  Bandwidth is reported in MB/s with MB = 10**6 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from tf_grpc_bench.replay.core.named import OpenName
from tf_grpc_bench.sizes import SizeCategory, classify


class Benchmark(OpenName):
    """A benchmark's name: the paper's three, and any other a ``core.benchmarks`` row
    registers (what each one does is its row, ``benchmarks.spec_of``)."""

    __slots__ = ()
    P2P_LATENCY: ClassVar[Benchmark]
    P2P_BANDWIDTH: ClassVar[Benchmark]
    PS_THROUGHPUT: ClassVar[Benchmark]


Benchmark.P2P_LATENCY = Benchmark.define("p2p-latency")
Benchmark.P2P_BANDWIDTH = Benchmark.define("p2p-bandwidth")
Benchmark.PS_THROUGHPUT = Benchmark.define("ps-throughput")


#: Percentiles reported for every latency distribution (p99.9 as 99.9).
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSample:
    """One completed RPC as a client saw it.

    ``start_ns`` is relative to the start of the measured run; ``latency_ns``
    runs from the call being issued to its response fully received.
    ``payload_bytes`` is the size of the message carrying the payload (the
    larger of request and response), which decides the size category.
    """

    start_ns: int
    latency_ns: int
    request_bytes: int
    response_bytes: int
    payload_bytes: int
    #: Index of the ps (server) the call went to.
    server_index: int = 0
    #: Index of the worker (client process) that made the call.
    worker_index: int = 0
    #: Replayed training step the call belongs to; -1 for synthetic workloads.
    step: int = -1
    #: How late the call was issued after its planned release (schedule
    #: fidelity); 0 under closed-loop pacing, which plans no release times.
    release_lag_ns: int = 0
    #: Trace replays: index of the replayed RPC in its trace step's ``rpcs``
    #: (which tensor, which tasks, which method); -1 for synthetic workloads.
    rpc_index: int = -1
    #: 1 when the in-flight window held the call back: after its planned release the
    #: window refused a due call, and the completion that opened it again came after
    #: the release (``release_held``; the same rule in both engines).  Its lag is then
    #: the link's, not the machine's.  0 otherwise, and in documents before format 9.
    window_held: int = 0

    def __post_init__(self) -> None:
        if self.latency_ns < 0:
            raise ValueError(f"latency_ns must be >= 0, got {self.latency_ns}")


#: The fields of a CallSample, in the order raw sample tables (result
#: documents, arrays passed between processes) store them.
SAMPLE_COLUMNS = (
    "start_ns",
    "latency_ns",
    "request_bytes",
    "response_bytes",
    "payload_bytes",
    "server_index",
    "worker_index",
    "step",
    "release_lag_ns",
    "rpc_index",
    "window_held",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMeasurement:
    """One measured run (the paper averages 5) of one benchmark."""

    run_index: int
    #: Wall time of the measured part of the run (warm-up excluded).
    duration_ns: int
    samples: tuple[CallSample, ...]
    #: For trace-driven runs: wall time of each replayed step, in order (under
    #: dependencies pacing: from a step's begin to the next one's, the compute kept).
    step_times_ns: tuple[int, ...] = ()
    #: Dependencies pacing: compute kept on each step's critical path, parallel to
    #: ``step_times_ns`` (the rest of the step is communication); else empty.
    step_compute_ns: tuple[int, ...] = ()
    #: CPU time (user + system) spent by the client processes during the run.
    client_cpu_ns: int = 0
    #: CPU time spent by the server processes during the run (0 if unknown,
    #: e.g. a remote server that does not report it).
    server_cpu_ns: int = 0
    #: Bytes and messages the server(s) reported receiving during the run,
    #: used to check that what was sent arrived (-1 when not reported).
    server_received_bytes: int = -1
    server_received_messages: int = -1
    #: The whole machine's CPU time over the run, every core and every process
    #: (``/proc/stat``, in its ticks): busy, and busy plus idle.  0 when unknown.
    machine_cpu_busy_ticks: int = 0
    machine_cpu_total_ticks: int = 0
    #: True when the run stopped early (server gone, deadline); see ``partial_reason``.
    partial: bool = False
    partial_reason: str = ""

    @property
    def rpc_count(self) -> int:
        return len(self.samples)

    @property
    def request_bytes(self) -> int:
        return sum(s.request_bytes for s in self.samples)

    @property
    def response_bytes(self) -> int:
        return sum(s.response_bytes for s in self.samples)


def release_held(release_ns: int | None, held_until_ns: int) -> int:
    """Whether a call planned for ``release_ns`` (None: no planned release) was held
    back by the in-flight window: 1 when the window's last opening after refusing a due
    call came at or after the release (``held_until_ns``: the end of the completion
    that opened it, -1 when it never refused), else 0.  Both engines apply this rule."""
    return int(release_ns is not None and release_ns <= held_until_ns)


def in_link_time(run: RunMeasurement, time_dilation: float) -> RunMeasurement:
    """``run``, measured ``time_dilation`` times slower than the training it predicts,
    in that training's time: every duration divided by the dilation.

    CPU times are divided too, so a share of the cores (CPU over wall time) reads
    as measured; the machine's tick counts, a ratio, stay.  Byte and call counts
    are not time and stay.  A dilation of 1 returns ``run`` itself.
    """
    if time_dilation == 1:
        return run
    if not time_dilation > 1:
        raise ValueError(f"time dilation must be >= 1, got {time_dilation}")

    def scaled(ns: int) -> int:
        return round(ns / time_dilation)

    samples = tuple(
        replace(
            sample,
            start_ns=scaled(sample.start_ns),
            latency_ns=scaled(sample.latency_ns),
            release_lag_ns=scaled(sample.release_lag_ns),
        )
        for sample in run.samples
    )
    return replace(
        run,
        duration_ns=scaled(run.duration_ns),
        samples=samples,
        step_times_ns=tuple(scaled(t) for t in run.step_times_ns),
        step_compute_ns=tuple(scaled(t) for t in run.step_compute_ns),
        client_cpu_ns=scaled(run.client_cpu_ns),
        server_cpu_ns=scaled(run.server_cpu_ns),
    )


def machine_cpu_busy_share(runs: Sequence[RunMeasurement]) -> float | None:
    """Share of all the machine's cores busy over the runs (any process), or None if unknown."""
    known = [run for run in runs if run.machine_cpu_total_ticks > 0]
    if not known:
        return None
    busy = sum(run.machine_cpu_busy_ticks for run in known)
    return busy / sum(run.machine_cpu_total_ticks for run in known)


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySummary:
    """Distribution of latencies, in ns."""

    count: int
    mean_ns: float
    min_ns: float
    p50_ns: float
    p90_ns: float
    p99_ns: float
    p999_ns: float
    max_ns: float

    @classmethod
    def from_samples(cls, latencies_ns: Sequence[int]) -> LatencySummary:
        if not latencies_ns:
            nan = math.nan
            return cls(
                count=0,
                mean_ns=nan,
                min_ns=nan,
                p50_ns=nan,
                p90_ns=nan,
                p99_ns=nan,
                p999_ns=nan,
                max_ns=nan,
            )
        values = np.asarray(latencies_ns, dtype=np.float64)
        p50, p90, p99, p999 = np.percentile(values, PERCENTILES)
        return cls(
            count=len(values),
            mean_ns=float(values.mean()),
            min_ns=float(values.min()),
            p50_ns=float(p50),
            p90_ns=float(p90),
            p99_ns=float(p99),
            p999_ns=float(p999),
            max_ns=float(values.max()),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InexactSizes:
    """Traced message sizes a replay could not reproduce to the byte, per pass of the trace.

    Serialized mode cannot encode every length: a 1 or 2 B message goes as an
    empty one, a length just past a varint step one byte short.  Bytes count
    both directions of the calls concerned.
    """

    calls_per_pass: int
    traced_bytes: int
    replayed_bytes: int
    #: The commonest changes, ``"<traced> B -> <replayed> B x<calls>"``, most calls first.
    examples: str

    def __post_init__(self) -> None:
        if self.calls_per_pass < 1:
            raise ValueError(f"calls_per_pass must be >= 1, got {self.calls_per_pass}")
        if self.traced_bytes < 0 or self.replayed_bytes < 0:
            raise ValueError("traced_bytes and replayed_bytes must be >= 0")

    def describe(self) -> str:
        """One line for the terminal."""
        return (
            f"{self.calls_per_pass} traced message sizes per pass cannot be encoded exactly "
            f"in serialized mode ({self.examples}): {self.replayed_bytes} B replayed for "
            f"{self.traced_bytes} B traced"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchmarkResult:
    """One benchmark's runs and the statistics over all of them.

    Throughput figures are the mean over runs of each run's figure (the
    paper's "5 runs averaged"); latency percentiles pool the samples of all
    runs.
    """

    benchmark: Benchmark
    #: What was sent: "trace" or "synthetic".
    workload: str
    #: Every parameter that shaped the run, flat and JSON-friendly
    #: (mode, generator, buffers, sizes, warm-up, duration, runs, pacing,
    #: concurrency, channels, workers, ps, target addresses, grpc settings...).
    parameters: dict[str, str | int | float | bool]
    runs: tuple[RunMeasurement, ...]
    partial: bool = False
    partial_reason: str = ""
    #: Trace replays: the traced sizes the replay could not reproduce; None if all were.
    inexact_sizes: InexactSizes | None = None
    latency_all: LatencySummary = field(init=False)
    #: Per size category present in the samples, in SizeCategory order.
    latency_by_category: tuple[tuple[SizeCategory, LatencySummary], ...] = field(init=False)

    def __post_init__(self) -> None:
        samples = [s for run in self.runs for s in run.samples]
        object.__setattr__(
            self, "latency_all", LatencySummary.from_samples([s.latency_ns for s in samples])
        )
        by_category: dict[SizeCategory, list[int]] = {}
        for sample in samples:
            by_category.setdefault(classify(sample.payload_bytes), []).append(sample.latency_ns)
        object.__setattr__(
            self,
            "latency_by_category",
            tuple(
                (category, LatencySummary.from_samples(by_category[category]))
                for category in SizeCategory
                if category in by_category
            ),
        )

    @property
    def rpc_count(self) -> int:
        return sum(run.rpc_count for run in self.runs)

    def _mean_over_runs(self, values: Sequence[float]) -> float:
        finite = [v for v in values if not math.isnan(v)]
        return float(np.mean(finite)) if finite else math.nan

    @property
    def rpcs_per_s(self) -> float:
        """Aggregate RPCs per second over all workers, mean over runs."""
        return self._mean_over_runs(
            [
                run.rpc_count / (run.duration_ns / 1e9) if run.duration_ns else math.nan
                for run in self.runs
            ]
        )

    @property
    def bytes_per_s(self) -> float:
        """Payload bytes moved per second (request + response), mean over runs."""
        return self._mean_over_runs(
            [
                (run.request_bytes + run.response_bytes) / (run.duration_ns / 1e9)
                if run.duration_ns
                else math.nan
                for run in self.runs
            ]
        )

    @property
    def bandwidth_mb_per_s(self) -> float:
        """The paper's bandwidth: payload MB (10**6 B) per second, mean over runs."""
        return self.bytes_per_s / 1e6

    @property
    def step_times_ns(self) -> tuple[int, ...]:
        return tuple(t for run in self.runs for t in run.step_times_ns)

    @property
    def step_compute_ns(self) -> tuple[int, ...]:
        return tuple(t for run in self.runs for t in run.step_compute_ns)

    @property
    def step_communication_ns(self) -> tuple[int, ...]:
        """Per step: the critical path's communication (step time less the compute kept)."""
        return tuple(
            total - compute
            for run in self.runs
            for total, compute in zip(run.step_times_ns, run.step_compute_ns, strict=False)
        )

    @property
    def release_lag(self) -> LatencySummary:
        """Schedule fidelity: how late calls went after their planned release."""
        return LatencySummary.from_samples(
            [s.release_lag_ns for run in self.runs for s in run.samples]
        )

    @property
    def unheld_release_lag(self) -> LatencySummary:
        """How late the calls the window did not hold back went after their planned
        release: the replay's own lateness (its CPU, its wake-ups), not the link's."""
        return LatencySummary.from_samples(
            [s.release_lag_ns for run in self.runs for s in run.samples if not s.window_held]
        )

    @property
    def step_time(self) -> LatencySummary:
        """Distribution of replayed communication time per step (trace-driven runs)."""
        return LatencySummary.from_samples(self.step_times_ns)

    @property
    def client_cpu_ns(self) -> int:
        return sum(run.client_cpu_ns for run in self.runs)

    @property
    def server_cpu_ns(self) -> int:
        return sum(run.server_cpu_ns for run in self.runs)
