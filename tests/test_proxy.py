"""The recording proxy between real grpcio clients and servers on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from tf_grpc_bench.errors import ServeError
from tf_grpc_bench.profiler.recorders.proxy import RecordedCall, RecordingProxy

SERVICE = "test.Bench"
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def pattern(size: int) -> bytes:
    """Deterministic, position-dependent bytes: a shifted or lost chunk shows."""
    block = bytes(range(251))
    return (block * (size // len(block) + 1))[:size]


def _pull(request: bytes, context: grpc.ServicerContext) -> bytes:
    return pattern(int(request[:12]))


def _chat(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    for request in requests:
        yield pattern(int(request[:12]) * 2)


def _fail(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.NOT_FOUND, "no such tensor")
    raise AssertionError("unreachable")


release = threading.Event()
entered = threading.Semaphore(0)


def _slow(request: bytes, context: grpc.ServicerContext) -> bytes:
    entered.release()
    release.wait(10)
    return b"late"


@pytest.fixture(scope="module")
def server_port() -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(8), options=UNLIMITED)
    handlers = {
        "Pull": grpc.unary_unary_rpc_method_handler(_pull),
        "Chat": grpc.stream_stream_rpc_method_handler(_chat),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail),
        "Slow": grpc.unary_unary_rpc_method_handler(_slow),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    release.set()
    server.stop(None)


@pytest.fixture
def proxy(server_port: int) -> Iterator[RecordingProxy]:
    with RecordingProxy(
        target=("127.0.0.1", server_port), callee="ps:0", owner_pids=lambda: [os.getpid()]
    ) as recording:
        recording.start()
        yield recording


@pytest.fixture
def channel(proxy: RecordingProxy) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(proxy.address, options=UNLIMITED) as opened:
        yield opened


def collect_until(
    proxy: RecordingProxy, done: Callable[[list[RecordedCall]], bool], *, final: bool = False
) -> list[RecordedCall]:
    """Calls recorded so far, waiting (bounded) for the forwarding threads to catch up."""
    calls: list[RecordedCall] = []
    deadline = time.monotonic() + 10
    while True:
        calls += proxy.collect()
        if done(calls) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if final:
        calls += proxy.collect(final=True)
    return calls


def size_request(size: int) -> bytes:
    return b"%012d" % size + b"-padding" * 10


def test_unary_calls_of_every_size_arrive_intact_and_are_recorded(
    proxy: RecordingProxy, channel: grpc.Channel
) -> None:
    pull = channel.unary_unary(f"/{SERVICE}/Pull")
    sizes = [0, 10, 10_000, 1 << 20, 9 << 20]
    for size in sizes:
        assert pull(size_request(size)) == pattern(size)
    calls = collect_until(proxy, lambda c: len(c) == len(sizes))
    assert [c.response_bytes for c in calls] == sizes
    for call in calls:
        assert call.method == f"/{SERVICE}/Pull"
        assert call.callee == "ps:0"
        assert call.request_bytes == len(size_request(0))
        assert (call.request_messages, call.response_messages) == (1, 1)
        assert call.status_code == 0 and call.complete and not call.reset
        assert call.caller_pid == os.getpid()
        assert call.start_ns <= call.response_start_ns <= call.end_ns
        assert call.request_head == size_request(call.response_bytes)
        assert call.response_head == pattern(min(call.response_bytes, 1024))
    forwarded, spliced = proxy.forwarded_bytes()
    assert forwarded > sum(sizes)
    # Most of the big responses went socket to socket without entering Python
    # (only the first read of each, with its frame and message headers, did).
    assert spliced > 0.75 * ((9 << 20) + (1 << 20))
    assert proxy.follower_errors() == []


def test_streaming_call_counts_every_message_each_way(
    proxy: RecordingProxy, channel: grpc.Channel
) -> None:
    chat = channel.stream_stream(f"/{SERVICE}/Chat")
    sizes = [5, 70_000, 0, 300_000]
    replies = list(chat(iter([size_request(s) for s in sizes])))
    assert replies == [pattern(2 * s) for s in sizes]
    (call,) = collect_until(proxy, lambda c: len(c) == 1)
    assert call.request_messages == len(sizes)
    assert call.request_bytes == len(sizes) * len(size_request(0))
    assert call.response_messages == len(sizes)
    assert call.response_bytes == 2 * sum(sizes)
    assert call.status_code == 0


def test_error_status_is_recorded(proxy: RecordingProxy, channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError, match="NOT_FOUND") as raised:
        channel.unary_unary(f"/{SERVICE}/Fail")(b"x")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    (call,) = collect_until(proxy, lambda c: len(c) == 1)
    assert call.status_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert call.response_bytes == 0 and call.complete


def test_a_cancelled_call_is_recorded_as_reset(
    proxy: RecordingProxy, channel: grpc.Channel
) -> None:
    future = channel.unary_unary(f"/{SERVICE}/Slow").future(b"wait")
    assert entered.acquire(timeout=10)  # the call crossed the proxy
    future.cancel()
    (call,) = collect_until(proxy, lambda c: len(c) == 1)
    assert call.reset and call.status_code is None
    assert call.method == f"/{SERVICE}/Slow"


CLIENT = """
import grpc, sys
with grpc.insecure_channel(sys.argv[1]) as channel:
    reply = channel.unary_unary("/test.Bench/Pull")(b"%012d" % 4096)
    assert len(reply) == 4096
"""


def test_the_caller_is_found_in_another_process(server_port: int) -> None:
    started: list[int] = []
    with RecordingProxy(
        target=("127.0.0.1", server_port), callee="worker:1", owner_pids=lambda: list(started)
    ) as recording:
        recording.start()
        client = subprocess.Popen([sys.executable, "-c", CLIENT, recording.address])
        started.append(client.pid)
        assert client.wait(60) == 0
        (call,) = collect_until(recording, lambda c: len(c) == 1)
    assert call.caller_pid == client.pid
    assert call.callee == "worker:1"


def test_a_port_in_use_is_a_serve_error(server_port: int) -> None:
    with pytest.raises(ServeError, match=f"port {server_port} .* in use"):
        RecordingProxy(target=("127.0.0.1", 1), callee="ps:0", listen_port=server_port)


def test_traffic_that_is_not_http2_is_forwarded_unchanged_and_reported() -> None:
    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = echo.accept()
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    with RecordingProxy(target=echo.getsockname(), callee="ps:0") as recording:
        recording.start()
        message = b"GET / HTTP/1.1\r\n\r\n" + pattern(200_000)
        with socket.create_connection(("127.0.0.1", recording.port)) as client:
            client.sendall(message)
            received = b""
            while len(received) < len(message):
                received += client.recv(65536)
        assert received == message
        deadline = time.monotonic() + 10
        while not recording.follower_errors() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "preface" in recording.follower_errors()[0]
        assert recording.collect(final=True) == []
    echo.close()


def test_a_callee_that_never_listens_gets_its_clients_disconnected() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with RecordingProxy(
        target=("127.0.0.1", port), callee="ps:0", connect_timeout_s=0.3
    ) as recording:
        recording.start()
        with socket.create_connection(("127.0.0.1", recording.port), timeout=10) as client:
            assert client.recv(10) == b""


def test_stop_ends_open_connections_and_returns_open_calls(server_port: int) -> None:
    recording = RecordingProxy(target=("127.0.0.1", server_port), callee="ps:0")
    recording.start()
    channel = grpc.insecure_channel(recording.address)
    future = channel.unary_unary(f"/{SERVICE}/Slow").future(b"wait")
    assert entered.acquire(timeout=10)  # the call crossed the proxy
    recording.stop()
    with pytest.raises(grpc.RpcError, match="UNAVAILABLE"):
        future.result(timeout=10)
    channel.close()
    (call,) = recording.collect(final=True)
    assert not call.complete and call.status_code is None
    assert call.method == f"/{SERVICE}/Slow"
    threads = [t for t in threading.enumerate() if t.name.startswith("proxy-ps:0")]
    assert all(not t.is_alive() for t in threads)
