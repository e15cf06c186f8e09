"""Native parts built on first use from C source the package ships, and cached.

A native part (the in-process recorder's library ``profiler/recorders/wiretap.c``,
the link relay ``netns/relay.c``) is compiled with the system's C compiler the
first time it is needed and kept in a cache directory
(``$XDG_CACHE_HOME/tf-grpc-bench``, else ``~/.cache/tf-grpc-bench``).  The cached
file's name carries a hash of the source and the compiler flags, so an edited
source is rebuilt and an unchanged one never is.  What needs no compiler keeps
working without one: each caller says what the user can do instead.

Safe to call from several processes at once: the output is written to a
temporary name and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from absl import logging

from tf_grpc_bench.errors import BenchError


@dataclass(frozen=True, slots=True, kw_only=True)
class NativeSource:
    """One native part: its source, how it is compiled, and what to tell a user without
    a compiler."""

    #: Short name, the cached file's prefix (``wiretap``, ``relay``).
    name: str
    source: Path
    #: ``shared`` for a library loaded into other processes, ``executable`` for a program.
    kind: str
    #: Flags after the source file (libraries to link).
    link_flags: tuple[str, ...] = ()
    #: What the part is, for messages: "the in-process recorder (--recorder preload)".
    purpose: str = ""
    #: What works without a compiler, for messages: "--recorder proxy needs none".
    alternative: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("shared", "executable"):
            raise ValueError(f"kind must be 'shared' or 'executable', got {self.kind!r}")
        if not self.name or "/" in self.name:
            raise ValueError(f"bad native part name {self.name!r}")

    @property
    def compile_flags(self) -> tuple[str, ...]:
        shared = ("-fPIC", "-shared") if self.kind == "shared" else ()
        return ("-O2", "-Wall", *shared)


def cache_directory() -> Path:
    """Where built native parts are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tf-grpc-bench"


def find_compiler() -> str | None:
    """``$CC``, else ``cc`` or ``gcc`` on the PATH, else None."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def built_path(part: NativeSource, directory: Path) -> Path:
    """The cached file ``part`` builds to in ``directory`` (named by a hash of its
    source and flags)."""
    digest = hashlib.sha256(part.source.read_bytes())
    digest.update("\0".join((*part.compile_flags, *part.link_flags)).encode())
    suffix = ".so" if part.kind == "shared" else ""
    return directory / f"{part.name}-{digest.hexdigest()[:16]}{suffix}"


def build(
    part: NativeSource,
    *,
    error: type[BenchError],
    cache: Path | None = None,
) -> Path:
    """The compiled ``part``, built now if it is not in the cache yet (blocking).

    ``error`` is the exception raised, in one line naming the compiler's first
    complaint and ``part.alternative``, when no compiler is found or the build
    fails.
    """
    directory = cache or cache_directory()
    target = built_path(part, directory)
    if target.is_file():
        return target
    alternative = f" ({part.alternative})" if part.alternative else ""
    compiler = find_compiler()
    if not compiler:
        raise error(
            f"{part.purpose} needs a C compiler to be built, and none was found "
            f"(set CC, or install gcc){alternative}"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as failure:
        raise error(f"cache directory {directory}: {failure.strerror}") from None
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    command = [
        compiler,
        *part.compile_flags,
        "-o",
        str(temporary),
        str(part.source),
        *part.link_flags,
    ]
    try:
        built = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as failure:
        raise error(
            f"cannot run the C compiler {compiler} ({failure.strerror}): {part.purpose} "
            f"needs one to be built; set CC or install gcc{alternative}"
        ) from None
    if built.returncode != 0:
        temporary.unlink(missing_ok=True)
        first = (built.stderr.strip().splitlines() or ["no output"])[0]
        raise error(f"building {part.purpose} with {compiler} failed: {first}{alternative}")
    os.replace(temporary, target)
    logging.info("built %s: %s", part.purpose, target)
    return target
