"""Measurements and the figures derived from them, on runs whose every figure is worked out
by hand: rates per run and their mean, percentiles, per-category latencies, step
communication, CPU use."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest

from tf_grpc_bench.replay.core.measurement import (
    PERCENTILES,
    SAMPLE_COLUMNS,
    Benchmark,
    BenchmarkResult,
    CallSample,
    LatencySummary,
    RunMeasurement,
    release_held,
)
from tf_grpc_bench.replay.output.statistics import cpu_utilization, run_statistics
from tf_grpc_bench.sizes import SizeCategory


def _sample(
    latency_ns: int, payload: int = 10, *, request: int = 10, response: int = 10, lag: int = 0
) -> CallSample:
    return CallSample(
        start_ns=0,
        latency_ns=latency_ns,
        request_bytes=request,
        response_bytes=response,
        payload_bytes=payload,
        release_lag_ns=lag,
    )


def _run(index: int, duration_ns: int, samples: list[CallSample], **fields) -> RunMeasurement:  # type: ignore[no-untyped-def]
    return RunMeasurement(
        run_index=index, duration_ns=duration_ns, samples=tuple(samples), **fields
    )


def _result(*runs: RunMeasurement) -> BenchmarkResult:
    return BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY, workload="synthetic", parameters={}, runs=runs
    )


def test_the_benchmarks_and_percentiles_are_the_papers_and_ours() -> None:
    assert [b.value for b in Benchmark] == ["p2p-latency", "p2p-bandwidth", "ps-throughput"]
    assert PERCENTILES == (50.0, 90.0, 99.0, 99.9)
    assert SAMPLE_COLUMNS == (
        "start_ns",
        "latency_ns",
        "request_bytes",
        "response_bytes",
        "payload_bytes",
        "server_index",
        "worker_index",
        "step",
        "release_lag_ns",
        "rpc_index",
        "window_held",
    )


def test_a_call_is_held_by_the_window_when_its_opening_came_after_the_release() -> None:
    # The window refused a due call and the completion that opened it ended at 500.
    assert release_held(400, 500) == 1
    assert release_held(500, 500) == 1
    # Released after that opening: any lateness is the replay's own.
    assert release_held(501, 500) == 0
    # No planned release (closed loop), or a window that never refused.
    assert release_held(None, 500) == 0
    assert release_held(0, -1) == 0


def test_the_unheld_release_lag_leaves_out_the_calls_the_window_held() -> None:
    def sample(lag_ns: int, held: int) -> CallSample:
        return CallSample(
            start_ns=0, latency_ns=1, request_bytes=1, response_bytes=1, payload_bytes=1,
            release_lag_ns=lag_ns, window_held=held,
        )  # fmt: skip

    run = RunMeasurement(
        run_index=0,
        duration_ns=10,
        samples=(sample(10, 0), sample(20, 0), sample(9_000, 1), sample(8_000, 1)),
    )
    result = BenchmarkResult(
        benchmark=Benchmark.PS_THROUGHPUT, workload="trace", parameters={}, runs=(run,)
    )
    assert result.release_lag.max_ns == 9_000
    assert (result.unheld_release_lag.count, result.unheld_release_lag.max_ns) == (2, 20)


def test_a_negative_latency_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^latency_ns must be >= 0, got -1$"):
        _sample(-1)
    assert _sample(0).latency_ns == 0


def test_latency_summary_of_ten_latencies() -> None:
    # 1..10 us: numpy's linear percentiles put p50 at 5.5, p90 at 9.1, p99 at 9.91.
    summary = LatencySummary.from_samples([i * 1000 for i in range(10, 0, -1)])
    assert (summary.count, summary.mean_ns, summary.min_ns, summary.max_ns) == (
        10,
        5500.0,
        1000.0,
        10000.0,
    )
    assert (summary.p50_ns, summary.p90_ns, summary.p99_ns, summary.p999_ns) == pytest.approx(
        (5500.0, 9100.0, 9910.0, 9991.0), abs=1e-6
    )


def test_latency_summary_of_nothing_is_all_nan() -> None:
    summary = LatencySummary.from_samples([])
    assert summary.count == 0
    values = [
        summary.mean_ns,
        summary.min_ns,
        summary.p50_ns,
        summary.p90_ns,
        summary.p99_ns,
        summary.p999_ns,
        summary.max_ns,
    ]
    assert all(math.isnan(v) for v in values)


def test_run_totals_count_requests_and_responses() -> None:
    run = _run(0, 10, [_sample(1, request=100, response=7), _sample(1, request=20, response=3)])
    assert (run.rpc_count, run.request_bytes, run.response_bytes) == (2, 120, 10)


def test_rates_are_the_mean_of_each_runs_rate() -> None:
    # Run 0: 4 calls in 2 s = 2/s, 4 x 300 B = 1200 B / 2 s = 600 B/s.
    # Run 1: 3 calls in 1 s = 3/s, 3 x 300 B = 900 B/s.
    first = _run(0, 2_000_000_000, [_sample(10, request=100, response=200)] * 4)
    second = _run(1, 1_000_000_000, [_sample(20, request=100, response=200)] * 3)
    result = _result(first, second)
    assert result.rpc_count == 7
    assert result.rpcs_per_s == 2.5
    assert result.bytes_per_s == 750.0
    assert result.bandwidth_mb_per_s == 0.00075


def test_a_run_of_no_duration_is_left_out_of_the_means() -> None:
    timed = _run(0, 1_000_000_000, [_sample(10, request=1, response=1)] * 4)
    untimed = _run(1, 0, [_sample(10)] * 9)
    result = _result(timed, untimed)
    assert (result.rpcs_per_s, result.bytes_per_s) == (4.0, 8.0)
    nothing = _result(untimed)
    assert math.isnan(nothing.rpcs_per_s) and math.isnan(nothing.bytes_per_s)


def test_latencies_pool_the_runs_and_split_by_size_category() -> None:
    first = _run(0, 1, [_sample(100, 10), _sample(300, 1 << 20)])
    second = _run(1, 1, [_sample(200, 10), _sample(900, 2048), _sample(500, 10)])
    result = _result(first, second)
    assert (result.latency_all.count, result.latency_all.mean_ns) == (5, 400.0)
    assert [(c, s.count, s.mean_ns, s.max_ns) for c, s in result.latency_by_category] == [
        (SizeCategory.SMALL, 3, 266.6666666666667, 500.0),
        (SizeCategory.MEDIUM, 1, 900.0, 900.0),
        (SizeCategory.LARGE, 1, 300.0, 300.0),
    ]
    only_small = _result(_run(0, 1, [_sample(5, 0)]))
    assert [c for c, _ in only_small.latency_by_category] == [SizeCategory.SMALL]


def test_steps_compute_and_communication_over_runs() -> None:
    first = _run(0, 1, [], step_times_ns=(100, 200), step_compute_ns=(30, 50))
    second = _run(1, 1, [], step_times_ns=(400,), step_compute_ns=(100,))
    result = _result(first, second)
    assert result.step_times_ns == (100, 200, 400)
    assert result.step_compute_ns == (30, 50, 100)
    assert result.step_communication_ns == (70, 150, 300)
    assert (result.step_time.count, result.step_time.mean_ns, result.step_time.max_ns) == (
        3,
        700 / 3,
        400.0,
    )
    # Without compute recorded (not dependency pacing), there is no communication split.
    assert _result(_run(0, 1, [], step_times_ns=(5, 6))).step_communication_ns == ()


def test_release_lag_and_cpu_add_up_over_runs() -> None:
    first = _run(0, 1, [_sample(1, lag=10), _sample(1, lag=30)], client_cpu_ns=5, server_cpu_ns=7)
    second = _run(1, 1, [_sample(1, lag=50)], client_cpu_ns=11, server_cpu_ns=13)
    result = _result(first, second)
    assert (result.release_lag.count, result.release_lag.mean_ns) == (3, 30.0)
    assert (result.client_cpu_ns, result.server_cpu_ns) == (16, 20)


def test_run_statistics_of_one_run() -> None:
    run = _run(
        3,
        500_000_000,
        [_sample(1000, request=1_000_000, response=500_000)] * 2,
        step_times_ns=(10, 30),
        client_cpu_ns=8,
        server_cpu_ns=9,
        partial=True,
        partial_reason="why",
    )
    stats = run_statistics(run)
    assert (stats.run_index, stats.rpc_count, stats.duration_ns) == (3, 2, 500_000_000)
    assert stats.rpcs_per_s == 4.0
    assert stats.bytes_per_s == 6_000_000.0
    assert stats.bandwidth_mb_per_s == 6.0
    assert (stats.latency.count, stats.latency.mean_ns) == (2, 1000.0)
    assert (stats.step_time.count, stats.step_time.mean_ns) == (2, 20.0)
    assert (stats.client_cpu_ns, stats.server_cpu_ns, stats.partial) == (8, 9, True)


def test_run_statistics_of_a_run_of_no_duration_are_nan() -> None:
    stats = run_statistics(_run(0, 0, [_sample(1)]))
    assert math.isnan(stats.rpcs_per_s)
    assert math.isnan(stats.bytes_per_s)
    assert math.isnan(stats.bandwidth_mb_per_s)


def test_cpu_utilization_is_cpu_time_over_measured_time() -> None:
    result = _result(_run(0, 2_000, []), _run(1, 3_000, []))
    assert cpu_utilization(2_500, result) == 0.5
    assert cpu_utilization(10_000, result) == 2.0
    assert math.isnan(cpu_utilization(5, _result(_run(0, 0, []))))


def test_inexact_sizes_refuse_nonsense_and_describe_themselves() -> None:
    from tf_grpc_bench.replay.core.measurement import InexactSizes

    inexact = InexactSizes(
        calls_per_pass=1, traced_bytes=0, replayed_bytes=0, examples="1 B -> 0 B x1"
    )
    assert inexact.describe() == (
        "1 traced message sizes per pass cannot be encoded exactly in serialized mode "
        "(1 B -> 0 B x1): 0 B replayed for 0 B traced"
    )
    with pytest.raises(ValueError, match=r"^calls_per_pass must be >= 1, got 0$"):
        InexactSizes(calls_per_pass=0, traced_bytes=1, replayed_bytes=1, examples="")
    for traced, replayed in ((-1, 1), (1, -1)):
        with pytest.raises(ValueError, match=r"^traced_bytes and replayed_bytes must be >= 0$"):
            InexactSizes(
                calls_per_pass=1, traced_bytes=traced, replayed_bytes=replayed, examples=""
            )


def test_a_result_whose_runs_measured_no_time_has_no_rate_and_says_nothing_of_it() -> None:
    """Rates are NaN (not applicable) without numpy's warning about an empty mean."""
    sample = CallSample(
        start_ns=0, latency_ns=5, request_bytes=3, response_bytes=4, payload_bytes=4
    )
    timeless = RunMeasurement(run_index=0, duration_ns=0, samples=(sample,))
    result = BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY, workload="synthetic", parameters={}, runs=(timeless,)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(result.rpcs_per_s)
        assert math.isnan(result.bytes_per_s)
        assert math.isnan(result.bandwidth_mb_per_s)
    timed = RunMeasurement(run_index=1, duration_ns=2 * 10**9, samples=(sample, sample))
    both = dataclasses.replace(result, runs=(timeless, timed))
    # Only the run that measured time counts: 2 calls in 2 s, 14 bytes in 2 s.
    assert (both.rpcs_per_s, both.bytes_per_s) == (1.0, 7.0)
