"""The replay server: one stateless gRPC server answering echo, ack and pull.

Each request says what it needs (the pull's response length travels in the
request), so one server serves any trace on a host without the trace file.
Payload paths (``/tf_grpc_bench.Replay/{Echo,Push,Pull}``) answer in the
server's mode; any other method path (a trace's ``/tensorflow.WorkerService/
RecvTensor``, ``RunGraph``...) answers with the pull semantics, so that a
replay captured by the profiler's proxy shows the trace's own methods.  The
control service (``/tf_grpc_bench.Control/Stats`` and ``/Reset``, JSON over raw
bytes) reports what the server received and the CPU time it spent, for a
client on this host or another.  The streaming kind's bidirectional streams
(``EchoStream``, ``PushStream``, see ``wire``) answer each message with one
message, counting every message as the unary paths count every call.

``LocalServers`` runs servers as separate processes (so their CPU time and
GIL are their own), as the replay command does on loopback.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc

from tf_grpc_bench.errors import ServeError
from tf_grpc_bench.protos import bench_pb2, bench_pb2_grpc
from tf_grpc_bench.replay.core.workload import ECHO_METHOD, PULL_METHOD, PUSH_METHOD, Mode
from tf_grpc_bench.replay.transport.wire import (
    CONTROL_SERVICE,
    ECHO_STREAM_METHOD,
    PUSH_STREAM_METHOD,
    RESET_METHOD,
    STATS_METHOD,
    Counters,
    PayloadBytes,
    ServerSettings,
    ServerStats,
    identity,
    keep_freed_memory,
    raw_ack,
    raw_response_length,
)

#: The paper's port.
DEFAULT_PORT = 50001


def _join(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def dial_address(host: str, port: int) -> str:
    """The ``host:port`` a client dials to reach a server bound to ``host``
    (a wildcard host is reached on loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host)
    return _join(host, port)


def check_port_available(host: str, port: int) -> None:
    """Raise ``ServeError`` if ``host:port`` cannot be bound (port in use, unknown address).

    Checked with a plain socket before gRPC tries, because gRPC reports a
    failed bind only as a log line on stderr and a zero port.
    """
    if port == 0:
        return
    bare = host.strip("[]")
    try:
        infos = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ServeError(f"--host {host}: cannot resolve ({error.strerror})") from None
    for family, kind, protocol, _, address in infos:
        with socket.socket(family, kind, protocol) as probe:
            # As gRPC does, so that a port in TIME_WAIT counts as free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise ServeError(
                        f"cannot listen on {_join(host, port)}: port {port} is in use"
                    ) from None
                raise ServeError(
                    f"cannot listen on {_join(host, port)}: {error.strerror or error}"
                ) from None


def _cpu_ns() -> int:
    return time.process_time_ns()


class _State:
    """What every handler shares: counters, preallocated responses, reset times."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.counters = Counters()
        self.payloads = PayloadBytes()
        self.address = ""
        self._reset_wall_ns = time.monotonic_ns()
        self._reset_cpu_ns = _cpu_ns()

    def reset(self) -> None:
        self.counters.reset()
        self._reset_wall_ns = time.monotonic_ns()
        self._reset_cpu_ns = _cpu_ns()

    def stats(self) -> ServerStats:
        received, received_messages, sent, sent_messages, per_method = self.counters.snapshot()
        return ServerStats(
            mode=self.mode.value,
            received_bytes=received,
            received_messages=received_messages,
            sent_bytes=sent,
            sent_messages=sent_messages,
            cpu_ns=_cpu_ns() - self._reset_cpu_ns,
            wall_ns=time.monotonic_ns() - self._reset_wall_ns,
            pid=os.getpid(),
            address=self.address,
            per_method=per_method,
        )


class _SerializedReplay(bench_pb2_grpc.ReplayServicer):
    """Serialized mode's payload service, on the generated base."""

    def __init__(self, state: _State) -> None:
        self._state = state

    def Echo(self, request: bench_pb2.Payload, context: grpc.ServicerContext) -> bench_pb2.Payload:
        size = request.ByteSize()
        self._state.counters.add(ECHO_METHOD, size, size)
        return request

    def Push(self, request: bench_pb2.Payload, context: grpc.ServicerContext) -> bench_pb2.Ack:
        size = request.ByteSize()
        ack = bench_pb2.Ack(received_bytes=size)
        self._state.counters.add(PUSH_METHOD, size, ack.ByteSize())
        return ack

    def Pull(
        self, request: bench_pb2.PullRequest, context: grpc.ServicerContext
    ) -> bench_pb2.PullResponse:
        return _serialized_pull(self._state, PULL_METHOD, request)


def _serialized_pull(
    state: _State, method: str, request: bench_pb2.PullRequest
) -> bench_pb2.PullResponse:
    response = bench_pb2.PullResponse(content=state.payloads.get(request.response_bytes))
    state.counters.add(method, request.ByteSize(), response.ByteSize())
    return response


if TYPE_CHECKING:
    _GenericHandler = grpc.GenericRpcHandler[Any, Any]
else:
    _GenericHandler = grpc.GenericRpcHandler


class _Handlers(_GenericHandler):
    """Raw payload paths, any other method path as a pull, and the control service."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._cache: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self._raw_fixed: dict[str, Callable[[bytes, grpc.ServicerContext], bytes]] = {
            ECHO_METHOD: self._raw_echo,
            PUSH_METHOD: self._raw_push,
        }
        self._control: dict[str, Callable[[bytes, grpc.ServicerContext], bytes]] = {
            STATS_METHOD: self._stats,
            RESET_METHOD: self._reset,
        }

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        handler = self._cache.get(method)
        if handler is None:
            handler = self._make(method)
            if handler is not None:
                self._cache[method] = handler
        return handler

    def _make(self, method: str) -> grpc.RpcMethodHandler[Any, Any] | None:
        if method in self._control:
            return grpc.unary_unary_rpc_method_handler(
                self._control[method], request_deserializer=identity, response_serializer=identity
            )
        if method.startswith(f"/{CONTROL_SERVICE}/"):
            return None
        if method in (ECHO_STREAM_METHOD, PUSH_STREAM_METHOD):
            return self._stream_handler(method)
        if self._state.mode is Mode.NON_SERIALIZED:
            behaviour = self._raw_fixed.get(method) or self._raw_pull_for(method)
            return grpc.unary_unary_rpc_method_handler(
                behaviour, request_deserializer=identity, response_serializer=identity
            )
        # Serialized mode: the Replay service's own paths are served by the
        # registered servicer; any other path is a pull with PullRequest/PullResponse.
        state = self._state

        def pull(request: bench_pb2.PullRequest, context: grpc.ServicerContext) -> Any:
            return _serialized_pull(state, method, request)

        return grpc.unary_unary_rpc_method_handler(
            pull,
            request_deserializer=bench_pb2.PullRequest.FromString,
            response_serializer=bench_pb2.PullResponse.SerializeToString,
        )

    def _stream_handler(self, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        """A bidirectional stream answering each message as its unary path answers a call."""
        counters = self._state.counters
        echo = method == ECHO_STREAM_METHOD
        serialized = self._state.mode is Mode.SERIALIZED

        def answer_each(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            # A cancelled stream ends the loop with grpc's own RpcError, which
            # grpc recognises and does not log.
            for request in requests:
                size = request.ByteSize() if serialized else len(request)
                if echo:
                    response = request
                elif serialized:
                    response = bench_pb2.Ack(received_bytes=size)
                else:
                    response = raw_ack(size)
                sent = size if echo else (response.ByteSize() if serialized else len(response))
                counters.add(method, size, sent)
                yield response

        if not serialized:
            return grpc.stream_stream_rpc_method_handler(
                answer_each, request_deserializer=identity, response_serializer=identity
            )
        response_type = bench_pb2.Payload if echo else bench_pb2.Ack
        return grpc.stream_stream_rpc_method_handler(
            answer_each,
            request_deserializer=bench_pb2.Payload.FromString,
            response_serializer=response_type.SerializeToString,
        )

    def _raw_echo(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._state.counters.add(ECHO_METHOD, len(request), len(request))
        return request

    def _raw_push(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        ack = raw_ack(len(request))
        self._state.counters.add(PUSH_METHOD, len(request), len(ack))
        return ack

    def _raw_pull_for(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        state = self._state

        def pull(request: bytes, context: grpc.ServicerContext) -> bytes:
            metadata = context.invocation_metadata() if len(request) < 8 else None
            response = state.payloads.get(raw_response_length(request, metadata))
            state.counters.add(method, len(request), len(response))
            return response

        return pull

    def _stats(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return self._state.stats().to_json()

    def _reset(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._state.reset()
        return b""


class ReplayServer:
    """A replay server in this process.  ``start`` binds and serves in gRPC's threads.

    Thread-safe to ``stats``/``reset`` while serving.  Use as a context manager
    or call ``stop``.
    """

    def __init__(
        self,
        *,
        mode: Mode = Mode.NON_SERIALIZED,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: ServerSettings | None = None,
    ) -> None:
        self.mode = mode
        self.host = host
        self.requested_port = port
        self.settings = settings or ServerSettings()
        self._state = _State(mode)
        self._server: grpc.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` clients can dial."""
        return dial_address(self.host, self.port)

    @property
    def bind_address(self) -> str:
        return _join(self.host, self.requested_port)

    def start(self) -> ReplayServer:
        """Bind and start serving.  Raises ``ServeError`` when the port cannot be had."""
        if not 0 <= self.requested_port <= 65535:
            raise ServeError(f"--port {self.requested_port}: expected 0..65535")
        check_port_available(self.host, self.requested_port)
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.settings.max_workers, thread_name_prefix="replay-server"
            ),
            options=self.settings.all_options(),
        )
        if self.mode is Mode.SERIALIZED:
            bench_pb2_grpc.add_ReplayServicer_to_server(  # type: ignore[no-untyped-call]
                _SerializedReplay(self._state), server
            )
        server.add_generic_rpc_handlers((_Handlers(self._state),))
        credentials = self.settings.credentials()
        try:
            if credentials is None:
                port = server.add_insecure_port(self.bind_address)
            else:
                port = server.add_secure_port(self.bind_address, credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            server.stop(None)
            raise ServeError(
                f"cannot listen on {self.bind_address}: port in use or address not available"
            )
        server.start()
        self.port = port
        self._state.address = self.address
        self._server = server
        return self

    def stats(self) -> ServerStats:
        return self._state.stats()

    def reset(self) -> None:
        self._state.reset()

    def stop(self, grace_s: float | None = 1.0) -> None:
        """Stop accepting calls; let calls in flight finish for up to ``grace_s``. Blocks."""
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server stops (or ``timeout_s`` passes); True if it stopped."""
        if self._server is None:
            return True
        return bool(self._server.wait_for_termination(timeout_s))

    def __enter__(self) -> ReplayServer:
        if self._server is None:
            self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop(0.5)


# --------------------------------------------------------------------------
# Servers in processes of their own.


def _serve_in_process(
    connection: multiprocessing.connection.Connection,
    mode_value: str,
    host: str,
    port: int,
    settings: ServerSettings,
) -> None:
    """Entry point of a server process: report the port, serve until SIGTERM/SIGINT."""
    if settings.keep_freed_memory:
        keep_freed_memory()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C reaches the whole process group: the parent decides when servers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server = ReplayServer(mode=Mode(mode_value), host=host, port=port, settings=settings)
    try:
        server.start()
    except ServeError as error:
        connection.send(("error", str(error)))
        return
    connection.send(("ok", server.port))
    connection.close()
    while not stop.wait(0.5):
        pass
    server.stop(1.0)


class LocalServers:
    """``count`` replay servers, each in its own process (spawned, so nothing is inherited).

    ``targets`` lists their addresses, in order.  ``stop`` terminates exactly
    the processes this object started.  A context manager.
    """

    def __init__(
        self,
        count: int,
        *,
        mode: Mode = Mode.NON_SERIALIZED,
        host: str = "127.0.0.1",
        ports: Sequence[int] | None = None,
        settings: ServerSettings | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        if count < 1:
            raise ServeError(f"need at least one server, got {count}")
        self.count = count
        self.mode = mode
        self.host = host
        self.ports = list(ports) if ports is not None else [0] * count
        if len(self.ports) != count:
            raise ServeError(f"{count} servers but {len(self.ports)} ports")
        self.settings = settings or ServerSettings()
        self.start_timeout_s = start_timeout_s
        self.processes: list[Any] = []
        self.targets: list[str] = []

    def start(self) -> LocalServers:
        context = multiprocessing.get_context("spawn")
        pending = []
        try:
            for port in self.ports:
                parent_end, child_end = context.Pipe(duplex=False)
                process = context.Process(
                    target=_serve_in_process,
                    args=(child_end, self.mode.value, self.host, port, self.settings),
                    name=f"tf-grpc-bench-server-{len(self.processes)}",
                    daemon=True,
                )
                process.start()
                child_end.close()
                self.processes.append(process)
                pending.append(parent_end)
            for process, connection in zip(self.processes, pending, strict=True):
                if not connection.poll(self.start_timeout_s):
                    raise ServeError(
                        f"server process {process.pid} did not report its port within "
                        f"{self.start_timeout_s:g} s"
                    )
                try:
                    status, value = connection.recv()
                except EOFError:
                    raise ServeError(
                        f"server process {process.pid} exited while starting "
                        f"(exit code {process.exitcode})"
                    ) from None
                if status != "ok":
                    raise ServeError(str(value))
                self.targets.append(dial_address(self.host, int(value)))
        except BaseException:
            self.stop()
            raise
        finally:
            for connection in pending:
                connection.close()
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask each server process to stop (SIGTERM), then kill any that lingers."""
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
                process.join(timeout_s)
        self.processes = []

    def __enter__(self) -> LocalServers:
        if not self.processes:
            self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def serve_until(
    stop: threading.Event,
    *,
    mode: Mode,
    host: str,
    ports: Sequence[int],
    settings: ServerSettings,
    announce: Callable[[str], None],
) -> str:
    """``tf-grpc-bench serve``: ps servers on ``ports`` until ``stop`` is set.

    One port is served in this process, several by one process each.
    ``announce`` gets the line saying where they listen; the return value is
    the line saying what they did.
    """
    if len(ports) == 1:
        if settings.keep_freed_memory:
            keep_freed_memory()
        server = ReplayServer(mode=mode, host=host, port=ports[0], settings=settings)
        server.start()
        try:
            announce(
                f"serving {mode.value} on {server.address} (pid {os.getpid()}); Ctrl-C to stop"
            )
            while not stop.wait(1.0):
                pass
        finally:
            stats = server.stats()
            server.stop(1.0)
        return f"stopped; received {stats.received_messages} messages, {stats.received_bytes} bytes"
    servers = LocalServers(len(ports), mode=mode, host=host, ports=list(ports), settings=settings)
    servers.start()
    try:
        announce(
            f"serving {mode.value} on {','.join(servers.targets)} "
            f"(pids {' '.join(map(str, servers.pids))}); Ctrl-C to stop"
        )
        while not stop.wait(1.0):
            pass
    finally:
        servers.stop()
    return "stopped"
