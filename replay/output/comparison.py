"""Comparisons across links in TensorBoard: step time against link rate, latency per network.

``write_comparison`` turns the result documents of one replay on several
links (``network compare``, ``bench/fidelity.py``) into one TensorBoard run,
``comparison``, beside them:

- Custom Scalars: ``step_vs_rate/replay_ms``, ``step_vs_rate/training_ms``
  and ``step_vs_rate/link_bound_ms`` on one chart whose x axis (the step) is
  the link rate in Mbit/s; ``latency_vs_rate/<label>/<class>_p50_us`` and
  ``_p99_us`` per benchmark on another.  Links without a rate limit have no
  place on that axis: they are in the images and the table;
- Images: the same as pictures that read at once (``plots/step_vs_rate``, and
  ``plots/latency/<label>``: p50 and p99 per size class per network);
- Text: ``comparison``, the table of every run and of the points plotted.

The replay's step is its median replayed step (under dependencies pacing, the
step ``prediction.prediction_json`` predicts); the link's bound
is the heavier direction's bytes of a step between the ps host and the
worker host over the link rate (servers on one host, clients on the other,
as ``network compare`` places them).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.util import tensor_util

from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.replay.core.benchmarks import step_benchmark
from tf_grpc_bench.replay.core.measurement import BenchmarkResult
from tf_grpc_bench.replay.output import plots, report
from tf_grpc_bench.replay.output.document import ResultDocument
from tf_grpc_bench.replay.output.events import EventFile
from tf_grpc_bench.sizes import SizeCategory
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import WORKERS_AND_PS_ONLY, trace_roles
from tf_grpc_bench.units import format_rate, format_seconds

#: The TensorBoard run the comparison is written to, inside the comparison's directory.
RUN_NAME = "comparison"


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkPoint:
    """One link: its rate (0: no limit) and the step times measured or bounded on it (s)."""

    name: str
    rate_bits_per_s: int
    replay_step_s: float | None = None
    training_step_s: float | None = None
    link_bound_s: float | None = None


def replay_step_s(result: BenchmarkResult) -> float | None:
    """The median replayed step (what the prediction under dependencies pacing predicts,
    ``prediction_json``'s ``step_ns``); None without steps."""
    if result.step_time.count:
        return result.step_time.p50_ns / 1e9
    return None


def link_bound_s(trace: Trace, rate_bits_per_s: int) -> float | None:
    """The heavier direction's bytes of a median step between the two hosts, over the rate."""
    if rate_bits_per_s <= 0:
        return None
    # The ps tasks on one host, the rest on the other (not the stand-in servers).
    servers = set(trace_roles(trace, whole_steps=WORKERS_AND_PS_ONLY).server_tasks)
    up, down = [], []
    for step in trace.steps:
        to_servers = to_clients = 0
        for rpc in step.rpcs:
            caller, callee = rpc.caller_task in servers, rpc.callee_task in servers
            if caller == callee:
                continue  # both on one host
            if callee:
                to_servers, to_clients = (
                    to_servers + rpc.request_bytes,
                    to_clients + rpc.response_bytes,
                )
            else:
                to_clients, to_servers = (
                    to_clients + rpc.request_bytes,
                    to_servers + rpc.response_bytes,
                )
        up.append(to_servers)
        down.append(to_clients)
    if not up:
        return None
    return max(statistics.median(up), statistics.median(down)) * 8 / rate_bits_per_s


def _result(document: ResultDocument, label: str) -> BenchmarkResult | None:
    for result, name in zip(document.benchmarks, document.labels, strict=True):
        if name == label:
            return result
    return None


def link_points(
    documents: Sequence[ResultDocument],
    *,
    trace: Trace | None = None,
    training_s: Mapping[str, float] | None = None,
    predicted_s: Mapping[str, float] | None = None,
) -> list[LinkPoint]:
    """One point per document (its network), by rate; ``training_s`` by network name.

    The replay's step is the document's, or ``predicted_s``'s for its network where
    that has one (``network compare``'s limit of a profile's dilated replays)."""
    points = []
    for document in documents:
        network = document.network
        name = network.name if network else "unrecorded"
        rate = network.emulated_rate_bits_per_s if network else 0
        # The benchmark whose step is compared with training's (its row says so).
        result = _result(document, step_benchmark().name)
        step_s = None if result is None else replay_step_s(result)
        points.append(
            LinkPoint(
                name=name,
                rate_bits_per_s=rate,
                replay_step_s=(predicted_s or {}).get(name, step_s),
                training_step_s=(training_s or {}).get(name),
                link_bound_s=None if trace is None else link_bound_s(trace, rate),
            )
        )
    return sorted(points, key=lambda p: (p.rate_bits_per_s == 0, p.rate_bits_per_s))


# --------------------------------------------------------------------------
# Writing the comparison run.

_STEP_SERIES = (
    ("replay", "replay_step_s", False),
    ("training", "training_step_s", False),
    ("link bound", "link_bound_s", True),
)


def _mbit(point: LinkPoint) -> int:
    return round(point.rate_bits_per_s / 1e6)


def _write_steps(events: EventFile, points: Sequence[LinkPoint]) -> None:
    """Scalars and a chart of step time against link rate (no chart if nothing to plot)."""
    series = []
    for shown, attribute, dashed in _STEP_SERIES:
        measured = [(p, getattr(p, attribute)) for p in points if getattr(p, attribute) is not None]
        for point, seconds in measured:
            if point.rate_bits_per_s > 0:
                tag = f"step_vs_rate/{shown.replace(' ', '_')}_ms"
                events.scalar(tag, seconds * 1e3, step=_mbit(point))
        line = tuple((p.rate_bits_per_s / 1e9, s) for p, s in measured if p.rate_bits_per_s > 0)
        if line:
            series.append(plots.Series(name=shown, points=line, dashed=dashed))
    if not series:
        return
    note = _unlimited_note(points)
    chart = plots.line_chart(
        f"Step time against link rate{note}",
        series,
        x_label="link rate (Gbit/s)",
        y_label="step time (s)",
    )
    events.image("plots/step_vs_rate", chart.png, chart.width, chart.height)


def _write_latency(events: EventFile, documents: Sequence[ResultDocument], label: str) -> None:
    """Latency per size class per network for one benchmark: scalars over rate and a chart."""
    classes = [c.value for c in SizeCategory]
    series = []
    for number, document in enumerate(documents):
        result = _result(document, label)
        if result is None or document.network is None:
            continue
        by_class = {c.value: s for c, s in result.latency_by_category}
        rate = document.network.emulated_rate_bits_per_s
        for stat in ("p50", "p99"):
            values = tuple(
                getattr(by_class[c], f"{stat}_ns") / 1e3 if c in by_class else None for c in classes
            )
            name = f"{document.network.name} {stat}"
            series.append(
                plots.Series(name=name, values=values, colour=number, light=stat == "p99")
            )
            for size, value in zip(classes, values, strict=True):
                if value is not None and rate > 0:
                    tag = f"latency_vs_rate/{label}/{size}_{stat}_us"
                    events.scalar(tag, value, step=round(rate / 1e6))
    if series:
        chart = plots.bar_chart(
            f"{label}: latency per size class and network", classes, series, y_label="latency (us)"
        )
        events.image(f"plots/latency/{label}", chart.png, chart.width, chart.height)


def _unlimited_note(points: Sequence[LinkPoint]) -> str:
    """What the links without a rate measured, for the chart's title (they have no x)."""
    parts = []
    for point in points:
        if point.rate_bits_per_s == 0:
            for shown, value in (
                ("replay", point.replay_step_s),
                ("training", point.training_step_s),
            ):
                if value is not None:
                    parts.append(f"{shown} {value:.3g} s")
    return f" (no limit: {', '.join(parts)})" if parts else ""


def layout_summary(labels: Sequence[str]) -> summary_pb2.Summary:
    """The Custom Scalars layout: step time over rate, then latency over rate per benchmark."""
    charts = [
        layout_pb2.Chart(
            title="step time (ms) against link rate (Mbit/s, the step axis)",
            multiline=layout_pb2.MultilineChartContent(tag=[r"step_vs_rate/.*"]),
        )
    ]
    charts += [
        layout_pb2.Chart(
            title=f"{label}: latency p50 and p99 (us) against link rate (Mbit/s)",
            multiline=layout_pb2.MultilineChartContent(tag=[rf"latency_vs_rate/{label}/.*"]),
        )
        for label in labels
    ]
    layout = layout_pb2.Layout(category=[layout_pb2.Category(title="comparison", chart=charts)])
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=custom_scalar_metadata.CONFIG_SUMMARY_TAG,
        metadata=custom_scalar_metadata.create_summary_metadata(),
        tensor=tensor_util.make_tensor_proto(layout.SerializeToString(), dtype=np.object_),
    )
    return summary


def points_markdown(points: Sequence[LinkPoint]) -> str:
    """The points as a table: the replay's step is a median (the predicted step is the
    median replayed worker-step, compute kept), and so is training's."""

    def seconds(value: float | None) -> str:
        return format_seconds(value, digits=3)

    lines = [
        "| link | rate | replay step p50 | training step p50 | link bound |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {p.name} | {format_rate(p.rate_bits_per_s)} | {seconds(p.replay_step_s)} | "
        f"{seconds(p.training_step_s)} | {seconds(p.link_bound_s)} |"
        for p in points
    ]
    return "\n".join(lines)


def write_comparison(
    directory: Path,
    documents: Sequence[ResultDocument],
    *,
    points: Sequence[LinkPoint],
    wall_time_s: float,
) -> Path:
    """Write the ``comparison`` TensorBoard run into ``directory``; returns its folder.

    ``ResultError`` if it cannot be written.
    """
    run = directory / RUN_NAME
    labels = sorted({label for d in documents for label in d.labels})
    try:
        with EventFile(run, wall_time_s) as events:
            _write_steps(events, points)
            for label in labels:
                _write_latency(events, documents, label)
            events.add(layout_summary(labels))
            table = report.format_markdown_table(list(documents)) if documents else "(no results)"
            events.add(text_summary.text_pb("comparison", f"{points_markdown(points)}\n\n{table}"))
    except OSError as error:
        raise ResultError(
            f"{run}: cannot write the comparison ({error.strerror or error})"
        ) from None
    return run
