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

How a replay releases the calls under this model is ``dependency_tracker``'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


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
