"""Comparison plots across links, as a real TensorBoard (default mode) serves them."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from tests.result_factory import golden_document
from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.network.compare import write_tensorboard_comparison
from tf_grpc_bench.replay.output import comparison, plots
from tf_grpc_bench.replay.output.document import ResultDocument
from tf_grpc_bench.replay.output.machine import NetworkInfo

from .tensorboard_server import TensorBoard, running_tensorboard

LINKS = (("1gbit", 10**9), ("2.5gbit", 25 * 10**8), ("10gbit", 10**10), ("unlimited", 0))
TRAINING_S = {"1gbit": 3.3, "2.5gbit": 1.4, "10gbit": 0.5, "unlimited": 0.35}


def _documents() -> list[ResultDocument]:
    """The golden document (a ResNet-50 replay) as if run on each link."""
    return [
        dataclasses.replace(
            golden_document(),
            network=NetworkInfo(name=name, emulated_rate_bits_per_s=rate, emulation="tbf"),
        )
        for name, rate in LINKS
    ]


def test_the_link_bound_is_the_heavier_directions_bytes_of_a_step_over_the_rate() -> None:
    trace = trace_files.read_trace(trace_files.default_trace_path())
    # ResNet-50, 2 workers: every round, each worker pulls the weights and the ps
    # pulls its gradients: about 2 x 25.6 M parameters x 4 B each way.
    bound = comparison.link_bound_s(trace, 10**9)
    assert bound is not None
    assert bound == pytest.approx(2 * 25_583_592 * 4 * 8 / 1e9, rel=0.02)
    assert comparison.link_bound_s(trace, 0) is None


def test_points_carry_replay_training_and_bound_per_link_by_rate() -> None:
    trace = trace_files.read_trace(trace_files.default_trace_path())
    points = comparison.link_points(_documents(), trace=trace, training_s=TRAINING_S)
    assert [p.name for p in points] == ["1gbit", "2.5gbit", "10gbit", "unlimited"]
    predicted = golden_document().benchmarks[2]
    for point in points:
        assert point.training_step_s == TRAINING_S[point.name]
        assert point.replay_step_s == comparison.replay_step_s(predicted)
    assert points[0].link_bound_s == pytest.approx(10 * points[2].link_bound_s)  # type: ignore[operator]
    assert points[-1].link_bound_s is None
    # network compare's prediction of a network (the limit of its dilated replays)
    # takes the place of its document's step; the others keep theirs.
    limited = comparison.link_points(_documents(), trace=trace, predicted_s={"2.5gbit": 1.25})
    assert [p.replay_step_s for p in limited][:2] == [points[0].replay_step_s, 1.25]


def test_charts_are_pngs_of_their_stated_size() -> None:
    chart = plots.line_chart(
        "t", [plots.Series(name="a", points=((1.0, 2.0), (10.0, 1.0)))], x_label="x", y_label="y"
    )
    with Image.open(io.BytesIO(chart.png)) as image:
        assert image.format == "PNG" and image.size == (chart.width, chart.height)
    with pytest.raises(ValueError, match="nothing to draw"):
        plots.bar_chart("t", ["small"], [plots.Series(name="a", values=(None,))], y_label="y")


def test_a_chart_of_one_point_at_a_power_of_ten_draws() -> None:
    # One profile of 1 Gbit/s: a log axis from 1e9 to 1e9 divided by zero.
    chart = plots.line_chart(
        "t", [plots.Series(name="a", points=((1e9, 3.6),))], x_label="x", y_label="y"
    )
    with Image.open(io.BytesIO(chart.png)) as image:
        assert image.size == (chart.width, chart.height)


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TensorBoard, Path]]:
    logdir = tmp_path_factory.mktemp("comparison")
    documents = _documents()
    for document, (name, _) in zip(documents, LINKS, strict=True):
        from tf_grpc_bench.replay.output.tensorboard import write_run

        write_run(document, logdir / name / "run")
    # The golden document names a trace that is not on this machine: no link bound.
    write_tensorboard_comparison(logdir, documents, training_s=TRAINING_S)
    with running_tensorboard(logdir, tmp_path_factory.mktemp("tensorboard")) as board:
        board.wait_for(
            "the comparison run",
            lambda: (
                "step_vs_rate/training_ms"
                in board.get("data/plugin/scalars/tags").get(comparison.RUN_NAME, {})
            ),
        )
        yield board, logdir


def test_custom_scalars_plot_step_time_against_the_link_rate(
    board: tuple[TensorBoard, Path],
) -> None:
    server, _ = board
    layout = server.get("data/plugin/custom_scalars/layout")
    charts = layout["category"][0]["chart"]
    assert charts[0]["multiline"]["tag"] == ["step_vs_rate/.*"]
    assert any("ps-throughput" in c["title"] for c in charts[1:])
    replay_ms = comparison.replay_step_s(golden_document().benchmarks[2]) * 1e3  # type: ignore[operator]
    for tag, expected in (
        ("step_vs_rate/training_ms", {1000: 3300.0, 2500: 1400.0, 10000: 500.0}),
        ("step_vs_rate/replay_ms", dict.fromkeys((1000, 2500, 10000), replay_ms)),
    ):
        points = server.get("data/plugin/scalars/scalars", run=comparison.RUN_NAME, tag=tag)
        assert {step: pytest.approx(value, rel=1e-6) for _, step, value in points} == expected
    latency = server.get(
        "data/plugin/scalars/scalars",
        run=comparison.RUN_NAME,
        tag="latency_vs_rate/p2p-latency/small_p99_us",
    )
    assert [step for _, step, _ in latency] == [1000, 2500, 10000]


def test_images_show_the_comparison_charts(board: tuple[TensorBoard, Path]) -> None:
    server, _ = board
    tags = server.get("data/plugin/images/tags")[comparison.RUN_NAME]
    assert {"plots/step_vs_rate", "plots/latency/p2p-latency"} <= set(tags)
    (entry,) = server.get(
        "data/plugin/images/images", run=comparison.RUN_NAME, tag="plots/step_vs_rate"
    )
    png = server.get_bytes("data/plugin/images/individualImage?" + entry["query"])
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == (plots.WIDTH, plots.HEIGHT)
    (text,) = server.get("data/plugin/text/text", run=comparison.RUN_NAME, tag="comparison")
    assert "<td>2.5gbit</td>" in text["text"] and "<td>1.400 s</td>" in text["text"]
