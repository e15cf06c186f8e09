"""The capture sequence: run a training job under a recorder, then write its trace.

One sequence for both commands: ``capture`` (a job of the launcher,
``capture_training`` here) and ``capture-job`` (the user's own script,
``userjob.capture_user_job``).  Each describes its job as a ``CapturedJob``;
``capture_job`` then

1. builds what the recorder needs before anything starts (the in-process
   recorder's library) and makes the work directory;
2. ``open_recorder(kind, ...)``: one of two recorders, which see the same bytes
   and parse them the same way (``recorders/``):

   * ``preload`` (the default): ``recorders.wiretap.TapRecorder`` loads a small
     library into every task process, which records what the process sends on
     its cluster connections; tasks talk to each other directly;
   * ``proxy``: a ``RecordingProxy`` in front of every task (``recorders.proxy.
     ProxySet``): each task binds its real port, while every task's cluster
     definition advertises the proxies' addresses, so every call between tasks
     crosses a proxy (a second TCP hop, which costs more step time;
     bench/README.md, "Capture overhead");

3. ``run_and_write``: starts the recorder, runs the job to its end, stops
   every process and the recorder, and writes the trace (``assembly/``) with
   the steps the job says where to find (``TraceLayout``).

Faults: whatever stops the job early (a task crashes or hangs, a port is
taken, the user interrupts: ``RunInterrupted``) stops every process the job
started and writes the trace captured so far, marked partial, before the error
goes on (in ``CaptureResult.error``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from absl import logging

from tf_grpc_bench import __version__, lifetime, trace_files
from tf_grpc_bench.calibration import Calibration, CalibrationWorkload
from tf_grpc_bench.errors import BenchError, CaptureError, ConfigError, RunInterrupted
from tf_grpc_bench.host import capture_machine
from tf_grpc_bench.profiler.assembly.phases import assemble_trace, partial_reason
from tf_grpc_bench.profiler.cpu_sampler import CpuSample, CpuSampler, summarize
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
from tf_grpc_bench.profiler.physics import VARIABLES_EXTRA, encode_variables
from tf_grpc_bench.profiler.progress import Progress, ProgressCallback
from tf_grpc_bench.profiler.recorders.proxy import ProxySet
from tf_grpc_bench.profiler.recorders.recorder import (
    CAPTURE_METHODS,
    DEFAULT_RECORDER,
    RECORDERS,
    Recorder,
)
from tf_grpc_bench.profiler.recorders.wiretap import TapRecorder, build_library
from tf_grpc_bench.trace import ROUND, WORKER_STEP, RunMetadata, Task, Trace

#: ``RunMetadata.extra`` key of the capture machine's kernel release.
KERNEL_EXTRA = "kernel"

#: Launcher setup -> the trace's strategy name (see protos/trace.proto).
STRATEGY_NAMES = {
    "tf2-ps": "tf2-parameter-server",
    "tf1-ps": "tf1-parameter-server",
    "mwms": "multi-worker-mirrored",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureResult:
    """A finished capture: the trace written to ``path`` and the job's facts.

    ``error`` is the failure that ended a partial capture (the trace was still
    written), None if the job completed.  ``recorded_bytes`` crossed the
    recorder (both directions); of those, ``uncopied_bytes`` never reached
    the recorder's memory (spliced by the proxy, or only counted by the
    in-process library).
    """

    trace: Trace
    path: Path
    job_info: Mapping[str, Any]
    recorder_errors: tuple[str, ...]
    recorded_bytes: int
    uncopied_bytes: int
    error: BenchError | None = None
    #: Where the tasks' logs are (the work directory), None if it was removed.
    logs: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceLayout:
    """How a finished job's calls become its trace (see ``assembly.phases.assemble_trace``
    and ``assembly.steps.find_steps``, which take ``markers``, ``warmup_steps``,
    ``per_run``, ``need_markers`` and ``unit``).  ``job_info`` goes to the result.
    """

    tasks: tuple[Task, ...]
    caller_of_pid: Mapping[int, int]
    markers: tuple[StepMarker, ...]
    metadata: RunMetadata
    job_info: Mapping[str, Any]
    #: Training steps found in the traffic to keep as start-up (jobs without markers).
    warmup_steps: int = 0
    #: A step is one training run (asynchronous steps overlap), not a marker's span.
    per_run: bool = False
    #: No steps without steady markers (the launcher's jobs always write them).
    need_markers: bool = False
    #: What one step is (``trace.ROUND``, ``WORKER_STEP``, ``MARKER``); "" for the default.
    unit: str = ""


class CapturedJob(Protocol):
    """A job that ``run_and_write`` runs under a recorder."""

    @property
    def servers(self) -> Mapping[str, tuple[str, int]]:
        """Task name (``job:index``) -> (host, port) its gRPC server listens on."""
        ...

    def pids(self) -> dict[tuple[str, int], int]:
        """Process id of every task started so far."""
        ...

    def run(self, recorder: Recorder, work: Path) -> None:
        """Start every task under ``recorder`` (logs in ``work``) and block until
        the job is done; BenchError if it failed."""
        ...

    def stop(self) -> None:
        """Stop every process the job started, however ``run`` ended; idempotent."""
        ...

    def layout(self) -> TraceLayout:
        """The trace's tasks, callers, steps and labels, once the job is stopped."""
        ...


def check_recorder(recorder: str) -> None:
    """ConfigError unless ``recorder`` is one of RECORDERS."""
    if recorder not in CAPTURE_METHODS:
        raise ConfigError(f"unknown recorder {recorder!r}; expected one of {', '.join(RECORDERS)}")


@contextlib.contextmanager
def open_recorder(
    kind: str,
    servers: Mapping[str, tuple[str, int]],
    *,
    work: Path,
    listen_host: str = "127.0.0.1",
    owner_pids: Callable[[], list[int]] | None = None,
    library: Path | None = None,
    proxy_options: Mapping[str, Any] | None = None,
) -> Iterator[Recorder]:
    """A recorder of ``kind`` (``preload``/``proxy``) for the tasks whose servers
    listen at ``servers``; stopped when the block ends.

    ``preload`` records into ``work/wiretap`` with ``library`` (default: built
    now); ``proxy`` listens on ``listen_host`` with one proxy per task, which
    ask ``owner_pids`` who dials them, with ``proxy_options`` (more
    ``RecordingProxy`` arguments).  Not started: ``run_and_write`` starts it.
    """
    check_recorder(kind)
    recorder: Recorder
    if kind == "preload":
        ports = {name: port for name, (_, port) in servers.items()}
        recorder = TapRecorder(ports, work / "wiretap", library=library)
    else:
        recorder = ProxySet(
            servers, listen_host=listen_host, owner_pids=owner_pids, options=proxy_options
        )
    try:
        yield recorder
    finally:
        recorder.stop()


#: The tasks' own temporary directory under the work directory (``TMPDIR``): what
#: TensorFlow leaves there (autograph's generated modules) goes with it after the job.
TASK_TMP = "tmp"


def task_environment(base: Mapping[str, str], work: Path) -> dict[str, str]:
    """``base`` with ``TMPDIR`` (and Python's ``TEMP``/``TMP``) set to the tasks' own
    directory under ``work``, made here and removed by ``run_and_write``."""
    private = work / TASK_TMP
    try:
        private.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CaptureError(f"{private}: cannot make the tasks' TMPDIR ({error.strerror})") from None
    return {**base, "TMPDIR": str(private), "TEMP": str(private), "TMP": str(private)}


def run_and_write(
    recorder: Recorder, job: CapturedJob, *, output: Path, work: Path, remove_work: bool
) -> CaptureResult:
    """Run ``job`` under ``recorder`` to its end, then write and return its trace.

    Blocks until the job is done.  The trace is written even when the job
    failed (then marked partial with the reason, which is also
    ``CaptureResult.error``); a job that ends without a training step
    recorded failed too.  With ``remove_work`` the work directory is removed,
    unless the capture failed and it holds logs to read.
    """
    error: BenchError | None = None
    sampler = CpuSampler(lambda: {f"{name}:{i}": pid for (name, i), pid in job.pids().items()})
    try:
        recorder.start()
        sampler.start()
        try:
            job.run(recorder, work)
        except BenchError as failure:
            error = failure
        except KeyboardInterrupt as interrupt:
            # Ctrl-C, SIGTERM or SIGHUP (lifetime): the trace so far is kept.
            signum = lifetime.signal_of(interrupt)
            error = RunInterrupted(f"interrupted ({lifetime.signal_name(signum)})", signum=signum)
        finally:
            sampler.stop()
            job.stop()
            shutil.rmtree(work / TASK_TMP, ignore_errors=True)  # kept logs or not
    finally:
        recorder.stop()
    calls = recorder.collect(final=True)
    layout = job.layout()
    recorder_errors = recorder.errors()
    logging.info(
        "job %s; %d calls recorded", "done" if error is None else f"failed: {error}", len(calls)
    )
    for line in recorder_errors:
        logging.info("recorder: %s", line)
    assemble = functools.partial(
        assemble_trace,
        calls,
        tasks=layout.tasks,
        caller_of_pid=layout.caller_of_pid,
        markers=layout.markers,
        warmup_steps=layout.warmup_steps,
        per_run=layout.per_run,
        need_markers=layout.need_markers,
        unit=layout.unit,
        origin_ns=recorder.started_ns,
        metadata=layout.metadata,
    )
    trace = with_capture_cpu(
        assemble(partial_reason=partial_reason(error, recorder_errors)),
        sampler.samples,
        origin_ns=recorder.started_ns,
    )
    if error is None and not trace.steps:
        # The job "succeeded" without training (a command that exits at once).
        error = CaptureError(
            f"the job ended without a training step recorded ({len(calls)} calls between "
            "its tasks): does its command train on this cluster?"
        )
        trace = assemble(partial_reason=partial_reason(error, recorder_errors))
    trace_files.write_trace(trace, output)
    logging.info("wrote %s", output)
    recorded, uncopied = recorder.forwarded_bytes()
    # A failure keeps the tasks' logs, unless there are none to read.
    keep_logs = error is not None and _holds_logs(work)
    if remove_work and not keep_logs:
        shutil.rmtree(work, ignore_errors=True)
    return CaptureResult(
        trace=trace,
        path=output,
        job_info=layout.job_info,
        recorder_errors=recorder_errors,
        recorded_bytes=recorded,
        uncopied_bytes=uncopied,
        error=error,
        logs=work if keep_logs or not remove_work else None,
    )


def with_capture_cpu(trace: Trace, samples: Sequence[CpuSample], *, origin_ns: int) -> Trace:
    """``trace`` with the capture machine's CPU over its steps in its metadata
    (``tf_grpc_bench.capture_cpu``); as it is when the samples do not cover its steps."""
    windows = [(step.start_ns + origin_ns, step.end_ns + origin_ns) for step in trace.steps]
    tasks = [f"{task.job}:{task.index}" for task in trace.tasks]
    cpu = summarize(samples, windows, tasks)
    if cpu is None:
        return trace
    extra = dict(trace.metadata.extra) | dict(cpu.extra())
    metadata = dataclasses.replace(trace.metadata, extra=tuple(sorted(extra.items())))
    return dataclasses.replace(trace, metadata=metadata)


def _holds_logs(work: Path) -> bool:
    """Whether the work directory holds anything to read (a non-empty file)."""
    with contextlib.suppress(OSError):
        return any(path.is_file() and path.stat().st_size > 0 for path in work.rglob("*"))
    return False


def capture_job(
    job: CapturedJob,
    output: str | Path,
    *,
    recorder: str = DEFAULT_RECORDER,
    workdir: str | Path | None = None,
    work_prefix: str = "tfgb-capture-",
    listen_host: str = "127.0.0.1",
    proxy_options: Mapping[str, Any] | None = None,
) -> CaptureResult:
    """The capture sequence: ``job`` under ``recorder``, its trace written to ``output``.

    Raises before anything starts or is written only when the recorder cannot
    be had (unknown kind, the in-process recorder's library cannot be built,
    a proxy cannot listen).  ``workdir`` keeps the tasks' logs (default: a
    temporary directory named ``work_prefix...``, removed on success).
    """
    check_recorder(recorder)
    # Built (or found in the cache) before anything is made or started.
    library = build_library() if recorder == "preload" else None
    output = Path(output)
    temporary = workdir is None
    work = Path(tempfile.mkdtemp(prefix=work_prefix)) if workdir is None else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    logging.info("capturing with the %s recorder; task logs in %s", recorder, work)
    with open_recorder(
        recorder,
        job.servers,
        work=work,
        listen_host=listen_host,
        owner_pids=lambda: list(job.pids().values()),
        library=library,
        proxy_options=proxy_options,
    ) as recording:
        return run_and_write(recording, job, output=output, work=work, remove_work=temporary)


# --------------------------------------------------------------------------
# A job of the launcher.


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


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_metadata(
    config: TrainingConfig,
    job_info: Mapping[str, Any],
    command: Sequence[str],
    *,
    recorder: str = DEFAULT_RECORDER,
    network: Sequence[tuple[str, str]] = (),
    calibration: Calibration | None = None,
) -> RunMetadata:
    """The trace's RunMetadata for a launcher job (job_info may be empty if it failed early);
    ``network`` are the emulated network's entries of ``extra`` (``TaskHosts.metadata``)."""
    import grpc

    extra = {
        "setup": config.setup,
        "ps": str(config.ps),
        "workers": str(config.workers),
        "warmup_steps": str(config.warmup_steps),
        "steps": str(config.steps),
        "keras": f"{job_info.get('keras_flavour', config.keras)} "
        f"{job_info.get('keras_version', '')}".strip(),
        "grpcio_version": grpc.__version__,
        "python_version": platform.python_version(),
        **dict(capture_machine()),
        # The instance's kernel build: machines of one CPU model differ by it (bench/README.md).
        KERNEL_EXTRA: platform.release(),
    }
    if "trainable_bytes" in job_info:
        extra["trainable_bytes"] = str(job_info["trainable_bytes"])
    if job_info.get("variables"):
        extra[VARIABLES_EXTRA] = encode_variables(job_info["variables"])
    extra.update(network)
    if calibration is not None:
        extra.update(calibration.extra())
    return RunMetadata(
        model=config.model,
        tensorflow_version=str(job_info.get("tensorflow_version", "")),
        strategy=STRATEGY_NAMES[config.setup],
        synchronous=config.synchronous,
        batch_size=config.batch_size,
        input_shape=tuple(config.input_shape),
        trainable_parameters=int(job_info.get("trainable_parameters", 0)),
        capture_method=CAPTURE_METHODS[recorder],
        host=socket.gethostname(),
        command=tuple(command),
        tool_version=__version__,
        created_utc=_utc_now(),
        extra=tuple(sorted(extra.items())),
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


def command_line() -> tuple[str, ...]:
    """The command line of this process, as a user would retype it."""
    if not sys.argv:
        return ("tf-grpc-bench",)
    program = Path(sys.argv[0]).name
    if program == "__main__.py":  # python -m tf_grpc_bench ...
        return ("python", "-m", "tf_grpc_bench", *sys.argv[1:])
    return (program, *sys.argv[1:])
