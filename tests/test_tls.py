"""TLS files made for a run, used by a real grpcio server and client on loopback."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.transport import tls

METHOD = "/test.Echo/Echo"


def _echo(request: bytes, _context: grpc.ServicerContext) -> bytes:
    return request


@pytest.fixture
def tls_files(tmp_path: Path) -> tls.TlsFiles:
    return tls.generate_tls_files(tmp_path / "tls", hosts=["10.233.0.2", "ps0.example"])


@pytest.fixture
def secure_port(tls_files: tls.TlsFiles) -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(tls_files))
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None).wait()


def _call(port: int, credentials: grpc.ChannelCredentials, *options: tuple[str, str]) -> bytes:
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=list(options)) as channel:
        echo = channel.unary_unary(METHOD)
        reply: bytes = echo(b"over tls", timeout=10)
        return reply


def test_certificate_names_every_host_and_loopback(tls_files: tls.TlsFiles) -> None:
    assert set(tls_files.server_hosts()) == {
        "localhost",
        "ps0.example",
        "127.0.0.1",
        "::1",
        "10.233.0.2",
    }
    assert stat.S_IMODE(tls_files.server_key_path.stat().st_mode) == 0o600


def test_a_call_over_tls_reaches_a_real_server(tls_files: tls.TlsFiles, secure_port: int) -> None:
    assert _call(secure_port, tls.channel_credentials(tls_files)) == b"over tls"


def test_a_client_trusting_another_ca_is_refused(
    tmp_path: Path, tls_files: tls.TlsFiles, secure_port: int
) -> None:
    stranger = tls.generate_tls_files(tmp_path / "other")
    with pytest.raises(grpc.RpcError, match="UNAVAILABLE") as caught:
        _call(secure_port, tls.channel_credentials(stranger))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_name_missing_from_the_certificate_is_refused(
    tls_files: tls.TlsFiles, secure_port: int
) -> None:
    credentials = tls.channel_credentials(tls_files)
    assert _call(secure_port, credentials, ("grpc.ssl_target_name_override", "ps0.example"))
    with pytest.raises(grpc.RpcError, match="UNAVAILABLE"):
        _call(secure_port, credentials, ("grpc.ssl_target_name_override", "ps9.example"))


def test_existing_files_are_reused_only_when_they_cover_the_hosts(
    tmp_path: Path, tls_files: tls.TlsFiles
) -> None:
    directory = tls_files.ca_cert_path.parent
    before = tls_files.server_cert_pem()
    assert tls.ensure_tls_files(directory, hosts=["10.233.0.2"]).server_cert_pem() == before
    renewed = tls.ensure_tls_files(directory, hosts=["10.233.0.3"])
    assert renewed.server_cert_pem() != before
    assert "10.233.0.3" in renewed.server_hosts()


def test_missing_files_and_bad_hosts_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ca\.pem: TLS file missing"):
        tls.load_tls_files(tmp_path)
    with pytest.raises(ConfigError, match=r"TLS host 'a b'"):
        tls.generate_tls_files(tmp_path, hosts=["a b"])


def _tool(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "tf_grpc_bench", *arguments]


def test_a_replay_over_tls_reaches_a_tls_server_and_plaintext_does_not(tmp_path: Path) -> None:
    tls_dir = tmp_path / "tls"
    server = subprocess.Popen(
        _tool("serve", "--host", "127.0.0.1", "--port", "0", "--tls", "--tls-dir", str(tls_dir)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.search(r"on (127\.0\.0\.1:[0-9]+)", line)
        assert match, line + (server.stderr.read() if server.poll() is not None else "")
        target = match.group(1)
        flags = ["--synthetic", "--benchmark", "p2p-latency", "--warmup", "0", "--duration", "0.3"]
        flags += ["--runs", "1", "--target", target, "--output-dir", str(tmp_path / "runs")]
        secure = subprocess.run(
            _tool("replay", *flags, "--tls", "--tls-dir", str(tls_dir), "--quiet"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert secure.returncode == 0, secure.stderr
        document = read_document(next((tmp_path / "runs").glob("*/results.json")))
        assert document.config["grpc_tls"] is True
        assert document.benchmarks[0].rpc_count > 0
        plain = subprocess.run(
            _tool("replay", *flags, "--quiet", "--connect-timeout", "2"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert plain.returncode != 0
        assert "Traceback" not in plain.stderr
        assert len(plain.stderr.strip().splitlines()) == 1
    finally:
        server.terminate()
        server.wait(timeout=30)
