"""The trace model: what a trace holds, and the one place trace files are parsed.

A trace records the tensor traffic of one distributed TensorFlow training run:
run metadata, the cluster's tasks, start-up traffic, then per steady-state step
every RPC between tasks with its message lengths, tensor identity and timing.

On disk a trace is the 8-byte magic ``TFGBTRC\\n`` followed by a zlib stream
of one serialized ``tf_grpc_bench.Trace`` message (``protos/trace.proto``).
zlib's checksum makes truncation and corruption detectable, which a bare
protobuf stream is not.  The format version lives in the message; see
``FORMAT_VERSION``.

This module is pure: no TensorFlow, no gRPC, no clocks, no files.  Its reader
and writer (``load_trace``, ``dump_trace``) work on a caller's binary file
object, and the JSON form (``trace_to_json_dict``, ``trace_from_json_dict``)
on plain dicts; opening files by path, hashes and the shipped traces are
``tf_grpc_bench.trace_files``.  See docs/trace-format.md.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from google.protobuf.message import DecodeError

from tf_grpc_bench.errors import ConfigError, TraceError, UnsupportedVersionError
from tf_grpc_bench.protos import trace_pb2

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

MAGIC = b"TFGBTRC\n"
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


def _check_task_count(count: int) -> None:
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
    _check_task_count(len(trace.tasks))
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


# --------------------------------------------------------------------------
# Protobuf <-> model: the one parse point.


def _rpc_from_proto(message: trace_pb2.Rpc) -> Rpc:
    tensor = None
    if message.HasField("tensor"):
        tensor = TensorInfo(
            rendezvous_key=message.tensor.rendezvous_key,
            dtype=message.tensor.dtype,
            shape=tuple(message.tensor.shape),
            content_bytes=message.tensor.content_bytes,
        )
    return Rpc(
        method=message.method,
        caller_task=message.caller_task,
        callee_task=message.callee_task,
        request_bytes=message.request_bytes,
        response_bytes=message.response_bytes,
        start_ns=message.start_ns,
        response_start_ns=message.response_start_ns,
        end_ns=message.end_ns,
        tensor=tensor,
        outstanding_at_start=message.outstanding_at_start,
        status_code=message.status_code,
    )


def _rpc_to_proto(rpc: Rpc, message: trace_pb2.Rpc) -> None:
    message.method = rpc.method
    message.caller_task = rpc.caller_task
    message.callee_task = rpc.callee_task
    message.request_bytes = rpc.request_bytes
    message.response_bytes = rpc.response_bytes
    message.start_ns = rpc.start_ns
    message.response_start_ns = rpc.response_start_ns
    message.end_ns = rpc.end_ns
    message.outstanding_at_start = rpc.outstanding_at_start
    message.status_code = rpc.status_code
    if rpc.tensor is not None:
        message.tensor.rendezvous_key = rpc.tensor.rendezvous_key
        message.tensor.dtype = rpc.tensor.dtype
        message.tensor.shape.extend(rpc.tensor.shape)
        message.tensor.content_bytes = rpc.tensor.content_bytes


def _phase_from_proto(message: trace_pb2.Phase) -> Phase:
    return Phase(
        start_ns=message.start_ns,
        end_ns=message.end_ns,
        rpcs=tuple(_rpc_from_proto(r) for r in message.rpcs),
    )


def _phase_to_proto(phase: Phase, message: trace_pb2.Phase) -> None:
    message.start_ns = phase.start_ns
    message.end_ns = phase.end_ns
    for rpc in phase.rpcs:
        _rpc_to_proto(rpc, message.rpcs.add())


def _detection_from_proto(message: trace_pb2.StepDetection) -> StepDetection:
    return StepDetection(
        source=message.source,
        unit=message.unit,
        rule=message.rule,
        candidates=message.candidates,
        set_aside=tuple(
            SetAside(reason=s.reason, phase=s.phase, runs=s.runs, rpcs=s.rpcs, bytes=s.bytes)
            for s in message.set_aside
        ),
    )


def _detection_to_proto(detection: StepDetection, message: trace_pb2.StepDetection) -> None:
    message.source = detection.source
    message.unit = detection.unit
    message.rule = detection.rule
    message.candidates = detection.candidates
    for item in detection.set_aside:
        message.set_aside.add(
            reason=item.reason, phase=item.phase, runs=item.runs, rpcs=item.rpcs, bytes=item.bytes
        )


def _alignment_from_proto(message: trace_pb2.ClockAlignment) -> ClockAlignment:
    return ClockAlignment(
        reference=message.reference,
        method=message.method,
        tasks=tuple(
            ClockOffset(
                task=t.task,
                host=t.host,
                offset_ns=t.offset_ns,
                lower_ns=t.lower_ns if t.has_lower else None,
                upper_ns=t.upper_ns if t.has_upper else None,
                source=t.source,
                constraints=t.constraints,
            )
            for t in message.tasks
        ),
    )


def _alignment_to_proto(alignment: ClockAlignment, message: trace_pb2.ClockAlignment) -> None:
    message.reference = alignment.reference
    message.method = alignment.method
    for item in alignment.tasks:
        message.tasks.add(
            task=item.task,
            host=item.host,
            offset_ns=item.offset_ns,
            lower_ns=item.lower_ns or 0,
            upper_ns=item.upper_ns or 0,
            has_lower=item.lower_ns is not None,
            has_upper=item.upper_ns is not None,
            source=item.source,
            constraints=item.constraints,
        )


def trace_from_proto(message: trace_pb2.Trace, *, source: str = "trace") -> Trace:
    """Build and validate a ``Trace`` from its protobuf message.

    Raises ``TraceError`` naming ``source`` and the offending field.
    """
    if message.format_version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"{source}: format_version {message.format_version} is not supported "
            f"(this tool reads versions {sorted(READABLE_VERSIONS)}); "
            "upgrade tf-grpc-bench or re-capture the trace"
        )
    meta = message.metadata
    try:
        # Before a Python object is made per task.
        _check_task_count(len(message.tasks))
        return Trace(
            format_version=message.format_version,
            metadata=RunMetadata(
                model=meta.model,
                tensorflow_version=meta.tensorflow_version,
                strategy=meta.strategy,
                synchronous=meta.synchronous,
                batch_size=meta.batch_size,
                input_shape=tuple(meta.input_shape),
                trainable_parameters=meta.trainable_parameters,
                capture_method=meta.capture_method,
                host=meta.host,
                command=tuple(meta.command),
                tool_version=meta.tool_version,
                created_utc=meta.created_utc,
                extra=tuple(sorted(meta.extra.items())),
            ),
            tasks=tuple(Task(job=t.job, index=t.index, address=t.address) for t in message.tasks),
            startup=_phase_from_proto(message.startup),
            steps=tuple(
                Step(
                    index=s.index,
                    start_ns=s.start_ns,
                    end_ns=s.end_ns,
                    rpcs=tuple(_rpc_from_proto(r) for r in s.rpcs),
                )
                for s in message.steps
            ),
            teardown=_phase_from_proto(message.teardown),
            partial=message.partial,
            partial_reason=message.partial_reason,
            step_detection=_detection_from_proto(message.step_detection),
            clock_alignment=_alignment_from_proto(message.clock_alignment),
        )
    except TraceError as error:
        raise type(error)(f"{source}: {error}") from None
    except ValueError as error:
        raise TraceError(f"{source}: invalid trace: {error}") from None


def trace_to_proto(trace: Trace) -> trace_pb2.Trace:
    message = trace_pb2.Trace(
        format_version=trace.format_version,
        partial=trace.partial,
        partial_reason=trace.partial_reason,
    )
    meta = trace.metadata
    message.metadata.model = meta.model
    message.metadata.tensorflow_version = meta.tensorflow_version
    message.metadata.strategy = meta.strategy
    message.metadata.synchronous = meta.synchronous
    message.metadata.batch_size = meta.batch_size
    message.metadata.input_shape.extend(meta.input_shape)
    message.metadata.trainable_parameters = meta.trainable_parameters
    message.metadata.capture_method = meta.capture_method
    message.metadata.host = meta.host
    message.metadata.command.extend(meta.command)
    message.metadata.tool_version = meta.tool_version
    message.metadata.created_utc = meta.created_utc
    for key, value in meta.extra:
        message.metadata.extra[key] = value
    for task in trace.tasks:
        message.tasks.add(job=task.job, index=task.index, address=task.address)
    _phase_to_proto(trace.startup, message.startup)
    for step in trace.steps:
        step_message = message.steps.add(
            index=step.index, start_ns=step.start_ns, end_ns=step.end_ns
        )
        for rpc in step.rpcs:
            _rpc_to_proto(rpc, step_message.rpcs.add())
    _phase_to_proto(trace.teardown, message.teardown)
    if not trace.step_detection.empty:
        _detection_to_proto(trace.step_detection, message.step_detection)
    if not trace.clock_alignment.empty:
        _alignment_to_proto(trace.clock_alignment, message.clock_alignment)
    return message


#: Largest trace accepted, decompressed (and so compressed): the shipped traces are 2-4 MB,
#: a capture of hundreds of steps of a large model tens of MB.  Past it a file is
#: refused before more memory is spent on it (a small file can decompress to gigabytes).
MAX_TRACE_BYTES = 256 * 1024 * 1024


def load_trace(stream: IO[bytes], *, source: str = "trace") -> Trace:
    """Read one trace from a binary file object.  ``source`` names it in errors.

    Neither the file nor what it decompresses to may exceed ``MAX_TRACE_BYTES``.
    """
    data = stream.read(MAX_TRACE_BYTES + 1)
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{source}: larger than {MAX_TRACE_BYTES >> 20} MiB, not a trace")
    if not data:
        raise TraceError(f"{source}: file is empty (expected a tf-grpc-bench trace)")
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise TraceError(f"{source}: file is truncated (only {len(data)} bytes)")
        raise TraceError(
            f"{source}: not a tf-grpc-bench trace (missing the {MAGIC[:-1].decode()} header)"
        )
    decompressor = zlib.decompressobj()
    try:
        payload = decompressor.decompress(memoryview(data)[len(MAGIC) :], MAX_TRACE_BYTES + 1)
    except zlib.error as error:
        raise TraceError(f"{source}: trace is corrupt ({error})") from None
    if len(payload) > MAX_TRACE_BYTES:
        raise TraceError(
            f"{source}: decompresses to more than {MAX_TRACE_BYTES >> 20} MiB, "
            "more than any trace this tool reads"
        )
    if not decompressor.eof:
        raise TraceError(f"{source}: trace is truncated (compressed stream ends early)")
    if decompressor.unused_data:
        raise TraceError(
            f"{source}: trace is corrupt ({len(decompressor.unused_data)} unexpected "
            "bytes after the end of the trace)"
        )
    message = trace_pb2.Trace()
    try:
        message.ParseFromString(payload)
    except DecodeError as error:
        raise TraceError(f"{source}: trace is corrupt (protobuf: {error})") from None
    return trace_from_proto(message, source=source)


def dump_trace(trace: Trace, stream: IO[bytes]) -> None:
    """Write ``trace`` to a binary file object."""
    stream.write(MAGIC)
    stream.write(zlib.compress(trace_to_proto(trace).SerializeToString(), 6))


# --------------------------------------------------------------------------
# JSON export / import, for other tools.  Integers stay integers.


def trace_to_json_dict(trace: Trace) -> dict[str, Any]:
    """A plain-JSON view of the trace (``format`` names the document kind)."""

    def convert(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [convert(item) for item in value]
        return value

    document = convert(trace)
    document["metadata"]["extra"] = dict(trace.metadata.extra)
    return {"format": "tf-grpc-bench-trace", **document}


def trace_from_json_dict(document: dict[str, Any], *, source: str = "trace JSON") -> Trace:
    """Inverse of ``trace_to_json_dict``; validates like ``load_trace``."""
    if document.get("format") != "tf-grpc-bench-trace":
        raise TraceError(f"{source}: 'format' must be 'tf-grpc-bench-trace'")
    version = document.get("format_version")
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"{source}: format_version {version!r} is not supported "
            f"(this tool reads versions {sorted(READABLE_VERSIONS)})"
        )

    def rpc(item: dict[str, Any]) -> Rpc:
        tensor = item.get("tensor")
        fields = {k: v for k, v in item.items() if k != "tensor"}
        return Rpc(
            **fields,
            tensor=None
            if tensor is None
            else TensorInfo(**{**tensor, "shape": tuple(tensor.get("shape", ()))}),
        )

    def phase(item: dict[str, Any] | None) -> Phase:
        item = item or {}
        return Phase(
            start_ns=item.get("start_ns", 0),
            end_ns=item.get("end_ns", 0),
            rpcs=tuple(rpc(r) for r in item.get("rpcs", ())),
        )

    try:
        meta = dict(document.get("metadata", {}))
        meta["input_shape"] = tuple(meta.get("input_shape", ()))
        meta["command"] = tuple(meta.get("command", ()))
        meta["extra"] = tuple(sorted(dict(meta.get("extra", {})).items()))
        return Trace(
            format_version=version,
            metadata=RunMetadata(**meta),
            tasks=tuple(Task(**t) for t in document["tasks"]),
            startup=phase(document.get("startup")),
            steps=tuple(
                Step(
                    index=s["index"],
                    start_ns=s["start_ns"],
                    end_ns=s["end_ns"],
                    rpcs=tuple(rpc(r) for r in s["rpcs"]),
                )
                for s in document["steps"]
            ),
            teardown=phase(document.get("teardown")),
            partial=bool(document.get("partial", False)),
            partial_reason=str(document.get("partial_reason", "")),
            step_detection=_detection_from_json(document.get("step_detection")),
            clock_alignment=_alignment_from_json(document.get("clock_alignment")),
        )
    except TraceError as error:
        raise type(error)(f"{source}: {error}") from None
    except KeyError as error:
        raise TraceError(f"{source}: missing field {error}") from None
    except (TypeError, ValueError) as error:
        raise TraceError(f"{source}: invalid trace: {error}") from None


def _detection_from_json(item: dict[str, Any] | None) -> StepDetection:
    item = dict(item or {})
    item["set_aside"] = tuple(SetAside(**s) for s in item.get("set_aside", ()))
    return StepDetection(**item)


def _alignment_from_json(item: dict[str, Any] | None) -> ClockAlignment:
    item = dict(item or {})
    item["tasks"] = tuple(ClockOffset(**t) for t in item.get("tasks", ()))
    return ClockAlignment(**item)


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
