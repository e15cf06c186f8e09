"""Result documents: what a replay measured, self-described, as versioned JSON.

A ``ResultDocument`` holds everything needed to understand, compare and
re-render a run later without the machine it ran on (STYLE.md principle 4):
the format version, the tool version, the UTC time, the machine, the trace's
path, hash and model, the network, every parameter, the raw samples of every
run and the statistics derived from them.

On disk a document is one JSON object (``docs/results.md`` describes it field
by field).  ``read_document`` is the one place result files are parsed; it
refuses a format version it does not know.  The derived ``statistics`` objects
in the file are written for other tools and for people reading the file: on
reading, statistics are recomputed from the raw samples, so a document read
back is exactly the ``BenchmarkResult`` objects that were written.

The machine and network records and their probes live in ``machine``, the
derived figures in ``statistics``.  Pure except where a function says
otherwise: ``describe_trace`` reads a file,
``write_document``/``read_document``/``new_run_directory`` touch the file
system, and ``build_document`` calls ``describe_machine`` unless given one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

import tf_grpc_bench
from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import ResultError, UnsupportedResultVersionError
from tf_grpc_bench.files import write_atomically
from tf_grpc_bench.replay.core.measurement import (
    SAMPLE_COLUMNS,
    Benchmark,
    BenchmarkResult,
    CallSample,
    InexactSizes,
    LatencySummary,
    RunMeasurement,
    machine_cpu_busy_share,
)
from tf_grpc_bench.replay.core.whatif import Derivation
from tf_grpc_bench.replay.output.machine import (
    InterfaceInfo,
    MachineInfo,
    NetworkInfo,
    describe_machine,
)
from tf_grpc_bench.replay.output.statistics import cpu_utilization, run_statistics

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
FORMAT_VERSION = 5
#: Versions ``read_document`` can read.
READABLE_VERSIONS = frozenset({1, 2, 3, 4, 5})
#: The sample columns each version stores.
_SAMPLE_COLUMNS_BY_VERSION = {
    1: tuple(c for c in SAMPLE_COLUMNS if c not in ("release_lag_ns", "rpc_index")),
    2: tuple(c for c in SAMPLE_COLUMNS if c != "rpc_index"),
    3: tuple(c for c in SAMPLE_COLUMNS if c != "rpc_index"),
    4: SAMPLE_COLUMNS,
    5: SAMPLE_COLUMNS,
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
            label = f"{label}-{_safe_name(result.workload) or 'workload'}"
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


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")


# --------------------------------------------------------------------------
# Describing the trace (reads the file).


def describe_trace(path: str | os.PathLike[str]) -> TraceInfo:
    """Read and hash the trace at ``path`` (raises ``TraceError`` if unreadable)."""
    path = Path(path)
    trace = trace_files.read_trace(path)
    return TraceInfo(
        path=str(path.resolve()),
        sha256=trace_files.file_sha256(path),
        model=trace.metadata.model,
        strategy=trace.metadata.strategy,
        tensorflow_version=trace.metadata.tensorflow_version,
        format_version=trace.format_version,
        step_count=len(trace.steps),
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
    ``describe_machine()`` and ``created`` to now; ``trace_path`` is read and
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
            machine=machine or describe_machine(),
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


def _finite_or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def _latency_json(summary: LatencySummary) -> dict[str, Any]:
    return {
        "count": summary.count,
        "mean_ns": _finite_or_none(summary.mean_ns),
        "min_ns": _finite_or_none(summary.min_ns),
        "p50_ns": _finite_or_none(summary.p50_ns),
        "p90_ns": _finite_or_none(summary.p90_ns),
        "p99_ns": _finite_or_none(summary.p99_ns),
        "p999_ns": _finite_or_none(summary.p999_ns),
        "max_ns": _finite_or_none(summary.max_ns),
    }


def _statistics_json(result: BenchmarkResult, cpu_count: int) -> dict[str, Any]:
    latency = {"all": _latency_json(result.latency_all)}
    for category, summary in result.latency_by_category:
        latency[category.value] = _latency_json(summary)
    return {
        "rpc_count": result.rpc_count,
        "request_bytes": sum(run.request_bytes for run in result.runs),
        "response_bytes": sum(run.response_bytes for run in result.runs),
        "rpcs_per_s": _finite_or_none(result.rpcs_per_s),
        "bytes_per_s": _finite_or_none(result.bytes_per_s),
        "bandwidth_mb_per_s": _finite_or_none(result.bandwidth_mb_per_s),
        "latency_ns": latency,
        "step_time_ns": _latency_json(result.step_time),
        "prediction": prediction_json(result, cpu_count),
        "release_lag_ns": _latency_json(result.release_lag),
        "client_cpu_ns": result.client_cpu_ns,
        "server_cpu_ns": result.server_cpu_ns,
        "client_cpu_utilization": _finite_or_none(cpu_utilization(result.client_cpu_ns, result)),
        "server_cpu_utilization": _finite_or_none(cpu_utilization(result.server_cpu_ns, result)),
    }


def _median_or_none(values: Sequence[int]) -> float | None:
    return float(np.median(values)) if values else None


#: Share of the machine's cores the replay's own processes may use before its
#: prediction is flagged as bound by the replay rather than by the link.
REPLAY_BOUND_CPU_SHARE = 0.7
#: Share of all the machine's cores busy (any process) from which the prediction
#: is flagged even when the replay's own processes used less: others took the cores.
MACHINE_BUSY_CPU_SHARE = 0.9


def replay_cpu_cores(result: BenchmarkResult) -> float:
    """Cores the replay's client and (local or reporting) server processes kept busy."""
    total = cpu_utilization(result.client_cpu_ns + result.server_cpu_ns, result)
    return 0.0 if math.isnan(total) else total


def replay_bound_verdict(
    replay_cores: float, cpu_count: int, machine_busy_share: float | None
) -> tuple[bool, str]:
    """Whether a prediction is bound by the replay's machine rather than the link, and why.

    Bound when the replay's own processes kept at least ``REPLAY_BOUND_CPU_SHARE``
    of the ``cpu_count`` cores busy, or when the whole machine was at least
    ``MACHINE_BUSY_CPU_SHARE`` busy (None: not known) whoever used it.
    """
    own = cpu_count > 0 and replay_cores >= REPLAY_BOUND_CPU_SHARE * cpu_count
    machine = machine_busy_share is not None and machine_busy_share >= MACHINE_BUSY_CPU_SHARE
    evidence = f"replay client and server processes used {replay_cores:.2f} of {cpu_count} cores"
    if machine_busy_share is not None:
        evidence += (
            f"; the machine's cores were {100 * machine_busy_share:.0f}% busy "
            f"({machine_busy_share * cpu_count:.2f} of {cpu_count}, every process)"
        )
    if own:
        evidence += " (the step may be the replay's CPU, not the link)"
    elif machine:
        evidence += (
            " (other processes took the cores the replay needed: the step may be the "
            "machine's load, not the link)"
        )
    return own or machine, evidence


def prediction_json(result: BenchmarkResult, cpu_count: int) -> dict[str, Any] | None:
    """What the replay predicts of a training step (dependencies pacing), else None.

    ``step_ns``: median replayed worker-step, compute kept; ``compute_ns`` and
    ``communication_ns``: medians of the critical path's two parts.
    ``replay_bound`` (``replay_bound_verdict``): the replay's own processes
    (``replay_cpu_cores``) or every process together (``machine_cpu_busy_share``,
    null when unknown) kept the machine's cores busy, so the step may be the
    replay's machine rather than the network; ``replay_bound_evidence`` says which.
    """
    if not result.step_compute_ns:
        return None
    cores = replay_cpu_cores(result)
    machine = machine_cpu_busy_share(result.runs)
    bound, evidence = replay_bound_verdict(cores, cpu_count, machine)
    return {
        "step_ns": _median_or_none(result.step_times_ns),
        "compute_ns": _median_or_none(result.step_compute_ns),
        "communication_ns": _median_or_none(result.step_communication_ns),
        "steps": len(result.step_compute_ns),
        "replay_bound": bound,
        "replay_bound_evidence": evidence,
        "replay_cpu_cores": _finite_or_none(cores),
        "machine_cpu_busy_share": machine,
    }


def _run_statistics_json(run: RunMeasurement) -> dict[str, Any]:
    stats = run_statistics(run)
    return {
        "rpc_count": stats.rpc_count,
        "rpcs_per_s": _finite_or_none(stats.rpcs_per_s),
        "bytes_per_s": _finite_or_none(stats.bytes_per_s),
        "bandwidth_mb_per_s": _finite_or_none(stats.bandwidth_mb_per_s),
        "latency_ns": _latency_json(stats.latency),
        "step_time_ns": _latency_json(stats.step_time),
    }


# --------------------------------------------------------------------------
# To JSON.


def _run_json(run: RunMeasurement) -> dict[str, Any]:
    return {
        "run_index": run.run_index,
        "duration_ns": run.duration_ns,
        "client_cpu_ns": run.client_cpu_ns,
        "server_cpu_ns": run.server_cpu_ns,
        "server_received_bytes": run.server_received_bytes,
        "server_received_messages": run.server_received_messages,
        "machine_cpu_busy_ticks": run.machine_cpu_busy_ticks,
        "machine_cpu_total_ticks": run.machine_cpu_total_ticks,
        "partial": run.partial,
        "partial_reason": run.partial_reason,
        "statistics": _run_statistics_json(run),
        "step_times_ns": list(run.step_times_ns),
        "step_compute_ns": list(run.step_compute_ns),
        "samples": {
            "count": run.rpc_count,
            **{
                column: [getattr(sample, column) for sample in run.samples]
                for column in SAMPLE_COLUMNS
            },
        },
    }


def _inexact_json(inexact: InexactSizes | None) -> dict[str, Any] | None:
    if inexact is None:
        return None
    return {
        "calls_per_pass": inexact.calls_per_pass,
        "traced_bytes": inexact.traced_bytes,
        "replayed_bytes": inexact.replayed_bytes,
        "examples": inexact.examples,
    }


def _benchmark_json(result: BenchmarkResult, cpu_count: int) -> dict[str, Any]:
    return {
        "benchmark": result.benchmark.value,
        "workload": result.workload,
        "partial": result.partial,
        "partial_reason": result.partial_reason,
        "inexact_sizes": _inexact_json(result.inexact_sizes),
        "parameters": dict(result.parameters),
        "statistics": _statistics_json(result, cpu_count),
        "runs": [_run_json(run) for run in result.runs],
    }


def _what_if_json(what_if: Derivation | None) -> dict[str, Any] | None:
    if what_if is None:
        return None
    return {
        "workers": what_if.workers,
        "ps": what_if.ps,
        "placement": what_if.placement,
        "scale_tensors": what_if.scale_tensors,
        "variables": what_if.variables,
        "derived_from": {
            "trace": what_if.trace,
            "workers": what_if.captured_workers,
            "ps": what_if.captured_ps,
        },
    }


def _what_if_from_json(obj: dict[str, Any], where: str) -> Derivation:
    source = _object(obj, "derived_from", where)
    scale = obj.get("scale_tensors")
    if not isinstance(scale, int | float) or isinstance(scale, bool):
        raise _Invalid(f"{where}.scale_tensors: expected a number")
    try:
        return Derivation(
            workers=_int(obj, "workers", where),
            ps=_int(obj, "ps", where),
            placement=_str(obj, "placement", where),
            scale_tensors=float(scale),
            variables=_int(obj, "variables", where),
            trace=_str(source, "trace", f"{where}.derived_from"),
            captured_workers=_int(source, "workers", f"{where}.derived_from"),
            captured_ps=_int(source, "ps", f"{where}.derived_from"),
        )
    except ValueError as error:
        raise _Invalid(f"{where}: {error}") from None


def document_to_json_dict(document: ResultDocument) -> dict[str, Any]:
    """The JSON object ``write_document`` writes (plain dicts, lists and scalars)."""
    machine = document.machine
    trace = document.trace
    network = document.network
    return {
        "format": FORMAT,
        "format_version": document.format_version,
        "tool_version": document.tool_version,
        "created_utc": document.created_utc,
        "partial": document.partial,
        "partial_reason": document.partial_reason,
        "machine": {
            "hostname": machine.hostname,
            "platform": machine.platform,
            "kernel": machine.kernel,
            "cpu_model": machine.cpu_model,
            "cpu_count": machine.cpu_count,
            "memory_bytes": machine.memory_bytes,
            "python_version": machine.python_version,
            "grpcio_version": machine.grpcio_version,
            "protobuf_version": machine.protobuf_version,
            "numpy_version": machine.numpy_version,
            "tensorboard_version": machine.tensorboard_version,
        },
        "trace": None
        if trace is None
        else {
            "path": trace.path,
            "sha256": trace.sha256,
            "model": trace.model,
            "strategy": trace.strategy,
            "tensorflow_version": trace.tensorflow_version,
            "format_version": trace.format_version,
            "step_count": trace.step_count,
        },
        "network": None
        if network is None
        else {
            "name": network.name,
            "addresses": list(network.addresses),
            "interfaces": [
                {
                    "name": interface.name,
                    "mtu_bytes": interface.mtu_bytes,
                    "speed_mbit_per_s": interface.speed_mbit_per_s,
                    "namespace": interface.namespace,
                }
                for interface in network.interfaces
            ],
            "emulated_rate_bits_per_s": network.emulated_rate_bits_per_s,
            "emulation": network.emulation,
        },
        "what_if": _what_if_json(document.what_if),
        "config": dict(document.config),
        "benchmarks": [
            _benchmark_json(result, document.machine.cpu_count) for result in document.benchmarks
        ],
    }


def _encode(value: Any, depth: int = 0) -> str:
    """JSON with one indented line per object member, but lists of numbers on one line.

    Raw sample columns hold hundreds of thousands of numbers: one per line
    would make files long to page through for no gain.
    """
    if isinstance(value, dict) and value:
        inner = " " * (depth + 1)
        members = (f"{inner}{json.dumps(k)}: {_encode(v, depth + 1)}" for k, v in value.items())
        return "{\n" + ",\n".join(members) + "\n" + " " * depth + "}"
    if isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
        inner = " " * (depth + 1)
        items = (inner + _encode(item, depth + 1) for item in value)
        return "[\n" + ",\n".join(items) + "\n" + " " * depth + "]"
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def dumps_document(document: ResultDocument) -> str:
    """The text of the JSON file ``write_document`` writes."""
    return _encode(document_to_json_dict(document)) + "\n"


def write_document(document: ResultDocument, path: str | os.PathLike[str]) -> Path:
    """Write ``document`` as JSON to ``path`` atomically; returns the path.

    A reader never sees half a file.  Raises ``ResultError`` if the file
    cannot be written.
    """
    data = dumps_document(document).encode("utf-8")
    return write_atomically(
        path, lambda stream: stream.write(data), error=ResultError, what="results"
    )


# --------------------------------------------------------------------------
# From JSON: the one parse point.


class _Invalid(Exception):
    """A field of the document is missing or of the wrong type (internal)."""


def _field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise _Invalid(f"{where}: missing field {key!r}")
    return obj[key]


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = _field(obj, key, where)
    if not isinstance(value, str):
        raise _Invalid(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value


def _int(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(obj, key, where)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Invalid(f"{where}.{key}: expected an integer, got {json.dumps(value)[:40]}")
    return value


def _bool(obj: Mapping[str, Any], key: str, where: str) -> bool:
    value = _field(obj, key, where)
    if not isinstance(value, bool):
        raise _Invalid(f"{where}.{key}: expected true or false, got {json.dumps(value)[:40]}")
    return value


def _object(obj: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = _field(obj, key, where)
    if not isinstance(value, dict):
        raise _Invalid(f"{where}.{key}: expected an object, got {type(value).__name__}")
    return value


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = _field(obj, key, where)
    if not isinstance(value, list):
        raise _Invalid(f"{where}.{key}: expected a list, got {type(value).__name__}")
    return value


def _int_list(obj: Mapping[str, Any], key: str, where: str) -> list[int]:
    values = _list(obj, key, where)
    for index, value in enumerate(values):
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Invalid(
                f"{where}.{key}[{index}]: expected an integer, got {json.dumps(value)[:40]}"
            )
    return values


def _parameters(obj: Mapping[str, Any], key: str, where: str) -> dict[str, ParameterValue]:
    values = _object(obj, key, where)
    for name, value in values.items():
        if not isinstance(value, str | int | float | bool):
            raise _Invalid(
                f"{where}.{key}.{name}: expected a string, number or boolean, "
                f"got {json.dumps(value)[:40]}"
            )
    return values


def _machine_from_json(obj: dict[str, Any], where: str) -> MachineInfo:
    return MachineInfo(
        hostname=_str(obj, "hostname", where),
        platform=_str(obj, "platform", where),
        kernel=_str(obj, "kernel", where),
        cpu_model=_str(obj, "cpu_model", where),
        cpu_count=_int(obj, "cpu_count", where),
        memory_bytes=_int(obj, "memory_bytes", where),
        python_version=_str(obj, "python_version", where),
        grpcio_version=_str(obj, "grpcio_version", where),
        protobuf_version=_str(obj, "protobuf_version", where),
        numpy_version=_str(obj, "numpy_version", where),
        tensorboard_version=_str(obj, "tensorboard_version", where),
    )


def _trace_from_json(obj: dict[str, Any], where: str) -> TraceInfo:
    return TraceInfo(
        path=_str(obj, "path", where),
        sha256=_str(obj, "sha256", where),
        model=_str(obj, "model", where),
        strategy=_str(obj, "strategy", where),
        tensorflow_version=_str(obj, "tensorflow_version", where),
        format_version=_int(obj, "format_version", where),
        step_count=_int(obj, "step_count", where),
    )


def _network_from_json(obj: dict[str, Any], where: str) -> NetworkInfo:
    interfaces = []
    for index, item in enumerate(_list(obj, "interfaces", where)):
        at = f"{where}.interfaces[{index}]"
        if not isinstance(item, dict):
            raise _Invalid(f"{at}: expected an object")
        interfaces.append(
            InterfaceInfo(
                name=_str(item, "name", at),
                mtu_bytes=_int(item, "mtu_bytes", at),
                speed_mbit_per_s=_int(item, "speed_mbit_per_s", at),
                namespace=_str(item, "namespace", at),
            )
        )
    addresses = _list(obj, "addresses", where)
    if not all(isinstance(address, str) for address in addresses):
        raise _Invalid(f"{where}.addresses: expected a list of strings")
    return NetworkInfo(
        name=_str(obj, "name", where),
        addresses=tuple(addresses),
        interfaces=tuple(interfaces),
        emulated_rate_bits_per_s=_int(obj, "emulated_rate_bits_per_s", where),
        emulation=_str(obj, "emulation", where),
    )


def _run_from_json(obj: dict[str, Any], where: str, version: int) -> RunMeasurement:
    samples_obj = _object(obj, "samples", where)
    at = f"{where}.samples"
    count = _int(samples_obj, "count", at)
    names = _SAMPLE_COLUMNS_BY_VERSION[version]
    columns = [_int_list(samples_obj, column, at) for column in names]
    for column, values in zip(names, columns, strict=True):
        if len(values) != count:
            raise _Invalid(f"{at}.{column}: has {len(values)} values, 'count' says {count}")
    samples = []
    for index, row in enumerate(zip(*columns, strict=True)):
        try:
            samples.append(CallSample(**dict(zip(names, row, strict=True))))
        except ValueError as error:
            raise _Invalid(f"{at}[{index}]: {error}") from None
    busy = _int(obj, "machine_cpu_busy_ticks", where) if version >= 5 else 0
    total = _int(obj, "machine_cpu_total_ticks", where) if version >= 5 else 0
    if not 0 <= busy <= total:
        raise _Invalid(
            f"{where}: machine_cpu_busy_ticks {busy} must be within 0 .. "
            f"machine_cpu_total_ticks {total}"
        )
    return RunMeasurement(
        run_index=_int(obj, "run_index", where),
        duration_ns=_int(obj, "duration_ns", where),
        samples=tuple(samples),
        step_times_ns=tuple(_int_list(obj, "step_times_ns", where)),
        step_compute_ns=tuple(_int_list(obj, "step_compute_ns", where)) if version >= 2 else (),
        client_cpu_ns=_int(obj, "client_cpu_ns", where),
        server_cpu_ns=_int(obj, "server_cpu_ns", where),
        server_received_bytes=_int(obj, "server_received_bytes", where),
        server_received_messages=_int(obj, "server_received_messages", where),
        machine_cpu_busy_ticks=busy,
        machine_cpu_total_ticks=total,
        partial=_bool(obj, "partial", where),
        partial_reason=_str(obj, "partial_reason", where),
    )


def _benchmark_from_json(obj: dict[str, Any], where: str, version: int) -> BenchmarkResult:
    name = _str(obj, "benchmark", where)
    try:
        benchmark = Benchmark(name)
    except ValueError:
        known = ", ".join(b.value for b in Benchmark)
        raise _Invalid(f"{where}.benchmark: unknown benchmark {name!r} (known: {known})") from None
    runs = []
    for index, item in enumerate(_list(obj, "runs", where)):
        if not isinstance(item, dict):
            raise _Invalid(f"{where}.runs[{index}]: expected an object")
        runs.append(_run_from_json(item, f"{where}.runs[{index}]", version))
    return BenchmarkResult(
        benchmark=benchmark,
        workload=_str(obj, "workload", where),
        parameters=_parameters(obj, "parameters", where),
        runs=tuple(runs),
        partial=_bool(obj, "partial", where),
        partial_reason=_str(obj, "partial_reason", where),
        inexact_sizes=_inexact_from_json(obj, where) if version >= 3 else None,
    )


def _inexact_from_json(obj: Mapping[str, Any], where: str) -> InexactSizes | None:
    value = _field(obj, "inexact_sizes", where)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Invalid(f"{where}.inexact_sizes: expected an object or null")
    at = f"{where}.inexact_sizes"
    try:
        return InexactSizes(
            calls_per_pass=_int(value, "calls_per_pass", at),
            traced_bytes=_int(value, "traced_bytes", at),
            replayed_bytes=_int(value, "replayed_bytes", at),
            examples=_str(value, "examples", at),
        )
    except ValueError as error:
        raise _Invalid(f"{at}: {error}") from None


def document_from_json_dict(data: Any, *, source: str = "results") -> ResultDocument:
    """Inverse of ``document_to_json_dict``; ``source`` names the file in errors.

    Raises ``UnsupportedResultVersionError`` for a version this tool cannot
    read and ``ResultError`` for anything missing or malformed.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultError(
            f"{source}: not a tf-grpc-bench result document ('format' is not {FORMAT!r})"
        )
    version = data.get("format_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise UnsupportedResultVersionError(
            f"{source}: result format_version {version!r} is not supported "
            f"(this tool, version {tf_grpc_bench.__version__}, reads versions "
            f"{sorted(READABLE_VERSIONS)})"
        )
    where = "document"
    try:
        benchmarks = []
        for index, item in enumerate(_list(data, "benchmarks", where)):
            if not isinstance(item, dict):
                raise _Invalid(f"benchmarks[{index}]: expected an object")
            benchmarks.append(_benchmark_from_json(item, f"benchmarks[{index}]", version))
        trace = data.get("trace")
        network = data.get("network")
        if trace is not None and not isinstance(trace, dict):
            raise _Invalid("trace: expected an object or null")
        if network is not None and not isinstance(network, dict):
            raise _Invalid("network: expected an object or null")
        what_if = data.get("what_if") if version >= 5 else None
        if what_if is not None and not isinstance(what_if, dict):
            raise _Invalid("what_if: expected an object or null")
        return ResultDocument(
            format_version=version,
            tool_version=_str(data, "tool_version", where),
            created_utc=_str(data, "created_utc", where),
            machine=_machine_from_json(_object(data, "machine", where), "machine"),
            config=_parameters(data, "config", where),
            benchmarks=tuple(benchmarks),
            trace=None if trace is None else _trace_from_json(trace, "trace"),
            network=None if network is None else _network_from_json(network, "network"),
            partial=_bool(data, "partial", where),
            partial_reason=_str(data, "partial_reason", where),
            what_if=None if what_if is None else _what_if_from_json(what_if, "what_if"),
        )
    except _Invalid as error:
        raise ResultError(f"{source}: invalid result document: {error}") from None
    except ValueError as error:
        raise ResultError(f"{source}: invalid result document: {error}") from None


def loads_document(text: str, *, source: str = "results") -> ResultDocument:
    """Parse the text of a result file (see ``read_document``)."""
    if not text.strip():
        raise ResultError(f"{source}: file is empty (expected a tf-grpc-bench result document)")
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        if not text[error.pos :].strip():
            raise ResultError(
                f"{source}: result document is truncated (JSON ends early at line "
                f"{error.lineno} column {error.colno})"
            ) from None
        raise ResultError(
            f"{source}: result document is not valid JSON ({error.msg} at line "
            f"{error.lineno} column {error.colno})"
        ) from None
    except ValueError as error:
        raise ResultError(f"{source}: result document is not valid JSON ({error})") from None
    return document_from_json_dict(data, source=source)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def read_document(path: str | os.PathLike[str]) -> ResultDocument:
    """Read and validate the result document at ``path``.

    Every error is a ``ResultError`` whose one-line message names the file:
    missing, empty, truncated, not JSON, not a result document, an unknown
    format version (``UnsupportedResultVersionError``), or a field missing or
    of the wrong type (named by its path in the document).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultError(f"{path}: no such result file") from None
    except IsADirectoryError:
        raise ResultError(f"{path}: is a directory, expected a result file") from None
    except PermissionError:
        raise ResultError(f"{path}: permission denied") from None
    except UnicodeDecodeError:
        raise ResultError(f"{path}: result document is corrupt (not UTF-8 text)") from None
    except OSError as error:
        raise ResultError(f"{path}: cannot read ({error.strerror or error})") from None
    return loads_document(text, source=str(path))


# --------------------------------------------------------------------------
# Run directories.


def discard_run_directory(run_directory: Path, *, base_existed: bool) -> None:
    """Remove a run directory that holds no results (nothing was measured), and its
    base directory too when ``new_run_directory`` made it and it is now empty."""
    shutil.rmtree(run_directory, ignore_errors=True)
    if not base_existed:
        with contextlib.suppress(OSError):
            run_directory.parent.rmdir()


def new_run_directory(
    base: str | os.PathLike[str], label: str = "", *, now: datetime | None = None
) -> Path:
    """Create and return a new directory ``base/<UTC timestamp>[-<label>]``.

    The timestamp reads ``20261129T174552Z`` so directories sort by time; the
    label is reduced to file-name-safe characters.  If the name is taken
    (two runs in the same second), ``-2``, ``-3``, ... is appended; creation
    is atomic, so concurrent callers never share a directory.  Raises
    ``ResultError`` if ``base`` cannot be created or written.
    """
    base = Path(base)
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    stem = moment.strftime("%Y%m%dT%H%M%SZ")
    safe = _safe_name(label)
    if safe:
        stem = f"{stem}-{safe}"
    try:
        base.mkdir(parents=True, exist_ok=True)
        for number in range(1, 10_000):
            candidate = base / (stem if number == 1 else f"{stem}-{number}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return candidate
    except OSError as error:
        raise ResultError(
            f"{base}: cannot create a run directory ({error.strerror or error})"
        ) from None
    raise ResultError(f"{base}: cannot create a run directory (too many named {stem!r})")
