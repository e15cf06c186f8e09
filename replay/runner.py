"""The runner: warm-up, measured duration and repetitions, around a workload and a pacing.

It owns the paper's protocol (2 s warm-up, 10 s measured, 5 runs by default)
for synthetic workloads (the payload cycle repeated for the duration) and for
traces (whole steps replayed in a loop for the duration, or exactly
``steps``/``passes`` of them, each step's replay time recorded), around the
workers an engine runs (``transport.seam``: a plan in, samples out): a
benchmark's row says whether its one worker runs in this process or every
worker in a process of its own (PS throughput, ``throughput``).

A server that fails mid-run ends the run and the benchmark: what was measured
is kept, marked partial with the reason.  ``run_benchmark`` is one benchmark;
``session`` carries out a whole request, ``request`` plans one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.benchmarks import (
    STREAMING_BANDWIDTH_WINDOW as STREAMING_BANDWIDTH_WINDOW,
)
from tf_grpc_bench.replay.core.benchmarks import RpcKind, default_window, spec_of
from tf_grpc_bench.replay.core.benchmarks import default_rpc as default_rpc
from tf_grpc_bench.replay.core.measurement import BenchmarkResult, RunMeasurement, in_link_time
from tf_grpc_bench.replay.core.pacing import (
    Pacing,
    Timing,
    check_processes_per_worker,
    check_source,
    timing_parameters,
)
from tf_grpc_bench.replay.core.processes import client_processes
from tf_grpc_bench.replay.core.workload import Shape, Workload
from tf_grpc_bench.replay.engines.registry import engine_named
from tf_grpc_bench.replay.fitting import format_client_namespaces
from tf_grpc_bench.replay.spec import DEFAULT_ENGINE
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.loop import (
    ProgressCallback,
    open_clients,
)
from tf_grpc_bench.replay.transport.loop import (
    ProgressEvent as ProgressEvent,
)
from tf_grpc_bench.replay.transport.loop import (
    RunPlan as RunPlan,
)
from tf_grpc_bench.replay.transport.seam import Engine, measure_runs, worker_jobs
from tf_grpc_bench.replay.transport.wire import ChannelSettings, new_session_id


def rpc_used(workload: Workload, rpc: RpcKind) -> RpcKind:
    """The RPC kind a workload's calls actually travel with: streams carry only echo
    and ack calls, so a trace's pulls stay unary whatever was asked."""
    if rpc is RpcKind.STREAMING and any(call.shape is not Shape.PULL for call in workload.calls):
        return RpcKind.STREAMING
    return RpcKind.UNARY


def default_pacing(workload: Workload) -> Pacing:
    """Closed loop, as fast as possible, with the benchmark's default window."""
    return Pacing(timing=Timing.ASAP, window=default_window(workload))


def _check_benchmark(
    workload: Workload, pacing: Pacing, plan: RunPlan, procs_per_worker: int
) -> None:
    """ConfigError for what a workload cannot be replayed with."""
    if workload.source == "synthetic" and (plan.steps is not None or plan.passes is not None):
        raise ConfigError("--steps/--passes apply to trace replays, not to --synthetic workloads")
    check_source(pacing.timing, workload.source)
    if spec_of(workload.benchmark).worker_processes:
        check_processes_per_worker(pacing.timing, procs_per_worker)


def _process_parameters(workload: Workload, procs_per_worker: int) -> dict[str, int]:
    """The client processes of a benchmark measured from worker processes: per worker
    (the most any has) and in all."""
    processes = client_processes(workload, procs_per_worker)
    return {"procs_per_worker": max(processes), "client_processes": sum(processes)}


def measure(
    engine: Engine,
    workload: Workload,
    targets: Sequence[str],
    clients: Mapping[int, ReplayClient],
    pacing: Pacing,
    plan: RunPlan,
    *,
    settings: ChannelSettings,
    on_progress: ProgressCallback | None = None,
    procs_per_worker: int = 1,
    client_namespaces: Mapping[str, str] | None = None,
) -> tuple[tuple[RunMeasurement, ...], dict[str, str | int | float | bool]]:
    """The benchmark's runs (``seam.measure_runs``) with ``engine``'s workers: one job
    per worker, from worker processes if its row says so, else its one worker here;
    and the compute load's result entries (``transport.load``), if it ran one."""
    in_processes = spec_of(workload.benchmark).worker_processes
    jobs = worker_jobs(
        workload,
        targets,
        pacing,
        plan,
        settings=settings,
        procs_per_worker=procs_per_worker if in_processes else 1,
        client_namespaces=client_namespaces if in_processes else None,
    )
    workers = engine.start_workers(
        jobs, in_process=not in_processes, round_barrier=workload.round_barrier
    )
    try:
        notify = on_progress or (lambda event: None)
        runs = measure_runs(workers, workload, clients, plan, notify)
    finally:
        workers.close()
    load = getattr(workers, "load", None)
    return runs, ({} if load is None else load.parameters())


def _result_parameters(
    workload: Workload,
    targets: Sequence[str],
    pacing: Pacing,
    plan: RunPlan,
    settings: ChannelSettings,
    *,
    engine: Engine,
    shared_with: int,
    procs_per_worker: int | None,
    namespaces: Mapping[str, str],
) -> dict[str, str | int | float | bool]:
    """Every parameter that shaped a benchmark's runs, for its result."""
    parameters: dict[str, str | int | float | bool] = {
        "mode": workload.mode.value,
        "pacing": pacing.timing.value,
        "outstanding": "recorded" if pacing.window is None else pacing.window,
        "targets": ",".join(targets[i] for i in workload.servers_used),
        "grpc": settings.describe(),
        "rpc": rpc_used(workload, settings.rpc).value,
        **workload.parameters(),
        **plan.parameters(),
        "server_other_sessions": shared_with,
        "engine": engine.name,
        "grpc_version": engine.version(),
    }
    if procs_per_worker is not None:
        parameters.update(_process_parameters(workload, procs_per_worker))
        if namespaces:
            parameters["client_netns"] = format_client_namespaces(namespaces)
    parameters.update(timing_parameters(pacing))
    return parameters


def run_benchmark(
    workload: Workload,
    targets: Sequence[str],
    *,
    pacing: Pacing | None = None,
    plan: RunPlan | None = None,
    settings: ChannelSettings | None = None,
    parameters: Mapping[str, str | int | float | bool] | None = None,
    on_progress: ProgressCallback | None = None,
    procs_per_worker: int = 1,
    client_namespaces: Mapping[str, str] | None = None,
    engine: Engine | None = None,
) -> BenchmarkResult:
    """Run one benchmark against servers at ``targets`` (indexed by ps server index)
    with ``engine`` (default: ``spec.DEFAULT_ENGINE``'s).

    A benchmark measured from worker processes (PS throughput) spreads each
    worker's calls over ``procs_per_worker`` client processes (``core.processes``)
    and places its clients that stand for tasks of a job in that job's named
    network namespace (``client_namespaces``, ``--client-netns``); the others have
    one worker in this process and ignore both.

    Checks every server first (reachable, same mode): ``TransportError`` or
    ``ConfigError`` if not; a failure after that yields a partial result.  The
    calls form one client session of their own on the servers (``settings.session``,
    made here when empty): servers shared with other clients count them apart.
    """
    plan = plan or RunPlan()
    pacing = pacing or default_pacing(workload)
    settings = settings or ChannelSettings()
    engine = engine or engine_named(DEFAULT_ENGINE)
    if not settings.session:
        settings = replace(settings, session=new_session_id())
    _check_benchmark(workload, pacing, plan, procs_per_worker)
    in_processes = spec_of(workload.benchmark).worker_processes
    namespaces = dict(client_namespaces or {}) if in_processes else {}
    clients = open_clients(workload, targets, settings=settings)
    try:
        for client in clients.values():
            client.check_server(plan.connect_timeout_s)
        runs, loaded = measure(
            engine,
            workload,
            targets,
            clients,
            pacing,
            plan,
            settings=settings,
            on_progress=on_progress,
            procs_per_worker=procs_per_worker,
            client_namespaces=namespaces,
        )
        # A dilated replay's times, in the time of the training it predicts.
        runs = tuple(in_link_time(run, pacing.time_dilation) for run in runs)
    finally:
        for client in clients.values():
            client.close()
    all_parameters = _result_parameters(
        workload,
        targets,
        pacing,
        plan,
        settings,
        engine=engine,
        # Other clients' sessions the servers served meanwhile: their CPU time is shared.
        shared_with=max(client.other_sessions_seen for client in clients.values()),
        procs_per_worker=procs_per_worker if in_processes else None,
        namespaces=namespaces,
    )
    all_parameters.update({**loaded, **(parameters or {})})
    partial_runs = [run for run in runs if run.partial]
    return BenchmarkResult(
        benchmark=workload.benchmark,
        workload=workload.source,
        parameters=all_parameters,
        runs=runs,
        partial=bool(partial_runs),
        partial_reason=partial_runs[0].partial_reason if partial_runs else "",
        inexact_sizes=workload.inexact_sizes,
    )
