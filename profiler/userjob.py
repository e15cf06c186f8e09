"""Capture a training job this tool did not write: the user's own script.

The user gives the cluster layout (the addresses the tasks will listen on, as
in ``TF_CONFIG``) and the command that runs one task (the same command for
every task, as TensorFlow's multi-worker tutorials do).  This module starts one
process per task running the command, with a ``TF_CONFIG`` written for that
task, under one of the two recorders of ``capture``:

* ``preload`` (default): the cluster is the user's, unchanged; every process
  gets the in-process recorder's library (``wiretap``), so every call between
  the tasks, including calls to the chief, is recorded where it is sent;
* ``proxy``: one ``RecordingProxy`` per task; in each task's ``TF_CONFIG`` its
  own entry is its real address (its gRPC server binds there) and every other
  task's entry is that task's proxy, so everything the task dials goes
  through a proxy.  TensorFlow's TF2 strategies push the coordinator's
  (chief's) cluster view to the other tasks; in that view the ps and worker
  tasks are proxy addresses, so their traffic is recorded, but calls *to* the
  chief (in a ``ParameterServerStrategy`` job there are none in steady
  state) go direct.

Steps.  A user script writes no step markers unless it wants to: if it appends
lines to the file named by ``$TF_GRPC_BENCH_STEP_MARKERS`` (JSON: ``task``,
``step``, ``phase`` = ``warmup``/``steady``, ``start_ns``/``end_ns`` from
``time.monotonic_ns()``), those delimit the steps as for ``capture``.
Otherwise steps are found in the traffic: every RecvTensor (and RecvBuf)
request carries the ``step_id`` of the function or graph run that needs the
tensor, so the calls sharing a step id are one *worker-step*; its window runs
from its first call to its last, and the first ``warmup_steps`` of them go to
start-up.  MultiWorkerMirrored's RecvBuf calls all carry step id 0: there the
steps are the periods of the collectives' instance keys
(``capture.collective_windows``).

The run ends when every *driver* task (the chief if there is one, else every
worker) has exited with status 0; the other tasks (servers that never return)
are then stopped.  A task that fails, or a run past ``timeout_s``, ends the
run early: every process is stopped and the trace captured so far is written,
marked partial.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tf_grpc_bench import __version__
from tf_grpc_bench.errors import BenchError, CaptureError, ConfigError, ServeError
from tf_grpc_bench.profiler.capture import (
    CAPTURE_METHODS,
    DEFAULT_RECORDER,
    CaptureResult,
    Progress,
    ProgressCallback,
    ProxySet,
    Recorder,
    StepWindow,
    check_recorder,
    collective_windows,
    step_id_windows,
    write_captured_trace,
)
from tf_grpc_bench.profiler.launcher import StepMarker, read_step_markers
from tf_grpc_bench.profiler.wiretap import TapRecorder, build_library
from tf_grpc_bench.trace import RunMetadata, Task

#: Environment variable naming the step-marker file a user script may write.
MARKERS_VARIABLE = "TF_GRPC_BENCH_STEP_MARKERS"
#: How the trace's steps were found -> what one step is.
_STEP_UNITS = {
    "markers": "marker",
    "step-id": "worker-step",
    "collective-instance": "step",
}
#: Job names TensorFlow's cluster resolvers know.
KNOWN_JOBS = ("chief", "ps", "worker", "evaluator")
_MAX_TASKS = 32
_FAILURE_LINES = 3


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
    timeout_s: float | None = None
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
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(f"timeout must be > 0 s, got {self.timeout_s}")

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


def split_address(address: str, *, where: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` (``[v6]:port`` too); ConfigError naming ``where``."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}: {address!r} is not host:port")
    return host, int(port)


def parse_cluster(text: str) -> dict[str, tuple[str, ...]]:
    """A cluster from JSON (``{"ps": ["h:p", ...], ...}``), a TF_CONFIG document
    (its ``cluster`` is used) or ``@file`` holding either.  ConfigError if not."""
    source = "--cluster"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"{source}: cannot read the cluster ({error.strerror})") from None
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"{source}: not JSON ({error})") from None
    if isinstance(document, dict) and isinstance(document.get("cluster"), dict):
        document = document["cluster"]
    if not isinstance(document, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) for v in document.values()
    ):
        raise ConfigError(
            f'{source}: expected a cluster like {{"ps": ["localhost:2222"], '
            '"worker": ["localhost:2223"]}'
        )
    return {job: tuple(addresses) for job, addresses in document.items()}


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
# Steps from step ids (pure).


def markers_as_windows(markers: Sequence[StepMarker]) -> list[StepMarker]:
    """The steady markers, or [] if the script wrote none."""
    return [m for m in markers if m.phase == "steady"]


# --------------------------------------------------------------------------
# Processes.


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
    try:
        with path.open("rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - 8192))
            text = stream.read().decode("utf-8", "replace")
    except OSError:
        return "(no stderr)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-_FAILURE_LINES:]) if lines else "(stderr empty)"


def _stop_all(processes: Sequence[_TaskProcess], grace_s: float = 5.0) -> None:
    """SIGTERM every task's process group, SIGKILL after ``grace_s``, reap all."""
    for task in processes:
        if task.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(task.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for task in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            task.process.wait(max(0.0, deadline - time.monotonic()))
    for task in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(task.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            task.process.wait(5)
        for stream in (task.stdout, task.stderr):
            stream.close()


def _check_local(host: str, task: str) -> None:
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


def _wait(
    job: UserJob,
    processes: Sequence[_TaskProcess],
    markers_path: Path,
    progress: ProgressCallback | None,
) -> None:
    """Block until every driver exited 0; CaptureError on a failure or the timeout."""
    started = time.monotonic()
    drivers = [t for t in processes if t.job in job.driver_jobs]
    seen_markers = -1
    while True:
        for task in processes:
            code = task.process.poll()
            if code is not None and code != 0:
                status = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
                tail = _stderr_tail(task.log_prefix.with_suffix(".stderr"))
                raise CaptureError(f"task {task.name} {status}: {tail}")
        if all(t.process.poll() == 0 for t in drivers):
            return
        if job.timeout_s is not None and time.monotonic() - started > job.timeout_s:
            raise CaptureError(
                f"the job did not finish within {job.timeout_s:g} s "
                f"(drivers: {', '.join(t.name for t in drivers)})"
            )
        if progress is not None:
            with contextlib.suppress(BenchError, OSError):
                markers = read_step_markers(markers_path)
                if len(markers) != seen_markers:
                    seen_markers = len(markers)
                    progress(
                        Progress(
                            steps_done=seen_markers,
                            steps_expected=0,
                            last_step_ns=markers[-1].duration_ns if markers else 0,
                        )
                    )
        time.sleep(0.2)


def _script_name(command: Sequence[str]) -> str:
    """The user's script (first argument ending in .py), else the program, as a label."""
    for argument in command:
        if argument.endswith(".py"):
            return Path(argument).stem
    return Path(command[0]).name


def _tensorflow_version() -> str:
    for distribution in ("tensorflow", "tensorflow-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return ""


def capture_user_job(
    job: UserJob,
    output: str | Path,
    *,
    command: Sequence[str] = (),
    workdir: str | Path | None = None,
    environment: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
    recorder: str = DEFAULT_RECORDER,
) -> CaptureResult:
    """Run the user's job under ``recorder`` and write its trace to ``output``.

    With ``preload`` every task gets the cluster as given (plus its own task)
    and the in-process recorder's library; with ``proxy``, a ``TF_CONFIG`` whose
    peers are recording proxies (see ``task_tf_config``).

    Blocks until the drivers finish.  The tasks' output goes to
    ``<workdir>/<job>-<index>.stdout|.stderr`` (a temporary directory, removed on
    success, if ``workdir`` is None).  On failure the partial trace is written
    and ``CaptureResult.error`` says why.  ``command`` is recorded as the
    trace's command line.
    """
    check_recorder(recorder)
    library = build_library() if recorder == "preload" else None
    output = Path(output)
    temporary = workdir is None
    work = Path(tempfile.mkdtemp(prefix="tfgb-userjob-")) if workdir is None else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    markers_path = work / "steps.jsonl"
    markers_path.unlink(missing_ok=True)
    tasks = job.tasks
    for name, index, address in tasks:
        host, port = split_address(address, where=f"cluster job {name!r}")
        _check_local(host, f"{name}:{index}")
    processes: list[_TaskProcess] = []

    def task_pids() -> list[int]:
        return [t.process.pid for t in processes]

    base_environment = dict(os.environ if environment is None else environment)
    recording: Recorder
    tap: TapRecorder | None = None
    if recorder == "preload":
        ports = {
            f"{name}:{index}": split_address(address, where=f"cluster job {name!r}")[1]
            for name, index, address in tasks
        }
        tap = TapRecorder(ports, work / "wiretap", library=library)
        base_environment = tap.environment(base_environment)
        peer_addresses = {(name, index): address for name, index, address in tasks}
        recording = tap
    else:
        targets = {}
        for name, index, address in tasks:
            host, port = split_address(address, where=f"cluster job {name!r}")
            targets[f"{name}:{index}"] = ("127.0.0.1" if host == "localhost" else host, port)
        proxies = ProxySet(targets, listen_host="127.0.0.1", owner_pids=task_pids)
        peer_addresses = {
            (name, index): proxies.proxies[f"{name}:{index}"].address for name, index, _ in tasks
        }
        recording = proxies
    error: BenchError | None = None
    try:
        recording.start()
        try:
            for name, index, address in tasks:
                _check_port_free(*split_address(address, where="cluster"), f"{name}:{index}")
            for name, index, _ in tasks:
                variables = dict(base_environment)
                variables["TF_CONFIG"] = json.dumps(
                    task_tf_config(job.cluster, peer_addresses, name, index)
                )
                variables[MARKERS_VARIABLE] = str(markers_path)
                variables["PYTHONUNBUFFERED"] = "1"
                prefix = work / f"{name}-{index}"
                stdout = prefix.with_suffix(".stdout").open("wb")
                stderr = prefix.with_suffix(".stderr").open("wb")
                try:
                    process = subprocess.Popen(
                        list(job.command),
                        stdin=subprocess.DEVNULL,
                        stdout=stdout,
                        stderr=stderr,
                        env=variables,
                        start_new_session=True,
                    )
                except OSError as failure:
                    stdout.close()
                    stderr.close()
                    raise CaptureError(
                        f"cannot run {job.command[0]!r} for task {name}:{index}: {failure.strerror}"
                    ) from None
                processes.append(_TaskProcess(name, index, process, stdout, stderr, prefix))
                if tap is not None:
                    tap.expected_pids[process.pid] = f"{name}:{index}"
            _wait(job, processes, markers_path, progress)
        except BenchError as failure:
            error = failure
        except KeyboardInterrupt:
            error = CaptureError("interrupted by the user")
        finally:
            _stop_all(processes)
    finally:
        recording.stop()
    pids = {(t.job, t.index): t.process.pid for t in processes}
    calls = recording.collect(final=True)
    markers: list[StepMarker] = []
    with contextlib.suppress(BenchError):
        markers = markers_as_windows(read_step_markers(markers_path))
    windows: list[StepWindow] | None = None
    warmup_ids: frozenset[int] = frozenset()
    if markers:
        steps_from = "markers"
    else:
        windows, warmup_ids = step_id_windows(calls, warmup_steps=job.warmup_steps)
        steps_from = "step-id"
        if not windows:
            # Collectives carry step id 0: find the steps in their instance keys.
            found = collective_windows(calls, warmup_steps=job.warmup_steps)
            if found:
                windows, steps_from = found, "collective-instance"
    trace_tasks = [Task(job=name, index=index, address=address) for name, index, address in tasks]
    task_index = {(name, index): i for i, (name, index, _) in enumerate(tasks)}
    caller_of_pid = {pid: task_index[key] for key, pid in pids.items()}
    metadata = RunMetadata(
        model=job.model or _script_name(job.command),
        tensorflow_version=_tensorflow_version(),
        strategy=job.strategy or "user job",
        synchronous=job.synchronous,
        batch_size=job.batch_size,
        input_shape=job.input_shape,
        capture_method=CAPTURE_METHODS[recorder],
        host=socket.gethostname(),
        command=tuple(command),
        tool_version=__version__,
        created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        extra=(
            ("job_command", " ".join(job.command)),
            ("python_version", platform.python_version()),
            ("step_unit", _STEP_UNITS[steps_from]),
            ("steps_from", steps_from),
        ),
    )
    return write_captured_trace(
        calls,
        recorder=recording,
        tasks=trace_tasks,
        caller_of_pid=caller_of_pid,
        markers=markers,
        windows=windows,
        startup_step_ids=warmup_ids,
        metadata=metadata,
        error=error,
        output=output,
        work=work,
        remove_work=temporary,
        job_info={},
    )
