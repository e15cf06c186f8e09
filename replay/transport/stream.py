"""Calls carried as messages on one bidirectional stream (``RpcKind.STREAMING``).

The server answers every message with one message, in order (``wire``'s
streaming kind); ``MessageStream`` pairs each answer with its message and
``StreamFuture`` hands it to whoever waits for it.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.transport.wire import translate_rpc_error

Metadata = tuple[tuple[str, str], ...] | None

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
