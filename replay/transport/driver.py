"""The driver that issues a worker's calls of a step to its clients under a ``Pacing``
and records one ``CallSample`` per completed call, timed with ``time.perf_counter_ns``."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import numpy as np

from tf_grpc_bench.dependencies import Dependencies
from tf_grpc_bench.dependency_tracker import DependencyTracker, StepPath
from tf_grpc_bench.errors import ConfigError, TransportError
from tf_grpc_bench.replay.core.measurement import CallSample, release_held
from tf_grpc_bench.replay.core.pacing import (
    Pacing,
    Timing,
    blocking_calls_suffice,
    may_issue,
    release_time_ns,
)
from tf_grpc_bench.replay.core.workload import Call, WorkloadStep
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.peers import PEER_POLL_S, Peers


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """How one replayed step went, as the driver saw it (absolute ns of its clock)."""

    #: When the step's last call completed.
    last_end_ns: int
    #: Dependencies pacing: when the worker's next step may begin (the step's
    #: recorded tail kept); None for other pacings, which decide it themselves.
    next_begin_ns: int | None = None
    #: Dependencies pacing: the step's critical path, compute against communication.
    path: StepPath | None = None
    #: The step was cut short: a call of it was planned past the run's last moment
    #: (``Driver.run_step``'s ``give_up_at_ns``) and was not waited for.
    cut: bool = False


#: Longest single sleep or wait: longer ones are made of several, so that a wait planned
#: for centuries (a trace's extreme timestamps) never asks the system for more than it takes.
MAX_SLEEP_S = 3600.0


def sleep_until(
    deadline_ns: int,
    clock: Callable[[], int],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Sleep until ``clock`` (ns) reads ``deadline_ns`` or later.  Each wait is what one
    reading left: the clock read again can already be past the deadline."""
    while (remaining_ns := deadline_ns - clock()) > 0:
        sleep(min(remaining_ns / 1e9, MAX_SLEEP_S))


class StepCut(Exception):
    """A call of the step is planned past the step's last moment (within the driver)."""


#: Timeout of a chunk whose payload's deadline has passed: a deadline in the past, which
#: gRPC fails at once with DEADLINE_EXCEEDED, as the payload has failed (one a
#: microsecond ahead raced a loopback answer, and mostly lost).
EXPIRED_TIMEOUT_S = -1.0


class PayloadDeadlines:
    """The timeout of each call of one step: ``timeout_s`` (``--deadline``) from when it is
    issued, except that the chunks of one payload (``Call.chunk_index`` of ``chunk_count``,
    consecutive in the step) share the deadline their first chunk got, so that a
    payload cut into many chunks is bounded as a whole.  Not thread-safe."""

    def __init__(self, timeout_s: float, clock: Callable[[], int]) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        #: Deadline (clock ns) of each chunked payload, by its first chunk's position.
        self._by_first: dict[int, int] = {}

    def timeout_s(self, call: Call, position: int) -> float:
        """The timeout of ``call``, at ``position`` in its step, issued now."""
        if call.chunk_count == 1:
            return self._timeout_s
        now = self._clock()
        first = position - call.chunk_index
        deadline = self._by_first.setdefault(first, now + int(self._timeout_s * 1e9))
        return (deadline - now) / 1e9 if deadline > now else EXPIRED_TIMEOUT_S


class StepDriver(Protocol):
    """What makes a worker's calls for ``WorkerLoop``: ``transport.driver.Driver`` (grpcio),
    or another engine's (``native.driver.NativeDriver``)."""

    @property
    def pacing(self) -> Pacing: ...

    @property
    def peers(self) -> Peers | None: ...

    def begin_run(self) -> None: ...

    def run_step(
        self,
        step: WorkloadStep,
        *,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None = None,
        give_up_at_ns: int | None = None,
        samples: list[CallSample] | None = None,
    ) -> StepOutcome: ...


class Driver:
    """Issues a worker's calls to its servers' clients under a pacing, recording samples.

    One driver per worker; not for use from several threads at once (its
    completion callbacks run on gRPC's threads and are synchronised here).
    ``clock`` returns ns; ``sleep`` takes seconds.
    """

    def __init__(
        self,
        clients: Mapping[int, ReplayClient],
        pacing: Pacing,
        *,
        timeout_s: float,
        clock: Callable[[], int] = time.perf_counter_ns,
        sleep: Callable[[float], None] = time.sleep,
        peers: Peers | None = None,
    ) -> None:
        self.clients = clients
        self.pacing = pacing
        self.timeout_s = timeout_s
        self.clock = clock
        self.sleep = sleep
        #: The worker's other client processes (``--procs-per-worker``), if any: this
        #: driver makes its own share of each step's calls and ends the step with them.
        self.peers = peers
        #: Told of each compute gap a step plans (``DependencyTracker``'s ``on_compute``).
        self.on_compute: Callable[[int, int], None] | None = None
        self._issued_in_run = 0
        #: The current step's last moment (``run_step``).
        self.give_up_at_ns: int | None = None

    def prepare(self, steps: Iterable[WorkloadStep]) -> None:
        for step in steps:
            local = step if self.peers is None else self.peers.local_step(step)
            for call in local.calls:
                self.clients[call.server_index].prepare([call])
            if self.pacing.timing is Timing.DEPENDENCIES:
                dependencies_of(step)  # refuses calls without dependencies up front

    def begin_run(self) -> None:
        """Start counting calls afresh (rate pacing counts from a run's begin)."""
        self._issued_in_run = 0

    def _wait_until(self, deadline_ns: int) -> None:
        sleep_until(deadline_ns, self.clock, self.sleep)

    def run_step(
        self,
        step: WorkloadStep,
        *,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None = None,
        give_up_at_ns: int | None = None,
        samples: list[CallSample] | None = None,
    ) -> StepOutcome:
        """Issue the step's calls, wait for all, say when the last one completed.

        Stops issuing once ``stop_at_ns`` has passed (calls in flight still
        complete).  A call planned for after ``give_up_at_ns`` is not waited for:
        the step ends there, ``cut``.  Samples (``start_ns`` relative to
        ``run_begin_ns``) are appended to ``samples`` as calls complete, so a
        caller keeps what was measured even when this raises ``TransportError``.
        """
        self.give_up_at_ns = give_up_at_ns
        if self.pacing.timing is Timing.DEPENDENCIES:
            return self._run_dependencies(step, run_begin_ns, step_begin_ns, samples)
        peers = self.peers
        if peers is not None:
            peers.begin_step()
            step = peers.local_step(step)
        if blocking_calls_suffice(self.pacing):
            end, cut = self._run_blocking(step, run_begin_ns, step_begin_ns, stop_at_ns, samples)
        else:
            end, cut = self._run_concurrent(step, run_begin_ns, step_begin_ns, stop_at_ns, samples)
        if peers is not None:
            # The step ends when the worker's last call, in whichever process, ended.
            end = peers.end_step(end)
        return StepOutcome(last_end_ns=end, cut=cut)

    def _release(self, call: Call, run_begin_ns: int, step_begin_ns: int) -> int | None:
        """Wait until ``call``'s planned release, if the pacing plans one; returns it.
        ``StepCut`` if that is past the step's last moment (not waited for)."""
        release = release_time_ns(
            self.pacing,
            call,
            call_number=self._issued_in_run,
            step_begin_ns=step_begin_ns,
            run_begin_ns=run_begin_ns,
        )
        if release is not None:
            if self.give_up_at_ns is not None and release > self.give_up_at_ns:
                raise StepCut()
            self._wait_until(release)
        self._issued_in_run += 1
        return release

    def _run_blocking(
        self,
        step: WorkloadStep,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None,
        samples: list[CallSample] | None,
    ) -> tuple[int, bool]:
        clock = self.clock
        end = clock()
        deadlines = PayloadDeadlines(self.timeout_s, clock)
        # One call at a time: the window (of one) held a call whose release came before
        # the previous call ended.
        held_until = -1
        for position, call in enumerate(step.calls):
            if stop_at_ns is not None and clock() >= stop_at_ns:
                break
            try:
                release = self._release(call, run_begin_ns, step_begin_ns)
            except StepCut:
                return end, True
            client = self.clients[call.server_index]
            start = clock()
            client.invoke(call, deadlines.timeout_s(call, position))
            held = release_held(release, held_until)
            end = held_until = clock()
            if samples is not None:
                samples.append(
                    _sample(call, start - run_begin_ns, end - start, start, release, held)
                )
        return end, False

    def _run_concurrent(
        self,
        step: WorkloadStep,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None,
        samples: list[CallSample] | None,
    ) -> tuple[int, bool]:
        flight = _CallsInFlight(self, run_begin_ns, samples, self.clock())
        cut = False
        for position, call in enumerate(step.calls):
            if flight.errors or (stop_at_ns is not None and self.clock() >= stop_at_ns):
                break
            try:
                release = self._release(call, run_begin_ns, step_begin_ns)
            except StepCut:
                cut = True
                break
            with flight.condition:
                while not flight.errors and not flight.window_allows(call):
                    flight.condition.wait()
                if flight.errors:
                    break
            flight.start(call, release, position=position)
        flight.drain()
        return flight.last_end_ns, cut

    def _run_dependencies(
        self,
        step: WorkloadStep,
        run_begin_ns: int,
        step_begin_ns: int,
        samples: list[CallSample] | None,
    ) -> StepOutcome:
        """Issue the step's calls in release order, each once what it waits for has arrived."""
        tracker = step_tracker(step, step_begin_ns, self.pacing, self.on_compute)
        if self.peers is None:
            replay = _DependentStep(self, step, tracker, run_begin_ns, samples)
            replay.run()
            last_end = replay.last_end_ns
        else:
            self.peers.begin_step()
            replay = _SharedDependentStep(self, step, tracker, run_begin_ns, samples, self.peers)
            replay.run()
            last_end = self.peers.end_step(replay.last_end_ns)
        if replay.cut:
            return StepOutcome(last_end_ns=last_end, cut=True)
        return StepOutcome(
            last_end_ns=last_end,
            next_begin_ns=tracker.next_step_begin_ns(),
            path=tracker.critical_path(),
        )


class _CallsInFlight:
    """The calls a driver has started and not yet seen complete, with the samples and
    errors of those that did.  Completions run on gRPC's threads; everything here
    is guarded by ``condition``, which is notified on every completion."""

    def __init__(
        self,
        driver: Driver,
        run_begin_ns: int,
        samples: list[CallSample] | None,
        last_end_ns: int,
        on_success: Callable[[int, int], None] | None = None,
    ) -> None:
        self.driver = driver
        self.run_begin_ns = run_begin_ns
        self.samples = samples
        self.last_end_ns = last_end_ns
        #: Called as ``on_success(key, end_ns)``, under ``condition``, for each call
        #: that completed without error.
        self.on_success = on_success
        self.condition = threading.Condition()
        self.count = 0
        self.to_server: dict[int, int] = dict.fromkeys(driver.clients, 0)
        self.errors: list[TransportError] = []
        #: The window refused a due call and has not let one go since; the end of the
        #: latest completion of this process; the end of the completion that last opened
        #: the window after a refusal (-1: none), for ``release_held``.
        self.refused = False
        self.last_completion_ns = -1
        self.held_until_ns = -1
        self.deadlines = PayloadDeadlines(driver.timeout_s, driver.clock)

    def window_allows(self, call: Call) -> bool:
        """Whether the pacing's window lets ``call`` go now (hold ``condition``); asked
        of a due call only, so a refusal is a hold (``release_held``)."""
        allowed = may_issue(
            self.driver.pacing,
            call,
            in_flight=self.count,
            in_flight_to_server=self.to_server[call.server_index],
        )
        if not allowed:
            self.refused = True
        elif self.refused:
            self.refused = False
            self.held_until_ns = self.last_completion_ns
        return allowed

    def start(self, call: Call, release: int | None, *, position: int, key: int = -1) -> None:
        """Start ``call``, at ``position`` in its step (planned for ``release``, if any);
        ``key`` is passed to ``on_success``."""
        with self.condition:
            self.count += 1
            self.to_server[call.server_index] += 1
            held = release_held(release, self.held_until_ns)
        start = self.driver.clock()
        timeout_s = self.deadlines.timeout_s(call, position)
        future = self.driver.clients[call.server_index].start(call, timeout_s)
        future.add_done_callback(lambda f: self._completed(call, key, start, release, held, f))

    def _completed(
        self,
        call: Call,
        key: int,
        start: int,
        release: int | None,
        held: int,
        future: grpc.Future[Any],
    ) -> None:
        end = self.driver.clock()
        error = self.driver.clients[call.server_index].outcome(call, future)
        if error is None and self.samples is not None:
            self.samples.append(
                _sample(call, start - self.run_begin_ns, end - start, start, release, held)
            )
        with self.condition:
            if error is not None:
                self.errors.append(error)
            elif self.on_success is not None:
                self.on_success(key, end)
            self.count -= 1
            self.to_server[call.server_index] -= 1
            self.last_end_ns = max(self.last_end_ns, end)
            self.last_completion_ns = max(self.last_completion_ns, end)
            self.condition.notify_all()

    def drain(self) -> None:
        """Wait for every call started; raise the first ``TransportError`` any of them had."""
        with self.condition:
            while self.count > 0:
                self.condition.wait()
        if self.errors:
            raise self.errors[0]


class _DependentStep:
    """One step under dependencies pacing: completions feed the tracker; calls whose
    waited-for arrivals are all in join a heap by release time, and the driver's
    thread issues the earliest as soon as its time comes, so a call waiting long
    for its inputs never holds back one that could go."""

    def __init__(
        self,
        driver: Driver,
        step: WorkloadStep,
        tracker: DependencyTracker,
        run_begin_ns: int,
        samples: list[CallSample] | None,
    ) -> None:
        self.driver = driver
        self.calls = step.calls
        self.tracker = tracker
        self.due: list[tuple[int, int]] = []
        #: The calls this process makes (all but another process's share).
        self.owned = frozenset(range(len(step.calls)))
        self.flight = _CallsInFlight(
            driver, run_begin_ns, samples, tracker.step_begin_ns, on_success=self._arrived
        )
        #: A call was due past the step's last moment (``Driver.run_step``): not made.
        self.cut = False

    @property
    def last_end_ns(self) -> int:
        return self.flight.last_end_ns

    def _schedule_releasable(self) -> None:
        for index in self.tracker.take_releasable():
            release = self.tracker.release_ns(index)
            assert release is not None
            heapq.heappush(self.due, (release, index))

    def _arrived(self, index: int, end_ns: int) -> None:
        self.tracker.complete(index, end_ns)
        self._schedule_releasable()

    def _wait_for_next(self) -> tuple[int, int] | None:
        """Block until a call is due and the window lets it go; (release, index) or None."""
        clock = self.driver.clock
        flight = self.flight
        while not flight.errors:
            while self.due and self.due[0][1] not in self.owned:
                heapq.heappop(self.due)  # another process makes it
            give_up_at = self.driver.give_up_at_ns
            if self.due and give_up_at is not None and self.due[0][0] > give_up_at:
                self.cut = True
                return None
            if self.due and self.due[0][0] <= clock():
                if flight.window_allows(self.calls[self.due[0][1]]):
                    return heapq.heappop(self.due)
                flight.condition.wait()
            elif self.due:
                # A completion may bring an earlier release: wake on it too.
                flight.condition.wait(min((self.due[0][0] - clock()) / 1e9, MAX_SLEEP_S))
            else:
                self._wait_for_arrival()
        return None

    def _wait_for_arrival(self) -> None:
        """Block until a call completes (hold ``flight.condition``)."""
        self.flight.condition.wait()

    def run(self) -> None:
        """Issue every call, wait for all; raise the first ``TransportError``."""
        with self.flight.condition:
            self._schedule_releasable()
        for _ in range(len(self.owned)):
            with self.flight.condition:
                chosen = self._wait_for_next()
            if chosen is None:
                break
            release, index = chosen
            self.flight.start(self.calls[index], release, position=index, key=index)
        self.flight.drain()


class _SharedDependentStep(_DependentStep):
    """A ``_DependentStep`` of one of a worker's client processes: it makes its own share
    of the calls and learns of the others' completions from ``peers``, so its tracker
    sees the whole worker-step; ``run`` returns once every call of the step, in every
    process, has completed."""

    def __init__(
        self,
        driver: Driver,
        step: WorkloadStep,
        tracker: DependencyTracker,
        run_begin_ns: int,
        samples: list[CallSample] | None,
        peers: Peers,
    ) -> None:
        super().__init__(driver, step, tracker, run_begin_ns, samples)
        self.peers = peers
        self.owned = frozenset(peers.owned(step))
        self.fed = np.zeros(len(step.calls), dtype=bool)
        self.fed[list(self.owned)] = True

    def _arrived(self, index: int, end_ns: int) -> None:
        self.peers.publish(index, end_ns)
        super()._arrived(index, end_ns)

    def _take_remote(self) -> None:
        """Feed the other processes' completions to the tracker (any thread)."""
        with self.flight.condition:
            for index, end_ns in self.peers.arrivals(self.fed):
                self.flight.last_end_ns = max(self.flight.last_end_ns, end_ns)
                super()._arrived(index, end_ns)
            self.flight.condition.notify_all()

    def _wait_for_arrival(self) -> None:
        self.flight.condition.wait(PEER_POLL_S)
        if self.peers.broken:
            raise TransportError("another client process of this worker stopped mid-step")

    def run(self) -> None:
        self.peers.on_arrivals(self._take_remote)
        try:
            self._take_remote()
            super().run()
            with self.flight.condition:
                while not self.cut and self.tracker.completed_count < len(self.calls):
                    self._wait_for_arrival()
        finally:
            self.peers.on_arrivals(None)


def dependencies_of(step: WorkloadStep) -> list[Dependencies]:
    """The step's calls' dependencies; ConfigError for calls without (synthetic ones)."""
    dependencies = [call.dependencies for call in step.calls]
    if any(d is None for d in dependencies):
        raise ConfigError(
            "--pacing dependencies needs a trace's calls (synthetic payloads have no dependencies)"
        )
    return [d for d in dependencies if d is not None]


def step_tracker(
    step: WorkloadStep,
    step_begin_ns: int,
    pacing: Pacing,
    on_compute: Callable[[int, int], None] | None,
) -> DependencyTracker:
    """The dependency tracker of one step under dependencies pacing, for either engine."""
    return DependencyTracker(
        dependencies_of(step),
        servers=[call.server_index for call in step.calls],
        step_begin_ns=step_begin_ns,
        period_ns=step.period_ns,
        compute_scale=pacing.wall_compute_scale,
        step_compute_ns=step.step_compute_ns,
        round_tail_ns=step.round_tail_ns,
        on_compute=on_compute,
    )


def _sample(
    call: Call,
    start_ns: int,
    latency_ns: int,
    issued_ns: int = 0,
    release_ns: int | None = None,
    held: int = 0,
) -> CallSample:
    return CallSample(
        start_ns=start_ns,
        latency_ns=latency_ns,
        request_bytes=call.request_bytes,
        response_bytes=call.response_bytes,
        payload_bytes=call.payload_bytes,
        server_index=call.server_index,
        worker_index=call.worker_index,
        step=call.step,
        release_lag_ns=0 if release_ns is None else max(issued_ns - release_ns, 0),
        rpc_index=call.rpc_index,
        window_held=held,
    )
