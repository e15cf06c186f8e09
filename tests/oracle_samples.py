"""One fixed set of samples for the oracle tests of every writer, and the figures worked
out from it without the code under test.

The samples: a synthetic P2P-latency result (one call at a time, echoes of every
size-class boundary), a synthetic P2P-bandwidth result (requests of every boundary
answered by 8 B acknowledgements, two calls in flight) and a PS-throughput result
made of the calls of a small trace (``boundary_trace``: workers pull weights of
every boundary size from two ps, the ps pull gradients back, which a replay sends
as pushes whose request is the larger message), replayed under dependencies pacing
with overlapping calls (issued 50 us apart), over two runs of which the second
stopped early.  The same results make two documents, one per network (loopback,
a 1 Gbit/s link, the second's latencies slower), for the comparison.

Everything after ``# Figures worked out`` recomputes what a user should read from
the raw samples with plain Python: size classes by the larger message, percentiles
by linear interpolation, rates per run averaged over runs, calls in flight by brute
force, numbers shown to about three significant digits.  None of it imports the
modules it checks.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone

from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    RunMeasurement,
)
from tf_grpc_bench.replay.output.document import ResultDocument, TraceInfo, build_document
from tf_grpc_bench.replay.output.machine import MachineInfo, NetworkInfo
from tf_grpc_bench.trace import RECV_TENSOR, Rpc, RunMetadata, Step, Task, TensorInfo, Trace

#: Sizes on both sides of each class boundary (1 KiB, 1 MiB), and the extremes.
BOUNDARY_SIZES = (0, 1, 1023, 1024, 1025, 1_048_575, 1_048_576, 1_048_577, 10 << 20)
#: What a gradient pull's request and a weight pull's request weigh (a rendezvous key).
PULL_REQUEST_BYTES = 150
CREATED = datetime(2026, 12, 1, 9, 30, 0, tzinfo=timezone.utc)
MACHINE = MachineInfo(
    hostname="oracle-host",
    platform="Linux",
    kernel="6.1.0",
    cpu_model="Example CPU",
    cpu_count=4,
    memory_bytes=1 << 33,
    python_version="3.11.2",
    grpcio_version="1.85.0",
    protobuf_version="6.0.0",
    numpy_version="2.0.0",
    tensorboard_version="2.21.0",
)
#: The two networks of the comparison: (name, rate in bit/s, latency factor).
NETWORKS = (("loopback", 0, 1), ("veth-1gbit", 10**9, 3))
TASKS = (
    Task(job="ps", index=0, address="localhost:2000"),
    Task(job="ps", index=1, address="localhost:2001"),
    Task(job="worker", index=0, address="localhost:3000"),
    Task(job="worker", index=1, address="localhost:3001"),
)


def boundary_trace(steps: int = 3) -> Trace:
    """Two workers, two ps; per step each worker pulls a weight of each boundary size
    from one ps (alternating), and that ps pulls the gradient back from the worker.
    The tensors' names carry their step, so that a call found in the wrong step shows."""
    step_list = []
    clock = 1_000_000
    for index in range(steps):
        start = clock
        rpcs = []
        for worker in (2, 3):
            for number, size in enumerate(BOUNDARY_SIZES):
                ps = number % 2
                for caller, callee, edge in ((worker, ps, "w"), (ps, worker, "g")):
                    source, destination = TASKS[callee], TASKS[caller]
                    key = (
                        f"/job:{source.job}/replica:0/task:{source.index}/device:CPU:0;1;"
                        f"/job:{destination.job}/replica:0/task:{destination.index}/device:CPU:0;"
                        f"edge_{number}_{edge}{number}/step{index};0:0"
                    )
                    rpcs.append(
                        Rpc(
                            method=RECV_TENSOR,
                            caller_task=caller,
                            callee_task=callee,
                            request_bytes=PULL_REQUEST_BYTES,
                            response_bytes=size,
                            start_ns=clock,
                            response_start_ns=clock + 300,
                            end_ns=clock + 900,
                            tensor=TensorInfo(
                                rendezvous_key=key,
                                dtype="float32",
                                shape=(size // 4,),
                                content_bytes=size,
                            ),
                        )
                    )
                    clock += 1000
        step_list.append(Step(index=index, start_ns=start, end_ns=clock, rpcs=tuple(rpcs)))
        clock += 5000
    return Trace(
        metadata=RunMetadata(model="boundary", strategy="synthetic", batch_size=1),
        tasks=TASKS,
        steps=tuple(step_list),
    )


def _latency(size: int, number: int, run_index: int, factor: int) -> int:
    """A latency with a long tail, so that every percentile shows a figure of its own."""
    tail = int(50_000 * 1.7 ** (number % 13))
    return factor * (2 + run_index) * (100_000 + size // 40 + tail + 1_013 * number) // 2


def _sequential_run(
    run_index: int, pairs: Sequence[tuple[int, int]], factor: int, overlap: int = 1
) -> RunMeasurement:
    """Calls of (request, response) bytes; ``overlap`` of them issued together each time."""
    samples = []
    clock = 0
    for number, (request, response) in enumerate(pairs):
        latency = _latency(max(request, response), number, run_index, factor)
        samples.append(
            CallSample(
                start_ns=clock,
                latency_ns=latency,
                request_bytes=request,
                response_bytes=response,
                payload_bytes=max(request, response),
            )
        )
        if number % overlap == overlap - 1:
            clock = max(s.start_ns + s.latency_ns for s in samples) + 2_000
    duration = max(s.start_ns + s.latency_ns for s in samples) + 5_000
    return RunMeasurement(
        run_index=run_index,
        duration_ns=duration,
        samples=tuple(samples),
        client_cpu_ns=duration // 2,
        server_cpu_ns=duration // 3,
        server_received_bytes=sum(s.request_bytes for s in samples),
        server_received_messages=len(samples),
    )


def _trace_run(run_index: int, trace: Trace, factor: int, *, partial: bool) -> RunMeasurement:
    """Steps 1 and 2 of ``trace`` replayed: each RPC a sample of the worker that makes it
    (the gradient pulls as the worker's pushes, their request the gradient), calls of a
    step issued 50 us apart and overlapping."""
    samples = []
    step_times = []
    computes = []
    clock = 10_000
    for step in trace.steps[1:]:
        ends = {2: clock, 3: clock}
        for number, rpc in enumerate(step.rpcs):
            pushed = trace.tasks[rpc.caller_task].job == "ps"
            worker_task = rpc.callee_task if pushed else rpc.caller_task
            server_task = rpc.caller_task if pushed else rpc.callee_task
            request, response = (
                (rpc.response_bytes, rpc.request_bytes)
                if pushed
                else (rpc.request_bytes, rpc.response_bytes)
            )
            start = clock + 50_000 * number
            serial = len(samples)
            latency = _latency(max(request, response), serial, run_index, factor)
            samples.append(
                CallSample(
                    start_ns=start,
                    latency_ns=latency,
                    request_bytes=request,
                    response_bytes=response,
                    payload_bytes=max(request, response),
                    server_index=TASKS[server_task].index,
                    worker_index=TASKS[worker_task].index,
                    step=step.index,
                    release_lag_ns=100 * number,
                    rpc_index=number,
                )
            )
            ends[worker_task] = max(ends[worker_task], start + latency)
        for worker in (2, 3):
            # Skewed: worker 1's later steps longer, so mean and median differ.
            step_times.append(ends[worker] - clock + 1_500_000 * (worker - 2) * step.index)
            computes.append(2_000 * step.index + 500 * worker)
        clock = max(ends.values()) + 20_000
    return RunMeasurement(
        run_index=run_index,
        duration_ns=clock,
        samples=tuple(samples),
        step_times_ns=tuple(step_times),
        step_compute_ns=tuple(computes),
        client_cpu_ns=clock // 2 + run_index,
        server_cpu_ns=clock // 4,
        server_received_bytes=sum(s.request_bytes for s in samples),
        server_received_messages=len(samples),
        machine_cpu_busy_ticks=40 + run_index,
        machine_cpu_total_ticks=100,
        partial=partial,
        partial_reason="server 1 stopped answering" if partial else "",
    )


def results(factor: int = 1) -> list[BenchmarkResult]:
    """The three benchmarks of the fixed sample set (latencies times ``factor``)."""
    trace = boundary_trace()
    echoes = [(size, size) for size in BOUNDARY_SIZES]
    pushes = [(size, 8) for size in BOUNDARY_SIZES]
    common = {"mode": "non-serialized", "runs": 2, "warmup_s": 0.0, "rpc": "unary"}
    tasks = {
        "server_tasks": "/job:ps/task:0,/job:ps/task:1",
        "client_tasks": "/job:worker/task:0,/job:worker/task:1",
    }
    return [
        BenchmarkResult(
            benchmark=Benchmark.P2P_LATENCY,
            workload="synthetic",
            parameters={**common, "generator": "uniform", "pacing": "asap", "outstanding": 1},
            runs=tuple(_sequential_run(i, echoes, factor) for i in range(2)),
        ),
        BenchmarkResult(
            benchmark=Benchmark.P2P_BANDWIDTH,
            workload="synthetic",
            parameters={**common, "generator": "uniform", "pacing": "asap", "outstanding": 2},
            runs=tuple(_sequential_run(i, pushes, factor, overlap=2) for i in range(2)),
        ),
        BenchmarkResult(
            benchmark=Benchmark.PS_THROUGHPUT,
            workload="trace",
            parameters={
                **common,
                **tasks,
                "pacing": "dependencies",
                "compute_scale": 1.0,
                "outstanding": "recorded",
                "grpc_channels": 2,
            },
            runs=(
                _trace_run(0, trace, factor, partial=False),
                _trace_run(1, trace, factor, partial=True),
            ),
            partial=True,
            partial_reason="server 1 stopped answering",
        ),
    ]


TRACE_INFO = TraceInfo(
    path="/traces/boundary.tfgbtrace",
    sha256="ab" * 32,
    model="boundary",
    strategy="synthetic",
    tensorflow_version="",
    format_version=3,
    step_count=3,
)


def documents() -> list[ResultDocument]:
    """One document per network of ``NETWORKS``, each holding the three benchmarks."""
    made = []
    for number, (name, rate, factor) in enumerate(NETWORKS):
        document = build_document(
            results(factor),
            config={"command": "replay", "runs": 2},
            trace_path=None,
            network=NetworkInfo(
                name=name,
                addresses=("127.0.0.1:50001",),
                emulated_rate_bits_per_s=rate,
                emulation="tbf" if rate else "",
            ),
            machine=MACHINE,
            created=CREATED.replace(minute=number),
        )
        made.append(dataclasses.replace(document, trace=TRACE_INFO))
    return made


# --------------------------------------------------------------------------
# Figures worked out from the samples, without the code under test.

#: The size classes by the larger of a call's two messages: [0, 1 KiB), [1 KiB, 1 MiB), 1 MiB+.
CLASSES = ("small", "medium", "large")


def size_class(sample: CallSample) -> str:
    larger = max(sample.request_bytes, sample.response_bytes)
    return "small" if larger < 1024 else "medium" if larger < 1024 * 1024 else "large"


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the two nearest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


#: (name in tables and tags, how to get it from values)
STATISTICS = ("count", "mean", "min", "p50", "p90", "p99", "p999", "max")


def summary(values: Sequence[float]) -> dict[str, float]:
    """count, mean, min, p50, p90, p99, p999, max; NaN figures for no values."""
    if not values:
        return {"count": 0, **{name: math.nan for name in STATISTICS[1:]}}
    return {
        "count": len(values),
        "mean": sum(values) / len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "p999": percentile(values, 99.9),
        "max": max(values),
    }


def samples_of(result: BenchmarkResult) -> list[CallSample]:
    return [s for run in result.runs for s in run.samples]


def latency(result: BenchmarkResult, size: str = "all") -> dict[str, float]:
    """The latency summary of one size class (``all``: every sample), runs pooled."""
    return summary([s.latency_ns for s in samples_of(result) if size in ("all", size_class(s))])


def classes_present(result: BenchmarkResult) -> list[str]:
    found = {size_class(s) for s in samples_of(result)}
    return [c for c in CLASSES if c in found]


def run_rpcs_per_s(run: RunMeasurement) -> float:
    return len(run.samples) / (run.duration_ns / 1e9)


def run_mb_per_s(run: RunMeasurement) -> float:
    moved = sum(s.request_bytes + s.response_bytes for s in run.samples)
    return moved / (run.duration_ns / 1e9) / 1e6


def rpcs_per_s(result: BenchmarkResult) -> float:
    return sum(run_rpcs_per_s(r) for r in result.runs) / len(result.runs)


def mb_per_s(result: BenchmarkResult) -> float:
    return sum(run_mb_per_s(r) for r in result.runs) / len(result.runs)


def step_times(result: BenchmarkResult) -> list[int]:
    return [t for run in result.runs for t in run.step_times_ns]


def step_computes(result: BenchmarkResult) -> list[int]:
    return [t for run in result.runs for t in run.step_compute_ns]


def cpu_cores(cpu_ns: int, result: BenchmarkResult) -> float:
    return cpu_ns / sum(run.duration_ns for run in result.runs)


def prediction(result: BenchmarkResult) -> dict[str, float] | None:
    """The predicted step: medians of the replayed steps, their compute and the rest."""
    if not step_computes(result):
        return None
    communication = [
        total - compute
        for run in result.runs
        for total, compute in zip(run.step_times_ns, run.step_compute_ns, strict=True)
    ]
    return {
        "step": percentile(step_times(result), 50),
        "compute": percentile(step_computes(result), 50),
        "communication": percentile(communication, 50),
    }


def in_flight(samples: Sequence[CallSample]) -> list[int]:
    """For each call, the calls open when it was issued (itself included), by brute force."""
    counts = []
    for sample in samples:
        open_calls = sum(
            1
            for other in samples
            if other.start_ns <= sample.start_ns < other.start_ns + other.latency_ns
        )
        counts.append(max(open_calls, 1))
    return counts


def median_in_flight(result: BenchmarkResult) -> float:
    return percentile([n for run in result.runs for n in in_flight(run.samples)], 50)


def shown(value: float) -> str:
    """A figure as the tables show it: about three significant digits, "-" for none."""
    if math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def is_partial(result: BenchmarkResult) -> bool:
    return result.partial or any(run.partial for run in result.runs)


def task_name(trace: Trace, index: int) -> str:
    task = trace.tasks[index]
    return f"/job:{task.job}/task:{task.index}"


def tensor_label(rpc: Rpc) -> str:
    """The rendezvous key's edge without its ``edge_<n>_`` prefix."""
    assert rpc.tensor is not None
    edge = rpc.tensor.rendezvous_key.split(";")[3]
    return re.sub(r"^edge_[0-9]+_", "", edge)


def traced_rpc(trace: Trace, sample: CallSample) -> Rpc:
    (step,) = [s for s in trace.steps if s.index == sample.step]
    return step.rpcs[sample.rpc_index]
