"""gRPC C++'s own bare echo and push (``grpc_cpp_echo.cc``), the floors the replay engines'
round trips and bandwidth are measured against: one generic-API call at a time from a C++
client to a C++ server on one completion queue, nothing of the replay's in the way.  The
server keeps freed message buffers as the replay's servers do by default
(``ServerSettings.keep_freed_memory``), so that the floor and the replay allocate alike.

Built on first use with the system's gRPC C++, as the gRPC C++ engine is
(``replay/native/build.py``).  Used by ``replay_vs_raw.py``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from common import LOOPBACK, stop_process

from tf_grpc_bench import native
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.replay.native.build import EngineUnavailable, find_library
from tf_grpc_bench.replay.transport.wire import KEPT_ALLOCATION_BYTES

SOURCE = Path(__file__).with_name("grpc_cpp_echo.cc")


def build_echo() -> Path:
    """The bare echo program (built now if not cached); ``EngineUnavailable`` without gRPC C++."""
    library = find_library()
    part = native.NativeSource(
        name="grpc-cpp-echo",
        source=SOURCE,
        kind="executable",
        language="c++",
        extra_compile_flags=("-std=c++17", *library.compile_flags),
        link_flags=library.link_flags,
        key=f"grpc++ {library.version}",
        purpose="the bare gRPC C++ echo (bench/grpc_cpp_echo.cc)",
    )
    return native.build(part, error=EngineUnavailable)


def _run_against_server(*arguments: str, seconds: float) -> str:
    """``grpc_cpp_echo ARGUMENT[0] TARGET ARGUMENTS[1:]`` against a server of its own, after
    a warm-up of a quarter of ``seconds`` (at most 1 s); its output."""
    program = build_echo()
    server = subprocess.Popen(
        [program, "serve", str(KEPT_ALLOCATION_BYTES)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    verb, size, *rest = arguments
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        target = f"{LOOPBACK}:{port}"
        subprocess.run(
            [program, verb, target, size, str(min(1.0, seconds / 4)), *rest],
            capture_output=True,
            check=True,
        )
        done = subprocess.run(
            [program, verb, target, size, str(seconds), *rest],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        stop_process(server)
    if done.returncode != 0:
        raise BenchError(f"the bare gRPC C++ {verb} failed: {done.stderr.strip()[:200]}")
    return done.stdout


def push_bandwidth(size_bytes: int, seconds: float, *, streamed: bool) -> tuple[float, int]:
    """Pushes of ``size_bytes``, each sent once the last one's 8-byte ack is in (unary
    calls, or messages on one stream, as the replay's P2P bandwidth makes them), for
    ``seconds``: payload MB (10**6 bytes) per second, and the client's CPU time in ns."""
    output = _run_against_server(
        "push", str(size_bytes), "stream" if streamed else "unary", seconds=seconds
    )
    fields = dict(line.split() for line in output.splitlines())
    return int(fields["bytes"]) / (int(fields["wall_ns"]) / 1e9) / 1e6, int(fields["cpu_ns"])


def round_trips_ns(size_bytes: int, seconds: float) -> tuple[np.ndarray, int]:
    """Back-to-back echoes of ``size_bytes`` for ``seconds`` (after as long again of
    warm-up): each round trip in ns, and the client's CPU time in ns."""
    output = _run_against_server("ping", str(size_bytes), seconds=seconds)
    lines = output.split()
    cpu_ns = int(lines[lines.index("cpu_ns") + 1])
    times = np.array([int(v) for v in lines[: lines.index("cpu_ns")]], dtype=np.int64)
    return times, cpu_ns
