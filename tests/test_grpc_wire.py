"""gRPC settings seen on the wire: a relay between the replay's own client and server records
every byte each way, and the checks read those bytes (HTTP/2 frames through the project's
follower and hyperframe), not only that a call succeeded.

* compression: the messages carry gRPC's compressed flag and ``grpc-encoding: gzip``, and are
  smaller on the wire than the payload;
* keepalive: the client sends HTTP/2 PING frames with no call open, and none without it;
* TLS: the connection starts with a TLS handshake and neither the HTTP/2 preface nor the
  payload's bytes appear in the clear.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hyperframe.frame import Frame, PingFrame

from tf_grpc_bench.profiler.recorders.http2 import (
    PREFACE,
    HeaderBlock,
    HeaderDecoder,
    Http2Follower,
    MessageSeen,
    header_value,
)
from tf_grpc_bench.replay.core.workload import Mode, ack_call, echo_call
from tf_grpc_bench.replay.transport import tls
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.grpc_settings import (
    Compression,
    GrpcSettings,
    channel_settings,
    server_settings,
)
from tf_grpc_bench.replay.transport.server import ReplayServer


class Relay:
    """A TCP relay on a free loopback port that forwards to ``target`` and keeps every byte
    of every connection, each direction apart."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream: list[bytearray] = []  # client -> server, per connection
        self.downstream: list[bytearray] = []  # server -> client
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            up, down = bytearray(), bytearray()
            with self.lock:
                self.upstream.append(up)
                self.downstream.append(down)
                self.sockets += [client, server]
            for source, sink, kept in ((client, server, up), (server, client, down)):
                thread = threading.Thread(target=self._pump, args=(source, sink, kept), daemon=True)
                self.threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, kept: bytearray) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            with self.lock:
                kept += data
            try:
                sink.sendall(data)
            except OSError:
                return

    def bytes_up(self) -> bytes:
        with self.lock:
            return b"".join(bytes(b) for b in self.upstream)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # shutdown wakes the thread blocked in accept
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        for thread in self.threads:
            thread.join(timeout=10)


@pytest.fixture
def relayed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Relay, ReplayClient]]:
    """The replay's server started with ``request.param``'s settings, a relay in front of it,
    and a replay client with the same settings dialling the relay."""
    settings: GrpcSettings = request.param
    material = tls.material(tls.generate_tls_files(tmp_path / "tls")) if settings.tls else None
    server = ReplayServer(mode=Mode.NON_SERIALIZED, settings=server_settings(settings, material))
    server.start()
    relay = Relay(("127.0.0.1", server.port))
    client = ReplayClient(
        f"127.0.0.1:{relay.port}",
        mode=Mode.NON_SERIALIZED,
        settings=channel_settings(settings, material),
    )
    try:
        yield relay, client
    finally:
        client.close()
        relay.close()
        server.stop(None)


def _follow(data: bytes, *, client_side: bool) -> list[object]:
    events: list[object] = []
    Http2Follower(events.append, client_side=client_side).feed(data, 0)
    return events


def _frames(data: bytes, *, since: int = 0) -> list[Frame]:
    """The HTTP/2 frames of one direction (after the client's preface, if any) that start at
    or after byte ``since``."""
    position = len(PREFACE) if data.startswith(PREFACE) else 0
    frames = []
    while position + 9 <= len(data):
        frame, length = Frame.parse_frame_header(memoryview(data[position : position + 9]))
        if position + 9 + length > len(data):
            break
        frame.parse_body(memoryview(data[position + 9 : position + 9 + length]))
        if position >= since:
            frames.append(frame)
        position += 9 + length
    return frames


def _pings_while_idle(relay: Relay, client: ReplayClient, idle_s: float) -> list[PingFrame]:
    """The PING frames (not acknowledgements) the client sent while no call was open."""
    call = ack_call((10,), Mode.NON_SERIALIZED)
    client.prepare([call])
    client.invoke(call, timeout_s=30)
    time.sleep(0.05)  # let the call's own frames (and grpc's BDP pings) pass
    idle_from = len(relay.bytes_up())
    deadline = time.monotonic() + idle_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
    idle_to = len(relay.bytes_up())
    client.invoke(call, timeout_s=30)  # the connection is still alive and usable
    idle = _frames(relay.bytes_up()[:idle_to], since=idle_from)
    return [f for f in idle if isinstance(f, PingFrame) and "ACK" not in f.flags]


PAYLOAD = (1 << 16,)  # one 64 KiB buffer of zeros: compresses to almost nothing


@pytest.mark.parametrize("relayed", [GrpcSettings(compression=Compression.GZIP)], indirect=True)
def test_compressed_calls_are_compressed_on_the_wire(
    relayed: tuple[Relay, ReplayClient],
) -> None:
    relay, client = relayed
    calls = [echo_call(PAYLOAD, Mode.NON_SERIALIZED), ack_call(PAYLOAD, Mode.NON_SERIALIZED)]
    client.prepare(calls)
    for call in calls:
        client.invoke(call, timeout_s=30)
    up = relay.bytes_up()
    events = _follow(up, client_side=True)
    messages = [e for e in events if isinstance(e, MessageSeen)]
    payload_messages = [m for m in messages if m.compressed]
    assert len(payload_messages) >= 2, messages
    assert all(m.length < 2_000 for m in payload_messages)  # 64 KiB of zeros, gzipped
    assert len(up) < 20_000  # the 128 KiB sent crossed as a few KiB
    decoder = HeaderDecoder()
    blocks = [tuple(decoder.decode(e.block)) for e in events if isinstance(e, HeaderBlock)]
    assert any(header_value(b, b"grpc-encoding") == b"gzip" for b in blocks)
    # The server answers compressed too: the echo's 64 KiB reply is small on the wire.
    down = b"".join(bytes(b) for b in relay.downstream)
    replies = [e for e in _follow(down, client_side=False) if isinstance(e, MessageSeen)]
    assert any(m.compressed for m in replies), replies
    assert len(down) < 20_000


@pytest.mark.parametrize("relayed", [GrpcSettings()], indirect=True)
def test_without_compression_the_payload_crosses_as_it_is(
    relayed: tuple[Relay, ReplayClient],
) -> None:
    relay, client = relayed
    call = echo_call(PAYLOAD, Mode.NON_SERIALIZED)
    client.prepare([call])
    client.invoke(call, timeout_s=30)
    up = relay.bytes_up()
    messages = [e for e in _follow(up, client_side=True) if isinstance(e, MessageSeen)]
    assert any(m.length == 1 << 16 and not m.compressed for m in messages), messages
    assert len(up) > 1 << 16


@pytest.mark.parametrize(
    "relayed", [GrpcSettings(keepalive_time_ms=200, keepalive_timeout_ms=5_000)], indirect=True
)
def test_keepalive_sends_pings_while_the_channel_is_idle(
    relayed: tuple[Relay, ReplayClient],
) -> None:
    relay, client = relayed
    # About eight keepalive intervals of idleness.  grpc-core sends at most
    # grpc.http2.max_pings_without_data (2) pings between data frames, one or two of them
    # in this window; without keepalive (the next test) it sends none.
    sent = _pings_while_idle(relay, client, idle_s=1.6)
    assert 1 <= len(sent) <= 2, sent
    answered = [
        f
        for f in _frames(b"".join(bytes(b) for b in relay.downstream))
        if isinstance(f, PingFrame) and "ACK" in f.flags
    ]
    assert {p.opaque_data for p in sent} <= {p.opaque_data for p in answered}


@pytest.mark.parametrize("relayed", [GrpcSettings()], indirect=True)
def test_without_keepalive_an_idle_channel_sends_no_pings(
    relayed: tuple[Relay, ReplayClient],
) -> None:
    relay, client = relayed
    assert _pings_while_idle(relay, client, idle_s=1.6) == []


@pytest.mark.parametrize("relayed", [GrpcSettings(tls=True)], indirect=True)
def test_tls_hides_the_http2_connection_and_the_payload(
    relayed: tuple[Relay, ReplayClient],
) -> None:
    relay, client = relayed
    marker = 0x5A
    call = echo_call((4096,), Mode.NON_SERIALIZED)
    client.prepare([call])
    client.invoke(call, timeout_s=30)
    up = relay.bytes_up()
    # A TLS record of type handshake (22), version 3.x, carrying the ClientHello (1).
    assert up[0] == 22 and up[1] == 3 and up[5] == 1, up[:8]
    assert PREFACE not in up
    assert b"/tf_grpc_bench.Replay/" not in up
    assert bytes([0]) * 1024 not in up and bytes([marker]) * 64 not in up
    down = b"".join(bytes(b) for b in relay.downstream)
    assert down[0] == 22 and down[5] == 2  # the ServerHello
    assert bytes([0]) * 1024 not in down


@pytest.mark.parametrize("relayed", [GrpcSettings(tls=False)], indirect=True)
def test_plaintext_shows_the_http2_preface_and_the_method(
    relayed: tuple[Relay, ReplayClient],
) -> None:
    relay, client = relayed
    call = echo_call((4096,), Mode.NON_SERIALIZED)
    client.prepare([call])
    client.invoke(call, timeout_s=30)
    up = relay.bytes_up()
    assert up.startswith(PREFACE)
    assert bytes([0]) * 1024 in up
