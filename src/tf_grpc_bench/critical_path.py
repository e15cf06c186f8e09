"""A capture's critical paths: each worker's step replayed onto itself under the dependency model.

Pure: no gRPC, no clocks, no IO.  Used by ``inspect``, the replay's timeline
and the bench scripts; the model is ``dependencies``', the walk
``dependency_tracker``'s, and the trace is read as a replay reads it
(``trace_mapping``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from tf_grpc_bench.dependencies import TimedCall, infer_dependencies
from tf_grpc_bench.dependency_tracker import (
    DependencyTracker,
    PathSegment,
    StepPath,
)
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import (
    MappedRpc,
    arrival_tail_ns,
    gradient_arrivals,
    map_steps,
    step_periods,
    steps_are_rounds,
    timed_call,
    trace_roles,
)


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


@dataclass(frozen=True, slots=True)
class _WorkerStep:
    """One client's calls in one captured step, as the captured paths need them."""

    #: Position in ``trace.steps``.
    number: int
    client: int
    period_ns: int
    #: Where the steps are rounds: what followed the round's last arrival until its
    #: period ended (``WorkloadStep.round_tail_ns``); None otherwise.
    round_tail_ns: int | None
    own: list[MappedRpc]
    timed: list[TimedCall]
    #: Where the steps are rounds: when every worker's gradients arrived at their ps
    #: (``infer_dependencies``' ``round_gradient_arrivals``); empty otherwise.
    gradient_arrivals: tuple[int, ...] = ()


def _worker_steps(trace: Trace) -> Iterator[_WorkerStep]:
    """Each client's calls and their timings, per captured step."""
    roles = trace_roles(trace)
    mapped_steps, _ = map_steps(trace, roles)
    rounds = steps_are_rounds(trace)
    for number, (step, period, mapped) in enumerate(
        zip(trace.steps, step_periods(trace), mapped_steps, strict=True)
    ):
        timed = [timed_call(m, roles.server_index(m.server_task), step.start_ns) for m in mapped]
        by_client: dict[int, tuple[list[MappedRpc], list[TimedCall]]] = {
            client: ([], []) for client in roles.step_clients
        }
        for call, timing in zip(mapped, timed, strict=True):
            if call.client_task in by_client:
                by_client[call.client_task][0].append(call)
                by_client[call.client_task][1].append(timing)
        # As the replay's (``arrival_tail_ns``): arrivals are the tensors
        # (``infer_dependencies``), of every client, side clients too.
        tail = (
            arrival_tail_ns((c.end_ns for c in timed if c.carries_tensor), period)
            if rounds
            else None
        )
        gradients = tuple(gradient_arrivals(timed)) if rounds else ()
        for client, (own, own_timed) in by_client.items():
            if own_timed:
                yield _WorkerStep(number, client, period, tail, own, own_timed, gradients)


def captured_critical_paths(trace: Trace) -> list[tuple[int, str, StepPath]]:
    """Each worker's critical path in each captured step: (step index, task name, path).

    The trace replayed onto itself under the dependency model (``dependencies``):
    the compute gaps and transfers along the chain of binding waits.
    """
    return [
        (
            trace.steps[step.number].index,
            trace.task_name(step.client),
            captured_critical_path(
                step.timed,
                period_ns=step.period_ns,
                round_tail_ns=step.round_tail_ns,
                round_gradient_arrivals=step.gradient_arrivals,
            ),
        )
        for step in _worker_steps(trace)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapturedSegment:
    """A stretch of a worker's captured critical path, in trace time (ns from capture start)."""

    start_ns: int
    end_ns: int
    #: The transfer's RPC, as an index into its step's ``rpcs``; -1 for compute.
    rpc_index: int


def captured_path_segments(trace: Trace) -> list[tuple[int, int, tuple[CapturedSegment, ...]]]:
    """Each worker's critical path per captured step, as stretches of compute and transfer.

    Returns (step position in ``trace.steps``, worker task, segments in time
    order).  ``TraceError`` if the trace has nothing to replay.
    """
    result = []
    for step in _worker_steps(trace):
        begin = trace.steps[step.number].start_ns
        segments = tuple(
            CapturedSegment(
                start_ns=begin + segment.start_ns,
                end_ns=begin + segment.end_ns,
                rpc_index=step.own[segment.call].rpc_index if segment.call >= 0 else -1,
            )
            for segment in captured_critical_path_segments(
                step.timed,
                period_ns=step.period_ns,
                round_tail_ns=step.round_tail_ns,
                round_gradient_arrivals=step.gradient_arrivals,
            )
        )
        result.append((step.number, step.client, segments))
    return result
