"""Tables of results: a short one for the terminal, markdown ones for comparisons.

Pure functions from result objects to text.  Latencies are shown in
microseconds, bandwidth in MB/s (10**6 bytes), step time in milliseconds;
"-" marks a figure that does not apply (no samples of that size class, no
replayed steps).  Every column names its statistic: latencies are p50/p99 of
each size class, the step is the median replayed step (``step p50 ms``), and
``in flight p50`` is the median number of the benchmark's calls open when each
call was issued (1 when calls go one at a time): a latency measured with many
calls in flight includes the wait behind them, which a line below the table
says.  A benchmark that stopped early is marked ``*`` and its reason follows
the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tf_grpc_bench import capture_cpu, host
from tf_grpc_bench.replay.core.measurement import BenchmarkResult, LatencySummary
from tf_grpc_bench.replay.output.document import ResultDocument, benchmark_labels
from tf_grpc_bench.replay.output.statistics import (
    calls_in_flight,
    median_in_flight,
    run_statistics,
)
from tf_grpc_bench.sizes import SizeCategory

PARTIAL_MARK = "*"


def format_number(value: float) -> str:
    """A figure with about three significant digits; "-" for NaN."""
    if math.isnan(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _latency_cell(summary: LatencySummary | None) -> str:
    if summary is None or summary.count == 0:
        return "-"
    return f"{format_number(summary.p50_ns / 1e3)} / {format_number(summary.p99_ns / 1e3)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    cells: tuple[str, ...]
    partial_note: str


_RESULT_HEADER = (
    "benchmark",
    "workload",
    "rpcs",
    "in flight p50",
    *(f"{category.value} p50/p99 us" for category in SizeCategory),
    "MB/s",
    "RPCs/s",
    "step p50 ms",
)


def _result_row(result: BenchmarkResult, label: str) -> _Row:
    by_category = dict(result.latency_by_category)
    step = result.step_time
    partial = result.partial or any(run.partial for run in result.runs)
    reason = result.partial_reason or next(
        (run.partial_reason for run in result.runs if run.partial_reason), ""
    )
    return _Row(
        cells=(
            label + (PARTIAL_MARK if partial else ""),
            result.workload,
            str(result.rpc_count),
            format_number(median_in_flight(result)),
            *(_latency_cell(by_category.get(category)) for category in SizeCategory),
            format_number(result.bandwidth_mb_per_s),
            format_number(result.rpcs_per_s),
            format_number(step.p50_ns / 1e6) if step.count else "-",
        ),
        partial_note=f"{label}: {reason or 'stopped early'}" if partial else "",
    )


def _align(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    # Text columns left-aligned, figures right-aligned.
    text_columns = {0, 1}

    def render(line: Sequence[str]) -> str:
        cells = [
            cell.ljust(widths[i]) if i in text_columns else cell.rjust(widths[i])
            for i, cell in enumerate(line)
        ]
        return "  ".join(cells).rstrip()

    return [render(header), *(render(row) for row in rows)]


def describe_context(document: ResultDocument) -> str:
    """One line: when, where, on which network, with which trace."""
    network = document.network.name if document.network else "unrecorded network"
    if document.trace:
        trace = f"trace {document.trace.model or '?'} ({document.trace.sha256[:12]})"
        if document.trace.partial_reason:
            trace += f", PARTIAL trace ({document.trace.partial_reason})"
    else:
        trace = "synthetic workload"
    return (
        f"{document.created_utc} on {document.machine.hostname} "
        f"({document.machine.cpu_count} CPUs), {network}, {trace}"
    )


def format_table(document: ResultDocument) -> str:
    """The short table printed after a replay: one row per benchmark."""
    rows = [
        _result_row(result, label)
        for result, label in zip(document.benchmarks, document.labels, strict=True)
    ]
    lines = [describe_context(document)]
    if document.what_if is not None:
        lines.append(document.what_if.describe())
    lines += _align(_RESULT_HEADER, [row.cells for row in rows])
    lines += in_flight_notes(document.benchmarks, document.labels)
    notes = [row.partial_note for row in rows if row.partial_note]
    if document.partial and not notes:
        notes.append(document.partial_reason or "stopped early")
    lines += [f"{PARTIAL_MARK} partial: {note}" for note in notes]
    lines += _dropped_notes(document)
    lines += _inexact_notes(document)
    lines += [note for note in (compute_machine_note(document), capture_cpu_note(document)) if note]
    return "\n".join(lines)


def in_flight_notes(results: Sequence[BenchmarkResult], labels: Sequence[str]) -> list[str]:
    """A line naming the benchmarks whose latencies were measured with more than one
    call in flight (their median ``calls_in_flight``); none when every call went alone."""
    crowded = [
        f"{label} {format_number(count)}"
        for result, label in zip(results, labels, strict=True)
        if (count := median_in_flight(result)) > 1
    ]
    if not crowded:
        return []
    return [
        "latency with calls in flight (median open when each call was issued): "
        + ", ".join(crowded)
    ]


def _keeps_compute(result: BenchmarkResult) -> bool:
    """Whether ``result``'s replay kept the trace's compute gaps (its step carries them)."""
    pacing = result.parameters.get("pacing")
    if pacing == "recorded":
        return True
    scale = result.parameters.get("compute_scale")
    return pacing == "dependencies" and isinstance(scale, int | float) and scale > 0


def compute_machine_note(document: ResultDocument) -> str:
    """A line on whose compute ``document``'s predicted step carries ("" when it is this
    machine's own, or none): scaled to this machine by the calibrations
    (``compute_calibration``), or kept from the capture machine (docs/fidelity.md)."""
    here = host.machine_name(document.machine.cpu_model, document.machine.cpu_count)
    for result in document.benchmarks:
        if not _keeps_compute(result):
            continue
        calibrated = str(result.parameters.get("compute_calibration", ""))
        if calibrated and not calibrated.startswith("none"):
            return f"compute scaled to this machine: {calibrated}"
        captured = result.parameters.get("captured_on")
        if isinstance(captured, str) and captured and captured != here:
            why = f"not scaled: {calibrated.removeprefix('none: ')}; " if calibrated else ""
            return (
                f"compute kept from another machine: the trace was captured on {captured}, "
                f"replayed on {here}; the step carries the capture machine's compute ({why}"
                "capture on this machine to predict its training)"
            )
    return ""


def capture_cpu_note(document: ResultDocument) -> str:
    """A line when the compute ``document``'s predicted step keeps was captured with the
    machine's cores (nearly) all busy, on another link than the replay's
    (``capture_cpu.contention_note``); "" otherwise."""
    network = document.network.name if document.network else None
    for result in document.benchmarks:
        share = result.parameters.get("capture_cpu_busy_share")
        if _keeps_compute(result) and isinstance(share, int | float):
            note = capture_cpu.contention_note(
                str(result.parameters.get("capture_cpu", "")),
                share,
                same_link=network is not None and result.parameters.get("capture_link") == network,
            )
            if note:
                return note
    return ""


def _inexact_notes(document: ResultDocument) -> list[str]:
    """What sizes a (serialized) trace replay could not reproduce, per benchmark."""
    return [
        f"sizes not exact: {label}: {result.inexact_sizes.describe()}"
        for result, label in zip(document.benchmarks, document.labels, strict=True)
        if result.inexact_sizes is not None
    ]


def _dropped_notes(document: ResultDocument) -> list[str]:
    """What a trace replay could not send (once per distinct kind list)."""
    seen: set[str] = set()
    lines = []
    for result in document.benchmarks:
        kinds = result.parameters.get("dropped_rpcs")
        if isinstance(kinds, str) and kinds and kinds not in seen:
            seen.add(kinds)
            replayed = result.parameters.get("whole_steps")
            why = f" (replayed beyond worker <-> ps: {replayed})" if replayed else ""
            lines.append(f"not replayed (no replay task makes these calls), per pass: {kinds}{why}")
    return lines


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_escape(cell) for cell in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(_escape(cell) for cell in row) + " |" for row in rows]
    return lines


def format_markdown_table(items: Sequence[ResultDocument] | Sequence[BenchmarkResult]) -> str:
    """A markdown table comparing benchmark results.

    Given result documents (for example the same replay over several
    networks), one row per benchmark per document, with the document's
    network and trace first; given ``BenchmarkResult`` objects, one row each.
    Partial results are marked and their reasons listed below the table.
    """
    notes: list[str] = []
    table_rows: list[tuple[str, ...]] = []
    if all(isinstance(item, BenchmarkResult) for item in items):
        results = [item for item in items if isinstance(item, BenchmarkResult)]
        header: tuple[str, ...] = _RESULT_HEADER
        labels = benchmark_labels(results)
        for result, label in zip(results, labels, strict=True):
            row = _result_row(result, label)
            table_rows.append(row.cells)
            notes += [row.partial_note] if row.partial_note else []
        crowded = in_flight_notes(results, labels)
    elif all(isinstance(item, ResultDocument) for item in items):
        header = ("network", "trace", *_RESULT_HEADER)
        crowded = []
        for document in items:
            assert isinstance(document, ResultDocument)
            network = document.network.name if document.network else "-"
            trace = (document.trace.model or "?") if document.trace else "synthetic"
            for result, label in zip(document.benchmarks, document.labels, strict=True):
                row = _result_row(result, label)
                table_rows.append((network, trace, *row.cells))
                if row.partial_note:
                    notes.append(f"{network}, {row.partial_note}")
            crowded += [
                f"{network}: {line}"
                for line in in_flight_notes(document.benchmarks, document.labels)
            ]
    else:
        raise TypeError("format_markdown_table takes result documents or benchmark results")
    lines = _markdown(header, table_rows)
    if crowded or notes:
        lines.append("")
    lines += crowded
    lines += [f"{PARTIAL_MARK} partial: {note}" for note in notes]
    machines = {
        note(item)
        for item in items
        if isinstance(item, ResultDocument)
        for note in (compute_machine_note, capture_cpu_note)
    } - {""}
    if machines:
        lines += ["", *sorted(machines)]
    return "\n".join(lines)


def format_benchmark_markdown(result: BenchmarkResult) -> str:
    """Markdown detail of one benchmark: latency per size class, then per run."""
    latency_header = (
        "class",
        "count",
        "mean us",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
    )

    def latency_row(name: str, summary: LatencySummary) -> tuple[str, ...]:
        return (
            name,
            str(summary.count),
            *(
                format_number(value / 1e3)
                for value in (
                    summary.mean_ns,
                    summary.p50_ns,
                    summary.p90_ns,
                    summary.p99_ns,
                    summary.p999_ns,
                    summary.max_ns,
                )
            ),
        )

    latency_rows = [latency_row(category.value, s) for category, s in result.latency_by_category]
    latency_rows.append(latency_row("all", result.latency_all))
    run_header = (
        "run",
        "rpcs",
        "seconds",
        "MB/s",
        "RPCs/s",
        "in flight p50",
        "p50 us",
        "p99 us",
        "step p50 ms",
        "partial",
    )
    run_rows = []
    for run in result.runs:
        stats = run_statistics(run)
        run_rows.append(
            (
                str(run.run_index),
                str(stats.rpc_count),
                format_number(stats.duration_ns / 1e9),
                format_number(stats.bandwidth_mb_per_s),
                format_number(stats.rpcs_per_s),
                format_number(float(np.median(calls_in_flight(run.samples))))
                if run.samples
                else "-",
                format_number(stats.latency.p50_ns / 1e3),
                format_number(stats.latency.p99_ns / 1e3),
                format_number(stats.step_time.p50_ns / 1e6),
                (run.partial_reason or "yes") if run.partial else "",
            )
        )
    return "\n".join(
        [*_markdown(latency_header, latency_rows), "", *_markdown(run_header, run_rows)]
    )
