"""Trace files on disk: reading and writing them by path, their hashes, the shipped traces.

The format itself (schema, versions, validation, encoding over a caller's file
object) is ``tf_grpc_bench.trace``; this module is the thin layer that opens
files, maps file-system errors to ``TraceError`` and finds the traces shipped
with the package.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from pathlib import Path
from typing import IO

from tf_grpc_bench.errors import TraceError
from tf_grpc_bench.files import write_atomically
from tf_grpc_bench.trace import SUFFIX, Trace, dump_trace, load_trace, trace_to_json_dict

#: The shipped trace that ``replay`` uses when it is given none.
DEFAULT_TRACE = "resnet50-tf2ps.tfgbtrace"


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate the trace file at ``path``."""
    path = Path(path)
    try:
        with path.open("rb") as stream:
            return load_trace(stream, source=str(path))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a trace file") from None
    except PermissionError:
        raise TraceError(f"{path}: permission denied") from None


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` to ``path`` atomically (a reader never sees half a file).

    Raises ``TraceError`` naming the path if it cannot be written.
    """
    return write_atomically(
        path, lambda stream: dump_trace(trace, stream), error=TraceError, what="trace"
    )


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes (recorded in results to identify the trace)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shipped_trace_names() -> list[str]:
    """File names of the traces shipped in ``tf_grpc_bench.traces``."""
    root = importlib.resources.files("tf_grpc_bench.traces")
    return sorted(entry.name for entry in root.iterdir() if entry.name.endswith(SUFFIX))


def shipped_trace_path(name: str) -> Path:
    """Path of a shipped trace, by file name with or without the suffix."""
    if not name.endswith(SUFFIX):
        name += SUFFIX
    resource = importlib.resources.files("tf_grpc_bench.traces").joinpath(name)
    if not resource.is_file():
        raise TraceError(
            f"no shipped trace named {name!r} "
            f"(shipped: {', '.join(shipped_trace_names()) or 'none'})"
        )
    return Path(str(resource))


def default_trace_path() -> Path | None:
    """The shipped trace the replay command uses by default, if it is shipped."""
    try:
        return shipped_trace_path(DEFAULT_TRACE)
    except TraceError:
        return None


def export_json(trace: Trace, stream: IO[str]) -> None:
    json.dump(trace_to_json_dict(trace), stream, indent=1)
    stream.write("\n")
