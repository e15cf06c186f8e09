"""Planning a replay request: workloads of a request, and the checks that they fit a host.

The pure part is ``replay.core.planning``; the RPC kind and pacing of each
workload, and the checks against this host, are ``replay.fitting``'s.  Real
workloads from a small trace and the paper's generators, real gRPC settings.
"""

from __future__ import annotations

import pytest

from tests.conftest import make_trace
from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay import fitting
from tf_grpc_bench.replay.core import benchmarks, planning, whatif
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, PacingChoice, Timing
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.transport.grpc_settings import GrpcSettings
from tf_grpc_bench.replay.transport.wire import RpcKind, ServerSettings

MIB = 1 << 20


def _throughput(workers: int = 2) -> Workload:
    (workload,), derivation = planning.trace_workloads(
        make_trace(workers=workers, ps=1, sizes=(21, 4096, MIB)),
        [Benchmark.PS_THROUGHPUT],
        mode=Mode.NON_SERIALIZED,
        source="trace",
        trace_name="toy",
    )
    assert derivation is None
    return workload


def test_bytes_in_flight_are_the_largest_calls_the_window_lets_each_worker_have() -> None:
    workload = _throughput(workers=2)
    one = planning.in_flight_bytes(workload, Pacing(timing=Timing.ASAP, window=1))[0]
    two = planning.in_flight_bytes(workload, Pacing(timing=Timing.ASAP, window=2))[0]
    assert one > MIB * 2
    assert two > one
    # Each call counts both ways; two workers each hold their own largest calls at once.
    sizes = sorted(
        (
            c.request_bytes + c.response_bytes
            for c in workload.steps[0].calls
            if c.worker_index == 0
        ),
        reverse=True,
    )
    assert one == 2 * sizes[0]
    assert two == 2 * (sizes[0] + sizes[1])


def test_memory_check_refuses_what_does_not_fit_and_names_the_step() -> None:
    workload = _throughput()
    pacing = Pacing(timing=Timing.ASAP, window=1)
    in_flight, _ = planning.in_flight_bytes(workload, pacing)
    needed = in_flight * planning.MESSAGE_COPIES
    planning.check_memory([workload], [pacing], needed)
    planning.check_memory([workload], [pacing], None)  # unknown memory: no check
    with pytest.raises(ConfigError, match=r"messages in flight at once \(trace step 0\)"):
        planning.check_memory([workload], [pacing], needed - 1)
    with pytest.raises(ConfigError, match="bounded by its memory cgroup /job"):
        planning.check_memory([workload], [pacing], 0, bound="its memory cgroup /job")


def test_payloads_over_the_message_limit_are_refused_unless_chunked() -> None:
    workload = _throughput(workers=1)
    with pytest.raises(ConfigError, match="--max-message-size"):
        planning.fitted_to_messages([workload], GrpcSettings(max_message_bytes=64 * 1024))
    settings = GrpcSettings(max_message_bytes=64 * 1024, chunk_bytes=32 * 1024)
    (chunked,) = planning.fitted_to_messages([workload], settings)
    assert len(chunked.calls) > len(workload.calls)
    assert max(c.payload_bytes for c in chunked.calls) <= 32 * 1024
    assert sum(c.payload_bytes for c in chunked.calls) == sum(
        c.payload_bytes for c in workload.calls
    )


def test_process_and_target_counts_are_checked_against_the_workload() -> None:
    workload = _throughput(workers=2)
    planning.check_processes([workload], local_servers=True, limit=2)
    with pytest.raises(ConfigError, match="2 workers, each a process of its own: at most 1"):
        planning.check_processes([workload], local_servers=True, limit=1)
    planning.check_target_count(None, [workload])
    planning.check_target_count(1, [workload])
    with pytest.raises(ConfigError, match="needs 1 ps server"):
        planning.check_target_count(0, [workload])


def test_a_what_if_keeps_the_captured_cluster_where_nothing_is_asked() -> None:
    trace = make_trace(workers=2, ps=1)
    assert planning.what_if_of(trace) is None
    asked = planning.what_if_of(trace, ps=2)
    assert asked == whatif.WhatIf(workers=2, ps=2)


def test_pacing_defaults_to_dependencies_for_a_trace_throughput_and_asap_otherwise() -> None:
    traced = _throughput()
    (synthetic,) = planning.synthetic_workloads(
        [Benchmark.P2P_LATENCY], GeneratorConfig(), mode=Mode.NON_SERIALIZED
    )
    nothing = PacingChoice()
    assert fitting.pacing_for(traced, RpcKind.UNARY, nothing).timing is Timing.DEPENDENCIES
    assert fitting.pacing_for(synthetic, RpcKind.UNARY, nothing).timing is Timing.ASAP
    with pytest.raises(UsageError, match="--compute applies only to --pacing dependencies"):
        fitting.pacing_for(synthetic, RpcKind.UNARY, PacingChoice(compute_scale=0.5))
    with pytest.raises(UsageError, match="--rate applies only to --pacing rate"):
        fitting.pacing_for(synthetic, RpcKind.UNARY, PacingChoice(rate_per_s=10.0))
    with pytest.raises(UsageError, match="--rpc streaming applies to the synthetic"):
        fitting.rpc_for(traced, RpcKind.STREAMING)


def test_planning_a_request_fits_every_workload_and_gives_each_its_rpc_and_pacing() -> None:
    workloads = planning.synthetic_workloads(
        [Benchmark.P2P_LATENCY, Benchmark.P2P_BANDWIDTH],
        GeneratorConfig(),
        mode=Mode.NON_SERIALIZED,
    )
    planned = fitting.plan_workloads(
        workloads, settings=GrpcSettings(), targets=None, rpc=None, pacing=PacingChoice()
    )
    assert planned.rpcs == (RpcKind.UNARY, RpcKind.STREAMING)
    assert [p.window for p in planned.pacings] == [1, benchmarks.STREAMING_BANDWIDTH_WINDOW]
    threads = ServerSettings().max_workers
    room = threads - fitting.STREAM_THREADS_KEPT_FREE
    fitting.check_stream_threads(planned.workloads[1:], planned.rpcs[1:], channels=room)
    with pytest.raises(ConfigError, match=f"= {threads} streams per ps server"):
        fitting.check_stream_threads(planned.workloads[1:], planned.rpcs[1:], channels=threads)
