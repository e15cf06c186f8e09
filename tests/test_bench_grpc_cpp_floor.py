"""gRPC C++'s bare floors (``bench/grpc_cpp_floor.py``, ``bench/grpc_cpp_echo.cc``) run:
the echo's round trips and the push, streamed and unary, each acknowledged push counted."""

from __future__ import annotations

import pytest

from tf_grpc_bench.replay.native.build import EngineUnavailable

from .conftest import load_bench_script

floor = load_bench_script("grpc_cpp_floor.py", "bench_grpc_cpp_floor")
replay_vs_raw = load_bench_script("replay_vs_raw.py", "bench_replay_vs_raw")


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    try:
        floor.build_echo()
    except EngineUnavailable as error:
        pytest.skip(f"gRPC C++ cannot be built here: {error}")


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "unary"])
def test_the_bare_push_moves_whole_messages(streamed: bool) -> None:
    mb_per_s, cpu_ns = floor.push_bandwidth(64 * 1024, 0.2, streamed=streamed)
    assert mb_per_s > 0 and cpu_ns > 0


def test_the_bare_echo_times_round_trips() -> None:
    times, cpu_ns = floor.round_trips_ns(1000, 0.2)
    assert len(times) > 0 and (times > 0).all() and cpu_ns > 0


def test_the_bare_push_rows_are_set_against_iperf3_and_the_replay() -> None:
    figures = replay_vs_raw.Figures()
    bandwidth = replay_vs_raw.Bandwidth
    mib = replay_vs_raw.MIB
    figures.bandwidth += [
        bandwidth(tool="iperf3", size_bytes=0, pass_index=1, mb_per_s=2000.0),
        bandwidth(
            tool="bare gRPC C++ push, streamed", size_bytes=mib, pass_index=1, mb_per_s=1600.0
        ),
        bandwidth(tool="replay grpc-cpp", size_bytes=mib, pass_index=1, mb_per_s=1200.0),
    ]
    found = dict(replay_vs_raw.ratios(figures))
    assert found["bare gRPC C++ push, streamed bandwidth 1 MiB / iperf3"] == 0.8
    assert found["replay grpc-cpp bandwidth 1 MiB / bare gRPC C++ push, streamed"] == 0.75
    sentences = replay_vs_raw.native_findings(figures)
    assert any("bare push of 1 MiB" in s and "= 0.80 of iperf3's" in s for s in sentences)
