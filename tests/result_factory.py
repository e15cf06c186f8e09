"""Benchmark results that look like the engine's, built from plain data.

The outputs (JSON, TensorBoard, tables) only read ``BenchmarkResult``; the
engine's loopback tests cover producing them over real gRPC.  Values are drawn
from a seeded generator so a test can recompute what it expects.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    InexactSizes,
    RunMeasurement,
)
from tf_grpc_bench.replay.core.whatif import Derivation
from tf_grpc_bench.replay.output.document import ResultDocument, TraceInfo, build_document
from tf_grpc_bench.replay.output.machine import (
    InterfaceInfo,
    MachineInfo,
    NetworkInfo,
    RelayDirection,
)

#: Round-trip latency model: fixed cost plus a per-byte cost, in ns.
_BASE_NS = 180_000
_NS_PER_BYTE = 0.6


def make_run(
    *,
    run_index: int,
    sizes: tuple[int, ...],
    calls: int,
    rng: np.random.Generator,
    echo: bool = True,
    workers: int = 1,
    servers: int = 1,
    steps: int = 0,
    partial: bool = False,
) -> RunMeasurement:
    """One run of ``calls`` RPCs cycling through ``sizes`` (payload bytes)."""
    samples = []
    clock_ns = 0
    for index in range(calls):
        size = sizes[index % len(sizes)]
        latency_ns = int((_BASE_NS + _NS_PER_BYTE * size) * rng.lognormal(0.0, 0.25))
        samples.append(
            CallSample(
                start_ns=clock_ns,
                latency_ns=latency_ns,
                request_bytes=size if echo else 32,
                response_bytes=size,
                payload_bytes=size,
                server_index=index % servers,
                worker_index=(index // servers) % workers,
                step=(index * steps) // calls if steps else -1,
            )
        )
        clock_ns += latency_ns + int(rng.integers(1_000, 5_000))
    step_times = ()
    if steps:
        per_step: dict[int, int] = {}
        for sample in samples:
            per_step[sample.step] = per_step.get(sample.step, 0) + sample.latency_ns
        step_times = tuple(per_step[s] for s in sorted(per_step))
    received = sum(s.request_bytes for s in samples)
    return RunMeasurement(
        run_index=run_index,
        duration_ns=clock_ns,
        samples=tuple(samples),
        step_times_ns=step_times,
        client_cpu_ns=int(clock_ns * 0.8),
        server_cpu_ns=int(clock_ns * 0.6),
        server_received_bytes=received,
        server_received_messages=len(samples),
        partial=partial,
        partial_reason="server stopped answering" if partial else "",
    )


def make_results(*, seed: int = 7, runs: int = 3, calls: int = 40) -> list[BenchmarkResult]:
    """The three benchmarks, as ``tf-grpc-bench replay`` would produce them."""
    rng = np.random.default_rng(seed)
    common = {
        "mode": "non-serialized",
        "warmup_s": 0.0,
        "runs": runs,
        "target": "127.0.0.1:50001",
        "grpc.max_receive_message_length": 64 * 1024 * 1024,
    }
    latency = BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY,
        workload="synthetic",
        parameters={**common, "generator": "uniform", "buffers": 10, "sizes": "10B,10KB,1MB"},
        runs=tuple(
            make_run(run_index=i, sizes=(10, 10 * 1024, 1 << 20), calls=calls, rng=rng)
            for i in range(runs)
        ),
    )
    bandwidth = BenchmarkResult(
        benchmark=Benchmark.P2P_BANDWIDTH,
        workload="synthetic",
        parameters={**common, "generator": "uniform", "buffers": 10, "sizes": "1MB"},
        runs=tuple(
            make_run(run_index=i, sizes=(1 << 20,), calls=calls, rng=rng, echo=False)
            for i in range(runs)
        ),
    )
    throughput = BenchmarkResult(
        benchmark=Benchmark.PS_THROUGHPUT,
        workload="trace",
        parameters={**common, "pacing": "fast", "workers": 2, "ps": 2, "concurrent": True},
        runs=tuple(
            make_run(
                run_index=i,
                sizes=(21, 4096, 600_000, 2_400_000),
                calls=calls,
                rng=rng,
                echo=False,
                workers=2,
                servers=2,
                steps=4,
            )
            for i in range(runs)
        ),
    )
    return [latency, bandwidth, throughput]


#: The machine recorded in golden documents (fixed, so the file is reproducible).
GOLDEN_MACHINE = MachineInfo(
    hostname="golden-host",
    platform="Linux-6.1.0-x86_64-with-glibc2.36",
    kernel="6.1.0",
    cpu_model="Example CPU @ 2.0GHz",
    cpu_count=2,
    memory_bytes=8 * 1024**3,
    python_version="3.11.7",
    grpcio_version="1.85.3",
    protobuf_version="7.36.2",
    numpy_version="2.4.6",
    tensorboard_version="2.21.0",
)


def golden_document() -> ResultDocument:
    """The small document kept as ``tests/data/results-v<N>.json`` for the current version."""
    results = make_results(seed=11, runs=2, calls=6)
    # The last run of the throughput benchmark stopped early, as when a server dies.
    throughput = results[2]
    # Throughput replayed under dependencies pacing: planned releases, step
    # critical paths (format version 2), the trace RPC each call replayed (4).
    throughput = dataclasses.replace(
        throughput,
        runs=tuple(
            dataclasses.replace(
                run,
                samples=tuple(
                    dataclasses.replace(
                        sample,
                        release_lag_ns=1000 * (number + 1),
                        rpc_index=number % 4,
                        # Every third call held back by the window (format version 9).
                        window_held=int(number % 3 == 2),
                    )
                    for number, sample in enumerate(run.samples)
                ),
                step_times_ns=(300_000_000 + run.run_index, 310_000_000),
                step_compute_ns=(120_000_000, 125_000_000 + run.run_index),
                # The whole machine's CPU over the run (format version 5).
                machine_cpu_busy_ticks=93 + run.run_index,
                machine_cpu_total_ticks=100,
            )
            for run in throughput.runs
        ),
    )
    last = dataclasses.replace(
        throughput.runs[-1], partial=True, partial_reason="server 1 stopped answering"
    )
    results[2] = dataclasses.replace(
        throughput,
        runs=(*throughput.runs[:-1], last),
        partial=True,
        partial_reason="server 1 stopped answering",
    )
    # A serialized trace replay that could not encode every traced size (format version 3).
    results[0] = dataclasses.replace(
        results[0],
        inexact_sizes=InexactSizes(
            calls_per_pass=5, traced_bytes=130, replayed_bytes=120, examples="2 B -> 0 B x5"
        ),
    )
    document = build_document(
        results,
        config={"command": "replay", "runs": 2, "warmup_s": 0.0, "target": "127.0.0.1:50001"},
        trace_path=None,
        # An emulated link with a delay: its profile and its relay's lateness (version 6).
        network=NetworkInfo(
            name="10gbit-crossrack",
            addresses=("10.233.0.1:50001",),
            interfaces=(
                InterfaceInfo(
                    name="eth0", mtu_bytes=1500, speed_mbit_per_s=10, namespace="tfgb-12-ab-h1"
                ),
            ),
            emulated_rate_bits_per_s=10**10,
            emulation="tbf rate 10gbit burst 5000000B on eth0; relay 50us +- 10us one way",
            emulated_delay_ns=50_000,
            emulated_jitter_ns=10_000,
            emulated_loss=0.001,
            relays=(
                RelayDirection(
                    link="h0-h1",
                    direction="tfgb-12-ab-h1:eth0 -> tfgb-12-ab-h0:eth0",
                    delay_ns=50_000,
                    jitter_ns=10_000,
                    packets=1200,
                    bytes=9_000_000,
                    late_p50_ns=1_279,
                    late_p99_ns=30_719,
                    late_max_ns=41_000,
                    late_mean_ns=2_100,
                    late_histogram=((1216, 700), (1280, 480), (28672, 18), (40960, 2)),
                    behind="99% of releases within 31 us of their time, not 20 us",
                ),
            ),
        ),
        machine=GOLDEN_MACHINE,
        created=datetime(2026, 11, 29, 18, 0, 0, tzinfo=timezone.utc),
    )
    trace = TraceInfo(
        path="/opt/traces/resnet50-tf2ps.tfgbtrace",
        sha256="9f2c" + "0" * 60,
        model="resnet50",
        strategy="ParameterServerStrategy",
        tensorflow_version="2.21.0",
        format_version=1,
        step_count=4,
        # A partial trace (format version 6).
        partial_reason="the job looks hung: its tasks exchanged nothing for 120 s",
    )
    # A what-if replay of a larger cluster than captured (format version 5).
    what_if = Derivation(
        workers=4,
        ps=1,
        placement="round-robin",
        scale_tensors=1.0,
        trace="resnet50-tf2ps",
        captured_workers=2,
        captured_ps=2,
        variables=321,
    )
    return dataclasses.replace(document, trace=trace, what_if=what_if)


if __name__ == "__main__":
    # Regenerate the golden document of the current format version:
    #   .venv/bin/python -m tests.result_factory
    # Only when the format version changes, as a NEW file: old ones stay.
    from tf_grpc_bench.replay.output.document import FORMAT_VERSION
    from tf_grpc_bench.replay.output.document_writer import write_document

    target = Path(__file__).parent / "data" / f"results-v{FORMAT_VERSION}.json"
    if target.exists():
        raise SystemExit(f"{target} exists: golden files of released versions are never rewritten")
    write_document(golden_document(), target)
    print(target)
