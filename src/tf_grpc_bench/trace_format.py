"""The trace file format: the one place trace files are parsed and written.

On disk a trace is the 8-byte magic ``TFGBTRC\\n`` followed by a zlib stream
of one serialized ``tf_grpc_bench.Trace`` message (``protos/trace.proto``).
zlib's checksum makes truncation and corruption detectable, which a bare
protobuf stream is not.  The format version lives in the message
(``trace.FORMAT_VERSION``, with its history); an unknown one is refused.

Pure: no TensorFlow, no gRPC, no clocks, no files: the reader and writer
(``load_trace``, ``dump_trace``) work on a caller's binary file object; opening
files by path is ``tf_grpc_bench.trace_files``.  See docs/trace-format.md.
"""

from __future__ import annotations

import zlib
from typing import IO

from google.protobuf.message import DecodeError

from tf_grpc_bench.errors import TraceError, UnsupportedVersionError
from tf_grpc_bench.protos import trace_pb2
from tf_grpc_bench.trace import (
    READABLE_VERSIONS,
    ClockAlignment,
    ClockOffset,
    Phase,
    Rpc,
    RunMetadata,
    SetAside,
    Step,
    StepDetection,
    Task,
    TensorInfo,
    Trace,
    check_task_count,
)

MAGIC = b"TFGBTRC\n"


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
        check_task_count(len(message.tasks))
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
