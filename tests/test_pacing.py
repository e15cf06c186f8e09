"""Pacing's pure rules, as properties: no call released before its time, windows respected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.pacing import (
    OPEN_LOOP_MAX_IN_FLIGHT,
    Pacing,
    Timing,
    blocking_calls_suffice,
    may_issue,
    next_step_begin_ns,
    release_time_ns,
)
from tf_grpc_bench.replay.core.workload import Call, Shape
from tf_grpc_bench.replay.transport.driver import MAX_SLEEP_S, sleep_until

_times = st.integers(min_value=0, max_value=10**12)


def _call(offset_ns: int = 0, outstanding: int = 0) -> Call:
    return Call(
        shape=Shape.PULL,
        method="/tensorflow.WorkerService/RecvTensor",
        request_bytes=100,
        response_bytes=1000,
        offset_ns=offset_ns,
        outstanding_at_start=outstanding,
    )


@settings(max_examples=200)
@given(offset=_times, begin=_times, speedup=st.sampled_from([0.5, 1.0, 2.0, 7.5]))
def test_recorded_pacing_never_releases_a_call_before_its_scaled_offset(
    offset: int, begin: int, speedup: float
) -> None:
    pacing = Pacing(timing=Timing.RECORDED, window=None, speedup=speedup)
    release = release_time_ns(
        pacing, _call(offset_ns=offset), call_number=0, step_begin_ns=begin, run_begin_ns=0
    )
    assert release == begin + round(offset / speedup)
    assert release is not None and release >= begin


@settings(max_examples=200)
@given(numbers=st.lists(st.integers(min_value=0, max_value=10**6), min_size=2, max_size=20))
def test_rate_pacing_releases_in_call_order_at_the_rate(numbers: list[int]) -> None:
    pacing = Pacing(timing=Timing.RATE, window=None, rate_per_s=250.0)
    releases = [
        release_time_ns(pacing, _call(), call_number=n, step_begin_ns=0, run_begin_ns=1_000)
        for n in sorted(numbers)
    ]
    assert all(r is not None for r in releases)
    assert releases == sorted(releases)  # type: ignore[type-var]
    for number, release in zip(sorted(numbers), releases, strict=True):
        assert release == 1_000 + round(number * 4_000_000)


@pytest.mark.parametrize("timing", [Timing.ASAP, Timing.DEPENDENCIES])
def test_closed_loop_and_dependency_pacing_plan_no_release_time(timing: Timing) -> None:
    assert (
        release_time_ns(
            Pacing(timing=timing), _call(), call_number=3, step_begin_ns=5, run_begin_ns=0
        )
        is None
    )


@settings(max_examples=300)
@given(
    window=st.integers(min_value=1, max_value=64),
    in_flight=st.integers(min_value=0, max_value=128),
    timing=st.sampled_from(list(Timing)),
)
def test_an_explicit_window_caps_calls_in_flight_under_every_timing(
    window: int, in_flight: int, timing: Timing
) -> None:
    rate = 10.0 if timing is Timing.RATE else 0.0
    pacing = Pacing(timing=timing, window=window, rate_per_s=rate)
    assert may_issue(pacing, _call(), in_flight=in_flight, in_flight_to_server=0) == (
        in_flight < window
    )


@settings(max_examples=300)
@given(
    outstanding=st.integers(min_value=0, max_value=50),
    to_server=st.integers(min_value=0, max_value=60),
)
def test_the_recorded_window_keeps_each_pairs_recorded_concurrency(
    outstanding: int, to_server: int
) -> None:
    for timing in (Timing.ASAP, Timing.RECORDED):
        pacing = Pacing(timing=timing, window=None)
        assert may_issue(
            pacing, _call(outstanding=outstanding), in_flight=10**6, in_flight_to_server=to_server
        ) == (to_server <= outstanding)


@pytest.mark.parametrize("timing", [Timing.RATE, Timing.DEPENDENCIES])
def test_open_loop_timings_without_a_window_stop_at_the_in_flight_cap(timing: Timing) -> None:
    pacing = Pacing(timing=timing, window=None, rate_per_s=10.0 if timing is Timing.RATE else 0.0)
    call = _call()
    assert may_issue(pacing, call, in_flight=OPEN_LOOP_MAX_IN_FLIGHT - 1, in_flight_to_server=0)
    assert not may_issue(pacing, call, in_flight=OPEN_LOOP_MAX_IN_FLIGHT, in_flight_to_server=0)


@settings(max_examples=200)
@given(begin=_times, length=_times, period=_times, speedup=st.sampled_from([0.5, 1.0, 3.0]))
def test_a_recorded_step_begins_no_sooner_than_its_period_nor_before_the_last_ended(
    begin: int, length: int, period: int, speedup: float
) -> None:
    pacing = Pacing(timing=Timing.RECORDED, window=None, speedup=speedup)
    following = next_step_begin_ns(
        pacing, previous_begin_ns=begin, previous_end_ns=begin + length, recorded_period_ns=period
    )
    assert following == max(begin + round(period / speedup), begin + length)
    asap = next_step_begin_ns(
        Pacing(), previous_begin_ns=begin, previous_end_ns=begin + length, recorded_period_ns=period
    )
    assert asap == begin + length


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"timing": Timing.ASAP, "compute_scale": 0.5}, "--compute applies only to --pacing dep"),
        ({"timing": Timing.DEPENDENCIES, "compute_scale": -0.1}, "--compute must be"),
        ({"timing": Timing.DEPENDENCIES, "compute_scale": 101.0}, "--compute must be"),
        ({"window": 0}, "--outstanding must be >= 1, got 0"),
        ({"timing": Timing.RATE}, r"^--rate must be in \(0, 1e\+07\] calls/s, got 0$"),
        (
            {"timing": Timing.RATE, "rate_per_s": -1.0},
            r"^--rate must be in \(0, 1e\+07\] calls/s, got -1$",
        ),
        ({"rate_per_s": 5.0}, r"^--rate applies only to --pacing rate$"),
        ({"speedup": 0.0}, r"^--speedup must be in \(0, 1e\+06\], got 0$"),
        ({"speedup": 1.000001e6}, r"^--speedup must be in \(0, 1e\+06\], got 1e\+06$"),
        (
            {"timing": Timing.RATE, "rate_per_s": 1.000001e7},
            r"^--rate must be in \(0, 1e\+07\] calls/s, got 1e\+07$",
        ),
        (
            {"timing": Timing.DEPENDENCIES, "compute_scale": 100.001},
            r"^--compute must be 'recorded', 'none' or a scale in \[0, 100\], got 100.001$",
        ),
        ({"timing": Timing.RECORDED, "compute_scale": 0.0}, r"^--compute applies only to"),
    ],
)
def test_out_of_range_pacing_is_refused(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Pacing(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "arguments",
    [
        {"window": 1},
        {"timing": Timing.RATE, "rate_per_s": 0.001},
        {"timing": Timing.RATE, "rate_per_s": 1e7},  # the largest rate, exactly
        {"speedup": 0.001},
        {"speedup": 1e6},  # the largest speedup, exactly
        {"timing": Timing.DEPENDENCIES, "compute_scale": 0.0},
        {"timing": Timing.DEPENDENCIES, "compute_scale": 100.0},
        {"window": None},
    ],
)
def test_pacing_at_the_edges_of_its_ranges_is_accepted(arguments: dict[str, object]) -> None:
    Pacing(**arguments)  # type: ignore[arg-type]


def test_the_defaults_and_the_open_loop_cap() -> None:
    pacing = Pacing()
    assert (pacing.timing, pacing.window, pacing.rate_per_s) == (Timing.ASAP, 1, 0.0)
    assert (pacing.speedup, pacing.compute_scale) == (1.0, 1.0)
    assert pacing.closed_loop
    assert not Pacing(timing=Timing.RECORDED).closed_loop
    assert OPEN_LOOP_MAX_IN_FLIGHT == 1024


@pytest.mark.parametrize(
    ("pacing", "text"),
    [
        (Pacing(), "asap, window 1"),
        (Pacing(window=None), "asap, window recorded"),
        (Pacing(timing=Timing.RATE, rate_per_s=2500.0, window=8), "rate 2500/s, window 8"),
        (
            Pacing(timing=Timing.RECORDED, speedup=1.5, window=None),
            "recorded x1.5, window recorded",
        ),
        (
            Pacing(timing=Timing.DEPENDENCIES, compute_scale=0.5, window=None),
            "dependencies, compute x0.5, window recorded",
        ),
    ],
)
def test_pacing_describes_itself(pacing: Pacing, text: str) -> None:
    assert pacing.describe() == text


def test_release_times_worked_out_by_hand() -> None:
    recorded = Pacing(timing=Timing.RECORDED, speedup=2.0)
    call = _call(offset_ns=3001)
    # 3001 / 2 = 1500.5, rounded to even: 1500.
    assert release_time_ns(recorded, call, call_number=9, step_begin_ns=100, run_begin_ns=7) == 1600
    rate = Pacing(timing=Timing.RATE, rate_per_s=4.0)
    assert release_time_ns(rate, call, call_number=3, step_begin_ns=100, run_begin_ns=7) == (
        7 + 750_000_000
    )
    assert release_time_ns(rate, call, call_number=0, step_begin_ns=100, run_begin_ns=7) == 7


def test_windows_at_their_edge() -> None:
    window = Pacing(window=3)
    assert may_issue(window, _call(), in_flight=2, in_flight_to_server=99)
    assert not may_issue(window, _call(), in_flight=3, in_flight_to_server=0)
    recorded = Pacing(timing=Timing.RECORDED, window=None)
    assert may_issue(recorded, _call(outstanding=2), in_flight=50, in_flight_to_server=2)
    assert not may_issue(recorded, _call(outstanding=2), in_flight=0, in_flight_to_server=3)
    rate = Pacing(timing=Timing.RATE, rate_per_s=1.0, window=None)
    assert may_issue(rate, _call(), in_flight=1023, in_flight_to_server=1023)
    assert not may_issue(rate, _call(), in_flight=1024, in_flight_to_server=0)
    asap = Pacing(window=None)
    assert not may_issue(asap, _call(outstanding=0), in_flight=1, in_flight_to_server=1)


def test_a_recorded_step_begins_at_its_scaled_period_or_when_the_last_ended() -> None:
    recorded = Pacing(timing=Timing.RECORDED, speedup=2.0)
    assert (
        next_step_begin_ns(
            recorded, previous_begin_ns=100, previous_end_ns=550, recorded_period_ns=1001
        )
        == 600
    )  # 100 + round(500.5) = 100 + 500
    assert (
        next_step_begin_ns(
            recorded, previous_begin_ns=100, previous_end_ns=700, recorded_period_ns=1001
        )
        == 700
    )
    rate = Pacing(timing=Timing.RATE, rate_per_s=1.0)
    assert (
        next_step_begin_ns(
            rate, previous_begin_ns=100, previous_end_ns=150, recorded_period_ns=1000
        )
        == 150
    )


@pytest.mark.parametrize(("window", "blocking"), [(1, True), (2, False), (None, False)])
def test_only_a_window_of_one_lets_a_driver_block_on_each_call(
    window: int | None, blocking: bool
) -> None:
    assert blocking_calls_suffice(Pacing(window=window)) is blocking


def test_waiting_for_a_release_never_asks_for_a_negative_sleep() -> None:
    # A replay worker crashed with "sleep length must be non-negative": it read the
    # clock before the release (9 < 10) and again, already past it (11), for the sleep.
    readings = iter([9, 11])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        slept.append(seconds)

    sleep_until(10, lambda: next(readings), sleep)
    assert slept == [1e-9]
    sleep_until(10, lambda: 10, sleep)  # already there: no sleep
    assert slept == [1e-9]


@given(
    deadline=st.integers(min_value=0, max_value=10**6),
    start=st.integers(min_value=0, max_value=10**6),
    steps=st.lists(st.integers(min_value=0, max_value=10**5), min_size=1, max_size=20),
)
def test_a_wait_ends_at_the_deadline_whatever_the_clock_does_between_readings(
    deadline: int, start: int, steps: list[int]
) -> None:
    now = [start]
    remaining = iter(steps)

    def clock() -> int:
        # Between any two readings the clock moves on by a step (or jumps past the deadline).
        now[0] += next(remaining, deadline + 1)
        return now[0]

    def sleep(seconds: float) -> None:
        assert seconds > 0
        now[0] += round(seconds * 1e9)

    sleep_until(deadline, clock, sleep)
    assert now[0] >= deadline


def test_a_wait_of_centuries_is_made_of_waits_the_system_takes() -> None:
    # time.sleep refuses a wait of 2^63 ns (OverflowError or EINVAL): each is bounded.
    now = [0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += round(seconds * 1e9)

    sleep_until(10**17, lambda: now[0], sleep)  # three years
    assert now[0] >= 10**17
    assert max(slept) == MAX_SLEEP_S
