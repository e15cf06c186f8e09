"""A trace from recorded calls and step windows (pure): start-up, steps, teardown.

* an RPC belongs to the step whose window contains its start (the latest such
  window when asynchronous windows overlap; an RPC between two windows belongs
  to the next one); RPCs before the first steady window are start-up (graph
  registration, variable initialisation, warm-up steps), after the last one
  teardown; with step-id windows, an RPC goes to the window of its step id;
* times are ns from the start of the capture (the recorder's start).

No TensorFlow, no IO: records in, trace out, tested without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tf_grpc_bench import trace as trace_model
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.profiler.assembly.rpcs import calls_to_rpcs
from tf_grpc_bench.profiler.assembly.steps import StepWindow, step_id_of, step_windows
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.trace import Phase, Rpc, RunMetadata, Step, Task, Trace


def split_into_steps(
    rpcs: Sequence[Rpc],
    windows: Sequence[StepWindow],
    *,
    origin_ns: int,
    step_ids: Sequence[int] | None = None,
    startup_step_ids: frozenset[int] = frozenset(),
) -> tuple[Phase, tuple[Step, ...], Phase]:
    """(start-up, steps, teardown) from RPCs and step windows (see the module docstring).

    ``step_ids`` (parallel to ``rpcs``, 0 for none) puts an RPC in the window
    of its step id, or in start-up if its id is in ``startup_step_ids`` (a
    warm-up step), whatever its time; the others go by time.
    """
    relative = [(w.start_ns - origin_ns, w.end_ns - origin_ns) for w in windows]
    by_step_id = {w.step_id: number for number, w in enumerate(windows) if w.step_id}
    startup: list[Rpc] = []
    teardown: list[Rpc] = []
    per_step: list[list[Rpc]] = [[] for _ in windows]
    for position, rpc in enumerate(rpcs):
        t = rpc.start_ns
        step_id = step_ids[position] if step_ids is not None else 0
        if step_id and step_id in by_step_id:
            per_step[by_step_id[step_id]].append(rpc)
            continue
        if step_id and step_id in startup_step_ids:
            startup.append(rpc)
            continue
        if not relative or t < relative[0][0]:
            startup.append(rpc)
            continue
        if t > relative[-1][1]:
            teardown.append(rpc)
            continue
        chosen = None
        for number, (start, end) in enumerate(relative):
            if start > t:
                if chosen is None:
                    chosen = number  # in a gap: the next step
                break
            if t <= end:
                chosen = number  # the latest window that contains t
        if chosen is None:
            # After the end of every window that started before t, and no later window.
            teardown.append(rpc)
        else:
            per_step[chosen].append(rpc)
    steps = tuple(
        Step(
            index=number,
            start_ns=max(0, start),
            end_ns=max(0, end),
            rpcs=trace_model.with_outstanding(step_rpcs),
        )
        for number, ((start, end), step_rpcs) in enumerate(zip(relative, per_step, strict=True))
    )
    first_start = steps[0].start_ns if steps else max((r.end_ns for r in startup), default=0)
    last_end = steps[-1].end_ns if steps else first_start
    startup_phase = Phase(
        start_ns=0, end_ns=first_start, rpcs=trace_model.with_outstanding(startup)
    )
    teardown_phase = Phase(
        start_ns=last_end,
        end_ns=max([last_end, *(r.end_ns for r in teardown)]),
        rpcs=trace_model.with_outstanding(teardown),
    )
    return startup_phase, steps, teardown_phase


def assemble_trace(
    calls: Sequence[RecordedCall],
    *,
    tasks: Sequence[Task],
    caller_of_pid: Mapping[int, int],
    markers: Sequence[StepMarker] = (),
    windows: Sequence[StepWindow] | None = None,
    startup_step_ids: frozenset[int] = frozenset(),
    origin_ns: int,
    metadata: RunMetadata,
    partial_reason: str = "",
) -> Trace:
    """A validated Trace from proxy records and step markers (pure).

    Steps come from ``windows`` if given (then RPCs with a step id go to the
    window of that id, or to start-up if it is in ``startup_step_ids``), else
    from ``markers``.  ``metadata.extra`` gains the
    assembly notes (calls left out, callers found by rendezvous key,
    undecodable messages, calls still open at the end).
    """
    rpcs, kept, notes = calls_to_rpcs(
        calls, tasks=tasks, caller_of_pid=caller_of_pid, origin_ns=origin_ns
    )
    if windows is None:
        startup, steps, teardown = split_into_steps(
            rpcs, step_windows(markers), origin_ns=origin_ns
        )
    else:
        startup, steps, teardown = split_into_steps(
            rpcs,
            windows,
            origin_ns=origin_ns,
            step_ids=[step_id_of(call) for call in kept],
            startup_step_ids=startup_step_ids,
        )
    extra = dict(metadata.extra)
    extra.update(notes.as_extra())
    return Trace(
        metadata=dataclasses.replace(metadata, extra=tuple(sorted(extra.items()))),
        tasks=tuple(tasks),
        startup=startup,
        steps=steps,
        teardown=teardown,
        partial=bool(partial_reason),
        partial_reason=partial_reason,
    )


def partial_reason(error: BenchError | None, recorder_errors: Sequence[str]) -> str:
    """Why a capture's trace is partial: the run's error, else the recorder's first, else ""."""
    if error is not None:
        return str(error)
    if recorder_errors:
        return f"the recorder lost track of some traffic: {recorder_errors[0]}"
    return ""
