"""Training with no recorder: rounds from the job's own step markers, both ratios in the bench."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tests.conftest import load_bench_script, make_trace
from tf_grpc_bench.capture_cpu import CaptureCpu
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.uncaptured import UncapturedRun, steady_rounds, train_uncaptured


def _marker(task: str, step: int, start: int, end: int, phase: str = "steady") -> StepMarker:
    return StepMarker(task=task, step=step, phase=phase, start_ns=start, end_ns=end)


def test_a_round_spans_every_driving_tasks_marker_of_its_step() -> None:
    markers = [
        _marker("worker:0", 0, 0, 50, phase="warmup"),
        _marker("worker:0", 1, 100, 180),
        _marker("worker:1", 1, 110, 200),  # the round ends with its slowest worker
        _marker("worker:1", 2, 210, 300),
        _marker("worker:0", 2, 205, 290),
    ]
    assert steady_rounds(markers) == (100, 95)
    assert steady_rounds([_marker("chief:0", 3, 10, 40)]) == (30,)


def test_an_uncaptured_run_gives_each_tasks_cpu_per_round() -> None:
    cpu = CaptureCpu(
        cores=2,
        busy_cores=1.5,
        task_cores=(("ps:0", 0.25), ("worker:0", 1.0)),
        span_ns=4_000_000_000,
    )
    config = TrainingConfig(model="tiny")
    run = UncapturedRun(
        config=config,
        network="5gbit",
        rounds_ns=(1_000, 3_000, 2_000, 5_000),
        cpu=cpu,
        cpu_model="X",
    )
    assert run.round_ns == 2_500
    assert run.task_cpu_per_round_s() == {
        "ps:0": pytest.approx(0.25),
        "worker:0": pytest.approx(1.0),
    }
    printed = run.as_json()
    assert printed["tasks_cpu_per_round_s"] == pytest.approx(1.25)
    assert printed["network"] == "5gbit" and printed["rounds_ns"] == [1_000, 3_000, 2_000, 5_000]
    bare = dataclasses.replace(run, cpu=None)
    assert bare.task_cpu_per_round_s() == {} and bare.as_json()["tasks_cpu_per_round_s"] is None


def test_the_fidelity_bench_sets_the_prediction_against_uncaptured_and_captured_training(
    tmp_path: Path,
) -> None:
    fidelity = load_bench_script("fidelity.py", "bench_fidelity")
    training = sys.modules["training"]
    prediction = fidelity.Prediction(
        step_s=0.80, compute_s=0.1, cpu_cores=0.5, cpu_per_round_s=None, document=tmp_path
    )
    plain = training.Uncaptured(round_s=0.75, tasks_cpu_per_round_s=0.70, rounds=8)
    assert fidelity._prediction_cells(prediction, 0.80, 0.75) == ["0.80 s", "**1.07** / 1.00"]
    assert fidelity._prediction_cells(prediction, 0.80) == ["0.80 s", "1.00"]
    trace = make_trace()
    facts = training.capture_facts(trace, "5gbit", plain)
    cells = fidelity._uncaptured_cells(facts)
    assert cells[0] == "0.75 s" and cells[1] == "0.70 s"
    assert cells[2] == f"{facts.round_s / 0.75:.3f}" and cells[3] == "-"
    row = fidelity.Row(
        model="tiny", profile="5gbit", training_s=0.80, link_bound_s=0.33,
        from_loopback=prediction, from_link=None, uncaptured=plain, link_capture=facts,
    )  # fmt: skip
    body = fidelity.report([row], "tf2-ps", "cmd", "0", "0")
    assert "| tiny | 5gbit | 0.75 s | 0.80 s | 0.33 s | 0.80 s | **1.07** / 1.00 |" in body
    assert "uncaptured round" in body


def test_the_job_shape_is_the_captures() -> None:
    training = load_bench_script("training.py", "bench_training")
    shape = training.job_arguments("resnet50", "tf2-ps", 8)
    assert shape[shape.index("--steps") + 1] == "8" and shape[shape.index("--ps") + 1] == "2"


@pytest.mark.tensorflow
@pytest.mark.usefixtures("temporary_files_here")
def test_the_launchers_job_runs_uncaptured_and_times_its_rounds(tmp_path: Path) -> None:
    config = TrainingConfig(model="tiny", ps=1, workers=2, steps=3, warmup_steps=1)
    run = train_uncaptured(config, workdir=tmp_path)
    assert len(run.rounds_ns) == 3 and all(r > 0 for r in run.rounds_ns)
    # Nothing was recorded: no recorder file, no trace in the work directory.
    assert not list(tmp_path.rglob("tap-*.bin")) and not list(tmp_path.rglob("*.tfgbtrace"))
    assert run.cpu is not None
    assert {name for name, _ in run.cpu.task_cores} == {"ps:0", "worker:0", "worker:1", "chief:0"}
    assert sum(run.task_cpu_per_round_s().values()) > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "nope"], "error: unknown model 'nope'"),
        (["--model", "tiny", "--network", "7zz"], "error: --network: unknown network profile"),
        (["--model", "tiny", "--steps", "0"], "error: steps must be >= 1"),
    ],
)
def test_bad_flags_are_one_line_errors_and_start_nothing(flags: list[str], message: str) -> None:
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench.profiler.uncaptured", *flags],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.startswith(message) and completed.stderr.count("\n") == 1
