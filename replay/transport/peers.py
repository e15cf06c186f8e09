"""A worker's client processes kept in step: shared completions, step ends and decisions.

With ``--procs-per-worker K`` a worker's calls are split over K processes
(``core.processes``).  The processes of one worker share:

* the completion time of every call of the current step (a shared array of
  ``CLOCK_MONOTONIC`` ns, tagged with the step's number), each process
  waking the others through a pipe when its calls complete (once for the
  completions it learns of together), so every process's dependency tracker
  sees the whole worker-step;
* a barrier at the end of each step, where each process says when its last
  call ended: a step ends when all of the worker's calls have ended, and
  everyone knows when that was;
* a barrier where the first process (the *leader*, which also records the
  worker's step times) decides whether to go on, so that all K replay the same
  steps.

A process that stops (an error, a stop signal) breaks the barrier: the others
end their run too instead of waiting for calls that will not come.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core.processes import ProcessSplit
from tf_grpc_bench.replay.core.workload import Workload, WorkloadStep

#: How often a process waiting for the others' calls checks that none has stopped.
PEER_POLL_S = 0.2

#: What holds a process's run interrupt while it uses a barrier shared with other
#: processes, given how to break that barrier from another thread should the interrupt
#: come meanwhile (``throughput._RunInterrupt.held``).
Hold = Callable[[Callable[[], None]], AbstractContextManager[object]]


def unheld(_breaking: Callable[[], None]) -> AbstractContextManager[object]:
    """No hold (a process that no run interrupt reaches)."""
    return contextlib.nullcontext()


def perf_minus_monotonic_ns() -> int:
    """``perf_counter_ns() - monotonic_ns()``: 0 where both read the same clock (Linux),
    so that times passed between processes in monotonic ns come back exact."""
    perf, monotonic = time.get_clock_info("perf_counter"), time.get_clock_info("monotonic")
    if perf.implementation == monotonic.implementation:
        return 0
    return time.perf_counter_ns() - time.monotonic_ns()


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerLinks:
    """What one of a worker's processes gets of the shared state; picklable at spawn only."""

    process: int
    count: int
    split: ProcessSplit
    #: Shared int64 arrays: per call of the step, its end (monotonic ns) and step number.
    done: Any
    generation: Any
    #: Shared int64 array: per process, the end of its last call of the step (monotonic ns).
    ends: Any
    #: Shared byte: the leader's decision to stop.
    vote: Any
    barrier: Any
    #: This process's end of its wake-up pipe, and the writing ends of the others'.
    inbox: multiprocessing.connection.Connection
    outboxes: tuple[multiprocessing.connection.Connection, ...]


def make_links(context: Any, workload: Workload, split: ProcessSplit) -> list[PeerLinks]:
    """Shared state for one worker's ``split.count`` processes (``context``: a spawn context)."""
    size = max((len(step.calls) for step in workload.steps), default=0) or 1
    done = context.RawArray("q", size)
    generation = context.RawArray("q", size)
    ends = context.RawArray("q", split.count)
    vote = context.RawValue("b", 0)
    barrier = context.Barrier(split.count)
    pipes = [context.Pipe(duplex=False) for _ in range(split.count)]
    return [
        PeerLinks(
            process=process,
            count=split.count,
            split=split,
            done=done,
            generation=generation,
            ends=ends,
            vote=vote,
            barrier=barrier,
            inbox=pipes[process][0],
            outboxes=tuple(writer for other, (_, writer) in enumerate(pipes) if other != process),
        )
        for process in range(split.count)
    ]


class Peers:
    """One process's side of the shared state (``PeerLinks``), built in that process.

    ``publish`` may be called from gRPC's threads; the arrival callback runs on
    a thread of its own.  ``begin_step``, ``end_step``, ``agree`` and
    ``leave`` are the replaying thread's.
    """

    def __init__(
        self,
        links: PeerLinks,
        steps: Sequence[WorkloadStep],
        timeout_s: float,
        *,
        hold: Hold = unheld,
    ) -> None:
        self._links = links
        self._timeout_s = timeout_s
        #: Holds the run's interrupt while the shared barrier is used: an exception raised
        #: inside its wait or notify leaves its shared state broken for the other processes.
        self._hold = hold
        self._done = np.frombuffer(links.done, dtype=np.int64)
        self._generation = np.frombuffer(links.generation, dtype=np.int64)
        self._ends = np.frombuffer(links.ends, dtype=np.int64)
        #: perf_counter_ns - monotonic_ns: the shared values are monotonic ns.
        self._offset = perf_minus_monotonic_ns()
        self._owned = {
            id(step): links.split.owned(position, links.process)
            for position, step in enumerate(steps)
        }
        self._local_steps = {id(step): _local_step(step, self._owned[id(step)]) for step in steps}
        self.step_number = 0
        self._send_lock = threading.Lock()
        self._listener_lock = threading.Lock()
        self._listener: Callable[[], None] | None = None
        threading.Thread(target=self._listen, name="peer-arrivals", daemon=True).start()

    @property
    def leader(self) -> bool:
        return self._links.process == 0

    @property
    def broken(self) -> bool:
        return bool(self._links.barrier.broken)

    def owned(self, step: WorkloadStep) -> tuple[int, ...]:
        """Indices of ``step``'s calls this process makes."""
        return self._owned[id(step)]

    def local_step(self, step: WorkloadStep) -> WorkloadStep:
        """``step`` with this process's calls only."""
        return self._local_steps[id(step)]

    def begin_step(self) -> None:
        self.step_number += 1

    def publish(self, index: int, end_ns: int) -> None:
        """Call ``index`` of the current step (made here) completed at ``end_ns`` (perf ns)."""
        self.publish_many(((index, end_ns),))

    def publish_many(self, arrivals: Sequence[tuple[int, int]]) -> None:
        """Calls of the current step (made here) completed, (index, end perf ns) each: the
        others are woken once for all of them."""
        if not arrivals:
            return
        for index, end_ns in arrivals:
            self._done[index] = end_ns - self._offset
            self._generation[index] = self.step_number
        with self._send_lock:
            for outbox in self._links.outboxes:
                # A process that is gone breaks the barrier: the others learn it there.
                with contextlib.suppress(OSError):
                    outbox.send_bytes(b"")

    def arrivals(self, fed: np.ndarray) -> list[tuple[int, int]]:
        """Completions of the current step not yet in ``fed`` (marked there): (index, perf ns)."""
        size = len(fed)
        new = np.flatnonzero((self._generation[:size] == self.step_number) & ~fed)
        fed[new] = True
        return [(int(i), int(self._done[i]) + self._offset) for i in new]

    def on_arrivals(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` (on the peers' thread) whenever another process's call completes."""
        with self._listener_lock:
            self._listener = listener

    def _listen(self) -> None:
        inbox = self._links.inbox
        while True:
            try:
                inbox.recv_bytes()
                while inbox.poll(0):
                    inbox.recv_bytes()
            except (EOFError, OSError):
                return
            with self._listener_lock:
                listener = self._listener
            if listener is not None:
                listener()

    def _wait(self) -> bool:
        with self._hold(self._links.barrier.abort):
            try:
                self._links.barrier.wait(self._timeout_s)
            except threading.BrokenBarrierError:
                return False
        return True

    def end_step(self, last_end_ns: int) -> int:
        """Wait for the worker's other processes to end the step; the last end over all (perf ns).

        ``TransportError`` if one of them stopped.
        """
        self._ends[self._links.process] = last_end_ns - self._offset
        if not self._wait():
            raise TransportError("another client process of this worker stopped mid-step")
        return int(self._ends.max()) + self._offset

    def agree(self, stop: bool) -> bool:
        """The leader's ``stop``, the same in every process; True if one of them has left."""
        if self.leader:
            self._links.vote.value = 1 if stop else 0
        if not self._wait():
            return True
        return bool(self._links.vote.value)

    def leave(self) -> None:
        """This process stops: release the others waiting, now or later."""
        with self._hold(self._links.barrier.abort):
            self._links.barrier.abort()


class RoundBarrier:
    """A ``StepBarrier`` over a ``multiprocessing.Barrier`` shared by the worker processes
    (every process of every worker, when the trace's steps are rounds).

    Broken (aborted) by the first worker that stops, so none waits for a round the
    others will not finish; the parent resets it before each phase.  ``hold`` holds the
    run's interrupt while the barrier is used (``throughput._RunInterrupt.held``).
    """

    def __init__(
        self,
        barrier: Any,
        timeout_s: float,
        hold: Hold = unheld,
    ) -> None:
        self._barrier = barrier
        self._timeout_s = timeout_s
        self._hold = hold

    def wait(self) -> bool:
        with self._hold(self._barrier.abort):
            try:
                self._barrier.wait(self._timeout_s)
            except threading.BrokenBarrierError:
                return False
        return True

    def leave(self) -> None:
        with self._hold(self._barrier.abort):
            self._barrier.abort()


def _local_step(step: WorkloadStep, owned: Sequence[int]) -> WorkloadStep:
    return replace(step, calls=tuple(step.calls[i] for i in owned))
