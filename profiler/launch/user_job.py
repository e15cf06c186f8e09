"""A training job this tool did not write: the user's own script, one process per task.

The user gives the cluster layout (the addresses the tasks will listen on, as
in ``TF_CONFIG``) and the command that runs one task (the same command for
every task, as TensorFlow's multi-worker tutorials do).  ``UserTasks`` starts
one process per task running the command, with a ``TF_CONFIG`` written for
that task (``task_tf_config``: its own real address, its peers where a
recorder says they must be dialled).

A user script writes no step markers unless it wants to: it may append lines
(``launch.markers`` format) to the file named by ``$TF_GRPC_BENCH_STEP_MARKERS``.

The run ends when every *driver* task (the chief if there is one, else every
worker) has exited with status 0; the other tasks (servers that never return)
are then stopped.  A task that fails, a run past ``timeout_s`` (default
``DEFAULT_TIMEOUT_S``: a capture never waits forever), or a job that looks
hung, its tasks exchanging nothing and writing no step marker for
``step_timeout_s`` (a synchronous job whose workers finish at different
times may wait for each other forever), ends the run early.

This module imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from absl import logging

from tf_grpc_bench import lifetime
from tf_grpc_bench.cluster import split_address
from tf_grpc_bench.errors import BenchError, CaptureError, ConfigError, ServeError
from tf_grpc_bench.profiler.launch.identity import TaskIdentity, expand_placeholders
from tf_grpc_bench.profiler.launch.markers import StepMarker, read_step_markers
from tf_grpc_bench.profiler.launch.processes import meaningful_line, stop_groups, tail_lines
from tf_grpc_bench.profiler.progress import Progress, ProgressCallback

#: Environment variable naming the step-marker file a user script may write.
MARKERS_VARIABLE = "TF_GRPC_BENCH_STEP_MARKERS"
_MAX_TASKS = 32
#: How long a user's job may run in all, unless told otherwise (seconds).
DEFAULT_TIMEOUT_S = 1800.0
#: How long the tasks may exchange nothing (and write no step marker) before the
#: job counts as hung, unless told otherwise (seconds; ``capture``'s default).
DEFAULT_STEP_TIMEOUT_S = 120.0
#: Least time between two progress reports of a job without step markers.
_PROGRESS_EVERY_NS = 5_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class UserJob:
    """A user's job: the cluster (job -> listen addresses) and the command of every task.

    ``drivers`` are the jobs whose tasks end the run by exiting (default: the
    chief if any, else the workers).  ``model``/``strategy``/``batch_size``/
    ``input_shape`` only label the trace.
    """

    cluster: Mapping[str, tuple[str, ...]]
    command: tuple[str, ...]
    warmup_steps: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S
    drivers: tuple[str, ...] = ()
    model: str = ""
    strategy: str = ""
    batch_size: int = 0
    input_shape: tuple[int, ...] = ()
    synchronous: bool = True

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no command to run: give it after '--'")
        if not self.cluster:
            raise ConfigError("the cluster has no jobs")
        count = 0
        seen: set[tuple[str, int]] = set()
        for job, addresses in self.cluster.items():
            if not job or not job.replace("_", "").isalnum():
                raise ConfigError(f"cluster: {job!r} is not a job name")
            if not addresses:
                raise ConfigError(f"cluster: job {job!r} has no tasks")
            for address in addresses:
                host, port = split_address(address, where=f"cluster job {job!r}")
                if (host, port) in seen:
                    raise ConfigError(f"cluster: address {address} is listed twice")
                seen.add((host, port))
                count += 1
        if count > _MAX_TASKS:
            raise ConfigError(f"{count} tasks is too many for one machine (at most {_MAX_TASKS})")
        for job in self.drivers:
            if job not in self.cluster:
                raise ConfigError(f"driver job {job!r} is not in the cluster")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup steps must be >= 0, got {self.warmup_steps}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout must be > 0 s, got {self.timeout_s}")
        if not self.step_timeout_s > 0:
            raise ConfigError(f"step timeout must be > 0 s, got {self.step_timeout_s}")

    @property
    def driver_jobs(self) -> tuple[str, ...]:
        if self.drivers:
            return self.drivers
        return ("chief",) if "chief" in self.cluster else ("worker",)

    @property
    def tasks(self) -> list[tuple[str, int, str]]:
        """(job, index, address) of every task, servers (ps) first, drivers last."""
        order = sorted(self.cluster, key=lambda j: (j in self.driver_jobs, j != "ps", j))
        return [(job, i, a) for job in order for i, a in enumerate(self.cluster[job])]


def rehost_cluster(
    cluster: Mapping[str, Sequence[str]], address_of: Callable[[tuple[str, int]], str]
) -> dict[str, tuple[str, ...]]:
    """``cluster`` with every task's host replaced by ``address_of((job, index))``, its
    port kept.  ConfigError if two tasks share a port: the in-process recorder tells
    the tasks apart by their ports."""
    rehosted: dict[str, tuple[str, ...]] = {}
    owner: dict[int, str] = {}
    for job, addresses in cluster.items():
        moved = []
        for index, address in enumerate(addresses):
            _, port = split_address(address, where=f"cluster job {job!r}")
            if port in owner:
                raise ConfigError(
                    f"cluster: {owner[port]} and {job}:{index} both use port {port}; "
                    "with --network every task needs its own port"
                )
            owner[port] = f"{job}:{index}"
            moved.append(f"{address_of((job, index))}:{port}")
        rehosted[job] = tuple(moved)
    return rehosted


def task_tf_config(
    cluster: Mapping[str, Sequence[str]],
    peers: Mapping[tuple[str, int], str],
    job: str,
    index: int,
) -> dict[str, Any]:
    """TF_CONFIG for one task: its own real address, every peer's address from ``peers``
    (the proxies', or the real ones)."""
    rewritten = {
        name: [
            address if (name, i) == (job, index) else peers[(name, i)]
            for i, address in enumerate(addresses)
        ]
        for name, addresses in cluster.items()
    }
    # gRPC is the only RPC layer of open-source TensorFlow, and what the proxies follow.
    return {"cluster": rewritten, "task": {"type": job, "index": index}, "rpc_layer": "grpc"}


# --------------------------------------------------------------------------
# Processes.


@dataclass
class _Watch:
    """When a running job last showed life (traffic or a new step marker), and what
    the progress display was last told."""

    started_ns: int
    activity: int
    changed_ns: int = 0
    markers: int = 0
    reported_ns: int = 0
    reported_markers: int = -1

    def __post_init__(self) -> None:
        self.changed_ns = self.started_ns

    def update(self, now_ns: int, activity: int, markers: int) -> None:
        if activity != self.activity or markers != self.markers:
            self.activity, self.markers, self.changed_ns = activity, markers, now_ns

    def report(self, progress: ProgressCallback, now_ns: int, markers: list[StepMarker]) -> None:
        """Tell ``progress`` about new step markers, or, without any, how the job runs
        (at most every few seconds)."""
        if markers:
            if len(markers) != self.reported_markers:
                self.reported_markers = len(markers)
                progress(Progress(steps_done=len(markers), last_step_ns=markers[-1].duration_ns))
            return
        if now_ns - self.reported_ns >= _PROGRESS_EVERY_NS:
            self.reported_ns = now_ns
            progress(
                Progress(
                    markers=False,
                    elapsed_ns=now_ns - self.started_ns,
                    quiet_ns=now_ns - self.changed_ns,
                )
            )


@dataclass
class _TaskProcess:
    job: str
    index: int
    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]
    log_prefix: Path

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"


def _stderr_tail(path: Path) -> str:
    """What the task's stderr says went wrong, in one line: ": <line>", or ""."""
    line = meaningful_line(tail_lines(path, tail_bytes=16384) or [])
    return f": {line}" if line else ""


def check_local(host: str, task: str) -> None:
    """ConfigError unless ``host`` is an address of this machine (every task runs here)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ConfigError(f"cluster: cannot resolve host {host!r} of task {task}") from None
    for family, kind, protocol, _, address in infos:
        probe = socket.socket(family, kind, protocol)
        try:
            probe.bind(address)
            return
        except OSError:
            continue
        finally:
            probe.close()
    raise ConfigError(
        f"cluster: {host} (task {task}) is not an address of this machine; capture-job runs "
        "every task here (use localhost)"
    )


def _check_port_free(host: str, port: int, task: str) -> None:
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("::" if ":" in host else "0.0.0.0", port))
    except OSError:
        raise ServeError(
            f"port {port} (for {task}) is already in use; stop whatever listens there "
            "or choose other ports in --cluster"
        ) from None
    finally:
        probe.close()


class UserTasks:
    """The processes of one run of a ``UserJob``; ``stop()`` however the run ends.

    Task logs go to ``<work>/<job>-<index>.stdout|.stderr``; the step-marker
    file is ``markers_path``.  Not thread-safe: drive it from one thread.
    """

    def __init__(
        self,
        job: UserJob,
        work: Path,
        markers_path: Path,
        *,
        prefixes: Mapping[tuple[str, int], Sequence[str]] | None = None,
    ) -> None:
        """``prefixes`` go before a task's command (``ip netns exec NS``: inside an
        emulated host); none by default."""
        self.job = job
        self.work = work
        self.markers_path = markers_path
        self.prefixes = {key: tuple(prefix) for key, prefix in (prefixes or {}).items()}
        self.processes: list[_TaskProcess] = []

    def pids(self) -> dict[tuple[str, int], int]:
        """Process id (also its process group id) of every started task."""
        return {(t.job, t.index): t.process.pid for t in self.processes}

    def start(
        self,
        environment: Mapping[str, str],
        peers: Mapping[tuple[str, int], str],
        *,
        started: Callable[[int, str], None] = lambda pid, task: None,
    ) -> None:
        """Start every task (servers first) with ``environment`` and its TF_CONFIG.

        ``peers`` are the addresses at which tasks dial each other; ``started``
        hears every process's pid and task name.  ServeError if a task's port
        is taken, CaptureError if the command cannot be run.
        """
        tasks = self.job.tasks
        for name, index, address in tasks:
            _check_port_free(*split_address(address, where="cluster"), f"{name}:{index}")
        for name, index, _ in tasks:
            variables = dict(environment)
            tf_config = task_tf_config(self.job.cluster, peers, name, index)
            variables["TF_CONFIG"] = json.dumps(tf_config)
            variables[MARKERS_VARIABLE] = str(self.markers_path)
            variables["PYTHONUNBUFFERED"] = "1"
            # {job}, {task}, {cluster}, {port}: a script that takes its role as flags.
            seen = {job: tuple(addresses) for job, addresses in tf_config["cluster"].items()}
            command = expand_placeholders(
                self.job.command, TaskIdentity(job=name, index=index, cluster=seen)
            )
            process = self._spawn(name, index, variables, command)
            started(process.pid, f"{name}:{index}")

    def _spawn(
        self, name: str, index: int, variables: dict[str, str], command: Sequence[str]
    ) -> subprocess.Popen[bytes]:
        prefix = self.work / f"{name}-{index}"
        stdout = prefix.with_suffix(".stdout").open("wb")
        stderr = prefix.with_suffix(".stderr").open("wb")
        try:
            process = subprocess.Popen(
                [*self.prefixes.get((name, index), ()), *command],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=variables,
                start_new_session=True,
                # Dies with this process, even one killed by SIGKILL.
                preexec_fn=lifetime.die_with_parent_preexec(),
            )
        except OSError as failure:
            stdout.close()
            stderr.close()
            raise CaptureError(
                f"cannot run {self.job.command[0]!r} for task {name}:{index}: {failure.strerror}"
            ) from None
        self.processes.append(_TaskProcess(name, index, process, stdout, stderr, prefix))
        logging.info("started task %s:%d (pid %d)", name, index, process.pid)
        return process

    def wait(
        self, progress: ProgressCallback | None, activity: Callable[[], int] = lambda: 0
    ) -> None:
        """Block until every driver exited 0.

        CaptureError if a task fails, if the job runs past its ``timeout_s``,
        or if it looks hung: ``activity`` (a count that grows while the tasks
        talk, ``Recorder.activity``) and the step markers stay still for
        ``step_timeout_s``.
        """
        job, processes = self.job, self.processes
        watch = _Watch(time.monotonic_ns(), activity())
        drivers = [t for t in processes if t.job in job.driver_jobs]
        while True:
            for task in processes:
                code = task.process.poll()
                if code is not None and code != 0:
                    status = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
                    tail = _stderr_tail(task.log_prefix.with_suffix(".stderr"))
                    raise CaptureError(f"task {task.name} {status}{tail}")
            if all(t.process.poll() == 0 for t in drivers):
                return
            now = time.monotonic_ns()
            markers = self._markers()
            watch.update(now, activity(), len(markers))
            running = ", ".join(t.name for t in drivers if t.process.poll() is None)
            if now - watch.started_ns > job.timeout_s * 1e9:
                raise CaptureError(
                    f"the job did not finish within {job.timeout_s:g} s (--timeout; "
                    f"drivers still running: {running})"
                )
            if now - watch.changed_ns > job.step_timeout_s * 1e9:
                raise CaptureError(
                    f"the job looks hung: its tasks exchanged nothing and wrote no step "
                    f"marker for {job.step_timeout_s:g} s (--step-timeout; drivers still "
                    f"running: {running})"
                )
            if progress is not None:
                watch.report(progress, now, markers)
            time.sleep(0.2)

    def _markers(self) -> list[StepMarker]:
        with contextlib.suppress(BenchError, OSError):
            return read_step_markers(self.markers_path)
        return []

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every task's process group, SIGKILL after ``grace_s``, reap all."""
        stop_groups(
            [t.process for t in self.processes],
            [s for t in self.processes for s in (t.stdout, t.stderr)],
            grace_s=grace_s,
        )
