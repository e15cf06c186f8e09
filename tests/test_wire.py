"""The replay server and client over real grpcio on loopback: shapes, sizes, counts, faults."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from tf_grpc_bench.errors import ConfigError, ServeError, TransportError
from tf_grpc_bench.protos import bench_pb2, bench_pb2_grpc
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.messages import ECHO_METHOD, PULL_METHOD
from tf_grpc_bench.replay.core.workload import Mode, ack_call, echo_call, pull_call
from tf_grpc_bench.replay.transport.client import ReplayClient, parse_target
from tf_grpc_bench.replay.transport.server import ReplayServer
from tf_grpc_bench.replay.transport.wire import (
    ECHO_STREAM_METHOD,
    PUSH_STREAM_METHOD,
    RESPONSE_LENGTH_METADATA,
    ChannelSettings,
    RpcKind,
    ServerSettings,
    translate_rpc_error,
    with_defaults,
)
from tf_grpc_bench.trace import RECV_TENSOR


@pytest.fixture(params=list(Mode), ids=lambda m: m.value)
def mode(request: pytest.FixtureRequest) -> Mode:
    return Mode(request.param)


@pytest.fixture
def server(mode: Mode) -> Iterator[ReplayServer]:
    with ReplayServer(mode=mode) as running:
        yield running


@pytest.fixture
def client(server: ReplayServer) -> Iterator[ReplayClient]:
    replay_client = ReplayClient(server.address, mode=server.mode)
    replay_client.check_server(10)
    yield replay_client
    replay_client.close()


def test_echo_ack_and_pull_arrive_with_the_bytes_the_calls_state(
    server: ReplayServer, client: ReplayClient, mode: Mode
) -> None:
    calls = [
        echo_call((10, 10_240, 1 << 20), mode),
        ack_call((1 << 20, 1 << 20), mode),
        pull_call(method=PULL_METHOD, request_bytes=120, response_bytes=5_000_000, mode=mode),
        pull_call(method=RECV_TENSOR, request_bytes=64, response_bytes=21, mode=mode),
    ]
    client.prepare(calls)
    client.reset_stats()
    for call in calls:
        client.invoke(call, timeout_s=30)  # raises unless the response has the stated length
    stats = client.stats()
    assert stats.mode == mode.value
    assert stats.received_messages == len(calls) == stats.sent_messages
    assert stats.received_bytes == sum(c.request_bytes for c in calls)
    assert stats.sent_bytes == sum(c.response_bytes for c in calls)
    assert stats.per_method[RECV_TENSOR] == [1, calls[3].request_bytes]


def test_any_method_path_is_answered_as_a_pull(client: ReplayClient, mode: Mode) -> None:
    methods = ["/tensorflow.WorkerService/RunGraph", "/tensorflow.eager.EagerService/Enqueue"]
    client.reset_stats()
    for method in methods:
        call = pull_call(method=method, request_bytes=300, response_bytes=777, mode=mode)
        client.invoke(call, timeout_s=10)
    assert sorted(client.stats().per_method) == sorted(methods)


def test_a_raw_pull_shorter_than_its_header_carries_the_length_in_metadata() -> None:
    with (
        ReplayServer(mode=Mode.NON_SERIALIZED) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        pull = channel.unary_unary(RECV_TENSOR, None, None)
        response = pull(b"abc", metadata=((RESPONSE_LENGTH_METADATA, "4321"),), timeout=10)
        assert len(response) == 4321
        header = (99).to_bytes(8, "little") + bytes(20)
        assert len(pull(header, timeout=10)) == 99


def test_serialized_mode_serves_the_generated_replay_service() -> None:
    with (
        ReplayServer(mode=Mode.SERIALIZED) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = bench_pb2_grpc.ReplayStub(channel)
        payload = bench_pb2.Payload(buffers=[b"a" * 10, b"b" * 2048])
        assert stub.Echo(payload, timeout=10) == payload
        assert stub.Push(payload, timeout=10).received_bytes == payload.ByteSize()
        pulled = stub.Pull(bench_pb2.PullRequest(response_bytes=1234, tensor_name="t"), timeout=10)
        assert len(pulled.content) == 1234


def test_messages_over_50_mb_pass(client: ReplayClient, mode: Mode) -> None:
    call = pull_call(method=RECV_TENSOR, request_bytes=120, response_bytes=60_000_000, mode=mode)
    client.reset_stats()
    client.invoke(call, timeout_s=60)
    assert client.stats().sent_bytes == call.response_bytes


def test_several_channels_to_one_server_all_carry_calls(server: ReplayServer, mode: Mode) -> None:
    settings = ChannelSettings(
        channels_per_server=3, options=(("grpc.use_local_subchannel_pool", 1),)
    )
    replay_client = ReplayClient(server.address, mode=mode, settings=settings)
    try:
        replay_client.reset_stats()
        workload = synthetic_workload(Benchmark.P2P_LATENCY, GeneratorConfig(), mode=mode)
        for call in workload.calls[:6]:
            replay_client.invoke(call, timeout_s=30)
        assert replay_client.stats().received_messages == 6
    finally:
        replay_client.close()


def test_a_client_in_the_other_mode_is_refused_before_any_call(server: ReplayServer) -> None:
    other = Mode.SERIALIZED if server.mode is Mode.NON_SERIALIZED else Mode.NON_SERIALIZED
    replay_client = ReplayClient(server.address, mode=other)
    try:
        with pytest.raises(ConfigError, match="mode"):
            replay_client.check_server(10)
    finally:
        replay_client.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_target_is_a_transport_error_naming_it() -> None:
    target = f"127.0.0.1:{_free_port()}"
    replay_client = ReplayClient(target, mode=Mode.NON_SERIALIZED)
    try:
        with pytest.raises(TransportError, match=target):
            replay_client.check_server(0.5)
        call = pull_call(
            method=RECV_TENSOR, request_bytes=8, response_bytes=8, mode=Mode.NON_SERIALIZED
        )
        with pytest.raises(TransportError, match="unavailable"):
            replay_client.invoke(call, timeout_s=5)
    finally:
        replay_client.close()


def test_a_port_in_use_is_a_serve_error_naming_the_port() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServeError, match=str(port)):
            ReplayServer(host="127.0.0.1", port=port).start()


def test_a_second_replay_server_cannot_share_a_port() -> None:
    with ReplayServer(host="127.0.0.1") as first, pytest.raises(ServeError, match="in use"):
        ReplayServer(host="127.0.0.1", port=first.port).start()


def test_a_stopped_server_makes_calls_fail_as_transport_errors(mode: Mode) -> None:
    running = ReplayServer(mode=mode).start()
    replay_client = ReplayClient(running.address, mode=mode)
    call = pull_call(method=RECV_TENSOR, request_bytes=100, response_bytes=100, mode=mode)
    try:
        replay_client.invoke(call, timeout_s=10)
        running.stop(0)
        with pytest.raises(TransportError, match=running.address):
            replay_client.invoke(call, timeout_s=5)
    finally:
        replay_client.close()


def test_deadline_exceeded_is_translated_with_the_flag_to_change() -> None:
    class Late(grpc.RpcError, grpc.Call):  # type: ignore[misc]
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.DEADLINE_EXCEEDED

        def details(self) -> str:
            return "Deadline Exceeded"

    error = translate_rpc_error(Late(), target="h:1", method="/a.B/C")
    assert isinstance(error, TransportError)
    assert "h:1/a.B/C" in str(error) and "--deadline" in str(error)


@pytest.mark.parametrize("text", ["host", "host:", ":80", "host:0", "host:70000", "[::1:80"])
def test_bad_targets_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--target"):
        parse_target(text)


def test_tls_servers_and_clients_talk_with_the_runs_certificates(tmp_path: Path) -> None:
    from tf_grpc_bench.replay.transport import tls

    files = tls.generate_tls_files(tmp_path)
    settings = ServerSettings(
        private_key=files.server_key_pem(), certificate_chain=files.server_cert_pem()
    )
    with ReplayServer(host="localhost", settings=settings) as running:
        replay_client = ReplayClient(
            f"localhost:{running.port}",
            mode=Mode.NON_SERIALIZED,
            settings=ChannelSettings(root_certificates=files.ca_cert_pem()),
        )
        try:
            replay_client.check_server(10)
            call = echo_call((10, 10), Mode.NON_SERIALIZED)
            replay_client.invoke(call, timeout_s=10)
            assert replay_client.stats().received_bytes == 20
        finally:
            replay_client.close()


def test_preallocated_payloads_are_shared_up_to_their_memory_limit() -> None:
    from tf_grpc_bench.replay.transport.wire import PayloadBytes

    payloads = PayloadBytes(limit_bytes=100)
    assert payloads.get(60) is payloads.get(60)
    assert len(payloads.get(50)) == 50 and payloads.get(50) is not payloads.get(50)
    assert payloads.held_bytes == 60


# -- the streaming kind: echo and ack calls as messages on one stream per channel


@pytest.mark.parametrize("channels", [1, 2])
def test_streamed_echo_and_ack_messages_reach_the_server_one_message_per_call(
    server: ReplayServer, mode: Mode, channels: int
) -> None:
    settings = ChannelSettings(rpc=RpcKind.STREAMING, channels_per_server=channels)
    replay_client = ReplayClient(server.address, mode=mode, settings=settings)
    try:
        calls = [echo_call((10, 10_240), mode), ack_call((1 << 20, 7), mode), echo_call((1,), mode)]
        replay_client.prepare(calls)
        replay_client.reset_stats()
        for call in calls * 3:
            replay_client.invoke(call, timeout_s=20)
        pending = [(call, replay_client.start(call, timeout_s=20)) for call in calls * 4]
        assert [replay_client.outcome(call, future) for call, future in pending] == [None] * 12
        stats = replay_client.stats()
    finally:
        replay_client.close()
    sent = calls * 7
    assert stats.received_messages == len(sent)
    assert stats.received_bytes == sum(call.request_bytes for call in sent)
    assert stats.sent_bytes == sum(call.response_bytes for call in sent)
    echoes = [call for call in sent if call.method == ECHO_METHOD]
    assert stats.per_method == {
        ECHO_STREAM_METHOD: [len(echoes), sum(call.request_bytes for call in echoes)],
        PUSH_STREAM_METHOD: [len(sent) - len(echoes), 7 * calls[1].request_bytes],
    }


def test_pulls_stay_unary_on_their_own_method_when_streaming(
    server: ReplayServer, mode: Mode
) -> None:
    settings = ChannelSettings(rpc=RpcKind.STREAMING)
    replay_client = ReplayClient(server.address, mode=mode, settings=settings)
    try:
        call = pull_call(method=RECV_TENSOR, request_bytes=100, response_bytes=4096, mode=mode)
        replay_client.reset_stats()
        replay_client.invoke(call, timeout_s=20)
        stats = replay_client.stats()
    finally:
        replay_client.close()
    assert stats.per_method == {RECV_TENSOR: [1, call.request_bytes]}


def _stalling_server() -> tuple[grpc.Server, int, list[grpc.ServicerContext]]:
    """A real grpcio server whose push stream takes messages and never answers."""
    seen: list[grpc.ServicerContext] = []

    def swallow(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        seen.append(context)
        for _ in requests:
            pass
        return iter(())

    handler = grpc.method_handlers_generic_handler(
        "tf_grpc_bench.Replay",
        {"PushStream": grpc.stream_stream_rpc_method_handler(swallow)},
    )
    stalling = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    stalling.add_generic_rpc_handlers((handler,))
    port = stalling.add_insecure_port("127.0.0.1:0")
    stalling.start()
    return stalling, port, seen


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "future"])
def test_a_streamed_call_without_an_answer_fails_at_its_deadline(blocking: bool) -> None:
    stalling, port, _ = _stalling_server()
    settings = ChannelSettings(rpc=RpcKind.STREAMING)
    replay_client = ReplayClient(f"127.0.0.1:{port}", mode=Mode.NON_SERIALIZED, settings=settings)
    call = ack_call((100,), Mode.NON_SERIALIZED)
    try:
        if blocking:
            with pytest.raises(TransportError, match="--deadline"):
                replay_client.invoke(call, timeout_s=0.3)
        else:
            error = replay_client.outcome(call, replay_client.start(call, timeout_s=0.3))
            assert isinstance(error, TransportError) and "--deadline" in str(error)
        # The stream is gone: later calls fail at once instead of hanging.
        with pytest.raises(TransportError, match=r"PushStream: no answer within the deadline"):
            replay_client.invoke(call, timeout_s=0.3)
    finally:
        replay_client.close()
        stalling.stop(None)


def test_a_stopped_server_fails_streamed_calls_as_transport_errors(mode: Mode) -> None:
    running = ReplayServer(mode=mode).start()
    settings = ChannelSettings(rpc=RpcKind.STREAMING)
    replay_client = ReplayClient(running.address, mode=mode, settings=settings)
    call = echo_call((1000,), mode)
    try:
        replay_client.invoke(call, timeout_s=10)
        running.stop(None)
        with pytest.raises(TransportError, match="EchoStream"):
            for _ in range(100):
                replay_client.invoke(call, timeout_s=10)
    finally:
        replay_client.close()
        running.stop(None)


def test_a_users_message_size_option_replaces_the_default_instead_of_losing_to_it() -> None:
    # grpcio keeps the first of two equal keys: the default must not come first.
    settings = ChannelSettings(options=(("grpc.max_send_message_length", 1 << 30),))
    options = settings.all_options()
    sends = [value for key, value in options if key == "grpc.max_send_message_length"]
    assert sends == [1 << 30]
    assert ("grpc.max_receive_message_length", 256 * 1024 * 1024) in options
    assert with_defaults((("a", 1), ("b", 2)), (("b", 3), ("c", 4))) == [
        ("a", 1),
        ("b", 3),
        ("c", 4),
    ]
