"""Building the gRPC C++ engine, and saying what is built and where.

The engine is compiled with the system's gRPC C++, found through
``pkg-config grpc++`` (Debian and Ubuntu: ``apt-get install libgrpc++-dev``;
conda-forge's ``grpc-cpp`` installs the same ``grpc++.pc``), into the native
cache (``tf_grpc_bench.native``) under a key of its sources' hash and the
library's version: a new source or an upgraded gRPC builds it again.
"""

from __future__ import annotations

import shutil
import subprocess
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


def _pkg_config(*arguments: str) -> str:
    tool = shutil.which("pkg-config")
    if tool is None:
        raise EngineUnavailable(f"--engine grpc-cpp: pkg-config not found; {INSTALL_HINT}")
    done = subprocess.run(
        [tool, *arguments, PKG_CONFIG_PACKAGE], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise EngineUnavailable(f"--engine grpc-cpp: gRPC C++ not found; {INSTALL_HINT}")
    return done.stdout.strip()


def find_library() -> Library:
    """The system's gRPC C++; ``EngineUnavailable`` naming what to install if none."""
    version = _pkg_config("--modversion")
    library_directory = _pkg_config("--variable=libdir")
    rpath = (f"-Wl,-rpath,{library_directory}",) if library_directory else ()
    return Library(
        version=version,
        compile_flags=tuple(_pkg_config("--cflags").split()),
        link_flags=(*_pkg_config("--libs").split(), *rpath, "-pthread"),
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
    C++ or a compiler is missing, or the build fails."""
    return native.build(engine_part(find_library()), error=EngineUnavailable, cache=cache_directory)


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
        library = find_library()
    except EngineUnavailable as error:
        return EngineStatus(library_version="", path=None, built=False, problem=str(error))
    path = native.built_path(engine_part(library), cache_directory or native.cache_directory())
    problem = ""
    if native.find_compiler("c++") is None and not path.is_file():
        problem = "--engine grpc-cpp: no C++ compiler to build it (install g++, or set CXX)"
    return EngineStatus(
        library_version=library.version, path=path, built=path.is_file(), problem=problem
    )
