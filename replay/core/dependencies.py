"""Training's causality in a replayed step: which calls wait for which, and for how long.

Pure: no gRPC, no clocks, no IO.  Times are ns; the tracker is given them.

Why (docs/design.md#trainings-causality)
----------------------------------------
In parameter-server training a tensor leaves a task only once what it is
computed from has arrived there and the compute between them has run: a worker
sends its gradients only after it has pulled the variables and run forward and
backward.  A replay that releases calls by the trace's *request* times overlaps
the gradient pushes with the variable pulls (the ps asks for a gradient early;
the rendezvous request waits until the gradient exists) and, on a slow link,
predicts a step far shorter than training's.

The model, per worker and per step
----------------------------------
Each replayed call carries one *data message*: the tensor in a RecvTensor or
RecvBuf response (which a reversed call sends as its request), or the request
of any other method.  For every call the trace gives:

* ``ready``: when its data left its sender: ``response_start_ns`` for a tensor
  method (the tensor existed then), ``start_ns`` otherwise; less what was the
  sender's queue, as far as the tensor's identity tells: outputs of one op are
  ready when the first of them left (``_ready_times``), and a variable read is
  ready when it was asked for (``is_variable_read``);
* ``arrival``: when the call completed (``end_ns``), i.e. when its data had
  arrived at its receiver: at the worker for a pull (the worker calls the ps
  and the tensor comes back), at the ps for a reversed call (the ps pulled a
  gradient from the worker; the replay pushes it).

Inference rule: a call waits for every arrival, at the task its data leaves
from, that completed strictly before its data left, and, for a pull, also for
every arrival at the worker that completed strictly before the worker asked
for it.  Concretely:

* a reversed call (gradient, worker -> ps) waits for the worker's pulls that
  completed before ``ready``: backward needs the forward pass, which needs the
  variables that had arrived;
* a pull (variable, ps -> worker) waits for the worker's own earlier arrivals
  at this ps (its gradients that reached the ps before the variable left: a
  variable read after an update) and for the worker's pulls that completed
  before the pull's request left the worker.

Arrivals of other workers are not waited for: workers run in separate replay
processes, and training's cross-worker ordering (a synchronous ps waiting for
every worker's gradient) is not in one worker's trace.  What arrived *before*
is taken as what the data was *computed from*; the tensor identities in a
PS step agree (every gradient depends on the whole forward pass), and an
arrival that was in fact unrelated can only delay the call.

One such ordering is TF1's sync token (``is_sync_token``), the last call of a
``SyncReplicasOptimizer`` worker's step: the ps gives it once *every* worker's
gradients have arrived and been applied.  Where the steps are rounds that a
barrier ends, the replay's barrier already waits for the other workers, so the
token keeps as compute only what followed the round's last gradient arrival
before it left (the apply; ``others_arrival_offset_ns``), not the time from
this worker's own gradients, which on a link is mostly the wait for the other
worker's.  The round then ends at the last worker's gradients plus the apply,
as training's does; the early worker's token goes early, a few bytes.

Because every waited-for arrival completed strictly before the call's data
left, sorting a step's calls by ``ready`` is a topological order, and the sets
a call waits for are prefixes of the arrivals in completion order.  The
tracker therefore needs one running maximum (of completion times) per arrival
list, not an edge list.

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
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Placeholder for "no arrival yet": any completion time is later.
_NEVER = -(1 << 62)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedCall:
    """One replayed call of a worker-step as the trace timed it (ns from the step's start)."""

    #: The ps (server index) the replayed call goes to.
    server: int
    #: The trace's RPC went from the ps to the worker (a gradient pull), replayed as a push.
    reversed_direction: bool
    #: The trace's data was the response's tensor (RecvTensor, RecvBuf).
    carries_tensor: bool
    start_ns: int
    response_start_ns: int
    end_ns: int
    #: The TensorFlow op whose output the tensor is (the rendezvous key's edge
    #: name without its ``edge_N_`` prefix), or ``""`` when not known.
    source_op: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Dependencies:
    """What a call waits for, and when its data left and arrived in the trace.

    Offsets are ns from the trace step's start.  The call waits for the first
    ``after_worker_arrivals`` arrivals at its worker and the first
    ``after_server_arrivals`` arrivals (from its worker) at its server, both in
    trace completion order; its own place in its arrival list is
    ``arrival_rank``.
    """

    ready_offset_ns: int
    arrival_offset_ns: int
    lands_on_worker: bool
    #: When its data began to arrive (a tensor's response start), None: at its
    #: arrival.  From then until ``arrival_offset_ns`` its receiver was receiving it.
    transfer_offset_ns: int | None = None
    #: Whether others wait for this call's completion: only a tensor's arrival
    #: counts (a control call's completion marks the callee's work finishing,
    #: which the replay's server does not redo).
    is_arrival: bool = True
    arrival_rank: int = 0
    after_worker_arrivals: int = 0
    after_server_arrivals: int = 0
    #: For TF1's sync token (``is_sync_token``): the latest arrival at a ps of any
    #: worker's gradient before the token left, None for any other call.  The ps gives
    #: the token once every worker's gradients are in and applied; the replay's round
    #: barrier waits for the other workers, so only what followed this arrival (the
    #: apply) is the token's compute.
    others_arrival_offset_ns: int | None = None

    def __post_init__(self) -> None:
        for name in ("arrival_rank", "after_worker_arrivals", "after_server_arrivals"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.arrival_offset_ns < self.ready_offset_ns:
            raise ValueError("a call's data cannot arrive before it left")
        if self.transfer_offset_ns is not None and not (
            self.ready_offset_ns <= self.transfer_offset_ns <= self.arrival_offset_ns
        ):
            raise ValueError("a call's data must begin to arrive between leaving and arriving")
        if (
            self.others_arrival_offset_ns is not None
            and self.others_arrival_offset_ns > self.ready_offset_ns
        ):
            raise ValueError("a call cannot wait for an arrival after its data left")

    @property
    def transfer_start_ns(self) -> int:
        """When the call's data began to arrive in the trace (ns from the step's start)."""
        return (
            self.arrival_offset_ns if self.transfer_offset_ns is None else self.transfer_offset_ns
        )


def ready_ns(call: TimedCall) -> int:
    """When the call's data left its sender in the trace."""
    return call.response_start_ns if call.carries_tensor else call.start_ns


def source_op(edge_name: str) -> str:
    """The op a rendezvous edge (``edge_6836_sgd/IdentityN``) carries an output of, or ``""``."""
    prefix, _, rest = edge_name.partition("_")
    number, _, op = rest.partition("_")
    return op if prefix == "edge" and number.isdigit() else ""


def is_variable_read(op: str) -> bool:
    """Whether ``op`` reads a variable (``.../ReadVariableOp``, ``.../ReadVariableOp_3``).

    A step's reads come before its updates of what they read: an update needs
    the gradient, which needs the forward pass, which needs the read (and in a
    ``tf.function`` automatic control dependencies order them as well).  So a
    read waits for no update of its own step.
    """
    return op.rpartition("/")[2].startswith("ReadVariableOp")


#: The queue of tokens ``tf.compat.v1.train.SyncReplicasOptimizer`` hands the workers.
SYNC_TOKEN_QUEUE = "sync_token_q"


def is_sync_token(op: str) -> bool:
    """Whether ``op`` is TF1's take of a sync token (``sync_token_q_Dequeue``).

    ``SyncReplicasOptimizer`` enqueues one token per worker once every worker's
    gradients have reached the ps and been applied; a worker's step ends when it
    has taken one.  So the token leaves the ps after *every* worker's
    gradients arrived, not only the taking worker's.
    """
    return op.rpartition("/")[2].startswith(SYNC_TOKEN_QUEUE)


def _ready_times(calls: Sequence[TimedCall]) -> list[int]:
    """Each call's ready time: outputs of one op ready together, a variable read when asked.

    An op's outputs exist together, when the op has run: TensorFlow 2's Keras
    optimizer passes every gradient through one ``IdentityN``, so a worker's
    gradients are ready at one instant, but the trace sees them leave one after
    another as the sender's connection drains.  That queueing is the link's
    (the replay queues them again on its own), not compute: a tensor of an op
    whose first output left earlier is taken as ready then.  Grouped per
    sender: the worker for a reversed call, the server for a pull.
    """

    def sender_op(call: TimedCall) -> tuple[int, str] | None:
        if not (call.carries_tensor and call.source_op):
            return None
        # -1: the worker itself sent it (a reversed call), whichever ps asked.
        return (-1 if call.reversed_direction else call.server, call.source_op)

    first: dict[tuple[int, str], int] = {}
    for call in calls:
        if (key := sender_op(call)) is not None:
            first[key] = min(first.get(key, call.response_start_ns), call.response_start_ns)
    ready = []
    for call in calls:
        key = sender_op(call)
        if key is None:
            ready.append(ready_ns(call))
        elif not call.reversed_direction and is_variable_read(call.source_op):
            # The variable existed when the worker asked: a later response is
            # the ps's queue, which the replay's server has of its own.
            ready.append(call.start_ns)
        else:
            # Never before its own request: the receiver asked for it then.
            ready.append(max(first[key], call.start_ns))
    return ready


def infer_dependencies(
    calls: Sequence[TimedCall], *, round_gradient_arrivals: Sequence[int] = ()
) -> tuple[Dependencies, ...]:
    """The dependencies of one worker's calls in one step, in the order given.

    ``round_gradient_arrivals``: where the step is a round that a barrier ends
    (``Workload.round_barrier``), when each worker's gradients (every reversed
    tensor call of the round) arrived at their ps, in ns from the step's start;
    a TF1 sync token (``is_sync_token``) keeps as its compute only what followed
    the last of them before it left (``Dependencies.others_arrival_offset_ns``).
    Empty: no such rule.

    See the module docstring for the rules.  Raises ``ValueError`` for a call
    whose times are out of order (end before response start before start).
    """
    for number, call in enumerate(calls):
        if not call.start_ns <= call.response_start_ns <= call.end_ns:
            raise ValueError(
                f"call {number}: times out of order (start {call.start_ns}, "
                f"response start {call.response_start_ns}, end {call.end_ns})"
            )
    worker_order = sorted(
        (i for i, c in enumerate(calls) if c.carries_tensor and not c.reversed_direction),
        key=lambda i: (calls[i].end_ns, i),
    )
    worker_ends = [calls[i].end_ns for i in worker_order]
    server_orders: dict[int, list[int]] = {}
    for i in sorted(
        (i for i, c in enumerate(calls) if c.carries_tensor and c.reversed_direction),
        key=lambda i: (calls[i].end_ns, i),
    ):
        server_orders.setdefault(calls[i].server, []).append(i)
    server_ends = {s: [calls[i].end_ns for i in order] for s, order in server_orders.items()}
    rank = {i: r for r, i in enumerate(worker_order)}
    for order in server_orders.values():
        rank.update({i: r for r, i in enumerate(order)})
    gradient_arrivals = sorted(round_gradient_arrivals)

    result = []
    for number, (call, ready) in enumerate(zip(calls, _ready_times(calls), strict=True)):
        if call.reversed_direction:
            after_worker = bisect.bisect_left(worker_ends, ready)
            after_server = 0
        else:
            after_worker = bisect.bisect_left(worker_ends, call.start_ns)
            after_server = bisect.bisect_left(server_ends.get(call.server, []), ready)
            if call.carries_tensor and is_variable_read(call.source_op):
                after_server = 0  # a read waits for no update of its own step
        others = None
        if (
            gradient_arrivals
            and call.carries_tensor
            and not call.reversed_direction
            and is_sync_token(call.source_op)
        ):
            before = bisect.bisect_left(gradient_arrivals, ready)
            others = gradient_arrivals[before - 1] if before else None
        result.append(
            Dependencies(
                ready_offset_ns=ready,
                arrival_offset_ns=call.end_ns,
                transfer_offset_ns=max(ready, call.response_start_ns)
                if call.carries_tensor
                else None,
                lands_on_worker=not call.reversed_direction,
                is_arrival=number in rank,
                arrival_rank=rank.get(number, 0),
                after_worker_arrivals=after_worker,
                after_server_arrivals=after_server,
                others_arrival_offset_ns=others,
            )
        )
    return tuple(result)


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
    ) -> None:
        """``step_compute_ns``: the capture machine's compute of a whole training step
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


def captured_critical_path(
    calls: Sequence[TimedCall],
    *,
    servers: Iterable[int] | None = None,
    period_ns: int,
    round_tail_ns: int | None = None,
    round_gradient_arrivals: Sequence[int] = (),
) -> StepPath:
    """The critical path of one worker's step as captured: the trace replayed onto itself.

    In a round (``round_tail_ns``, ``DependencyTracker``) the step is the round,
    ``period_ns``: what a worker that finished early spent waiting for the others
    is communication (theirs), not its compute; so is a TF1 sync token's wait for
    the other workers' gradients (``round_gradient_arrivals``, ``infer_dependencies``)."""
    path = _captured(
        calls, servers, period_ns, round_tail_ns, round_gradient_arrivals
    ).critical_path()
    if round_tail_ns is None:
        return path
    step = max(period_ns, path.step_ns)
    return StepPath(
        step_ns=step, compute_ns=path.compute_ns, communication_ns=step - path.compute_ns
    )


def captured_critical_path_segments(
    calls: Sequence[TimedCall],
    *,
    period_ns: int,
    round_tail_ns: int | None = None,
    round_gradient_arrivals: Sequence[int] = (),
) -> tuple[PathSegment, ...]:
    """``captured_critical_path`` as stretches of compute and transfer (ns from the step start)."""
    return _captured(
        calls, None, period_ns, round_tail_ns, round_gradient_arrivals
    ).critical_path_segments()


def _captured(
    calls: Sequence[TimedCall],
    servers: Iterable[int] | None,
    period_ns: int,
    round_tail_ns: int | None = None,
    round_gradient_arrivals: Sequence[int] = (),
) -> DependencyTracker:
    """A tracker that has replayed one worker's captured step onto itself."""
    dependencies = infer_dependencies(calls, round_gradient_arrivals=round_gradient_arrivals)
    tracker = DependencyTracker(
        dependencies,
        servers=[c.server for c in calls] if servers is None else list(servers),
        step_begin_ns=0,
        period_ns=period_ns,
        round_tail_ns=round_tail_ns,
    )
    # Replay the trace onto itself: completions at their end, releases at their
    # ready time; a completion at the same instant as a release is not waited for.
    events = sorted(
        [(call.end_ns, 0, i) for i, call in enumerate(calls)]
        + [(d.ready_offset_ns, 1, i) for i, d in enumerate(dependencies)],
        key=lambda event: (event[0], -event[1], event[2]),
    )
    for _, kind, index in events:
        if kind == 1:
            if tracker.release_ns(index) is None:
                raise AssertionError("a waited-for arrival ends before the data leaves")
        else:
            tracker.complete(index, calls[index].end_ns)
    return tracker
