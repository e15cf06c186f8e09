"""``tf-grpc-bench assemble``: one trace from the records of every task, wherever they were made.

``record`` (``profiler.record``) leaves one folder per task, on whichever host
the task ran.  Copied together (or on a shared file system), ``assemble_records``
makes them one trace:

1. every task of the cluster must have exactly one folder, all of the same job
   (the same cluster); otherwise one ``CaptureError`` line names what is
   missing, duplicated or mixed;
2. each folder's record files are read; a connection's two sides are paired
   by their addresses as on one machine (``recorders.tapcalls.calls_of_files``),
   the caller being the task whose folder holds the client side and the callee
   the task whose folder holds the server side;
3. clocks: each task's times are its own host's; tasks whose manifests name
   the same kernel boot id read the same clock; the others are placed by
   what the wire says (``assembly.clocks``: a request is sent before its
   response), against a reference task (the first of the cluster, servers
   first), and the offsets with their bounds go into the trace's
   ``clock_alignment`` (format version 3).  ``clocks="wire"`` estimates every
   task from the wire, even those sharing a clock (to see how good the
   estimate is where the truth is known);
4. the calls, moved onto the reference clock, and the step markers the tasks
   wrote become the trace as ``capture-job`` makes it (steps found in the
   traffic unless markers say).
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from absl import logging

from tf_grpc_bench import __version__
from tf_grpc_bench.cluster import split_address
from tf_grpc_bench.errors import CaptureError, ConfigError
from tf_grpc_bench.profiler.assembly.clocks import (
    SHARED_CLOCK,
    ClockEstimate,
    Precedence,
    estimate_offsets,
)
from tf_grpc_bench.profiler.assembly.phases import assemble_trace, partial_reason
from tf_grpc_bench.profiler.launch.markers import StepMarker, read_step_markers
from tf_grpc_bench.profiler.launch.user_job import UserJob
from tf_grpc_bench.profiler.record import (
    MANIFEST_NAME,
    MARKERS_NAME,
    RECORDS_FOLDER,
    TaskRecord,
    read_task_record,
)
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.profiler.recorders.recorder import CAPTURE_METHODS
from tf_grpc_bench.profiler.recorders.wiretap import (
    ConnectionFrames,
    TapFile,
    calls_of_files,
    read_tap_file,
    shift_tap_file,
    with_sends_at_their_start,
)
from tf_grpc_bench.trace import ClockAlignment, ClockOffset, RunMetadata, Task, Trace

#: How the wire places a task's clock, in words (``ClockAlignment.method``).
WIRE_RULE = (
    "by the wire: a request is sent before its response, a SETTINGS or PING frame "
    "before its acknowledgement"
)
#: ``clocks`` choices: shared kernel clocks trusted (``auto``), or every task from the wire.
CLOCK_MODES = ("auto", "wire")


@dataclass(frozen=True, slots=True, kw_only=True)
class Labels:
    """What the trace says ran (``assemble``'s label flags; empty: from the records)."""

    model: str = ""
    strategy: str = ""
    batch_size: int = 0
    synchronous: bool = True
    command: tuple[str, ...] = ()


def task_folders(paths: Sequence[Path]) -> list[Path]:
    """Every task folder under ``paths``: a folder holding a manifest, the folders of a
    ``record --out`` directory, or of directories in it.  CaptureError naming a path
    that holds none."""
    folders: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise CaptureError(f"{path}: not a directory (expected a record --out directory)")
        if (path / MANIFEST_NAME).is_file():
            folders.append(path)
            continue
        # A record --out directory, or a folder holding several (copied from the hosts).
        found = sorted(
            p for p in (*path.glob("*"), *path.glob("*/*")) if (p / MANIFEST_NAME).is_file()
        )
        if not found:
            raise CaptureError(f"{path}: no task records in it (expected record --out folders)")
        folders.extend(found)
    return folders


def read_records(paths: Sequence[Path]) -> tuple[UserJob, list[TaskRecord]]:
    """The job and one record per task, in the job's task order (servers first).

    CaptureError (one line) when records of one task appear twice, when
    records of different jobs are mixed, or when a task of the cluster has
    no record.
    """
    records = [read_task_record(folder) for folder in task_folders(paths)]
    first = records[0]
    by_task: dict[tuple[str, int], TaskRecord] = {}
    for record in records:
        if dict(record.cluster) != dict(first.cluster):
            raise CaptureError(
                f"{record.folder} and {first.folder} are records of different jobs "
                "(their clusters differ)"
            )
        key = (record.job, record.index)
        if key in by_task:
            raise CaptureError(
                f"task {record.name} is recorded twice: {by_task[key].folder} and {record.folder}"
            )
        by_task[key] = record
    try:
        job = UserJob(cluster=first.cluster, command=first.command or ("?",))
    except ConfigError as error:
        raise CaptureError(f"{first.folder / MANIFEST_NAME}: {error}") from None
    missing = [f"{name}:{index}" for name, index, _ in job.tasks if (name, index) not in by_task]
    if missing:
        raise CaptureError(
            f"no record of task{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(the cluster has {len(job.tasks)} tasks; give every task's folder)"
        )
    return job, [by_task[(name, index)] for name, index, _ in job.tasks]


class _Files:
    """Every task's record files, with which task each belongs to."""

    def __init__(self, job: UserJob, records: Sequence[TaskRecord]) -> None:
        self.names = [record.name for record in records]
        self.errors: list[str] = []
        self.by_task: list[list[TapFile]] = []
        for record in records:
            files = []
            for path in sorted((record.folder / RECORDS_FOLDER).glob("tap-*.bin")):
                try:
                    files.append(read_tap_file(path))
                except CaptureError as error:
                    self.errors.append(str(error))
            if not files:
                self.errors.append(f"task {record.name} left no record file in {record.folder}")
            self.by_task.append(files)
        #: Record file -> the number of the task whose folder holds it.
        self.owner = {tap.path: n for n, files in enumerate(self.by_task) for tap in files}
        self.addresses = {
            split_address(address, where="cluster"): f"{name}:{index}"
            for name, index, address in job.tasks
        }

    def calls(
        self,
        offsets: Sequence[int],
        errors: list[str],
        *,
        send_starts: bool = False,
        frames: list[ConnectionFrames] | None = None,
    ) -> list[RecordedCall]:
        """Every call, each file's times moved by its task's offset.  Caller pids are
        task numbers + 1 (``caller_of_pid``).  ``send_starts``: every send timed when it
        began (``with_sends_at_their_start``).  ``frames`` gets the control frames."""
        owner = self.owner
        files = []
        for number, task_files in enumerate(self.by_task):
            for tap in task_files:
                if send_starts:
                    tap = with_sends_at_their_start(tap)
                files.append(shift_tap_file(tap, offsets[number]) if offsets[number] else tap)
        return calls_of_files(
            files,
            callee_of=lambda server, address: (
                self.names[owner[server.path]] if server else self._callee_by_address(address)
            ),
            caller_pid_of=lambda tap: owner[tap.path] + 1,
            errors=errors,
            frames=frames,
        )

    def precedences(self) -> list[Precedence]:
        """What the wire says about the clocks (see ``wire_precedences``)."""
        returned: list[ConnectionFrames] = []
        began: list[ConnectionFrames] = []
        ends = self.calls([0] * len(self.names), [], frames=returned)
        starts = self.calls([0] * len(self.names), [], send_starts=True, frames=began)
        return wire_precedences(starts, ends, self.names) + frame_precedences(
            began, returned, self.names, self.owner
        )

    def _callee_by_address(self, address: tuple[str, int]) -> str:
        """The task listening at ``address`` by the cluster (a server side not recorded)."""
        host, port = address
        for (cluster_host, cluster_port), name in self.addresses.items():
            if cluster_port == port and cluster_host == host:
                return name
        by_port = [name for (_, p), name in self.addresses.items() if p == port]
        return by_port[0] if len(by_port) == 1 else f"port {port}"


def wire_precedences(
    starts: Sequence[RecordedCall], ends: Sequence[RecordedCall], names: Sequence[str]
) -> list[Precedence]:
    """What calls say about the clocks: each answered call's request began to be sent
    (``start_ns`` in ``starts``, calls of files timed when sends began, on its caller's
    clock) before the send of its response's first bytes returned (``response_start_ns``
    in ``ends``, calls of the files as recorded, on its callee's)."""
    answered = {
        (call.callee, call.connection, call.stream_id): call.response_start_ns
        for call in ends
        if call.complete and call.status_code is not None
    }
    result = []
    for call in starts:
        response_ns = answered.get((call.callee, call.connection, call.stream_id))
        if call.caller_pid is None or response_ns is None or call.callee not in names:
            continue
        result.append(
            Precedence(
                before=names[call.caller_pid - 1],
                before_ns=call.start_ns,
                after=call.callee,
                after_ns=response_ns,
            )
        )
    return result


def frame_precedences(
    began: Sequence[ConnectionFrames],
    returned: Sequence[ConnectionFrames],
    names: Sequence[str],
    owner: Mapping[Path, int],
) -> list[Precedence]:
    """What control frames say about the clocks, both ways on every connection: a
    SETTINGS or PING frame began to be sent (``began``) before the peer's
    acknowledgement of it was sent (``returned``); acknowledgements come in order."""
    result: list[Precedence] = []
    for early, late in zip(began, returned, strict=True):
        if early.client_file is None or early.server_file is None:
            continue
        client, server = names[owner[early.client_file]], names[owner[early.server_file]]
        sides = (
            (client, early.client, server, late.server),
            (server, early.server, client, late.client),
        )
        for sender, sent, acker, acks in sides:
            for kind in ("SETTINGS", "PING"):
                asked = [f.time_ns for f in sent if f.kind == kind and not f.ack]
                answered = [f.time_ns for f in acks if f.kind == kind and f.ack]
                result.extend(
                    Precedence(before=sender, before_ns=a, after=acker, after_ns=b)
                    for a, b in zip(asked, answered, strict=False)
                )
    return result


def _markers(records: Sequence[TaskRecord], offsets: Sequence[int]) -> list[StepMarker]:
    markers = []
    for record, offset in zip(records, offsets, strict=True):
        for marker in read_step_markers(record.folder / MARKERS_NAME):
            if marker.phase == "steady":
                markers.append(
                    replace(
                        marker, start_ns=marker.start_ns + offset, end_ns=marker.end_ns + offset
                    )
                )
    return sorted(markers, key=lambda m: (m.start_ns, m.task))


def _alignment(
    records: Sequence[TaskRecord], estimates: dict[str, ClockEstimate], clocks: str
) -> ClockAlignment:
    shared = clocks == "auto"
    method = (
        f"tasks with the same kernel boot id share its clock; the others are placed {WIRE_RULE}"
        if shared
        else f"every task placed {WIRE_RULE}"
    )
    return ClockAlignment(
        reference=records[0].name,
        method=method,
        tasks=tuple(
            ClockOffset(
                task=record.name,
                host=record.host,
                offset_ns=estimates[record.name].offset_ns,
                lower_ns=estimates[record.name].lower_ns,
                upper_ns=estimates[record.name].upper_ns,
                source=estimates[record.name].source,
                constraints=estimates[record.name].constraints,
            )
            for record in records
        ),
    )


def _why_partial(job: UserJob, records: Sequence[TaskRecord]) -> str:
    for record in records:
        if record.exit_status is None:
            return f"the record of task {record.name} never finished (record itself was killed)"
        if not record.pid:
            return f"task {record.name} was stopped before its command started"
    for record in records:
        if record.job in job.driver_jobs and record.exit_status:
            return f"task {record.name} exited with status {record.exit_status}"
    return ""


def _metadata(records: Sequence[TaskRecord], labels: Labels) -> RunMetadata:
    command = records[0].command
    script = next((Path(a).stem for a in command if a.endswith(".py")), Path(command[0]).name)
    return RunMetadata(
        model=labels.model or script,
        strategy=labels.strategy or "user job",
        tensorflow_version=records[0].tensorflow_version,
        synchronous=labels.synchronous,
        batch_size=labels.batch_size,
        capture_method=CAPTURE_METHODS["preload"],
        host=records[0].host,
        command=labels.command,
        tool_version=__version__,
        created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        extra=(
            ("job_command", " ".join(command)),
            ("python_version", platform.python_version()),
            ("record_hosts", ", ".join(f"{r.name}={r.host}" for r in records)),
        ),
    )


def assemble_records(
    paths: Sequence[Path],
    *,
    warmup_steps: int = 1,
    clocks: str = "auto",
    labels: Labels | None = None,
) -> Trace:
    """One trace from the ``record`` folders under ``paths`` (see the module docstring).

    CaptureError (one line) if the records are not those of exactly one
    complete job, or if their clocks contradict each other.
    """
    if clocks not in CLOCK_MODES:
        raise ConfigError(f"--clocks: expected one of {', '.join(CLOCK_MODES)}, got {clocks!r}")
    job, records = read_records(paths)
    names = [record.name for record in records]
    files = _Files(job, records)
    shared: list[list[str]] = []
    if clocks == "auto":
        by_boot: dict[str, list[str]] = {}
        for record in records:
            if record.boot_id:
                by_boot.setdefault(record.boot_id, []).append(record.name)
        shared = [group for group in by_boot.values() if len(group) > 1]
    # One clock for all (one machine, or its namespaces): nothing to learn from the wire.
    one_clock = len(shared) == 1 and len(shared[0]) == len(names)
    estimates = estimate_offsets(
        names, [] if one_clock else files.precedences(), reference=names[0], shared_clocks=shared
    )
    offsets = [estimates[name].offset_ns for name in names]
    for name in names:
        estimate = estimates[name]
        if estimate.source != SHARED_CLOCK:
            logging.info(
                "clock of %s: %+d ns (bounds %s..%s, %d calls)",
                name,
                estimate.offset_ns,
                estimate.lower_ns,
                estimate.upper_ns,
                estimate.constraints,
            )
    errors = list(files.errors)
    calls = files.calls(offsets, errors)
    task_index = {name: number for number, name in enumerate(names)}
    trace = assemble_trace(
        calls,
        tasks=tuple(Task(job=name, index=index, address=a) for name, index, a in job.tasks),
        caller_of_pid={number + 1: number for number in task_index.values()},
        markers=tuple(_markers(records, offsets)),
        warmup_steps=warmup_steps,
        origin_ns=min(r.start.monotonic_ns + o for r, o in zip(records, offsets, strict=True)),
        metadata=_metadata(records, labels or Labels()),
        partial_reason=_why_partial(job, records) or partial_reason(None, errors),
    )
    return replace(trace, clock_alignment=_alignment(records, estimates, clocks))
