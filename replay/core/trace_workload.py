"""A trace's steady-state steps as a workload: one benchmark's calls, step by step.

Pure: no gRPC, no clocks, no IO.  Which trace tasks become the replay's
servers and clients, and how each RPC is mapped, is ``tf_grpc_bench.trace_mapping``'s;
what each call waits for is the dependency model's (``tf_grpc_bench.dependencies``).

Training's workers are the *step clients*, listed first (so worker ``i`` of a
workload is the trace's ``i``-th worker whatever else is replayed); side
clients follow.  Side clients replay their calls with the same dependency
model, per task, but their steps are not training's steps: they record no step
time.  What is still dropped is said in the workload's parameters:
``dropped_rpcs_per_pass``, ``dropped_bytes_per_pass`` (both directions) and
``dropped_rpcs``, the kinds (caller job -> callee job, method) with their RPCs
and bytes.  A point-to-point replay also counts the other pairs' RPCs in
``dropped_rpcs_per_pass``.

Within each (client, server) pair calls keep the trace's order (by start time);
``outstanding_at_start`` is recomputed per pair after the mapping (how many
earlier calls of the pair were still open when this one started);
``offset_ns`` is the call's start relative to its step's start.

Steps.  A PS-throughput workload has one step per trace step, in order, even
a step without calls: in a trace of worker-steps (asynchronous training) each
step is one worker's, and every other worker has nothing to do in it, yet a
pass over the trace is every step once for every worker, and the Nth step is
the same trace step on every worker (``Workload.for_worker`` keeps the steps,
with that worker's calls).  A P2P workload keeps the steps in which its pair
talks.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Sequence

from tf_grpc_bench.dependencies import Dependencies, infer_dependencies
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.measurement import Benchmark, InexactSizes
from tf_grpc_bench.replay.core.workload import (
    Call,
    Mode,
    ParameterValue,
    Shape,
    Workload,
    WorkloadStep,
    pull_call,
)
from tf_grpc_bench.trace import Step, Trace, calibration_step_ns
from tf_grpc_bench.trace_mapping import (
    WHOLE_STEPS,
    MappedRpc,
    TraceRoles,
    WholeSteps,
    arrival_tail_ns,
    choose_pair,
    gradient_arrivals,
    map_steps,
    pair_servers,
    step_periods,
    steps_are_rounds,
    timed_call,
    trace_roles,
    unreplayed_summary,
)


def outstanding_per_pair(calls: Sequence[tuple[Hashable, int, int]]) -> list[int]:
    """For each call ``(pair, start_ns, end_ns)``, in order: how many earlier calls of
    its pair were still open when it started (ended after its start).

    O(n log n) however many calls overlap: per pair, a Fenwick tree over the
    calls' end times counts the earlier calls that had ended by each start.
    """
    by_pair: dict[Hashable, list[int]] = {}
    for position, (pair, _, _) in enumerate(calls):
        by_pair.setdefault(pair, []).append(position)
    result = [0] * len(calls)
    for positions in by_pair.values():
        ends = sorted({calls[p][2] for p in positions})
        ended = [0] * (len(ends) + 1)  # Fenwick tree: earlier calls by end time
        for earlier, position in enumerate(positions):
            _, start_ns, end_ns = calls[position]
            slot, closed = bisect.bisect_right(ends, start_ns), 0
            while slot > 0:
                closed += ended[slot]
                slot &= slot - 1
            result[position] = earlier - closed
            slot = bisect.bisect_left(ends, end_ns) + 1
            while slot <= len(ends):
                ended[slot] += 1
                slot += slot & -slot
    return result


def _step_dependencies(
    mapped: Sequence[MappedRpc], roles: TraceRoles, step_start_ns: int, *, rounds: bool = False
) -> list[Dependencies]:
    """Each call's dependencies, inferred per client task over its calls of the step;
    in a round, a worker's TF1 sync token follows every worker's gradients."""
    by_client: dict[int, list[int]] = {}
    for position, m in enumerate(mapped):
        by_client.setdefault(m.client_task, []).append(position)
    timed = [timed_call(m, roles.server_index(m.server_task), step_start_ns) for m in mapped]
    gradients = gradient_arrivals(timed) if rounds else []
    result: list[Dependencies | None] = [None] * len(mapped)
    for client, positions in by_client.items():
        inferred = infer_dependencies(
            [timed[p] for p in positions],
            round_gradient_arrivals=() if client in roles.side_clients else gradients,
        )
        for position, dependencies in zip(positions, inferred, strict=True):
            result[position] = dependencies
    return [d for d in result if d is not None]


def _pair_only(
    trace: Trace,
    roles: TraceRoles,
    steps: list[list[MappedRpc]],
    dropped: int,
    pair: tuple[int, int] | None,
) -> tuple[tuple[int, int], list[list[MappedRpc]], int]:
    """The steps' RPCs between one (worker, ps) pair (default: ``choose_pair``), and the
    dropped count grown by the others.  ConfigError for a pair that is not one."""
    if pair is None:
        pair = choose_pair(trace, roles)
    elif pair[1] not in pair_servers(roles) or pair[0] not in roles.step_clients:
        raise ConfigError(
            f"--pair: {trace.task_name(pair[0])} -> {trace.task_name(pair[1])} is not a "
            "(worker, ps) pair of this trace"
        )
    dropped += sum(1 for step in steps for m in step if (m.client_task, m.server_task) != pair)
    steps = [[m for m in step if (m.client_task, m.server_task) == pair] for step in steps]
    if not any(steps):
        raise ConfigError(
            f"--pair: {trace.task_name(pair[0])} and {trace.task_name(pair[1])} "
            "exchange no RPCs in the trace's steps"
        )
    return pair, steps, dropped


def _arrivals(calls: Sequence[Call]) -> Iterator[int]:
    """When each call's data arrived, for the calls others wait for (``Dependencies``)."""
    for call in calls:
        if call.dependencies is not None and call.dependencies.is_arrival:
            yield call.dependencies.arrival_offset_ns


def inexact_sizes(pairs: Iterable[tuple[tuple[int, int], tuple[int, int]]]) -> InexactSizes | None:
    """What differs between traced and replayed (request, response) sizes, or None."""
    changes: Counter[tuple[int, int]] = Counter()
    calls = traced = replayed = 0
    for (traced_request, traced_response), (request, response) in pairs:
        if (traced_request, traced_response) == (request, response):
            continue
        calls += 1
        traced += traced_request + traced_response
        replayed += request + response
        for before, after in ((traced_request, request), (traced_response, response)):
            if before != after:
                changes[(before, after)] += 1
    if not calls:
        return None
    ranked = sorted(changes.items(), key=lambda item: (-item[1], item[0]))
    examples = ", ".join(f"{b} B -> {a} B x{n}" for (b, a), n in ranked[:_INEXACT_EXAMPLES])
    if len(ranked) > _INEXACT_EXAMPLES:
        examples += ", ..."
    return InexactSizes(
        calls_per_pass=calls, traced_bytes=traced, replayed_bytes=replayed, examples=examples
    )


def _size_pairs(
    mapped: Sequence[MappedRpc], calls: Sequence[Call]
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Each call's traced and replayed (request, response) sizes, for ``inexact_sizes``."""
    return [
        ((m.request_bytes, m.response_bytes), (c.request_bytes, c.response_bytes))
        for m, c in zip(mapped, calls, strict=True)
    ]


#: How many kinds of size change ``inexact_sizes`` names.
_INEXACT_EXAMPLES = 3


def _step_calls(
    trace_step: Step,
    mapped: Sequence[MappedRpc],
    roles: TraceRoles,
    mode: Mode,
    *,
    point_to_point: bool,
    rounds: bool = False,
) -> tuple[Call, ...]:
    """One trace step's mapped RPCs as calls (one worker's when ``point_to_point``)."""
    outstanding = outstanding_per_pair(
        [((m.client_task, m.server_task), m.rpc.start_ns, m.rpc.end_ns) for m in mapped]
    )
    dependencies = _step_dependencies(mapped, roles, trace_step.start_ns, rounds=rounds)
    return tuple(
        pull_call(
            method=m.rpc.method,
            request_bytes=m.request_bytes,
            response_bytes=m.response_bytes,
            mode=mode,
            tensor_name=m.rpc.tensor.edge_name if m.rpc.tensor else "",
            server_index=roles.server_index(m.server_task),
            worker_index=0 if point_to_point else roles.client_index(m.client_task),
            step=trace_step.index,
            offset_ns=max(m.rpc.start_ns - trace_step.start_ns, 0),
            outstanding_at_start=count,
            reversed_direction=m.reversed_direction,
            dependencies=deps,
            rpc_index=m.rpc_index,
        )
        for m, count, deps in zip(mapped, outstanding, dependencies, strict=True)
    )


def _tasks_description(
    trace: Trace, roles: TraceRoles, pair: tuple[int, int] | None
) -> dict[str, ParameterValue]:
    """The tasks a workload's description names: its P2P ``pair``, else every client and
    server task of a PS-throughput replay."""
    if pair is not None:
        return {"pair": f"{trace.task_name(pair[0])}->{trace.task_name(pair[1])}"}
    return {
        "client_tasks": ",".join(trace.task_name(t) for t in roles.client_tasks),
        "side_clients": ",".join(trace.task_name(t) for t in roles.side_clients),
        "stand_in_servers": ",".join(trace.task_name(t) for t in roles.stand_in_servers),
    }


def pair_workload(
    trace: Trace,
    benchmark: Benchmark,
    *,
    mode: Mode,
    pair: tuple[int, int] | None = None,
    source: str = "trace",
    whole_steps: WholeSteps = WHOLE_STEPS,
) -> Workload:
    """The P2P benchmarks' trace workload: one (worker, ps) pair (``pair``, trace task
    indices; default ``choose_pair``)."""
    return trace_workload(
        trace, benchmark, mode=mode, pair=pair, source=source, whole_steps=whole_steps,
        point_to_point=True,
    )  # fmt: skip


def cluster_workload(
    trace: Trace,
    benchmark: Benchmark,
    *,
    mode: Mode,
    pair: tuple[int, int] | None = None,
    source: str = "trace",
    whole_steps: WholeSteps = WHOLE_STEPS,
) -> Workload:
    """PS throughput's trace workload: every worker against every ps, and with
    ``whole_steps`` the ps-to-ps and chief-to-worker calls too (``pair`` unused)."""
    return trace_workload(
        trace, benchmark, mode=mode, source=source, whole_steps=whole_steps,
        point_to_point=False,
    )  # fmt: skip


def trace_workload(
    trace: Trace,
    benchmark: Benchmark,
    *,
    mode: Mode,
    point_to_point: bool,
    pair: tuple[int, int] | None = None,
    source: str = "trace",
    whole_steps: WholeSteps = WHOLE_STEPS,
) -> Workload:
    """The trace's steady-state steps as one benchmark's calls (docs/design.md#replaying-a-trace).

    ``point_to_point``: one (worker, ps) pair, ``pair`` as trace task indices
    (default: ``choose_pair``); else every worker against every ps, and with
    ``whole_steps`` the ps-to-ps and chief-to-worker calls too
    (``tf_grpc_bench.trace_mapping``).  Every call is pull-shaped and keeps the
    trace's method.
    """
    roles = trace_roles(trace, source=source, whole_steps=whole_steps)
    steps, dropped = map_steps(trace, roles)
    dropped_bytes, dropped_kinds = unreplayed_summary(trace, roles)
    if point_to_point:
        pair, steps, dropped = _pair_only(trace, roles, steps, dropped, pair)
    step_compute = calibration_step_ns(trace.metadata.extra) or 0
    rounds = not point_to_point and steps_are_rounds(trace)
    workload_steps = []
    #: (traced, replayed) (request, response) sizes of every call, to find inexact ones.
    sizes: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for trace_step, period, mapped in zip(trace.steps, step_periods(trace), steps, strict=True):
        calls = _step_calls(
            trace_step, mapped, roles, mode, point_to_point=point_to_point, rounds=rounds
        )
        # PS throughput keeps every trace step, even one without calls (a pass is
        # every step once, for every worker); a pair keeps the steps it talks in.
        if calls or not point_to_point:
            workload_steps.append(
                WorkloadStep(
                    index=trace_step.index,
                    calls=calls,
                    period_ns=period,
                    step_compute_ns=step_compute,
                    round_tail_ns=arrival_tail_ns(_arrivals(calls), period) if rounds else None,
                )
            )
        sizes += _size_pairs(mapped, calls)
    description: dict[str, ParameterValue] = {
        "trace_steps": len(trace.steps),
        "calls_per_pass": sum(len(s.calls) for s in workload_steps),
        "reversed_calls_per_pass": sum(
            1 for s in workload_steps for c in s.calls if c.reversed_direction
        ),
        "dropped_rpcs_per_pass": dropped,
        "dropped_bytes_per_pass": dropped_bytes,
        "dropped_rpcs": dropped_kinds,
        "whole_steps": whole_steps.describe(),
        "ps": len(pair_servers(roles)),
        "workers": 1 if point_to_point else len(roles.step_clients),
        "server_tasks": ",".join(trace.task_name(t) for t in roles.server_tasks),
        "shape": Shape.PULL.value,
        "round_barrier": rounds,
    }
    description.update(_tasks_description(trace, roles, pair if point_to_point else None))
    return Workload(
        benchmark=benchmark,
        source="trace",
        mode=mode,
        steps=tuple(workload_steps),
        # A pair's server is a ps, and a P2P replay needs no stand-ins.
        server_count=len(pair_servers(roles) if point_to_point else roles.server_tasks),
        worker_count=1 if point_to_point else len(roles.client_tasks),
        description=tuple(description.items()),
        round_barrier=bool(description["round_barrier"]),
        inexact_sizes=inexact_sizes(sizes),
        side_workers=()
        if point_to_point
        else tuple(roles.client_index(t) for t in roles.side_clients),
        client_tasks=() if point_to_point else tuple(trace.tasks[t] for t in roles.client_tasks),
        server_tasks=() if point_to_point else tuple(trace.tasks[t] for t in roles.server_tasks),
    )
