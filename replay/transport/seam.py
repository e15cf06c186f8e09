"""The engine seam: what an engine is given (a plan) and what it returns (samples).

The Python side plans: the workloads (calls, sizes, targets, dependencies and
compute gaps), their pacing and the run plan.  An *engine* executes: it
starts ps servers on this host and runs a benchmark's workers, each one's
warm-up and measured runs, returning per run a ``WorkerOutcome`` of raw
``CallSample``s.  The runner keeps the protocol around them (``loop.measure_runs``:
ready, warm-up, runs, the servers' statistics through the tool's own control
calls) and what results say.

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

from tf_grpc_bench.replay.core.pacing import Pacing
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.transport.loop import RunPlan
from tf_grpc_bench.replay.transport.loop import Workers as Workers
from tf_grpc_bench.replay.transport.wire import ChannelSettings, ServerSettings


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
