"""The passive HTTP/2 + gRPC follower, on frames written by hyperframe and hpack.

The frames are built with the same well-kept libraries a real HTTP/2 stack
uses (hyperframe for frames, hpack's Encoder for header blocks), covering what
real peers send: the preface, SETTINGS, PADDED DATA, HEADERS with priority and
padding, CONTINUATION, messages spanning frames and several per frame,
interleaved streams, RST_STREAM and GOAWAY.  Real TensorFlow traffic is
followed in test_capture.py.
"""

from __future__ import annotations

import random

import hpack
import pytest
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
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench.profiler.recorders.http2 import (
    PREFACE,
    ControlFrame,
    FramingError,
    GoAway,
    HeaderBlock,
    HeaderDecoder,
    Http2Follower,
    MessageSeen,
    StreamEnded,
    StreamReset,
    header_value,
)

from .http2_frames import REQUEST_HEADERS, data_frames, grpc_message, headers_frames


def follow(data: bytes, *, client_side: bool, chunks: list[int] | None = None, head: int = 1024):
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=client_side, head_bytes=head)
    if chunks is None:
        follower.feed(data, 1)
    else:
        position = 0
        for size in chunks:
            follower.feed(data[position : position + size], 1)
            position += size
        follower.feed(data[position:], 1)
    return events, follower


def client_bytes(payloads: list[bytes], *, frame_size: int = 16384, pad: int = 0) -> bytes:
    """A client connection carrying one unary call per payload on streams 1, 3, 5..."""
    encoder = hpack.Encoder()
    out = PREFACE + SettingsFrame(0, {SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 24}).serialize()
    for number, payload in enumerate(payloads):
        stream_id = 2 * number + 1
        out += headers_frames(encoder, stream_id, REQUEST_HEADERS, split=5 if number == 1 else 0)
        out += data_frames(
            stream_id, grpc_message(payload), size=frame_size, end_stream=True, pad=pad
        )
        out += WindowUpdateFrame(0, 1000).serialize() + PingFrame(0, b"12345678").serialize()
    return out


def decoded_blocks(events: list[object]) -> list[list[tuple[bytes, bytes]]]:
    decoder = HeaderDecoder()
    return [list(decoder.decode(e.block)) for e in events if isinstance(e, HeaderBlock)]


def test_a_unary_call_gives_its_headers_message_and_end() -> None:
    payload = b"request bytes " * 10
    events, _ = follow(client_bytes([payload]), client_side=True)
    kinds = [type(e) for e in events]
    assert kinds == [ControlFrame, HeaderBlock, MessageSeen, StreamEnded, ControlFrame]
    # SETTINGS and PING, which the peer acknowledges: what puts two hosts' clocks together.
    assert (events[0], events[-1]) == (
        ControlFrame("SETTINGS", False, 1),
        ControlFrame("PING", False, 1),
    )
    message = events[2]
    assert isinstance(message, MessageSeen)
    assert (message.stream_id, message.length, message.compressed) == (1, len(payload), False)
    assert message.head == payload
    headers = decoded_blocks(events)[0]
    assert header_value(tuple(headers), b":path") == b"/tensorflow.WorkerService/RecvTensor"


def test_acknowledgements_of_settings_and_ping_are_marked() -> None:
    data = (
        SettingsFrame(0, flags=["ACK"]).serialize()
        + PingFrame(0, b"12345678", flags=["ACK"]).serialize()
    )
    data += WindowUpdateFrame(0, 5).serialize()
    events, _ = follow(data, client_side=False)
    assert events == [ControlFrame("SETTINGS", True, 1), ControlFrame("PING", True, 1)]


def test_large_message_over_many_padded_frames_is_one_message_with_its_head() -> None:
    payload = bytes(range(256)) * 400  # 102,400 bytes
    events, follower = follow(client_bytes([payload], frame_size=1000, pad=17), client_side=True)
    messages = [e for e in events if isinstance(e, MessageSeen)]
    assert len(messages) == 1
    assert messages[0].length == len(payload)
    assert messages[0].head == payload[:1024]
    assert follower.bytes_seen == len(client_bytes([payload], frame_size=1000, pad=17))


def test_several_messages_in_one_frame_and_interleaved_streams() -> None:
    encoder = hpack.Encoder()
    data = PREFACE
    data += headers_frames(encoder, 1, REQUEST_HEADERS)
    data += headers_frames(encoder, 3, REQUEST_HEADERS)
    both = grpc_message(b"a" * 10) + grpc_message(b"") + grpc_message(b"b" * 3000)
    # Stream 1's messages cut at awkward places, stream 3's DATA in between.
    data += DataFrame(1, both[:3]).serialize()
    data += DataFrame(3, grpc_message(b"c" * 5)).serialize()
    data += DataFrame(1, both[3:2000]).serialize()
    data += data_frames(1, both[2000:], size=400, end_stream=True)
    data += DataFrame(3, b"", flags=["END_STREAM"]).serialize()
    events, _ = follow(data, client_side=True)
    messages = [(e.stream_id, e.length, e.head[:1]) for e in events if isinstance(e, MessageSeen)]
    assert messages == [(3, 5, b"c"), (1, 10, b"a"), (1, 0, b""), (1, 3000, b"b")]
    assert [e.stream_id for e in events if isinstance(e, StreamEnded)] == [1, 3]


def test_server_side_headers_trailers_rst_and_goaway() -> None:
    encoder = hpack.Encoder()
    data = SettingsFrame(0, {SettingsFrame.MAX_FRAME_SIZE: 1 << 24}).serialize()
    data += headers_frames(encoder, 1, [(":status", "200"), ("content-type", "application/grpc")])
    data += DataFrame(1, grpc_message(b"x" * 50)).serialize()
    data += headers_frames(encoder, 1, [("grpc-status", "0")], end_stream=True, padded=True)
    data += headers_frames(
        encoder,
        3,
        [(":status", "200"), ("grpc-status", "5"), ("grpc-message", "not found")],
        end_stream=True,
    )
    data += RstStreamFrame(5, error_code=8).serialize()
    data += GoAwayFrame(0, last_stream_id=5, error_code=0).serialize()
    events, _ = follow(data, client_side=False)
    blocks = decoded_blocks(events)
    assert header_value(tuple(blocks[1]), b"grpc-status") == b"0"
    assert header_value(tuple(blocks[2]), b"grpc-status") == b"5"
    assert [type(e) for e in events] == [
        ControlFrame,
        HeaderBlock,
        MessageSeen,
        HeaderBlock,
        StreamEnded,
        HeaderBlock,
        StreamEnded,
        StreamReset,
        GoAway,
    ]
    reset = events[-2]
    assert isinstance(reset, StreamReset) and (reset.stream_id, reset.error_code) == (5, 8)


def test_continuation_frames_make_one_block_and_may_not_be_interrupted() -> None:
    encoder = hpack.Encoder()
    block = headers_frames(encoder, 1, REQUEST_HEADERS, split=3)
    events, _ = follow(PREFACE + block, client_side=True)
    assert len([e for e in events if isinstance(e, HeaderBlock)]) == 1
    assert dict(decoded_blocks(events)[0])[b":path"] == b"/tensorflow.WorkerService/RecvTensor"
    # HEADERS without END_HEADERS, then DATA: not HTTP/2.
    first = HeadersFrame(1, encoder.encode(REQUEST_HEADERS)).serialize()
    with pytest.raises(FramingError, match="interrupted"):
        follow(PREFACE + first + DataFrame(1, b"").serialize(), client_side=True)


def test_bytes_that_are_not_http2_are_refused() -> None:
    with pytest.raises(FramingError, match="preface"):
        follow(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", client_side=True)
    bad_padding = bytearray(DataFrame(1, b"abc").serialize())
    bad_padding[4] = 0x8  # PADDED
    bad_padding[9] = 200  # pads more than the frame holds
    with pytest.raises(FramingError, match="pads"):
        follow(bytes(bad_padding), client_side=False)


def test_skipping_the_skippable_bytes_gives_the_same_events() -> None:
    payloads = [b"q" * 10, bytes(range(256)) * 4000, b"z" * 70_000, b""]
    data = client_bytes(payloads, frame_size=9000, pad=3)
    expected, _ = follow(data, client_side=True)
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=True)
    position = 0
    skipped = 0
    rng = random.Random(7)
    while position < len(data):
        skippable = follower.skippable
        if skippable:
            count = rng.randint(1, skippable)
            follower.skip(count, 1)
            skipped += count
            position += count
        else:
            size = rng.randint(1, 700)
            follower.feed(data[position : position + size], 1)
            position += size
    assert skipped > 200_000  # the bulk of the big messages was never shown
    assert events == expected
    with pytest.raises(ValueError, match="cannot skip"):
        follower.skip(1, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=97), max_size=400), st.integers(0, 64))
def test_any_chunking_gives_the_same_events(chunks: list[int], head: int) -> None:
    data = client_bytes([b"a" * 5, b"b" * 4000, b"c" * 300], frame_size=1500, pad=2)
    whole, _ = follow(data, client_side=True, head=head)
    split, _ = follow(data, client_side=True, chunks=chunks, head=head)
    assert split == whole


HEADER_NAMES = ["grpc-status", "grpc-message", "x-a", "x-b", ":path", "content-type"]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(
                st.tuples(st.sampled_from(HEADER_NAMES), st.sampled_from(["0", "1", "v" * 40])),
                min_size=1,
                max_size=4,
            ),
            st.booleans(),
            st.sampled_from([None, 256, 4096, 65536]),
            st.integers(min_value=1, max_value=3),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_header_decoder_cache_never_changes_what_hpack_decodes(
    blocks: list[tuple[list[tuple[str, str]], bool, int | None, int]],
) -> None:
    encoder = hpack.Encoder()
    cached = HeaderDecoder()
    plain = hpack.Decoder(max_header_list_size=1 << 30)
    plain.max_allowed_table_size = 1 << 30
    for headers, sensitive, table_size, repeats in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        tuples = [
            hpack.NeverIndexedHeaderTuple(n, v) if sensitive else hpack.HeaderTuple(n, v)
            for n, v in headers
        ]
        # Sent again, the same headers become a block of table references:
        # what the cache serves.
        for _ in range(repeats):
            encoded = encoder.encode(tuples)
            expected = [(bytes(n), bytes(v)) for n, v in plain.decode(encoded, raw=True)]
            assert list(cached.decode(encoded)) == expected


def test_header_decoder_accepts_tables_larger_than_the_default() -> None:
    encoder = hpack.Encoder()
    encoder.header_table_size = 1 << 20
    decoder = HeaderDecoder()
    headers = [(f"x-{i}", "v" * 1000) for i in range(100)]
    assert dict(decoder.decode(encoder.encode(headers)))[b"x-99"] == b"v" * 1000
    assert dict(decoder.decode(encoder.encode(headers)))[b"x-0"] == b"v" * 1000


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(min_size=0, max_size=300),  # the block
            st.booleans(),  # PADDED
            st.booleans(),  # PRIORITY
            st.booleans(),  # END_STREAM
            st.integers(min_value=0, max_value=4),  # CONTINUATION frames
        ),
        min_size=1,
        max_size=12,
    )
)
def test_header_blocks_are_what_hyperframe_parses_whatever_the_flags(
    frames: list[tuple[bytes, bool, bool, bool, int]],
) -> None:
    data = b""
    expected = []
    for number, (block, padded, priority, end_stream, continuations) in enumerate(frames):
        stream_id = 2 * number + 1
        cut = [len(block) * i // (continuations + 1) for i in range(continuations + 2)]
        pieces = [block[cut[i] : cut[i + 1]] for i in range(continuations + 1)]
        first = HeadersFrame(stream_id, pieces[0])
        if padded and len(pieces[0]) > 1:
            # hyperframe refuses padding as long as the fragment: keep it shorter.
            first.flags.add("PADDED")
            first.pad_length = min(7, len(pieces[0]) - 1)
        if priority:
            first.flags.add("PRIORITY")
            first.depends_on, first.stream_weight = 0, 200
        if end_stream:
            first.flags.add("END_STREAM")
        sequence = [first] + [ContinuationFrame(stream_id, piece) for piece in pieces[1:]]
        sequence[-1].flags.add("END_HEADERS")
        serialized = b"".join(frame.serialize() for frame in sequence)
        data += serialized
        # What hyperframe itself makes of those bytes, frame by frame.
        position = 0
        fragments = []
        while position < len(serialized):
            frame, length = Frame.parse_frame_header(
                memoryview(serialized[position : position + 9])
            )
            frame.parse_body(memoryview(serialized[position + 9 : position + 9 + length]))
            fragments.append(frame.data)
            position += 9 + length
        expected.append((stream_id, b"".join(fragments), end_stream))
    events, _ = follow(data, client_side=False, chunks=[5, 17, 1, 300])
    blocks = [(e.stream_id, e.block, e.end_stream) for e in events if isinstance(e, HeaderBlock)]
    assert blocks == expected


def test_the_same_reference_block_after_a_table_change_is_decoded_afresh() -> None:
    # A table that holds one entry: each new header evicts the last one, and
    # the same one-byte block (a reference to the newest entry) means
    # something else each time.
    encoder = hpack.Encoder()
    encoder.header_table_size = 64
    decoder = HeaderDecoder()
    seen_blocks = set()
    for number in range(50):
        header = [(f"x-{number % 7}", str(number))]
        decoder.decode(encoder.encode(header))  # literal, added to the table
        reference = encoder.encode(header)  # now a reference to it
        seen_blocks.add(reference)
        assert list(decoder.decode(reference)) == [(b"x-%d" % (number % 7), str(number).encode())]
    assert len(seen_blocks) == 1  # one block, fifty meanings


def _padded_data_frame(stream_id: int, pad_length: int, data: bytes, padding: int) -> bytes:
    """A PADDED DATA frame written byte by byte, so that its pad length may lie."""
    body = bytes([pad_length]) + data + bytes(padding)
    return (
        len(body).to_bytes(3, "big") + bytes([0x0, 0x8 | 0x1]) + stream_id.to_bytes(4, "big") + body
    )


@pytest.mark.parametrize(
    ("data", "padding"),
    [
        (grpc_message(b"xyz"), 0),  # pad length 0: only the pad-length byte
        (grpc_message(b"xyz"), 9),
        (b"", 0),  # a frame of one byte: the pad length, no data, no padding
        (b"", 12),  # pad length = frame length - 1: padding and no data
    ],
)
def test_a_padded_data_frame_at_the_edges_of_its_pad_length_is_followed(
    data: bytes, padding: int
) -> None:
    frame = _padded_data_frame(1, padding, data, padding)
    events, follower = follow(frame, client_side=False)
    messages = [(e.stream_id, e.length, e.head) for e in events if isinstance(e, MessageSeen)]
    assert messages == ([(1, 3, b"xyz")] if data else [])
    assert [e.stream_id for e in events if isinstance(e, StreamEnded)] == [1]
    assert follower.bytes_seen == len(frame) == 9 + 1 + len(data) + padding


@pytest.mark.parametrize(("data", "claimed"), [(b"", 1), (b"", 5), (grpc_message(b"ab"), 8)])
def test_a_pad_length_past_the_end_of_the_frame_is_refused(data: bytes, claimed: int) -> None:
    # The frame holds len(data) bytes after its pad-length byte, and claims more as padding.
    frame = _padded_data_frame(3, claimed, data, 0)
    carried = len(data)
    assert claimed == carried + 1 or claimed > carried
    with pytest.raises(
        FramingError,
        match=rf"^stream 3: DATA frame pads {claimed} bytes but carries only {carried}$",
    ):
        follow(frame, client_side=False)


def test_a_pad_length_of_exactly_the_frame_length_is_refused() -> None:
    # Frame length 8: the pad-length byte and 7 more; a pad length of 8 is one too many.
    frame = _padded_data_frame(1, 8, b"", 7)
    with pytest.raises(
        FramingError, match=r"^stream 1: DATA frame pads 8 bytes but carries only 7$"
    ):
        follow(frame, client_side=False)
    # One less is all padding, and fine.
    events, _ = follow(_padded_data_frame(1, 7, b"", 7), client_side=False)
    assert [type(e) for e in events] == [StreamEnded]


def test_an_empty_padded_data_frame_is_refused() -> None:
    frame = (0).to_bytes(3, "big") + bytes([0x0, 0x8]) + (5).to_bytes(4, "big")
    with pytest.raises(FramingError, match=r"^stream 5: PADDED DATA frame is empty$"):
        follow(frame, client_side=False)


# --------------------------------------------------------------------------
# Exact events, times and counters, written out by hand.


def _feed(follower: Http2Follower, *pieces: tuple[bytes, int]) -> None:
    for data, time_ns in pieces:
        follower.feed(data, time_ns)


def test_every_event_carries_the_time_its_first_byte_arrived() -> None:
    encoder = hpack.Encoder()
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=True, head_bytes=4)
    headers = headers_frames(encoder, 1, REQUEST_HEADERS, split=10)
    message = grpc_message(b"abcdefgh")
    _feed(
        follower,
        (PREFACE, 10),
        (headers[:12], 20),  # the HEADERS frame starts arriving at 20
        (headers[12:], 30),
        (DataFrame(1, message[:3]).serialize(), 40),  # part of the gRPC prefix
        (DataFrame(1, message[3:], flags=["END_STREAM"]).serialize(), 50),
    )
    assert [type(e) for e in events] == [HeaderBlock, MessageSeen, StreamEnded]
    header_block, seen, ended = events
    assert isinstance(header_block, HeaderBlock)
    assert (header_block.stream_id, header_block.end_stream, header_block.time_ns) == (1, False, 20)
    assert header_block.push_promise is False
    assert seen == MessageSeen(1, 8, False, b"abcd", 50)
    assert ended == StreamEnded(1, 50)
    assert (follower.bytes_seen, follower.bytes_skipped) == (
        len(PREFACE) + len(headers) + 9 + 3 + 9 + len(message) - 3,
        0,
    )


def test_a_message_prefix_time_is_when_its_last_prefix_byte_came() -> None:
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=False)
    message = grpc_message(b"xy", compressed=True)
    frame = DataFrame(3, message).serialize()
    _feed(follower, (frame[:11], 5), (frame[11:14], 6), (frame[14:], 7))
    assert events == [MessageSeen(3, 2, True, b"xy", 6)]


@pytest.mark.parametrize(
    ("head", "expected"), [(0, b""), (3, b"abc"), (5, b"abcde"), (9, b"abcde")]
)
def test_the_head_is_at_most_head_bytes_of_the_message(head: int, expected: bytes) -> None:
    events, _ = follow(
        DataFrame(1, grpc_message(b"abcde") + grpc_message(b"")).serialize(),
        client_side=False,
        head=head,
    )
    assert events == [MessageSeen(1, 5, False, expected, 1), MessageSeen(1, 0, False, b"", 1)]


def test_a_negative_head_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^head_bytes must be >= 0, got -1$"):
        Http2Follower(lambda event: None, client_side=True, head_bytes=-1)


def test_skippable_counts_the_bytes_the_follower_does_not_need() -> None:
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=False, head_bytes=2)
    assert follower.skippable == 0  # a frame header is needed
    message = grpc_message(b"0123456789")
    frame = DataFrame(1, message, flags=["PADDED"], pad_length=4).serialize()
    follower.feed(frame[:9], 1)  # the header: the pad length comes next
    assert follower.skippable == 0
    follower.feed(frame[9:10], 1)  # pad length read: the gRPC prefix is needed
    assert follower.skippable == 0
    follower.feed(frame[10:17], 2)  # the prefix and 2 head bytes: 8 message bytes left
    assert follower.skippable == 8
    with pytest.raises(ValueError, match=r"^cannot skip 9 bytes \(skippable: 8\)$"):
        follower.skip(9, 3)
    with pytest.raises(ValueError, match=r"^cannot skip -1 bytes \(skippable: 8\)$"):
        follower.skip(-1, 3)
    follower.skip(5, 3)
    assert follower.skippable == 3
    follower.skip(3, 4)  # the message ends with the frame's data: the padding follows
    assert follower.skippable == 4
    follower.skip(4, 5)
    assert follower.skippable == 0
    assert (follower.bytes_seen, follower.bytes_skipped) == (17, 12)
    assert events == [MessageSeen(1, 10, False, b"01", 2)]
    # A frame whose payload is of no interest (PING) is skippable whole.
    follower.feed(PingFrame(0, b"12345678").serialize()[:9], 6)
    assert follower.skippable == 8
    follower.skip(8, 6)
    assert follower.skippable == 0


def test_skipping_to_the_end_of_a_frame_ends_the_stream_at_that_time() -> None:
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=False, head_bytes=0)
    frame = DataFrame(1, grpc_message(b"z" * 20), flags=["END_STREAM"]).serialize()
    follower.feed(frame[:14], 1)
    assert follower.skippable == 20
    follower.skip(20, 9)
    assert events == [MessageSeen(1, 20, False, b"", 1), StreamEnded(1, 9)]


def test_a_message_spanning_frames_is_one_message_and_two_streams_stay_apart() -> None:
    message = grpc_message(b"m" * 30)
    data = DataFrame(1, message[:20]).serialize() + DataFrame(3, grpc_message(b"n")).serialize()
    data += DataFrame(1, message[20:], flags=["END_STREAM"]).serialize()
    events, _ = follow(data, client_side=False, head=8)
    # A message is seen once its head is in: stream 1's before stream 3's.
    assert events == [
        MessageSeen(1, 30, False, b"m" * 8, 1),
        MessageSeen(3, 1, False, b"n", 1),
        StreamEnded(1, 1),
    ]


def test_reset_and_goaway_carry_their_codes() -> None:
    data = RstStreamFrame(5, error_code=8).serialize()
    data += GoAwayFrame(0, last_stream_id=7, error_code=2).serialize()
    events, _ = follow(data, client_side=False)
    assert events == [StreamReset(5, 8, 1), GoAway(7, 2, 1)]


def test_a_reset_stream_forgets_its_half_read_message() -> None:
    message = grpc_message(b"q" * 10)
    data = DataFrame(1, message[:3]).serialize() + RstStreamFrame(1, error_code=8).serialize()
    data += DataFrame(1, grpc_message(b"r")).serialize()
    events, _ = follow(data, client_side=False)
    assert events == [StreamReset(1, 8, 1), MessageSeen(1, 1, False, b"r", 1)]


def test_a_header_block_that_ends_the_stream_forgets_its_half_read_message() -> None:
    encoder = hpack.Encoder()
    data = DataFrame(1, grpc_message(b"q" * 10)[:3]).serialize()
    data += headers_frames(encoder, 1, [("grpc-status", "0")], end_stream=True, split=4)
    data += DataFrame(1, grpc_message(b"r")).serialize()
    events, _ = follow(data, client_side=False)
    assert [type(e) for e in events] == [HeaderBlock, StreamEnded, MessageSeen]
    assert events[1] == StreamEnded(1, 1)
    assert events[2] == MessageSeen(1, 1, False, b"r", 1)


def test_a_push_promise_gives_the_promised_streams_block() -> None:
    encoder = hpack.Encoder()
    block = encoder.encode([(":path", "/pushed")])
    promise = PushPromiseFrame(1, promised_stream_id=2, data=block, flags=["END_HEADERS"])
    events, _ = follow(promise.serialize(), client_side=False)
    assert events == [HeaderBlock(2, block, False, 1, True)]


def test_an_empty_headers_frame_and_an_empty_continuation() -> None:
    encoder = hpack.Encoder()
    block = encoder.encode([("grpc-status", "0")])
    data = HeadersFrame(1, b"", flags=["END_STREAM"]).serialize()
    data += ContinuationFrame(1, block).serialize()
    data += ContinuationFrame(1, b"", flags=["END_HEADERS"]).serialize()
    data += HeadersFrame(3, b"", flags=["END_HEADERS"]).serialize()
    events, _ = follow(data, client_side=False)
    assert events == [
        HeaderBlock(1, block, True, 1),
        StreamEnded(1, 1),
        HeaderBlock(3, b"", False, 1),
    ]


def test_framing_errors_say_what_is_wrong() -> None:
    with pytest.raises(FramingError, match=r"^the client did not start with the HTTP/2 preface$"):
        follow(PREFACE[:5] + b"X", client_side=True)
    stray = ContinuationFrame(3, b"x", flags=["END_HEADERS"]).serialize()
    with pytest.raises(FramingError, match=r"^stream 3: CONTINUATION without a header block$"):
        follow(stray, client_side=False)
    open_block = HeadersFrame(1, b"x").serialize()
    with pytest.raises(FramingError, match=r"^stream 3: CONTINUATION without a header block$"):
        follow(open_block + ContinuationFrame(3, b"y").serialize(), client_side=False)
    with pytest.raises(
        FramingError,
        match=r"^stream 1: header block interrupted by a frame of type 0 before END_HEADERS$",
    ):
        follow(open_block + DataFrame(1, b"").serialize(), client_side=False)
    bad_rst = (3).to_bytes(3, "big") + bytes([3, 0]) + (1).to_bytes(4, "big") + b"abc"
    with pytest.raises(FramingError, match=r"^bad RstStreamFrame: "):
        follow(bad_rst, client_side=False)
    no_stream = (4).to_bytes(3, "big") + bytes([3, 0]) + (0).to_bytes(4, "big") + bytes(4)
    with pytest.raises(FramingError, match=r"^bad frame header: "):
        follow(no_stream, client_side=False)


def test_the_preface_may_come_in_pieces() -> None:
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=True)
    for byte in PREFACE:
        assert follower.skippable == 0
        follower.feed(bytes([byte]), 1)
    follower.feed(DataFrame(1, b"", flags=["END_STREAM"]).serialize(), 2)
    assert events == [StreamEnded(1, 2)]
    assert follower.bytes_seen == len(PREFACE) + 9


def test_the_header_decoder_counts_what_it_decodes_and_serves_repeats_from_its_cache() -> None:
    encoder = hpack.Encoder()
    decoder = HeaderDecoder()
    assert decoder.blocks_decoded == 0
    literal = encoder.encode([("x-a", "1")])
    reference = encoder.encode([("x-a", "1")])
    assert decoder.decode(literal) == ((b"x-a", b"1"),)
    assert decoder.decode(reference) == ((b"x-a", b"1"),)
    assert decoder.decode(reference) == ((b"x-a", b"1"),)
    assert decoder.blocks_decoded == 2  # the repeat came from the cache
    with pytest.raises(FramingError, match=r"^undecodable HPACK header block: "):
        decoder.decode(b"\xff\xff\xff\xff\xff")
    assert header_value(((b"a", b"1"), (b"b", b"2"), (b"a", b"3")), b"a") == b"1"
    assert header_value(((b"a", b"1"),), b"c") is None


def test_a_length_of_16_mib_and_more_uses_all_four_length_bytes() -> None:
    prefix = bytes([0, 0x01, 0x00, 0x00, 0x01])  # 16,777,217
    events, _ = follow(DataFrame(1, prefix + b"ab").serialize(), client_side=False, head=2)
    assert events == [MessageSeen(1, 16_777_217, False, b"ab", 1)]


@pytest.mark.parametrize("head", [0, 1])
def test_empty_and_one_byte_messages_back_to_back(head: int) -> None:
    body = grpc_message(b"") + grpc_message(b"") + grpc_message(b"x") + grpc_message(b"yz")
    frames = DataFrame(1, body[:7]).serialize() + DataFrame(1, body[7:]).serialize()
    events, _ = follow(
        frames + DataFrame(1, grpc_message(b"w")).serialize(), client_side=False, head=head
    )
    assert [(e.length, e.head) for e in events if isinstance(e, MessageSeen)] == [
        (0, b""),
        (0, b""),
        (1, b"x"[:head]),
        (2, b"yz"[:head]),
        (1, b"w"[:head]),
    ]


def test_after_skipping_a_message_the_next_one_is_followed() -> None:
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=False, head_bytes=1)
    first = DataFrame(1, grpc_message(b"a" * 50)).serialize()
    follower.feed(first[:15], 1)  # header, prefix and the one head byte
    follower.skip(0, 1)  # nothing skipped is fine
    follower.skip(follower.skippable, 2)
    follower.feed(DataFrame(1, grpc_message(b"bc")).serialize(), 3)
    assert events == [MessageSeen(1, 50, False, b"a", 1), MessageSeen(1, 2, False, b"b", 3)]
    assert (follower.bytes_seen, follower.bytes_skipped) == (15 + 16, 49)


def test_a_padded_frame_of_padding_only_ends_its_stream_at_its_time() -> None:
    events: list[object] = []
    follower = Http2Follower(events.append, client_side=False)
    follower.feed(_padded_data_frame(7, 4, b"", 4), 42)
    assert events == [StreamEnded(7, 42)]


def test_a_headers_frame_with_priority_and_padding_is_no_push_promise() -> None:
    encoder = hpack.Encoder()
    data = headers_frames(encoder, 1, [("grpc-status", "0")], end_stream=True, padded=True)
    events, _ = follow(data, client_side=False)
    assert [type(e) for e in events] == [HeaderBlock, StreamEnded]
    assert events[0].push_promise is False  # type: ignore[union-attr]


def test_the_header_decoder_cache_is_emptied_when_it_holds_4096_blocks() -> None:
    decoder = HeaderDecoder()
    # Blocks of three static-table references: decoding them never changes the table.
    blocks = [
        bytes([0x80 | a, 0x80 | b, 0x80 | c])
        for a in (1, 2)
        for b in range(1, 62)
        for c in range(1, 62)
    ][:4097]
    for block in blocks:
        decoder.decode(block)
    assert decoder.blocks_decoded == 4097
    decoder.decode(blocks[-1])  # cached: the cache was emptied before it went in
    assert decoder.blocks_decoded == 4097
    decoder.decode(blocks[0])  # emptied away: decoded again
    assert decoder.blocks_decoded == 4098
