"""Workers in OS processes of their own (PS throughput), so the GIL does not cap the figure.

The grpcio engine's ``ProcessWorkers`` (``transport.seam.Workers``) for the
benchmarks measured from worker processes; ``measure_throughput`` is the whole
protocol around them for one workload.

The parent spawns one process per worker (``multiprocessing`` spawn: nothing
inherited, the same on every platform), each with its own channels to every
ps server it calls.  Runs start together at an agreed ``time.monotonic_ns``
instant (CLOCK_MONOTONIC is shared by the processes of one host); each worker
replays its own calls (synthetic: every payload to every ps; trace: its
per-step calls, steps separated as the pacing says) and sends back its samples
as one numpy array.  The parent aggregates: RPCs/s over all workers, server
counts, client CPU time summed over the worker processes.

With ``procs_per_worker`` K > 1 a worker's calls are split over K processes
(``core.processes``), kept in step through ``transport.peers``; each sample
still names its worker, and only the worker's first process records its step
times, so the result counts each worker once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import NetworkError, TransportError
from tf_grpc_bench.host import MachineCpuTimes
from tf_grpc_bench.netns import namespaces
from tf_grpc_bench.replay.core.measurement import (
    SAMPLE_COLUMNS,
    CallSample,
    RunMeasurement,
)
from tf_grpc_bench.replay.core.pacing import Pacing
from tf_grpc_bench.replay.core.processes import split_worker
from tf_grpc_bench.replay.core.workload import Workload
from tf_grpc_bench.replay.native.driver import NativeDriver, open_native_driver
from tf_grpc_bench.replay.transport.burners import GapSender, round_hooks
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.driver import Driver
from tf_grpc_bench.replay.transport.load import ComputeLoad
from tf_grpc_bench.replay.transport.loop import (
    ProgressCallback,
    RunPlan,
    WorkerLoop,
    WorkerOutcome,
    interrupted_reason,
)
from tf_grpc_bench.replay.transport.peers import (
    Hold,
    PeerLinks,
    Peers,
    RoundBarrier,
    make_links,
    perf_minus_monotonic_ns,
    unheld,
)
from tf_grpc_bench.replay.transport.seam import WorkerJob, measure_runs, worker_jobs
from tf_grpc_bench.replay.transport.wire import ChannelSettings

#: Time between telling workers to start and their common start instant.
START_MARGIN_NS = 300_000_000
#: How often the parent checks that workers are alive while waiting.
POLL_S = 0.5
#: What the parent sends its workers to end a measured run early (on a stop signal).
INTERRUPT_SIGNAL = signal.SIGUSR1
#: How long the parent waits for interrupted workers' calls so far, past the call deadline.
INTERRUPT_GRACE_S = 5.0
#: How long workers told to stop have, all together, before they are terminated; and
#: terminated ones before they are killed.
STOP_GRACE_S = 10.0
KILL_GRACE_S = 5.0


def pack_samples(samples: Sequence[CallSample]) -> np.ndarray:
    """Samples as an int64 array, one row per call (cheap to send between processes)."""
    array = np.empty((len(samples), len(SAMPLE_COLUMNS)), dtype=np.int64)
    for row, sample in enumerate(samples):
        array[row] = [getattr(sample, column) for column in SAMPLE_COLUMNS]
    return array


def unpack_samples(array: np.ndarray) -> tuple[CallSample, ...]:
    return tuple(
        CallSample(**dict(zip(SAMPLE_COLUMNS, (int(v) for v in row), strict=True)))
        for row in array.tolist()
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """What a worker process needs; picklable."""

    worker_index: int
    workload: Workload
    targets: tuple[str, ...]
    pacing: Pacing
    plan: RunPlan
    settings: ChannelSettings
    #: Which of the worker's client processes this is (``--procs-per-worker``); the
    #: first records the worker's step times.
    process: int = 0
    #: The named network namespace the process runs in ("": the parent's), so a side
    #: client runs on the emulated host of the task it stands for (``--client-netns``).
    netns: str = ""
    #: The gRPC C++ engine's program, which then makes this process's calls (its
    #: ``native.driver.NativeDriver``); "": grpcio channels in this process.
    native_program: str = ""
    #: Where this process's driver sends its compute gaps (``burners.GapSender``), if
    #: a compute load runs in them (``--compute-load gaps``); None: nowhere.
    compute_gaps: Any = None
    #: Where this process tells each round's start (``burners.RoundClock``), if a
    #: compute load's quotas are owed by the round; None: it does not.
    rounds: Any = None


class _RunInterrupt:
    """``INTERRUPT_SIGNAL`` ends a worker's measured run (and only that) early: a
    ``KeyboardInterrupt`` where the main thread is, or at the end of a ``held`` block."""

    def __init__(self) -> None:
        self.measuring = False
        self._pending = False
        #: How to break the barrier of each ``held`` block running, innermost last.
        self._held: list[Callable[[], None]] = []
        self._break_now = threading.Event()
        self._breaker = threading.Thread(target=self._break, name="run-interrupt", daemon=True)
        self._breaker.start()
        signal.signal(INTERRUPT_SIGNAL, self._handle)

    def _handle(self, _signum: int, _frame: object) -> None:
        if self.measuring:
            self.measuring = False  # once: a second one must not cut the outcome short
            if self._held:
                self._pending = True
                self._break_now.set()
                return
            raise KeyboardInterrupt

    def _break(self) -> None:
        self._break_now.wait()
        for breaking in list(self._held):
            breaking()

    @contextlib.contextmanager
    def held(self, breaking: Callable[[], None]) -> Iterator[None]:
        """Hold the interrupt while the block uses a barrier shared with other processes
        (``RoundBarrier``, ``Peers``); raise it when the outermost block ends.

        Their state is in shared memory, and an exception raised inside their wait or
        notify leaves it inconsistent: another process fails an assertion or waits out
        its timeout, and the interrupted run's samples of both are lost.  An interrupt
        that comes meanwhile breaks the barrier with ``breaking`` from a thread of its
        own (a wait ends at once, as the interrupt would have ended it), and is raised
        once that thread is done: a process that ended while it held the barrier's lock
        would leave the lock held for good.  Main thread only, where the handler runs;
        nests.
        """
        self._held.append(breaking)
        try:
            yield
        finally:
            self._held.pop()
            if self._pending and not self._held:
                self._pending = False
                self._breaker.join()
                raise KeyboardInterrupt

    def measure(self, loop: WorkerLoop, command: tuple[Any, ...]) -> WorkerOutcome:
        _, start_monotonic_ns, duration_ns, step_count = command
        begin = start_monotonic_ns + perf_minus_monotonic_ns()
        self.measuring = True
        try:
            return loop.measure(begin_ns=begin, duration_ns=duration_ns, step_count=step_count)
        finally:
            self.measuring = False


def _open_clients(spec: WorkerSpec, peers: Peers | None) -> dict[int, ReplayClient]:
    """A client for each server this process calls (its share of the worker's calls)."""
    servers = {
        call.server_index
        for step in spec.workload.steps
        for call in (step if peers is None else peers.local_step(step)).calls
    }
    return {
        index: ReplayClient(spec.targets[index], mode=spec.workload.mode, settings=spec.settings)
        for index in sorted(servers)
    }


def _open_driver(
    spec: WorkerSpec, peers: Peers | None, hold: Hold = unheld
) -> tuple[Driver | NativeDriver, Callable[[], None], Callable[[], int]]:
    """The driver of this process's calls, connected and with its requests made; what
    closes it; the CPU clock of the process (and of the engine program, if any, whose
    frames are read under ``hold``)."""
    if spec.native_program:
        native = open_native_driver(
            Path(spec.native_program),
            spec.workload,
            spec.targets,
            spec.pacing,
            spec.plan,
            settings=spec.settings,
            peers=peers,
            hold=hold,
        )
        return native, native.close, native.cpu_ns
    clients = _open_clients(spec, peers)

    def close() -> None:
        for client in clients.values():
            client.close()

    try:
        driver = Driver(clients, spec.pacing, timeout_s=spec.plan.deadline_s, peers=peers)
        driver.prepare(spec.workload.steps)
        for client in clients.values():
            client.wait_ready(spec.plan.connect_timeout_s)
    except BaseException:
        close()
        raise
    return driver, close, time.process_time_ns


def _worker_main(
    connection: multiprocessing.connection.Connection,
    spec: WorkerSpec,
    barrier: Any = None,
    parent_pid: int = 0,
    links: PeerLinks | None = None,
) -> None:
    """A worker process: build channels and requests, then obey the parent's commands.

    Commands: ("warmup", ns) -> ("warm",); ("run", start_monotonic_ns, duration_ns,
    steps) -> ("result", ...); ("stop",) ends.  Setup failures -> ("error", message).
    ``INTERRUPT_SIGNAL`` ends a measured run early: its result holds the calls so far.
    """
    lifetime.die_with_parent(parent_pid)
    if spec.netns:
        # Before any channel: gRPC's threads, made later, follow this thread there.
        try:
            namespaces.enter_namespace(spec.netns)
        except NetworkError as error:
            connection.send(("error", f"worker {spec.worker_index}: {error}"))
            connection.close()
            return
    # Ctrl-C and a hang-up reach the whole process group: the parent handles them
    # (and interrupts the workers' run itself).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    interrupt = _RunInterrupt()
    hold = interrupt.held
    close: Callable[[], None] = lambda: None  # noqa: E731
    try:
        peers = None
        if links is not None:
            peers = Peers(links, spec.workload.steps, timeout_s=spec.plan.deadline_s, hold=hold)
        driver, close, cpu_clock = _open_driver(spec, peers, hold)
        rounds = None if barrier is None else RoundBarrier(barrier, spec.plan.deadline_s, hold)
        if spec.compute_gaps is not None:
            driver.on_compute = GapSender(spec.compute_gaps)
        loop = WorkerLoop(
            spec.workload,
            driver,
            cpu_clock=cpu_clock,
            step_barrier=rounds,
            record_steps=spec.process == 0 and spec.worker_index not in spec.workload.side_workers,
            **round_hooks(spec.rounds, wait=spec.plan.compute_load_wait),
        )
        connection.send(("ready",))
        while True:
            command = connection.recv()
            if command[0] == "warmup":
                try:
                    loop.warm_up(command[1])
                    connection.send(("warm", "", loop.replayed_steps))
                except TransportError as error:
                    connection.send(("warm", f"during warm-up: {error}", 0))
            elif command[0] == "run":
                outcome = interrupt.measure(loop, command)
                connection.send(
                    (
                        "result",
                        pack_samples(outcome.samples),
                        outcome.step_times_ns,
                        outcome.step_compute_ns,
                        outcome.elapsed_ns,
                        outcome.cpu_ns,
                        outcome.partial_reason if outcome.partial else None,
                        outcome.machine_cpu_begin,
                        outcome.machine_cpu_end,
                    )
                )
            else:
                break
    except TransportError as error:
        connection.send(("error", str(error)))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    except Exception:
        connection.send(("error", f"worker {spec.worker_index} crashed:\n{traceback.format_exc()}"))
    finally:
        close()
        connection.close()


class _WorkerProcesses:
    """The parent's handles on its worker processes."""

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        round_barrier: bool = False,
        procs_per_worker: int = 1,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        #: Shared by the workers when the trace's steps are rounds (``Workload.round_barrier``).
        self.barrier = context.Barrier(len(specs)) if round_barrier and len(specs) > 1 else None
        self.processes: list[Any] = []
        self.connections: list[multiprocessing.connection.Connection] = []
        #: The barriers of each worker's processes (more than one per worker).
        self.peer_barriers: list[Any] = []
        links = _peer_links(context, specs, procs_per_worker)
        try:
            # A stop signal waits until every child has its arguments and is listed here
            # (one that cut a write short left the child a truncated pickle's traceback).
            with lifetime.deferred_signals():
                for spec, link in zip(specs, links, strict=True):
                    if link is not None and link.process == 0:
                        self.peer_barriers.append(link.barrier)
                    parent_end, child_end = context.Pipe()
                    process = context.Process(
                        target=_worker_main,
                        args=(child_end, spec, self.barrier, os.getpid(), link),
                        name=f"tf-grpc-bench-worker-{spec.worker_index}-{spec.process}",
                        daemon=True,
                    )
                    process.start()
                    child_end.close()
                    self.processes.append(process)
                    self.connections.append(parent_end)
        except BaseException:
            self.stop()
            raise

    def send_all(self, message: tuple[object, ...]) -> None:
        for barrier in [self.barrier, *self.peer_barriers]:
            if barrier is not None:
                # A phase that ended left it broken; nobody waits on it between phases.
                barrier.reset()
        for connection in self.connections:
            connection.send(message)

    def receive(self, worker: int, timeout_s: float | None = None) -> tuple[object, ...]:
        """The worker's next message; ``TransportError`` if it died or timed out."""
        connection, process = self.connections[worker], self.processes[worker]
        waited = 0.0
        while not connection.poll(POLL_S):
            waited += POLL_S
            if not process.is_alive() and not connection.poll(0):
                raise TransportError(
                    f"worker process {process.pid} exited (exit code {process.exitcode})"
                )
            if timeout_s is not None and waited >= timeout_s:
                raise TransportError(
                    f"worker process {process.pid} did not answer in {timeout_s:g} s"
                )
        try:
            message: tuple[object, ...] = connection.recv()
        except EOFError:
            raise TransportError(f"worker process {process.pid} exited") from None
        if message[0] == "error":
            raise TransportError(str(message[1]))
        return message

    def interrupt(self) -> None:
        """End the workers' measured run now; each still sends what it measured."""
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, INTERRUPT_SIGNAL)

    def stop(self) -> None:
        """Ask every worker to end, and end those still running after ``STOP_GRACE_S``
        (all of them together: a worker in its warm-up reads "stop" only when the
        warm-up is over, and one wait per worker in turn made a stop signal in the
        warm-up take 10 s per process)."""
        for connection in self.connections:
            with contextlib.suppress(BrokenPipeError, OSError):
                connection.send(("stop",))
        lifetime.end_processes(
            self.processes,
            (("", STOP_GRACE_S), ("terminate", KILL_GRACE_S), ("kill", KILL_GRACE_S)),
        )
        for connection in self.connections:
            connection.close()


def _peer_links(
    context: Any, specs: Sequence[WorkerSpec], procs_per_worker: int
) -> list[PeerLinks | None]:
    """Each spec's shared state with the other processes of its worker (None: alone)."""
    links: list[PeerLinks | None] = []
    group: list[PeerLinks] = []
    for spec in specs:
        if spec.process == 0:
            split = split_worker(spec.workload, procs_per_worker)
            group = make_links(context, spec.workload, split) if split.count > 1 else []
        links.append(group[spec.process] if group else None)
    return links


class ProcessWorkers:
    """A benchmark's workers in processes of their own (``transport.seam.Workers``):
    one per job, or ``job.processes`` sharing its calls (``core.processes``)."""

    def __init__(
        self, jobs: Sequence[WorkerJob], *, round_barrier: bool, native_program: Path | None = None
    ) -> None:
        """``native_program``: the gRPC C++ engine's program makes the calls (grpc-cpp engine)."""
        self.load = ComputeLoad(jobs)
        specs = [
            WorkerSpec(
                worker_index=job.worker_index,
                workload=job.workload,
                targets=job.targets,
                pacing=job.pacing,
                plan=job.plan,
                settings=job.channel,
                process=process,
                netns=job.netns,
                native_program=str(native_program or ""),
                compute_gaps=self.load.gap_writer(number) if process == 0 else None,
                rounds=self.load.round_clock(number) if process == 0 else None,
            )
            for number, job in enumerate(jobs)
            for process in range(split_worker(job.workload, job.processes).count)
        ]
        self._plan = jobs[0].plan
        self._count = len(specs)
        try:
            self._workers = _WorkerProcesses(
                specs,
                round_barrier=round_barrier,
                procs_per_worker=max(job.processes for job in jobs),
            )
        except BaseException:
            self.load.close()
            raise

    def wait_ready(self, timeout_s: float) -> None:
        for index in range(self._count):
            self._workers.receive(index, timeout_s=timeout_s)

    def warm_up(self, duration_ns: int) -> None:
        cpu = self.load.replay_cpu_ns()
        began = time.monotonic_ns()
        self._workers.send_all(("warmup", duration_ns))
        replies = [self._workers.receive(index) for index in range(self._count)]
        errors = [str(reply[1]) for reply in replies]
        if any(errors):
            raise TransportError(next(e for e in errors if e))
        steps = replies[0][2]
        assert isinstance(steps, int)
        self.load.size(
            replay_cpu_ns=self.load.replay_cpu_ns() - cpu,
            steps=steps,
            wall_ns=time.monotonic_ns() - began,
        )

    def run(self, *, duration_ns: int, steps: int | None) -> list[WorkerOutcome]:
        start = time.monotonic_ns() + START_MARGIN_NS
        with self.load.measuring() as measured:
            self._workers.send_all(("run", start, duration_ns, steps))
            outcomes = _run_outcomes(self._workers, self._count, start, self._plan)
            measured.steps = max((len(o.step_times_ns) for o in outcomes), default=0)
        return outcomes

    def close(self) -> None:
        try:
            self._workers.stop()
        finally:
            self.load.close()


def measure_throughput(
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
) -> tuple[RunMeasurement, ...]:
    """Warm up and measure ``plan.runs`` runs with one process per worker, or
    ``procs_per_worker`` processes per worker sharing its calls (``core.processes``).

    ``client_namespaces`` maps a job to a named network namespace: the processes of
    a client standing for a task of that job (``workload.client_tasks``) run there.
    ``clients`` (in this process) only reset and read the servers' statistics.
    """
    jobs = worker_jobs(
        workload,
        targets,
        pacing,
        plan,
        settings=settings,
        procs_per_worker=procs_per_worker,
        client_namespaces=client_namespaces,
    )
    workers = ProcessWorkers(jobs, round_barrier=workload.round_barrier)
    try:
        return measure_runs(workers, workload, clients, plan, on_progress or (lambda event: None))
    finally:
        workers.close()


def _run_outcomes(
    workers: _WorkerProcesses, worker_count: int, start: int, plan: RunPlan
) -> list[WorkerOutcome]:
    """Every worker's outcome of the run begun at ``start`` (monotonic ns).

    A stop signal while waiting interrupts the workers' run: each sends the
    calls it completed (a worker that does not within the grace is counted as
    failed), and the run is kept, marked partial.  Only the first stop signal
    interrupts (``lifetime``): later ones cannot cut this short.
    """
    outcomes: list[WorkerOutcome] = []
    interrupted: KeyboardInterrupt | None = None
    timeout_s: float | None = None
    while len(outcomes) < worker_count:
        try:
            outcomes.append(_receive_outcome(workers, len(outcomes), start, timeout_s))
        except KeyboardInterrupt as interrupt:
            interrupted = interrupt
            timeout_s = min(plan.deadline_s, INTERRUPT_GRACE_S) + INTERRUPT_GRACE_S
            workers.interrupt()
    if interrupted is None:
        return outcomes
    reason = interrupted_reason(lifetime.signal_of(interrupted))
    return [replace(outcome, partial=True, partial_reason=reason) for outcome in outcomes]


def _receive_outcome(
    workers: _WorkerProcesses, index: int, start: int, timeout_s: float | None
) -> WorkerOutcome:
    """Worker ``index``'s outcome of a run; an empty partial one if it failed or died."""
    try:
        message = workers.receive(index, timeout_s)
    except TransportError as error:
        return WorkerOutcome(
            samples=(),
            step_times_ns=(),
            elapsed_ns=max(time.monotonic_ns() - start, 1),
            cpu_ns=0,
            partial=True,
            partial_reason=str(error),
        )
    _, packed, step_times, step_compute, elapsed, cpu, reason, machine_begin, machine_end = message
    assert isinstance(packed, np.ndarray)
    assert machine_begin is None or isinstance(machine_begin, MachineCpuTimes)
    assert machine_end is None or isinstance(machine_end, MachineCpuTimes)
    assert isinstance(step_times, tuple) and isinstance(step_compute, tuple)
    assert isinstance(elapsed, int) and isinstance(cpu, int)
    return WorkerOutcome(
        samples=unpack_samples(packed),
        step_times_ns=step_times,
        step_compute_ns=step_compute,
        elapsed_ns=elapsed,
        cpu_ns=cpu,
        partial=reason is not None,
        partial_reason=str(reason or ""),
        machine_cpu_begin=machine_begin,
        machine_cpu_end=machine_end,
    )
