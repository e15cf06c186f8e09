"""Result documents from JSON: the one place result files are parsed.

``read_document`` refuses a format version it does not know.  Statistics in
the file are not read back: they are recomputed from the raw samples, so a
document read back is exactly the ``BenchmarkResult`` objects that were
written.  Pure except ``read_document``, which reads a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tf_grpc_bench
from tf_grpc_bench.errors import ResultError, UnsupportedResultVersionError
from tf_grpc_bench.files import loads_json
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    InexactSizes,
    RunMeasurement,
)
from tf_grpc_bench.replay.core.whatif import Derivation
from tf_grpc_bench.replay.output.document import (
    FORMAT,
    READABLE_VERSIONS,
    SAMPLE_COLUMNS_BY_VERSION,
    ParameterValue,
    ResultDocument,
    TraceInfo,
)
from tf_grpc_bench.replay.output.machine import (
    InterfaceInfo,
    MachineInfo,
    NetworkInfo,
    RelayDirection,
)


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


def _trace_from_json(obj: dict[str, Any], where: str, version: int) -> TraceInfo:
    return TraceInfo(
        path=_str(obj, "path", where),
        sha256=_str(obj, "sha256", where),
        model=_str(obj, "model", where),
        strategy=_str(obj, "strategy", where),
        tensorflow_version=_str(obj, "tensorflow_version", where),
        format_version=_int(obj, "format_version", where),
        step_count=_int(obj, "step_count", where),
        partial_reason=_str(obj, "partial_reason", where) if version >= 7 else "",
    )


def _float(obj: Mapping[str, Any], key: str, where: str) -> float:
    value = _field(obj, key, where)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _Invalid(f"{where}.{key}: expected a number, got {json.dumps(value)[:40]}")
    return float(value)


_RELAY_COUNTS = (
    "delay_ns", "jitter_ns", "packets", "bytes", "queue_drops", "write_errors", "late_p50_ns",
    "late_p99_ns", "late_max_ns", "late_mean_ns",
)  # fmt: skip


def _relay_from_json(obj: dict[str, Any], where: str) -> RelayDirection:
    histogram = []
    for index, bucket in enumerate(_list(obj, "late_histogram", where)):
        if not (
            isinstance(bucket, list)
            and len(bucket) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in bucket)
        ):
            raise _Invalid(f"{where}.late_histogram[{index}]: expected [lower_ns, count]")
        histogram.append((bucket[0], bucket[1]))
    return RelayDirection(
        link=_str(obj, "link", where),
        direction=_str(obj, "direction", where),
        **{key: _int(obj, key, where) for key in _RELAY_COUNTS},
        late_histogram=tuple(histogram),
        behind=_str(obj, "behind", where),
    )


def _emulation_from_json(obj: dict[str, Any], where: str, version: int) -> dict[str, Any]:
    """A version 6 network's delay, jitter, loss and relays (none before version 6)."""
    if version < 6:
        return {}
    relays = []
    for index, item in enumerate(_list(obj, "relays", where)):
        if not isinstance(item, dict):
            raise _Invalid(f"{where}.relays[{index}]: expected an object")
        relays.append(_relay_from_json(item, f"{where}.relays[{index}]"))
    return {
        "emulated_delay_ns": _int(obj, "emulated_delay_ns", where),
        "emulated_jitter_ns": _int(obj, "emulated_jitter_ns", where),
        "emulated_loss": _float(obj, "emulated_loss", where),
        "relays": tuple(relays),
    }


def _network_from_json(obj: dict[str, Any], where: str, version: int) -> NetworkInfo:
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
        **_emulation_from_json(obj, where, version),
    )


def _run_from_json(obj: dict[str, Any], where: str, version: int) -> RunMeasurement:
    samples_obj = _object(obj, "samples", where)
    at = f"{where}.samples"
    count = _int(samples_obj, "count", at)
    names = SAMPLE_COLUMNS_BY_VERSION[version]
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
            trace=None if trace is None else _trace_from_json(trace, "trace", version),
            network=None if network is None else _network_from_json(network, "network", version),
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
        data = loads_json(text, parse_constant=_refuse_constant)
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
