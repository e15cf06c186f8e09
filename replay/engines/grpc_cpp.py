"""The ``grpc-cpp`` engine: gRPC C++, the runtime TensorFlow itself moves tensors with.

Built on first use (``native.build``: the program from the sources the package
ships, against the system's gRPC C++).  Servers: ``native.servers.NativeServers``
(one program per ps server, or several sharing its port).  Workers: a benchmark
not measured from worker processes runs its one worker from this process
(``InProcessWorkers``: a ``NativeDriver`` and a ``WorkerLoop``, the calls made by
the program); the others run in the grpcio engine's worker processes
(``throughput.ProcessWorkers``), each driving a program of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.native.build import build_engine, find_library
from tf_grpc_bench.replay.native.driver import open_native_driver
from tf_grpc_bench.replay.native.servers import NativeServers
from tf_grpc_bench.replay.throughput import ProcessWorkers
from tf_grpc_bench.replay.transport.loop import WorkerLoop, WorkerOutcome
from tf_grpc_bench.replay.transport.seam import Serving, WorkerJob, Workers
from tf_grpc_bench.replay.transport.wire import ServerSettings


class InProcessWorkers:
    """One worker driven from this process (``transport.seam.Workers``); its calls are
    the program's.  Blocking, main thread, so a stop signal reaches the loop."""

    def __init__(self, job: WorkerJob, program: Path) -> None:
        self._driver = open_native_driver(
            program,
            job.workload,
            job.targets,
            job.pacing,
            job.plan,
            settings=job.channel,
            hold=_deferred,
        )
        self._loop = WorkerLoop(job.workload, self._driver, cpu_clock=self._driver.cpu_ns)

    def wait_ready(self, timeout_s: float) -> None:
        """Connected already: the program waits for every channel before it answers."""

    def warm_up(self, duration_ns: int) -> None:
        try:
            self._loop.warm_up(duration_ns)
        except TransportError as error:
            raise TransportError(f"during warm-up: {error}") from None

    def run(self, *, duration_ns: int, steps: int | None) -> list[WorkerOutcome]:
        return [self._loop.measure(duration_ns=duration_ns, step_count=steps)]

    def close(self) -> None:
        self._driver.close()


def _deferred(_breaking: Callable[[], None]) -> AbstractContextManager[None]:
    """The session's stop signal held while a step's report is taken and kept
    (``NativeDriver``'s hold; taking it waits for nothing, so nothing is broken)."""
    return lifetime.deferred_signals()


class _Serving:
    """Servers of ``GrpcCppEngine.serving``: programs of their own."""

    def __init__(self, servers: NativeServers) -> None:
        self._servers = servers
        self._received: tuple[int, int] | None = None

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self._servers.targets)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(self._servers.pids)

    def stop(self) -> None:
        self._received = self._servers.stop()

    def received(self) -> tuple[int, int] | None:
        return self._received


class GrpcCppEngine:
    """gRPC C++ through the engine program (``transport.seam.Engine``)."""

    def __init__(self) -> None:
        #: Built (or found built) now: ``EngineUnavailable`` names what to install.
        self.program = build_engine()
        self._version = find_library().version

    @property
    def name(self) -> str:
        return "grpc-cpp"

    def version(self) -> str:
        return self._version

    @contextlib.contextmanager
    def local_servers(
        self, count: int, *, mode: Mode, settings: ServerSettings, procs_per_server: int
    ) -> Iterator[tuple[str, ...]]:
        with NativeServers(
            count, self.program, mode=mode, settings=settings, procs_per_server=procs_per_server
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
        servers = NativeServers(
            len(ports), self.program, mode=mode, host=host, ports=list(ports), settings=settings,
            procs_per_server=procs_per_server,
        )  # fmt: skip
        serving = _Serving(servers.start())
        try:
            yield serving
        finally:
            serving.stop()

    def start_workers(
        self, jobs: Sequence[WorkerJob], *, in_process: bool, round_barrier: bool
    ) -> Workers:
        if in_process:
            (job,) = jobs
            return InProcessWorkers(job, self.program)
        return ProcessWorkers(jobs, round_barrier=round_barrier, native_program=self.program)
