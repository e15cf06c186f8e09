"""Building the gRPC C++ engine, and saying what is built and where.

The engine is compiled with the system's gRPC C++, found through
``pkg-config grpc++`` (Debian and Ubuntu: ``apt-get install libgrpc++-dev``;
conda-forge's ``grpc-cpp`` installs the same ``grpc++.pc``), into the native
cache (``tf_grpc_bench.native``) under a key of its sources' hash and the
library's version: a new source or an upgraded gRPC builds it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench import native
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.native import NativeSource

SOURCE_DIRECTORY = Path(__file__).with_name("engine")
#: The program's name in the cache.
PROGRAM = "tfgb-engine"
#: How to get the library, for the messages that say it is missing.
INSTALL_HINT = (
    "install gRPC C++: apt-get install libgrpc++-dev (Debian, Ubuntu), "
    "or conda install -c conda-forge grpc-cpp"
)
#: The pkg-config package the engine is compiled against.
PKG_CONFIG_PACKAGE = "grpc++"


class EngineUnavailable(ConfigError):
    """The gRPC C++ engine cannot be built here: no gRPC C++, or no compiler."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Library:
    """gRPC C++ as pkg-config describes it."""

    version: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]


#: What pkg-config is asked, side by side (each call takes seconds on a busy machine: grpc++
#: pulls in dozens of abseil packages).
_QUERIES = {
    "version": "--modversion",
    "compile": "--cflags",
    "link": "--libs",
    "libdir": "--variable=libdir",
    "pcfiledir": "--variable=pcfiledir",
}
#: Where pkg-config's answers are kept, with what makes them stale.
_ANSWERS_FILE = "grpc++-pkg-config.json"
_ENVIRONMENT = ("PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR")


def _ask_pkg_config() -> dict[str, str]:
    tool = shutil.which("pkg-config")
    if tool is None:
        raise EngineUnavailable(f"--engine grpc-cpp: pkg-config not found; {INSTALL_HINT}")
    running = {
        name: subprocess.Popen(
            [tool, flag, PKG_CONFIG_PACKAGE],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for name, flag in _QUERIES.items()
    }
    answers = {name: process.communicate()[0].strip() for name, process in running.items()}
    if any(process.returncode != 0 for process in running.values()):
        raise EngineUnavailable(f"--engine grpc-cpp: gRPC C++ not found; {INSTALL_HINT}")
    return answers


def _pc_file_stamp(answers: dict[str, str]) -> int:
    """When grpc++.pc last changed (an upgrade rewrites it); -1 if it is gone."""
    try:
        return (Path(answers["pcfiledir"]) / f"{PKG_CONFIG_PACKAGE}.pc").stat().st_mtime_ns
    except (KeyError, OSError):
        return -1


def _pkg_config_answers(cache_directory: Path | None) -> dict[str, str]:
    """pkg-config's answers about gRPC C++: kept in the native cache while grpc++.pc and
    pkg-config's environment stay as they were, asked again otherwise."""
    kept = (cache_directory or native.cache_directory()) / _ANSWERS_FILE
    environment = {name: os.environ.get(name, "") for name in _ENVIRONMENT}
    with contextlib.suppress(OSError, ValueError, TypeError):
        document = json.loads(kept.read_text(encoding="utf-8"))
        answers = dict(document["answers"])
        if document["environment"] == environment and document["stamp"] == _pc_file_stamp(answers):
            return answers
    answers = _ask_pkg_config()
    document = {"answers": answers, "environment": environment, "stamp": _pc_file_stamp(answers)}
    with contextlib.suppress(OSError):
        kept.parent.mkdir(parents=True, exist_ok=True)
        temporary = kept.with_name(f".{kept.name}.{os.getpid()}")
        temporary.write_text(json.dumps(document), encoding="utf-8")
        os.replace(temporary, kept)
    return answers


def find_library(cache_directory: Path | None = None) -> Library:
    """The system's gRPC C++; ``EngineUnavailable`` naming what to install if none."""
    answers = _pkg_config_answers(cache_directory)
    rpath = (f"-Wl,-rpath,{answers['libdir']}",) if answers["libdir"] else ()
    return Library(
        version=answers["version"],
        compile_flags=tuple(answers["compile"].split()),
        link_flags=(*answers["link"].split(), *rpath, "-pthread"),
    )


def engine_part(library: Library) -> NativeSource:
    """The engine program, as ``native.build`` takes it."""
    first, *others = sorted(SOURCE_DIRECTORY.glob("*.cc"))
    return NativeSource(
        name="grpc-cpp-engine",
        source=first,
        more_sources=tuple(others),
        headers=tuple(sorted(SOURCE_DIRECTORY.glob("*.h"))),
        kind="executable",
        language="c++",
        extra_compile_flags=("-std=c++17", *library.compile_flags),
        link_flags=library.link_flags,
        key=f"{PKG_CONFIG_PACKAGE} {library.version}",
        purpose="the gRPC C++ engine (--engine grpc-cpp)",
        alternative="--engine grpcio needs none",
    )


def build_engine(cache_directory: Path | None = None) -> Path:
    """The engine program, built now if not cached yet.  ``EngineUnavailable`` when gRPC
    C++ or a compiler is missing, or the build fails.

    One build at a time per cache: the processes of a ``role`` cluster started together
    on a host where it is not built yet (each taking ``--engine auto``) wait for the
    first one's build and use it, rather than each compiling it on the same cores."""
    library = find_library(cache_directory)
    part = engine_part(library)
    with _build_lock(cache_directory or native.cache_directory()):
        return native.build(part, error=EngineUnavailable, cache=cache_directory)


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory``'s engine build; none where it cannot be made (a
    read-only cache: the build then says so itself)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = (directory / f".{PROGRAM}.lock").open("a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStatus:
    """What ``tf-grpc-bench engine`` says of the gRPC C++ engine."""

    #: gRPC C++'s version, "" when it is not found.
    library_version: str
    #: Where the program is (or will be once built); None without gRPC C++.
    path: Path | None
    built: bool
    #: Why it cannot be built here ("" when it can).
    problem: str = ""


def engine_status(cache_directory: Path | None = None) -> EngineStatus:
    """Whether the engine is built here, where, against which gRPC C++; builds nothing."""
    try:
        library = find_library(cache_directory)
    except EngineUnavailable as error:
        return EngineStatus(library_version="", path=None, built=False, problem=str(error))
    path = native.built_path(engine_part(library), cache_directory or native.cache_directory())
    problem = ""
    if native.find_compiler("c++") is None and not path.is_file():
        problem = "--engine grpc-cpp: no C++ compiler to build it (install g++, or set CXX)"
    return EngineStatus(
        library_version=library.version, path=path, built=path.is_file(), problem=problem
    )
