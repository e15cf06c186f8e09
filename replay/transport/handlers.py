"""What a replay server answers: payload paths in its mode, any other path as a
pull, and the control service, each call counted in the session it names.

Payload paths (``/tf_grpc_bench.Replay/{Echo,Push,Pull}``) answer in the
server's mode; any other method path (a trace's ``/tensorflow.WorkerService/
RecvTensor``, ``RunGraph``...) answers with the pull semantics.  The control
service (``Stats``, ``Reset``: JSON over raw bytes) reads and resets the
caller's own session, after checking the token where the server has one.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.host import memory_room
from tf_grpc_bench.protos import bench_pb2, bench_pb2_grpc
from tf_grpc_bench.replay.core.messages import (
    ECHO_METHOD,
    PULL_METHOD,
    PUSH_METHOD,
    RAW_PULL_HEADER_BYTES,
)
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.response_memory import (
    MEMORY_CHECKED_BYTES,
    Refused,
    ResponseMemory,
)
from tf_grpc_bench.replay.transport.sessions import Refusal, Session, Sessions, cpu_ns
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
    raw_ack,
    raw_response_length,
    session_of,
)

#: Method handlers kept per session (beyond them, handlers are made per call).
MAX_CACHED_HANDLERS = 64
#: Most bytes of responses a server makes once and keeps (``PayloadBytes``).
PAYLOAD_CACHE_BYTES = 2 * 1024**3


class ServerState:
    """What every handler shares: sessions, preallocated responses, limits."""

    def __init__(self, mode: Mode, settings: ServerSettings) -> None:
        self.mode = mode
        room = memory_room()
        # Responses made once and kept: at most a quarter of the memory this process
        # may take at start, so that clients asking for many sizes cannot hold it.
        cache_bytes = PAYLOAD_CACHE_BYTES if room is None else room.available_bytes // 4
        self.payloads = PayloadBytes(min(PAYLOAD_CACHE_BYTES, cache_bytes))
        self.memory = ResponseMemory()
        self.address = ""
        #: The other processes serving the same address (``--procs-per-server``), if any.
        self.siblings: Siblings | None = None
        self.sessions = Sessions(settings.max_sessions)
        self.control_token = settings.control_token
        self.send_limit = settings.send_limit_bytes()
        self.max_response = (
            self.send_limit if settings.max_response_bytes is None else settings.max_response_bytes
        )

    def stats(self, session: Session) -> ServerStats:
        received, received_messages, sent, sent_messages, per_method = session.counters.snapshot()
        return ServerStats(
            mode=self.mode.value,
            received_bytes=received,
            received_messages=received_messages,
            sent_bytes=sent,
            sent_messages=sent_messages,
            cpu_ns=cpu_ns() - session.reset_cpu_ns,
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
        abort with RESOURCE_EXHAUSTED saying why not, before anything is allocated.

        A large response holds its memory (``ResponseMemory``) until its call ends."""
        if content_bytes > self.max_response or message_bytes > self.send_limit:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a response of {content_bytes} bytes was asked for; this server answers "
                f"at most {min(self.max_response, self.send_limit)} (serve --max-response, "
                "--max-message-size)",
            )
        if content_bytes < MEMORY_CHECKED_BYTES:
            return self.payloads.get(content_bytes)
        client = context.peer()
        try:
            held = self.memory.reserve(content_bytes, client)
        except Refused as refusal:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(refusal))
            raise AssertionError("abort returned") from None  # grpc's abort always raises
        if not context.add_callback(lambda: self.memory.release(client, held)):
            self.memory.release(client, held)  # the call has ended already
        return self.payloads.get(content_bytes)


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

    def __init__(self, state: ServerState, session: Session) -> None:
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
    state: ServerState,
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
    state: ServerState, counters: Counters, method: str
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


class Handlers(_GenericHandler):
    """Every path: payload paths, any other method path as a pull, and the control service,
    each call counted in the session its metadata names."""

    def __init__(self, state: ServerState) -> None:
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
        self._bad_session_handler = _refusal_handler(*self._bad_session)

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
        if session_id and not SESSION_ID.fullmatch(session_id):
            return self._bad_session_handler
        session = self._sessions.known(session_id)
        if session is not None:
            return self._cached(method, session)
        return self._admitting(method, session_id)

    def _cached(self, method: str, session: Session) -> grpc.RpcMethodHandler[Any, Any] | None:
        """``session``'s handler of ``method``, kept for its next calls while there is room."""
        handler = self._make(method, session)
        if (
            handler is not None
            and len(session.handlers) < MAX_CACHED_HANDLERS
            and len(method) <= MAX_METHOD_CHARS
        ):
            session.handlers[method] = handler
        return handler

    def _make(self, method: str, session: Session) -> grpc.RpcMethodHandler[Any, Any] | None:
        if method.startswith(f"/{CONTROL_SERVICE}/"):
            return None
        if method in (ECHO_STREAM_METHOD, PUSH_STREAM_METHOD):
            return _stream_handler(method, session.counters, self._state.mode)
        if self._state.mode is Mode.NON_SERIALIZED:
            return _raw_handler(self._state, session.counters, method)
        return _serialized_handler(self._state, session, method)

    def _admitting(self, method: str, session_id: str) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The handler of a new session's first call: it makes the session for the
        calling client (the call's context names it), or refuses the call saying why,
        and then answers as the session's own handler does."""
        template = self._make(method, Session(session_id))  # its (de)serializers only
        if template is None:
            return None

        def admitted(context: grpc.ServicerContext) -> grpc.RpcMethodHandler[Any, Any]:
            try:
                session = self._sessions.get(session_id, context.peer())
            except Refusal as refusal:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(refusal))
                raise AssertionError("abort returned") from None  # grpc's abort always raises
            handler = session.handlers.get(method) or self._cached(method, session)
            assert handler is not None  # the template was made for the same method
            return handler

        if template.response_streaming:

            def each(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
                behaviour = admitted(context).stream_stream
                assert behaviour is not None  # a streaming template's method streams
                yield from behaviour(requests, context)

            return grpc.stream_stream_rpc_method_handler(
                each,
                request_deserializer=template.request_deserializer,
                response_serializer=template.response_serializer,
            )

        def one(request: Any, context: grpc.ServicerContext) -> Any:
            behaviour = admitted(context).unary_unary
            assert behaviour is not None  # a unary template's method is unary
            return behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(
            one,
            request_deserializer=template.request_deserializer,
            response_serializer=template.response_serializer,
        )

    def _control_session(self, context: grpc.ServicerContext) -> Session:
        """The session a control call names, once its token is checked (aborts otherwise);
        made for the calling client if new."""
        metadata = context.invocation_metadata()
        token = self._state.control_token
        if token is not None:
            given = next((v for k, v in metadata if k == TOKEN_METADATA), "")
            if not isinstance(given, str) or not hmac.compare_digest(given, token):
                context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"missing or wrong token ({TOKEN_METADATA})",
                )
        session_id = session_of(metadata)
        if session_id and not SESSION_ID.fullmatch(session_id):
            context.abort(*self._bad_session)
        # A call another process serving this address passes on is not its client's.
        forwarded = any(key == SIBLING_METADATA for key, _ in metadata)
        peer = None if forwarded else context.peer()
        try:
            session = self._sessions.get(session_id, peer)
        except Refusal as refusal:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(refusal))
            raise AssertionError("abort returned") from None  # grpc's abort always raises
        self._sessions.touch(session, peer)
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


def _raw_handler(
    state: ServerState, counters: Counters, method: str
) -> grpc.RpcMethodHandler[Any, Any]:
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
    state: ServerState, session: Session, method: str
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
