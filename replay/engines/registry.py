"""The replay engines, by name (``--engine NAME``).

A built-in engine is a line of ``BUILT_IN``: its name and a function that
imports its module only when it is asked for (a native engine may build
itself on first use) and makes it; ``register_engine`` adds one from
elsewhere (a test's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tf_grpc_bench.errors import UsageError
from tf_grpc_bench.replay.transport.seam import Engine

#: ``--engine auto``: grpc-cpp where it builds, grpcio elsewhere (``resolve_auto``).
AUTO = "auto"


def _grpcio() -> Engine:
    from tf_grpc_bench.replay.engines import grpcio

    return grpcio.GrpcioEngine()


def _grpc_cpp() -> Engine:
    from tf_grpc_bench.replay.engines import grpc_cpp

    return grpc_cpp.GrpcCppEngine()


#: Built-in engines: name -> what makes it.
BUILT_IN: dict[str, Callable[[], Engine]] = {
    "grpcio": _grpcio,
    "grpc-cpp": _grpc_cpp,
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
    return (*BUILT_IN, *_REGISTERED, AUTO)


def check_engine_name(name: str) -> None:
    """UsageError naming ``--engine`` for an engine nobody registered."""
    if name not in engine_names():
        raise UsageError(f"--engine {name!r}: expected one of {', '.join(engine_names())}")


def engine_named(name: str) -> Engine:
    """The engine called ``name`` (``auto``: ``resolve_auto``'s); UsageError for none."""
    check_engine_name(name)
    if name == AUTO:
        name = resolve_auto(lambda line: None)
    return {**BUILT_IN, **_REGISTERED}[name]()


def resolve_auto(say: Callable[[str], None]) -> str:
    """The engine ``--engine auto`` takes on this host: grpc-cpp when it builds here (built
    now if it is not yet), grpcio otherwise; ``say`` gets one line saying which and why."""
    from tf_grpc_bench.replay.native.build import EngineUnavailable, build_engine, engine_status

    status = engine_status()
    if not status.problem:
        if not status.built:
            say("engine: building the gRPC C++ engine for --engine auto (once, about a minute)")
        try:
            build_engine()
        except EngineUnavailable as error:
            status = replace(status, problem=str(error))
    if status.problem:
        say(f"engine: grpcio (--engine auto; grpc-cpp is not available: {status.problem})")
        return "grpcio"
    say(f"engine: grpc-cpp (--engine auto; gRPC C++ {status.library_version})")
    return "grpc-cpp"
