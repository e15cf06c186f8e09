"""How a connection's follower events become recorded gRPC calls (``CallTable``): times,
sizes, heads, status, resets, and what an undecodable header block does.  Events are built
by hand, header blocks by hpack's own encoder, so every expected value is written out."""

from __future__ import annotations

import hpack

from tf_grpc_bench.profiler.recorders.calls import CallTable, Direction, RecordedCall
from tf_grpc_bench.profiler.recorders.http2 import (
    ControlFrame,
    GoAway,
    HeaderBlock,
    MessageSeen,
    StreamEnded,
    StreamReset,
)

PATH = "/tensorflow.WorkerService/RecvTensor"


class Connection:
    """Both directions of one connection, with an HPACK encoder for each."""

    def __init__(self) -> None:
        self.requests = Direction(client_side=True)
        self.responses = Direction(client_side=False)
        self.table = CallTable(callee="ps:0", connection=7)
        self._request_encoder = hpack.Encoder()
        self._response_encoder = hpack.Encoder()

    def request_headers(self, stream: int, time_ns: int, path: str = PATH) -> None:
        block = self._request_encoder.encode([(":method", "POST"), (":path", path)])
        self.requests.events.append(HeaderBlock(stream, block, False, time_ns))

    def response_headers(
        self, stream: int, time_ns: int, *, status: str | None = None, end: bool = False
    ) -> None:
        headers = [("grpc-status", status)] if status is not None else [(":status", "200")]
        block = self._response_encoder.encode(headers)
        self.responses.events.append(HeaderBlock(stream, block, end, time_ns))

    def fold(self) -> None:
        self.table.fold(self.requests)
        self.table.fold(self.responses)


def _unary(connection: Connection, stream: int, start: int) -> None:
    c = connection
    c.request_headers(stream, start)
    c.requests.events.append(MessageSeen(stream, 120, False, b"request head", start + 1))
    c.requests.events.append(StreamEnded(stream, start + 2))
    c.response_headers(stream, start + 10)
    c.responses.events.append(MessageSeen(stream, 4096, False, b"response head", start + 11))
    c.responses.events.append(MessageSeen(stream, 10, False, b"second", start + 12))
    c.response_headers(stream, start + 20, status="0", end=True)
    c.responses.events.append(StreamEnded(stream, start + 20))


def test_a_unary_call_is_recorded_with_its_times_sizes_heads_and_status() -> None:
    c = Connection()
    _unary(c, 1, 1000)
    c.fold()
    assert c.requests.events == [] and c.responses.events == []
    assert c.table.take(caller_pid=42, final=False) == [
        RecordedCall(
            callee="ps:0",
            connection=7,
            stream_id=1,
            caller_pid=42,
            method=PATH,
            start_ns=1000,
            response_start_ns=1010,
            end_ns=1020,
            request_bytes=120,
            response_bytes=4106,
            request_messages=1,
            response_messages=2,
            status_code=0,
            reset=False,
            complete=True,
            request_head=b"request head",
            response_head=b"response head",
        )
    ]
    assert c.table.take(caller_pid=42, final=True) == []


def test_an_open_call_is_taken_only_when_final_and_then_incomplete() -> None:
    c = Connection()
    c.request_headers(3, 500)
    c.requests.events.append(MessageSeen(3, 64, False, b"h", 501))
    c.requests.events.append(StreamEnded(3, 502))
    c.fold()
    assert c.table.take(caller_pid=None, final=False) == []
    (call,) = c.table.take(caller_pid=None, final=True)
    assert (call.complete, call.status_code, call.reset) == (False, None, False)
    # No response yet: it "ends" and "responds" when it started.
    assert (call.start_ns, call.response_start_ns, call.end_ns) == (500, 500, 500)
    assert (call.request_bytes, call.response_bytes, call.caller_pid) == (64, 0, None)
    assert c.table.take(caller_pid=None, final=True) == []


def test_a_response_message_without_headers_starts_the_response() -> None:
    c = Connection()
    c.request_headers(5, 100)
    c.responses.events.append(MessageSeen(5, 8, False, b"x", 130))
    c.responses.events.append(StreamEnded(5, 140))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.response_start_ns, call.end_ns, call.status_code) == (130, 140, None)
    assert call.complete


def test_a_reset_stream_is_a_finished_call_marked_reset() -> None:
    c = Connection()
    c.request_headers(7, 100)
    c.requests.events.append(MessageSeen(7, 50, False, b"", 101))
    c.requests.events.append(StreamReset(7, 8, 150))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.reset, call.complete, call.end_ns, call.response_start_ns) == (
        True,
        True,
        150,
        150,
    )
    # A reset from the server side after the response began keeps the first end.
    c.request_headers(9, 200)
    c.response_headers(9, 210)
    c.responses.events.append(StreamReset(9, 2, 260))
    c.responses.events.append(StreamReset(9, 2, 290))
    c.fold()
    (second,) = c.table.take(caller_pid=1, final=False)
    assert (second.reset, second.response_start_ns, second.end_ns) == (True, 210, 260)


def test_calls_on_several_streams_are_kept_apart() -> None:
    c = Connection()
    _unary(c, 1, 1000)
    _unary(c, 3, 2000)
    c.request_headers(5, 3000, path="/tensorflow.WorkerService/RunGraph")
    c.fold()
    calls = c.table.take(caller_pid=9, final=False)
    assert [(x.stream_id, x.start_ns, x.end_ns) for x in calls] == [
        (1, 1000, 1020),
        (3, 2000, 2020),
    ]
    (open_call,) = c.table.take(caller_pid=9, final=True)
    assert (open_call.stream_id, open_call.method) == (5, "/tensorflow.WorkerService/RunGraph")


def test_a_second_request_header_block_keeps_the_first_start_and_path() -> None:
    c = Connection()
    c.request_headers(1, 100)
    c.request_headers(1, 300, path="/other/Path")  # trailers would come this way
    c.responses.events.append(StreamEnded(1, 400))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.start_ns, call.method) == (100, PATH)


def test_a_call_without_a_path_is_unknown_and_a_non_numeric_status_is_none() -> None:
    c = Connection()
    block = hpack.Encoder().encode([(":method", "POST")])
    c.requests.events.append(HeaderBlock(1, block, False, 10))
    c.response_headers(1, 20, status="abc", end=True)
    c.responses.events.append(StreamEnded(1, 20))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.method, call.status_code) == ("/unknown", None)


def test_responses_whose_request_was_never_seen_are_dropped() -> None:
    c = Connection()
    c.response_headers(11, 20)
    c.responses.events.append(StreamEnded(11, 30))
    c.fold()
    assert c.table.take(caller_pid=1, final=False) == []
    assert c.table.take(caller_pid=1, final=True) == []


def test_goaway_and_push_promise_blocks_make_no_call() -> None:
    c = Connection()
    c.responses.events.append(GoAway(0, 0, 5))
    promised = hpack.Encoder().encode([(":path", "/pushed")])
    c.responses.events.append(HeaderBlock(2, promised, False, 6, push_promise=True))
    c.fold()
    assert c.table.take(caller_pid=1, final=True) == []


def test_an_undecodable_header_block_stops_its_direction_and_keeps_the_first_error() -> None:
    c = Connection()
    _unary(c, 1, 1000)
    c.requests.events.insert(1, HeaderBlock(3, b"\xff\xff\xff\xff", False, 1005))
    c.fold()
    assert c.requests.undecodable
    assert c.requests.error.startswith("undecodable HPACK header block")
    first_error = c.requests.error
    assert c.requests.events == []
    # Later events of that direction are dropped unread; the error stays the first one.
    c.requests.events.append(HeaderBlock(5, b"\xff", False, 2000))
    c.table.fold(c.requests)
    assert c.requests.events == [] and c.requests.error == first_error
    # The responses still fold: stream 1's request header came before the bad block.
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.stream_id, call.request_bytes, call.response_bytes) == (1, 0, 4106)


def test_a_direction_makes_a_follower_that_appends_to_its_events() -> None:
    direction = Direction(client_side=False)
    follower = direction.new_follower(head_bytes=16)
    assert direction.follower is follower
    follower.feed(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00", 5)  # an empty SETTINGS frame
    assert direction.events == [ControlFrame("SETTINGS", False, 5)]
    follower.feed(b"\x00\x00\x00\x00\x01\x00\x00\x00\x01", 6)  # empty DATA, END_STREAM
    assert direction.events == [ControlFrame("SETTINGS", False, 5), StreamEnded(1, 6)]
    # Control frames belong to no call: folding them makes none.
    table = CallTable(callee="ps:0", connection=0)
    table.fold(direction)
    assert table.take(caller_pid=None, final=True) == []


def test_a_client_direction_follows_from_the_preface_with_its_head_size() -> None:
    direction = Direction(client_side=True)
    follower = direction.new_follower(head_bytes=3)
    message = b"\x00\x00\x00\x00\x05hello"
    frame = len(message).to_bytes(3, "big") + b"\x00\x01" + (1).to_bytes(4, "big") + message
    follower.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame, 8)
    assert direction.events == [MessageSeen(1, 5, False, b"hel", 8), StreamEnded(1, 8)]


def test_a_streamed_request_adds_up_its_messages_and_keeps_the_first_head() -> None:
    c = Connection()
    c.request_headers(1, 10)
    for number, length in enumerate((100, 20, 3)):
        c.requests.events.append(MessageSeen(1, length, False, b"m%d" % number, 11 + number))
    c.requests.events.append(StreamEnded(1, 20))
    c.responses.events.append(StreamEnded(1, 30))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.request_bytes, call.request_messages, call.request_head) == (123, 3, b"m0")


def test_a_path_that_is_not_utf8_is_kept_with_replacement_characters() -> None:
    c = Connection()
    block = hpack.Encoder().encode([(b":path", b"/bad\xffpath")])
    c.requests.events.append(HeaderBlock(1, block, False, 10))
    c.responses.events.append(StreamEnded(1, 30))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert call.method == "/bad\ufffdpath"


def test_an_open_call_whose_response_began_ends_when_its_response_began() -> None:
    c = Connection()
    c.request_headers(3, 500)
    c.response_headers(3, 530)
    c.responses.events.append(MessageSeen(3, 16, False, b"r", 531))
    c.fold()
    (call,) = c.table.take(caller_pid=None, final=True)
    # Neither ended nor reset: it "ends" at the later of its start and its response's start.
    assert (call.complete, call.start_ns, call.response_start_ns, call.end_ns) == (
        False,
        500,
        530,
        530,
    )


def test_a_client_reset_after_the_response_began_keeps_all_three_times() -> None:
    c = Connection()
    c.request_headers(7, 100)
    c.response_headers(7, 120)
    c.requests.events.append(StreamReset(7, 8, 150))
    # Either direction may be folded first: the response's headers are already in.
    c.table.fold(c.responses)
    c.table.fold(c.requests)
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.reset, call.start_ns, call.response_start_ns, call.end_ns) == (True, 100, 120, 150)


def test_a_call_whose_response_side_ended_before_its_request_was_seen_ends_at_its_start() -> None:
    # The two directions are read apart, so a server's reset can carry an earlier time
    # than the request's headers; the call then lasts no time rather than less than none.
    c = Connection()
    c.request_headers(9, 100)
    c.responses.events.append(StreamReset(9, 2, 95))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.reset, call.start_ns, call.response_start_ns, call.end_ns) == (
        True,
        100,
        100,
        100,
    )


def test_a_response_whose_headers_carry_a_time_before_its_request_starts_with_its_request() -> None:
    # A server's headers stamped 4 ns before the request's (the directions are read
    # apart): the response cannot start before the call, so it starts when the call does.
    c = Connection()
    c.request_headers(11, 200)
    c.response_headers(11, 196)
    c.responses.events.append(MessageSeen(11, 8, False, b"r", 197))
    c.response_headers(11, 260, status="0", end=True)
    c.responses.events.append(StreamEnded(11, 260))
    c.fold()
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.start_ns, call.response_start_ns, call.end_ns) == (200, 200, 260)


def test_a_response_that_began_after_the_client_reset_the_call_starts_when_it_ended() -> None:
    # The client's reset (300) is folded first; the response's headers, read later,
    # carry 340: the call ended at the reset, and its response cannot start after that.
    c = Connection()
    c.request_headers(13, 250)
    c.requests.events.append(StreamReset(13, 8, 300))
    c.response_headers(13, 340)
    c.table.fold(c.requests)
    c.table.fold(c.responses)
    (call,) = c.table.take(caller_pid=1, final=False)
    assert (call.reset, call.start_ns, call.response_start_ns, call.end_ns) == (
        True,
        250,
        300,
        300,
    )


def test_the_end_of_a_request_stream_changes_none_of_the_calls_figures() -> None:
    # Only the response's end finishes a call: a request that ended leaves it open.
    c = Connection()
    c.request_headers(15, 400)
    c.requests.events.append(MessageSeen(15, 64, False, b"q", 401))
    c.requests.events.append(StreamEnded(15, 402))
    c.fold()
    assert c.table.take(caller_pid=1, final=False) == []
    (call,) = c.table.take(caller_pid=1, final=True)
    assert (call.complete, call.start_ns, call.response_start_ns, call.end_ns) == (
        False,
        400,
        400,
        400,
    )
    assert (call.request_bytes, call.request_messages, call.response_bytes) == (64, 1, 0)
