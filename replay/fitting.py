"""Fitting a replay's workloads to this host: each one's RPC kind and pacing, and the checks.

``plan_workloads`` gives each workload its RPC kind (``rpc_for``) and pacing
(``pacing_for``: the benchmark's row's defaults, then ``pacing.resolve_pacing``)
and refuses, before anything is allocated, what cannot run here: more
processes than allowed, messages over gRPC's limit, more streams than a
server has threads for, fewer targets than servers, more bytes in flight
than this machine's memory (``core.planning`` holds the pure checks; what
this machine has comes in as plain numbers).  Also the client processes per
worker (``procs_per_worker_for``) and the network namespaces clients run in
(``check_client_namespaces``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench.errors import ConfigError, NetworkError, UsageError
from tf_grpc_bench.host import MemoryRoom
from tf_grpc_bench.netns import namespaces
from tf_grpc_bench.replay.core import planning
from tf_grpc_bench.replay.core.benchmarks import RpcKind, default_window, spec_of
from tf_grpc_bench.replay.core.pacing import (
    Pacing,
    PacingChoice,
    Timing,
    check_processes_per_worker,
    resolve_pacing,
    resolve_timing,
    timing_spec,
)
from tf_grpc_bench.replay.core.planning import MAX_LOCAL_PROCESSES, check_server_processes
from tf_grpc_bench.replay.core.processes import automatic_procs_per_worker
from tf_grpc_bench.replay.core.workload import Workload
from tf_grpc_bench.replay.transport.grpc_settings import GrpcSettings
from tf_grpc_bench.replay.transport.wire import ServerSettings

#: Server threads left for control calls when streams hold the others.
STREAM_THREADS_KEPT_FREE = 4


def rpc_for(workload: Workload, asked: RpcKind | None) -> RpcKind:
    """The RPC kind ``workload``'s calls use: ``asked`` (``--rpc``) or its default.
    UsageError for streaming a trace (its calls are TensorFlow's unary methods)."""
    if asked is None:
        return spec_of(workload.benchmark).defaults(workload.source).rpc
    if asked is RpcKind.STREAMING and workload.source == "trace":
        raise UsageError(
            "--rpc streaming applies to the synthetic echo and ack benchmarks; a trace is "
            "replayed with its own unary methods (add --synthetic)"
        )
    return asked


def _benchmark_paces(workload: Workload, choice: PacingChoice) -> str:
    default = spec_of(workload.benchmark).defaults(workload.source).timing
    timing = choice.timing if choice.timing is not None else default
    return f" (the {workload.benchmark.value} benchmark paces {timing.value})"


def timing_for(workload: Workload, choice: PacingChoice) -> Timing:
    """The timing ``workload`` paces with under ``choice`` (its row's default unless
    asked); PacingError for a setting that timing does not read (``--compute`` without
    dependencies pacing, ...)."""
    defaults = spec_of(workload.benchmark).defaults(workload.source)
    return resolve_timing(choice, defaults.timing, context=_benchmark_paces(workload, choice))


def pacing_for(workload: Workload, rpc: RpcKind, choice: PacingChoice) -> Pacing:
    """``workload``'s pacing as ``choice`` asks (``pacing.resolve_pacing``), with its
    row's window unless ``--outstanding`` sets one; PacingError for a setting its
    timing does not read (``--rate`` without rate pacing, ...)."""
    spec = spec_of(workload.benchmark)
    window = default_window(workload, rpc)
    if choice.outstanding is not None and not spec.one_call_at_a_time:
        window = choice.outstanding
    return resolve_pacing(
        choice,
        default=spec.defaults(workload.source).timing,
        window=window,
        context=_benchmark_paces(workload, choice),
    )


def check_stream_threads(
    workloads: Sequence[Workload], rpcs: Sequence[RpcKind], *, channels: int
) -> None:
    """ConfigError if streams (one per worker and channel) would hold more of a ps
    server's threads than it can spare from control calls."""
    room = ServerSettings().max_workers - STREAM_THREADS_KEPT_FREE
    for workload, rpc in zip(workloads, rpcs, strict=True):
        # A stream holds one server thread while open; leave threads for control calls.
        streams = workload.worker_count * channels
        if rpc is RpcKind.STREAMING and streams > room:
            raise ConfigError(
                f"--rpc streaming: {workload.worker_count} worker(s) x --channels "
                f"{channels} = {streams} streams per ps server, more than its "
                f"{room} stream threads; use fewer channels or --rpc unary"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """Workloads fitted to gRPC's messages, with each one's RPC kind and pacing."""

    workloads: tuple[Workload, ...]
    rpcs: tuple[RpcKind, ...]
    pacings: tuple[Pacing, ...]


def plan_workloads(
    workloads: Sequence[Workload],
    *,
    settings: GrpcSettings,
    targets: Sequence[str] | None,
    rpc: RpcKind | None,
    pacing: PacingChoice,
    memory: MemoryRoom | None = None,
) -> Planned:
    """Fit ``workloads`` to this host and the gRPC settings, and give each its RPC kind
    and pacing; ConfigError or UsageError, before anything is allocated, for what
    cannot run here (processes, message sizes, stream threads, targets, and the bytes
    in flight against the ``memory`` this process may take: None, unknown, not checked)."""
    planning.check_processes(workloads, local_servers=targets is None, limit=MAX_LOCAL_PROCESSES)
    fitted = planning.fitted_to_messages(workloads, settings)
    rpcs = tuple(rpc_for(workload, rpc) for workload in fitted)
    check_stream_threads(fitted, rpcs, channels=settings.channels)
    pacings = tuple(pacing_for(w, kind, pacing) for w, kind in zip(fitted, rpcs, strict=True))
    planning.check_target_count(None if targets is None else len(targets), fitted)
    if memory is not None:
        planning.check_memory(fitted, pacings, memory.available_bytes, bound=memory.bound)
    return Planned(workloads=tuple(fitted), rpcs=rpcs, pacings=pacings)


def check_procs_per_server(
    procs_per_server: int, workloads: Sequence[Workload], targets: Sequence[str] | None
) -> None:
    """UsageError or ConfigError for a replay's ``--procs-per-server`` it cannot have: its
    own servers only, within ``MAX_LOCAL_PROCESSES``."""
    if targets is not None and procs_per_server != 1:
        raise UsageError(
            "--procs-per-server applies to the servers a replay starts; with --target, give "
            "it to serve"
        )
    check_server_processes(max(w.server_count for w in workloads), procs_per_server)


def procs_per_worker_for(
    requested: int | None,
    workloads: Sequence[Workload],
    pacings: Sequence[Pacing] = (),
    *,
    server_processes: int,
    cores: int | None = None,
) -> int:
    """Client processes per worker of a benchmark measured from worker processes (PS
    throughput): ``requested``, or for None (``auto``) the ``cores`` this process may use
    (None: ask this machine), less the ``server_processes`` started here (0 for servers
    elsewhere), shared by the workers.

    ConfigError when the workers' processes would pass ``MAX_LOCAL_PROCESSES``, or
    for more than one under a timing whose settings are per process (``--pacing rate``).
    """
    in_processes = [w for w in workloads if spec_of(w.benchmark).worker_processes]
    if not in_processes:
        return requested or 1
    workers = max(w.worker_count for w in in_processes)
    per_process = [p.timing for p in pacings if timing_spec(p.timing).per_process]
    if per_process:
        check_processes_per_worker(per_process[0], requested)
        return 1
    if requested is None:
        automatic = automatic_procs_per_worker(
            cores=usable_cores() if cores is None else cores,
            workers=workers,
            servers=server_processes,
        )
        requested = max(1, min(automatic, MAX_LOCAL_PROCESSES // workers))
    if workers * requested > MAX_LOCAL_PROCESSES:
        raise ConfigError(
            f"--procs-per-worker {requested}: {workers} workers x {requested} client processes "
            f"is more than {MAX_LOCAL_PROCESSES} processes on one host"
        )
    return requested


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


def check_client_namespaces(
    placed: Sequence[tuple[str, str]],
    workloads: Sequence[Workload],
    targets: Sequence[str] | None,
    *,
    root: bool,
) -> tuple[tuple[str, str], ...]:
    """``--client-netns`` (job, namespace) pairs that this replay can honour: each job one
    that clients of a benchmark measured from worker processes stand for, each namespace
    there.  UsageError for a flag it cannot honour; NetworkError for a namespace that is
    not there or, not being ``root``, no right to enter one."""
    if not placed:
        return ()
    flag = f"--client-netns {format_client_namespaces(dict(placed))!r}"
    if targets is None:
        raise UsageError(
            f"{flag}: needs --target (servers started here listen on this namespace's loopback)"
        )
    jobs = {
        task.job
        for w in workloads
        if spec_of(w.benchmark).worker_processes
        for task in w.client_tasks
    }
    for job, _ in placed:
        if job not in jobs:
            named = ", ".join(sorted(jobs)) or "none (a trace's ps-throughput replay has them)"
            raise UsageError(f"{flag}: no client stands for a task of job {job!r}; jobs: {named}")
    for _, namespace in placed:
        try:
            namespaces.namespace_path(namespace)
        except NetworkError as missing:
            raise NetworkError(f"{flag}: {missing}") from None
    if not root:
        raise NetworkError(f"{flag}: entering a network namespace needs root")
    return tuple(placed)


def format_client_namespaces(namespaces: Mapping[str, str]) -> str:
    """``--client-netns``'s form of job -> namespace, for the result's parameters."""
    return ",".join(f"{job}={namespace}" for job, namespace in sorted(namespaces.items()))
