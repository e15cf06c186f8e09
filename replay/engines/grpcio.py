"""The ``grpcio`` engine: gRPC's Python binding, as every replay ran before there were engines.

Servers: ``transport.server.LocalServers`` (one process per ps server, or
several sharing its port).  Workers: a benchmark not measured from worker
processes runs its one worker in this process (``InProcessWorkers``: a
``Driver`` and a ``WorkerLoop`` on channels of its own); the others run one
spawned process per worker, or several sharing its calls
(``throughput.ProcessWorkers``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import grpc

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.throughput import ProcessWorkers
from tf_grpc_bench.replay.transport.driver import Driver
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.loop import WorkerLoop, WorkerOutcome, open_clients
from tf_grpc_bench.replay.transport.seam import Serving, WorkerJob, Workers
from tf_grpc_bench.replay.transport.server import ReplayServer
from tf_grpc_bench.replay.transport.wire import ServerSettings, keep_freed_memory


class InProcessWorkers:
    """One worker in this process (``transport.seam.Workers``): blocking, main thread,
    so a stop signal reaches the measuring loop (which keeps the run's calls)."""

    def __init__(self, job: WorkerJob) -> None:
        self._clients = open_clients(job.workload, job.targets, settings=job.channel)
        try:
            driver = Driver(self._clients, job.pacing, timeout_s=job.plan.deadline_s)
            driver.prepare(job.workload.steps)
            self._loop = WorkerLoop(job.workload, driver)
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout_s: float) -> None:
        for client in self._clients.values():
            client.wait_ready(timeout_s)

    def warm_up(self, duration_ns: int) -> None:
        try:
            self._loop.warm_up(duration_ns)
        except TransportError as error:
            raise TransportError(f"during warm-up: {error}") from None

    def run(self, *, duration_ns: int, steps: int | None) -> list[WorkerOutcome]:
        return [self._loop.measure(duration_ns=duration_ns, step_count=steps)]

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients = {}


class _Serving:
    """Servers of ``GrpcioEngine.serving``: one in this process, or processes of their own."""

    def __init__(self, server: ReplayServer | None, servers: LocalServers | None) -> None:
        self._server = server
        self._servers = servers
        self._received: tuple[int, int] | None = None

    @property
    def targets(self) -> tuple[str, ...]:
        if self._server is not None:
            return (self._server.address,)
        assert self._servers is not None
        return tuple(self._servers.targets)

    @property
    def pids(self) -> tuple[int, ...]:
        if self._server is not None:
            return (os.getpid(),)
        assert self._servers is not None
        return tuple(self._servers.pids)

    def stop(self) -> None:
        if self._server is not None:
            received_bytes, received_messages = self._server.received()
            self._server.stop(1.0)
            self._received = (received_messages, received_bytes)
        elif self._servers is not None:
            self._servers.stop()

    def received(self) -> tuple[int, int] | None:
        return self._received


class GrpcioEngine:
    """gRPC's Python binding (``transport.seam.Engine``)."""

    @property
    def name(self) -> str:
        return "grpcio"

    def version(self) -> str:
        return str(grpc.__version__)

    @contextlib.contextmanager
    def local_servers(
        self, count: int, *, mode: Mode, settings: ServerSettings, procs_per_server: int
    ) -> Iterator[tuple[str, ...]]:
        with LocalServers(
            count, mode=mode, settings=settings, procs_per_server=procs_per_server
        ) as servers:
            yield tuple(servers.targets)

    @contextlib.contextmanager
    def serving(
        self,
        *,
        mode: Mode,
        host: str,
        ports: Sequence[int],
        settings: ServerSettings,
        procs_per_server: int = 1,
    ) -> Iterator[Serving]:
        """One port is served in this process (reusing freed message buffers, as a
        server process does), several by one process each, or each by
        ``procs_per_server`` processes (``siblings``)."""
        if len(ports) == 1 and procs_per_server == 1:
            if settings.keep_freed_memory:
                keep_freed_memory()
            serving = _Serving(
                ReplayServer(mode=mode, host=host, port=ports[0], settings=settings).start(), None
            )
        else:
            servers = LocalServers(
                len(ports), mode=mode, host=host, ports=list(ports), settings=settings,
                procs_per_server=procs_per_server,
            )  # fmt: skip
            serving = _Serving(None, servers.start())
        try:
            yield serving
        finally:
            serving.stop()

    def start_workers(
        self, jobs: Sequence[WorkerJob], *, in_process: bool, round_barrier: bool
    ) -> Workers:
        if in_process:
            (job,) = jobs
            return InProcessWorkers(job)
        return ProcessWorkers(jobs, round_barrier=round_barrier)
