"""``tf-grpc-bench export RUN --csv DIR``: the raw samples and the summary, as pandas reads them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.result_factory import golden_document
from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.core.measurement import SAMPLE_COLUMNS
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.document_writer import write_document

from .conftest import make_trace

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))


def _run(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *arguments], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("export")
    trace_files.write_trace(make_trace(steps=2, workers=2, ps=2), base / "toy.tfgbtrace")
    completed = _run(
        "replay", "toy.tfgbtrace", "--steps", "2", "--runs", "2", "--warmup", "0",
        "--output-dir", "runs", "--quiet", cwd=base,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    (path,) = (base / "runs").glob("*/results.json")
    return path.parent


def test_export_writes_every_sample_and_the_summary_as_tables_pandas_reads(
    run_directory: Path, tmp_path: Path
) -> None:
    completed = _run("export", str(run_directory), "--csv", "tables", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    document = read_document(run_directory / "results.json")
    trace = trace_files.read_trace(run_directory.parent.parent / "toy.tfgbtrace")
    samples = pd.read_csv(tmp_path / "tables" / "samples.csv")
    expected = [
        (label, run.run_index, sample)
        for result, label in zip(document.benchmarks, document.labels, strict=True)
        for run in result.runs
        for sample in run.samples
    ]
    assert len(samples) == len(expected)
    for (label, run_index, sample), (_, row) in zip(expected, samples.iterrows(), strict=True):
        assert row["benchmark"] == label and row["run_index"] == run_index
        assert [row[c] for c in SAMPLE_COLUMNS] == [getattr(sample, c) for c in SAMPLE_COLUMNS]
        rpc = trace.steps[sample.step].rpcs[sample.rpc_index]
        assert row["method"] == rpc.method
        assert row["trace_caller"] == trace.task_name(rpc.caller_task)
    assert samples["latency_ns"].dtype.kind == "i"

    summary = pd.read_csv(tmp_path / "tables" / "summary.csv")
    assert list(summary["label"]) == list(document.labels)
    for result, (_, row) in zip(document.benchmarks, summary.iterrows(), strict=True):
        assert row["rpc_count"] == result.rpc_count
        assert row["bandwidth_mb_per_s"] == pytest.approx(result.bandwidth_mb_per_s)
        assert row["latency_all_p99_ns"] == pytest.approx(result.latency_all.p99_ns)
        assert row["network"] == "loopback" and row["trace"] == "toy"

    runs = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert len(runs) == sum(len(r.runs) for r in document.benchmarks)
    steps = pd.read_csv(tmp_path / "tables" / "steps.csv")
    assert list(steps["step_time_ns"]) == [
        t for r in document.benchmarks for run in r.runs for t in run.step_times_ns
    ]
    parameters = pd.read_csv(tmp_path / "tables" / "parameters.csv")
    assert {"(config)", *document.labels} == set(parameters["benchmark"])


def test_export_of_a_run_whose_trace_is_gone_leaves_the_trace_columns_empty(
    tmp_path: Path,
) -> None:
    path = write_document(golden_document(), tmp_path / "run" / "results.json")
    completed = _run("export", str(path), "--csv", "tables", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "no longer there" in completed.stdout
    samples = pd.read_csv(tmp_path / "tables" / "samples.csv")
    assert samples["method"].isna().all()
    assert set(samples["size_class"]) == {"small", "medium", "large"}


def test_export_of_something_that_is_not_a_run_is_one_line(tmp_path: Path) -> None:
    completed = _run("export", "resnet50-tf2ps", "--csv", "out", cwd=tmp_path)
    assert completed.returncode != 0
    assert "expected a run directory or its results.json" in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1
