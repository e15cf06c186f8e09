"""A trace as a replay sees it: which tasks serve, which call, and each RPC's direction.

Pure: no gRPC, no clocks, no IO.  Shared by the replay (``replay/core/trace_workload.py``
builds its calls from it) and by the analysis of a capture (``critical_path``), so that
both read a trace the same way.

From a trace to calls (docs/design.md#replaying-a-trace)
-------------------------------------------------------
Only gRPC servers of the replay's own exist in a replay.  *Server tasks* are
the trace's ``ps`` tasks; in a trace without ``ps`` tasks (e.g.
MultiWorkerMirrored) every task that is called is a server task.  *Client
tasks* are those that make a replayed call.  Each RPC of a steady-state step is
mapped as follows (a whole step, ``WholeSteps``; each kind can be turned off):

* client -> server (a worker pulling weights with RecvTensor, control calls):
  replayed as is, by that client against that server, with the trace's method
  path and sizes.
* server -> client (a ps pulling gradients from a worker with RecvTensor): in
  replay only the ps side has a server, so it is replayed by the worker's client
  against the ps server with request and response sizes swapped
  (``reversed_direction``): the large message now travels in the request, from
  the worker to the ps, which is the same link in the same direction as the
  trace's response.  The method path stays the trace's.
* server -> server, when servers are ps tasks (``WholeSteps.ps_clients``): the
  calling ps becomes a client too, a *side client*, which calls the other ps's
  server as in training.
* non-ps -> non-ps (the chief's control calls to workers,
  ``WholeSteps.stand_in_servers``): the callee gets a *stand-in server* of its
  own, after the ps servers in the server list, and the caller (a side client
  when it calls no ps) calls it as in training.
* a task calling itself (TF1's ``RunStep`` to a worker's own server) crosses no
  link and is replayed by no one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from tf_grpc_bench.dependencies import TimedCall, source_op
from tf_grpc_bench.errors import ConfigError, TraceError
from tf_grpc_bench.trace import TENSOR_METHODS, Rpc, Trace


@dataclass(frozen=True, slots=True, kw_only=True)
class MappedRpc:
    """One trace RPC as a replay sees it: who calls whom, which way the bytes go."""

    rpc: Rpc
    client_task: int
    server_task: int
    reversed_direction: bool
    #: Index of ``rpc`` in its trace step's ``rpcs``.
    rpc_index: int = -1

    @property
    def request_bytes(self) -> int:
        return self.rpc.response_bytes if self.reversed_direction else self.rpc.request_bytes

    @property
    def response_bytes(self) -> int:
        return self.rpc.request_bytes if self.reversed_direction else self.rpc.response_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class WholeSteps:
    """Which of a step's calls beyond worker <-> ps a trace replay makes (module docstring)."""

    #: A ps calling another ps (TF2's ps-to-ps RecvTensor) is replayed by a client of that ps.
    ps_clients: bool = True
    #: A non-ps task called by another (the chief's control calls to workers) gets a server.
    stand_in_servers: bool = True

    def describe(self) -> str:
        """For the result's parameters: what beyond worker <-> ps calls is replayed."""
        kinds = [
            text
            for wanted, text in (
                (self.ps_clients, "ps-to-ps by ps clients"),
                (self.stand_in_servers, "calls to workers by stand-in servers"),
            )
            if wanted
        ]
        return ", ".join(kinds) or "worker <-> ps only"


#: Every kind of call a replay can make: the default.
WHOLE_STEPS = WholeSteps()
#: Only what training's workers and ps exchange (``role``'s last resort, when its cluster
#: cannot place side clients).
WORKERS_AND_PS_ONLY = WholeSteps(ps_clients=False, stand_in_servers=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRoles:
    """Which trace tasks become servers and which become clients of a replay."""

    server_tasks: tuple[int, ...]
    client_tasks: tuple[int, ...]
    #: True when servers are the trace's ps tasks (else: every called task).
    ps_job: bool
    #: Server tasks that are not ps: stand-ins for a called worker (last in ``server_tasks``).
    stand_in_servers: tuple[int, ...] = ()
    #: Client tasks that are not training's workers: a ps calling a ps, a chief calling
    #: only workers (last in ``client_tasks``); their steps are not training's.
    side_clients: tuple[int, ...] = ()
    whole_steps: WholeSteps = WHOLE_STEPS

    def server_index(self, task: int) -> int:
        return self.server_tasks.index(task)

    def client_index(self, task: int) -> int:
        return self.client_tasks.index(task)

    @property
    def step_clients(self) -> tuple[int, ...]:
        """The client tasks that are training's workers, in client order."""
        return tuple(t for t in self.client_tasks if t not in self.side_clients)


def _sort_tasks(trace: Trace, tasks: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(tasks), key=lambda i: (trace.tasks[i].job, trace.tasks[i].index)))


def _map_rpc(
    rpc: Rpc, servers: frozenset[int], ps_job: bool, whole: WholeSteps
) -> MappedRpc | None:
    caller, callee = rpc.caller_task, rpc.callee_task
    if caller == callee:
        return None  # a task calling itself crosses no link
    caller_serves = caller in servers
    callee_serves = callee in servers
    if caller_serves and not callee_serves:
        return MappedRpc(rpc=rpc, client_task=callee, server_task=caller, reversed_direction=True)
    direct = (
        (callee_serves and not caller_serves)
        or (caller_serves and callee_serves and (not ps_job or whole.ps_clients))
        or (not caller_serves and not callee_serves and ps_job and whole.stand_in_servers)
    )
    if direct:
        return MappedRpc(rpc=rpc, client_task=caller, server_task=callee, reversed_direction=False)
    return None


def _is_step_client(mapped: MappedRpc, servers: frozenset[int], ps_job: bool) -> bool:
    """Whether the call's client is one of training's workers: it calls a ps or a ps calls it."""
    if not ps_job:
        return True
    return mapped.server_task in servers and mapped.client_task not in servers


def trace_roles(
    trace: Trace, *, source: str = "trace", whole_steps: WholeSteps = WHOLE_STEPS
) -> TraceRoles:
    """Decide servers and clients (see the module docstring)."""
    rpcs = [rpc for step in trace.steps for rpc in step.rpcs]
    if not rpcs:
        raise TraceError(f"{source}: no RPCs in steady-state steps, nothing to replay")
    ps_tasks = frozenset(trace.tasks_of_job("ps"))
    ps_job = bool(ps_tasks)
    servers = ps_tasks or frozenset(r.callee_task for r in rpcs)
    step_clients: set[int] = set()
    clients: set[int] = set()
    used_servers: set[int] = set()
    for rpc in rpcs:
        mapped = _map_rpc(rpc, servers, ps_job, whole_steps)
        if mapped is not None:
            clients.add(mapped.client_task)
            used_servers.add(mapped.server_task)
            if _is_step_client(mapped, servers, ps_job):
                step_clients.add(mapped.client_task)
    if not step_clients:
        raise TraceError(f"{source}: no RPC between a worker and a ps, nothing to replay")
    if not ps_job:
        # Without a ps job a task may both serve and call; it then appears in both lists.
        return TraceRoles(
            server_tasks=_sort_tasks(trace, used_servers),
            client_tasks=_sort_tasks(trace, clients),
            ps_job=False,
            whole_steps=whole_steps,
        )
    side = _sort_tasks(trace, clients - step_clients)
    stand_ins = _sort_tasks(trace, used_servers - servers)
    return TraceRoles(
        server_tasks=_sort_tasks(trace, servers) + stand_ins,
        client_tasks=_sort_tasks(trace, step_clients) + side,
        ps_job=True,
        stand_in_servers=stand_ins,
        side_clients=side,
        whole_steps=whole_steps,
    )


def map_steps(trace: Trace, roles: TraceRoles) -> tuple[list[list[MappedRpc]], int]:
    steps, unreplayed = _mapped_and_unreplayed(trace, roles)
    return steps, len(unreplayed)


def _mapped_and_unreplayed(
    trace: Trace, roles: TraceRoles
) -> tuple[list[list[MappedRpc]], list[Rpc]]:
    """Each step's RPCs as the replay maps them, and the RPCs no replay task can make."""
    servers = frozenset(t for t in roles.server_tasks if t not in roles.stand_in_servers)
    steps: list[list[MappedRpc]] = []
    unreplayed: list[Rpc] = []
    for step in trace.steps:
        mapped_step = []
        for index, rpc in enumerate(step.rpcs):
            mapped = _map_rpc(rpc, servers, roles.ps_job, roles.whole_steps)
            if mapped is None:
                unreplayed.append(rpc)
            else:
                mapped_step.append(replace(mapped, rpc_index=index))
        mapped_step.sort(key=lambda m: (m.rpc.start_ns, m.rpc.end_ns))
        steps.append(mapped_step)
    return steps, unreplayed


def unreplayed_summary(trace: Trace, roles: TraceRoles | None = None) -> tuple[int, str]:
    """Bytes per pass of the RPCs a replay cannot make, and what they are.

    The text lists each kind as ``caller job->callee job method: RPCs, bytes``
    (both directions' bytes), most bytes first; empty when nothing is dropped.
    """
    if roles is None:
        roles = trace_roles(trace)
    _, unreplayed = _mapped_and_unreplayed(trace, roles)
    kinds: dict[str, list[int]] = {}
    for rpc in unreplayed:
        caller = trace.tasks[rpc.caller_task].job
        callee = trace.tasks[rpc.callee_task].job
        method = rpc.method.rsplit("/", 1)[-1]
        entry = kinds.setdefault(f"{caller}->{callee} {method}", [0, 0])
        entry[0] += 1
        entry[1] += rpc.request_bytes + rpc.response_bytes
    total = sum(size for _, size in kinds.values())
    ranked = sorted(kinds.items(), key=lambda item: (-item[1][1], item[0]))
    text = "; ".join(f"{kind}: {count} RPCs, {size} B" for kind, (count, size) in ranked)
    return total, text


def pair_bytes(trace: Trace, roles: TraceRoles | None = None) -> dict[tuple[int, int], int]:
    """Bytes moved per (client task, server task) pair over all steady-state steps."""
    roles = roles or trace_roles(trace)
    totals: Counter[tuple[int, int]] = Counter()
    for step in map_steps(trace, roles)[0]:
        for m in step:
            totals[(m.client_task, m.server_task)] += m.rpc.request_bytes + m.rpc.response_bytes
    return dict(totals)


def pair_servers(roles: TraceRoles) -> tuple[int, ...]:
    return tuple(t for t in roles.server_tasks if t not in roles.stand_in_servers)


def choose_pair(trace: Trace, roles: TraceRoles | None = None) -> tuple[int, int]:
    """The (worker task, ps task) pair that moved the most bytes; lowest indices on a tie."""
    roles = roles or trace_roles(trace)
    servers, clients = pair_servers(roles), roles.step_clients
    totals = {
        pair: size
        for pair, size in pair_bytes(trace, roles).items()
        if pair[0] in clients and pair[1] in servers
    }
    return max(sorted(totals), key=lambda pair: totals[pair])


def parse_pair(text: str, trace: Trace) -> tuple[int, int]:
    """``worker:0,ps:1`` (job:index of the worker, then of the ps) -> task indices."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise ConfigError(
            f"--pair {text!r}: expected WORKER_JOB:INDEX,PS_JOB:INDEX, e.g. worker:0,ps:0"
        )
    indices = []
    for part in parts:
        job, _, number = part.partition(":")
        matches = [
            i
            for i, t in enumerate(trace.tasks)
            if t.job == job and number.isdigit() and t.index == int(number)
        ]
        if not matches:
            names = ", ".join(f"{t.job}:{t.index}" for t in trace.tasks)
            raise ConfigError(f"--pair {text!r}: no task {part!r} in the trace (tasks: {names})")
        indices.append(matches[0])
    return indices[0], indices[1]


def step_periods(trace: Trace) -> list[int]:
    periods = []
    for number, step in enumerate(trace.steps):
        if number + 1 < len(trace.steps):
            periods.append(max(trace.steps[number + 1].start_ns - step.start_ns, 0))
        else:
            periods.append(step.duration_ns)
    return periods


#: How far a step's last tensor transfer may run into the next step, as a share of the
#: step's period, for the steps still to be rounds (``steps_are_rounds``).
ROUND_OVERLAP_SHARE = 0.05


def steps_are_rounds(trace: Trace) -> bool:
    """Whether every tensor transfer of each step ended before any of the next began,
    give or take ``ROUND_OVERLAP_SHARE`` of the step's period.

    Control calls (the coordinator's ``Enqueue`` of the next round) are left
    out: they announce the round, they are not its traffic.  Such steps are
    rounds separated by a barrier (a synchronous coordinator joins every
    worker's step before scheduling the next round), so a replay
    must not let one worker start a round before the others finished theirs.
    The barrier of tf1-ps (``SyncReplicasOptimizer``'s token queue) is looser: a
    worker may take its token and begin while a ps still pulls the other's last
    gradient (9.9 ms into a 400 ms step in one loopback capture, once in seven
    steps), so an overlap that small does not undo the rounds: without the
    barrier the replayed workers drift apart, which training's do not.  Needs at
    least two steps to tell.
    """
    if len(trace.steps) < 2:
        return False
    for step, following in itertools.pairwise(trace.steps):
        ends = [r.end_ns for r in step.rpcs if r.method in TENSOR_METHODS]
        starts = [r.start_ns for r in following.rpcs if r.method in TENSOR_METHODS]
        if not ends or not starts:
            return False
        period = following.start_ns - step.start_ns
        if max(ends) - min(starts) > ROUND_OVERLAP_SHARE * max(period, 0):
            return False
    return True


def arrival_tail_ns(arrival_offsets: Iterable[int], period_ns: int) -> int:
    """What followed a round's last arrival (offsets from its start) until its period ended."""
    return max(period_ns - max(arrival_offsets, default=period_ns), 0)


def timed_call(mapped: MappedRpc, server_index: int, step_start_ns: int) -> TimedCall:
    rpc = mapped.rpc
    start = max(rpc.start_ns - step_start_ns, 0)
    response_start = max(rpc.response_start_ns - step_start_ns, start)
    return TimedCall(
        server=server_index,
        reversed_direction=mapped.reversed_direction,
        carries_tensor=rpc.method in TENSOR_METHODS,
        start_ns=start,
        response_start_ns=response_start,
        end_ns=max(rpc.end_ns - step_start_ns, response_start),
        source_op=source_op(rpc.tensor.edge_name) if rpc.tensor is not None else "",
    )


def gradient_arrivals(timed: Iterable[TimedCall]) -> list[int]:
    """When the step's gradients (its reversed tensor calls: a ps pulling a worker's
    tensor) arrived at their ps (``infer_dependencies``' ``round_gradient_arrivals``)."""
    return [c.end_ns for c in timed if c.reversed_direction and c.carries_tensor]
