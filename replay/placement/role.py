"""``tf-grpc-bench role``: a replay task placed by TF_CONFIG, as a launcher starts it.

The launcher that starts distributed training (a Kubernetes TFJob, a SLURM
script) starts ``tf-grpc-bench role`` in every task instead, with the same
``TF_CONFIG`` (or ``--cluster``/``--task``).  Each task does its part
(``cluster.Placement.roles``):

- **ps** ``i`` serves on the port of its cluster address (all interfaces, like
  a TensorFlow server) until the gatherer says every worker is in (or is gone);
- **worker** ``i`` replays against every ps task: the P2P benchmarks are run by
  worker 0 alone (the paper's one worker and one ps); for PS throughput every
  worker replays its own share of the traffic (trace worker ``i``, or the
  synthetic workload's worker ``i``) after a barrier, so that all workers run
  at once; it then sends its result document to the gatherer;
- the **gatherer** (chief, or worker 0 without a chief) collects the documents
  and writes one: P2P results as worker 0 measured them, PS throughput with
  every worker's runs merged (samples of all workers, a run lasting as long as
  its slowest worker), plus the TensorBoard logs.

A trace's PS throughput is replayed in whole steps (``core.workload``): a ps
task whose trace task called another ps also runs that *side client*, the
chief runs the chief's side client (its calls to workers), and each worker the
chief called serves a *stand-in* on its own cluster port while it replays and
until the job is done.  Side clients meet the workers at the start barrier and
send their documents to the gatherer too.  Every task works out who runs what
from the same flags (``cluster_request``), falling back to fewer kinds of
calls when the cluster cannot place one (no chief: no chief-to-worker calls).

Every replay flag (``tf-grpc-bench replay --help``) applies, the same on every
task, as a launcher gives every task the same command.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tf_grpc_bench import launchers, lifetime
from tf_grpc_bench.cluster import PS, WORKER, TaskId, split_address
from tf_grpc_bench.errors import (
    ConfigError,
    ResultError,
    RunInterrupted,
    TransportError,
    UsageError,
)
from tf_grpc_bench.replay.core.benchmarks import spec_of
from tf_grpc_bench.replay.core.measurement import BenchmarkResult
from tf_grpc_bench.replay.core.workload import Workload
from tf_grpc_bench.replay.engines.registry import engine_named
from tf_grpc_bench.replay.network import netinfo
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import loads_document
from tf_grpc_bench.replay.output.document_writer import dumps_document, write_document
from tf_grpc_bench.replay.output.run_directories import discard_run_directory, new_run_directory
from tf_grpc_bench.replay.placement import cluster, gather
from tf_grpc_bench.replay.placement.cluster import Placement, Role, WholeStepParts
from tf_grpc_bench.replay.placement.merge import merge_worker_documents, task_order
from tf_grpc_bench.replay.request import Host, ReplayRequest, plan, resolve_trace, this_host
from tf_grpc_bench.replay.runner import run_benchmark
from tf_grpc_bench.replay.spec import ReplaySpec
from tf_grpc_bench.replay.transport import grpc_settings, tls
from tf_grpc_bench.replay.transport.loop import interrupted_reason
from tf_grpc_bench.replay.transport.wire import read_token_file
from tf_grpc_bench.trace_mapping import WHOLE_STEPS, WORKERS_AND_PS_ONLY, WholeSteps

#: Seconds a task waits for the others (barriers, submissions, job end).
DEFAULT_JOB_TIMEOUT_S = 3600.0


#: What a cluster replay of a trace makes, the first that its cluster can place
#: (``cluster.place_whole_steps``): every call of a step; without the chief's calls
#: to workers (a cluster without a chief); training's workers and ps only.
WHOLE_STEP_CHOICES = (WHOLE_STEPS, WholeSteps(stand_in_servers=False), WORKERS_AND_PS_ONLY)


#: Longest --job-timeout: a day.
MAX_JOB_TIMEOUT_S = 86_400.0
#: How long an interrupted gatherer still waits for the workers' partial results.
INTERRUPT_GRACE_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleFlags:
    """``role``'s own flags: where this task is (TensorFlow's conventions), how long to wait."""

    #: Cluster spec or whole TF_CONFIG (JSON or a file); None: the TF_CONFIG variable.
    cluster: str | None = None
    #: ``TYPE:INDEX``; None: TF_CONFIG's task.
    task: str | None = None
    #: ``JOB:N,...``: placed from srun's environment (``--slurm-jobs``).
    slurm_jobs: str | None = None
    port_base: int = launchers.DEFAULT_PORT_BASE
    #: Seconds a task waits for the others (``--job-timeout``).
    job_timeout_s: float = DEFAULT_JOB_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 < self.job_timeout_s <= MAX_JOB_TIMEOUT_S:
            raise ConfigError(
                f"--job-timeout must be in (0, {MAX_JOB_TIMEOUT_S:g}] seconds, "
                f"got {self.job_timeout_s:g}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleJob:
    """What every task of a replay job is given alike: the replay and ``role``'s flags."""

    spec: ReplaySpec
    flags: RoleFlags


def check_job(job: RoleJob) -> None:
    """The replay flags ``role`` refuses beside what the replay itself does (UsageError)."""
    if job.spec.targets is not None:
        raise UsageError("role takes its targets from the cluster's ps tasks; drop --target")
    if job.spec.client_netns:
        raise UsageError(
            "role runs each client in the task it stands for, on that task's host; "
            "drop --client-netns"
        )
    if job.spec.compute_load not in ("none", "auto"):
        # auto runs none under role, and its results say so (``compute_load_auto``).
        raise UsageError(
            "--compute-load sizes one replay's load against the whole job, and every task "
            "would add all of it; use it with replay or network compare"
        )


def run_role(job: RoleJob, *, here: Host | None = None) -> int:
    """Do this task's part of the replay job on ``here`` (default: this machine, probed).

    Every task checks every flag before it does anything (a ps too, which replays
    at most a side client: the launcher gives all tasks the same command).
    """
    flags = job.flags
    placement = cluster.resolve_placement(
        cluster=flags.cluster,
        task=flags.task,
        slurm_jobs=flags.slurm_jobs,
        port_base=flags.port_base,
    )
    if placement is None:
        if launchers.in_slurm_step(os.environ):
            raise UsageError(
                "no placement: under srun, give --slurm-jobs (e.g. ps:1,worker:2), or set TF_CONFIG"
            )
        raise UsageError("no placement: set TF_CONFIG, or give --cluster and --task")
    check_job(job)
    request, parts = cluster_request(placement, job.spec, here=here)
    roles = placement.roles
    side = placement.task in parts.side_tasks
    stand_in = placement.task in parts.stand_ins
    doing = [
        *sorted(r.value for r in roles),
        *(["side client"] if side else []),
        *(["stand-in server"] if stand_in else []),
    ]
    print(f"{placement.task}: {', '.join(doing) or 'nothing to do'}")
    if not doing:
        return 0
    if Role.GATHER in roles:
        return _gather(placement, job, request, parts)
    if Role.SERVE in roles or stand_in:
        # A ps task serves, and replays its side client if it has one; a worker the
        # chief calls serves its stand-in while it replays its share.
        with _serving(placement, job):
            if Role.REPLAY in roles or side:
                _replay(placement, job, request, parts)
        return 0
    return _replay(placement, job, request, parts)


# -- shared -------------------------------------------------------------------


def _port_of(address: str) -> int:
    return split_address(address, where="cluster address")[1]


def _hosts(placement: Placement) -> list[str]:
    return sorted(
        {
            split_address(a, where="cluster")[0]
            for _, addresses in placement.cluster.jobs
            for a in addresses
        }
    )


def _tls(placement: Placement, job: RoleJob) -> Any:
    """The run's TLS files when --tls (one certificate naming every cluster host)."""
    if not job.spec.grpc.tls:
        return None
    if not job.spec.grpc.tls_dir:
        raise UsageError("role --tls needs --tls-dir DIR, a directory every task can read")
    return tls.ensure_tls_files(Path(job.spec.grpc.tls_dir), hosts=_hosts(placement))


def _gather_credentials(files: Any) -> tuple[Any, Any]:
    if files is None:
        return None, None
    return tls.server_credentials(files), tls.channel_credentials(files)


def _raise_if_interrupted(task: TaskId, what: str, signum: int | None = None) -> None:
    """RunInterrupted (exit 128 + signal) if a stop signal came (``signum`` or ``lifetime``'s)."""
    signum = signum or lifetime.stop_signal()
    if signum is not None:
        raise RunInterrupted(
            f"{task}: interrupted ({lifetime.signal_name(signum)}); {what}", signum=signum
        )


# -- ps --------------------------------------------------------------------------


@contextlib.contextmanager
def _serving(placement: Placement, job: RoleJob) -> Iterator[None]:
    """A replay server on this task's cluster port while the body runs, and then until
    the gatherer says the job is done (other tasks may still be calling it) or a stop
    signal comes (RunInterrupted, exit 128 + signal, after the server stopped)."""
    settings = job.spec.grpc.settings()
    files = _tls(placement, job)
    material = None if files is None else tls.material(files)
    token = None if job.spec.token_file is None else read_token_file(job.spec.token_file)
    port = _port_of(placement.address)
    servers = engine_named(job.spec.engine).serving(
        mode=job.spec.mode,
        host="0.0.0.0",
        ports=(port,),
        settings=replace(grpc_settings.server_settings(settings, material), control_token=token),
    )
    serving = servers.__enter__()
    print(f"{placement.task}: serving on 0.0.0.0:{port}", flush=True)
    # Asked from now on: once the gatherer has answered, its going away means the job is
    # done, which it may be by the time the body ends.
    job_done = _job_watch(placement, job, files)
    signum: int | None = None
    try:
        yield
        signum = _wait_for_job(job_done)
    finally:
        servers.__exit__(None, None, None)
        messages, received_bytes = serving.received() or (0, 0)
        print(
            f"{placement.task}: stopped; received {messages} messages, {received_bytes} bytes",
            flush=True,
        )
    _raise_if_interrupted(placement.task, "server stopped", signum)


def _job_watch(placement: Placement, job: RoleJob, files: Any) -> threading.Event:
    """An event set once the gatherer says the job is done, or stops answering after
    having answered (``gather.wait_until_job_done``), asked from a thread of its own."""
    _, channel_credentials = _gather_credentials(files)
    done = threading.Event()

    def watch() -> None:
        gather.wait_until_job_done(
            placement.gatherer_address,
            timeout_s=job.flags.job_timeout_s,
            credentials=channel_credentials,
        )
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    return done


#: How often a task waiting for the job's end looks at its watch.
JOB_WATCH_POLL_S = 0.2


def _wait_for_job(job_done: threading.Event) -> int | None:
    """Block until ``job_done`` is set or a stop signal comes; returns that signal."""
    with lifetime.StopSignals() as stop:
        while not stop.event.is_set() and not job_done.wait(JOB_WATCH_POLL_S):
            pass
    return stop.signum


# -- worker ------------------------------------------------------------------------


def shaped_like(placement: Placement, spec: ReplaySpec) -> ReplaySpec:
    """``spec`` of a task of ``placement``: no targets of its own (the cluster's ps tasks
    are), and a synthetic workload shaped like the cluster unless told otherwise."""
    spec = replace(spec, targets=None)
    if resolve_trace(spec) is not None:
        return spec
    return replace(
        spec,
        workers=placement.worker_count if spec.workers is None else spec.workers,
        ps=len(placement.ps_addresses) if spec.ps is None else spec.ps,
    )


def _worker_request(
    placement: Placement,
    spec: ReplaySpec,
    here: Host,
    whole_steps: WholeSteps = WHOLE_STEPS,
) -> ReplayRequest:
    """The replay request of this task, before its targets are placed.

    ConfigError, naming the cluster (``role`` has no ``--target``), when the
    workload needs more ps tasks or workers than the cluster has.
    """
    ps = placement.ps_addresses
    request = plan(shaped_like(placement, spec), here, whole_steps=whole_steps, one_task=True)
    needed = max(ps_server_count(w) for w in request.workloads)
    if needed > len(ps):
        raise ConfigError(
            f"the workload needs {needed} ps task(s), the cluster has {len(ps)} "
            f"({'--ps' if request.trace_path is None else 'the trace'} decides how many)"
        )
    for workload in request.workloads:
        workers = workload.worker_count - len(workload.side_workers)
        every_worker = not spec_of(workload.benchmark).point_to_point
        if every_worker and workers != placement.worker_count:
            # Fewer cluster workers would leave some of the workload's workers unreplayed.
            decides = "--workers" if request.trace_path is None else "the trace (or --workers)"
            raise ConfigError(
                f"the workload has {workers} worker(s), the cluster "
                f"{placement.worker_count}: each cluster worker replays one of the workload's "
                f"({decides} decides how many)"
            )
    return request


def ps_server_count(workload: Workload) -> int:
    """How many of the workload's servers are ps tasks (the others are stand-ins)."""
    stand_ins = sum(1 for task in workload.server_tasks if task.job != PS)
    return workload.server_count - stand_ins


def whole_step_parts(placement: Placement, request: ReplayRequest) -> WholeStepParts | None:
    """Which task runs which client and server of the request's workload that every
    worker replays (PS throughput; cluster worker ``i`` the workload's worker ``i`` when
    it is synthetic), None when the cluster cannot place one of its side clients or
    stand-ins."""
    workers = placement.worker_count
    throughput = [w for w in request.workloads if not spec_of(w.benchmark).point_to_point]
    if not throughput or not throughput[0].client_tasks:
        return WholeStepParts(
            targets=placement.ps_addresses,
            clients=tuple((TaskId(type=WORKER, index=i), i) for i in range(workers)),
        )
    workload = throughput[0]
    return cluster.place_whole_steps(
        placement.cluster,
        step_clients=workload.worker_count - len(workload.side_workers),
        client_tasks=[(t.job, t.index) for t in workload.client_tasks],
        server_tasks=[(t.job, t.index) for t in workload.server_tasks],
    )


def cluster_request(
    placement: Placement, spec: ReplaySpec, *, here: Host | None = None
) -> tuple[ReplayRequest, WholeStepParts]:
    """This task's request on ``here`` (default: this machine), targets placed on the
    cluster, and who runs what: every call of a step when the cluster can place it
    (``WHOLE_STEP_CHOICES``).  Every task works this out alike from the same flags, so
    they agree without talking."""
    here = here or this_host()
    for whole_steps in WHOLE_STEP_CHOICES:
        request = _worker_request(placement, spec, here, whole_steps)
        parts = whole_step_parts(placement, request)
        if parts is not None:
            config = {**request.config, "targets": ",".join(parts.targets)}
            return replace(request, targets=parts.targets, config=config), parts
    raise AssertionError("workers and ps only always place")  # pragma: no cover


def _measure(
    placement: Placement,
    job: RoleJob,
    files: Any,
    request: ReplayRequest,
    parts: WholeStepParts,
) -> str:
    """Replay this task's part; returns its result document as JSON text."""
    client = parts.client_of(placement.task)
    side = {index for task, index in parts.clients if task in parts.side_tasks}
    material = None if files is None else tls.material(files)
    channel_settings = replace(
        grpc_settings.channel_settings(request.grpc, material),
        control_token=request.control_token,
    )
    _, channel_credentials = _gather_credentials(files)
    measured: list[BenchmarkResult] = []
    engine = engine_named(request.engine)
    assert request.targets is not None
    for workload, pacing, rpc in zip(request.workloads, request.pacings, request.rpcs, strict=True):
        if not spec_of(workload.benchmark).point_to_point and client is not None:
            gather.barrier(
                placement.gatherer_address,
                name=workload.benchmark.value,
                task=str(placement.task),
                timeout_s=job.flags.job_timeout_s,
                credentials=channel_credentials,
            )
            # Its own calls under its own worker index, so merged runs tell clients apart.
            workload = workload.for_worker(client)
        elif placement.task != TaskId(type=WORKER, index=0):
            continue  # P2P benchmarks: one worker, as the paper defines them.
        result = run_benchmark(
            workload,
            request.targets,
            pacing=pacing,
            plan=request.plan,
            settings=replace(channel_settings, rpc=rpc),
            parameters={**request.grpc_parameters, "task": str(placement.task)},
            # A side client stays one process (its calls are few and small).
            procs_per_worker=1 if client in side else request.procs_per_worker,
            engine=engine,
        )
        measured.append(result)
        if result.partial:
            break
    network = netinfo.describe_network(request.targets, name=job.spec.network_name)
    config = {
        **request.config,
        "placement": "cluster",
        "task": str(placement.task),
        "cluster": json.dumps(placement.cluster.as_dict(), sort_keys=True),
    }
    document = results.build_document(
        measured,
        config=config,
        trace_path=request.trace_path,
        network=network,
        what_if=request.what_if,
    )
    return dumps_document(document)


def _replay(
    placement: Placement, job: RoleJob, request: ReplayRequest, parts: WholeStepParts
) -> int:
    files = _tls(placement, job)
    _, channel_credentials = _gather_credentials(files)
    task = str(placement.task)
    try:
        document = _measure(placement, job, files, request, parts)
    except (Exception, KeyboardInterrupt) as error:
        # Tell the gatherer rather than leave it waiting, then fail as usual.
        message = str(error) or type(error).__name__
        if isinstance(error, KeyboardInterrupt):
            message = f"interrupted ({lifetime.signal_name(lifetime.signal_of(error))})"
        with contextlib.suppress(TransportError):
            gather.submit(
                placement.gatherer_address,
                task=task,
                error=message,
                timeout_s=min(job.flags.job_timeout_s, INTERRUPT_GRACE_S),
                credentials=channel_credentials,
            )
        raise
    # Stopped, the run kept what it measured; the gatherer may be stopping too (a launcher
    # stops every task at once), so it gets a short while rather than --job-timeout (a
    # call waiting for a gatherer that is gone would hold this task that long).
    stopped = lifetime.stop_signal() is not None
    timeout_s = job.flags.job_timeout_s
    try:
        gather.submit(
            placement.gatherer_address,
            task=task,
            document=document,
            timeout_s=min(timeout_s, INTERRUPT_GRACE_S) if stopped else timeout_s,
            credentials=channel_credentials,
        )
    except TransportError as error:
        if not stopped:
            raise
        _raise_if_interrupted(placement.task, f"partial results not sent ({error})")
    print(f"{task}: results sent to {placement.gatherer_address}", flush=True)
    _raise_if_interrupted(placement.task, "partial results sent to the gatherer")
    return 0


# -- gatherer ------------------------------------------------------------------------


def _gather(
    placement: Placement, job: RoleJob, request: ReplayRequest, parts: WholeStepParts
) -> int:
    files = _tls(placement, job)
    server_credentials, _ = _gather_credentials(files)
    # Every task that replays something submits: the workers and the side clients.
    workers = [f"{WORKER}:{i}" for i in range(placement.worker_count)]
    workers += [str(task) for task in parts.side_tasks]
    # Made (and so checked writable) before anything is measured.
    base_existed = Path(job.spec.output_dir).exists()
    run_directory = new_run_directory(job.spec.output_dir, "cluster")
    errors: list[BaseException] = []
    try:
        with gather.GatherServer(
            bind=f"0.0.0.0:{_port_of(placement.gatherer_address)}",
            workers=workers,
            credentials=server_credentials,
            barrier_timeout_s=job.flags.job_timeout_s,
        ) as server:
            print(f"{placement.task}: gathering from {', '.join(workers)}", flush=True)
            if Role.REPLAY in placement.roles or placement.task in parts.side_tasks:
                # In the main thread, so that a stop signal reaches the measuring loop.
                try:
                    _replay(placement, job, request, parts)
                except BaseException as error:  # reported after the gather below
                    errors.append(error)
            texts, failures = _wait_for_workers(server, job.flags.job_timeout_s)
    except BaseException:
        discard_run_directory(run_directory, base_existed=base_existed)
        raise
    document = _gathered_document(placement, workers, texts, failures)
    _write_gathered(document, run_directory)
    _raise_if_interrupted(placement.task, f"partial results written to {run_directory}")
    if errors:
        raise errors[0]
    if document.partial:
        raise TransportError(
            f"partial results written to {run_directory}: {document.partial_reason}"
        )
    return 0


def _wait_for_workers(
    server: gather.GatherServer, timeout_s: float
) -> tuple[dict[str, str], dict[str, str]]:
    """The workers' documents and failures; not long once a stop signal came (the launcher
    stops every task at once, and their partial results come within moments)."""
    if lifetime.stop_signal() is not None:
        return server.wait(timeout_s=min(timeout_s, INTERRUPT_GRACE_S))
    try:
        return server.wait(timeout_s=timeout_s)
    except KeyboardInterrupt:
        return server.wait(timeout_s=min(timeout_s, INTERRUPT_GRACE_S))


def _gathered_document(
    placement: Placement,
    workers: Sequence[str],
    texts: Mapping[str, str],
    failures: Mapping[str, str],
) -> results.ResultDocument:
    """One result document of the job from what the workers sent."""
    documents = {
        task: loads_document(text, source=f"results of {task}") for task, text in texts.items()
    }
    missing = sorted(set(workers) - set(documents) - set(failures))
    all_failures = {**failures, **{task: "sent no results in time" for task in missing}}
    merged, reason = merge_worker_documents(documents, failures=all_failures)
    signum = lifetime.stop_signal()
    if signum is not None:
        reason = "; ".join(
            r for r in (reason, f"{placement.task} {interrupted_reason(signum)}") if r
        )
    first = min(documents.items(), key=lambda item: task_order(item[0]))[1] if documents else None
    config = dict(first.config) if first else {}
    config.pop("task", None)
    config["cluster_workers"] = placement.worker_count
    trace_path = Path(str(config["trace"])) if "trace" in config else None
    return results.build_document(
        merged,
        config=config,
        trace_path=trace_path,
        network=first.network if first else None,
        partial=bool(reason),
        partial_reason=reason,
        what_if=first.what_if if first else None,
    )


def _write_gathered(document: results.ResultDocument, run_directory: Path) -> None:
    # The TensorBoard writer is imported only by the task that writes the logs.
    from tf_grpc_bench.replay.output import tensorboard as tensorboard_output
    from tf_grpc_bench.replay.output import timeline

    trace = None
    with contextlib.suppress(ResultError):
        trace = timeline.replayed_trace(document)
    with lifetime.deferred_signals():
        path = write_document(document, run_directory / results.RESULTS_FILE_NAME)
        tensorboard_output.write_run(document, run_directory)
        timeline.write_run_timelines(document, run_directory, trace)
    print(f"results: {path}")
    print(f"view:    tensorboard --logdir {run_directory.parent}")
