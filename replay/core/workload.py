"""What a benchmark sends: the calls to make, built from the paper's generators or from a trace.

WHAT only: when to send is ``pacing``'s business, how long to run the
``runner``'s.  Pure: no gRPC, no clocks, no IO.

A ``Call`` is one RPC to make.  Its ``request_bytes`` and ``response_bytes`` are
the exact lengths of the gRPC messages on the wire (the message body, without
gRPC's 5-byte prefix) in the workload's mode, and are what the server is
expected to count.

Message layouts
---------------
Non-serialized mode (raw bytes, identity serializers):

* echo: request = the payload's buffers concatenated; response = the request.
* ack: request = the payload; response = 8 bytes, the little-endian count of
  request bytes received.
* pull (and every trace method): request of ``request_bytes`` whose first 8
  bytes are the little-endian response length when ``request_bytes >= 8`` (else
  the length travels in the ``tfgb-response-bytes`` call metadata); response of
  exactly that many bytes.

Serialized mode (``protos/bench.proto``):

* echo / ack: ``Payload{buffers}``, one bytes field per buffer; ack answers
  ``Ack{received_bytes}``.
* pull: ``PullRequest{response_bytes, tensor_name, padding}`` padded to the
  recorded request length, answered by ``PullResponse{content}`` whose length
  makes the whole message the recorded response length.  A few lengths cannot
  be encoded exactly: 1 and 2 bytes (sent as an empty message), and one length
  just past each varint-size step (e.g. 130 B, sent one byte short).  The call
  records what is sent.

From a trace to calls (docs/design.md#replaying-a-trace)
-------------------------------------------------------
Only gRPC servers of the replay's own exist in a replay.  *Server tasks* are
the trace's ``ps`` tasks; in a trace without ``ps`` tasks (e.g.
MultiWorkerMirrored) every task that is called is a server task.  *Client
tasks* are those that make a replayed call.  Each RPC of a steady-state step is
mapped as follows (a whole step, ``WholeSteps``; each kind can be turned off):

* client -> server (a worker pulling weights with RecvTensor, control calls):
  replayed as is, by that client against that server, with the trace's method
  path and sizes.
* server -> client (a ps pulling gradients from a worker with RecvTensor): in
  replay only the ps side has a server, so it is replayed by the worker's client
  against the ps server with request and response sizes swapped
  (``reversed_direction``): the large message now travels in the request, from
  the worker to the ps, which is the same link in the same direction as the
  trace's response.  The method path stays the trace's.
* server -> server, when servers are ps tasks (``WholeSteps.ps_clients``): the
  calling ps becomes a client too, a *side client*, which calls the other ps's
  server as in training.
* non-ps -> non-ps (the chief's control calls to workers,
  ``WholeSteps.stand_in_servers``): the callee gets a *stand-in server* of its
  own, after the ps servers in the server list, and the caller (a side client
  when it calls no ps) calls it as in training.
* a task calling itself (TF1's ``RunStep`` to a worker's own server) crosses no
  link and is replayed by no one.

Training's workers are the *step clients*, listed first (so worker ``i`` of a
workload is the trace's ``i``-th worker whatever else is replayed); side
clients follow.  Side clients replay their calls with the same dependency
model, per task, but their steps are not training's steps: they record no step
time.  What is still dropped is said in the workload's parameters:
``dropped_rpcs_per_pass``, ``dropped_bytes_per_pass`` (both directions) and
``dropped_rpcs``, the kinds (caller job -> callee job, method) with their RPCs
and bytes.  A point-to-point replay also counts the other pairs' RPCs in
``dropped_rpcs_per_pass``.

Within each (client, server) pair calls keep the trace's order (by start time);
``outstanding_at_start`` is recomputed per pair after the mapping (how many
earlier calls of the pair were still open when this one started);
``offset_ns`` is the call's start relative to its step's start.

Steps.  A PS-throughput workload has one step per trace step, in order, even
a step without calls: in a trace of worker-steps (asynchronous training) each
step is one worker's, and every other worker has nothing to do in it, yet a
pass over the trace is every step once for every worker, and the Nth step is
the same trace step on every worker (``Workload.for_worker`` keeps the steps,
with that worker's calls).  A P2P workload keeps the steps in which its pair
talks.
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from tf_grpc_bench.errors import ConfigError, TraceError
from tf_grpc_bench.replay.core.dependencies import (
    Dependencies,
    StepPath,
    TimedCall,
    captured_critical_path,
    captured_critical_path_segments,
    infer_dependencies,
    source_op,
)
from tf_grpc_bench.replay.core.generators import GeneratorConfig, PayloadSpec, generate_payloads
from tf_grpc_bench.replay.core.measurement import Benchmark, InexactSizes
from tf_grpc_bench.trace import TENSOR_METHODS, Rpc, Step, Task, Trace, calibration_step_ns

#: Method paths of the replay service (``protos/bench.proto``); the raw mode uses the same paths.
ECHO_METHOD = "/tf_grpc_bench.Replay/Echo"
PUSH_METHOD = "/tf_grpc_bench.Replay/Push"
PULL_METHOD = "/tf_grpc_bench.Replay/Pull"

#: Non-serialized ack: the received byte count as a little-endian uint64.
RAW_ACK_BYTES = 8
#: Non-serialized pull: the response length as a little-endian uint64 at the request's start.
RAW_PULL_HEADER_BYTES = 8

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


# --------------------------------------------------------------------------
# Protobuf wire-size arithmetic (proto3), for the serialized mode's messages.


def varint_bytes(value: int) -> int:
    """Length of ``value``'s protobuf varint encoding."""
    if value < 0:
        raise ValueError(f"varint of a negative number: {value}")
    length = 1
    while value >= 0x80:
        value >>= 7
        length += 1
    return length


def bytes_field_bytes(length: int, *, repeated: bool = False) -> int:
    """Encoded size of a bytes/string field (tag < 16) holding ``length`` bytes.

    A singular proto3 field that is empty is not encoded at all.
    """
    if length == 0 and not repeated:
        return 0
    return 1 + varint_bytes(length) + length


def uint_field_bytes(value: int) -> int:
    """Encoded size of a singular uint64 field (tag < 16)."""
    return 0 if value == 0 else 1 + varint_bytes(value)


def payload_message_bytes(buffers: Sequence[int]) -> int:
    """Serialized size of ``Payload{buffers}``."""
    return sum(bytes_field_bytes(size, repeated=True) for size in buffers)


def ack_message_bytes(received_bytes: int) -> int:
    """Serialized size of ``Ack{received_bytes}``."""
    return uint_field_bytes(received_bytes)


def _fitting_bytes_field(target: int) -> int | None:
    """A content length whose singular bytes field encodes to exactly ``target`` bytes."""
    if target == 0:
        return 0
    guess = max(target - 1 - varint_bytes(target), 0)
    for content in (guess, guess + 1, guess + 2):
        if content > 0 and bytes_field_bytes(content) == target:
            return content
    return None


def pull_response_content_bytes(target_bytes: int) -> int:
    """Content length of the ``PullResponse`` closest to ``target_bytes`` without exceeding it."""
    for target in range(target_bytes, -1, -1):
        content = _fitting_bytes_field(target)
        if content is not None:
            return content
    raise AssertionError("unreachable: an empty PullResponse always fits")


@dataclass(frozen=True, slots=True, kw_only=True)
class PullRequestLayout:
    """How a serialized ``PullRequest`` reaches its target length."""

    response_content_bytes: int
    tensor_name: str
    padding_bytes: int
    message_bytes: int


def pull_request_layout(
    target_bytes: int, response_content_bytes: int, tensor_name: str = ""
) -> PullRequestLayout:
    """Lay out a ``PullRequest`` of ``target_bytes`` (or the nearest size it can have).

    Keeps as much of the tensor name as fits, then pads.  When the target is
    smaller than the mandatory response-length field, the request is that field
    alone.  Deterministic, so the client and the workload agree on the size.
    """
    base = uint_field_bytes(response_content_bytes)
    name = tensor_name.encode()
    best: PullRequestLayout | None = None
    for name_length in range(len(name), -1, -1):
        # Only whole characters: a truncated name must stay valid UTF-8.
        shortened = name[:name_length].decode("utf-8", errors="ignore")
        if len(shortened.encode()) != name_length:
            continue
        used = base + bytes_field_bytes(name_length)
        if used > target_bytes:
            continue
        padding_field = _fitting_bytes_field(target_bytes - used)
        if padding_field is not None:
            return PullRequestLayout(
                response_content_bytes=response_content_bytes,
                tensor_name=shortened,
                padding_bytes=padding_field,
                message_bytes=target_bytes,
            )
        if best is None and name_length == 0:
            # Off by one at a varint step: go one byte short.
            padding = pull_response_content_bytes(target_bytes - used)
            best = PullRequestLayout(
                response_content_bytes=response_content_bytes,
                tensor_name="",
                padding_bytes=padding,
                message_bytes=used + bytes_field_bytes(padding),
            )
    if best is not None:
        return best
    return PullRequestLayout(
        response_content_bytes=response_content_bytes,
        tensor_name="",
        padding_bytes=0,
        message_bytes=base,
    )


# --------------------------------------------------------------------------
# Calls and workloads.


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


# --------------------------------------------------------------------------
# Synthetic workloads: the paper's benchmarks.


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


def synthetic_workload(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> Workload:
    """The paper's benchmark over the generator's payloads, sent in a cycle.

    * P2P latency: one worker echoes each payload off one ps.
    * P2P bandwidth: one worker pushes each payload to one ps, which acks.
    * PS throughput: every worker sends each payload to every ps as an echo (a
      gradient up, the updated weights of the same size back, as in parameter-
      server training); the calls of one payload to the different ps go out
      together, one outstanding call per (worker, ps) pair by default.
    """
    if ps_count < 1:
        raise ConfigError(f"--ps must be >= 1, got {ps_count}")
    if worker_count < 1:
        raise ConfigError(f"--workers must be >= 1, got {worker_count}")
    payloads = generate_payloads(generator)
    calls: list[Call] = []
    if benchmark is Benchmark.P2P_LATENCY:
        calls = [echo_call(p, mode) for p in payloads]
        ps_count = worker_count = 1
    elif benchmark is Benchmark.P2P_BANDWIDTH:
        calls = [ack_call(p, mode) for p in payloads]
        ps_count = worker_count = 1
    else:
        calls = [
            echo_call(p, mode, server_index=s, worker_index=w)
            for w in range(worker_count)
            for p in payloads
            for s in range(ps_count)
        ]
    description: dict[str, ParameterValue] = {
        "generator": generator.kind.value,
        "categories": ",".join(c.value for c in generator.categories),
        "buffers": generator.buffers_per_payload,
        "payloads": generator.payload_count,
        "small_size_bytes": generator.sizes.small_bytes,
        "medium_size_bytes": generator.sizes.medium_bytes,
        "large_size_bytes": generator.sizes.large_bytes,
        "seed": generator.seed,
        "random_sizes": generator.random_sizes,
        "ps": ps_count,
        "workers": worker_count,
        "shape": calls[0].shape.value,
    }
    if generator.kind.value == "skew":
        description["skew_bias"] = generator.effective_skew_bias.value
    return Workload(
        benchmark=benchmark,
        source="synthetic",
        mode=mode,
        steps=(WorkloadStep(index=-1, calls=tuple(calls)),),
        server_count=ps_count,
        worker_count=worker_count,
        description=tuple(description.items()),
    )


# --------------------------------------------------------------------------
# Trace-driven workloads.


@dataclass(frozen=True, slots=True, kw_only=True)
class _Mapped:
    """One trace RPC as a replay sees it: who calls whom, which way the bytes go."""

    rpc: Rpc
    client_task: int
    server_task: int
    reversed_direction: bool
    #: Index of ``rpc`` in its trace step's ``rpcs``.
    rpc_index: int = -1

    @property
    def request_bytes(self) -> int:
        return self.rpc.response_bytes if self.reversed_direction else self.rpc.request_bytes

    @property
    def response_bytes(self) -> int:
        return self.rpc.request_bytes if self.reversed_direction else self.rpc.response_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class WholeSteps:
    """Which of a step's calls beyond worker <-> ps a trace replay makes (module docstring)."""

    #: A ps calling another ps (TF2's ps-to-ps RecvTensor) is replayed by a client of that ps.
    ps_clients: bool = True
    #: A non-ps task called by another (the chief's control calls to workers) gets a server.
    stand_in_servers: bool = True

    def describe(self) -> str:
        """For the result's parameters: what beyond worker <-> ps calls is replayed."""
        kinds = [
            text
            for wanted, text in (
                (self.ps_clients, "ps-to-ps by ps clients"),
                (self.stand_in_servers, "calls to workers by stand-in servers"),
            )
            if wanted
        ]
        return ", ".join(kinds) or "worker <-> ps only"


#: Every kind of call a replay can make: the default.
WHOLE_STEPS = WholeSteps()
#: Only what training's workers and ps exchange (``role``'s last resort, when its cluster
#: cannot place side clients).
WORKERS_AND_PS_ONLY = WholeSteps(ps_clients=False, stand_in_servers=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRoles:
    """Which trace tasks become servers and which become clients of a replay."""

    server_tasks: tuple[int, ...]
    client_tasks: tuple[int, ...]
    #: True when servers are the trace's ps tasks (else: every called task).
    ps_job: bool
    #: Server tasks that are not ps: stand-ins for a called worker (last in ``server_tasks``).
    stand_in_servers: tuple[int, ...] = ()
    #: Client tasks that are not training's workers: a ps calling a ps, a chief calling
    #: only workers (last in ``client_tasks``); their steps are not training's.
    side_clients: tuple[int, ...] = ()
    whole_steps: WholeSteps = WHOLE_STEPS

    def server_index(self, task: int) -> int:
        return self.server_tasks.index(task)

    def client_index(self, task: int) -> int:
        return self.client_tasks.index(task)

    @property
    def step_clients(self) -> tuple[int, ...]:
        """The client tasks that are training's workers, in client order."""
        return tuple(t for t in self.client_tasks if t not in self.side_clients)


def _sort_tasks(trace: Trace, tasks: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(tasks), key=lambda i: (trace.tasks[i].job, trace.tasks[i].index)))


def _map_rpc(rpc: Rpc, servers: frozenset[int], ps_job: bool, whole: WholeSteps) -> _Mapped | None:
    caller, callee = rpc.caller_task, rpc.callee_task
    if caller == callee:
        return None  # a task calling itself crosses no link
    caller_serves = caller in servers
    callee_serves = callee in servers
    if caller_serves and not callee_serves:
        return _Mapped(rpc=rpc, client_task=callee, server_task=caller, reversed_direction=True)
    direct = (
        (callee_serves and not caller_serves)
        or (caller_serves and callee_serves and (not ps_job or whole.ps_clients))
        or (not caller_serves and not callee_serves and ps_job and whole.stand_in_servers)
    )
    if direct:
        return _Mapped(rpc=rpc, client_task=caller, server_task=callee, reversed_direction=False)
    return None


def _is_step_client(mapped: _Mapped, servers: frozenset[int], ps_job: bool) -> bool:
    """Whether the call's client is one of training's workers: it calls a ps or a ps calls it."""
    if not ps_job:
        return True
    return mapped.server_task in servers and mapped.client_task not in servers


def trace_roles(
    trace: Trace, *, source: str = "trace", whole_steps: WholeSteps = WHOLE_STEPS
) -> TraceRoles:
    """Decide servers and clients (see the module docstring)."""
    rpcs = [rpc for step in trace.steps for rpc in step.rpcs]
    if not rpcs:
        raise TraceError(f"{source}: no RPCs in steady-state steps, nothing to replay")
    ps_tasks = frozenset(trace.tasks_of_job("ps"))
    ps_job = bool(ps_tasks)
    servers = ps_tasks or frozenset(r.callee_task for r in rpcs)
    step_clients: set[int] = set()
    clients: set[int] = set()
    used_servers: set[int] = set()
    for rpc in rpcs:
        mapped = _map_rpc(rpc, servers, ps_job, whole_steps)
        if mapped is not None:
            clients.add(mapped.client_task)
            used_servers.add(mapped.server_task)
            if _is_step_client(mapped, servers, ps_job):
                step_clients.add(mapped.client_task)
    if not step_clients:
        raise TraceError(f"{source}: no RPC between a worker and a ps, nothing to replay")
    if not ps_job:
        # Without a ps job a task may both serve and call; it then appears in both lists.
        return TraceRoles(
            server_tasks=_sort_tasks(trace, used_servers),
            client_tasks=_sort_tasks(trace, clients),
            ps_job=False,
            whole_steps=whole_steps,
        )
    side = _sort_tasks(trace, clients - step_clients)
    stand_ins = _sort_tasks(trace, used_servers - servers)
    return TraceRoles(
        server_tasks=_sort_tasks(trace, servers) + stand_ins,
        client_tasks=_sort_tasks(trace, step_clients) + side,
        ps_job=True,
        stand_in_servers=stand_ins,
        side_clients=side,
        whole_steps=whole_steps,
    )


def _mapped_steps(trace: Trace, roles: TraceRoles) -> tuple[list[list[_Mapped]], int]:
    steps, unreplayed = _mapped_and_unreplayed(trace, roles)
    return steps, len(unreplayed)


def _mapped_and_unreplayed(
    trace: Trace, roles: TraceRoles
) -> tuple[list[list[_Mapped]], list[Rpc]]:
    """Each step's RPCs as the replay maps them, and the RPCs no replay task can make."""
    servers = frozenset(t for t in roles.server_tasks if t not in roles.stand_in_servers)
    steps: list[list[_Mapped]] = []
    unreplayed: list[Rpc] = []
    for step in trace.steps:
        mapped_step = []
        for index, rpc in enumerate(step.rpcs):
            mapped = _map_rpc(rpc, servers, roles.ps_job, roles.whole_steps)
            if mapped is None:
                unreplayed.append(rpc)
            else:
                mapped_step.append(replace(mapped, rpc_index=index))
        mapped_step.sort(key=lambda m: (m.rpc.start_ns, m.rpc.end_ns))
        steps.append(mapped_step)
    return steps, unreplayed


def unreplayed_summary(trace: Trace, roles: TraceRoles | None = None) -> tuple[int, str]:
    """Bytes per pass of the RPCs a replay cannot make, and what they are.

    The text lists each kind as ``caller job->callee job method: RPCs, bytes``
    (both directions' bytes), most bytes first; empty when nothing is dropped.
    """
    if roles is None:
        roles = trace_roles(trace)
    _, unreplayed = _mapped_and_unreplayed(trace, roles)
    kinds: dict[str, list[int]] = {}
    for rpc in unreplayed:
        caller = trace.tasks[rpc.caller_task].job
        callee = trace.tasks[rpc.callee_task].job
        method = rpc.method.rsplit("/", 1)[-1]
        entry = kinds.setdefault(f"{caller}->{callee} {method}", [0, 0])
        entry[0] += 1
        entry[1] += rpc.request_bytes + rpc.response_bytes
    total = sum(size for _, size in kinds.values())
    ranked = sorted(kinds.items(), key=lambda item: (-item[1][1], item[0]))
    text = "; ".join(f"{kind}: {count} RPCs, {size} B" for kind, (count, size) in ranked)
    return total, text


def pair_bytes(trace: Trace, roles: TraceRoles | None = None) -> dict[tuple[int, int], int]:
    """Bytes moved per (client task, server task) pair over all steady-state steps."""
    roles = roles or trace_roles(trace)
    totals: Counter[tuple[int, int]] = Counter()
    for step in _mapped_steps(trace, roles)[0]:
        for m in step:
            totals[(m.client_task, m.server_task)] += m.rpc.request_bytes + m.rpc.response_bytes
    return dict(totals)


def _pair_servers(roles: TraceRoles) -> tuple[int, ...]:
    return tuple(t for t in roles.server_tasks if t not in roles.stand_in_servers)


def choose_pair(trace: Trace, roles: TraceRoles | None = None) -> tuple[int, int]:
    """The (worker task, ps task) pair that moved the most bytes; lowest indices on a tie."""
    roles = roles or trace_roles(trace)
    servers, clients = _pair_servers(roles), roles.step_clients
    totals = {
        pair: size
        for pair, size in pair_bytes(trace, roles).items()
        if pair[0] in clients and pair[1] in servers
    }
    return max(sorted(totals), key=lambda pair: totals[pair])


def parse_pair(text: str, trace: Trace) -> tuple[int, int]:
    """``worker:0,ps:1`` (job:index of the worker, then of the ps) -> task indices."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise ConfigError(
            f"--pair {text!r}: expected WORKER_JOB:INDEX,PS_JOB:INDEX, e.g. worker:0,ps:0"
        )
    indices = []
    for part in parts:
        job, _, number = part.partition(":")
        matches = [
            i
            for i, t in enumerate(trace.tasks)
            if t.job == job and number.isdigit() and t.index == int(number)
        ]
        if not matches:
            names = ", ".join(f"{t.job}:{t.index}" for t in trace.tasks)
            raise ConfigError(f"--pair {text!r}: no task {part!r} in the trace (tasks: {names})")
        indices.append(matches[0])
    return indices[0], indices[1]


def _with_pair_outstanding(mapped: Sequence[_Mapped]) -> list[int]:
    """For each call, in order: earlier calls of its pair still open when it started."""
    open_ends: dict[tuple[int, int], list[int]] = {}
    result = []
    for m in mapped:
        pair = (m.client_task, m.server_task)
        ends = [end for end in open_ends.get(pair, []) if end > m.rpc.start_ns]
        result.append(len(ends))
        ends.append(m.rpc.end_ns)
        open_ends[pair] = ends
    return result


def _timed_call(mapped: _Mapped, server_index: int, step_start_ns: int) -> TimedCall:
    rpc = mapped.rpc
    start = max(rpc.start_ns - step_start_ns, 0)
    response_start = max(rpc.response_start_ns - step_start_ns, start)
    return TimedCall(
        server=server_index,
        reversed_direction=mapped.reversed_direction,
        carries_tensor=rpc.method in TENSOR_METHODS,
        start_ns=start,
        response_start_ns=response_start,
        end_ns=max(rpc.end_ns - step_start_ns, response_start),
        source_op=source_op(rpc.tensor.edge_name) if rpc.tensor is not None else "",
    )


def _gradient_arrivals(timed: Iterable[TimedCall]) -> list[int]:
    """When the step's gradients (its reversed tensor calls: a ps pulling a worker's
    tensor) arrived at their ps (``infer_dependencies``' ``round_gradient_arrivals``)."""
    return [c.end_ns for c in timed if c.reversed_direction and c.carries_tensor]


def _step_dependencies(
    mapped: Sequence[_Mapped], roles: TraceRoles, step_start_ns: int, *, rounds: bool = False
) -> list[Dependencies]:
    """Each call's dependencies, inferred per client task over its calls of the step;
    in a round, a worker's TF1 sync token follows every worker's gradients."""
    by_client: dict[int, list[int]] = {}
    for position, m in enumerate(mapped):
        by_client.setdefault(m.client_task, []).append(position)
    timed = [_timed_call(m, roles.server_index(m.server_task), step_start_ns) for m in mapped]
    gradients = _gradient_arrivals(timed) if rounds else []
    result: list[Dependencies | None] = [None] * len(mapped)
    for client, positions in by_client.items():
        inferred = infer_dependencies(
            [timed[p] for p in positions],
            round_gradient_arrivals=() if client in roles.side_clients else gradients,
        )
        for position, dependencies in zip(positions, inferred, strict=True):
            result[position] = dependencies
    return [d for d in result if d is not None]


@dataclass(frozen=True, slots=True)
class _WorkerStep:
    """One client's calls in one captured step, as the captured paths need them."""

    #: Position in ``trace.steps``.
    number: int
    client: int
    period_ns: int
    #: Where the steps are rounds: what followed the round's last arrival until its
    #: period ended (``WorkloadStep.round_tail_ns``); None otherwise.
    round_tail_ns: int | None
    own: list[_Mapped]
    timed: list[TimedCall]
    #: Where the steps are rounds: when every worker's gradients arrived at their ps
    #: (``infer_dependencies``' ``round_gradient_arrivals``); empty otherwise.
    gradient_arrivals: tuple[int, ...] = ()


def _worker_steps(trace: Trace) -> Iterator[_WorkerStep]:
    """Each client's calls and their timings, per captured step."""
    roles = trace_roles(trace)
    mapped_steps, _ = _mapped_steps(trace, roles)
    rounds = steps_are_rounds(trace)
    for number, (step, period, mapped) in enumerate(
        zip(trace.steps, _step_periods(trace), mapped_steps, strict=True)
    ):
        timed = [_timed_call(m, roles.server_index(m.server_task), step.start_ns) for m in mapped]
        by_client: dict[int, tuple[list[_Mapped], list[TimedCall]]] = {
            client: ([], []) for client in roles.step_clients
        }
        for call, timing in zip(mapped, timed, strict=True):
            if call.client_task in by_client:
                by_client[call.client_task][0].append(call)
                by_client[call.client_task][1].append(timing)
        # As the replay's (``_round_tail_ns``): arrivals are the tensors
        # (``infer_dependencies``), of every client, side clients too.
        tail = (
            _round_tail_ns((c.end_ns for c in timed if c.carries_tensor), period)
            if rounds
            else None
        )
        gradients = tuple(_gradient_arrivals(timed)) if rounds else ()
        for client, (own, own_timed) in by_client.items():
            if own_timed:
                yield _WorkerStep(number, client, period, tail, own, own_timed, gradients)


def captured_critical_paths(trace: Trace) -> list[tuple[int, str, StepPath]]:
    """Each worker's critical path in each captured step: (step index, task name, path).

    The trace replayed onto itself under the dependency model (``dependencies``):
    the compute gaps and transfers along the chain of binding waits.
    """
    return [
        (
            trace.steps[step.number].index,
            trace.task_name(step.client),
            captured_critical_path(
                step.timed,
                period_ns=step.period_ns,
                round_tail_ns=step.round_tail_ns,
                round_gradient_arrivals=step.gradient_arrivals,
            ),
        )
        for step in _worker_steps(trace)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapturedSegment:
    """A stretch of a worker's captured critical path, in trace time (ns from capture start)."""

    start_ns: int
    end_ns: int
    #: The transfer's RPC, as an index into its step's ``rpcs``; -1 for compute.
    rpc_index: int


def captured_path_segments(trace: Trace) -> list[tuple[int, int, tuple[CapturedSegment, ...]]]:
    """Each worker's critical path per captured step, as stretches of compute and transfer.

    Returns (step position in ``trace.steps``, worker task, segments in time
    order).  ``TraceError`` if the trace has nothing to replay.
    """
    result = []
    for step in _worker_steps(trace):
        begin = trace.steps[step.number].start_ns
        segments = tuple(
            CapturedSegment(
                start_ns=begin + segment.start_ns,
                end_ns=begin + segment.end_ns,
                rpc_index=step.own[segment.call].rpc_index if segment.call >= 0 else -1,
            )
            for segment in captured_critical_path_segments(
                step.timed,
                period_ns=step.period_ns,
                round_tail_ns=step.round_tail_ns,
                round_gradient_arrivals=step.gradient_arrivals,
            )
        )
        result.append((step.number, step.client, segments))
    return result


def _step_periods(trace: Trace) -> list[int]:
    periods = []
    for number, step in enumerate(trace.steps):
        if number + 1 < len(trace.steps):
            periods.append(max(trace.steps[number + 1].start_ns - step.start_ns, 0))
        else:
            periods.append(step.duration_ns)
    return periods


def _pair_only(
    trace: Trace,
    roles: TraceRoles,
    steps: list[list[_Mapped]],
    dropped: int,
    pair: tuple[int, int] | None,
) -> tuple[tuple[int, int], list[list[_Mapped]], int]:
    """The steps' RPCs between one (worker, ps) pair (default: ``choose_pair``), and the
    dropped count grown by the others.  ConfigError for a pair that is not one."""
    if pair is None:
        pair = choose_pair(trace, roles)
    elif pair[1] not in _pair_servers(roles) or pair[0] not in roles.step_clients:
        raise ConfigError(
            f"--pair: {trace.task_name(pair[0])} -> {trace.task_name(pair[1])} is not a "
            "(worker, ps) pair of this trace"
        )
    dropped += sum(1 for step in steps for m in step if (m.client_task, m.server_task) != pair)
    steps = [[m for m in step if (m.client_task, m.server_task) == pair] for step in steps]
    if not any(steps):
        raise ConfigError(
            f"--pair: {trace.task_name(pair[0])} and {trace.task_name(pair[1])} "
            "exchange no RPCs in the trace's steps"
        )
    return pair, steps, dropped


#: How far a step's last tensor transfer may run into the next step, as a share of the
#: step's period, for the steps still to be rounds (``steps_are_rounds``).
ROUND_OVERLAP_SHARE = 0.05


def steps_are_rounds(trace: Trace) -> bool:
    """Whether every tensor transfer of each step ended before any of the next began,
    give or take ``ROUND_OVERLAP_SHARE`` of the step's period.

    Control calls (the coordinator's ``Enqueue`` of the next round) are left
    out: they announce the round, they are not its traffic.  Such steps are
    rounds separated by a barrier (a synchronous coordinator joins every
    worker's step before scheduling the next round), so a replay
    must not let one worker start a round before the others finished theirs.
    The barrier of tf1-ps (``SyncReplicasOptimizer``'s token queue) is looser: a
    worker may take its token and begin while a ps still pulls the other's last
    gradient (9.9 ms into a 400 ms step in one loopback capture, once in seven
    steps), so an overlap that small does not undo the rounds: without the
    barrier the replayed workers drift apart, which training's do not.  Needs at
    least two steps to tell.
    """
    if len(trace.steps) < 2:
        return False
    for step, following in itertools.pairwise(trace.steps):
        ends = [r.end_ns for r in step.rpcs if r.method in TENSOR_METHODS]
        starts = [r.start_ns for r in following.rpcs if r.method in TENSOR_METHODS]
        if not ends or not starts:
            return False
        period = following.start_ns - step.start_ns
        if max(ends) - min(starts) > ROUND_OVERLAP_SHARE * max(period, 0):
            return False
    return True


def _round_tail_ns(arrival_offsets: Iterable[int], period_ns: int) -> int:
    """What followed a round's last arrival (offsets from its start) until its period ended."""
    return max(period_ns - max(arrival_offsets, default=period_ns), 0)


def _arrivals(calls: Sequence[Call]) -> Iterator[int]:
    """When each call's data arrived, for the calls others wait for (``Dependencies``)."""
    for call in calls:
        if call.dependencies is not None and call.dependencies.is_arrival:
            yield call.dependencies.arrival_offset_ns


def inexact_sizes(pairs: Iterable[tuple[tuple[int, int], tuple[int, int]]]) -> InexactSizes | None:
    """What differs between traced and replayed (request, response) sizes, or None."""
    changes: Counter[tuple[int, int]] = Counter()
    calls = traced = replayed = 0
    for (traced_request, traced_response), (request, response) in pairs:
        if (traced_request, traced_response) == (request, response):
            continue
        calls += 1
        traced += traced_request + traced_response
        replayed += request + response
        for before, after in ((traced_request, request), (traced_response, response)):
            if before != after:
                changes[(before, after)] += 1
    if not calls:
        return None
    ranked = sorted(changes.items(), key=lambda item: (-item[1], item[0]))
    examples = ", ".join(f"{b} B -> {a} B x{n}" for (b, a), n in ranked[:_INEXACT_EXAMPLES])
    if len(ranked) > _INEXACT_EXAMPLES:
        examples += ", ..."
    return InexactSizes(
        calls_per_pass=calls, traced_bytes=traced, replayed_bytes=replayed, examples=examples
    )


def _size_pairs(
    mapped: Sequence[_Mapped], calls: Sequence[Call]
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Each call's traced and replayed (request, response) sizes, for ``inexact_sizes``."""
    return [
        ((m.request_bytes, m.response_bytes), (c.request_bytes, c.response_bytes))
        for m, c in zip(mapped, calls, strict=True)
    ]


#: How many kinds of size change ``inexact_sizes`` names.
_INEXACT_EXAMPLES = 3


def _step_calls(
    trace_step: Step,
    mapped: Sequence[_Mapped],
    roles: TraceRoles,
    mode: Mode,
    *,
    point_to_point: bool,
    rounds: bool = False,
) -> tuple[Call, ...]:
    """One trace step's mapped RPCs as calls (one worker's when ``point_to_point``)."""
    outstanding = _with_pair_outstanding(mapped)
    dependencies = _step_dependencies(mapped, roles, trace_step.start_ns, rounds=rounds)
    return tuple(
        pull_call(
            method=m.rpc.method,
            request_bytes=m.request_bytes,
            response_bytes=m.response_bytes,
            mode=mode,
            tensor_name=m.rpc.tensor.edge_name if m.rpc.tensor else "",
            server_index=roles.server_index(m.server_task),
            worker_index=0 if point_to_point else roles.client_index(m.client_task),
            step=trace_step.index,
            offset_ns=max(m.rpc.start_ns - trace_step.start_ns, 0),
            outstanding_at_start=count,
            reversed_direction=m.reversed_direction,
            dependencies=deps,
            rpc_index=m.rpc_index,
        )
        for m, count, deps in zip(mapped, outstanding, dependencies, strict=True)
    )


def _tasks_description(
    trace: Trace, roles: TraceRoles, pair: tuple[int, int] | None
) -> dict[str, ParameterValue]:
    """The tasks a workload's description names: its P2P ``pair``, else every client and
    server task of a PS-throughput replay."""
    if pair is not None:
        return {"pair": f"{trace.task_name(pair[0])}->{trace.task_name(pair[1])}"}
    return {
        "client_tasks": ",".join(trace.task_name(t) for t in roles.client_tasks),
        "side_clients": ",".join(trace.task_name(t) for t in roles.side_clients),
        "stand_in_servers": ",".join(trace.task_name(t) for t in roles.stand_in_servers),
    }


def trace_workload(
    trace: Trace,
    benchmark: Benchmark,
    *,
    mode: Mode,
    pair: tuple[int, int] | None = None,
    source: str = "trace",
    whole_steps: WholeSteps = WHOLE_STEPS,
) -> Workload:
    """The trace's steady-state steps as one benchmark's calls (docs/design.md#replaying-a-trace).

    P2P benchmarks replay one (worker, ps) pair, ``pair`` as trace task
    indices (default: ``choose_pair``); PS throughput replays every worker
    against every ps, and with ``whole_steps`` the ps-to-ps and chief-to-worker
    calls too (module docstring).  Every call is pull-shaped and keeps the
    trace's method.
    """
    roles = trace_roles(trace, source=source, whole_steps=whole_steps)
    steps, dropped = _mapped_steps(trace, roles)
    dropped_bytes, dropped_kinds = unreplayed_summary(trace, roles)
    point_to_point = benchmark is not Benchmark.PS_THROUGHPUT
    if point_to_point:
        pair, steps, dropped = _pair_only(trace, roles, steps, dropped, pair)
    step_compute = calibration_step_ns(trace.metadata.extra) or 0
    rounds = not point_to_point and steps_are_rounds(trace)
    workload_steps = []
    #: (traced, replayed) (request, response) sizes of every call, to find inexact ones.
    sizes: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for trace_step, period, mapped in zip(trace.steps, _step_periods(trace), steps, strict=True):
        calls = _step_calls(
            trace_step, mapped, roles, mode, point_to_point=point_to_point, rounds=rounds
        )
        # PS throughput keeps every trace step, even one without calls (a pass is
        # every step once, for every worker); a pair keeps the steps it talks in.
        if calls or not point_to_point:
            workload_steps.append(
                WorkloadStep(
                    index=trace_step.index,
                    calls=calls,
                    period_ns=period,
                    step_compute_ns=step_compute,
                    round_tail_ns=_round_tail_ns(_arrivals(calls), period) if rounds else None,
                )
            )
        sizes += _size_pairs(mapped, calls)
    description: dict[str, ParameterValue] = {
        "trace_steps": len(trace.steps),
        "calls_per_pass": sum(len(s.calls) for s in workload_steps),
        "reversed_calls_per_pass": sum(
            1 for s in workload_steps for c in s.calls if c.reversed_direction
        ),
        "dropped_rpcs_per_pass": dropped,
        "dropped_bytes_per_pass": dropped_bytes,
        "dropped_rpcs": dropped_kinds,
        "whole_steps": whole_steps.describe(),
        "ps": len(_pair_servers(roles)),
        "workers": 1 if point_to_point else len(roles.step_clients),
        "server_tasks": ",".join(trace.task_name(t) for t in roles.server_tasks),
        "shape": Shape.PULL.value,
        "round_barrier": rounds,
    }
    description.update(_tasks_description(trace, roles, pair if point_to_point else None))
    return Workload(
        benchmark=benchmark,
        source="trace",
        mode=mode,
        steps=tuple(workload_steps),
        # A pair's server is a ps, and a P2P replay needs no stand-ins.
        server_count=len(_pair_servers(roles) if point_to_point else roles.server_tasks),
        worker_count=1 if point_to_point else len(roles.client_tasks),
        description=tuple(description.items()),
        round_barrier=bool(description["round_barrier"]),
        inexact_sizes=inexact_sizes(sizes),
        side_workers=()
        if point_to_point
        else tuple(roles.client_index(t) for t in roles.side_clients),
        client_tasks=() if point_to_point else tuple(trace.tasks[t] for t in roles.client_tasks),
        server_tasks=() if point_to_point else tuple(trace.tasks[t] for t in roles.server_tasks),
    )
