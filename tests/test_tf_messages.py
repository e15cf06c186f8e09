"""Decoding TensorFlow's worker-service messages from the first bytes the proxy keeps.

TensorProto bytes here are genuine: serialized by TensorFlow's own
``tensor_pb2`` (``tf.make_tensor_proto``).  The worker-service wrappers around
them (RecvTensorRequest/Response, RecvBuf*) are not shipped by the TensorFlow
wheel, so the tests write those few fields with the protobuf wire format; the
real-traffic capture tests (test_capture.py) decode what TensorFlow itself sent.
"""

from __future__ import annotations

import numpy as np
import pytest

from tf_grpc_bench.profiler.assembly import tf_messages
from tf_grpc_bench.profiler.assembly.tf_messages import (
    MessageDecodeError,
    decode_recv_buf_request,
    decode_recv_buf_response,
    decode_recv_tensor_request,
    decode_recv_tensor_response,
    decode_tensor_header,
    dtype_name,
    iter_fields,
    parse_rendezvous_key,
    task_of_device,
)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _fixed64(number: int, value: int) -> bytes:
    return _varint(number << 3 | 1) + value.to_bytes(8, "little")


@pytest.fixture(scope="module")
def tf():  # type: ignore[no-untyped-def]
    return pytest.importorskip("tensorflow")


@pytest.mark.tensorflow
def test_dtype_names_match_tensorflows_for_every_datatype(tf) -> None:  # type: ignore[no-untyped-def]
    from tensorflow.core.framework import types_pb2

    for name, number in types_pb2.DataType.items():
        if number == types_pb2.DT_INVALID:
            continue
        assert dtype_name(number) == tf.dtypes.as_dtype(number).name, name


@pytest.mark.tensorflow
def test_field_numbers_agree_with_tensorflows_tensor_proto(tf) -> None:  # type: ignore[no-untyped-def]
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2

    fields = {f.name: f.number for f in tensor_pb2.TensorProto.DESCRIPTOR.fields}
    assert fields["dtype"] == tf_messages._TENSOR_DTYPE
    assert fields["tensor_shape"] == tf_messages._TENSOR_SHAPE
    assert fields["tensor_content"] == tf_messages._TENSOR_CONTENT
    value_fields = {n for name, n in fields.items() if name.endswith("_val")} | {
        fields["tensor_content"]
    }
    assert value_fields == tf_messages._TENSOR_VALUE_FIELDS
    shape = {f.name: f.number for f in tensor_shape_pb2.TensorShapeProto.DESCRIPTOR.fields}
    assert shape["dim"] == tf_messages._SHAPE_DIM
    assert shape["unknown_rank"] == tf_messages._SHAPE_UNKNOWN_RANK


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    "array",
    [
        np.zeros((1024, 512), np.float32),
        np.arange(24, dtype=np.int64).reshape(2, 3, 4),
        np.ones((3, 3, 8, 16), np.float16),
        np.array([True, False, True]),
        np.zeros((0,), np.float32),
        np.float32(1.5),
        np.arange(7, dtype=np.int32),
    ],
    ids=["float32-2d", "int64-3d", "float16-4d", "bool", "empty", "scalar", "int32"],
)
def test_tensor_header_reads_genuine_tensor_protos(tf, array: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    proto = tf.make_tensor_proto(array)
    data = proto.SerializeToString()
    header = decode_tensor_header(data)
    assert header.dtype == tf.dtypes.as_dtype(array.dtype).name
    assert header.shape == tuple(array.shape)
    assert header.complete
    if proto.tensor_content:
        assert header.content_bytes == len(proto.tensor_content) == array.nbytes
    else:
        # Small tensors may use the typed *_val fields instead: their bytes count.
        assert (header.content_bytes > 0) == (array.size > 0)


@pytest.mark.tensorflow
def test_first_bytes_of_a_large_response_give_dtype_shape_and_content_size(tf) -> None:  # type: ignore[no-untyped-def]
    array = np.zeros((1024, 512), np.float32)
    tensor = tf.make_tensor_proto(array).SerializeToString()
    response = _field(1, tensor) + _field(2, 0) + _field(3, 1_700_000_000_000_000)
    for kept in (40, 200, 1024):
        decoded = decode_recv_tensor_response(response[:kept])
        assert decoded.tensor is not None
        assert decoded.tensor.dtype == "float32"
        assert decoded.tensor.shape == (1024, 512)
        assert decoded.tensor.content_bytes == array.nbytes
        assert not decoded.tensor.complete
    whole = decode_recv_tensor_response(response)
    assert whole.tensor is not None and whole.tensor.complete
    assert not whole.is_dead


@pytest.mark.tensorflow
def test_control_edge_response_is_an_empty_float_tensor(tf) -> None:  # type: ignore[no-untyped-def]
    tensor = tf.make_tensor_proto(np.zeros((0,), np.float32)).SerializeToString()
    decoded = decode_recv_tensor_response(_field(1, tensor))
    assert decoded.tensor is not None
    assert (decoded.tensor.dtype, decoded.tensor.shape, decoded.tensor.content_bytes) == (
        "float32",
        (0,),
        0,
    )


def test_recv_tensor_request_gives_step_id_key_and_request_id() -> None:
    key = (
        "/job:ps/replica:0/task:0/device:CPU:0;5f1e2d3c4b5a6978;"
        "/job:worker/replica:0/task:1/device:CPU:0;edge_12_conv1/kernel/read;0:0"
    )
    data = _field(1, -3688566517109693244) + _field(2, key.encode()) + _field(3, 1)
    data += _field(4, b"\x08\x01") + _field(7, 123456789)
    request = decode_recv_tensor_request(data)
    assert request.step_id == -3688566517109693244
    assert request.rendezvous_key == key
    assert request.request_id == 123456789
    parts = parse_rendezvous_key(request.rendezvous_key)
    assert parts is not None
    assert parts.edge_name == "edge_12_conv1/kernel/read"
    assert task_of_device(parts.src_device) == ("ps", 0)
    assert task_of_device(parts.dst_device) == ("worker", 1)


def test_recv_buf_messages_give_key_devices_and_sizes() -> None:
    request = decode_recv_buf_request(
        _field(1, 0)
        + _field(2, b"1:639:0:0:1:0:1")
        + _field(3, 4_194_304)
        + _fixed64(4, 0xDEADBEEF)
        + _field(8, b"/job:worker/replica:0/task:0/device:CPU:0")
        + _field(9, b"/job:worker/replica:0/task:1/device:CPU:0")
        + _field(10, 77)
        + _field(11, 987654321)
    )
    assert request.buf_rendezvous_key == "1:639:0:0:1:0:1"
    assert request.num_bytes == 4_194_304
    assert task_of_device(request.src_device) == ("worker", 0)
    assert task_of_device(request.dst_device) == ("worker", 1)
    assert request.request_id == 77
    chunks = _field(1, b"x" * 1000) + _field(1, b"y" * 500)
    any_value = _field(1, b"type.googleapis.com/tensorflow.RecvBufRespExtra") + _field(2, chunks)
    response_bytes = (
        _fixed64(1, 0) + _field(2, 1500) + _field(3, 0) + _field(4, any_value) + _field(5, 3)
    )
    response = decode_recv_buf_response(response_bytes)
    assert (response.num_bytes, response.is_dead, response.transport_bytes) == (1500, False, 1500)
    truncated = decode_recv_buf_response(response_bytes[:30])
    assert truncated.num_bytes == 1500


def test_truncation_anywhere_never_raises_and_never_invents_fields() -> None:
    data = _field(1, 42) + _field(2, b"k" * 300) + _fixed64(4, 7) + _field(7, 9)
    complete = [(f.number, f.value) for f in iter_fields(data)]
    for cut in range(len(data)):
        seen = list(iter_fields(data[:cut]))
        for field, (number, value) in zip(seen, complete, strict=False):
            assert field.number == number
            if field.truncated:
                assert isinstance(value, bytes) and value.startswith(field.value)  # type: ignore[arg-type]
            else:
                assert field.value == value


def test_unsupported_wire_types_are_refused() -> None:
    with pytest.raises(MessageDecodeError, match="wire type 3"):
        list(iter_fields(bytes([1 << 3 | 3, 0])))
    with pytest.raises(MessageDecodeError, match="field number 0"):
        list(iter_fields(b"\x00\x01"))


def test_device_and_key_parsing_refuse_what_they_do_not_know() -> None:
    assert parse_rendezvous_key("1:639:0:0:1:0:1") is None
    assert task_of_device("/device:CPU:0") is None
    assert task_of_device("/job:chief/replica:0/task:0/device:CPU:0") == ("chief", 0)
    assert dtype_name(1) == "float32"
    assert dtype_name(101) == "float32_ref"
    assert dtype_name(999) == "dtype_999"


@pytest.mark.tensorflow
def test_a_recv_tensor_exchange_framed_like_grpc_decodes_from_the_kept_head(tf) -> None:  # type: ignore[no-untyped-def]
    """HTTP/2 frames (hyperframe, hpack) carrying a genuine TensorProto, followed and decoded."""
    import hpack
    from hyperframe.frame import DataFrame, HeadersFrame

    from tf_grpc_bench.profiler.recorders.http2 import Http2Follower, MessageSeen

    array = np.arange(64 * 1024, dtype=np.float32).reshape(256, 256)
    response = _field(1, tf.make_tensor_proto(array).SerializeToString()) + _field(3, 12345)
    message = b"\x00" + len(response).to_bytes(4, "big") + response
    encoder = hpack.Encoder()
    data = HeadersFrame(1, encoder.encode([(":status", "200")]), flags=["END_HEADERS"]).serialize()
    for start in range(0, len(message), 16384):
        frame = DataFrame(1, message[start : start + 16384])
        frame.flags.add("PADDED")
        frame.pad_length = 3
        data += frame.serialize()
    trailers = encoder.encode([("grpc-status", "0")])
    data += HeadersFrame(1, trailers, flags=["END_HEADERS", "END_STREAM"]).serialize()
    events: list[object] = []
    Http2Follower(events.append, client_side=False).feed(data, 1)
    (seen,) = [e for e in events if isinstance(e, MessageSeen)]
    assert seen.length == len(response) and len(seen.head) == 1024
    decoded = decode_recv_tensor_response(seen.head)
    assert decoded.tensor is not None
    assert (decoded.tensor.dtype, decoded.tensor.shape) == ("float32", (256, 256))
    assert decoded.tensor.content_bytes == array.nbytes
