"""TensorBoard event files from a result document, without TensorFlow.

Layout: ``write_run(document, logdir)`` writes one TensorBoard run per
benchmark, ``logdir/<label>/`` (``p2p-latency``, ``p2p-bandwidth``,
``ps-throughput``; see ``results.benchmark_labels``), plus a document-level
run in ``logdir`` itself holding the results table and the run's context as
text.

Why one run per benchmark: TensorBoard's HParams dashboard shows one row per
*session* (a run directory with hparams), and each row's metric columns are
that run's scalars.  With a session per benchmark, each row is one benchmark
on one network with one set of gRPC settings, the metric columns mean the
same thing in every row (``latency_us/all/p50`` is the p50 of that
benchmark), and filtering on the ``benchmark`` hparam lines up, say, P2P
latency on loopback, on a 1 Gbit/s veth and on a 100 Mbit/s veth.  One
session per document would need metric names per benchmark
(``p2p-latency/latency_us/...``) and leave most cells of a row empty.

Why no experiment config (``hparams_config_pb``) is written: TensorBoard
reads at most one experiment config per logdir and, when several result
directories sit under one ``--logdir`` (the way to compare networks), picks
one of them arbitrarily; its declared hparam domains and metrics would then
hide the values and metrics of the others.  Without a config TensorBoard
derives the experiment from every session's hparams and every scalar tag of
the session runs (``tensorboard.plugins.hparams.backend_context``), so all
documents under a logdir appear, each metric as a column.

What each benchmark run holds:

- hparams: every scalar parameter of the invocation and of the benchmark,
  plus ``benchmark``, ``workload``, ``network``, ``network_rate_bits_per_s``,
  ``trace``, ``trace_sha256``, ``host``, ``created_utc`` and ``partial``;
- scalars at step 0, the figures over all runs: ``latency_us/<class>/<stat>``
  (class ``all``, ``small``, ``medium``, ``large``; stat ``mean``, ``p50``,
  ``p90``, ``p99``, ``p99.9``, ``max``), ``throughput/bandwidth_mb_per_s``,
  ``throughput/rpcs_per_s``, ``rpcs/count``, ``step_time_ms/<stat>`` (trace
  replays), ``cpu/client_utilization`` and ``cpu/server_utilization`` (CPU
  seconds per wall second);
- scalars per measured run, the run index as step: ``per_run/...``;
- scalars per replayed step, numbered across runs: ``per_step/communication_time_ms``;
- histograms per run (run index as step): ``message_size_bytes``,
  ``latency_us`` and ``latency_us/<class>``, ``step_time_ms``; buckets are
  spaced logarithmically, because sizes and latencies span decades;
- text: ``summary``, the benchmark's latency per class and its runs.

Scalars are float64 tensors with the scalar plugin's metadata, exactly what
``tf.summary.scalar`` produces, so TensorBoard reads them like any other.
Nothing here imports TensorFlow: the protos, plugin metadata and record
framing all come from the ``tensorboard`` package.  (``EventFileWriter`` is
not used: it goes through ``tensorboard.compat.tf``, which imports TensorFlow
whenever it is installed.)
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.replay.core.measurement import BenchmarkResult, CallSample, LatencySummary
from tf_grpc_bench.replay.output import report
from tf_grpc_bench.replay.output.document import ParameterValue, ResultDocument
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
#: Buckets per decade in the logarithmic histograms.
BUCKETS_PER_DECADE = 10


def document_time_s(document: ResultDocument) -> float:
    """The document's creation time as seconds since the epoch (event wall time)."""
    return datetime.fromisoformat(document.created_utc.replace("Z", "+00:00")).timestamp()


class _EventFile:
    """One TensorBoard event file, written under a temporary name and renamed on close.

    Not thread-safe.  The final name ``events.out.tfevents.<time>.<host>.tf-grpc-bench``
    depends only on the document, so writing the same document again replaces
    its event files instead of adding duplicates.
    """

    def __init__(self, directory: Path, wall_time_s: float) -> None:
        self._directory = directory
        self._wall_time_s = wall_time_s
        self._final = directory / (
            f"events.out.tfevents.{int(wall_time_s):010d}.{socket.gethostname()}.tf-grpc-bench"
        )
        directory.mkdir(parents=True, exist_ok=True)
        # The temporary name lacks "tfevents", so a running TensorBoard ignores it.
        descriptor, self._temporary = tempfile.mkstemp(dir=directory, prefix=".tb-", suffix=".tmp")
        self._records = RecordWriter(os.fdopen(descriptor, "wb"))
        self._write(event_pb2.Event(wall_time=wall_time_s, file_version="brain.Event:2"))

    def _write(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def add(self, summary: summary_pb2.Summary, step: int = 0) -> None:
        self._write(event_pb2.Event(wall_time=self._wall_time_s, step=step, summary=summary))

    def scalar(self, tag: str, value: float, step: int = 0, description: str = "") -> None:
        """A scalar; NaN (a figure that does not apply) is left out."""
        if math.isnan(value):
            return
        summary = summary_pb2.Summary()
        summary.value.add(
            tag=tag,
            metadata=scalar_metadata.create_summary_metadata(
                display_name=tag, description=description
            ),
            tensor=tensor_util.make_tensor_proto(float(value), dtype=np.float64),
        )
        self.add(summary, step)

    def histogram(self, tag: str, values: Sequence[float], step: int = 0) -> None:
        if len(values) == 0:
            return
        buckets = log_buckets(np.asarray(values, dtype=np.float64))
        summary = summary_pb2.Summary()
        summary.value.add(
            tag=tag,
            metadata=histogram_metadata.create_summary_metadata(display_name=tag, description=""),
            tensor=tensor_util.make_tensor_proto(buckets, dtype=np.float64),
        )
        self.add(summary, step)

    def close(self) -> None:
        self._records.close()
        os.replace(self._temporary, self._final)

    def discard(self) -> None:
        self._records.close()
        Path(self._temporary).unlink(missing_ok=True)


def log_buckets(values: np.ndarray) -> np.ndarray:
    """Histogram buckets as TensorBoard's histogram plugin stores them: rows of
    (left edge, right edge, count), edges spaced ``BUCKETS_PER_DECADE`` per
    decade between the smallest and largest value.  Zeros and negatives go in
    a first bucket [min, min]."""
    positive = values[values > 0]
    rows: list[tuple[float, float, float]] = []
    non_positive = values.size - positive.size
    if non_positive:
        low = float(values.min())
        rows.append((low, low, float(non_positive)))
    if positive.size:
        low, high = float(positive.min()), float(positive.max())
        if low == high:
            rows.append((low, high, float(positive.size)))
        else:
            decades = math.log10(high) - math.log10(low)
            count = max(1, math.ceil(decades * BUCKETS_PER_DECADE))
            edges = np.logspace(math.log10(low), math.log10(high), count + 1)
            edges[0], edges[-1] = low, high
            counts, _ = np.histogram(positive, bins=edges)
            rows += [(float(edges[i]), float(edges[i + 1]), float(counts[i])) for i in range(count)]
    return np.asarray(rows, dtype=np.float64).reshape(-1, 3)


def session_name(document: ResultDocument, label: str) -> str:
    """The HParams session group of one benchmark of one document.

    Unique per host, time, network and benchmark: TensorBoard merges sessions
    of the same name into one row, which must only happen when the same
    document is rendered twice.
    """
    network = document.network.name if document.network else "unrecorded"
    return f"{document.machine.hostname} {document.created_utc} {network} {label}"


def hparams_of(
    document: ResultDocument, result: BenchmarkResult, label: str
) -> dict[str, ParameterValue]:
    """The hparams of one benchmark's session (see the module docstring)."""
    values: dict[str, ParameterValue] = {**document.config, **result.parameters}
    network = document.network
    trace = document.trace
    values.update(
        benchmark=result.benchmark.value,
        label=label,
        workload=result.workload,
        network=network.name if network else "unrecorded",
        network_rate_bits_per_s=network.emulated_rate_bits_per_s if network else 0,
        trace=(trace.model or Path(trace.path).name) if trace else "synthetic",
        trace_sha256=trace.sha256 if trace else "",
        host=document.machine.hostname,
        created_utc=document.created_utc,
        partial=result.partial or any(run.partial for run in result.runs),
    )
    return values


def _write_latency(events: _EventFile, prefix: str, summary: LatencySummary) -> None:
    for name, attribute in LATENCY_STATISTICS:
        events.scalar(f"{prefix}/{name}", getattr(summary, attribute) / 1e3)


def _write_benchmark(
    events: _EventFile, document: ResultDocument, result: BenchmarkResult, label: str
) -> None:
    events.add(
        hparams_summary.hparams_pb(
            hparams_of(document, result, label),
            trial_id=session_name(document, label),
            start_time_secs=document_time_s(document),
        )
    )
    events.scalar("rpcs/count", result.rpc_count)
    _write_latency(events, "latency_us/all", result.latency_all)
    for category, summary in result.latency_by_category:
        _write_latency(events, f"latency_us/{category.value}", summary)
    events.scalar(
        "throughput/bandwidth_mb_per_s",
        result.bandwidth_mb_per_s,
        description="Request plus response payload, MB (10**6 bytes) per second, mean over runs.",
    )
    events.scalar(
        "throughput/rpcs_per_s",
        result.rpcs_per_s,
        description="Completed RPCs per second over all workers, mean over runs.",
    )
    step_time = result.step_time
    for name, attribute in LATENCY_STATISTICS:
        events.scalar(f"step_time_ms/{name}", getattr(step_time, attribute) / 1e6)
    events.scalar("cpu/client_utilization", cpu_utilization(result.client_cpu_ns, result))
    events.scalar("cpu/server_utilization", cpu_utilization(result.server_cpu_ns, result))

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
            "histogram/message_size_bytes", [s.payload_bytes for s in run.samples], index
        )
        events.histogram("histogram/latency_us", [s.latency_ns / 1e3 for s in run.samples], index)
        by_category = _latencies_by_category(run.samples)
        for class_name, latencies in by_category.items():
            events.histogram(f"histogram/latency_us/{class_name}", latencies, index)
        events.histogram("histogram/step_time_ms", [t / 1e6 for t in run.step_times_ns], index)
        for step_time_ns in run.step_times_ns:
            events.scalar("per_step/communication_time_ms", step_time_ns / 1e6, step_number)
            step_number += 1
    events.add(text_summary.text_pb("summary", report.format_benchmark_markdown(result)))


def _latencies_by_category(samples: Iterable[CallSample]) -> Mapping[str, list[float]]:
    grouped: dict[str, list[float]] = {}
    for sample in samples:
        category = classify(sample.payload_bytes).value
        grouped.setdefault(category, []).append(sample.latency_ns / 1e3)
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


def write_run(document: ResultDocument, logdir: Path) -> None:
    """Write ``document`` as TensorBoard event files under ``logdir``.

    Blocking file IO; creates ``logdir`` and one sub-directory per benchmark.
    Each event file appears complete or not at all; writing the same document
    again replaces its files.  Raises ``ResultError`` if ``logdir`` cannot be
    written.
    """
    logdir = Path(logdir)
    wall_time_s = document_time_s(document)
    try:
        for result, label in zip(document.benchmarks, document.labels, strict=True):
            events = _EventFile(logdir / label, wall_time_s)
            try:
                _write_benchmark(events, document, result, label)
            except BaseException:
                events.discard()
                raise
            events.close()
        events = _EventFile(logdir, wall_time_s)
        events.add(
            text_summary.text_pb(
                "results",
                _context_markdown(document) + "\n\n" + report.format_markdown_table([document]),
            )
        )
        events.close()
    except OSError as error:
        raise ResultError(
            f"{logdir}: cannot write TensorBoard logs ({error.strerror or error})"
        ) from None
