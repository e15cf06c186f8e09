"""What makes the replay fast or slow: its alternatives side by side, against raw TCP, in one run.

The project's figures (docs/design.md#figures-the-project-holds-itself-to)
ask that the replay not be the bottleneck: P2P bandwidth with 1 MB+ messages
at least half of iperf3's single stream on the same link, and a small-message
round trip driven toward what C++ gRPC achieves.  This
script measures, interleaved in every repetition (so that a shared machine's
load hits all of them alike):

1. raw TCP: ``iperf3`` one stream and ``-P 2`` streams; ``sockperf ping-pong``;
2. the replay library (``run_benchmark`` against ``LocalServers``, raw bytes,
   one buffer per payload) in each RPC kind and window: P2P bandwidth with
   1 MiB and 10 MiB messages (unary and streaming, 1..8 in flight, 2 channels,
   a server without ``keep_freed_memory``), P2P latency with 10 B and 10 KiB
   (unary and streaming); bandwidth rows carry CPU time per MB (client +
   server), a figure the machine's load disturbs far less than MB/s;
3. bare grpcio thread models for a 10 B echo (no replay code at all): sync and
   asyncio clients and servers, unary calls and a bidirectional ping-pong,
   1 or 64 server threads, with the thread switches each round trip costs;
   run again in a child process with grpc-core's EventEngine client turned
   off (``GRPC_EXPERIMENTS``), which moves polling into the calling thread.

Writes the tables (medians over repetitions, ratios per repetition) into the
"Measured" section of ``docs/performance.md`` with the command and the load.

    .venv/bin/python bench/replay_alternatives.py                # 3 repetitions
    .venv/bin/python bench/replay_alternatives.py --reps 1 --seconds 1 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from common import (
    INSTALL_HINT,
    KIB,
    LOOPBACK,
    MIB,
    ROOT,
    SOCKPERF_MIN_BYTES,
    command_line,
    iperf3_loopback,
    load_average,
    machine_line,
    server_process,
    size_name,
    sockperf_loopback,
    table_head,
    table_row,
    write_section,
)

DOC = ROOT / "docs" / "performance.md"
SECTION = "## Measured"


# --------------------------------------------------------------------------
# Raw TCP.


def iperf3(seconds: float, streams: int) -> float:
    """MB/s (10**6 B) received by an ``iperf3 -s -1`` on loopback, over whole seconds."""
    return iperf3_loopback(max(1, round(seconds)), streams) / 8e6


def sockperf(seconds: float) -> float:
    """p50 round trip (us) of ``sockperf ping-pong --tcp`` with 14-byte messages."""
    (found,) = sockperf_loopback([SOCKPERF_MIN_BYTES], seconds)
    return found.p50_us


# --------------------------------------------------------------------------
# The replay library.


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayVariant:
    label: str
    rpc: str = "unary"
    window: int = 1
    channels: int = 1
    tuned_server: bool = True
    #: gRPC channel arguments given to both the client's channels and the server.
    options: tuple[tuple[str, str | int], ...] = ()


BANDWIDTH_VARIANTS = (
    ReplayVariant(label="unary, 1 in flight"),
    ReplayVariant(label="unary, 4 in flight", window=4),
    ReplayVariant(label="streaming, 1 in flight", rpc="streaming"),
    ReplayVariant(label="streaming, 2 in flight", rpc="streaming", window=2),
    ReplayVariant(label="streaming, 4 in flight", rpc="streaming", window=4),
    ReplayVariant(label="streaming, 8 in flight", rpc="streaming", window=8),
    ReplayVariant(
        label="streaming, 4 in flight, server without keep_freed_memory",
        rpc="streaming",
        window=4,
        tuned_server=False,
    ),
    ReplayVariant(label="unary, 1 in flight, server without keep_freed_memory", tuned_server=False),
    ReplayVariant(
        label="streaming, 8 in flight, 2 channels", rpc="streaming", window=8, channels=2
    ),
)
#: grpc-core channel arguments tried on the default streamed bandwidth, each on
#: a server of its own that has the same arguments.
OPTION_VARIANTS = (
    ReplayVariant(
        label="streaming + grpc.http2.max_frame_size 16 MiB",
        options=(("grpc.http2.max_frame_size", 16 * MIB - 1),),
        rpc="streaming",
    ),
    ReplayVariant(
        label="streaming + lookahead 64 MiB, no BDP probe",
        options=(("grpc.http2.lookahead_bytes", 64 * MIB), ("grpc.http2.bdp_probe", 0)),
        rpc="streaming",
    ),
    ReplayVariant(
        label="streaming + grpc.optimization_target throughput",
        options=(("grpc.optimization_target", "throughput"),),
        rpc="streaming",
    ),
    ReplayVariant(
        label="streaming + grpc.http2.write_buffer_size 64 MiB",
        options=(("grpc.http2.write_buffer_size", 64 * MIB),),
        rpc="streaming",
    ),
    ReplayVariant(
        label="streaming + TCP read chunks 1-16 MiB",
        options=(
            ("grpc.experimental.tcp_read_chunk_size", 4 * MIB),
            ("grpc.experimental.tcp_min_read_chunk_size", MIB),
            ("grpc.experimental.tcp_max_read_chunk_size", 16 * MIB),
        ),
        rpc="streaming",
    ),
)
LATENCY_VARIANTS = (
    ReplayVariant(label="unary"),
    ReplayVariant(label="streaming", rpc="streaming"),
)
BANDWIDTH_SIZES = (MIB, 10 * MIB)
LATENCY_SIZES = (10, 10 * KIB)


@dataclass(slots=True, kw_only=True)
class Table:
    """Figures per (row, column) over repetitions."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, row: str, column: str, value: float) -> None:
        self.values.setdefault((row, column), []).append(value)

    def median(self, row: str, column: str) -> float | None:
        found = self.values.get((row, column))
        return statistics.median(found) if found else None

    def rows(self) -> list[str]:
        return list(dict.fromkeys(row for row, _ in self.values))


def _generator(size: int) -> Any:
    from tf_grpc_bench.replay.core.generators import BufferSizes, GeneratorConfig
    from tf_grpc_bench.sizes import classify

    category = classify(size)
    return GeneratorConfig(
        categories=(category,),
        buffers_per_payload=1,
        payload_count=1,
        sizes=BufferSizes(**{f"{category.value}_bytes": size}),
    )


def replay_once(
    benchmark_name: str, size: int, variant: ReplayVariant, target: str, seconds: float
) -> Any:
    from tf_grpc_bench.replay.core.benchmarks import synthetic_workload
    from tf_grpc_bench.replay.core.measurement import Benchmark
    from tf_grpc_bench.replay.core.pacing import Pacing
    from tf_grpc_bench.replay.core.workload import Mode
    from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
    from tf_grpc_bench.replay.transport.wire import ChannelSettings, RpcKind

    benchmark = Benchmark(benchmark_name)
    workload = synthetic_workload(benchmark, _generator(size), mode=Mode.NON_SERIALIZED)
    settings = ChannelSettings(
        rpc=RpcKind(variant.rpc), channels_per_server=variant.channels, options=variant.options
    )
    plan = RunPlan(warmup_ns=int(0.5e9), duration_ns=int(seconds * 1e9), runs=1)
    result = run_benchmark(
        workload, [target], pacing=Pacing(window=variant.window), plan=plan, settings=settings
    )
    if result.partial:
        raise RuntimeError(f"{variant.label}: partial run ({result.partial_reason})")
    run = result.runs[0]
    if run.server_received_messages != run.rpc_count or run.server_received_bytes != (
        run.request_bytes
    ):
        raise RuntimeError(f"{variant.label}: the server counted other bytes than were sent")
    return result


# --------------------------------------------------------------------------
# Bare grpcio thread models (10 B echo), with thread switches per round trip.

_BARE_OPTIONS = [("grpc.max_receive_message_length", 64 * MIB)]


def _bare_server(connection: Any, workers: int, use_aio: bool) -> None:
    import grpc

    def echo(request: bytes, context: Any) -> bytes:
        return request

    def echo_stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        yield from requests

    def push(request: bytes, context: Any) -> bytes:
        return len(request).to_bytes(8, "little")

    def push_stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        for request in requests:
            yield len(request).to_bytes(8, "little")

    async def aio_echo(request: bytes, context: Any) -> bytes:
        return request

    async def aio_echo_stream(requests: Any, context: Any) -> Any:
        async for request in requests:
            yield request

    def handlers(aio: bool) -> Any:
        return grpc.method_handlers_generic_handler(
            "bare",
            {
                "Echo": grpc.unary_unary_rpc_method_handler(aio_echo if aio else echo),
                "EchoStream": grpc.stream_stream_rpc_method_handler(
                    aio_echo_stream if aio else echo_stream
                ),
                "Push": grpc.unary_unary_rpc_method_handler(push),
                "PushStream": grpc.stream_stream_rpc_method_handler(push_stream),
            },
        )

    if use_aio:

        async def serve() -> None:
            server = grpc.aio.server(options=_BARE_OPTIONS)
            server.add_generic_rpc_handlers((handlers(True),))
            port = server.add_insecure_port(f"{LOOPBACK}:0")
            await server.start()
            connection.send(port)
            await server.wait_for_termination()

        asyncio.run(serve())
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=_BARE_OPTIONS)
    server.add_generic_rpc_handlers((handlers(False),))
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    server.start()
    connection.send(port)
    server.wait_for_termination()


def _switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as status:
                for line in status:
                    if "ctxt_switches" in line:
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def _round_trips(client: str, port: int, count: int) -> list[int]:
    """``count`` timed 10 B echoes (ns) with one of the four client models."""
    import grpc

    message = b"x" * 10
    clock = time.perf_counter_ns
    target = f"{LOOPBACK}:{port}"
    if client.startswith("aio"):

        async def run() -> list[int]:
            samples = []
            async with grpc.aio.insecure_channel(target) as channel:
                if client == "aio unary":
                    echo = channel.unary_unary("/bare/Echo", None, None)
                    for _ in range(count):
                        start = clock()
                        await echo(message)
                        samples.append(clock() - start)
                else:
                    call = channel.stream_stream("/bare/EchoStream", None, None)(None)
                    for _ in range(count):
                        start = clock()
                        await call.write(message)
                        await call.read()
                        samples.append(clock() - start)
                    await call.done_writing()
            return samples

        return asyncio.run(run())
    samples = []
    with grpc.insecure_channel(target) as channel:
        if client == "sync unary":
            echo = channel.unary_unary("/bare/Echo", None, None)
            for _ in range(count):
                start = clock()
                echo(message)
                samples.append(clock() - start)
            return samples
        go = threading.Semaphore(0)
        stop = threading.Event()

        def requests() -> Iterator[bytes]:
            while True:
                go.acquire()
                if stop.is_set():
                    return
                yield message

        answers = iter(channel.stream_stream("/bare/EchoStream", None, None)(requests()))
        for _ in range(count):
            start = clock()
            go.release()
            next(answers)
            samples.append(clock() - start)
        stop.set()
        go.release()
        for _ in answers:
            pass
    return samples


BARE_SERVERS = (("sync server, 64 threads", 64, False), ("sync server, 1 thread", 1, False))
BARE_SERVERS_AIO = (("asyncio server", 0, True),)
BARE_CLIENTS = ("sync unary", "sync bidi ping-pong", "aio unary", "aio bidi ping-pong")


def _pushes(client: str, port: int, size: int, seconds: float) -> float:
    """MB/s of ``size``-byte pushes, acknowledged one by one (sync client)."""
    import grpc

    message = bytes(size)
    window = 4
    with grpc.insecure_channel(f"{LOOPBACK}:{port}", options=_BARE_OPTIONS) as channel:
        if client == "unary":
            push = channel.unary_unary("/bare/Push", None, None)
            push(message)
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                push(message)
                count += 1
            return count * size / (time.perf_counter() - start) / 1e6
        credit = threading.Semaphore(window)
        stop = threading.Event()

        def requests() -> Iterator[bytes]:
            while True:
                credit.acquire()
                if stop.is_set():
                    return
                yield message

        count, start = 0, time.perf_counter()
        for _ in channel.stream_stream("/bare/PushStream", None, None)(requests()):
            count += 1
            if time.perf_counter() - start >= seconds:
                stop.set()
            credit.release()
        return count * size / (time.perf_counter() - start) / 1e6


BARE_PUSHES = (("unary push, 1 in flight", "unary"), ("bidi push, 4 in flight", "bidi"))


def bare_models(seconds: float) -> list[tuple[str, float, float, float]]:
    """(model, p50 us, client switches per round trip, server switches per round trip), and
    (push model with its size, MB/s, 0, 0) for the pushes against the 64-thread sync server."""
    rows = []
    for server_name, workers, use_aio in (*BARE_SERVERS, *BARE_SERVERS_AIO):
        server = server_process(_bare_server, workers, use_aio, what="bare grpcio server")
        with server as (port, process):
            for client in BARE_CLIENTS:
                _round_trips(client, port, 300)
                # Calibrate the count to about ``seconds`` of round trips.
                probe = _round_trips(client, port, 200)
                count = max(500, int(seconds * 1e9 / max(statistics.median(probe), 1)))
                own, theirs = _switches(os.getpid()), _switches(process.pid or 0)
                samples = _round_trips(client, port, count)
                own, theirs = _switches(os.getpid()) - own, _switches(process.pid or 0) - theirs
                rows.append(
                    (
                        f"{client}, {server_name}",
                        statistics.median(samples) / 1e3,
                        own / count,
                        theirs / count,
                    )
                )
            if workers == 64:
                for label, client in BARE_PUSHES:
                    for size in BANDWIDTH_SIZES:
                        mb_per_s = _pushes(client, port, size, seconds)
                        rows.append((f"push {size_name(size)}: {label}", mb_per_s, 0.0, 0.0))
    return rows


def bare_models_in_child(seconds: float, environment: dict[str, str]) -> list[Any]:
    """``bare_models`` in a fresh interpreter with ``environment`` (grpc reads it at start)."""
    done = subprocess.run(
        [sys.executable, __file__, "--bare-only", "--seconds", str(seconds)],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"bare grpcio child failed: {done.stderr.strip()[-300:]}")
    return list(json.loads(lines[-1]))


#: grpc-core experiments that, off, make the thread that waits for a call poll the socket itself.
NO_EVENT_ENGINE_CLIENT = {
    "GRPC_EXPERIMENTS": "-event_engine_client,-event_engine_listener,"
    "-event_engine_for_all_other_endpoints,-event_engine_callback_cq"
}


# --------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Results:
    bandwidth: Table = field(default_factory=Table)
    bandwidth_ratio: Table = field(default_factory=Table)
    cpu_per_mb: Table = field(default_factory=Table)
    latency: Table = field(default_factory=Table)
    latency_ratio: Table = field(default_factory=Table)
    bare: Table = field(default_factory=Table)
    bare_push: Table = field(default_factory=Table)
    raw: Table = field(default_factory=Table)
    notes: list[str] = field(default_factory=list)


def _bandwidths(
    results: Results,
    seconds: float,
    single: float,
    multi: float,
    tuned: Any,
    untuned: Any,
    optioned: dict[str, Any],
) -> None:
    """Every bandwidth variant at every size, each against its server, into ``results``."""
    for size in BANDWIDTH_SIZES:
        for variant in (*BANDWIDTH_VARIANTS, *(v for v in OPTION_VARIANTS if v.label in optioned)):
            servers = optioned.get(variant.label) or (tuned if variant.tuned_server else untuned)
            result = replay_once("p2p-bandwidth", size, variant, servers.targets[0], seconds)
            run = result.runs[0]
            mb_per_s = result.bandwidth_mb_per_s
            baseline = multi if variant.channels > 1 else single
            moved_mb = (run.request_bytes + run.response_bytes) / 1e6
            cpu_us_per_mb = (run.client_cpu_ns + run.server_cpu_ns) / 1e3 / moved_mb
            column = size_name(size)
            results.bandwidth.add(variant.label, column, mb_per_s)
            results.bandwidth_ratio.add(variant.label, column, mb_per_s / baseline)
            results.cpu_per_mb.add(variant.label, column, cpu_us_per_mb)
            print(
                f"   bandwidth {column:7s} {variant.label:58s} {mb_per_s:7,.0f} MB/s "
                f"= {mb_per_s / baseline:.2f} x iperf3, {cpu_us_per_mb:4.0f} us CPU/MB",
                flush=True,
            )


def measure(seconds: float, reps: int, with_bare: bool, with_options: bool) -> Results:
    from tf_grpc_bench.replay.core.workload import Mode
    from tf_grpc_bench.replay.transport.local_servers import LocalServers
    from tf_grpc_bench.replay.transport.wire import ServerSettings

    results = Results()
    mode = Mode.NON_SERIALIZED
    untuned = ServerSettings(keep_freed_memory=False)
    with (
        LocalServers(1, mode=mode) as tuned_servers,
        LocalServers(1, mode=mode, settings=untuned) as untuned_servers,
    ):
        for rep in range(reps):
            print(f"-- repetition {rep + 1}/{reps}, load {load_average()}", flush=True)
            single = iperf3(seconds, 1)
            multi = iperf3(seconds, 2)
            round_trip = sockperf(seconds)
            results.raw.add("iperf3, 1 stream", "MB/s", single)
            results.raw.add("iperf3 -P 2", "MB/s", multi)
            results.raw.add(
                f"sockperf ping-pong {size_name(SOCKPERF_MIN_BYTES)}", "p50 us", round_trip
            )
            print(f"   iperf3 {single:,.0f} MB/s, -P 2 {multi:,.0f}; sockperf {round_trip} us")
            with contextlib.ExitStack() as stack:
                optioned = {
                    variant.label: stack.enter_context(
                        LocalServers(1, mode=mode, settings=ServerSettings(options=variant.options))
                    )
                    for variant in (OPTION_VARIANTS if with_options else ())
                }
                _bandwidths(
                    results, seconds, single, multi, tuned_servers, untuned_servers, optioned
                )
            for size in LATENCY_SIZES:
                for variant in LATENCY_VARIANTS:
                    result = replay_once(
                        "p2p-latency", size, variant, tuned_servers.targets[0], seconds
                    )
                    p50_us = result.latency_all.p50_ns / 1e3
                    column = size_name(size)
                    results.latency.add(variant.label, column, p50_us)
                    results.latency_ratio.add(variant.label, column, p50_us / round_trip)
                    print(
                        f"   latency {column:7s} {variant.label:10s} p50 {p50_us:6.1f} us "
                        f"= {p50_us / round_trip:.1f} x sockperf",
                        flush=True,
                    )
            if with_bare:
                for label, environment in (
                    ("", {}),
                    (" (EventEngine client off)", NO_EVENT_ENGINE_CLIENT),
                ):
                    for model, p50_us, client_switches, server_switches in bare_models_in_child(
                        seconds, environment
                    ):
                        row = model + label
                        if model.startswith("push "):
                            results.bare_push.add(row, "MB/s", p50_us)
                            print(f"   bare {row:70s} {p50_us:7,.0f} MB/s", flush=True)
                            continue
                        results.bare.add(row, "p50 us", p50_us)
                        results.bare.add(row, "x sockperf", p50_us / round_trip)
                        results.bare.add(row, "client switches", client_switches)
                        results.bare.add(row, "server switches", server_switches)
                        print(
                            f"   bare {row:70s} p50 {p50_us:6.1f} us, thread switches per round "
                            f"trip: client {client_switches:.1f}, server {server_switches:.1f}",
                            flush=True,
                        )
    return results


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def _size_table(
    rows: list[str], sizes: Sequence[int], columns: Sequence[tuple[str, Table, str]]
) -> list[str]:
    """A row per variant, and for every size a cell per (name, table, format) column."""
    names = [size_name(size) for size in sizes]
    lines = table_head("variant", *[f"{n} {column}" for n in names for column, _, _ in columns])
    for row in rows:
        cells = [_cell(table.median(row, n), form) for n in names for _, table, form in columns]
        lines.append(table_row(row, *cells))
    return lines


def report(results: Results) -> list[str]:
    lines = ["Raw TCP (median over repetitions):", "", *table_head("baseline", "figure")]
    for row in results.raw.rows():
        for column in ("MB/s", "p50 us"):
            value = results.raw.median(row, column)
            if value is not None:
                lines.append(f"| {row} | {value:,.1f} {column} |")
    lines += [
        "",
        "P2P bandwidth through the replay library (raw bytes; ratio to iperf3 one stream measured"
        " in the same repetition, to iperf3 -P 2 for the 2-channel row; CPU = client + server"
        " CPU time per MB moved):",
        "",
        *_size_table(
            results.bandwidth.rows(),
            BANDWIDTH_SIZES,
            [
                ("MB/s", results.bandwidth, ",.0f"),
                ("x iperf3", results.bandwidth_ratio, ".2f"),
                ("CPU us/MB", results.cpu_per_mb, ",.0f"),
            ],
        ),
        "",
        "P2P latency through the replay library (p50 round trip; ratio to sockperf's p50 of the"
        " same repetition):",
        "",
        *_size_table(
            results.latency.rows(),
            LATENCY_SIZES,
            [("p50 us", results.latency, ",.1f"), ("x sockperf", results.latency_ratio, ".1f")],
        ),
    ]
    if results.bare.rows():
        # Column -> format.
        columns = {
            "p50 us": ",.1f",
            "x sockperf": ".1f",
            "client switches": ".1f",
            "server switches": ".1f",
        }
        lines += [
            "",
            "Bare grpcio, 10 B echo, no replay code (thread switches = voluntary + involuntary"
            " context switches of all threads of the process, per round trip):",
            "",
            *table_head("client, server", *columns),
        ]
        for row in results.bare.rows():
            cells = [_cell(results.bare.median(row, c), form) for c, form in columns.items()]
            lines.append(table_row(row, *cells))
    if results.bare_push.rows():
        lines += [
            "",
            "Bare grpcio pushes (sync client, sync server with 64 threads, no replay code):",
            "",
            *table_head("push", "MB/s"),
        ]
        for row in results.bare_push.rows():
            lines.append(f"| {row} | {_cell(results.bare_push.median(row, 'MB/s'), ',.0f')} |")
    lines += [f"- {note}" for note in results.notes]
    return lines


def write_measured_section(
    lines: Sequence[str], command: str, before: str, after: str, reps: int
) -> None:
    section = [
        SECTION,
        "",
        "(written by `bench/replay_alternatives.py`; rerun it to replace this section)",
        "",
        f"Command: `{command}`; {reps} repetitions, every variant measured in every repetition"
        " right after that repetition's raw baselines; tables give medians over repetitions.",
        machine_line(before, after, load_remark=" (other work shares this machine)"),
        "",
        *lines,
    ]
    write_section(DOC, SECTION, "\n".join(section), title="# Performance")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each measurement")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the whole set")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare grpcio models")
    parser.add_argument(
        "--no-options", action="store_true", help="skip the grpc-core channel argument variants"
    )
    parser.add_argument("--no-write", action="store_true", help="leave docs/performance.md alone")
    parser.add_argument("--bare-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_only:
        print(json.dumps(bare_models(args.seconds)))
        return 0
    for tool in ("iperf3", "sockperf"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: {INSTALL_HINT}", file=sys.stderr)
            return 1
    command = command_line(__file__, argv or sys.argv[1:])
    before = load_average()
    results = measure(args.seconds, args.reps, not args.no_bare, not args.no_options)
    after = load_average()
    lines = report(results)
    print("\n".join(lines))
    if not args.no_write:
        write_measured_section(lines, command, before, after, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
