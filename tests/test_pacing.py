"""Pacing's pure rules, as properties: no call released before its time, windows respected."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.pacing import (
    OPEN_LOOP_MAX_IN_FLIGHT,
    Compute,
    Pacing,
    PacingChoice,
    PacingError,
    Timing,
    TimingSpec,
    blocking_calls_suffice,
    check_processes_per_worker,
    check_settings,
    check_source,
    keeps_recorded_window,
    may_issue,
    next_step_begin_ns,
    register_timing,
    release_time_ns,
    resolve_pacing,
    resolve_timing,
    restore_timing,
    timing_names,
    timing_parameters,
    timing_spec,
    withdraw_timing,
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


# --------------------------------------------------------------------------
# The rules around a Pacing: its table of timings, ``--compute``, and what a replay
# asks for resolved into a Pacing. Each expectation is written out by hand.


def _toy_spec(name: str, **fields: object) -> TimingSpec:
    return TimingSpec(name=name, summary="a test's own timing", **fields)


def test_a_timing_names_the_settings_it_reads_and_every_other_is_refused_by_flag() -> None:
    assert timing_names()[:4] == ("asap", "recorded", "rate", "dependencies")
    cases = [
        (Timing.ASAP, ("compute_scale",), "--compute applies only to --pacing dependencies"),
        (Timing.ASAP, ("time_dilation",), "--time-dilation applies only to --pacing dependencies"),
        (Timing.RECORDED, ("rate_per_s",), "--rate applies only to --pacing rate"),
        (Timing.DEPENDENCIES, ("speedup",), "--speedup applies only to --pacing recorded"),
        # The first in the table's order is named: --compute before --rate.
        (Timing.RECORDED, ("rate_per_s", "compute_scale"), "--compute applies only to"),
    ]
    for timing, settings_given, message in cases:
        with pytest.raises(PacingError) as refused:
            check_settings(timing, settings_given, context=" (benchmark x)")
        assert str(refused.value).startswith(message)
        assert str(refused.value).endswith(" (benchmark x)")
    check_settings(Timing.RATE, ("rate_per_s",))
    check_settings(Timing.DEPENDENCIES, ("compute_scale", "time_dilation"))
    check_settings(Timing.RECORDED, ("speedup",))
    check_settings(Timing.ASAP, ())


def test_a_timing_that_needs_a_trace_refuses_a_synthetic_workload() -> None:
    with pytest.raises(PacingError) as refused:
        check_source(Timing.RECORDED, "synthetic")
    assert str(refused.value) == (
        "--pacing recorded needs a trace (synthetic payloads have no timestamps)"
    )
    with pytest.raises(PacingError) as refused:
        check_source(Timing.DEPENDENCIES, "synthetic")
    assert str(refused.value) == (
        "--pacing dependencies needs a trace (synthetic payloads have no dependencies)"
    )
    for timing in (Timing.RECORDED, Timing.DEPENDENCIES, Timing.ASAP, Timing.RATE):
        check_source(timing, "trace")
    check_source(Timing.ASAP, "synthetic")
    check_source(Timing.RATE, "synthetic")


def test_a_rate_is_per_client_process_so_a_worker_gets_one() -> None:
    with pytest.raises(PacingError) as refused:
        check_processes_per_worker(Timing.RATE, 2)
    assert str(refused.value) == (
        "--procs-per-worker 2: --pacing rate is a rate per client process; "
        "give --procs-per-worker 1"
    )
    check_processes_per_worker(Timing.RATE, 1)
    check_processes_per_worker(Timing.RATE, None)
    for timing in (Timing.ASAP, Timing.RECORDED, Timing.DEPENDENCIES):
        check_processes_per_worker(timing, 4)


def test_time_dilation_has_its_range_and_multiplies_the_compute_gaps() -> None:
    dilated = Pacing(timing=Timing.DEPENDENCIES, compute_scale=0.5, time_dilation=4.0)
    assert dilated.wall_compute_scale == 2.0
    assert dilated.describe() == "dependencies, compute x0.5, time dilation 4, window 1"
    assert Pacing(timing=Timing.DEPENDENCIES, time_dilation=64.0).time_dilation == 64.0
    for bad, shown in ((0.5, "0.5"), (64.5, "64.5")):
        with pytest.raises(PacingError) as refused:
            Pacing(timing=Timing.DEPENDENCIES, time_dilation=bad)
        assert str(refused.value) == f"--time-dilation must be in [1, 64], got {shown}"
    with pytest.raises(PacingError, match=r"^--time-dilation applies only to --pacing dep"):
        Pacing(time_dilation=2.0)


def test_a_pacings_parameters_are_the_settings_its_timing_reads() -> None:
    assert timing_parameters(Pacing()) == {}
    assert timing_parameters(Pacing(timing=Timing.RATE, rate_per_s=250.0)) == {"rate_per_s": 250.0}
    assert timing_parameters(Pacing(timing=Timing.RECORDED, speedup=2.0)) == {"speedup": 2.0}
    # Time dilation is recorded elsewhere (it is not a parameter of its own).
    assert timing_parameters(
        Pacing(timing=Timing.DEPENDENCIES, compute_scale=0.25, time_dilation=2.0)
    ) == {"compute_scale": 0.25}


def test_only_timings_that_keep_the_trace_concurrency_keep_the_recorded_window() -> None:
    assert keeps_recorded_window(Pacing(window=None))
    assert keeps_recorded_window(Pacing(timing=Timing.RECORDED, window=None))
    assert not keeps_recorded_window(Pacing(timing=Timing.RATE, rate_per_s=1.0, window=None))
    assert not keeps_recorded_window(Pacing(timing=Timing.DEPENDENCIES, window=None))
    assert not keeps_recorded_window(Pacing(window=2))


def test_a_timing_row_is_refused_when_it_reads_unknown_settings_or_its_name_is_taken() -> None:
    with pytest.raises(ValueError) as refused:
        register_timing(_toy_spec("toy-unknown", settings=("warp",)))
    assert str(refused.value) == "timing toy-unknown: unknown or unread settings ['warp']"
    with pytest.raises(ValueError) as refused:
        register_timing(_toy_spec("toy-unread", settings=("speedup",), required=("rate_per_s",)))
    assert str(refused.value) == "timing toy-unread: unknown or unread settings []"
    with pytest.raises(ValueError) as refused:
        register_timing(_toy_spec("asap"))
    assert str(refused.value) == "a timing named 'asap' is already registered"
    assert timing_spec(Timing.ASAP).summary == "closed loop, as fast as the window allows"


def test_a_withdrawn_timing_is_gone_and_withdrawing_it_again_is_harmless() -> None:
    timing = register_timing(_toy_spec("toy-withdrawn"))
    assert timing_spec(timing).name == "toy-withdrawn"
    assert "toy-withdrawn" in timing_names()
    withdraw_timing(timing)
    assert "toy-withdrawn" not in timing_names()
    with pytest.raises(ConfigError) as refused:
        timing_spec(timing)
    assert str(refused.value) == "--pacing toy-withdrawn: no such timing here"
    withdraw_timing(timing)
    assert "toy-withdrawn" not in timing_names()


def test_an_unpickled_timing_brings_its_row_and_never_replaces_one_registered() -> None:
    assert pickle.loads(pickle.dumps(Timing.RATE)) is Timing.RATE
    assert timing_spec(Timing.RATE).summary == "a fixed rate (--rate)"
    # A row arriving with a name this process has keeps this process's row.
    assert restore_timing("rate", _toy_spec("rate")) is Timing.RATE
    assert timing_spec(Timing.RATE).summary == "a fixed rate (--rate)"
    # A name without a row, restored without one, stays without one.
    timing = restore_timing("toy-rowless", None)
    try:
        with pytest.raises(ConfigError, match=r"^--pacing toy-rowless: no such timing here$"):
            timing_spec(timing)
        restored = restore_timing("toy-rowless", _toy_spec("toy-rowless", open_loop=True))
        assert restored is timing
        assert timing_spec(timing).open_loop
    finally:
        withdraw_timing(timing)


@pytest.mark.parametrize(
    ("text", "word", "scale", "to_this_machine"),
    [
        ("auto", "auto", 1.0, True),
        ("here", "here", 1.0, True),
        ("recorded", "recorded", 1.0, False),
        ("none", "none", 0.0, False),
        ("0.5", "", 0.5, False),
        ("0", "", 0.0, False),
        ("100", "", 100.0, False),
        ("2.5e1", "", 25.0, False),
    ],
)
def test_compute_is_read_as_a_word_or_a_scale(
    text: str, word: str, scale: float, to_this_machine: bool
) -> None:
    compute = Compute.parse(text)
    assert (compute.word, compute.scale) == (word, scale)
    assert type(compute.scale) is float
    assert compute.to_this_machine is to_this_machine
    assert Compute.parse(compute.text) == compute


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "fast",
            "--compute 'fast': expected 'auto', 'here', 'recorded', 'none' or a scale such as 0.5",
        ),
        ("-1", "--compute '-1': a scale must be in [0, 100]"),
        ("-0.001", "--compute '-0.001': a scale must be in [0, 100]"),
        ("100.5", "--compute '100.5': a scale must be in [0, 100]"),
        ("nan", "--compute 'nan': a scale must be in [0, 100]"),
        ("inf", "--compute 'inf': a scale must be in [0, 100]"),
        (
            "Auto",
            "--compute 'Auto': expected 'auto', 'here', 'recorded', 'none' or a scale such as 0.5",
        ),
    ],
)
def test_a_compute_that_is_neither_word_nor_scale_is_refused_quoted(
    text: str, message: str
) -> None:
    with pytest.raises(PacingError) as refused:
        Compute.parse(text)
    assert str(refused.value) == message


def test_a_compute_record_checks_its_own_word_and_scale() -> None:
    assert Compute() == Compute(word="auto", scale=1.0)
    assert Compute(word="", scale=0.0).text == "0.0"
    assert Compute(word="", scale=100.0).text == "100.0"
    assert Compute(word="recorded", scale=1.0).text == "recorded"
    with pytest.raises(PacingError) as refused:
        Compute(word="fast")
    assert str(refused.value) == "--compute: unknown word 'fast'"
    for scale in (-0.5, 100.5):
        with pytest.raises(PacingError) as refused:
            Compute(word="", scale=scale)
        assert str(refused.value) == f"--compute '{scale!r}': a scale must be in [0, 100]"


def test_a_choice_says_which_settings_it_gives() -> None:
    assert PacingChoice().given() == ()
    assert PacingChoice(timing=Timing.RATE, outstanding=4, default_compute_scale=3.0).given() == ()
    # Any value given counts, even one equal to the default; time dilation counts when not 1.
    assert PacingChoice(
        compute_scale=0.0, rate_per_s=1.0, speedup=1.0, time_dilation=2.0
    ).given() == ("compute_scale", "time_dilation", "rate_per_s", "speedup")
    assert PacingChoice(speedup=3.0).given() == ("speedup",)
    assert PacingChoice(time_dilation=1.0, compute_scale=1.0).given() == ("compute_scale",)


def test_a_choice_resolves_to_the_pacing_worked_out_by_hand() -> None:
    asap = resolve_pacing(PacingChoice(), default=Timing.ASAP, window=4)
    assert asap == Pacing(timing=Timing.ASAP, window=4)
    # The benchmark's default timing is taken when the choice names none.
    by_default = resolve_pacing(
        PacingChoice(compute_scale=0.5), default=Timing.DEPENDENCIES, window=None
    )
    assert by_default == Pacing(timing=Timing.DEPENDENCIES, window=None, compute_scale=0.5)
    named = resolve_pacing(
        PacingChoice(timing=Timing.RATE, rate_per_s=250.0), default=Timing.DEPENDENCIES, window=2
    )
    assert named == Pacing(timing=Timing.RATE, window=2, rate_per_s=250.0)
    recorded = resolve_pacing(
        PacingChoice(timing=Timing.RECORDED, speedup=2.5), default=Timing.ASAP, window=None
    )
    assert recorded == Pacing(timing=Timing.RECORDED, window=None, speedup=2.5)
    dilated = resolve_pacing(
        PacingChoice(timing=Timing.DEPENDENCIES, compute_scale=0.0, time_dilation=8.0),
        default=Timing.ASAP,
        window=None,
    )
    assert (dilated.compute_scale, dilated.time_dilation) == (0.0, 8.0)


def test_the_default_compute_scale_applies_to_dependencies_only_and_unset_is_one() -> None:
    choice = PacingChoice(default_compute_scale=0.25)
    assert resolve_pacing(choice, default=Timing.DEPENDENCIES, window=1).compute_scale == 0.25
    assert resolve_pacing(choice, default=Timing.ASAP, window=1).compute_scale == 1.0
    # An explicit --compute wins over the default, even --compute none.
    explicit = PacingChoice(compute_scale=0.0, default_compute_scale=0.25)
    assert resolve_pacing(explicit, default=Timing.DEPENDENCIES, window=1).compute_scale == 0.0
    unset = resolve_pacing(PacingChoice(), default=Timing.DEPENDENCIES, window=1)
    assert unset.compute_scale == 1.0


def test_a_choice_missing_a_required_setting_or_giving_an_unread_one_is_refused() -> None:
    with pytest.raises(PacingError) as refused:
        resolve_pacing(PacingChoice(timing=Timing.RATE), default=Timing.ASAP, window=1)
    assert str(refused.value) == "--pacing rate needs --rate CALLS_PER_S"
    with pytest.raises(PacingError) as refused:
        resolve_pacing(
            PacingChoice(rate_per_s=5.0), default=Timing.ASAP, window=1, context=" for p2p-latency"
        )
    assert str(refused.value) == "--rate applies only to --pacing rate for p2p-latency"
    with pytest.raises(PacingError) as refused:
        resolve_timing(PacingChoice(time_dilation=2.0), Timing.RECORDED, context="!")
    assert str(refused.value) == "--time-dilation applies only to --pacing dependencies!"
    assert resolve_timing(PacingChoice(speedup=2.0), Timing.RECORDED) is Timing.RECORDED
    assert resolve_timing(PacingChoice(timing=Timing.RATE), Timing.RECORDED) is Timing.RATE


def test_a_refusal_without_a_context_ends_at_the_timing() -> None:
    with pytest.raises(PacingError) as refused:
        resolve_pacing(PacingChoice(speedup=2.0), default=Timing.ASAP, window=1)
    assert str(refused.value) == "--speedup applies only to --pacing recorded"
    with pytest.raises(PacingError) as refused:
        resolve_timing(PacingChoice(rate_per_s=1.0), Timing.DEPENDENCIES)
    assert str(refused.value) == "--rate applies only to --pacing rate"


def test_a_timing_that_reads_an_optional_rate_given_none_is_refused_by_the_rates_range() -> None:
    timing = register_timing(_toy_spec("toy-optional-rate", settings=("rate_per_s",)))
    try:
        with pytest.raises(PacingError) as refused:
            resolve_pacing(PacingChoice(timing=timing), default=Timing.ASAP, window=1)
        assert str(refused.value) == "--rate must be in (0, 1e+07] calls/s, got 0"
        with_rate = resolve_pacing(
            PacingChoice(timing=timing, rate_per_s=3.0), default=Timing.ASAP, window=1
        )
        assert with_rate.rate_per_s == 3.0
    finally:
        withdraw_timing(timing)
