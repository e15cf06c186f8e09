"""TensorBoard logs of a result document, as TensorBoard shows them with no flag.

Layout: ``write_run(document, run_directory)`` writes one TensorBoard run per
benchmark, ``<run directory>/<label>/`` (``p2p-latency``, ``p2p-bandwidth``,
``ps-throughput``; see ``document.benchmark_labels``), plus a document-level
run in the run directory itself holding the results table, the run's context
and the HParams experiment configuration.  ``tensorboard --logdir runs``
therefore names a benchmark's run ``<UTC time>-<label of the run>/<benchmark>``,
e.g. ``20261129T174552Z-loopback-resnet50-tf2ps/ps-throughput``.

Why one run per benchmark: TensorBoard's HParams dashboard shows one row per
*session* (a run directory with hparams), and each row's metric columns are
that run's scalars.  With a session per benchmark, each row is one benchmark
on one network with one set of gRPC settings, and the metric columns mean the
same thing in every row (``latency_us/small/p99`` is the p99 of that
benchmark's small messages).  What the HParams dashboard lists, in which
order, and why every document writes the same configuration: ``hparams``.

What each benchmark run holds:

- hparams: ``hparams.hparam_values`` (network, link rate, trace, benchmark,
  mode, rpc, pacing, compute, the gRPC settings, then every other parameter);
- scalars drawn as flat lines (the same value at steps 0 to ``FLAT_STEPS`` - 1),
  the figures over all runs: ``latency_us/<class>/<stat>``
  (class ``all``, ``small``, ``medium``, ``large``; stat ``mean``, ``p50``,
  ``p90``, ``p99``, ``p99.9``, ``max``), ``throughput/bandwidth_mb_per_s``,
  ``throughput/rpcs_per_s``, ``rpcs/count``, ``step_time_ms/<stat>`` (trace
  replays), ``prediction/step_ms``, ``prediction/compute_ms``,
  ``prediction/communication_ms`` (dependencies pacing),
  ``cpu/client_utilization`` and ``cpu/server_utilization`` (CPU seconds per
  wall second);
- scalars per measured run, the run index as step: ``per_run/...``;
- scalars per replayed step, numbered across runs: ``per_step/communication_time_ms``;
- histograms per run (run index as step): ``message_size_log10_bytes``
  (log10 of each message's size: 1 is 10 B, 3 is 1 kB, 6 is 1 MB, so the
  axis reads across the decades sizes span), ``latency_ms`` and
  ``latency_ms/<class>``, ``step_time_ms``;
- text: ``summary``, the benchmark's latency per class and its runs.

Scalars are float32, what TensorBoard's own ``scalar_pb`` writes and what its
default (Rust) loader reads; see ``events``.

Why flat lines.  A figure over all runs is one value, but a chart holds one
series per benchmark run (every benchmark, every run directory), and
TensorBoard scales its y axis ignoring outliers by default: it keeps the values
between the 5th and 95th percentile of all the chart's points.  With one point
per series, a chart of three series keeps only the middle one; the others are
drawn off the chart.  Each figure written ``FLAT_STEPS`` times makes every
series' value at least 5% of the chart's points while a chart holds fewer than
20 series, so none is cut.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path

from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.text import summary_v2 as text_summary

from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.replay.core.measurement import BenchmarkResult, CallSample, LatencySummary
from tf_grpc_bench.replay.output import hparams, report
from tf_grpc_bench.replay.output.document import ResultDocument
from tf_grpc_bench.replay.output.events import EventFile
from tf_grpc_bench.replay.output.prediction import prediction_json
from tf_grpc_bench.replay.output.statistics import cpu_utilization, run_statistics
from tf_grpc_bench.sizes import classify

#: The statistics written for every latency distribution, as (tag suffix, field).
LATENCY_STATISTICS = (
    ("mean", "mean_ns"),
    ("p50", "p50_ns"),
    ("p90", "p90_ns"),
    ("p99", "p99_ns"),
    ("p99.9", "p999_ns"),
    ("max", "max_ns"),
)


#: Steps each figure over all runs is written at (a flat line; see the module docstring).
FLAT_STEPS = 20


def _figure(events: EventFile, tag: str, value: float, description: str = "") -> None:
    """A figure over all runs: the same value at steps 0 .. ``FLAT_STEPS`` - 1."""
    for step in range(FLAT_STEPS):
        events.scalar(tag, value, step, description=description)


def document_time_s(document: ResultDocument) -> float:
    """The document's creation time as seconds since the epoch (event wall time)."""
    return datetime.fromisoformat(document.created_utc.replace("Z", "+00:00")).timestamp()


def session_name(run_directory: Path, label: str) -> str:
    """The HParams session (trial) of one benchmark: its TensorBoard run name, ``<run>/<label>``.

    TensorBoard merges sessions of the same name into one row, which happens
    only when the same document is rendered twice into the same directory.
    """
    return f"{run_directory.name}/{label}"


def _write_latency(events: EventFile, prefix: str, summary: LatencySummary) -> None:
    for name, attribute in LATENCY_STATISTICS:
        _figure(events, f"{prefix}/{name}", getattr(summary, attribute) / 1e3)


def _write_figures(events: EventFile, result: BenchmarkResult, cpu_count: int) -> None:
    """The figures over all runs, each a flat line (``_figure``)."""
    _figure(events, "rpcs/count", result.rpc_count)
    _write_latency(events, "latency_us/all", result.latency_all)
    for category, summary in result.latency_by_category:
        _write_latency(events, f"latency_us/{category.value}", summary)
    _figure(
        events,
        "throughput/bandwidth_mb_per_s",
        result.bandwidth_mb_per_s,
        description="Request plus response payload, MB (10**6 bytes) per second, mean over runs.",
    )
    _figure(
        events,
        "throughput/rpcs_per_s",
        result.rpcs_per_s,
        description="Completed RPCs per second over all workers, mean over runs.",
    )
    step_time = result.step_time
    for name, attribute in LATENCY_STATISTICS:
        _figure(events, f"step_time_ms/{name}", getattr(step_time, attribute) / 1e6)
    predicted = prediction_json(result, cpu_count)
    if predicted is not None:
        for name in ("step", "compute", "communication"):
            value = predicted[f"{name}_ns"]
            if value is not None:
                _figure(events, f"prediction/{name}_ms", value / 1e6)
    _figure(events, "cpu/client_utilization", cpu_utilization(result.client_cpu_ns, result))
    _figure(events, "cpu/server_utilization", cpu_utilization(result.server_cpu_ns, result))


def _write_runs(events: EventFile, result: BenchmarkResult) -> None:
    """Scalars and histograms per measured run, and per replayed step."""
    step_number = 0
    for run in result.runs:
        stats = run_statistics(run)
        index = run.run_index
        events.scalar("per_run/bandwidth_mb_per_s", stats.bandwidth_mb_per_s, index)
        events.scalar("per_run/rpcs_per_s", stats.rpcs_per_s, index)
        events.scalar("per_run/latency_p50_us", stats.latency.p50_ns / 1e3, index)
        events.scalar("per_run/latency_p99_us", stats.latency.p99_ns / 1e3, index)
        events.scalar("per_run/step_time_mean_ms", stats.step_time.mean_ns / 1e6, index)
        if run.duration_ns:
            events.scalar(
                "per_run/client_cpu_utilization", run.client_cpu_ns / run.duration_ns, index
            )
            events.scalar(
                "per_run/server_cpu_utilization", run.server_cpu_ns / run.duration_ns, index
            )
        events.histogram(
            "histogram/message_size_log10_bytes",
            [math.log10(max(s.payload_bytes, 1)) for s in run.samples],
            index,
            log=False,
            description="log10 of each message's size in bytes: 1 is 10 B, 3 is 1 kB, 6 is 1 MB.",
        )
        events.histogram("histogram/latency_ms", [s.latency_ns / 1e6 for s in run.samples], index)
        for class_name, latencies in _latencies_by_category(run.samples).items():
            events.histogram(f"histogram/latency_ms/{class_name}", latencies, index)
        events.histogram("histogram/step_time_ms", [t / 1e6 for t in run.step_times_ns], index)
        for step_time_ns in run.step_times_ns:
            events.scalar("per_step/communication_time_ms", step_time_ns / 1e6, step_number)
            step_number += 1


def _write_benchmark(
    events: EventFile, document: ResultDocument, result: BenchmarkResult, trial: str
) -> None:
    label = trial.rsplit("/", 1)[-1]
    events.add(
        hparams_summary.hparams_pb(
            hparams.hparam_values(document, result, label),
            trial_id=trial,
            start_time_secs=document_time_s(document),
        )
    )
    _write_figures(events, result, document.machine.cpu_count)
    _write_runs(events, result)
    events.add(text_summary.text_pb("summary", report.format_benchmark_markdown(result)))


def _latencies_by_category(samples: Iterable[CallSample]) -> Mapping[str, list[float]]:
    grouped: dict[str, list[float]] = {}
    for sample in samples:
        category = classify(sample.payload_bytes).value
        grouped.setdefault(category, []).append(sample.latency_ns / 1e6)
    return grouped


def _context_markdown(document: ResultDocument) -> str:
    machine = document.machine
    lines = [
        f"**{report.describe_context(document)}**",
        "",
        f"- tool {document.tool_version}, result format {document.format_version}",
        f"- machine: {machine.cpu_model}, {machine.cpu_count} CPUs, kernel {machine.kernel}, "
        f"Python {machine.python_version}, grpcio {machine.grpcio_version}, "
        f"protobuf {machine.protobuf_version}",
    ]
    if document.trace:
        lines.append(f"- trace: `{document.trace.path}` sha256 `{document.trace.sha256}`")
    if document.network:
        network = document.network
        rate = (
            f", emulated {network.emulated_rate_bits_per_s} bit/s ({network.emulation})"
            if network.emulated_rate_bits_per_s
            else ""
        )
        lines.append(f"- network: {network.name}{rate}, {', '.join(network.addresses) or '-'}")
    if document.partial:
        lines.append(f"- **partial**: {document.partial_reason}")
    return "\n".join(lines)


def write_run(document: ResultDocument, run_directory: Path) -> None:
    """Write ``document`` as TensorBoard event files under ``run_directory``.

    Blocking file IO; creates ``run_directory`` and one sub-directory per
    benchmark.  Each event file appears complete or not at all; writing the
    same document again replaces its files.  Raises ``ResultError`` if the
    directory cannot be written.
    """
    run_directory = Path(run_directory)
    wall_time_s = document_time_s(document)
    all_values: dict[str, str | bool] = {}
    try:
        for result, label in zip(document.benchmarks, document.labels, strict=True):
            all_values.update(hparams.hparam_values(document, result, label))
            with EventFile(run_directory / label, wall_time_s) as events:
                _write_benchmark(events, document, result, session_name(run_directory, label))
        with EventFile(run_directory, wall_time_s) as events:
            events.add(hparams.experiment_summary(all_values))
            events.add(
                text_summary.text_pb(
                    "results",
                    _context_markdown(document) + "\n\n" + report.format_markdown_table([document]),
                )
            )
    except OSError as error:
        raise ResultError(
            f"{run_directory}: cannot write TensorBoard logs ({error.strerror or error})"
        ) from None
