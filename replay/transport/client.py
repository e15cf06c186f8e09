"""The replay client: channels to one server, and the driver that issues a step's calls.

``ReplayClient`` turns a ``Call`` into a gRPC call in the workload's mode,
with requests built once and reused (``prepare``), or, with
``RpcKind.STREAMING``, into one message on a ``MessageStream`` and its answer.
``Driver`` issues the calls of a step to its clients under a ``Pacing`` and
records one ``CallSample`` per completed call, timed with ``time.perf_counter_ns``.

gRPC failures surface as ``TransportError`` only (translated in ``wire``).
"""

from __future__ import annotations

import collections
import heapq
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from tf_grpc_bench.dependencies import Dependencies
from tf_grpc_bench.dependency_tracker import DependencyTracker, StepPath
from tf_grpc_bench.errors import ConfigError, TransportError
from tf_grpc_bench.protos import bench_pb2
from tf_grpc_bench.replay.core.measurement import CallSample
from tf_grpc_bench.replay.core.pacing import (
    Pacing,
    Timing,
    blocking_calls_suffice,
    may_issue,
    release_time_ns,
)
from tf_grpc_bench.replay.core.workload import Call, Mode, Shape, WorkloadStep
from tf_grpc_bench.replay.transport.peers import PEER_POLL_S, Peers
from tf_grpc_bench.replay.transport.wire import (
    RESET_METHOD,
    STATS_METHOD,
    STREAM_OF_METHOD,
    ChannelSettings,
    PayloadBytes,
    RpcKind,
    ServerStats,
    message_length,
    raw_pull_request,
    serialized_payload,
    serialized_pull_request,
    translate_rpc_error,
)

Metadata = tuple[tuple[str, str], ...] | None

#: Most bytes of requests a client keeps built for reuse; requests past it are built
#: for each call (a trace may declare many distinct large messages).
REQUEST_CACHE_BYTES = 1024**3

_SERIALIZED_TYPES: dict[Shape, tuple[Any, Any]] = {
    Shape.ECHO: (bench_pb2.Payload, bench_pb2.Payload),
    Shape.ACK: (bench_pb2.Payload, bench_pb2.Ack),
    Shape.PULL: (bench_pb2.PullRequest, bench_pb2.PullResponse),
}


_ADDRESS = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:\[\]/]+)):(?P<port>[0-9]+)$")


def split_address(address: str, *, where: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ConfigError naming ``where``."""
    match = _ADDRESS.match(address)
    port = int(match["port"]) if match else 0
    if not match or not 0 < port < 65536:
        raise ConfigError(f"{where}: expected 'host:port', got {address!r}")
    return (match["ipv6"] or match["host"], port)


def parse_target(text: str) -> str:
    """Check a ``HOST:PORT`` target; returns it stripped.  Raises ``ConfigError``."""
    target = text.strip()
    host, separator, port = target.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--target {text!r}: expected HOST:PORT with a port in 1..65535")
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(f"--target {text!r}: unbalanced brackets around an IPv6 address")
    return target


if TYPE_CHECKING:
    _Future = grpc.Future[Any]
else:
    _Future = grpc.Future


class StreamFuture(_Future):
    """The answer to one message on a ``MessageStream``, as a ``grpc.Future[Any]``.

    Resolved once, from the stream's reader thread (or at close); callbacks
    run on that thread.  Its error is a ``TransportError``.
    """

    def __init__(self) -> None:
        self._resolved = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None
        self._error: TransportError | None = None
        self._callbacks: list[Callable[[grpc.Future[Any]], None]] = []

    def resolve(self, response: Any, error: TransportError | None) -> None:
        with self._lock:
            if self._resolved.is_set():
                return
            self._response, self._error = response, error
            self._resolved.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self._resolved.is_set()

    def done(self) -> bool:
        return self._resolved.is_set()

    def result(self, timeout: float | None = None) -> Any:
        if not self._resolved.wait(timeout):
            raise grpc.FutureTimeoutError()
        if self._error is not None:
            raise self._error
        return self._response

    def exception(self, timeout: float | None = None) -> Exception | None:
        if not self._resolved.wait(timeout):
            raise grpc.FutureTimeoutError()
        return self._error

    def traceback(self, timeout: float | None = None) -> Any:
        return None

    def add_done_callback(self, fn: Callable[[grpc.Future[Any]], None]) -> None:
        with self._lock:
            if not self._resolved.is_set():
                self._callbacks.append(fn)
                return
        fn(self)


_END_OF_STREAM = object()
#: How often a stream's watchdog looks for an answer past its deadline.
_WATCHDOG_PERIOD_S = 0.1


class MessageStream:
    """One bidirectional stream carrying calls as (request message, answer message) pairs.

    The server answers every message with one message, in order (``wire``'s
    streaming kind).  ``exchange`` sends and waits in the calling thread (one
    thread at a time, and only while no ``submit`` is outstanding: the
    latency path, no thread hand-off on the answer); ``submit`` may be called
    from any thread and returns a ``StreamFuture`` resolved by a reader
    thread started on first use.  A watchdog thread cancels the stream when
    an answer is later than its deadline, which fails that call and every
    later one with ``TransportError``.  ``close`` ends the stream.
    """

    def __init__(
        self,
        multi_callable: grpc.StreamStreamMultiCallable[Any, Any],
        *,
        target: str,
        method: str,
        metadata: Metadata = None,
    ) -> None:
        self.target = target
        self.method = method
        self._outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: (deadline in perf_counter ns, future or None for ``exchange``), in send order.
        self._pending: collections.deque[tuple[int, StreamFuture | None]] = collections.deque()
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self._timed_out = False
        self._broken: TransportError | None = None
        self._reader: threading.Thread | None = None
        self._responses: Any = multi_callable(self._requests(), metadata=metadata)
        self._watchdog = threading.Thread(
            target=self._watch, name="replay-stream-watchdog", daemon=True
        )
        self._watchdog.start()

    def _requests(self) -> Iterator[Any]:
        while True:
            message = self._outgoing.get()
            if message is _END_OF_STREAM:
                return
            yield message

    def _watch(self) -> None:
        while not self._closed.wait(_WATCHDOG_PERIOD_S):
            try:
                deadline_ns = self._pending[0][0]
            except IndexError:
                continue
            if time.perf_counter_ns() > deadline_ns:
                self._timed_out = True
                self._responses.cancel()
                return

    def _error(self, error: BaseException | None) -> TransportError:
        if self._timed_out:
            return TransportError(
                f"{self.target}{self.method}: no answer within the deadline (--deadline) "
                "[DEADLINE_EXCEEDED]"
            )
        if isinstance(error, grpc.RpcError):
            return translate_rpc_error(error, target=self.target, method=self.method)
        return TransportError(f"{self.target}{self.method}: the server ended the stream")

    def exchange(self, request: Any, timeout_s: float) -> Any:
        """Send one message and wait for its answer.  Blocks; raises ``TransportError``."""
        if self._reader is not None:
            return self.submit(request, timeout_s).result()
        if self._broken is not None:
            raise self._broken
        self._pending.append((time.perf_counter_ns() + int(timeout_s * 1e9), None))
        self._outgoing.put(request)
        try:
            response = next(self._responses)
        except (grpc.RpcError, StopIteration) as error:
            self._broken = self._error(error)
            raise self._broken from None
        self._pending.popleft()
        return response

    def submit(self, request: Any, timeout_s: float) -> StreamFuture:
        """Send one message; the future resolves with its answer.  Thread-safe."""
        future = StreamFuture()
        with self._send_lock:
            if self._broken is not None:
                future.resolve(None, self._broken)
                return future
            if self._reader is None:
                self._reader = threading.Thread(
                    target=self._read, name="replay-stream-reader", daemon=True
                )
                self._reader.start()
            self._pending.append((time.perf_counter_ns() + int(timeout_s * 1e9), future))
            self._outgoing.put(request)
        return future

    def _read(self) -> None:
        error: BaseException | None = None
        try:
            for response in self._responses:
                _, future = self._pending.popleft()
                if future is not None:
                    future.resolve(response, None)
        except grpc.RpcError as rpc_error:
            error = rpc_error
        with self._send_lock:
            self._broken = self._error(error)
            while self._pending:
                _, future = self._pending.popleft()
                if future is not None:
                    future.resolve(None, self._broken)

    def close(self) -> None:
        """End the stream without waiting for answers still due (they fail)."""
        self._closed.set()
        self._outgoing.put(_END_OF_STREAM)
        self._responses.cancel()
        if self._reader is not None:
            self._reader.join(5.0)
        self._watchdog.join(5.0)


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
                raise translate_rpc_error(error, target=self.target, method=call.method) from None
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
            return translate_rpc_error(error, target=self.target, method=call.method)
        except grpc.FutureCancelledError:
            return TransportError(f"{self.target}{call.method}: call cancelled")
        try:
            self.check_response(call, response)
        except TransportError as error:
            return error
        return None

    # -- control --------------------------------------------------------------

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until the server answers; raises ``TransportError`` naming the target."""
        try:
            grpc.channel_ready_future(self._channels[0]).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise TransportError(
                f"{self.target}: no replay server reachable within {timeout_s:g} s"
            ) from None

    def stats(self, timeout_s: float = 10.0) -> ServerStats:
        """What the server counted of this client's session since its reset."""
        try:
            data = self._control[STATS_METHOD](
                b"", timeout=timeout_s, metadata=self._control_metadata
            )
        except grpc.RpcError as error:
            raise translate_rpc_error(error, target=self.target, method=STATS_METHOD) from None
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
        self.wait_ready(timeout_s)
        stats = self.stats(timeout_s)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """How one replayed step went, as the driver saw it (absolute ns of its clock)."""

    #: When the step's last call completed.
    last_end_ns: int
    #: Dependencies pacing: when the worker's next step may begin (the step's
    #: recorded tail kept); None for other pacings, which decide it themselves.
    next_begin_ns: int | None = None
    #: Dependencies pacing: the step's critical path, compute against communication.
    path: StepPath | None = None


def sleep_until(
    deadline_ns: int,
    clock: Callable[[], int],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Sleep until ``clock`` (ns) reads ``deadline_ns`` or later.  Each wait is what one
    reading left: the clock read again can already be past the deadline."""
    while (remaining_ns := deadline_ns - clock()) > 0:
        sleep(remaining_ns / 1e9)


class Driver:
    """Issues a worker's calls to its servers' clients under a pacing, recording samples.

    One driver per worker; not for use from several threads at once (its
    completion callbacks run on gRPC's threads and are synchronised here).
    ``clock`` returns ns; ``sleep`` takes seconds.
    """

    def __init__(
        self,
        clients: Mapping[int, ReplayClient],
        pacing: Pacing,
        *,
        timeout_s: float,
        clock: Callable[[], int] = time.perf_counter_ns,
        sleep: Callable[[float], None] = time.sleep,
        peers: Peers | None = None,
    ) -> None:
        self.clients = clients
        self.pacing = pacing
        self.timeout_s = timeout_s
        self.clock = clock
        self.sleep = sleep
        #: The worker's other client processes (``--procs-per-worker``), if any: this
        #: driver makes its own share of each step's calls and ends the step with them.
        self.peers = peers
        self._issued_in_run = 0

    def prepare(self, steps: Iterable[WorkloadStep]) -> None:
        for step in steps:
            local = step if self.peers is None else self.peers.local_step(step)
            for call in local.calls:
                self.clients[call.server_index].prepare([call])
            if self.pacing.timing is Timing.DEPENDENCIES:
                _dependencies_of(step)  # refuses calls without dependencies up front

    def begin_run(self) -> None:
        """Start counting calls afresh (rate pacing counts from a run's begin)."""
        self._issued_in_run = 0

    def _wait_until(self, deadline_ns: int) -> None:
        sleep_until(deadline_ns, self.clock, self.sleep)

    def run_step(
        self,
        step: WorkloadStep,
        *,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None = None,
        samples: list[CallSample] | None = None,
    ) -> StepOutcome:
        """Issue the step's calls, wait for all, say when the last one completed.

        Stops issuing once ``stop_at_ns`` has passed (calls in flight still
        complete).  Samples (``start_ns`` relative to ``run_begin_ns``) are
        appended to ``samples`` as calls complete, so a caller keeps what was
        measured even when this raises ``TransportError``.
        """
        if self.pacing.timing is Timing.DEPENDENCIES:
            return self._run_dependencies(step, run_begin_ns, step_begin_ns, samples)
        peers = self.peers
        if peers is not None:
            peers.begin_step()
            step = peers.local_step(step)
        if blocking_calls_suffice(self.pacing):
            end = self._run_blocking(step, run_begin_ns, step_begin_ns, stop_at_ns, samples)
        else:
            end = self._run_concurrent(step, run_begin_ns, step_begin_ns, stop_at_ns, samples)
        if peers is not None:
            # The step ends when the worker's last call, in whichever process, ended.
            end = peers.end_step(end)
        return StepOutcome(last_end_ns=end)

    def _release(self, call: Call, run_begin_ns: int, step_begin_ns: int) -> int | None:
        """Wait until ``call``'s planned release, if the pacing plans one; returns it."""
        release = release_time_ns(
            self.pacing,
            call,
            call_number=self._issued_in_run,
            step_begin_ns=step_begin_ns,
            run_begin_ns=run_begin_ns,
        )
        if release is not None:
            self._wait_until(release)
        self._issued_in_run += 1
        return release

    def _run_blocking(
        self,
        step: WorkloadStep,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None,
        samples: list[CallSample] | None,
    ) -> int:
        clock = self.clock
        end = clock()
        for call in step.calls:
            if stop_at_ns is not None and clock() >= stop_at_ns:
                break
            release = self._release(call, run_begin_ns, step_begin_ns)
            client = self.clients[call.server_index]
            start = clock()
            client.invoke(call, self.timeout_s)
            end = clock()
            if samples is not None:
                samples.append(_sample(call, start - run_begin_ns, end - start, start, release))
        return end

    def _run_concurrent(
        self,
        step: WorkloadStep,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None,
        samples: list[CallSample] | None,
    ) -> int:
        flight = _CallsInFlight(self, run_begin_ns, samples, self.clock())
        for call in step.calls:
            if flight.errors or (stop_at_ns is not None and self.clock() >= stop_at_ns):
                break
            release = self._release(call, run_begin_ns, step_begin_ns)
            with flight.condition:
                while not flight.errors and not flight.window_allows(call):
                    flight.condition.wait()
                if flight.errors:
                    break
            flight.start(call, release)
        flight.drain()
        return flight.last_end_ns

    def _run_dependencies(
        self,
        step: WorkloadStep,
        run_begin_ns: int,
        step_begin_ns: int,
        samples: list[CallSample] | None,
    ) -> StepOutcome:
        """Issue the step's calls in release order, each once what it waits for has arrived."""
        tracker = DependencyTracker(
            _dependencies_of(step),
            servers=[call.server_index for call in step.calls],
            step_begin_ns=step_begin_ns,
            period_ns=step.period_ns,
            compute_scale=self.pacing.wall_compute_scale,
            step_compute_ns=step.step_compute_ns,
            round_tail_ns=step.round_tail_ns,
        )
        if self.peers is None:
            replay = _DependentStep(self, step, tracker, run_begin_ns, samples)
            replay.run()
            last_end = replay.last_end_ns
        else:
            self.peers.begin_step()
            replay = _SharedDependentStep(self, step, tracker, run_begin_ns, samples, self.peers)
            replay.run()
            last_end = self.peers.end_step(replay.last_end_ns)
        return StepOutcome(
            last_end_ns=last_end,
            next_begin_ns=tracker.next_step_begin_ns(),
            path=tracker.critical_path(),
        )


class _CallsInFlight:
    """The calls a driver has started and not yet seen complete, with the samples and
    errors of those that did.  Completions run on gRPC's threads; everything here
    is guarded by ``condition``, which is notified on every completion."""

    def __init__(
        self,
        driver: Driver,
        run_begin_ns: int,
        samples: list[CallSample] | None,
        last_end_ns: int,
        on_success: Callable[[int, int], None] | None = None,
    ) -> None:
        self.driver = driver
        self.run_begin_ns = run_begin_ns
        self.samples = samples
        self.last_end_ns = last_end_ns
        #: Called as ``on_success(key, end_ns)``, under ``condition``, for each call
        #: that completed without error.
        self.on_success = on_success
        self.condition = threading.Condition()
        self.count = 0
        self.to_server: dict[int, int] = dict.fromkeys(driver.clients, 0)
        self.errors: list[TransportError] = []

    def window_allows(self, call: Call) -> bool:
        """Whether the pacing's window lets ``call`` go now (hold ``condition``)."""
        return may_issue(
            self.driver.pacing,
            call,
            in_flight=self.count,
            in_flight_to_server=self.to_server[call.server_index],
        )

    def start(self, call: Call, release: int | None, key: int = -1) -> None:
        """Start ``call`` (planned for ``release``, if any); ``key`` is passed to ``on_success``."""
        with self.condition:
            self.count += 1
            self.to_server[call.server_index] += 1
        start = self.driver.clock()
        future = self.driver.clients[call.server_index].start(call, self.driver.timeout_s)
        future.add_done_callback(lambda f: self._completed(call, key, start, release, f))

    def _completed(
        self, call: Call, key: int, start: int, release: int | None, future: grpc.Future[Any]
    ) -> None:
        end = self.driver.clock()
        error = self.driver.clients[call.server_index].outcome(call, future)
        if error is None and self.samples is not None:
            self.samples.append(
                _sample(call, start - self.run_begin_ns, end - start, start, release)
            )
        with self.condition:
            if error is not None:
                self.errors.append(error)
            elif self.on_success is not None:
                self.on_success(key, end)
            self.count -= 1
            self.to_server[call.server_index] -= 1
            self.last_end_ns = max(self.last_end_ns, end)
            self.condition.notify_all()

    def drain(self) -> None:
        """Wait for every call started; raise the first ``TransportError`` any of them had."""
        with self.condition:
            while self.count > 0:
                self.condition.wait()
        if self.errors:
            raise self.errors[0]


class _DependentStep:
    """One step under dependencies pacing: completions feed the tracker; calls whose
    waited-for arrivals are all in join a heap by release time, and the driver's
    thread issues the earliest as soon as its time comes, so a call waiting long
    for its inputs never holds back one that could go."""

    def __init__(
        self,
        driver: Driver,
        step: WorkloadStep,
        tracker: DependencyTracker,
        run_begin_ns: int,
        samples: list[CallSample] | None,
    ) -> None:
        self.driver = driver
        self.calls = step.calls
        self.tracker = tracker
        self.due: list[tuple[int, int]] = []
        #: The calls this process makes (all but another process's share).
        self.owned = frozenset(range(len(step.calls)))
        self.flight = _CallsInFlight(
            driver, run_begin_ns, samples, tracker.step_begin_ns, on_success=self._arrived
        )

    @property
    def last_end_ns(self) -> int:
        return self.flight.last_end_ns

    def _schedule_releasable(self) -> None:
        for index in self.tracker.take_releasable():
            release = self.tracker.release_ns(index)
            assert release is not None
            heapq.heappush(self.due, (release, index))

    def _arrived(self, index: int, end_ns: int) -> None:
        self.tracker.complete(index, end_ns)
        self._schedule_releasable()

    def _wait_for_next(self) -> tuple[int, int] | None:
        """Block until a call is due and the window lets it go; (release, index) or None."""
        clock = self.driver.clock
        flight = self.flight
        while not flight.errors:
            while self.due and self.due[0][1] not in self.owned:
                heapq.heappop(self.due)  # another process makes it
            if self.due and self.due[0][0] <= clock():
                if flight.window_allows(self.calls[self.due[0][1]]):
                    return heapq.heappop(self.due)
                flight.condition.wait()
            elif self.due:
                # A completion may bring an earlier release: wake on it too.
                flight.condition.wait((self.due[0][0] - clock()) / 1e9)
            else:
                self._wait_for_arrival()
        return None

    def _wait_for_arrival(self) -> None:
        """Block until a call completes (hold ``flight.condition``)."""
        self.flight.condition.wait()

    def run(self) -> None:
        """Issue every call, wait for all; raise the first ``TransportError``."""
        with self.flight.condition:
            self._schedule_releasable()
        for _ in range(len(self.owned)):
            with self.flight.condition:
                chosen = self._wait_for_next()
            if chosen is None:
                break
            release, index = chosen
            self.flight.start(self.calls[index], release, key=index)
        self.flight.drain()


class _SharedDependentStep(_DependentStep):
    """A ``_DependentStep`` of one of a worker's client processes: it makes its own share
    of the calls and learns of the others' completions from ``peers``, so its tracker
    sees the whole worker-step; ``run`` returns once every call of the step, in every
    process, has completed."""

    def __init__(
        self,
        driver: Driver,
        step: WorkloadStep,
        tracker: DependencyTracker,
        run_begin_ns: int,
        samples: list[CallSample] | None,
        peers: Peers,
    ) -> None:
        super().__init__(driver, step, tracker, run_begin_ns, samples)
        self.peers = peers
        self.owned = frozenset(peers.owned(step))
        self.fed = np.zeros(len(step.calls), dtype=bool)
        self.fed[list(self.owned)] = True

    def _arrived(self, index: int, end_ns: int) -> None:
        self.peers.publish(index, end_ns)
        super()._arrived(index, end_ns)

    def _take_remote(self) -> None:
        """Feed the other processes' completions to the tracker (any thread)."""
        with self.flight.condition:
            for index, end_ns in self.peers.arrivals(self.fed):
                self.flight.last_end_ns = max(self.flight.last_end_ns, end_ns)
                super()._arrived(index, end_ns)
            self.flight.condition.notify_all()

    def _wait_for_arrival(self) -> None:
        self.flight.condition.wait(PEER_POLL_S)
        if self.peers.broken:
            raise TransportError("another client process of this worker stopped mid-step")

    def run(self) -> None:
        self.peers.on_arrivals(self._take_remote)
        try:
            self._take_remote()
            super().run()
            with self.flight.condition:
                while self.tracker.completed_count < len(self.calls):
                    self._wait_for_arrival()
        finally:
            self.peers.on_arrivals(None)


def _dependencies_of(step: WorkloadStep) -> list[Dependencies]:
    dependencies = [call.dependencies for call in step.calls]
    if any(d is None for d in dependencies):
        raise ConfigError(
            "--pacing dependencies needs a trace's calls (synthetic payloads have no dependencies)"
        )
    return [d for d in dependencies if d is not None]


def _sample(
    call: Call, start_ns: int, latency_ns: int, issued_ns: int = 0, release_ns: int | None = None
) -> CallSample:
    return CallSample(
        start_ns=start_ns,
        latency_ns=latency_ns,
        request_bytes=call.request_bytes,
        response_bytes=call.response_bytes,
        payload_bytes=call.payload_bytes,
        server_index=call.server_index,
        worker_index=call.worker_index,
        step=call.step,
        release_lag_ns=0 if release_ns is None else max(issued_ns - release_ns, 0),
        rpc_index=call.rpc_index,
    )
