"""A benchmark is a row and a timing is a row: a toy of each, registered here, replays end to end.

The toy benchmark ("ping-pong": one worker pushes each payload to one ps and
pulls it back, from a worker process of its own) and the toy timing
("half-rate": calls at half of ``--rate``) live in this file alone: nothing
else in the repository names them.  They are registered through the tables
(``core.benchmarks.register``, ``core.pacing.register_timing``), run by the
command line in this process on loopback, and withdrawn again.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from tf_grpc_bench import cli
from tf_grpc_bench.replay.core import benchmarks, pacing
from tf_grpc_bench.replay.core.benchmarks import BenchmarkSpec, Defaults
from tf_grpc_bench.replay.core.generators import GeneratorConfig, generate_payloads
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, PacingError, Timing, TimingSpec
from tf_grpc_bench.replay.core.workload import (
    Call,
    Mode,
    Workload,
    WorkloadStep,
    ack_call,
    echo_call,
)
from tf_grpc_bench.replay.output.document_reader import read_document

RATE_PER_S = 200.0


def ping_pong_workload(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> Workload:
    """Each payload pushed to ps 0 (acknowledged), then echoed off it."""
    calls: list[Call] = []
    for payload in generate_payloads(generator):
        calls += [ack_call(payload, mode), echo_call(payload, mode)]
    return Workload(
        benchmark=benchmark,
        source="synthetic",
        mode=mode,
        steps=(WorkloadStep(index=-1, calls=tuple(calls)),),
        server_count=1,
        worker_count=1,
        description=(("shape", "ping-pong"), ("payloads", generator.payload_count)),
    )


def half_rate_release(pace: Pacing, call: Call, number: int, step_ns: int, run_ns: int) -> int:
    return run_ns + round(number * 2e9 / pace.rate_per_s)


def half_rate_label(pace: Pacing) -> str:
    return f"half-rate {pace.rate_per_s / 2:g}/s"


@pytest.fixture
def toy_rows() -> Iterator[tuple[Benchmark, Timing]]:
    benchmark = benchmarks.register(
        BenchmarkSpec(
            name="ping-pong",
            summary="one worker pushes each payload to one ps and pulls it back",
            synthetic=Defaults(window=1),
            trace=Defaults(window=1),
            build_synthetic=ping_pong_workload,
            build_trace=benchmarks.spec_of(Benchmark.P2P_LATENCY).build_trace,
            point_to_point=True,
            worker_processes=True,
        )
    )
    timing = pacing.register_timing(
        TimingSpec(
            name="half-rate",
            summary="calls at half of --rate",
            settings=("rate_per_s",),
            required=("rate_per_s",),
            open_loop=True,
            release=half_rate_release,
            label=half_rate_label,
        )
    )
    try:
        yield benchmark, timing
    finally:
        benchmarks.withdraw(benchmark)
        pacing.withdraw_timing(timing)


def test_a_toy_benchmark_and_timing_replay_end_to_end_on_loopback(
    toy_rows: tuple[Benchmark, Timing], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    benchmark, _ = toy_rows
    status = cli.main(
        [
            "replay",
            "--synthetic",
            "--benchmark",
            "ping-pong",
            "--pacing",
            "half-rate",
            "--rate",
            f"{RATE_PER_S:g}",
            "--payloads",
            "4",
            "--runs",
            "1",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--output-dir",
            str(tmp_path),
            "--quiet",
        ]
    )
    output = capsys.readouterr()
    assert status == 0, output.err
    line = next(x for x in output.out.splitlines() if x.startswith("results: "))
    document = read_document(Path(line.removeprefix("results: ").strip()))
    (result,) = document.benchmarks
    assert result.benchmark is benchmark and not result.partial
    assert result.parameters["pacing"] == "half-rate"
    assert result.parameters["rate_per_s"] == RATE_PER_S
    assert result.parameters["shape"] == "ping-pong"
    # Measured from a worker process of its own (the row says so).
    assert result.parameters["client_processes"] == 1
    (run,) = result.runs
    assert run.rpc_count >= 2
    # Pushes and pulls alternate, as the toy's builder made them.
    by_start = sorted(run.samples, key=lambda s: s.start_ns)
    assert [s.response_bytes < s.request_bytes for s in by_start[:4]] == [True, False] * 2
    # Never released before its time at half the rate: call n at n * 2 / rate.
    gap_ns = round(2e9 / RATE_PER_S)
    for number, sample in enumerate(by_start):
        assert sample.start_ns >= number * gap_ns - 1_000_000
    assert run.rpc_count <= run.duration_ns // gap_ns + 1
    assert run.server_received_bytes == run.request_bytes


def test_the_toy_rows_follow_the_tables_rules(toy_rows: tuple[Benchmark, Timing]) -> None:
    benchmark, timing = toy_rows
    assert benchmarks.parse_benchmarks("all")[-1] is benchmark
    assert list(Benchmark)[-1] is benchmark
    assert Timing("half-rate") is timing
    # A setting the toy timing reads is refused by those that do not, naming both readers.
    with pytest.raises(PacingError, match=r"^--rate applies only to --pacing rate or half-rate$"):
        Pacing(timing=Timing.ASAP, rate_per_s=5.0)
    with pytest.raises(PacingError, match=r"^--pacing half-rate needs --rate CALLS_PER_S$"):
        pacing.resolve_pacing(pacing.PacingChoice(timing=timing), default=Timing.ASAP, window=1)
    toy = Pacing(timing=timing, rate_per_s=10.0)
    assert toy.describe() == "half-rate 5/s, window 1"
    # A worker process unpickles the timing with its row (it never imported this file's rows).
    pickled = pickle.dumps(toy)
    pacing.withdraw_timing(timing)
    assert pickle.loads(pickled).timing is timing
    assert pacing.timing_spec(timing).release is half_rate_release


def test_withdrawn_rows_are_gone() -> None:
    assert "ping-pong" not in benchmarks.names()
    assert [b.value for b in Benchmark] == ["p2p-latency", "p2p-bandwidth", "ps-throughput"]
    assert "half-rate" not in pacing.timing_names()
    with pytest.raises(ValueError, match="not a valid Benchmark"):
        Benchmark("ping-pong")
