"""The replay client: channels to one server, and the driver that issues a step's calls.

``ReplayClient`` turns a ``Call`` into a gRPC call in the workload's mode,
with requests built once and reused (``prepare``).  ``Driver`` issues the
calls of a step to its clients under a ``Pacing`` and records one
``CallSample`` per completed call, timed with ``time.perf_counter_ns``.

gRPC failures surface as ``TransportError`` only (translated in ``wire``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc
from tf_grpc_bench.protos import bench_pb2
from tf_grpc_bench.replay.measurement import CallSample
from tf_grpc_bench.replay.pacing import (
    Pacing,
    blocking_calls_suffice,
    may_issue,
    release_time_ns,
)
from tf_grpc_bench.replay.wire import (
    RESET_METHOD,
    STATS_METHOD,
    ChannelSettings,
    PayloadBytes,
    ServerStats,
    message_length,
    raw_pull_request,
    serialized_payload,
    serialized_pull_request,
    translate_rpc_error,
)
from tf_grpc_bench.replay.workload import Call, Mode, Shape, WorkloadStep

from tf_grpc_bench.errors import ConfigError, TransportError

Metadata = tuple[tuple[str, str], ...] | None

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
    ) -> None:
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
        self._callables: dict[tuple[int, str, Shape], grpc.UnaryUnaryMultiCallable] = {}
        self._requests: dict[Any, tuple[Any, Metadata]] = {}
        self._bytes = PayloadBytes()
        self._control = {
            method: self._channels[0].unary_unary(method, None, None)
            for method in (STATS_METHOD, RESET_METHOD)
        }

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
        if self.mode is Mode.NON_SERIALIZED:
            if call.shape is Shape.PULL:
                return raw_pull_request(call.request_bytes, call.response_bytes)
            return self._bytes.get(call.request_bytes), None
        if call.shape is Shape.PULL:
            return (
                serialized_pull_request(
                    call.request_bytes, call.response_bytes, call.tensor_name, self._bytes
                ),
                None,
            )
        return serialized_payload(call.buffers, self._bytes), None

    def _request(self, call: Call) -> tuple[Any, Metadata]:
        key = self._request_key(call)
        request = self._requests.get(key)
        if request is None:
            request = self._requests.setdefault(key, self._build_request(call))
        return request

    def prepare(self, calls: Iterable[Call]) -> None:
        """Build every request these calls need now, so none is built while measuring."""
        for call in calls:
            request, _ = self._request(call)
            sent = message_length(request, self.mode)
            if sent != call.request_bytes:
                raise AssertionError(
                    f"request for {call.method} encodes to {sent} B, the workload says "
                    f"{call.request_bytes} B"
                )

    def _callable(self, call: Call) -> grpc.UnaryUnaryMultiCallable:
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
        try:
            response = self._callable(call)(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as error:
            raise translate_rpc_error(error, target=self.target, method=call.method) from None
        self.check_response(call, response)

    def start(self, call: Call, timeout_s: float) -> grpc.Future:
        """Issue ``call`` without waiting; the future's result is the response."""
        request, metadata = self._request(call)
        return self._callable(call).future(request, timeout=timeout_s, metadata=metadata)

    def outcome(self, call: Call, future: grpc.Future) -> TransportError | None:
        """The error of a finished future, as ``TransportError``, or None if it succeeded."""
        try:
            response = future.result()
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
        try:
            data = self._control[STATS_METHOD](b"", timeout=timeout_s)
        except grpc.RpcError as error:
            raise translate_rpc_error(error, target=self.target, method=STATS_METHOD) from None
        return ServerStats.from_json(data, source=self.target)

    def reset_stats(self, timeout_s: float = 10.0) -> None:
        try:
            self._control[RESET_METHOD](b"", timeout=timeout_s)
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
        for channel in self._channels:
            channel.close()


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
    ) -> None:
        self.clients = clients
        self.pacing = pacing
        self.timeout_s = timeout_s
        self.clock = clock
        self.sleep = sleep
        self._issued_in_run = 0

    def prepare(self, steps: Iterable[WorkloadStep]) -> None:
        for step in steps:
            for call in step.calls:
                self.clients[call.server_index].prepare([call])

    def begin_run(self) -> None:
        """Start counting calls afresh (rate pacing counts from a run's begin)."""
        self._issued_in_run = 0

    def _wait_until(self, deadline_ns: int) -> None:
        while True:
            remaining = deadline_ns - self.clock()
            if remaining <= 0:
                return
            self.sleep(remaining / 1e9)

    def run_step(
        self,
        step: WorkloadStep,
        *,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None = None,
        samples: list[CallSample] | None = None,
    ) -> int:
        """Issue the step's calls, wait for all, return the time the last one completed.

        Stops issuing once ``stop_at_ns`` has passed (calls in flight still
        complete).  Samples (``start_ns`` relative to ``run_begin_ns``) are
        appended to ``samples`` as calls complete, so a caller keeps what was
        measured even when this raises ``TransportError``.
        """
        if blocking_calls_suffice(self.pacing):
            return self._run_blocking(step, run_begin_ns, step_begin_ns, stop_at_ns, samples)
        return self._run_concurrent(step, run_begin_ns, step_begin_ns, stop_at_ns, samples)

    def _release(self, call: Call, run_begin_ns: int, step_begin_ns: int) -> None:
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
            self._release(call, run_begin_ns, step_begin_ns)
            client = self.clients[call.server_index]
            start = clock()
            client.invoke(call, self.timeout_s)
            end = clock()
            if samples is not None:
                samples.append(_sample(call, start - run_begin_ns, end - start))
        return end

    def _run_concurrent(
        self,
        step: WorkloadStep,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None,
        samples: list[CallSample] | None,
    ) -> int:
        clock = self.clock
        condition = threading.Condition()
        in_flight_to: dict[int, int] = dict.fromkeys(self.clients, 0)
        state = {"in_flight": 0, "last_end": clock()}
        errors: list[TransportError] = []

        def completed(call: Call, start: int, future: grpc.Future) -> None:
            end = clock()
            error = self.clients[call.server_index].outcome(call, future)
            if error is None and samples is not None:
                samples.append(_sample(call, start - run_begin_ns, end - start))
            with condition:
                if error is not None:
                    errors.append(error)
                state["in_flight"] -= 1
                in_flight_to[call.server_index] -= 1
                state["last_end"] = max(state["last_end"], end)
                condition.notify_all()

        for call in step.calls:
            if errors or (stop_at_ns is not None and clock() >= stop_at_ns):
                break
            self._release(call, run_begin_ns, step_begin_ns)
            with condition:
                while not errors and not may_issue(
                    self.pacing,
                    call,
                    in_flight=state["in_flight"],
                    in_flight_to_server=in_flight_to[call.server_index],
                ):
                    condition.wait()
                if errors:
                    break
                state["in_flight"] += 1
                in_flight_to[call.server_index] += 1
            start = clock()
            future = self.clients[call.server_index].start(call, self.timeout_s)
            future.add_done_callback(
                lambda f, call=call, start=start: completed(call, start, f)  # type: ignore[misc]
            )
        with condition:
            while state["in_flight"] > 0:
                condition.wait()
        if errors:
            raise errors[0]
        return state["last_end"]


def _sample(call: Call, start_ns: int, latency_ns: int) -> CallSample:
    return CallSample(
        start_ns=start_ns,
        latency_ns=latency_ns,
        request_bytes=call.request_bytes,
        response_bytes=call.response_bytes,
        payload_bytes=call.payload_bytes,
        server_index=call.server_index,
        worker_index=call.worker_index,
        step=call.step,
    )
