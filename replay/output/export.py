"""A result document as CSV tables for pandas, R, spreadsheets (``tf-grpc-bench export``).

Every table has one header row and one value per cell; units live in the
column names (``_ns``, ``_bytes``, ``_per_s``); a figure that does not apply
is an empty cell.  ``pandas.read_csv(DIR / "samples.csv")`` gives the raw
samples as a frame.

- ``samples.csv``: every completed call of every measured run: ``benchmark``
  (the run's label), ``run_index``, the raw sample columns of the document
  (``start_ns``, ``latency_ns``, bytes, ``server_index``, ``worker_index``,
  ``step``, ``release_lag_ns``, ``rpc_index``, ``window_held``), its ``size_class``, and, for
  trace replays whose trace is at hand, the replayed RPC: ``method``,
  ``tensor``, ``trace_caller``, ``trace_callee``;
- ``runs.csv``: one row per measured run (duration, CPU, what the servers
  received, partial, and the run's figures);
- ``steps.csv``: one row per replayed step (``step_time_ns``, and
  ``step_compute_ns`` under dependencies pacing);
- ``summary.csv``: one row per benchmark: its context (network, link rate,
  trace, benchmark, mode, rpc, pacing) and its figures (latency per size class,
  MB/s, RPCs/s, step time, prediction, CPU); every latency and step-time
  summary has the columns ``results.json`` has: count, mean, min, p50, p90,
  p99, p99.9 and max;
- ``parameters.csv``: every parameter of every benchmark, one per row
  (``benchmark``, ``name``, ``value``), the invocation's config included.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.files import write_atomically
from tf_grpc_bench.replay.core.measurement import SAMPLE_COLUMNS, BenchmarkResult, LatencySummary
from tf_grpc_bench.replay.output import hparams
from tf_grpc_bench.replay.output.document import ResultDocument
from tf_grpc_bench.replay.output.prediction import prediction_json
from tf_grpc_bench.replay.output.statistics import cpu_utilization, run_statistics
from tf_grpc_bench.replay.output.timeline import tensor_label
from tf_grpc_bench.sizes import SizeCategory, classify
from tf_grpc_bench.trace import Trace

Cell = str | int | float | bool | None
#: Statistics of a latency summary as CSV columns: (suffix, field).
SUMMARY_STATISTICS = (
    ("count", "count"),
    ("mean_ns", "mean_ns"),
    ("min_ns", "min_ns"),
    ("p50_ns", "p50_ns"),
    ("p90_ns", "p90_ns"),
    ("p99_ns", "p99_ns"),
    ("p999_ns", "p999_ns"),
    ("max_ns", "max_ns"),
)


def _cell(value: Cell) -> Cell:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def write_table(path: Path, header: Sequence[str], rows: Iterable[Sequence[Cell]]) -> Path:
    """One CSV file, written atomically (``ResultError`` naming it if it cannot be)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_cell(value) for value in row] for row in rows)
    data = text.getvalue().encode("utf-8")
    return write_atomically(
        path, lambda stream: stream.write(data), error=ResultError, what="table"
    )


def _trace_columns(trace: Trace | None, step: int, rpc_index: int) -> list[Cell]:
    if trace is None or rpc_index < 0:
        return ["", "", "", ""]
    for candidate in trace.steps:
        if candidate.index == step and rpc_index < len(candidate.rpcs):
            rpc = candidate.rpcs[rpc_index]
            return [
                rpc.method,
                tensor_label(rpc),
                trace.task_name(rpc.caller_task),
                trace.task_name(rpc.callee_task),
            ]
    return ["", "", "", ""]


def sample_rows(document: ResultDocument, trace: Trace | None) -> Iterable[list[Cell]]:
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        for run in result.runs:
            for sample in run.samples:
                yield [
                    label,
                    run.run_index,
                    *(getattr(sample, column) for column in SAMPLE_COLUMNS),
                    classify(sample.payload_bytes).value,
                    *_trace_columns(trace, sample.step, sample.rpc_index),
                ]


def run_rows(document: ResultDocument) -> Iterable[list[Cell]]:
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        for run in result.runs:
            stats = run_statistics(run)
            yield [
                label,
                run.run_index,
                run.duration_ns,
                run.client_cpu_ns,
                run.server_cpu_ns,
                run.server_received_bytes,
                run.server_received_messages,
                run.machine_cpu_busy_ticks,
                run.machine_cpu_total_ticks,
                run.partial,
                run.partial_reason,
                stats.rpc_count,
                stats.rpcs_per_s,
                stats.bandwidth_mb_per_s,
                *(getattr(stats.latency, field) for _, field in SUMMARY_STATISTICS),
            ]


def step_rows(document: ResultDocument) -> Iterable[list[Cell]]:
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        for run in result.runs:
            computes = list(run.step_compute_ns) + [None] * len(run.step_times_ns)
            for number, step_ns in enumerate(run.step_times_ns):
                yield [label, run.run_index, number, step_ns, computes[number]]


def _latency_cells(summary: LatencySummary | None) -> list[Cell]:
    if summary is None:
        return [None] * len(SUMMARY_STATISTICS)
    return [getattr(summary, field) for _, field in SUMMARY_STATISTICS]


def summary_header() -> list[str]:
    context = ["benchmark", "label", "workload", "network", "link_rate", "trace", "mode", "rpc"]
    figures = ["pacing", "compute", "rpc_count", "rpcs_per_s", "bandwidth_mb_per_s"]
    latency = [
        f"latency_{size}_{suffix}"
        for size in ("all", *(c.value for c in SizeCategory))
        for suffix, _ in SUMMARY_STATISTICS
    ]
    tail = ["predicted_step_ns", "predicted_compute_ns", "client_cpu_utilization"]
    steps = [f"step_time_{suffix}" for suffix, _ in SUMMARY_STATISTICS]
    return [*context, *figures, *latency, *steps, *tail, "server_cpu_utilization", "partial"]


def _summary_row(document: ResultDocument, result: BenchmarkResult, label: str) -> list[Cell]:
    values = hparams.hparam_values(document, result, label)
    by_class = dict(result.latency_by_category)
    predicted = prediction_json(result, document.machine.cpu_count) or {}
    return [
        result.benchmark.value,
        label,
        result.workload,
        *(values[hparams.HPARAM[name]] for name in ("network", "link rate", "trace", "mode")),
        *(values[hparams.HPARAM[name]] for name in ("rpc", "pacing", "compute")),
        result.rpc_count,
        result.rpcs_per_s,
        result.bandwidth_mb_per_s,
        *_latency_cells(result.latency_all),
        *(cell for c in SizeCategory for cell in _latency_cells(by_class.get(c))),
        *_latency_cells(result.step_time),
        predicted.get("step_ns"),
        predicted.get("compute_ns"),
        cpu_utilization(result.client_cpu_ns, result),
        cpu_utilization(result.server_cpu_ns, result),
        bool(values["partial"]),
    ]


def parameter_rows(document: ResultDocument) -> Iterable[list[Cell]]:
    for name, value in sorted(document.config.items()):
        yield ["(config)", name, value]
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        for name, value in sorted(result.parameters.items()):
            yield [label, name, value]


def export_csv(document: ResultDocument, directory: Path, trace: Trace | None) -> list[Path]:
    """Write the five tables into ``directory`` (created); returns their paths."""
    latency = [f"latency_{suffix}" for suffix, _ in SUMMARY_STATISTICS]
    run_header = ["benchmark", "run_index", "duration_ns", "client_cpu_ns", "server_cpu_ns"]
    run_header += ["server_received_bytes", "server_received_messages"]
    run_header += ["machine_cpu_busy_ticks", "machine_cpu_total_ticks", "partial"]
    run_header += ["partial_reason", "rpc_count", "rpcs_per_s", "bandwidth_mb_per_s", *latency]
    sample_header = ["benchmark", "run_index", *SAMPLE_COLUMNS, "size_class"]
    sample_header += ["method", "tensor", "trace_caller", "trace_callee"]
    return [
        write_table(directory / "samples.csv", sample_header, sample_rows(document, trace)),
        write_table(directory / "runs.csv", run_header, run_rows(document)),
        write_table(
            directory / "steps.csv",
            ["benchmark", "run_index", "step_number", "step_time_ns", "step_compute_ns"],
            step_rows(document),
        ),
        write_table(
            directory / "summary.csv",
            summary_header(),
            (
                _summary_row(document, result, label)
                for result, label in zip(document.benchmarks, document.labels, strict=True)
            ),
        ),
        write_table(
            directory / "parameters.csv", ["benchmark", "name", "value"], parameter_rows(document)
        ),
    ]
