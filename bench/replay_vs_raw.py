"""Replay against raw TCP on loopback, side by side in one run.

Measures, one after the other on 127.0.0.1:

1. iperf3, one TCP stream: the link's bandwidth (``iperf3 -s -1`` / ``iperf3 -c -J``);
2. raw TCP round trips: ``sockperf ping-pong --tcp`` (10 B and 10 KiB; sockperf
   caps messages just under 1 MiB) and a small blocking-socket ping-pong of our
   own with TCP_NODELAY (10 B, 10 KiB, 1 MiB);
3. gRPC's own floors: a bare grpcio echo and push (Python), and gRPC C++'s bare
   generic-API echo and push, streamed and unary (``grpc_cpp_echo.cc``, built on
   first use with the system's gRPC C++; left out, said so, where there is none):
   what gRPC C++ itself reaches with the replay's call pattern, to tell its own
   share of a gap to iperf3 from the engine's;
4. our replay with each engine (grpcio, and grpc-cpp where it builds), through
   the library the ``replay`` command uses: P2P bandwidth with 1 MiB and 10 MiB
   messages, P2P latency with 10 B, 10 KiB and 1 MiB messages (one buffer per
   payload, so the message is exactly that size), with the client's CPU per call;

then prints the ratios and rewrites the "Replay against raw TCP" section of
``bench/README.md`` with the command, the machine, the load, the figures and
the ratios.  Only figures measured in this run are written.

Run from the repository root::

    .venv/bin/python bench/replay_vs_raw.py            # 5 s per measurement
    .venv/bin/python bench/replay_vs_raw.py --seconds 2 --no-readme

iperf3 and sockperf come from the distribution: ``apt-get install -y iperf3 sockperf``.
A missing tool is reported and its rows are left out, not guessed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from common import (
    INSTALL_HINT,
    KIB,
    LOOPBACK,
    MIB,
    README,
    SOCKPERF_MIN_BYTES,
    command_line,
    iperf3_loopback,
    load_average,
    machine_line,
    server_process,
    size_name,
    sockperf_loopback,
    table_head,
    write_section,
)

from tf_grpc_bench.errors import BenchError

SECTION = "## Replay against raw TCP"

#: Message sizes of the round-trip comparison (the paper's default Small/Medium/Large).
#: sockperf's 10 B row is measured at its smallest message, ``SOCKPERF_MIN_BYTES``.
ROUND_TRIP_SIZES = (10, 10 * KIB, MIB)
#: Message sizes of the bandwidth comparison.
BANDWIDTH_SIZES = (MIB, 10 * MIB)


# --------------------------------------------------------------------------
# Figures.


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundTrip:
    """Round-trip times of one message size, in microseconds."""

    tool: str
    size_bytes: int
    #: 1: measured before the replay, 2: after it (raw baselines are measured twice).
    pass_index: int
    p50_us: float
    p99_us: float
    mean_us: float
    count: int
    #: The calling process's CPU time per round trip (client side), where measured.
    client_cpu_us: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Bandwidth:
    tool: str
    size_bytes: int
    pass_index: int
    #: MB = 10**6 bytes, payload bytes moved per second.
    mb_per_s: float


@dataclass(slots=True, kw_only=True)
class Figures:
    bandwidth: list[Bandwidth] = field(default_factory=list)
    round_trips: list[RoundTrip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def best_bandwidth(self, tool: str, size_bytes: int = 0) -> Bandwidth | None:
        """The highest bandwidth of ``tool`` over the passes."""
        found = [b for b in self.bandwidth if b.tool == tool and b.size_bytes == size_bytes]
        return max(found, key=lambda b: b.mb_per_s, default=None)

    def best_round_trip(self, tool: str, size_bytes: int) -> RoundTrip | None:
        """The round trip of ``tool`` with the lowest median over the passes."""
        found = [r for r in self.round_trips if r.tool == tool and r.size_bytes == size_bytes]
        return min(found, key=lambda r: r.p50_us, default=None)


# --------------------------------------------------------------------------
# iperf3.


def measure_iperf3(seconds: float, pass_index: int) -> Bandwidth:
    """One TCP stream, client to server, for ``seconds``; bits/s as the receiver counted them."""
    bits_per_s = iperf3_loopback(seconds)
    return Bandwidth(
        tool="iperf3", size_bytes=0, pass_index=pass_index, mb_per_s=bits_per_s / 8 / 1e6
    )


# --------------------------------------------------------------------------
# sockperf.


def measure_sockperf(sizes: Sequence[int], seconds: float, pass_index: int) -> list[RoundTrip]:
    """``sockperf ping-pong --tcp --full-rtt`` against ``sockperf server``, one size at a time."""
    return [
        RoundTrip(tool="sockperf", pass_index=pass_index, **dataclasses.asdict(found))
        for found in sockperf_loopback(sizes, seconds)
    ]


# --------------------------------------------------------------------------
# Our own socket ping-pong: blocking sockets, TCP_NODELAY, no framing beyond
# a 4-byte size sent once per connection.


def _receive_exactly(connection: socket.socket, view: memoryview) -> bool:
    received = 0
    while received < len(view):
        count = connection.recv_into(view[received:])
        if count == 0:
            return False
        received += count
    return True


def _echo_server(listener: socket.socket) -> None:
    """Serve connections one after another until the listener is closed."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            header = bytearray(4)
            if not _receive_exactly(connection, memoryview(header)):
                continue
            (size,) = struct.unpack("<I", header)
            buffer = bytearray(size)
            view = memoryview(buffer)
            while _receive_exactly(connection, view):
                connection.sendall(view)


def _serve_forever(connection: Any) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, 0))
    listener.listen(1)
    connection.send(listener.getsockname()[1])
    _echo_server(listener)


def measure_socket_ping_pong(
    sizes: Sequence[int], seconds: float, pass_index: int
) -> list[RoundTrip]:
    """Round trips of ``size`` bytes each way through a Python echo server in another process."""
    with server_process(_serve_forever, what="the ping-pong server", timeout_s=30) as (port, _):
        return [_ping_pong(port, size, seconds, pass_index) for size in sizes]


def _ping_pong(port: int, size: int, seconds: float, pass_index: int) -> RoundTrip:
    message = os.urandom(size)
    answer = bytearray(size)
    view = memoryview(answer)
    with socket.create_connection((LOOPBACK, port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.sendall(struct.pack("<I", size))

        def exchange() -> None:
            connection.sendall(message)
            if not _receive_exactly(connection, view):
                raise RuntimeError("the ping-pong server closed the connection")

        samples = _timed_loop(exchange, seconds)
    if answer != message:
        raise RuntimeError("the ping-pong server answered different bytes")
    return _round_trip("python socket", size, pass_index, samples)


def _timed_loop(call: Callable[[], object], seconds: float) -> list[int]:
    """Durations (ns) of back-to-back calls for ``seconds``, after a short warm-up."""
    clock = time.perf_counter_ns
    warm_until = clock() + int(min(1.0, seconds / 4) * 1e9)
    while clock() < warm_until:
        call()
    samples = []
    stop = clock() + int(seconds * 1e9)
    while clock() < stop:
        start = clock()
        call()
        samples.append(clock() - start)
    return samples


def _round_trip(tool: str, size: int, pass_index: int, samples_ns: Sequence[int]) -> RoundTrip:
    values = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return RoundTrip(
        tool=tool,
        size_bytes=size,
        pass_index=pass_index,
        p50_us=float(np.percentile(values, 50)),
        p99_us=float(np.percentile(values, 99)),
        mean_us=float(values.mean()),
        count=len(samples_ns),
    )


# --------------------------------------------------------------------------
# Bare grpcio: the least a Python gRPC client and server can do (unary calls,
# raw bytes, no serializers, a server in its own process), to tell grpcio's own
# cost from what the replay adds on top of it.

_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 64 * MIB),
    ("grpc.max_receive_message_length", 64 * MIB),
]


def _serve_grpc(connection: Any) -> None:
    from concurrent import futures

    import grpc

    def echo(request: bytes, context: Any) -> bytes:
        return request

    def push(request: bytes, context: Any) -> bytes:
        return struct.pack("<Q", len(request))

    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Push": grpc.unary_unary_rpc_method_handler(push),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=_GRPC_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench", handlers),))
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    server.start()
    connection.send(port)
    server.wait_for_termination()


def measure_bare_grpc(
    round_trip_sizes: Sequence[int], bandwidth_sizes: Sequence[int], seconds: float
) -> tuple[list[RoundTrip], list[Bandwidth]]:
    import grpc

    trips, bandwidths = [], []
    with (
        server_process(_serve_grpc, what="the bare grpcio server") as (port, _),
        grpc.insecure_channel(f"{LOOPBACK}:{port}", options=_GRPC_OPTIONS) as channel,
    ):
        echo = channel.unary_unary("/bench/Echo", None, None)
        push = channel.unary_unary("/bench/Push", None, None)
        for size in round_trip_sizes:
            message = os.urandom(size)
            samples = _timed_loop(functools.partial(echo, message), seconds)
            trips.append(_round_trip("bare grpcio", size, 1, samples))
        for size in bandwidth_sizes:
            message = os.urandom(size)
            samples = _timed_loop(functools.partial(push, message), seconds)
            moved = len(samples) * (size + 8)
            bandwidths.append(
                Bandwidth(
                    tool="bare grpcio",
                    size_bytes=size,
                    pass_index=1,
                    mb_per_s=moved / (sum(samples) / 1e9) / 1e6,
                )
            )
    return trips, bandwidths


# --------------------------------------------------------------------------
# Our replay.


#: Replay configurations of the bandwidth comparison: (tool name, RPC kind,
#: calls in flight); None means what ``tf-grpc-bench replay`` does by default
#: (streaming, one message at a time, for synthetic P2P bandwidth: see
#: ``runner.default_rpc`` and ``docs/performance.md``).  "replay, unary" is the
#: paper's one unary call at a time.
BANDWIDTH_VARIANTS: tuple[tuple[str, str | None, int | None], ...] = (
    ("replay", None, None),
    ("replay, unary", "unary", 1),
    ("replay, streaming, 4 in flight", "streaming", 4),
)
#: Replay configurations of the round-trip comparison: the default (unary calls)
#: and the streaming ping-pong (one message each way per round trip).
ROUND_TRIP_VARIANTS: tuple[tuple[str, str | None], ...] = (
    ("replay", None),
    ("replay, streaming", "streaming"),
)


def replay_tool(engine: str, variant: str) -> str:
    """A replay row's tool name: ``replay`` (grpcio, the names earlier runs used) or
    ``replay grpc-cpp``, then the variant's own words."""
    name = "replay" if engine == "grpcio" else f"replay {engine}"
    return name + variant.removeprefix("replay")


def measure_replay(seconds: float, runs: int, figures: Figures, engine_name: str) -> None:
    """P2P bandwidth and latency through the replay library, against a local server
    (both of ``engine_name``, the grpcio or the gRPC C++ engine).

    The same path as ``tf-grpc-bench replay``: the engine's local servers (a
    server in its own process), ``synthetic_workload`` and ``run_benchmark``
    with the RPC kind and window the ``replay`` command defaults to (or the
    variant's), non-serialized mode; one buffer per payload so every message is
    exactly the size in the table, and the command's default number of payloads
    (``GeneratorConfig.payload_count``), all of that size: a window is held within a
    step (whose calls all complete before the next step begins), so with one payload
    per step a row of 4 in flight would have had one.
    """
    from tf_grpc_bench.replay.core.benchmarks import default_window, synthetic_workload
    from tf_grpc_bench.replay.core.generators import BufferSizes, GeneratorConfig
    from tf_grpc_bench.replay.core.measurement import Benchmark
    from tf_grpc_bench.replay.core.pacing import Pacing
    from tf_grpc_bench.replay.core.workload import Mode
    from tf_grpc_bench.replay.engines.registry import engine_named
    from tf_grpc_bench.replay.runner import RunPlan, default_rpc, run_benchmark
    from tf_grpc_bench.replay.transport.wire import ChannelSettings, RpcKind, ServerSettings
    from tf_grpc_bench.sizes import classify

    def generator(size: int) -> GeneratorConfig:
        category = classify(size)
        sizes = {f"{category.value}_bytes": size}
        return GeneratorConfig(
            categories=(category,),
            buffers_per_payload=1,
            sizes=BufferSizes(**sizes),
        )

    plan = RunPlan(
        warmup_ns=int(min(2.0, seconds) * 1e9), duration_ns=int(seconds * 1e9), runs=runs
    )
    mode = Mode.NON_SERIALIZED
    engine = engine_named(engine_name)
    local = engine.local_servers(1, mode=mode, settings=ServerSettings(), procs_per_server=1)
    with local as targets:
        for size in BANDWIDTH_SIZES:
            for variant, rpc_name, chosen_window in BANDWIDTH_VARIANTS:
                tool = replay_tool(engine_name, variant)
                workload = synthetic_workload(Benchmark.P2P_BANDWIDTH, generator(size), mode=mode)
                rpc = RpcKind(rpc_name) if rpc_name else default_rpc(workload)
                window = chosen_window or default_window(workload, rpc)
                print(
                    f"   {tool} P2P bandwidth {size_name(size)}, {rpc.value}, {window} in flight",
                    flush=True,
                )
                result = run_benchmark(
                    workload,
                    targets,
                    pacing=Pacing(window=window),
                    plan=plan,
                    settings=ChannelSettings(rpc=rpc),
                    engine=engine,
                )
                figures.bandwidth.append(
                    Bandwidth(
                        tool=tool,
                        size_bytes=size,
                        pass_index=1,
                        mb_per_s=result.bandwidth_mb_per_s,
                    )
                )
                _note_partial(figures, result, f"P2P bandwidth {size_name(size)} ({tool})")
        for size in ROUND_TRIP_SIZES:
            for variant, rpc_name in ROUND_TRIP_VARIANTS:
                tool = replay_tool(engine_name, variant)
                workload = synthetic_workload(Benchmark.P2P_LATENCY, generator(size), mode=mode)
                rpc = RpcKind(rpc_name) if rpc_name else default_rpc(workload)
                print(f"   {tool} P2P latency {size_name(size)}, {rpc.value}", flush=True)
                result = run_benchmark(
                    workload, targets, plan=plan, settings=ChannelSettings(rpc=rpc), engine=engine
                )
                latency = result.latency_all
                calls = sum(len(run.samples) for run in result.runs) or 1
                figures.round_trips.append(
                    RoundTrip(
                        tool=tool,
                        size_bytes=size,
                        pass_index=1,
                        p50_us=latency.p50_ns / 1e3,
                        p99_us=latency.p99_ns / 1e3,
                        mean_us=latency.mean_ns / 1e3,
                        count=latency.count,
                        client_cpu_us=sum(r.client_cpu_ns for r in result.runs) / calls / 1e3,
                    )
                )
                _note_partial(figures, result, f"P2P latency {size_name(size)} ({tool})")


def measure_bare_grpc_cpp(sizes: Sequence[int], seconds: float) -> list[RoundTrip]:
    """gRPC C++'s bare echo (``grpc_cpp_floor``), one size at a time."""
    from grpc_cpp_floor import round_trips_ns

    trips = []
    for size in sizes:
        times, cpu_ns = round_trips_ns(size, seconds)
        trip = _round_trip("bare gRPC C++", size, 1, list(times))
        trips.append(dataclasses.replace(trip, client_cpu_us=cpu_ns / max(len(times), 1) / 1e3))
    return trips


#: gRPC C++'s bare push (``grpc_cpp_floor.push_bandwidth``): (tool, streamed), and the
#: grpc-cpp replay row each is the floor of (the default streams, one message at a time).
BARE_PUSHES: tuple[tuple[str, bool, str], ...] = (
    ("bare gRPC C++ push, streamed", True, "replay"),
    ("bare gRPC C++ push, unary", False, "replay, unary"),
)


def measure_bare_grpc_cpp_push(sizes: Sequence[int], seconds: float) -> list[Bandwidth]:
    """gRPC C++'s bare push (``grpc_cpp_floor``), streamed and unary, one size at a time."""
    from grpc_cpp_floor import push_bandwidth

    return [
        Bandwidth(
            tool=tool,
            size_bytes=size,
            pass_index=1,
            mb_per_s=push_bandwidth(size, seconds, streamed=streamed)[0],
        )
        for size in sizes
        for tool, streamed, _ in BARE_PUSHES
    ]


def _note_partial(figures: Figures, result: Any, what: str) -> None:
    if result.partial:
        reason = next((run.partial_reason for run in result.runs if run.partial), "")
        figures.notes.append(f"replay {what} was partial: {reason or result.partial_reason}")


# --------------------------------------------------------------------------
# Reporting.


#: The replay engines measured, in order (grpc-cpp where gRPC C++ is found).
ENGINES = ("grpcio", "grpc-cpp")
#: What each replay round trip is divided by: raw TCP, and gRPC's own bare calls.
#: The floors a replay's round trip is set against, by engine: raw TCP (sockperf; the
#: python socket's figure is in the table beside it) and the bare echo of each gRPC
#: stack that engine could be compared with.
ROUND_TRIP_FLOORS = {
    "grpcio": ("sockperf", "bare grpcio", "bare gRPC C++"),
    "grpc-cpp": ("sockperf", "bare gRPC C++"),
}


def ratios(figures: Figures) -> list[tuple[str, float]]:
    """(what, ratio) pairs: bandwidth as a fraction of iperf3's, round trips as
    multiples of raw TCP's and of gRPC's bare calls.  Against the best raw figure of
    the passes, so noise on a shared machine can only make the replay look worse."""
    found = []
    iperf = figures.best_bandwidth("iperf3")
    for engine in ENGINES:
        for size in BANDWIDTH_SIZES:
            for variant, _, _ in BANDWIDTH_VARIANTS:
                tool = replay_tool(engine, variant)
                replay = figures.best_bandwidth(tool, size)
                if iperf and replay:
                    what = f"{tool} bandwidth {size_name(size)} / iperf3"
                    found.append((what, replay.mb_per_s / iperf.mb_per_s))
            for tool, _, variant in BARE_PUSHES if engine == "grpc-cpp" else ():
                floor = figures.best_bandwidth(tool, size)
                replay = figures.best_bandwidth(replay_tool(engine, variant), size)
                if floor and iperf:
                    what = f"{tool} bandwidth {size_name(size)} / iperf3"
                    found.append((what, floor.mb_per_s / iperf.mb_per_s))
                if floor and replay:
                    what = f"{replay.tool} bandwidth {size_name(size)} / {tool}"
                    found.append((what, replay.mb_per_s / floor.mb_per_s))
            bare = figures.best_bandwidth("bare grpcio", size)
            replay = figures.best_bandwidth(replay_tool(engine, "replay"), size)
            if bare and replay and engine == "grpcio":
                what = f"{replay.tool} bandwidth {size_name(size)} / bare grpcio"
                found.append((what, replay.mb_per_s / bare.mb_per_s))
        for size in ROUND_TRIP_SIZES:
            for variant, _ in ROUND_TRIP_VARIANTS:
                replay_trip = figures.best_round_trip(replay_tool(engine, variant), size)
                for raw_tool in ROUND_TRIP_FLOORS[engine]:
                    raw_size = max(size, SOCKPERF_MIN_BYTES) if raw_tool == "sockperf" else size
                    raw = figures.best_round_trip(raw_tool, raw_size)
                    if replay_trip and raw:
                        what = (
                            f"{replay_trip.tool} p50 round trip {size_name(size)} / {raw_tool} "
                            f"{size_name(raw_size)}"
                        )
                        found.append((what, replay_trip.p50_us / raw.p50_us))
    return found


#: Baselines measured twice, before and after the replay.
RAW_TOOLS = ("iperf3", "sockperf", "python socket")
_TOOL_ORDER = (*RAW_TOOLS, "bare grpcio", "bare gRPC C++")


def _order(tool: str) -> tuple[int, str]:
    return (_TOOL_ORDER.index(tool) if tool in _TOOL_ORDER else len(_TOOL_ORDER), tool)


def format_report(figures: Figures) -> list[str]:
    passes = {1: "before", 2: "after"}
    lines = table_head("measurement", "message", "pass", "figure")
    for item in sorted(figures.bandwidth, key=lambda b: (_order(b.tool), b.size_bytes)):
        message = "stream" if item.size_bytes == 0 else size_name(item.size_bytes)
        when = passes[item.pass_index] if item.tool in RAW_TOOLS else "-"
        lines.append(f"| {item.tool} bandwidth | {message} | {when} | {item.mb_per_s:,.0f} MB/s |")
    for trip in sorted(figures.round_trips, key=lambda r: (r.size_bytes, _order(r.tool))):
        when = passes[trip.pass_index] if trip.tool in RAW_TOOLS else "-"
        cpu = "" if trip.client_cpu_us is None else f"; client CPU {trip.client_cpu_us:,.1f} us"
        lines.append(
            f"| {trip.tool} round trip | {size_name(trip.size_bytes)} | {when} "
            f"| p50 {trip.p50_us:,.1f} us, p99 {trip.p99_us:,.1f} us, "
            f"mean {trip.mean_us:,.1f} us ({trip.count:,} round trips{cpu}) |"
        )
    found = ratios(figures)
    if found:
        lines += ["", *table_head("ratio", "value")]
        lines += [f"| {what} | {value:.2f} |" for what, value in found]
    return lines


def findings(figures: Figures) -> list[str]:
    """Sentences computed from the figures: the targets of docs/design.md's figures, and how
    much of the replay's small-message round trip grpcio itself accounts for."""
    lines = []
    iperf = figures.best_bandwidth("iperf3")
    for size in BANDWIDTH_SIZES:
        best = max(
            (b for b in figures.bandwidth if b.tool.startswith("replay") and b.size_bytes == size),
            key=lambda b: b.mb_per_s,
            default=None,
        )
        if iperf and best:
            ratio = best.mb_per_s / iperf.mb_per_s
            verdict = "meets" if ratio >= 0.5 else "misses"
            lines.append(
                f"P2P bandwidth, {size_name(size)} messages: best replay figure ({best.tool}) "
                f"{best.mb_per_s:,.0f} MB/s = {ratio:.3f} of iperf3's {iperf.mb_per_s:,.0f} MB/s; "
                f"{verdict} the target of at least 0.5."
            )
    for size in ROUND_TRIP_SIZES[:2]:
        replay = figures.best_round_trip("replay", size)
        raw = figures.best_round_trip("sockperf", max(size, SOCKPERF_MIN_BYTES))
        raw = raw or figures.best_round_trip("python socket", size)
        bare = figures.best_round_trip("bare grpcio", size)
        if replay and raw:
            sentence = (
                f"{size_name(size)} round trip: replay p50 {replay.p50_us:,.0f} us = "
                f"{replay.p50_us / raw.p50_us:.1f} x raw TCP ({raw.tool} p50 {raw.p50_us:,.1f} us)"
            )
            if bare:
                share = bare.p50_us / replay.p50_us
                sentence += (
                    f"; a bare grpcio unary echo takes {bare.p50_us:,.0f} us "
                    f"({bare.p50_us / raw.p50_us:.1f} x raw TCP), "
                )
                if share >= 1:
                    sentence += (
                        "no less than the replay: grpcio's own Python call path is the whole "
                        "of the replay's round trip"
                    )
                else:
                    sentence += (
                        f"{share:.0%} of the replay's: grpcio's own Python call path is that "
                        f"share, the replay's driver the remaining {1 - share:.0%}"
                    )
            streamed = figures.best_round_trip("replay, streaming", size)
            if streamed:
                sentence += (
                    f". Streamed (--rpc streaming, one message each way per round trip) the "
                    f"replay's p50 is {streamed.p50_us:,.0f} us = "
                    f"{streamed.p50_us / raw.p50_us:.1f} x raw TCP"
                )
            lines.append(sentence + ".")
    for tool in RAW_TOOLS[1:]:
        for size in sorted({r.size_bytes for r in figures.round_trips if r.tool == tool}):
            passes = [r for r in figures.round_trips if r.tool == tool and r.size_bytes == size]
            low = min(passes, key=lambda r: r.p50_us)
            high = max(passes, key=lambda r: r.p50_us)
            if len(passes) > 1 and high.p50_us > 2 * low.p50_us:
                lines.append(
                    f"{tool} {size_name(size)} p50 was {low.p50_us:,.1f} us in one pass and "
                    f"{high.p50_us:,.1f} us in the other: the machine's state changed between "
                    "passes (shared host); ratios use the lower figure."
                )
    return lines


def native_findings(figures: Figures) -> list[str]:
    """The gRPC C++ engine against its targets: a 10 B round trip within 1.3 x gRPC C++'s
    bare echo, 1 MiB bandwidth at least 0.8 of iperf3's (grpcio's figures beside them)."""
    lines = []
    bare = figures.best_round_trip("bare gRPC C++", ROUND_TRIP_SIZES[0])
    for engine in ENGINES:
        replay = figures.best_round_trip(replay_tool(engine, "replay"), ROUND_TRIP_SIZES[0])
        if bare and replay:
            ratio = replay.p50_us / bare.p50_us
            verdict = "meets" if ratio <= 1.3 else "misses"
            lines.append(
                f"{size_name(ROUND_TRIP_SIZES[0])} round trip, {engine} engine: p50 "
                f"{replay.p50_us:,.1f} us = {ratio:.2f} x gRPC C++'s bare echo "
                f"({bare.p50_us:,.1f} us); {verdict} the target of at most 1.3."
            )
    iperf = figures.best_bandwidth("iperf3")
    for engine in ENGINES:
        best = max(
            (b for b in figures.bandwidth
             if b.tool.startswith(replay_tool(engine, "replay")) and b.size_bytes == MIB
             and (engine != "grpcio" or not b.tool.startswith("replay grpc-cpp"))),
            key=lambda b: b.mb_per_s,
            default=None,
        )  # fmt: skip
        if iperf and best:
            ratio = best.mb_per_s / iperf.mb_per_s
            verdict = "meets" if ratio >= 0.8 else "misses"
            lines.append(
                f"1 MiB bandwidth, {engine} engine: best {best.mb_per_s:,.0f} MB/s ({best.tool}) "
                f"= {ratio:.2f} of iperf3's; {verdict} the target of at least 0.8."
            )
    floors = [figures.best_bandwidth(tool, MIB) for tool, _, _ in BARE_PUSHES]
    floor = max((f for f in floors if f is not None), key=lambda f: f.mb_per_s, default=None)
    if iperf and floor:
        lines.append(
            f"gRPC C++'s own bare push of 1 MiB, one at a time: best {floor.mb_per_s:,.0f} MB/s "
            f"({floor.tool}) = {floor.mb_per_s / iperf.mb_per_s:.2f} of iperf3's: what gRPC C++ "
            "itself reaches with the replay's one-at-a-time pattern, without the engine."
        )
    return lines


def readme_section(
    figures: Figures, command: str, seconds: float, runs: int, load_before: str, load_after: str
) -> str:
    lines = [
        SECTION,
        "",
        "(written by `bench/replay_vs_raw.py`; rerun it to replace this section)",
        "",
        f"Command: `{command}` ({seconds:g} s per measurement, replay: {runs} runs of {seconds:g} s"
        " after a warm-up), on loopback, all figures from one run.",
        "",
        machine_line(load_before, load_after, memory_and_protobuf=True),
        "",
        "The raw baselines run twice, before and after the replay; ratios use the better raw figure"
        " of the two (the highest iperf3 bandwidth, the lowest median round trip). On a shared"
        " machine raw TCP round trips vary several-fold with the load from other work, between"
        " runs and sometimes between the two passes of one run: compare ratios within one run,"
        " with its load averages.",
        "",
        *format_report(figures),
    ]
    found = findings(figures) + native_findings(figures)
    if found:
        lines += ["", *[f"- {sentence}" for sentence in found]]
    if figures.notes:
        lines += ["", *[f"- {note}" for note in figures.notes]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------


def _attempt(figures: Figures, what: str, action: Callable[[], None]) -> None:
    print(f"-- {what}", flush=True)
    try:
        action()
    except (RuntimeError, OSError, subprocess.SubprocessError, BenchError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        figures.notes.append(f"{what}: not measured ({reason})")
        print(f"   not measured: {reason}", flush=True)


def measure_baselines(figures: Figures, seconds: float, *, pass_index: int) -> None:
    """iperf3, sockperf and the socket ping-pong, each one after the other."""
    if shutil.which("iperf3"):
        _attempt(
            figures,
            f"iperf3 one stream (pass {pass_index})",
            lambda: figures.bandwidth.append(measure_iperf3(seconds, pass_index)),
        )
    if shutil.which("sockperf"):
        sizes = [max(size, SOCKPERF_MIN_BYTES) for size in ROUND_TRIP_SIZES[:2]]
        _attempt(
            figures,
            f"sockperf ping-pong (pass {pass_index})",
            lambda: figures.round_trips.extend(measure_sockperf(sizes, seconds, pass_index)),
        )
    _attempt(
        figures,
        f"python socket ping-pong (pass {pass_index})",
        lambda: figures.round_trips.extend(
            measure_socket_ping_pong(ROUND_TRIP_SIZES, seconds, pass_index)
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    parser.add_argument(
        "--runs", type=int, default=3, help="measured runs of each replay benchmark"
    )
    parser.add_argument(
        "--no-readme", action="store_true", help="print only; leave bench/README.md alone"
    )
    parser.add_argument("--skip-replay", action="store_true", help="measure the raw baselines only")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv or sys.argv[1:])

    load_before = load_average()
    print(f"load average before: {load_before} on {os.cpu_count()} CPUs", flush=True)
    if os.getloadavg()[0] > 0.75 * (os.cpu_count() or 1):
        print("warning: the machine is busy; figures will be noisy (the load goes into the README)")
    figures = Figures()
    for tool in ("iperf3", "sockperf"):
        if shutil.which(tool) is None:
            figures.notes.append(f"{tool} is not installed ({INSTALL_HINT}); its rows are missing")
            print(f"{tool} not found: {INSTALL_HINT}")

    measure_baselines(figures, args.seconds, pass_index=1)
    if not args.skip_replay:

        def bare_grpc() -> None:
            trips, bandwidths = measure_bare_grpc(ROUND_TRIP_SIZES, BANDWIDTH_SIZES, args.seconds)
            figures.round_trips.extend(trips)
            figures.bandwidth.extend(bandwidths)

        _attempt(figures, "bare grpcio", bare_grpc)
        _attempt(
            figures,
            "bare gRPC C++",
            lambda: figures.round_trips.extend(
                measure_bare_grpc_cpp(ROUND_TRIP_SIZES, args.seconds)
            ),
        )
        _attempt(
            figures,
            "bare gRPC C++ push",
            lambda: figures.bandwidth.extend(
                measure_bare_grpc_cpp_push(BANDWIDTH_SIZES, args.seconds)
            ),
        )
        for engine in ENGINES:
            _attempt(
                figures,
                f"replay, {engine} engine",
                functools.partial(measure_replay, args.seconds, args.runs, figures, engine),
            )
    measure_baselines(figures, args.seconds, pass_index=2)
    load_after = load_average()

    print()
    print("\n".join(format_report(figures)))
    for sentence in findings(figures) + native_findings(figures):
        print(f"- {sentence}")
    for note in figures.notes:
        print(f"note: {note}")
    if not args.no_readme:
        section = readme_section(figures, command, args.seconds, args.runs, load_before, load_after)
        print()
        write_section(README, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
