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

A server may be shared, and its clients may not play fair:

- Counts are kept per client session: every call names its session in its
  metadata (``wire.SESSION_METADATA``), and ``Stats``/``Reset`` read and reset
  only the caller's own, so clients sharing a server neither see nor clear
  each other's figures.  Calls naming none share the default session (what
  clients before sessions get).  The table is bounded in all and per client,
  and a session whose client has left makes room for a new one (``sessions``).
- A pull asking for more than the server's limit (``--max-response``, else its
  message size limit) or than the memory this process may still take (its
  memory cgroup's, where that is less than the machine's) is refused with
  RESOURCE_EXHAUSTED before anything is allocated (``response_memory``); a
  malformed one with INVALID_ARGUMENT.
- With ``ServerSettings.control_token``, control calls without that token
  (``wire.TOKEN_METADATA``) are refused with UNAUTHENTICATED.  The token is
  never logged or echoed.

What each call gets is in ``handlers`` (the sessions in ``sessions``);
``local_servers`` runs servers as separate processes.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Sequence
from concurrent import futures
from types import TracebackType

import grpc

from tf_grpc_bench.errors import ServeError
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.handlers import Handlers, ServerState
from tf_grpc_bench.replay.transport.sessions import Refusal
from tf_grpc_bench.replay.transport.siblings import Siblings
from tf_grpc_bench.replay.transport.wire import ServerSettings, ServerStats

#: The paper's port.
DEFAULT_PORT = 50001


#: Where the processes serving one address (``--procs-per-server``) reach each other.
SIBLING_HOST = "127.0.0.1"


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
    """Raise ``ServeError`` if ``host:port`` cannot be bound (port in use, unknown or
    empty host, an address not on this machine); port 0 checks the host only.

    Checked with a plain socket before gRPC tries, because gRPC reports a failed
    bind only as a zero port and a log line of its own on stderr (for an empty
    host, one that says the port is in use).
    """
    bare = host.strip("[]")
    if not bare:
        raise ServeError(
            f"--host {host!r}: expected a host name or address (0.0.0.0 or :: for every interface)"
        )
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


#: How long ``ReplayServer.stop`` waits for gRPC's shutdown after the grace (s).
STOP_WAIT_S = 10.0


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
        shared: bool = False,
        sibling: bool = False,
    ) -> None:
        """``shared``: one of several processes serving ``port`` (``siblings``): bind it
        with SO_REUSEPORT and listen on a port of its own for the others too;
        ``sibling``: another process of them has bound ``port`` already."""
        self.mode = mode
        self.host = host
        self.requested_port = port
        self.settings = settings or ServerSettings()
        self.shared = shared or sibling
        self.sibling = sibling
        self._state = ServerState(mode, self.settings)
        self._server: grpc.Server | None = None
        self.port = 0
        #: ``shared``: where the other processes reach this one (``host:port``).
        self.sibling_address = ""

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
        if not self.sibling:
            check_port_available(self.host, self.requested_port)
        options = self.settings.all_options()
        if self.shared:
            # grpcio keeps the first of two options with the same key.
            options = [("grpc.so_reuseport", 1), *options]
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.settings.max_workers, thread_name_prefix="replay-server"
            ),
            options=options,
        )
        # Every path, the Replay service's own included, goes through the
        # generic handler: it sees each call's metadata, hence its session.
        server.add_generic_rpc_handlers((Handlers(self._state),))
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
        if self.shared:
            self.sibling_address = self._listen_for_siblings(server)
        server.start()
        self.port = port
        self._state.address = self.address
        self._server = server
        return self

    def _listen_for_siblings(self, server: grpc.Server) -> str:
        """A loopback port of this process's own, for the other processes serving its
        address (on this host: no TLS; control calls there still need the token)."""
        port = server.add_insecure_port(_join(SIBLING_HOST, 0))
        if port == 0:
            server.stop(None)
            raise ServeError(f"cannot listen on {SIBLING_HOST} for the other server processes")
        return dial_address(SIBLING_HOST, port)

    def set_siblings(self, addresses: Sequence[str]) -> None:
        """The other processes serving this address: control calls reach them too."""
        self._state.siblings = Siblings(addresses, control_token=self.settings.control_token)

    def stats(self, session: str = "") -> ServerStats:
        """What ``session`` (default: calls naming none) counted since its reset."""
        try:
            found = self._state.sessions.get(session)
        except Refusal as refusal:
            raise ServeError(f"session {session!r}: {refusal}") from None
        return self._state.stats(found)

    def reset(self, session: str | None = None) -> None:
        """Reset ``session``'s counts, or every session's (None)."""
        if session is None:
            for each in self._state.sessions.all():
                each.reset()
        else:
            with contextlib.suppress(Refusal):  # no room: nothing of it to reset
                self._state.sessions.get(session).reset()

    def received(self) -> tuple[int, int]:
        """Bytes and messages received from every client over the server's life."""
        return self._state.sessions.received()

    @property
    def session_count(self) -> int:
        """Client sessions that named themselves, kept now (the default one not counted)."""
        return len(self._state.sessions.all()) - 1

    def stop(self, grace_s: float | None = 1.0) -> None:
        """Stop accepting calls; let calls in flight finish for up to ``grace_s``, then
        cancel them.  Blocks until gRPC says it has stopped, or ``STOP_WAIT_S`` after the
        grace (a handler thread stuck in a call must not hold its process's stop)."""
        if self._server is not None:
            self._server.stop(grace_s).wait((grace_s or 0.0) + STOP_WAIT_S)
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
