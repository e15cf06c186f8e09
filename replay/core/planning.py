"""From what a replay asks for to the workloads it runs, and the checks that they fit.

A request names benchmarks and either the paper's generators or a trace (and
perhaps a what-if cluster); ``synthetic_workloads`` and ``trace_workloads``
turn that into one workload per benchmark.  The checks refuse, with one
``ConfigError`` naming the culprit and before anything is allocated, what a
host could not run: more processes than allowed, messages over gRPC's size
limit or chunks too many to make, fewer targets than servers, more message
bytes in flight than memory.  The limits of this machine (its memory, its
process limit) arrive as plain numbers from the caller (``replay.runner``).

Pure: plain functions over workloads; no gRPC, no clock, no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay.core import whatif
from tf_grpc_bench.replay.core.benchmarks import spec_of
from tf_grpc_bench.replay.core.chunking import chunk_count, chunk_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import (
    MAX_TIME_DILATION,
    OPEN_LOOP_MAX_IN_FLIGHT,
    Pacing,
    keeps_recorded_window,
)
from tf_grpc_bench.replay.core.workload import Call, Mode, Workload
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import WHOLE_STEPS, WholeSteps, parse_pair

#: Most processes a replay starts on this host for one benchmark: ps servers (one
#: each) and the workers of a benchmark measured from worker processes (one each).
#: Beyond, a typo or a hostile trace.
MAX_LOCAL_PROCESSES = 64
#: Most calls one pass of a chunked workload may become (each call is an object in memory).
MAX_CALLS_PER_PASS = 1_000_000
#: Copies of a message one host holds while it travels on loopback: the sender's,
#: gRPC's and the receiver's.
MESSAGE_COPIES = 3


class MessageLimit(Protocol):
    """What fitting workloads to messages needs of the gRPC settings (``GrpcSettings``)."""

    @property
    def chunk_bytes(self) -> int: ...

    def check_payload(self, payload_bytes: int, *, what: str = "payload") -> None: ...


# --------------------------------------------------------------------------
# Workloads.


def synthetic_workloads(
    benchmarks: Sequence[Benchmark],
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> list[Workload]:
    """Each benchmark's workload over ``generator``'s payloads (its row's builder)."""
    return [
        spec_of(benchmark).build_synthetic(
            benchmark, generator, mode=mode, ps_count=ps_count, worker_count=worker_count
        )
        for benchmark in benchmarks
    ]


def what_if_of(
    trace: Trace,
    *,
    workers: int | None = None,
    ps: int | None = None,
    placement: whatif.Placement | None = None,
    scale_tensors: float | None = None,
) -> whatif.WhatIf | None:
    """The cluster a trace replay asks about: the captured one where a value is None,
    or None when every value is (no what-if).  ConfigError if the trace cannot be
    derived so (``whatif.check_what_if``)."""
    if workers is None and ps is None and placement is None and scale_tensors is None:
        return None
    captured_workers, captured_ps = whatif.captured_cluster(trace)
    what_if = whatif.WhatIf(
        workers=workers if workers is not None else len(captured_workers),
        ps=ps if ps is not None else len(captured_ps),
        placement=placement or whatif.Placement.ROUND_ROBIN,
        scale_tensors=scale_tensors if scale_tensors is not None else 1.0,
    )
    whatif.check_what_if(trace, what_if)
    return what_if


def trace_workloads(
    trace: Trace,
    benchmarks: Sequence[Benchmark],
    *,
    mode: Mode,
    source: str,
    trace_name: str,
    what_if: whatif.WhatIf | None = None,
    pair: str | None = None,
    whole_steps: WholeSteps = WHOLE_STEPS,
) -> tuple[list[Workload], whatif.Derivation | None]:
    """The trace's workload of each benchmark, of the ``what_if`` cluster if one is
    given, and how that cluster was derived (None for the captured one).

    ``pair``: the P2P benchmarks' (worker, ps) pair as ``worker:0,ps:1`` (default:
    the pair that moved the most bytes); ``source`` is recorded in each workload.
    """
    derivation = None
    if what_if is not None:
        derivation = whatif.derivation(trace, what_if, trace_name=trace_name)
        trace = whatif.derive_trace(trace, what_if)
    chosen_pair = parse_pair(pair, trace) if pair is not None else None
    workloads = [
        spec_of(benchmark).build_trace(
            trace, benchmark, mode=mode, pair=chosen_pair, source=source, whole_steps=whole_steps
        )
        for benchmark in benchmarks
    ]
    return workloads, derivation


# --------------------------------------------------------------------------
# Checks.


def check_server_processes(servers: int, procs_per_server: int) -> None:
    """ConfigError unless ``procs_per_server`` is in 1.. and the servers' processes stay
    within ``MAX_LOCAL_PROCESSES``."""
    if not 1 <= procs_per_server <= MAX_LOCAL_PROCESSES:
        raise ConfigError(
            f"--procs-per-server must be in 1..{MAX_LOCAL_PROCESSES}, got {procs_per_server}"
        )
    if servers * procs_per_server > MAX_LOCAL_PROCESSES:
        raise ConfigError(
            f"--procs-per-server {procs_per_server}: {servers} servers x {procs_per_server} "
            f"processes is more than {MAX_LOCAL_PROCESSES} processes on one host"
        )


def check_processes(workloads: Sequence[Workload], *, local_servers: bool, limit: int) -> None:
    """ConfigError if a workload needs more processes on this host than ``limit``:
    one per worker of a benchmark measured from worker processes (PS throughput), and
    one per ps server when ``local_servers``."""
    for workload in workloads:
        in_processes = spec_of(workload.benchmark).worker_processes
        if in_processes and workload.worker_count > limit:
            raise ConfigError(
                f"the {workload.source} workload has {workload.worker_count} workers, each a "
                f"process of its own: at most {limit} on one host"
            )
        if local_servers and workload.server_count > limit:
            raise ConfigError(
                f"the {workload.source} workload needs {workload.server_count} ps servers, each "
                f"a process of its own: at most {limit} on one host (or give --target)"
            )


def fitted_to_messages(workloads: Sequence[Workload], limit: MessageLimit) -> list[Workload]:
    """The workloads chunked as ``limit.chunk_bytes`` says (``--chunk-size``); ConfigError
    if a payload cannot be sent, or if chunks would be too many to make."""
    fitted = list(workloads)
    if limit.chunk_bytes:
        for workload in fitted:
            count = sum(chunk_count(call, limit.chunk_bytes) for call in workload.calls)
            if count > MAX_CALLS_PER_PASS:
                raise ConfigError(
                    f"--chunk-size {limit.chunk_bytes}: the {workload.benchmark.value} "
                    f"workload would become {count} calls (at most {MAX_CALLS_PER_PASS}); "
                    "use a larger --chunk-size"
                )
        fitted = [chunk_workload(workload, limit) for workload in fitted]
    for workload in fitted:
        limit.check_payload(max(call.payload_bytes for call in workload.calls))
    return fitted


def check_target_count(target_count: int | None, workloads: Sequence[Workload]) -> None:
    """ConfigError if ``target_count`` servers (None: local ones) are fewer than a
    workload needs."""
    if target_count is not None:
        needed = max(w.server_count for w in workloads)
        if target_count < needed:
            raise ConfigError(
                f"--target: the workload needs {needed} ps server(s), got {target_count} target(s)"
            )


def in_flight_bytes(workload: Workload, pacing: Pacing) -> tuple[int, int]:
    """The most message bytes (both ways) ``workload`` can have in flight at once under
    ``pacing``'s window, over all its workers; and the step where that happens."""
    worst, worst_step = 0, 0
    for step in workload.steps:
        groups: dict[tuple[int, int], list[Call]] = {}
        for call in step.calls:
            # The recorded window holds calls per (worker, server); the others per worker.
            server = call.server_index if keeps_recorded_window(pacing) else 0
            groups.setdefault((call.worker_index, server), []).append(call)
        total = 0
        for calls in groups.values():
            sizes = sorted((c.request_bytes + c.response_bytes for c in calls), reverse=True)
            if pacing.window is not None:
                at_once = pacing.window
            elif keeps_recorded_window(pacing):
                at_once = 1 + max(c.outstanding_at_start for c in calls)
            else:
                at_once = OPEN_LOOP_MAX_IN_FLIGHT
            total += sum(sizes[:at_once])
        if total > worst:
            worst, worst_step = total, step.index
    return worst, worst_step


def check_memory(
    workloads: Sequence[Workload],
    pacings: Sequence[Pacing],
    available_bytes: int | None,
    *,
    bound: str = "the machine's MemAvailable",
) -> None:
    """ConfigError if the messages a workload can have in flight (times the copies a
    host holds of each) do not fit in ``available_bytes`` (None: unknown, no check),
    the memory this process may take as ``bound`` says (``host.memory_room``)."""
    if available_bytes is None:
        return
    for workload, pacing in zip(workloads, pacings, strict=True):
        in_flight, step = in_flight_bytes(workload, pacing)
        needed = in_flight * MESSAGE_COPIES
        if needed > available_bytes:
            where = "" if workload.source == "synthetic" else f" (trace step {step})"
            raise ConfigError(
                f"the {workload.benchmark.value} workload can have {in_flight / 1e9:.2f} GB of "
                f"messages in flight at once{where}; with the copies sender, gRPC and receiver "
                f"hold that needs about {needed / 1e9:.1f} GB, more than the "
                f"{available_bytes / 1e9:.1f} GB of memory this process may take "
                f"(bounded by {bound}; smaller messages, fewer workers or a smaller "
                "--outstanding)"
            )


def parse_time_dilation(text: str | None, *, allow_auto: bool = False) -> float | None:
    """``--time-dilation``: a factor in [1, MAX_TIME_DILATION] (None: 1); ``auto`` (None)
    where ``allow_auto`` (network compare chooses per link)."""
    if text is None:
        return None if allow_auto else 1.0
    if allow_auto and text == "auto":
        return None
    expected = "'auto' or a factor" if allow_auto else "a factor"
    try:
        factor = float(text)
    except ValueError:
        raise UsageError(f"--time-dilation {text!r}: expected {expected} such as 4") from None
    if not 1 <= factor <= MAX_TIME_DILATION:
        raise UsageError(f"--time-dilation {text!r}: must be in [1, {MAX_TIME_DILATION:g}]")
    return factor
