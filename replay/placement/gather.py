"""The gatherer of a cluster replay: start barriers and result collection over gRPC.

When roles are placed by TF_CONFIG, every task is its own process, possibly on
its own host.  One task (the chief, or worker 0) runs a ``GatherServer`` on its
cluster address; workers

1. wait at named barriers (``barrier``) so that they start a benchmark
   together: an aggregate throughput over workers is only meaningful when
   their runs overlap;
2. send their result document when done (``submit``);

and ps tasks ask whether the job is done (``job_done``) so they can exit, the
way a launcher expects a finished job's tasks to.

Messages are small JSON objects over raw bytes (no protobuf schema to keep in
step).  Handlers block on a condition variable, one pool thread each, so the
server's pool is sized to the number of workers.  ``grpc.RpcError`` is turned
into ``TransportError`` here, the one boundary for these calls.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc

from tf_grpc_bench.errors import ServeError, TransportError
from tf_grpc_bench.files import loads_json
from tf_grpc_bench.replay.transport.server import STOP_WAIT_S

SERVICE = "tf_grpc_bench.Gather"
BARRIER_METHOD = f"/{SERVICE}/Barrier"
SUBMIT_METHOD = f"/{SERVICE}/Submit"
STATUS_METHOD = f"/{SERVICE}/Status"
#: A worker's result document has a sample per call: a long run's passes gRPC's default
#: limit of 4 MiB on what a server receives, so the gatherer takes one of any size.
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (("grpc.max_receive_message_length", -1),)


def _identity(data: bytes) -> bytes:
    return data


def _decode(data: bytes, *, source: str) -> dict[str, Any]:
    try:
        value = loads_json(data)
    except (ValueError, UnicodeDecodeError):
        raise TransportError(f"{source}: not a JSON message") from None
    if not isinstance(value, dict):
        raise TransportError(f"{source}: expected a JSON object")
    return value


class _GatherState:
    """What the gatherer knows: who arrived at which barrier, who submitted what."""

    def __init__(self, workers: Sequence[str]) -> None:
        self.workers = frozenset(workers)
        self.condition = threading.Condition()
        self.arrived: dict[str, set[str]] = {}
        self.documents: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        #: Set when the server stops: barrier handlers still waiting return then.
        self.closing = False

    @property
    def done(self) -> bool:
        return set(self.documents) | set(self.failures) >= self.workers


class GatherServer:
    """A gRPC server collecting the workers' results.  Context manager.

    ``workers`` names every task expected to submit (``worker:0`` ...).
    ``bind`` is ``host:port``; TensorFlow binds its task servers to all
    interfaces, and so does this by default (``0.0.0.0:<port of the task>``).
    """

    def __init__(
        self,
        *,
        bind: str,
        workers: Sequence[str],
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ServerCredentials | None = None,
        barrier_timeout_s: float = 600.0,
    ) -> None:
        if not workers:
            raise ServeError("gatherer: no worker tasks to wait for")
        self._state = _GatherState(workers)
        self._barrier_timeout_s = barrier_timeout_s
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=len(workers) + 4),
            options=[*SERVER_OPTIONS, *options],
        )
        handlers = {
            "Barrier": grpc.unary_unary_rpc_method_handler(self._barrier),
            "Submit": grpc.unary_unary_rpc_method_handler(self._submit),
            "Status": grpc.unary_unary_rpc_method_handler(self._status),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        try:
            if credentials is None:
                self.port = self._server.add_insecure_port(bind)
            else:
                self.port = self._server.add_secure_port(bind, credentials)
        except RuntimeError as error:
            raise ServeError(f"gatherer: cannot listen on {bind} ({error})") from None
        if self.port == 0:
            raise ServeError(f"gatherer: cannot listen on {bind} (address in use?)")

    def __enter__(self) -> GatherServer:
        self._server.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        # Barrier handlers still waiting (the job is stopping before every task arrived)
        # return now: a pool thread left waiting would hold the process's exit.
        with self._state.condition:
            self._state.closing = True
            self._state.condition.notify_all()
        # Let a last Status/Submit call finish before the port closes.
        self._server.stop(grace=2.0).wait(2.0 + STOP_WAIT_S)

    # -- handlers (gRPC pool threads) ----------------------------------------

    def _barrier(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        message = _decode(request, source="barrier")
        name, task = str(message.get("name", "")), str(message.get("task", ""))
        state = self._state

        def wake() -> None:  # the caller went away (cancelled, or its deadline passed)
            with state.condition:
                state.condition.notify_all()

        context.add_callback(wake)
        with state.condition:
            if task not in state.workers:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{task}: not a worker of the job")
            state.arrived.setdefault(name, set()).add(task)
            state.condition.notify_all()

            def everyone_in() -> bool:  # every task that has not failed
                return state.arrived[name] >= state.workers - set(state.failures)

            state.condition.wait_for(
                lambda: everyone_in() or state.closing or not context.is_active(),
                timeout=self._barrier_timeout_s,
            )
            released = everyone_in()
        if not released and state.closing:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"barrier {name}: the gatherer stopped")
        if not released:
            missing = sorted(state.workers - state.arrived[name])
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"barrier {name}: {', '.join(missing)} did not arrive",
            )
        return b"{}"

    def _submit(self, request: bytes, _context: grpc.ServicerContext) -> bytes:
        message = _decode(request, source="submit")
        task = str(message.get("task", ""))
        with self._state.condition:
            if "error" in message:
                self._state.failures[task] = str(message["error"])
            else:
                self._state.documents[task] = str(message.get("document", ""))
            self._state.condition.notify_all()
        return b"{}"

    def _status(self, _request: bytes, _context: grpc.ServicerContext) -> bytes:
        with self._state.condition:
            return json.dumps(
                {"done": self._state.done, "submitted": sorted(self._state.documents)}
            ).encode()

    # -- the gatherer's own side -----------------------------------------------

    def wait(self, timeout_s: float) -> tuple[dict[str, str], dict[str, str]]:
        """Block until every worker submitted or failed, or ``timeout_s`` passed.

        Returns (documents by task, failures by task); tasks in neither are
        missing.  Thread-safe.
        """
        state = self._state
        with state.condition:
            state.condition.wait_for(lambda: state.done, timeout=timeout_s)
            return dict(state.documents), dict(state.failures)


# -- clients (workers and ps tasks) ------------------------------------------------


def _call(
    address: str,
    method: str,
    message: dict[str, Any],
    *,
    timeout_s: float,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
) -> dict[str, Any]:
    channel = (
        grpc.insecure_channel(address, options=list(options))
        if credentials is None
        else grpc.secure_channel(address, credentials, options=list(options))
    )
    with channel:
        call = channel.unary_unary(
            method, request_serializer=_identity, response_deserializer=_identity
        )
        try:
            reply = call(json.dumps(message).encode(), timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as error:
            code = error.code().name if hasattr(error, "code") else "UNKNOWN"
            detail = error.details() if hasattr(error, "details") else str(error)
            raise TransportError(f"gatherer {address}: {method} failed: {code} {detail}") from None
    return _decode(reply, source=f"gatherer {address}")


def barrier(
    address: str,
    *,
    name: str,
    task: str,
    timeout_s: float = 600.0,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> None:
    """Block until every worker reached barrier ``name`` (waits for the gatherer to be up)."""
    _call(
        address,
        BARRIER_METHOD,
        {"name": name, "task": task},
        timeout_s=timeout_s,
        credentials=credentials,
        options=options,
    )


def submit(
    address: str,
    *,
    task: str,
    document: str = "",
    error: str = "",
    timeout_s: float = 60.0,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> None:
    """Send this worker's result document (JSON text), or the error that stopped it."""
    message = {"task": task, "error": error} if error else {"task": task, "document": document}
    _call(
        address,
        SUBMIT_METHOD,
        message,
        timeout_s=timeout_s,
        credentials=credentials,
        options=options,
    )


def wait_until_job_done(
    address: str,
    *,
    timeout_s: float,
    poll_s: float = 0.5,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> bool:
    """For ps tasks: poll the gatherer until all workers are in, or it is gone.

    Returns True when the gatherer said done, False when it stopped answering
    after having answered (it finished and closed) or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    answered = False
    while time.monotonic() < deadline:
        try:
            status = _call(
                address,
                STATUS_METHOD,
                {},
                timeout_s=max(1.0, min(10.0, deadline - time.monotonic())),
                credentials=credentials,
                options=options,
            )
        except TransportError:
            if answered:
                return False
        else:
            answered = True
            if status.get("done"):
                return True
        time.sleep(poll_s)
    return False
