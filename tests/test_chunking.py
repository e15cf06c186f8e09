"""Chunking large payloads into several calls: bytes and order kept, no chunk over the limit."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.core.chunking import chunk_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.workload import Mode, Shape, synthetic_workload, trace_workload
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.transport.grpc_settings import GrpcSettings
from tf_grpc_bench.replay.transport.server import ReplayServer

from .conftest import make_trace

CHUNK = 256 * 1024


@pytest.mark.parametrize("benchmark", list(Benchmark))
def test_trace_workloads_keep_their_bytes_and_order_in_chunks(benchmark: Benchmark) -> None:
    trace = make_trace(sizes=(21, 4096, 1 << 20, 3 * (1 << 20) + 5))
    workload = trace_workload(trace, benchmark, mode=Mode.NON_SERIALIZED)
    chunked = chunk_workload(workload, GrpcSettings(chunk_bytes=CHUNK))
    for before, after in zip(workload.steps, chunked.steps, strict=True):
        assert before.response_bytes == after.response_bytes
        assert all(c.payload_bytes <= CHUNK for c in after.calls)
        # Chunks of one tensor stay together, tensors in their order.
        names = [c.tensor_name for c in after.calls]
        assert [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n] == [
            c.tensor_name for c in before.calls
        ]
    assert dict(chunked.description)["chunk_bytes"] == CHUNK


@settings(max_examples=30, deadline=None)
@given(chunk=st.integers(min_value=1024, max_value=3 << 20))
def test_synthetic_payloads_split_into_buffers_that_add_up(chunk: int) -> None:
    workload = synthetic_workload(
        Benchmark.P2P_BANDWIDTH, GeneratorConfig(), mode=Mode.NON_SERIALIZED
    )
    chunked = chunk_workload(workload, GrpcSettings(chunk_bytes=chunk))
    before = sum(sum(c.buffers) for c in workload.calls)
    after = sum(sum(c.buffers) for c in chunked.calls)
    assert before == after
    assert all(sum(c.buffers) <= chunk for c in chunked.calls)
    assert {c.shape for c in chunked.calls} == {Shape.ACK}


def test_without_a_chunk_size_the_workload_is_unchanged() -> None:
    workload = synthetic_workload(Benchmark.P2P_LATENCY, GeneratorConfig(), mode=Mode.SERIALIZED)
    assert chunk_workload(workload, GrpcSettings()) is workload


def test_a_chunked_replay_delivers_every_chunk_to_a_real_server(tmp_path: Path) -> None:
    trace = make_trace(steps=1, sizes=(1 << 20,))
    path = tmp_path / "t.tfgbtrace"
    trace_files.write_trace(trace, path)
    workload = chunk_workload(
        trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED),
        GrpcSettings(chunk_bytes=CHUNK),
    )
    assert len(workload.calls) == 4
    with ReplayServer(mode=Mode.NON_SERIALIZED) as server:
        result = run_benchmark(
            workload,
            [server.address],
            plan=RunPlan(warmup_ns=0, duration_ns=1, runs=1, steps=1),
        )
    (run,) = result.runs
    assert len(run.samples) == 4
    assert sum(s.response_bytes for s in run.samples) == 1 << 20
    assert run.server_received_messages == 4
