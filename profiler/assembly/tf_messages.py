"""Decode the few fields of TensorFlow's worker-service messages that a trace needs.

The recording proxy keeps only the first bytes of each gRPC message (see
``http2.MESSAGE_HEAD_BYTES``), so these decoders read *truncated* protobuf
messages: a field whose value runs past the end of the kept bytes is reported
with its declared length and whatever part of it was kept.  ``google.protobuf``
cannot parse a truncated message, and the TensorFlow wheel does not ship the
worker-service messages anyway, so this module carries a tiny wire-format
reader of its own and the field numbers it needs (facts about TensorFlow's
``worker.proto``, ``tensor.proto``, ``tensor_shape.proto`` and
``transport_options.proto``; no schema text is copied).

Which fields matter:

* ``RecvTensorRequest``: ``step_id`` (1), ``rendezvous_key`` (2),
  ``request_id`` (7).
* ``RecvTensorResponse``: ``tensor`` (1, a ``TensorProto``), ``is_dead`` (2).
  TensorFlow writes the tensor's ``dtype`` (1) and ``tensor_shape`` (2) before
  its ``tensor_content`` (4), so a few hundred bytes give the tensor's identity
  and the content's declared length gives its size.
* ``RecvBufRequest``: ``step_id`` (1), ``buf_rendezvous_key`` (2),
  ``num_bytes`` (3), ``src_device`` (8), ``dst_device`` (9), ``request_id`` (10).
* ``RecvBufResponse``: ``num_bytes`` (2), ``is_dead`` (3), ``transport_options``
  (4, an ``Any`` whose value holds the data chunks as repeated bytes field 1).
* ``RunGraphRequest``: ``step_id`` (2); ``CleanupGraphRequest``: ``step_id`` (1):
  the run a graph execution, and its clean-up, belong to (checked against the
  RecvTensor step ids of real TF1 traffic in ``tests/test_tf_messages.py``).

Pure: no TensorFlow, no IO.  Malformed input raises ``MessageDecodeError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tf_grpc_bench.errors import CaptureError

#: TensorFlow's ``DataType`` enum numbers -> the names ``tf.dtypes`` uses.
#: Reference types are the plain type + 100, named with a ``_ref`` suffix.
DTYPE_NAMES: dict[int, str] = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    8: "complex64",
    9: "int64",
    10: "bool",
    11: "qint8",
    12: "quint8",
    13: "qint32",
    14: "bfloat16",
    15: "qint16",
    16: "quint16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    20: "resource",
    21: "variant",
    22: "uint32",
    23: "uint64",
    24: "float8_e5m2",
    25: "float8_e4m3fn",
    26: "float8_e4m3fnuz",
    27: "float8_e4m3b11fnuz",
    28: "float8_e5m2fnuz",
    29: "int4",
    30: "uint4",
    31: "int2",
    32: "uint2",
    33: "float4_e2m1fn",
}
_REF_OFFSET = 100

# Field numbers (facts about TensorFlow's messages).
_TENSOR_DTYPE = 1
_TENSOR_SHAPE = 2
_TENSOR_CONTENT = 4
#: TensorProto fields that carry values: the typed ``*_val`` fields and
#: ``tensor_content``; their bytes are the tensor's content.
_TENSOR_VALUE_FIELDS = frozenset({4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18})
_SHAPE_DIM = 2
_SHAPE_UNKNOWN_RANK = 3
_DIM_SIZE = 1

_VARINT = 0
_FIXED64 = 1
_LENGTH_DELIMITED = 2
_FIXED32 = 5


class MessageDecodeError(CaptureError):
    """Bytes that are not the protobuf message they were expected to be."""


def dtype_name(number: int) -> str:
    """TensorFlow's name for a ``DataType`` number (1 -> ``float32``); ``dtype_<n>`` if unknown."""
    if number in DTYPE_NAMES:
        return DTYPE_NAMES[number]
    if number - _REF_OFFSET in DTYPE_NAMES:
        return DTYPE_NAMES[number - _REF_OFFSET] + "_ref"
    return f"dtype_{number}"


@dataclass(frozen=True, slots=True)
class WireField:
    """One field of a protobuf message as read from the wire.

    ``value`` is the integer of a varint or fixed field, or the (possibly
    truncated) bytes of a length-delimited one; ``length`` is the declared
    length of a length-delimited field (``len(value)`` unless truncated).
    """

    number: int
    wire_type: int
    value: int | bytes
    length: int

    @property
    def truncated(self) -> bool:
        return isinstance(self.value, bytes) and len(self.value) < self.length


def _read_varint(data: bytes, position: int) -> tuple[int, int] | None:
    """(value, next position), or None if ``data`` ends inside the varint."""
    result = 0
    shift = 0
    while position < len(data):
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise MessageDecodeError("varint longer than 10 bytes")
    return None


def iter_fields(data: bytes) -> Iterator[WireField]:
    """The fields of a serialized message, in wire order, tolerating truncation.

    Stops quietly where ``data`` ends inside a field's key or fixed-size value;
    a length-delimited field that runs past the end is yielded truncated and
    ends the iteration.  Raises MessageDecodeError for wire types protobuf does
    not have (groups included: no TensorFlow message here uses them).
    """
    position = 0
    end = len(data)
    while position < end:
        key = _read_varint(data, position)
        if key is None:
            return
        tag, position = key
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise MessageDecodeError("field number 0")
        if wire_type == _VARINT:
            read = _read_varint(data, position)
            if read is None:
                return
            value, position = read
            yield WireField(number, wire_type, value, 0)
        elif wire_type in (_FIXED64, _FIXED32):
            size = 8 if wire_type == _FIXED64 else 4
            if position + size > end:
                return
            value = int.from_bytes(data[position : position + size], "little")
            position += size
            yield WireField(number, wire_type, value, 0)
        elif wire_type == _LENGTH_DELIMITED:
            read = _read_varint(data, position)
            if read is None:
                return
            length, position = read
            chunk = bytes(data[position : position + length])
            yield WireField(number, wire_type, chunk, length)
            if len(chunk) < length:
                return
            position += length
        else:
            raise MessageDecodeError(f"field {number}: unsupported wire type {wire_type}")


def _signed64(value: int) -> int:
    """An int64 field's value from its varint (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(field: WireField, what: str) -> str:
    if not isinstance(field.value, bytes):
        raise MessageDecodeError(f"{what}: expected a string, got wire type {field.wire_type}")
    return field.value.decode("utf-8", "replace")


def _integer(field: WireField, what: str) -> int:
    if isinstance(field.value, bytes):
        raise MessageDecodeError(f"{what}: expected an integer, got a length-delimited field")
    return field.value


# --------------------------------------------------------------------------
# Tensors.


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorHeader:
    """What the first bytes of a serialized ``TensorProto`` tell.

    ``shape`` is None when the shape was cut off or its rank unknown.
    ``content_bytes`` is the declared size of the value fields seen (the
    ``tensor_content`` length for the tensors TensorFlow sends), complete when
    ``complete`` is true (every field of the message was at least started).
    """

    dtype: str
    shape: tuple[int, ...] | None
    content_bytes: int
    complete: bool


def _decode_shape(data: bytes) -> tuple[int, ...] | None:
    dims: list[int] = []
    for field in iter_fields(data):
        if field.truncated:
            return None
        if field.number == _SHAPE_UNKNOWN_RANK and field.value:
            return None
        if field.number == _SHAPE_DIM and isinstance(field.value, bytes):
            size = 0
            for dim_field in iter_fields(field.value):
                if dim_field.number == _DIM_SIZE:
                    size = _signed64(_integer(dim_field, "TensorShapeProto.dim.size"))
            dims.append(size)
    return tuple(dims)


def decode_tensor_header(data: bytes, *, declared_length: int | None = None) -> TensorHeader:
    """Decode a (possibly truncated) serialized ``TensorProto``.

    ``declared_length`` is the message's full length when ``data`` is only its
    beginning; it decides whether the header is complete.
    """
    dtype = ""
    shape: tuple[int, ...] | None = None
    content = 0
    seen_shape = False
    consumed_all = True
    for field in iter_fields(data):
        if field.number == _TENSOR_DTYPE:
            dtype = dtype_name(_integer(field, "TensorProto.dtype"))
        elif field.number == _TENSOR_SHAPE and isinstance(field.value, bytes):
            seen_shape = True
            shape = None if field.truncated else _decode_shape(field.value)
        elif field.number in _TENSOR_VALUE_FIELDS:
            # Packed repeated numbers and tensor_content are one field each;
            # string_val and the message-valued fields repeat: add them up.
            content += field.length if field.wire_type == _LENGTH_DELIMITED else 8
        if field.truncated:
            consumed_all = False
    if not seen_shape:
        shape = () if consumed_all else None
    complete = consumed_all and (declared_length is None or declared_length <= len(data))
    return TensorHeader(dtype=dtype, shape=shape, content_bytes=content, complete=complete)


# --------------------------------------------------------------------------
# Worker-service messages.


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvTensorRequest:
    step_id: int
    rendezvous_key: str
    request_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvTensorResponse:
    """``tensor`` is None when the response's head held no tensor field."""

    tensor: TensorHeader | None
    is_dead: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvBufRequest:
    step_id: int
    buf_rendezvous_key: str
    num_bytes: int
    src_device: str
    dst_device: str
    request_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvBufResponse:
    """``num_bytes`` is the buffer's size as the sender declared it (0 if absent)."""

    num_bytes: int
    is_dead: bool
    #: Declared size of the data chunks carried in ``transport_options``
    #: (what the gRPC transport actually sends), when the head reached them.
    transport_bytes: int


def decode_recv_tensor_request(data: bytes) -> RecvTensorRequest:
    step_id = 0
    key = ""
    request_id = 0
    for field in iter_fields(data):
        if field.number == 1:
            step_id = _signed64(_integer(field, "RecvTensorRequest.step_id"))
        elif field.number == 2:
            key = _text(field, "RecvTensorRequest.rendezvous_key")
        elif field.number == 7:
            request_id = _signed64(_integer(field, "RecvTensorRequest.request_id"))
    return RecvTensorRequest(step_id=step_id, rendezvous_key=key, request_id=request_id)


def decode_recv_tensor_response(data: bytes) -> RecvTensorResponse:
    """Decode the first bytes (or all) of a ``RecvTensorResponse``."""
    tensor: TensorHeader | None = None
    is_dead = False
    for field in iter_fields(data):
        if field.number == 1 and isinstance(field.value, bytes):
            tensor = decode_tensor_header(field.value, declared_length=field.length)
        elif field.number == 2:
            is_dead = bool(_integer(field, "RecvTensorResponse.is_dead"))
    return RecvTensorResponse(tensor=tensor, is_dead=is_dead)


def decode_recv_buf_request(data: bytes) -> RecvBufRequest:
    values: dict[str, int | str] = {}
    names = {1: "step_id", 3: "num_bytes", 10: "request_id"}
    texts = {2: "buf_rendezvous_key", 8: "src_device", 9: "dst_device"}
    for field in iter_fields(data):
        if field.number in names:
            values[names[field.number]] = _signed64(
                _integer(field, f"RecvBufRequest.{names[field.number]}")
            )
        elif field.number in texts:
            values[texts[field.number]] = _text(field, f"RecvBufRequest.{texts[field.number]}")
    return RecvBufRequest(
        step_id=int(values.get("step_id", 0)),
        buf_rendezvous_key=str(values.get("buf_rendezvous_key", "")),
        num_bytes=int(values.get("num_bytes", 0)),
        src_device=str(values.get("src_device", "")),
        dst_device=str(values.get("dst_device", "")),
        request_id=int(values.get("request_id", 0)),
    )


def decode_recv_buf_response(data: bytes) -> RecvBufResponse:
    num_bytes = 0
    is_dead = False
    transport = 0
    for field in iter_fields(data):
        if field.number == 2:
            num_bytes = _signed64(_integer(field, "RecvBufResponse.num_bytes"))
        elif field.number == 3:
            is_dead = bool(_integer(field, "RecvBufResponse.is_dead"))
        elif field.number == 4 and isinstance(field.value, bytes):
            # google.protobuf.Any: type_url (1), value (2) = the extra message,
            # whose field 1 repeats the data chunks.
            for any_field in iter_fields(field.value):
                if any_field.number == 2 and isinstance(any_field.value, bytes):
                    for chunk in iter_fields(any_field.value):
                        if chunk.number == 1:
                            transport += chunk.length
    return RecvBufResponse(num_bytes=num_bytes, is_dead=is_dead, transport_bytes=transport)


#: Worker-service methods whose request names a step id, and its field number.
RUN_GRAPH = "/tensorflow.WorkerService/RunGraph"
CLEANUP_GRAPH = "/tensorflow.WorkerService/CleanupGraph"
_STEP_ID_FIELDS = {RUN_GRAPH: 2, CLEANUP_GRAPH: 1}


def decode_graph_step_id(method: str, data: bytes) -> int:
    """The step id a ``RunGraph`` or ``CleanupGraph`` request names (0: none, or another
    method)."""
    number = _STEP_ID_FIELDS.get(method)
    if number is None:
        return 0
    for field in iter_fields(data):
        if field.number == number:
            return _signed64(_integer(field, f"{method.rsplit('/', 1)[-1]}Request.step_id"))
    return 0


# --------------------------------------------------------------------------
# Rendezvous keys and device names.


@dataclass(frozen=True, slots=True, kw_only=True)
class RendezvousKey:
    """A RecvTensor rendezvous key: ``src;incarnation;dst;edge;frame:iter``."""

    src_device: str
    src_incarnation: str
    dst_device: str
    edge_name: str
    frame_iter: str


def parse_rendezvous_key(key: str) -> RendezvousKey | None:
    """The parts of a RecvTensor rendezvous key, or None if it is not one."""
    parts = key.split(";")
    if len(parts) != 5:
        return None
    return RendezvousKey(
        src_device=parts[0],
        src_incarnation=parts[1],
        dst_device=parts[2],
        edge_name=parts[3],
        frame_iter=parts[4],
    )


def task_of_device(device: str) -> tuple[str, int] | None:
    """(job, task index) of a device name like ``/job:worker/replica:0/task:1/device:CPU:0``."""
    job: str | None = None
    index: int | None = None
    for part in device.split("/"):
        name, _, value = part.partition(":")
        if name == "job" and value:
            job = value
        elif name == "task" and value.isdigit():
            index = int(value)
    if job is None or index is None:
        return None
    return job, index
