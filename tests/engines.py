"""The gRPC C++ engine's program for the tests: built once per session, or a skip saying why."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from tf_grpc_bench.replay.native.build import EngineUnavailable, build_engine


@functools.cache
def _built() -> Path | str:
    try:
        return build_engine()
    except EngineUnavailable as error:
        return str(error)


def grpc_cpp_program() -> Path:
    """The engine program (built on first use); skips the test where it cannot be built."""
    built = _built()
    if isinstance(built, str):
        pytest.skip(f"the gRPC C++ engine cannot be built here: {built}")
    return built
