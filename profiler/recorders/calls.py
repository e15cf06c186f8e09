"""Calls from HTTP/2 events: what both recorders share once bytes are followed.

A recorder (the proxy of ``proxy.py``, or ``tapcalls.py`` for the in-process
recorder of ``wiretap.py``) shows each direction of a connection to an
``http2.Http2Follower``, which appends events to a ``Direction``.  A
``CallTable`` per connection folds those events, in wire order, into gRPC
calls: HPACK blocks through the direction's decoder (every block, in order),
``:path`` and ``grpc-status`` from the decoded headers, message sizes and
heads from ``MessageSeen``, ends and resets.  ``take`` hands out the calls
that are complete as ``RecordedCall`` records.

Not thread-safe: fold and take from one thread; a follower may append to the
direction's event list concurrently (``fold`` only consumes what was there
when it started).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tf_grpc_bench.profiler.recorders.http2 import (
    ControlFrame,
    Event,
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedCall:
    """One gRPC call (HTTP/2 stream) seen by a recorder.  Times are monotonic ns.

    ``status_code`` is the ``grpc-status`` trailer, None if none was seen (the
    stream was reset or the capture ended first: then ``complete`` is false or
    ``reset`` true).  ``request_head``/``response_head`` are the first bytes of
    the first message each way.  ``caller_pid`` is the process that opened the
    connection, None if it could not be found.
    """

    callee: str
    connection: int
    stream_id: int
    caller_pid: int | None
    method: str
    start_ns: int
    response_start_ns: int
    end_ns: int
    request_bytes: int
    response_bytes: int
    request_messages: int
    response_messages: int
    status_code: int | None
    reset: bool
    complete: bool
    request_head: bytes = b""
    response_head: bytes = b""


@dataclass(slots=True)
class _CallBuilder:
    """A call being put together from the events of its stream."""

    stream_id: int
    method: str = ""
    start_ns: int = 0
    response_start_ns: int = 0
    end_ns: int = 0
    request_bytes: int = 0
    response_bytes: int = 0
    request_messages: int = 0
    response_messages: int = 0
    request_head: bytes = b""
    response_head: bytes = b""
    status_code: int | None = None
    request_seen: bool = False
    response_ended: bool = False
    reset: bool = False


@dataclass(slots=True)
class Direction:
    """One direction of a connection: its follower's events, HPACK context and first error.

    ``client_side`` is true for requests (client to server).
    """

    client_side: bool
    events: list[Event] = field(default_factory=list)
    follower: Http2Follower | None = None
    undecodable: bool = False
    decoder: HeaderDecoder = field(default_factory=HeaderDecoder)
    error: str = ""

    def new_follower(self, head_bytes: int) -> Http2Follower:
        """A follower appending to this direction's events (kept as ``follower``)."""
        self.follower = Http2Follower(
            self.events.append, client_side=self.client_side, head_bytes=head_bytes
        )
        return self.follower


class CallTable:
    """The calls of one connection, built from the events of both directions."""

    def __init__(self, *, callee: str, connection: int) -> None:
        self.callee = callee
        self.connection = connection
        self._calls: dict[int, _CallBuilder] = {}

    def fold(self, direction: Direction) -> None:
        """Fold the direction's events so far into the calls, then drop them.

        An HPACK error makes the rest of the direction undecodable (the table
        state is lost): its error is set and later events are dropped unread.
        """
        events = direction.events
        end = len(events)
        if not direction.undecodable:
            for index in range(end):
                try:
                    _apply(self._calls, direction, events[index])
                except FramingError as error:
                    direction.error = direction.error or str(error)
                    direction.undecodable = True
                    break
        # A follower only appends, at the end: the first ``end`` events are
        # exactly the ones just folded in.
        del events[:end]

    def take(self, *, caller_pid: int | None, final: bool) -> list[RecordedCall]:
        """Calls whose response ended (or that were reset), removed from the table.

        ``final`` also takes the calls still open, with ``complete`` false.
        """
        finished = []
        for stream_id in list(self._calls):
            builder = self._calls[stream_id]
            done = builder.request_seen and (builder.response_ended or builder.reset)
            if done or final:
                del self._calls[stream_id]
                if builder.request_seen:
                    finished.append(self._record(builder, caller_pid=caller_pid, complete=done))
        return finished

    def _record(
        self, builder: _CallBuilder, *, caller_pid: int | None, complete: bool
    ) -> RecordedCall:
        # The two directions are read apart, so the response side's times can come before
        # the request's headers: the call's times are kept in order, start <= response
        # start <= end.
        start_ns = builder.start_ns
        end_ns = max(builder.end_ns or builder.response_start_ns, start_ns)
        response_start_ns = min(max(builder.response_start_ns or end_ns, start_ns), end_ns)
        return RecordedCall(
            callee=self.callee,
            connection=self.connection,
            stream_id=builder.stream_id,
            caller_pid=caller_pid,
            method=builder.method or "/unknown",
            start_ns=start_ns,
            response_start_ns=response_start_ns,
            end_ns=end_ns,
            request_bytes=builder.request_bytes,
            response_bytes=builder.response_bytes,
            request_messages=builder.request_messages,
            response_messages=builder.response_messages,
            status_code=builder.status_code,
            reset=builder.reset,
            complete=complete,
            request_head=builder.request_head,
            response_head=builder.response_head,
        )


def _apply(calls: dict[int, _CallBuilder], direction: Direction, event: Event) -> None:
    """Fold one follower event into the call table of its connection."""
    if isinstance(event, GoAway | ControlFrame):
        return
    if isinstance(event, HeaderBlock):
        headers = direction.decoder.decode(event.block)
        if event.push_promise:
            return  # gRPC never pushes; the block only had to reach the decoder
    builder = calls.get(event.stream_id)
    if builder is None:
        builder = calls[event.stream_id] = _CallBuilder(stream_id=event.stream_id)
    if direction.client_side:
        if isinstance(event, HeaderBlock):
            if not builder.request_seen:
                builder.request_seen = True
                builder.start_ns = event.time_ns
                path = header_value(headers, b":path")
                builder.method = path.decode("utf-8", "replace") if path else ""
        elif isinstance(event, MessageSeen):
            builder.request_bytes += event.length
            builder.request_messages += 1
            if builder.request_messages == 1:
                builder.request_head = event.head
        elif isinstance(event, StreamReset):
            builder.reset = True
            builder.end_ns = builder.end_ns or event.time_ns
    else:
        if isinstance(event, HeaderBlock):
            if not builder.response_start_ns:
                builder.response_start_ns = event.time_ns
            status = header_value(headers, b"grpc-status")
            if status is not None and status.isdigit():
                builder.status_code = int(status)
        elif isinstance(event, MessageSeen):
            if not builder.response_start_ns:
                builder.response_start_ns = event.time_ns
            builder.response_bytes += event.length
            builder.response_messages += 1
            if builder.response_messages == 1:
                builder.response_head = event.head
        elif isinstance(event, StreamEnded):
            builder.response_ended = True
            builder.end_ns = event.time_ns
        elif isinstance(event, StreamReset):
            builder.reset = True
            builder.end_ns = builder.end_ns or event.time_ns
