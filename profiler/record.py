"""``tf-grpc-bench record``: one task of a job launched elsewhere, recorded where it runs.

A launcher (a shell on each host, ``srun``, a Kubernetes pod) runs
``tf-grpc-bench record --out DIR -- COMMAND`` in place of the training command
on every host.  ``record_task`` finds which task this is
(``launch.identity.identify_task``: ``TF_CONFIG``, ``--job/--task/--cluster``, or
``srun``'s environment with ``--slurm-jobs``, which also gives the command its ``TF_CONFIG``),
runs the command with the in-process recorder preloaded (``recorders.wiretap``)
and writes into ``DIR/<job>-<index>/``:

* ``wiretap/tap-<pid>.bin``: the records of the task's process and its children,
  cut to the records they hold once the command has ended
  (``recorders.tapfile.trim_record_files``), so the folder copies as its records;
* ``steps.jsonl``: step markers, if the command writes any
  (``$TF_GRPC_BENCH_STEP_MARKERS``);
* ``manifest.json`` (``MANIFEST_FORMAT``, version ``MANIFEST_VERSION``): the task,
  the cluster, the host name and boot id, the pid, the command, its exit
  status, and the host's monotonic and wall clocks read together at the start
  and at the end.  Written before the command starts (``exit_status`` null) and
  again when it has ended.

``tf-grpc-bench assemble`` (``profiler.assemble``) makes one trace of the
folders of every task, wherever they were written.

The command's exit status is the record's (128 + N when signal N ended it).
SIGTERM, SIGINT and SIGHUP sent to ``record`` are passed on to the command's
process group (under ``srun``, where Slurm signals every process of the step,
SIGTERM and SIGINT are not: the command has them from Slurm); the records are
on disk whatever happens (the library writes them into a file mapped shared),
and the command dies with ``record`` even when that is killed with SIGKILL.
Under ``srun``, ``end_step`` has a command that ended by itself (a TF2 chief)
end the job step with SIGTERM (``end_slurm_step``), so that the servers'
records finish too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from absl import logging

from tf_grpc_bench import launchers, lifetime
from tf_grpc_bench.cluster import split_address
from tf_grpc_bench.errors import CaptureError, ConfigError, UsageError
from tf_grpc_bench.files import loads_json, write_atomically
from tf_grpc_bench.host import boot_id, tensorflow_version
from tf_grpc_bench.profiler.launch.identity import TaskIdentity, expand_placeholders
from tf_grpc_bench.profiler.launch.user_job import MARKERS_VARIABLE
from tf_grpc_bench.profiler.recorders.tapfile import trim_record_files
from tf_grpc_bench.profiler.recorders.wiretap import build_library, recorder_environment

#: ``manifest.json``'s ``format`` and version.  History: 1 (2026-12) first version.
MANIFEST_FORMAT = "tf-grpc-bench-task-record"
MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"
RECORDS_FOLDER = "wiretap"
MARKERS_NAME = "steps.jsonl"
#: How long the command has, after a forwarded stop signal, before SIGKILL.
STOP_GRACE_S = 10.0
#: How often the wait for the command looks at the grace's end (s).
WAIT_POLL_S = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockReading:
    """The host's monotonic and wall clocks, read one right after the other (ns)."""

    monotonic_ns: int
    wall_ns: int

    @classmethod
    def now(cls) -> ClockReading:
        return cls(monotonic_ns=time.monotonic_ns(), wall_ns=time.time_ns())


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRecord:
    """What ``manifest.json`` says about one recorded task."""

    folder: Path
    job: str
    index: int
    cluster: Mapping[str, tuple[str, ...]]
    host: str
    boot_id: str
    tensorflow_version: str
    pid: int
    command: tuple[str, ...]
    start: ClockReading
    end: ClockReading | None
    #: None while the command runs (or if ``record`` was killed first).
    exit_status: int | None

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"


def task_folder(out: Path, task: TaskIdentity) -> Path:
    return out / f"{task.job}-{task.index}"


def _manifest(
    task: TaskIdentity,
    command: Sequence[str],
    pid: int,
    start: ClockReading,
    end: ClockReading | None,
    exit_status: int | None,
) -> dict[str, Any]:
    def reading(value: ClockReading | None) -> dict[str, int] | None:
        if value is None:
            return None
        return {"monotonic_ns": value.monotonic_ns, "wall_ns": value.wall_ns}

    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "task": {"job": task.job, "index": task.index},
        "cluster": {job: list(addresses) for job, addresses in task.cluster.items()},
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "tensorflow_version": tensorflow_version(),
        "pid": pid,
        "command": list(command),
        "clock": {"start": reading(start), "end": reading(end)},
        "exit_status": exit_status,
    }


def _write_manifest(folder: Path, document: Mapping[str, Any]) -> None:
    text = json.dumps(document, indent=1) + "\n"
    write_atomically(
        folder / MANIFEST_NAME,
        lambda stream: stream.write(text.encode("utf-8")),
        error=CaptureError,
        what="task manifest",
    )


def prepare_folder(out: Path, task: TaskIdentity) -> Path:
    """``out/<job>-<index>/``, made now; CaptureError if it already holds a record
    (two tasks claiming the same identity, or a rerun into the same place)."""
    folder = task_folder(out, task)
    if (folder / MANIFEST_NAME).exists():
        raise CaptureError(
            f"--out {out}: {folder.name}/ already holds the record of task {task.name} "
            "(a second task with this identity, or an earlier run: use another --out)"
        )
    try:
        (folder / RECORDS_FOLDER).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CaptureError(f"--out {out}: cannot make {folder} ({error.strerror})") from None
    return folder


def record_task(
    out: Path,
    command: Sequence[str],
    task: TaskIdentity,
    *,
    environment: Mapping[str, str] | None = None,
    library: Path | None = None,
    end_step: bool = False,
) -> int:
    """Run ``command`` (placeholders expanded) as ``task`` with the recorder preloaded;
    write its records and manifest under ``out``; return its exit status.

    Blocks until the command ends.  A stop signal (SIGTERM, SIGINT, SIGHUP)
    is passed on to the command's process group, which gets ``STOP_GRACE_S``
    before SIGKILL.  With ``end_step`` (under ``srun``), a command that ended
    by itself (no stop signal came) then ends the job step: ``end_slurm_step``.
    CaptureError before anything starts if the library cannot be built, the
    folder cannot be made, or the command cannot be run.
    """
    variables_in = dict(os.environ if environment is None else environment)
    if end_step and not launchers.in_slurm_step(variables_in):
        raise UsageError("--end-step ends an srun job step: run record under srun")
    if not command:
        raise ConfigError("no command to run: put it after '--', e.g. -- python train.py")
    library = library or build_library()
    folder = prepare_folder(out, task)
    expanded = expand_placeholders(command, task)
    ports = [
        split_address(address, where=f"cluster job {job!r}")[1]
        for job, addresses in task.cluster.items()
        for address in addresses
    ]
    variables = recorder_environment(
        dict(variables_in),
        library=library,
        directory=(folder / RECORDS_FOLDER).resolve(),
        ports=ports,
    )
    variables.setdefault(MARKERS_VARIABLE, str((folder / MARKERS_NAME).resolve()))
    with _Forwarding() as forwarding:
        # Under srun, Slurm's own stop signals reach the command already (most trackers
        # signal every process of the step): passed on as well, a SIGTERM would come twice.
        if launchers.in_slurm_step(variables_in) and slurm_signals_whole_step(variables_in):
            forwarding.not_passed_on = SLURM_STEP_SIGNALS
        start = ClockReading.now()
        _write_manifest(folder, _manifest(task, expanded, 0, start, None, None))
        if forwarding.signum is not None:
            # Stopped before the command started: it is not started at all.
            status = lifetime.exit_status(forwarding.signum)
            _write_manifest(folder, _manifest(task, expanded, 0, start, ClockReading.now(), status))
            return status
        try:
            process = subprocess.Popen(
                list(expanded),
                env=variables,
                start_new_session=True,
                preexec_fn=lifetime.die_with_parent_preexec(),
            )
        except OSError as failure:
            raise CaptureError(f"cannot run {expanded[0]!r}: {failure.strerror}") from None
        forwarding.started(process)
        _write_manifest(folder, _manifest(task, expanded, process.pid, start, None, None))
        status = _wait(process, forwarding)
        end = ClockReading.now()
        trim_record_files(folder / RECORDS_FOLDER)
        _write_manifest(folder, _manifest(task, expanded, process.pid, start, end, status))
    if end_step and forwarding.signum is None:
        problem = end_slurm_step(variables_in)
        if problem:
            logging.warning("record: %s", problem)
    return status


def end_slurm_step(environment: Mapping[str, str]) -> str:
    """SIGTERM to every task of this ``srun`` job step (``scancel --signal=TERM JOB.STEP``),
    which this process, whose command has ended, then ignores; "" when sent, else why not.

    For a job whose servers never end by themselves (TF2 parameter-server
    training's ps and workers): the chief's end ends the step; Slurm signals
    every other task's command (else its ``record`` passes the signal on), and
    each ``record`` writes its manifest.
    Slurm's own ways of ending what is left of a step after a task succeeded
    (``srun --wait``, a SIGTERM to ``srun``) send SIGKILL, which leaves
    manifests unfinished; ``--kill-on-bad-exit`` acts only on a failure.
    """
    job = environment.get("SLURM_JOB_ID", environment.get("SLURM_JOBID", "")).strip()
    step = environment.get("SLURM_STEP_ID", environment.get("SLURM_STEPID", "")).strip()
    if not job or not step:
        return "cannot end the step: SLURM_JOB_ID or SLURM_STEP_ID is not set"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        result = subprocess.run(
            ["scancel", "--signal=TERM", f"{job}.{step}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot end step {job}.{step} with scancel: {error}"
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        return f"scancel --signal=TERM {job}.{step} failed: {last}"
    return ""


#: The stop signals Slurm sends a job step (scancel, its time limit, a preemption,
#: srun's forwarded Ctrl-C).
SLURM_STEP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
#: How long ``record`` waits for ``scontrol show config`` before it starts the command.
SCONTROL_TIMEOUT_S = 5.0


def slurm_signals_whole_step(environment: Mapping[str, str]) -> bool:
    """Whether Slurm signals every process of a job step, the command ``record`` starts
    in a session of its own too: its ``ProctrackType`` (``scontrol show config``) is
    one that tracks processes by cgroup or by parentage, not ``proctrack/pgid`` (the
    task's process group only).  False when that cannot be told."""
    try:
        result = subprocess.run(
            ["scontrol", "show", "config"],
            env=dict(environment),
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    for line in result.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "ProctrackType":
            tracker = value.strip()
            return tracker.startswith("proctrack/") and tracker != "proctrack/pgid"
    return False


class _Forwarding:
    """While entered, stop signals (SIGTERM, SIGINT, SIGHUP) are passed on to the
    command's process group, and the first one starts its grace (``STOP_GRACE_S``).
    Those in ``not_passed_on`` (set once entered) only start the grace: under ``srun``, where Slurm
    signals every process of the step, the command has them already, and a second
    SIGTERM at the same moment breaks a handler that is not reentrant (one that
    saves a checkpoint, or coverage's).  One that came before the command started is
    passed on all the same (Slurm's went to no command).

    Entered before the first manifest is written and left after the last, so that
    a signal at any moment between (before the command started, as it starts, as
    its status is being written) neither ends ``record`` with the manifest
    unfinished nor goes missing: one that came before the command started is
    passed on as soon as it has (``started``).  The handler only passes the
    signal on; ``_wait`` polls, so that the grace is kept: a blocking ``wait``
    is resumed after a handler returns (PEP 475), so a command that ignores the
    signal (TensorFlow's servers catch SIGTERM) would be waited for forever; and
    a handler that raised to end it could interrupt ``Popen.wait`` between
    ``waitpid`` reaping the command and its status being kept, the status then
    lost (read as 0).  That happens when the command gets the signal at the same
    moment, as every process of a Slurm step does from ``scancel``.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.not_passed_on: frozenset[int] = frozenset()
        self.deadline = 0.0
        self._process: subprocess.Popen[bytes] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Forwarding:
        self._previous = {n: signal.signal(n, self._handle) for n in lifetime.STOP_SIGNALS}
        return self

    def __exit__(self, *_exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            self.deadline = time.monotonic() + STOP_GRACE_S
        if signum in self.not_passed_on:
            return
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signum)

    def started(self, process: subprocess.Popen[bytes]) -> None:
        """The command runs: later signals go to its group, and one that came before too."""
        self._process = process
        if self.signum is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, self.signum)


def _wait(process: subprocess.Popen[bytes], forwarding: _Forwarding) -> int:
    """Wait for ``process`` (SIGKILL to its group once a forwarded signal's grace is
    over); its exit status, 128 + N if signal N ended it."""
    while True:
        try:
            code = process.wait(timeout=WAIT_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if forwarding.signum is not None and time.monotonic() >= forwarding.deadline:
                # The command ignored the forwarded signal for STOP_GRACE_S.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
    # Whatever the command left in its group goes with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    return lifetime.exit_status(-code) if code < 0 else code


# --------------------------------------------------------------------------
# Reading manifests (the one place they are parsed).


def read_task_record(folder: Path) -> TaskRecord:
    """The manifest of the task recorded in ``folder``; CaptureError naming the file
    and the field when it is not one this tool wrote."""
    path = folder / MANIFEST_NAME
    try:
        document = loads_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CaptureError(
            f"{folder}: no {MANIFEST_NAME} (not a folder written by record)"
        ) from None
    except OSError as error:
        raise CaptureError(f"{path}: {error.strerror}") from None
    except ValueError as error:
        raise CaptureError(f"{path}: not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        raise CaptureError(f"{path}: 'format' must be {MANIFEST_FORMAT!r}")
    if document.get("version") != MANIFEST_VERSION:
        raise CaptureError(
            f"{path}: manifest version {document.get('version')!r}; this tool reads "
            f"{MANIFEST_VERSION}"
        )
    try:
        task = document["task"]
        clock = document["clock"]
        end = clock.get("end")
        status = document.get("exit_status")
        return TaskRecord(
            folder=folder,
            job=str(task["job"]),
            index=int(task["index"]),
            cluster={str(j): tuple(str(a) for a in v) for j, v in document["cluster"].items()},
            host=str(document.get("host", "")),
            boot_id=str(document.get("boot_id", "")),
            tensorflow_version=str(document.get("tensorflow_version", "")),
            pid=int(document.get("pid", 0)),
            command=tuple(str(a) for a in document.get("command", ())),
            start=ClockReading(**{k: int(v) for k, v in clock["start"].items()}),
            end=None if end is None else ClockReading(**{k: int(v) for k, v in end.items()}),
            exit_status=None if status is None else int(status),
        )
    except KeyError as error:
        raise CaptureError(f"{path}: missing field {error}") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise CaptureError(f"{path}: invalid manifest ({error})") from None
