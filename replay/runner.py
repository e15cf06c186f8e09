"""The runner: warm-up, measured duration and repetitions, around a workload and a pacing.

It owns the paper's protocol (2 s warm-up, 10 s measured, 5 runs by default)
for synthetic workloads (the payload cycle repeated for the duration) and for
traces (whole steps replayed in a loop for the duration, or exactly
``steps``/``passes`` of them, each step's replay time recorded).  Point-to-
point benchmarks run their one worker in this process; PS throughput runs
one process per worker (``throughput``).

A server that fails mid-run ends the run and the benchmark: what was measured
is kept, marked partial with the reason.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench.errors import ConfigError, TransportError
from tf_grpc_bench.replay.client import Driver, ReplayClient
from tf_grpc_bench.replay.measurement import Benchmark, BenchmarkResult, CallSample, RunMeasurement
from tf_grpc_bench.replay.pacing import Pacing, Timing, next_step_begin_ns
from tf_grpc_bench.replay.wire import ChannelSettings, RpcKind, ServerStats
from tf_grpc_bench.replay.workload import Shape, Workload, WorkloadStep

NS_PER_S = 1_000_000_000
#: Partial reason of a run stopped by Ctrl-C.
INTERRUPTED_REASON = "interrupted by the user (Ctrl-C)"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    """How long and how often to measure.  The defaults are the paper's."""

    warmup_ns: int = 2 * NS_PER_S
    duration_ns: int = 10 * NS_PER_S
    runs: int = 5
    #: Trace workloads only: replay exactly this many steps per run (instead of a duration).
    steps: int | None = None
    #: Trace workloads only: replay the trace's steps this many times per run.
    passes: int | None = None
    #: Deadline of each call, in seconds.
    deadline_s: float = 60.0
    #: How long to wait for a server to answer before the first call.
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.warmup_ns < 0:
            raise ConfigError(f"--warmup must be >= 0 s, got {self.warmup_ns / 1e9:g}")
        if self.duration_ns <= 0:
            raise ConfigError(f"--duration must be > 0 s, got {self.duration_ns / 1e9:g}")
        if self.runs < 1:
            raise ConfigError(f"--runs must be >= 1, got {self.runs}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {self.steps}")
        if self.passes is not None and self.passes < 1:
            raise ConfigError(f"--passes must be >= 1, got {self.passes}")
        if self.steps is not None and self.passes is not None:
            raise ConfigError("--steps and --passes are alternatives; give one")
        if not self.deadline_s > 0:
            raise ConfigError(f"--deadline must be > 0 s, got {self.deadline_s:g}")
        if not self.connect_timeout_s > 0:
            raise ConfigError(f"--connect-timeout must be > 0 s, got {self.connect_timeout_s:g}")

    def steps_per_run(self, workload: Workload) -> int | None:
        """Exact steps to replay per run, or None to run for ``duration_ns``."""
        if self.passes is not None:
            return self.passes * len(workload.steps)
        return self.steps

    def parameters(self) -> dict[str, str | int | float | bool]:
        parameters: dict[str, str | int | float | bool] = {
            "warmup_s": self.warmup_ns / 1e9,
            "duration_s": self.duration_ns / 1e9,
            "runs": self.runs,
            "deadline_s": self.deadline_s,
        }
        if self.steps is not None:
            parameters["steps_per_run"] = self.steps
        if self.passes is not None:
            parameters["passes_per_run"] = self.passes
        return parameters


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressEvent:
    """Reported by the runner as it goes, for a progress bar."""

    benchmark: Benchmark
    #: "warmup", "run" (a measured run starts) or "finished" (a measured run ended).
    phase: str
    run_index: int
    runs: int


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOutcome:
    """What one worker measured in one run."""

    samples: tuple[CallSample, ...]
    step_times_ns: tuple[int, ...]
    #: Dependencies pacing: compute on each step's critical path (else empty).
    step_compute_ns: tuple[int, ...] = ()
    #: From the run's begin to the worker's last completed call.
    elapsed_ns: int
    cpu_ns: int
    partial: bool = False
    partial_reason: str = ""


class WorkerLoop:
    """One worker's replay: its calls, cycled under the runner's protocol.

    ``clock`` returns ns.  Blocking; not thread-safe.
    """

    def __init__(
        self,
        workload: Workload,
        driver: Driver,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.process_time_ns,
    ) -> None:
        self.workload = workload
        self.driver = driver
        self.clock = clock
        self.cpu_clock = cpu_clock
        self._steps = tuple(step for step in workload.steps if step.calls)
        self._synthetic = workload.source == "synthetic"

    def _cycle(self) -> Iterator[WorkloadStep]:
        return itertools.cycle(self._steps)

    def _replay(
        self,
        *,
        begin_ns: int,
        duration_ns: int | None,
        step_count: int | None,
        samples: list[CallSample] | None,
        step_times: list[int] | None,
        step_compute: list[int] | None = None,
    ) -> int:
        """Replay steps from ``begin_ns``; returns the time the last call completed."""
        self.driver.begin_run()
        stop_at = None if duration_ns is None else begin_ns + duration_ns
        step_begin = begin_ns
        last_end = begin_ns
        for number, step in enumerate(self._cycle()):
            if step_count is not None and number >= step_count:
                break
            if step_count is None and stop_at is not None and self.clock() >= stop_at:
                break
            outcome = self.driver.run_step(
                step,
                run_begin_ns=begin_ns,
                step_begin_ns=step_begin,
                # A synthetic cycle may stop mid-way; trace steps are replayed whole.
                stop_at_ns=stop_at if self._synthetic and step_count is None else None,
                samples=samples,
            )
            last_end = outcome.last_end_ns
            if outcome.next_begin_ns is not None:
                # Dependencies pacing: the step lasts until the next may begin.
                next_begin = outcome.next_begin_ns
                if step_times is not None:
                    step_times.append(next_begin - step_begin)
                if step_compute is not None and outcome.path is not None:
                    step_compute.append(outcome.path.compute_ns)
            else:
                if step_times is not None and not self._synthetic:
                    step_times.append(last_end - step_begin)
                next_begin = next_step_begin_ns(
                    self.driver.pacing,
                    previous_begin_ns=step_begin,
                    previous_end_ns=last_end,
                    recorded_period_ns=step.period_ns,
                )
            now = self.clock()
            if next_begin > now:
                if stop_at is not None and step_count is None and next_begin >= stop_at:
                    break
                while self.clock() < next_begin:
                    time.sleep((next_begin - self.clock()) / 1e9)
            step_begin = max(next_begin, self.clock())
        return last_end

    def warm_up(self, duration_ns: int) -> None:
        """Replay for ``duration_ns`` (whole steps for traces), measuring nothing."""
        if duration_ns <= 0:
            return
        self._replay(
            begin_ns=self.clock(),
            duration_ns=duration_ns,
            step_count=None,
            samples=None,
            step_times=None,
        )

    def measure(
        self, *, begin_ns: int | None = None, duration_ns: int, step_count: int | None
    ) -> WorkerOutcome:
        """One measured run.  A ``TransportError`` ends it early, marked partial."""
        if begin_ns is not None:
            while self.clock() < begin_ns:
                time.sleep(max(begin_ns - self.clock(), 0) / 1e9)
        else:
            begin_ns = self.clock()
        samples: list[CallSample] = []
        step_times: list[int] = []
        step_compute: list[int] = []
        cpu_before = self.cpu_clock()
        partial, reason = False, ""
        try:
            last_end = self._replay(
                begin_ns=begin_ns,
                duration_ns=None if step_count is not None else duration_ns,
                step_count=step_count,
                samples=samples,
                step_times=step_times,
                step_compute=step_compute,
            )
        except TransportError as error:
            partial, reason = True, str(error)
            last_end = self.clock()
        return WorkerOutcome(
            samples=tuple(sorted(samples, key=lambda s: s.start_ns)),
            step_times_ns=tuple(step_times),
            step_compute_ns=tuple(step_compute),
            elapsed_ns=max(last_end - begin_ns, 1),
            cpu_ns=self.cpu_clock() - cpu_before,
            partial=partial,
            partial_reason=reason,
        )


# --------------------------------------------------------------------------
# Servers' statistics around a run.


def reset_servers(clients: Mapping[int, ReplayClient], timeout_s: float) -> None:
    for client in clients.values():
        client.reset_stats(timeout_s)


def collect_stats(
    clients: Mapping[int, ReplayClient], timeout_s: float
) -> list[ServerStats] | None:
    try:
        return [client.stats(timeout_s) for client in clients.values()]
    except TransportError:
        return None


def run_measurement(
    run_index: int, outcomes: Sequence[WorkerOutcome], stats: list[ServerStats] | None
) -> RunMeasurement:
    """Combine the workers' outcomes and the servers' counts into one run."""
    samples = sorted(
        (sample for outcome in outcomes for sample in outcome.samples), key=lambda s: s.start_ns
    )
    reasons = [o.partial_reason for o in outcomes if o.partial]
    partial = bool(reasons)
    reason = reasons[0] if reasons else ""
    if stats is None and not partial:
        partial, reason = True, "server statistics unavailable after the run"
    return RunMeasurement(
        run_index=run_index,
        duration_ns=max(o.elapsed_ns for o in outcomes),
        samples=tuple(samples),
        step_times_ns=tuple(t for o in outcomes for t in o.step_times_ns),
        step_compute_ns=tuple(t for o in outcomes for t in o.step_compute_ns),
        client_cpu_ns=sum(o.cpu_ns for o in outcomes),
        server_cpu_ns=sum(s.cpu_ns for s in stats) if stats else 0,
        server_received_bytes=sum(s.received_bytes for s in stats) if stats else -1,
        server_received_messages=sum(s.received_messages for s in stats) if stats else -1,
        partial=partial,
        partial_reason=reason,
    )


# --------------------------------------------------------------------------
# Benchmarks.


#: Messages in flight on a stream for synthetic P2P bandwidth (measured in
#: ``docs/performance.md``).
STREAMING_BANDWIDTH_WINDOW = 1


def default_window(workload: Workload, rpc: RpcKind = RpcKind.UNARY) -> int | None:
    """Calls in flight a benchmark allows unless told otherwise (None: the recorded concurrency).

    Latency: one call at a time.  Bandwidth: one outstanding call for the
    paper's synthetic benchmark (send, wait for the ack, send again), or
    ``STREAMING_BANDWIDTH_WINDOW`` messages on a stream; the recorded
    concurrency for a trace.  Throughput: the recorded concurrency
    (synthetic: one call in flight per (worker, ps) pair, all ps at once).
    """
    if workload.benchmark is Benchmark.P2P_LATENCY:
        return 1
    if workload.benchmark is Benchmark.P2P_BANDWIDTH and workload.source == "synthetic":
        return STREAMING_BANDWIDTH_WINDOW if rpc is RpcKind.STREAMING else 1
    return None


def default_rpc(workload: Workload) -> RpcKind:
    """The RPC kind a benchmark uses unless told otherwise: streaming for synthetic
    P2P bandwidth (measured faster and cheaper per MB, ``docs/performance.md``),
    unary for everything else (the paper's and TensorFlow's one call per tensor)."""
    if workload.benchmark is Benchmark.P2P_BANDWIDTH and workload.source == "synthetic":
        return RpcKind.STREAMING
    return RpcKind.UNARY


def rpc_used(workload: Workload, rpc: RpcKind) -> RpcKind:
    """The RPC kind a workload's calls actually travel with: streams carry only echo
    and ack calls, so a trace's pulls stay unary whatever was asked."""
    if rpc is RpcKind.STREAMING and any(call.shape is not Shape.PULL for call in workload.calls):
        return RpcKind.STREAMING
    return RpcKind.UNARY


def default_pacing(workload: Workload) -> Pacing:
    """Closed loop, as fast as possible, with the benchmark's default window."""
    return Pacing(timing=Timing.ASAP, window=default_window(workload))


def open_clients(
    workload: Workload,
    targets: Sequence[str],
    *,
    settings: ChannelSettings,
) -> dict[int, ReplayClient]:
    """One client per server the workload calls, keyed by server index."""
    if len(targets) < workload.server_count:
        raise ConfigError(
            f"--target: the {workload.benchmark.value} workload needs {workload.server_count} "
            f"ps server(s), got {len(targets)} target(s)"
        )
    return {
        index: ReplayClient(targets[index], mode=workload.mode, settings=settings)
        for index in workload.servers_used
    }


def measure_point_to_point(
    workload: Workload,
    clients: Mapping[int, ReplayClient],
    pacing: Pacing,
    plan: RunPlan,
    *,
    on_progress: ProgressCallback | None = None,
) -> tuple[RunMeasurement, ...]:
    """Warm up, then ``plan.runs`` measured runs of a one-worker workload in this process."""
    driver = Driver(clients, pacing, timeout_s=plan.deadline_s)
    driver.prepare(workload.steps)
    loop = WorkerLoop(workload, driver)
    runs: list[RunMeasurement] = []
    try:
        _measure_runs(workload, clients, loop, plan, runs, on_progress)
    except KeyboardInterrupt:
        runs.append(failed_run(len(runs), INTERRUPTED_REASON))
    return tuple(runs)


def _measure_runs(
    workload: Workload,
    clients: Mapping[int, ReplayClient],
    loop: WorkerLoop,
    plan: RunPlan,
    runs: list[RunMeasurement],
    on_progress: ProgressCallback | None,
) -> None:
    """Warm-up and runs; appends each run to ``runs`` as it ends."""
    notify = on_progress or (lambda event: None)
    notify(ProgressEvent(benchmark=workload.benchmark, phase="warmup", run_index=0, runs=plan.runs))
    try:
        loop.warm_up(plan.warmup_ns)
    except TransportError as error:
        runs.append(failed_run(0, f"during warm-up: {error}"))
        return
    run_each(
        workload,
        clients,
        plan,
        runs,
        notify,
        lambda: [
            loop.measure(duration_ns=plan.duration_ns, step_count=plan.steps_per_run(workload))
        ],
    )


def run_each(
    workload: Workload,
    clients: Mapping[int, ReplayClient],
    plan: RunPlan,
    runs: list[RunMeasurement],
    notify: ProgressCallback,
    measure: Callable[[], list[WorkerOutcome]],
) -> None:
    """The measured runs after the warm-up, whoever drives the calls.

    Per run: servers' counters reset, ``measure()`` (the drivers' outcomes of
    one run), the servers' statistics collected, the run appended to ``runs``.
    Stops after a run that is partial or whose servers cannot be reset (then
    recorded as a failed run).
    """
    for run_index in range(plan.runs):
        notify(
            ProgressEvent(
                benchmark=workload.benchmark, phase="run", run_index=run_index, runs=plan.runs
            )
        )
        try:
            reset_servers(clients, plan.connect_timeout_s)
        except TransportError as error:
            runs.append(failed_run(run_index, str(error)))
            break
        outcomes = measure()
        run = run_measurement(run_index, outcomes, collect_stats(clients, plan.connect_timeout_s))
        runs.append(run)
        notify(
            ProgressEvent(
                benchmark=workload.benchmark, phase="finished", run_index=run_index, runs=plan.runs
            )
        )
        if run.partial:
            break


def failed_run(run_index: int, reason: str) -> RunMeasurement:
    return RunMeasurement(
        run_index=run_index, duration_ns=0, samples=(), partial=True, partial_reason=reason
    )


def run_benchmark(
    workload: Workload,
    targets: Sequence[str],
    *,
    pacing: Pacing | None = None,
    plan: RunPlan | None = None,
    settings: ChannelSettings | None = None,
    parameters: Mapping[str, str | int | float | bool] | None = None,
    on_progress: ProgressCallback | None = None,
) -> BenchmarkResult:
    """Run one benchmark against servers at ``targets`` (indexed by ps server index).

    Checks every server first (reachable, same mode): ``TransportError`` or
    ``ConfigError`` if not.  A failure after that yields a partial result.
    """
    plan = plan or RunPlan()
    pacing = pacing or default_pacing(workload)
    settings = settings or ChannelSettings()
    if workload.source == "synthetic" and (plan.steps is not None or plan.passes is not None):
        raise ConfigError("--steps/--passes apply to trace replays, not to --synthetic workloads")
    if workload.source == "synthetic" and pacing.timing is Timing.RECORDED:
        raise ConfigError("--pacing recorded needs a trace (synthetic payloads have no timestamps)")
    clients = open_clients(workload, targets, settings=settings)
    try:
        for client in clients.values():
            client.check_server(plan.connect_timeout_s)
        if workload.benchmark is Benchmark.PS_THROUGHPUT:
            from tf_grpc_bench.replay.throughput import measure_throughput

            runs = measure_throughput(
                workload,
                targets,
                clients,
                pacing,
                plan,
                settings=settings,
                on_progress=on_progress,
            )
        else:
            runs = measure_point_to_point(workload, clients, pacing, plan, on_progress=on_progress)
    finally:
        for client in clients.values():
            client.close()
    partial_runs = [run for run in runs if run.partial]
    all_parameters: dict[str, str | int | float | bool] = {
        "mode": workload.mode.value,
        "pacing": pacing.timing.value,
        "outstanding": "recorded" if pacing.window is None else pacing.window,
        "targets": ",".join(targets[i] for i in workload.servers_used),
        "grpc": settings.describe(),
        "rpc": rpc_used(workload, settings.rpc).value,
        **workload.parameters(),
        **plan.parameters(),
    }
    if pacing.timing is Timing.RATE:
        all_parameters["rate_per_s"] = pacing.rate_per_s
    if pacing.timing is Timing.DEPENDENCIES:
        all_parameters["compute_scale"] = pacing.compute_scale
    if pacing.timing is Timing.RECORDED:
        all_parameters["speedup"] = pacing.speedup
    all_parameters.update(parameters or {})
    return BenchmarkResult(
        benchmark=workload.benchmark,
        workload=workload.source,
        parameters=all_parameters,
        runs=runs,
        partial=bool(partial_runs),
        partial_reason=partial_runs[0].partial_reason if partial_runs else "",
    )
