"""Trace files on disk: reading and writing them by path, their hashes, the shipped traces.

The format itself (schema, versions, validation, encoding over a caller's file
object) is ``tf_grpc_bench.trace``; this module is the thin layer that opens
files, maps file-system errors to ``TraceError`` and finds the traces shipped
with the package.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import io
import json
import os
import stat
from pathlib import Path
from typing import IO

from tf_grpc_bench.errors import TraceError
from tf_grpc_bench.files import write_atomically
from tf_grpc_bench.trace import SUFFIX, Trace
from tf_grpc_bench.trace_format import MAX_TRACE_BYTES, dump_trace, load_trace
from tf_grpc_bench.trace_json import trace_to_json_dict

#: The shipped trace that ``replay`` uses when it is given none.
DEFAULT_TRACE = "resnet50-tf2ps.tfgbtrace"


#: The bytes of traces read from a pipe or another file that can be read only once
#: (``<(cat trace)``), by the path given: a replay reads its trace more than once (to
#: plan, to hash, to draw), and a second read of a pipe finds it empty.  Only the
#: main thread reads traces.
_READ_ONCE: dict[str, bytes] = {}


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return True  # the open below says what is wrong


def _open(path: Path) -> IO[bytes]:
    """The trace's bytes as a stream: a regular file opened, anything else read once."""
    if _is_regular(path):
        return path.open("rb")
    key = str(path)
    if key not in _READ_ONCE:
        with path.open("rb") as stream:
            # One byte past the limit, so that load_trace still refuses an oversized trace.
            _READ_ONCE[key] = stream.read(MAX_TRACE_BYTES + 1)
    return io.BytesIO(_READ_ONCE[key])


def _os_error(path: Path, error: OSError) -> TraceError:
    if isinstance(error, FileNotFoundError):
        return TraceError(f"{path}: no such trace file")
    if isinstance(error, IsADirectoryError):
        return TraceError(f"{path}: is a directory, expected a trace file")
    if isinstance(error, PermissionError):
        return TraceError(f"{path}: permission denied")
    return TraceError(f"{path}: cannot read ({error.strerror or error})")


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate the trace file at ``path`` (a pipe too: read once).

    Raises ``TraceError`` naming the path for anything unreadable or invalid.
    """
    path = Path(path)
    try:
        with _open(path) as stream:
            return load_trace(stream, source=str(path))
    except OSError as error:
        raise _os_error(path, error) from None


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` to ``path`` atomically (a reader never sees half a file).

    Raises ``TraceError`` naming the path if it cannot be written.
    """
    return write_atomically(
        path, lambda stream: dump_trace(trace, stream), error=TraceError, what="trace"
    )


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a trace file's bytes (recorded in results to identify the trace).

    A pipe is hashed from the bytes ``read_trace`` read.  Raises ``TraceError``.
    """
    path = Path(path)
    digest = hashlib.sha256()
    try:
        with _open(path) as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as error:
        raise _os_error(path, error) from None
    return digest.hexdigest()


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (not a pipe, which reads only once)."""
    return _is_regular(Path(path))


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
