"""The replay engines, by name (``--engine NAME``).

A built-in engine is a line of ``BUILT_IN``: its name and a function that
imports its module only when it is asked for (a native engine may build
itself on first use) and makes it; ``register_engine`` adds one from
elsewhere (a test's).
"""

from __future__ import annotations

from collections.abc import Callable

from tf_grpc_bench.errors import UsageError
from tf_grpc_bench.replay.transport.seam import Engine

#: The engine unless ``--engine`` names another.
DEFAULT_ENGINE = "grpcio"


def _grpcio() -> Engine:
    from tf_grpc_bench.replay.engines import grpcio

    return grpcio.GrpcioEngine()


#: Built-in engines: name -> what makes it.
BUILT_IN: dict[str, Callable[[], Engine]] = {
    "grpcio": _grpcio,
}
_REGISTERED: dict[str, Callable[[], Engine]] = {}


def register_engine(name: str, factory: Callable[[], Engine]) -> None:
    """Add an engine; ValueError if the name is taken."""
    if name in BUILT_IN or name in _REGISTERED:
        raise ValueError(f"an engine named {name!r} is already registered")
    _REGISTERED[name] = factory


def withdraw_engine(name: str) -> None:
    _REGISTERED.pop(name, None)


def engine_names() -> tuple[str, ...]:
    return (*BUILT_IN, *_REGISTERED)


def check_engine_name(name: str) -> None:
    """UsageError naming ``--engine`` for an engine nobody registered."""
    if name not in BUILT_IN and name not in _REGISTERED:
        raise UsageError(f"--engine {name!r}: expected one of {', '.join(engine_names())}")


def engine_named(name: str) -> Engine:
    """The engine called ``name``; UsageError for none."""
    check_engine_name(name)
    return {**BUILT_IN, **_REGISTERED}[name]()
