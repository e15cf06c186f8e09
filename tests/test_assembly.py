"""Recorded calls to trace RPCs (``profiler.assembly.rpcs``), with TensorFlow's messages
written field by field: callers by process or by rendezvous key, times from the origin,
statuses of calls that never finished, tensor identities, and the notes of what was left
out."""

from __future__ import annotations

import dataclasses

from tf_grpc_bench.profiler.assembly.rpcs import (
    STATUS_CANCELLED,
    STATUS_UNKNOWN,
    AssemblyNotes,
    calls_to_rpcs,
    tensor_info,
)
from tf_grpc_bench.profiler.assembly.steps import (
    StepWindow,
    collective_instance_of,
    repeating_tail,
    step_id_of,
    step_windows,
)
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.trace import RECV_BUF, RECV_TENSOR, Rpc, Task, TensorInfo


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _key(dst_task: int, edge: str = "edge_1_w") -> str:
    return (
        "/job:ps/replica:0/task:0/device:CPU:0;1;"
        f"/job:worker/replica:0/task:{dst_task}/device:CPU:0;{edge};0:0"
    )


def recv_tensor_request(dst_task: int) -> bytes:
    return _field(1, 7) + _field(2, _key(dst_task).encode())


def recv_tensor_response(*, dtype: int = 1, dims: tuple[int, ...] = (3, 4)) -> bytes:
    """A RecvTensorResponse whose TensorProto has dtype, shape and 4-byte elements."""
    shape = b"".join(_field(2, _field(1, d)) for d in dims)
    count = 1
    for d in dims:
        count *= d
    tensor = _field(1, dtype) + _field(2, shape) + _field(4, bytes(4 * count))
    return _field(1, tensor)


TASKS = (
    Task(job="ps", index=0),
    Task(job="worker", index=0),
    Task(job="worker", index=1),
)


def _call(
    *,
    method: str = RECV_TENSOR,
    callee: str = "ps:0",
    connection: int = 1,
    caller_pid: int | None = 100,
    start_ns: int = 1_000,
    request_head: bytes = b"",
    response_head: bytes = b"",
    status_code: int | None = 0,
    reset: bool = False,
    complete: bool = True,
) -> RecordedCall:
    return RecordedCall(
        callee=callee,
        connection=connection,
        stream_id=1,
        caller_pid=caller_pid,
        method=method,
        start_ns=start_ns,
        response_start_ns=start_ns + 30,
        end_ns=start_ns + 50,
        request_bytes=len(request_head) or 9,
        response_bytes=len(response_head) or 11,
        request_messages=1,
        response_messages=1,
        status_code=status_code,
        reset=reset,
        complete=complete,
        request_head=request_head,
        response_head=response_head,
    )


def test_a_recv_tensor_call_becomes_an_rpc_with_its_tensor_and_times_from_the_origin() -> None:
    call = _call(request_head=recv_tensor_request(1), response_head=recv_tensor_response())
    rpcs, kept, notes = calls_to_rpcs([call], tasks=TASKS, caller_of_pid={100: 2}, origin_ns=400)
    assert rpcs == [
        Rpc(
            method=RECV_TENSOR,
            caller_task=2,
            callee_task=0,
            request_bytes=call.request_bytes,
            response_bytes=call.response_bytes,
            start_ns=600,
            response_start_ns=630,
            end_ns=650,
            tensor=TensorInfo(
                rendezvous_key=_key(1), dtype="float32", shape=(3, 4), content_bytes=48
            ),
            status_code=0,
        )
    ]
    assert kept == [call]
    assert notes == AssemblyNotes()


def test_times_before_the_origin_are_clamped_to_it() -> None:
    call = _call(start_ns=100)
    (rpc,), _, _ = calls_to_rpcs([call], tasks=TASKS, caller_of_pid={100: 1}, origin_ns=140)
    assert (rpc.start_ns, rpc.response_start_ns, rpc.end_ns) == (0, 0, 10)


def test_calls_without_a_status_are_cancelled_when_reset_and_unknown_otherwise() -> None:
    assert (STATUS_CANCELLED, STATUS_UNKNOWN) == (1, 2)
    calls = [
        _call(status_code=None, reset=True),
        _call(status_code=None, complete=False),
        _call(status_code=5),
    ]
    rpcs, _, notes = calls_to_rpcs(calls, tasks=TASKS, caller_of_pid={100: 1}, origin_ns=0)
    assert [r.status_code for r in rpcs] == [1, 2, 5]
    assert notes == AssemblyNotes(incomplete_calls=1)


def test_a_connection_without_a_known_process_is_attributed_by_its_rendezvous_keys() -> None:
    calls = [
        _call(caller_pid=None, connection=4, request_head=recv_tensor_request(0)),
        _call(caller_pid=None, connection=4, request_head=recv_tensor_request(1)),
        _call(caller_pid=None, connection=4, request_head=recv_tensor_request(1)),
        _call(caller_pid=None, connection=4, method="/tensorflow.WorkerService/RunGraph"),
        _call(caller_pid=999, connection=4, method="/tensorflow.WorkerService/RunGraph"),
        # A connection whose requests name no task.
        _call(caller_pid=None, connection=5, method="/tensorflow.WorkerService/RunGraph"),
        # A callee that is not in the trace's tasks.
        _call(caller_pid=100, connection=6, callee="ps:1"),
    ]
    rpcs, kept, notes = calls_to_rpcs(calls, tasks=TASKS, caller_of_pid={100: 1}, origin_ns=0)
    # worker:1 (task 2) is named twice, worker:0 once: the connection is worker 1's.
    assert [r.caller_task for r in rpcs] == [2, 2, 2, 2, 2]
    assert kept == calls[:5]
    assert notes == AssemblyNotes(unattributed_calls=2, attributed_by_rendezvous_key=5)
    assert notes.as_extra() == {
        "unattributed_calls": "2",
        "attributed_by_rendezvous_key": "5",
        "undecodable_messages": "0",
        "incomplete_calls": "0",
    }


def test_a_recv_buf_names_its_destination_device() -> None:
    request = _field(2, b"1:5:0:0:1:0:1") + _field(3, 4096)
    request += _field(9, b"/job:worker/replica:0/task:0/device:CPU:0")
    call = _call(method=RECV_BUF, caller_pid=None, request_head=request)
    (rpc,), _, notes = calls_to_rpcs([call], tasks=TASKS, caller_of_pid={}, origin_ns=0)
    assert rpc.caller_task == 1
    assert rpc.tensor == TensorInfo(rendezvous_key="1:5:0:0:1:0:1", content_bytes=4096)
    assert notes.attributed_by_rendezvous_key == 1


def test_an_undecodable_head_leaves_the_tensor_out_and_is_counted() -> None:
    bad = b"\x0f\x01"  # field 1 with wire type 7: not protobuf
    calls = [
        _call(request_head=bad, complete=False),
        _call(request_head=bad, complete=False),
        _call(method=RECV_TENSOR, caller_pid=None, request_head=bad),
        # A request naming a task the trace does not have: no vote, and no error.
        _call(request_head=recv_tensor_request(5)),
    ]
    rpcs, _, notes = calls_to_rpcs(calls, tasks=TASKS, caller_of_pid={100: 1}, origin_ns=0)
    assert [r.tensor is None for r in rpcs] == [True, True, False]
    assert notes == AssemblyNotes(unattributed_calls=1, undecodable_messages=2, incomplete_calls=2)


def test_tensor_info_of_each_method() -> None:
    assert tensor_info(_call(method="/tensorflow.WorkerService/RunGraph")) is None
    no_tensor = tensor_info(_call(request_head=recv_tensor_request(0), response_head=b""))
    assert no_tensor == TensorInfo(rendezvous_key=_key(0), dtype="", shape=(), content_bytes=0)
    scalar = tensor_info(
        _call(request_head=recv_tensor_request(0), response_head=recv_tensor_response(dims=()))
    )
    assert scalar == TensorInfo(rendezvous_key=_key(0), dtype="float32", shape=(), content_bytes=4)
    # RecvBuf: the request's size, else the response's, else the chunks carried.
    key = _field(2, b"3:9")
    response_size = _field(2, 700)
    chunks = _field(1, b"x" * 40) + _field(1, b"y" * 2)
    carried = _field(4, _field(1, b"type") + _field(2, chunks))
    assert tensor_info(
        _call(method=RECV_BUF, request_head=key + _field(3, 900), response_head=response_size)
    ) == TensorInfo(rendezvous_key="3:9", content_bytes=900)
    assert tensor_info(
        _call(method=RECV_BUF, request_head=key, response_head=response_size + carried)
    ) == TensorInfo(rendezvous_key="3:9", content_bytes=700)
    assert tensor_info(
        _call(method=RECV_BUF, request_head=key, response_head=carried)
    ) == TensorInfo(rendezvous_key="3:9", content_bytes=42)


# --------------------------------------------------------------------------
# Step windows (``profiler.assembly.steps``).


def _marker(step: int, start: int, end: int, *, task: str = "chief:0", phase: str = "steady"):  # type: ignore[no-untyped-def]
    return StepMarker(task=task, step=step, phase=phase, start_ns=start, end_ns=end)


def test_markers_make_one_window_per_step_number_in_start_order() -> None:
    windows = step_windows(
        [
            _marker(3, 900, 950),
            _marker(2, 500, 640, task="worker:1"),
            _marker(2, 480, 600, task="worker:0"),
            _marker(1, 100, 200, phase="warmup"),
            _marker(4, 900, 910),
        ]
    )
    assert windows == [
        StepWindow(number=2, start_ns=480, end_ns=640),
        StepWindow(number=3, start_ns=900, end_ns=950),
        StepWindow(number=4, start_ns=900, end_ns=910),
    ]
    assert step_windows([]) == []


def _step_call(
    step_id: int, start: int, *, ps: bool = True, method: str = RECV_TENSOR
) -> RecordedCall:
    source = "/job:ps/replica:0/task:0" if ps else "/job:chief/replica:0/task:0"
    key = f"{source}/device:CPU:0;1;/job:worker/replica:0/task:0/device:CPU:0;edge_1_w;0:0"
    head = _field(1, step_id) + _field(2, key.encode())
    if method == RECV_BUF:
        head = _field(1, step_id) + _field(2, b"1:2:0")
    return RecordedCall(
        callee="ps:0",
        connection=1,
        stream_id=1,
        caller_pid=1,
        method=method,
        start_ns=start,
        response_start_ns=start,
        end_ns=start + 10,
        request_bytes=len(head),
        response_bytes=0,
        request_messages=1,
        response_messages=1,
        status_code=0,
        reset=False,
        complete=True,
        request_head=head,
    )


def test_the_step_id_of_a_call_comes_from_its_request() -> None:
    assert step_id_of(_step_call(41, 0)) == 41
    assert step_id_of(_step_call(42, 0, method=RECV_BUF)) == 42
    assert step_id_of(_step_call(43, 0, method="/tensorflow.WorkerService/RunGraph")) == 0
    bad = dataclasses.replace(_step_call(44, 0), request_head=b"\x0f")
    assert step_id_of(bad) == 0


def test_collective_instances_come_from_buffer_keys_of_digits() -> None:
    def buf(key: bytes, method: str = RECV_BUF) -> RecordedCall:
        return dataclasses.replace(
            _step_call(0, 0, method=RECV_BUF), method=method, request_head=_field(2, key)
        )

    assert collective_instance_of(buf(b"1:639:0:0:1:0:1")) == (1, 639)
    assert collective_instance_of(buf(b"12:7")) == (12, 7)
    assert collective_instance_of(buf(b"12")) is None
    assert collective_instance_of(buf(b"a:7")) is None
    assert collective_instance_of(buf(b"7:b:1")) is None
    assert collective_instance_of(buf(b"1:2", method=RECV_TENSOR)) is None
    bad = dataclasses.replace(buf(b"1:2"), request_head=b"\x0f")
    assert collective_instance_of(bad) is None


def test_the_longest_periodic_tail_prefers_the_shorter_period_and_needs_two_repeats() -> None:
    assert repeating_tail([]) == (0, 0)
    assert repeating_tail(["a"]) == (0, 1)
    assert repeating_tail(["a", "a"]) == (1, 0)
    assert repeating_tail(["x", "a", "b", "a", "b"]) == (2, 1)
    assert repeating_tail(list("abab"), longest_period=1) == (0, 4)
    assert repeating_tail(list("zzabcabc")) == (3, 2)
