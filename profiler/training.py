"""Capture a job of the launcher (``capture``): a shipped model trained as a distributed job.

``capture_training`` plans the job's tasks (``launch.plan``), places them on
emulated hosts when asked (``launch.hosts``), and runs them as a
``launch.job.TrainingJob`` through the one capture sequence
(``capture.capture_job``).  The job's step markers delimit the steps: a round
for a synchronous setup, a worker-step (one training run) for an asynchronous
one; a progress callback hears of new markers as they are written (read four
times a second).  ``calibration_workload`` is what the capture times for its
compute calibration before the job starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import logging

from tf_grpc_bench.calibration import Calibration, CalibrationWorkload
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.profiler.capture import (
    CaptureResult,
    TraceLayout,
    capture_job,
    check_recorder,
    task_environment,
)
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.hosts import (
    NetworkRequest,
    TaskHosts,
    check_network_allowed,
    emulated_hosts,
)
from tf_grpc_bench.profiler.launch.job import TrainingJob
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.launch.plan import TaskSpec, check_tasks, plan_tasks
from tf_grpc_bench.profiler.metadata import run_metadata
from tf_grpc_bench.profiler.progress import Progress, ProgressCallback
from tf_grpc_bench.profiler.recorders.recorder import DEFAULT_RECORDER, Recorder
from tf_grpc_bench.trace import ROUND, WORKER_STEP, Task


class _TrainingRun:
    """A ``CapturedJob`` for ``capture_training``: a launcher job and its progress."""

    def __init__(
        self,
        config: TrainingConfig,
        tasks: Sequence[TaskSpec],
        *,
        host: str,
        recorder: str,
        command: Sequence[str],
        timeout_s: float | None,
        progress: ProgressCallback | None,
        hosts: TaskHosts | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        check_tasks(config, tasks)
        self.config = config
        self.tasks = list(tasks)
        self.host = host
        self.recorder = recorder
        self.command = tuple(command)
        self.timeout_s = timeout_s
        self.progress = progress
        #: The emulated hosts the tasks run on, None for all on ``host``.
        self.hosts = hosts
        #: This machine's compute calibration, recorded in the trace (None: not measured).
        self.calibration = calibration
        self.job: TrainingJob | None = None
        self.markers: list[StepMarker] = []
        self.job_info: dict[str, Any] = {}
        self._pids: dict[tuple[str, int], int] = {}
        self._stop_progress = threading.Event()
        self._watcher: threading.Thread | None = None

    def host_of(self, task: TaskSpec) -> str:
        """The address ``task`` listens on: its emulated host's, or ``host``."""
        return self.host if self.hosts is None else self.hosts.address(task.key)

    @property
    def servers(self) -> dict[str, tuple[str, int]]:
        return {t.name: (self.host_of(t), t.bind_port) for t in self.tasks}

    def pids(self) -> dict[tuple[str, int], int]:
        return self.job.pids() if self.job else {}

    def run(self, recorder: Recorder, work: Path) -> None:
        tasks = [
            dataclasses.replace(
                t, advertised_address=recorder.peer_address(t.name, t.advertised_address)
            )
            for t in self.tasks
        ]
        self.tasks = tasks
        prefixes = None if self.hosts is None else {t.key: self.hosts.prefix(t.key) for t in tasks}
        self.job = job = TrainingJob(
            self.config,
            tasks,
            work,
            environment=task_environment(recorder.environment(os.environ), work),
            prefixes=prefixes,
        )
        job.start()
        self._pids = job.pids()
        for (name, index), pid in self._pids.items():
            recorder.expect_process(pid, f"{name}:{index}")
        if self.progress is not None:
            expected = self.config.markers_per_driving_task * len(self.config.driving_tasks)
            self._watcher = threading.Thread(
                target=_watch_progress,
                args=(job, expected, self.progress, self._stop_progress),
                daemon=True,
            )
            self._watcher.start()
        job.wait(self.timeout_s)
        if self.progress is not None:
            self._stop_progress.set()
            markers = job.step_markers()
            self.progress(
                Progress(
                    steps_done=len(markers),
                    steps_expected=len(markers),
                    last_step_ns=markers[-1].duration_ns if markers else 0,
                )
            )

    def stop(self) -> None:
        self._stop_progress.set()
        job = self.job
        if job is not None:
            self._pids = self._pids or job.pids()
            job.stop()
            with contextlib.suppress(BenchError, OSError):
                self.markers = job.step_markers()
            with contextlib.suppress(BenchError, OSError):
                self.job_info = job.job_info()
        if self._watcher is not None:
            self._watcher.join(1)

    def layout(self) -> TraceLayout:
        markers = self.markers
        task_index = {t.key: i for i, t in enumerate(self.tasks)}
        metadata = run_metadata(
            self.config,
            self.job_info,
            self.command,
            recorder=self.recorder,
            network=() if self.hosts is None else self.hosts.metadata(),
            calibration=self.calibration,
        )
        # Asynchronous steps overlap in time: a step is one worker-step, one
        # training run, within the steady markers' span.  Synchronous steps are
        # rounds: the markers of one step number (tf2-ps: one per round).
        asynchronous = not self.config.synchronous
        return TraceLayout(
            tasks=tuple(
                Task(job=t.job, index=t.index, address=f"{self.host_of(t)}:{t.bind_port}")
                for t in self.tasks
            ),
            caller_of_pid={
                pid: task_index[key] for key, pid in self._pids.items() if key in task_index
            },
            markers=tuple(markers),
            metadata=metadata,
            job_info=self.job_info,
            per_run=asynchronous,
            need_markers=True,
            unit=WORKER_STEP if asynchronous else ROUND,
        )


def capture_training(
    config: TrainingConfig,
    output: str | Path,
    *,
    command: Sequence[str] = (),
    workdir: str | Path | None = None,
    host: str = "127.0.0.1",
    timeout_s: float | None = None,
    progress: ProgressCallback | None = None,
    tasks: Sequence[TaskSpec] | None = None,
    recorder: str = DEFAULT_RECORDER,
    proxy_options: Mapping[str, Any] | None = None,
    network: NetworkRequest | None = None,
    calibration: Calibration | None = None,
) -> CaptureResult:
    """Run ``config`` as a real distributed job under ``recorder``; write the trace.

    Blocks until the job is done.  ``workdir`` keeps the tasks' logs (a
    temporary directory, removed on success, if not given).  The trace is
    written to ``output`` in every case once the job has started; if the job
    failed, the returned ``CaptureResult.error`` says why and the trace is
    marked partial.  Raises before writing anything only when nothing could
    start (bad configuration, no free ports, the in-process recorder's library
    cannot be built).  ``tasks`` fixes the tasks' bind ports (default:
    ``plan_tasks`` picks free ones); with the proxy recorder their advertised
    addresses are replaced by the proxies'.  ``proxy_options`` go to every
    ``RecordingProxy`` (the overhead benchmark compares variants).

    ``network`` runs every task inside an emulated host (``launch.hosts``) on
    links of its profile, listening on its host's address; the network is
    removed when the capture ends, however it ends.  It needs root and the
    ``preload`` recorder (ConfigError before anything starts otherwise).

    ``calibration`` (``calibration_workload``, measured before the job by the
    caller) is recorded in the trace, so that a replay on another machine can
    scale its compute to that machine.
    """
    check_recorder(recorder)
    planned = list(tasks) if tasks is not None else plan_tasks(config, host=host)
    options: dict[str, Any] = {
        "command": command,
        "timeout_s": timeout_s,
        "progress": progress,
        "recorder": recorder,
        "calibration": calibration,
    }
    if network is None:
        run = _TrainingRun(config, planned, host=host, **options)
        return capture_job(
            run,
            output,
            recorder=recorder,
            workdir=workdir,
            listen_host=host,
            proxy_options=proxy_options,
        )
    check_network_allowed(recorder)
    with emulated_hosts(network, [t.key for t in planned]) as hosts:
        placed = [
            dataclasses.replace(t, advertised_address=f"{hosts.address(t.key)}:{t.bind_port}")
            for t in planned
        ]
        logging.info(
            "emulated network %s (%s): %s",
            network.profile.name,
            network.layout,
            ", ".join(f"{t.name} on {t.advertised_address}" for t in placed),
        )
        run = _TrainingRun(config, placed, host=host, hosts=hosts, **options)
        return capture_job(run, output, recorder=recorder, workdir=workdir)


def calibration_workload(config: TrainingConfig) -> CalibrationWorkload:
    """What a capture of ``config`` times for its compute calibration: a local training step
    of its model, image size, per-worker batch and Keras flavour, in as many processes at
    once as it has workers, sharing the cores as they do (``profiler.calibrate``)."""
    return CalibrationWorkload(
        model=config.model,
        input_size=config.image_size,
        batch_size=config.batch_size,
        keras=config.keras,
        processes=config.workers,
    )


def _watch_progress(
    job: TrainingJob, expected: int, callback: ProgressCallback, stop: threading.Event
) -> None:
    seen = -1
    while not stop.wait(0.25):
        with contextlib.suppress(BenchError, OSError):
            markers = job.step_markers()
            if len(markers) != seen:
                seen = len(markers)
                callback(
                    Progress(
                        steps_done=seen,
                        steps_expected=expected,
                        last_step_ns=markers[-1].duration_ns if markers else 0,
                    )
                )
