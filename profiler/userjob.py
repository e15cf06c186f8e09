"""Capture a training job this tool did not write: the user's own script.

The job (``launch.user_job.UserJob``: the cluster layout and the command every
task runs) runs under one of the two recorders of ``capture``:

* ``preload`` (default): the cluster is the user's, unchanged; every process
  gets the in-process recorder's library (``recorders.wiretap``), so every call
  between the tasks, including calls to the chief, is recorded where it is sent;
* ``proxy``: one ``RecordingProxy`` per task; in each task's ``TF_CONFIG`` its
  own entry is its real address (its gRPC server binds there) and every other
  task's entry is that task's proxy, so everything the task dials goes
  through a proxy.  TensorFlow's TF2 strategies push the coordinator's
  (chief's) cluster view to the other tasks; in that view the ps and worker
  tasks are proxy addresses, so their traffic is recorded, but calls *to* the
  chief (in a ``ParameterServerStrategy`` job there are none in steady
  state) go direct.

Steps.  If the script appends step markers to the file named by
``$TF_GRPC_BENCH_STEP_MARKERS`` (JSON: ``task``, ``step``, ``phase`` =
``warmup``/``steady``, ``start_ns``/``end_ns`` from ``time.monotonic_ns()``),
those delimit the steps as for ``capture``.  Otherwise steps are found in the
traffic (``assembly.steps.find_steps``): the calls sharing a TensorFlow step
id are one run, and a run that moves the model's variables (weights pulled,
gradients of the same shapes pushed back) is one *worker-step*; set-up runs,
readiness checks and the like are set aside however many there are, and the
first ``warmup_steps`` training runs go to start-up.  MultiWorkerMirrored's
RecvBuf calls all carry step id 0: there the steps are the periods of the
collectives' instance keys (``assembly.steps.collective_windows``).

A task that fails, a run past ``timeout_s``, or a job whose tasks exchange
nothing (and write no step marker) for ``step_timeout_s`` ends the run early:
every process is stopped and the trace captured so far is written, marked
partial.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from tf_grpc_bench import __version__
from tf_grpc_bench.calibration import Calibration, CalibrationWorkload
from tf_grpc_bench.cluster import split_address
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.host import capture_machine, tensorflow_version
from tf_grpc_bench.models.registry import available_models, model_spec
from tf_grpc_bench.profiler.capture import (
    CaptureResult,
    TraceLayout,
    capture_job,
    check_recorder,
    task_environment,
)
from tf_grpc_bench.profiler.launch.hosts import (
    NetworkRequest,
    TaskHosts,
    check_network_allowed,
    emulated_hosts,
)
from tf_grpc_bench.profiler.launch.markers import StepMarker, read_step_markers
from tf_grpc_bench.profiler.launch.user_job import (
    UserJob,
    UserTasks,
    check_local,
    rehost_cluster,
)
from tf_grpc_bench.profiler.metadata import KERNEL_EXTRA, utc_now
from tf_grpc_bench.profiler.progress import ProgressCallback
from tf_grpc_bench.profiler.recorders.recorder import CAPTURE_METHODS, DEFAULT_RECORDER, Recorder
from tf_grpc_bench.trace import RunMetadata, Task


def markers_as_windows(markers: Sequence[StepMarker]) -> list[StepMarker]:
    """The steady markers, or [] if the script wrote none."""
    return [m for m in markers if m.phase == "steady"]


def _script_name(command: Sequence[str]) -> str:
    """The user's script (first argument ending in .py), else the program, as a label."""
    for argument in command:
        if argument.endswith(".py"):
            return Path(argument).stem
    return Path(command[0]).name


#: The model a user job's calibration times when the job names none of ``models/``.
REFERENCE_MODEL = "resnet50"


def check_hosts_local(job: UserJob) -> None:
    """ConfigError unless every task's host is an address of this machine (without an
    emulated network, every task runs here)."""
    for name, index, address in job.tasks:
        host, _ = split_address(address, where=f"cluster job {name!r}")
        check_local(host, f"{name}:{index}")


class _UserRun:
    """A ``capture.CapturedJob`` for ``capture_user_job``."""

    def __init__(
        self,
        job: UserJob,
        *,
        recorder: str,
        command: Sequence[str],
        environment: Mapping[str, str] | None,
        progress: ProgressCallback | None,
        hosts: TaskHosts | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        """With ``hosts`` the job's cluster already lists the emulated hosts' addresses."""
        self.job = job
        self.hosts = hosts
        self.calibration = calibration
        self.recorder = recorder
        self.command = tuple(command)
        self.environment = dict(os.environ if environment is None else environment)
        self.progress = progress
        self.tasks: UserTasks | None = None
        if hosts is None:
            check_hosts_local(job)

    @property
    def servers(self) -> dict[str, tuple[str, int]]:
        servers = {}
        for name, index, address in self.job.tasks:
            host, port = split_address(address, where=f"cluster job {name!r}")
            servers[f"{name}:{index}"] = ("127.0.0.1" if host == "localhost" else host, port)
        return servers

    def pids(self) -> dict[tuple[str, int], int]:
        return self.tasks.pids() if self.tasks else {}

    def run(self, recorder: Recorder, work: Path) -> None:
        markers_path = work / "steps.jsonl"
        markers_path.unlink(missing_ok=True)
        prefixes = None
        if self.hosts is not None:
            prefixes = {(n, i): self.hosts.prefix((n, i)) for n, i, _ in self.job.tasks}
        self.tasks = UserTasks(self.job, work, markers_path, prefixes=prefixes)
        peers = {
            (name, index): recorder.peer_address(f"{name}:{index}", address)
            for name, index, address in self.job.tasks
        }
        self.tasks.start(
            task_environment(recorder.environment(self.environment), work),
            peers,
            started=recorder.expect_process,
        )
        self.tasks.wait(self.progress, recorder.activity)

    def stop(self) -> None:
        if self.tasks is not None:
            self.tasks.stop()

    def layout(self) -> TraceLayout:
        job, tasks = self.job, self.job.tasks
        markers: list[StepMarker] = []
        if self.tasks is not None:
            with contextlib.suppress(BenchError):
                markers = markers_as_windows(read_step_markers(self.tasks.markers_path))
        task_index = {(name, index): i for i, (name, index, _) in enumerate(tasks)}
        metadata = RunMetadata(
            model=job.model or _script_name(job.command),
            tensorflow_version=tensorflow_version(),
            strategy=job.strategy or "user job",
            synchronous=job.synchronous,
            batch_size=job.batch_size,
            input_shape=job.input_shape,
            capture_method=CAPTURE_METHODS[self.recorder],
            host=socket.gethostname(),
            command=self.command,
            tool_version=__version__,
            created_utc=utc_now(),
            extra=(
                ("job_command", " ".join(job.command)),
                ("python_version", platform.python_version()),
                *capture_machine(),
                (KERNEL_EXTRA, platform.release()),
                *(() if self.hosts is None else self.hosts.metadata()),
                *(() if self.calibration is None else self.calibration.extra()),
            ),
        )
        return TraceLayout(
            tasks=tuple(Task(job=name, index=index, address=a) for name, index, a in tasks),
            caller_of_pid={pid: task_index[key] for key, pid in self.pids().items()},
            markers=tuple(markers),
            metadata=metadata,
            job_info={},
            warmup_steps=job.warmup_steps,
        )


def calibration_workload(job: UserJob) -> CalibrationWorkload:
    """What a capture of the user's job times for its compute calibration: the job's model
    if it is one of ``models/`` (``--model``), at its smallest input and ``--batch-size``
    (4 if not given); any other job, the reference workload (ResNet-50, 32x32, batch 4).
    Only the ratio between two machines is used, so a job's own model need not be known."""
    model = job.model if job.model in available_models() else REFERENCE_MODEL
    return CalibrationWorkload(
        model=model,
        input_size=model_spec(model).minimum_input_size,
        batch_size=job.batch_size if model == job.model and job.batch_size > 0 else 4,
        keras="keras",
        # As many processes at once as the job has workers, sharing the cores as they do.
        processes=max(1, len(job.cluster.get("worker", ()))),
    )


def capture_user_job(
    job: UserJob,
    output: str | Path,
    *,
    command: Sequence[str] = (),
    workdir: str | Path | None = None,
    environment: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
    recorder: str = DEFAULT_RECORDER,
    network: NetworkRequest | None = None,
    calibration: Calibration | None = None,
) -> CaptureResult:
    """Run the user's job under ``recorder`` and write its trace to ``output``.

    With ``preload`` every task gets the cluster as given (plus its own task)
    and the in-process recorder's library; with ``proxy``, a ``TF_CONFIG`` whose
    peers are recording proxies (see ``launch.user_job.task_tf_config``).

    Blocks until the drivers finish.  The tasks' output goes to
    ``<workdir>/<job>-<index>.stdout|.stderr`` (a temporary directory, removed on
    success, if ``workdir`` is None).  On failure the partial trace is written
    and ``CaptureResult.error`` says why.  ``command`` is recorded as the
    trace's command line.

    ``network`` runs each task inside an emulated host (``launch.hosts``): the
    cluster's hosts become the emulated hosts' addresses (ports kept), and
    every task's command starts inside its host.  Needs root and ``preload``.

    ``calibration`` (``calibration_workload``) is recorded in the trace.
    """
    check_recorder(recorder)

    def run_on(hosts: TaskHosts | None, placed: UserJob) -> CaptureResult:
        run = _UserRun(
            placed,
            recorder=recorder,
            command=command,
            environment=environment,
            progress=progress,
            hosts=hosts,
            calibration=calibration,
        )
        return capture_job(
            run, output, recorder=recorder, workdir=workdir, work_prefix="tfgb-userjob-"
        )

    if network is None:
        return run_on(None, job)
    check_network_allowed(recorder)
    rehost_cluster(job.cluster, lambda key: "0.0.0.0")  # ports checked before the network exists
    keys = [(name, index) for name, index, _ in job.tasks]
    with emulated_hosts(network, keys) as hosts:
        return run_on(hosts, replace(job, cluster=rehost_cluster(job.cluster, hosts.address)))
