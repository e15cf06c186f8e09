"""Result documents to JSON: the object ``docs/results.md`` describes, and its file.

The derived ``statistics`` objects are written for other tools and for people
reading the file; ``document_reader`` recomputes them from the raw samples.
Pure except ``write_document``, which writes a file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.files import write_atomically
from tf_grpc_bench.replay.core.measurement import (
    SAMPLE_COLUMNS,
    BenchmarkResult,
    InexactSizes,
    LatencySummary,
    RunMeasurement,
)
from tf_grpc_bench.replay.core.whatif import Derivation
from tf_grpc_bench.replay.output.document import FORMAT, ResultDocument
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.prediction import prediction_json
from tf_grpc_bench.replay.output.statistics import cpu_utilization, run_statistics


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


def _network_json(network: NetworkInfo) -> dict[str, Any]:
    return {
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
        "emulated_delay_ns": network.emulated_delay_ns,
        "emulated_jitter_ns": network.emulated_jitter_ns,
        "emulated_loss": network.emulated_loss,
        "relays": [
            {
                "link": relay.link,
                "direction": relay.direction,
                "delay_ns": relay.delay_ns,
                "jitter_ns": relay.jitter_ns,
                "packets": relay.packets,
                "bytes": relay.bytes,
                "queue_drops": relay.queue_drops,
                "write_errors": relay.write_errors,
                "late_p50_ns": relay.late_p50_ns,
                "late_p99_ns": relay.late_p99_ns,
                "late_max_ns": relay.late_max_ns,
                "late_mean_ns": relay.late_mean_ns,
                "late_histogram": [list(bucket) for bucket in relay.late_histogram],
                "behind": relay.behind,
            }
            for relay in network.relays
        ],
    }


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
            "partial_reason": trace.partial_reason,
        },
        "network": None if network is None else _network_json(network),
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
