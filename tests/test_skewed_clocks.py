"""Records of tasks whose clocks differ assemble to the trace their aligned clocks give.

A real job (``tests/data/tensor_exchange_job.py``: a ps and two workers moving
tensors over real gRPC with TensorFlow's RecvTensor messages, no TensorFlow) runs
with every task under ``tf-grpc-bench record``, on this machine, so every task
reads the same clock.  Then each task's records are copied as if its host's clock
were seconds off (worker 0 ahead, worker 1 behind: every recorded time, the
manifest's clock readings and the step markers moved by the task's offset, and a
boot id of its own), and both sets are assembled, with the driving task's step
markers and without them.  The skewed copy must give the aligned trace: the
offsets found by the wire bound the true ones, and every call lands in the same
step with the same sizes, tensor and tasks, at the same time up to the wire's
bounds (a call that starts within those bounds of a step's edge, on another clock
than the step markers', in the step on either side of it).
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import platform
import shutil
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tf_grpc_bench
from tf_grpc_bench.errors import CaptureError, ConfigError
from tf_grpc_bench.profiler.assemble import (
    Labels,
    assemble_records,
    frame_precedences,
    read_records,
    task_folders,
    wire_precedences,
)
from tf_grpc_bench.profiler.assembly.clocks import ClockError, Precedence, estimate_offsets
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.profiler.recorders.http2 import ControlFrame
from tf_grpc_bench.profiler.recorders.tapcalls import ConnectionFrames
from tf_grpc_bench.trace import Rpc, Trace

DATA = Path(__file__).parent / "data"
JOB = DATA / "tensor_exchange_job.py"
CLI = str(Path(sys.executable).with_name("tf-grpc-bench"))
STEPS = 6
#: How far each task's clock is off (ns): the reference ps:0 none, worker 0 ahead by
#: 3.2 s, worker 1 behind by 2.7 s.
OFFSETS = {"ps:0": 0, "worker:0": 3_200_000_000, "worker:1": -2_700_000_000}

# The record file layout (``wiretap.c``): a 64-byte header whose last field is its
# creation time, then records of a 24-byte head: length, kind, 0, connection,
# duration, time (ns).
_HEADER = struct.Struct("<8sIIIIQQQQ")
_RECORD = struct.Struct("<IHHIIQ")


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's records, every task under ``record``, all on this machine's clock."""
    out = tmp_path_factory.mktemp("aligned") / "records"
    ports = free_ports(3)
    cluster = {
        "ps": [f"127.0.0.1:{ports[0]}"],
        "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"],
    }
    command = [sys.executable, str(JOB), "--steps", str(STEPS), "--markers"]
    processes = []
    for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
        environment = dict(os.environ)
        environment["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": job, "index": index}}
        )
        processes.append(
            subprocess.Popen(
                [CLI, "record", "--out", str(out), "--", *command],
                env=environment,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=240)
            assert process.returncode == 0, stderr
    finally:
        for process in processes:
            process.kill()
            process.wait()
    return out


def _shift_record_file(source: Path, target: Path, offset_ns: int) -> None:
    """A copy of a record file with every time in it moved by ``offset_ns``; only its
    written part (the recorder makes the file as large as its capacity, sparse)."""
    with source.open("rb") as stream:
        fields = list(_HEADER.unpack(stream.read(_HEADER.size)))
        stream.seek(0)
        data = bytearray(stream.read(min(fields[6], fields[5])))
    fields[-1] += offset_ns
    _HEADER.pack_into(data, 0, *fields)
    end = len(data)
    position = 64
    while position + _RECORD.size <= end:
        length, kind, zero, connection, took, time_ns = _RECORD.unpack_from(data, position)
        if length == 0:
            break
        _RECORD.pack_into(data, position, length, kind, zero, connection, took, time_ns + offset_ns)
        position += length
    target.write_bytes(bytes(data))


def _task_folders(records: Path) -> Iterator[tuple[str, Path]]:
    for manifest in sorted(records.glob("*/manifest.json")):
        task = json.loads(manifest.read_text())["task"]
        yield f"{task['job']}:{task['index']}", manifest.parent


def _copy(records: Path, target: Path, *, markers: bool, skewed: bool) -> Path:
    """``records`` with or without the step markers; ``skewed``: as if each task's host
    clock were off by ``OFFSETS`` (and each host had its own boot id)."""
    for name, folder in _task_folders(records):
        offset = OFFSETS[name] if skewed else 0
        copy = target / folder.name
        (copy / "wiretap").mkdir(parents=True)
        manifest = json.loads((folder / "manifest.json").read_text())
        for reading in ("start", "end"):
            manifest["clock"][reading]["monotonic_ns"] += offset
        if skewed:
            manifest["boot_id"] = f"host-of-{name}"
        (copy / "manifest.json").write_text(json.dumps(manifest))
        for path in (folder / "wiretap").glob("tap-*.bin"):
            _shift_record_file(path, copy / "wiretap" / path.name, offset)
        written = folder / "steps.jsonl"
        lines = written.read_text().splitlines() if markers and written.exists() else []
        if lines:
            shifted = []
            for line in lines:
                marker = json.loads(line)
                marker["start_ns"] += offset
                marker["end_ns"] += offset
                shifted.append(json.dumps(marker) + "\n")
            (copy / "steps.jsonl").write_text("".join(shifted))
    return target


def _call(rpc: Rpc, trace: Trace) -> tuple[object, ...]:
    return (
        rpc.method, rpc.request_bytes, rpc.response_bytes, rpc.tensor, rpc.status_code,
        trace.task_name(rpc.caller_task), trace.task_name(rpc.callee_task),
    )  # fmt: skip


def _places(trace: Trace) -> list[list[tuple[str, int]]]:
    """(call, start) of every RPC by where it went: start-up, each step, teardown."""
    phases = [trace.startup, *trace.steps, trace.teardown]
    return [sorted((repr(_call(r, trace)), r.start_ns) for r in phase.rpcs) for phase in phases]


def _edges(trace: Trace) -> list[tuple[int, ...]]:
    """Where a call's start decides between place k and place k + 1 (``_places``): the
    first step's start; a step's end (a call between two steps goes to the next); the
    last step's end."""
    steps = trace.steps
    middle = [(before.end_ns, after.start_ns) for before, after in itertools.pairwise(steps)]
    return [(steps[0].start_ns,), *middle, (steps[-1].end_ns,)]


def _assert_same_trace(skewed: Trace, aligned: Trace) -> None:
    """The same steps, each with the same calls, at the same times up to the wire's
    bounds on the clocks.

    A call whose start lies within those bounds of a step's edge, on another task's
    clock than the markers' (worker 0's), may be on the edge's other side: the ps
    pulls worker 0's next gradients the moment worker 0 ends its step.  Such a call,
    and only such a call, may be in the neighbouring place.
    """
    assert [t.name for t in skewed.tasks] == [t.name for t in aligned.tasks]
    slack = max((o.upper_ns or 0) - (o.lower_ns or 0) for o in skewed.clock_alignment.tasks)
    assert [s.index for s in skewed.steps] == [s.index for s in aligned.steps]
    assert len(aligned.steps) >= 3
    for ours, theirs in zip(skewed.steps, aligned.steps, strict=True):
        assert abs(ours.start_ns - theirs.start_ns) <= slack
        assert abs(ours.end_ns - theirs.end_ns) <= slack
    ours, theirs, edges = _places(skewed), _places(aligned), _edges(aligned)
    extra = [
        Counter(c for c, _ in o) - Counter(c for c, _ in t)
        for o, t in zip(ours, theirs, strict=True)
    ]
    for place, then in enumerate(theirs):
        missing = Counter(c for c, _ in then) - Counter(c for c, _ in ours[place])
        for call in missing.elements():
            starts = [t for c, t in then if c == call]
            # The neighbour on the side of an edge the call's start is that close to.
            near = [
                other
                for other, edge in ((place - 1, place - 1), (place + 1, place))
                if 0 <= other < len(ours) and extra[other][call]
                if any(abs(t - e) <= slack for t in starts for e in edges[edge])
            ]
            assert near, (call, place)
            extra[near[0]][call] -= 1
    assert not any(+counts for counts in extra), extra
    every = sorted(c for place in ours for c in place)
    expected = sorted(c for place in theirs for c in place)
    assert [c for c, _ in every] == [c for c, _ in expected]
    for (call, start), (_, start_then) in zip(every, expected, strict=True):
        assert abs(start - start_then) <= slack, call


def _assert_offsets_found(skewed: Trace) -> None:
    """The wire bounds each task's true offset: reference time = own time + offset."""
    alignment = skewed.clock_alignment
    assert alignment.reference == "ps:0"
    for found in alignment.tasks:
        true = -OFFSETS[found.task]
        assert found.lower_ns is not None and found.upper_ns is not None, found
        assert found.lower_ns <= true <= found.upper_ns, found
        # Loopback calls bound a clock to well under a millisecond.
        assert found.upper_ns - found.lower_ns < 10_000_000, found


@pytest.mark.parametrize("markers", [True, False], ids=["markers", "no-markers"])
def test_records_of_clocks_seconds_apart_assemble_to_the_aligned_trace(
    records: Path, tmp_path: Path, markers: bool
) -> None:
    aligned = assemble_records(
        [_copy(records, tmp_path / "aligned", markers=markers, skewed=False)]
    )
    assert not aligned.partial, aligned.partial_reason
    assert {o.offset_ns for o in aligned.clock_alignment.tasks} == {0}
    skewed = assemble_records([_copy(records, tmp_path / "skewed", markers=markers, skewed=True)])
    assert not skewed.partial, skewed.partial_reason
    _assert_offsets_found(skewed)
    _assert_same_trace(skewed, aligned)
    detection = aligned.step_detection
    assert detection is not None
    assert ("marker" in detection.source) == markers, detection


# --------------------------------------------------------------------------
# The offsets from precedences, worked out by hand and by an independent solver.


def _before(after: str, before: str, gap_ns: int) -> Precedence:
    """``before``'s event ``gap_ns`` ahead of ``after``'s on their own clocks: bounds
    o[before] - o[after] <= gap_ns."""
    return Precedence(before=before, before_ns=0, after=after, after_ns=gap_ns)


def test_offsets_bounded_on_one_side_or_none_take_what_is_known() -> None:
    found = estimate_offsets(
        ["ref", "up", "low", "free"],
        [
            Precedence(before="ghost", before_ns=0, after="ref", after_ns=5),  # not a task
            Precedence(before="ref", before_ns=0, after="ghost", after_ns=5),
            Precedence(before="up", before_ns=7, after="up", after_ns=0),  # itself
            _before(after="ref", before="up", gap_ns=300),  # o[up] <= 300
            _before(after="low", before="ref", gap_ns=40),  # o[low] >= -40
        ],
        reference="ref",
    )
    ref, up, low, free = (found[t] for t in ("ref", "up", "low", "free"))
    assert (ref.lower_ns, ref.upper_ns, ref.offset_ns, ref.source) == (0, 0, 0, "reference")
    assert (up.lower_ns, up.upper_ns, up.offset_ns, up.constraints) == (None, 300, 300, 1)
    assert (low.lower_ns, low.upper_ns, low.offset_ns, low.constraints) == (-40, None, -40, 1)
    assert (free.lower_ns, free.upper_ns, free.offset_ns, free.constraints) == (
        None, None, 0, 0,
    )  # fmt: skip
    for one_sided in (up, low, free):
        assert not one_sided.bounded and one_sided.uncertainty_ns is None
    both = estimate_offsets(
        ["ref", "b"],
        [
            _before(after="ref", before="b", gap_ns=301),
            _before(after="b", before="ref", gap_ns=-100),
        ],
        reference="ref",
    )["b"]
    # 100 <= o[b] <= 301: the middle, rounded down, and half the width rounded up.
    assert (both.lower_ns, both.upper_ns, both.offset_ns) == (100, 301, 200)
    assert both.bounded and both.uncertainty_ns == 101


def test_what_cannot_be_reconciled_is_one_line_naming_it() -> None:
    with pytest.raises(ClockError, match=r"^reference task z is not among the tasks$"):
        estimate_offsets(["a"], [], reference="z")
    contradiction = [
        _before(after="b", before="a", gap_ns=-100),
        _before(after="a", before="b", gap_ns=50),
    ]
    with pytest.raises(
        ClockError,
        match=r"^the records' clocks contradict each other around task a: some response would "
        r"have been sent before its request \(records of different runs, or a clock that "
        r"jumped\)$",
    ):
        estimate_offsets(["a", "b"], contradiction, reference="a")


def _tightest(
    tasks: list[str], precedences: list[Precedence], reference: str
) -> dict[str, tuple[int | None, int | None]]:
    """Each task's bounds by Bellman-Ford from the reference (an edge after -> before of
    weight after_ns - before_ns for each precedence): upper = distance reference -> task,
    lower = -distance task -> reference."""

    def distances(source: str, reverse: bool) -> dict[str, int]:
        found = {source: 0}
        for _ in tasks:
            for p in precedences:
                start, end = (p.before, p.after) if reverse else (p.after, p.before)
                if start in found and (
                    end not in found or found[start] + p.after_ns - p.before_ns < found[end]
                ):
                    found[end] = found[start] + p.after_ns - p.before_ns
        return found

    forward, backward = distances(reference, False), distances(reference, True)
    return {t: (None if t not in backward else -backward[t], forward.get(t)) for t in tasks}


@settings(max_examples=200, deadline=None)
@given(
    truth=st.lists(st.integers(-(10**9), 10**9), min_size=3, max_size=5),
    pairs=st.lists(
        st.tuples(
            st.integers(0, 4), st.integers(0, 4), st.integers(0, 10**6), st.integers(0, 10**9)
        ),
        max_size=12,
    ),
)
def test_offsets_are_the_tightest_bounds_the_precedences_give(
    truth: list[int], pairs: list[tuple[int, int, int, int]]
) -> None:
    """Precedences drawn from true clocks (each ``after`` event truly later, by ``gap``)
    bound every offset around the truth, exactly as tight as an independent solver finds."""
    tasks = [f"t{n}" for n in range(len(truth))]
    # reference time = own time + truth[n] (truth[0] = 0 for the reference).
    offsets = [t - truth[0] for t in truth]
    precedences = []
    for a, b, gap, when in pairs:
        a, b = a % len(tasks), b % len(tasks)
        if a == b:
            continue
        # The before event at reference time ``when``, the after event ``gap`` later.
        precedences.append(
            Precedence(
                before=tasks[a], before_ns=when - offsets[a],
                after=tasks[b], after_ns=when + gap - offsets[b],
            )
        )  # fmt: skip
    found = estimate_offsets(tasks, precedences, reference="t0")
    expected = _tightest(tasks, precedences, "t0")
    for n, task in enumerate(tasks):
        estimate = found[task]
        assert (estimate.lower_ns, estimate.upper_ns) == expected[task]
        assert estimate.lower_ns is None or estimate.lower_ns <= offsets[n]
        assert estimate.upper_ns is None or offsets[n] <= estimate.upper_ns


# --------------------------------------------------------------------------
# What assembly takes from the records besides the clocks, in this process.


def test_the_records_are_read_in_the_clusters_order_and_the_trace_says_what_ran(
    records: Path, tmp_path: Path
) -> None:
    folders = {name: folder for name, folder in _task_folders(records)}
    # A record --out directory, a folder holding several, or the task folders themselves.
    for paths in ([records], [records.parent], list(folders.values())):
        _, read = read_records(paths)
        assert [r.name for r in read] == ["ps:0", "worker:0", "worker:1"]
    assert task_folders([folders["ps:0"]]) == [folders["ps:0"]]
    trace = assemble_records([records], labels=Labels(model="exchange", batch_size=3))
    metadata = trace.metadata
    assert (metadata.model, metadata.strategy, metadata.batch_size) == ("exchange", "user job", 3)
    assert assemble_records([records]).metadata.model == "tensor_exchange_job"
    extra = dict(metadata.extra)
    assert extra["job_command"].endswith(f"{JOB} --steps {STEPS} --markers")
    hosts = ", ".join(f"{name}={read[0].host}" for name in ("ps:0", "worker:0", "worker:1"))
    assert extra["record_hosts"] == hosts
    assert trace.clock_alignment.reference == "ps:0"
    assert trace.clock_alignment.method.startswith("tasks with the same kernel boot id share")
    wired = assemble_records([records], clocks="wire").clock_alignment
    assert wired.method.startswith("every task placed by the wire")
    assert [o.source for o in wired.tasks] == ["reference", "wire", "wire"]
    # A warm-up marker (step 0) makes no step: steps 1 to 5, marked steady, do.
    assert [s.index for s in trace.steps] == list(range(STEPS - 1))


def test_records_that_are_not_one_whole_job_are_refused_naming_what(
    records: Path, tmp_path: Path
) -> None:
    folders = {name: folder for name, folder in _task_folders(records)}
    with pytest.raises(CaptureError, match=r"nowhere: not a directory \(expected a record --out"):
        read_records([tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaptureError, match=r"empty: no task records in it \(expected record"):
        read_records([tmp_path / "empty"])
    with pytest.raises(
        CaptureError,
        match=r"^no record of task worker:1 \(the cluster has 3 tasks; give every task's folder\)$",
    ):
        read_records([folders["ps:0"], folders["worker:0"]])
    with pytest.raises(CaptureError, match=r"^no record of tasks worker:0, worker:1 \(the cluster"):
        read_records([folders["ps:0"]])
    with pytest.raises(CaptureError, match=r"^task ps:0 is recorded twice: "):
        read_records([records, folders["ps:0"]])
    other = tmp_path / "other"
    shutil.copytree(folders["worker:1"], other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["cluster"]["ps"] = ["127.0.0.1:1"]
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        CaptureError, match=r"are records of different jobs \(their clusters differ\)"
    ):
        read_records([folders["ps:0"], folders["worker:0"], other])


def test_a_record_that_never_finished_or_a_driver_that_failed_makes_the_trace_partial(
    records: Path, tmp_path: Path
) -> None:
    def assembled(change: dict[str, object], task: str) -> Trace:
        copy = _copy(
            records,
            tmp_path / f"{task}-{len(list(tmp_path.iterdir()))}",
            markers=True,
            skewed=False,
        )
        manifest_path = next(f for n, f in _task_folders(copy) if n == task) / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest.update(change)
        manifest_path.write_text(json.dumps(manifest))
        return assemble_records([copy])

    killed = assembled({"exit_status": None}, "worker:1")
    assert killed.partial
    assert killed.partial_reason == (
        "the record of task worker:1 never finished (record itself was killed)"
    )
    unstarted = assembled({"pid": 0}, "worker:0")
    assert unstarted.partial_reason == "task worker:0 was stopped before its command started"
    failed = assembled({"exit_status": 3}, "worker:0")
    assert failed.partial_reason == "task worker:0 exited with status 3"
    assert not assembled({"exit_status": 0}, "worker:0").partial


# --------------------------------------------------------------------------
# What the wire says about the clocks, from calls and frames made by hand.


def _recorded(
    callee: str,
    connection: int,
    stream: int,
    start: int,
    response_start: int,
    *,
    caller_pid: int | None = 2,
    status: int | None = 0,
    complete: bool = True,
) -> RecordedCall:
    return RecordedCall(
        callee=callee, connection=connection, stream_id=stream, caller_pid=caller_pid,
        method="/tensorflow.WorkerService/RecvTensor", start_ns=start,
        response_start_ns=response_start, end_ns=response_start + 5, request_bytes=10,
        response_bytes=20, request_messages=1, response_messages=1, status_code=status,
        reset=False, complete=complete,
    )  # fmt: skip


def test_each_answered_call_says_its_request_began_before_its_response_was_sent() -> None:
    """The request's start comes from the calls timed when sends began, the response's
    from the calls as recorded; a call is matched by callee, connection and stream."""
    names = ["ps:0", "worker:0", "worker:1"]
    starts = [
        _recorded("ps:0", 1, 1, 100, 900),  # worker 0 (pid 2) to the ps
        _recorded("ps:0", 1, 3, 200, 900, caller_pid=3),  # never answered
        _recorded("ps:0", 2, 1, 300, 900, caller_pid=None),  # caller unknown
        _recorded("port 9", 3, 1, 400, 900),  # callee no task of the cluster
        _recorded("worker:1", 4, 1, 500, 900, caller_pid=1),  # reset: no status
        _recorded("worker:0", 5, 7, 600, 900, caller_pid=3),  # answered with an error
        _recorded("worker:0", 5, 9, 700, 900, caller_pid=3),  # no call of that stream ended
    ]
    ends = [
        _recorded("ps:0", 1, 1, 110, 130),
        _recorded("ps:0", 1, 3, 210, 230, caller_pid=3, complete=False),
        _recorded("ps:0", 2, 1, 310, 330, caller_pid=None),
        _recorded("port 9", 3, 1, 410, 430),
        _recorded("worker:1", 4, 1, 510, 530, caller_pid=1, status=None),
        _recorded("worker:0", 5, 7, 610, 650, caller_pid=3, status=5),
        _recorded("worker:0", 6, 9, 710, 730, caller_pid=3),  # another connection
    ]
    assert wire_precedences(starts, ends, names) == [
        Precedence(before="worker:0", before_ns=100, after="ps:0", after_ns=130),
        Precedence(before="worker:1", before_ns=600, after="worker:0", after_ns=650),
    ]


def test_each_settings_or_ping_was_sent_before_its_acknowledgement_both_ways() -> None:
    """Frames as sends began (``began``) and as recorded (``returned``); the n-th frame
    asked of a kind is acknowledged by the peer's n-th acknowledgement of that kind."""
    client_file, server_file = Path("worker-0/tap-1.bin"), Path("ps-0/tap-1.bin")
    owner = {server_file: 0, client_file: 1}

    def frames(client_file: Path | None, server_file: Path | None, shift: int) -> ConnectionFrames:
        return ConnectionFrames(
            client_file=client_file,
            server_file=server_file,
            client=(
                ControlFrame("SETTINGS", False, 10 + shift),
                ControlFrame("PING", False, 20 + shift),
                ControlFrame("SETTINGS", True, 16 + shift),
                ControlFrame("PING", False, 40 + shift),
            ),
            server=(
                ControlFrame("SETTINGS", False, 11 + shift),
                ControlFrame("SETTINGS", True, 14 + shift),
                ControlFrame("PING", True, 25 + shift),
            ),
        )

    # A connection with a side not recorded, before and after one with both, says nothing.
    sides = [(None, server_file), (client_file, server_file), (client_file, None)]
    began = [frames(client, server, 0) for client, server in sides]
    returned = [frames(client, server, 2) for client, server in sides]
    assert frame_precedences(began, returned, ["ps:0", "worker:0"], owner) == [
        # worker 0's SETTINGS (10) acknowledged by the ps at 14 + 2, its first PING (20)
        # at 25 + 2; its second PING was never acknowledged.
        Precedence(before="worker:0", before_ns=10, after="ps:0", after_ns=16),
        Precedence(before="worker:0", before_ns=20, after="ps:0", after_ns=27),
        # The ps's SETTINGS (11) acknowledged by worker 0 at 16 + 2.
        Precedence(before="ps:0", before_ns=11, after="worker:0", after_ns=18),
    ]


# --------------------------------------------------------------------------
# What the records give the trace besides the clocks, from the real job's records.


def _manifests(folder: Path) -> dict[str, tuple[Path, dict[str, object]]]:
    """Each task's manifest under ``folder``, by task name, with its path."""
    return {
        name: (path / "manifest.json", json.loads((path / "manifest.json").read_text()))
        for name, path in _task_folders(folder)
    }


def _sends_took_nothing(records: Path) -> int:
    """Every send of ``records``' tap files rewritten as if its call took no time (it
    began when it returned); how long they took in all, in ns."""
    took_in_all = 0
    for path in records.glob("*/wiretap/tap-*.bin"):
        data = bytearray(path.read_bytes())
        position = 64
        while position + _RECORD.size <= len(data):
            length, kind, zero, connection, took, time_ns = _RECORD.unpack_from(data, position)
            if length == 0:
                break
            took_in_all += took
            _RECORD.pack_into(data, position, length, kind, zero, connection, 0, time_ns)
            position += length
        path.write_bytes(bytes(data))
    return took_in_all


def test_each_call_is_timed_as_recorded_not_as_its_first_send_began(
    records: Path, tmp_path: Path
) -> None:
    """Only the clock pass times a send when its call began (a frame was sent no earlier
    than that, whatever the clocks say); the trace's calls keep their recorded times: the
    same records with every send taking no time give the same trace."""
    recorded = assemble_records([_copy(records, tmp_path / "recorded", markers=True, skewed=False)])
    instant = _copy(records, tmp_path / "instant", markers=True, skewed=False)
    assert _sends_took_nothing(instant) > 0
    same = assemble_records([instant])

    def times(trace: Trace) -> list[list[tuple[object, ...]]]:
        phases = [trace.startup, *trace.steps, trace.teardown]
        return [
            [(r.method, r.start_ns, r.response_start_ns, r.end_ns) for r in p.rpcs] for p in phases
        ]

    assert times(recorded) == times(same)
    assert sum(len(step.rpcs) for step in recorded.steps) > 0


def test_the_trace_says_what_ran_where_and_starts_at_the_first_tasks_start(
    records: Path, tmp_path: Path
) -> None:
    read = {name: manifest for name, (_, manifest) in _manifests(records).items()}
    labels = Labels(model="m", strategy="s", batch_size=7, synchronous=False, command=("a", "b"))
    metadata = assemble_records([records], labels=labels).metadata
    assert (metadata.model, metadata.strategy, metadata.batch_size) == ("m", "s", 7)
    assert (metadata.synchronous, metadata.command) == (False, ("a", "b"))
    assert metadata.capture_method == "in-process-recorder"
    cluster = read["ps:0"]["cluster"]
    assert isinstance(cluster, dict)
    tasks = assemble_records([records]).tasks
    assert [(t.job, t.index, t.address) for t in tasks] == [
        ("ps", 0, cluster["ps"][0]), ("worker", 0, cluster["worker"][0]),
        ("worker", 1, cluster["worker"][1]),
    ]  # fmt: skip
    assert metadata.host == read["ps:0"]["host"]
    assert metadata.tensorflow_version == read["ps:0"]["tensorflow_version"]
    assert metadata.tool_version == tf_grpc_bench.__version__
    created = datetime.datetime.fromisoformat(metadata.created_utc)
    assert created.utcoffset() == datetime.timedelta(0) and created.microsecond == 0
    extra = dict(metadata.extra)
    assert extra["python_version"] == platform.python_version()
    # Every caller is the task whose folder holds the call's client side: none is guessed.
    assert (extra["attributed_by_rendezvous_key"], extra["unattributed_calls"]) == ("0", "0")
    assert assemble_records([records]).metadata.synchronous
    # The steps are found in the traffic without markers: the first run is warm-up
    # unless told otherwise.
    bare = _copy(records, tmp_path / "bare", markers=False, skewed=False)
    every = assemble_records([bare], warmup_steps=0)
    assert len(assemble_records([bare]).steps) == len(every.steps) - 1
    # Times are from the earliest task's start, on the reference clock: worker 1's
    # clock behind by 2.7 s starts first once moved onto the ps's.
    skewed = assemble_records([_copy(records, tmp_path / "skewed", markers=True, skewed=True)])
    aligned = assemble_records([records])
    assert abs(skewed.steps[0].start_ns - aligned.steps[0].start_ns) < 10_000_000


def test_a_task_whose_records_are_missing_leaves_a_partial_trace_saying_so(
    records: Path, tmp_path: Path
) -> None:
    copy = _copy(records, tmp_path / "copy", markers=True, skewed=False)
    folders = dict(_task_folders(copy))
    for path in (folders["worker:0"] / "wiretap").glob("tap-*.bin"):
        path.unlink()
    trace = assemble_records([copy])
    assert trace.partial_reason == (
        "the recorder lost track of some traffic: task worker:0 left no record file in "
        f"{folders['worker:0']}"
    )
    # The ps's calls to worker 0 are known from the ps's side: worker 0, by its address.
    assert {("ps:0", "worker:0"), ("ps:0", "worker:1")} <= _pairs(trace)
    broken = _copy(records, tmp_path / "broken", markers=True, skewed=False)
    (tap,) = list((dict(_task_folders(broken))["worker:1"] / "wiretap").glob("tap-*.bin"))[:1]
    tap.write_bytes(b"not a record file")
    reason = assemble_records([broken]).partial_reason
    assert reason.startswith("the recorder lost track of some traffic: ") and str(tap) in reason


def _pairs(trace: Trace) -> set[tuple[str, str]]:
    """(caller, callee) of every RPC of the trace, as ``job:index``."""
    name = [f"{t.job}:{t.index}" for t in trace.tasks]
    phases = (trace.startup, *trace.steps, trace.teardown)
    return {(name[r.caller_task], name[r.callee_task]) for p in phases for r in p.rpcs}


def test_a_server_not_recorded_is_named_by_its_port_when_the_cluster_names_its_host(
    records: Path, tmp_path: Path
) -> None:
    """The cluster says ``localhost``, the wire 127.0.0.1: the port alone names the task."""
    copy = _copy(records, tmp_path / "copy", markers=True, skewed=False)
    for path, manifest in _manifests(copy).values():
        cluster = manifest["cluster"]
        assert isinstance(cluster, dict)
        manifest["cluster"] = {
            job: [a.replace("127.0.0.1", "localhost") for a in addresses]
            for job, addresses in cluster.items()
        }
        path.write_text(json.dumps(manifest))
    folders = dict(_task_folders(copy))
    for path in (folders["worker:1"] / "wiretap").glob("tap-*.bin"):
        path.unlink()
    trace = assemble_records([copy])
    assert ("ps:0", "worker:1") in _pairs(trace)


def test_only_a_driving_task_that_failed_makes_the_trace_partial(
    records: Path, tmp_path: Path
) -> None:
    copy = _copy(records, tmp_path / "copy", markers=True, skewed=False)
    path, manifest = _manifests(copy)["ps:0"]
    manifest["exit_status"] = 143  # a server stopped by SIGTERM, as launchers do
    path.write_text(json.dumps(manifest))
    trace = assemble_records([copy])
    assert (trace.partial, trace.partial_reason) == (False, "")


def test_an_unknown_clock_mode_is_refused_in_one_line(records: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--clocks: expected one of auto, wire, got 'ntp'$"):
        assemble_records([records], clocks="ntp")


def test_a_server_not_recorded_is_named_by_host_and_port_else_by_a_port_only_it_has() -> None:
    """Tasks of different hosts may listen on one port: the host decides, and where no
    host matches, a port one task alone has; otherwise the connection names its port."""
    from tf_grpc_bench.profiler.assemble import _Files
    from tf_grpc_bench.profiler.launch.user_job import UserJob

    cluster = {"ps": ("10.0.0.1:2222",), "worker": ("10.0.0.2:2222", "10.0.0.3:2223")}
    files = _Files(UserJob(cluster=cluster, command=("train",)), [])
    assert files._callee_by_address(("10.0.0.2", 2222)) == "worker:0"
    assert files._callee_by_address(("10.0.0.1", 2222)) == "ps:0"
    assert files._callee_by_address(("10.0.0.9", 2223)) == "worker:1"
    assert files._callee_by_address(("10.0.0.3", 2222)) == "port 2222"
    assert files._callee_by_address(("10.0.0.2", 9999)) == "port 9999"


def test_the_alignment_gives_each_tasks_host_offset_and_calls_and_the_first_tasks_command(
    records: Path, tmp_path: Path
) -> None:
    copy = _copy(records, tmp_path / "skewed", markers=True, skewed=True)
    command = ["python3", "/jobs/exchange_ps.py", "--steps", "6"]
    for name, (path, manifest) in _manifests(copy).items():
        manifest["host"] = f"host-of-{name}"
        if name == "ps:0":
            manifest["command"] = command  # the first task's: the job's
            manifest["tensorflow_version"] = "2.99.0"
        path.write_text(json.dumps(manifest))
    trace = assemble_records([copy])
    assert trace.metadata.model == "exchange_ps"
    extra = dict(trace.metadata.extra)
    assert extra["job_command"] == "python3 /jobs/exchange_ps.py --steps 6"
    assert extra["record_hosts"] == (
        "ps:0=host-of-ps:0, worker:0=host-of-worker:0, worker:1=host-of-worker:1"
    )
    assert (trace.metadata.host, trace.metadata.tensorflow_version) == ("host-of-ps:0", "2.99.0")
    alignment = trace.clock_alignment
    assert [(o.task, o.host, o.source) for o in alignment.tasks] == [
        ("ps:0", "host-of-ps:0", "reference"),
        ("worker:0", "host-of-worker:0", "wire"),
        ("worker:1", "host-of-worker:1", "wire"),
    ]
    for found in alignment.tasks[1:]:
        # Reference time = own time + offset: the true offset, within the wire's bounds.
        assert found.lower_ns is not None and found.upper_ns is not None
        assert found.lower_ns <= found.offset_ns <= found.upper_ns
        assert abs(found.offset_ns + OFFSETS[found.task]) < 10_000_000
        assert found.constraints > 0
    # A command without a Python script is named after its program.
    path, manifest = _manifests(copy)["ps:0"]
    manifest["command"] = ["/opt/bin/train", "--steps", "6"]
    path.write_text(json.dumps(manifest))
    assert assemble_records([copy]).metadata.model == "train"


def test_tasks_of_one_boot_share_the_references_clock_and_the_others_are_placed_by_the_wire(
    records: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    aligned = assemble_records([records]).clock_alignment
    assert [(o.task, o.source, o.offset_ns) for o in aligned.tasks] == [
        ("ps:0", "reference", 0), ("worker:0", "shared-clock", 0), ("worker:1", "shared-clock", 0),
    ]  # fmt: skip
    # Worker 0 on the ps's machine, worker 1 on another whose clock is 2.7 s behind.
    monkeypatch.setitem(OFFSETS, "worker:0", 0)
    copy = _copy(records, tmp_path / "two-hosts", markers=True, skewed=True)
    path, manifest = _manifests(copy)["worker:0"]
    manifest["boot_id"] = "host-of-ps:0"
    path.write_text(json.dumps(manifest))
    ps, worker_0, worker_1 = assemble_records([copy]).clock_alignment.tasks
    assert (ps.source, worker_0.source, worker_1.source) == ("reference", "shared-clock", "wire")
    assert worker_0.offset_ns == 0
    assert worker_1.lower_ns is not None and worker_1.upper_ns is not None
    assert worker_1.lower_ns <= 2_700_000_000 <= worker_1.upper_ns


def test_each_clock_not_shared_with_the_reference_is_logged_with_its_bounds_and_calls(
    records: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="absl")
    trace = assemble_records([_copy(records, tmp_path / "skewed", markers=True, skewed=True)])
    expected = [
        f"clock of {o.task}: {o.offset_ns:+d} ns (bounds {o.lower_ns}..{o.upper_ns}, "
        f"{o.constraints} calls)"
        for o in trace.clock_alignment.tasks
        if o.source != "shared-clock"
    ]
    assert len(expected) == 3  # the reference's own and the two the wire placed
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("clock of ")]
    assert logged == expected


def test_a_cluster_the_records_agree_on_but_cannot_be_is_refused_naming_the_manifest(
    records: Path, tmp_path: Path
) -> None:
    copy = _copy(records, tmp_path / "copy", markers=True, skewed=False)
    manifests = _manifests(copy)
    for path, manifest in manifests.values():
        cluster = manifest["cluster"]
        assert isinstance(cluster, dict)
        manifest["cluster"] = {**cluster, "evaluator": []}
        path.write_text(json.dumps(manifest))
    first = manifests["ps:0"][0]
    with pytest.raises(CaptureError) as refused:
        read_records([copy])
    assert str(refused.value) == f"{first}: cluster: job 'evaluator' has no tasks"


def test_the_steps_are_the_driving_tasks_steady_markers_on_the_reference_clock(
    records: Path, tmp_path: Path
) -> None:
    """Worker 0 marks the steps; its clock 3.2 s ahead, each marker moves back onto the
    ps's, and the trace counts from the earliest task's start."""
    copy = _copy(records, tmp_path / "skewed", markers=True, skewed=True)
    manifests = {name: manifest for name, (_, manifest) in _manifests(copy).items()}
    trace = assemble_records([copy])
    offset = {o.task: o.offset_ns for o in trace.clock_alignment.tasks}
    origin = min(
        m["clock"]["start"]["monotonic_ns"] + offset[name]  # type: ignore[index]
        for name, m in manifests.items()
    )
    folders = dict(_task_folders(copy))
    marked = [json.loads(line) for line in (folders["worker:0"] / "steps.jsonl").open()]
    steady = [m for m in marked if m["phase"] == "steady"]
    assert len(steady) == STEPS - 1
    assert [(s.start_ns, s.end_ns) for s in trace.steps] == [
        (m["start_ns"] + offset["worker:0"] - origin, m["end_ns"] + offset["worker:0"] - origin)
        for m in steady
    ]
