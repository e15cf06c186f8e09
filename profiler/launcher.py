"""Launch real distributed TensorFlow training on this machine, one OS process per task.

Three setups:

``tf2-ps`` (default)
    TF2 ``ParameterServerStrategy`` driven by a ``ClusterCoordinator``: one chief
    (the coordinator, which drives the steps), ``ps`` parameter servers and
    ``workers`` workers.  Variables live on the ps tasks; each scheduled step
    runs on one worker, which pulls the weights and the ps tasks pull its
    gradients.  Keras 3 by default (``tf_keras`` works too).
``tf1-ps``
    TF1 graph-mode parameter-server training, the architecture the paper
    measured: ``tf.compat.v1.train.Server`` per task, variables placed by
    ``replica_device_setter``, ``tf_keras`` model (Keras 3 has no graph mode),
    ``ps`` ps tasks and ``workers`` workers; every worker drives its own steps,
    worker 0 is the chief (initialises the variables).
``mwms``
    TF2 ``MultiWorkerMirroredStrategy``: ``workers`` workers, no ps; every worker
    holds a replica and gradients are all-reduced with collectives (``RecvBuf``).

What a *step* is, and what ``synchronous`` means (``steps`` and
``warmup_steps`` always count steps *per worker*):

* tf2-ps, synchronous: a step is a round: the chief schedules one training
  step per worker, then joins (waits for all of them).  The coordinator hands a
  queued step to whichever worker is idle, so normally, not provably, each
  worker runs one step per round.  One marker per round (task ``chief:0``).
* tf2-ps, asynchronous: warm-up rounds as above, then the chief keeps one step
  per worker in flight without joining; a marker spans one worker-step, from
  scheduling to its result reaching the chief, and markers overlap.
  ``steps * workers`` steady markers, numbered in scheduling order.
* tf1-ps, synchronous: ``SyncReplicasOptimizer`` applies one update per
  ``workers`` gradients, and each worker blocks after pushing its gradient
  until the update is applied.  No initial tokens, so the first update takes a
  gradient from every worker; later, TensorFlow does not insist that the
  gradients come from distinct workers (a fast worker may take a slow one's
  token), only that none is stale.  Each worker marks its own steps.
* tf1-ps, asynchronous: plain SGD; each worker applies its gradients to the ps
  whenever it has them and marks its own steps.
* mwms: synchronous by nature: every step all-reduces every worker's gradients
  before any applies them.  Each worker marks its own steps.
* tf1-ps and mwms workers wait for one another (a file barrier in the work
  directory for tf1-ps, the collectives for mwms) before their first step.

The optimizer is plain SGD everywhere (no slot variables), so in the PS setups
each worker-step moves exactly the trainable variables once each way (weights
to the worker, gradients to the ps), plus, for models with batch normalisation,
the moving statistics' updates.

Each task binds its gRPC server on ``TaskSpec.bind_port`` while every task's
cluster definition lists the ``advertised_address`` of its peers; a recording
proxy can sit between the two.  Without a proxy they are the same.

A driving task that has finished its steps idles until stopped: peers may
still need it (the tf1-ps chief worker runs the queue that applies synchronous
updates).  So after ``TrainingJob.wait`` every task is still running until
``stop()`` or the end of the ``with`` block.

Files in the job's work directory: ``plan.json`` (what the tasks read),
``steps.jsonl`` (step markers), ``job.json`` (model, variables, settings),
``ready-<job>-<index>`` and ``finished-<job>-<index>.json`` per driving task,
``<job>-<index>.stdout`` and ``.stderr`` per task.

This module imports no TensorFlow; the tasks (``tf_grpc_bench.profiler.task``)
do, in their own processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tf_grpc_bench.errors import CaptureError, ConfigError, ServeError
from tf_grpc_bench.models.registry import KERAS_FLAVOURS, check_input_size, model_spec
from tf_grpc_bench.profiler.ports import check_ports_free, free_ports

SETUPS = ("tf2-ps", "tf1-ps", "mwms")
PHASES = ("warmup", "steady")

#: Most tasks a job may have: each is a TensorFlow process of a few hundred MB.
MAX_TASKS = 32

#: Version of plan.json and job.json.  History: 1 (2026-11): first version.
PLAN_VERSION = 1

PLAN_FILE = "plan.json"
MARKERS_FILE = "steps.jsonl"
JOB_INFO_FILE = "job.json"

#: First word of the line a task writes on stderr when it fails.
FAILURE_PREFIX = "TASK FAILED"

_STRATEGY_NAMES = {
    "tf2-ps": "tf.distribute.experimental.ParameterServerStrategy",
    "tf1-ps": "tf.compat.v1 replica_device_setter parameter server",
    "mwms": "tf.distribute.MultiWorkerMirroredStrategy",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """What to train and how; validated on construction (ConfigError).

    ``steps`` and ``warmup_steps`` count steps per worker (see the module
    docstring for what a step is in each setup).  ``input_size`` is the image
    side in pixels, default the model's minimum (traffic follows the variables,
    not the image).  ``batch_size`` is per worker.  ``keras_flavour`` defaults to
    ``keras`` for the TF2 setups and ``tf_keras`` for tf1-ps.  Timeouts: no task
    may take longer than ``startup_timeout_s`` to finish its first step, nor
    ``step_timeout_s`` between two step markers.
    """

    model: str
    setup: str = "tf2-ps"
    ps: int = 1
    workers: int = 2
    steps: int = 3
    warmup_steps: int = 1
    batch_size: int = 4
    input_size: int | None = None
    classes: int | None = None
    synchronous: bool = True
    seed: int = 0
    learning_rate: float = 0.01
    keras_flavour: str | None = None
    startup_timeout_s: float = 300.0
    step_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.setup not in SETUPS:
            raise ConfigError(f"unknown setup {self.setup!r}; expected one of {', '.join(SETUPS)}")
        model_spec(self.model)  # ConfigError naming the known models
        if self.input_size is not None:
            check_input_size(self.model, self.input_size)
        if self.classes is not None and self.classes < 1:
            raise ConfigError(f"classes must be >= 1, got {self.classes}")
        _check_cluster_size(self.setup, self.ps, self.workers)
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not (self.startup_timeout_s > 0 and self.step_timeout_s > 0):
            raise ConfigError("startup_timeout_s and step_timeout_s must be > 0")
        if self.setup == "mwms" and not self.synchronous:
            raise ConfigError(
                "setup mwms is synchronous by nature (every step all-reduces the gradients); "
                "asynchronous training needs tf2-ps or tf1-ps"
            )
        if self.keras_flavour is not None and self.keras_flavour not in KERAS_FLAVOURS:
            raise ConfigError(
                f"unknown keras_flavour {self.keras_flavour!r}; expected one of {KERAS_FLAVOURS}"
            )
        if self.setup == "tf1-ps" and self.keras_flavour == "keras":
            raise ConfigError(
                "setup tf1-ps runs in TF1 graph mode, which Keras 3 does not support: "
                "use keras_flavour tf_keras"
            )

    @property
    def image_size(self) -> int:
        """The image side in pixels that will be trained on."""
        return self.input_size or model_spec(self.model).minimum_input_size

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, 3)

    @property
    def class_count(self) -> int:
        return self.classes or model_spec(self.model).default_classes

    @property
    def keras(self) -> str:
        """The Keras flavour the tasks will use."""
        if self.keras_flavour:
            return self.keras_flavour
        return "tf_keras" if self.setup == "tf1-ps" else "keras"

    @property
    def strategy(self) -> str:
        return _STRATEGY_NAMES[self.setup]

    @property
    def jobs(self) -> dict[str, int]:
        """Task count per TensorFlow job name, in start order (servers first)."""
        if self.setup == "tf2-ps":
            return {"ps": self.ps, "worker": self.workers, "chief": 1}
        if self.setup == "tf1-ps":
            return {"ps": self.ps, "worker": self.workers}
        return {"worker": self.workers}

    @property
    def driving_tasks(self) -> tuple[tuple[str, int], ...]:
        """The (job, index) of the tasks that drive steps and write step markers."""
        if self.setup == "tf2-ps":
            return (("chief", 0),)
        return tuple(("worker", i) for i in range(self.workers))

    @property
    def markers_per_driving_task(self) -> int:
        """Step markers each driving task writes in a complete run."""
        if self.setup == "tf2-ps" and not self.synchronous:
            return self.warmup_steps + self.steps * self.workers
        return self.warmup_steps + self.steps

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown training config fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def _check_cluster_size(setup: str, ps: int, workers: int) -> None:
    if workers < 1:
        raise ConfigError(f"setup {setup} needs at least 1 worker, got workers={workers}")
    if setup == "mwms":
        if ps != 0:
            raise ConfigError(
                f"setup mwms has no parameter servers (collectives between workers): "
                f"set ps=0, got ps={ps}"
            )
    elif ps < 1:
        raise ConfigError(f"setup {setup} needs at least 1 parameter server, got ps={ps}")
    total = ps + workers + (1 if setup == "tf2-ps" else 0)
    if total > MAX_TASKS:
        raise ConfigError(f"{total} tasks is too many for one machine (at most {MAX_TASKS})")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """One task: its gRPC server binds ``bind_port`` (every interface); peers dial
    ``advertised_address`` (``host:port``), which is a proxy's when capturing
    with the recording proxy (the in-process recorder leaves it the bound one)."""

    job: str
    index: int
    bind_port: int
    advertised_address: str

    def __post_init__(self) -> None:
        if self.job not in ("chief", "ps", "worker"):
            raise ConfigError(f"task job must be chief, ps or worker, got {self.job!r}")
        if self.index < 0:
            raise ConfigError(f"task {self.job} index must be >= 0, got {self.index}")
        if not 0 < self.bind_port < 65536:
            raise ConfigError(f"task {self.name}: bind_port {self.bind_port} is not a TCP port")
        host, _, port = self.advertised_address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"task {self.name}: advertised_address {self.advertised_address!r} is not host:port"
            )

    @property
    def name(self) -> str:
        """``job:index``, as in step markers (e.g. ``worker:0``)."""
        return f"{self.job}:{self.index}"

    @property
    def key(self) -> tuple[str, int]:
        return (self.job, self.index)

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "index": self.index,
            "bind_port": self.bind_port,
            "advertised_address": self.advertised_address,
        }


def plan_tasks(config: TrainingConfig, *, host: str = "127.0.0.1") -> list[TaskSpec]:
    """One TaskSpec per task of ``config``, on free ports, advertised == bound.

    Order: ps, workers, then the chief (tf2-ps).  To put proxies in between,
    replace ``advertised_address`` (``dataclasses.replace``) before starting.
    """
    jobs = config.jobs
    ports = iter(free_ports(sum(jobs.values())))
    tasks = []
    for job, count in jobs.items():
        for index in range(count):
            port = next(ports)
            tasks.append(
                TaskSpec(job=job, index=index, bind_port=port, advertised_address=f"{host}:{port}")
            )
    return tasks


def cluster_definition(tasks: Sequence[TaskSpec]) -> dict[str, list[str]]:
    """The cluster as TensorFlow wants it: job -> advertised addresses by index."""
    cluster: dict[str, list[str]] = {}
    for task in sorted(tasks, key=lambda t: (t.job, t.index)):
        cluster.setdefault(task.job, []).append(task.advertised_address)
    return cluster


def _check_tasks(config: TrainingConfig, tasks: Sequence[TaskSpec]) -> None:
    expected = {(job, i) for job, count in config.jobs.items() for i in range(count)}
    given = [t.key for t in tasks]
    if len(set(given)) != len(given):
        raise ConfigError(f"duplicate tasks in the task list: {sorted(given)}")
    if set(given) != expected:
        missing = sorted(expected - set(given))
        extra = sorted(set(given) - expected)
        raise ConfigError(
            f"tasks do not match the {config.setup} cluster of the config: "
            f"missing {missing}, unexpected {extra}"
        )
    ports = [t.bind_port for t in tasks]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"two tasks share a bind port: {sorted(ports)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMarker:
    """One training step as the driving task saw it.

    Times are ``time.monotonic_ns()`` of the driving process (CLOCK_MONOTONIC,
    system-wide on Linux, so comparable with other processes' monotonic clocks).
    """

    task: str
    step: int
    phase: str
    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"step marker phase must be one of {PHASES}, got {self.phase!r}")
        if self.step < 0:
            raise ValueError(f"step marker step must be >= 0, got {self.step}")
        if self.end_ns < self.start_ns:
            raise ValueError(f"step marker {self.task} step {self.step}: end before start")

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_line(self) -> str:
        return (
            json.dumps(
                {
                    "task": self.task,
                    "step": self.step,
                    "phase": self.phase,
                    "start_ns": self.start_ns,
                    "end_ns": self.end_ns,
                },
                separators=(",", ":"),
            )
            + "\n"
        )

    @classmethod
    def from_line(cls, line: str) -> StepMarker:
        data = json.loads(line)
        return cls(
            task=str(data["task"]),
            step=int(data["step"]),
            phase=str(data["phase"]),
            start_ns=int(data["start_ns"]),
            end_ns=int(data["end_ns"]),
        )


def read_step_markers(path: Path) -> list[StepMarker]:
    """Every complete marker line of a step-marker file (a torn last line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    markers = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if not line.endswith("\n"):
            break
        try:
            markers.append(StepMarker.from_line(line))
        except (ValueError, KeyError, TypeError) as error:
            raise CaptureError(f"{path}:{number}: not a step marker ({error})") from None
    return markers


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPlan:
    """Everything a task process needs: the config, every task, the work directory."""

    config: TrainingConfig
    tasks: tuple[TaskSpec, ...]
    workdir: Path
    version: int = PLAN_VERSION

    def task(self, job: str, index: int) -> TaskSpec:
        for task in self.tasks:
            if task.key == (job, index):
                return task
        raise ConfigError(f"plan {self.workdir / PLAN_FILE} has no task {job}:{index}")

    @property
    def cluster(self) -> dict[str, list[str]]:
        return cluster_definition(self.tasks)

    @property
    def markers_path(self) -> Path:
        return self.workdir / MARKERS_FILE

    @property
    def job_info_path(self) -> Path:
        return self.workdir / JOB_INFO_FILE

    def finished_path(self, job: str, index: int) -> Path:
        return self.workdir / f"finished-{job}-{index}.json"

    def ready_path(self, job: str, index: int) -> Path:
        return self.workdir / f"ready-{job}-{index}"

    def log_path(self, job: str, index: int, stream: str) -> Path:
        return self.workdir / f"{job}-{index}.{stream}"

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "config": self.config.as_json(),
            "tasks": [t.as_json() for t in self.tasks],
            "workdir": str(self.workdir),
        }

    def write(self) -> Path:
        path = self.workdir / PLAN_FILE
        path.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> JobPlan:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ConfigError(f"{path}: cannot read the job plan ({error})") from None
        if data.get("version") != PLAN_VERSION:
            raise ConfigError(
                f"{path}: plan version {data.get('version')!r}, this tool reads {PLAN_VERSION}"
            )
        return cls(
            config=TrainingConfig.from_json(data["config"]),
            tasks=tuple(TaskSpec(**t) for t in data["tasks"]),
            workdir=Path(data["workdir"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOutcome:
    """A finished job: its step markers and job.json.  Times are monotonic ns."""

    markers: tuple[StepMarker, ...]
    job_info: Mapping[str, Any]
    started_ns: int
    finished_ns: int
    exit_codes: Mapping[str, int | None] = field(default_factory=dict)

    @property
    def steady_markers(self) -> tuple[StepMarker, ...]:
        return tuple(m for m in self.markers if m.phase == "steady")

    @property
    def steady_step_durations_ns(self) -> tuple[int, ...]:
        return tuple(m.duration_ns for m in self.steady_markers)


@dataclass(slots=True)
class _Running:
    spec: TaskSpec
    process: subprocess.Popen[bytes]
    stdout: Any
    stderr: Any


class TrainingJob:
    """A distributed training job: one process (own process group) per task.

    Use as a context manager so every process is stopped however the block
    ends; entering does not start the job, ``start()`` does.  Not thread-safe:
    drive one job from one thread.
    """

    def __init__(
        self,
        config: TrainingConfig,
        tasks: Sequence[TaskSpec],
        workdir: str | os.PathLike[str],
        *,
        python: str = sys.executable,
        environment: Mapping[str, str] | None = None,
        poll_interval_s: float = 0.1,
        stop_grace_s: float = 5.0,
    ) -> None:
        _check_tasks(config, tasks)
        self.config = config
        self.plan = JobPlan(
            config=config, tasks=tuple(tasks), workdir=Path(workdir).resolve(strict=False)
        )
        self._python = python
        self._environment = dict(os.environ if environment is None else environment)
        self._poll_interval_s = poll_interval_s
        self._stop_grace_s = stop_grace_s
        self._running: dict[tuple[str, int], _Running] = {}
        self._started_ns = 0
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> TrainingJob:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Write the plan and start every task (servers first).  Returns at once.

        ServeError if a bind port is in use; CaptureError if a process cannot
        be started (then the ones already started are stopped).
        """
        if self._running or self._stopped:
            raise CaptureError("this training job was already started; make a new TrainingJob")
        workdir = self.plan.workdir
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CaptureError(f"work directory {workdir}: {error.strerror}") from None
        leftovers = [workdir / MARKERS_FILE, workdir / JOB_INFO_FILE]
        for key in self.config.driving_tasks:
            leftovers += [self.plan.finished_path(*key), self.plan.ready_path(*key)]
        for path in leftovers:
            path.unlink(missing_ok=True)
        check_ports_free({t.bind_port: t.name for t in self.plan.tasks})
        self.plan.write()
        environment = _task_environment(self._environment)
        self._started_ns = time.monotonic_ns()
        order = list(self.config.jobs)
        try:
            for spec in sorted(self.plan.tasks, key=lambda t: (order.index(t.job), t.index)):
                self._spawn(spec, environment)
        except OSError as error:
            self.stop()
            raise CaptureError(f"cannot start a training task: {error}") from None

    def _spawn(self, spec: TaskSpec, environment: dict[str, str]) -> None:
        stdout = open(self.plan.log_path(spec.job, spec.index, "stdout"), "wb")  # noqa: SIM115
        stderr = open(self.plan.log_path(spec.job, spec.index, "stderr"), "wb")  # noqa: SIM115
        command = [
            self._python,
            "-m",
            "tf_grpc_bench.profiler.task",
            "--plan",
            str(self.plan.workdir / PLAN_FILE),
            "--job",
            spec.job,
            "--index",
            str(spec.index),
        ]
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=environment,
                cwd=self.plan.workdir,
                start_new_session=True,  # own process group: stop() reaches its children
            )
        except OSError:
            stdout.close()
            stderr.close()
            raise
        self._running[spec.key] = _Running(spec=spec, process=process, stdout=stdout, stderr=stderr)

    @property
    def tasks(self) -> tuple[TaskSpec, ...]:
        return self.plan.tasks

    @property
    def workdir(self) -> Path:
        return self.plan.workdir

    def pids(self) -> dict[tuple[str, int], int]:
        """Process id (also its process group id) of every started task."""
        return {key: running.process.pid for key, running in self._running.items()}

    def stop(self) -> None:
        """Stop every task's process group: SIGTERM, then SIGKILL after a grace period.

        Blocks until every task process is reaped (at most about ``stop_grace_s``
        plus a second).  Idempotent; safe to call before ``start``.
        """
        self._stopped = True
        alive = [r for r in self._running.values() if r.process.poll() is None]
        for running in alive:
            _signal_group(running.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_grace_s
        for running in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        for running in self._running.values():
            # Also the groups whose leader is gone: a child may linger.
            _signal_group(running.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.process.wait(timeout=5)
            for stream in (running.stdout, running.stderr):
                if not stream.closed:
                    stream.close()

    # -- observation -------------------------------------------------------

    def step_markers(self) -> list[StepMarker]:
        """Every step marker written so far, in file order."""
        return read_step_markers(self.plan.markers_path)

    def job_info(self) -> dict[str, Any]:
        """job.json as written by the first driving task; CaptureError if not there yet."""
        path = self.plan.job_info_path
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise CaptureError(f"{path} not written yet: the job has not built its model") from None
        except ValueError as error:
            raise CaptureError(f"{path}: not valid JSON ({error})") from None

    def wait(self, timeout_s: float | None = None) -> JobOutcome:
        """Block until every driving task has finished its steps; return the outcome.

        Raises CaptureError, after stopping every task, if a task exits early
        (naming it, its exit status and its last stderr lines), if no step
        marker appears within ``config.startup_timeout_s`` of the start or
        ``config.step_timeout_s`` of the previous marker (a hang), or if
        ``timeout_s`` passes first.  ServeError if a task could not bind its
        port.  The other tasks keep running after a successful wait (the
        parameter servers never exit by themselves): call ``stop()``.
        """
        if not self._running:
            raise CaptureError("the training job was not started")
        expected = self.config.markers_per_driving_task
        driving = self.config.driving_tasks
        last_progress_ns = self._started_ns
        seen = 0
        seen_any = False
        while True:
            try:
                self._check_processes(driving)
            except CaptureError:
                self.stop()
                raise
            markers = self.step_markers()
            now = time.monotonic_ns()
            if len(markers) > seen:
                seen, seen_any, last_progress_ns = len(markers), True, now
            finished = all(self.plan.finished_path(*key).exists() for key in driving)
            if finished:
                counts = {f"{job}:{index}": 0 for job, index in driving}
                for marker in markers:
                    counts[marker.task] = counts.get(marker.task, 0) + 1
                short = {task: n for task, n in counts.items() if n < expected}
                if short:
                    self.stop()
                    raise CaptureError(
                        f"tasks finished with fewer step markers than the {expected} expected: "
                        f"{short}"
                    )
                return JobOutcome(
                    markers=tuple(markers),
                    job_info=self.job_info(),
                    started_ns=self._started_ns,
                    finished_ns=now,
                    exit_codes={r.spec.name: r.process.poll() for r in self._running.values()},
                )
            limit_s = self.config.step_timeout_s if seen_any else self.config.startup_timeout_s
            if now - last_progress_ns > limit_s * 1e9:
                self.stop()
                what = "the next step" if seen_any else "the first step"
                raise CaptureError(
                    f"training hangs: no step finished within {limit_s:g} s waiting for {what} "
                    f"({seen} step markers so far; logs in {self.plan.workdir})"
                )
            if timeout_s is not None and now - self._started_ns > timeout_s * 1e9:
                self.stop()
                raise CaptureError(
                    f"training did not finish within {timeout_s:g} s "
                    f"({seen} step markers so far; logs in {self.plan.workdir})"
                )
            time.sleep(self._poll_interval_s)

    def _check_processes(self, driving: tuple[tuple[str, int], ...]) -> None:
        for key, running in self._running.items():
            code = running.process.poll()
            if code is None:
                continue
            if key in driving and self.plan.finished_path(*key).exists():
                # Done with its steps: how its teardown went does not matter.
                continue
            detail = self._stderr_tail(running.spec)
            if "Could not start gRPC server" in detail or "Address already in use" in detail:
                raise ServeError(
                    f"task {running.spec.name} could not start its gRPC server on port "
                    f"{running.spec.bind_port}: port in use (taken after the launcher checked it?)"
                )
            status = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise CaptureError(
                f"task {running.spec.name} {status} before the job finished: {detail}"
            )

    def _stderr_tail(self, spec: TaskSpec, *, lines: int = 3) -> str:
        path = self.plan.log_path(spec.job, spec.index, "stderr")
        try:
            with open(path, "rb") as stream:
                stream.seek(0, os.SEEK_END)
                stream.seek(max(0, stream.tell() - 16384))
                text = stream.read().decode("utf-8", "replace")
        except OSError:
            return f"(no stderr at {path})"
        content = [line.strip() for line in text.splitlines() if line.strip()]
        failure = [line for line in content if line.startswith(FAILURE_PREFIX)]
        if failure:
            return failure[-1]
        if not content:
            return f"(stderr empty; see {path})"
        return " | ".join(content[-lines:]) + f" (see {path})"


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


#: Variables that would change what the tasks do or whom they dial.
_DROPPED_VARIABLES = (
    "TF_CONFIG",
    "http_proxy",
    "https_proxy",
    "grpc_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "GRPC_PROXY",
    "all_proxy",
    "ALL_PROXY",
)


def _task_environment(base: Mapping[str, str]) -> dict[str, str]:
    environment = {k: v for k, v in base.items() if k not in _DROPPED_VARIABLES}
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    environment["PYTHONUNBUFFERED"] = "1"
    return environment
