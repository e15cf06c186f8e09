"""Recorded calls -> trace RPCs: who called whom, with which tensor, when (pure).

The callee of a call is the task its recorder stood for; the caller is the
task of the process that made the connection, or failing that the destination
device its RecvTensor/RecvBuf requests name.  What had to be left out or
guessed is counted in ``AssemblyNotes``, which go into the trace's metadata.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench.profiler.assembly.tf_messages import (
    MessageDecodeError,
    decode_recv_buf_request,
    decode_recv_buf_response,
    decode_recv_tensor_request,
    decode_recv_tensor_response,
    parse_rendezvous_key,
    task_of_device,
)
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.trace import RECV_BUF, RECV_TENSOR, Rpc, Task, TensorInfo

#: gRPC status recorded for a call that ended without a grpc-status trailer.
STATUS_CANCELLED = 1  # the stream was reset
STATUS_UNKNOWN = 2  # the capture ended while the call was open


@dataclass(frozen=True, slots=True, kw_only=True)
class AssemblyNotes:
    """What assembling a trace had to leave out or guess; goes into metadata.extra."""

    unattributed_calls: int = 0
    attributed_by_rendezvous_key: int = 0
    undecodable_messages: int = 0
    incomplete_calls: int = 0

    def as_extra(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}


def tensor_info(call: RecordedCall) -> TensorInfo | None:
    """Tensor identity of a RecvTensor or RecvBuf call from its message heads.

    MessageDecodeError if a head is not the message it should be.
    """
    if call.method == RECV_TENSOR:
        request = decode_recv_tensor_request(call.request_head)
        response = decode_recv_tensor_response(call.response_head)
        header = response.tensor
        return TensorInfo(
            rendezvous_key=request.rendezvous_key,
            dtype=header.dtype if header else "",
            shape=(header.shape or ()) if header else (),
            content_bytes=header.content_bytes if header else 0,
        )
    if call.method == RECV_BUF:
        buf_request = decode_recv_buf_request(call.request_head)
        buf_response = decode_recv_buf_response(call.response_head)
        # The request states the buffer's size; the response carries the data
        # in chunks (4 KB each here) past the head the proxy keeps.
        return TensorInfo(
            rendezvous_key=buf_request.buf_rendezvous_key,
            content_bytes=buf_request.num_bytes
            or buf_response.num_bytes
            or buf_response.transport_bytes,
        )
    return None


def _destination_task(call: RecordedCall) -> tuple[str, int] | None:
    """The task a RecvTensor/RecvBuf request names as the tensor's destination."""
    try:
        if call.method == RECV_TENSOR:
            key = parse_rendezvous_key(decode_recv_tensor_request(call.request_head).rendezvous_key)
            return task_of_device(key.dst_device) if key else None
        if call.method == RECV_BUF:
            return task_of_device(decode_recv_buf_request(call.request_head).dst_device)
    except MessageDecodeError:
        return None
    return None


def calls_to_rpcs(
    calls: Sequence[RecordedCall],
    *,
    tasks: Sequence[Task],
    caller_of_pid: Mapping[int, int],
    origin_ns: int,
) -> tuple[list[Rpc], list[RecordedCall], AssemblyNotes]:
    """Turn proxy records into trace RPCs (times relative to ``origin_ns``).

    The callee is the task named by the record's ``callee`` (``job:index``).
    The caller is the task of the connection's process (``caller_of_pid``);
    failing that, the destination device that the connection's RecvTensor or
    RecvBuf requests name (every call of a connection comes from one process).
    Calls with no known caller are left out and counted.  Returns the RPCs,
    the records they came from (parallel) and notes.
    """
    index_of = {f"{t.job}:{t.index}": i for i, t in enumerate(tasks)}
    by_task = {(t.job, t.index): i for i, t in enumerate(tasks)}
    # Connection -> callers named by rendezvous keys, for the fallback.
    named: dict[tuple[str, int], Counter[int]] = {}
    for call in calls:
        destination = _destination_task(call)
        if destination is not None and destination in by_task:
            named.setdefault((call.callee, call.connection), Counter())[by_task[destination]] += 1
    rpcs = []
    kept = []
    unattributed = by_key = undecodable = incomplete = 0
    for call in calls:
        callee = index_of.get(call.callee)
        caller: int | None = None
        if call.caller_pid is not None:
            caller = caller_of_pid.get(call.caller_pid)
        if caller is None:
            votes = named.get((call.callee, call.connection))
            if votes:
                caller = votes.most_common(1)[0][0]
                by_key += 1
        if callee is None or caller is None:
            unattributed += 1
            continue
        try:
            tensor = tensor_info(call)
        except MessageDecodeError:
            tensor = None
            undecodable += 1
        if not call.complete:
            incomplete += 1
        status = call.status_code
        if status is None:
            status = STATUS_CANCELLED if call.reset else STATUS_UNKNOWN
        start = max(0, call.start_ns - origin_ns)
        rpcs.append(
            Rpc(
                method=call.method,
                caller_task=caller,
                callee_task=callee,
                request_bytes=call.request_bytes,
                response_bytes=call.response_bytes,
                start_ns=start,
                response_start_ns=max(start, call.response_start_ns - origin_ns),
                end_ns=max(start, call.end_ns - origin_ns),
                tensor=tensor,
                status_code=status,
            )
        )
        kept.append(call)
    notes = AssemblyNotes(
        unattributed_calls=unattributed,
        attributed_by_rendezvous_key=by_key,
        undecodable_messages=undecodable,
        incomplete_calls=incomplete,
    )
    return rpcs, kept, notes
