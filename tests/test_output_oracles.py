"""Every figure every writer shows, checked by value against what the samples say.

One fixed set of samples (``tests/oracle_samples.py``: synthetic calls on every size
class boundary, a small trace's calls with requests larger than responses, calls
in flight, a partial run) goes through each writer: the terminal table, the
markdown tables, TensorBoard's scalars, histograms, hparams and text (read back
with TensorBoard's own event reader), the CSV tables, the step timeline and the
comparison across links.  Each expected value is worked out from the samples by
``oracle_samples`` without the code under test.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import itertools
import math
import os
import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

from tests import oracle_samples as oracle
from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.protos import xplane_pb2
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import (
    SAMPLE_COLUMNS,
    Benchmark,
    BenchmarkResult,
    CallSample,
)
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.engines.registry import engine_named
from tf_grpc_bench.replay.output import comparison, export, report, timeline
from tf_grpc_bench.replay.output.document import ResultDocument
from tf_grpc_bench.replay.output.events import LINEAR_BUCKETS
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.statistics import calls_in_flight, median_in_flight
from tf_grpc_bench.replay.output.tensorboard import write_run
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.throughput import pack_samples, unpack_samples
from tf_grpc_bench.replay.transport.local_servers import LocalServers

from .engines import grpc_cpp_program

SIZES = ("small", "medium", "large")
#: Tag and table names of the latency statistics, by the oracle's names.
TAG_STATISTICS = {"mean": "mean", "p50": "p50", "p90": "p90", "p99": "p99", "p99.9": "p999"}


@pytest.fixture(scope="module")
def documents() -> list[ResultDocument]:
    return oracle.documents()


def _latency_cell(result: BenchmarkResult, size: str) -> str:
    figures = oracle.latency(result, size)
    if figures["count"] == 0:
        return "-"
    return f"{oracle.shown(figures['p50'] / 1e3)} / {oracle.shown(figures['p99'] / 1e3)}"


def _result_cells(result: BenchmarkResult, label: str) -> list[str]:
    """A benchmark's row of the terminal and markdown tables, worked out from its samples."""
    steps = oracle.step_times(result)
    return [
        label + ("*" if oracle.is_partial(result) else ""),
        result.workload,
        str(len(oracle.samples_of(result))),
        oracle.shown(oracle.median_in_flight(result)),
        *(_latency_cell(result, size) for size in SIZES),
        oracle.shown(oracle.mb_per_s(result)),
        oracle.shown(oracle.rpcs_per_s(result)),
        oracle.shown(oracle.percentile(steps, 50) / 1e6) if steps else "-",
    ]


HEADER = [
    "benchmark", "workload", "rpcs", "in flight p50",
    "small p50/p99 us", "medium p50/p99 us", "large p50/p99 us",
    "MB/s", "RPCs/s", "step p50 ms",
]  # fmt: skip


def _crowded_note(document: ResultDocument) -> str:
    crowded = [
        f"{label} {oracle.shown(oracle.median_in_flight(result))}"
        for result, label in zip(document.benchmarks, document.labels, strict=True)
        if oracle.median_in_flight(result) > 1
    ]
    return "latency with calls in flight (median open when each call was issued): " + ", ".join(
        crowded
    )


def _markdown_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


# --------------------------------------------------------------------------
# Tables.


def test_the_terminal_table_shows_each_benchmarks_figures(documents: list[ResultDocument]) -> None:
    document = documents[0]
    lines = report.format_table(document).splitlines()
    assert lines[0] == (
        "2026-12-01T09:00:00.000Z on oracle-host (4 CPUs), loopback, trace boundary (abababababab)"
    )
    assert re.split(r"\s{2,}", lines[1].strip()) == HEADER
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[2:5]]
    assert rows == [
        _result_cells(result, label)
        for result, label in zip(document.benchmarks, document.labels, strict=True)
    ]
    assert lines[5:] == [
        _crowded_note(document),
        "* partial: ps-throughput: server 1 stopped answering",
    ]


def test_the_markdown_table_shows_each_networks_benchmarks(
    documents: list[ResultDocument],
) -> None:
    lines = report.format_markdown_table(documents).splitlines()
    assert _markdown_cells(lines[0]) == ["network", "trace", *HEADER]
    expected = [
        [network, "boundary", *_result_cells(result, label)]
        for (network, _, _), document in zip(oracle.NETWORKS, documents, strict=True)
        for result, label in zip(document.benchmarks, document.labels, strict=True)
    ]
    assert [_markdown_cells(line) for line in lines[2:8]] == expected
    assert lines[8:] == [
        "",
        f"loopback: {_crowded_note(documents[0])}",
        f"veth-1gbit: {_crowded_note(documents[1])}",
        "* partial: loopback, ps-throughput: server 1 stopped answering",
        "* partial: veth-1gbit, ps-throughput: server 1 stopped answering",
    ]


def _detail_tables(result: BenchmarkResult) -> tuple[list[list[str]], list[list[str]]]:
    """The expected rows of a benchmark's text summary: latency per class, then per run."""
    latency_rows = []
    for size in [*oracle.classes_present(result), "all"]:
        figures = oracle.latency(result, size)
        latency_rows.append(
            [
                size,
                str(figures["count"]),
                *(
                    oracle.shown(figures[name] / 1e3)
                    for name in ("mean", "p50", "p90", "p99", "p999", "max")
                ),
            ]
        )
    run_rows = []
    for run in result.runs:
        latencies = [s.latency_ns for s in run.samples]
        run_rows.append(
            [
                str(run.run_index),
                str(len(run.samples)),
                oracle.shown(run.duration_ns / 1e9),
                oracle.shown(oracle.run_mb_per_s(run)),
                oracle.shown(oracle.run_rpcs_per_s(run)),
                oracle.shown(oracle.percentile(oracle.in_flight(run.samples), 50)),
                oracle.shown(oracle.percentile(latencies, 50) / 1e3),
                oracle.shown(oracle.percentile(latencies, 99) / 1e3),
                oracle.shown(oracle.percentile(run.step_times_ns, 50) / 1e6)
                if run.step_times_ns
                else "-",
                run.partial_reason if run.partial else "",
            ]
        )
    return latency_rows, run_rows


def _check_detail(text: str, result: BenchmarkResult) -> None:
    lines = text.splitlines()
    blank = lines.index("")
    latency_rows, run_rows = _detail_tables(result)
    assert _markdown_cells(lines[0]) == [
        "class", "count", "mean us", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us",
    ]  # fmt: skip
    assert [_markdown_cells(line) for line in lines[2:blank]] == latency_rows
    assert _markdown_cells(lines[blank + 1]) == [
        "run", "rpcs", "seconds", "MB/s", "RPCs/s", "in flight p50", "p50 us", "p99 us",
        "step p50 ms", "partial",
    ]  # fmt: skip
    assert [_markdown_cells(line) for line in lines[blank + 3 :]] == run_rows


def test_each_benchmarks_detail_shows_every_percentile_its_header_names(
    documents: list[ResultDocument],
) -> None:
    for result in documents[0].benchmarks:
        _check_detail(report.format_benchmark_markdown(result), result)


# --------------------------------------------------------------------------
# TensorBoard, read back with its own event reader.


def _load(directory: Path) -> plugin_event_accumulator.EventAccumulator:
    accumulator = plugin_event_accumulator.EventAccumulator(
        str(directory), size_guidance={"tensors": 0}
    )
    accumulator.Reload()
    return accumulator


def _scalars(run: plugin_event_accumulator.EventAccumulator) -> dict[str, dict[int, float]]:
    found = {}
    for tag in run.Tags()["tensors"]:
        if run.SummaryMetadata(tag).plugin_data.plugin_name == "scalars":
            found[tag] = {
                event.step: float(tensor_util.make_ndarray(event.tensor_proto))
                for event in run.Tensors(tag)
            }
    return found


def _text(run: plugin_event_accumulator.EventAccumulator, tag: str) -> str:
    return str(tensor_util.make_ndarray(run.Tensors(tag)[0].tensor_proto).item().decode())


def _expected_figures(result: BenchmarkResult, cpu_count: int) -> dict[str, float]:
    """Every figure over all runs a benchmark's TensorBoard run must show, by tag."""
    figures: dict[str, float] = {
        "rpcs/count": len(oracle.samples_of(result)),
        "throughput/bandwidth_mb_per_s": oracle.mb_per_s(result),
        "throughput/rpcs_per_s": oracle.rpcs_per_s(result),
        "cpu/client_utilization": oracle.cpu_cores(
            sum(r.client_cpu_ns for r in result.runs), result
        ),
        "cpu/server_utilization": oracle.cpu_cores(
            sum(r.server_cpu_ns for r in result.runs), result
        ),
    }
    for size in ["all", *oracle.classes_present(result)]:
        summary = oracle.latency(result, size)
        figures.update(
            {
                f"latency_us/{size}/{tag}": summary[name] / 1e3
                for tag, name in {**TAG_STATISTICS, "max": "max"}.items()
            }
        )
    steps = oracle.step_times(result)
    if steps:
        summary = oracle.summary(steps)
        figures.update(
            {
                f"step_time_ms/{tag}": summary[name] / 1e6
                for tag, name in {**TAG_STATISTICS, "max": "max"}.items()
            }
        )
    predicted = oracle.prediction(result)
    if predicted is not None:
        figures.update({f"prediction/{name}_ms": v / 1e6 for name, v in predicted.items()})
    return figures


def _expected_per_run(result: BenchmarkResult) -> dict[str, dict[int, float]]:
    per_run: dict[str, dict[int, float]] = {}
    step_number = 0
    for run in result.runs:
        latencies = [s.latency_ns for s in run.samples]
        values = {
            "per_run/bandwidth_mb_per_s": oracle.run_mb_per_s(run),
            "per_run/rpcs_per_s": oracle.run_rpcs_per_s(run),
            "per_run/latency_p50_us": oracle.percentile(latencies, 50) / 1e3,
            "per_run/latency_p99_us": oracle.percentile(latencies, 99) / 1e3,
            "per_run/client_cpu_utilization": run.client_cpu_ns / run.duration_ns,
            "per_run/server_cpu_utilization": run.server_cpu_ns / run.duration_ns,
        }
        if run.step_times_ns:
            values["per_run/step_time_mean_ms"] = (
                sum(run.step_times_ns) / len(run.step_times_ns) / 1e6
            )
        for tag, value in values.items():
            per_run.setdefault(tag, {})[run.run_index] = value
        for step_ns in run.step_times_ns:
            per_run.setdefault("per_step/communication_time_ms", {})[step_number] = step_ns / 1e6
            step_number += 1
    return per_run


def _close(shown: dict[int, float], expected: dict[int, float]) -> bool:
    """Equal as float32 (what the writer stores) up to a few units in the last place."""
    return sorted(shown) == sorted(expected) and all(
        shown[step] == pytest.approx(float(np.float32(expected[step])), rel=1e-6)
        for step in expected
    )


def test_tensorboard_scalars_show_every_figure_of_every_benchmark(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    document = documents[0]
    write_run(document, tmp_path)
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        scalars = _scalars(_load(tmp_path / label))
        flat = {
            tag: dict.fromkeys(range(20), value)
            for tag, value in _expected_figures(result, oracle.MACHINE.cpu_count).items()
        }
        expected = {**flat, **_expected_per_run(result)}
        assert sorted(scalars) == sorted(expected), label
        wrong = [tag for tag in expected if not _close(scalars[tag], expected[tag])]
        assert not wrong, {tag: (scalars[tag], expected[tag]) for tag in wrong}


def test_tensorboard_histograms_count_each_call_in_its_size_class(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    document = documents[0]
    write_run(document, tmp_path)
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        run = _load(tmp_path / label)
        histograms = {
            tag: {
                event.step: tensor_util.make_ndarray(event.tensor_proto)
                for event in run.Tensors(tag)
            }
            for tag in run.Tags()["tensors"]
            if run.SummaryMetadata(tag).plugin_data.plugin_name == "histograms"
        }
        for measured in result.runs:
            index = measured.run_index
            by_class = Counter(oracle.size_class(s) for s in measured.samples)
            for size in SIZES:
                buckets = histograms.get(f"histogram/latency_ms/{size}", {}).get(index)
                counted = 0 if buckets is None else int(buckets[:, 2].sum())
                assert counted == by_class[size], (label, index, size)
                if buckets is not None:
                    latencies = [
                        s.latency_ns / 1e6 for s in measured.samples if oracle.size_class(s) == size
                    ]
                    assert buckets[0, 0] == pytest.approx(min(latencies))
                    assert buckets[-1, 1] == pytest.approx(max(latencies))
            sizes = histograms["histogram/message_size_log10_bytes"][index]
            assert int(sizes[:, 2].sum()) == len(measured.samples)
            larger = [max(s.request_bytes, s.response_bytes, 1) for s in measured.samples]
            assert sizes[0, 0] == pytest.approx(math.log10(min(larger)))
            assert sizes[-1, 1] == pytest.approx(math.log10(max(larger)))
            assert int(histograms["histogram/latency_ms"][index][:, 2].sum()) == len(
                measured.samples
            )
            if measured.step_times_ns:
                steps = histograms["histogram/step_time_ms"][index]
                assert int(steps[:, 2].sum()) == len(measured.step_times_ns)


def test_tensorboard_histograms_span_each_runs_values_in_their_units(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    """Each histogram's first edge is the run's smallest value and its last the largest,
    exactly, in the unit its tag names (latencies and step times in ms, sizes as log10
    of bytes); the sizes in equal-width buckets, the axis already in decades."""
    document = documents[0]
    write_run(document, tmp_path)
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        run = _load(tmp_path / label)

        def buckets(
            tag: str, index: int, run: plugin_event_accumulator.EventAccumulator = run
        ) -> np.ndarray:
            (event,) = [e for e in run.Tensors(tag) if e.step == index]
            return tensor_util.make_ndarray(event.tensor_proto)

        for measured in result.runs:
            index = measured.run_index
            spans = {"histogram/latency_ms": [s.latency_ns / 1e6 for s in measured.samples]}
            for size in SIZES:
                in_class = [s for s in measured.samples if oracle.size_class(s) == size]
                if in_class:
                    spans[f"histogram/latency_ms/{size}"] = [s.latency_ns / 1e6 for s in in_class]
            if measured.step_times_ns:
                spans["histogram/step_time_ms"] = [t / 1e6 for t in measured.step_times_ns]
            for tag, values in spans.items():
                shown = buckets(tag, index)
                assert (shown[0, 0], shown[-1, 1]) == (min(values), max(values)), (label, tag)
            sizes = buckets("histogram/message_size_log10_bytes", index)
            larger = [
                math.log10(max(s.request_bytes, s.response_bytes, 1)) for s in measured.samples
            ]
            assert (sizes[0, 0], sizes[-1, 1]) == (min(larger), max(larger))
            widths = sizes[:, 1] - sizes[:, 0]
            assert len(sizes) == LINEAR_BUCKETS, label
            assert widths == pytest.approx([widths[0]] * LINEAR_BUCKETS), label


def test_tensorboard_describes_the_figures_whose_units_need_saying(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    write_run(documents[0], tmp_path)
    for label in documents[0].labels:
        run = _load(tmp_path / label)
        described = {
            tag: run.SummaryMetadata(tag).summary_description for tag in run.Tags()["tensors"]
        }
        assert {tag: text for tag, text in described.items() if text} == {
            "throughput/bandwidth_mb_per_s": (
                "Request plus response payload, MB (10**6 bytes) per second, mean over runs."
            ),
            "throughput/rpcs_per_s": "Completed RPCs per second over all workers, mean over runs.",
            "histogram/message_size_log10_bytes": (
                "log10 of each message's size in bytes: 1 is 10 B, 3 is 1 kB, 6 is 1 MB."
            ),
        }, label


def test_tensorboard_sessions_start_when_the_document_was_made(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    for number, document in enumerate(documents):
        write_run(document, tmp_path / f"run{number}")
        made = oracle.CREATED.replace(minute=number).timestamp()
        for label in document.labels:
            run = _load(tmp_path / f"run{number}" / label)
            content = run.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data
            start = hparams_metadata.parse_session_start_info_plugin_data(content.content)
            assert start.start_time_secs == made, label


def test_tensorboard_context_lists_every_address_of_the_network(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    document = documents[0]
    assert document.network is not None
    network = dataclasses.replace(document.network, addresses=("10.0.0.1:50001", "10.0.0.2:50002"))
    write_run(dataclasses.replace(document, network=network), tmp_path)
    context = _text(_load(tmp_path), "results").split("\n\n")[1].splitlines()
    assert "- network: loopback, 10.0.0.1:50001, 10.0.0.2:50002" in context


def _expected_hparams(
    document: ResultDocument, result: BenchmarkResult, label: str
) -> dict[str, str | bool]:
    network = document.network
    assert network is not None
    rate = network.emulated_rate_bits_per_s
    parameters = {**document.config, **result.parameters}

    def text(value: object) -> str | bool:
        if isinstance(value, bool | str):
            return value
        return f"{value:g}" if isinstance(value, float) else str(value)

    pacing = parameters["pacing"]
    values: dict[str, str | bool] = {
        "01 network": network.name,
        "02 benchmark": result.benchmark.value,
        "03 rpc": "unary",
        "04 pacing": str(pacing),
        "05 compute": "recorded" if pacing == "dependencies" else "-",
        "06 link rate": f"{rate // 10**9} Gbit/s" if rate else "unlimited",
        "07 trace": "boundary",
        "08 mode": "non-serialized",
        "label": label,
        "workload": result.workload,
        "trace_sha256": "abababababab",
        "host": "oracle-host",
        "created_utc": document.created_utc,
        "partial": oracle.is_partial(result),
    }
    for name, value in parameters.items():
        if name == "grpc_channels":
            values["09 grpc channels"] = text(value)
        elif name not in ("mode", "rpc", "pacing", "compute_scale"):
            values[name] = text(value)
    return values


def test_tensorboard_hparams_name_each_session_and_its_settings(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    for number, document in enumerate(documents):
        directory = tmp_path / f"run{number}"
        write_run(document, directory)
        for result, label in zip(document.benchmarks, document.labels, strict=True):
            run = _load(directory / label)
            content = run.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data
            start = hparams_metadata.parse_session_start_info_plugin_data(content.content)
            assert start.group_name == f"run{number}/{label}"
            shown = {
                name: value.bool_value if value.HasField("bool_value") else value.string_value
                for name, value in start.hparams.items()
            }
            assert shown == _expected_hparams(document, result, label)


def test_tensorboard_text_shows_the_tables_with_the_context(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    document = documents[1]
    write_run(document, tmp_path)
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        _check_detail(_text(_load(tmp_path / label), "summary"), result)
    text = _text(_load(tmp_path), "results")
    title, context, table = text.split("\n\n", 2)
    assert title == (
        "**2026-12-01T09:01:00.000Z on oracle-host (4 CPUs), veth-1gbit, trace boundary "
        "(abababababab)**"
    )
    assert context.splitlines() == [
        f"- tool {document.tool_version}, result format {document.format_version}",
        "- machine: Example CPU, 4 CPUs, kernel 6.1.0, Python 3.11.2, grpcio 1.85.0, "
        "protobuf 6.0.0",
        f"- trace: `/traces/boundary.tfgbtrace` sha256 `{'ab' * 32}`",
        "- network: veth-1gbit, emulated 1000000000 bit/s (tbf), 127.0.0.1:50001",
        "- **partial**: ps-throughput: server 1 stopped answering",
    ]
    lines = table.splitlines()
    assert [_markdown_cells(line) for line in lines[2:5]] == [
        ["veth-1gbit", "boundary", *_result_cells(result, label)]
        for result, label in zip(document.benchmarks, document.labels, strict=True)
    ]


# --------------------------------------------------------------------------
# CSV tables.


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def _cell(value: object) -> str:
    """A value as the CSV writer writes it: NaN and None empty, the rest as Python prints."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _assert_figures(row: dict[str, str], expected: dict[str, float]) -> None:
    for column, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert row[column] == "", column
        else:
            assert float(row[column]) == pytest.approx(value, rel=1e-12), column


def test_csv_tables_hold_every_sample_run_step_and_figure(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    document = documents[0]
    trace = oracle.boundary_trace()
    export.export_csv(document, tmp_path, trace)
    labelled = list(zip(document.benchmarks, document.labels, strict=True))

    samples = _read_csv(tmp_path / "samples.csv")
    expected_samples = []
    for result, label in labelled:
        for run in result.runs:
            for sample in run.samples:
                row = {
                    "benchmark": label,
                    "run_index": str(run.run_index),
                    **{column: str(getattr(sample, column)) for column in SAMPLE_COLUMNS},
                    "size_class": oracle.size_class(sample),
                    "method": "",
                    "tensor": "",
                    "trace_caller": "",
                    "trace_callee": "",
                }
                if sample.rpc_index >= 0:
                    rpc = oracle.traced_rpc(trace, sample)
                    row.update(
                        method=rpc.method,
                        tensor=oracle.tensor_label(rpc),
                        trace_caller=oracle.task_name(trace, rpc.caller_task),
                        trace_callee=oracle.task_name(trace, rpc.callee_task),
                    )
                expected_samples.append(row)
    assert samples == expected_samples

    runs = _read_csv(tmp_path / "runs.csv")
    expected_runs = []
    for result, label in labelled:
        for run in result.runs:
            expected_runs.append((label, run))
    assert len(runs) == len(expected_runs)
    for row, (label, run) in zip(runs, expected_runs, strict=True):
        assert row["benchmark"] == label and row["run_index"] == str(run.run_index)
        for column in (
            "duration_ns", "client_cpu_ns", "server_cpu_ns", "server_received_bytes",
            "server_received_messages", "machine_cpu_busy_ticks", "machine_cpu_total_ticks",
            "partial", "partial_reason",
        ):  # fmt: skip
            assert row[column] == str(getattr(run, column)), column
        latency = oracle.summary([s.latency_ns for s in run.samples])
        _assert_figures(
            row,
            {
                "rpc_count": len(run.samples),
                "rpcs_per_s": oracle.run_rpcs_per_s(run),
                "bandwidth_mb_per_s": oracle.run_mb_per_s(run),
                **{f"latency_{name}{'' if name == 'count' else '_ns'}": v
                   for name, v in latency.items()},
            },
        )  # fmt: skip

    steps = _read_csv(tmp_path / "steps.csv")
    assert steps == [
        {
            "benchmark": label,
            "run_index": str(run.run_index),
            "step_number": str(number),
            "step_time_ns": str(step_ns),
            "step_compute_ns": str(run.step_compute_ns[number]),
        }
        for result, label in labelled
        for run in result.runs
        for number, step_ns in enumerate(run.step_times_ns)
    ]

    summaries = _read_csv(tmp_path / "summary.csv")
    assert [row["label"] for row in summaries] == list(document.labels)
    for row, (result, label) in zip(summaries, labelled, strict=True):
        hparams = _expected_hparams(document, result, label)
        assert {
            column: row[column]
            for column in (
                "benchmark", "workload", "network", "link_rate", "trace", "mode", "rpc",
                "pacing", "compute", "partial",
            )
        } == {
            "benchmark": result.benchmark.value, "workload": result.workload,
            "network": "loopback", "link_rate": "unlimited", "trace": "boundary",
            "mode": "non-serialized", "rpc": "unary", "pacing": hparams["04 pacing"],
            "compute": hparams["05 compute"], "partial": str(oracle.is_partial(result)),
        }  # fmt: skip
        figures: dict[str, float] = {
            "rpc_count": len(oracle.samples_of(result)),
            "rpcs_per_s": oracle.rpcs_per_s(result),
            "bandwidth_mb_per_s": oracle.mb_per_s(result),
            "client_cpu_utilization": oracle.cpu_cores(
                sum(r.client_cpu_ns for r in result.runs), result
            ),
            "server_cpu_utilization": oracle.cpu_cores(
                sum(r.server_cpu_ns for r in result.runs), result
            ),
        }
        for size in ("all", *SIZES):
            latency = oracle.latency(result, size)
            for name, value in latency.items():
                column = f"latency_{size}_{name}{'' if name == 'count' else '_ns'}"
                absent = size != "all" and latency["count"] == 0
                figures[column] = math.nan if absent else value
        for name, value in oracle.summary(oracle.step_times(result)).items():
            figures[f"step_time_{name}{'' if name == 'count' else '_ns'}"] = value
        predicted = oracle.prediction(result) or {}
        figures["predicted_step_ns"] = predicted.get("step", math.nan)
        figures["predicted_compute_ns"] = predicted.get("compute", math.nan)
        _assert_figures(row, figures)
        assert set(row) == {
            "benchmark", "label", "workload", "network", "link_rate", "trace", "mode", "rpc",
            "pacing", "compute", "partial", *figures,
        }  # fmt: skip

    parameters = _read_csv(tmp_path / "parameters.csv")
    assert parameters == [
        {"benchmark": "(config)", "name": "command", "value": "replay"},
        {"benchmark": "(config)", "name": "runs", "value": "2"},
        *(
            {"benchmark": label, "name": name, "value": _cell(value)}
            for result, label in labelled
            for name, value in sorted(result.parameters.items())
        ),
    ]


def test_csv_tables_leave_empty_what_a_sample_or_a_benchmark_lacks(tmp_path: Path) -> None:
    """A synthetic benchmark without medium and large calls, a trace replay without kept
    compute, calls naming a step the trace lacks or an RPC past the end of their step,
    and the same document exported without its trace: those cells are empty."""
    trace = oracle.boundary_trace()
    echoes, _, throughput = oracle.results()
    small = dataclasses.replace(
        echoes,
        runs=tuple(dataclasses.replace(run, samples=run.samples[:3]) for run in echoes.runs),
    )
    run = throughput.runs[0]
    odd = (
        dataclasses.replace(run.samples[0], step=99),
        dataclasses.replace(run.samples[1], rpc_index=len(trace.steps[1].rpcs)),
        *run.samples[2:],
    )
    uncomputed = dataclasses.replace(
        throughput,
        parameters={**throughput.parameters, "pacing": "asap"},
        runs=(dataclasses.replace(run, samples=odd, step_compute_ns=()),),
        partial=False,
    )
    document = oracle.documents()[0]
    document = dataclasses.replace(document, benchmarks=(small, uncomputed))
    for name, given in (("with", trace), ("without", None)):
        export.export_csv(document, tmp_path / name, given)
        for table in ("samples", "runs", "steps", "summary", "parameters"):
            assert b"\r" not in (tmp_path / name / f"{table}.csv").read_bytes()
        samples = [r for r in _read_csv(tmp_path / name / "samples.csv")]
        traced = [r for r in samples if r["benchmark"] == "ps-throughput"]
        empty = {"method": "", "tensor": "", "trace_caller": "", "trace_callee": ""}
        for row in traced[:2] if given is not None else traced:
            assert {k: row[k] for k in empty} == empty
        if given is not None:
            assert traced[2]["tensor"] == oracle.tensor_label(oracle.traced_rpc(trace, odd[2]))
        (summary, _) = _read_csv(tmp_path / name / "summary.csv")
        for size in ("medium", "large"):
            assert all(v == "" for k, v in summary.items() if k.startswith(f"latency_{size}_"))
        assert summary["latency_small_count"] == "6"
        steps = _read_csv(tmp_path / name / "steps.csv")
        assert [r["step_time_ns"] for r in steps] == [str(t) for t in run.step_times_ns]
        assert {r["step_compute_ns"] for r in steps} == {""}
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(ResultError, match=r"a-file/samples\.csv: cannot write table \("):
        export.export_csv(document, blocked, trace)


# --------------------------------------------------------------------------
# The step timeline.


def _slices(events: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    """The X slices of a trace-event list, by the name of their process; each with the
    name of its thread (the row) as ``row``."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}  # type: ignore[index]
    rows = {
        (e["pid"], e["tid"]): e["args"]["name"]  # type: ignore[index]
        for e in events
        if e.get("name") == "thread_name"
    }
    by_group: dict[str, list[dict[str, object]]] = {}
    for event in events:
        if event["ph"] == "X":
            row = rows[(event["pid"], event["tid"])]
            by_group.setdefault(str(names[event["pid"]]), []).append({**event, "row": row})
    return by_group


def _calls(slices: list[dict[str, object]]) -> list[dict[str, object]]:
    """The slices of the ``calls`` rows (not the steps, gaps or critical path)."""
    return [e for e in slices if str(e["row"]).startswith("calls")]


def test_the_timeline_draws_each_replayed_and_captured_call_where_and_as_it_was(
    documents: list[ResultDocument],
) -> None:
    result = documents[0].benchmarks[2]
    trace = oracle.boundary_trace()
    drawn = timeline.run_timeline(result, "ps-throughput", trace, steps=2)
    groups = _slices(timeline.trace_events(drawn)["traceEvents"])  # type: ignore[arg-type]

    # Replayed: the first measured run, each worker's first two steps, from the earliest call.
    run = result.runs[0]
    clients = ["/job:worker/task:0", "/job:worker/task:1"]
    servers = ["/job:ps/task:0", "/job:ps/task:1"]
    kept = []
    for worker in (0, 1):
        mine = sorted(
            (s for s in run.samples if s.worker_index == worker),
            key=lambda s: (s.start_ns, s.rpc_index),
        )
        first_steps = sorted({s.step for s in mine}, key=[s.step for s in mine].index)[:2]
        kept += [s for s in mine if s.step in first_steps]
    origin = min(s.start_ns for s in kept)
    for worker in (0, 1):
        expected = []
        for sample in kept:
            if sample.worker_index != worker:
                continue
            rpc = oracle.traced_rpc(trace, sample)
            caller = oracle.task_name(trace, rpc.caller_task)
            pushed = servers[sample.server_index] == caller
            expected.append(
                (
                    f"RecvTensor {oracle.tensor_label(rpc)}",
                    (sample.start_ns - origin) / 1e3,
                    sample.latency_ns / 1e3,
                    servers[sample.server_index],
                    sample.request_bytes,
                    sample.response_bytes,
                    sample.latency_ns / 1e6,
                    sample.release_lag_ns / 1e3,
                    sample.step,
                    sample.rpc_index,
                    "push (the trace's response as request)" if pushed else "pull",
                    caller,
                    oracle.task_name(trace, rpc.callee_task),
                    rpc.request_bytes,
                    rpc.response_bytes,
                )
            )
        calls = _calls(groups[f"replayed {clients[worker]}"])
        shown = [
            (
                e["name"], e["ts"], e["dur"],
                *(e["args"][k] for k in (  # type: ignore[index]
                    "server", "request_bytes", "response_bytes", "latency_ms", "release_lag_us",
                    "step", "rpc_index", "replayed_as", "trace_caller", "trace_callee",
                    "trace_request_bytes", "trace_response_bytes",
                )),
            )
            for e in calls
        ]  # fmt: skip
        assert sorted(shown, key=repr) == sorted(expected, key=repr)

    # Captured: every task's calls of the trace's first two steps, from the first step's start.
    first = trace.steps[0].start_ns
    for task in range(len(trace.tasks)):
        name = f"captured {oracle.task_name(trace, task)}"
        calls = _calls(groups[name])
        expected_calls = [
            (
                f"RecvTensor {oracle.tensor_label(rpc)}",
                (rpc.start_ns - first) / 1e3,
                (rpc.end_ns - rpc.start_ns) / 1e3,
                oracle.task_name(trace, rpc.caller_task),
                oracle.task_name(trace, rpc.callee_task),
            )
            for step in trace.steps[:2]
            for rpc in step.rpcs
            if rpc.caller_task == task
        ]
        assert sorted(
            (e["name"], e["ts"], e["dur"], e["args"]["caller"], e["args"]["callee"])  # type: ignore[index]
            for e in calls
        ) == sorted(expected_calls)
        steps = [(e["name"], e["ts"], e["dur"]) for e in groups[name] if e["cat"] == "step"]
        assert steps == [
            (f"step {s.index}", (s.start_ns - first) / 1e3, (s.end_ns - s.start_ns) / 1e3)
            for s in trace.steps[:2]
        ]

    # The profile TensorBoard's Profile tab reads: the same slices, in ps, per task.
    space = xplane_pb2.XSpace.FromString(timeline.profile_bytes(drawn, "ps-throughput"))
    for plane in space.planes:
        group = plane.name.split(" ", 1)[1]
        events = sorted(
            (plane.event_metadata[e.metadata_id].name, e.offset_ps, e.duration_ps)
            for line in plane.lines
            for e in line.events
        )
        assert events == sorted(
            (e["name"], round(e["ts"] * 1e6), round(e["dur"] * 1e6))  # type: ignore[operator]
            for e in groups[group]
        )


# --------------------------------------------------------------------------
# The comparison across links.


def _link_bound_s(rate: int) -> float | None:
    """The heavier direction's median step bytes between the ps host and the other, over
    the rate; None without a rate."""
    if not rate:
        return None
    trace = oracle.boundary_trace()
    up, down = [], []
    for step in trace.steps:
        to_ps = sum(
            r.request_bytes if trace.tasks[r.callee_task].job == "ps" else r.response_bytes
            for r in step.rpcs
        )
        to_workers = sum(
            r.response_bytes if trace.tasks[r.callee_task].job == "ps" else r.request_bytes
            for r in step.rpcs
        )
        up.append(to_ps)
        down.append(to_workers)
    return max(oracle.percentile(up, 50), oracle.percentile(down, 50)) * 8 / rate


def test_the_comparison_shows_each_links_step_and_latency_by_value(
    documents: list[ResultDocument], tmp_path: Path
) -> None:
    trace = oracle.boundary_trace()
    points = comparison.link_points(documents, trace=trace, training_s={"veth-1gbit": 0.5})
    expected_points = []
    for (name, rate, _), document in zip(oracle.NETWORKS, documents, strict=True):
        predicted = oracle.prediction(document.benchmarks[2])
        assert predicted is not None
        expected_points.append(
            (name, rate, predicted["step"] / 1e9, 0.5 if rate else None, _link_bound_s(rate))
        )
    # Rated links by rate, the unlimited one last.
    expected_points = sorted(expected_points, key=lambda p: (p[1] == 0, p[1]))
    shown_points = [
        (p.name, p.rate_bits_per_s, p.replay_step_s, p.training_step_s, p.link_bound_s)
        for p in points
    ]
    assert len(shown_points) == len(expected_points)
    for point, expected_point in zip(shown_points, expected_points, strict=True):
        assert point[:2] == expected_point[:2]
        for shown_value, value in zip(point[2:], expected_point[2:], strict=True):
            assert shown_value == (None if value is None else pytest.approx(value, rel=1e-12))

    run = comparison.write_comparison(tmp_path, documents, points=points, wall_time_s=1.0e9)
    board = _load(run)
    scalars = _scalars(board)
    veth = documents[1]
    expected: dict[str, dict[int, float]] = {
        "step_vs_rate/replay_ms": {1000: expected_points[0][2] * 1e3},
        "step_vs_rate/training_ms": {1000: 500.0},
        "step_vs_rate/link_bound_ms": {1000: expected_points[0][4] * 1e3},  # type: ignore[operator]
    }
    for result, label in zip(veth.benchmarks, veth.labels, strict=True):
        for size in oracle.classes_present(result):
            for stat in ("p50", "p99"):
                expected[f"latency_vs_rate/{label}/{size}_{stat}_us"] = {
                    1000: oracle.latency(result, size)[stat] / 1e3
                }
    assert sorted(scalars) == sorted(expected)
    wrong = [tag for tag in expected if not _close(scalars[tag], expected[tag])]
    assert not wrong, {tag: (scalars[tag], expected[tag]) for tag in wrong}

    text = _text(board, "comparison")
    lines = text.splitlines()

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    assert lines[:4] == [
        "| link | rate | replay step p50 | training step p50 | link bound |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {'1 Gbit/s' if rate else 'unlimited'} | {seconds(step)} | "
            f"{seconds(training)} | {seconds(bound)} |"
            for name, rate, step, training, bound in expected_points
        ),
    ]
    assert lines[5:] == report.format_markdown_table(documents).splitlines()


# --------------------------------------------------------------------------
# The samples themselves: a real replay over loopback builds them.


@pytest.mark.parametrize(
    ("benchmark", "pacing"),
    [
        (Benchmark.PS_THROUGHPUT, Pacing(window=None)),
        (Benchmark.P2P_LATENCY, Pacing()),
        (Benchmark.P2P_LATENCY, Pacing(timing=Timing.RATE, rate_per_s=2000.0)),
    ],
    ids=["ps-throughput", "p2p-latency", "p2p-latency-rate"],
)
# Each engine builds its samples itself (grpcio's driver, the gRPC C++ engine's).
@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_a_replayed_call_is_counted_in_the_class_of_its_larger_message(
    benchmark: Benchmark, pacing: Pacing, engine: str
) -> None:
    """Real gRPC clients and servers, of each engine, replay the boundary trace (weights
    pulled at every class boundary, gradients pushed back: a push's request is the larger
    message); each sample carries its traced call's sizes, server and worker, is counted
    by the larger message, and says how late it went after its planned release (none
    planned as fast as possible; after it, within the run, at a fixed rate)."""
    if engine == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    trace = oracle.boundary_trace()
    workload = trace_workload(trace, benchmark, mode=Mode.NON_SERIALIZED)
    plan = RunPlan(warmup_ns=0, duration_ns=1, runs=1, steps=2, deadline_s=120)
    with LocalServers(2, mode=Mode.NON_SERIALIZED) as servers:
        result = run_benchmark(
            workload, servers.targets, plan=plan, pacing=pacing, engine=engine_named(engine)
        )
    assert result.parameters["engine"] == engine
    assert not result.partial, result.partial_reason
    samples = oracle.samples_of(result)
    assert samples
    servers_played = str(result.parameters["server_tasks"]).split(",")
    # P2P replays one (worker, ps) pair: the worker is the pair's first task.
    workers_played = str(
        result.parameters.get("client_tasks", str(result.parameters.get("pair")).split("->")[0])
    ).split(",")
    pushes = 0
    for sample in samples:
        rpc = oracle.traced_rpc(trace, sample)
        pushed = trace.tasks[rpc.caller_task].job == "ps"
        ps, worker = (rpc.caller_task, rpc.callee_task) if pushed else (
            rpc.callee_task, rpc.caller_task
        )  # fmt: skip
        traced = (rpc.response_bytes, rpc.request_bytes) if pushed else (
            rpc.request_bytes, rpc.response_bytes
        )  # fmt: skip
        pushes += pushed
        assert (sample.request_bytes, sample.response_bytes) == traced
        assert sample.payload_bytes == max(traced)
        assert servers_played[sample.server_index] == oracle.task_name(trace, ps)
        assert workers_played[sample.worker_index] == oracle.task_name(trace, worker)
        assert 0 <= sample.release_lag_ns <= result.runs[0].duration_ns
        # Held back by the window or not, and never without a planned release.
        assert sample.window_held in ((0,) if pacing.timing is Timing.ASAP else (0, 1))
    lags = [s.release_lag_ns for s in samples]
    if pacing.timing is Timing.ASAP:
        assert set(lags) == {0}
    else:
        assert max(lags) > 0
    counted = {
        size: summary.count
        for size, summary in ((c.value, s) for c, s in result.latency_by_category)
    }
    assert counted == Counter(oracle.size_class(s) for s in samples)
    # Pushes whose request is in another class than their response are among them.
    assert pushes and any(
        oracle.size_class(s) != oracle.size_class(dataclasses.replace(s, request_bytes=0))
        for s in samples
    )


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_a_call_the_window_of_one_held_back_says_so_in_its_sample(engine: str) -> None:
    """At 10 million calls a second every call is due before the one before it can end:
    a window of one holds back each call of a step but its first.  A call is held
    where its planned release (its issue less its lag) came at or before the end of
    the step's call before it, and the sample of each says so."""
    if engine == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    trace = oracle.boundary_trace()
    workload = trace_workload(trace, Benchmark.P2P_LATENCY, mode=Mode.NON_SERIALIZED)
    plan = RunPlan(warmup_ns=0, duration_ns=1, runs=1, steps=2, deadline_s=120)
    pacing = Pacing(timing=Timing.RATE, rate_per_s=1e7, window=1)
    with LocalServers(2, mode=Mode.NON_SERIALIZED) as servers:
        result = run_benchmark(
            workload, servers.targets, plan=plan, pacing=pacing, engine=engine_named(engine)
        )
    assert not result.partial, result.partial_reason
    steps: dict[tuple[int, int], list[CallSample]] = {}
    for sample in sorted(oracle.samples_of(result), key=lambda s: s.start_ns):
        steps.setdefault((sample.worker_index, sample.step), []).append(sample)
    assert len(steps) == 2 and all(len(calls) > 1 for calls in steps.values())
    for calls in steps.values():
        expected = [0] + [
            int(call.start_ns - call.release_lag_ns <= before.start_ns + before.latency_ns)
            for before, call in itertools.pairwise(calls)
        ]
        assert [call.window_held for call in calls] == expected == [0] + [1] * (len(calls) - 1)
    # Each call within its run: issued after the run began, answered by its end.
    (run,) = result.runs
    assert all(
        s.start_ns >= 0 and s.latency_ns > 0 and s.start_ns + s.latency_ns <= run.duration_ns
        for s in oracle.samples_of(result)
    )


def test_samples_cross_between_processes_unchanged() -> None:
    """Worker processes send their samples to the parent as int64 arrays: every field of
    every sample of the oracle set comes back as it was, in order."""
    samples = tuple(s for result in oracle.results() for s in oracle.samples_of(result))
    array = pack_samples(samples)
    assert array.dtype == np.int64 and array.shape == (len(samples), len(SAMPLE_COLUMNS))
    assert array[0].tolist() == [getattr(samples[0], c) for c in SAMPLE_COLUMNS]
    assert unpack_samples(array) == samples
    assert unpack_samples(pack_samples(())) == ()


def test_calls_in_flight_count_what_was_open_when_each_was_issued() -> None:
    """A call answered at the very instant another is issued is no longer open; one
    issued at the same instant is; a call is open while it is answered (at least 1)."""

    def call(start: int, latency: int) -> CallSample:
        return CallSample(
            start_ns=start, latency_ns=latency, request_bytes=1, response_bytes=1, payload_bytes=1
        )

    samples = [call(0, 10), call(10, 5), call(10, 20), call(12, 0), call(40, 1)]
    assert calls_in_flight(samples) == oracle.in_flight(samples) == [1, 2, 2, 2, 1]
    assert calls_in_flight([]) == []


def test_a_result_without_calls_has_no_median_in_flight_and_says_nothing_of_it() -> None:
    """No calls in any run: NaN, without numpy's warning about an empty median."""
    echoes = oracle.results()[0]
    empty = dataclasses.replace(
        echoes, runs=tuple(dataclasses.replace(run, samples=()) for run in echoes.runs)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(median_in_flight(empty))
        assert median_in_flight(echoes) == oracle.median_in_flight(echoes)


def test_tensorboard_of_a_document_that_says_little_and_of_a_run_without_time(
    tmp_path: Path,
) -> None:
    """No trace, a network without addresses or rate, a complete document; a run that
    measured no time has no rate and no CPU share, and its calls still count."""
    echoes = oracle.results()[0]
    timeless = dataclasses.replace(echoes.runs[1], duration_ns=0)
    result = dataclasses.replace(echoes, runs=(echoes.runs[0], timeless))
    document = dataclasses.replace(
        oracle.documents()[0],
        benchmarks=(result,),
        trace=None,
        network=NetworkInfo(name="lab"),
        partial=False,
        partial_reason="",
    )
    write_run(document, tmp_path)
    context = _text(_load(tmp_path), "results").split("\n\n")[1].splitlines()
    assert context[1:] == [
        "- machine: Example CPU, 4 CPUs, kernel 6.1.0, Python 3.11.2, grpcio 1.85.0, "
        "protobuf 6.0.0",
        "- network: lab, -",
    ]
    scalars = _scalars(_load(tmp_path / "p2p-latency"))
    rates = ("bandwidth_mb_per_s", "rpcs_per_s", "client_cpu_utilization", "server_cpu_utilization")
    for tag in rates:
        assert sorted(scalars[f"per_run/{tag}"]) == [0], tag
    assert sorted(scalars["per_run/latency_p50_us"]) == [0, 1]
    # Whole figures come from the run that measured time, and CPU over its time.
    assert scalars["throughput/rpcs_per_s"][0] == pytest.approx(
        float(np.float32(oracle.run_rpcs_per_s(echoes.runs[0]))), rel=1e-6
    )
    assert scalars["cpu/client_utilization"][0] == pytest.approx(
        float(np.float32(sum(r.client_cpu_ns for r in result.runs) / echoes.runs[0].duration_ns)),
        rel=1e-6,
    )


def test_tensorboard_logs_that_cannot_be_written_are_one_error_naming_the_directory(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(ResultError, match=r"a-file: cannot write TensorBoard logs \("):
        write_run(oracle.documents()[0], blocked)


def test_tensorboard_logs_that_cannot_be_written_say_why_in_the_systems_words(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(ResultError) as refused:
        write_run(oracle.documents()[0], blocked / "run")
    assert str(refused.value) == (
        f"{blocked / 'run'}: cannot write TensorBoard logs ({os.strerror(errno.ENOTDIR)})"
    )
