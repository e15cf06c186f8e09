"""Run a launched job: one OS process (its own process group) per task.

A driving task that has finished its steps idles until stopped: peers may
still need it (the tf1-ps chief worker runs the queue that applies synchronous
updates).  So after ``TrainingJob.wait`` every task is still running until
``stop()`` or the end of the ``with`` block.

This module imports no TensorFlow; the tasks (``tf_grpc_bench.profiler.task``)
do, in their own processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from absl import logging

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import CaptureError, ServeError
from tf_grpc_bench.files import loads_json
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.markers import MARKERS_FILE, StepMarker, read_step_markers
from tf_grpc_bench.profiler.launch.plan import (
    JOB_INFO_FILE,
    PLAN_FILE,
    JobPlan,
    TaskSpec,
    check_tasks,
)
from tf_grpc_bench.profiler.launch.ports import check_ports_free
from tf_grpc_bench.profiler.launch.processes import meaningful_line, stop_groups, tail_lines

#: First word of the line a task writes on stderr when it fails.
FAILURE_PREFIX = "TASK FAILED"


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
        prefixes: Mapping[tuple[str, int], Sequence[str]] | None = None,
    ) -> None:
        """``prefixes`` go before a task's command (``ip netns exec NS`` to run it
        inside an emulated host); none by default."""
        check_tasks(config, tasks)
        self.config = config
        self.plan = JobPlan(
            config=config, tasks=tuple(tasks), workdir=Path(workdir).resolve(strict=False)
        )
        self._python = python
        self._environment = dict(os.environ if environment is None else environment)
        self._poll_interval_s = poll_interval_s
        self._stop_grace_s = stop_grace_s
        self._prefixes = {key: tuple(prefix) for key, prefix in (prefixes or {}).items()}
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
            *self._prefixes.get(spec.key, ()),
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
                # Dies with this process, even one killed by SIGKILL.
                preexec_fn=lifetime.die_with_parent_preexec(),
            )
        except OSError:
            stdout.close()
            stderr.close()
            raise
        self._running[spec.key] = _Running(spec=spec, process=process, stdout=stdout, stderr=stderr)
        logging.info("started task %s (pid %d)", spec.name, process.pid)

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
        stop_groups(
            [r.process for r in self._running.values()],
            [s for r in self._running.values() for s in (r.stdout, r.stderr)],
            grace_s=self._stop_grace_s,
        )

    # -- observation -------------------------------------------------------

    def step_markers(self) -> list[StepMarker]:
        """Every step marker written so far, in file order."""
        return read_step_markers(self.plan.markers_path)

    def job_info(self) -> dict[str, Any]:
        """job.json as written by the first driving task; CaptureError if not there yet."""
        path = self.plan.job_info_path
        try:
            return dict(loads_json(path.read_text(encoding="utf-8")))
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
            path = self.plan.log_path(running.spec.job, running.spec.index, "stderr")
            tail = "\n".join(tail_lines(path, tail_bytes=16384) or [])
            if "Could not start gRPC server" in tail or "Address already in use" in tail:
                raise ServeError(
                    f"task {running.spec.name} could not start its gRPC server on port "
                    f"{running.spec.bind_port}: port in use (taken after the launcher checked it?)"
                )
            status = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise CaptureError(
                f"task {running.spec.name} {status} before the job finished: "
                f"{self._stderr_tail(running.spec)}"
            )

    def _stderr_tail(self, spec: TaskSpec) -> str:
        """One line of the task's stderr saying what went wrong (its own failure line, a
        traceback's last line, else the last line that is not start-up logging), and
        where the whole log is."""
        path = self.plan.log_path(spec.job, spec.index, "stderr")
        content = tail_lines(path, tail_bytes=16384)
        if content is None:
            return f"(no stderr at {path})"
        failure = [line for line in content if line.startswith(FAILURE_PREFIX)]
        if failure:
            return failure[-1]
        line = meaningful_line(content)
        return f"{line} (see {path})" if line else f"(nothing but start-up logs; see {path})"


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
