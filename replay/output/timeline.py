"""Timelines of training steps: every RPC a slice on its task's rows, compute gaps, steps.

A ``Timeline`` is groups of rows of slices.  A *group* is one task (a
process in the viewers): ``captured /job:worker/task:0`` for a task of a
captured trace, ``replayed /job:worker/task:0`` for the replay process that
played that task.  Its rows, top to bottom:

- ``steps``: one slice per step (captured: the trace's step windows;
  replayed: from a worker's first call of a step to the end of its last);
- ``critical path`` (captured workers): the step's critical path under the
  dependency model (``tf_grpc_bench.dependencies``): *compute* slices (the recorded
  compute between a tensor's arrival and the next tensor leaving, which
  ``inspect`` sums per step) and the transfers between them;
- ``no call in flight`` (replayed workers): the gaps in which the worker had
  no call open: the compute a dependency-paced replay keeps, or its waits;
- ``calls 1``, ``calls 2``, ...: every call the task made, from issue to
  response, packed into as few rows as overlap allows (a RecvTensor is issued
  early and waits for its tensor, so hundreds are open at once).  Slice names
  are the method and tensor (``RecvTensor resnet50/conv1/kernel``); each slice's
  arguments give caller, callee, method, tensor, dtype, shape and bytes.

Times start at 0 at the first drawn step, for captured and replayed steps
alike, so both can be put side by side: ``run_timeline`` draws the trace's
steps and the replay's measured steps of one benchmark in one timeline.

Renderings: Chrome trace-event JSON (``trace_events_json``: Perfetto,
chrome://tracing, any Trace Event Format viewer) and the profile format that
TensorBoard's Profile tab (tensorboard-plugin-profile) opens from a run
directory (``profile_bytes``, ``profile_path``).  Pure except the writers.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tf_grpc_bench import trace_files
from tf_grpc_bench.critical_path import captured_path_segments
from tf_grpc_bench.errors import ResultError, TraceError
from tf_grpc_bench.files import write_atomically
from tf_grpc_bench.protos import xplane_pb2
from tf_grpc_bench.replay.core.measurement import BenchmarkResult, CallSample, RunMeasurement
from tf_grpc_bench.replay.core.whatif import derive_trace
from tf_grpc_bench.replay.output.document import ResultDocument
from tf_grpc_bench.trace import Rpc, Trace

#: Suffix of Chrome trace-event files.
TRACE_EVENTS_SUFFIX = ".trace.json"
#: Profile session name under ``<run>/plugins/profile/``: the Profile tab lists ``<run>/timeline``.
PROFILE_SESSION = "timeline"
#: Steps drawn unless told otherwise (per task; captured and replayed alike).
DEFAULT_STEPS = 2

ArgValue = str | int | float


@dataclass(frozen=True, slots=True, kw_only=True)
class Slice:
    """One timed slice.  Times in ns from the timeline's origin."""

    name: str
    start_ns: int
    end_ns: int
    #: ``rpc``, ``compute``, ``idle`` or ``step``.
    category: str
    args: tuple[tuple[str, ArgValue], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """Slices that do not overlap, by start time."""

    name: str
    slices: tuple[Slice, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """One task's rows."""

    name: str
    rows: tuple[Row, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    title: str
    groups: tuple[Group, ...]

    @property
    def slice_count(self) -> int:
        return sum(len(row.slices) for group in self.groups for row in group.rows)


# --------------------------------------------------------------------------
# Building blocks.


def pack(prefix: str, slices: Iterable[Slice]) -> tuple[Row, ...]:
    """``slices`` in as few rows as overlap allows: by start, each to the row freed first.

    Rows are named ``<prefix> 1``, ``<prefix> 2``, ...; a single row just ``<prefix>``.
    """
    ordered = sorted(slices, key=lambda s: (s.start_ns, s.end_ns, s.name))
    rows: list[list[Slice]] = []
    free: list[tuple[int, int]] = []  # (end of the row's last slice, row number)
    for item in ordered:
        if free and free[0][0] <= item.start_ns:
            _, number = heapq.heappop(free)
        else:
            number = len(rows)
            rows.append([])
        rows[number].append(item)
        heapq.heappush(free, (item.end_ns, number))
    if len(rows) == 1:
        return (Row(name=prefix, slices=tuple(rows[0])),)
    return tuple(Row(name=f"{prefix} {n + 1}", slices=tuple(row)) for n, row in enumerate(rows))


def gaps(
    name: str, category: str, spans: Iterable[tuple[int, int]], within: tuple[int, int]
) -> Row:
    """The stretches of ``within`` covered by none of ``spans``, as one row."""
    begin, end = within
    found: list[Slice] = []
    cursor = begin
    for start, stop in sorted(spans):
        if start > cursor:
            found.append(
                Slice(name=name, start_ns=cursor, end_ns=min(start, end), category=category)
            )
        cursor = max(cursor, stop)
        if cursor >= end:
            break
    if cursor < end:
        found.append(Slice(name=name, start_ns=cursor, end_ns=end, category=category))
    return Row(name=name, slices=tuple(s for s in found if s.end_ns > s.start_ns))


def tensor_label(rpc: Rpc) -> str:
    """The tensor an RPC carries, short: the rendezvous edge without ``edge_<n>_``."""
    if rpc.tensor is None:
        return ""
    edge = rpc.tensor.edge_name or rpc.tensor.rendezvous_key
    return re.sub(r"^edge_\d+_", "", edge)


def rpc_name(rpc: Rpc) -> str:
    """A slice's name: method and tensor, e.g. ``RecvTensor resnet50/conv1/kernel``."""
    tensor = tensor_label(rpc)
    return f"{rpc.short_method} {tensor}" if tensor else rpc.short_method


def rpc_args(trace: Trace, rpc: Rpc, step_index: int) -> tuple[tuple[str, ArgValue], ...]:
    """What a slice says about its RPC when selected."""
    args: list[tuple[str, ArgValue]] = [
        ("caller", trace.task_name(rpc.caller_task)),
        ("callee", trace.task_name(rpc.callee_task)),
        ("method", rpc.method),
        ("request_bytes", rpc.request_bytes),
        ("response_bytes", rpc.response_bytes),
        ("step", step_index),
    ]
    if rpc.tensor is not None:
        args += [
            ("tensor", rpc.tensor.edge_name or rpc.tensor.rendezvous_key),
            ("dtype", rpc.tensor.dtype),
            ("shape", "x".join(str(d) for d in rpc.tensor.shape) or "scalar"),
        ]
    args.append(("waited_for_response_ms", (rpc.response_start_ns - rpc.start_ns) / 1e6))
    return tuple(args)


def _task_order(trace: Trace, tasks: Iterable[int]) -> list[int]:
    """Workers first (whose steps people read), then ps, then the rest."""
    rank = {"worker": 0, "ps": 1}
    return sorted(set(tasks), key=lambda t: (rank.get(trace.tasks[t].job, 2), trace.tasks[t].index))


def chosen_steps(count: int, steps: int | None) -> int:
    """How many of ``count`` steps to draw (``steps`` None: all)."""
    return count if steps is None else max(0, min(count, steps))


# --------------------------------------------------------------------------
# A captured trace.


def _captured_paths(trace: Trace, drawn: int, origin: int) -> dict[int, list[Slice]]:
    """Worker task -> its critical-path slices over the drawn steps (none if unknowable)."""
    try:
        paths = captured_path_segments(trace)
    except TraceError:
        return {}
    by_task: dict[int, list[Slice]] = {}
    for number, task, segments in paths:
        if number >= drawn:
            continue
        step = trace.steps[number]
        for segment in segments:
            args: tuple[tuple[str, ArgValue], ...] = (("step", step.index),)
            if segment.rpc_index < 0:
                name, category = "compute", "compute"
            else:
                rpc = step.rpcs[segment.rpc_index]
                name, category = rpc_name(rpc), "rpc"
                args = rpc_args(trace, rpc, step.index)
            by_task.setdefault(task, []).append(
                Slice(
                    name=name,
                    start_ns=max(segment.start_ns - origin, 0),
                    end_ns=max(segment.end_ns - origin, 0),
                    category=category,
                    args=args,
                )
            )
    return by_task


def captured_groups(
    trace: Trace, *, steps: int | None = DEFAULT_STEPS, tasks: Iterable[int] | None = None
) -> tuple[Group, ...]:
    """One group per task that made or served a call in the trace's first ``steps`` steps
    (None: all), workers first.

    ``tasks`` limits the groups and calls to those between the given tasks.
    """
    drawn = chosen_steps(len(trace.steps), steps)
    if drawn == 0:
        return ()
    origin = trace.steps[0].start_ns
    wanted = set(range(len(trace.tasks)) if tasks is None else tasks)
    step_row = Row(
        name="steps",
        slices=tuple(
            Slice(
                name=f"step {step.index}",
                start_ns=step.start_ns - origin,
                end_ns=step.end_ns - origin,
                category="step",
                args=(("rpcs", len(step.rpcs)),),
            )
            for step in trace.steps[:drawn]
        ),
    )
    paths = {
        task: path for task, path in _captured_paths(trace, drawn, origin).items() if task in wanted
    }
    # One pass over the drawn calls; only tasks that made or served one get a group, so
    # the work and memory follow the calls drawn, not the tasks a trace lists.
    calls: dict[int, list[Slice]] = {}
    for step in trace.steps[:drawn]:
        for rpc in step.rpcs:
            if rpc.caller_task not in wanted or rpc.callee_task not in wanted:
                continue
            calls.setdefault(rpc.callee_task, [])
            calls.setdefault(rpc.caller_task, []).append(
                Slice(
                    name=rpc_name(rpc),
                    start_ns=rpc.start_ns - origin,
                    end_ns=rpc.end_ns - origin,
                    category="rpc",
                    args=rpc_args(trace, rpc, step.index),
                )
            )
    groups = []
    for task in _task_order(trace, set(calls) | set(paths)):
        rows = [step_row]
        if task in paths:
            # Consecutive stretches; a step's tail may reach into the next step.
            rows += pack("critical path", paths[task])
        rows += pack("calls", calls.get(task, []))
        groups.append(Group(name=f"captured {trace.task_name(task)}", rows=tuple(rows)))
    return tuple(groups)


def trace_timeline(trace: Trace, *, title: str, steps: int | None = DEFAULT_STEPS) -> Timeline:
    """The captured steps of ``trace``: every task, every RPC."""
    return Timeline(title=title, groups=captured_groups(trace, steps=steps))


# --------------------------------------------------------------------------
# A replay's measured calls.

#: Calls drawn per worker for a synthetic workload (it has no steps).
SYNTHETIC_CALLS = 500


def task_names(parameters: dict[str, str | int | float | bool]) -> tuple[list[str], list[str]]:
    """The trace tasks a replay's workers and ps servers played, by index (may be empty)."""
    servers = str(parameters.get("server_tasks", "")).split(",")
    if "client_tasks" in parameters:
        clients = str(parameters["client_tasks"]).split(",")
    elif "pair" in parameters:
        clients = [str(parameters["pair"]).split("->")[0]]
    else:
        clients = []
    return [c for c in clients if c], [s for s in servers if s]


def replayed_steps(samples: Iterable[CallSample], steps: int | None) -> list[list[CallSample]]:
    """One worker's samples in issue order, split where the replayed step changes."""
    ordered = sorted(samples, key=lambda s: (s.start_ns, s.rpc_index))
    if ordered and ordered[0].step < 0:
        return [ordered[:SYNTHETIC_CALLS]]
    split: list[list[CallSample]] = []
    for sample in ordered:
        if not split or split[-1][-1].step != sample.step:
            split.append([])
        split[-1].append(sample)
    return split[: chosen_steps(len(split), steps)]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Replayed:
    """What names a replayed call: the trace and the tasks the replay played."""

    trace: Trace | None
    clients: list[str]
    servers: list[str]
    origin: int

    def rpc(self, sample: CallSample) -> Rpc | None:
        if self.trace is None or sample.rpc_index < 0:
            return None
        for step in self.trace.steps:
            if step.index == sample.step and sample.rpc_index < len(step.rpcs):
                return step.rpcs[sample.rpc_index]
        return None

    def slice(self, sample: CallSample) -> Slice:
        rpc = self.rpc(sample)
        server = sample.server_index
        args: list[tuple[str, ArgValue]] = [
            ("server", self.servers[server] if server < len(self.servers) else f"ps {server}"),
            ("request_bytes", sample.request_bytes),
            ("response_bytes", sample.response_bytes),
            ("latency_ms", sample.latency_ns / 1e6),
            ("release_lag_us", sample.release_lag_ns / 1e3),
            ("step", sample.step),
            ("rpc_index", sample.rpc_index),
        ]
        if rpc is not None and self.trace is not None:
            # Reversed (the trace's response carried as the request) when the
            # server the call went to stood for the trace's caller.  Not "the
            # caller is a server": with stand-in servers, workers serve too.
            caller = self.trace.task_name(rpc.caller_task)
            pushed = server < len(self.servers) and self.servers[server] == caller
            args.append(
                ("replayed_as", "push (the trace's response as request)" if pushed else "pull")
            )
            args += [(f"trace_{k}", v) for k, v in rpc_args(self.trace, rpc, sample.step)]
        return Slice(
            name=rpc_name(rpc) if rpc is not None else f"call {sample.payload_bytes} B",
            start_ns=sample.start_ns - self.origin,
            end_ns=sample.start_ns + sample.latency_ns - self.origin,
            category="rpc",
            args=tuple(args),
        )


def _replayed_group(name: str, steps: list[list[CallSample]], named: _Replayed) -> Group:
    step_slices = []
    spans = []
    for samples in steps:
        begin = min(s.start_ns for s in samples) - named.origin
        end = max(s.start_ns + s.latency_ns for s in samples) - named.origin
        label = f"replayed step {samples[0].step}" if samples[0].step >= 0 else "calls"
        step_slices.append(
            Slice(
                name=label,
                start_ns=begin,
                end_ns=end,
                category="step",
                args=(("calls", len(samples)),),
            )
        )
        spans += [
            (s.start_ns - named.origin, s.start_ns + s.latency_ns - named.origin) for s in samples
        ]
    within = (step_slices[0].start_ns, step_slices[-1].end_ns)
    calls = [named.slice(sample) for samples in steps for sample in samples]
    rows = (
        *pack("steps", step_slices),
        gaps("no call in flight", "idle", spans, within),
        *pack("calls", calls),
    )
    return Group(name=name, rows=rows)


def chosen_run(result: BenchmarkResult, run_index: int | None) -> RunMeasurement:
    """The measured run to draw: ``run_index``, or the first with calls.  ResultError if none."""
    runs = [r for r in result.runs if r.samples]
    if run_index is not None:
        runs = [r for r in result.runs if r.run_index == run_index]
        if not runs:
            indices = ", ".join(str(r.run_index) for r in result.runs) or "none"
            raise ResultError(f"--run {run_index}: no such run (runs: {indices})")
    if not runs or not runs[0].samples:
        raise ResultError(f"{result.benchmark.value}: no measured calls to draw")
    return runs[0]


def replayed_groups(
    result: BenchmarkResult,
    trace: Trace | None,
    *,
    run_index: int | None = None,
    steps: int | None = DEFAULT_STEPS,
) -> tuple[Group, ...]:
    """One group per replay worker: its first ``steps`` replayed steps of one measured run."""
    run = chosen_run(result, run_index)
    clients, servers = task_names(result.parameters)
    by_worker: dict[int, list[CallSample]] = {}
    for sample in run.samples:
        by_worker.setdefault(sample.worker_index, []).append(sample)
    split = {
        worker: replayed_steps(samples, steps) for worker, samples in sorted(by_worker.items())
    }
    drawn = [s for parts in split.values() for part in parts for s in part]
    if not drawn:
        return ()
    named = _Replayed(
        trace=trace, clients=clients, servers=servers, origin=min(s.start_ns for s in drawn)
    )
    return tuple(
        _replayed_group(
            f"replayed {clients[worker] if worker < len(clients) else f'worker {worker}'}",
            parts,
            named,
        )
        for worker, parts in split.items()
        if parts
    )


def run_timeline(
    result: BenchmarkResult,
    label: str,
    trace: Trace | None,
    *,
    run_index: int | None = None,
    steps: int | None = DEFAULT_STEPS,
) -> Timeline:
    """One benchmark's replayed steps, after the trace's captured steps of the same tasks."""
    replayed = replayed_groups(result, trace, run_index=run_index, steps=steps)
    captured: tuple[Group, ...] = ()
    if trace is not None and result.workload == "trace":
        clients, servers = task_names(result.parameters)
        names = set(clients) | set(servers)
        if "pair" in result.parameters:
            names = set(str(result.parameters["pair"]).split("->"))
        tasks = [i for i in range(len(trace.tasks)) if trace.task_name(i) in names]
        captured = captured_groups(trace, steps=steps, tasks=tasks or None)
    return Timeline(title=f"{label}: captured and replayed steps", groups=captured + replayed)


# --------------------------------------------------------------------------
# Renderings.


def _events(timeline: Timeline) -> Iterator[dict[str, object]]:
    """The timeline's trace events one at a time (see ``trace_events``)."""
    for pid, group in enumerate(timeline.groups, start=1):
        yield {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": group.name}}
        yield {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}
        for tid, row in enumerate(group.rows, start=1):
            yield {
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "name": "thread_name",
                "args": {"name": row.name},
            }
            yield {
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
            for item in row.slices:
                yield {
                    "ph": "X",
                    "pid": pid,
                    "tid": tid,
                    "name": item.name,
                    "cat": item.category,
                    "ts": item.start_ns / 1e3,
                    "dur": (item.end_ns - item.start_ns) / 1e3,
                    "args": dict(item.args),
                }


def _other_data(timeline: Timeline) -> dict[str, object]:
    return {"title": timeline.title, "written_by": "tf-grpc-bench"}


def trace_events(timeline: Timeline) -> dict[str, object]:
    """Chrome's Trace Event Format: a process per group, a thread per row, ``X`` slices (us)."""
    return {
        "traceEvents": list(_events(timeline)),
        "displayTimeUnit": "ms",
        "otherData": _other_data(timeline),
    }


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def write_trace_events(timeline: Timeline, stream: IO[bytes]) -> None:
    """``trace_events_json`` written event by event: memory for one event, not the file."""
    stream.write(b'{"traceEvents":[')
    for number, event in enumerate(_events(timeline)):
        stream.write((b"," if number else b"") + _dumps(event).encode("utf-8"))
    tail = f'],"displayTimeUnit":"ms","otherData":{_dumps(_other_data(timeline))}}}'
    stream.write(tail.encode("utf-8"))


def trace_events_json(timeline: Timeline) -> str:
    return _dumps(trace_events(timeline))


def _stat(
    plane: xplane_pb2.XPlane,
    stat_ids: dict[str, int],
    event: xplane_pb2.XEvent,
    key: str,
    value: ArgValue,
) -> None:
    number = stat_ids.setdefault(key, len(stat_ids) + 1)
    plane.stat_metadata[number].id = number
    plane.stat_metadata[number].name = key
    stat = event.stats.add(metadata_id=number)
    if isinstance(value, bool | str):
        stat.str_value = str(value)
    elif isinstance(value, int):
        stat.int64_value = value
    else:
        stat.double_value = value


def profile_bytes(timeline: Timeline, host: str) -> bytes:
    """The timeline as the profile TensorBoard's Profile tab reads (``protos/xplane.proto``).

    Each group is a plane named ``/device:CUSTOM:<n> <group>`` (the trace
    viewer shows such planes as processes), each row a line, each slice an
    event whose name is its metadata's and whose arguments are stats.
    """
    space = xplane_pb2.XSpace(hostnames=[host])
    for number, group in enumerate(timeline.groups):
        plane = space.planes.add(id=number, name=f"/device:CUSTOM:{number} {group.name}")
        names: dict[str, int] = {}
        stat_ids: dict[str, int] = {}
        for line_id, row in enumerate(group.rows):
            line = plane.lines.add(
                id=line_id, display_id=line_id, name=row.name, display_name=row.name, timestamp_ns=0
            )
            for item in row.slices:
                metadata_id = names.setdefault(item.name, len(names) + 1)
                plane.event_metadata[metadata_id].id = metadata_id
                plane.event_metadata[metadata_id].name = item.name
                event = line.events.add(
                    metadata_id=metadata_id,
                    offset_ps=item.start_ns * 1000,
                    duration_ps=(item.end_ns - item.start_ns) * 1000,
                )
                for key, value in item.args:
                    _stat(plane, stat_ids, event, key, value)
    return space.SerializeToString()


def profile_path(tensorboard_run: Path, host: str) -> Path:
    """Where the Profile tab finds a run's profile (``<run>/plugins/profile/timeline/``)."""
    return tensorboard_run / "plugins" / "profile" / PROFILE_SESSION / f"{host}.xplane.pb"


def write_timeline(
    timeline: Timeline, *, events_path: Path, tensorboard_run: Path, host: str
) -> tuple[Path, Path]:
    """Write the trace-event JSON and the Profile tab's profile; returns both paths.

    Atomic writes; ``ResultError`` naming the file if one cannot be written.
    """
    written = write_atomically(
        events_path,
        lambda stream: write_trace_events(timeline, stream),
        error=ResultError,
        what="timeline",
    )
    data = profile_bytes(timeline, host)
    profile = write_atomically(
        profile_path(tensorboard_run, host),
        lambda stream: stream.write(data),
        error=ResultError,
        what="profile",
    )
    return written, profile


# --------------------------------------------------------------------------
# A run directory's timelines.

#: Folder of a run directory holding the trace-event files, one per benchmark.
TIMELINE_FOLDER = "timeline"


def replayed_trace(document: ResultDocument, override: Path | None = None) -> Trace | None:
    """The trace a run replayed: ``override``, else the recorded path, else a shipped trace.

    Checked against the recorded SHA-256 (a trace file edited or replaced
    since the run is refused).  None for a synthetic run; ``ResultError`` when
    the trace cannot be found.
    """
    info = document.trace
    if info is None:
        return None
    candidates = [override] if override is not None else [Path(info.path)]
    if override is None:
        candidates += [trace_files.shipped_trace_path(n) for n in trace_files.shipped_trace_names()]
    for candidate in candidates:
        if candidate.is_file() and trace_files.file_sha256(candidate) == info.sha256:
            trace = trace_files.read_trace(candidate)
            if document.what_if is not None:
                # A what-if run's calls index the RPCs of the trace derived from it.
                trace = derive_trace(trace, document.what_if.asked())
            return trace
    if override is not None:
        raise ResultError(
            f"--trace {override}: not the trace the run replayed (sha256 {info.sha256[:12]}...)"
        )
    raise ResultError(
        f"the run replayed {info.path} (sha256 {info.sha256[:12]}...), which is no longer "
        "there; give it with --trace"
    )


def write_run_timelines(
    document: ResultDocument,
    run_directory: Path,
    trace: Trace | None,
    *,
    steps: int | None = DEFAULT_STEPS,
    run_index: int | None = None,
    labels: Iterable[str] | None = None,
) -> list[Path]:
    """Each benchmark's timeline (``run_timeline``) into the run directory; returns the files.

    ``<run>/timeline/<label>.trace.json`` and the Profile tab's
    ``<run>/<label>/plugins/profile/timeline/<label>.xplane.pb``.  Benchmarks
    without measured calls are skipped; ``labels`` picks some.
    """
    wanted = set(document.labels if labels is None else labels)
    unknown = wanted - set(document.labels)
    if unknown:
        raise ResultError(
            f"--benchmark {','.join(sorted(unknown))}: not in this run "
            f"(it has {', '.join(document.labels)})"
        )
    written: list[Path] = []
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        if label not in wanted or not any(run.samples for run in result.runs):
            continue
        timeline = run_timeline(result, label, trace, run_index=run_index, steps=steps)
        written += write_timeline(
            timeline,
            events_path=run_directory / TIMELINE_FOLDER / f"{label}{TRACE_EVENTS_SUFFIX}",
            tensorboard_run=run_directory / label,
            host=label,
        )
    return written
