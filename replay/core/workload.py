"""What a benchmark sends: the calls to make, built from the paper's generators or from a trace.

WHAT only: when to send is ``pacing``'s business, how long to run the
``runner``'s.  Pure: no gRPC, no clocks, no IO.

A ``Call`` is one RPC to make.  Its ``request_bytes`` and ``response_bytes`` are
the exact lengths of the gRPC messages on the wire (the message body, without
gRPC's 5-byte prefix) in the workload's mode, and are what the server is
expected to count.

Message layouts and sizes are ``messages``'; the paper's synthetic workloads
are ``synthetic``'s; a trace's steps become a workload in ``trace_workload``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from tf_grpc_bench.dependencies import Dependencies
from tf_grpc_bench.replay.core.generators import PayloadSpec
from tf_grpc_bench.replay.core.measurement import Benchmark, InexactSizes
from tf_grpc_bench.replay.core.messages import (
    ECHO_METHOD,
    PUSH_METHOD,
    RAW_ACK_BYTES,
    ack_message_bytes,
    bytes_field_bytes,
    payload_message_bytes,
    pull_request_layout,
    pull_response_content_bytes,
)
from tf_grpc_bench.trace import Task

ParameterValue = str | int | float | bool


class Shape(enum.Enum):
    """The three RPC shapes the server answers."""

    #: The paper's latency benchmark: the response is the request.
    ECHO = "echo"
    #: The paper's bandwidth benchmark: payload in, small acknowledgement out.
    ACK = "ack"
    #: TensorFlow's RecvTensor: the request says how long the response must be.
    PULL = "pull"


class Mode(enum.Enum):
    """How payloads travel: raw bytes, or as protobuf messages (the paper's two modes)."""

    NON_SERIALIZED = "non-serialized"
    SERIALIZED = "serialized"


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One RPC to make.  Sizes are wire message lengths in the workload's mode."""

    shape: Shape
    method: str
    request_bytes: int
    response_bytes: int
    #: The payload's buffer sizes (echo and ack); serialized mode sends one field per buffer.
    buffers: PayloadSpec = ()
    #: Index of the ps server (into the run's target list) the call goes to.
    server_index: int = 0
    #: Index of the worker (client) that makes the call.
    worker_index: int = 0
    #: Trace step index the call belongs to; -1 for synthetic workloads.
    step: int = -1
    #: When the call started in the trace, relative to its step's start.
    offset_ns: int = 0
    tensor_name: str = ""
    #: Earlier calls of the same (worker, server) pair still open when this one started.
    outstanding_at_start: int = 0
    #: The trace's RPC went from the ps to the worker; replayed with sizes swapped.
    reversed_direction: bool = False
    #: Trace calls: what the call waits for and when its data left and arrived in
    #: the trace (``dependencies``); None for synthetic calls.
    dependencies: Dependencies | None = None
    #: Trace calls: index of the RPC in its trace step's ``rpcs``; -1 for synthetic calls.
    rpc_index: int = -1
    #: A payload cut into chunks (``chunking``) travels as ``chunk_count`` consecutive
    #: calls; this is the ``chunk_index``-th.  One whole payload: 0 of 1.
    chunk_index: int = 0
    chunk_count: int = 1

    def __post_init__(self) -> None:
        if not self.method.startswith("/"):
            raise ValueError(f"method must be a full gRPC path, got {self.method!r}")
        for name in (
            "request_bytes",
            "response_bytes",
            "server_index",
            "worker_index",
            "offset_ns",
            "outstanding_at_start",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if any(size < 0 for size in self.buffers):
            raise ValueError("buffer sizes must be >= 0")
        if not 0 <= self.chunk_index < self.chunk_count:
            raise ValueError(
                f"chunk_index must be in [0, chunk_count), got {self.chunk_index} of "
                f"{self.chunk_count}"
            )
        if self.shape is not Shape.PULL and not self.buffers:
            raise ValueError(f"a {self.shape.value} call needs its payload's buffers")

    @property
    def payload_bytes(self) -> int:
        """Size of the message that carries the payload (the larger direction)."""
        return max(self.request_bytes, self.response_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadStep:
    """The calls of one step, in the order they are issued."""

    #: The trace's step index; -1 for the synthetic payload cycle.
    index: int
    calls: tuple[Call, ...]
    #: Recorded time from this step's start to the next one's (its own length for
    #: the last step); 0 for synthetic workloads.  Used by recorded pacing.
    period_ns: int = 0
    #: The capture machine's compute of a whole training step run alone (the
    #: trace's calibration), 0 where the trace records none.  Used by
    #: dependencies pacing (``DependencyTracker``).
    step_compute_ns: int = 0
    #: Where the steps are rounds ended by a barrier (``Workload.round_barrier``):
    #: what followed the round's last arrival, of any worker, in the trace until
    #: the step's end, the tail every worker keeps after its own last arrival
    #: (``DependencyTracker``); None otherwise.
    round_tail_ns: int | None = None

    @property
    def request_bytes(self) -> int:
        return sum(c.request_bytes for c in self.calls)

    @property
    def response_bytes(self) -> int:
        return sum(c.response_bytes for c in self.calls)

    def without_round_barrier(self) -> WorkloadStep:
        """The step as a replay without the round barrier takes it (one worker, ``role``):
        its own recorded tail, and TF1's sync token keeping the trace's wait for the
        other workers' gradients (``Dependencies.others_arrival_offset_ns``), since no
        barrier waits for them."""
        if self.round_tail_ns is None:
            return self
        calls = tuple(
            replace(call, dependencies=replace(call.dependencies, others_arrival_offset_ns=None))
            if call.dependencies is not None
            and call.dependencies.others_arrival_offset_ns is not None
            else call
            for call in self.calls
        )
        return replace(self, calls=calls, round_tail_ns=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Everything one benchmark sends, for every worker, per step (or per payload cycle)."""

    benchmark: Benchmark
    #: "synthetic" or "trace".
    source: str
    mode: Mode
    steps: tuple[WorkloadStep, ...]
    #: Number of ps servers the calls address (server indices are 0 .. server_count-1).
    server_count: int
    #: Number of workers (clients) making calls.
    worker_count: int
    #: Facts about how the workload was built, for the result's parameters.
    description: tuple[tuple[str, ParameterValue], ...] = ()
    #: The trace's steps are rounds: every worker's calls of a step ended before
    #: any call of the next began (a synchronous coordinator's join); the
    #: replay's workers then meet between steps.
    round_barrier: bool = False
    #: Trace workloads: the traced sizes the calls could not reproduce (serialized
    #: mode); None when every call has its traced sizes.
    inexact_sizes: InexactSizes | None = None
    #: Worker (client) indices that are side clients, not training's workers (a ps
    #: calling a ps, the chief's control calls): their steps record no step time.
    side_workers: tuple[int, ...] = ()
    #: PS-throughput trace workloads: the trace task each worker (client) index
    #: stands for (training's workers, then side clients) and each server index
    #: (ps tasks, then stand-ins), so a cluster replay can place them; () otherwise.
    client_tasks: tuple[Task, ...] = ()
    server_tasks: tuple[Task, ...] = ()

    def __post_init__(self) -> None:
        if self.source not in ("synthetic", "trace"):
            raise ValueError(f"source must be 'synthetic' or 'trace', got {self.source!r}")
        if not self.steps or not any(step.calls for step in self.steps):
            raise ValueError("a workload needs at least one call")
        if self.server_count < 1 or self.worker_count < 1:
            raise ValueError("a workload needs at least one server and one worker")
        if any(not 0 <= w < self.worker_count for w in self.side_workers):
            raise ValueError(f"side workers {self.side_workers} of {self.worker_count}")
        if len(self.side_workers) >= self.worker_count:
            raise ValueError("a workload needs a worker that is not a side client")
        if self.client_tasks and len(self.client_tasks) != self.worker_count:
            raise ValueError(
                f"{len(self.client_tasks)} client tasks for {self.worker_count} workers"
            )
        if self.server_tasks and len(self.server_tasks) != self.server_count:
            raise ValueError(
                f"{len(self.server_tasks)} server tasks for {self.server_count} servers"
            )
        for step in self.steps:
            for call in step.calls:
                if call.server_index >= self.server_count:
                    raise ValueError(f"call to server {call.server_index} of {self.server_count}")
                if call.worker_index >= self.worker_count:
                    raise ValueError(f"call by worker {call.worker_index} of {self.worker_count}")

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(call for step in self.steps for call in step.calls)

    @property
    def servers_used(self) -> tuple[int, ...]:
        return tuple(sorted({call.server_index for call in self.calls}))

    def for_worker(self, worker_index: int) -> Workload:
        """The part of the workload one worker makes (same steps, its calls only)."""
        if not 0 <= worker_index < self.worker_count:
            raise ValueError(f"worker {worker_index} of {self.worker_count}")
        steps = tuple(
            replace(step, calls=tuple(c for c in step.calls if c.worker_index == worker_index))
            for step in self.steps
        )
        return replace(self, steps=steps)

    def parameters(self) -> dict[str, ParameterValue]:
        return dict(self.description)


def echo_call(
    buffers: PayloadSpec, mode: Mode, *, server_index: int = 0, worker_index: int = 0
) -> Call:
    size = sum(buffers) if mode is Mode.NON_SERIALIZED else payload_message_bytes(buffers)
    return Call(
        shape=Shape.ECHO,
        method=ECHO_METHOD,
        request_bytes=size,
        response_bytes=size,
        buffers=tuple(buffers),
        server_index=server_index,
        worker_index=worker_index,
    )


def ack_call(
    buffers: PayloadSpec, mode: Mode, *, server_index: int = 0, worker_index: int = 0
) -> Call:
    if mode is Mode.NON_SERIALIZED:
        request, response = sum(buffers), RAW_ACK_BYTES
    else:
        request = payload_message_bytes(buffers)
        response = ack_message_bytes(request)
    return Call(
        shape=Shape.ACK,
        method=PUSH_METHOD,
        request_bytes=request,
        response_bytes=response,
        buffers=tuple(buffers),
        server_index=server_index,
        worker_index=worker_index,
    )


def pull_call(
    *,
    method: str,
    request_bytes: int,
    response_bytes: int,
    mode: Mode,
    tensor_name: str = "",
    server_index: int = 0,
    worker_index: int = 0,
    step: int = -1,
    offset_ns: int = 0,
    outstanding_at_start: int = 0,
    reversed_direction: bool = False,
    dependencies: Dependencies | None = None,
    rpc_index: int = -1,
) -> Call:
    """A pull-shaped call as close as the mode allows to the given wire sizes."""
    if mode is Mode.SERIALIZED:
        content = pull_response_content_bytes(response_bytes)
        response_bytes = bytes_field_bytes(content)
        layout = pull_request_layout(request_bytes, content, tensor_name)
        request_bytes, tensor_name = layout.message_bytes, layout.tensor_name
    return Call(
        shape=Shape.PULL,
        method=method,
        request_bytes=request_bytes,
        response_bytes=response_bytes,
        tensor_name=tensor_name,
        server_index=server_index,
        worker_index=worker_index,
        step=step,
        offset_ns=offset_ns,
        outstanding_at_start=outstanding_at_start,
        reversed_direction=reversed_direction,
        dependencies=dependencies,
        rpc_index=rpc_index,
    )
