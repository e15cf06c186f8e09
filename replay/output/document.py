"""Result documents: what a replay measured, self-described.

A ``ResultDocument`` holds everything needed to understand, compare and
re-render a run later without the machine it ran on (self-describing results,
docs/design.md#rules-each-layer-keeps): the format version, the tool version,
the UTC time, the machine, the trace's path, hash and model, the network,
every parameter, the raw samples of every run and the statistics derived from
them.

On disk a document is one JSON object (``docs/results.md`` describes it field
by field): ``document_writer`` writes it, ``document_reader`` is the one place
result files are parsed, ``run_directory`` makes the directories runs write
into.  This module holds the model, the format's version history and
``build_document``.  The machine and network records and their probes live in
``machine``, the derived figures in ``statistics`` and ``prediction``.  Pure
except where a function says otherwise: ``describe_trace`` reads a file and
``build_document`` calls ``probe_machine`` unless given one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import tf_grpc_bench
from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.replay.core.measurement import SAMPLE_COLUMNS, Benchmark, BenchmarkResult
from tf_grpc_bench.replay.core.whatif import Derivation
from tf_grpc_bench.replay.output.machine import MachineInfo, NetworkInfo, probe_machine

#: Value of the ``format`` field, naming the kind of document.
FORMAT = "tf-grpc-bench-results"
#: Version of the result format this module writes.  History:
#:   1 (2026-11): first version.
#:   2 (2026-12): samples gain ``release_lag_ns`` (schedule fidelity), runs gain
#:       ``step_compute_ns`` (compute on each step's critical path), statistics
#:       gain ``prediction`` and ``release_lag_ns``.  Version 1 documents read
#:       with those empty (lags 0).
#:   3 (2026-12): benchmarks gain ``inexact_sizes``: the traced message sizes a
#:       (serialized) replay could not reproduce, or null.  Older documents read
#:       with null.
#:   4 (2026-12): samples gain ``rpc_index`` (which RPC of the trace step a
#:       call replayed, for timelines and exports).  Versions 1 to 3 read with
#:       -1 (unknown).
#:   5 (2026-12): runs gain ``machine_cpu_busy_ticks`` and ``machine_cpu_total_ticks``
#:       (the whole machine's CPU over the run, from ``/proc/stat``); predictions
#:       gain ``replay_cpu_cores`` and ``machine_cpu_busy_share``, and
#:       ``replay_bound`` also counts the machine's load.  Versions 1 to 4 read
#:       with 0 ticks (unknown).
#:       Documents also gain ``what_if``: the cluster a what-if replay asked
#:       about and the trace it was derived from (``core.whatif``), or null;
#:       versions 1 to 4 read with null.
#:   6 (2026-12): the network gains ``emulated_delay_ns``, ``emulated_jitter_ns``,
#:       ``emulated_loss`` (an emulated link's profile) and ``relays`` (what each
#:       direction of its delay relay did: packets, drops, release lateness
#:       percentiles and histogram, and why it fell behind).  Versions 1 to 5 read
#:       with 0 and no relays.
#:   7 (2026-12): the trace gains ``partial_reason``: why the replayed trace is
#:       partial (a capture stopped early), "" for a whole trace.  Versions 1 to 6
#:       read with "".
#:   8 (2026-12): a prediction's ``replay_bound`` is judged from the replay's own
#:       processes alone; the machine's load (``machine_cpu_busy_share``) is evidence
#:       and no longer flags it.  No field changes; versions 1 to 7 read as before.
#:   9 (2026-12): samples gain ``window_held`` (1: the in-flight window held the call
#:       back, ``measurement.release_held``); predictions gain
#:       ``unheld_release_lag_p90_ns`` and ``replay_bound`` also counts that lag.
#:       Versions 1 to 8 read with 0 (no call held: their lag is every call's).
FORMAT_VERSION = 9
#: Versions ``read_document`` can read.
READABLE_VERSIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9})
_BEFORE_9 = tuple(c for c in SAMPLE_COLUMNS if c != "window_held")
#: The sample columns each version stores.
SAMPLE_COLUMNS_BY_VERSION = {
    1: tuple(c for c in _BEFORE_9 if c not in ("release_lag_ns", "rpc_index")),
    2: tuple(c for c in _BEFORE_9 if c != "rpc_index"),
    3: tuple(c for c in _BEFORE_9 if c != "rpc_index"),
    4: _BEFORE_9,
    5: _BEFORE_9,
    6: _BEFORE_9,
    7: _BEFORE_9,
    8: _BEFORE_9,
    9: SAMPLE_COLUMNS,
}
#: Conventional name of the result document inside a run directory.
RESULTS_FILE_NAME = "results.json"

#: A parameter value: what JSON and TensorBoard's hparams both hold.
ParameterValue = str | int | float | bool

# Raw samples are stored column by column, in measurement.SAMPLE_COLUMNS order.

# --------------------------------------------------------------------------
# What the document records besides the measurements.


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceInfo:
    """The trace a trace-driven run replayed."""

    #: Absolute path of the trace file when the run was made.
    path: str
    #: Hex SHA-256 of the trace file's bytes.
    sha256: str
    model: str
    strategy: str
    tensorflow_version: str
    format_version: int
    step_count: int
    #: Why the trace is partial (its capture stopped early); "" for a whole trace.
    partial_reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultDocument:
    """One invocation's results: every benchmark it ran, and their context."""

    #: When the document was built, ISO 8601 in UTC ("...Z").
    created_utc: str
    tool_version: str
    machine: MachineInfo
    #: The invocation's parameters (flags after defaults), flat.
    config: dict[str, ParameterValue]
    benchmarks: tuple[BenchmarkResult, ...]
    trace: TraceInfo | None = None
    network: NetworkInfo | None = None
    partial: bool = False
    partial_reason: str = ""
    #: A what-if replay: the cluster asked about and where it was derived from.
    what_if: Derivation | None = None
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_parameters(self.config, "config")
        for result in self.benchmarks:
            _check_parameters(result.parameters, f"parameters of {result.benchmark.value}")
        if self.format_version not in READABLE_VERSIONS:
            raise ValueError(f"format_version {self.format_version} is not supported")

    @property
    def labels(self) -> tuple[str, ...]:
        """A short unique name per benchmark result, in order (see ``benchmark_labels``)."""
        return benchmark_labels(self.benchmarks)


def benchmark_labels(results: Sequence[BenchmarkResult]) -> tuple[str, ...]:
    """Unique, file-name-safe names for ``results``, in order.

    The benchmark's name ("p2p-latency") when it occurs once; with its
    workload appended ("p2p-latency-trace") when the same benchmark ran on
    several workloads; with a counter when even that repeats.
    """
    counts: dict[Benchmark, int] = {}
    for result in results:
        counts[result.benchmark] = counts.get(result.benchmark, 0) + 1
    labels: list[str] = []
    for result in results:
        label = result.benchmark.value
        if counts[result.benchmark] > 1:
            label = f"{label}-{safe_name(result.workload) or 'workload'}"
        candidate, number = label, 2
        while candidate in labels:
            candidate = f"{label}-{number}"
            number += 1
        labels.append(candidate)
    return tuple(labels)


def _check_parameters(parameters: Mapping[str, object], where: str) -> None:
    for key, value in parameters.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: parameter names must be non-empty strings, got {key!r}")
        if not isinstance(value, str | int | float | bool):
            raise ValueError(
                f"{where}: parameter {key!r} must be a str, int, float or bool, "
                f"got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}: parameter {key!r} must be finite, got {value}")


def safe_name(text: str) -> str:
    """``text`` reduced to file-name-safe characters (letters, digits, ``._-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")


# --------------------------------------------------------------------------
# Describing the trace (reads the file).


def describe_trace(path: str | os.PathLike[str]) -> TraceInfo:
    """Read and hash the trace at ``path`` (raises ``TraceError`` if unreadable)."""
    path = Path(path)
    trace = trace_files.read_trace(path)
    return TraceInfo(
        # A pipe (``<(cat trace)``) resolves to no path worth recording: as given.
        path=str(path.resolve() if trace_files.is_regular_file(path) else path),
        sha256=trace_files.file_sha256(path),
        model=trace.metadata.model,
        strategy=trace.metadata.strategy,
        tensorflow_version=trace.metadata.tensorflow_version,
        format_version=trace.format_version,
        step_count=len(trace.steps),
        partial_reason=(trace.partial_reason or "capture ended early") if trace.partial else "",
    )


def utc_timestamp(moment: datetime | None = None) -> str:
    """ISO 8601 UTC time with milliseconds and a ``Z`` suffix (now by default)."""
    moment = moment or datetime.now(timezone.utc)
    text = moment.astimezone(timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


# --------------------------------------------------------------------------
# Building a document.


def build_document(
    results: Sequence[BenchmarkResult],
    *,
    config: Mapping[str, ParameterValue],
    trace_path: Path | None,
    network: NetworkInfo | None = None,
    partial: bool = False,
    partial_reason: str = "",
    machine: MachineInfo | None = None,
    created: datetime | None = None,
    what_if: Derivation | None = None,
) -> ResultDocument:
    """Assemble the result document of one invocation.

    The document is partial when the caller says so or when any benchmark or
    run in ``results`` is; without a reason from the caller, the reasons of
    the partial benchmarks are joined.  ``machine`` defaults to
    ``probe_machine()`` and ``created`` to now; ``trace_path`` is read and
    hashed (``TraceError`` if it cannot be).  Bad parameter values raise
    ``ResultError`` naming the parameter.
    """
    reasons = []
    for result in results:
        reason = result.partial_reason or next(
            (run.partial_reason for run in result.runs if run.partial), ""
        )
        if result.partial or any(run.partial for run in result.runs):
            reasons.append(f"{result.benchmark.value}: {reason or 'stopped early'}")
    is_partial = partial or bool(reasons)
    if is_partial and not partial_reason:
        partial_reason = "; ".join(reasons) or "stopped early"
    try:
        return ResultDocument(
            created_utc=utc_timestamp(created),
            tool_version=tf_grpc_bench.__version__,
            machine=machine or probe_machine(),
            config=dict(config),
            benchmarks=tuple(results),
            trace=None if trace_path is None else describe_trace(trace_path),
            network=network,
            partial=is_partial,
            partial_reason=partial_reason if is_partial else "",
            what_if=what_if,
        )
    except ValueError as error:
        raise ResultError(f"cannot build the result document: {error}") from None
