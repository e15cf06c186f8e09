"""gRPC settings: validation, chunking, and their effect on real grpcio channels and servers."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.cli_flags import add_grpc_flags, settings_from_args
from tf_grpc_bench.replay.transport.grpc_settings import Compression, GrpcSettings

METHOD = "/test.Peers/Call"


class PeerRecorder:
    """A real server that answers with the request's size and records each caller's peer."""

    def __init__(self) -> None:
        self.peers: set[str] = set()
        self._lock = threading.Lock()

    def call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.peers.add(context.peer())
        return str(len(request)).encode()


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[tuple[GrpcSettings, int, PeerRecorder]]:
    settings: GrpcSettings = request.param
    recorder = PeerRecorder()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=settings.server_options(),
        compression=settings.compression_algorithm(),
    )
    handler = grpc.method_handlers_generic_handler(
        "test.Peers", {"Call": grpc.unary_unary_rpc_method_handler(recorder.call)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield settings, port, recorder
    finally:
        server.stop(grace=None).wait()


def _call(settings: GrpcSettings, port: int, payload: bytes) -> bytes:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=settings.channel_options()) as channel:
        reply: bytes = channel.unary_unary(METHOD)(payload, timeout=10)
        return reply


@pytest.mark.parametrize("served", [GrpcSettings(channels=3)], indirect=True)
def test_each_channel_is_its_own_connection(served: tuple[GrpcSettings, int, PeerRecorder]) -> None:
    settings, port, recorder = served
    channels = [
        grpc.insecure_channel(f"127.0.0.1:{port}", options=settings.channel_options())
        for _ in range(settings.channels)
    ]
    try:
        for channel in channels:
            channel.unary_unary(METHOD)(b"x", timeout=10)
    finally:
        for channel in channels:
            channel.close()
    assert len(recorder.peers) == 3


@pytest.mark.parametrize(
    "served",
    [GrpcSettings(compression=c) for c in Compression]
    + [GrpcSettings(keepalive_time_ms=200, keepalive_timeout_ms=1000)],
    indirect=True,
)
def test_settings_are_accepted_by_a_real_channel_and_server(
    served: tuple[GrpcSettings, int, PeerRecorder],
) -> None:
    settings, port, _ = served
    assert _call(settings, port, bytes(3 << 20)) == str(3 << 20).encode()


@pytest.mark.parametrize("served", [GrpcSettings(max_message_bytes=64 * 1024)], indirect=True)
def test_the_message_limit_is_enforced_by_grpc(
    served: tuple[GrpcSettings, int, PeerRecorder],
) -> None:
    settings, port, _ = served
    assert _call(settings, port, bytes(60 * 1024)) == str(60 * 1024).encode()
    with pytest.raises(grpc.RpcError, match="RESOURCE_EXHAUSTED") as caught:
        _call(settings, port, bytes(100 * 1024))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@given(
    payload=st.integers(min_value=0, max_value=50 << 20),
    chunk=st.sampled_from([0, 1024, 4096, 1 << 20, 3_000_001]),
)
def test_chunks_add_up_to_the_payload_and_none_exceeds_the_chunk_size(
    payload: int, chunk: int
) -> None:
    sizes = GrpcSettings(chunk_bytes=chunk).chunk_sizes(payload)
    assert sum(sizes) == payload
    if chunk:
        assert all(0 < s <= chunk for s in sizes) or sizes == (0,)
        assert len(sizes) == max(1, -(-payload // chunk))
    else:
        assert sizes == (payload,)


def test_payload_check_suggests_chunking() -> None:
    small = GrpcSettings(max_message_bytes=1 << 20)
    with pytest.raises(ConfigError, match="--chunk-size"):
        small.check_payload(2 << 20, what="tensor conv1/kernel")
    GrpcSettings(max_message_bytes=1 << 20, chunk_bytes=512 << 10).check_payload(2 << 20)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"channels": 0}, "--channels"),
        ({"outstanding_rpcs": 0}, "--outstanding"),
        ({"max_message_bytes": 100}, "--max-message-size"),
        ({"max_message_bytes": 2**31}, "--max-message-size"),
        ({"chunk_bytes": 10}, "--chunk-size must be 0"),
        ({"chunk_bytes": 1 << 20, "max_message_bytes": 1 << 20}, "does not fit"),
        ({"keepalive_time_ms": -1}, "--keepalive-ms"),
        ({"keepalive_timeout_ms": 0}, "--keepalive-timeout-ms"),
    ],
)
def test_nonsense_settings_name_their_flag(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GrpcSettings(**fields)  # type: ignore[arg-type]


def test_parameters_round_trip_and_are_plain_values() -> None:
    settings = GrpcSettings(channels=2, compression=Compression.GZIP, chunk_bytes=1 << 20, tls=True)
    parameters = settings.as_parameters()
    assert parameters["grpc_compression"] == "gzip"
    assert all(isinstance(v, (int, str, bool)) for v in parameters.values())
    assert GrpcSettings.from_parameters(parameters) == settings


def test_flags_build_settings() -> None:
    parser = argparse.ArgumentParser()
    add_grpc_flags(parser)
    args = parser.parse_args(
        ["--channels", "4", "--compression", "deflate", "--chunk-size", "4MB", "--tls"]
    )
    settings = settings_from_args(args, default_outstanding=8)
    assert settings == GrpcSettings(
        channels=4,
        outstanding_rpcs=8,
        compression=Compression.DEFLATE,
        chunk_bytes=4 << 20,
        tls=True,
    )
    with pytest.raises(ConfigError, match="--chunk-size 'lots'"):
        settings_from_args(parser.parse_args(["--chunk-size", "lots"]))
