"""A trace from recorded calls and found steps (pure): start-up, steps, teardown.

* an RPC of a run that is a step (its step id names the step's run) belongs
  to that step, whatever its time;
* an RPC of a run set aside (``steps.FoundSteps.set_aside_runs``: runs that
  moved no variables, warm-up steps) and every session or graph set-up call
  (``steps.SESSION_METHODS``) belongs to no step: to teardown if it started
  after the last step of its worker (the non-ps task at either end), else to
  start-up;
* a collective's RecvBuf goes by its instance key when the steps are
  periods of instance keys (``steps.collective_windows``): to the step whose
  period holds its key, to start-up if its key comes before the first step's,
  to teardown if after the last step's (one step's calls may start after the
  next step's first: the workers are not in lockstep);
* any other RPC goes by time: to the step whose window contains its start
  (the latest such window when asynchronous windows overlap; an RPC between
  two windows belongs to the next one); before the first window it is
  start-up, after the last teardown;
* what did not go into a step is counted by reason and phase
  (``trace.SetAside``), for the trace's ``StepDetection``;
* times are ns from the start of the capture (the recorder's start).

No TensorFlow, no IO: records in, trace out, tested without TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tf_grpc_bench import trace as trace_model
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.profiler.assembly.rpcs import calls_to_rpcs
from tf_grpc_bench.profiler.assembly.steps import (
    AFTER_LAST_STEP,
    BEFORE_FIRST_STEP,
    SESSION_METHODS,
    SESSION_SETUP,
    FoundSteps,
    StepWindow,
    collective_instance_of,
    find_steps,
    step_id_of,
)
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.trace import (
    MARKER,
    ROUND,
    WORKER_STEP,
    Phase,
    Rpc,
    RunMetadata,
    SetAside,
    Step,
    StepDetection,
    Task,
    Trace,
)

#: What one step is, by how the steps were found, unless the job says.
DEFAULT_UNITS = {"markers": MARKER, "step-id": WORKER_STEP, "collective-instance": ROUND}


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitTraffic:
    """RPCs split into start-up, steps and teardown, with what was set aside and why."""

    startup: Phase
    steps: tuple[Step, ...]
    teardown: Phase
    set_aside: tuple[SetAside, ...] = ()


@dataclass
class _Tally:
    runs: set[int] = field(default_factory=set)
    rpcs: int = 0
    bytes: int = 0


class _Placer:
    """Decides, RPC by RPC, the step or the phase (and reason) it goes to."""

    def __init__(
        self, windows: Sequence[StepWindow], origin_ns: int, tasks: Sequence[Task]
    ) -> None:
        self.relative = [(w.start_ns - origin_ns, w.end_ns - origin_ns) for w in windows]
        self.by_step_id = {w.step_id: n for n, w in enumerate(windows) if w.step_id}
        self.by_instance = {key: n for n, w in enumerate(windows) for key in w.instances}
        self.instance_range = (
            (min(windows[0].instances), max(windows[-1].instances))
            if windows and windows[0].instances and windows[-1].instances
            else None
        )
        self.ps_tasks = {i for i, t in enumerate(tasks) if t.job == "ps"}
        index_of = {f"{t.job}:{t.index}": i for i, t in enumerate(tasks)}
        #: Per task index: end of its last step (relative ns).
        self.last_end: dict[int, int] = {}
        for (_, end), window in zip(self.relative, windows, strict=True):
            if window.task in index_of:
                task = index_of[window.task]
                self.last_end[task] = max(self.last_end.get(task, end), end)

    def aside_phase(self, rpc: Rpc) -> str:
        """Teardown if ``rpc`` started after its worker's last step (or, for a task
        without steps, after the last step of all), else start-up."""
        task = rpc.caller_task if rpc.caller_task not in self.ps_tasks else rpc.callee_task
        last = self.last_end.get(task, max((end for _, end in self.relative), default=None))
        return "teardown" if last is not None and rpc.start_ns > last else "startup"

    def by_instance_key(self, key: tuple[int, int] | None) -> int | str | None:
        """The step (number) whose period holds collective ``key``, "startup" or
        "teardown" if it comes before or after them all; None when steps are not
        periods of instance keys (or ``key`` is None)."""
        if key is None or self.instance_range is None:
            return None
        if key in self.by_instance:
            return self.by_instance[key]
        first, last = self.instance_range
        if key < first:
            return "startup"
        return "teardown" if key > last else None

    def by_time(self, t: int) -> int | str:
        """The step (number) containing ``t``, the next one if ``t`` falls in a gap,
        else "startup" or "teardown"."""
        relative = self.relative
        if not relative or t < relative[0][0]:
            return "startup"
        if t > relative[-1][1]:
            return "teardown"
        chosen = None
        for number, (start, end) in enumerate(relative):
            if start > t:
                if chosen is None:
                    chosen = number  # in a gap: the next step
                break
            if t <= end:
                chosen = number  # the latest window that contains t
        # None: after the end of every window that started before t, and no later one.
        return "teardown" if chosen is None else chosen


def split_traffic(
    rpcs: Sequence[Rpc],
    windows: Sequence[StepWindow],
    *,
    origin_ns: int,
    tasks: Sequence[Task] = (),
    step_ids: Sequence[int] | None = None,
    instances: Sequence[tuple[int, int] | None] | None = None,
    set_aside_runs: Mapping[int, str] | None = None,
) -> SplitTraffic:
    """Start-up, steps and teardown from RPCs and step windows (see the module docstring).

    ``step_ids`` (0 for none) and ``instances`` (a RecvBuf's collective key,
    None for none) are parallel to ``rpcs``; ``tasks`` are the trace's (RPCs
    name them by index; windows by ``job:index``).
    """
    placer = _Placer(windows, origin_ns, tasks)
    aside_runs = set_aside_runs or {}
    phases: dict[str, list[Rpc]] = {"startup": [], "teardown": []}
    per_step: list[list[Rpc]] = [[] for _ in windows]
    tallies: dict[tuple[str, str], _Tally] = {}
    for position, rpc in enumerate(rpcs):
        step_id = step_ids[position] if step_ids is not None else 0
        if step_id and step_id in placer.by_step_id:
            per_step[placer.by_step_id[step_id]].append(rpc)
            continue
        reason = aside_runs.get(step_id) if step_id else None
        if reason is None and rpc.method in SESSION_METHODS:
            reason = SESSION_SETUP
        if reason is not None:
            place: int | str = placer.aside_phase(rpc)
        else:
            by_key = placer.by_instance_key(instances[position] if instances else None)
            place = placer.by_time(rpc.start_ns) if by_key is None else by_key
            reason = BEFORE_FIRST_STEP if place == "startup" else AFTER_LAST_STEP
        if isinstance(place, int):
            per_step[place].append(rpc)
            continue
        phases[place].append(rpc)
        tally = tallies.setdefault((place, reason), _Tally())
        tally.rpcs += 1
        tally.bytes += rpc.request_bytes + rpc.response_bytes
        if step_id:
            tally.runs.add(step_id)
    return _phases(placer.relative, per_step, phases, tallies)


def _phases(
    relative: Sequence[tuple[int, int]],
    per_step: Sequence[Sequence[Rpc]],
    phases: Mapping[str, Sequence[Rpc]],
    tallies: Mapping[tuple[str, str], _Tally],
) -> SplitTraffic:
    steps = tuple(
        Step(
            index=number,
            start_ns=max(0, start),
            end_ns=max(0, end),
            rpcs=trace_model.with_outstanding(step_rpcs),
        )
        for number, ((start, end), step_rpcs) in enumerate(zip(relative, per_step, strict=True))
    )
    startup, teardown = phases["startup"], phases["teardown"]
    first_start = steps[0].start_ns if steps else max((r.end_ns for r in startup), default=0)
    last_end = steps[-1].end_ns if steps else first_start
    return SplitTraffic(
        startup=Phase(start_ns=0, end_ns=first_start, rpcs=trace_model.with_outstanding(startup)),
        steps=steps,
        teardown=Phase(
            start_ns=last_end,
            end_ns=max([last_end, *(r.end_ns for r in teardown)]),
            rpcs=trace_model.with_outstanding(teardown),
        ),
        set_aside=tuple(
            SetAside(reason=reason, phase=phase, runs=len(t.runs), rpcs=t.rpcs, bytes=t.bytes)
            for (phase, reason), t in sorted(
                tallies.items(), key=lambda item: (item[0][0] != "startup", item[0][1])
            )
        ),
    )


def split_into_steps(
    rpcs: Sequence[Rpc],
    windows: Sequence[StepWindow],
    *,
    origin_ns: int,
    step_ids: Sequence[int] | None = None,
) -> tuple[Phase, tuple[Step, ...], Phase]:
    """(start-up, steps, teardown) of ``split_traffic`` with nothing set aside by run."""
    split = split_traffic(rpcs, windows, origin_ns=origin_ns, step_ids=step_ids)
    return split.startup, split.steps, split.teardown


def assemble_trace(
    calls: Sequence[RecordedCall],
    *,
    tasks: Sequence[Task],
    caller_of_pid: Mapping[int, int],
    markers: Sequence[StepMarker] = (),
    warmup_steps: int = 0,
    per_run: bool = False,
    need_markers: bool = False,
    unit: str = "",
    origin_ns: int,
    metadata: RunMetadata,
    partial_reason: str = "",
) -> Trace:
    """A validated Trace from recorded calls and step markers (pure).

    The steps are found by ``steps.find_steps(calls, markers=, warmup_steps=,
    per_run=, need_markers=)``; the trace's ``step_detection`` records how, what one step is
    (``unit``, default by how they were found: ``DEFAULT_UNITS``) and what was
    set aside.  ``metadata.extra`` gains the assembly notes (calls left out,
    callers found by rendezvous key, undecodable messages, calls still open at
    the end).
    """
    rpcs, kept, notes = calls_to_rpcs(
        calls, tasks=tasks, caller_of_pid=caller_of_pid, origin_ns=origin_ns
    )
    found = find_steps(
        calls,
        markers=markers,
        warmup_steps=warmup_steps,
        per_run=per_run,
        need_markers=need_markers,
    )
    split = split_traffic(
        rpcs,
        found.windows,
        origin_ns=origin_ns,
        tasks=tasks,
        step_ids=[step_id_of(call) for call in kept],
        instances=[collective_instance_of(call) for call in kept],
        set_aside_runs=found.set_aside_runs,
    )
    extra = dict(metadata.extra)
    extra.update(notes.as_extra())
    return Trace(
        metadata=dataclasses.replace(metadata, extra=tuple(sorted(extra.items()))),
        tasks=tuple(tasks),
        startup=split.startup,
        steps=split.steps,
        teardown=split.teardown,
        partial=bool(partial_reason),
        partial_reason=partial_reason,
        step_detection=detection(found, split, unit=unit),
    )


def detection(found: FoundSteps, split: SplitTraffic, *, unit: str = "") -> StepDetection:
    """The trace's record of how its steps were found and what was set aside."""
    return StepDetection(
        source=found.source,
        unit=unit or DEFAULT_UNITS[found.source],
        rule=found.rule,
        candidates=found.candidates,
        set_aside=split.set_aside,
    )


def partial_reason(error: BenchError | None, recorder_errors: Sequence[str]) -> str:
    """Why a capture's trace is partial: the run's error, else the recorder's first, else ""."""
    if error is not None:
        return str(error)
    if recorder_errors:
        return f"the recorder lost track of some traffic: {recorder_errors[0]}"
    return ""
