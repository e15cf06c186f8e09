"""Step timelines: every RPC a slice on its task's rows, for a trace and for a replay run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tf_grpc_bench import trace_files
from tf_grpc_bench.critical_path import captured_critical_paths
from tf_grpc_bench.protos import xplane_pb2
from tf_grpc_bench.replay.core.measurement import CallSample
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.timeline import (
    Slice,
    _Replayed,
    gaps,
    pack,
    profile_bytes,
    trace_events,
    trace_timeline,
)

from .conftest import make_trace

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))


def _run(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *arguments], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def _slices(group: Any, prefix: str) -> list[Slice]:
    return [s for row in group.rows if row.name.startswith(prefix) for s in row.slices]


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=60))
def test_pack_needs_as_many_rows_as_calls_overlap_and_rows_never_overlap(
    spans: list[tuple[int, int]],
) -> None:
    slices = [
        Slice(name=str(n), start_ns=start, end_ns=start + length, category="rpc")
        for n, (start, length) in enumerate(spans)
    ]
    rows = pack("calls", slices)
    assert sorted(s.name for row in rows for s in row.slices) == sorted(s.name for s in slices)
    for row in rows:
        for before, after in zip(row.slices, row.slices[1:], strict=False):
            assert before.end_ns <= after.start_ns
    # As many rows as the most slices that overlap at one instant: slices are [start, end);
    # a zero-length one sits at its instant after what ends there and before what starts
    # there, so it overlaps only what is open across it, and no other zero-length one.
    most = 0
    for instant in {s.start_ns for s in slices}:
        covering = sum(1 for s in slices if s.start_ns <= instant < s.end_ns)
        across = sum(1 for s in slices if s.start_ns < instant < s.end_ns)
        point = any(s.start_ns == s.end_ns == instant for s in slices)
        most = max(most, covering, across + point)
    assert len(rows) == most


def test_gaps_are_what_no_call_covers() -> None:
    row = gaps("idle", "idle", [(10, 20), (15, 30), (50, 60)], within=(0, 100))
    assert [(s.start_ns, s.end_ns) for s in row.slices] == [(0, 10), (30, 50), (60, 100)]


def test_every_rpc_of_the_drawn_steps_is_a_slice_on_its_callers_rows() -> None:
    trace = make_trace(steps=3, workers=2, ps=2)
    timeline = trace_timeline(trace, title="toy", steps=2)
    by_name = {group.name: group for group in timeline.groups}
    assert list(by_name) == [
        "captured /job:worker/task:0",
        "captured /job:worker/task:1",
        "captured /job:ps/task:0",
        "captured /job:ps/task:1",
    ]
    origin = trace.steps[0].start_ns
    for task in range(len(trace.tasks)):
        group = by_name[f"captured {trace.task_name(task)}"]
        expected = sorted(
            (rpc.start_ns - origin, rpc.end_ns - origin)
            for step in trace.steps[:2]
            for rpc in step.rpcs
            if rpc.caller_task == task
        )
        calls = _slices(group, "calls")
        assert sorted((s.start_ns, s.end_ns) for s in calls) == expected
        steps = _slices(group, "steps")
        assert [s.name for s in steps] == ["step 0", "step 1"]
    call = _slices(by_name["captured /job:worker/task:1"], "calls")[0]
    args = dict(call.args)
    assert call.name == "RecvTensor w"
    assert args["caller"] == "/job:worker/task:1" and args["callee"].startswith("/job:ps/")
    assert args["tensor"] == "edge_0_w" and args["dtype"] == "float32"
    assert args["response_bytes"] == 21 and args["request_bytes"] == 120


def test_a_captured_workers_critical_path_row_adds_up_to_its_compute() -> None:
    trace = trace_files.read_trace(trace_files.default_trace_path())
    timeline = trace_timeline(trace, title="resnet50", steps=1)
    worker = next(g for g in timeline.groups if g.name == "captured /job:worker/task:0")
    path = _slices(worker, "critical path")
    compute = sum(s.end_ns - s.start_ns for s in path if s.category == "compute")
    (expected,) = [
        p for step, task, p in captured_critical_paths(trace)
        if step == trace.steps[0].index and task == "/job:worker/task:0"
    ]  # fmt: skip
    assert compute == expected.compute_ns
    transfers = [s for s in path if s.category == "rpc"]
    assert transfers and all(s.name.startswith("RecvTensor ") for s in transfers)
    ps = next(g for g in timeline.groups if g.name == "captured /job:ps/task:0")
    assert not _slices(ps, "critical path")  # the dependency model is per worker


def test_trace_event_json_and_profile_carry_every_slice() -> None:
    trace = make_trace(steps=2, workers=1, ps=2)
    timeline = trace_timeline(trace, title="toy", steps=None)
    data = trace_events(timeline)
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]  # type: ignore[index, union-attr]
    assert len(slices) == timeline.slice_count
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}  # type: ignore[index, union-attr]
    assert names == {g.name for g in timeline.groups}
    space = xplane_pb2.XSpace.FromString(profile_bytes(timeline, "toy"))
    assert [p.name for p in space.planes] == [
        f"/device:CUSTOM:{n} {g.name}" for n, g in enumerate(timeline.groups)
    ]
    events = [e for p in space.planes for line in p.lines for e in line.events]
    assert len(events) == timeline.slice_count
    plane = space.planes[0]
    first = plane.lines[-1].events[0]
    assert plane.event_metadata[first.metadata_id].name.startswith("RecvTensor")
    stats = {plane.stat_metadata[s.metadata_id].name: s for s in first.stats}
    assert stats["caller"].str_value == "/job:worker/task:0"


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real replay of a toy trace (2 workers, 2 ps, a pull and a push per pair)."""
    base = tmp_path_factory.mktemp("timeline-run")
    trace_files.write_trace(make_trace(steps=3, workers=2, ps=2), base / "toy.tfgbtrace")
    completed = _run(
        "replay", "toy.tfgbtrace", "--steps", "3", "--runs", "2", "--warmup", "0",
        "--output-dir", "runs", "--quiet", cwd=base,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "timeline: " in completed.stdout
    (path,) = (base / "runs").glob("*/results.json")
    return path.parent


def test_a_replay_draws_each_measured_call_named_by_the_trace_rpc_it_replayed(
    replay_run: Path,
) -> None:
    document = read_document(replay_run / "results.json")
    trace = trace_files.read_trace(replay_run.parent.parent / "toy.tfgbtrace")
    data = json.loads((replay_run / "timeline" / "ps-throughput.trace.json").read_text())
    events = data["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes.values()) == sorted(
        [f"captured /job:{t.job}/task:{t.index}" for t in trace.tasks]
        + ["replayed /job:worker/task:0", "replayed /job:worker/task:1"]
    )
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    replayed = [
        e for e in events
        if e["ph"] == "X" and processes[e["pid"]].startswith("replayed")
        and threads[(e["pid"], e["tid"])].startswith("calls")
    ]  # fmt: skip
    assert document.benchmarks[-1].runs[0].samples
    # Two steps drawn per worker (the default): the first two replayed, the trace's
    # second and third (a replay begins at the middle step), each of their calls once.
    per_step = [len([r for r in step.rpcs if r.caller_task == 2]) for step in trace.steps]
    assert len(replayed) == 2 * (per_step[1] + per_step[2])
    assert {e["args"]["step"] for e in replayed} == {1, 2}
    for event in replayed:
        args = event["args"]
        rpc = trace.steps[args["step"]].rpcs[args["rpc_index"]]
        assert rpc.tensor is not None
        assert event["name"] == f"RecvTensor {rpc.tensor.edge_name.split('_', 2)[2]}"
        assert args["trace_callee"] == trace.task_name(rpc.callee_task)
        assert args["request_bytes"] == rpc.request_bytes
        assert args["response_bytes"] == rpc.response_bytes
        assert args["replayed_as"] == "pull"
    profile = replay_run / "ps-throughput" / "plugins" / "profile" / "timeline"
    assert (profile / "ps-throughput.xplane.pb").stat().st_size > 0


def test_a_call_is_drawn_as_pushed_only_when_its_server_stood_for_the_trace_caller() -> None:
    # A whole-step replay of a tf2-ps trace serves the workers too (stand-ins for
    # the chief's calls), so "the caller is a server" is no test of a reversed call.
    trace = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps.tfgbtrace"))
    servers = ["/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0", "/job:worker/task:1"]
    named = _Replayed(trace=trace, clients=["/job:worker/task:0"], servers=servers, origin=0)
    step = trace.steps[1]
    seen = set()
    for index, rpc in enumerate(step.rpcs):
        caller, callee = trace.task_name(rpc.caller_task), trace.task_name(rpc.callee_task)
        if caller == callee:
            continue
        reversed_call = caller.startswith("/job:ps") and not callee.startswith("/job:ps")
        server = servers.index(caller if reversed_call else callee)
        sample = CallSample(
            start_ns=0, latency_ns=1, request_bytes=rpc.request_bytes,
            response_bytes=rpc.response_bytes,
            payload_bytes=max(rpc.request_bytes, rpc.response_bytes, 1),
            server_index=server, step=step.index, rpc_index=index,
        )  # fmt: skip
        args = dict(named.slice(sample).args)
        expected = "push (the trace's response as request)" if reversed_call else "pull"
        assert args["replayed_as"] == expected, (caller, callee)
        seen.add((caller.split("/")[1], callee.split("/")[1], expected))
    assert ("job:worker", "job:ps", "pull") in seen
    assert ("job:ps", "job:worker", "push (the trace's response as request)") in seen
    assert ("job:chief", "job:worker", "pull") in seen


def test_timeline_command_redraws_a_run_and_draws_a_trace(replay_run: Path, tmp_path: Path) -> None:
    before = {p: p.read_bytes() for p in replay_run.rglob("*") if p.is_file()}
    arguments = ("timeline", str(replay_run), "--steps", "all", "--benchmark", "p2p-latency")
    completed = _run(*arguments, "--output-dir", "drawn", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    # Where --output-dir says, in a directory of its own; the run's own files untouched.
    (drawn_run,) = (tmp_path / "drawn").glob(f"*-timeline-{replay_run.name}")
    written = drawn_run.relative_to(tmp_path) / "timeline" / "p2p-latency.trace.json"
    assert f"written: {written}" in completed.stdout
    assert {p: p.read_bytes() for p in replay_run.rglob("*") if p.is_file()} == before
    assert list(drawn_run.glob("p2p-latency/plugins/profile/timeline/*.xplane.pb"))
    # Again: another directory, never over the first.
    assert _run(*arguments, "--output-dir", "drawn", cwd=tmp_path).returncode == 0
    assert len(list((tmp_path / "drawn").glob(f"*-timeline-{replay_run.name}*"))) == 2
    data = json.loads((drawn_run / "timeline" / "p2p-latency.trace.json").read_text())
    steps = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert [e["name"] for e in steps if e["name"].startswith("replayed")] == [
        f"replayed step {n}" for n in (1, 2, 0)
    ]  # in the order replayed: from the middle step on, round to the first
    completed = _run("timeline", "resnet50-tf2ps", "--output-dir", "out", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    (drawn,) = (tmp_path / "out").glob("*-timeline-resnet50-tf2ps/resnet50-tf2ps.trace.json")
    assert json.loads(drawn.read_text())["traceEvents"]
    assert list(drawn.parent.glob("resnet50-tf2ps/plugins/profile/timeline/*.xplane.pb"))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["no-such.tfgbtrace"], "no-such.tfgbtrace: no such trace file"),
        (["resnet50-tf2ps", "--steps", "0"], "--steps '0': expected a number of steps >= 1"),
        (["resnet50-tf2ps", "--run", "1"], "--run applies to a run directory"),
        (["RUN", "--run", "7"], "--run 7: no such run (runs: 0, 1)"),
        (["RUN", "--benchmark", "nope"], "--benchmark nope: not in this run"),
        (["RUN", "--trace", "resnet50-tf2ps"], "not the trace the run replayed"),
    ],
)
def test_timeline_mistakes_get_one_line(
    replay_run: Path, tmp_path: Path, arguments: list[str], message: str
) -> None:
    arguments = [str(replay_run) if a == "RUN" else a for a in arguments]
    if "--trace" in arguments:
        index = arguments.index("--trace") + 1
        arguments[index] = str(trace_files.shipped_trace_path(arguments[index]))
    completed = _run("timeline", *arguments, cwd=tmp_path)
    assert completed.returncode != 0
    assert message in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr


def test_a_run_whose_trace_moved_asks_for_it(replay_run: Path, tmp_path: Path) -> None:
    moved = tmp_path / "run"
    moved.mkdir()
    text = (replay_run / "results.json").read_text()
    document = json.loads(text)
    document["trace"]["path"] = str(tmp_path / "gone.tfgbtrace")
    (moved / "results.json").write_text(json.dumps(document))
    completed = _run("timeline", str(moved), cwd=tmp_path)
    assert completed.returncode != 0
    assert "no longer there; give it with --trace" in completed.stderr
    original = replay_run.parent.parent / "toy.tfgbtrace"
    completed = _run("timeline", str(moved), "--trace", str(original), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
