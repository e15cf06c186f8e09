"""The comparison run's pictures and step axis, by value: each chart written by
``write_comparison`` is exactly the one drawn here from series worked out by hand from the
points and documents (the same PNG bytes), and the step-time scalars sit at the link rate in
whole Mbit/s."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.util import tensor_util

from tests import oracle_samples as oracle
from tests.result_factory import golden_document
from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.replay.output import comparison, plots
from tf_grpc_bench.replay.output.comparison import LinkPoint
from tf_grpc_bench.replay.output.document import ResultDocument
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.prediction import prediction_json
from tf_grpc_bench.trace import Trace

#: Rated links (one not a whole number of Mbit/s, one of 1 Tbit/s), and two without a rate.
POINTS = (
    LinkPoint(name="1gbit", rate_bits_per_s=10**9, replay_step_s=2.0, link_bound_s=1.5),
    LinkPoint(
        name="odd",
        rate_bits_per_s=1_234_567_890,
        replay_step_s=1.75,
        training_step_s=1.5,
        link_bound_s=1.25,
    ),
    LinkPoint(name="tbit", rate_bits_per_s=10**12, replay_step_s=0.5, training_step_s=0.25),
    LinkPoint(name="unlimited", rate_bits_per_s=0, replay_step_s=0.4321, training_step_s=0.125),
    LinkPoint(name="other", rate_bits_per_s=0, training_step_s=0.0625),
)


def _load(run: Path) -> plugin_event_accumulator.EventAccumulator:
    accumulator = plugin_event_accumulator.EventAccumulator(str(run), size_guidance={"tensors": 0})
    accumulator.Reload()
    return accumulator


def _image(board: plugin_event_accumulator.EventAccumulator, tag: str) -> tuple[int, int, bytes]:
    (event,) = board.Tensors(tag)
    width, height, png = tensor_util.make_ndarray(event.tensor_proto).tolist()
    return int(width), int(height), png


def _documents() -> list[ResultDocument]:
    # The golden document on two links, then once without a network: it has no bars
    # (nothing to name them by), and the colours stay those of the documents' order.
    base = golden_document()
    return [
        dataclasses.replace(
            base,
            network=NetworkInfo(name="fast", emulated_rate_bits_per_s=10**12, emulation="tbf"),
        ),
        dataclasses.replace(base, network=None),
        dataclasses.replace(
            base,
            network=NetworkInfo(name="slow", emulated_rate_bits_per_s=10**9, emulation="tbf"),
        ),
    ]


def test_the_step_chart_draws_each_series_over_the_rated_links_and_notes_the_others(
    tmp_path: Path,
) -> None:
    run = comparison.write_comparison(tmp_path, [], points=POINTS, wall_time_s=1.0)
    board = _load(run)
    gbit = (1.0, 1.234567890, 1000.0)
    expected = plots.line_chart(
        "Step time against link rate"
        " (no limit: replay 0.432 s, training 0.125 s, training 0.0625 s)",
        [
            plots.Series(name="replay", points=((gbit[0], 2.0), (gbit[1], 1.75), (gbit[2], 0.5))),
            plots.Series(name="training", points=((gbit[1], 1.5), (gbit[2], 0.25))),
            plots.Series(name="link bound", points=((gbit[0], 1.5), (gbit[1], 1.25)), dashed=True),
        ],
        x_label="link rate (Gbit/s)",
        y_label="step time (s)",
    )
    assert _image(board, "plots/step_vs_rate") == (
        expected.width,
        expected.height,
        expected.png,
    )


def test_step_times_are_scalars_at_the_rate_in_whole_mbit_per_s(tmp_path: Path) -> None:
    run = comparison.write_comparison(tmp_path, [], points=POINTS, wall_time_s=1.0)
    board = _load(run)
    found = {
        tag: {
            event.step: float(tensor_util.make_ndarray(event.tensor_proto))
            for event in board.Tensors(tag)
        }
        for tag in board.Tags()["tensors"]
        if tag.startswith("step_vs_rate/")
    }
    # 1,234,567,890 bit/s is 1,234.57 Mbit/s, shown at 1235; 1 Tbit/s at 1,000,000.
    assert found == {
        "step_vs_rate/replay_ms": {1000: 2000.0, 1235: 1750.0, 1_000_000: 500.0},
        "step_vs_rate/training_ms": {1235: 1500.0, 1_000_000: 250.0},
        "step_vs_rate/link_bound_ms": {1000: 1500.0, 1235: 1250.0},
    }


def test_without_a_rated_link_there_is_no_step_chart(tmp_path: Path) -> None:
    run = comparison.write_comparison(tmp_path, [], points=POINTS[3:], wall_time_s=1.0)
    tags = _load(run).Tags()["tensors"]
    assert "plots/step_vs_rate" not in tags
    assert not [tag for tag in tags if tag.startswith("step_vs_rate/")]


def test_each_benchmarks_latency_chart_shows_p50_and_p99_per_class_and_network(
    tmp_path: Path,
) -> None:
    documents = _documents()
    run = comparison.write_comparison(tmp_path, documents, points=(), wall_time_s=1.0)
    board = _load(run)
    classes = ["small", "medium", "large"]
    for label in documents[0].labels:
        series = []
        for number, document in enumerate(documents):
            if document.network is None:
                continue
            (result,) = [
                r for r, name in zip(document.benchmarks, document.labels, strict=True)
                if name == label
            ]  # fmt: skip
            by_class = {c.value: s for c, s in result.latency_by_category}
            for stat in ("p50", "p99"):
                values = tuple(
                    getattr(by_class[c], f"{stat}_ns") / 1000 if c in by_class else None
                    for c in classes
                )
                series.append(
                    plots.Series(
                        name=f"{document.network.name} {stat}",
                        values=values,
                        colour=number,
                        light=stat == "p99",
                    )
                )
        expected = plots.bar_chart(
            f"{label}: latency per size class and network",
            classes,
            series,
            y_label="latency (us)",
        )
        assert _image(board, f"plots/latency/{label}") == (
            expected.width,
            expected.height,
            expected.png,
        ), label


def test_latency_scalars_sit_at_each_networks_rate_in_whole_mbit_per_s(tmp_path: Path) -> None:
    documents = _documents()
    run = comparison.write_comparison(tmp_path, documents, points=(), wall_time_s=1.0)
    board = _load(run)
    found = {
        tag: {
            event.step: float(tensor_util.make_ndarray(event.tensor_proto))
            for event in board.Tensors(tag)
        }
        for tag in board.Tags()["tensors"]
        if tag.startswith("latency_vs_rate/")
    }
    expected: dict[str, dict[int, float]] = {}
    # 1 Tbit/s at step 1,000,000 and 1 Gbit/s at 1,000; the document without a network
    # has no rate to sit at.
    for document, step in ((documents[0], 1_000_000), (documents[2], 1000)):
        for result, label in zip(document.benchmarks, document.labels, strict=True):
            for category, summary in result.latency_by_category:
                for stat in ("p50", "p99"):
                    tag = f"latency_vs_rate/{label}/{category.value}_{stat}_us"
                    value = getattr(summary, f"{stat}_ns") / 1000
                    expected.setdefault(tag, {})[step] = float(np.float32(value))
    assert found == expected


def test_the_custom_scalars_layout_has_the_step_chart_then_one_per_benchmark(
    tmp_path: Path,
) -> None:
    documents = _documents()
    run = comparison.write_comparison(tmp_path, documents, points=POINTS, wall_time_s=1.0)
    board = _load(run)
    tag = custom_scalar_metadata.CONFIG_SUMMARY_TAG
    assert board.SummaryMetadata(tag).plugin_data.plugin_name == custom_scalar_metadata.PLUGIN_NAME
    (event,) = board.Tensors(tag)
    assert event.tensor_proto.dtype == types_pb2.DT_STRING
    (serialized,) = event.tensor_proto.string_val
    labels = sorted(documents[0].labels)
    charts = [
        layout_pb2.Chart(
            title="step time (ms) against link rate (Mbit/s, the step axis)",
            multiline=layout_pb2.MultilineChartContent(tag=["step_vs_rate/.*"]),
        )
    ] + [
        layout_pb2.Chart(
            title=f"{label}: latency p50 and p99 (us) against link rate (Mbit/s)",
            multiline=layout_pb2.MultilineChartContent(tag=[f"latency_vs_rate/{label}/.*"]),
        )
        for label in labels
    ]
    expected = layout_pb2.Layout(category=[layout_pb2.Category(title="comparison", chart=charts)])
    assert layout_pb2.Layout.FromString(serialized) == expected


def test_the_comparison_text_is_the_points_then_the_results_or_says_there_are_none(
    tmp_path: Path,
) -> None:
    run = comparison.write_comparison(tmp_path, [], points=POINTS, wall_time_s=1.0)
    (event,) = _load(run).Tensors("comparison")
    text = tensor_util.make_ndarray(event.tensor_proto).item().decode()
    assert text == comparison.points_markdown(POINTS) + "\n\n(no results)"


def test_a_comparison_that_cannot_be_written_names_its_folder_and_why(tmp_path: Path) -> None:
    blocked = tmp_path / "a file"
    blocked.write_text("")
    with pytest.raises(ResultError) as refused:
        comparison.write_comparison(blocked, [], points=POINTS, wall_time_s=1.0)
    assert (
        str(refused.value)
        == f"{blocked / 'comparison'}: cannot write the comparison (Not a directory)"
    )


def test_the_replays_step_is_the_median_replayed_step_with_or_without_a_prediction() -> None:
    document = golden_document()
    latency, _, throughput = document.benchmarks
    steps = [t for run in throughput.runs for t in run.step_times_ns]
    assert steps and [c for run in throughput.runs for c in run.step_compute_ns]
    median_s = statistics.median(steps) / 1e9
    assert comparison.replay_step_s(throughput) == pytest.approx(median_s, rel=1e-12)
    # The step the prediction under dependencies pacing predicts is that median too.
    predicted = prediction_json(throughput, 2)
    assert predicted is not None
    assert predicted["step_ns"] / 1e9 == pytest.approx(median_s, rel=1e-12)
    # Replayed without dependencies pacing: no compute kept, no prediction, the same median.
    unpaced = dataclasses.replace(
        throughput,
        runs=tuple(dataclasses.replace(run, step_compute_ns=()) for run in throughput.runs),
    )
    assert comparison.replay_step_s(unpaced) == pytest.approx(median_s, rel=1e-12)
    # A benchmark without steps has none.
    assert not latency.step_times_ns
    assert comparison.replay_step_s(latency) is None


def test_a_document_without_a_network_or_the_step_benchmark_is_a_point_without_them() -> None:
    base = golden_document()
    unrecorded = dataclasses.replace(base, network=None)
    no_steps = dataclasses.replace(
        base,
        benchmarks=base.benchmarks[:2],
        network=NetworkInfo(name="lab", emulated_rate_bits_per_s=10**9, emulation="tbf"),
    )
    points = comparison.link_points([unrecorded, no_steps])
    steps = [t for run in base.benchmarks[2].runs for t in run.step_times_ns]
    assert points == [
        LinkPoint(name="lab", rate_bits_per_s=10**9),
        LinkPoint(
            name="unrecorded",
            rate_bits_per_s=0,
            replay_step_s=pytest.approx(statistics.median(steps) / 1e9, rel=1e-12),
        ),
    ]


def test_a_step_chart_of_rated_links_only_has_no_note_in_its_title(tmp_path: Path) -> None:
    run = comparison.write_comparison(tmp_path, [], points=POINTS[:1], wall_time_s=1.0)
    expected = plots.line_chart(
        "Step time against link rate",
        [
            plots.Series(name="replay", points=((1.0, 2.0),)),
            plots.Series(name="link bound", points=((1.0, 1.5),), dashed=True),
        ],
        x_label="link rate (Gbit/s)",
        y_label="step time (s)",
    )
    assert _image(_load(run), "plots/step_vs_rate") == (
        expected.width,
        expected.height,
        expected.png,
    )


def _heavier_direction_s(trace: Trace, rate: int) -> float:
    """The median step's bytes each way between the ps host and the workers' host, the
    heavier of the two, over the rate (calls within one host left out)."""
    up, down = [], []
    for step in trace.steps:
        to_ps = to_workers = 0
        for rpc in step.rpcs:
            caller_ps = trace.tasks[rpc.caller_task].job == "ps"
            callee_ps = trace.tasks[rpc.callee_task].job == "ps"
            if caller_ps == callee_ps:
                continue
            sent, answered = rpc.request_bytes, rpc.response_bytes
            to_ps += answered if caller_ps else sent
            to_workers += sent if caller_ps else answered
        up.append(to_ps)
        down.append(to_workers)
    return max(statistics.median(up), statistics.median(down)) * 8 / rate


@pytest.mark.parametrize("heavy", ["requests to the ps", "requests from the ps"])
def test_the_link_bound_counts_each_calls_request_and_response_on_its_own_side(
    heavy: str,
) -> None:
    trace = oracle.boundary_trace()
    steps = []
    for step in trace.steps:
        rpcs = []
        for number, rpc in enumerate(step.rpcs):
            from_ps = trace.tasks[rpc.caller_task].job == "ps"
            if (heavy == "requests from the ps") == from_ps:
                rpc = dataclasses.replace(rpc, request_bytes=3_000_000 + 1000 * number)
            rpcs.append(rpc)
        steps.append(dataclasses.replace(step, rpcs=tuple(rpcs)))
    weighted = dataclasses.replace(trace, steps=tuple(steps))
    expected = _heavier_direction_s(weighted, 10**9)
    assert expected > _heavier_direction_s(trace, 10**9)
    assert comparison.link_bound_s(weighted, 10**9) == pytest.approx(expected, rel=1e-12)
    assert comparison.link_bound_s(weighted, 1) == pytest.approx(expected * 10**9, rel=1e-12)
    assert comparison.link_bound_s(weighted, 0) is None
