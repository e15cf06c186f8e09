"""``tf-grpc-bench engine``: which replay engines this host has; ``engine build`` builds
the gRPC C++ one now (as its first use would)."""

from __future__ import annotations

import argparse
import sys

from tf_grpc_bench.command import Command
from tf_grpc_bench.replay.native.build import EngineUnavailable, build_engine, engine_status


def configure_engine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=("status", "build"),
        default="status",
        help="status (default): say what is built and where; build: build the gRPC C++ "
        "engine now (about a minute; cached until its sources or gRPC C++ change)",
    )


def describe_engines() -> list[str]:
    """One line per engine: what it runs on, whether it is ready, where."""
    import grpc

    lines = [f"grpcio: gRPC {grpc.__version__} through its Python binding; always available"]
    status = engine_status()
    if status.built:
        lines.append(f"grpc-cpp: built with gRPC C++ {status.library_version}: {status.path}")
    elif status.problem:
        lines.append(f"grpc-cpp: unavailable: {status.problem}")
    else:
        lines.append(
            f"grpc-cpp: not built yet (gRPC C++ {status.library_version} found; "
            "'tf-grpc-bench engine build' builds it, as does its first use)"
        )
    chosen = "grpc-cpp" if not status.problem else "grpcio"
    lines.append(f"--engine auto takes {chosen}")
    return lines


def run_engine(args: argparse.Namespace) -> int:
    if args.action == "build":
        status = engine_status()
        if status.problem:
            raise EngineUnavailable(status.problem)
        if not status.built:
            sys.stderr.write("building the gRPC C++ engine (about a minute)...\n")
        build_engine()
    for line in describe_engines():
        print(line)
    return 0


#: ``tf-grpc-bench engine``.
COMMANDS = (
    Command(
        name="engine",
        help="the replay engines this host has; 'engine build' builds the gRPC C++ one",
        add_arguments=configure_engine,
        run=run_engine,
    ),
)
