"""gRPC C++'s own bare echo (``grpc_cpp_echo.cc``), the floor the replay engines' round
trips are measured against: one generic-API unary call at a time from a C++ client to a
C++ echo server on one completion queue, nothing of the replay's in the way.

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


def round_trips_ns(size_bytes: int, seconds: float) -> tuple[np.ndarray, int]:
    """Back-to-back echoes of ``size_bytes`` for ``seconds`` (after as long again of
    warm-up): each round trip in ns, and the client's CPU time in ns."""
    program = build_echo()
    server = subprocess.Popen(
        [program, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        target = f"{LOOPBACK}:{port}"
        subprocess.run(
            [program, "ping", target, str(size_bytes), str(min(1.0, seconds / 4))],
            capture_output=True,
            check=True,
        )
        done = subprocess.run(
            [program, "ping", target, str(size_bytes), str(seconds)],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        stop_process(server)
    if done.returncode != 0:
        raise BenchError(f"the bare gRPC C++ echo failed: {done.stderr.strip()[:200]}")
    lines = done.stdout.split()
    cpu_ns = int(lines[lines.index("cpu_ns") + 1])
    times = np.array([int(v) for v in lines[: lines.index("cpu_ns")]], dtype=np.int64)
    return times, cpu_ns
