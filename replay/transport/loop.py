"""The measuring loop the runner and PS throughput's worker processes share.

``RunPlan`` (how long and how often), ``WorkerLoop`` (one worker's calls
cycled: warm-up, then a duration or an exact number of steps), the servers'
statistics around a run, and ``run_each``, the measured runs after a warm-up
whoever drives the calls (``transport.seam.measure_runs`` is the whole
protocol around an engine's workers).  Blocking; the clock is injected.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import ConfigError, TransportError
from tf_grpc_bench.host import MachineCpuTimes, read_machine_cpu
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    CallSample,
    RunMeasurement,
)
from tf_grpc_bench.replay.core.pacing import next_step_begin_ns
from tf_grpc_bench.replay.core.workload import Workload, WorkloadStep
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.driver import StepDriver, StepOutcome, sleep_until
from tf_grpc_bench.replay.transport.wire import ChannelSettings, ServerStats

NS_PER_S = 1_000_000_000
#: How the partial reason of a run stopped by a stop signal begins.
INTERRUPTED_PREFIX = "interrupted by "


#: Longest run of a number of steps (``--steps``, ``--passes``): a week, the longest
#: ``--duration``.
MAX_STEPS_RUN_NS = 7 * 86_400 * NS_PER_S


def last_moment_ns(begin_ns: int, duration_ns: int | None) -> int:
    """The last moment of a run from ``begin_ns``: a run of ``duration_ns`` replays its
    last trace step whole, but for at most another ``duration_ns``; a run of a number
    of steps (None) lasts at most ``MAX_STEPS_RUN_NS``."""
    return begin_ns + (MAX_STEPS_RUN_NS if duration_ns is None else 2 * duration_ns)


def cut_reason(step_index: int, counted: bool) -> str:
    """Partial reason of a run cut in trace step ``step_index`` (``last_moment_ns``)."""
    bound = "a week (the longest run)" if counted else "twice --duration"
    return (
        f"trace step {step_index} plans a call later than {bound} after the run began "
        "(its recorded times); the run stopped there"
    )


def interrupted_reason(signum: int) -> str:
    """Partial reason of a run stopped by ``signum`` (Ctrl-C, SIGTERM, SIGHUP)."""
    who = "the user (Ctrl-C)" if signum == signal.SIGINT else lifetime.signal_name(signum)
    return f"{INTERRUPTED_PREFIX}{who}"


#: Partial reason of a run stopped by Ctrl-C.
INTERRUPTED_REASON = interrupted_reason(signal.SIGINT)


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
    #: The run is this many times slower than the training it predicts
    #: (``Pacing.time_dilation``): the times above are the dilated (wall) ones,
    #: ``parameters`` reports them as asked, in the predicted training's time.
    time_dilation: float = 1.0
    #: ``--compute-load`` (``core.compute_load.MODES``, chosen: never ``auto``): burners
    #: keep the cores as busy as training did (the benchmarks of worker processes:
    #: ``transport.load``, whose entries the results carry).
    compute_load: str = "none"
    #: Why ``--compute-load auto`` chose ``compute_load`` ("": it was given).
    compute_load_auto: str = ""
    #: ``--compute-load-wait``: a round ends once the load's quotas of it are done too
    #: (``burners.RoundSignal.wait``), not only its path.
    compute_load_wait: bool = False

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
        if not self.time_dilation >= 1:
            raise ConfigError(f"--time-dilation must be >= 1, got {self.time_dilation:g}")

    def steps_per_run(self, workload: Workload) -> int | None:
        """Exact steps to replay per run, or None to run for ``duration_ns``."""
        if self.passes is not None:
            return self.passes * len(workload.steps)
        return self.steps

    def parameters(self) -> dict[str, str | int | float | bool]:
        dilation = self.time_dilation
        parameters: dict[str, str | int | float | bool] = {
            "warmup_s": self.warmup_ns / 1e9 / dilation,
            "duration_s": self.duration_ns / 1e9 / dilation,
            "runs": self.runs,
            "deadline_s": self.deadline_s / dilation,
        }
        if dilation != 1:
            parameters["time_dilation"] = dilation
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
    #: The whole machine's CPU times when the run began and when it ended (None: unknown).
    machine_cpu_begin: MachineCpuTimes | None = None
    machine_cpu_end: MachineCpuTimes | None = None


def machine_cpu_over(outcomes: Sequence[WorkerOutcome]) -> tuple[int, int]:
    """(busy, total) ticks of the machine from the first worker's begin to the last one's end.

    (0, 0) when a worker could not read them.
    """
    begins = [o.machine_cpu_begin for o in outcomes]
    ends = [o.machine_cpu_end for o in outcomes]
    if not outcomes or None in begins or None in ends:
        return 0, 0
    # The counters only grow: the earliest reading has the smallest total.
    first = min((b for b in begins if b is not None), key=lambda t: t.total_ticks)
    last = max((e for e in ends if e is not None), key=lambda t: t.total_ticks)
    if last.total_ticks <= first.total_ticks:
        return 0, 0
    return max(last.busy_ticks - first.busy_ticks, 0), last.total_ticks - first.total_ticks


class StepBarrier(Protocol):
    """Where the workers of a synchronous trace meet between rounds (one per process)."""

    def wait(self) -> bool:
        """Block until every worker has finished the round; False once one has stopped."""

    def leave(self) -> None:
        """This worker stops: release the others waiting, now or later."""


def _record_dependent_step(
    own: bool,
    duration_ns: int,
    outcome: StepOutcome,
    step_times: list[int] | None,
    step_compute: list[int] | None,
) -> None:
    """Record a dependency-paced step: its time and critical-path compute, or, for a
    step without calls of this worker, add its time to the step before as compute."""
    if own:
        if step_times is not None:
            step_times.append(duration_ns)
        if step_compute is not None and outcome.path is not None:
            step_compute.append(outcome.path.compute_ns)
        return
    if step_times:
        step_times[-1] += duration_ns
        if step_compute and len(step_compute) == len(step_times):
            step_compute[-1] += duration_ns


def begin_mid_trace(steps: Sequence[WorkloadStep]) -> tuple[WorkloadStep, ...]:
    """A trace's steps in the order a replay cycles them: from the middle step on, then
    round from the first.

    The first steps after a capture's warm-up are the likeliest to be start-up still
    (a VGG-16 capture's first four rounds took twice its last four), and a replay
    shorter than a pass replays only the steps it begins with; begun mid-trace it
    replays the steadier ones.  A pass is still every step once, in the trace's
    cyclic order, and every worker (same trace, same steps) begins at the same one.
    """
    middle = len(steps) // 2
    return (*steps[middle:], *steps[:middle])


class WorkerLoop:
    """One worker's replay: its calls, cycled under the runner's protocol.

    ``clock`` returns ns.  Blocking; not thread-safe.  With ``step_barrier``,
    a step begins only once every worker has finished the previous one (the
    trace's steps are rounds ended by a barrier, as a synchronous
    ``ClusterCoordinator`` loop's ``join`` makes them).

    A trace workload's steps are cycled whole, including those in which this
    worker makes no call (another worker's step of an asynchronous trace), so
    that a pass is every trace step once and the Nth step is the same trace
    step on every worker.  Such a step takes the time its pacing gives it
    (none as fast as possible, its recorded period otherwise) and records no
    step time of its own: its time belongs to the worker's step before it
    (under dependencies pacing, as that step's compute: the worker computed
    its next step while the others made theirs).
    """

    def __init__(
        self,
        workload: Workload,
        driver: StepDriver,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.process_time_ns,
        machine_cpu: Callable[[], MachineCpuTimes | None] = read_machine_cpu,
        step_barrier: StepBarrier | None = None,
        record_steps: bool = True,
        on_round: Callable[[int], None] | None = None,
        quota_wait: Callable[[int], bool] | None = None,
    ) -> None:
        self.workload = workload
        #: Told each step's (a round's) start on ``clock`` as it begins (the compute
        #: load's quota burners owe their quota from it: ``burners.RoundSignal``).
        self.on_round = on_round or (lambda _start_ns: None)
        #: ``--compute-load-wait``: called when a dependencies-paced round's path is done
        #: with the round's length so far, it returns once the compute load's quotas of the
        #: round are done (bounded; whether it waited): the round lasts until then.
        self.quota_wait = quota_wait
        #: False for a side client (``Workload.side_workers``): its steps are not training's.
        self.record_steps = record_steps
        self.driver = driver
        self.step_barrier = step_barrier
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.machine_cpu = machine_cpu
        self._synthetic = workload.source == "synthetic"
        steps = workload.steps
        if self._synthetic or not any(step.calls for step in steps):
            steps = tuple(step for step in steps if step.calls)
        elif workload.source == "trace":
            steps = begin_mid_trace(steps)
        if step_barrier is None:
            # A round's tail, and TF1's sync token keeping only the apply, assume the
            # barrier that waits for the other workers.
            steps = tuple(step.without_round_barrier() for step in steps)
        self._steps = steps
        #: The index of the trace step a run was cut in (``_replay_steps``), if any.
        self.cut_step: int | None = None
        #: Steps the last warm-up replayed (and any run since).
        self.replayed_steps = 0

    def _cycle(self) -> Iterator[WorkloadStep]:
        return itertools.cycle(self._steps)

    def _replay(self, **arguments: Any) -> int:
        """Replay steps (``_replay_steps``); a worker that stops releases the others."""
        try:
            return self._replay_steps(**arguments)
        finally:
            if self.step_barrier is not None:
                self.step_barrier.leave()
            if self.driver.peers is not None:
                self.driver.peers.leave()

    def _stops(self, stop: bool) -> bool:
        """Whether to stop: ``stop``, or with a worker's other processes the leader's decision."""
        peers = self.driver.peers
        return stop if peers is None else peers.agree(stop)

    def _replay_steps(
        self,
        *,
        begin_ns: int,
        duration_ns: int | None,
        step_count: int | None,
        samples: list[CallSample] | None,
        step_times: list[int] | None,
        step_compute: list[int] | None = None,
    ) -> int:
        """Replay steps from ``begin_ns``; returns the time the last call completed.

        Trace steps are replayed whole, but not past the run's last moment
        (``last_moment_ns``): a step that plans a call later is cut there and ends
        the run (``self.cut_step``)."""
        self.driver.begin_run()
        stop_at = None if duration_ns is None else begin_ns + duration_ns
        give_up_at = last_moment_ns(begin_ns, duration_ns)
        step_begin = last_end = begin_ns
        for number, step in enumerate(self._cycle()):
            if self._stops(
                (step_count is not None and number >= step_count)
                or (step_count is None and stop_at is not None and self.clock() >= stop_at)
            ):
                break
            self.on_round(step_begin)
            outcome = self.driver.run_step(
                step,
                run_begin_ns=begin_ns,
                step_begin_ns=step_begin,
                # A synthetic cycle may stop mid-way; trace steps are replayed whole.
                stop_at_ns=stop_at if self._synthetic and step_count is None else None,
                give_up_at_ns=give_up_at,
                samples=samples,
            )
            self.replayed_steps += 1
            own = bool(step.calls)
            if own:
                last_end = outcome.last_end_ns
            if outcome.cut:
                self.cut_step = step.index
                self._stops(True)
                break
            dependent = outcome.next_begin_ns is not None
            if outcome.next_begin_ns is not None:
                # Dependencies pacing: the step lasts until the next may begin; in a
                # round, until every worker may begin the next (recorded below).
                next_begin = self._after_quota(step_begin, outcome.next_begin_ns)
                if self.step_barrier is None:
                    _record_dependent_step(
                        own, next_begin - step_begin, outcome, step_times, step_compute
                    )
            else:
                if step_times is not None and not self._synthetic and own:
                    step_times.append(last_end - step_begin)
                next_begin = next_step_begin_ns(
                    self.driver.pacing,
                    previous_begin_ns=step_begin,
                    previous_end_ns=last_end if own else step_begin,
                    recorded_period_ns=step.period_ns,
                )
            # A next step that would begin past the end is not waited for.  A worker's
            # processes decide together (the leader's clock), every step.
            late = stop_at is not None and step_count is None and next_begin >= stop_at
            late = (late or next_begin > give_up_at) and next_begin > self.clock()
            stopping = (late or self.driver.peers is not None) and self._stops(late)
            if not stopping:
                sleep_until(next_begin, self.clock)
                stopping = self.step_barrier is not None and not self.step_barrier.wait()
            following = next_begin if stopping else max(next_begin, self.clock())
            if dependent and self.step_barrier is not None:
                # The round: until the last worker may begin the next, as training's round
                # lasts until its slowest worker's step is joined (its own, when stopping).
                _record_dependent_step(
                    own, following - step_begin, outcome, step_times, step_compute
                )
            if stopping:
                break
            step_begin = following
        return last_end

    def _after_quota(self, step_begin: int, path_end: int) -> int:
        """When the round may end: its path's end ``path_end``, or with ``quota_wait`` once
        the compute load's quotas of the round are done too, if that is later."""
        if self.quota_wait is None:
            return path_end
        sleep_until(path_end, self.clock)
        if self.quota_wait(path_end - step_begin):
            return max(path_end, self.clock())
        return path_end

    def warm_up(self, duration_ns: int) -> None:
        """Replay for ``duration_ns`` (whole steps for traces), measuring nothing."""
        self.replayed_steps = 0
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
        """One measured run.  A ``TransportError`` or a stop signal (``KeyboardInterrupt``)
        ends it early, marked partial, with the calls completed so far."""
        begin_ns = self.clock() if begin_ns is None else begin_ns
        samples: list[CallSample] = []
        step_times: list[int] = []
        step_compute: list[int] = []
        cpu_before = self.cpu_clock()
        partial, reason = False, ""
        machine_begin = machine_end = None
        self.cut_step = None
        try:
            sleep_until(begin_ns, self.clock)
            machine_begin = self.machine_cpu()
            last_end = self._replay(
                begin_ns=begin_ns,
                duration_ns=None if step_count is not None else duration_ns,
                step_count=step_count,
                samples=samples,
                step_times=step_times if self.record_steps else None,
                step_compute=step_compute if self.record_steps else None,
            )
        except TransportError as error:
            partial, reason = True, str(error)
            last_end = self.clock()
        except KeyboardInterrupt as interrupt:
            partial, reason = True, interrupted_reason(lifetime.signal_of(interrupt))
            last_end = max(self.clock(), begin_ns)
        if self.cut_step is not None and not partial:
            partial, reason = True, cut_reason(self.cut_step, step_count is not None)
        if machine_begin is not None:
            machine_end = self.machine_cpu()
        return WorkerOutcome(
            samples=tuple(sorted(samples, key=lambda s: s.start_ns)),
            step_times_ns=tuple(step_times),
            step_compute_ns=tuple(step_compute),
            elapsed_ns=max(last_end - begin_ns, 1),
            cpu_ns=self.cpu_clock() - cpu_before,
            partial=partial,
            partial_reason=reason,
            machine_cpu_begin=machine_begin,
            machine_cpu_end=machine_end,
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
    machine_busy, machine_total = machine_cpu_over(outcomes)
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
        machine_cpu_busy_ticks=machine_busy,
        machine_cpu_total_ticks=machine_total,
        partial=partial,
        partial_reason=reason,
    )


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
        stats = collect_stats(clients, stats_timeout(plan, outcomes))
        run = run_measurement(run_index, outcomes, stats)
        runs.append(run)
        notify(
            ProgressEvent(
                benchmark=workload.benchmark, phase="finished", run_index=run_index, runs=plan.runs
            )
        )
        if run.partial:
            break


def stats_timeout(plan: RunPlan, outcomes: Sequence[WorkerOutcome]) -> float:
    """How long the servers' statistics after a run may take: ``--connect-timeout``, or
    no more than ``--deadline`` after a run that ended early (a server that left a call
    unanswered past its deadline, frozen or overloaded, gets no longer for its figures; a
    stopped replay owes its launcher a quick end)."""
    if any(outcome.partial for outcome in outcomes):
        return min(plan.connect_timeout_s, plan.deadline_s)
    return plan.connect_timeout_s


def failed_run(run_index: int, reason: str) -> RunMeasurement:
    """A run that measured nothing: no samples, partial, ``reason`` saying why."""
    return RunMeasurement(
        run_index=run_index, duration_ns=0, samples=(), partial=True, partial_reason=reason
    )


def interrupted_run(run_index: int, interrupt: KeyboardInterrupt) -> RunMeasurement:
    """The run a stop signal ended before any of its calls was measured."""
    reason = interrupted_reason(lifetime.signal_of(interrupt))
    return failed_run(run_index, f"{reason} before run {run_index + 1} measured any call")
