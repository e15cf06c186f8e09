"""Chunking large payloads into several calls: bytes and order kept, no chunk over the limit."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload, trace_workload
from tf_grpc_bench.replay.core.chunking import chunk_call, chunk_sizes, chunk_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
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
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.transport.driver import EXPIRED_TIMEOUT_S, PayloadDeadlines
from tf_grpc_bench.replay.transport.grpc_settings import GrpcSettings
from tf_grpc_bench.replay.transport.server import ReplayServer
from tf_grpc_bench.sizes import SizeCategory

from .conftest import make_trace
from .engines import grpc_cpp_program

CLI = str(Path(sys.executable).parent / "tf-grpc-bench")

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


# --------------------------------------------------------------------------
# Exact cuts, worked out by hand.


@pytest.mark.parametrize(
    ("payload", "chunk", "sizes"),
    [
        (0, 0, (0,)),
        (0, 10, (0,)),
        (10, 0, (10,)),
        (10, 10, (10,)),
        (11, 10, (10, 1)),
        (20, 10, (10, 10)),
        (25, 10, (10, 10, 5)),
        (1, 1, (1,)),
        (3, 1, (1, 1, 1)),
    ],
)
def test_chunk_sizes_are_full_chunks_and_the_rest(
    payload: int, chunk: int, sizes: tuple[int, ...]
) -> None:
    assert chunk_sizes(payload, chunk) == sizes


def test_a_negative_payload_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^payload_bytes must be >= 0, got -1$"):
        chunk_sizes(-1, 10)


class Limit:
    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes


def _pull(mode: Mode, response_bytes: int = 2500) -> Call:
    return pull_call(
        method="/tensorflow.WorkerService/RecvTensor",
        request_bytes=120,
        response_bytes=response_bytes,
        mode=mode,
        tensor_name="w",
        server_index=2,
        worker_index=3,
        step=4,
        offset_ns=500,
        outstanding_at_start=1,
        reversed_direction=True,
    )


@pytest.mark.parametrize("mode", list(Mode))
def test_a_pull_is_cut_into_pulls_of_the_same_tensor_step_and_pair(mode: Mode) -> None:
    chunks = chunk_call(_pull(mode), Limit(1000), mode)
    assert [c.response_bytes for c in chunks] == [1000, 1000, 500]
    for chunk in chunks:
        assert (chunk.shape, chunk.method, chunk.request_bytes) == (
            Shape.PULL,
            "/tensorflow.WorkerService/RecvTensor",
            120,
        )
        assert (chunk.tensor_name, chunk.server_index, chunk.worker_index, chunk.step) == (
            "w",
            2,
            3,
            4,
        )
        assert (chunk.offset_ns, chunk.outstanding_at_start, chunk.reversed_direction) == (
            500,
            1,
            True,
        )
    assert [(c.chunk_index, c.chunk_count) for c in chunks] == [(0, 3), (1, 3), (2, 3)]
    fits = _pull(mode, response_bytes=1000)
    assert chunk_call(fits, Limit(1000), mode) == (fits,)
    assert chunk_call(fits, Limit(0), mode) == (fits,)
    assert (fits.chunk_index, fits.chunk_count) == (0, 1)


def test_an_ack_payload_is_cut_across_its_buffers() -> None:
    call = replace(
        ack_call((300, 500, 200), Mode.NON_SERIALIZED, server_index=1, worker_index=2),
        step=5,
        offset_ns=60,
        tensor_name="g",
        outstanding_at_start=2,
        reversed_direction=True,
    )
    chunks = chunk_call(call, Limit(400), Mode.NON_SERIALIZED)
    assert [c.buffers for c in chunks] == [(300, 100), (400,), (200,)]
    assert [(c.request_bytes, c.response_bytes) for c in chunks] == [(400, 8), (400, 8), (200, 8)]
    for chunk in chunks:
        assert (chunk.shape, chunk.method, chunk.server_index, chunk.worker_index) == (
            Shape.ACK,
            call.method,
            1,
            2,
        )
        assert (chunk.step, chunk.offset_ns, chunk.tensor_name) == (5, 60, "g")
        assert (chunk.outstanding_at_start, chunk.reversed_direction) == (2, True)


def test_an_echo_payload_is_cut_into_echoes() -> None:
    call = echo_call((1000,), Mode.NON_SERIALIZED)
    chunks = chunk_call(call, Limit(300), Mode.NON_SERIALIZED)
    assert [(c.shape, c.buffers, c.request_bytes, c.response_bytes) for c in chunks] == [
        (Shape.ECHO, (300,), 300, 300),
        (Shape.ECHO, (300,), 300, 300),
        (Shape.ECHO, (300,), 300, 300),
        (Shape.ECHO, (100,), 100, 100),
    ]
    assert chunk_call(call, Limit(1000), Mode.NON_SERIALIZED) == (call,)


def test_a_workload_is_cut_step_by_step_and_says_so() -> None:
    workload = synthetic_workload(
        Benchmark.P2P_BANDWIDTH,
        GeneratorConfig(categories=(SizeCategory.MEDIUM,), buffers_per_payload=3, payload_count=2),
        mode=Mode.NON_SERIALIZED,
    )
    chunked = chunk_workload(workload, Limit(20_000))
    # Each payload is 3 x 10 KiB = 30,720 B: 20,000 + 10,720.
    assert [c.buffers for c in chunked.calls] == [
        (10_240, 9_760),
        (480, 10_240),
    ] * 2
    assert chunked.description == (*workload.description, ("chunk_bytes", 20_000))
    assert chunked.mode is workload.mode


def test_a_pull_in_two_chunks_and_a_last_chunk_protobuf_cannot_encode() -> None:
    # 2002 B in 1000 B chunks: the last is 2 B, which a serialized PullResponse cannot be
    # (sent as an empty message); raw bytes can.
    raw = chunk_call(_pull(Mode.NON_SERIALIZED, 2002), Limit(1000), Mode.NON_SERIALIZED)
    assert [c.response_bytes for c in raw] == [1000, 1000, 2]
    serialized = chunk_call(_pull(Mode.SERIALIZED, 2002), Limit(1000), Mode.SERIALIZED)
    assert [c.response_bytes for c in serialized] == [1000, 1000, 0]
    two = chunk_call(_pull(Mode.NON_SERIALIZED, 1500), Limit(1000), Mode.NON_SERIALIZED)
    assert [c.response_bytes for c in two] == [1000, 500]


def test_a_workload_is_cut_in_its_own_mode() -> None:
    call = _pull(Mode.NON_SERIALIZED, 2002)
    workload = Workload(
        benchmark=Benchmark.P2P_LATENCY,
        source="trace",
        mode=Mode.NON_SERIALIZED,
        steps=(WorkloadStep(index=0, calls=(call,)),),
        server_count=3,
        worker_count=4,
    )
    chunked = chunk_workload(workload, Limit(1000))
    assert [c.response_bytes for c in chunked.calls] == [1000, 1000, 2]


def test_a_chunk_one_byte_short_takes_it_from_the_next_buffer() -> None:
    call = replace(ack_call((399, 2), Mode.NON_SERIALIZED), method="/tensorflow.WorkerService/X")
    chunks = chunk_call(call, Limit(400), Mode.NON_SERIALIZED)
    assert [c.buffers for c in chunks] == [(399, 1), (1,)]
    assert [c.method for c in chunks] == ["/tensorflow.WorkerService/X"] * 2


def _raw_pull(request_bytes: int, response_bytes: int) -> Call:
    return pull_call(
        method="/tensorflow.WorkerService/RecvTensor",
        request_bytes=request_bytes,
        response_bytes=response_bytes,
        mode=Mode.NON_SERIALIZED,
    )


def test_a_reversed_pull_cuts_its_request_and_repeats_its_small_response() -> None:
    # A gradient pushed in the request (2,500 B) with a 120 B answer, in 1,000 B chunks.
    chunks = chunk_call(_raw_pull(2_500, 120), Limit(1_000), Mode.NON_SERIALIZED)
    assert [(c.request_bytes, c.response_bytes) for c in chunks] == [
        (1_000, 120),
        (1_000, 120),
        (500, 120),
    ]


def test_when_both_directions_are_cut_the_shorter_ends_in_empty_messages() -> None:
    longer_request = chunk_call(_raw_pull(2_500, 1_500), Limit(1_000), Mode.NON_SERIALIZED)
    assert [(c.request_bytes, c.response_bytes) for c in longer_request] == [
        (1_000, 1_000),
        (1_000, 500),
        (500, 0),
    ]
    longer_response = chunk_call(_raw_pull(1_500, 2_500), Limit(1_000), Mode.NON_SERIALIZED)
    assert [(c.request_bytes, c.response_bytes) for c in longer_response] == [
        (1_000, 1_000),
        (500, 1_000),
        (0, 500),
    ]


def test_chunk_count_says_how_many_calls_a_call_becomes() -> None:
    from tf_grpc_bench.replay.core.chunking import chunk_count

    assert chunk_count(_raw_pull(120, 2_500), 1_000) == 3
    assert chunk_count(_raw_pull(2_500, 120), 1_000) == 3
    assert chunk_count(_raw_pull(2_500, 1_500), 1_000) == 3
    assert chunk_count(_raw_pull(2_000, 1_000), 1_000) == 2  # exact multiples
    assert chunk_count(_raw_pull(120, 2_500), 0) == 1  # no chunking
    assert chunk_count(_raw_pull(3, 2), 1) == 3
    assert chunk_count(_raw_pull(0, 0), 1_000) == 1
    assert chunk_count(_raw_pull(1_000, 1_000), 1_000) == 1
    # Echo and ack: the payload's buffers, not the message (3 fields of overhead here).
    echo = echo_call((600, 600, 900), Mode.SERIALIZED)
    assert echo.request_bytes == 2_109
    assert chunk_count(echo, 1_000) == 3
    exact = echo_call((1_000,), Mode.SERIALIZED)
    assert exact.request_bytes == 1_003
    assert chunk_count(exact, 1_000) == 1
    assert chunk_count(ack_call((600, 600, 900), Mode.NON_SERIALIZED), 2_100) == 1
    # And chunk_call makes that many.
    for call, chunk, mode in (
        (_raw_pull(2_500, 1_500), 1_000, Mode.NON_SERIALIZED),
        (echo, 1_000, Mode.SERIALIZED),
        (exact, 1_000, Mode.SERIALIZED),
    ):
        assert len(chunk_call(call, Limit(chunk), mode)) == chunk_count(call, chunk)


def test_a_serialized_workload_is_cut_in_serialized_mode() -> None:
    # 2002 B in 1000 B chunks: the last 2 B cannot be a serialized PullResponse (empty).
    call = _pull(Mode.SERIALIZED, 2002)
    workload = Workload(
        benchmark=Benchmark.P2P_LATENCY,
        source="trace",
        mode=Mode.SERIALIZED,
        steps=(WorkloadStep(index=0, calls=(call,)),),
        server_count=3,
        worker_count=4,
    )
    chunked = chunk_workload(workload, Limit(1000))
    assert [c.response_bytes for c in chunked.calls] == [1000, 1000, 0]


# --------------------------------------------------------------------------
# One deadline for the chunks of one payload.


def test_the_chunks_of_a_payload_share_the_deadline_its_first_chunk_got() -> None:
    now = [0]
    deadlines = PayloadDeadlines(2.0, lambda: now[0])
    whole = _pull(Mode.NON_SERIALIZED, response_bytes=10)
    first, second, third = chunk_call(_pull(Mode.NON_SERIALIZED), Limit(1000), Mode.NON_SERIALIZED)
    assert deadlines.timeout_s(first, 5) == 2.0
    now[0] = 1_500_000_000
    assert deadlines.timeout_s(whole, 8) == 2.0  # a whole payload gets its own
    assert deadlines.timeout_s(second, 6) == pytest.approx(0.5)
    now[0] = 3_000_000_000
    assert deadlines.timeout_s(third, 7) == EXPIRED_TIMEOUT_S
    # Another payload's chunks start a deadline of their own.
    assert deadlines.timeout_s(first, 9) == 2.0


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_a_payload_of_a_terabyte_in_chunks_ends_at_its_deadline(
    tmp_path: Path, engine: str
) -> None:
    if engine == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    path = tmp_path / "huge.tfgbtrace"
    trace_files.write_trace(make_trace(steps=1, sizes=(10**12,)), path)
    completed = subprocess.run(
        [CLI, "replay", str(path), "--benchmark", "p2p-latency", "--chunk-size", "64MB",
         "--deadline", "2", "--output-dir", str(tmp_path / "out"), "--quiet",
         "--engine", engine],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode != 0
    (line,) = completed.stderr.splitlines()
    assert "[DEADLINE_EXCEEDED]" in line and "--deadline bounds them together" in line
    assert f"of the {-(-(10**12) // 2**26)} that carry one payload" in line  # 64 MiB chunks


@pytest.mark.parametrize("mode", list(Mode))
def test_a_payload_cut_in_two_numbers_both_chunks(mode: Mode) -> None:
    # The smallest cut: 1,500 B in chunks of 1,000 is two calls, 0 and 1 of 2, so that
    # the driver gives both one deadline together.
    chunks = chunk_call(_pull(mode, response_bytes=1_500), Limit(1_000), mode)
    assert [(c.chunk_index, c.chunk_count) for c in chunks] == [(0, 2), (1, 2)]
    echo = echo_call((900, 600), mode)
    assert [(c.chunk_index, c.chunk_count) for c in chunk_call(echo, Limit(1_000), mode)] == [
        (0, 2),
        (1, 2),
    ]
