"""The three benchmarks end to end on loopback: server processes, real grpcio, real counts.

Every test checks what the servers themselves counted against what the
workload said to send.  Durations are tiny; nothing asserts on speed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload, trace_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig, GeneratorKind
from tf_grpc_bench.replay.core.measurement import Benchmark, BenchmarkResult, CallSample
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Call, Mode, Workload
from tf_grpc_bench.replay.engines.registry import engine_named
from tf_grpc_bench.replay.runner import ProgressEvent, RunPlan, run_benchmark
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.loop import begin_mid_trace
from tf_grpc_bench.replay.transport.wire import ChannelSettings, RpcKind

from .conftest import make_trace
from .engines import grpc_cpp_program

SHORT = RunPlan(warmup_ns=50_000_000, duration_ns=200_000_000, runs=2, deadline_s=20)
TWO_STEPS = RunPlan(warmup_ns=0, duration_ns=1, runs=2, steps=2, deadline_s=20)
SMALL_PAYLOADS = GeneratorConfig(kind=GeneratorKind.SKEW, payload_count=3, buffers_per_payload=4)


@pytest.fixture(scope="module", params=list(Mode), ids=lambda m: m.value)
def servers(request: pytest.FixtureRequest) -> Iterator[LocalServers]:
    with LocalServers(2, mode=Mode(request.param)) as running:
        yield running


def _workload(benchmark: Benchmark, source: str, mode: Mode) -> Workload:
    if source == "synthetic":
        return synthetic_workload(benchmark, SMALL_PAYLOADS, mode=mode, ps_count=2, worker_count=2)
    return trace_workload(make_trace(steps=3, workers=2, ps=2), benchmark, mode=mode)


def _key(item: Call | CallSample) -> tuple[int, int, int, int]:
    return (item.request_bytes, item.response_bytes, item.server_index, item.worker_index)


def _assert_servers_received_what_was_sent(result: BenchmarkResult) -> None:
    assert not result.partial, result.partial_reason
    for run in result.runs:
        assert run.rpc_count > 0
        assert run.server_received_messages == run.rpc_count
        assert run.server_received_bytes == run.request_bytes
        assert run.client_cpu_ns > 0 and run.server_cpu_ns > 0


@pytest.mark.parametrize("benchmark", list(Benchmark), ids=lambda b: b.value)
def test_synthetic_benchmarks_send_the_generated_payloads_and_the_servers_get_them(
    servers: LocalServers, benchmark: Benchmark
) -> None:
    workload = _workload(benchmark, "synthetic", servers.mode)
    result = run_benchmark(workload, servers.targets, plan=SHORT)
    _assert_servers_received_what_was_sent(result)
    assert len(result.runs) == 2 and result.workload == "synthetic"
    calls = workload.calls
    for run in result.runs:
        if benchmark is Benchmark.PS_THROUGHPUT:
            # Each worker sends its calls in a cycle; concurrent calls may finish out of order.
            for worker in range(2):
                mine = [s for s in run.samples if s.worker_index == worker]
                own_calls = workload.for_worker(worker).calls
                cycled = [own_calls[i % len(own_calls)] for i in range(len(mine))]
                # Up to one call per ps may still be missing from an unfinished cycle.
                assert Counter(map(_key, mine)) - Counter(map(_key, cycled)) == Counter()
            assert {(s.worker_index, s.server_index) for s in run.samples} == {
                (w, p) for w in range(2) for p in range(2)
            }
        else:
            # One call at a time: exactly the payload cycle, in order.
            expected = [_key(calls[i % len(calls)]) for i in range(run.rpc_count)]
            assert [_key(s) for s in run.samples] == expected


@pytest.mark.parametrize("benchmark", list(Benchmark), ids=lambda b: b.value)
def test_trace_benchmarks_replay_exact_steps_and_the_servers_get_every_byte(
    servers: LocalServers, benchmark: Benchmark
) -> None:
    workload = _workload(benchmark, "trace", servers.mode)
    result = run_benchmark(workload, servers.targets, plan=TWO_STEPS)
    _assert_servers_received_what_was_sent(result)
    # A replay begins mid-trace: of 3 steps, the second and the third.
    first_two = begin_mid_trace(workload.steps)[:2]
    two_steps = [c for step in first_two for c in step.calls]
    for run in result.runs:
        assert Counter(map(_key, run.samples)) == Counter(map(_key, two_steps))
        assert len(run.step_times_ns) == 2 * workload.worker_count
        assert sorted({s.step for s in run.samples}) == [1, 2]
        if benchmark is Benchmark.P2P_LATENCY:
            assert [_key(s) for s in run.samples] == [_key(c) for c in two_steps]


def test_passes_replay_the_whole_trace_that_many_times(servers: LocalServers) -> None:
    workload = _workload(Benchmark.P2P_BANDWIDTH, "trace", servers.mode)
    plan = RunPlan(warmup_ns=0, duration_ns=1, runs=1, passes=2, deadline_s=20)
    result = run_benchmark(workload, servers.targets, plan=plan)
    _assert_servers_received_what_was_sent(result)
    assert result.rpc_count == 2 * len(workload.calls)


def test_recorded_pacing_never_sends_a_call_before_its_recorded_offset(
    servers: LocalServers,
) -> None:
    workload = _workload(Benchmark.P2P_BANDWIDTH, "trace", servers.mode)
    pacing = Pacing(timing=Timing.RECORDED, window=None)
    result = run_benchmark(workload, servers.targets, pacing=pacing, plan=TWO_STEPS)
    _assert_servers_received_what_was_sent(result)
    begun, then = begin_mid_trace(workload.steps)[:2]  # the steps replayed, in order
    for run in result.runs:
        samples = [s for s in run.samples if s.step == begun.index]
        assert len(samples) == len(begun.calls)
        for sample, call in zip(
            sorted(samples, key=lambda s: s.start_ns), begun.calls, strict=True
        ):
            assert sample.start_ns >= call.offset_ns
        # The second step begins no earlier than the recorded distance between steps.
        second = [s for s in run.samples if s.step == then.index]
        assert min(s.start_ns for s in second) >= begun.period_ns


def test_rate_pacing_never_sends_ahead_of_its_schedule(servers: LocalServers) -> None:
    workload = _workload(Benchmark.P2P_BANDWIDTH, "synthetic", servers.mode)
    pacing = Pacing(timing=Timing.RATE, rate_per_s=200.0, window=None)
    result = run_benchmark(workload, servers.targets, pacing=pacing, plan=SHORT)
    _assert_servers_received_what_was_sent(result)
    for run in result.runs:
        starts = sorted(s.start_ns for s in run.samples)
        for number, start in enumerate(starts):
            assert start >= number * 5_000_000


def test_bandwidth_with_several_outstanding_calls_delivers_every_byte(
    servers: LocalServers,
) -> None:
    workload = _workload(Benchmark.P2P_BANDWIDTH, "synthetic", servers.mode)
    result = run_benchmark(workload, servers.targets, pacing=Pacing(window=4), plan=SHORT)
    _assert_servers_received_what_was_sent(result)
    assert result.parameters["outstanding"] == 4


def test_recorded_pacing_of_a_synthetic_workload_is_refused(servers: LocalServers) -> None:
    workload = _workload(Benchmark.P2P_LATENCY, "synthetic", servers.mode)
    with pytest.raises(ConfigError, match="recorded"):
        run_benchmark(workload, servers.targets, pacing=Pacing(timing=Timing.RECORDED), plan=SHORT)


def test_too_few_targets_for_the_workloads_ps_count_is_refused(servers: LocalServers) -> None:
    workload = _workload(Benchmark.PS_THROUGHPUT, "synthetic", servers.mode)
    with pytest.raises(ConfigError, match="2 ps server"):
        run_benchmark(workload, servers.targets[:1], plan=SHORT)


#: The client session of the benchmarks ``_kill_once_measuring`` watches.
WATCHED = ChannelSettings(session="watched-benchmark")


def _kill_once_measuring(
    running: LocalServers, *, in_flight: int = 1
) -> tuple[threading.Event, Callable[[ProgressEvent], None]]:
    """A progress callback that SIGKILLs the server process once the first measured run
    has delivered calls to it (watched through the server's own statistics of the
    benchmark's session: run it with ``WATCHED``'s session).

    The server counts a message before its answer leaves, so with ``in_flight``
    calls allowed at once, only a count above ``in_flight`` proves that at
    least one call has completed at the client."""
    killed = threading.Event()

    def kill_when_served() -> None:
        observer = ReplayClient(running.targets[0], mode=running.mode, settings=WATCHED)
        try:
            for _ in range(600):
                if observer.stats().received_messages > in_flight:
                    break
                time.sleep(0.05)
        finally:
            observer.close()
        os.kill(running.pids[0], signal.SIGKILL)

    def on_progress(event: ProgressEvent) -> None:
        if event.phase == "run" and not killed.is_set():
            killed.set()
            threading.Thread(target=kill_when_served, daemon=True).start()

    return killed, on_progress


@pytest.mark.parametrize(
    "benchmark", [Benchmark.P2P_LATENCY, Benchmark.PS_THROUGHPUT], ids=lambda b: b.value
)
def test_a_server_killed_mid_run_ends_the_benchmark_partial_with_what_was_measured(
    benchmark: Benchmark,
) -> None:
    with LocalServers(1) as running:
        workload = synthetic_workload(benchmark, SMALL_PAYLOADS, mode=Mode.NON_SERIALIZED)
        plan = RunPlan(warmup_ns=0, duration_ns=60_000_000_000, runs=3, deadline_s=5)
        killed, on_progress = _kill_once_measuring(running)
        result = run_benchmark(
            workload, running.targets, plan=plan, settings=WATCHED, on_progress=on_progress
        )
    assert killed.is_set()
    assert result.partial
    assert "unavailable" in result.partial_reason
    assert len(result.runs) == 1 and result.runs[0].partial
    assert result.runs[0].rpc_count > 0
    assert result.runs[0].server_received_messages == -1


@pytest.mark.parametrize("window", [1, 4])
@pytest.mark.parametrize("benchmark", list(Benchmark), ids=lambda b: b.value)
def test_streamed_synthetic_benchmarks_deliver_every_message_and_byte(
    servers: LocalServers, benchmark: Benchmark, window: int
) -> None:
    workload = _workload(benchmark, "synthetic", servers.mode)
    settings = ChannelSettings(rpc=RpcKind.STREAMING, channels_per_server=2)
    result = run_benchmark(
        workload, servers.targets, pacing=Pacing(window=window), plan=SHORT, settings=settings
    )
    _assert_servers_received_what_was_sent(result)
    assert result.parameters["rpc"] == "streaming"
    if benchmark is not Benchmark.PS_THROUGHPUT and window == 1:
        calls = workload.calls
        for run in result.runs:
            expected = [_key(calls[i % len(calls)]) for i in range(run.rpc_count)]
            assert [_key(s) for s in run.samples] == expected


def test_a_trace_replayed_with_streaming_asked_stays_unary_and_says_so(
    servers: LocalServers,
) -> None:
    workload = _workload(Benchmark.P2P_BANDWIDTH, "trace", servers.mode)
    settings = ChannelSettings(rpc=RpcKind.STREAMING)
    result = run_benchmark(workload, servers.targets, plan=TWO_STEPS, settings=settings)
    _assert_servers_received_what_was_sent(result)
    assert result.parameters["rpc"] == "unary"


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_a_server_killed_mid_stream_ends_the_benchmark_partial(engine: str) -> None:
    if engine == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    with LocalServers(1) as running:
        workload = synthetic_workload(
            Benchmark.P2P_BANDWIDTH, SMALL_PAYLOADS, mode=Mode.NON_SERIALIZED
        )
        plan = RunPlan(warmup_ns=0, duration_ns=60_000_000_000, runs=3, deadline_s=5)
        killed, on_progress = _kill_once_measuring(running, in_flight=4)
        result = run_benchmark(
            workload,
            running.targets,
            pacing=Pacing(window=4),
            plan=plan,
            settings=replace(WATCHED, rpc=RpcKind.STREAMING),
            on_progress=on_progress,
            engine=engine_named(engine),
        )
    assert killed.is_set()
    assert result.partial
    # Worded alike by both clients: the server went away.
    assert "server unavailable" in result.partial_reason, result.partial_reason
    assert "[UNAVAILABLE]" in result.partial_reason
    assert len(result.runs) == 1 and result.runs[0].partial
    assert result.runs[0].rpc_count > 0
