"""The runner: warm-up, measured duration and repetitions, around a workload and a pacing.

It owns the paper's protocol (2 s warm-up, 10 s measured, 5 runs by default)
for synthetic workloads (the payload cycle repeated for the duration) and for
traces (whole steps replayed in a loop for the duration, or exactly
``steps``/``passes`` of them, each step's replay time recorded).  Point-to-
point benchmarks run their one worker in this process; PS throughput runs
one process per worker (``throughput``).

A server that fails mid-run ends the run and the benchmark: what was measured
is kept, marked partial with the reason.

``plan_workloads`` gives a request's workloads their RPC kind and pacing and
checks that they fit this host (its memory, its servers' threads, the process
limit; the pure checks are ``core.planning``'s), ``execute`` carries out a
whole ``ReplayRequest`` (servers, benchmarks) and ``record`` writes what it
measured (result document, TensorBoard logs): the library behind ``replay``,
``role`` and ``network compare``.  ``serve_until_stopped`` is ``serve``'s
servers, until a stop signal.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tf_grpc_bench import lifetime, trace_files
from tf_grpc_bench.errors import ConfigError, NetworkError, TransportError, UsageError
from tf_grpc_bench.host import memory_room
from tf_grpc_bench.netns import namespaces
from tf_grpc_bench.replay.core import planning
from tf_grpc_bench.replay.core.benchmarks import (
    STREAMING_BANDWIDTH_WINDOW as STREAMING_BANDWIDTH_WINDOW,
)
from tf_grpc_bench.replay.core.benchmarks import RpcKind, spec_of
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    RunMeasurement,
    in_link_time,
)
from tf_grpc_bench.replay.core.pacing import (
    Pacing,
    PacingChoice,
    Timing,
    check_processes_per_worker,
    check_source,
    resolve_pacing,
    resolve_timing,
    timing_parameters,
    timing_spec,
)
from tf_grpc_bench.replay.core.processes import automatic_procs_per_worker
from tf_grpc_bench.replay.core.whatif import Derivation, derive_trace
from tf_grpc_bench.replay.core.workload import Mode, Shape, Workload
from tf_grpc_bench.replay.network import netinfo
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_writer import write_document
from tf_grpc_bench.replay.transport import grpc_settings
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.driver import Driver
from tf_grpc_bench.replay.transport.local_servers import LocalServers, serve_until
from tf_grpc_bench.replay.transport.loop import (
    ProgressCallback,
    ProgressEvent,
    RunPlan,
    WorkerLoop,
    failed_run,
    interrupted_reason,
    interrupted_run,
    open_clients,
    run_each,
)
from tf_grpc_bench.replay.transport.wire import (
    ChannelSettings,
    ServerSettings,
    new_session_id,
)

# --------------------------------------------------------------------------
# Benchmarks.


#: Most processes a replay starts on this host for one benchmark: ps servers (one
#: each) and PS-throughput workers (one each).  Beyond, a typo or a hostile trace.
MAX_LOCAL_PROCESSES = 64


def default_window(workload: Workload, rpc: RpcKind = RpcKind.UNARY) -> int | None:
    """Calls in flight a benchmark allows unless told otherwise (None: the recorded
    concurrency), as its row says (``benchmarks.Defaults``).

    Latency: one call at a time.  Bandwidth: one outstanding call for the
    paper's synthetic benchmark (send, wait for the ack, send again), or
    ``STREAMING_BANDWIDTH_WINDOW`` messages on a stream; the recorded
    concurrency for a trace.  Throughput: the recorded concurrency
    (synthetic: one call in flight per (worker, ps) pair, all ps at once).
    """
    defaults = spec_of(workload.benchmark).defaults(workload.source)
    return defaults.streaming_window if rpc is RpcKind.STREAMING else defaults.window


def default_rpc(workload: Workload) -> RpcKind:
    """The RPC kind a benchmark uses unless told otherwise (its row): streaming for
    synthetic P2P bandwidth (measured faster and cheaper per MB, ``docs/performance.md``),
    unary for everything else (the paper's and TensorFlow's one call per tensor)."""
    return spec_of(workload.benchmark).defaults(workload.source).rpc


def rpc_used(workload: Workload, rpc: RpcKind) -> RpcKind:
    """The RPC kind a workload's calls actually travel with: streams carry only echo
    and ack calls, so a trace's pulls stay unary whatever was asked."""
    if rpc is RpcKind.STREAMING and any(call.shape is not Shape.PULL for call in workload.calls):
        return RpcKind.STREAMING
    return RpcKind.UNARY


def default_pacing(workload: Workload) -> Pacing:
    """Closed loop, as fast as possible, with the benchmark's default window."""
    return Pacing(timing=Timing.ASAP, window=default_window(workload))


def measure_point_to_point(
    workload: Workload,
    clients: Mapping[int, ReplayClient],
    pacing: Pacing,
    plan: RunPlan,
    *,
    on_progress: ProgressCallback | None = None,
) -> tuple[RunMeasurement, ...]:
    """Warm up, then ``plan.runs`` measured runs of a one-worker workload in this process."""
    driver = Driver(clients, pacing, timeout_s=plan.deadline_s)
    driver.prepare(workload.steps)
    loop = WorkerLoop(workload, driver)
    runs: list[RunMeasurement] = []
    try:
        _measure_runs(workload, clients, loop, plan, runs, on_progress)
    except KeyboardInterrupt as interrupt:
        # Between runs or in the warm-up: a measured run keeps its calls itself.
        runs.append(interrupted_run(len(runs), interrupt))
    return tuple(runs)


def _measure_runs(
    workload: Workload,
    clients: Mapping[int, ReplayClient],
    loop: WorkerLoop,
    plan: RunPlan,
    runs: list[RunMeasurement],
    on_progress: ProgressCallback | None,
) -> None:
    """Warm-up and runs; appends each run to ``runs`` as it ends."""
    notify = on_progress or (lambda event: None)
    notify(ProgressEvent(benchmark=workload.benchmark, phase="warmup", run_index=0, runs=plan.runs))
    try:
        loop.warm_up(plan.warmup_ns)
    except TransportError as error:
        runs.append(failed_run(0, f"during warm-up: {error}"))
        return
    run_each(
        workload,
        clients,
        plan,
        runs,
        notify,
        lambda: [
            loop.measure(duration_ns=plan.duration_ns, step_count=plan.steps_per_run(workload))
        ],
    )


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
    """PS throughput's client processes: per worker (the most any has) and in all."""
    from tf_grpc_bench.replay.throughput import client_processes

    processes = client_processes(workload, procs_per_worker)
    return {"procs_per_worker": max(processes), "client_processes": sum(processes)}


def _measure(
    workload: Workload,
    targets: Sequence[str],
    clients: Mapping[int, ReplayClient],
    pacing: Pacing,
    plan: RunPlan,
    settings: ChannelSettings,
    on_progress: ProgressCallback | None,
    procs_per_worker: int,
    client_namespaces: Mapping[str, str],
) -> tuple[RunMeasurement, ...]:
    """The benchmark's runs: from worker processes (PS throughput), or from here."""
    if not spec_of(workload.benchmark).worker_processes:
        return measure_point_to_point(workload, clients, pacing, plan, on_progress=on_progress)
    from tf_grpc_bench.replay.throughput import measure_throughput

    return measure_throughput(
        workload,
        targets,
        clients,
        pacing,
        plan,
        settings=settings,
        on_progress=on_progress,
        procs_per_worker=procs_per_worker,
        client_namespaces=client_namespaces,
    )


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
) -> BenchmarkResult:
    """Run one benchmark against servers at ``targets`` (indexed by ps server index).

    PS throughput spreads each worker's calls over ``procs_per_worker`` client
    processes (``core.processes``); the other benchmarks have one worker in this
    process and ignore it.  ``client_namespaces`` (job -> named network namespace)
    places PS throughput's clients that stand for tasks of a job in that namespace
    (``--client-netns``); the others stay in this process's.

    Checks every server first (reachable, same mode): ``TransportError`` or
    ``ConfigError`` if not.  A failure after that yields a partial result.
    The benchmark's calls form one client session of their own on the servers
    (``settings.session``, made here when empty), so servers shared with other
    clients count this benchmark's calls apart.
    """
    plan = plan or RunPlan()
    pacing = pacing or default_pacing(workload)
    settings = settings or ChannelSettings()
    if not settings.session:
        settings = replace(settings, session=new_session_id())
    _check_benchmark(workload, pacing, plan, procs_per_worker)
    throughput = spec_of(workload.benchmark).worker_processes
    clients = open_clients(workload, targets, settings=settings)
    try:
        for client in clients.values():
            client.check_server(plan.connect_timeout_s)
        namespaces = dict(client_namespaces or {}) if throughput else {}
        measuring = (pacing, plan, settings, on_progress, procs_per_worker, namespaces)
        runs = _measure(workload, targets, clients, *measuring)
        # A dilated replay's times, in the time of the training it predicts.
        runs = tuple(in_link_time(run, pacing.time_dilation) for run in runs)
    finally:
        for client in clients.values():
            client.close()
    shared_with = max(client.other_sessions_seen for client in clients.values())
    partial_runs = [run for run in runs if run.partial]
    all_parameters: dict[str, str | int | float | bool] = {
        "mode": workload.mode.value,
        "pacing": pacing.timing.value,
        "outstanding": "recorded" if pacing.window is None else pacing.window,
        "targets": ",".join(targets[i] for i in workload.servers_used),
        "grpc": settings.describe(),
        "rpc": rpc_used(workload, settings.rpc).value,
        **workload.parameters(),
        **plan.parameters(),
        # Other clients' sessions the servers served meanwhile: their CPU time is shared.
        "server_other_sessions": shared_with,
    }
    if throughput:
        all_parameters.update(_process_parameters(workload, procs_per_worker))
        if namespaces:
            all_parameters["client_netns"] = format_client_namespaces(namespaces)
    all_parameters.update(timing_parameters(pacing))
    all_parameters.update(parameters or {})
    return BenchmarkResult(
        benchmark=workload.benchmark,
        workload=workload.source,
        parameters=all_parameters,
        runs=runs,
        partial=bool(partial_runs),
        partial_reason=partial_runs[0].partial_reason if partial_runs else "",
        inexact_sizes=workload.inexact_sizes,
    )


# --------------------------------------------------------------------------
# A replay request: what ``replay`` (and ``role``) was asked to do, carried out.


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


def parse_client_namespaces(
    text: str, workloads: Sequence[Workload], targets: Sequence[str] | None
) -> tuple[tuple[str, str], ...]:
    """``--client-netns JOB=NAMESPACE[,JOB=NAMESPACE...]``: the named network namespace
    PS throughput's clients standing for tasks of JOB run in (``network compare``
    puts a ps's side client on the ps tasks' emulated host).  UsageError for a flag
    it cannot honour; NetworkError for a namespace that is not there or no root."""
    if not text.strip():
        return ()
    flag = f"--client-netns {text!r}"
    if targets is None:
        raise UsageError(
            f"{flag}: needs --target (servers started here listen on this namespace's loopback)"
        )
    placed: dict[str, str] = {}
    for item in text.split(","):
        job, equals, namespace = (part.strip() for part in item.partition("="))
        if not equals or not job or not namespace:
            raise UsageError(f"{flag}: expected JOB=NAMESPACE[,JOB=NAMESPACE...]")
        if job in placed:
            raise UsageError(f"{flag}: job {job!r} given twice")
        placed[job] = namespace
    jobs = {
        task.job
        for w in workloads
        if spec_of(w.benchmark).worker_processes
        for task in w.client_tasks
    }
    for job in placed:
        if job not in jobs:
            named = ", ".join(sorted(jobs)) or "none (a trace's ps-throughput replay has them)"
            raise UsageError(f"{flag}: no client stands for a task of job {job!r}; jobs: {named}")
    for namespace in placed.values():
        try:
            namespaces.namespace_path(namespace)
        except NetworkError as missing:
            raise NetworkError(f"{flag}: {missing}") from None
    if os.geteuid() != 0:
        raise NetworkError(f"{flag}: entering a network namespace needs root")
    return tuple(placed.items())


def format_client_namespaces(namespaces: Mapping[str, str]) -> str:
    """``--client-netns``'s form of job -> namespace, for the result's parameters."""
    return ",".join(f"{job}={namespace}" for job, namespace in sorted(namespaces.items()))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


def procs_per_worker_for(
    requested: int | None,
    workloads: Sequence[Workload],
    pacings: Sequence[Pacing] = (),
    *,
    server_processes: int,
) -> int:
    """Client processes per PS-throughput worker: ``requested``, or for None (``auto``)
    the cores this process may use, less the ``server_processes`` started here (0 for
    servers elsewhere), shared by the workers.

    ConfigError when the workers' processes would pass ``MAX_LOCAL_PROCESSES``, or
    for more than one under a timing whose settings are per process (``--pacing rate``).
    """
    throughput = [w for w in workloads if spec_of(w.benchmark).worker_processes]
    if not throughput:
        return requested or 1
    workers = max(w.worker_count for w in throughput)
    per_process = [p.timing for p in pacings if timing_spec(p.timing).per_process]
    if per_process:
        check_processes_per_worker(per_process[0], requested)
        return 1
    if requested is None:
        automatic = automatic_procs_per_worker(
            cores=usable_cores(), workers=workers, servers=server_processes
        )
        requested = max(1, min(automatic, MAX_LOCAL_PROCESSES // workers))
    if workers * requested > MAX_LOCAL_PROCESSES:
        raise ConfigError(
            f"--procs-per-worker {requested}: {workers} workers x {requested} client processes "
            f"is more than {MAX_LOCAL_PROCESSES} processes on one host"
        )
    return requested


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRequest:
    """What ``replay`` was asked to do, validated."""

    benchmarks: tuple[Benchmark, ...]
    trace_path: Path | None
    workloads: tuple[Workload, ...]
    pacings: tuple[Pacing, ...]
    #: How each workload's echo and ack calls travel.
    rpcs: tuple[RpcKind, ...]
    plan: RunPlan
    mode: Mode
    targets: tuple[str, ...] | None
    grpc: grpc_settings.GrpcSettings
    config: dict[str, str | int | float | bool]
    #: The gRPC settings as result parameters.
    grpc_parameters: dict[str, str | int | float | bool]
    #: The servers' control-call token (``--token-file``); never recorded.
    control_token: str | None = field(default=None, repr=False)
    #: A what-if replay: the cluster asked about and the trace it was derived from
    #: (``core.whatif``); None for the captured cluster.
    what_if: Derivation | None = None
    #: PS throughput: client processes per worker (``--procs-per-worker``, resolved).
    procs_per_worker: int = 1
    #: PS throughput: job -> named network namespace its clients run in (``--client-netns``).
    client_namespaces: tuple[tuple[str, str], ...] = ()
    #: Servers started here: processes per ps server (``--procs-per-server``).
    procs_per_server: int = 1


def run_label(request: ReplayRequest) -> str:
    """The name a run directory of ``request`` starts with: where and what."""
    where = "remote" if request.targets is not None else "loopback"
    what = request.trace_path.stem if request.trace_path is not None else "synthetic"
    if request.what_if is not None:
        what += f"-whatif-{request.what_if.workers}w{request.what_if.ps}ps"
    return f"{where}-{what}"


@contextlib.contextmanager
def replay_servers(
    request: ReplayRequest, server_settings: ServerSettings
) -> Iterator[tuple[tuple[str, ...], bool]]:
    """The targets to replay against: given, or servers started here (stopped afterwards)."""
    if request.targets is not None:
        yield request.targets, False
        return
    count = max(w.server_count for w in request.workloads)
    with LocalServers(
        count,
        mode=request.mode,
        settings=server_settings,
        procs_per_server=request.procs_per_server,
    ) as servers:
        yield tuple(servers.targets), True


@dataclass(frozen=True, slots=True, kw_only=True)
class Executed:
    """What ``execute`` measured, against which targets."""

    results: tuple[BenchmarkResult, ...]
    targets: tuple[str, ...]
    #: Whether the targets were servers started here.
    local: bool
    #: Why the replay stopped between benchmarks when no result says so itself
    #: (a stop signal after one benchmark ended); "" otherwise.
    stopped_reason: str = ""


def execute(
    request: ReplayRequest,
    *,
    tls_dir: Path | None = None,
    on_progress: ProgressCallback | None = None,
) -> Executed:
    """Run the requested benchmarks against the given targets or servers started here.

    Stops after a benchmark that ended partial (its servers are likely gone).
    A stop signal (``KeyboardInterrupt``) ends the benchmark under way with
    what it measured; one between benchmarks keeps those done, and one before
    anything was measured propagates.
    """
    material = None
    if request.grpc.tls:
        # cryptography is imported only by runs that use TLS.
        from tf_grpc_bench.replay.transport import tls

        material = tls.ensure_material(tls_dir)
    channel_settings = replace(
        grpc_settings.channel_settings(request.grpc, material),
        control_token=request.control_token,
    )
    server_settings = replace(
        grpc_settings.server_settings(request.grpc, material),
        control_token=request.control_token,
    )
    measured: list[BenchmarkResult] = []
    targets: tuple[str, ...] = ()
    local = False
    try:
        with replay_servers(request, server_settings) as (targets, local):
            for workload, pacing, rpc in zip(
                request.workloads, request.pacings, request.rpcs, strict=True
            ):
                result = run_benchmark(
                    workload,
                    targets,
                    pacing=pacing,
                    plan=request.plan,
                    settings=replace(channel_settings, rpc=rpc),
                    parameters=request.grpc_parameters,
                    on_progress=on_progress,
                    procs_per_worker=request.procs_per_worker,
                    client_namespaces=dict(request.client_namespaces),
                )
                measured.append(result)
                if result.partial:
                    break
    except KeyboardInterrupt as interrupt:
        if not measured:
            raise
        reason = interrupted_reason(lifetime.signal_of(interrupt))
        return Executed(
            results=tuple(measured),
            targets=targets,
            local=local,
            stopped_reason=f"{reason} after {measured[-1].benchmark.value}",
        )
    return Executed(results=tuple(measured), targets=targets, local=local)


def record(
    request: ReplayRequest,
    executed: Executed,
    run_directory: Path,
    *,
    network_name: str = "",
) -> results.ResultDocument:
    """Write the result document, TensorBoard logs and timelines of a replay into ``run_directory``.

    The timelines (``output.timeline``): each benchmark's first measured steps
    next to the trace's, as trace-event JSON in ``<run>/timeline/`` and for
    TensorBoard's Profile tab.  Stop signals wait until all are written
    (``lifetime.deferred_signals``).
    """
    with lifetime.deferred_signals():
        # The TensorBoard writer is imported only when there is something to write (a
        # while, on a loaded machine: a stop signal then waits too).
        from tf_grpc_bench.replay.output import tensorboard, timeline

        network = netinfo.describe_network(executed.targets, name=network_name)
        network = netinfo.undilated(network, request.plan.time_dilation)
        document = results.build_document(
            executed.results,
            config=request.config,
            trace_path=request.trace_path,
            network=network,
            what_if=request.what_if,
        )
        if executed.stopped_reason:
            reasons = (document.partial_reason, executed.stopped_reason)
            document = replace(
                document, partial=True, partial_reason="; ".join(r for r in reasons if r)
            )
        write_document(document, run_directory / results.RESULTS_FILE_NAME)
        tensorboard.write_run(document, run_directory)
        trace = None if request.trace_path is None else trace_files.read_trace(request.trace_path)
        if trace is not None and request.what_if is not None:
            # The replayed calls index the derived trace's RPCs.
            trace = derive_trace(trace, request.what_if.asked())
        timeline.write_run_timelines(document, run_directory, trace)
    return document


# --------------------------------------------------------------------------
# Planning a request: each workload's RPC kind and pacing, and the checks that
# the workloads fit this host (``core.planning`` holds the pure ones).


#: Server threads left for control calls when streams hold the others.
STREAM_THREADS_KEPT_FREE = 4


def rpc_for(workload: Workload, asked: RpcKind | None) -> RpcKind:
    """The RPC kind ``workload``'s calls use: ``asked`` (``--rpc``) or its default.
    UsageError for streaming a trace (its calls are TensorFlow's unary methods)."""
    if asked is None:
        return default_rpc(workload)
    if asked is RpcKind.STREAMING and workload.source == "trace":
        raise UsageError(
            "--rpc streaming applies to the synthetic echo and ack benchmarks; a trace is "
            "replayed with its own unary methods (add --synthetic)"
        )
    return asked


def timing_for(workload: Workload, choice: PacingChoice) -> Timing:
    """The timing ``workload`` paces with under ``choice`` (its row's default unless
    asked); PacingError for a setting that timing does not read (``--compute`` without
    dependencies pacing, ...)."""
    defaults = spec_of(workload.benchmark).defaults(workload.source)
    return resolve_timing(choice, defaults.timing, context=_benchmark_paces(workload, choice))


def _benchmark_paces(workload: Workload, choice: PacingChoice) -> str:
    default = spec_of(workload.benchmark).defaults(workload.source).timing
    timing = choice.timing if choice.timing is not None else default
    return f" (the {workload.benchmark.value} benchmark paces {timing.value})"


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
    settings: grpc_settings.GrpcSettings,
    targets: Sequence[str] | None,
    rpc: RpcKind | None,
    pacing: PacingChoice,
) -> Planned:
    """Fit ``workloads`` to this host and the gRPC settings, and give each its RPC kind
    and pacing; ConfigError or UsageError, before anything is allocated, for what
    cannot run here (processes, message sizes, stream threads, targets, memory)."""
    planning.check_processes(workloads, local_servers=targets is None, limit=MAX_LOCAL_PROCESSES)
    fitted = planning.fitted_to_messages(workloads, settings)
    rpcs = tuple(rpc_for(workload, rpc) for workload in fitted)
    check_stream_threads(fitted, rpcs, channels=settings.channels)
    pacings = tuple(pacing_for(w, kind, pacing) for w, kind in zip(fitted, rpcs, strict=True))
    planning.check_target_count(None if targets is None else len(targets), fitted)
    room = memory_room()
    if room is not None:
        planning.check_memory(fitted, pacings, room.available_bytes, bound=room.bound)
    return Planned(workloads=tuple(fitted), rpcs=rpcs, pacings=pacings)


# --------------------------------------------------------------------------
# Serving: ``tf-grpc-bench serve``.


def serving_hosts(host: str) -> tuple[str, ...]:
    """What a TLS server certificate must name: the listening host, or every local address."""
    wildcard = host in ("0.0.0.0", "::", "[::]", "")
    return netinfo.local_addresses() if wildcard else (host, *netinfo.local_addresses())


def serve_until_stopped(
    *,
    mode: Mode,
    host: str,
    ports: Sequence[int],
    settings: grpc_settings.GrpcSettings,
    tls_dir: Path | None = None,
    max_response_bytes: int | None = None,
    control_token: str | None = None,
    announce: Callable[[str], None],
    procs_per_server: int = 1,
) -> tuple[str, int | None]:
    """Ps servers on ``ports`` until a stop signal (Ctrl-C, SIGTERM, SIGHUP); blocking.

    With ``settings.tls`` the servers' certificate (in ``tls_dir``, made if
    missing) names ``host``, or every local address when it is a wildcard.
    ``announce`` gets the line saying where they listen.  Returns the line
    saying what they did and the signal that stopped them.  Main thread only.
    """
    tls_material = None
    if settings.tls:
        from tf_grpc_bench.replay.transport import tls

        tls_material = tls.ensure_material(tls_dir, hosts=serving_hosts(host))
    server_settings = replace(
        grpc_settings.server_settings(settings, tls_material),
        max_response_bytes=max_response_bytes,
        control_token=control_token,
    )
    with lifetime.StopSignals() as stop:
        summary = serve_until(
            stop.event,
            mode=mode,
            host=host,
            ports=ports,
            settings=server_settings,
            announce=announce,
            procs_per_server=procs_per_server,
        )
    return summary, stop.signum
