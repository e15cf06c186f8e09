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
  clients before sessions get).  At most ``ServerSettings.max_sessions`` are
  kept; a new one takes the place of one idle for ``SESSION_IDLE_NS``.
- A pull asking for more than the server's limit (``--max-response``, else its
  message size limit) or than the machine's available memory is refused with
  RESOURCE_EXHAUSTED before anything is allocated; a malformed one with
  INVALID_ARGUMENT.
- With ``ServerSettings.control_token``, control calls without that token
  (``wire.TOKEN_METADATA``) are refused with UNAUTHENTICATED.  The token is
  never logged or echoed.

``LocalServers`` runs servers as separate processes (so their CPU time and
GIL are their own), as the replay command does on loopback.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
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

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import ServeError, TransportError
from tf_grpc_bench.protos import bench_pb2, bench_pb2_grpc
from tf_grpc_bench.replay.core.messages import (
    ECHO_METHOD,
    PULL_METHOD,
    PUSH_METHOD,
    RAW_PULL_HEADER_BYTES,
)
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.siblings import SIBLING_METADATA, Siblings, merge_stats
from tf_grpc_bench.replay.transport.wire import (
    CONTROL_SERVICE,
    ECHO_STREAM_METHOD,
    MAX_METHOD_CHARS,
    PUSH_STREAM_METHOD,
    RESET_METHOD,
    RESPONSE_LENGTH_METADATA,
    SESSION_ID,
    SESSION_METADATA,
    STATS_METHOD,
    TOKEN_METADATA,
    Counters,
    PayloadBytes,
    ServerSettings,
    ServerStats,
    identity,
    keep_freed_memory,
    raw_ack,
    raw_response_length,
    session_of,
)

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


#: A session with no call and no control call for this long may be dropped to
#: make room for a new one when the server holds ``max_sessions``.
SESSION_IDLE_NS = 600 * 1_000_000_000
#: Method handlers kept per session (beyond them, handlers are made per call).
MAX_CACHED_HANDLERS = 64
#: Responses at least this large that are not already made are checked against
#: the memory the machine has available before they are made.
MEMORY_CHECKED_BYTES = 64 * 1024 * 1024
#: Most bytes of responses a server makes once and keeps (``PayloadBytes``).
PAYLOAD_CACHE_BYTES = 2 * 1024**3


class _Session:
    """One client session's counts since its last reset (the default session "" is
    every call that names none).  ``handlers`` caches its method handlers."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.counters = Counters()
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self.created_ns = time.monotonic_ns()
        self.control_ns = self.created_ns
        self.reset_wall_ns = self.created_ns
        self.reset_cpu_ns = _cpu_ns()
        #: Received (bytes, messages) counted before the last reset.
        self.earlier = (0, 0)

    @property
    def active_ns(self) -> int:
        """When the session last made a call or a control call (monotonic ns)."""
        return max(self.counters.last_call_ns, self.control_ns)

    def received(self) -> tuple[int, int]:
        """Bytes and messages received over the session's life."""
        counters = self.counters
        return (
            self.earlier[0] + counters.received_bytes,
            self.earlier[1] + counters.received_messages,
        )

    def reset(self) -> None:
        self.earlier = self.received()
        self.counters.reset()
        self.reset_wall_ns = time.monotonic_ns()
        self.reset_cpu_ns = _cpu_ns()


class _Sessions:
    """The sessions a server counts apart, at most ``limit`` at once.

    Thread-safe.  A new session takes the place of one idle for
    ``SESSION_IDLE_NS`` when there is no room; with none idle it is refused
    (``get`` returns None), so clients inventing sessions cannot grow the
    server or drop the sessions of clients still at work.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._by_id: dict[str, _Session] = {"": _Session("")}
        self._lock = threading.Lock()
        #: Received (bytes, messages) of sessions dropped.
        self._dropped = (0, 0)

    def get(self, session_id: str) -> _Session | None:
        """The session named ``session_id`` (a valid name: ``SESSION_ID``), made if
        new and there is room; None if there is none."""
        session = self._by_id.get(session_id)
        if session is not None:
            return session
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None and self._make_room():
                session = self._by_id[session_id] = _Session(session_id)
            return session

    def _make_room(self) -> bool:
        """Drop idle sessions if the table is full; whether there is room now (hold the lock)."""
        if len(self._by_id) < self.limit + 1:  # the default session is not counted
            return True
        idle_before = time.monotonic_ns() - SESSION_IDLE_NS
        for session_id, session in list(self._by_id.items()):
            if session_id and session.active_ns < idle_before:
                received = session.received()
                self._dropped = (self._dropped[0] + received[0], self._dropped[1] + received[1])
                del self._by_id[session_id]
        return len(self._by_id) < self.limit + 1

    def known(self, session_id: str) -> _Session | None:
        """The session named ``session_id`` if the server has it (per call: a lookup only)."""
        return self._by_id.get(session_id)

    def active_since(self, since_ns: int, *, besides: _Session) -> int:
        """How many other sessions made calls at or after ``since_ns``."""
        sessions = list(self._by_id.values())
        return sum(1 for s in sessions if s is not besides and s.counters.last_call_ns >= since_ns)

    def received(self) -> tuple[int, int]:
        """Bytes and messages received by every session, over the server's life."""
        totals = [session.received() for session in list(self._by_id.values())]
        return (
            self._dropped[0] + sum(t[0] for t in totals),
            self._dropped[1] + sum(t[1] for t in totals),
        )

    def all(self) -> list[_Session]:
        return list(self._by_id.values())


class _State:
    """What every handler shares: sessions, preallocated responses, limits."""

    def __init__(self, mode: Mode, settings: ServerSettings) -> None:
        self.mode = mode
        available = _available_memory_bytes()
        # Responses made once and kept: at most a quarter of the memory available
        # at start, so that clients asking for many sizes cannot hold the machine's.
        self.payloads = PayloadBytes(
            PAYLOAD_CACHE_BYTES if available is None else min(PAYLOAD_CACHE_BYTES, available // 4)
        )
        self._large_responses = threading.Lock()
        self.address = ""
        #: The other processes serving the same address (``--procs-per-server``), if any.
        self.siblings: Siblings | None = None
        self.sessions = _Sessions(settings.max_sessions)
        self.control_token = settings.control_token
        self.send_limit = settings.send_limit_bytes()
        self.max_response = (
            self.send_limit if settings.max_response_bytes is None else settings.max_response_bytes
        )

    def stats(self, session: _Session) -> ServerStats:
        received, received_messages, sent, sent_messages, per_method = session.counters.snapshot()
        return ServerStats(
            mode=self.mode.value,
            received_bytes=received,
            received_messages=received_messages,
            sent_bytes=sent,
            sent_messages=sent_messages,
            cpu_ns=_cpu_ns() - session.reset_cpu_ns,
            wall_ns=time.monotonic_ns() - session.reset_wall_ns,
            pid=os.getpid(),
            address=self.address,
            per_method=per_method,
            session=session.id,
            other_sessions=self.sessions.active_since(session.reset_wall_ns, besides=session),
        )

    def response(
        self, content_bytes: int, message_bytes: int, context: grpc.ServicerContext
    ) -> bytes:
        """The ``content_bytes`` a pull asks for (a ``message_bytes`` response), or an
        abort with RESOURCE_EXHAUSTED saying why not, before anything is allocated."""
        if content_bytes > self.max_response or message_bytes > self.send_limit:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a response of {content_bytes} bytes was asked for; this server answers "
                f"at most {min(self.max_response, self.send_limit)} (serve --max-response, "
                "--max-message-size)",
            )
        if content_bytes < MEMORY_CHECKED_BYTES or self.payloads.holds(content_bytes):
            return self.payloads.get(content_bytes)
        # One large response made at a time, each against what the ones before left.
        with self._large_responses:
            available = _available_memory_bytes()
            # The response's bytes and gRPC's copy of them.
            if available is not None and 2 * content_bytes > available:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"a response of {content_bytes} bytes was asked for; this server's "
                    f"machine has {available} bytes of memory available",
                )
            return self.payloads.get(content_bytes)


def _available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _serialized_response_bytes(content_bytes: int) -> int:
    """Length of a ``PullResponse`` carrying ``content_bytes`` (field 1, length-delimited)."""
    if content_bytes == 0:
        return 0
    return 1 + len(_varint(content_bytes)) + content_bytes


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


class _SerializedReplay(bench_pb2_grpc.ReplayServicer):
    """Serialized mode's payload service for one session, on the generated base."""

    def __init__(self, state: _State, session: _Session) -> None:
        self._state = state
        self._counters = session.counters

    def Echo(self, request: bench_pb2.Payload, context: grpc.ServicerContext) -> bench_pb2.Payload:
        size = request.ByteSize()
        self._counters.add(ECHO_METHOD, size, size)
        return request

    def Push(self, request: bench_pb2.Payload, context: grpc.ServicerContext) -> bench_pb2.Ack:
        size = request.ByteSize()
        ack = bench_pb2.Ack(received_bytes=size)
        self._counters.add(PUSH_METHOD, size, ack.ByteSize())
        return ack

    def Pull(
        self, request: bench_pb2.PullRequest, context: grpc.ServicerContext
    ) -> bench_pb2.PullResponse:
        return _serialized_pull(self._state, self._counters, PULL_METHOD, request, context)


def _serialized_pull(
    state: _State,
    counters: Counters,
    method: str,
    request: bench_pb2.PullRequest,
    context: grpc.ServicerContext,
) -> bench_pb2.PullResponse:
    size = request.response_bytes
    content = state.response(size, _serialized_response_bytes(size), context)
    response = bench_pb2.PullResponse(content=content)
    counters.add(method, request.ByteSize(), response.ByteSize())
    return response


def _raw_pull(
    state: _State, counters: Counters, method: str
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def pull(request: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = context.invocation_metadata() if len(request) < RAW_PULL_HEADER_BYTES else None
        try:
            size = raw_response_length(request, metadata)
        except ValueError:
            size = -1
        if size < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{RESPONSE_LENGTH_METADATA}: expected a response length in bytes",
            )
        response = state.response(size, size, context)
        counters.add(method, len(request), len(response))
        return response

    return pull


def _refusal_handler(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler[Any, Any]:
    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(code, details)
        raise AssertionError("abort returned")  # grpc's abort always raises

    return grpc.unary_unary_rpc_method_handler(
        refuse, request_deserializer=identity, response_serializer=identity
    )


if TYPE_CHECKING:
    _GenericHandler = grpc.GenericRpcHandler[Any, Any]
else:
    _GenericHandler = grpc.GenericRpcHandler


class _Handlers(_GenericHandler):
    """Every path: payload paths, any other method path as a pull, and the control service,
    each call counted in the session its metadata names."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._sessions = state.sessions
        self._control: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            method: grpc.unary_unary_rpc_method_handler(
                behaviour, request_deserializer=identity, response_serializer=identity
            )
            for method, behaviour in ((STATS_METHOD, self._stats), (RESET_METHOD, self._reset))
        }
        self._bad_session = (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{SESSION_METADATA}: expected 1-64 letters, digits, '-' or '_'",
        )
        self._no_room = (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"this server counts at most {state.sessions.limit} client sessions at once, "
            "all busy; try again later",
        )
        self._refusals = {
            refusal: _refusal_handler(*refusal) for refusal in (self._bad_session, self._no_room)
        }

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        # Per call: a scan of the metadata and two lookups; the rest when a
        # session or a method is new to the server.
        session_id = session_of(handler_call_details.invocation_metadata)
        session = self._sessions.known(session_id)
        if session is not None:
            handler = session.handlers.get(handler_call_details.method)
            if handler is not None:
                return handler
        return self._first_service(handler_call_details.method, session_id)

    def _first_service(
        self, method: str, session_id: str
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The handler of a method or a session the server has not cached yet."""
        control = self._control.get(method)
        if control is not None:
            return control  # it finds the session (and checks the token) itself
        session = self._admit(session_id)
        if isinstance(session, tuple):
            return self._refusals[session]
        handler = self._make(method, session)
        if (
            handler is not None
            and len(session.handlers) < MAX_CACHED_HANDLERS
            and len(method) <= MAX_METHOD_CHARS
        ):
            session.handlers[method] = handler
        return handler

    def _make(self, method: str, session: _Session) -> grpc.RpcMethodHandler[Any, Any] | None:
        if method.startswith(f"/{CONTROL_SERVICE}/"):
            return None
        if method in (ECHO_STREAM_METHOD, PUSH_STREAM_METHOD):
            return _stream_handler(method, session.counters, self._state.mode)
        if self._state.mode is Mode.NON_SERIALIZED:
            return _raw_handler(self._state, session.counters, method)
        return _serialized_handler(self._state, session, method)

    def _admit(self, session_id: str) -> _Session | tuple[grpc.StatusCode, str]:
        """A session met for the first time, or why it is refused."""
        if session_id and not SESSION_ID.fullmatch(session_id):
            return self._bad_session
        return self._state.sessions.get(session_id) or self._no_room

    def _control_session(self, context: grpc.ServicerContext) -> _Session:
        """The session a control call names, once its token is checked (aborts otherwise)."""
        metadata = context.invocation_metadata()
        token = self._state.control_token
        if token is not None:
            given = next((v for k, v in metadata if k == TOKEN_METADATA), "")
            if not isinstance(given, str) or not hmac.compare_digest(given, token):
                context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"missing or wrong token ({TOKEN_METADATA})",
                )
        session = self._admit(session_of(metadata))
        if isinstance(session, tuple):
            context.abort(*session)
            raise AssertionError("abort returned")  # grpc's abort always raises
        session.control_ns = time.monotonic_ns()
        return session

    def _to_siblings(self, context: grpc.ServicerContext) -> Siblings | None:
        """The siblings a control call must also reach (None: this process only)."""
        metadata = context.invocation_metadata()
        if any(key == SIBLING_METADATA for key, _ in metadata):
            return None
        return self._state.siblings

    def _stats(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        session = self._control_session(context)
        own = self._state.stats(session)
        siblings = self._to_siblings(context)
        if siblings is None:
            return own.to_json()
        try:
            answers = siblings.call(STATS_METHOD, session.id)
            others = [ServerStats.from_json(a, source=siblings.addresses[0]) for a in answers]
        except TransportError as error:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
            raise AssertionError("abort returned") from None
        return merge_stats(own, others).to_json()

    def _reset(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        session = self._control_session(context)
        session.reset()
        siblings = self._to_siblings(context)
        if siblings is not None:
            try:
                siblings.call(RESET_METHOD, session.id)
            except TransportError as error:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        return b""


def _raw_handler(state: _State, counters: Counters, method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """Non-serialized mode: echo, ack, or (any other path) a pull, on raw bytes."""

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        counters.add(ECHO_METHOD, len(request), len(request))
        return request

    def push(request: bytes, context: grpc.ServicerContext) -> bytes:
        ack = raw_ack(len(request))
        counters.add(PUSH_METHOD, len(request), len(ack))
        return ack

    behaviour = {ECHO_METHOD: echo, PUSH_METHOD: push}.get(method) or _raw_pull(
        state, counters, method
    )
    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=identity, response_serializer=identity
    )


def _serialized_handler(
    state: _State, session: _Session, method: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """Serialized mode: the Replay service's own paths from its servicer, any other
    path a pull with ``PullRequest``/``PullResponse``."""
    servicer = _SerializedReplay(state, session)
    own: dict[str, tuple[Callable[..., Any], Any, Any]] = {
        ECHO_METHOD: (servicer.Echo, bench_pb2.Payload, bench_pb2.Payload),
        PUSH_METHOD: (servicer.Push, bench_pb2.Payload, bench_pb2.Ack),
        PULL_METHOD: (servicer.Pull, bench_pb2.PullRequest, bench_pb2.PullResponse),
    }
    if method in own:
        behaviour, request_type, response_type = own[method]
    else:
        counters = session.counters

        def behaviour(request: bench_pb2.PullRequest, context: grpc.ServicerContext) -> Any:
            return _serialized_pull(state, counters, method, request, context)

        request_type, response_type = bench_pb2.PullRequest, bench_pb2.PullResponse
    return grpc.unary_unary_rpc_method_handler(
        behaviour,
        request_deserializer=request_type.FromString,
        response_serializer=response_type.SerializeToString,
    )


def _stream_handler(method: str, counters: Counters, mode: Mode) -> grpc.RpcMethodHandler[Any, Any]:
    """A bidirectional stream answering each message as its unary path answers a call."""
    echo = method == ECHO_STREAM_METHOD
    serialized = mode is Mode.SERIALIZED

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
        self._state = _State(mode, self.settings)
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
        found = self._state.sessions.get(session)
        if found is None:
            raise ServeError(f"no room for session {session!r}")
        return self._state.stats(found)

    def reset(self, session: str | None = None) -> None:
        """Reset ``session``'s counts, or every session's (None)."""
        if session is None:
            for each in self._state.sessions.all():
                each.reset()
        elif (found := self._state.sessions.get(session)) is not None:
            found.reset()

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


# --------------------------------------------------------------------------
# Servers in processes of their own.


def _serve_in_process(
    connection: multiprocessing.connection.Connection,
    mode_value: str,
    host: str,
    port: int,
    settings: ServerSettings,
    parent_pid: int = 0,
    shared: bool = False,
    sibling: bool = False,
) -> None:
    """Entry point of a server process: report the port, serve until SIGTERM.

    Dies with its parent (``parent_pid``), even one killed by SIGKILL.  ``shared``
    and ``sibling`` as ``ReplayServer`` takes them; a shared server then waits
    for the addresses of its siblings (("siblings", [...]) -> ("ready",)).
    """
    lifetime.die_with_parent(parent_pid)
    if settings.keep_freed_memory:
        keep_freed_memory()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C and a hang-up reach the whole process group: the parent decides when
    # servers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    server = ReplayServer(
        mode=Mode(mode_value), host=host, port=port, settings=settings, shared=shared,
        sibling=sibling,
    )  # fmt: skip
    try:
        server.start()
    except ServeError as error:
        connection.send(("error", str(error)))
        return
    connection.send(("ok", server.port, server.sibling_address))
    try:
        if shared or sibling:
            _, addresses = connection.recv()
            server.set_siblings(addresses)
            connection.send(("ready",))
    except (EOFError, OSError):
        stop.set()  # the parent is gone
    connection.close()
    while not stop.wait(0.5):
        pass
    server.stop(1.0)


class LocalServers:
    """``count`` replay servers, each in its own process (spawned, so nothing is inherited),
    or each in ``procs_per_server`` processes sharing its port (``siblings``).

    ``targets`` lists their addresses, in order.  ``stop`` terminates exactly
    the processes this object started; each also dies with this process
    (``lifetime.die_with_parent``), so start them from a thread that outlives
    them.  A context manager.
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
        procs_per_server: int = 1,
    ) -> None:
        if count < 1:
            raise ServeError(f"need at least one server, got {count}")
        if procs_per_server < 1:
            raise ServeError(f"need at least one process per server, got {procs_per_server}")
        self.count = count
        self.mode = mode
        self.host = host
        self.ports = list(ports) if ports is not None else [0] * count
        if len(self.ports) != count:
            raise ServeError(f"{count} servers but {len(self.ports)} ports")
        self.settings = settings or ServerSettings()
        self.start_timeout_s = start_timeout_s
        self.procs_per_server = procs_per_server
        self.processes: list[Any] = []
        self.targets: list[str] = []
        self._pending: list[multiprocessing.connection.Connection] = []

    def _spawn(
        self, context: Any, port: int, *, sibling: bool
    ) -> tuple[Any, multiprocessing.connection.Connection]:
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=_serve_in_process,
            args=(
                child_end,
                self.mode.value,
                self.host,
                port,
                self.settings,
                os.getpid(),
                self.procs_per_server > 1,
                sibling,
            ),
            name=f"tf-grpc-bench-server-{len(self.processes)}",
            daemon=True,
        )
        # A stop signal waits until the child has its arguments and is listed here, to be
        # stopped: one that cut the write short left it a traceback of a truncated pickle.
        with lifetime.deferred_signals():
            process.start()
            child_end.close()
            self.processes.append(process)
            self._pending.append(parent_end)
        return process, parent_end

    def _report(
        self, process: Any, connection: multiprocessing.connection.Connection
    ) -> tuple[object, ...]:
        """The next message of a starting server process; ServeError if it failed."""
        if not connection.poll(self.start_timeout_s):
            raise ServeError(
                f"server process {process.pid} did not report its port within "
                f"{self.start_timeout_s:g} s"
            )
        try:
            message: tuple[object, ...] = connection.recv()
        except EOFError:
            raise ServeError(
                f"server process {process.pid} exited while starting (exit code {process.exitcode})"
            ) from None
        if message[0] == "error":
            raise ServeError(str(message[1]))
        return message

    def start(self) -> LocalServers:
        context = multiprocessing.get_context("spawn")
        try:
            firsts = [self._spawn(context, port, sibling=False) for port in self.ports]
            reports = [self._report(*first) for first in firsts]
            groups = [
                [first] + [
                    self._spawn(context, int(str(report[1])), sibling=True)
                    for _ in range(self.procs_per_server - 1)
                ]
                for first, report in zip(firsts, reports, strict=True)
            ]  # fmt: skip
            for group, report in zip(groups, reports, strict=True):
                if len(group) > 1:
                    self._introduce(group, [report] + [self._report(*m) for m in group[1:]])
                self.targets.append(dial_address(self.host, int(str(report[1]))))
        except BaseException:
            self.stop()
            raise
        finally:
            for connection in self._pending:
                connection.close()
            self._pending = []
        return self

    def _introduce(
        self,
        group: Sequence[tuple[Any, multiprocessing.connection.Connection]],
        reports: Sequence[tuple[object, ...]],
    ) -> None:
        """Tell each process serving one address where the others are, and wait for them."""
        addresses = [str(report[2]) for report in reports]
        for index, (_, connection) in enumerate(group):
            connection.send(("siblings", addresses[:index] + addresses[index + 1 :]))
        for member in group:
            self._report(*member)

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
    procs_per_server: int = 1,
) -> str:
    """``tf-grpc-bench serve``: ps servers on ``ports`` until ``stop`` is set.

    One port is served in this process, several by one process each, or each
    by ``procs_per_server`` processes (``siblings``).  ``announce`` gets the
    line saying where they listen; the return value is the line saying what
    they did.
    """
    if len(ports) == 1 and procs_per_server == 1:
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
            received_bytes, received_messages = server.received()
            server.stop(1.0)
        return f"stopped; received {received_messages} messages, {received_bytes} bytes"
    servers = LocalServers(
        len(ports),
        mode=mode,
        host=host,
        ports=list(ports),
        settings=settings,
        procs_per_server=procs_per_server,
    )
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
