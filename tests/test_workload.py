"""Workloads from the paper's generators and from traces, message layouts, and pacing (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench import trace_files
from tf_grpc_bench.critical_path import captured_critical_paths
from tf_grpc_bench.dependencies import (
    Dependencies,
    TimedCall,
    is_sync_token,
    is_variable_read,
    source_op,
)
from tf_grpc_bench.errors import ConfigError, TraceError
from tf_grpc_bench.protos import bench_pb2
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload, trace_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig, GeneratorKind, generate_payloads
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.messages import (
    ECHO_METHOD,
    PUSH_METHOD,
    ack_message_bytes,
    pull_response_content_bytes,
    uint_field_bytes,
)
from tf_grpc_bench.replay.core.pacing import (
    Pacing,
    Timing,
    may_issue,
    next_step_begin_ns,
    release_time_ns,
)
from tf_grpc_bench.replay.core.synthetic import all_pairs_echo, pair_echoes, pair_pushes
from tf_grpc_bench.replay.core.trace_workload import (
    cluster_workload,
    outstanding_per_pair,
    pair_workload,
)
from tf_grpc_bench.replay.core.trace_workload import trace_workload as workload_of_trace
from tf_grpc_bench.replay.core.workload import (
    Call,
    Mode,
    Shape,
    Workload,
    WorkloadStep,
    ack_call,
    echo_call,
    pull_call,
)
from tf_grpc_bench.replay.transport.wire import (
    PayloadBytes,
    serialized_payload,
    serialized_pull_request,
)
from tf_grpc_bench.sizes import SizeCategory
from tf_grpc_bench.trace import RECV_TENSOR, Rpc, RunMetadata, Step, Task, TensorInfo, Trace
from tf_grpc_bench.trace_mapping import (
    WHOLE_STEPS,
    WORKERS_AND_PS_ONLY,
    MappedRpc,
    WholeSteps,
    arrival_tail_ns,
    choose_pair,
    map_steps,
    parse_pair,
    steps_are_rounds,
    timed_call,
    trace_roles,
)

from .conftest import make_trace

RUN_GRAPH = "/tensorflow.WorkerService/RunGraph"


def _rpc(method: str, caller: int, callee: int, request: int, response: int, start: int) -> Rpc:
    return Rpc(
        method=method,
        caller_task=caller,
        callee_task=callee,
        request_bytes=request,
        response_bytes=response,
        start_ns=start,
        end_ns=start + 1_000,
    )


def _ps_trace() -> Trace:
    """ps:0, ps:1, worker:0, worker:1, chief:0.  Per step: weights pulled by workers,
    gradients pulled by the ps from the workers, chief control calls to workers, ps-to-ps."""
    tasks = (
        Task(job="ps", index=0),
        Task(job="ps", index=1),
        Task(job="worker", index=0),
        Task(job="worker", index=1),
        Task(job="chief", index=0),
    )
    steps = []
    for number in range(2):
        base = 1_000_000 * (number + 1)
        rpcs = (
            _rpc(RECV_TENSOR, 2, 0, 120, 4_000_000, base + 0),  # worker:0 pulls from ps:0
            _rpc(RECV_TENSOR, 2, 0, 121, 300, base + 100),  # overlapping: outstanding 1
            _rpc(RECV_TENSOR, 3, 1, 122, 2_000, base + 200),  # worker:1 pulls from ps:1
            _rpc(RECV_TENSOR, 0, 2, 130, 4_000_000, base + 3_000),  # ps:0 pulls worker:0's grad
            _rpc(RUN_GRAPH, 4, 2, 500, 60, base + 5_000),  # chief -> worker: dropped
            _rpc(RECV_TENSOR, 0, 1, 90, 7, base + 6_000),  # ps -> ps: dropped
        )
        steps.append(Step(index=number, start_ns=base, end_ns=base + 900_000, rpcs=rpcs))
    return Trace(metadata=RunMetadata(model="toy"), tasks=tasks, steps=tuple(steps))


# --------------------------------------------------------------------------
# Synthetic workloads.


@pytest.mark.parametrize("mode", list(Mode))
def test_synthetic_latency_echoes_each_generated_payload(mode: Mode) -> None:
    generator = GeneratorConfig(kind=GeneratorKind.SKEW, payload_count=4)
    workload = synthetic_workload(Benchmark.P2P_LATENCY, generator, mode=mode)
    payloads = generate_payloads(generator)
    assert [c.buffers for c in workload.calls] == list(payloads)
    cache = PayloadBytes()
    for call, payload in zip(workload.calls, payloads, strict=True):
        assert call.shape is Shape.ECHO and call.method == ECHO_METHOD
        assert call.request_bytes == call.response_bytes
        if mode is Mode.NON_SERIALIZED:
            assert call.request_bytes == sum(payload)
        else:
            assert call.request_bytes == serialized_payload(payload, cache).ByteSize()


@pytest.mark.parametrize("mode", list(Mode))
def test_synthetic_bandwidth_pushes_payloads_and_expects_a_small_ack(mode: Mode) -> None:
    workload = synthetic_workload(Benchmark.P2P_BANDWIDTH, GeneratorConfig(), mode=mode)
    for call in workload.calls:
        assert call.shape is Shape.ACK and call.method == PUSH_METHOD
        if mode is Mode.NON_SERIALIZED:
            assert call.response_bytes == 8
        else:
            expected = bench_pb2.Ack(received_bytes=call.request_bytes).ByteSize()
            assert call.response_bytes == expected == ack_message_bytes(call.request_bytes)


def test_synthetic_throughput_sends_every_payload_from_every_worker_to_every_ps() -> None:
    generator = GeneratorConfig(payload_count=3)
    workload = synthetic_workload(
        Benchmark.PS_THROUGHPUT, generator, mode=Mode.NON_SERIALIZED, ps_count=3, worker_count=2
    )
    assert workload.server_count == 3 and workload.worker_count == 2
    pairs = [(c.worker_index, c.server_index) for c in workload.calls]
    assert sorted(set(pairs)) == [(w, s) for w in range(2) for s in range(3)]
    assert all(pairs.count(pair) == 3 for pair in set(pairs))
    assert len(workload.for_worker(1).calls) == 9
    assert {c.worker_index for c in workload.for_worker(1).calls} == {1}


def test_point_to_point_synthetic_workloads_use_one_worker_and_one_ps() -> None:
    workload = synthetic_workload(
        Benchmark.P2P_LATENCY, GeneratorConfig(), mode=Mode.NON_SERIALIZED, ps_count=4
    )
    assert workload.server_count == 1 and workload.servers_used == (0,)


def test_zero_ps_or_workers_is_refused() -> None:
    with pytest.raises(ConfigError, match="--ps"):
        synthetic_workload(
            Benchmark.PS_THROUGHPUT, GeneratorConfig(), mode=Mode.SERIALIZED, ps_count=0
        )
    with pytest.raises(ConfigError, match="--workers"):
        synthetic_workload(
            Benchmark.PS_THROUGHPUT, GeneratorConfig(), mode=Mode.SERIALIZED, worker_count=0
        )


@pytest.mark.parametrize("build", [pair_echoes, pair_pushes, all_pairs_echo])
def test_each_synthetic_builder_refuses_zero_ps_or_workers_and_defaults_to_one_of_each(
    build: Callable[..., Workload],
) -> None:
    generator = GeneratorConfig(payload_count=2)
    with pytest.raises(ConfigError) as refused:
        build(Benchmark.PS_THROUGHPUT, generator, mode=Mode.SERIALIZED, ps_count=0)
    assert str(refused.value) == "--ps must be >= 1, got 0"
    with pytest.raises(ConfigError) as refused:
        build(Benchmark.PS_THROUGHPUT, generator, mode=Mode.SERIALIZED, worker_count=0)
    assert str(refused.value) == "--workers must be >= 1, got 0"
    # The benchmark it is given, one worker and one ps unless told otherwise: 2 calls.
    workload = build(Benchmark.P2P_BANDWIDTH, generator, mode=Mode.NON_SERIALIZED)
    assert workload.benchmark is Benchmark.P2P_BANDWIDTH
    assert (workload.server_count, workload.worker_count) == (1, 1)
    assert len(workload.steps[0].calls) == 2
    assert {(c.server_index, c.worker_index) for c in workload.steps[0].calls} == {(0, 0)}


# --------------------------------------------------------------------------
# Serialized pull layouts agree with real protobuf encoding.


@settings(max_examples=300, deadline=None)
@given(
    request_bytes=st.integers(0, 70_000),
    response_bytes=st.integers(0, 3_000_000),
    name=st.text(max_size=40),
)
def test_serialized_pull_messages_encode_to_the_sizes_the_call_states(
    request_bytes: int, response_bytes: int, name: str
) -> None:
    call = pull_call(
        method=RECV_TENSOR,
        request_bytes=request_bytes,
        response_bytes=response_bytes,
        mode=Mode.SERIALIZED,
        tensor_name=name,
    )
    request = serialized_pull_request(
        call.request_bytes, call.response_bytes, call.tensor_name, PayloadBytes()
    )
    assert request.ByteSize() == call.request_bytes
    response = bench_pb2.PullResponse(content=bytes(request.response_bytes))
    assert response.ByteSize() == call.response_bytes
    # Exact, or one byte short where protobuf cannot encode the length (1 and 2 B: empty).
    if response_bytes > 2:
        assert response_bytes - 1 <= call.response_bytes <= response_bytes
    else:
        assert call.response_bytes == 0
    # The request always carries the response length; padding fills the rest.
    base = uint_field_bytes(request.response_bytes)
    if request_bytes >= base + 3:
        assert request_bytes - 1 <= call.request_bytes <= request_bytes
    else:
        assert base <= call.request_bytes <= max(request_bytes, base)


def test_a_pull_response_length_protobuf_cannot_encode_goes_one_byte_short() -> None:
    # 1 tag byte + 1 length byte + 127 content = 129; 128 content needs 2 length bytes = 131.
    assert pull_response_content_bytes(129) == 127
    assert pull_response_content_bytes(130) == 127
    assert pull_response_content_bytes(131) == 128


def test_non_serialized_pulls_keep_the_exact_sizes() -> None:
    call = pull_call(method="/a.B/C", request_bytes=3, response_bytes=129, mode=Mode.NON_SERIALIZED)
    assert (call.request_bytes, call.response_bytes) == (3, 129)


# --------------------------------------------------------------------------
# From a trace.


def test_roles_make_ps_tasks_servers_and_their_peers_clients() -> None:
    trace = _ps_trace()
    roles = trace_roles(trace, whole_steps=WORKERS_AND_PS_ONLY)
    assert roles.server_tasks == (0, 1)
    assert roles.client_tasks == (2, 3)  # the chief only talks to workers: not a client
    assert roles.side_clients == roles.stand_in_servers == ()


def test_whole_steps_add_side_clients_and_stand_in_servers_after_the_workers_and_ps() -> None:
    trace = _ps_trace()
    roles = trace_roles(trace)
    # worker:0 is called by the chief: a stand-in server of its own after ps:0 and ps:1.
    assert roles.server_tasks == (0, 1, 2) and roles.stand_in_servers == (2,)
    # The workers keep indices 0 and 1; the chief (calls workers only) and ps:0 (calls
    # ps:1) follow as side clients.
    assert roles.client_tasks == (2, 3, 4, 0) and roles.side_clients == (4, 0)
    assert roles.step_clients == (2, 3)
    only_ps_callers = trace_roles(trace, whole_steps=WholeSteps(stand_in_servers=False))
    assert only_ps_callers.server_tasks == (0, 1)
    assert only_ps_callers.client_tasks == (2, 3, 0)


def test_whole_steps_replay_ps_to_ps_and_chief_to_worker_calls_with_their_sizes() -> None:
    trace = _ps_trace()
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert workload.server_count == 3 and workload.worker_count == 4
    assert workload.side_workers == (2, 3)
    described = [
        (c.method, c.worker_index, c.server_index, c.request_bytes, c.response_bytes)
        for c in workload.steps[0].calls
    ]
    assert described[4:] == [
        (RUN_GRAPH, 2, 2, 500, 60),  # chief:0 -> worker:0's stand-in server
        (RECV_TENSOR, 3, 1, 90, 7),  # ps:0's side client -> ps:1
    ]
    assert not any(c.reversed_direction for c in workload.steps[0].calls[4:])
    parameters = workload.parameters()
    assert parameters["calls_per_pass"] == 12
    assert parameters["dropped_rpcs_per_pass"] == parameters["dropped_bytes_per_pass"] == 0
    assert parameters["dropped_rpcs"] == ""
    assert parameters["ps"] == 2 and parameters["workers"] == 2
    assert parameters["side_clients"] == "/job:chief/task:0,/job:ps/task:0"
    assert parameters["stand_in_servers"] == "/job:worker/task:0"
    assert parameters["whole_steps"] == (
        "ps-to-ps by ps clients, calls to workers by stand-in servers"
    )
    # Each side client's calls carry the dependencies inferred over its own calls.
    chief = [c for c in workload.calls if c.worker_index == 2]
    assert all(c.dependencies is not None for c in chief)
    # A P2P replay still needs only the ps servers.
    p2p = trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)
    assert p2p.server_count == 2 and p2p.side_workers == ()


def test_throughput_replays_every_worker_ps_rpc_with_sizes_order_and_fan_out() -> None:
    trace = _ps_trace()
    workload = trace_workload(
        trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED, whole_steps=WORKERS_AND_PS_ONLY
    )
    assert workload.server_count == 2 and workload.worker_count == 2
    assert len(workload.steps) == 2
    step = workload.steps[0]
    described = [
        (c.method, c.worker_index, c.server_index, c.request_bytes, c.response_bytes)
        for c in step.calls
    ]
    assert described == [
        (RECV_TENSOR, 0, 0, 120, 4_000_000),
        (RECV_TENSOR, 0, 0, 121, 300),
        (RECV_TENSOR, 1, 1, 122, 2_000),
        # ps:0 pulled worker:0's gradient: worker:0 sends it to ps:0, sizes swapped.
        (RECV_TENSOR, 0, 0, 4_000_000, 130),
    ]
    assert [c.reversed_direction for c in step.calls] == [False, False, False, True]
    assert [c.offset_ns for c in step.calls] == [0, 100, 200, 3_000]
    assert [c.outstanding_at_start for c in step.calls] == [0, 1, 0, 0]
    assert all(c.shape is Shape.PULL and c.step == 0 for c in step.calls)
    assert step.period_ns == 1_000_000
    parameters = workload.parameters()
    assert parameters["whole_steps"] == "worker <-> ps only"
    assert parameters["dropped_rpcs_per_pass"] == 4  # chief->worker and ps->ps, twice
    # Both directions' bytes: chief->worker 2 x (500 + 60), ps->ps 2 x (90 + 7).
    assert parameters["dropped_bytes_per_pass"] == 1_120 + 194
    assert parameters["dropped_rpcs"] == (
        "chief->worker RunGraph: 2 RPCs, 1120 B; ps->ps RecvTensor: 2 RPCs, 194 B"
    )
    assert parameters["reversed_calls_per_pass"] == 2


def test_each_call_names_the_trace_rpc_it_replays() -> None:
    trace = _ps_trace()
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    for step in workload.steps:
        (trace_step,) = [s for s in trace.steps if s.index == step.index]
        for call in step.calls:
            rpc = trace_step.rpcs[call.rpc_index]
            sizes = (rpc.response_bytes, rpc.request_bytes) if call.reversed_direction else (
                rpc.request_bytes, rpc.response_bytes
            )  # fmt: skip
            assert (call.request_bytes, call.response_bytes) == sizes
            assert rpc.start_ns - trace_step.start_ns == call.offset_ns
    synthetic = synthetic_workload(
        Benchmark.P2P_LATENCY, GeneratorConfig(), mode=Mode.NON_SERIALIZED
    )
    assert all(call.rpc_index == -1 for call in synthetic.calls)


def test_point_to_point_defaults_to_the_pair_that_moved_most_bytes() -> None:
    trace = _ps_trace()
    assert choose_pair(trace) == (2, 0)
    workload = trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)
    assert workload.worker_count == 1
    assert {c.server_index for c in workload.calls} == {0}
    assert len(workload.steps[0].calls) == 3
    assert workload.parameters()["pair"] == "/job:worker/task:0->/job:ps/task:0"


def test_a_chosen_pair_is_replayed_on_its_own_ps_server_index() -> None:
    trace = _ps_trace()
    pair = parse_pair("worker:1,ps:1", trace)
    assert pair == (3, 1)
    workload = trace_workload(trace, Benchmark.P2P_BANDWIDTH, mode=Mode.NON_SERIALIZED, pair=pair)
    assert workload.server_count == 2 and workload.servers_used == (1,)
    assert [c.response_bytes for c in workload.calls] == [2_000, 2_000]


@pytest.mark.parametrize("text", ["worker:0", "worker:9,ps:0", "ps:0,worker:0", "chief:0,ps:0"])
def test_a_pair_that_is_not_a_worker_ps_pair_of_the_trace_is_refused(text: str) -> None:
    trace = _ps_trace()
    with pytest.raises(ConfigError, match="--pair"):
        pair = parse_pair(text, trace)
        trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED, pair=pair)


def test_a_trace_without_ps_serves_every_called_task() -> None:
    tasks = (Task(job="worker", index=0), Task(job="worker", index=1))
    rpcs = (
        _rpc("/tensorflow.WorkerService/RecvBuf", 0, 1, 80, 5_000, 10),
        _rpc("/tensorflow.WorkerService/RecvBuf", 1, 0, 80, 5_000, 20),
    )
    trace = Trace(
        metadata=RunMetadata(),
        tasks=tasks,
        steps=(Step(index=0, start_ns=0, end_ns=100, rpcs=rpcs),),
    )
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert workload.server_count == 2 and workload.worker_count == 2
    assert [(c.worker_index, c.server_index) for c in workload.calls] == [(0, 1), (1, 0)]
    assert not any(c.reversed_direction for c in workload.calls)


def test_a_trace_without_steady_state_rpcs_is_refused() -> None:
    trace = Trace(metadata=RunMetadata(), tasks=(Task(job="ps", index=0),), steps=())
    with pytest.raises(TraceError, match="no RPCs"):
        trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)


def test_the_conftest_trace_replays_every_rpc_in_both_modes() -> None:
    trace = make_trace(steps=3, workers=2, ps=2)
    for mode in Mode:
        workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=mode)
        assert len(workload.calls) == sum(len(s.rpcs) for s in trace.steps)
    raw = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    recorded = [(r.request_bytes, r.response_bytes) for s in trace.steps for r in s.rpcs]
    assert [(c.request_bytes, c.response_bytes) for c in raw.calls] == recorded


# --------------------------------------------------------------------------
# Pacing (pure).


def _call(offset_ns: int = 0, outstanding: int = 0) -> Call:
    return Call(
        shape=Shape.PULL,
        method="/a.B/C",
        request_bytes=1,
        response_bytes=1,
        offset_ns=offset_ns,
        outstanding_at_start=outstanding,
    )


def test_asap_releases_calls_at_once_within_its_window() -> None:
    pacing = Pacing(window=2)
    call = _call()
    assert release_time_ns(pacing, call, call_number=5, step_begin_ns=10, run_begin_ns=0) is None
    assert may_issue(pacing, call, in_flight=1, in_flight_to_server=1)
    assert not may_issue(pacing, call, in_flight=2, in_flight_to_server=0)


def test_recorded_window_keeps_the_traces_per_pair_concurrency() -> None:
    pacing = Pacing(window=None)
    assert may_issue(pacing, _call(outstanding=1), in_flight=5, in_flight_to_server=1)
    assert not may_issue(pacing, _call(outstanding=1), in_flight=5, in_flight_to_server=2)


def test_recorded_pacing_releases_at_absolute_offsets_from_the_step_begin() -> None:
    pacing = Pacing(timing=Timing.RECORDED, window=None, speedup=2.0)
    call = _call(offset_ns=3_000)
    assert release_time_ns(pacing, call, call_number=9, step_begin_ns=100, run_begin_ns=0) == 1_600
    # A step begins at its recorded distance from the previous one, or when that one ends.
    assert (
        next_step_begin_ns(
            pacing, previous_begin_ns=0, previous_end_ns=10, recorded_period_ns=1_000
        )
        == 500
    )
    assert (
        next_step_begin_ns(
            pacing, previous_begin_ns=0, previous_end_ns=900, recorded_period_ns=1_000
        )
        == 900
    )


def test_rate_pacing_spaces_calls_from_the_run_begin() -> None:
    pacing = Pacing(timing=Timing.RATE, rate_per_s=1_000.0, window=None)
    times = [
        release_time_ns(pacing, _call(), call_number=n, step_begin_ns=0, run_begin_ns=50)
        for n in range(3)
    ]
    assert times == [50, 1_000_050, 2_000_050]


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        ({"window": 0}, "--outstanding"),
        ({"timing": Timing.RATE}, "--rate"),
        ({"rate_per_s": 5.0}, "--rate"),
        ({"speedup": 0.0}, "--speedup"),
    ],
)
def test_nonsense_pacing_is_refused_naming_the_flag(
    arguments: dict[str, object], flag: str
) -> None:
    with pytest.raises(ConfigError, match=flag):
        Pacing(**arguments)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Dependencies and rounds.


def test_trace_calls_carry_their_dependencies_per_worker() -> None:
    workload = trace_workload(_ps_trace(), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    step = workload.steps[0]
    worker0 = [c for c in step.calls if c.worker_index == 0]
    # worker:0's two pulls end at +1000 and +1100 ns, before its gradient (start +3000)
    # left: the gradient waits for both; the pulls wait for nothing.
    gradient = next(c for c in worker0 if c.reversed_direction)
    assert gradient.dependencies is not None
    assert gradient.dependencies.after_worker_arrivals == 2
    assert gradient.dependencies.ready_offset_ns == 3_000
    pulls = [c for c in worker0 if not c.reversed_direction]
    assert [c.dependencies.after_worker_arrivals for c in pulls if c.dependencies] == [0, 0]
    # worker:1's pull is ranked among worker:1's arrivals only.
    (pull1,) = [c for c in step.calls if c.worker_index == 1]
    assert pull1.dependencies is not None and pull1.dependencies.arrival_rank == 0


def test_steps_whose_transfers_do_not_overlap_are_rounds_with_a_barrier() -> None:
    trace = _ps_trace()
    assert steps_are_rounds(trace)
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert workload.round_barrier and workload.parameters()["round_barrier"] is True
    # Point-to-point replays have one worker: no barrier.
    assert not trace_workload(
        trace, Benchmark.P2P_BANDWIDTH, mode=Mode.NON_SERIALIZED
    ).round_barrier


def test_a_rounds_tail_is_what_followed_its_last_arrival_of_any_worker() -> None:
    workload = trace_workload(_ps_trace(), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    first, last = workload.steps
    # worker:1's last arrival is its pull (ends +1_200), worker:0's its gradient at the
    # ps (+4_000): worker:1's own tail was mostly its wait for worker:0.
    assert first.period_ns == 1_000_000 and last.period_ns == 900_000
    for step in (first, last):
        arrivals = [
            c.dependencies.arrival_offset_ns
            for c in step.calls
            if c.dependencies is not None and c.dependencies.is_arrival
        ]
        assert max(arrivals) >= 4_000
        assert step.round_tail_ns == step.period_ns - max(arrivals)
        # A worker's part of the workload keeps the round's tail.
        assert workload.for_worker(1).steps[step is last].round_tail_ns == step.round_tail_ns
    # No rounds, no round's tail: one pair's replay, and steps that overlap.
    pair = trace_workload(_ps_trace(), Benchmark.P2P_BANDWIDTH, mode=Mode.NON_SERIALIZED)
    assert all(step.round_tail_ns is None for step in pair.steps)


def _overlapping_trace() -> Trace:
    """``_ps_trace`` with a pull recorded in step 0 that ends 101 us into step 1 (10% of
    step 0's 1 ms period): steps that overlap, not rounds."""
    trace = _ps_trace()
    first, second = trace.steps
    late = _rpc(RECV_TENSOR, 2, 0, 120, 100, second.start_ns + 100_000)
    return Trace(
        metadata=trace.metadata,
        tasks=trace.tasks,
        steps=(
            Step(index=0, start_ns=first.start_ns, end_ns=first.end_ns, rpcs=(*first.rpcs, late)),
            second,
        ),
    )


def test_steps_that_overlap_are_not_rounds() -> None:
    trace = _ps_trace()
    overlapping = _overlapping_trace()
    assert not steps_are_rounds(overlapping)
    first = trace.steps[0]
    assert not steps_are_rounds(Trace(metadata=trace.metadata, tasks=trace.tasks, steps=(first,)))
    workload = trace_workload(overlapping, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert all(step.round_tail_ns is None for step in workload.steps)


def test_captured_paths_of_steps_that_are_not_rounds_keep_each_workers_own_time() -> None:
    overlapping = _overlapping_trace()
    assert not steps_are_rounds(overlapping)
    # No round's tail: what followed a worker's own last arrival is its compute, not a
    # wait for the others.  worker:0, step 0: compute 100, its second pull 1,000, compute
    # 1,900, the gradient 1,000, compute to the late pull (+1,100,000), the pull 1,000.
    # worker:1: compute 200, its pull 1,000, compute to the period's end (+1,000,000).
    assert [
        (p.step_ns, p.compute_ns, p.communication_ns)
        for _, _, p in captured_critical_paths(overlapping)
    ] == [
        (1_101_000, 100 + 1_900 + (1_100_000 - 4_000), 3_000),
        (1_000_000, 200 + (1_000_000 - 1_200), 1_000),
        (900_000, 100 + 1_900 + (900_000 - 4_000), 2_000),
        (900_000, 200 + (900_000 - 1_200), 1_000),
    ]


def test_captured_critical_paths_split_every_worker_step_into_compute_and_communication() -> None:
    trace = _ps_trace()
    paths = captured_critical_paths(trace)
    assert [(index, task) for index, task, _ in paths] == [
        (0, "/job:worker/task:0"),
        (0, "/job:worker/task:1"),
        (1, "/job:worker/task:0"),
        (1, "/job:worker/task:1"),
    ]
    # worker:0, step 0 (offsets from the step start): the pulls are ready at 0 and 100
    # and arrive at 1000 and 1100; the gradient, ready at 3000 (1900 after the last
    # pull arrived), arrives at 4000; the step's period is 1,000,000 (to the next step).
    # The steps are rounds: after the gradient, the 3000 until the round's last arrival
    # (ps:0's pull from ps:1, at 7000) are another client's, then the round's tail.
    _, _, path = paths[0]
    assert path.step_ns == 1_000_000
    assert path.communication_ns == 1_000 + 1_000 + 3_000
    assert path.compute_ns == 100 + 1_900 + (1_000_000 - 7_000)


@pytest.mark.parametrize("name", ["resnet50-tf2ps", "resnet50-tf1ps"])
def test_shipped_traces_take_reads_as_ready_when_asked_and_one_ops_outputs_together(
    name: str,
) -> None:
    trace = trace_files.read_trace(trace_files.shipped_trace_path(name))
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    groups: dict[tuple[int, int, str], list[tuple[int, int, int]]] = {}
    reads = 0
    for step in workload.steps:
        for call in step.calls:
            rpc = trace.steps[call.step].rpcs[call.rpc_index]
            if call.dependencies is None or rpc.tensor is None:
                continue
            op = source_op(rpc.tensor.edge_name)
            begin = trace.steps[call.step].start_ns
            ready = call.dependencies.ready_offset_ns
            if not call.reversed_direction and is_variable_read(op):
                reads += 1
                assert ready == rpc.start_ns - begin
            elif call.reversed_direction and op:
                key = (call.step, call.worker_index, op)
                groups.setdefault(key, []).append(
                    (ready, rpc.start_ns - begin, rpc.response_start_ns - begin)
                )
    assert reads > 1000
    many = [g for g in groups.values() if len(g) > 1]
    # TensorFlow 2's optimizer sends every gradient out of one IdentityN.
    assert any(len(g) > 100 for g in many) is (name == "resnet50-tf2ps")
    for group in many:
        first = min(seen for _, _, seen in group)
        assert all(ready == max(first, asked) for ready, asked, _ in group)


def test_a_tf1_workers_sync_token_follows_every_workers_gradients_in_the_round() -> None:
    """Each worker's sync token (``is_sync_token``) keeps only what followed the round's last
    gradient arrival, of any worker, before it left; no TF2 call has such a wait."""
    for name, tokens_expected in (("resnet50-tf1ps", True), ("resnet50-tf2ps", False)):
        trace = trace_files.read_trace(trace_files.shipped_trace_path(name))
        workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
        assert workload.round_barrier
        roles = trace_roles(trace)
        side = {roles.client_index(task) for task in roles.side_clients}
        tokens = 0
        for step in workload.steps:
            gradients = sorted(
                c.dependencies.arrival_offset_ns
                for c in step.calls
                if c.dependencies is not None and c.reversed_direction and c.dependencies.is_arrival
            )
            for call in step.calls:
                rpc = trace.steps[call.step].rpcs[call.rpc_index]
                op = source_op(rpc.tensor.edge_name) if rpc.tensor is not None else ""
                deps = call.dependencies
                assert deps is not None
                if not is_sync_token(op) or call.worker_index in side:
                    assert deps.others_arrival_offset_ns is None
                    continue
                tokens += 1
                # The latest gradient of any worker that arrived before the token left.
                assert deps.others_arrival_offset_ns == max(
                    g for g in gradients if g < deps.ready_offset_ns
                )
        # A token per worker per step, none in a TF2 trace.
        assert tokens == (2 * len(workload.steps) if tokens_expected else 0)


def test_a_tf1_rounds_tail_follows_its_last_tensor_arrival_not_its_control_calls() -> None:
    """A round's tail is what followed its last arrival others wait for (a tensor's): the
    sync tokens and other control calls that end after it, even past the period, are not
    arrivals (``Dependencies.is_arrival``) and leave the tail as it is."""
    trace = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf1ps"))
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    later_control_calls = 0
    for step in workload.steps:
        deps = [c.dependencies for c in step.calls if c.dependencies is not None]
        last = max(d.arrival_offset_ns for d in deps if d.is_arrival)
        later_control_calls += any(not d.is_arrival and d.arrival_offset_ns > last for d in deps)
        assert step.round_tail_ns == max(step.period_ns - last, 0)
    # The trace has control calls that end after each round's last arrival: the test
    # tells them apart.
    assert later_control_calls == len(workload.steps)


def test_each_step_carries_the_traces_calibrated_compute_and_none_without_one() -> None:
    """Every step of a trace's workload, a cluster's or a pair's, carries the compute of a
    step the trace's calibration measured (``step_compute_ns``); a trace that records none
    gives 0, no compute, not a made-up one."""
    shipped = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf1ps"))
    assert dict(shipped.metadata.extra)["calibration_step_ns"] == "82732143"
    plain = _ps_trace()
    assert "calibration_step_ns" not in dict(plain.metadata.extra)
    for trace, compute in ((shipped, 82_732_143), (plain, 0)):
        for benchmark in (Benchmark.PS_THROUGHPUT, Benchmark.P2P_BANDWIDTH):
            workload = trace_workload(trace, benchmark, mode=Mode.NON_SERIALIZED)
            assert workload.steps
            assert [s.step_compute_ns for s in workload.steps] == [compute] * len(workload.steps)


def test_a_clusters_workload_names_the_task_each_client_and_server_stands_for() -> None:
    """The replay places each of its clients and servers as the trace task it stands for
    (``Workload.client_tasks``, ``server_tasks``, in the replay's order): the workers, then
    the side clients (the chief calling workers, ps:0 calling ps:1); the ps, then the worker
    the chief calls, standing in as a server.  A pair's replay needs no placement."""
    trace = _ps_trace()
    cluster = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert [t.name for t in cluster.client_tasks] == [
        "/job:worker/task:0", "/job:worker/task:1", "/job:chief/task:0", "/job:ps/task:0"
    ]  # fmt: skip
    assert [t.name for t in cluster.server_tasks] == [
        "/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0"
    ]  # fmt: skip
    pair = trace_workload(trace, Benchmark.P2P_BANDWIDTH, mode=Mode.NON_SERIALIZED)
    assert (pair.client_tasks, pair.server_tasks) == ((), ())


def test_a_tf1_token_replayed_by_its_pair_alone_waits_for_no_other_workers_gradients() -> None:
    """One (worker, ps) pair's replay has no round barrier: its sync tokens keep their whole
    compute, and no call waits for other workers' gradients (``others_arrival_offset_ns``)."""
    trace = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf1ps"))
    pair = trace_workload(
        trace,
        Benchmark.P2P_BANDWIDTH,
        mode=Mode.NON_SERIALIZED,
        pair=parse_pair("worker:0,ps:0", trace),
    )
    calls = [c for step in pair.steps for c in step.calls]
    tokens = [
        c
        for c in calls
        if (tensor := trace.steps[c.step].rpcs[c.rpc_index].tensor) is not None
        and is_sync_token(source_op(tensor.edge_name))
    ]
    # The pair holds tokens and gradients (its worker's, pulled by its ps).
    assert tokens and any(c.reversed_direction for c in calls)
    assert all(c.dependencies is not None for c in calls)
    assert all(c.dependencies.others_arrival_offset_ns is None for c in calls)  # type: ignore[union-attr]


# --------------------------------------------------------------------------
# The trace -> workload mapping, for any parameter-server trace.

_JOBS = ("ps", "ps", "worker", "worker", "worker", "chief")


@st.composite
def _any_ps_trace(draw: st.DrawFn) -> Trace:
    """ps:0, ps:1, worker:0..2, chief:0 and random RPCs between any two different tasks."""
    tasks = tuple(
        Task(job=job, index=_JOBS[:i].count(job), address=f"127.0.0.1:{20_000 + i}")
        for i, job in enumerate(_JOBS)
    )
    steps = []
    start = 1_000_000
    for number in range(draw(st.integers(1, 3))):
        drawn = draw(
            st.lists(
                st.tuples(
                    st.sampled_from(range(len(tasks))),
                    st.sampled_from(range(len(tasks))),
                    st.integers(0, 5_000_000),
                    st.integers(0, 5_000_000),
                    st.integers(0, 50_000),
                ),
                min_size=1,
                max_size=12,
            )
        )
        rpcs = tuple(
            _rpc(RECV_TENSOR, caller, callee, request, response, start + offset)
            for caller, callee, request, response, offset in drawn
            if caller != callee
        )
        # Every step has one worker -> ps pull, so the trace always has something to replay.
        rpcs += (_rpc(RECV_TENSOR, 2 + number % 3, number % 2, 100, 1_000, start),)
        steps.append(Step(index=number, start_ns=start, end_ns=start + 100_000, rpcs=rpcs))
        start += 200_000
    return Trace(metadata=RunMetadata(model="any"), tasks=tasks, steps=tuple(steps))


def _replayed_by_hand(rpc: Rpc, trace: Trace, whole: WholeSteps) -> tuple[int, int, bool] | None:
    """(client task, server task, reversed) of an RPC by job names, or None if dropped."""
    caller, callee = trace.tasks[rpc.caller_task].job, trace.tasks[rpc.callee_task].job
    if caller == "ps" and callee != "ps":
        return rpc.callee_task, rpc.caller_task, True  # a ps pulled: the other side pushes
    if callee == "ps" and (caller != "ps" or whole.ps_clients):
        return rpc.caller_task, rpc.callee_task, False
    if caller != "ps" and callee != "ps" and whole.stand_in_servers:
        return rpc.caller_task, rpc.callee_task, False
    return None


_WHOLE_STEPS_CHOICES = st.builds(
    WholeSteps, ps_clients=st.booleans(), stand_in_servers=st.booleans()
)


@settings(max_examples=150, deadline=None)
@given(trace=_any_ps_trace(), whole=_WHOLE_STEPS_CHOICES)
def test_every_rpc_is_replayed_or_counted_as_dropped_and_each_server_moves_its_bytes(
    trace: Trace, whole: WholeSteps
) -> None:
    workload = trace_workload(
        trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED, whole_steps=whole
    )
    parameters = workload.parameters()
    rpcs = [rpc for step in trace.steps for rpc in step.rpcs]
    assert parameters["calls_per_pass"] + parameters["dropped_rpcs_per_pass"] == len(rpcs)
    replayed_bytes = sum(c.request_bytes + c.response_bytes for c in workload.calls)
    all_bytes = sum(r.request_bytes + r.response_bytes for r in rpcs)
    assert replayed_bytes + parameters["dropped_bytes_per_pass"] == all_bytes
    # Dropped: exactly what no replay task can make, by job names: nothing, with whole steps.
    by_hand = [_replayed_by_hand(r, trace, whole) for r in rpcs]
    unreplayable = [r for r, mapped in zip(rpcs, by_hand, strict=True) if mapped is None]
    assert parameters["dropped_rpcs_per_pass"] == len(unreplayable)
    assert parameters["dropped_bytes_per_pass"] == sum(
        r.request_bytes + r.response_bytes for r in unreplayable
    )
    if whole.ps_clients and whole.stand_in_servers:
        assert not unreplayable and parameters["dropped_rpcs"] == ""
    # Each server (a ps, or a stand-in for a called worker or chief) receives in requests
    # and sends in responses exactly what its task did with the tasks the replay has; each
    # client makes exactly its task's calls.
    roles = trace_roles(trace, whole_steps=whole)
    expected: dict[tuple[int, int], list[int]] = {}
    for rpc, mapped in zip(rpcs, by_hand, strict=True):
        if mapped is not None:
            client, server, reversed_direction = mapped
            sizes = (rpc.request_bytes, rpc.response_bytes)
            entry = expected.setdefault((client, server), [0, 0, 0])
            received, sent = sizes[::-1] if reversed_direction else sizes
            entry[0], entry[1], entry[2] = entry[0] + received, entry[1] + sent, entry[2] + 1
    replayed: dict[tuple[int, int], list[int]] = {}
    for call in workload.calls:
        key = (roles.client_tasks[call.worker_index], roles.server_tasks[call.server_index])
        entry = replayed.setdefault(key, [0, 0, 0])
        entry[0] += call.request_bytes
        entry[1] += call.response_bytes
        entry[2] += 1
    assert replayed == expected
    ps_tasks = set(trace.tasks_of_job("ps"))
    assert roles.server_tasks[: len(ps_tasks)] == tuple(sorted(ps_tasks))
    # Training's workers come first; side clients (ps, or calling no ps) record no steps.
    side = {roles.client_tasks[w] for w in workload.side_workers}
    assert side == set(roles.side_clients)
    assert all(
        t in ps_tasks or all(key[1] not in ps_tasks for key in expected if key[0] == t)
        for t in side
    )
    reversed_count = sum(1 for mapped in by_hand if mapped is not None and mapped[2])
    assert parameters["reversed_calls_per_pass"] == reversed_count
    # Within each (client, server) pair of a step, calls keep the trace's order.
    for step in workload.steps:
        for key in {(c.worker_index, c.server_index) for c in step.calls}:
            offsets = [c.offset_ns for c in step.calls if (c.worker_index, c.server_index) == key]
            assert offsets == sorted(offsets)


# --------------------------------------------------------------------------
# One pair of a trace, and what a replay cannot send (worked out by hand on make_trace:
# tasks 0 = ps:0, 1 = ps:1, 2 = worker:0, 3 = worker:1; each worker pulls 21 B, 4 KiB and
# 1 MiB from each ps, 120 B requests).


def test_a_pair_is_named_by_job_and_index() -> None:
    from tf_grpc_bench.trace_mapping import parse_pair

    trace = make_trace(workers=2, ps=2)
    assert parse_pair("worker:1,ps:0", trace) == (3, 0)
    assert parse_pair(" worker:0 , ps:1 ", trace) == (2, 1)
    with pytest.raises(
        ConfigError,
        match=r"^--pair 'worker:1': expected WORKER_JOB:INDEX,PS_JOB:INDEX, e\.g\. worker:0,ps:0$",
    ):
        parse_pair("worker:1", trace)
    for text, part in (
        ("worker:9,ps:0", "worker:9"),
        ("worker:x,ps:0", "worker:x"),
        ("worker:1,ps", "ps"),
    ):
        with pytest.raises(
            ConfigError,
            match=rf"^--pair {text!r}: no task {part!r} in the trace "
            r"\(tasks: ps:0, ps:1, worker:0, worker:1\)$",
        ):
            parse_pair(text, trace)


def test_a_p2p_workload_of_one_pair_drops_the_others() -> None:
    trace = make_trace(steps=2, workers=2, ps=2)
    workload = trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED, pair=(3, 1))
    description = dict(workload.description)
    assert description["pair"] == "/job:worker/task:1->/job:ps/task:1"
    assert description["calls_per_pass"] == 6
    assert description["dropped_rpcs_per_pass"] == 18  # 3 other pairs x 3 RPCs x 2 steps
    assert [c.response_bytes for c in workload.calls] == [21, 4096, 1 << 20] * 2
    assert {(c.server_index, c.worker_index) for c in workload.calls} == {(1, 0)}
    default = trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)
    assert dict(default.description)["pair"] == "/job:worker/task:0->/job:ps/task:0"


def test_a_pair_that_is_not_worker_to_ps_or_exchanges_nothing_is_refused() -> None:
    trace = make_trace(workers=2, ps=2)
    for pair in ((0, 1), (2, 3), (1, 2)):
        names = f"{trace.task_name(pair[0])} -> {trace.task_name(pair[1])}"
        with pytest.raises(
            ConfigError, match=rf"^--pair: {names} is not a \(worker, ps\) pair of this trace$"
        ):
            trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED, pair=pair)
    lonely = make_trace(workers=2, ps=2)
    rpcs = tuple(r for r in lonely.steps[0].rpcs if (r.caller_task, r.callee_task) != (3, 1))
    lonely = Trace(
        metadata=lonely.metadata,
        tasks=lonely.tasks,
        steps=(Step(index=0, start_ns=0, end_ns=10**9, rpcs=rpcs),),
    )
    with pytest.raises(
        ConfigError,
        match=r"^--pair: /job:worker/task:1 and /job:ps/task:1 exchange no RPCs in the "
        r"trace's steps$",
    ):
        trace_workload(lonely, Benchmark.P2P_BANDWIDTH, mode=Mode.NON_SERIALIZED, pair=(3, 1))


def test_one_workers_part_of_a_workload() -> None:
    workload = trace_workload(
        make_trace(workers=2, ps=2), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    second = workload.for_worker(1)
    assert {c.worker_index for c in second.calls} == {1}
    assert len(second.calls) == len(workload.calls) // 2
    assert len(workload.for_worker(0).calls) == len(workload.calls) // 2
    for index in (-1, 2):
        with pytest.raises(ValueError, match=rf"^worker {index} of 2$"):
            workload.for_worker(index)


def test_what_a_replay_cannot_send_is_summed_up_by_kind() -> None:
    from tf_grpc_bench.trace_mapping import unreplayed_summary

    base = make_trace(steps=1, workers=1, ps=2)
    extra = (
        Rpc(
            method="/tensorflow.WorkerService/RecvTensor",
            caller_task=0,
            callee_task=1,
            request_bytes=100,
            response_bytes=900,
        ),  # ps -> ps
        Rpc(
            method="/tensorflow.WorkerService/RecvTensor",
            caller_task=1,
            callee_task=0,
            request_bytes=50,
            response_bytes=50,
        ),
        Rpc(
            method="/tensorflow.eager.EagerService/Enqueue",
            caller_task=3,
            callee_task=2,
            request_bytes=5000,
            response_bytes=0,
        ),  # chief -> worker
    )
    tasks = (*base.tasks, Task(job="chief", index=0))
    step = base.steps[0]
    trace = Trace(
        metadata=base.metadata,
        tasks=tasks,
        steps=(
            Step(index=0, start_ns=step.start_ns, end_ns=step.end_ns, rpcs=(*step.rpcs, *extra)),
        ),
    )
    assert unreplayed_summary(trace) == (0, "")  # whole steps: every kind replayed
    total, text = unreplayed_summary(trace, trace_roles(trace, whole_steps=WORKERS_AND_PS_ONLY))
    assert total == 1100 + 5000
    assert text == "chief->worker Enqueue: 1 RPCs, 5000 B; ps->ps RecvTensor: 2 RPCs, 1100 B"
    assert unreplayed_summary(make_trace()) == (0, "")


# --------------------------------------------------------------------------
# Exact values, worked out by hand (the mutation run of workload.py showed these unpinned).


def test_protobuf_field_sizes_at_each_varint_step() -> None:
    from tf_grpc_bench.replay.core.messages import (
        bytes_field_bytes,
        payload_message_bytes,
        varint_bytes,
    )

    steps = {0: 1, 1: 1, 127: 1, 128: 2, 16_383: 2, 16_384: 3, 2**21 - 1: 3, 2**21: 4}
    assert {value: varint_bytes(value) for value in steps} == steps
    with pytest.raises(ValueError, match=r"^varint of a negative number: -1$"):
        varint_bytes(-1)
    # A singular empty field is not encoded; a repeated one is: tag + length 0.
    assert bytes_field_bytes(0) == 0
    assert bytes_field_bytes(0, repeated=True) == 2
    assert [bytes_field_bytes(n) for n in (1, 127, 128)] == [3, 129, 131]
    assert [uint_field_bytes(n) for n in (0, 1, 127, 128, 16_384)] == [0, 2, 2, 3, 4]
    # Payload{buffers}: 2 (empty) + 12 (10 B) + 203 (200 B: 1 tag, 2 length bytes).
    assert payload_message_bytes((0, 10, 200)) == 217
    assert payload_message_bytes(()) == 0
    assert [ack_message_bytes(n) for n in (0, 217, 16_384)] == [0, 3, 4]


def test_pull_response_lengths_around_each_varint_step() -> None:
    # target -> content: 1 tag + varint(content) + content; 1 and 2 B cannot be encoded.
    expected = {0: 0, 1: 0, 2: 0, 3: 1, 4: 2, 129: 127, 130: 127, 131: 128, 132: 129}
    # 16,386 = 1 + 2 + 16,383; 16,387 would need a content of 16,384, whose length takes
    # 3 bytes (16,388): one byte short.
    expected |= {16_385: 16_382, 16_386: 16_383, 16_387: 16_383, 16_388: 16_384}
    assert {t: pull_response_content_bytes(t) for t in expected} == expected


def test_a_pull_request_keeps_what_fits_of_its_tensor_name_and_pads() -> None:
    from tf_grpc_bench.replay.core.messages import PullRequestLayout, pull_request_layout

    # response_bytes 100 -> 2 B; "abc" -> 5 B; 3 B left: a padding field of 1 B content.
    assert pull_request_layout(10, 100, "abc") == PullRequestLayout(
        response_content_bytes=100, tensor_name="abc", padding_bytes=1, message_bytes=10
    )
    # 8 B: with "abc" 1 B is left and with "ab" 2 B, which no field encodes; "a" leaves 3.
    assert pull_request_layout(8, 100, "abc") == PullRequestLayout(
        response_content_bytes=100, tensor_name="a", padding_bytes=1, message_bytes=8
    )
    # Exactly the name: no padding field.
    assert pull_request_layout(7, 100, "abc") == PullRequestLayout(
        response_content_bytes=100, tensor_name="abc", padding_bytes=0, message_bytes=7
    )
    # Smaller than the response-length field: that field alone, longer than asked.
    assert pull_request_layout(1, 100, "abc") == PullRequestLayout(
        response_content_bytes=100, tensor_name="", padding_bytes=0, message_bytes=2
    )
    assert pull_request_layout(0, 0, "") == PullRequestLayout(
        response_content_bytes=0, tensor_name="", padding_bytes=0, message_bytes=0
    )
    # 130 B with no name cannot be encoded (a 127 B padding is 129, a 128 B one 131):
    # one byte short.  With a 2-character name it fits exactly.
    assert pull_request_layout(130, 0, "") == PullRequestLayout(
        response_content_bytes=0, tensor_name="", padding_bytes=127, message_bytes=129
    )
    assert pull_request_layout(130, 0, "ab") == PullRequestLayout(
        response_content_bytes=0, tensor_name="ab", padding_bytes=124, message_bytes=130
    )


def test_a_tensor_name_is_only_cut_between_whole_characters() -> None:
    from tf_grpc_bench.replay.core.messages import PullRequestLayout, pull_request_layout

    name = "a\u00e9"  # 3 bytes in UTF-8: "a", then 2 for the accented e.
    assert pull_request_layout(5, 0, name).tensor_name == name
    # 4 B: the name's first 2 bytes would split the e; "a" (3 B) leaves 1 B, which no
    # field encodes; so no name and a 2 B padding field.
    assert pull_request_layout(4, 0, name) == PullRequestLayout(
        response_content_bytes=0, tensor_name="", padding_bytes=2, message_bytes=4
    )


def test_a_call_refuses_nonsense_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^method must be a full gRPC path, got 'a\.B/C'$"):
        Call(shape=Shape.PULL, method="a.B/C", request_bytes=1, response_bytes=1)
    for name in (
        "request_bytes",
        "response_bytes",
        "server_index",
        "worker_index",
        "offset_ns",
        "outstanding_at_start",
    ):
        arguments: dict[str, object] = {"request_bytes": 1, "response_bytes": 1, name: -1}
        with pytest.raises(ValueError, match=rf"^{name} must be >= 0, got -1$"):
            Call(shape=Shape.PULL, method="/a.B/C", **arguments)  # type: ignore[arg-type]
        # Zero is allowed.
        Call(shape=Shape.PULL, method="/a.B/C", **{**arguments, name: 0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^buffer sizes must be >= 0$"):
        Call(shape=Shape.ECHO, method="/a.B/C", request_bytes=1, response_bytes=1, buffers=(1, -1))
    for shape in (Shape.ECHO, Shape.ACK):
        with pytest.raises(
            ValueError, match=rf"^a {shape.value} call needs its payload's buffers$"
        ):
            Call(shape=shape, method="/a.B/C", request_bytes=1, response_bytes=1)
    # An empty buffer is a buffer; a pull needs none.
    assert Call(shape=Shape.ECHO, method="/a.B/C", request_bytes=0, response_bytes=0, buffers=(0,))
    pull = Call(shape=Shape.PULL, method="/a.B/C", request_bytes=7, response_bytes=3)
    assert pull.payload_bytes == 7
    assert replace(pull, response_bytes=9).payload_bytes == 9


def _one_call_step(**call: object) -> WorkloadStep:
    arguments: dict[str, object] = {"request_bytes": 1, "response_bytes": 1, **call}
    return WorkloadStep(
        index=0,
        calls=(Call(shape=Shape.PULL, method="/a.B/C", **arguments),),  # type: ignore[arg-type]
    )


def test_a_workload_refuses_nonsense_saying_what() -> None:
    def workload(**changes: object) -> Workload:
        arguments: dict[str, object] = {
            "benchmark": Benchmark.PS_THROUGHPUT,
            "source": "trace",
            "mode": Mode.NON_SERIALIZED,
            "steps": (_one_call_step(),),
            "server_count": 1,
            "worker_count": 2,
            **changes,
        }
        return Workload(**arguments)  # type: ignore[arg-type]

    assert workload().worker_count == 2
    assert workload(source="synthetic").source == "synthetic"
    with pytest.raises(ValueError, match=r"^source must be 'synthetic' or 'trace', got 'x'$"):
        workload(source="x")
    for steps in ((), (WorkloadStep(index=0, calls=()),)):
        with pytest.raises(ValueError, match=r"^a workload needs at least one call$"):
            workload(steps=steps)
    for counts in ({"server_count": 0}, {"worker_count": 0}):
        with pytest.raises(
            ValueError, match=r"^a workload needs at least one server and one worker$"
        ):
            workload(**counts)
    for side in ((2,), (-1,)):
        with pytest.raises(ValueError, match=rf"^side workers \({side[0]},\) of 2$"):
            workload(side_workers=side)
    assert workload(side_workers=(1,)).side_workers == (1,)
    with pytest.raises(ValueError, match=r"^a workload needs a worker that is not a side client$"):
        workload(side_workers=(0, 1))
    with pytest.raises(ValueError, match=r"^call to server 1 of 1$"):
        workload(steps=(_one_call_step(server_index=1),))
    with pytest.raises(ValueError, match=r"^call by worker 2 of 2$"):
        workload(steps=(_one_call_step(worker_index=2),))
    assert workload(steps=(_one_call_step(worker_index=1),)).calls[0].worker_index == 1


def test_a_workers_part_keeps_every_step_and_its_period() -> None:
    steps = (
        WorkloadStep(
            index=4,
            calls=(
                Call(shape=Shape.PULL, method="/a.B/C", request_bytes=1, response_bytes=2),
                Call(
                    shape=Shape.PULL,
                    method="/a.B/C",
                    request_bytes=3,
                    response_bytes=4,
                    server_index=2,
                    worker_index=1,
                ),
            ),
            period_ns=700,
        ),
        WorkloadStep(
            index=5,
            calls=(
                Call(
                    shape=Shape.PULL,
                    method="/a.B/C",
                    request_bytes=5,
                    response_bytes=6,
                    server_index=2,
                ),
            ),
            period_ns=900,
        ),
    )
    workload = Workload(
        benchmark=Benchmark.PS_THROUGHPUT,
        source="trace",
        mode=Mode.NON_SERIALIZED,
        steps=steps,
        server_count=3,
        worker_count=2,
    )
    assert workload.servers_used == (0, 2)
    assert [(s.request_bytes, s.response_bytes) for s in workload.steps] == [(4, 6), (5, 6)]
    second = workload.for_worker(1)
    # The second step has nothing for worker 1, and stays: a pass is every step.
    assert [(s.index, s.period_ns, len(s.calls)) for s in second.steps] == [
        (4, 700, 1),
        (5, 900, 0),
    ]
    assert second.servers_used == (2,)
    assert [c.request_bytes for c in workload.for_worker(0).calls] == [1, 5]


def _two_category_generator(kind: GeneratorKind = GeneratorKind.UNIFORM) -> GeneratorConfig:
    # Uniform over small (10 B) and medium (10 KiB), 3 buffers: S M S, then M S M.
    return GeneratorConfig(
        kind=kind,
        categories=(SizeCategory.MEDIUM, SizeCategory.SMALL),
        buffers_per_payload=3,
        payload_count=2,
    )


def test_synthetic_calls_have_their_payloads_sizes_in_each_mode() -> None:
    generator = _two_category_generator()
    raw = synthetic_workload(Benchmark.P2P_LATENCY, generator, mode=Mode.NON_SERIALIZED)
    assert [(c.buffers, c.request_bytes, c.response_bytes) for c in raw.calls] == [
        ((10, 10_240, 10), 10_260, 10_260),
        ((10_240, 10, 10_240), 20_490, 20_490),
    ]
    # Serialized: a 10 B field is 12 B, a 10 KiB one 10,243 B (2 length bytes).
    serialized = synthetic_workload(Benchmark.P2P_LATENCY, generator, mode=Mode.SERIALIZED)
    assert [(c.request_bytes, c.response_bytes) for c in serialized.calls] == [
        (10_267, 10_267),
        (20_498, 20_498),
    ]
    pushes = synthetic_workload(Benchmark.P2P_BANDWIDTH, generator, mode=Mode.NON_SERIALIZED)
    assert [(c.request_bytes, c.response_bytes) for c in pushes.calls] == [
        (10_260, 8),
        (20_490, 8),
    ]
    # Ack{received_bytes}: 10,267 takes a 2-byte varint, 20,498 a 3-byte one.
    acks = synthetic_workload(Benchmark.P2P_BANDWIDTH, generator, mode=Mode.SERIALIZED)
    assert [(c.request_bytes, c.response_bytes) for c in acks.calls] == [
        (10_267, 3),
        (20_498, 4),
    ]
    assert all(c.step == -1 and c.rpc_index == -1 and c.dependencies is None for c in acks.calls)
    assert [s.index for s in acks.steps] == [-1] and acks.steps[0].period_ns == 0


def test_synthetic_throughput_goes_worker_by_worker_payload_by_payload_to_every_ps() -> None:
    workload = synthetic_workload(
        Benchmark.PS_THROUGHPUT,
        _two_category_generator(),
        mode=Mode.NON_SERIALIZED,
        ps_count=2,
        worker_count=2,
    )
    assert [(c.worker_index, c.request_bytes, c.server_index) for c in workload.calls] == [
        (0, 10_260, 0),
        (0, 10_260, 1),
        (0, 20_490, 0),
        (0, 20_490, 1),
        (1, 10_260, 0),
        (1, 10_260, 1),
        (1, 20_490, 0),
        (1, 20_490, 1),
    ]
    assert all(c.shape is Shape.ECHO for c in workload.calls)
    assert workload.parameters() == {
        "generator": "uniform",
        "categories": "small,medium",
        "buffers": 3,
        "payloads": 2,
        "small_size_bytes": 10,
        "medium_size_bytes": 10_240,
        "large_size_bytes": 1_048_576,
        "seed": 0,
        "random_sizes": False,
        "ps": 2,
        "workers": 2,
        "shape": "echo",
    }
    assert workload.source == "synthetic" and workload.side_workers == ()
    assert not workload.round_barrier and workload.inexact_sizes is None


def test_synthetic_point_to_point_parameters_say_one_ps_one_worker_and_the_skew() -> None:
    workload = synthetic_workload(
        Benchmark.P2P_BANDWIDTH,
        _two_category_generator(GeneratorKind.SKEW),
        mode=Mode.SERIALIZED,
        ps_count=3,
        worker_count=4,
    )
    parameters = workload.parameters()
    assert (parameters["ps"], parameters["workers"]) == (1, 1)
    assert (workload.server_count, workload.worker_count) == (1, 1)
    assert parameters["generator"] == "skew" and parameters["skew_bias"] == "medium"
    assert parameters["shape"] == "ack"
    assert (
        "skew_bias"
        not in synthetic_workload(
            Benchmark.P2P_BANDWIDTH, _two_category_generator(), mode=Mode.SERIALIZED
        ).parameters()
    )


def test_whole_steps_describe_what_they_replay() -> None:
    described = {
        (ps, stand_in): WholeSteps(ps_clients=ps, stand_in_servers=stand_in).describe()
        for ps in (True, False)
        for stand_in in (True, False)
    }
    assert described == {
        (True, True): "ps-to-ps by ps clients, calls to workers by stand-in servers",
        (True, False): "ps-to-ps by ps clients",
        (False, True): "calls to workers by stand-in servers",
        (False, False): "worker <-> ps only",
    }


# --------------------------------------------------------------------------
# From a trace, exact (worked out by hand on the traces named).


def _trace(tasks: tuple[Task, ...], *steps: tuple[int, int, tuple[Rpc, ...]]) -> Trace:
    """A trace of the given tasks and (start, end, rpcs) steps, indexed 0, 1, ..."""
    return Trace(
        metadata=RunMetadata(model="toy"),
        tasks=tasks,
        steps=tuple(
            Step(index=number, start_ns=start, end_ns=end, rpcs=rpcs)
            for number, (start, end, rpcs) in enumerate(steps)
        ),
    )


def test_roles_list_ps_by_index_then_stand_ins_and_clients_by_job_name_and_index() -> None:
    # Tasks deliberately out of order: 0 worker:1, 1 chief:0, 2 ps:1, 3 worker:0, 4 ps:0.
    tasks = (
        Task(job="worker", index=1),
        Task(job="chief", index=0),
        Task(job="ps", index=1),
        Task(job="worker", index=0),
        Task(job="ps", index=0),
    )
    rpcs = (
        _rpc(RECV_TENSOR, 0, 2, 10, 100, 0),  # worker:1 -> ps:1
        _rpc(RECV_TENSOR, 3, 4, 10, 100, 10),  # worker:0 -> ps:0
        _rpc(RUN_GRAPH, 1, 0, 10, 10, 20),  # chief -> worker:1
        _rpc(RUN_GRAPH, 1, 3, 10, 10, 30),  # chief -> worker:0
    )
    trace = _trace(tasks, (0, 10_000, rpcs))
    roles = trace_roles(trace)
    assert roles.server_tasks == (4, 2, 3, 0) and roles.stand_in_servers == (3, 0)
    assert roles.client_tasks == (3, 0, 1) and roles.side_clients == (1,)
    assert roles.ps_job
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert [(c.worker_index, c.server_index) for c in workload.calls] == [
        (1, 1),
        (0, 0),
        (2, 3),
        (2, 2),
    ]
    assert workload.parameters()["server_tasks"] == (
        "/job:ps/task:0,/job:ps/task:1,/job:worker/task:0,/job:worker/task:1"
    )
    assert workload.parameters()["client_tasks"] == (
        "/job:worker/task:0,/job:worker/task:1,/job:chief/task:0"
    )
    assert workload.parameters()["stand_in_servers"] == "/job:worker/task:0,/job:worker/task:1"
    assert workload.parameters()["side_clients"] == "/job:chief/task:0"


def test_without_ps_every_called_task_serves_and_clients_sort_by_job_name() -> None:
    tasks = (Task(job="worker", index=0), Task(job="worker", index=1), Task(job="chief", index=0))
    rpcs = (
        _rpc(RECV_TENSOR, 0, 1, 10, 100, 0),
        _rpc(RECV_TENSOR, 1, 0, 10, 100, 10),
        _rpc(RUN_GRAPH, 2, 0, 10, 10, 20),
    )
    roles = trace_roles(_trace(tasks, (0, 10_000, rpcs)))
    assert roles.server_tasks == (0, 1)
    assert roles.client_tasks == (2, 0, 1) == roles.step_clients
    assert not roles.ps_job and roles.side_clients == roles.stand_in_servers == ()


def test_a_trace_without_a_worker_ps_rpc_is_refused_naming_its_source() -> None:
    tasks = (Task(job="ps", index=0), Task(job="ps", index=1), Task(job="worker", index=0))
    tasks_with_chief = (*tasks, Task(job="chief", index=0))
    ps_to_ps = _trace(tasks, (0, 10_000, (_rpc(RECV_TENSOR, 0, 1, 10, 100, 0),)))
    chief_to_worker = _trace(tasks_with_chief, (0, 10_000, (_rpc(RUN_GRAPH, 3, 2, 10, 10, 0),)))
    for trace in (ps_to_ps, chief_to_worker):
        for whole in (WHOLE_STEPS, WORKERS_AND_PS_ONLY):
            with pytest.raises(
                TraceError,
                match=r"^run\.trace: no RPC between a worker and a ps, nothing to replay$",
            ):
                trace_roles(trace, source="run.trace", whole_steps=whole)
    empty = _trace(tasks, (0, 10_000, ()))
    with pytest.raises(
        TraceError, match=r"^run\.trace: no RPCs in steady-state steps, nothing to replay$"
    ):
        trace_roles(empty, source="run.trace")
    with pytest.raises(TraceError, match=r"^other\.trace: no RPCs in steady-state steps"):
        trace_workload(empty, Benchmark.PS_THROUGHPUT, mode=Mode.SERIALIZED, source="other.trace")


def test_whole_step_parameters_of_the_ps_trace() -> None:
    trace = _ps_trace()
    common = {
        "trace_steps": 2,
        "reversed_calls_per_pass": 2,
        "dropped_bytes_per_pass": 0,
        "dropped_rpcs": "",
        "whole_steps": "ps-to-ps by ps clients, calls to workers by stand-in servers",
        "ps": 2,
        "server_tasks": "/job:ps/task:0,/job:ps/task:1,/job:worker/task:0",
        "shape": "pull",
    }
    throughput = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert throughput.parameters() == {
        **common,
        "calls_per_pass": 12,
        "dropped_rpcs_per_pass": 0,
        "workers": 2,
        "round_barrier": True,
        "client_tasks": "/job:worker/task:0,/job:worker/task:1,/job:chief/task:0,/job:ps/task:0",
        "side_clients": "/job:chief/task:0,/job:ps/task:0",
        "stand_in_servers": "/job:worker/task:0",
    }
    # The pair worker:0 -> ps:0 makes 3 of each step's 6 RPCs; the other 3 count as dropped.
    pair = trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)
    assert pair.parameters() == {
        **common,
        "calls_per_pass": 6,
        "dropped_rpcs_per_pass": 6,
        "workers": 1,
        "round_barrier": False,
        "pair": "/job:worker/task:0->/job:ps/task:0",
    }
    assert (pair.server_count, pair.worker_count) == (2, 1)
    assert all(c.worker_index == 0 and c.server_index == 0 for c in pair.calls)


def test_the_last_steps_period_is_its_own_length() -> None:
    workload = trace_workload(_ps_trace(), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    # Steps start at 1,000,000 and 2,000,000; the second lasts 900,000.
    assert [(s.index, s.period_ns) for s in workload.steps] == [(0, 1_000_000), (1, 900_000)]


def test_throughput_keeps_a_step_without_calls_and_a_pair_keeps_the_steps_it_talks_in() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0), Task(job="chief", index=0))
    trace = _trace(
        tasks,
        (10_000, 15_000, (_rpc(RECV_TENSOR, 1, 0, 10, 100, 10_000),)),
        (20_000, 25_000, (_rpc(RUN_GRAPH, 2, 1, 10, 10, 20_000),)),
        (50_000, 58_000, (_rpc(RECV_TENSOR, 1, 0, 10, 300, 50_000),)),
    )
    throughput = trace_workload(
        trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED, whole_steps=WORKERS_AND_PS_ONLY
    )
    assert [(s.index, s.period_ns, len(s.calls)) for s in throughput.steps] == [
        (0, 10_000, 1),
        (1, 30_000, 0),
        (2, 8_000, 1),
    ]
    assert throughput.parameters()["dropped_rpcs_per_pass"] == 1
    assert throughput.parameters()["dropped_bytes_per_pass"] == 20
    pair = trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)
    assert [(s.index, s.period_ns) for s in pair.steps] == [(0, 10_000), (2, 8_000)]
    assert [c.response_bytes for c in pair.calls] == [100, 300]
    assert [c.step for c in pair.calls] == [0, 2]


def test_outstanding_calls_are_counted_per_pair_and_a_call_ending_as_one_starts_is_not() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0), Task(job="worker", index=1))

    def rpc(caller: int, start: int, end: int) -> Rpc:
        return Rpc(
            method=RECV_TENSOR,
            caller_task=caller,
            callee_task=0,
            request_bytes=10,
            response_bytes=100,
            start_ns=start,
            end_ns=end,
        )

    rpcs = (
        rpc(1, 0, 1_000),
        rpc(2, 100, 5_000),  # the other worker's: not counted for worker:0
        rpc(1, 1_000, 1_500),  # the first ended as this one started: not open
        rpc(1, 1_200, 1_300),
        rpc(1, 1_400, 1_450),  # the 1,000-1,500 call is still open; 1,200-1,300 is not
    )
    workload = trace_workload(
        _trace(tasks, (0, 10_000, rpcs)), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    assert [(c.worker_index, c.offset_ns, c.outstanding_at_start) for c in workload.calls] == [
        (0, 0, 0),
        (1, 100, 0),
        (0, 1_000, 0),
        (0, 1_200, 1),
        (0, 1_400, 1),
    ]


@settings(max_examples=200)
@given(
    calls=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.integers(0, 50),
            st.integers(0, 50),
        ).map(lambda c: (c[0], c[1], c[1] + c[2])),
        max_size=60,
    )
)
def test_outstanding_per_pair_counts_the_earlier_calls_still_open(
    calls: list[tuple[int, int, int]],
) -> None:
    expected = [
        sum(1 for pair, _, end in calls[:i] if pair == calls[i][0] and end > calls[i][1])
        for i in range(len(calls))
    ]
    assert outstanding_per_pair(calls) == expected


def test_a_step_of_200000_overlapping_calls_is_mapped_in_time_linear_in_its_calls() -> None:
    # Every call of the pair is still open when the next starts: the count that took a
    # scan of the pair's open calls for each call (200,000^2 / 2 steps) is a tree's now.
    count = 200_000
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0))
    rpcs = tuple(
        Rpc(
            method=RECV_TENSOR,
            caller_task=1,
            callee_task=0,
            request_bytes=10,
            response_bytes=100,
            start_ns=n,
            end_ns=10 * count + n,
        )
        for n in range(count)
    )
    workload = trace_workload(
        _trace(tasks, (0, 20 * count, rpcs)), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    assert [c.outstanding_at_start for c in workload.calls] == list(range(count))


def test_calls_of_the_conftest_trace_carry_names_offsets_and_dependencies() -> None:
    from tf_grpc_bench.dependencies import Dependencies

    # One worker pulls 21 B, 4 KiB and 1 MiB from one ps, 2,000 ns apart; each response
    # starts 500 ns and ends 1,000 ns after its request.
    workload = trace_workload(
        make_trace(steps=1), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    calls = workload.calls
    assert [c.tensor_name for c in calls] == ["edge_0_w", "edge_1_w", "edge_2_w"]
    assert [c.offset_ns for c in calls] == [0, 2_000, 4_000]
    assert [c.rpc_index for c in calls] == [0, 1, 2]
    # A pull's data leaves the ps when the response starts; it waits for the worker's
    # pulls that arrived before its request left.  The three tensors are outputs of
    # one op (``w``), which were ready together when the first left (500 ns): the
    # later two are ready as soon as they are asked for.
    assert [c.dependencies for c in calls] == [
        Dependencies(
            ready_offset_ns=500 if n == 0 else 2_000 * n,
            arrival_offset_ns=1_000 + 2_000 * n,
            lands_on_worker=True,
            transfer_offset_ns=500 + 2_000 * n,
            is_arrival=True,
            arrival_rank=n,
            after_worker_arrivals=n,
            after_server_arrivals=0,
        )
        for n in range(3)
    ]


def test_a_control_calls_data_leaves_with_its_request_and_an_early_rpc_starts_its_step() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0))
    rpcs = (
        # Began 50 ns before its step (a clock's skew): offset 0.
        Rpc(
            method=RECV_TENSOR,
            caller_task=1,
            callee_task=0,
            request_bytes=10,
            response_bytes=100,
            start_ns=950,
            response_start_ns=1_200,
            end_ns=1_300,
        ),
        Rpc(
            method=RUN_GRAPH,
            caller_task=1,
            callee_task=0,
            request_bytes=10,
            response_bytes=10,
            start_ns=1_400,
            response_start_ns=1_700,
            end_ns=1_800,
        ),
    )
    workload = trace_workload(
        _trace(tasks, (1_000, 5_000, rpcs)), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    pull, control = workload.calls
    assert pull.offset_ns == 0 and control.offset_ns == 400
    assert pull.dependencies is not None and control.dependencies is not None
    assert (pull.dependencies.ready_offset_ns, pull.dependencies.arrival_offset_ns) == (200, 300)
    # Not a tensor: its data is the request; nobody waits for it; it waits for the pull.
    assert (control.dependencies.ready_offset_ns, control.dependencies.arrival_offset_ns) == (
        400,
        800,
    )
    assert not control.dependencies.is_arrival
    assert control.dependencies.after_worker_arrivals == 1


def test_captured_path_segments_of_the_ps_trace_in_trace_time() -> None:
    from tf_grpc_bench.critical_path import CapturedSegment, captured_path_segments

    segments = captured_path_segments(_ps_trace())
    assert [(number, task) for number, task, _ in segments] == [(0, 2), (0, 3), (1, 2), (1, 3)]
    # worker:0, step 0 (starts at 1,000,000): compute to its second pull's request
    # (+100), that pull (rpc 1) to +1,100, compute to the gradient's push (+3,000),
    # the push (rpc 3) to +4,000, then the round's tail (993,000: what followed its
    # last arrival, the ps-to-ps pull's at +7,000).
    assert segments[0][2] == (
        CapturedSegment(start_ns=1_000_000, end_ns=1_000_100, rpc_index=-1),
        CapturedSegment(start_ns=1_000_100, end_ns=1_001_100, rpc_index=1),
        CapturedSegment(start_ns=1_001_100, end_ns=1_003_000, rpc_index=-1),
        CapturedSegment(start_ns=1_003_000, end_ns=1_004_000, rpc_index=3),
        CapturedSegment(start_ns=1_004_000, end_ns=1_997_000, rpc_index=-1),
    )
    # worker:1, step 1 (starts at 2,000,000, lasts 900,000): its one pull (rpc 2, +200
    # to +1,200) between compute.  The steps are rounds: its tail is the round's, what
    # followed the round's last arrival (the ps-to-ps pull's, at +7,000; as the
    # replay's ``round_tail_ns``), 893,000; the 5,800 before it, worker:1 waited.
    assert segments[3][2] == (
        CapturedSegment(start_ns=2_000_000, end_ns=2_000_200, rpc_index=-1),
        CapturedSegment(start_ns=2_000_200, end_ns=2_001_200, rpc_index=2),
        CapturedSegment(start_ns=2_001_200, end_ns=2_894_200, rpc_index=-1),
    )
    assert (
        trace_workload(_ps_trace(), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
        .steps[1]
        .round_tail_ns
        == 2_894_200 - 2_001_200
    )
    paths = captured_critical_paths(_ps_trace())
    assert [(p.step_ns, p.communication_ns, p.compute_ns) for _, _, p in paths[2:]] == [
        (900_000, 2_000 + 3_000, 898_000 - 3_000),
        (900_000, 1_000 + 5_800, 899_000 - 5_800),
    ]


def _tf1_trace() -> Trace:
    """ps:0, worker:0, worker:1, two rounds of TF1's sync replicas (offsets from each
    step's start): each worker pulls a variable (0 to 1,000); the ps pulls worker:0's
    gradient at 3,000-4,000 and worker:1's at 20,000-21,000; each worker asks for its
    sync token (at 4,500 and 21,500), which leaves the ps at 25,000 (the apply after
    the round's last gradient) and arrives at 26,000.  The second step lasts 30,000."""

    def pull(caller: int, callee: int, times: tuple[int, int, int], edge: str) -> Rpc:
        key = f"/job:ps/task:0;1;/job:worker/task:0;{edge};0:0"
        return Rpc(
            method=RECV_TENSOR,
            caller_task=caller,
            callee_task=callee,
            request_bytes=100,
            response_bytes=1_000,
            start_ns=times[0],
            response_start_ns=times[1],
            end_ns=times[2],
            tensor=TensorInfo(rendezvous_key=key, dtype="DT_FLOAT", shape=(4,), content_bytes=16),
        )

    steps = []
    for number in range(2):
        b = 1_000_000 * (number + 1)
        rpcs = (
            pull(1, 0, (b, b, b + 1_000), "edge_1_w/ReadVariableOp"),
            pull(2, 0, (b, b, b + 1_000), "edge_2_w/ReadVariableOp"),
            pull(0, 1, (b + 3_000, b + 3_000, b + 4_000), "edge_3_gradients/MatMul"),
            pull(0, 2, (b + 20_000, b + 20_000, b + 21_000), "edge_4_gradients/MatMul"),
            pull(1, 0, (b + 4_500, b + 25_000, b + 26_000), "edge_5_sync_token_q_Dequeue"),
            pull(2, 0, (b + 21_500, b + 25_000, b + 26_000), "edge_6_sync_token_q_Dequeue"),
        )
        steps.append(Step(index=number, start_ns=b, end_ns=b + 30_000, rpcs=rpcs))
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0), Task(job="worker", index=1))
    return Trace(metadata=RunMetadata(model="toy"), tasks=tasks, steps=tuple(steps))


def test_a_tf1_traces_captured_paths_count_the_wait_for_the_other_workers_gradients() -> None:
    from tf_grpc_bench.critical_path import CapturedSegment, captured_path_segments

    trace = _tf1_trace()
    assert steps_are_rounds(trace)
    # worker:0: pull 1,000, compute 2,000, its gradient 1,000, the apply 4,000 (what
    # followed worker:1's gradient, the round's last, before the token left), then the
    # token's 18,000 (the wait for worker:1's gradient, 17,000, and its own 1,000), then
    # the round's tail after its last arrival (26,000): 974,000 to the next step, then
    # 4,000.  worker:1's own gradient is the round's last: pull 1,000, compute 19,000,
    # gradient 1,000, apply 4,000, token 1,000, tail.
    assert [
        (index, task, p.step_ns, p.compute_ns, p.communication_ns)
        for index, task, p in captured_critical_paths(trace)
    ] == [
        (0, "/job:worker/task:0", 1_000_000, 2_000 + 4_000 + 974_000, 20_000),
        (0, "/job:worker/task:1", 1_000_000, 19_000 + 4_000 + 974_000, 3_000),
        (1, "/job:worker/task:0", 30_000, 2_000 + 4_000 + 4_000, 20_000),
        (1, "/job:worker/task:1", 30_000, 19_000 + 4_000 + 4_000, 3_000),
    ]
    segments = captured_path_segments(trace)
    assert [(number, task) for number, task, _ in segments] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    b = 2_000_000
    assert segments[2][2] == (
        CapturedSegment(start_ns=b, end_ns=b + 1_000, rpc_index=0),
        CapturedSegment(start_ns=b + 1_000, end_ns=b + 3_000, rpc_index=-1),
        CapturedSegment(start_ns=b + 3_000, end_ns=b + 4_000, rpc_index=2),
        CapturedSegment(start_ns=b + 4_000, end_ns=b + 8_000, rpc_index=-1),
        CapturedSegment(start_ns=b + 8_000, end_ns=b + 26_000, rpc_index=4),
        CapturedSegment(start_ns=b + 26_000, end_ns=b + 30_000, rpc_index=-1),
    )


def test_a_rounds_tail_runs_from_its_last_arrival_to_its_periods_end_and_is_never_negative() -> (
    None
):
    assert arrival_tail_ns([300, 700, 650], 1_000) == 300
    # An arrival at or after the period's end leaves no tail, nor does a round without one.
    assert arrival_tail_ns([1_000], 1_000) == 0
    assert arrival_tail_ns([200, 1_200], 1_000) == 0
    assert arrival_tail_ns([], 1_000) == 0


def test_a_timed_call_is_its_rpc_in_offsets_from_the_step_start_with_its_tensors_op() -> None:
    key = "/job:worker/task:0;1;/job:ps/task:0;edge_12_gradients/MatMul;0:0"
    rpc = Rpc(
        method=RECV_TENSOR,
        caller_task=0,
        callee_task=2,
        request_bytes=130,
        response_bytes=4_000,
        start_ns=1_003_000,
        response_start_ns=1_003_400,
        end_ns=1_004_000,
        tensor=TensorInfo(rendezvous_key=key),
    )
    mapped = MappedRpc(rpc=rpc, client_task=2, server_task=0, reversed_direction=True)
    expected = TimedCall(
        server=1,
        reversed_direction=True,
        carries_tensor=True,
        start_ns=3_000,
        response_start_ns=3_400,
        end_ns=4_000,
        source_op="gradients/MatMul",
    )
    assert timed_call(mapped, 1, 1_000_000) == expected
    # Without the tensor's rendezvous key there is no op to group it with others by.
    untagged = replace(mapped, rpc=replace(rpc, tensor=None))
    assert timed_call(untagged, 1, 1_000_000) == replace(expected, source_op="")
    # Offsets never fall before the step's start, nor the response's before the request's.
    early = replace(mapped, rpc=replace(rpc, start_ns=999_000, response_start_ns=999_500))
    assert timed_call(early, 1, 1_000_000) == replace(expected, start_ns=0, response_start_ns=0)


def test_without_a_ps_job_the_tasks_called_serve_and_the_callers_are_clients() -> None:
    tasks = tuple(Task(job="worker", index=i) for i in range(3))
    steps = tuple(
        Step(
            index=n,
            start_ns=b,
            end_ns=b + 900_000,
            rpcs=(
                _rpc(RECV_TENSOR, 0, 1, 100, 5_000, b),
                _rpc(RECV_TENSOR, 2, 1, 100, 6_000, b + 10),
            ),
        )
        for n, b in enumerate((1_000_000, 2_000_000))
    )
    roles = trace_roles(Trace(metadata=RunMetadata(model="toy"), tasks=tasks, steps=steps))
    assert (roles.ps_job, roles.server_tasks, roles.client_tasks) == (False, (1,), (0, 2))


def test_calls_that_start_together_are_mapped_in_the_order_they_end() -> None:
    trace = _ps_trace()
    first, second = trace.steps
    longer = replace(first.rpcs[0], end_ns=first.start_ns + 5_000)
    shorter = replace(first.rpcs[0], end_ns=first.start_ns + 2_000)
    together = replace(trace, steps=(replace(first, rpcs=(longer, shorter)), second))
    mapped, _ = map_steps(together, trace_roles(together))
    assert [(m.rpc_index, m.rpc.end_ns - first.start_ns) for m in mapped[0]] == [
        (1, 2_000),
        (0, 5_000),
    ]


def test_steps_are_rounds_when_the_last_transfer_ends_as_the_next_begins() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0))

    def step(start: int, *rpcs: Rpc) -> tuple[int, int, tuple[Rpc, ...]]:
        return (start, start + 1_000, rpcs)

    def pull(start: int, end: int, method: str = RECV_TENSOR) -> Rpc:
        return Rpc(
            method=method,
            caller_task=1,
            callee_task=0,
            request_bytes=10,
            response_bytes=100,
            start_ns=start,
            end_ns=end,
        )

    touching = _trace(tasks, step(0, pull(0, 2_000)), step(2_000, pull(2_000, 2_500)))
    assert steps_are_rounds(touching)
    # Up to 5% of the step's period (2 us here) into the next step still makes rounds
    # (tf1-ps' looser barrier), more does not.
    slightly = _trace(tasks, step(0, pull(0, 2_100)), step(2_000, pull(2_000, 2_500)))
    assert steps_are_rounds(slightly)
    overlapping = _trace(tasks, step(0, pull(0, 2_101)), step(2_000, pull(2_000, 2_500)))
    assert not steps_are_rounds(overlapping)
    # A control call running into the next step does not make it overlap...
    control = _trace(
        tasks,
        step(0, pull(0, 500), pull(600, 9_000, RUN_GRAPH)),
        step(2_000, pull(2_000, 2_500)),
    )
    assert steps_are_rounds(control)
    # ... and a step without transfers tells nothing: not rounds.
    without = _trace(tasks, step(0, pull(0, 500, RUN_GRAPH)), step(2_000, pull(2_000, 2_500)))
    assert not steps_are_rounds(without)
    without_next = _trace(tasks, step(0, pull(0, 500)), step(2_000, pull(2_000, 2_500, RUN_GRAPH)))
    assert not steps_are_rounds(without_next)
    # Every pair of neighbours counts, not only the first.
    third = _trace(
        tasks,
        step(0, pull(0, 500)),
        step(2_000, pull(2_000, 4_500)),
        step(4_000, pull(4_000, 4_500)),
    )
    assert not steps_are_rounds(third)


def test_the_default_pair_moved_most_bytes_and_ties_go_to_the_lowest_indices() -> None:
    tasks = (
        Task(job="ps", index=0),
        Task(job="ps", index=1),
        Task(job="worker", index=0),
        Task(job="worker", index=1),
    )
    # worker:1 -> ps:1 comes first in the trace; both pairs move 110 B.
    tied = _trace(
        tasks,
        (0, 10_000, (_rpc(RECV_TENSOR, 3, 1, 10, 100, 0), _rpc(RECV_TENSOR, 2, 0, 10, 100, 5))),
    )
    assert choose_pair(tied) == (2, 0)
    heavier = _trace(
        tasks,
        (0, 10_000, (_rpc(RECV_TENSOR, 2, 0, 10, 100, 0), _rpc(RECV_TENSOR, 3, 1, 10, 101, 5))),
    )
    assert choose_pair(heavier) == (3, 1)
    # ps:0 -> ps:1 moves the most, but is not a (worker, ps) pair.
    with_ps_to_ps = _trace(
        tasks,
        (
            0,
            10_000,
            (
                _rpc(RECV_TENSOR, 0, 1, 10, 9_000, 0),
                _rpc(RECV_TENSOR, 3, 1, 10, 100, 5),
            ),
        ),
    )
    assert choose_pair(with_ps_to_ps) == (3, 1)


def test_a_pair_with_a_side_client_or_a_stand_in_server_is_refused() -> None:
    trace = _ps_trace()
    for pair, names in (
        ((4, 2), "/job:chief/task:0 -> /job:worker/task:0"),
        ((0, 1), "/job:ps/task:0 -> /job:ps/task:1"),
        ((4, 0), "/job:chief/task:0 -> /job:ps/task:0"),
    ):
        with pytest.raises(ConfigError, match=rf"^--pair: {names} is not a \(worker, ps\) pair"):
            trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED, pair=pair)


def test_serialized_trace_calls_say_which_sizes_they_could_not_keep() -> None:
    from tf_grpc_bench.replay.core.measurement import InexactSizes

    tasks = (Task(job="ps", index=0), Task(job="worker", index=0))
    rpcs = (
        _rpc(RECV_TENSOR, 1, 0, 1, 130, 0),  # 1 B request: the length field alone is 2 B
        _rpc(RECV_TENSOR, 1, 0, 10, 131, 10),  # exact
    )
    trace = _trace(tasks, (0, 10_000, rpcs))
    serialized = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.SERIALIZED)
    assert [(c.request_bytes, c.response_bytes) for c in serialized.calls] == [(2, 129), (10, 131)]
    assert serialized.inexact_sizes == InexactSizes(
        calls_per_pass=1,
        traced_bytes=131,
        replayed_bytes=131,
        examples="1 B -> 2 B x1, 130 B -> 129 B x1",
    )
    raw = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert raw.inexact_sizes is None


def test_only_the_sizes_a_replay_changes_are_inexact_whichever_direction_is_larger() -> None:
    """``_ps_trace``'s chief control calls ask more than they answer, and its ps pulls
    workers' gradients (requests are the larger side of neither): the raw replay keeps
    every size, a cluster's or a pair's, and the serialized one names only the two 130 B
    messages it cannot keep."""
    from tf_grpc_bench.replay.core.measurement import InexactSizes

    trace = _ps_trace()
    for benchmark in (Benchmark.PS_THROUGHPUT, Benchmark.P2P_BANDWIDTH):
        raw = trace_workload(trace, benchmark, mode=Mode.NON_SERIALIZED)
        assert any(c.request_bytes > c.response_bytes for c in raw.calls)
        assert raw.inexact_sizes is None
        serialized = trace_workload(trace, benchmark, mode=Mode.SERIALIZED)
        assert serialized.inexact_sizes == InexactSizes(
            calls_per_pass=2,
            traced_bytes=8_000_260,
            replayed_bytes=8_000_258,
            examples="130 B -> 129 B x2",
        )


def test_inexact_sizes_rank_the_commonest_changes_and_name_three() -> None:
    from tf_grpc_bench.replay.core.measurement import InexactSizes
    from tf_grpc_bench.replay.core.trace_workload import inexact_sizes

    assert inexact_sizes([]) is None
    assert inexact_sizes([((5, 5), (5, 5))]) is None
    pairs = [
        ((130, 1), (129, 0)),
        ((130, 2), (129, 0)),
        ((5, 5), (5, 5)),
        ((1, 130), (0, 129)),
    ]
    assert inexact_sizes(pairs) == InexactSizes(
        calls_per_pass=3,
        traced_bytes=394,
        replayed_bytes=387,
        examples="130 B -> 129 B x3, 1 B -> 0 B x2, 2 B -> 0 B x1",
    )
    # A fourth kind: the three commonest (ties by the sizes), then "...".
    assert inexact_sizes([*pairs, ((3, 3), (3, 4))]) == InexactSizes(
        calls_per_pass=4,
        traced_bytes=400,
        replayed_bytes=394,
        examples="130 B -> 129 B x3, 1 B -> 0 B x2, 2 B -> 0 B x1, ...",
    )


def test_a_pull_calls_defaults_are_a_synthetic_calls() -> None:
    call = pull_call(method="/a.B/C", request_bytes=30, response_bytes=40, mode=Mode.SERIALIZED)
    assert call == Call(
        shape=Shape.PULL,
        method="/a.B/C",
        request_bytes=30,
        response_bytes=40,
        tensor_name="",
        server_index=0,
        worker_index=0,
        step=-1,
        offset_ns=0,
        outstanding_at_start=0,
        reversed_direction=False,
        dependencies=None,
        rpc_index=-1,
    )


def test_a_pull_request_name_may_lose_one_character_or_two() -> None:
    from tf_grpc_bench.replay.core.messages import PullRequestLayout, pull_request_layout

    # 9 B: "abc" leaves 2 B (no field), "ab" leaves 3 B (1 B of padding).
    assert pull_request_layout(9, 100, "abc") == PullRequestLayout(
        response_content_bytes=100, tensor_name="ab", padding_bytes=1, message_bytes=9
    )


def test_synthetic_defaults_are_one_ps_and_one_worker_and_the_workload_says_what_it_is() -> None:
    workload = synthetic_workload(
        Benchmark.PS_THROUGHPUT, _two_category_generator(), mode=Mode.SERIALIZED
    )
    assert (workload.server_count, workload.worker_count) == (1, 1)
    assert (workload.parameters()["ps"], workload.parameters()["workers"]) == (1, 1)
    assert workload.benchmark is Benchmark.PS_THROUGHPUT and workload.mode is Mode.SERIALIZED
    assert [c.request_bytes for c in workload.calls] == [10_267, 20_498]


def test_side_worker_zero_is_allowed() -> None:
    workload = Workload(
        benchmark=Benchmark.PS_THROUGHPUT,
        source="trace",
        mode=Mode.NON_SERIALIZED,
        steps=(_one_call_step(worker_index=1),),
        server_count=1,
        worker_count=2,
        side_workers=(0,),
    )
    assert workload.side_workers == (0,)


def test_roles_say_how_they_were_made() -> None:
    tasks = (Task(job="worker", index=0), Task(job="worker", index=1))
    trace = _trace(tasks, (0, 10_000, (_rpc(RECV_TENSOR, 0, 1, 10, 100, 0),)))
    whole = WholeSteps(ps_clients=False)
    roles = trace_roles(trace, whole_steps=whole)
    assert roles.ps_job is False and roles.whole_steps == whole
    ps = trace_roles(_ps_trace(), whole_steps=whole)
    assert ps.ps_job is True and ps.whole_steps == whole
    # The default source of an error is "trace".
    empty = _trace(tasks, (0, 10_000, ()))
    with pytest.raises(TraceError, match=r"^trace: no RPCs in steady-state steps"):
        trace_roles(empty)
    with pytest.raises(TraceError, match=r"^trace: no RPCs in steady-state steps"):
        trace_workload(empty, Benchmark.PS_THROUGHPUT, mode=Mode.SERIALIZED)


def test_a_throughput_replay_ignores_a_pair_and_says_who_it_replays() -> None:
    trace = _ps_trace()
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED, pair=(3, 1))
    assert workload.benchmark is Benchmark.PS_THROUGHPUT
    assert "pair" not in workload.parameters()
    assert workload.parameters()["stand_in_servers"] == "/job:worker/task:0"
    assert len(workload.calls) == 12
    # The _ps_trace RPCs carry no tensor: their calls name none.
    assert {c.tensor_name for c in workload.calls} == {""}


def test_bytes_per_pair_of_the_ps_trace() -> None:
    from tf_grpc_bench.trace_mapping import pair_bytes

    # Per step: worker:0 <-> ps:0 120 + 4,000,000 + 121 + 300 + 130 + 4,000,000 (the
    # gradient ps:0 pulled, replayed by worker:0); worker:1 -> ps:1 122 + 2,000; chief ->
    # worker:0 500 + 60; ps:0 -> ps:1 90 + 7.  Two steps.
    assert pair_bytes(_ps_trace()) == {
        (2, 0): 16_001_342,
        (3, 1): 4_244,
        (4, 2): 1_120,
        (0, 1): 194,
    }


def test_what_a_replay_cannot_send_is_ranked_by_bytes_then_by_name() -> None:
    from tf_grpc_bench.trace_mapping import unreplayed_summary

    tasks = (
        Task(job="ps", index=0),
        Task(job="ps", index=1),
        Task(job="worker", index=0),
        Task(job="chief", index=0),
    )

    def summary(ps_to_ps: tuple[int, int]) -> tuple[int, str]:
        rpcs = (
            _rpc(RECV_TENSOR, 2, 0, 10, 100, 0),
            _rpc(RECV_TENSOR, 0, 1, *ps_to_ps, 10),
            _rpc(RUN_GRAPH, 3, 2, 25, 25, 20),
            _rpc(RUN_GRAPH, 3, 2, 25, 25, 30),
        )
        trace = _trace(tasks, (0, 10_000, rpcs))
        return unreplayed_summary(trace, trace_roles(trace, whole_steps=WORKERS_AND_PS_ONLY))

    # Most bytes first, whatever the name.
    assert summary((10, 990)) == (
        1_100,
        "ps->ps RecvTensor: 1 RPCs, 1000 B; chief->worker RunGraph: 2 RPCs, 100 B",
    )
    # On equal bytes, by name (not by count).
    assert summary((10, 90)) == (
        200,
        "chief->worker RunGraph: 2 RPCs, 100 B; ps->ps RecvTensor: 1 RPCs, 100 B",
    )


def test_a_pull_waits_only_for_arrivals_at_its_own_server() -> None:
    from tf_grpc_bench.critical_path import CapturedSegment, captured_path_segments
    from tf_grpc_bench.dependencies import Dependencies

    tasks = (Task(job="ps", index=0), Task(job="ps", index=1), Task(job="worker", index=0))
    rpcs = (
        _rpc(RECV_TENSOR, 0, 2, 10, 100, 0),  # ps:0 pulls worker:0's gradient (0 - 1,000)
        _rpc(RECV_TENSOR, 2, 1, 10, 100, 2_000),  # worker:0 pulls from ps:1 (2,000 - 3,000)
    )
    trace = _trace(tasks, (0, 10_000, rpcs))
    gradient, pull = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED).calls
    assert (gradient.server_index, pull.server_index) == (0, 1)
    assert gradient.dependencies == Dependencies(
        ready_offset_ns=0,
        arrival_offset_ns=1_000,
        lands_on_worker=False,
        transfer_offset_ns=0,
        is_arrival=True,
        arrival_rank=0,
        after_worker_arrivals=0,
        after_server_arrivals=0,
    )
    # The gradient arrived at ps:0, not ps:1: the pull waits for nothing.
    assert pull.dependencies == Dependencies(
        ready_offset_ns=2_000,
        arrival_offset_ns=3_000,
        lands_on_worker=True,
        transfer_offset_ns=2_000,
        is_arrival=True,
        arrival_rank=0,
        after_worker_arrivals=0,
        after_server_arrivals=0,
    )
    ((number, task, segments),) = captured_path_segments(trace)
    assert (number, task) == (0, 2)
    assert segments == (
        CapturedSegment(start_ns=0, end_ns=2_000, rpc_index=-1),
        CapturedSegment(start_ns=2_000, end_ns=3_000, rpc_index=1),
        CapturedSegment(start_ns=3_000, end_ns=10_000, rpc_index=-1),
    )


def test_a_control_call_at_its_steps_start_is_ready_at_zero() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0))
    rpcs = (
        _rpc(RUN_GRAPH, 1, 0, 10, 10, 1_000),
        _rpc(RECV_TENSOR, 1, 0, 10, 100, 1_500),
    )
    workload = trace_workload(
        _trace(tasks, (1_000, 5_000, rpcs)), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    control, _ = workload.calls
    assert control.dependencies is not None
    assert (control.dependencies.ready_offset_ns, control.dependencies.arrival_offset_ns) == (
        0,
        1_000,
    )


def test_steps_starting_together_have_a_period_of_zero() -> None:
    # Asynchronous training's worker-steps can start in the same nanosecond.
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0), Task(job="worker", index=1))
    trace = _trace(
        tasks,
        (1_000, 4_000, (_rpc(RECV_TENSOR, 1, 0, 10, 100, 1_000),)),
        (1_000, 3_000, (_rpc(RECV_TENSOR, 2, 0, 10, 100, 1_000),)),
    )
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert [(s.index, s.period_ns) for s in workload.steps] == [(0, 0), (1, 2_000)]


def test_inexact_sizes_are_summed_over_every_step() -> None:
    from tf_grpc_bench.replay.core.measurement import InexactSizes

    tasks = (Task(job="ps", index=0), Task(job="worker", index=0))
    trace = _trace(
        tasks,
        (0, 10_000, (_rpc(RECV_TENSOR, 1, 0, 10, 130, 0),)),  # 130 B -> 129 B
        (10_000, 20_000, (_rpc(RECV_TENSOR, 1, 0, 10, 131, 10_000),)),  # exact
    )
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.SERIALIZED)
    assert workload.inexact_sizes == InexactSizes(
        calls_per_pass=1, traced_bytes=140, replayed_bytes=139, examples="130 B -> 129 B x1"
    )


def test_a_pull_request_without_a_tensor_name_is_padding() -> None:
    from tf_grpc_bench.replay.core.messages import PullRequestLayout, pull_request_layout

    assert pull_request_layout(5, 0) == PullRequestLayout(
        response_content_bytes=0, tensor_name="", padding_bytes=3, message_bytes=5
    )


def test_a_pairs_dropped_rpcs_add_the_other_pairs_to_what_no_replay_can_send() -> None:
    # Per step of the ps trace, without whole steps: chief -> worker and ps -> ps cannot be
    # sent (2), and worker:1 -> ps:1 is not the pair (1); two steps.
    workload = trace_workload(
        _ps_trace(),
        Benchmark.P2P_LATENCY,
        mode=Mode.NON_SERIALIZED,
        whole_steps=WORKERS_AND_PS_ONLY,
    )
    assert workload.parameters()["dropped_rpcs_per_pass"] == 6
    assert workload.parameters()["calls_per_pass"] == 6


def test_inexact_sizes_of_equal_counts_go_by_size_not_by_first_seen() -> None:
    from tf_grpc_bench.replay.core.measurement import InexactSizes
    from tf_grpc_bench.replay.core.trace_workload import inexact_sizes

    assert inexact_sizes([((5, 5), (5, 6)), ((1, 1), (0, 1))]) == InexactSizes(
        calls_per_pass=2,
        traced_bytes=12,
        replayed_bytes=12,
        examples="1 B -> 0 B x1, 5 B -> 6 B x1",
    )


def test_a_pull_request_that_cannot_be_encoded_goes_one_byte_short_after_its_length_field() -> None:
    from tf_grpc_bench.replay.core.messages import PullRequestLayout, pull_request_layout

    # response_bytes 100 takes 2 B; the 130 B left cannot be one field: 127 B of padding
    # (129 B), 131 B in all.
    assert pull_request_layout(132, 100) == PullRequestLayout(
        response_content_bytes=100, tensor_name="", padding_bytes=127, message_bytes=131
    )


def test_a_synthetic_workload_of_one_payload() -> None:
    generator = GeneratorConfig(
        categories=(SizeCategory.SMALL,), buffers_per_payload=2, payload_count=1
    )
    workload = synthetic_workload(Benchmark.P2P_LATENCY, generator, mode=Mode.NON_SERIALIZED)
    assert [(c.buffers, c.request_bytes) for c in workload.calls] == [((10, 10), 20)]
    assert workload.parameters()["shape"] == "echo"


def test_a_chunk_is_one_of_its_payloads_chunks() -> None:
    def chunk(index: int, count: int) -> Call:
        return Call(
            shape=Shape.PULL,
            method="/a.B/C",
            request_bytes=1,
            response_bytes=1,
            chunk_index=index,
            chunk_count=count,
        )

    assert (chunk(0, 1).chunk_index, chunk(1, 2).chunk_index) == (0, 1)
    for index, count in ((1, 1), (-1, 2), (2, 2), (0, 0)):
        with pytest.raises(
            ValueError,
            match=rf"^chunk_index must be in \[0, chunk_count\), got {index} of {count}$",
        ):
            chunk(index, count)


def test_a_workload_names_one_task_per_worker_and_per_server_or_none() -> None:
    def workload(clients: int, servers: int) -> Workload:
        return Workload(
            benchmark=Benchmark.PS_THROUGHPUT,
            source="trace",
            mode=Mode.NON_SERIALIZED,
            steps=(_one_call_step(),),
            server_count=1,
            worker_count=2,
            client_tasks=tuple(Task(job="worker", index=i) for i in range(clients)),
            server_tasks=tuple(Task(job="ps", index=i) for i in range(servers)),
        )

    assert workload(0, 0).client_tasks == ()
    assert [t.index for t in workload(2, 1).client_tasks] == [0, 1]
    with pytest.raises(ValueError, match=r"^1 client tasks for 2 workers$"):
        workload(1, 1)
    with pytest.raises(ValueError, match=r"^3 client tasks for 2 workers$"):
        workload(3, 0)
    with pytest.raises(ValueError, match=r"^2 server tasks for 1 servers$"):
        workload(2, 2)


def test_a_step_replayed_without_its_round_barrier_keeps_its_own_tail_and_token_wait() -> None:
    token = Dependencies(
        ready_offset_ns=50, arrival_offset_ns=60, lands_on_worker=True, others_arrival_offset_ns=40
    )
    pull = Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=True)
    calls = (
        pull_call(method="/a.B/C", request_bytes=1, response_bytes=9, mode=Mode.NON_SERIALIZED),
        pull_call(
            method="/a.B/C",
            request_bytes=1,
            response_bytes=8,
            mode=Mode.NON_SERIALIZED,
            dependencies=pull,
        ),
        pull_call(
            method="/a.B/C",
            request_bytes=1,
            response_bytes=7,
            mode=Mode.NON_SERIALIZED,
            dependencies=token,
        ),
    )
    alone = WorkloadStep(index=3, calls=calls, period_ns=100, step_compute_ns=20)
    assert alone.without_round_barrier() is alone
    in_round = replace(alone, round_tail_ns=5)
    taken = in_round.without_round_barrier()
    assert taken.round_tail_ns is None
    assert (taken.index, taken.period_ns, taken.step_compute_ns) == (3, 100, 20)
    assert taken.calls[:2] == calls[:2]
    assert taken.calls[2] == replace(
        calls[2], dependencies=replace(token, others_arrival_offset_ns=None)
    )
    assert in_round.calls[2].dependencies == token  # the step itself unchanged


def test_an_echo_or_ack_call_goes_from_the_first_worker_to_the_first_server_by_default() -> None:
    echo = echo_call((10, 20), Mode.NON_SERIALIZED)
    ack = ack_call((10, 20), Mode.NON_SERIALIZED)
    # Raw bytes: the buffers back to back; the raw acknowledgement is 8 bytes.
    assert (echo.request_bytes, echo.response_bytes, echo.buffers) == (30, 30, (10, 20))
    assert (ack.request_bytes, ack.response_bytes, ack.buffers) == (30, 8, (10, 20))
    for call in (echo, ack):
        assert (call.server_index, call.worker_index) == (0, 0)
    placed = echo_call((1,), Mode.NON_SERIALIZED, server_index=2, worker_index=3)
    assert (placed.server_index, placed.worker_index) == (2, 3)
    placed = ack_call((1,), Mode.NON_SERIALIZED, server_index=2, worker_index=3)
    assert (placed.server_index, placed.worker_index) == (2, 3)


def test_outstanding_counts_every_earlier_call_that_ended_however_many_there_are() -> None:
    # One pair: seven calls end at 1 to 7 ns, then calls start at 2, 5 and 8: the
    # earlier calls still open at each are counted by hand (and by brute force).
    calls = [("p", 0, end) for end in range(1, 8)] + [("p", 2, 9), ("p", 5, 9), ("p", 8, 9)]
    by_hand = [0, 1, 2, 3, 4, 5, 6, 5, 3, 2]
    assert by_hand == [
        sum(1 for pair, _, end in calls[:i] if pair == calls[i][0] and end > calls[i][1])
        for i in range(len(calls))
    ]
    assert outstanding_per_pair(calls) == by_hand
    # Another pair's calls change nothing.
    other = [("q", 0, 1)] * 3
    assert outstanding_per_pair(other + calls)[3:] == by_hand


def test_a_call_starting_at_the_latest_end_counts_every_earlier_call_as_ended() -> None:
    # A call of no duration that starts when the pair's latest call ends (a trace's
    # clock gives both the same ns): every earlier call has ended, however many there
    # are; the count reads the tree's last slot, which only such a start reaches.
    for earlier in (1, 2, 3, 4, 7):
        calls = [("p", 0, end) for end in range(1, earlier + 1)] + [("p", earlier, earlier)]
        assert outstanding_per_pair(calls)[-1] == 0
    assert outstanding_per_pair([("p", 0, 10), ("p", 20, 20)]) == [0, 0]


def test_the_pair_and_cluster_builders_replay_one_pair_or_every_task_and_name_the_source() -> None:
    trace = make_trace(steps=2, workers=2, ps=2)
    for mode in Mode:
        pair = pair_workload(trace, Benchmark.P2P_LATENCY, mode=mode)
        assert (pair.benchmark, pair.mode, pair.worker_count) == (Benchmark.P2P_LATENCY, mode, 1)
        assert pair == workload_of_trace(
            trace, Benchmark.P2P_LATENCY, mode=mode, point_to_point=True
        )
        cluster = cluster_workload(trace, Benchmark.PS_THROUGHPUT, mode=mode)
        assert (cluster.benchmark, cluster.mode, cluster.worker_count) == (
            Benchmark.PS_THROUGHPUT,
            mode,
            2,
        )
        assert cluster == workload_of_trace(
            trace, Benchmark.PS_THROUGHPUT, mode=mode, point_to_point=False
        )
    for build in (pair_workload, cluster_workload):
        only = build(
            trace, Benchmark.P2P_LATENCY, mode=Mode.SERIALIZED, whole_steps=WORKERS_AND_PS_ONLY
        )
        assert only.parameters()["whole_steps"] == WORKERS_AND_PS_ONLY.describe()
        assert only.parameters()["whole_steps"] != WHOLE_STEPS.describe()
    empty = _trace(make_trace().tasks, (0, 10_000, ()))
    for build in (pair_workload, cluster_workload):
        with pytest.raises(TraceError, match=r"^trace: no RPCs in steady-state steps"):
            build(empty, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)
        with pytest.raises(TraceError, match=r"^run\.trace: no RPCs in steady-state steps"):
            build(empty, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED, source="run.trace")
