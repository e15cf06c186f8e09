"""One worker's step under dependencies pacing through the engine program: the program
reports each arrival, Python's dependency tracker (``DependencyTracker``, the grpcio
engine's own) finds the calls that may go and when, the program issues them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core.measurement import CallSample
from tf_grpc_bench.replay.core.pacing import Pacing
from tf_grpc_bench.replay.core.workload import Call, WorkloadStep
from tf_grpc_bench.replay.native.process import EngineProcess
from tf_grpc_bench.replay.native.protocol import STEP_DEPENDENT, Encoder, StepReport
from tf_grpc_bench.replay.transport.driver import StepOutcome, step_tracker
from tf_grpc_bench.replay.transport.peers import PEER_POLL_S, Peers


class _Engine(Protocol):
    @property
    def process(self) -> EngineProcess: ...


class StepDriver(Protocol):
    """What a dependent step uses of its driver (``driver.NativeDriver``)."""

    @property
    def engine(self) -> _Engine: ...
    @property
    def pacing(self) -> Pacing: ...
    @property
    def peers(self) -> Peers | None: ...
    @property
    def deadline_s(self) -> float: ...
    @property
    def on_compute(self) -> Callable[[int, int], None] | None: ...
    @property
    def clock(self) -> Callable[[], int]: ...
    def ids(self, step: WorkloadStep) -> tuple[int, ...]: ...
    def to_monotonic(self, perf_ns: int) -> int: ...
    def to_perf(self, monotonic_ns: int) -> int: ...
    def stop_step(self) -> None: ...
    def await_report(
        self,
        calls: Sequence[Call],
        run_begin_ns: int,
        samples: list[CallSample] | None,
        kept: list[StepReport],
    ) -> StepReport: ...
    def keep_report(
        self,
        calls: Sequence[Call],
        run_begin_ns: int,
        samples: list[CallSample] | None,
        kept: list[StepReport],
    ) -> StepReport: ...


#: Past the latest release and a call's deadline, how long a dependent step's program may
#: stay silent before it is taken to be stuck (a ``TransportError``, not a hang).
SILENCE_MARGIN_S = 10.0


class DependentStep:
    """One step under dependencies pacing: the program reports each arrival, the tracker
    (here) finds the calls that may go and when, the program issues them."""

    def __init__(
        self,
        driver: StepDriver,
        step: WorkloadStep,
        step_begin_ns: int,
        give_up_at_ns: int | None = None,
    ) -> None:
        self.driver = driver
        self.step = step
        self.give_up_at_ns = give_up_at_ns
        #: Releases sent to the program, arrivals it reported, and calls held back as
        #: planned past ``give_up_at_ns``: when every call sent has arrived and some
        #: are held back, nothing earlier can come and the step is cut.
        self.sent = self.arrived = 0
        self.held_back = False
        #: The step was cut (``X`` sent to the program).
        self.stopped = False
        self.tracker = step_tracker(step, step_begin_ns, driver.pacing, driver.on_compute)
        self.ids = driver.ids(step)
        peers = driver.peers
        self.owned = frozenset(range(len(step.calls)) if peers is None else peers.owned(step))
        #: Calls whose completion the tracker has (this process's own count from the start:
        #: they come from the program, not from the peers).
        self.fed = np.zeros(len(step.calls), dtype=bool)
        self.fed[list(self.owned)] = True
        self.last_end_ns = step_begin_ns
        #: The latest release sent to the program (perf ns): until then, and a call's
        #: deadline after it, the program may rightly say nothing.
        self.latest_release_ns = step_begin_ns
        #: Guards the tracker; notified when another process's call completes.
        self.lock = threading.Condition()

    def _release_ready(self) -> None:
        """Send the program the owned calls that became releasable (hold ``lock``)."""
        entries = []
        for index in self.tracker.take_releasable():
            release = self.tracker.release_ns(index)
            assert release is not None
            if index not in self.owned:
                continue
            if self.give_up_at_ns is not None and release > self.give_up_at_ns:
                self.held_back = True
                continue
            entries.append((index, self.ids[index], self.driver.to_monotonic(release)))
            self.latest_release_ns = max(self.latest_release_ns, release)
        self.sent += len(entries)
        if entries:
            self.driver.engine.process.send(Encoder("D").entries(entries).frame())

    def _arrived(self, arrivals: Sequence[tuple[int, int]]) -> None:
        """Calls completed, (index, end perf ns) each: fed to the tracker, then whatever
        they released sent in one frame (hold ``lock``).  A release depends only on the
        completions of what its call waits for, so a batch releases what one by one would."""
        for index, end_ns in arrivals:
            self.last_end_ns = max(self.last_end_ns, end_ns)
            self.tracker.complete(index, end_ns)
        self._release_ready()

    def _take_remote(self) -> None:
        """The worker's other processes' completions (on the peers' thread)."""
        peers = self.driver.peers
        assert peers is not None
        with self.lock:
            self._arrived(peers.arrivals(self.fed))
            self.lock.notify_all()

    def run(self, run_begin_ns: int, samples: list[CallSample] | None) -> StepOutcome:
        peers = self.driver.peers
        if peers is not None:
            peers.begin_step()
            peers.on_arrivals(self._take_remote)
        try:
            report = self._replay(run_begin_ns, samples)
            if report.error:
                raise TransportError(report.error)
            if peers is not None:
                self._take_remote()
                with self.lock:
                    while not self.cut and self.tracker.completed_count < len(self.step.calls):
                        if peers.broken:
                            raise TransportError(
                                "another client process of this worker stopped mid-step"
                            )
                        self.lock.wait(PEER_POLL_S)
        finally:
            if peers is not None:
                peers.on_arrivals(None)
        last_end = self.last_end_ns
        if peers is not None:
            last_end = peers.end_step(last_end)
        if self.cut:
            return StepOutcome(last_end_ns=last_end, cut=True)
        return StepOutcome(
            last_end_ns=last_end,
            next_begin_ns=self.tracker.next_step_begin_ns(),
            path=self.tracker.critical_path(),
        )

    @property
    def cut(self) -> bool:
        return self.stopped

    def _cut_if_nothing_else_can_come(self) -> None:
        """Every call sent has arrived and one is held back past the run's last moment: no
        earlier release can come now, so the step ends here, cut (hold ``lock``)."""
        if self.held_back and not self.stopped and self.arrived == self.sent:
            self.stopped = True
            self.driver.engine.process.send(Encoder("X").frame())

    def _silence_s(self) -> float:
        """How long the program may say nothing before it is taken to be stuck: until the
        latest release it was given, then a call's deadline, and a margin."""
        with self.lock:
            until_release = max(self.latest_release_ns - self.driver.clock(), 0) / 1e9
        return until_release + self.driver.deadline_s + SILENCE_MARGIN_S

    def _replay(self, run_begin_ns: int, samples: list[CallSample] | None) -> StepReport:
        """This process's calls of the step, released as their inputs arrive."""
        driver = self.driver
        calls = self.step.calls
        kept: list[StepReport] = []  # as an ordered step's (``NativeDriver.finish``)
        try:
            with self.lock:
                driver.engine.process.send(
                    Encoder("R").i64(-1).u8(STEP_DEPENDENT).u32(len(self.owned)).entries([]).frame()
                )
                self._release_ready()
                self._cut_if_nothing_else_can_come()
            self._take_arrivals()
            return driver.keep_report(calls, run_begin_ns, samples, kept)
        except KeyboardInterrupt:
            if not kept:
                driver.stop_step()
                driver.await_report(calls, run_begin_ns, samples, kept)
            raise

    def _take_arrivals(self) -> None:
        """The step's arrivals taken as they come, until its ``F`` frame is here."""
        driver = self.driver
        process = driver.engine.process
        while process.await_frame(self._silence_s()) == "C":
            arrivals = [(tag, driver.to_perf(end)) for tag, end in process.take().arrivals()]
            if driver.peers is not None:
                driver.peers.publish_many(arrivals)
            with self.lock:
                self.arrived += len(arrivals)
                self._arrived(arrivals)
                self._cut_if_nothing_else_can_come()
