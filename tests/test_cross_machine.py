"""Predictions across machines: the pairs measured, their spread, and what a replay says of it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tf_grpc_bench import cross_machine, host
from tf_grpc_bench.calibration import Calibration, CalibrationWorkload, StepHere
from tf_grpc_bench.compute_scale import compute_to_here
from tf_grpc_bench.cross_machine import MeasuredPair
from tf_grpc_bench.errors import ConfigError

EPYC, XEON = "AMD EPYC, 2 CPUs", "Intel(R) Xeon(R) Processor, 2 CPUs"
RESNET = CalibrationWorkload("resnet50", 32, 4, "keras")


def _pair(link: str, ratio: float, captured: str = EPYC, replayed: str = XEON) -> MeasuredPair:
    return MeasuredPair(
        captured_on=captured, replayed_on=replayed, trace="resnet50-tf2ps", link=link, ratio=ratio
    )


def test_pairs_are_written_read_back_and_the_latest_of_a_pair_stands(tmp_path: Path) -> None:
    old = [_pair("1gbit", 1.04), _pair("5gbit", 1.22)]
    loaded = dataclasses.replace(_pair("5gbit", 0.99), compute_load="uniform")
    new = [loaded, _pair("5gbit", 1.01, captured=XEON, replayed=EPYC)]
    pairs = cross_machine.merged(old, new)
    assert [(p.captured_on, p.link, p.ratio) for p in pairs] == [
        (EPYC, "1gbit", 1.04),
        (EPYC, "5gbit", 0.99),
        (XEON, "5gbit", 1.01),
    ]
    path = tmp_path / "pairs.json"
    path.write_text(cross_machine.pairs_document(pairs))
    assert cross_machine.read_pairs(path) == tuple(pairs)
    assert cross_machine.read_pairs(path)[1].compute_load == "uniform"
    assert cross_machine.read_pairs(tmp_path / "none.json") == ()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("[]", "format must be"),
        ('{"format": "tf-grpc-bench-cross-machine-pairs", "pairs": {}}', "'pairs' must be a list"),
        (
            '{"format": "tf-grpc-bench-cross-machine-pairs", "pairs": [{"captured_on": "a"}]}',
            r"pairs\[0\]: not a measured pair",
        ),
        (
            '{"format": "tf-grpc-bench-cross-machine-pairs", "pairs": [{"captured_on": "a", '
            '"replayed_on": "b", "trace": "t", "link": "l", "ratio": -1}]}',
            r"pairs\[0\]: ratio must be > 0",
        ),
        ("{", "not a file of measured pairs"),
    ],
)
def test_a_bad_pairs_file_is_one_error_naming_it(
    tmp_path: Path, document: str, message: str
) -> None:
    path = tmp_path / "pairs.json"
    path.write_text(document)
    with pytest.raises(ConfigError, match=message):
        cross_machine.read_pairs(path)


def test_the_spread_counts_only_pairs_across_machines() -> None:
    same = _pair("5gbit", 1.40, captured=EPYC, replayed=EPYC)
    pairs = [_pair("1gbit", 1.04), _pair("5gbit", 1.22), same]
    measured = cross_machine.spread(pairs)
    assert measured == cross_machine.Spread(1.04, 1.22, 2, ((EPYC, XEON),))
    assert cross_machine.spread([same]) is None
    text = cross_machine.uncertainty_text(EPYC, XEON, pairs)
    assert text == (
        "uncertain across CPU models: predictions of traces from another CPU model have been "
        "1.04 to 1.22 of training (2 measured, 1 pair of machines, this pair among them; "
        "bench/README.md)"
    )
    other = cross_machine.uncertainty_text(XEON, "Other, 4 CPUs", pairs)
    assert "this pair" not in other and "1.04 to 1.22" in other
    assert cross_machine.uncertainty_text(EPYC, EPYC, pairs) == ""
    assert cross_machine.uncertainty_text("", XEON, pairs) == ""
    # An unsteady calibration's spread widens the measured one both ways.
    widened = cross_machine.uncertainty_text(EPYC, XEON, pairs, widen=1.25)
    assert widened == (
        f"{text}; with an unsteady calibration, its timings up to 25% apart: 0.83 to 1.52"
    )
    assert cross_machine.uncertainty_text(EPYC, EPYC, pairs, widen=1.25) == ""


def test_a_replay_of_a_trace_from_another_cpu_says_how_uncertain_it_is() -> None:
    extra = (("cpu_model", "AMD EPYC"), ("cpus", "2"), *Calibration(RESNET, 60_000_000).extra())

    def measure(machine: str, workload: CalibrationWorkload) -> StepHere:
        return StepHere(99_000_000, "cached")

    pairs = [_pair("1gbit", 1.04), _pair("5gbit", 1.22)]
    to_here = compute_to_here(
        extra, XEON, required=False, max_scale=100.0, measure=measure, pairs=pairs
    )
    assert to_here is not None and to_here.scale == pytest.approx(1.65)
    assert to_here.description.endswith(
        "compute x1.65; uncertain across CPU models: predictions of traces from another CPU "
        "model have been 1.04 to 1.22 of training (2 measured, 1 pair of machines, this pair "
        "among them; bench/README.md)"
    )
    # On the capture's own machine there is nothing to say.
    assert compute_to_here(extra, EPYC, required=False, max_scale=100.0, pairs=pairs) is None


def test_the_shipped_pairs_file_reads() -> None:
    pairs = cross_machine.read_pairs()
    assert pairs, "the package ships the pairs measured so far"
    assert all(pair.source for pair in pairs)
    document = json.loads(cross_machine.PAIRS_FILE.read_text())
    assert document["version"] == cross_machine.VERSION


def test_the_cross_machine_bench_trains_the_traces_job_and_tables_every_pair(
    tmp_path: Path,
) -> None:
    from tests.conftest import load_bench_script
    from tf_grpc_bench import trace_files

    bench = load_bench_script("cross_machine.py", "bench_cross_machine")
    fidelity = sys.modules["fidelity"]
    training = sys.modules["training"]
    shipped = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps"))
    shape = bench.job_shape(shipped, 8)
    assert shape == training.job_arguments("resnet50", "tf2-ps", 8, workers=2, ps=2)
    document = tmp_path / "results.json"
    document.write_text(
        json.dumps(
            {
                "benchmarks": [
                    {
                        "parameters": {
                            "compute_calibration": "x: 1.0 ms a step on A, 1.3 ms on B (cached): "
                            "compute x1.3; uncertain across CPU models: 1.04 to 1.22",
                            "compute_load": "none",
                            "compute_load_auto": "the trace records no capture CPU",
                        }
                    }
                ]
            }
        )
    )
    prediction = fidelity.Prediction(
        step_s=0.80, compute_s=0.1, cpu_cores=0.5, cpu_per_round_s=None, document=document
    )
    plain = training.Uncaptured(round_s=0.75, tasks_cpu_per_round_s=0.7, rounds=8)
    row = bench.CrossRow(
        profile="5gbit", uncaptured=plain, captured_s=0.80, link_bound_s=0.33,
        prediction=prediction, compute=bench._compute(prediction),
        compute_load=bench._compute_load(prediction),
    )  # fmt: skip
    # The compute load the replay ran, and why where auto chose it.
    assert row.compute_load == "none (auto: the trace records no capture CPU)"
    # The table's compute cell: the scale alone (the results hold the rest).
    assert row.compute == "compute x1.3" and row.ratio == pytest.approx(0.80 / 0.75)
    body = bench.report("resnet50-tf2ps", shipped, [row], "cmd", "0")
    assert body.splitlines()[0] == "## Fidelity across machines: resnet50-tf2ps"
    assert (
        "| 5gbit | 0.75 s | 0.80 s | 0.33 s | 0.80 s | **1.07** / 1.00 | compute x1.3 | "
        "none (auto: the trace records no capture CPU) |"
    ) in body
    (pair,) = bench.measured_pairs("resnet50-tf2ps", shipped, [row], "cmd")
    assert pair.compute_load == row.compute_load
    assert (pair.captured_on, pair.trace, pair.link) == (EPYC, "resnet50-tf2ps", "5gbit")
    assert pair.calibration == bench.ONE_PROCESS and pair.source == "cmd"
    assert pair.replayed_on == host.this_machine()
    table = bench.pairs_section([dataclasses.replace(pair, replayed_on=XEON), _pair("1gbit", 1.04)])
    assert "Across CPU models: 1.04 to 1.07 (2 measured)" in table
    assert table.count("\n| ") == 3  # the head and a row per pair
    assert "| none (auto: the trace records no capture CPU) |" in table


def test_a_replay_of_a_trace_from_another_cpu_model_states_the_spread_in_every_output(
    tmp_path: Path,
) -> None:
    """A real replay (pure Python, a small trace) of a trace whose machine differs from this
    one, this machine's step cached unsteady: its table, its result document and its
    TensorBoard text state the spread measured across pairs, widened by the unsteadiness."""
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    from tests.conftest import make_trace
    from tf_grpc_bench import calibration, trace_files

    cache = tmp_path / "calibrations.json"
    quiet_timings = (calibration.Timing(25_000_000, 0.0), calibration.Timing(32_500_000, 0.0))
    calibration.remember(
        host.this_machine(), RESNET, 25_000_000, cache, timings=quiet_timings, spread=1.3,
        steady=False,
    )  # fmt: skip
    trace = make_trace(steps=2)
    extra = (("cpu_model", "Another CPU"), ("cpus", "2"), *Calibration(RESNET, 100_000_000).extra())
    trace = dataclasses.replace(trace, metadata=dataclasses.replace(trace.metadata, extra=extra))
    path = trace_files.write_trace(trace, tmp_path / "elsewhere.tfgbtrace")
    completed = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "replay", str(path), "--benchmark",
         "ps-throughput", "--warmup", "0", "--duration", "1", "--runs", "1",
         "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, calibration.CACHE_ENV: str(cache)},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    measured = cross_machine.spread(cross_machine.read_pairs())
    assert measured is not None
    widened = (
        "with an unsteady calibration, its timings up to 30% apart: "
        f"{measured.low / 1.3:.2f} to {measured.high * 1.3:.2f}"
    )
    stated = (
        f"uncertain across CPU models: predictions of traces from another CPU model have been "
        f"{measured.low:.2f} to {measured.high:.2f} of training"
    )
    (last,) = [
        line for line in completed.stdout.splitlines() if line.startswith("compute scaled to")
    ]
    assert last.startswith("compute scaled to this machine: resnet50 32x32 batch 4 keras: ")
    assert "(cached, unsteady: its timings 30% apart): compute x0.25" in last
    assert stated in last and last.endswith(widened)
    (document,) = (tmp_path / "out").rglob("results.json")
    parameters = json.loads(document.read_text())["benchmarks"][0]["parameters"]
    assert parameters["captured_on"] == "Another CPU, 2 CPUs"
    assert stated in parameters["compute_calibration"]
    assert parameters["compute_calibration"].endswith(widened)
    run = plugin_event_accumulator.EventAccumulator(
        str(document.parent), size_guidance={"tensors": 0}
    )
    run.Reload()
    text = tensor_util.make_ndarray(run.Tensors("results")[0].tensor_proto).item().decode()
    assert stated in text and widened in text


@pytest.mark.netns
@pytest.mark.tensorflow
@pytest.mark.usefixtures("temporary_files_here")
def test_the_cross_machine_mode_trains_the_job_here_and_writes_its_pair(tmp_path: Path) -> None:
    """bench/fidelity.py --cross-machine end to end on a tiny job (its plumbing, no figure):
    a trace naming another machine, its tiny job trained here uncaptured and captured on an
    emulated link, the trace replayed across it, the section printed and the pair written
    to the file given (bench/README.md and the package's pairs file left alone)."""
    from tests.conftest import BENCH, make_trace
    from tf_grpc_bench import calibration, trace_files

    # This machine's step of the job's workload, cached: neither the capture here nor the
    # replay times it (the cache is the test's own).
    tiny = CalibrationWorkload("tiny", 8, 4, "keras")
    cache = tmp_path / "calibrations.json"
    steady = (calibration.Timing(5_000_000, 0.0), calibration.Timing(5_100_000, 0.0))
    calibration.remember(host.this_machine(), tiny, 5_000_000, cache, timings=steady, spread=1.02)
    extra = (
        ("cpu_model", "Another CPU"), ("cpus", "2"), ("setup", "tf2-ps"), ("workers", "1"),
        ("ps", "1"), *Calibration(tiny, 4_000_000).extra(),
    )  # fmt: skip
    trace = make_trace(steps=2)
    metadata = dataclasses.replace(
        trace.metadata, model="tiny", strategy="tf2-parameter-server", extra=extra
    )
    path = trace_files.write_trace(
        dataclasses.replace(trace, metadata=metadata), tmp_path / "elsewhere.tfgbtrace"
    )
    readme = (BENCH / "README.md").read_text()
    package_pairs = cross_machine.PAIRS_FILE.read_text()
    pairs = tmp_path / "pairs.json"
    completed = subprocess.run(
        [sys.executable, str(BENCH / "fidelity.py"), "--cross-machine", str(path),
         "--profiles", "unlimited", "--steps", "2", "--replay-duration", "1", "--no-readme",
         "--pairs", str(pairs), "--logdir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=1200, check=False,
        env={**os.environ, calibration.CACHE_ENV: str(cache)},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    assert "## Fidelity across machines: elsewhere.tfgbtrace" in out
    assert "captured on Another CPU, 2 CPUs," in out and host.this_machine() in out
    # The link's row, then its repeats' (two pairs, --repeats' default: two uncaptured runs).
    row, repeated = [line for line in out.splitlines() if line.startswith("| unlimited |")]
    assert repeated.split(" | ")[1].count(" s, ") == 1
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[-2] == "compute x1.25"  # 5.0 ms here over the trace's 4.0 ms
    # auto (the default): the trace records no capture CPU, so no load, and why.
    assert cells[-1] == "none (auto: the trace records no capture CPU)"
    assert cells[5].startswith("**") and " / " in cells[5]  # over uncaptured / captured
    (pair,) = cross_machine.read_pairs(pairs)
    assert (pair.captured_on, pair.replayed_on) == ("Another CPU, 2 CPUs", host.this_machine())
    assert (pair.trace, pair.link, pair.compute) == (
        "elsewhere.tfgbtrace",
        "unlimited",
        "compute x1.25",
    )
    assert pair.ratio > 0 and pair.calibration == "one process, the whole local step"
    assert pair.compute_load == "none (auto: the trace records no capture CPU)"
    assert "--cross-machine" in pair.source
    assert "## Fidelity across machines: every pair of CPU models" in out
    assert (
        f"| Another CPU, 2 CPUs | {host.this_machine()} | elsewhere.tfgbtrace, unlimited |" in out
    )
    assert (BENCH / "README.md").read_text() == readme
    assert cross_machine.PAIRS_FILE.read_text() == package_pairs
