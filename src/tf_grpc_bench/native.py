"""Native parts built on first use from C or C++ source the package ships, and cached.

A native part (the in-process recorder's library ``profiler/recorders/wiretap.c``,
the link relay ``netns/relay.c``, the gRPC C++ replay engine
``replay/native/engine/*.cc``) is compiled with the system's compiler the first
time it is needed and kept in a cache directory (``$XDG_CACHE_HOME/tf-grpc-bench``,
else ``~/.cache/tf-grpc-bench``).  The cached file's name carries a hash of the
sources, the headers they include, the compiler flags and whatever else decides
the result (``NativeSource.key``, e.g. a library's version), so an edited source
or an upgraded library is rebuilt and an unchanged one never is.  What needs no
compiler keeps working without one: each caller says what the user can do instead.

A part of several sources compiles them to objects side by side (one compiler
per core), then links.  Safe to call from several processes at once: the output
is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
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
    #: Sources compiled and linked with ``source`` (each to an object, side by side).
    more_sources: tuple[Path, ...] = ()
    #: Files the sources include: part of the cache key, not compiled.
    headers: tuple[Path, ...] = ()
    #: "c" (``$CC``, else cc, gcc) or "c++" (``$CXX``, else c++, g++).
    language: str = "c"
    #: Compile flags of the part's own (a language standard, a library's include flags).
    extra_compile_flags: tuple[str, ...] = ()
    #: What else decides the result (e.g. "grpc++ 1.51.1"): part of the cache key.
    key: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("shared", "executable"):
            raise ValueError(f"kind must be 'shared' or 'executable', got {self.kind!r}")
        if not self.name or "/" in self.name:
            raise ValueError(f"bad native part name {self.name!r}")
        if self.language not in _COMPILERS:
            raise ValueError(f"language must be 'c' or 'c++', got {self.language!r}")

    @property
    def compile_flags(self) -> tuple[str, ...]:
        shared = ("-fPIC", "-shared") if self.kind == "shared" else ()
        return ("-O2", "-Wall", *shared, *self.extra_compile_flags)

    @property
    def sources(self) -> tuple[Path, ...]:
        return (self.source, *self.more_sources)


#: Per language: the variable naming its compiler, the names tried on the PATH, a package.
_COMPILERS = {"c": ("CC", ("cc", "gcc"), "gcc"), "c++": ("CXX", ("c++", "g++"), "g++")}


def cache_directory() -> Path:
    """Where built native parts are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tf-grpc-bench"


def find_compiler(language: str = "c") -> str | None:
    """``$CC``, else ``cc`` or ``gcc`` on the PATH (C++: ``$CXX``, ``c++``, ``g++``), else None."""
    variable, names, _ = _COMPILERS[language]
    return os.environ.get(variable) or next(filter(None, map(shutil.which, names)), None)


def built_path(part: NativeSource, directory: Path) -> Path:
    """The cached file ``part`` builds to in ``directory`` (named by a hash of its
    sources, headers, flags and key)."""
    digest = hashlib.sha256(part.source.read_bytes())
    digest.update("\0".join((*part.compile_flags, *part.link_flags)).encode())
    for path in (*part.more_sources, *part.headers):
        digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    if part.key:
        digest.update(b"\0" + part.key.encode())
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
    compiler = find_compiler(part.language)
    variable, _, package = _COMPILERS[part.language]
    language = part.language.upper()
    if not compiler:
        raise error(
            f"{part.purpose} needs a {language} compiler to be built, and none was found "
            f"(set {variable}, or install {package}){alternative}"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as failure:
        raise error(f"cache directory {directory}: {failure.strerror}") from None
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        if part.more_sources:
            _compile_objects_then_link(part, compiler, temporary)
        else:
            _run(part, [[compiler, *part.compile_flags, "-o", str(temporary),
                         str(part.source), *part.link_flags]])  # fmt: skip
    except OSError as failure:
        raise error(
            f"cannot run the {language} compiler {compiler} ({failure.strerror}): "
            f"{part.purpose} needs one to be built; set {variable} or install "
            f"{package}{alternative}"
        ) from None
    except _Failed as failure:
        temporary.unlink(missing_ok=True)
        raise error(
            f"building {part.purpose} with {compiler} failed: {failure}{alternative}"
        ) from None
    os.replace(temporary, target)
    logging.info("built %s: %s", part.purpose, target)
    return target


class _Failed(Exception):
    """A compiler failed; the message is its first line of complaint."""


def _run(part: NativeSource, commands: Sequence[Sequence[str]]) -> None:
    """Run ``commands`` side by side; ``_Failed`` naming the first complaint of one that failed."""
    running = [
        subprocess.Popen(list(c), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for c in commands
    ]
    complaints = [process.communicate()[1] for process in running]
    for process, complaint in zip(running, complaints, strict=True):
        if process.returncode != 0:
            lines = complaint.strip().splitlines()
            errors = [line for line in lines if "error" in line.lower()]
            raise _Failed((errors or lines or ["no output"])[0].strip())


def _compile_objects_then_link(part: NativeSource, compiler: str, output: Path) -> None:
    """Each source to an object (as many at once as there are cores), then one link."""
    flags = [flag for flag in part.compile_flags if flag != "-shared"]
    with tempfile.TemporaryDirectory(prefix=f".{part.name}-", dir=output.parent) as scratch:
        objects = [Path(scratch) / f"{n}-{source.stem}.o" for n, source in enumerate(part.sources)]
        commands = [
            [compiler, *flags, "-c", str(source), "-o", str(obj)]
            for source, obj in zip(part.sources, objects, strict=True)
        ]
        width = max(os.cpu_count() or 1, 1)
        for first in range(0, len(commands), width):
            _run(part, commands[first : first + width])
        shared = ["-shared"] if part.kind == "shared" else []
        _run(part, [[compiler, *shared, "-o", str(output), *map(str, objects), *part.link_flags]])
