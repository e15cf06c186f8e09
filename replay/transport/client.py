"""The replay client: channels to one server, and the calls made on them.

``ReplayClient`` turns a ``Call`` into a gRPC call in the workload's mode,
with requests built once and reused (``prepare``), or, with
``RpcKind.STREAMING``, into one message on a ``MessageStream`` (``stream``)
and its answer.  ``driver`` issues a step's calls through these clients.

gRPC failures surface as ``TransportError`` only (translated in ``wire``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import grpc

from tf_grpc_bench.errors import ConfigError, TransportError
from tf_grpc_bench.protos import bench_pb2
from tf_grpc_bench.replay.core.workload import Call, Mode, Shape
from tf_grpc_bench.replay.transport.stream import MessageStream, Metadata
from tf_grpc_bench.replay.transport.wire import (
    RESET_METHOD,
    STATS_METHOD,
    STREAM_OF_METHOD,
    ChannelSettings,
    PayloadBytes,
    RpcKind,
    ServerStats,
    chunk_failure_message,
    message_length,
    raw_pull_request,
    serialized_payload,
    serialized_pull_request,
    translate_rpc_error,
)

#: Most bytes of requests a client keeps built for reuse; requests past it are built
#: for each call (a trace may declare many distinct large messages).
REQUEST_CACHE_BYTES = 1024**3

_SERIALIZED_TYPES: dict[Shape, tuple[Any, Any]] = {
    Shape.ECHO: (bench_pb2.Payload, bench_pb2.Payload),
    Shape.ACK: (bench_pb2.Payload, bench_pb2.Ack),
    Shape.PULL: (bench_pb2.PullRequest, bench_pb2.PullResponse),
}


def parse_target(text: str) -> str:
    """Check a ``HOST:PORT`` target; returns it stripped.  Raises ``ConfigError``."""
    target = text.strip()
    host, separator, port = target.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--target {text!r}: expected HOST:PORT with a port in 1..65535")
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(f"--target {text!r}: unbalanced brackets around an IPv6 address")
    return target


class ReplayClient:
    """Channels to one replay server.  Thread-safe: calls may be issued from any thread.

    ``settings`` carries gRPC options, TLS and the number of channels; or pass
    ``channels`` already made (e.g. through a network namespace or a proxy).
    """

    def __init__(
        self,
        target: str,
        *,
        mode: Mode,
        settings: ChannelSettings | None = None,
        channels: Iterable[grpc.Channel] | None = None,
        request_cache_bytes: int = REQUEST_CACHE_BYTES,
    ) -> None:
        """``request_cache_bytes`` bounds the requests kept for reuse (``prepare``)."""
        self.target = target
        self.mode = mode
        self.settings = settings or ChannelSettings()
        if channels is not None:
            self._channels = list(channels)
        else:
            credentials = self.settings.credentials()
            options = self.settings.all_options()
            self._channels = [
                grpc.insecure_channel(target, options=options)
                if credentials is None
                else grpc.secure_channel(target, credentials, options=options)
                for _ in range(self.settings.channels_per_server)
            ]
        if not self._channels:
            raise ValueError("a client needs at least one channel")
        self._next_channel = 0
        self._callables: dict[tuple[int, str, Shape], grpc.UnaryUnaryMultiCallable[Any, Any]] = {}
        self._streaming = self.settings.rpc is RpcKind.STREAMING
        self._streams: dict[tuple[int, str], MessageStream] = {}
        self._streams_lock = threading.Lock()
        self._requests: dict[Any, tuple[Any, Metadata]] = {}
        self._requests_lock = threading.Lock()
        self._request_cache_bytes = request_cache_bytes
        #: Bytes of the requests kept in ``_requests``.
        self.cached_request_bytes = 0
        self._bytes = PayloadBytes(request_cache_bytes)
        self._control = {
            method: self._channels[0].unary_unary(method, None, None)
            for method in (STATS_METHOD, RESET_METHOD)
        }
        #: Every call names the client's session; control calls add the token.
        self._call_metadata = self.settings.call_metadata()
        self._control_metadata = self.settings.control_metadata() or None
        #: Most other sessions the server reported active beside this one's.
        self.other_sessions_seen = 0

    # -- requests -------------------------------------------------------------

    def _request_key(self, call: Call) -> Any:
        if self.mode is Mode.NON_SERIALIZED:
            if call.shape is Shape.PULL:
                # The raw request carries no name: one buffer per size pair.
                return (Shape.PULL, call.request_bytes, call.response_bytes)
            return ("raw", call.request_bytes)
        if call.shape is Shape.PULL:
            return (Shape.PULL, call.request_bytes, call.response_bytes, call.tensor_name)
        return ("payload", call.buffers)

    def _build_request(self, call: Call) -> tuple[Any, Metadata]:
        """The request of ``call`` and its metadata (the session's, and any the shape needs)."""
        request: Any
        metadata: Metadata = None
        if self.mode is Mode.NON_SERIALIZED:
            if call.shape is Shape.PULL:
                request, metadata = raw_pull_request(call.request_bytes, call.response_bytes)
            else:
                request = self._bytes.get(call.request_bytes)
        elif call.shape is Shape.PULL:
            request = serialized_pull_request(
                call.request_bytes, call.response_bytes, call.tensor_name, self._bytes
            )
        else:
            request = serialized_payload(call.buffers, self._bytes)
        return request, (*(metadata or ()), *self._call_metadata) or None

    def _request(self, call: Call) -> tuple[Any, Metadata]:
        """The request of ``call``: kept from before, or built now (and kept while the
        cache has room; past that, built for each call, so memory stays bounded)."""
        key = self._request_key(call)
        request = self._requests.get(key)
        if request is None:
            request = self._build_request(call)
            size = message_length(request[0], self.mode)
            with self._requests_lock:
                if key not in self._requests and self._has_room(size):
                    self._requests[key] = request
                    self.cached_request_bytes += size
        return request

    def _has_room(self, size: int) -> bool:
        return self.cached_request_bytes + size <= self._request_cache_bytes

    def prepare(self, calls: Iterable[Call]) -> None:
        """Build the requests these calls need now, so none is built while measuring;
        those past ``request_cache_bytes`` are left to be built call by call."""
        for call in calls:
            if self._request_key(call) in self._requests:
                continue
            if not self._has_room(call.request_bytes):
                continue
            request, _ = self._request(call)
            sent = message_length(request, self.mode)
            if sent != call.request_bytes:
                raise AssertionError(
                    f"request for {call.method} encodes to {sent} B, the workload says "
                    f"{call.request_bytes} B"
                )

    def _callable(self, call: Call) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        index = self._next_channel
        # Unlocked: a race between threads only skews which channel is next.
        if len(self._channels) > 1:
            self._next_channel = (index + 1) % len(self._channels)
        key = (index, call.method, call.shape)
        multi_callable = self._callables.get(key)
        if multi_callable is None:
            channel = self._channels[index]
            if self.mode is Mode.NON_SERIALIZED:
                # No serializers: requests and responses are bytes as they are.
                multi_callable = channel.unary_unary(call.method, None, None)
            else:
                request_type, response_type = _SERIALIZED_TYPES[call.shape]
                multi_callable = channel.unary_unary(
                    call.method,
                    request_serializer=request_type.SerializeToString,
                    response_deserializer=response_type.FromString,
                )
            self._callables[key] = multi_callable
        return multi_callable

    def _stream(self, call: Call) -> MessageStream | None:
        """The stream that carries ``call`` in the streaming kind (None: a unary call)."""
        path = STREAM_OF_METHOD.get(call.method)
        if path is None or call.shape is Shape.PULL:
            return None
        index = self._next_channel
        if len(self._channels) > 1:
            self._next_channel = (index + 1) % len(self._channels)
        stream = self._streams.get((index, path))
        if stream is None:
            with self._streams_lock:
                stream = self._streams.get((index, path))
                if stream is None:
                    stream = self._streams[(index, path)] = self._open_stream(index, path, call)
        return stream

    def _open_stream(self, index: int, path: str, call: Call) -> MessageStream:
        channel = self._channels[index]
        if self.mode is Mode.NON_SERIALIZED:
            multi_callable = channel.stream_stream(path, None, None)
        else:
            request_type, response_type = _SERIALIZED_TYPES[call.shape]
            multi_callable = channel.stream_stream(
                path,
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )
        return MessageStream(
            multi_callable,
            target=self.target,
            method=path,
            metadata=self._call_metadata or None,
        )

    # -- calls ----------------------------------------------------------------

    def check_response(self, call: Call, response: Any) -> None:
        """Raise ``TransportError`` unless the response has the length the call expects."""
        received = message_length(response, self.mode)
        if received != call.response_bytes:
            raise TransportError(
                f"{self.target}{call.method}: response of {received} B, expected "
                f"{call.response_bytes} B (is the server running in {self.mode.value} mode?)"
            )

    def invoke(self, call: Call, timeout_s: float) -> None:
        """Make ``call`` and wait for its response.  Blocks; raises ``TransportError``."""
        request, metadata = self._request(call)
        stream = self._stream(call) if self._streaming else None
        if stream is not None:
            response = stream.exchange(request, timeout_s)
        else:
            try:
                response = self._callable(call)(request, timeout=timeout_s, metadata=metadata)
            except grpc.RpcError as error:
                raise self._failure(call, error) from None
        self.check_response(call, response)

    def start(self, call: Call, timeout_s: float) -> grpc.Future[Any]:
        """Issue ``call`` without waiting; the future's result is the response."""
        request, metadata = self._request(call)
        stream = self._stream(call) if self._streaming else None
        if stream is not None:
            return stream.submit(request, timeout_s)
        return self._callable(call).future(request, timeout=timeout_s, metadata=metadata)

    def outcome(self, call: Call, future: grpc.Future[Any]) -> TransportError | None:
        """The error of a finished future, as ``TransportError``, or None if it succeeded."""
        try:
            response = future.result()
        except TransportError as error:
            return error
        except grpc.RpcError as error:
            return self._failure(call, error)
        except grpc.FutureCancelledError:
            return TransportError(f"{self.target}{call.method}: call cancelled")
        try:
            self.check_response(call, response)
        except TransportError as error:
            return error
        return None

    def _failure(self, call: Call, error: grpc.RpcError) -> TransportError:
        failure = translate_rpc_error(error, target=self.target, method=call.method)
        code = error.code() if isinstance(error, grpc.Call) else None
        if code is grpc.StatusCode.DEADLINE_EXCEEDED and call.chunk_count > 1:
            return TransportError(
                chunk_failure_message(str(failure), code, call.chunk_index, call.chunk_count)
            )
        return failure

    # -- control --------------------------------------------------------------

    def wait_ready(self, timeout_s: float) -> ServerStats:
        """Wait until the server answers, at most ``timeout_s``; its statistics of this
        client's session.  Raises ``TransportError`` naming the target.

        A control call that waits for the connection (gRPC's ``wait_for_ready``), not
        ``grpc.channel_ready_future``: that one's polling thread, still running when
        a short wait gave up and the channel closed, failed with a traceback."""
        unreachable = TransportError(
            f"{self.target}: no replay server reachable within {timeout_s:g} s"
        )
        started = time.monotonic()
        try:
            data = self._stats_call(timeout_s, wait_for_ready=True)
        except grpc.RpcError as error:
            if isinstance(error, grpc.Call) and error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise unreachable from None
            raise translate_rpc_error(error, target=self.target, method=STATS_METHOD) from None
        if time.monotonic() - started > timeout_s:
            # gRPC's deadline timer can lose the race to an answer on loopback; a
            # server that answered after the bound was not reachable within it.
            raise unreachable
        return self._read_stats(data)

    def stats(self, timeout_s: float = 10.0) -> ServerStats:
        """What the server counted of this client's session since its reset."""
        try:
            data = self._stats_call(timeout_s)
        except grpc.RpcError as error:
            raise translate_rpc_error(error, target=self.target, method=STATS_METHOD) from None
        return self._read_stats(data)

    def _stats_call(self, timeout_s: float, *, wait_for_ready: bool = False) -> bytes:
        data: bytes = self._control[STATS_METHOD](
            b"", timeout=timeout_s, metadata=self._control_metadata, wait_for_ready=wait_for_ready
        )
        return data

    def _read_stats(self, data: bytes) -> ServerStats:
        stats = ServerStats.from_json(data, source=self.target)
        self.other_sessions_seen = max(self.other_sessions_seen, stats.other_sessions)
        return stats

    def reset_stats(self, timeout_s: float = 10.0) -> None:
        """Reset the server's counts of this client's session (only those)."""
        try:
            self._control[RESET_METHOD](b"", timeout=timeout_s, metadata=self._control_metadata)
        except grpc.RpcError as error:
            raise translate_rpc_error(error, target=self.target, method=RESET_METHOD) from None

    def check_server(self, timeout_s: float) -> ServerStats:
        """Wait for the server and check it serves this client's mode."""
        stats = self.wait_ready(timeout_s)
        if stats.mode != self.mode.value:
            raise ConfigError(
                f"{self.target}: the server runs in {stats.mode} mode but --mode is "
                f"{self.mode.value} (start it with serve --mode {self.mode.value})"
            )
        return stats

    def close(self) -> None:
        with self._streams_lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
        for channel in self._channels:
            channel.close()
