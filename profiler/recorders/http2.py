"""Follow HTTP/2 and gRPC framing passively, one direction of one connection at a time.

The recording proxy forwards bytes first and shows them to an ``Http2Follower``
afterwards; the follower never sends anything and never changes the traffic.
It reads only what a trace needs: frame headers (through ``hyperframe``), the
header blocks of HEADERS/CONTINUATION/PUSH_PROMISE frames, the 5-byte gRPC
message prefixes inside DATA payloads, and the first ``head_bytes`` of every
gRPC message (where TensorFlow's messages keep their rendezvous key, dtype and
shape).  Everything else, the bulk of a tensor, is *skippable*: the proxy can
move it from socket to socket without ever copying it into Python (see
``skippable`` and ``skip``).

HPACK header blocks are emitted undecoded: decoding is stateful per connection
and per direction, and happens later, off the forwarding path, in a
``HeaderDecoder`` that must see every block of its direction in order.

Facts this relies on (RFC 9113, gRPC's HTTP/2 protocol):

* the client's side of a connection starts with the 24-byte preface;
* a frame is a 9-byte header (24-bit length, type, flags, 31-bit stream id)
  and a payload; a DATA frame with the PADDED flag starts with one pad-length
  byte and ends with that many padding bytes (read here directly: hyperframe
  can only parse a whole DATA payload, which the proxy never holds; the other
  frames whose payload matters are parsed by hyperframe);
* a header block is a HEADERS (or PUSH_PROMISE) fragment plus CONTINUATION
  fragments until END_HEADERS, with nothing in between;
* gRPC frames each message as 1 flag byte (bit 0: compressed) and a 4-byte
  big-endian length, and a message may span DATA frames.

Not thread-safe: one follower belongs to one forwarding thread.  Events go to
the ``sink`` callable in wire order, on that thread.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import hpack
from hpack.table import HeaderTable
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
)

from tf_grpc_bench.errors import CaptureError

#: What a client sends before its first frame.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES = 9
GRPC_PREFIX_BYTES = 5
#: Bytes of each gRPC message kept by default: a RecvTensorRequest is ~150 B
#: and a tensor's dtype and shape sit in the first ~100 B of its response.
MESSAGE_HEAD_BYTES = 1024

# Follower states.
_PREFACE = 0
_FRAME_HEADER = 1
_FRAME_BODY = 2  # a non-DATA frame whose payload we keep and parse
_IGNORED_BODY = 3  # a frame whose payload we do not need
_DATA_PAD_LENGTH = 4
_DATA = 5
_DATA_PADDING = 6
_PLAIN_HEADERS = 7  # the payload of a HEADERS frame that is only a block fragment

#: Frames whose payload the follower reads, through hyperframe.  Every other
#: frame but DATA (SETTINGS, PING, WINDOW_UPDATE, PRIORITY, extensions) is
#: skipped unread: only its type and length matter.
_PARSED_FRAMES = (HeadersFrame, ContinuationFrame, PushPromiseFrame, RstStreamFrame, GoAwayFrame)
_PARSED_TYPES = frozenset(frame.type for frame in _PARSED_FRAMES)
#: The fixed 9-byte frame header: 24-bit length (as 16 + 8 bits), type,
#: flags, reserved bit + 31-bit stream id.  DATA frames, the bulk of the
#: traffic, are followed from these fields alone (hyperframe would build a
#: frame object per frame, a third of the follower's time), with hyperframe's
#: own definitions of the DATA type and flags.
_FRAME_LAYOUT = struct.Struct(">HBBBL")
_DATA_TYPE = DataFrame.type
_CONTINUATION_TYPE = ContinuationFrame.type
_DATA_FLAGS = {flag.name: flag.bit for flag in DataFrame.defined_flags}
_END_STREAM = _DATA_FLAGS["END_STREAM"]
_PADDED = _DATA_FLAGS["PADDED"]
_STREAM_ID_MASK = 0x7FFFFFFF
#: A HEADERS frame with neither PADDED nor PRIORITY set carries nothing but
#: its header block fragment (RFC 9113, 6.2): gRPC's always do, and they are
#: a third of all frames, so those are taken as they are; any other HEADERS
#: frame goes through hyperframe.
_HEADERS_TYPE = HeadersFrame.type
_HEADERS_FLAGS = {flag.name: flag.bit for flag in HeadersFrame.defined_flags}
_HEADERS_EXTRAS = _HEADERS_FLAGS["PADDED"] | _HEADERS_FLAGS["PRIORITY"]
_HEADERS_END_STREAM = _HEADERS_FLAGS["END_STREAM"]
_HEADERS_END_HEADERS = _HEADERS_FLAGS["END_HEADERS"]


class FramingError(CaptureError):
    """Bytes that do not follow HTTP/2 or gRPC framing; the follower stops there."""


# --------------------------------------------------------------------------
# Events.


@dataclass(frozen=True, slots=True)
class HeaderBlock:
    """A complete HPACK header block (HEADERS or PUSH_PROMISE plus CONTINUATIONs).

    ``time_ns`` is when its first frame arrived.  For a PUSH_PROMISE,
    ``stream_id`` is the promised stream and ``push_promise`` is true.
    """

    stream_id: int
    block: bytes
    end_stream: bool
    time_ns: int
    push_promise: bool = False


@dataclass(frozen=True, slots=True)
class MessageSeen:
    """A gRPC message: its length (without the 5-byte prefix), its compressed
    flag, its first bytes (``head``, at most the follower's ``head_bytes``), and
    when its prefix arrived."""

    stream_id: int
    length: int
    compressed: bool
    head: bytes
    time_ns: int


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """This direction of the stream ended (END_STREAM on a DATA or HEADERS frame)."""

    stream_id: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class StreamReset:
    """RST_STREAM: the stream ended abnormally with an HTTP/2 error code."""

    stream_id: int
    error_code: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class GoAway:
    """GOAWAY: the sender will process no stream above ``last_stream_id``."""

    last_stream_id: int
    error_code: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class ControlFrame:
    """A SETTINGS or PING frame (``kind``: ``SETTINGS``/``PING``), ``ack`` if it
    acknowledges the peer's: the peer's frame had arrived before it was sent."""

    kind: str
    ack: bool
    time_ns: int


Event = HeaderBlock | MessageSeen | StreamEnded | StreamReset | GoAway | ControlFrame
#: Connection-level frames that the peer must acknowledge, by type: ``ControlFrame``s.
_ACKED_TYPES = {SettingsFrame.type: "SETTINGS", PingFrame.type: "PING"}
#: RFC 9113, 6.5 and 6.7: the same bit for SETTINGS and PING.
_ACK_FLAG = {flag.name: flag.bit for flag in PingFrame.defined_flags}["ACK"]


class _MessageReader:
    """gRPC message framing state of one stream in one direction."""

    __slots__ = (
        "compressed",
        "head",
        "head_left",
        "in_message",
        "length",
        "prefix",
        "remaining",
        "time_ns",
    )

    def __init__(self) -> None:
        self.prefix = bytearray()
        self.in_message = False
        self.length = 0
        self.remaining = 0
        self.compressed = False
        self.head = bytearray()
        self.head_left = 0
        self.time_ns = 0


class Http2Follower:
    """Passive HTTP/2 + gRPC framing state machine for one direction.

    ``client_side`` is true for the client-to-server direction (it starts with
    the connection preface).  ``feed(data, time_ns)`` shows it bytes that were
    forwarded; ``skip(count, time_ns)`` tells it that ``count`` bytes (at most
    ``skippable``) were forwarded without being shown.  ``time_ns`` is when the
    bytes arrived.  Raises FramingError on bytes that break the framing; the
    follower is then unusable.
    """

    def __init__(
        self,
        sink: Callable[[Event], object],
        *,
        client_side: bool,
        head_bytes: int = MESSAGE_HEAD_BYTES,
    ) -> None:
        if head_bytes < 0:
            raise ValueError(f"head_bytes must be >= 0, got {head_bytes}")
        self._sink = sink
        self._head_bytes = head_bytes
        self._state = _PREFACE if client_side else _FRAME_HEADER
        self._buffer = bytearray()
        self._left = len(PREFACE) if client_side else 0  # bytes left in the current piece
        self._frame: Frame | None = None
        self._frame_time_ns = 0
        self._flags = 0
        self._stream_id = 0
        self._end_stream = False
        self._padding = 0
        self._reader = _MessageReader()
        self._readers: dict[int, _MessageReader] = {}
        # A header block waiting for CONTINUATION frames.
        self._block_parts: list[bytes] | None = None
        self._block_stream = 0
        self._block_end_stream = False
        self._block_time_ns = 0
        self._block_push = False
        self.bytes_seen = 0
        self.bytes_skipped = 0

    # -- public ------------------------------------------------------------

    @property
    def skippable(self) -> int:
        """How many of the next bytes the follower does not need to see."""
        state = self._state
        if state == _DATA:
            reader = self._reader
            if reader.in_message and not reader.head_left:
                return min(self._left, reader.remaining)
            return 0
        if state in (_DATA_PADDING, _IGNORED_BODY):
            return self._left
        return 0

    def skip(self, count: int, time_ns: int) -> None:
        """Account for ``count`` forwarded bytes the follower was not shown."""
        if count > self.skippable or count < 0:
            raise ValueError(f"cannot skip {count} bytes (skippable: {self.skippable})")
        self.bytes_skipped += count
        self._left -= count
        if self._state == _DATA:
            reader = self._reader
            reader.remaining -= count
            if not reader.remaining:
                reader.in_message = False
            if not self._left:
                self._data_done(time_ns)
        elif not self._left:
            self._state = _FRAME_HEADER

    def feed(self, data: bytes | bytearray | memoryview, time_ns: int) -> None:
        """Follow ``data``, the next bytes of this direction, arrived at ``time_ns``."""
        view = data if isinstance(data, memoryview) else memoryview(data)
        end = len(view)
        self.bytes_seen += end
        position = 0
        while position < end:
            state = self._state
            if state == _DATA:
                take = min(self._left, end - position)
                self._data(view[position : position + take], time_ns)
                position += take
                self._left -= take
                if not self._left:
                    self._data_done(time_ns)
            elif state == _FRAME_HEADER:
                if not self._buffer and end - position >= FRAME_HEADER_BYTES:
                    header = view[position : position + FRAME_HEADER_BYTES]
                    position += FRAME_HEADER_BYTES
                    self._start_frame(header, time_ns)
                else:
                    take = min(FRAME_HEADER_BYTES - len(self._buffer), end - position)
                    self._buffer += view[position : position + take]
                    position += take
                    if len(self._buffer) == FRAME_HEADER_BYTES:
                        header = memoryview(bytes(self._buffer))
                        self._buffer.clear()
                        self._start_frame(header, time_ns)
            elif state in (_FRAME_BODY, _PLAIN_HEADERS):
                take = min(self._left, end - position)
                if not self._buffer and take == self._left:
                    body = bytes(view[position : position + take])  # whole, in this chunk
                else:
                    self._buffer += view[position : position + take]
                    body = b""
                position += take
                self._left -= take
                if not self._left:
                    if self._buffer:
                        body = bytes(self._buffer)
                        self._buffer.clear()
                    self._state = _FRAME_HEADER
                    if state == _PLAIN_HEADERS:
                        self._plain_headers(body)
                    else:
                        self._parse_body(memoryview(body), time_ns)
            elif state in (_IGNORED_BODY, _DATA_PADDING):
                take = min(self._left, end - position)
                position += take
                self._left -= take
                if not self._left:
                    self._state = _FRAME_HEADER
            elif state == _DATA_PAD_LENGTH:
                padding = view[position]
                position += 1
                if padding > self._left - 1:
                    raise FramingError(
                        f"stream {self._stream_id}: DATA frame pads {padding} bytes "
                        f"but carries only {self._left - 1}"
                    )
                self._padding = padding
                self._left -= 1 + padding
                self._state = _DATA
                if not self._left:
                    self._data_done(time_ns)
            else:  # _PREFACE
                take = min(self._left, end - position)
                offset = len(PREFACE) - self._left
                if view[position : position + take] != PREFACE[offset : offset + take]:
                    raise FramingError("the client did not start with the HTTP/2 preface")
                position += take
                self._left -= take
                if not self._left:
                    self._state = _FRAME_HEADER

    # -- frames ------------------------------------------------------------

    def _start_frame(self, header: memoryview, time_ns: int) -> None:
        high, low, frame_type, flags, stream_id = _FRAME_LAYOUT.unpack(header)
        length = high << 8 | low
        if self._block_parts is not None and frame_type != _CONTINUATION_TYPE:
            raise FramingError(
                f"stream {self._block_stream}: header block interrupted by a frame of type "
                f"{frame_type} before END_HEADERS"
            )
        self._frame_time_ns = time_ns
        self._left = length
        if frame_type == _DATA_TYPE:
            stream_id &= _STREAM_ID_MASK
            self._stream_id = stream_id
            self._end_stream = bool(flags & _END_STREAM)
            reader = self._readers.get(stream_id)
            if reader is None:
                reader = self._readers[stream_id] = _MessageReader()
            self._reader = reader
            self._padding = 0
            if flags & _PADDED:
                if not length:
                    raise FramingError(f"stream {stream_id}: PADDED DATA frame is empty")
                self._state = _DATA_PAD_LENGTH
            else:
                self._state = _DATA
                if not length:
                    self._data_done(time_ns)
        elif frame_type == _HEADERS_TYPE and not flags & _HEADERS_EXTRAS:
            self._stream_id = stream_id & _STREAM_ID_MASK
            self._flags = flags
            if length:
                self._state = _PLAIN_HEADERS
            else:
                self._state = _FRAME_HEADER
                self._plain_headers(b"")
        elif frame_type in _PARSED_TYPES:
            try:
                self._frame, _ = Frame.parse_frame_header(header)
            except HyperframeError as error:
                raise FramingError(f"bad frame header: {error}") from None
            if length:
                self._state = _FRAME_BODY
            else:
                self._state = _FRAME_HEADER
                self._parse_body(memoryview(b""), time_ns)
        else:
            kind = _ACKED_TYPES.get(frame_type)
            if kind is not None:
                self._sink(ControlFrame(kind, bool(flags & _ACK_FLAG), time_ns))
            self._state = _IGNORED_BODY if length else _FRAME_HEADER

    def _plain_headers(self, fragment: bytes) -> None:
        flags = self._flags
        self._start_block(
            self._stream_id,
            fragment,
            end_stream=bool(flags & _HEADERS_END_STREAM),
            end_headers=bool(flags & _HEADERS_END_HEADERS),
            push=False,
        )

    def _parse_body(self, body: memoryview, time_ns: int) -> None:
        frame = self._frame
        try:
            frame.parse_body(body)  # type: ignore[union-attr]
        except HyperframeError as error:
            raise FramingError(f"bad {type(frame).__name__}: {error}") from None
        if isinstance(frame, HeadersFrame):
            self._start_block(
                frame.stream_id,
                bytes(frame.data),
                end_stream="END_STREAM" in frame.flags,
                end_headers="END_HEADERS" in frame.flags,
                push=False,
            )
        elif isinstance(frame, ContinuationFrame):
            if self._block_parts is None or frame.stream_id != self._block_stream:
                raise FramingError(f"stream {frame.stream_id}: CONTINUATION without a header block")
            self._block_parts.append(bytes(frame.data))
            if "END_HEADERS" in frame.flags:
                self._end_block()
        elif isinstance(frame, PushPromiseFrame):
            self._start_block(
                frame.promised_stream_id,
                bytes(frame.data),
                end_stream=False,
                end_headers="END_HEADERS" in frame.flags,
                push=True,
            )
        elif isinstance(frame, RstStreamFrame):
            self._readers.pop(frame.stream_id, None)
            self._sink(StreamReset(frame.stream_id, frame.error_code, time_ns))
        elif isinstance(frame, GoAwayFrame):
            self._sink(GoAway(frame.last_stream_id, frame.error_code, time_ns))

    def _start_block(
        self, stream_id: int, fragment: bytes, *, end_stream: bool, end_headers: bool, push: bool
    ) -> None:
        self._block_parts = [fragment]
        self._block_stream = stream_id
        self._block_end_stream = end_stream
        self._block_time_ns = self._frame_time_ns
        self._block_push = push
        if end_headers:
            self._end_block()

    def _end_block(self) -> None:
        parts = self._block_parts or []
        block = parts[0] if len(parts) == 1 else b"".join(parts)
        self._block_parts = None
        stream_id = self._block_stream
        self._sink(
            HeaderBlock(
                stream_id, block, self._block_end_stream, self._block_time_ns, self._block_push
            )
        )
        if self._block_end_stream:
            self._readers.pop(stream_id, None)
            self._sink(StreamEnded(stream_id, self._block_time_ns))

    # -- DATA payloads: gRPC message framing --------------------------------

    def _data(self, chunk: memoryview, time_ns: int) -> None:
        reader = self._reader
        position = 0
        end = len(chunk)
        while position < end:
            if not reader.in_message:
                take = min(GRPC_PREFIX_BYTES - len(reader.prefix), end - position)
                reader.prefix += chunk[position : position + take]
                position += take
                if len(reader.prefix) == GRPC_PREFIX_BYTES:
                    prefix = reader.prefix
                    length = int.from_bytes(prefix[1:5], "big")
                    reader.compressed = bool(prefix[0] & 1)
                    prefix.clear()
                    reader.length = reader.remaining = length
                    reader.head_left = min(length, self._head_bytes)
                    reader.time_ns = time_ns
                    if reader.head_left:
                        reader.in_message = True
                    else:
                        self._message(reader, b"")
                        reader.in_message = length > 0
            elif reader.head_left:
                take = min(reader.head_left, end - position)
                reader.head += chunk[position : position + take]
                position += take
                reader.head_left -= take
                reader.remaining -= take
                if not reader.head_left:
                    head = bytes(reader.head)
                    reader.head.clear()
                    self._message(reader, head)
                if not reader.remaining:
                    reader.in_message = False
            else:
                take = min(reader.remaining, end - position)
                position += take
                reader.remaining -= take
                if not reader.remaining:
                    reader.in_message = False

    def _message(self, reader: _MessageReader, head: bytes) -> None:
        self._sink(
            MessageSeen(self._stream_id, reader.length, reader.compressed, head, reader.time_ns)
        )

    def _data_done(self, time_ns: int) -> None:
        """The DATA frame's data is consumed (its padding may follow)."""
        if self._end_stream:
            self._readers.pop(self._stream_id, None)
            self._sink(StreamEnded(self._stream_id, time_ns))
        if self._padding:
            self._left = self._padding
            self._padding = 0
            self._state = _DATA_PADDING
        else:
            self._state = _FRAME_HEADER


# --------------------------------------------------------------------------
# HPACK.

#: Limits high enough never to refuse what a real peer sends: the proxy is
#: passive and must decode whatever the endpoints agreed on.
_MAX_HEADER_LIST_BYTES = 1 << 30
_MAX_TABLE_BYTES = 1 << 30
_CACHE_ENTRIES = 4096

Headers = tuple[tuple[bytes, bytes], ...]


class _CountingTable(HeaderTable):
    """hpack's dynamic table, counting the entries added to it."""

    def __init__(self) -> None:
        super().__init__()
        self.additions = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.additions += 1
        super().add(name, value)


class HeaderDecoder:
    """HPACK decoding context of one direction of one connection (``hpack``).

    Every header block of the direction must go through ``decode``, in wire
    order: a block can add entries to the dynamic table that later blocks
    refer to.  gRPC's steady state repeats a few blocks made only of table
    references; decoding such a block does not change the table, so its result
    is cached until the table changes (entries added, counted by the table,
    or the size changed: checked before and after each decode).  Not
    thread-safe.
    """

    def __init__(self) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_LIST_BYTES)
        self._decoder.max_allowed_table_size = _MAX_TABLE_BYTES
        self._table = _CountingTable()
        self._decoder.header_table = self._table  # still empty: nothing decoded yet
        self._cache: dict[bytes, tuple[tuple[int, int, int], Headers]] = {}
        self.blocks_decoded = 0

    def _table_state(self) -> tuple[int, int, int]:
        # Entries only ever come in through ``add`` (counted) and leave through
        # evictions, which shorten the table unless an add comes with them.
        table = self._table
        return (table.additions, len(table.dynamic_entries), table.maxsize)

    def decode(self, block: bytes) -> Headers:
        """The (name, value) pairs of ``block`` as raw bytes.  FramingError if malformed."""
        state = self._table_state()
        cached = self._cache.get(block)
        if cached is not None and cached[0] == state:
            return cached[1]
        try:
            headers: Headers = tuple(
                (bytes(name), bytes(value)) for name, value in self._decoder.decode(block, raw=True)
            )
        except (hpack.HPACKError, IndexError, ValueError) as error:
            raise FramingError(f"undecodable HPACK header block: {error!r}") from None
        self.blocks_decoded += 1
        if self._table_state() == state:
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            self._cache[block] = (state, headers)
        return headers


def header_value(headers: Headers, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case bytes), or None."""
    for key, value in headers:
        if key == name:
            return value
    return None
