"""Compute calibration: a trace records how fast its capture machine computes its model's
step, and a replay elsewhere scales the trace's compute by this machine's step over that."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tf_grpc_bench import calibration, host, trace_files
from tf_grpc_bench.calibration import (
    Calibration,
    CalibrationUnavailable,
    CalibrationWorkload,
    StepHere,
)
from tf_grpc_bench.compute_scale import ComputeToHere, compute_to_here
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay import cli as replay_cli
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Timing
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_summary import format_summary

from .conftest import make_trace

RESNET = CalibrationWorkload("resnet50", 32, 4, "keras")
XEON = (("cpu_model", "Xeon"), ("cpus", "2"))
HERE = host.this_machine()


def _measured(step_ns: int, *, source: str = "measured now"):  # type: ignore[no-untyped-def]
    calls: list[tuple[str, CalibrationWorkload]] = []

    def measure(machine: str, workload: CalibrationWorkload) -> StepHere:
        calls.append((machine, workload))
        return StepHere(step_ns, source)

    return measure, calls


def _unavailable(machine: str, workload: CalibrationWorkload) -> StepHere:
    raise CalibrationUnavailable("TensorFlow is not installed on this machine")


def test_a_workload_is_written_and_read_back() -> None:
    assert RESNET.text == "resnet50 32x32 batch 4 keras"
    assert CalibrationWorkload.parse(" resnet50 32x32 batch 4 keras ") == RESNET
    assert CalibrationWorkload.parse("tiny 8x8 batch 2 tf_keras").keras == "tf_keras"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("resnet50", "expected 'MODEL SIZExSIZE batch N KERAS'"),
        ("resnet50 32x16 batch 4 keras", "expected 'MODEL SIZExSIZE"),
        ("resnet50 32x32 batch 0 keras", "sizes and processes must be >= 1"),
        ("resnet50 32x32 batch 4 jax", "keras must be one of keras, tf_keras"),
    ],
)
def test_a_malformed_workload_is_a_config_error_naming_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        CalibrationWorkload.parse(text)
    assert "calibration workload" in str(caught.value)


def test_a_trace_records_its_calibration_and_reads_it_back() -> None:
    recorded = Calibration(RESNET, 107_300_651)
    assert calibration.from_extra((*XEON, *recorded.extra())) == recorded
    assert calibration.from_extra(XEON) is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((("calibration_step_ns", "fast"), ("calibration_workload", RESNET.text)), "'fast'"),
        ((("calibration_step_ns", "0"), ("calibration_workload", RESNET.text)), "positive"),
        ((("calibration_workload", RESNET.text),), "calibration_step_ns=''"),
        ((("calibration_step_ns", "5"), ("calibration_workload", "?")), "calibration workload '?'"),
    ],
)
def test_a_malformed_calibration_in_a_trace_is_a_config_error(
    extra: tuple[tuple[str, str], ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        calibration.from_extra(extra)


def test_the_cache_keeps_a_step_per_machine_and_workload(tmp_path: Path) -> None:
    cache = tmp_path / "deep" / "calibrations.json"
    assert calibration.cached("Xeon, 2 CPUs", RESNET, cache) is None
    calibration.remember("Xeon, 2 CPUs", RESNET, 123, cache)
    calibration.remember("EPYC, 2 CPUs", RESNET, 77, cache)
    assert calibration.cached("Xeon, 2 CPUs", RESNET, cache) == 123
    assert calibration.cached("EPYC, 2 CPUs", RESNET, cache) == 77
    tiny = dataclasses.replace(RESNET, model="tiny")
    assert calibration.cached("Xeon, 2 CPUs", tiny, cache) is None
    entry = json.loads(cache.read_text())["Xeon, 2 CPUs | resnet50 32x32 batch 4 keras"]
    assert entry["step_ns"] == 123 and entry["measured_utc"].endswith("+00:00")


def test_a_damaged_or_unwritable_cache_is_measured_around(tmp_path: Path) -> None:
    cache = tmp_path / "calibrations.json"
    cache.write_text("{not json")
    assert calibration.cached("Xeon, 2 CPUs", RESNET, cache) is None
    calibration.remember("Xeon, 2 CPUs", RESNET, 5, cache)  # replaces the damaged file
    assert calibration.cached("Xeon, 2 CPUs", RESNET, cache) == 5
    cache.write_text(json.dumps({"Xeon, 2 CPUs | resnet50 32x32 batch 4 keras": {"step_ns": -1}}))
    assert calibration.cached("Xeon, 2 CPUs", RESNET, cache) is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    calibration.remember("Xeon, 2 CPUs", RESNET, 5, blocked / "calibrations.json")  # no raise


def _to_here(
    extra: tuple[tuple[str, str], ...],
    here: str,
    *,
    required: bool,
    measure: Callable[[str, CalibrationWorkload], tuple[int, bool]],
) -> ComputeToHere | None:
    return compute_to_here(
        extra, here, required=required, max_scale=100.0, measure=measure, pairs=()
    )


def _timings(*timings: tuple[float, float | None]):  # type: ignore[no-untyped-def]
    """A ``time_once`` giving these (ms, others' share) in turn, and the count it was asked."""
    given = iter(timings)
    asked: list[CalibrationWorkload] = []

    def time_once(workload: CalibrationWorkload) -> calibration.Timing:
        asked.append(workload)
        step_ms, share = next(given)
        return calibration.Timing(round(step_ms * 1e6), share)

    return time_once, asked


def test_a_step_is_timed_until_two_undisturbed_timings_agree() -> None:
    time_once, asked = _timings((176.7, 0.01), (158.5, 0.02))
    measured = calibration.time_steadily(RESNET, time_once)
    assert (measured.step_ns, measured.steady, len(asked)) == (158_500_000, True, 2)
    assert measured.unsteady_text() == ""
    # A timing others disturbed (the 439.7 ms one a session saw) counts for nothing, even
    # where it would agree with the next; nor does one that was slow with the machine idle.
    time_once, asked = _timings((439.7, 0.40), (400.0, 0.0), (158.5, 0.02), (167.2, None))
    measured = calibration.time_steadily(RESNET, time_once)
    assert (measured.step_ns, measured.steady, len(asked)) == (158_500_000, True, 4)
    # Of timings that agree, the fastest pair, and the faster of it.
    time_once, _ = _timings((300.0, 0.0), (250.0, 0.0), (161.0, 0.0))
    measured = calibration.time_steadily(RESNET, time_once)
    assert (measured.step_ns, measured.steady) == (250_000_000, True)


def test_a_step_no_two_timings_confirm_is_the_fastest_and_says_so() -> None:
    time_once, asked = _timings((100.0, 0.0), (150.0, 0.0), (400.0, 0.6), (230.0, 0.05))
    measured = calibration.time_steadily(RESNET, time_once)
    assert (measured.step_ns, measured.steady) == (100_000_000, False)
    assert len(asked) == calibration.MAX_TIMINGS == 4
    assert measured.unsteady_text() == (
        "unsteady: no two undisturbed timings within 20% (100.0 ms, 150.0 ms, "
        "400.0 ms (others 60% of the CPU), 230.0 ms), the fastest undisturbed taken"
    )
    # Every timing disturbed: the fastest of them all.
    time_once, _ = _timings((500.0, 0.5), (300.0, 0.3), (900.0, 0.9), (700.0, 0.2))
    disturbed = calibration.time_steadily(RESNET, time_once)
    assert disturbed.step_ns == 300_000_000
    text = disturbed.unsteady_text()
    assert text.endswith("700.0 ms (others 20% of the CPU)), the fastest taken")


def test_an_unsteady_step_is_cached_marked_unsteady_and_a_steady_one_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path / "calibrations.json"))
    monkeypatch.delenv(calibration.RECALIBRATE_ENV, raising=False)
    time_once, _ = _timings((100.0, 0.0), (150.0, 0.0), (400.0, 0.6), (230.0, 0.0))
    unsteady = calibration.measure_here("Xeon, 2 CPUs", RESNET, time_once, quiet=lambda: True)
    assert (unsteady.step_ns, unsteady.steady, unsteady.disturbed) == (100_000_000, False, True)
    # How far the step may be off: the slowest undisturbed timing over the fastest.
    assert unsteady.spread == pytest.approx(2.3)
    assert unsteady.source.startswith("measured now, unsteady: no two undisturbed timings")
    assert unsteady.source.endswith(", the fastest undisturbed taken, cached as unsteady")
    entry = json.loads((tmp_path / "calibrations.json").read_text())
    assert entry["Xeon, 2 CPUs | resnet50 32x32 batch 4 keras"]["steady"] is False
    # The machine still busy: the unsteady step is used from the cache, not timed again.
    cached = calibration.measure_here("Xeon, 2 CPUs", RESNET, _never, quiet=lambda: False)
    assert cached == StepHere(
        100_000_000, "cached, unsteady: its timings 130% apart", steady=False,
        spread=pytest.approx(2.3), disturbed=True,
    )  # fmt: skip
    # Quiet now, and others disturbed one of its timings: timed again, a steady step kept.
    time_once, asked = _timings((120.0, 0.0), (110.0, 0.01))
    steady = calibration.measure_here("Xeon, 2 CPUs", RESNET, time_once, quiet=lambda: True)
    assert steady == StepHere(110_000_000, "measured now", spread=pytest.approx(120 / 110))
    assert len(asked) == 2
    assert calibration.cached("Xeon, 2 CPUs", RESNET) == 110_000_000
    entry = json.loads((tmp_path / "calibrations.json").read_text())
    assert entry["Xeon, 2 CPUs | resnet50 32x32 batch 4 keras"]["timings"] == [
        {"step_ns": 120_000_000, "others_cpu_share": 0.0},
        {"step_ns": 110_000_000, "others_cpu_share": 0.01},
    ]
    assert "steady" not in entry["Xeon, 2 CPUs | resnet50 32x32 batch 4 keras"]
    # A steady step stands, quiet or not.
    again = calibration.measure_here("Xeon, 2 CPUs", RESNET, _never, quiet=lambda: True)
    assert again.source == "cached" and again.steady


def _never(workload: CalibrationWorkload) -> calibration.Timing:
    raise AssertionError(f"{workload.text} timed again")


def test_an_unsteady_step_timed_undisturbed_stands_until_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path / "calibrations.json"))
    monkeypatch.delenv(calibration.RECALIBRATE_ENV, raising=False)
    time_once, _ = _timings((100.0, 0.0), (150.0, 0.0), (200.0, 0.0), (250.0, 0.0))
    first = calibration.measure_here("Xeon, 2 CPUs", RESNET, time_once, quiet=lambda: True)
    assert not first.steady and not first.disturbed
    # Nothing disturbed it: the machine's step varies that much, quiet or not.
    kept = calibration.measure_here("Xeon, 2 CPUs", RESNET, _never, quiet=lambda: True)
    assert kept.source == "cached, unsteady: its timings 150% apart" and kept.step_ns == 100_000_000
    # Asked (TF_GRPC_BENCH_RECALIBRATE=1), any cached step is timed again, steady ones too.
    monkeypatch.setenv(calibration.RECALIBRATE_ENV, "1")
    time_once, asked = _timings((90.0, 0.0), (95.0, 0.0), (91.0, 0.0), (92.0, 0.0))
    retimed = calibration.measure_here("Xeon, 2 CPUs", RESNET, time_once, quiet=lambda: False)
    assert (retimed.step_ns, retimed.steady, len(asked)) == (90_000_000, True, 2)
    time_once, asked = _timings((80.0, 0.0), (81.0, 0.0))
    assert calibration.measure_here("Xeon, 2 CPUs", RESNET, time_once).step_ns == 80_000_000
    assert len(asked) == 2


def test_the_machine_is_quiet_when_nothing_else_takes_it() -> None:
    # A real reading of /proc/stat: a bool either way (how busy a shared machine is
    # cannot be asserted), and the sample is as long as asked.
    assert calibration.machine_is_quiet(0.05) in (True, False)


def test_a_replay_says_its_calibration_was_unsteady_and_widens_its_uncertainty() -> None:
    extra = (*XEON, *Calibration(RESNET, 100_000_000).extra())
    source = "cached, unsteady: its timings 30% apart"

    def unsteady(machine: str, workload: CalibrationWorkload) -> StepHere:
        return StepHere(80_000_000, source, steady=False, spread=1.3)

    to_here = _to_here(extra, "EPYC, 2 CPUs", required=False, measure=unsteady)
    assert to_here is not None and to_here.scale == pytest.approx(0.8)
    assert to_here.unsteady_spread == pytest.approx(1.3)
    assert f"80.0 ms on EPYC, 2 CPUs ({source}): compute x0.8" in to_here.description
    assert to_here.description.endswith(
        "measured against training yet; and an unsteady calibration, its timings up to 30% apart"
    )
    # The trace's own calibration unsteady too (recorded as such): both spreads count.
    there = Calibration(RESNET, 100_000_000, spread=1.5, steady=False)
    assert calibration.from_extra(there.extra()) == there
    both = _to_here((*XEON, *there.extra()), "EPYC, 2 CPUs", required=False, measure=unsteady)
    assert both is not None and both.unsteady_spread == pytest.approx(1.95)
    assert "a step on Xeon, 2 CPUs, unsteady: its timings 50% apart, 80.0 ms" in both.description
    steady = _to_here(extra, "EPYC, 2 CPUs", required=False, measure=_measured(80_000_000)[0])
    assert steady is not None and steady.unsteady_spread == 1.0
    assert "unsteady" not in steady.description
    # inspect says the trace's calibration was unsteady.
    assert "unsteady: no two timings confirmed it, its timings 50% apart" in (
        calibration.calibration_line(there.extra())
    )
    with pytest.raises(ConfigError, match=r"calibration_steady='maybe': expected true or false"):
        calibration.from_extra((*there.extra(), ("calibration_steady", "maybe")))


def test_auto_scales_compute_captured_elsewhere_by_the_two_steps() -> None:
    extra = (*XEON, *Calibration(RESNET, 100_000_000).extra())
    measure, calls = _measured(60_000_000)
    to_here = _to_here(extra, "EPYC, 2 CPUs", required=False, measure=measure)
    assert to_here is not None and to_here.calibrated
    assert to_here.scale == pytest.approx(0.6)
    assert calls == [("EPYC, 2 CPUs", RESNET)]
    assert to_here.description == (
        "resnet50 32x32 batch 4 keras: 100.0 ms a step on Xeon, 2 CPUs, 60.0 ms on "
        "EPYC, 2 CPUs (measured now): compute x0.6; uncertain across CPU models: no "
        "prediction across CPU models has been measured against training yet"
    )
    cached_measure, _ = _measured(150_000_000, source="cached")
    slower = _to_here(extra, "Old, 2 CPUs", required=False, measure=cached_measure)
    assert slower is not None and slower.scale == pytest.approx(1.5)
    assert "(cached): compute x1.5" in slower.description


def test_auto_leaves_the_capture_machine_and_unnamed_traces_alone() -> None:
    extra = (*XEON, *Calibration(RESNET, 100).extra())
    measure, calls = _measured(60)
    assert _to_here(extra, "Xeon, 2 CPUs", required=False, measure=measure) is None
    assert _to_here((), "EPYC, 2 CPUs", required=False, measure=measure) is None
    assert calls == []
    # Asked for explicitly, the capture machine measures itself too (its load may differ).
    same = _to_here(extra, "Xeon, 2 CPUs", required=True, measure=measure)
    assert same is not None and same.scale == pytest.approx(0.6)


def test_auto_says_why_compute_captured_elsewhere_was_not_scaled() -> None:
    measure, calls = _measured(60)
    uncalibrated = _to_here(XEON, "EPYC, 2 CPUs", required=False, measure=measure)
    assert uncalibrated is not None and not uncalibrated.calibrated
    assert uncalibrated.description.startswith("none: the trace records no calibration; ")
    assert calls == []
    extra = (*XEON, *Calibration(RESNET, 100).extra())
    no_tf = _to_here(extra, "EPYC, 2 CPUs", required=False, measure=_unavailable)
    assert no_tf is not None and not no_tf.calibrated and no_tf.scale == 1.0
    assert no_tf.description.startswith("none: TensorFlow is not installed on this machine; ")


def test_here_is_an_error_when_it_cannot_be_had() -> None:
    measure, _ = _measured(60)
    with pytest.raises(ConfigError, match=r"^--compute here: the trace records no compute cal"):
        _to_here(XEON, "EPYC, 2 CPUs", required=True, measure=measure)
    extra = (*XEON, *Calibration(RESNET, 100).extra())
    with pytest.raises(ConfigError, match=r"^--compute here: TensorFlow is not installed"):
        _to_here(extra, "EPYC, 2 CPUs", required=True, measure=_unavailable)


def test_a_scale_past_what_compute_takes_is_a_calibration_gone_wrong() -> None:
    extra = (*XEON, *Calibration(RESNET, 1_000).extra())  # 1 us a ResNet-50 step
    measure, _ = _measured(60_000_000)
    auto = _to_here(extra, "EPYC, 2 CPUs", required=False, measure=measure)
    assert auto is not None and auto.scale == 1.0 and not auto.calibrated
    assert auto.description.startswith(
        "none: trace metadata calibration_step_ns=1000: this machine's step is 6e+04 times it, "
        "over the 100 --compute takes (resnet50 32x32 batch 4 keras: 0.0 ms a step on Xeon"
    )
    with pytest.raises(ConfigError, match=r"^--compute here: trace metadata calibration_step_ns"):
        _to_here(extra, "EPYC, 2 CPUs", required=True, measure=measure)
    # Exactly the largest scale --compute takes is still a scale.
    at_limit, _ = _measured(100_000)
    scaled = _to_here(extra, "EPYC, 2 CPUs", required=False, measure=at_limit)
    assert scaled is not None and scaled.calibrated and scaled.scale == 100.0


def test_without_tensorflow_a_machine_cannot_calibrate(monkeypatch: pytest.MonkeyPatch) -> None:
    real = calibration.importlib.util.find_spec
    monkeypatch.setattr(
        calibration.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorflow" else real(name, *a),
    )
    with pytest.raises(CalibrationUnavailable, match="TensorFlow is not installed"):
        calibration.run_calibration(RESNET)


def _traced(tmp_path: Path, extra: tuple[tuple[str, str], ...]) -> Path:
    trace: Trace = make_trace(steps=2)
    trace = dataclasses.replace(trace, metadata=dataclasses.replace(trace.metadata, extra=extra))
    return trace_files.write_trace(trace, tmp_path / "calibrated.tfgbtrace")


def _request(path: Path, *flags: str):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    replay_cli.configure_replay(parser)
    return replay_cli.build_request(parser.parse_args([str(path), *flags]))


def test_a_replay_scales_compute_captured_elsewhere_from_the_cache(
    tmp_path: Path, calibration_cache: Path
) -> None:
    # This machine's step is in the cache (as a capture or an earlier replay here
    # leaves it), so the scale is the two recorded steps' ratio, without TensorFlow.
    calibration.remember(HERE, RESNET, 25_000_000, calibration_cache)
    path = _traced(tmp_path, (*XEON, *Calibration(RESNET, 100_000_000).extra()))
    request = _request(path, "--benchmark", "all")
    pairs = zip(request.workloads, request.pacings, strict=True)
    by_benchmark = {w.benchmark.value: p for w, p in pairs}
    throughput = by_benchmark["ps-throughput"]
    assert throughput.timing is Timing.DEPENDENCIES
    assert throughput.compute_scale == pytest.approx(0.25)
    # The other benchmarks keep no compute: their pacing is untouched.
    assert {p.compute_scale for b, p in by_benchmark.items() if b != "ps-throughput"} == {1.0}
    (described,) = {dict(w.parameters())["compute_calibration"] for w in request.workloads}
    assert described.startswith(
        f"resnet50 32x32 batch 4 keras: 100.0 ms a step on Xeon, 2 CPUs, 25.0 ms on {HERE} "
        "(cached): compute x0.25; uncertain across CPU models: "
    )
    # --compute recorded keeps the capture machine's compute and says nothing of scaling.
    kept = _request(path, "--benchmark", "ps-throughput", "--compute", "recorded")
    assert kept.pacings[0].compute_scale == 1.0
    assert "compute_calibration" not in dict(kept.workloads[0].parameters())
    # Without dependencies pacing there is no compute to scale.
    paced = _request(path, "--benchmark", "ps-throughput", "--pacing", "asap")
    assert "compute_calibration" not in dict(paced.workloads[0].parameters())


def test_compute_here_without_a_calibration_is_a_one_line_error(tmp_path: Path) -> None:
    path = _traced(tmp_path, XEON)
    completed = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "replay", str(path), "--compute", "here",
         "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        "tf-grpc-bench replay: error: --compute here: the trace records no compute calibration "
        "(captured before captures recorded one, or with --no-calibrate); re-capture it, or "
        "give a SCALE"
    ]
    assert not (tmp_path / "out").exists()


def test_inspect_shows_the_calibration() -> None:
    trace = make_trace()
    extra = (*XEON, *Calibration(RESNET, 107_300_651).extra())
    named = dataclasses.replace(trace, metadata=dataclasses.replace(trace.metadata, extra=extra))
    assert (
        "compute calibration: resnet50 32x32 batch 4 keras, 107.3 ms a step (a replay on "
        "another machine scales the compute by its own step / this)"
    ) in format_summary(named).splitlines()
    broken = dataclasses.replace(
        trace,
        metadata=dataclasses.replace(trace.metadata, extra=(("calibration_step_ns", "x"),)),
    )
    assert any(
        line.startswith("compute calibration: unreadable (trace metadata calibration_step_ns")
        for line in format_summary(broken).splitlines()
    )


TINY = CalibrationWorkload("tiny", 8, 2, "keras")


@pytest.fixture(scope="module")
def tiny_measured() -> tuple[StepHere, list[calibration.Timing]]:
    """This machine's step of a tiny workload, measured once (``measure_here``), and every
    real timing it took (``run_calibration``, each a fresh process): the tests below share
    them rather than each starting TensorFlow again."""
    timings: list[calibration.Timing] = []

    def time_once(workload: CalibrationWorkload) -> calibration.Timing:
        timing = calibration.run_calibration(workload)
        timings.append(timing)
        return timing

    return calibration.measure_here("Test machine, 2 CPUs", TINY, time_once), timings


@pytest.mark.tensorflow
def test_a_machine_times_a_real_training_step(
    calibration_cache: Path, tiny_measured: tuple[StepHere, list[calibration.Timing]]
) -> None:
    # A step of a few ms on a shared machine: a busy moment can leave no two timings
    # agreeing, however often it is asked.  What holds either way: a real, positive step,
    # cached and served from the cache, marked unsteady where it was (the agreement logic
    # and the cache's policy are tested with set timings above).
    measured, timings = tiny_measured
    assert measured.step_ns > 0
    assert 2 <= len(timings) <= calibration.MAX_TIMINGS
    cached = calibration.cached("Test machine, 2 CPUs", TINY, calibration_cache)
    assert cached == measured.step_ns  # steady or marked unsteady, it is kept
    again = calibration.measure_here("Test machine, 2 CPUs", TINY, quiet=lambda: False)
    assert (again.step_ns, again.steady) == (measured.step_ns, measured.steady)
    if measured.steady:
        assert measured.source == "measured now" and again.source == "cached"
    else:
        assert measured.source.startswith("measured now, unsteady: no two undisturbed timings")
        assert again.source.startswith("cached, unsteady: its timings")
    with pytest.raises(CalibrationUnavailable, match="timing nosuchmodel 8x8 batch 2 keras failed"):
        calibration.run_calibration(dataclasses.replace(TINY, model="nosuchmodel"))


@pytest.mark.tensorflow
def test_a_timing_knows_when_others_took_the_machine(
    tiny_measured: tuple[StepHere, list[calibration.Timing]],
) -> None:
    alone = tiny_measured[1][0]  # a real timing with nothing of ours beside it
    assert alone.step_ns > 0 and alone.others_share is not None
    assert 0.0 <= alone.others_share <= 1.0
    # Two processes spinning on a 2-core machine: the timing beside them is disturbed.
    spin = [sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(spin) for _ in range(os.cpu_count() or 2)]
    try:
        beside = calibration.run_calibration(TINY)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert beside.disturbed, beside
    assert beside.others_share is not None and beside.others_share > 0.3


def test_a_user_job_is_calibrated_on_its_model_if_known_else_the_reference() -> None:
    from tf_grpc_bench.cluster import read_cluster
    from tf_grpc_bench.profiler.launch.user_job import UserJob
    from tf_grpc_bench.profiler.userjob import calibration_workload

    cluster = read_cluster('{"ps": ["localhost:1"], "worker": ["localhost:2"]}', jobs=None)
    job = UserJob(cluster=cluster, command=("true",))
    assert calibration_workload(job).text == "resnet50 32x32 batch 4 keras"
    two = read_cluster(
        '{"ps": ["localhost:1"], "worker": ["localhost:2", "localhost:3"]}', jobs=None
    )
    both = calibration_workload(UserJob(cluster=two, command=("true",)))
    assert both.text == "resnet50 32x32 batch 4 keras, 2 processes at once"
    named = dataclasses.replace(job, model="vgg16", batch_size=16)
    assert calibration_workload(named).text == "vgg16 32x32 batch 16 keras"
    # The batch of a model we do not know says nothing of the reference workload's.
    mine = dataclasses.replace(job, model="my-net", batch_size=64)
    assert calibration_workload(mine).text == "resnet50 32x32 batch 4 keras"


def test_a_capture_is_calibrated_on_its_own_job() -> None:
    from tf_grpc_bench.profiler.launch.config import TrainingConfig
    from tf_grpc_bench.profiler.training import calibration_workload

    config = TrainingConfig(model="resnet50", setup="tf1-ps", batch_size=8, input_size=64)
    # As many processes at once as the job has workers (2 by default).
    assert calibration_workload(config).text == (
        "resnet50 64x64 batch 8 tf_keras, 2 processes at once"
    )
    alone = TrainingConfig(model="tiny", workers=1)
    assert calibration_workload(alone).text == "tiny 8x8 batch 4 keras"


def test_a_trace_workload_carries_its_calibrated_step_to_the_dependency_model() -> None:
    # The step's compute bounds what a replayed call keeps after the input that
    # arrived last in the replay (docs/fidelity.md, "Inference rules").
    trace: Trace = make_trace(steps=2)
    calibrated = dataclasses.replace(
        trace,
        metadata=dataclasses.replace(trace.metadata, extra=Calibration(RESNET, 57_000_000).extra()),
    )
    workload = trace_workload(calibrated, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert [s.step_compute_ns for s in workload.steps] == [57_000_000, 57_000_000]
    uncalibrated = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert {s.step_compute_ns for s in uncalibrated.steps} == {0}
    malformed = dataclasses.replace(
        trace,
        metadata=dataclasses.replace(trace.metadata, extra=(("calibration_step_ns", "-3"),)),
    )
    with pytest.raises(ConfigError, match=r"^trace metadata calibration_step_ns='-3': expected"):
        trace_workload(malformed, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)


def test_a_capture_warns_of_an_unsteady_calibration_even_when_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tf_grpc_bench.profiler import cli as profiler_cli

    source = (
        "measured now, unsteady: no two undisturbed timings within 20% (...), cached as unsteady"
    )
    monkeypatch.setattr(
        profiler_cli,
        "measure_here",
        lambda machine, workload: StepHere(7, source, steady=False, spread=1.4),
    )
    # The trace records it as unsteady, with its timings' spread.
    unsteady = Calibration(RESNET, 7, spread=1.4, steady=False)
    assert profiler_cli._calibrate(RESNET, quiet=True) == unsteady
    assert capsys.readouterr().err == f"warning: compute calibration {source}\n"
    monkeypatch.setattr(
        profiler_cli, "measure_here", lambda machine, workload: StepHere(7, "measured now")
    )
    assert profiler_cli._calibrate(RESNET, quiet=True) == Calibration(RESNET, 7)
    assert capsys.readouterr().err == ""
