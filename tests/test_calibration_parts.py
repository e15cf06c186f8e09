"""A calibration of what the path computes: the job's workers' step timed by as many processes
at once, its kinds of work apart, how far apart the confirming timings were, and a replay
that scales by the kinds' sum and names each kind's scale."""

from __future__ import annotations

from pathlib import Path

import pytest

from tf_grpc_bench import calibration
from tf_grpc_bench.calibration import (
    Calibration,
    CalibrationWorkload,
    StepHere,
    Timing,
    from_extra,
    time_steadily,
)
from tf_grpc_bench.compute_scale import compute_to_here
from tf_grpc_bench.errors import ConfigError

TOGETHER = CalibrationWorkload("resnet50", 32, 4, "keras", processes=2)
THERE = (("forward_backward", 60_000_000), ("apply", 10_000_000), ("serialize", 30_000_000))
EPYC = (("cpu_model", "AMD EPYC"), ("cpus", "2"))


def test_a_workload_of_several_processes_is_written_and_read_back() -> None:
    assert TOGETHER.text == "resnet50 32x32 batch 4 keras, 2 processes at once"
    assert CalibrationWorkload.parse(TOGETHER.text) == TOGETHER
    assert CalibrationWorkload.parse("resnet50 32x32 batch 4 keras").processes == 1
    with pytest.raises(ConfigError, match="processes must be >= 1"):
        CalibrationWorkload("resnet50", 32, 4, "keras", processes=0)
    with pytest.raises(ConfigError, match="P processes at once"):
        CalibrationWorkload.parse("resnet50 32x32 batch 4 keras, two processes")


def test_a_trace_records_the_parts_and_spread_of_its_calibration() -> None:
    recorded = Calibration(TOGETHER, 100_000_000, parts=THERE, spread=1.0625)
    extra = recorded.extra()
    assert dict(extra)["calibration_parts_ns"] == (
        "forward_backward=60000000,apply=10000000,serialize=30000000"
    )
    assert dict(extra)["calibration_spread"] == "1.0625"
    assert from_extra(extra) == recorded
    # Older traces record the step alone.
    assert from_extra(Calibration(TOGETHER, 5).extra()) == Calibration(TOGETHER, 5)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("calibration_parts_ns", "forward_backward=1,lunch=2", "expected NAME=NANOSECONDS"),
        ("calibration_parts_ns", "apply=-3", "expected NAME=NANOSECONDS"),
        ("calibration_spread", "0.5", "calibration_spread='0.5': expected a ratio >= 1"),
        ("calibration_spread", "wide", "calibration_spread='wide'"),
    ],
)
def test_a_malformed_part_or_spread_is_one_error_naming_it(
    key: str, value: str, message: str
) -> None:
    extra = dict(Calibration(TOGETHER, 100).extra()) | {key: value}
    with pytest.raises(ConfigError, match=message):
        from_extra(tuple(extra.items()))


def test_the_step_taken_brings_its_parts_and_the_agreeing_pairs_spread() -> None:
    parts_a = (("forward_backward", 9), ("apply", 1), ("serialize", 1))
    parts_b = (("forward_backward", 10), ("apply", 1), ("serialize", 1))
    given = iter([Timing(130, 0.0, parts_b), Timing(100, 0.0, parts_a), Timing(110, 0.0, parts_b)])
    measured = time_steadily(TOGETHER, lambda workload: next(given))
    assert measured.steady and measured.step_ns == 100 and measured.parts == parts_a
    assert measured.spread == pytest.approx(1.1)


def test_the_cache_keeps_parts_and_spread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "calibrations.json"
    monkeypatch.setenv(calibration.CACHE_ENV, str(cache))
    given = iter([Timing(100, 0.0, THERE), Timing(104, 0.0, THERE)])
    first = calibration.measure_here("X, 2 CPUs", TOGETHER, lambda workload: next(given))
    assert first.source == "measured now" and first.parts == THERE
    again = calibration.measure_here("X, 2 CPUs", TOGETHER, lambda workload: pytest.fail())
    assert again == StepHere(100, "cached", parts=THERE, spread=pytest.approx(1.04))
    recorded = Calibration.measured(TOGETHER, again)
    assert recorded.parts == THERE and recorded.spread == pytest.approx(1.04)


def test_a_replay_scales_by_the_kinds_sum_and_names_each_kinds_scale() -> None:
    extra = (*EPYC, *Calibration(TOGETHER, 100_000_000, parts=THERE).extra())
    here = (("forward_backward", 90_000_000), ("apply", 10_000_000), ("serialize", 30_000_000))

    def measure(machine: str, workload: CalibrationWorkload) -> StepHere:
        assert workload == TOGETHER  # the same processes at once, here too
        return StepHere(125_000_000, "cached", parts=here)

    to_here = compute_to_here(
        extra, "Xeon, 2 CPUs", required=False, max_scale=100.0, measure=measure, pairs=()
    )
    assert to_here is not None and to_here.calibrated
    assert to_here.scale == pytest.approx(130 / 100)
    assert (
        "by kind of work: forward/backward x1.5, apply x1, serialization x1; their sum: "
        "compute x1.3" in to_here.description
    )
    # A calibration without parts on either side: the whole step's ratio, as before.
    bare = (*EPYC, *Calibration(TOGETHER, 100_000_000).extra())
    whole = compute_to_here(
        bare, "Xeon, 2 CPUs", required=False, max_scale=100.0, measure=measure, pairs=()
    )
    assert whole is not None and whole.scale == pytest.approx(1.25)
    assert "by kind" not in whole.description


def test_inspect_shows_the_parts_and_spread() -> None:
    extra = (*EPYC, *Calibration(TOGETHER, 100_000_000, parts=THERE, spread=1.06).extra())
    assert calibration.calibration_line(extra) == (
        "compute calibration: resnet50 32x32 batch 4 keras, 2 processes at once, 100.0 ms a "
        "step (forward/backward 60.0 ms, apply 10.0 ms, serialization 30.0 ms; confirmed by a "
        "timing 6% slower) (a replay on another machine scales the compute by its own step "
        "/ this)"
    )


@pytest.mark.tensorflow
def test_a_machine_times_a_jobs_workers_step_in_processes_at_once(
    calibration_cache: Path,
) -> None:
    workload = CalibrationWorkload("tiny", 8, 4, "keras", processes=2)
    timing = calibration.run_calibration(workload)
    assert timing.step_ns > 0
    assert [name for name, _ in timing.parts] == list(calibration.PART_NAMES)
    assert all(ns > 0 for _, ns in timing.parts)


def test_a_trace_names_its_capture_machines_kernel() -> None:
    import platform

    from tf_grpc_bench.profiler.launch.config import TrainingConfig
    from tf_grpc_bench.profiler.metadata import KERNEL_EXTRA, run_metadata
    from tf_grpc_bench.profiler.training import calibration_workload

    config = TrainingConfig(model="tiny")
    recorded = Calibration(calibration_workload(config), 5_000_000, parts=THERE, spread=1.1)
    extra = dict(run_metadata(config, {}, ("capture",), calibration=recorded).extra)
    assert extra[KERNEL_EXTRA] == platform.release()
    assert extra["calibration_workload"] == "tiny 8x8 batch 4 keras, 2 processes at once"
    assert extra["calibration_spread"] == "1.1000"
