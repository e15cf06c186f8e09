"""The trace model: what a trace holds, validated on construction.

A trace records the tensor traffic of one distributed TensorFlow training run:
run metadata, the cluster's tasks, start-up traffic, then per steady-state step
every RPC between tasks with its message lengths, tensor identity and timing.

The format version lives in the trace (``FORMAT_VERSION``, with its
history).  This module is pure: no TensorFlow, no gRPC, no clocks, no files.
The file format, the one place trace files are parsed, is
``tf_grpc_bench.trace_format``; the JSON form is ``tf_grpc_bench.trace_json``;
opening files by path, hashes and the shipped traces are
``tf_grpc_bench.trace_files``.  See docs/trace-format.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tf_grpc_bench.errors import ConfigError, TraceError, UnsupportedVersionError

#: Version of the trace format this module writes.  History:
#:   1 (2026-11): first version.
#:   2 (2026-12): ``step_detection``, how the steps were found and what was
#:      set aside; a version 1 trace reads with an empty one.
#:   3 (2026-12): ``clock_alignment``, the tasks' clock offsets of a trace
#:      assembled from records of several hosts; versions 1 and 2 read with
#:      an empty one (one clock).
FORMAT_VERSION = 3
#: Versions this module can read.
READABLE_VERSIONS = frozenset({1, 2, 3})

#: File name suffix of trace files.
SUFFIX = ".tfgbtrace"

RECV_TENSOR = "/tensorflow.WorkerService/RecvTensor"
RECV_BUF = "/tensorflow.WorkerService/RecvBuf"
#: Methods whose response carries a tensor from callee to caller.
TENSOR_METHODS = frozenset({RECV_TENSOR, RECV_BUF})


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One TensorFlow task (process) of the captured cluster."""

    job: str
    index: int
    address: str = ""

    def __post_init__(self) -> None:
        if not self.job:
            raise ValueError("task job name must not be empty")
        if self.index < 0:
            raise ValueError(f"task index must be >= 0, got {self.index}")

    @property
    def name(self) -> str:
        """TensorFlow's name for the task, e.g. ``/job:ps/task:0``."""
        return f"/job:{self.job}/task:{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorInfo:
    """Identity of a tensor carried by a RecvTensor or RecvBuf response."""

    rendezvous_key: str = ""
    dtype: str = ""
    shape: tuple[int, ...] = ()
    content_bytes: int = 0

    @property
    def edge_name(self) -> str:
        """The edge part of a RecvTensor rendezvous key (``edge_12_foo``), or ``""``."""
        parts = self.rendezvous_key.split(";")
        return parts[3] if len(parts) >= 5 else ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rpc:
    """One RPC between two tasks.  Times are ns from the capture start."""

    method: str
    caller_task: int
    callee_task: int
    request_bytes: int
    response_bytes: int
    start_ns: int = 0
    response_start_ns: int = 0
    end_ns: int = 0
    tensor: TensorInfo | None = None
    outstanding_at_start: int = 0
    status_code: int = 0

    def __post_init__(self) -> None:
        if not self.method.startswith("/"):
            raise ValueError(
                f"method must be a full gRPC path like /pkg.Service/Name, got {self.method!r}"
            )
        for name in (
            "caller_task",
            "callee_task",
            "request_bytes",
            "response_bytes",
            "outstanding_at_start",
            "status_code",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.end_ns < self.start_ns:
            raise ValueError(f"end_ns ({self.end_ns}) is before start_ns ({self.start_ns})")

    @property
    def short_method(self) -> str:
        """The method name without its service, e.g. ``RecvTensor``."""
        return self.method.rsplit("/", 1)[-1]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """Traffic outside steady-state steps (start-up, teardown)."""

    start_ns: int = 0
    end_ns: int = 0
    rpcs: tuple[Rpc, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One steady-state training step and every RPC it made, by start time."""

    index: int
    start_ns: int
    end_ns: int
    rpcs: tuple[Rpc, ...]

    def __post_init__(self) -> None:
        if self.end_ns < self.start_ns:
            raise ValueError(f"step {self.index}: end_ns is before start_ns")

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMetadata:
    """What ran, where, and how the trace was made."""

    model: str = ""
    tensorflow_version: str = ""
    strategy: str = ""
    synchronous: bool = False
    batch_size: int = 0
    input_shape: tuple[int, ...] = ()
    trainable_parameters: int = 0
    capture_method: str = ""
    host: str = ""
    command: tuple[str, ...] = ()
    tool_version: str = ""
    created_utc: str = ""
    extra: tuple[tuple[str, str], ...] = ()


#: ``RunMetadata.extra`` key of the capture machine's compute calibration: a training
#: step of the job's model timed alone, in ns (``tf_grpc_bench.calibration``).
CALIBRATION_STEP_EXTRA = "calibration_step_ns"


def calibration_step_ns(extra: tuple[tuple[str, str], ...]) -> int | None:
    """The calibrated step ``extra`` records (ns), None if it records none.

    ``ConfigError`` naming the entry if it is not a positive whole number: a
    trace is data the user hands us, and an ignored calibration would mean a
    silently different prediction.
    """
    entries = dict(extra)
    if CALIBRATION_STEP_EXTRA not in entries:
        return None
    text = entries[CALIBRATION_STEP_EXTRA]
    if not text.isdigit() or int(text) <= 0:
        raise ConfigError(
            f"trace metadata {CALIBRATION_STEP_EXTRA}={text!r}: expected a positive "
            "whole number of nanoseconds"
        )
    return int(text)


#: ``StepDetection.unit`` values: one training step of every worker, one
#: worker's step, or whatever a job's own step markers span.
ROUND = "round"
WORKER_STEP = "worker-step"
MARKER = "marker"
#: Phases set-aside traffic goes to.
SET_ASIDE_PHASES = ("startup", "teardown")


@dataclass(frozen=True, slots=True, kw_only=True)
class SetAside:
    """RPCs kept out of the steps, all for one reason, in one phase."""

    reason: str
    #: "startup" or "teardown".
    phase: str
    #: TensorFlow runs (step ids) among them; 0 for calls of no run.
    runs: int = 0
    rpcs: int = 0
    #: Request plus response bytes.
    bytes: int = 0

    def __post_init__(self) -> None:
        if self.phase not in SET_ASIDE_PHASES:
            raise ValueError(f"set-aside phase must be startup or teardown, got {self.phase!r}")
        for name in ("runs", "rpcs", "bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"set-aside {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepDetection:
    """How a capture found its steps, and what it kept out of them (format version 2).

    Empty (``source == ""``) for traces that do not say: version 1, or made by
    hand.
    """

    #: "markers", "step-id" or "collective-instance".
    source: str = ""
    #: ``ROUND``, ``WORKER_STEP`` or ``MARKER``.
    unit: str = ""
    #: The rule that made a candidate a step, in words.
    rule: str = ""
    #: Candidates examined (runs, collective periods or step markers).
    candidates: int = 0
    set_aside: tuple[SetAside, ...] = ()

    def __post_init__(self) -> None:
        if self.candidates < 0:
            raise ValueError(f"candidates must be >= 0, got {self.candidates}")

    @property
    def empty(self) -> bool:
        return self == StepDetection()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockOffset:
    """One task's clock against the reference's: reference time = own time + ``offset_ns``.

    ``lower_ns``/``upper_ns`` bound it as the wire showed (None: no bound on
    that side).  ``source``: ``reference``, ``shared-clock`` (the reference's
    own clock: same kernel) or ``wire`` (estimated from the calls).
    """

    task: str
    host: str = ""
    offset_ns: int = 0
    lower_ns: int | None = None
    upper_ns: int | None = None
    source: str = ""
    constraints: int = 0

    def __post_init__(self) -> None:
        bounded = self.lower_ns is not None and self.upper_ns is not None
        if bounded and self.lower_ns > self.upper_ns:  # type: ignore[operator]
            raise ValueError(f"clock offset of {self.task}: lower bound above upper bound")
        if self.constraints < 0:
            raise ValueError(f"constraints must be >= 0, got {self.constraints}")

    @property
    def uncertainty_ns(self) -> int | None:
        """Half the width of [lower, upper]; None when a bound is missing."""
        if self.lower_ns is None or self.upper_ns is None:
            return None
        return (self.upper_ns - self.lower_ns + 1) // 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockAlignment:
    """How the tasks' clocks were put on one (format version 3); empty: one clock."""

    #: The task (``job:index``) whose clock the trace's times are on.
    reference: str = ""
    method: str = ""
    tasks: tuple[ClockOffset, ...] = ()

    @property
    def empty(self) -> bool:
        return self == ClockAlignment()


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A whole trace: validated on construction."""

    metadata: RunMetadata
    tasks: tuple[Task, ...]
    steps: tuple[Step, ...]
    startup: Phase = field(default_factory=Phase)
    teardown: Phase = field(default_factory=Phase)
    partial: bool = False
    partial_reason: str = ""
    step_detection: StepDetection = field(default_factory=StepDetection)
    clock_alignment: ClockAlignment = field(default_factory=ClockAlignment)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def step_unit(self) -> str:
        """What one step is (``ROUND``, ``WORKER_STEP``, ``MARKER``), "" if the trace
        does not say.  Version 1 traces of user jobs said it in ``metadata.extra``."""
        if self.step_detection.unit:
            return self.step_detection.unit
        return dict(self.metadata.extra).get("step_unit", "")

    def task_name(self, index: int) -> str:
        return self.tasks[index].name

    def tasks_of_job(self, job: str) -> list[int]:
        """Indices (into ``tasks``) of the tasks of one job, by task index."""
        return sorted(
            (i for i, t in enumerate(self.tasks) if t.job == job), key=lambda i: self.tasks[i].index
        )


#: Longest time a trace may span, from its first timestamp to its last: 30 days.  A
#: capture lasts minutes; the bound keeps every difference of two timestamps far inside
#: int64, in the picoseconds TensorBoard's profile timelines count in too, and every
#: recorded gap a sleep the operating system accepts.
MAX_SPAN_NS = 30 * 86_400 * 10**9
#: Most tasks a trace may list.  Far beyond any cluster a replay can stand in for, and a
#: bound on what reading, inspecting and drawing a trace may hold per task.
MAX_TASKS = 10_000
#: Timestamps are int64 nanoseconds on the wire.
_INT64 = range(-(2**63), 2**63)


def _timestamps(trace: Trace) -> Iterator[tuple[str, int]]:
    """(where, timestamp) of every time the trace records; an absent phase has none."""
    phases = [("startup", trace.startup), ("teardown", trace.teardown)]
    for where, phase in phases:
        if phase.rpcs or phase.start_ns or phase.end_ns:
            yield f"{where}.start_ns", phase.start_ns
            yield f"{where}.end_ns", phase.end_ns
    for number, step in enumerate(trace.steps):
        yield f"steps[{number}].start_ns", step.start_ns
        yield f"steps[{number}].end_ns", step.end_ns
    for where, rpcs in (
        ("startup", trace.startup.rpcs),
        ("teardown", trace.teardown.rpcs),
        *((f"steps[{n}]", step.rpcs) for n, step in enumerate(trace.steps)),
    ):
        for number, rpc in enumerate(rpcs):
            yield f"{where}.rpcs[{number}].start_ns", rpc.start_ns
            yield f"{where}.rpcs[{number}].end_ns", rpc.end_ns
            if rpc.response_start_ns:
                yield f"{where}.rpcs[{number}].response_start_ns", rpc.response_start_ns


def check_task_count(count: int) -> None:
    """TraceError for a trace listing more than ``MAX_TASKS`` tasks."""
    if count > MAX_TASKS:
        raise TraceError(f"tasks: {count} listed; a trace lists at most {MAX_TASKS}")


def _check_span(trace: Trace) -> None:
    """TraceError unless every timestamp is an int64 and all lie within ``MAX_SPAN_NS``."""
    first: tuple[str, int] | None = None
    last: tuple[str, int] | None = None
    for where, value in _timestamps(trace):
        if value not in _INT64:
            raise TraceError(f"{where}: {value} is not a 64-bit timestamp")
        if first is None or value < first[1]:
            first = (where, value)
        if last is None or value > last[1]:
            last = (where, value)
    if first is not None and last is not None and last[1] - first[1] > MAX_SPAN_NS:
        raise TraceError(
            f"timestamps span {(last[1] - first[1]) / 86_400e9:.3g} days ({first[0]} "
            f"{first[1]} to {last[0]} {last[1]}); a trace spans at most "
            f"{MAX_SPAN_NS // (86_400 * 10**9)} days"
        )


def _validate(trace: Trace) -> None:
    if trace.format_version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"format_version {trace.format_version} is not supported "
            f"(this tool reads versions {sorted(READABLE_VERSIONS)})"
        )
    if trace.format_version < 2 and not trace.step_detection.empty:
        raise TraceError(
            f"step_detection needs format version 2 or later (this trace says "
            f"{trace.format_version})"
        )
    if trace.format_version < 3 and not trace.clock_alignment.empty:
        raise TraceError(
            f"clock_alignment needs format version 3 or later (this trace says "
            f"{trace.format_version})"
        )
    check_task_count(len(trace.tasks))
    seen: set[tuple[str, int]] = set()
    for task in trace.tasks:
        key = (task.job, task.index)
        if key in seen:
            raise TraceError(f"tasks: {task.name} is listed twice")
        seen.add(key)
    task_count = len(trace.tasks)

    def check_rpcs(where: str, rpcs: Sequence[Rpc]) -> None:
        for number, rpc in enumerate(rpcs):
            for name in ("caller_task", "callee_task"):
                value = getattr(rpc, name)
                if value >= task_count:
                    raise TraceError(
                        f"{where}.rpcs[{number}].{name}: task {value} does not exist "
                        f"(the trace lists {task_count} tasks)"
                    )

    check_rpcs("startup", trace.startup.rpcs)
    check_rpcs("teardown", trace.teardown.rpcs)
    previous_index: int | None = None
    for number, step in enumerate(trace.steps):
        if previous_index is not None and step.index <= previous_index:
            raise TraceError(
                f"steps[{number}].index: {step.index} does not follow {previous_index}"
            )
        previous_index = step.index
        check_rpcs(f"steps[{number}]", step.rpcs)
    _check_span(trace)


def payload_bytes(rpc: Rpc) -> int:
    """Size of the message that carries the RPC's payload: the larger direction."""
    return max(rpc.request_bytes, rpc.response_bytes)


def with_outstanding(rpcs: Sequence[Rpc]) -> tuple[Rpc, ...]:
    """Sort ``rpcs`` by start time and fill in ``outstanding_at_start``.

    For each RPC, counts the earlier RPCs on the same (caller, callee) pair that
    had started and not yet ended when it started.  Used by the profiler when
    it assembles a step.
    """
    ordered = sorted(rpcs, key=lambda r: (r.start_ns, r.end_ns))
    open_ends: dict[tuple[int, int], list[int]] = {}
    result = []
    for rpc in ordered:
        pair = (rpc.caller_task, rpc.callee_task)
        ends = [end for end in open_ends.get(pair, []) if end > rpc.start_ns]
        result.append(dataclasses.replace(rpc, outstanding_at_start=len(ends)))
        ends.append(rpc.end_ns)
        open_ends[pair] = ends
    return tuple(result)
