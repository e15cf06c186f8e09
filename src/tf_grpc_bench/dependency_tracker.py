"""When a replayed step's calls may go under the dependency model, and its critical path.

Pure: no gRPC, no clocks, no IO.  Times are ns; the tracker is given them.
What each call waits for is inferred in ``dependencies`` (which says why).

Release time in a replay
------------------------
With ``s`` the compute scale (1: the recorded compute, 0: none, 0.5: twice as
fast), a step begun at ``B`` and ``done(j)`` the replay's completion of call
``j``, a call is released at::

    done(j*) + s * max(ready(c) - max over waited-for j of arrival(j),
                       min(ready(c) - arrival(j*) - R(j*), C))

with ``j*`` the waited-for call that completed last in the replay, ``R(j*)``
the time the trace spent receiving the waited-for inputs that arrived after
``j*`` (the union of their transfers, from ``arrival(j*)`` on), and ``C`` the
capture machine's compute of a whole training step (the trace's calibration;
0 where it records none): after the last of its inputs to arrive in the
replay, the compute that followed the last of them to arrive in the trace,
or, if more, what followed ``j*`` in the trace while no later input was on its
way, up to a whole step's compute; a call that waits for nothing is released
at ``B + s * ready(c)``.
The first term keeps only the compute after the last input: TensorFlow's
dataflow runs what an earlier input allows while later inputs are still on the way: in
the trace the time from an early arrival to ``ready(c)`` is partly that
compute and partly waiting for the later inputs, and the two cannot be told
apart. (Keeping the whole of it, a max-plus over every input, counts that
waiting once more whenever the replay delivers an early input late, as a slow
link that shares itself among concurrent transfers does: a loopback trace's
spread of arrivals was added to the step.) The second term is for the input
that arrives last here but early in the trace, whose compute overlapped the
later inputs' transfers there and cannot here (variables that share a slow
link arrive together at its end, and the whole forward pass follows): without
it a TF1 replay kept a few ms where training on the link computed 30 to 125
ms.  Less ``R(j*)``: while a later input was on its way the trace may have been
computing or waiting for it, and nothing tells which; on a link they are on
their way almost all the time, and counted as compute that wait was carried
into the replay whenever it delivered an early input last.

The worker's next step begins after the step's last arrival in the replay
plus what followed the step's last arrival in the trace until its end (the
recorded tail), and not before every call completed.  Where the steps are
rounds that a barrier ends (a synchronous coordinator's join), the tail is what
followed the *round's* last arrival: a worker that finished early in the trace
spent the rest of its step waiting for the others, and the replay's barrier
waits for them anew.

A compute load (``replay.core.compute_load``) is told of each compute gap as it
is planned (``on_compute``): from the completion a call waited for, or the
step's begin, to its release; and the step's tail, once.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tf_grpc_bench.dependencies import Dependencies

#: Placeholder for "no arrival yet": any completion time is later.
_NEVER = -(1 << 62)


class _ArrivalList:
    """Completions of one arrival list, with the latest completion over its complete prefix."""

    __slots__ = ("_argmax", "_complete", "_done", "_maxima")

    def __init__(self, length: int) -> None:
        self._done: list[int | None] = [None] * length
        self._complete = 0
        #: _maxima[k]: the latest completion of the first k arrivals; _argmax[k]: whose.
        self._maxima = [_NEVER]
        self._argmax = [-1]

    def record(self, rank: int, done_ns: int) -> None:
        if self._done[rank] is not None:
            raise ValueError(f"arrival {rank} recorded twice")
        self._done[rank] = done_ns
        while self._complete < len(self._done) and self._done[self._complete] is not None:
            done = self._done[self._complete]
            assert done is not None
            # ">=": on a tie the later arrival binds (the natural critical path).
            if done >= self._maxima[-1]:
                self._maxima.append(done)
                self._argmax.append(self._complete)
            else:
                self._maxima.append(self._maxima[-1])
                self._argmax.append(self._argmax[-1])
            self._complete += 1

    @property
    def complete_count(self) -> int:
        """How many arrivals, from the first in trace order, have all completed."""
        return self._complete

    def latest(self, count: int) -> tuple[int, int] | None:
        """(latest completion, its rank) of the first ``count`` arrivals; None while incomplete."""
        if count > self._complete:
            return None
        return self._maxima[count], self._argmax[count]


def _arrival_spans(
    deps: Sequence[Dependencies], index_of: dict[tuple[bool, int, int], int]
) -> dict[int, list[tuple[int, int]]]:
    """Per arrival list (-1: the worker's, else a server's), its arrivals' (arrival,
    transfer start) in the trace, in rank order (trace completion order)."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for (_, server, _), index in sorted(index_of.items()):
        spans.setdefault(server, []).append(
            (deps[index].arrival_offset_ns, deps[index].transfer_start_ns)
        )
    return spans


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPath:
    """A replayed (or captured) step's critical path, split into compute and communication.

    ``compute_ns`` sums the compute gaps kept on the path (scaled), including
    the wait before the step's first call and the step's recorded tail;
    ``communication_ns`` is the rest of the step: transfers, and any waiting
    of the replay itself.
    """

    step_ns: int
    compute_ns: int
    communication_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PathSegment:
    """One stretch of a step's critical path: a call's transfer, or compute before it.

    ``call`` is the index of the call (in the order the tracker was given)
    whose data moved from ``start_ns`` (its release) to ``end_ns`` (its
    completion), or -1 for compute: the gap from the arrival the path waited
    for (or the step's begin) to the next release, and the step's tail.
    """

    start_ns: int
    end_ns: int
    call: int


class DependencyTracker:
    """Release times of one worker-step's calls under the dependency model.

    Pure and clock-free: the driver tells it when the step began and when each
    call completed, and asks when a call may go.  Not thread-safe: callers
    hold their own lock.
    """

    def __init__(
        self,
        dependencies: Sequence[Dependencies],
        *,
        servers: Sequence[int],
        step_begin_ns: int,
        period_ns: int,
        compute_scale: float = 1.0,
        step_compute_ns: int = 0,
        round_tail_ns: int | None = None,
        on_compute: Callable[[int, int], None] | None = None,
    ) -> None:
        """``on_compute(start_ns, end_ns)``: told of each compute gap as it is planned.

        ``step_compute_ns``: the capture machine's compute of a whole training step
        run alone (the trace's calibration), 0 where unknown: the most compute the
        replay keeps after the input that arrived last in the replay (``release_ns``).

        ``round_tail_ns``: for a step that is a round ended by a barrier
        (``Workload.round_barrier``), what followed the round's last arrival, of
        any worker, in the trace until the round ended; the tail kept after this
        worker's last arrival (``next_step_begin_ns``).  None: the step is this
        worker's own, its tail is what followed its own last arrival until the
        step's end."""
        if compute_scale < 0:
            raise ValueError(f"compute scale must be >= 0, got {compute_scale}")
        if step_compute_ns < 0:
            raise ValueError(f"step compute must be >= 0, got {step_compute_ns}")
        if round_tail_ns is not None and round_tail_ns < 0:
            raise ValueError(f"round tail must be >= 0, got {round_tail_ns}")
        if len(servers) != len(dependencies):
            raise ValueError("one server per call")
        self._deps = tuple(dependencies)
        self._servers = tuple(servers)
        self._begin = step_begin_ns
        self._period = period_ns
        self._scale = compute_scale
        self._step_compute = step_compute_ns
        self._round_tail = round_tail_ns
        self._on_compute, self._tail_told = on_compute, False
        self._worker = _ArrivalList(
            sum(1 for d in self._deps if d.is_arrival and d.lands_on_worker)
        )
        self._by_server = {
            server: _ArrivalList(
                sum(
                    1
                    for d, s in zip(self._deps, self._servers, strict=True)
                    if s == server and d.is_arrival and not d.lands_on_worker
                )
            )
            for server in set(self._servers)
        }
        #: Per call: planned release (absolute ns), the call it waited for
        #: (index into ``dependencies``, -1 for none), its completion.
        self._released: dict[int, tuple[int, int]] = {}
        self._completed: dict[int, int] = {}
        self._index_of: dict[tuple[bool, int, int], int] = {
            (d.lands_on_worker, -1 if d.lands_on_worker else s, d.arrival_rank): i
            for i, (d, s) in enumerate(zip(self._deps, self._servers, strict=True))
            if d.is_arrival
        }
        self._spans = _arrival_spans(self._deps, self._index_of)
        self._receiving_cache: dict[tuple[int, int, int, int], int] = {}
        # Calls whose waited-for arrivals are not all in: first by how many of the
        # worker's arrivals they wait for, then by how many at their server.
        self._waiting_for_worker = [(d.after_worker_arrivals, i) for i, d in enumerate(self._deps)]
        heapq.heapify(self._waiting_for_worker)
        self._waiting_for_server: dict[int, list[tuple[int, int]]] = {
            server: [] for server in self._by_server
        }
        self._releasable: list[int] = []
        #: The step's last arrival in the trace: its recorded tail follows it.
        self._last_arrival_offset = max(
            (d.arrival_offset_ns for d in self._deps if d.is_arrival), default=0
        )
        #: In a round, a step of control calls only (the chief's) keeps none of the
        #: trace's times: they were when the workers finished there (``release_ns``).
        self._untimed = round_tail_ns is not None and not any(d.is_arrival for d in self._deps)
        self._advance()

    @property
    def step_begin_ns(self) -> int:
        return self._begin

    @property
    def completed_count(self) -> int:
        """How many of the step's calls have completed."""
        return len(self._completed)

    def _advance(self) -> None:
        """Move calls whose waited-for prefixes are complete on, towards ``releasable``."""
        worker_done = self._worker.complete_count
        while self._waiting_for_worker and self._waiting_for_worker[0][0] <= worker_done:
            _, index = heapq.heappop(self._waiting_for_worker)
            heapq.heappush(
                self._waiting_for_server[self._servers[index]],
                (self._deps[index].after_server_arrivals, index),
            )
        for server, waiting in self._waiting_for_server.items():
            server_done = self._by_server[server].complete_count
            while waiting and waiting[0][0] <= server_done:
                self._releasable.append(heapq.heappop(waiting)[1])

    def take_releasable(self) -> list[int]:
        """Calls that became releasable (all they wait for has arrived) since the last take.

        Each call is returned once; ask ``release_ns`` for its time.
        """
        taken, self._releasable = self._releasable, []
        return taken

    def _scaled(self, offset_ns: int) -> int:
        return round(self._scale * offset_ns)

    def _list_of(self, index: int) -> _ArrivalList:
        if self._deps[index].lands_on_worker:
            return self._worker
        return self._by_server[self._servers[index]]

    def release_ns(self, index: int) -> int | None:
        """Absolute time call ``index`` may go, or None while what it waits for is in flight."""
        deps = self._deps[index]
        worker = self._worker.latest(deps.after_worker_arrivals)
        server = self._by_server[self._servers[index]].latest(deps.after_server_arrivals)
        if worker is None or server is None:
            return None
        # The binding arrival: the latest to complete; on a tie the later trace arrival.
        # The compute kept is what followed the last waited-for arrival in the trace.
        candidates, last_arrival = [], 0
        if deps.after_worker_arrivals:
            candidates.append((worker[0], self._owner_of_worker_rank(worker[1])))
            last = self._owner_of_worker_rank(deps.after_worker_arrivals - 1)
            last_arrival = max(last_arrival, self._deps[last].arrival_offset_ns)
        if deps.after_server_arrivals:
            candidates.append((server[0], self._owner_of_server_rank(index, server[1])))
            last = self._owner_of_server_rank(index, deps.after_server_arrivals - 1)
            last_arrival = max(last_arrival, self._deps[last].arrival_offset_ns)
        if candidates:
            done, waited = max(candidates, key=lambda c: (c[0], self._deps[c[1]].arrival_offset_ns))
            # TF1's sync token: the other workers' gradients arrived later in the trace;
            # the round barrier waits for them in the replay, the apply followed them.
            others = deps.others_arrival_offset_ns
            if others is not None:
                last_arrival = max(last_arrival, others)
            gap = deps.ready_offset_ns - last_arrival
            # The input that arrived last here may have arrived early in the trace,
            # where the compute it needed overlapped later inputs' transfers: keep
            # what followed it in the trace, up to a whole step's compute.
            # Less the time the trace spent receiving the inputs that arrived after
            # it: there the compute it allowed and the wait for them overlapped.
            # (Computed only where it can matter: the union costs a sort.)
            since_waited = deps.ready_offset_ns - max(
                self._deps[waited].arrival_offset_ns, _NEVER if others is None else others
            )
            if min(since_waited, self._step_compute) > gap:
                since_waited -= self._receiving(index, waited)
                gap = max(gap, min(since_waited, self._step_compute))
            release = done + self._scaled(gap)
        elif self._untimed:
            release, waited = self._begin, -1
        else:
            release, waited = self._begin + self._scaled(deps.ready_offset_ns), -1
        self._released[index] = (release, waited)
        if self._on_compute is not None:
            self._on_compute(self._begin if waited < 0 else self._completed[waited], release)
        return release

    def _receiving(self, index: int, waited: int) -> int:
        """How long the trace spent receiving the inputs of call ``index`` that
        arrived after ``waited`` did, from ``waited``'s arrival on (ns): the union
        of their transfers (``Dependencies.transfer_start_ns`` to arrival)."""
        deps = self._deps[index]
        server = self._servers[index]
        since = self._deps[waited].arrival_offset_ns
        key = (deps.after_worker_arrivals, deps.after_server_arrivals, server, since)
        if (cached := self._receiving_cache.get(key)) is not None:
            return cached
        spans: list[tuple[int, int]] = []
        for name, count in ((-1, deps.after_worker_arrivals), (server, deps.after_server_arrivals)):
            # Arrivals are listed in trace completion order: those after ``since``.
            listed = self._spans.get(name, [])[:count]
            first = bisect.bisect_right(listed, since, key=lambda span: span[0])
            spans.extend((max(start, since), end) for end, start in listed[first:])
        total, reached = 0, since
        for start, end in sorted(spans):
            if end > reached:
                total += end - max(start, reached)
                reached = end
        self._receiving_cache[key] = total
        return total

    def _owner_of_worker_rank(self, rank: int) -> int:
        return self._index_of[(True, -1, rank)]

    def _owner_of_server_rank(self, index: int, rank: int) -> int:
        return self._index_of[(False, self._servers[index], rank)]

    def complete(self, index: int, done_ns: int) -> None:
        """Call ``index`` completed at ``done_ns`` (absolute)."""
        deps = self._deps[index]
        self._completed[index] = done_ns
        if deps.is_arrival:
            self._list_of(index).record(deps.arrival_rank, done_ns)
            self._advance()

    def _latest_arrival(self) -> int:
        """Index of the step's latest-completing arrival (on a tie the later in the
        trace), or -1 for a step without arrivals."""
        owner = -1
        for index, done in self._completed.items():
            deps = self._deps[index]
            if not deps.is_arrival:
                continue
            best = self._completed.get(owner, _NEVER)
            if done > best or (
                done == best and deps.arrival_offset_ns > self._deps[owner].arrival_offset_ns
            ):
                owner = index
        return owner

    def next_step_begin_ns(self) -> int:
        """When the worker's next step begins: every call done, plus the step's recorded tail.

        The tail is what followed the step's last arrival in the trace; in a
        round (``round_tail_ns``), what followed the round's last arrival: the
        rest of what followed this worker's own was its wait for the others,
        which the replay's barrier makes anew (kept, it counted that wait twice
        whenever the replay's workers finished in another order or closer
        together than the trace's).  A step without arrivals lasts its recorded
        period, or in a round until its calls are done, which go as the round
        begins: the round's length is the workers'.  Call once every call of
        the step has completed.
        """
        if len(self._completed) != len(self._deps):
            raise ValueError("the step still has calls in flight")
        owner = self._latest_arrival()
        last_done = max(self._completed.values(), default=self._begin)
        if owner < 0:
            if self._round_tail is not None:
                return last_done
            return max(self._begin + self._scaled(self._period), last_done)
        if self._round_tail is not None:
            tail = self._scaled(self._round_tail)
        else:
            tail = self._scaled(self._period - self._last_arrival_offset)
        if self._on_compute is not None and not self._tail_told:
            self._tail_told = True
            self._on_compute(self._completed[owner], self._completed[owner] + tail)
        return max(self._completed[owner] + tail, last_done)

    def critical_path(self) -> StepPath:
        """The step's critical path, walked back from its end through the waited-for calls."""
        end = self.next_step_begin_ns()
        compute = sum(s.end_ns - s.start_ns for s in self.critical_path_segments() if s.call < 0)
        step = end - self._begin
        compute = min(compute, step)
        return StepPath(step_ns=step, compute_ns=compute, communication_ns=step - compute)

    def critical_path_segments(self) -> tuple[PathSegment, ...]:
        """The critical path as stretches in time order (absolute ns), compute and transfers.

        Call once every call of the step has completed.  Compute stretches of
        zero length are left out.
        """
        end = self.next_step_begin_ns()
        index = self._latest_arrival()
        segments: list[PathSegment] = []
        if index >= 0 and end > self._completed[index]:
            segments.append(PathSegment(start_ns=self._completed[index], end_ns=end, call=-1))
        while index >= 0:
            release, waited = self._released.get(index, (self._begin, -1))
            segments.append(
                PathSegment(start_ns=release, end_ns=self._completed[index], call=index)
            )
            gap_start = self._completed[waited] if waited >= 0 else self._begin
            if release > gap_start:
                segments.append(PathSegment(start_ns=gap_start, end_ns=release, call=-1))
            index = waited
        return tuple(reversed(segments))
