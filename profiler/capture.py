"""Capture the tensor traffic of a real distributed training job as a trace.

``capture_training`` runs one job of the launcher (``launcher.TrainingJob``)
under one of two recorders, which see the same bytes and parse them the same
way (``http2.Http2Follower`` and ``calls.CallTable``):

* ``preload`` (the default): ``wiretap.TapRecorder`` loads a small library into
  every task process, which records what the process sends on its cluster
  connections; tasks talk to each other directly;
* ``proxy``: a ``RecordingProxy`` in front of every task: each task binds its
  real port, while every task's cluster definition advertises the proxies'
  addresses, so every call between tasks crosses a proxy (a second TCP hop,
  which costs more step time; bench/README.md, "Capture overhead").

When the job is done (or fails) the records become a ``Trace``:

* steady-state steps come from the launcher's step markers (phase
  ``steady``); markers with the same step number (one per driving task) make
  one window from the earliest start to the latest end.  Asynchronous
  training's steps overlap in time, so there a step is one worker-step: the
  calls sharing a TensorFlow step id (see ``step_id_windows``), between the
  first steady marker's start and the last one's end;
* an RPC belongs to the step whose window contains its start (the latest such
  window when asynchronous windows overlap; an RPC between two windows belongs
  to the next one); RPCs before the first steady window are start-up (graph
  registration, variable initialisation, warm-up steps), after the last one
  teardown;
* times are ns from the start of the capture (the recorder's start).

Faults: whatever stops the job early (a task crashes or hangs, a port is
taken, the user interrupts) stops every process this module started and
writes the trace captured so far, marked partial, before the error goes on.

``assemble_trace`` and the helpers around it are pure (records in, trace out)
so they are tested without TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tf_grpc_bench import __version__, trace_files
from tf_grpc_bench import trace as trace_model
from tf_grpc_bench.errors import BenchError, CaptureError, ConfigError
from tf_grpc_bench.profiler.calls import RecordedCall
from tf_grpc_bench.profiler.launcher import (
    StepMarker,
    TaskSpec,
    TrainingConfig,
    TrainingJob,
    plan_tasks,
)
from tf_grpc_bench.profiler.physics import VARIABLES_EXTRA, encode_variables
from tf_grpc_bench.profiler.proxy import RecordingProxy
from tf_grpc_bench.profiler.tf_messages import (
    MessageDecodeError,
    decode_recv_buf_request,
    decode_recv_buf_response,
    decode_recv_tensor_request,
    decode_recv_tensor_response,
    parse_rendezvous_key,
    task_of_device,
)
from tf_grpc_bench.profiler.wiretap import TapRecorder, build_library
from tf_grpc_bench.trace import (
    RECV_BUF,
    RECV_TENSOR,
    Phase,
    Rpc,
    RunMetadata,
    Step,
    Task,
    TensorInfo,
    Trace,
)

#: How the traffic is recorded (``--recorder``) -> the trace's capture_method.
CAPTURE_METHODS = {"preload": "in-process-recorder", "proxy": "recording-proxy"}
RECORDERS = tuple(CAPTURE_METHODS)
DEFAULT_RECORDER = "preload"

#: Launcher setup -> the trace's strategy name (see protos/trace.proto).
STRATEGY_NAMES = {
    "tf2-ps": "tf2-parameter-server",
    "tf1-ps": "tf1-parameter-server",
    "mwms": "multi-worker-mirrored",
}

#: gRPC status recorded for a call that ended without a grpc-status trailer.
STATUS_CANCELLED = 1  # the stream was reset
STATUS_UNKNOWN = 2  # the capture ended while the call was open


# --------------------------------------------------------------------------
# Records -> RPCs (pure).


@dataclass(frozen=True, slots=True, kw_only=True)
class AssemblyNotes:
    """What assembling a trace had to leave out or guess; goes into metadata.extra."""

    unattributed_calls: int = 0
    attributed_by_rendezvous_key: int = 0
    undecodable_messages: int = 0
    incomplete_calls: int = 0

    def as_extra(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}


def tensor_info(call: RecordedCall) -> TensorInfo | None:
    """Tensor identity of a RecvTensor or RecvBuf call from its message heads.

    MessageDecodeError if a head is not the message it should be.
    """
    if call.method == RECV_TENSOR:
        request = decode_recv_tensor_request(call.request_head)
        response = decode_recv_tensor_response(call.response_head)
        header = response.tensor
        return TensorInfo(
            rendezvous_key=request.rendezvous_key,
            dtype=header.dtype if header else "",
            shape=(header.shape or ()) if header else (),
            content_bytes=header.content_bytes if header else 0,
        )
    if call.method == RECV_BUF:
        buf_request = decode_recv_buf_request(call.request_head)
        buf_response = decode_recv_buf_response(call.response_head)
        # The request states the buffer's size; the response carries the data
        # in chunks (4 KB each here) past the head the proxy keeps.
        return TensorInfo(
            rendezvous_key=buf_request.buf_rendezvous_key,
            content_bytes=buf_request.num_bytes
            or buf_response.num_bytes
            or buf_response.transport_bytes,
        )
    return None


def _destination_task(call: RecordedCall) -> tuple[str, int] | None:
    """The task a RecvTensor/RecvBuf request names as the tensor's destination."""
    try:
        if call.method == RECV_TENSOR:
            key = parse_rendezvous_key(decode_recv_tensor_request(call.request_head).rendezvous_key)
            return task_of_device(key.dst_device) if key else None
        if call.method == RECV_BUF:
            return task_of_device(decode_recv_buf_request(call.request_head).dst_device)
    except MessageDecodeError:
        return None
    return None


def step_id_of(call: RecordedCall) -> int:
    """The TensorFlow step id a RecvTensor/RecvBuf request names (0: none or unknown)."""
    try:
        if call.method == RECV_TENSOR:
            return decode_recv_tensor_request(call.request_head).step_id
        if call.method == RECV_BUF:
            return decode_recv_buf_request(call.request_head).step_id
    except MessageDecodeError:
        return 0
    return 0


def calls_to_rpcs(
    calls: Sequence[RecordedCall],
    *,
    tasks: Sequence[Task],
    caller_of_pid: Mapping[int, int],
    origin_ns: int,
) -> tuple[list[Rpc], list[RecordedCall], AssemblyNotes]:
    """Turn proxy records into trace RPCs (times relative to ``origin_ns``).

    The callee is the task named by the record's ``callee`` (``job:index``).
    The caller is the task of the connection's process (``caller_of_pid``);
    failing that, the destination device that the connection's RecvTensor or
    RecvBuf requests name (every call of a connection comes from one process).
    Calls with no known caller are left out and counted.  Returns the RPCs,
    the records they came from (parallel) and notes.
    """
    index_of = {f"{t.job}:{t.index}": i for i, t in enumerate(tasks)}
    by_task = {(t.job, t.index): i for i, t in enumerate(tasks)}
    # Connection -> callers named by rendezvous keys, for the fallback.
    named: dict[tuple[str, int], Counter[int]] = {}
    for call in calls:
        destination = _destination_task(call)
        if destination is not None and destination in by_task:
            named.setdefault((call.callee, call.connection), Counter())[by_task[destination]] += 1
    rpcs = []
    kept = []
    unattributed = by_key = undecodable = incomplete = 0
    for call in calls:
        callee = index_of.get(call.callee)
        caller: int | None = None
        if call.caller_pid is not None:
            caller = caller_of_pid.get(call.caller_pid)
        if caller is None:
            votes = named.get((call.callee, call.connection))
            if votes:
                caller = votes.most_common(1)[0][0]
                by_key += 1
        if callee is None or caller is None:
            unattributed += 1
            continue
        try:
            tensor = tensor_info(call)
        except MessageDecodeError:
            tensor = None
            undecodable += 1
        if not call.complete:
            incomplete += 1
        status = call.status_code
        if status is None:
            status = STATUS_CANCELLED if call.reset else STATUS_UNKNOWN
        start = max(0, call.start_ns - origin_ns)
        rpcs.append(
            Rpc(
                method=call.method,
                caller_task=caller,
                callee_task=callee,
                request_bytes=call.request_bytes,
                response_bytes=call.response_bytes,
                start_ns=start,
                response_start_ns=max(start, call.response_start_ns - origin_ns),
                end_ns=max(start, call.end_ns - origin_ns),
                tensor=tensor,
                status_code=status,
            )
        )
        kept.append(call)
    notes = AssemblyNotes(
        unattributed_calls=unattributed,
        attributed_by_rendezvous_key=by_key,
        undecodable_messages=undecodable,
        incomplete_calls=incomplete,
    )
    return rpcs, kept, notes


# --------------------------------------------------------------------------
# Steps (pure).


@dataclass(frozen=True, slots=True, kw_only=True)
class StepWindow:
    """One steady-state step's time window (monotonic ns) and its marker step number."""

    number: int
    start_ns: int
    end_ns: int
    #: The TensorFlow step id whose RecvTensor/RecvBuf calls make this step
    #: (user jobs without markers); 0 when the window comes from markers.
    step_id: int = 0


def step_windows(markers: Sequence[StepMarker]) -> list[StepWindow]:
    """Steady-state step windows from step markers, by start time.

    Markers with the same step number (one per driving task: tf1-ps, mwms) are
    one step, from the earliest start to the latest end.
    """
    grouped: dict[int, list[StepMarker]] = {}
    for marker in markers:
        if marker.phase == "steady":
            grouped.setdefault(marker.step, []).append(marker)
    windows = [
        StepWindow(
            number=number,
            start_ns=min(m.start_ns for m in group),
            end_ns=max(m.end_ns for m in group),
        )
        for number, group in grouped.items()
    ]
    return sorted(windows, key=lambda w: (w.start_ns, w.number))


def _involves_ps(call: RecordedCall) -> bool:
    """A RecvTensor whose rendezvous key names a ps task at either end."""
    if call.method != RECV_TENSOR:
        return False
    try:
        key = decode_recv_tensor_request(call.request_head).rendezvous_key
    except MessageDecodeError:
        return False
    return "/job:ps/" in key


def step_id_windows(
    calls: Sequence[RecordedCall],
    *,
    warmup_steps: int = 0,
    start_ns: int | None = None,
    end_ns: int | None = None,
    count: int | None = None,
) -> tuple[list[StepWindow], frozenset[int]]:
    """One window per TensorFlow step id (one worker-step), ordered by first call.

    Every RecvTensor (and RecvBuf) request names the step id of the function
    or graph run that needs the tensor, so the calls sharing one are one
    worker-step.  Only the transfers to or from parameter servers count when
    there are some (other functions, such as the chief fetching a loss, have
    step ids of their own).  Step ids whose first call comes before ``start_ns``, and the
    ``warmup_steps`` first of the others, are start-up; those starting after
    ``end_ns`` are left to teardown.  With ``count``, only the last ``count``
    are steps and any earlier ones start-up (a slow worker's warm-up step
    may start after a fast one's first steady step).  Returns the windows and
    the start-up step ids.  Calls with step id 0 (RecvBuf under MultiWorkerMirrored)
    delimit nothing: ``collective_windows`` finds those steps.
    """
    spans: dict[int, list[int]] = {}
    with_ps = [call for call in calls if _involves_ps(call)]
    for call in with_ps or calls:
        step_id = step_id_of(call)
        if step_id:
            span = spans.get(step_id)
            if span is None:
                spans[step_id] = [call.start_ns, call.end_ns]
            else:
                span[0] = min(span[0], call.start_ns)
                span[1] = max(span[1], call.end_ns)
    ordered = sorted((start, end, step_id) for step_id, (start, end) in spans.items())
    early = [o for o in ordered if start_ns is not None and o[0] < start_ns]
    rest = [o for o in ordered if start_ns is None or o[0] >= start_ns]
    startup = early + rest[:warmup_steps]
    kept = [o for o in rest[warmup_steps:] if end_ns is None or o[0] <= end_ns]
    if count is not None and len(kept) > count:
        startup += kept[: len(kept) - count]
        kept = kept[len(kept) - count :]
    windows = [
        StepWindow(number=number, start_ns=start, end_ns=end, step_id=step_id)
        for number, (start, end, step_id) in enumerate(kept)
    ]
    return windows, frozenset(step_id for _, _, step_id in startup)


def collective_instance_of(call: RecordedCall) -> tuple[int, int] | None:
    """(group key, instance key) of a RecvBuf call, from its buffer's rendezvous key.

    TensorFlow's collectives name a buffer ``group:instance:frame:iteration:...``;
    None for any other call or key.
    """
    if call.method != RECV_BUF:
        return None
    try:
        key = decode_recv_buf_request(call.request_head).buf_rendezvous_key
    except MessageDecodeError:
        return None
    fields = key.split(":")
    if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


def _buffer_bytes(call: RecordedCall) -> int:
    """The size a RecvBuf request asks for (its response's length if it names none)."""
    try:
        return decode_recv_buf_request(call.request_head).num_bytes or call.response_bytes
    except MessageDecodeError:
        return call.response_bytes


def repeating_tail(signatures: Sequence[object], *, longest_period: int = 256) -> tuple[int, int]:
    """(period, first index) of the longest run at the end of ``signatures`` that
    repeats with one period, at least twice; (0, len) if there is none.

    The run starts where the repetition starts (so a run cut short at the end,
    as when a job is stopped mid-step, still starts on a whole period).  Ties
    go to the shorter period (a run with period K also repeats with 2K).
    """
    count = len(signatures)
    best = (0, count)
    best_length = 0
    for period in range(1, min(longest_period, count // 2) + 1):
        matching = 0
        for index in range(count - 1, period - 1, -1):
            if signatures[index] != signatures[index - period]:
                break
            matching += 1
        length = matching + period
        if matching >= period and length > best_length:
            best, best_length = (period, count - length), length
    return best


def collective_windows(calls: Sequence[RecordedCall], *, warmup_steps: int = 0) -> list[StepWindow]:
    """Steps of a collective (MultiWorkerMirrored) job from its RecvBuf calls.

    Their step ids are all 0, but every collective launch has an instance key
    of its own, counting up, and a synchronous training step launches the same
    collectives each time.  So the instance keys, each summarised by its
    transfers (who to whom, how many bytes), repeat with a period of one step:
    the longest periodic run at the end is the training, each period of
    instance keys one step, everything before it (the initial broadcasts) and
    the first ``warmup_steps`` periods start-up.  A window spans the calls of
    its period's instance keys.  [] when no such run is found.
    """
    transfers: dict[tuple[int, int], list[RecordedCall]] = {}
    for call in calls:
        instance = collective_instance_of(call)
        if instance is not None:
            transfers.setdefault(instance, []).append(call)
    instances = sorted(transfers)
    signatures = [
        tuple(sorted((c.caller_pid or 0, c.callee, _buffer_bytes(c)) for c in transfers[i]))
        for i in instances
    ]
    period, first = repeating_tail(signatures)
    if not period:
        return []
    windows: list[StepWindow] = []
    for start in range(first + warmup_steps * period, len(instances) - period + 1, period):
        block = [c for i in instances[start : start + period] for c in transfers[i]]
        windows.append(
            StepWindow(
                number=len(windows),
                start_ns=min(c.start_ns for c in block),
                end_ns=max(c.end_ns for c in block),
            )
        )
    return windows


def split_into_steps(
    rpcs: Sequence[Rpc],
    windows: Sequence[StepWindow],
    *,
    origin_ns: int,
    step_ids: Sequence[int] | None = None,
    startup_step_ids: frozenset[int] = frozenset(),
) -> tuple[Phase, tuple[Step, ...], Phase]:
    """(start-up, steps, teardown) from RPCs and step windows (see the module docstring).

    ``step_ids`` (parallel to ``rpcs``, 0 for none) puts an RPC in the window
    of its step id, or in start-up if its id is in ``startup_step_ids`` (a
    warm-up step), whatever its time; the others go by time.
    """
    relative = [(w.start_ns - origin_ns, w.end_ns - origin_ns) for w in windows]
    by_step_id = {w.step_id: number for number, w in enumerate(windows) if w.step_id}
    startup: list[Rpc] = []
    teardown: list[Rpc] = []
    per_step: list[list[Rpc]] = [[] for _ in windows]
    for position, rpc in enumerate(rpcs):
        t = rpc.start_ns
        step_id = step_ids[position] if step_ids is not None else 0
        if step_id and step_id in by_step_id:
            per_step[by_step_id[step_id]].append(rpc)
            continue
        if step_id and step_id in startup_step_ids:
            startup.append(rpc)
            continue
        if not relative or t < relative[0][0]:
            startup.append(rpc)
            continue
        if t > relative[-1][1]:
            teardown.append(rpc)
            continue
        chosen = None
        for number, (start, end) in enumerate(relative):
            if start > t:
                if chosen is None:
                    chosen = number  # in a gap: the next step
                break
            if t <= end:
                chosen = number  # the latest window that contains t
        if chosen is None:
            # After the end of every window that started before t, and no later window.
            teardown.append(rpc)
        else:
            per_step[chosen].append(rpc)
    steps = tuple(
        Step(
            index=number,
            start_ns=max(0, start),
            end_ns=max(0, end),
            rpcs=trace_model.with_outstanding(step_rpcs),
        )
        for number, ((start, end), step_rpcs) in enumerate(zip(relative, per_step, strict=True))
    )
    first_start = steps[0].start_ns if steps else max((r.end_ns for r in startup), default=0)
    last_end = steps[-1].end_ns if steps else first_start
    startup_phase = Phase(
        start_ns=0, end_ns=first_start, rpcs=trace_model.with_outstanding(startup)
    )
    teardown_phase = Phase(
        start_ns=last_end,
        end_ns=max([last_end, *(r.end_ns for r in teardown)]),
        rpcs=trace_model.with_outstanding(teardown),
    )
    return startup_phase, steps, teardown_phase


def assemble_trace(
    calls: Sequence[RecordedCall],
    *,
    tasks: Sequence[Task],
    caller_of_pid: Mapping[int, int],
    markers: Sequence[StepMarker] = (),
    windows: Sequence[StepWindow] | None = None,
    startup_step_ids: frozenset[int] = frozenset(),
    origin_ns: int,
    metadata: RunMetadata,
    partial_reason: str = "",
) -> Trace:
    """A validated Trace from proxy records and step markers (pure).

    Steps come from ``windows`` if given (then RPCs with a step id go to the
    window of that id, or to start-up if it is in ``startup_step_ids``), else
    from ``markers``.  ``metadata.extra`` gains the
    assembly notes (calls left out, callers found by rendezvous key,
    undecodable messages, calls still open at the end).
    """
    rpcs, kept, notes = calls_to_rpcs(
        calls, tasks=tasks, caller_of_pid=caller_of_pid, origin_ns=origin_ns
    )
    if windows is None:
        startup, steps, teardown = split_into_steps(
            rpcs, step_windows(markers), origin_ns=origin_ns
        )
    else:
        startup, steps, teardown = split_into_steps(
            rpcs,
            windows,
            origin_ns=origin_ns,
            step_ids=[step_id_of(call) for call in kept],
            startup_step_ids=startup_step_ids,
        )
    extra = dict(metadata.extra)
    extra.update(notes.as_extra())
    return Trace(
        metadata=dataclasses.replace(metadata, extra=tuple(sorted(extra.items()))),
        tasks=tuple(tasks),
        startup=startup,
        steps=steps,
        teardown=teardown,
        partial=bool(partial_reason),
        partial_reason=partial_reason,
    )


# --------------------------------------------------------------------------
# Orchestration.


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """What the progress display shows: markers written so far out of expected."""

    steps_done: int
    steps_expected: int
    last_step_ns: int


ProgressCallback = Callable[[Progress], None]


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


class Recorder(Protocol):
    """What a capture needs of a recorder (``ProxySet`` or ``wiretap.TapRecorder``)."""

    @property
    def started_ns(self) -> int:
        """When recording started (monotonic ns): the trace's time origin."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def collect(self, *, final: bool = False) -> list[RecordedCall]: ...

    def errors(self) -> tuple[str, ...]: ...

    def forwarded_bytes(self) -> tuple[int, int]: ...


class ProxySet:
    """One RecordingProxy per task, started and stopped together.

    ``owner_pids`` tells every proxy which processes may dial it; ``options``
    are more RecordingProxy arguments (``use_splice``, ``follow``...).
    """

    def __init__(
        self,
        targets: Mapping[str, tuple[str, int]],
        *,
        listen_host: str = "127.0.0.1",
        owner_pids: Callable[[], list[int]] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.proxies: dict[str, RecordingProxy] = {}
        try:
            for name, target in targets.items():
                self.proxies[name] = RecordingProxy(
                    target=target,
                    callee=name,
                    listen_host=listen_host,
                    owner_pids=owner_pids,
                    **dict(options or {}),
                )
        except BaseException:
            self.stop()
            raise
        self.started_ns = 0

    def start(self) -> None:
        for proxy in self.proxies.values():
            proxy.start()
        self.started_ns = min(p.started_ns for p in self.proxies.values())

    def stop(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()

    def collect(self, *, final: bool = False) -> list[RecordedCall]:
        calls = [c for p in self.proxies.values() for c in p.collect(final=final)]
        return sorted(calls, key=lambda c: c.start_ns)

    def errors(self) -> tuple[str, ...]:
        return tuple(e for p in self.proxies.values() for e in p.follower_errors())

    def forwarded_bytes(self) -> tuple[int, int]:
        totals = [p.forwarded_bytes() for p in self.proxies.values()]
        return sum(t for t, _ in totals), sum(s for _, s in totals)


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_metadata(
    config: TrainingConfig,
    job_info: Mapping[str, Any],
    command: Sequence[str],
    *,
    recorder: str = DEFAULT_RECORDER,
) -> RunMetadata:
    """The trace's RunMetadata for a launcher job (job_info may be empty if it failed early)."""
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
    }
    if "trainable_bytes" in job_info:
        extra["trainable_bytes"] = str(job_info["trainable_bytes"])
    if job_info.get("variables"):
        extra[VARIABLES_EXTRA] = encode_variables(job_info["variables"])
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


def check_recorder(recorder: str) -> None:
    """ConfigError unless ``recorder`` is one of RECORDERS."""
    if recorder not in CAPTURE_METHODS:
        raise ConfigError(f"unknown recorder {recorder!r}; expected one of {', '.join(RECORDERS)}")


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
    """
    check_recorder(recorder)
    # Built (or found in the cache) before anything is made or started.
    library = build_library() if recorder == "preload" else None
    output = Path(output)
    temporary = workdir is None
    work = Path(tempfile.mkdtemp(prefix="tfgb-capture-")) if workdir is None else Path(workdir)
    tasks = list(tasks) if tasks is not None else plan_tasks(config, host=host)
    holder: dict[str, TrainingJob] = {}

    def task_pids() -> list[int]:
        job = holder.get("job")
        return list(job.pids().values()) if job else []

    environment: dict[str, str] | None = None
    tap: TapRecorder | None = None
    recording: Recorder
    if recorder == "preload":
        tap = TapRecorder({t.name: t.bind_port for t in tasks}, work / "wiretap", library=library)
        environment = tap.environment(os.environ)
        recording = tap
    else:
        proxies = ProxySet(
            {t.name: (host, t.bind_port) for t in tasks},
            listen_host=host,
            owner_pids=task_pids,
            options=proxy_options,
        )
        tasks = [
            dataclasses.replace(t, advertised_address=proxies.proxies[t.name].address)
            for t in tasks
        ]
        recording = proxies
    error: BenchError | None = None
    job_info: dict[str, Any] = {}
    markers: list[StepMarker] = []
    pids: dict[tuple[str, int], int] = {}
    stop_progress = threading.Event()
    watcher: threading.Thread | None = None
    try:
        with TrainingJob(config, tasks, work, environment=environment) as job:
            holder["job"] = job
            recording.start()
            try:
                job.start()
                pids = job.pids()
                if tap is not None:
                    tap.expected_pids = {pid: f"{j}:{i}" for (j, i), pid in pids.items()}
                if progress is not None:
                    expected = config.markers_per_driving_task * len(config.driving_tasks)
                    watcher = threading.Thread(
                        target=_watch_progress,
                        args=(job, expected, progress, stop_progress),
                        daemon=True,
                    )
                    watcher.start()
                job.wait(timeout_s)
                if progress is not None:
                    stop_progress.set()
                    markers = job.step_markers()
                    progress(
                        Progress(
                            steps_done=len(markers),
                            steps_expected=len(markers),
                            last_step_ns=markers[-1].duration_ns if markers else 0,
                        )
                    )
            except BenchError as failure:
                error = failure
            except KeyboardInterrupt:
                error = CaptureError("interrupted by the user")
            finally:
                stop_progress.set()
                pids = pids or job.pids()
                job.stop()
                with contextlib.suppress(BenchError, OSError):
                    markers = job.step_markers()
                with contextlib.suppress(BenchError, OSError):
                    job_info = job.job_info()
    finally:
        recording.stop()
        if watcher is not None:
            watcher.join(1)
    calls = recording.collect(final=True)
    trace_tasks = [Task(job=t.job, index=t.index, address=f"{host}:{t.bind_port}") for t in tasks]
    task_index = {t.key: i for i, t in enumerate(tasks)}
    caller_of_pid = {pid: task_index[key] for key, pid in pids.items() if key in task_index}
    metadata = run_metadata(config, job_info, command, recorder=recorder)
    windows: list[StepWindow] | None = None
    startup_ids: frozenset[int] = frozenset()
    steady = step_windows(markers)
    if not config.synchronous and steady:
        # Asynchronous steps overlap in time: a step is one worker-step, the
        # calls of one TensorFlow step id, within the steady markers' span.
        windows, startup_ids = step_id_windows(
            calls,
            start_ns=steady[0].start_ns,
            end_ns=max(w.end_ns for w in steady),
            count=sum(1 for m in markers if m.phase == "steady"),
        )
        metadata = dataclasses.replace(
            metadata,
            extra=(
                *metadata.extra,
                ("step_unit", "worker-step"),
                ("steps_from", "step-id"),
            ),
        )
    return write_captured_trace(
        calls,
        recorder=recording,
        tasks=trace_tasks,
        caller_of_pid=caller_of_pid,
        markers=markers,
        windows=windows,
        startup_step_ids=startup_ids,
        metadata=metadata,
        error=error,
        output=output,
        work=work,
        remove_work=temporary,
        job_info=job_info,
    )


def partial_reason(error: BenchError | None, recorder_errors: Sequence[str]) -> str:
    """Why a capture's trace is partial: the run's error, else the recorder's first, else ""."""
    if error is not None:
        return str(error)
    if recorder_errors:
        return f"the recorder lost track of some traffic: {recorder_errors[0]}"
    return ""


def write_captured_trace(
    calls: Sequence[RecordedCall],
    *,
    recorder: Recorder,
    tasks: Sequence[Task],
    caller_of_pid: Mapping[int, int],
    markers: Sequence[StepMarker],
    windows: Sequence[StepWindow] | None,
    startup_step_ids: frozenset[int],
    metadata: RunMetadata,
    error: BenchError | None,
    output: Path,
    work: Path,
    remove_work: bool,
    job_info: dict[str, Any],
) -> CaptureResult:
    """Assemble the trace of a finished (or failed) capture, write it, and report.

    Shared by ``capture`` and ``capture-job``.  The trace is written even when
    ``error`` is set (then marked partial with its reason); the work directory
    is removed only when ``remove_work`` and the capture succeeded, so a
    failure keeps the tasks' logs.
    """
    recorder_errors = recorder.errors()
    trace = assemble_trace(
        calls,
        tasks=tasks,
        caller_of_pid=caller_of_pid,
        markers=markers,
        windows=windows,
        startup_step_ids=startup_step_ids,
        origin_ns=recorder.started_ns,
        metadata=metadata,
        partial_reason=partial_reason(error, recorder_errors),
    )
    trace_files.write_trace(trace, output)
    recorded, uncopied = recorder.forwarded_bytes()
    if remove_work and error is None:
        shutil.rmtree(work, ignore_errors=True)
    return CaptureResult(
        trace=trace,
        path=output,
        job_info=job_info,
        recorder_errors=recorder_errors,
        recorded_bytes=recorded,
        uncopied_bytes=uncopied,
        error=error,
    )


def command_line() -> tuple[str, ...]:
    """The command line of this process, as a user would retype it."""
    if not sys.argv:
        return ("tf-grpc-bench",)
    program = Path(sys.argv[0]).name
    if program == "__main__.py":  # python -m tf_grpc_bench ...
        return ("python", "-m", "tf_grpc_bench", *sys.argv[1:])
    return (program, *sys.argv[1:])
