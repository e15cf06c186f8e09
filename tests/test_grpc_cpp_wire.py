"""The gRPC C++ engine's server speaks the grpcio server's wire protocol: the same calls
give the same answers, counts, refusals and control calls from both (a grpcio client
against each); the ``engine`` command says what is built."""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from tf_grpc_bench.replay.core.benchmarks import synthetic_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.messages import ECHO_METHOD
from tf_grpc_bench.replay.core.workload import Call, Mode, pull_call
from tf_grpc_bench.replay.native.protocol import PROTOCOL_VERSION
from tf_grpc_bench.replay.native.servers import NativeServer, NativeServers
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.server import ReplayServer
from tf_grpc_bench.replay.transport.wire import (
    RESET_METHOD,
    RESPONSE_LENGTH_METADATA,
    SESSION_METADATA,
    STATS_METHOD,
    TOKEN_METADATA,
    ChannelSettings,
    RpcKind,
    ServerSettings,
    ServerStats,
)
from tf_grpc_bench.trace import RECV_TENSOR

from .engines import grpc_cpp_program
from .test_memory_bounds import _oom_kills, _pull, memory_cgroup
from .test_placement import free_ports

CLI = str(Path(sys.executable).parent / "tf-grpc-bench")
#: What differs between two servers however alike: who and when.
_CIRCUMSTANCES = ("cpu_ns", "wall_ns", "pid", "address")


@contextlib.contextmanager
def both_servers(
    mode: Mode, settings: ServerSettings | None = None, host: str = "127.0.0.1"
) -> Iterator[dict[str, str]]:
    """A grpcio server and a gRPC C++ server, alike; their addresses by engine."""
    settings = settings or ServerSettings()
    program = grpc_cpp_program()
    native = NativeServer(program, mode=mode, host=host, port=0, settings=settings)
    try:
        with ReplayServer(mode=mode, host=host, settings=settings) as python:
            yield {"grpcio": python.address, "grpc-cpp": native.address}
    finally:
        native.stop()


def _calls(mode: Mode) -> list[Call]:
    """Every shape, with sizes at the edges of each encoding."""
    calls: list[Call] = []
    generator = GeneratorConfig(payload_count=6)
    for benchmark in (Benchmark.P2P_LATENCY, Benchmark.P2P_BANDWIDTH, Benchmark.PS_THROUGHPUT):
        calls += synthetic_workload(benchmark, generator, mode=mode).calls
    for request, response in ((0, 0), (3, 5), (7, 0), (8, 1), (130, 129), (21, 3_000_000)):
        calls.append(
            pull_call(
                method=RECV_TENSOR,
                request_bytes=request,
                response_bytes=response,
                mode=mode,
                tensor_name="edge_12_conv1/kernel/Read/ReadVariableOp",
            )
        )
    return calls


def _comparable(stats: ServerStats) -> dict[str, Any]:
    document = {
        key: value
        for key, value in (
            (name, getattr(stats, name)) for name in ServerStats.__dataclass_fields__
        )
        if key not in _CIRCUMSTANCES
    }
    return document


@pytest.mark.parametrize("rpc", list(RpcKind), ids=lambda r: r.value)
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_a_grpcio_client_gets_the_same_answers_and_counts_from_both_servers(
    mode: Mode, rpc: RpcKind
) -> None:
    seen: dict[str, dict[str, Any]] = {}
    with both_servers(mode) as addresses:
        for engine, address in addresses.items():
            client = ReplayClient(
                address, mode=mode, settings=ChannelSettings(session="same-calls", rpc=rpc)
            )
            try:
                assert client.check_server(10).mode == mode.value
                for call in _calls(mode):
                    client.invoke(call, timeout_s=30)  # checks the response's length
                seen[engine] = _comparable(client.stats())
                client.reset_stats()
                assert client.stats().received_messages == 0
            finally:
                client.close()
    assert seen["grpc-cpp"] == seen["grpcio"]
    assert seen["grpcio"]["received_messages"] == len(_calls(mode))


def _outcome(
    address: str, method: str, request: bytes, metadata: Sequence[tuple[str, str]] = ()
) -> tuple[str, str]:
    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary(method, None, None)(
                request, timeout=10, metadata=tuple(metadata) or None
            )
        except grpc.RpcError as error:
            return error.code().name, error.details() or ""
    return "OK", ""


_PULL = struct.pack("<Q", 10)
#: (method, request, metadata): hostile, malformed, unauthorised and fine calls.
_CASES: list[tuple[str, bytes, tuple[tuple[str, str], ...]]] = [
    (RECV_TENSOR, _PULL, ((SESSION_METADATA, "has space"),)),
    (STATS_METHOD, b"", ((SESSION_METADATA, "x" * 65),)),
    (RECV_TENSOR, _PULL, ((SESSION_METADATA, "one"),)),
    (RECV_TENSOR, _PULL, ((SESSION_METADATA, "two"),)),
    (RECV_TENSOR, struct.pack("<Q", 1001), ()),
    (RECV_TENSOR, struct.pack("<Q", 1000), ()),
    (RECV_TENSOR, b"ab", ((RESPONSE_LENGTH_METADATA, "many"),)),
    (RECV_TENSOR, b"ab", ((RESPONSE_LENGTH_METADATA, "-4"),)),
    (RECV_TENSOR, b"ab", ((RESPONSE_LENGTH_METADATA, " 12 "),)),
    (RECV_TENSOR, b"ab", ((RESPONSE_LENGTH_METADATA, "9" * 30),)),
    (STATS_METHOD, b"", ()),
    (STATS_METHOD, b"", ((TOKEN_METADATA, "wrong"),)),
    (RESET_METHOD, b"", ((TOKEN_METADATA, "secret-token"),)),
    ("/tf_grpc_bench.Control/Other", b"", ((TOKEN_METADATA, "secret-token"),)),
    (ECHO_METHOD, b"hello", ((SESSION_METADATA, "one"),)),
]


def test_refusals_and_their_messages_are_the_same_from_both_servers() -> None:
    # Each case on a connection of its own, closed after it: whether a session's room is
    # free again by the next case is a race with the close, so no case makes a third session
    # (the test below refuses one with its clients still connected).
    settings = ServerSettings(max_sessions=2, max_response_bytes=1000, control_token="secret-token")
    with both_servers(Mode.NON_SERIALIZED, settings) as addresses:
        outcomes = {
            engine: [_outcome(address, *case) for case in _CASES]
            for engine, address in addresses.items()
        }
    assert outcomes["grpc-cpp"] == outcomes["grpcio"]
    codes = [code for code, _ in outcomes["grpcio"]]
    assert codes == [
        "INVALID_ARGUMENT",
        "UNAUTHENTICATED",  # a control call's token is checked before its session
        "OK",
        "OK",
        "RESOURCE_EXHAUSTED",
        "OK",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "OK",
        "RESOURCE_EXHAUSTED",
        "UNAUTHENTICATED",
        "UNAUTHENTICATED",
        "OK",
        "UNIMPLEMENTED",
        "OK",
    ]
    assert all("secret-token" not in details for _, details in outcomes["grpc-cpp"])


def test_sessions_of_clients_still_connected_keep_their_room_on_both_servers() -> None:
    settings = ServerSettings(max_sessions=2)
    with both_servers(Mode.NON_SERIALIZED, settings) as addresses:
        outcomes = {}
        for engine, address in addresses.items():
            with contextlib.ExitStack() as connected:
                seen = []
                for session in ("one", "two", "three"):
                    # A connection of its own each, kept open.
                    channel = connected.enter_context(
                        grpc.insecure_channel(
                            address, options=(("grpc.use_local_subchannel_pool", 1),)
                        )
                    )
                    call = channel.unary_unary(RECV_TENSOR, None, None)
                    try:
                        call(_PULL, timeout=10, metadata=((SESSION_METADATA, session),))
                        seen.append(("OK", ""))
                    except grpc.RpcError as error:
                        seen.append((error.code().name, error.details() or ""))
            outcomes[engine] = seen
    assert outcomes["grpc-cpp"] == outcomes["grpcio"]
    assert [code for code, _ in outcomes["grpcio"]] == ["OK", "OK", "RESOURCE_EXHAUSTED"]
    assert "still connected" in outcomes["grpcio"][2][1]


def test_processes_sharing_a_port_answer_control_calls_as_one_server() -> None:
    with NativeServers(
        1, grpc_cpp_program(), mode=Mode.NON_SERIALIZED, procs_per_server=3
    ) as servers:
        assert len(set(servers.pids)) == 3
        sent = 0
        for number in range(12):
            # A channel each, so the kernel hands connections to all three processes.
            client = ReplayClient(
                servers.targets[0],
                mode=Mode.NON_SERIALIZED,
                settings=ChannelSettings(
                    session="shared", options=(("grpc.use_local_subchannel_pool", 1),)
                ),
            )
            call = pull_call(
                method=RECV_TENSOR,
                request_bytes=10,
                response_bytes=number,
                mode=Mode.NON_SERIALIZED,
            )
            client.invoke(call, timeout_s=10)
            sent += 1
            if number < 11:
                client.close()
        stats = client.stats()
        client.reset_stats()
        after = client.stats()
        client.close()
    assert stats.processes == 3 and sum(stats.received_messages_per_process) == sent
    assert stats.received_messages == sent and stats.sent_bytes == sum(range(12))
    assert stats.per_method == {RECV_TENSOR: [sent, 10 * sent]}
    assert after.received_messages == 0 and after.processes == 3


def test_tls_and_a_wildcard_host_are_served_as_grpcio_serves_them(tmp_path: Path) -> None:
    from tf_grpc_bench.replay.transport import tls

    files = tls.generate_tls_files(tmp_path)
    settings = ServerSettings(
        private_key=files.server_key_pem(), certificate_chain=files.server_cert_pem()
    )
    server = NativeServer(
        grpc_cpp_program(), mode=Mode.NON_SERIALIZED, host="localhost", port=0, settings=settings
    )
    try:
        client = ReplayClient(
            f"localhost:{server.port}",
            mode=Mode.NON_SERIALIZED,
            settings=ChannelSettings(root_certificates=files.ca_cert_pem()),
        )
        client.check_server(10)
        client.invoke(pull_call(method=RECV_TENSOR, request_bytes=12, response_bytes=34,
                                mode=Mode.NON_SERIALIZED), timeout_s=10)  # fmt: skip
        assert client.stats().sent_bytes == 34
        client.close()
    finally:
        assert server.stop() == (1, 12)
    wildcard = NativeServer(grpc_cpp_program(), mode=Mode.SERIALIZED, host="0.0.0.0", port=0,
                            settings=ServerSettings())  # fmt: skip
    try:
        assert wildcard.address == f"127.0.0.1:{wildcard.port}"
        client = ReplayClient(wildcard.address, mode=Mode.SERIALIZED)
        assert client.check_server(10).address == wildcard.address
        client.close()
    finally:
        wildcard.stop()


def test_a_port_in_use_is_one_line_naming_it() -> None:
    from tf_grpc_bench.errors import ServeError

    with ReplayServer() as taken, pytest.raises(ServeError, match=f"port {taken.port} is in use"):
        NativeServer(grpc_cpp_program(), mode=Mode.NON_SERIALIZED, host="127.0.0.1",
                     port=taken.port, settings=ServerSettings())  # fmt: skip


def test_the_engine_command_says_what_is_built_and_where() -> None:
    program = grpc_cpp_program()
    version = subprocess.run([program, "version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith(f"protocol {PROTOCOL_VERSION} grpc 1.")
    shown = subprocess.run([CLI, "engine"], capture_output=True, text=True, check=True)
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("grpcio: gRPC ") and lines[2] == "--engine auto takes grpc-cpp"
    assert lines[1] == f"grpc-cpp: built with gRPC C++ {version.stdout.split()[3]}: {program}"


def test_without_grpc_cpp_building_is_one_line_naming_the_package() -> None:
    environment = {**os.environ, "PKG_CONFIG_LIBDIR": "/nonexistent", "PKG_CONFIG_PATH": ""}
    built = subprocess.run(
        [CLI, "engine", "build"], capture_output=True, text=True, env=environment, check=False
    )
    assert built.returncode == 2 and built.stdout == ""
    (line,) = built.stderr.splitlines()
    assert "gRPC C++ not found" in line and "apt-get install libgrpc++-dev" in line
    assert "conda-forge grpc-cpp" in line
    shown = subprocess.run(
        [CLI, "engine"], capture_output=True, text=True, env=environment, check=True
    )
    assert shown.stdout.splitlines()[1].startswith("grpc-cpp: unavailable: ")
    assert shown.stdout.splitlines()[2] == "--engine auto takes grpcio"


@pytest.mark.netns  # root: makes a memory cgroup
@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_serve_in_a_memory_cgroup_refuses_a_pull_it_cannot_hold_in_the_same_words(
    tmp_path: Path, engine: str
) -> None:
    # Both servers bound a large response by their cgroup's room, not the machine's.
    if engine == "grpc-cpp":
        grpc_cpp_program()
    port = free_ports(1)[0]
    with memory_cgroup(512 * 1024 * 1024) as (prefix, folder):
        serve = subprocess.Popen(
            [*prefix, CLI, "serve", "--host", "127.0.0.1", "--port", str(port), "--engine", engine],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert serve.stdout is not None and "serving" in serve.stdout.readline()
            large = _pull(f"127.0.0.1:{port}", 300_000_000)
            small = _pull(f"127.0.0.1:{port}", 70 * 1024 * 1024)
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.communicate(timeout=60)
        assert _oom_kills(folder) == 0
    code, details = large
    assert code == "RESOURCE_EXHAUSTED", details
    assert details.startswith(
        "a response of 300000000 B needs about 600000000 B of memory here (it and gRPC's "
        "copy); this server has "
    ), details
    assert "bounded by its memory cgroup /" in details
    assert f"/{folder.name} (limit {512 * 1024 * 1024} B))" in details
    assert small == ("OK", "")
