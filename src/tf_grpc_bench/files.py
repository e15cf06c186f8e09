"""Writing the tool's documents to disk: one atomic writer for traces and results.

A reader (another replay, TensorBoard, a user's script) never sees half a file:
the bytes go to a temporary file in the target's directory, which then replaces
the target.  Every document gets the same file mode, the one an ordinary file
created under the process's umask gets (0644 under the usual 022), because
traces and results are documents to share, not secrets.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tf_grpc_bench.errors import BenchError


def _shareable_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def check_writable(path: str | os.PathLike[str], *, error: type[BenchError], what: str) -> Path:
    """Raise ``error`` now if ``path`` could not be written later; returns it as a ``Path``.

    Used before minutes of measuring or training, so that their results are not
    lost to an output path that was never writable.  Creates the parent folder.
    """
    path = Path(path)
    try:
        if path.is_dir():
            raise error(f"{path}: is a directory, expected a file name for the {what}")
        path.parent.mkdir(parents=True, exist_ok=True)
        exists = path.exists()
    except OSError as failure:
        raise error(
            f"{path.parent}: cannot create or enter the folder of the {what} "
            f"({failure.strerror or failure})"
        ) from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise error(f"{path.parent}: folder not writable, cannot write the {what} there")
    if exists and not os.access(path, os.W_OK):
        raise error(f"{path}: not writable, cannot replace the {what}")
    return path


def write_atomically(
    path: str | os.PathLike[str],
    write: Callable[[IO[bytes]], object],
    *,
    error: type[BenchError],
    what: str,
) -> Path:
    """Write a document to ``path`` through ``write(stream)``, atomically; returns the path.

    ``write`` receives a binary file object.  An ``OSError`` (no space, no
    permission, a directory in the way) becomes ``error`` with a one-line
    message naming the path and ``what`` was being written; any other
    exception propagates after the temporary file is removed.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
        )
    except OSError as failure:
        raise error(f"{path}: cannot write {what} ({failure.strerror or failure})") from None
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
        # mkstemp creates the file private (0600).
        os.chmod(temporary, _shareable_mode())
        os.replace(temporary, path)
    except OSError as failure:
        Path(temporary).unlink(missing_ok=True)
        raise error(f"{path}: cannot write {what} ({failure.strerror or failure})") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def loads_json(text: str | bytes, **options: Any) -> Any:
    """``json.loads``, but a document nested past Python's recursion limit raises
    ``json.JSONDecodeError`` (a ``ValueError``) like any other malformed JSON, not
    ``RecursionError``.  ``options`` go to ``json.loads``."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        document = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested too deeply", document, 0) from None
