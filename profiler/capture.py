"""The capture sequence: run a training job under a recorder, then write its trace.

One sequence for both commands: ``capture`` (a job of the launcher,
``training.capture_training``) and ``capture-job`` (the user's own script,
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
import functools
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from absl import logging

from tf_grpc_bench import lifetime, trace_files
from tf_grpc_bench.errors import BenchError, CaptureError, ConfigError, RunInterrupted
from tf_grpc_bench.profiler.assembly.phases import assemble_trace, partial_reason
from tf_grpc_bench.profiler.cpu_sampler import CpuSample, CpuSampler, summarize
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.recorders.proxy import ProxySet
from tf_grpc_bench.profiler.recorders.recorder import (
    CAPTURE_METHODS,
    DEFAULT_RECORDER,
    RECORDERS,
    Recorder,
)
from tf_grpc_bench.profiler.recorders.wiretap import TapRecorder, build_library
from tf_grpc_bench.trace import RunMetadata, Task, Trace


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
