"""Run directories: one new directory per run, named by its UTC time, under a base."""

from __future__ import annotations

import contextlib
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.replay.output.document import safe_name


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
    safe = safe_name(label)
    if safe:
        stem = f"{stem}-{safe}"
    made = _missing_parents(base)
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
        _remove_empty(made)
        raise ResultError(
            f"{base}: cannot create a run directory ({error.strerror or error})"
        ) from None
    _remove_empty(made)
    raise ResultError(f"{base}: cannot create a run directory (too many named {stem!r})")


def _missing_parents(base: Path) -> list[Path]:
    """``base`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    for path in (base, *base.parents):
        try:
            if path.exists() or path.is_symlink():
                break
        except OSError:
            break
        missing.append(path)
    return missing


def _remove_empty(paths: list[Path]) -> None:
    """Remove the directories a failed ``new_run_directory`` made (deepest first)."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.rmdir()
