"""What-if clusters: a captured parameter-server step as M workers and N ps would send it.

Pure: no gRPC, no clocks, no IO.  ``derive_trace`` turns a captured trace into
the trace the larger (or different) cluster would have given; the replay then
builds its workload from it exactly as from a captured one (``trace_workload``), so
the derived step keeps the dependency edges, compute gaps and round barrier
that model infers (``dependencies``).

Variables (``trace_variables``)
-------------------------------
A *variable* is what a worker pulls from a ps with ``RecvTensor`` (a
non-empty tensor with a rendezvous key) together with the gradient the ps
pulls back for it.  Identity is the tensor's edge name in the rendezvous key
(stable across workers and steps in every shipped trace).  The k-th pulled
tensor of a (dtype, shape) on a ps is paired with the k-th pushed tensor of the
same dtype and shape on that ps, in the order the trace first shows them: the
gradient of a variable has its dtype and shape and is applied by the ps that
holds it.  Same-shaped variables paired the other way round move the same
bytes to the same ps, so the pairing cannot change what is sent where.  A
tensor that pairs with nothing (a TF1 step counter pushed alone) is a variable
of its own, moved one way.

The trace's variable order reconstructs the creation order TensorFlow dealt
out round-robin: each ps's variables in the order they were first pulled, then
interleaved ps by ps (ps 0's first, ps 1's first, ..., ps 0's second, ...).

Placement (``place_variables``)
-------------------------------
* ``round-robin`` (TensorFlow's default: ``ParameterServerStrategy`` and
  ``replica_device_setter`` both deal variables out to the ps in turn): the
  k-th variable of the trace's order goes to ps ``k mod N``.  With N equal to
  the captured ps count the captured placement is kept as it is: it *is*
  TensorFlow's round-robin placement, over variables the trace partly does not
  show (optimizer slots and counters living on the ps but never pulled).
* ``size``: greedy by bytes, as TF1's ``GreedyLoadBalancingStrategy`` with
  ``byte_size_load_fn``: in the trace's order, each variable to the ps holding
  the fewest bytes so far (lowest index on a tie).

The derived step
----------------
Derived worker ``i`` is captured worker ``i mod W`` and derived ps ``j`` stands
for captured ps ``j mod P``; other tasks (a chief) stay themselves.  In every
step:

* a variable's pull by worker ``i`` goes to the ps the placement gives it, and
  its gradient comes from there; times, sizes and method are the captured
  worker's (tensor bytes times ``scale_tensors``);
* an empty tensor a worker pulls from a ps that the op reading a variable there
  made (the 21-byte control edges of variable reads: same op name as the
  variable's pull) goes with that variable, to its derived ps;
* every other RPC (control calls such as ``RunComponentFunction``, other empty
  control-edge tensors, the chief's ``Enqueue``) is per-task traffic: it is
  made once for every pair of derived tasks that stand for its two captured
  tasks (each worker with each ps; the chief with each worker), or, between two
  tasks of the same job (ps to ps), once per replica of the caller with the
  callee shifted alike (ps ``j`` to ps ``j + b - a``), when that ps exists.
  So with fewer ps than captured, the extra ps's per-task traffic is gone (its
  work merged into the remaining ps's), and with more, it is repeated.

``scale_tensors`` multiplies the content of every tensor (``RecvTensor``
and ``RecvBuf`` responses), keeping the message's own overhead: a model whose
every layer is X times wider.  Start-up and teardown traffic is left out (the
replay does not use it).  M and N equal to the captured cluster with scale 1
give the captured trace back, RPC for RPC.
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from tf_grpc_bench.dependencies import source_op
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.trace import RECV_TENSOR, TENSOR_METHODS, Phase, Rpc, Step, Task, Trace

#: Largest ``--scale-tensors``: beyond, a typo (a 100x wider ResNet-50 is 10 GB a step).
MAX_SCALE_TENSORS = 100.0


class Placement(enum.Enum):
    """How variables are spread over the derived ps."""

    ROUND_ROBIN = "round-robin"
    SIZE = "size"


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    """The cluster asked about."""

    workers: int
    ps: int
    placement: Placement = Placement.ROUND_ROBIN
    scale_tensors: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Variable:
    """One variable as the trace shows it: pulled from a ps, its gradient pulled back."""

    #: The captured ps task (index into ``trace.tasks``) that held it.
    ps_task: int
    #: Edge names of its pull and of its gradient (``""`` for a direction it never takes).
    pull_edge: str
    push_edge: str
    dtype: str
    shape: tuple[int, ...]
    #: Tensor content bytes one way (the pull's, else the push's).
    content_bytes: int

    @property
    def name(self) -> str:
        """The edge name without its ``edge_N_`` prefix (the op that read or made it)."""
        return _op_name(self.pull_edge or self.push_edge)


def captured_cluster(trace: Trace) -> tuple[list[int], list[int]]:
    """(worker tasks, ps tasks) of a parameter-server trace, by task index.

    ``ConfigError`` for a trace without both (a what-if needs ps and workers).
    """
    workers, ps = trace.tasks_of_job("worker"), trace.tasks_of_job("ps")
    if not workers or not ps:
        raise ConfigError(
            "--workers/--ps on a trace: a what-if needs a parameter-server trace with worker "
            f"and ps tasks; this one has {', '.join(t.name for t in trace.tasks)}"
        )
    return workers, ps


def _op_name(edge: str) -> str:
    """An edge name without its ``edge_N_`` prefix: the op that made the tensor."""
    return source_op(edge) or edge


def _variable_transfer(trace: Trace, rpc: Rpc) -> tuple[int, str, bool] | None:
    """(ps task, edge name, is a pull) when ``rpc`` moves a variable or its gradient."""
    transfer = _worker_ps_tensor(trace, rpc)
    if transfer is None or rpc.tensor is None or rpc.tensor.content_bytes <= 0:
        return None
    return transfer


def _worker_ps_tensor(trace: Trace, rpc: Rpc) -> tuple[int, str, bool] | None:
    """(ps task, edge name, is a pull) when ``rpc`` moves a named tensor between a worker
    and a ps, empty or not."""
    tensor = rpc.tensor
    if rpc.method != RECV_TENSOR or tensor is None or not tensor.edge_name:
        return None
    caller, callee = trace.tasks[rpc.caller_task].job, trace.tasks[rpc.callee_task].job
    if caller == "worker" and callee == "ps":
        return rpc.callee_task, tensor.edge_name, True
    if caller == "ps" and callee == "worker":
        return rpc.caller_task, tensor.edge_name, False
    return None


def trace_variables(trace: Trace) -> tuple[Variable, ...]:
    """The trace's variables, in the trace's variable order (module docstring)."""
    _, ps_tasks = captured_cluster(trace)
    #: Per ps and direction: edge -> (dtype, shape, content bytes), in first-seen order.
    seen: dict[tuple[int, bool], dict[str, tuple[str, tuple[int, ...], int]]] = {}
    for step in trace.steps:
        for rpc in sorted(step.rpcs, key=lambda r: (r.start_ns, r.end_ns)):
            transfer = _variable_transfer(trace, rpc)
            if transfer is None or rpc.tensor is None:
                continue
            ps, edge, pull = transfer
            found = seen.setdefault((ps, pull), {})
            if edge not in found:
                found[edge] = (rpc.tensor.dtype, rpc.tensor.shape, rpc.tensor.content_bytes)
    per_ps = [_paired(ps, seen.get((ps, True), {}), seen.get((ps, False), {})) for ps in ps_tasks]
    interleaved = itertools.chain.from_iterable(itertools.zip_longest(*per_ps))
    return tuple(v for v in interleaved if v is not None)


def _paired(
    ps: int,
    pulls: Mapping[str, tuple[str, tuple[int, ...], int]],
    pushes: Mapping[str, tuple[str, tuple[int, ...], int]],
) -> list[Variable]:
    """One ps's variables: pulls paired with same-typed pushes in order, then lone pushes."""
    waiting: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for edge, (dtype, shape, _) in pushes.items():
        waiting.setdefault((dtype, shape), []).append(edge)
    variables = []
    for edge, (dtype, shape, size) in pulls.items():
        queue = waiting.get((dtype, shape), [])
        push = queue.pop(0) if queue else ""
        variables.append(
            Variable(
                ps_task=ps,
                pull_edge=edge,
                push_edge=push,
                dtype=dtype,
                shape=shape,
                content_bytes=size,
            )
        )
    lone = {edge for queue in waiting.values() for edge in queue}
    for edge, (dtype, shape, size) in pushes.items():
        if edge in lone:
            variables.append(
                Variable(
                    ps_task=ps,
                    pull_edge="",
                    push_edge=edge,
                    dtype=dtype,
                    shape=shape,
                    content_bytes=size,
                )
            )
    return variables


def place_variables(
    variables: Sequence[Variable],
    ps_count: int,
    placement: Placement,
    *,
    captured_ps: Sequence[int] = (),
) -> tuple[int, ...]:
    """The derived ps (0 .. ``ps_count``-1) of each variable, in the order given.

    ``captured_ps``: the captured ps tasks in ps order; when round-robin over as
    many ps as were captured, each variable stays where it was captured.
    """
    if placement is Placement.ROUND_ROBIN:
        if captured_ps and ps_count == len(captured_ps):
            return tuple(captured_ps.index(v.ps_task) for v in variables)
        return tuple(k % ps_count for k in range(len(variables)))
    loads = [0] * ps_count
    chosen = []
    for variable in variables:
        target = min(range(ps_count), key=lambda j: (loads[j], j))
        loads[target] += variable.content_bytes
        chosen.append(target)
    return tuple(chosen)


def check_what_if(trace: Trace, what_if: WhatIf) -> tuple[Variable, ...]:
    """The trace's variables; ``ConfigError`` naming the flag when the cluster asked for
    cannot be derived from this trace."""
    if what_if.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {what_if.workers}")
    if what_if.ps < 1:
        raise ConfigError(f"--ps must be >= 1, got {what_if.ps}")
    scale = what_if.scale_tensors
    if not (scale > 0 and scale <= MAX_SCALE_TENSORS):
        raise ConfigError(f"--scale-tensors must be in (0, {MAX_SCALE_TENSORS:g}], got {scale:g}")
    captured_cluster(trace)
    variables = trace_variables(trace)
    if not variables:
        raise ConfigError(
            "--ps: the trace shows no variables (no tensors pulled from its ps tasks) to place"
        )
    if what_if.ps > len(variables):
        raise ConfigError(
            f"--ps {what_if.ps}: the trace has {len(variables)} variables to place, "
            f"so at most {len(variables)} ps"
        )
    return variables


@dataclass(frozen=True, slots=True)
class _Cluster:
    """How derived tasks stand for captured ones."""

    #: The captured trace (task indices of its RPCs are into its ``tasks``).
    trace: Trace
    #: The derived cluster's tasks.
    tasks: tuple[Task, ...]
    workers: list[int]
    ps: list[int]
    what_if: WhatIf
    #: Derived task index of (job, replica number).
    derived: dict[tuple[str, int], int]
    #: Derived task index of each captured non-ps, non-worker task.
    others: dict[int, int]

    def replicas(self, task: int) -> list[tuple[str, int, int]]:
        """(job, rank of the captured task in its job, derived replica number) standing for it."""
        job = self.trace.tasks[task].job
        if job == "worker":
            rank, count, total = self.workers.index(task), len(self.workers), self.what_if.workers
        elif job == "ps":
            rank, count, total = self.ps.index(task), len(self.ps), self.what_if.ps
        else:
            return [(job, -1, -1)]
        return [(job, rank, number) for number in range(rank, total, count)]

    def task_of(self, job: str, number: int, captured: int) -> int:
        return self.others[captured] if number < 0 else self.derived[(job, number)]


def _derived_tasks(trace: Trace, workers: list[int], ps: list[int], what_if: WhatIf) -> _Cluster:
    """The derived task list: each captured ps/worker replaced by its replicas, in place."""
    tasks: list[Task] = []
    derived: dict[tuple[str, int], int] = {}
    others: dict[int, int] = {}
    for index, task in enumerate(trace.tasks):
        if task.job not in ("worker", "ps"):
            others[index] = len(tasks)
            tasks.append(task)
            continue
        members = workers if task.job == "worker" else ps
        total = what_if.workers if task.job == "worker" else what_if.ps
        rank = members.index(index)
        for number in range(rank, total, len(members)):
            derived[(task.job, number)] = len(tasks)
            same = number == rank and task.index == number
            tasks.append(task if same else Task(job=task.job, index=number, address=task.address))
    return _Cluster(trace, tuple(tasks), workers, ps, what_if, derived, others)


def _scaled(rpc: Rpc, scale: float) -> Rpc:
    """``rpc`` with its tensor content scaled (the message's overhead kept)."""
    if scale == 1.0 or rpc.method not in TENSOR_METHODS or rpc.tensor is None:
        return rpc
    content = rpc.tensor.content_bytes
    grown = round(content * scale)
    return replace(
        rpc,
        response_bytes=max(rpc.response_bytes + grown - content, 0),
        tensor=replace(rpc.tensor, content_bytes=grown),
    )


def _placed_with(
    cluster: _Cluster, rpc: Rpc, placed: Mapping[tuple[int, str], int]
) -> tuple[int, bool] | None:
    """(derived ps, is a pull) of a variable's transfer, or of an empty tensor the same
    op read on the same ps (a control edge of the variable's read); None otherwise."""
    transfer = _worker_ps_tensor(cluster.trace, rpc)
    if transfer is None or rpc.tensor is None:
        return None
    ps_task, edge, pull = transfer
    if rpc.tensor.content_bytes > 0:
        return placed[(ps_task, edge)], pull
    target = placed.get((ps_task, _READ_OF + _op_name(edge))) if pull else None
    return None if target is None else (target, pull)


#: Key prefix, in ``placed``, of the op that reads a variable (for its empty control edges).
_READ_OF = "read:"


def _copies(cluster: _Cluster, rpc: Rpc, placed: Mapping[tuple[int, str], int]) -> Iterator[Rpc]:
    """The derived RPCs standing for one captured RPC (module docstring)."""
    follows = _placed_with(cluster, rpc, placed)
    if follows is not None:
        ps_number, pull = follows
        worker = rpc.caller_task if pull else rpc.callee_task
        ps = cluster.derived[("ps", ps_number)]
        for job, _, number in cluster.replicas(worker):
            derived_worker = cluster.derived[(job, number)]
            caller, callee = (derived_worker, ps) if pull else (ps, derived_worker)
            yield replace(rpc, caller_task=caller, callee_task=callee)
        return
    callers = cluster.replicas(rpc.caller_task)
    callees = cluster.replicas(rpc.callee_task)
    if not callers or not callees:
        return  # a captured ps with no derived replica: its per-task traffic is gone
    if callers[0][0] == callees[0][0] and callers[0][1] >= 0:
        # Same job (ps to ps): each replica of the caller, the callee shifted alike.
        job, shift = callers[0][0], callees[0][1] - callers[0][1]
        total = cluster.what_if.ps if job == "ps" else cluster.what_if.workers
        pairs = [
            ((job, number), (job, number + shift))
            for _, _, number in callers
            if 0 <= number + shift < total
        ]
    else:
        pairs = [((a[0], a[2]), (b[0], b[2])) for a in callers for b in callees]
    for (caller_job, caller_number), (callee_job, callee_number) in pairs:
        yield replace(
            rpc,
            caller_task=cluster.task_of(caller_job, caller_number, rpc.caller_task),
            callee_task=cluster.task_of(callee_job, callee_number, rpc.callee_task),
        )


def derive_trace(trace: Trace, what_if: WhatIf) -> Trace:
    """The trace the cluster ``what_if`` describes would have given (module docstring).

    ``ConfigError`` when it cannot be derived (``check_what_if``).
    """
    variables = check_what_if(trace, what_if)
    workers, ps = captured_cluster(trace)
    placement = place_variables(variables, what_if.ps, what_if.placement, captured_ps=ps)
    placed: dict[tuple[int, str], int] = {}
    for variable, target in zip(variables, placement, strict=True):
        for edge in (variable.pull_edge, variable.push_edge):
            if edge:
                placed[(variable.ps_task, edge)] = target
        if variable.pull_edge:
            placed[(variable.ps_task, _READ_OF + variable.name)] = target
    cluster = _derived_tasks(trace, workers, ps, what_if)
    steps = tuple(
        Step(
            index=step.index,
            start_ns=step.start_ns,
            end_ns=step.end_ns,
            rpcs=tuple(
                _scaled(copy, what_if.scale_tensors)
                for rpc in step.rpcs
                for copy in _copies(cluster, rpc, placed)
            ),
        )
        for step in trace.steps
    )
    identity = (
        what_if.workers == len(workers)
        and what_if.ps == len(ps)
        and what_if.scale_tensors == 1.0
        and what_if.placement is Placement.ROUND_ROBIN
    )
    if identity:
        return replace(trace, steps=steps)
    return replace(trace, tasks=cluster.tasks, steps=steps, startup=Phase(), teardown=Phase())


def bytes_per_ps(trace: Trace, what_if: WhatIf) -> dict[int, int]:
    """Variable content bytes each derived ps holds (``--placement`` at a glance)."""
    variables = check_what_if(trace, what_if)
    _, ps = captured_cluster(trace)
    placement = place_variables(variables, what_if.ps, what_if.placement, captured_ps=ps)
    held: Counter[int] = Counter()
    for variable, target in zip(variables, placement, strict=True):
        held[target] += round(variable.content_bytes * what_if.scale_tensors)
    return {j: held[j] for j in range(what_if.ps)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Derivation:
    """What a what-if replay was: the cluster asked about, and the capture it came from.

    Recorded as the result document's ``what_if``.
    """

    workers: int
    ps: int
    placement: str
    scale_tensors: float
    #: The trace it was derived from (its name or path) and that trace's cluster.
    trace: str
    captured_workers: int
    captured_ps: int
    #: Variables placed over the ps.
    variables: int

    def __post_init__(self) -> None:
        for name in ("workers", "ps", "captured_workers", "captured_ps", "variables"):
            if getattr(self, name) < 1:
                raise ValueError(f"what_if.{name} must be >= 1, got {getattr(self, name)}")
        if not self.scale_tensors > 0:
            raise ValueError(f"what_if.scale_tensors must be > 0, got {self.scale_tensors}")
        Placement(self.placement)

    def asked(self) -> WhatIf:
        """The ``WhatIf`` this derivation records (to derive the same trace again)."""
        return WhatIf(
            workers=self.workers,
            ps=self.ps,
            placement=Placement(self.placement),
            scale_tensors=self.scale_tensors,
        )

    def describe(self) -> str:
        """One line for the report."""
        wider = "" if self.scale_tensors == 1.0 else f", tensors x{self.scale_tensors:g}"
        return (
            f"what-if: {self.workers} workers x {self.ps} ps ({self.placement} placement of "
            f"{self.variables} variables{wider}), derived from {self.trace} captured with "
            f"{self.captured_workers} workers x {self.captured_ps} ps, not captured on that cluster"
        )


def derivation(trace: Trace, what_if: WhatIf, *, trace_name: str) -> Derivation:
    """The ``Derivation`` of ``what_if`` applied to ``trace``."""
    workers, ps = captured_cluster(trace)
    return Derivation(
        workers=what_if.workers,
        ps=what_if.ps,
        placement=what_if.placement.value,
        scale_tensors=what_if.scale_tensors,
        trace=trace_name,
        captured_workers=len(workers),
        captured_ps=len(ps),
        variables=len(trace_variables(trace)),
    )
