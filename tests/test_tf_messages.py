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


# --------------------------------------------------------------------------
# The wire reader and the decoders on bytes written by hand (no TensorFlow).


def _fixed32(number: int, value: int) -> bytes:
    return _varint(number << 3 | 5) + value.to_bytes(4, "little")


def test_fields_of_every_wire_type_with_their_values_and_lengths() -> None:
    data = _field(1, 300) + _fixed64(2, 2**40 + 5) + _field(3, b"abc") + _fixed32(4, 70000)
    data += _field(536_870_911, 1)  # the largest field number
    fields = list(iter_fields(data))
    assert [(f.number, f.wire_type, f.value, f.length) for f in fields] == [
        (1, 0, 300, 0),
        (2, 1, 2**40 + 5, 0),
        (3, 2, b"abc", 3),
        (4, 5, 70000, 0),
        (536_870_911, 0, 1, 0),
    ]
    assert not any(f.truncated for f in fields)
    assert list(iter_fields(b"")) == []


def test_a_field_cut_short_is_yielded_truncated_and_ends_the_message() -> None:
    data = _field(1, 7) + _field(2, b"0123456789") + _field(3, 1)
    fields = list(iter_fields(data[:-4]))  # the string is cut after 8 of its 10 bytes
    assert [(f.number, f.value, f.length, f.truncated) for f in fields] == [
        (1, 7, 0, False),
        (2, b"01234567", 10, True),
    ]
    # Cut inside a key, a varint value, a length or a fixed value: stops quietly.
    assert list(iter_fields(b"\x88")) == []
    assert list(iter_fields(b"\x08\x96")) == []
    assert list(iter_fields(b"\x12\x96")) == []
    assert list(iter_fields(b"\x09" + bytes(7))) == []
    assert list(iter_fields(b"\x0d" + bytes(3))) == []
    assert [f.value for f in iter_fields(b"\x0d" + bytes([1, 0, 0, 0]))] == [1]


def test_a_varint_of_ten_bytes_is_the_longest() -> None:
    longest = b"\x08" + b"\xff" * 9 + b"\x01"
    assert [f.value for f in iter_fields(longest)] == [2**64 - 1]
    with pytest.raises(MessageDecodeError, match=r"^varint longer than 10 bytes$"):
        list(iter_fields(b"\x08" + b"\xff" * 10 + b"\x01"))


def test_unsupported_wire_types_are_named() -> None:
    for wire_type in (3, 4, 6, 7):
        with pytest.raises(
            MessageDecodeError, match=rf"^field 2: unsupported wire type {wire_type}$"
        ):
            list(iter_fields(bytes([2 << 3 | wire_type, 0])))
    with pytest.raises(MessageDecodeError, match=r"^field number 0$"):
        list(iter_fields(b"\x00\x01"))


def _tensor(
    dtype: int, dims: tuple[int, ...], content: bytes, *, unknown_rank: bool = False
) -> bytes:
    shape = b"".join(_field(2, _field(1, d) if d else b"") for d in dims)
    if unknown_rank:
        shape += _field(3, 1)
    return _field(1, dtype) + _field(2, shape) + _field(4, content)


def test_a_tensor_header_from_dtype_shape_and_content() -> None:
    header = decode_tensor_header(_tensor(19, (2, 0, 3), bytes(12)))
    # A dimension of size 0 is written without its size field.
    assert header == tf_messages.TensorHeader(
        dtype="float16", shape=(2, 0, 3), content_bytes=12, complete=True
    )
    negative = _field(1, 1) + _field(2, _field(2, _field(1, -1)))
    assert decode_tensor_header(negative).shape == (-1,)


def test_a_tensor_without_a_shape_field_is_a_scalar_unless_cut() -> None:
    scalar = _field(1, 9) + _field(5, bytes(8))  # an int64 value field
    assert decode_tensor_header(scalar) == tf_messages.TensorHeader(
        dtype="int64", shape=(), content_bytes=8, complete=True
    )
    cut = _field(1, 1) + _field(4, bytes(100))[:20]
    assert decode_tensor_header(cut) == tf_messages.TensorHeader(
        dtype="float32", shape=None, content_bytes=100, complete=False
    )


def test_a_shape_of_unknown_rank_or_cut_is_none() -> None:
    assert decode_tensor_header(_tensor(1, (4,), b"", unknown_rank=True)).shape is None
    assert decode_tensor_header(_field(1, 1) + _field(2, _field(3, 0))).shape == ()
    full = _tensor(1, (300, 400), bytes(10))
    cut_in_shape = full[: 2 + 2 + 4]  # dtype, the shape's key and length, part of its dims
    header = decode_tensor_header(cut_in_shape)
    assert (header.dtype, header.shape, header.complete) == ("float32", None, False)


def test_value_fields_add_up_and_fixed_ones_count_eight_bytes() -> None:
    data = _field(1, 7) + _field(8, b"ab") + _field(8, b"cde") + _fixed64(6, 1) + _field(3, 5)
    header = decode_tensor_header(data)
    assert (header.dtype, header.content_bytes) == ("string", 2 + 3 + 8)
    # Field 3 (version_number) and 19 (not a value field) are not content.
    assert decode_tensor_header(_field(1, 1) + _field(19, b"xyz")).content_bytes == 0
    assert decode_tensor_header(_field(1, 1) + _field(18, b"xyz")).content_bytes == 3


def test_a_header_is_complete_only_when_the_whole_message_was_kept() -> None:
    data = _tensor(1, (2,), bytes(8))
    assert decode_tensor_header(data, declared_length=len(data)).complete
    assert decode_tensor_header(data, declared_length=len(data) - 1).complete
    assert not decode_tensor_header(data, declared_length=len(data) + 1).complete


def test_a_recv_tensor_response_gives_its_tensor_and_dead_flag() -> None:
    tensor = _tensor(1, (2, 2), bytes(16))
    response = decode_recv_tensor_response(_field(1, tensor) + _field(2, 1))
    assert response.is_dead
    assert response.tensor == tf_messages.TensorHeader(
        dtype="float32", shape=(2, 2), content_bytes=16, complete=True
    )
    # Cut inside the tensor: the header knows the tensor's declared length.
    # Outer key and length (2), dtype (2), shape (10), then 3 bytes of the content's field.
    cut = decode_recv_tensor_response(_field(1, tensor)[:17])
    assert cut.tensor is not None and not cut.tensor.complete
    assert cut.tensor.shape == (2, 2)
    assert decode_recv_tensor_response(b"") == tf_messages.RecvTensorResponse(
        tensor=None, is_dead=False
    )
    assert decode_recv_tensor_response(_field(2, 0)).is_dead is False
    with pytest.raises(
        MessageDecodeError,
        match=r"^RecvTensorResponse\.is_dead: expected an integer, got a length-delimited field$",
    ):
        decode_recv_tensor_response(_field(2, b"x"))


def test_recv_tensor_request_fields_and_their_wrong_types() -> None:
    data = _field(1, 5) + _field(2, b"k\xff") + _field(7, -2) + _field(3, 9)
    assert decode_recv_tensor_request(data) == tf_messages.RecvTensorRequest(
        step_id=5, rendezvous_key="k\ufffd", request_id=-2
    )
    assert decode_recv_tensor_request(b"") == tf_messages.RecvTensorRequest(
        step_id=0, rendezvous_key="", request_id=0
    )
    with pytest.raises(
        MessageDecodeError,
        match=r"^RecvTensorRequest\.rendezvous_key: expected a string, got wire type 0$",
    ):
        decode_recv_tensor_request(_field(2, 3))
    with pytest.raises(MessageDecodeError, match=r"^RecvTensorRequest\.step_id: expected an"):
        decode_recv_tensor_request(_field(1, b"x"))
    with pytest.raises(MessageDecodeError, match=r"^RecvTensorRequest\.request_id: expected an"):
        decode_recv_tensor_request(_field(7, b"x"))


def test_recv_buf_request_fields_and_their_wrong_types() -> None:
    data = _field(1, -7) + _field(2, b"1:2") + _field(3, 64) + _field(8, b"/job:a/task:0")
    data += _field(9, b"/job:b/task:1") + _field(10, 11) + _field(4, 99)
    assert decode_recv_buf_request(data) == tf_messages.RecvBufRequest(
        step_id=-7,
        buf_rendezvous_key="1:2",
        num_bytes=64,
        src_device="/job:a/task:0",
        dst_device="/job:b/task:1",
        request_id=11,
    )
    assert decode_recv_buf_request(b"") == tf_messages.RecvBufRequest(
        step_id=0, buf_rendezvous_key="", num_bytes=0, src_device="", dst_device="", request_id=0
    )
    for number, name in ((1, "step_id"), (3, "num_bytes"), (10, "request_id")):
        with pytest.raises(MessageDecodeError, match=rf"^RecvBufRequest\.{name}: expected an"):
            decode_recv_buf_request(_field(number, b"x"))
    for number, name in ((2, "buf_rendezvous_key"), (8, "src_device"), (9, "dst_device")):
        with pytest.raises(MessageDecodeError, match=rf"^RecvBufRequest\.{name}: expected a str"):
            decode_recv_buf_request(_field(number, 1))


def test_recv_buf_response_fields_and_their_wrong_types() -> None:
    chunks = _field(1, b"a" * 10) + _field(2, b"ignored") + _field(1, b"b" * 5)
    extra = _field(1, b"type.googleapis.com/x") + _field(2, chunks)
    response = decode_recv_buf_response(_field(2, 15) + _field(3, 1) + _field(4, extra))
    assert response == tf_messages.RecvBufResponse(num_bytes=15, is_dead=True, transport_bytes=15)
    assert decode_recv_buf_response(_field(2, -1)).num_bytes == -1
    assert decode_recv_buf_response(b"") == tf_messages.RecvBufResponse(
        num_bytes=0, is_dead=False, transport_bytes=0
    )
    with pytest.raises(MessageDecodeError, match=r"^RecvBufResponse\.num_bytes: expected an"):
        decode_recv_buf_response(_field(2, b"x"))
    with pytest.raises(MessageDecodeError, match=r"^RecvBufResponse\.is_dead: expected an"):
        decode_recv_buf_response(_field(3, b"x"))


def test_rendezvous_keys_and_device_names_by_their_parts() -> None:
    key = parse_rendezvous_key("src;inc;dst;edge_3_x;1:2")
    assert key == tf_messages.RendezvousKey(
        src_device="src",
        src_incarnation="inc",
        dst_device="dst",
        edge_name="edge_3_x",
        frame_iter="1:2",
    )
    assert parse_rendezvous_key("a;b;c;d") is None
    assert parse_rendezvous_key("a;b;c;d;e;f") is None
    assert task_of_device("/job:ps/replica:0/task:12/device:CPU:0") == ("ps", 12)
    assert task_of_device("/job:ps/replica:0/task:x") is None
    assert task_of_device("/job:/task:1") is None
    assert task_of_device("/job:ps") is None
    assert task_of_device("/task:1") is None
    assert dtype_name(0) == "dtype_0"
    assert dtype_name(100) == "dtype_100"
    assert dtype_name(119) == "float16_ref"
    assert dtype_name(133) == "float4_e2m1fn_ref"
    assert dtype_name(134) == "dtype_134"
