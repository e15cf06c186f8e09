"""The engine seam: what an engine is given (a plan) and what it returns (samples).

The Python side plans: the workloads (calls, sizes, targets, dependencies and
compute gaps), their pacing and the run plan.  An *engine* executes: it
starts ps servers on this host and runs a benchmark's workers, each one's
warm-up and measured runs, returning per run a ``WorkerOutcome`` of raw
``CallSample``s.  The runner keeps the protocol around them (``measure_runs``:
ready, warm-up, runs, the servers' statistics through the tool's own control
calls) and what results say.  ``measure_runs`` is that protocol.

Everything crossing the seam is plain frozen data of the core and transport
types (``WorkerJob``, ``Workload``, ``Pacing``, ``RunPlan``,
``ChannelSettings``, ``ServerSettings``, ``WorkerOutcome``), picklable, so an
engine may run its workers in processes of its own or in another program.
Engines are found by name (``replay.engines.registry``); ``grpcio`` is
today's Python one (``replay.engines.grpcio``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core.measurement import RunMeasurement
from tf_grpc_bench.replay.core.pacing import Pacing
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.loop import (
    ProgressCallback,
    ProgressEvent,
    RunPlan,
    WorkerOutcome,
    failed_run,
    interrupted_run,
    run_each,
)
from tf_grpc_bench.replay.transport.wire import ChannelSettings, ServerSettings


class Workers(Protocol):
    """One benchmark's workers, started by an engine (``transport.seam``); the runner
    drives them phase by phase.  Blocking; main thread (stop signals reach it)."""

    def wait_ready(self, timeout_s: float) -> None:
        """Every worker started, its channels connected and its requests prepared.
        TransportError (its message: the run's partial reason) if one could not."""

    def warm_up(self, duration_ns: int) -> None:
        """Every worker replays for ``duration_ns`` (a trace: whole steps), measuring
        nothing.  TransportError("during warm-up: ...") if one failed."""

    def run(self, *, duration_ns: int, steps: int | None) -> list[WorkerOutcome]:
        """One measured run, every worker beginning at one instant: for ``duration_ns``,
        or exactly ``steps`` steps.  One outcome per worker, in order; a worker that
        failed or died gives a partial one.  A stop signal (``KeyboardInterrupt``) during
        the run interrupts every worker and returns what each measured, marked partial;
        a second one propagates."""

    def close(self) -> None:
        """Stop every worker: no process or thread left.  Idempotent."""


#: How long, past the connect timeout, workers get to start (spawn, import, channels).
READY_GRACE_S = 120.0


def measure_runs(
    workers: Workers,
    workload: Workload,
    clients: Mapping[int, ReplayClient],
    plan: RunPlan,
    notify: ProgressCallback,
) -> tuple[RunMeasurement, ...]:
    """The runner's protocol around ``workers``: ready, warm-up, then ``plan.runs``
    measured runs (``run_each``: the servers' statistics through ``clients``).  A worker
    that cannot start or warm up gives one failed run; a stop signal between runs or in
    the warm-up ends the list with an interrupted run (a measured run keeps its calls)."""
    runs: list[RunMeasurement] = []
    try:
        try:
            workers.wait_ready(plan.connect_timeout_s + READY_GRACE_S)
            notify(
                ProgressEvent(
                    benchmark=workload.benchmark, phase="warmup", run_index=0, runs=plan.runs
                )
            )
            workers.warm_up(plan.warmup_ns)
        except TransportError as error:
            runs.append(failed_run(0, str(error)))
            return tuple(runs)
        steps = plan.steps_per_run(workload)
        run_each(
            workload,
            clients,
            plan,
            runs,
            notify,
            lambda: workers.run(duration_ns=plan.duration_ns, steps=steps),
        )
    except KeyboardInterrupt as interrupt:
        runs.append(interrupted_run(len(runs), interrupt))
    return tuple(runs)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerJob:
    """One worker's part of one benchmark."""

    worker_index: int
    #: This worker's calls only (``Workload.for_worker``); the same steps as the others'.
    workload: Workload
    #: ``HOST:PORT`` by server index (``Call.server_index``).
    targets: tuple[str, ...]
    #: When its calls go: timing and window (dependencies: ``Call.dependencies`` and the
    #: recorded compute gaps, times ``pacing.wall_compute_scale``).
    pacing: Pacing
    #: Deadline of each call, connect timeout, time dilation; the durations come per phase.
    plan: RunPlan
    #: Channel arguments, TLS root, channels per server, session id, control token, RPC kind.
    channel: ChannelSettings
    #: Spread its calls over this many client processes (or threads) as
    #: ``core.processes.split_worker`` says (>= 1, already resolved).
    processes: int = 1
    #: The named network namespace its clients run in ("": this process's).
    netns: str = ""

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")


class Serving(Protocol):
    """Ps servers an engine runs on a given host and ports (``Engine.serving``)."""

    @property
    def targets(self) -> tuple[str, ...]:
        """``HOST:PORT`` a client dials, by server."""

    @property
    def pids(self) -> tuple[int, ...]:
        """The processes serving them."""

    def received(self) -> tuple[int, int] | None:
        """(messages, bytes) the servers received over their lives, once they have
        stopped; None where the engine cannot say."""


class Engine(Protocol):
    """Runs servers and workers; found by name (``engines.registry``)."""

    @property
    def name(self) -> str:
        """``grpcio``, ...: recorded as each result's ``engine`` parameter."""

    def version(self) -> str:
        """The gRPC it runs on (``1.76.0``): recorded as ``grpc_version``."""

    def local_servers(
        self, count: int, *, mode: Mode, settings: ServerSettings, procs_per_server: int
    ) -> AbstractContextManager[tuple[str, ...]]:
        """``count`` ps servers on loopback, each on a free port (and ``procs_per_server``
        processes sharing it); yields their targets by server index, stops them on exit.
        Servers answer the control calls of ``transport.wire`` (statistics, reset)."""

    def serving(
        self,
        *,
        mode: Mode,
        host: str,
        ports: Sequence[int],
        settings: ServerSettings,
        procs_per_server: int = 1,
    ) -> AbstractContextManager[Serving]:
        """Ps servers on ``host`` at ``ports`` (``serve``, a ``role`` ps) until the context
        exits; ``ServeError`` if one cannot listen."""

    def start_workers(
        self, jobs: Sequence[WorkerJob], *, in_process: bool, round_barrier: bool
    ) -> Workers:
        """Start one benchmark's workers (``close`` them).  ``in_process``: its one worker
        runs in the calling process (a benchmark not measured from worker processes);
        an engine that runs workers elsewhere anyway may ignore it.  ``round_barrier``:
        the workers meet after every step (``Workload.round_barrier``)."""


def worker_jobs(
    workload: Workload,
    targets: Sequence[str],
    pacing: Pacing,
    plan: RunPlan,
    *,
    settings: ChannelSettings,
    procs_per_worker: int = 1,
    client_namespaces: Mapping[str, str] | None = None,
) -> tuple[WorkerJob, ...]:
    """One job per worker that makes calls (a cluster task's workload keeps its own), in
    the namespace of the job its client stands for (``client_namespaces``)."""
    jobs = []
    for worker in sorted({call.worker_index for call in workload.calls}):
        job = workload.client_tasks[worker].job if workload.client_tasks else ""
        jobs.append(
            WorkerJob(
                worker_index=worker,
                workload=workload.for_worker(worker),
                targets=tuple(targets),
                pacing=pacing,
                plan=plan,
                channel=settings,
                processes=procs_per_worker,
                netns=(client_namespaces or {}).get(job, ""),
            )
        )
    return tuple(jobs)
