"""Step timelines: every RPC a slice on its task's rows, for a trace and for a replay run."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import oracle_samples as oracle
from tf_grpc_bench import trace_files
from tf_grpc_bench.critical_path import captured_critical_paths
from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.protos import xplane_pb2
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    RunMeasurement,
)
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.timeline import (
    ArgValue,
    Group,
    Row,
    Slice,
    Timeline,
    _Replayed,
    chosen_run,
    gaps,
    pack,
    profile_bytes,
    replayed_trace,
    rpc_args,
    rpc_name,
    run_timeline,
    trace_events,
    trace_events_json,
    trace_timeline,
    write_run_timelines,
    write_timeline,
    write_trace_events,
)
from tf_grpc_bench.trace import Rpc, TensorInfo

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


# --------------------------------------------------------------------------
# Each figure and word of a slice, row and file, by value (in this process, where
# mutation testing sees the code run; the command's tests above run it in another).


def test_a_captured_tasks_rows_hold_its_steps_and_calls_with_every_argument() -> None:
    # One worker pulling 21 B then 4 KiB from one ps, each call 1 us from issue to end,
    # its response starting after 0.5 us; calls 2 us apart, steps 10 us apart.
    trace = make_trace(steps=2, workers=1, ps=1, sizes=(21, 4096))
    timeline = trace_timeline(trace, title="toy", steps=None)
    assert timeline.title == "toy"
    worker, ps = timeline.groups
    assert worker.name == "captured /job:worker/task:0" and ps.name == "captured /job:ps/task:0"
    # The ps served but made no call: its steps and no calls row.
    assert [row.name for row in ps.rows] == ["steps"]
    (steps,) = [row for row in worker.rows if row.name == "steps"]
    assert [(s.name, s.start_ns, s.end_ns, s.category, s.args) for s in steps.slices] == [
        ("step 0", 0, 4_000, "step", (("rpcs", 2),)),
        ("step 1", 14_000, 18_000, "step", (("rpcs", 2),)),
    ]
    (calls,) = [row for row in worker.rows if row.name.startswith("calls")]
    assert calls.name == "calls"  # no call overlaps another: one row, not numbered

    def expected(step: int, edge: int, size: int, elements: int) -> tuple[object, ...]:
        return (
            ("caller", "/job:worker/task:0"),
            ("callee", "/job:ps/task:0"),
            ("method", "/tensorflow.WorkerService/RecvTensor"),
            ("request_bytes", 120),
            ("response_bytes", size),
            ("step", step),
            ("tensor", f"edge_{edge}_w"),
            ("dtype", "float32"),
            ("shape", str(elements)),
            ("waited_for_response_ms", 0.0005),
        )

    assert [(s.name, s.start_ns, s.end_ns, s.category, s.args) for s in calls.slices] == [
        ("RecvTensor w", 0, 1_000, "rpc", expected(0, 0, 21, 5)),
        ("RecvTensor w", 2_000, 3_000, "rpc", expected(0, 1, 4096, 1024)),
        ("RecvTensor w", 14_000, 15_000, "rpc", expected(1, 0, 21, 5)),
        ("RecvTensor w", 16_000, 17_000, "rpc", expected(1, 1, 4096, 1024)),
    ]
    # The critical path's slices say their step; an RPC's, everything its call's does.
    (path,) = [row for row in worker.rows if row.name == "critical path"]
    # One pull after another: each is on the path, as far as its end.
    assert [s.end_ns for s in path.slices if s.category == "rpc"] == [1_000, 3_000, 15_000, 17_000]
    by_start = {s.start_ns: s.args for s in calls.slices}
    for item in path.slices:
        if item.category == "compute":
            assert item.name == "compute" and item.args in ((("step", 0),), (("step", 1),))
        else:
            assert item.args == by_start[item.end_ns - 1_000]
    assert {item.args[0] for item in path.slices if item.category == "compute"} == {
        ("step", 0), ("step", 1)
    }  # fmt: skip
    # One step drawn: its two calls and its path; none: no group at all.
    one = trace_timeline(trace, title="toy", steps=1).groups[0]
    assert [s.start_ns for row in one.rows if row.name != "critical path" for s in row.slices] == [
        0, 0, 2_000
    ]  # fmt: skip
    assert {
        dict(s.args)["step"] for row in one.rows for s in row.slices if s.category != "step"
    } == {0}
    assert trace_timeline(trace, title="toy", steps=0).groups == ()


def test_a_call_is_named_by_its_tensor_and_a_scalar_or_tensorless_call_says_so() -> None:
    key = "/job:ps/replica:0/task:0/device:CPU:0;1;/job:worker/replica:0/task:0/device:CPU:0;"
    scalar = Rpc(
        method="/tensorflow.WorkerService/RecvTensor", caller_task=1, callee_task=0,
        request_bytes=100, response_bytes=60, start_ns=10, response_start_ns=2_010,
        end_ns=3_000,
        tensor=TensorInfo(rendezvous_key=key + "edge_12_global_step/edge_3_x;0:0", dtype="int64"),
    )  # fmt: skip
    # Only the leading edge_<n>_ goes; the rest of the edge is the tensor's name.
    assert rpc_name(scalar) == "RecvTensor global_step/edge_3_x"
    trace = make_trace(steps=1, workers=1, ps=1, sizes=(8,))
    args = dict(rpc_args(trace, scalar, 7))
    assert args["shape"] == "scalar" and args["dtype"] == "int64" and args["step"] == 7
    assert args["waited_for_response_ms"] == 0.002
    matrix = dataclasses.replace(
        scalar, tensor=TensorInfo(rendezvous_key="no edge here", shape=(3, 4, 5))
    )
    assert rpc_name(matrix) == "RecvTensor no edge here"
    assert dict(rpc_args(trace, matrix, 0))["shape"] == "3x4x5"
    assert dict(rpc_args(trace, matrix, 0))["tensor"] == "no edge here"
    bare = dataclasses.replace(scalar, method="/tensorflow.WorkerService/GetStatus", tensor=None)
    assert rpc_name(bare) == "GetStatus"
    assert [k for k, _ in rpc_args(trace, bare, 0)] == [
        "caller", "callee", "method", "request_bytes", "response_bytes", "step",
        "waited_for_response_ms",
    ]  # fmt: skip


def test_rows_are_numbered_only_when_calls_overlap_and_a_call_ending_frees_its_row() -> None:
    def span(name: str, start: int, end: int) -> Slice:
        return Slice(name=name, start_ns=start, end_ns=end, category="rpc")

    (row,) = pack("calls", [span("b", 10, 20), span("a", 0, 10)])
    assert row.name == "calls" and [s.name for s in row.slices] == ["a", "b"]
    rows = pack("calls", [span("a", 0, 10), span("b", 5, 15), span("c", 10, 30)])
    assert [(r.name, [s.name for s in r.slices]) for r in rows] == [
        ("calls 1", ["a", "c"]),
        ("calls 2", ["b"]),
    ]
    assert pack("calls", []) == ()
    # Taken by start, not by end: by end, (0, 5) and (3, 7) would leave (6, 10) a third row.
    rows = pack("calls", [span("a", 6, 10), span("b", 0, 5), span("c", 7, 9), span("d", 3, 7)])
    assert [(r.name, [s.name for s in r.slices]) for r in rows] == [
        ("calls 1", ["b", "a"]),
        ("calls 2", ["d", "c"]),
    ]


def test_gaps_are_cut_at_the_window_whatever_the_spans_reach() -> None:
    def cut(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        row = gaps("idle", "wait", spans, within=(0, 100))
        assert row.name == "idle"
        assert all(s.name == "idle" and s.category == "wait" for s in row.slices)
        return [(s.start_ns, s.end_ns) for s in row.slices]

    assert cut([]) == [(0, 100)]
    assert cut([(-10, -5)]) == [(0, 100)]
    assert cut([(150, 160)]) == [(0, 100)]
    assert cut([(-5, 10), (90, 200)]) == [(10, 90)]
    assert cut([(0, 100)]) == []
    assert cut([(0, 40), (40, 100)]) == []
    assert cut([(20, 30), (0, 50), (60, 100)]) == [(50, 60)]


def _synthetic(samples: list[CallSample], **parameters: str) -> BenchmarkResult:
    return BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY,
        workload="synthetic",
        parameters=dict(parameters),
        runs=(RunMeasurement(run_index=0, duration_ns=10**9, samples=tuple(samples)),),
    )


def test_a_synthetic_replay_draws_its_first_500_calls_per_worker_and_the_gaps_between() -> None:
    # Worker 1 calls ps 3 every 100 ns from 1000 ns on, each call 50 ns long; 501 calls.
    samples = [
        CallSample(
            start_ns=1_000 + 100 * n,
            latency_ns=50,
            request_bytes=7,
            response_bytes=9,
            payload_bytes=9,
            server_index=3,
            worker_index=1,
            release_lag_ns=2_000,
        )
        for n in range(501)
    ]
    (group,) = run_timeline(_synthetic(samples[::-1]), "p2p-latency", None, steps=1).groups
    assert group.name == "replayed worker 1"
    steps, idle, calls = group.rows
    assert (steps.name, idle.name, calls.name) == ("steps", "no call in flight", "calls")
    (step,) = steps.slices
    assert (step.name, step.start_ns, step.end_ns, step.args) == (
        "calls",
        0,
        49_950,
        (("calls", 500),),
    )
    assert [(s.start_ns, s.end_ns) for s in idle.slices] == [
        (100 * n + 50, 100 * n + 100) for n in range(499)
    ]
    assert len(calls.slices) == 500
    last = calls.slices[-1]
    assert (last.name, last.start_ns, last.end_ns) == ("call 9 B", 49_900, 49_950)
    assert last.args == (
        ("server", "ps 3"), ("request_bytes", 7), ("response_bytes", 9),
        ("latency_ms", 0.00005), ("release_lag_us", 2.0), ("step", -1), ("rpc_index", -1),
    )  # fmt: skip
    # A pair names the worker and the server.
    pair = "/job:worker/task:1->/job:ps/task:0"
    first = [dataclasses.replace(s, worker_index=0, server_index=0) for s in samples[:2]]
    (group,) = run_timeline(_synthetic(first, pair=pair), "p2p", None).groups
    assert group.name == "replayed /job:worker/task:1"
    assert dict(group.rows[-1].slices[0].args)["server"] == "ps 0"  # no server_tasks given
    named = _synthetic(first, pair=pair, server_tasks="/job:ps/task:0")
    assert dict(run_timeline(named, "p2p", None).groups[0].rows[-1].slices[0].args)["server"] == (
        "/job:ps/task:0"
    )
    assert run_timeline(named, "p2p", None).title == "p2p: captured and replayed steps"


def test_the_run_drawn_is_the_one_asked_for_or_the_first_with_calls() -> None:
    def run(index: int, calls: int) -> RunMeasurement:
        samples = tuple(
            CallSample(start_ns=n, latency_ns=1, request_bytes=1, response_bytes=1,
                       payload_bytes=1)
            for n in range(calls)
        )  # fmt: skip
        return RunMeasurement(run_index=index, duration_ns=10**9, samples=samples)

    result = BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY, workload="synthetic", parameters={},
        runs=(run(0, 0), run(1, 2), run(2, 3)),
    )  # fmt: skip
    assert chosen_run(result, None).run_index == 1
    assert chosen_run(result, 2).run_index == 2
    with pytest.raises(ResultError, match=r"^p2p-latency: no measured calls to draw$"):
        chosen_run(result, 0)
    with pytest.raises(ResultError, match=r"^--run 7: no such run \(runs: 0, 1, 2\)$"):
        chosen_run(result, 7)
    empty = dataclasses.replace(result, runs=(run(0, 0),))
    with pytest.raises(ResultError, match=r"^p2p-latency: no measured calls to draw$"):
        chosen_run(empty, None)
    with pytest.raises(ResultError, match=r"^--run 3: no such run \(runs: 0\)$"):
        chosen_run(empty, 3)


def _two_groups() -> Timeline:
    def item(name: str, start: int, end: int, *args: tuple[str, ArgValue]) -> Slice:
        return Slice(name=name, start_ns=start, end_ns=end, category="rpc", args=args)

    first = Group(
        name="g1",
        rows=(
            Row(name="r1", slices=(item("s", 1_500, 4_000, ("a", 1), ("b", "x")),)),
            Row(name="r2", slices=(item("t", 0, 2_000, ("c", 2.5), ("d", True)),
                                   item("s", 3_000, 3_001))),
        ),
    )  # fmt: skip
    second = Group(name="g2", rows=(Row(name="r", slices=(item("u", 7, 9, ("a", 3)),)),))
    return Timeline(title="two", groups=(first, second))


def test_trace_events_are_a_process_per_group_a_thread_per_row_in_microseconds() -> None:
    def meta(pid: int, name: str, value: object, tid: int = 0) -> dict[str, object]:
        key = "name" if name.endswith("_name") else "sort_index"
        where = {"pid": pid, "tid": tid} if tid else {"pid": pid}
        return {"ph": "M", **where, "name": name, "args": {key: value}}

    def x(
        pid: int, tid: int, name: str, ts: float, dur: float, **args: object
    ) -> dict[str, object]:
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": "rpc", "ts": ts,
                "dur": dur, "args": args}  # fmt: skip

    expected = {
        "traceEvents": [
            meta(1, "process_name", "g1"), meta(1, "process_sort_index", 1),
            meta(1, "thread_name", "r1", 1), meta(1, "thread_sort_index", 1, 1),
            x(1, 1, "s", 1.5, 2.5, a=1, b="x"),
            meta(1, "thread_name", "r2", 2), meta(1, "thread_sort_index", 2, 2),
            x(1, 2, "t", 0.0, 2.0, c=2.5, d=True), x(1, 2, "s", 3.0, 0.001),
            meta(2, "process_name", "g2"), meta(2, "process_sort_index", 2),
            meta(2, "thread_name", "r", 1), meta(2, "thread_sort_index", 1, 1),
            x(2, 1, "u", 0.007, 0.002, a=3),
        ],
        "displayTimeUnit": "ms",
        "otherData": {"title": "two", "written_by": "tf-grpc-bench"},
    }  # fmt: skip
    timeline = _two_groups()
    assert trace_events(timeline) == expected
    assert json.loads(trace_events_json(timeline)) == expected
    stream = io.BytesIO()
    write_trace_events(timeline, stream)
    assert json.loads(stream.getvalue()) == expected
    assert stream.getvalue() == trace_events_json(timeline).encode()  # compact, as one dump


def test_the_profile_has_a_plane_per_group_a_line_per_row_and_typed_stats() -> None:
    space = xplane_pb2.XSpace.FromString(profile_bytes(_two_groups(), "host"))
    assert list(space.hostnames) == ["host"]
    assert [(p.id, p.name) for p in space.planes] == [
        (0, "/device:CUSTOM:0 g1"), (1, "/device:CUSTOM:1 g2"),
    ]  # fmt: skip
    first, second = space.planes
    assert [(n.id, n.display_id, n.name, n.display_name, n.timestamp_ns) for n in first.lines] == [
        (0, 0, "r1", "r1", 0), (1, 1, "r2", "r2", 0),
    ]  # fmt: skip
    # Event names by metadata: one id per name within a plane, from 1.
    assert {k: (m.id, m.name) for k, m in first.event_metadata.items()} == {
        1: (1, "s"), 2: (2, "t"),
    }  # fmt: skip
    assert {k: (m.id, m.name) for k, m in second.event_metadata.items()} == {1: (1, "u")}
    events = [(e.metadata_id, e.offset_ps, e.duration_ps) for n in first.lines for e in n.events]
    assert events == [(1, 1_500_000, 2_500_000), (2, 0, 2_000_000), (1, 3_000_000, 1_000)]
    assert {k: (m.id, m.name) for k, m in first.stat_metadata.items()} == {
        1: (1, "a"), 2: (2, "b"), 3: (3, "c"), 4: (4, "d"),
    }  # fmt: skip
    stats = [
        (s.metadata_id, s.WhichOneof("value"), getattr(s, s.WhichOneof("value") or "str_value"))
        for n in first.lines for e in n.events for s in e.stats
    ]  # fmt: skip
    assert stats == [
        (1, "int64_value", 1), (2, "str_value", "x"), (3, "double_value", 2.5),
        (4, "str_value", "True"),
    ]  # fmt: skip
    (u,) = second.lines[0].events
    assert [(s.metadata_id, s.int64_value) for s in u.stats] == [(1, 3)]


def test_a_timeline_is_written_as_trace_events_and_as_the_profile_tabs_profile(
    tmp_path: Path,
) -> None:
    timeline = _two_groups()
    events = tmp_path / "timeline" / "two.trace.json"
    written = write_timeline(
        timeline, events_path=events, tensorboard_run=tmp_path / "two", host="two"
    )
    profile = tmp_path / "two" / "plugins" / "profile" / "timeline" / "two.xplane.pb"
    assert written == (events, profile)
    assert json.loads(events.read_text())["otherData"] == {
        "title": "two", "written_by": "tf-grpc-bench"
    }  # fmt: skip
    assert profile.read_bytes() == profile_bytes(timeline, "two")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(ResultError, match=r"a-file/x\.trace\.json: cannot write timeline \("):
        write_timeline(timeline, events_path=blocked / "x.trace.json", tensorboard_run=tmp_path,
                       host="h")  # fmt: skip
    with pytest.raises(ResultError, match=r"a-file/plugins/profile/timeline/h\.xplane\.pb: "
                       r"cannot write profile \("):  # fmt: skip
        write_timeline(timeline, events_path=tmp_path / "x.trace.json", tensorboard_run=blocked,
                       host="h")  # fmt: skip


def test_a_run_directory_gets_a_timeline_per_benchmark_with_calls(tmp_path: Path) -> None:
    document = oracle.documents()[0]
    trace = oracle.boundary_trace()
    assert document.labels == ("p2p-latency", "p2p-bandwidth", "ps-throughput")
    written = write_run_timelines(
        document, tmp_path, trace, labels=["ps-throughput", "p2p-latency"]
    )
    assert written == [
        tmp_path / "timeline" / "p2p-latency.trace.json",
        tmp_path / "p2p-latency" / "plugins" / "profile" / "timeline" / "p2p-latency.xplane.pb",
        tmp_path / "timeline" / "ps-throughput.trace.json",
        tmp_path / "ps-throughput" / "plugins" / "profile" / "timeline" / "ps-throughput.xplane.pb",
    ]
    data = json.loads(written[2].read_text())
    assert data["otherData"]["title"] == "ps-throughput: captured and replayed steps"
    # The replay's default two steps a worker: the first run's samples of those steps.
    run = document.benchmarks[2].runs[0]
    replayed = {
        e["pid"]
        for e in data["traceEvents"]
        if e["name"] == "process_name" and e["args"]["name"].startswith("replayed")
    }
    calls = [e for e in data["traceEvents"] if e["ph"] == "X" and e["pid"] in replayed
             and e["cat"] == "rpc"]  # fmt: skip
    kept = 0
    for worker in (0, 1):
        mine = sorted((s for s in run.samples if s.worker_index == worker),
                      key=lambda s: (s.start_ns, s.rpc_index))  # fmt: skip
        order = list(dict.fromkeys(s.step for s in mine))[:2]
        kept += sum(1 for s in mine if s.step in order)
    assert len(calls) == kept
    everything = write_run_timelines(document, tmp_path / "all", trace, steps=None)
    assert len(everything) == 6
    with pytest.raises(ResultError, match=r"^--benchmark a,nope: not in this run \(it has "
                       r"p2p-latency, p2p-bandwidth, ps-throughput\)$"):  # fmt: skip
        write_run_timelines(document, tmp_path, trace, labels=["nope", "a", "p2p-latency"])
    # A benchmark without measured calls is left out.
    empty = dataclasses.replace(
        document.benchmarks[0],
        runs=tuple(dataclasses.replace(r, samples=()) for r in document.benchmarks[0].runs),
    )
    quiet = dataclasses.replace(document, benchmarks=(empty, *document.benchmarks[1:]))
    assert [p.name for p in write_run_timelines(quiet, tmp_path / "q", trace)] == [
        "p2p-bandwidth.trace.json", "p2p-bandwidth.xplane.pb",
        "ps-throughput.trace.json", "ps-throughput.xplane.pb",
    ]  # fmt: skip


def test_the_trace_a_run_replayed_is_found_by_its_hash_or_asked_for(tmp_path: Path) -> None:
    document = oracle.documents()[0]
    trace = make_trace(steps=2, workers=1, ps=1)
    path = tmp_path / "toy.tfgbtrace"
    trace_files.write_trace(trace, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    info = dataclasses.replace(document.trace, path=str(path), sha256=digest)
    recorded = dataclasses.replace(document, trace=info)
    assert replayed_trace(dataclasses.replace(document, trace=None)) is None
    found = replayed_trace(recorded)
    assert found is not None and [len(s.rpcs) for s in found.steps] == [3, 3]
    copy = tmp_path / "copy.tfgbtrace"
    copy.write_bytes(path.read_bytes())
    assert replayed_trace(recorded, copy) is not None
    other = tmp_path / "other.tfgbtrace"
    trace_files.write_trace(make_trace(steps=1, workers=1, ps=1), other)
    with pytest.raises(
        ResultError,
        match=rf"^--trace {other}: not the trace the run replayed \(sha256 {digest[:12]}\.\.\.\)$",
    ):
        replayed_trace(recorded, other)
    path.unlink()
    with pytest.raises(
        ResultError,
        match=rf"^the run replayed {path} \(sha256 {digest[:12]}\.\.\.\), which is no longer "
        r"there; give it with --trace$",
    ):
        replayed_trace(recorded)


def _pulls(samples: list[tuple[int, int, int, int]], **parameters: str) -> BenchmarkResult:
    """A trace replay's result: (worker, step, rpc index, start) per call, each 100 ns long,
    to ps 0, from run 0; a second run has one call of step 1."""
    calls = tuple(
        CallSample(
            start_ns=start,
            latency_ns=100,
            request_bytes=120,
            response_bytes=21,
            payload_bytes=120,
            server_index=0,
            worker_index=worker,
            step=step,
            rpc_index=index,
        )
        for worker, step, index, start in samples
    )
    late = CallSample(
        start_ns=5, latency_ns=100, request_bytes=120, response_bytes=21, payload_bytes=120,
        step=1, rpc_index=0,
    )  # fmt: skip
    return BenchmarkResult(
        benchmark=Benchmark.PS_THROUGHPUT,
        workload="trace",
        parameters=dict(parameters),
        runs=(
            RunMeasurement(run_index=0, duration_ns=10**9, samples=calls),
            RunMeasurement(run_index=1, duration_ns=10**9, samples=(late,)),
        ),
    )


def test_a_replay_from_step_0_is_drawn_step_by_step_with_the_gaps_of_every_step(
    tmp_path: Path,
) -> None:
    # make_trace: ps 0 and 1, workers 0 and 1 (tasks 2, 3); three pulls a worker and ps.
    trace = make_trace(steps=3, workers=2, ps=2)
    result = _pulls(
        [(0, 0, 0, 1_000), (0, 0, 1, 1_200), (0, 1, 0, 2_000), (0, 2, 0, 3_000)],
        client_tasks="/job:worker/task:0", server_tasks="/job:ps/task:0",
    )  # fmt: skip
    drawn = run_timeline(result, "ps-throughput", trace, steps=2)
    by_name = {g.name: g for g in drawn.groups}
    # The captured tasks are the replay's: worker 0 and ps 0, their calls to each other.
    assert {"captured /job:worker/task:0", "captured /job:ps/task:0"} <= set(by_name)
    assert "captured /job:ps/task:1" not in by_name
    captured_calls = [s for row in by_name["captured /job:worker/task:0"].rows
                      if row.name.startswith("calls")
                      for s in row.slices]  # fmt: skip
    assert {dict(s.args)["callee"] for s in captured_calls} == {"/job:ps/task:0"}
    assert len(captured_calls) == 6  # two steps, three pulls from ps 0 each
    replayed = drawn.groups[-1]
    steps, idle, calls = replayed.rows
    assert [(s.name, s.start_ns, s.end_ns, s.category) for s in steps.slices] == [
        ("replayed step 0", 0, 300, "step"),
        ("replayed step 1", 1_000, 1_100, "step"),
    ]
    # Between the calls of both steps drawn, not just the last one's.
    assert [(s.start_ns, s.end_ns, s.category) for s in idle.slices] == [
        (100, 200, "idle"), (300, 1_000, "idle"),
    ]  # fmt: skip
    assert [s.name for s in calls.slices] == ["RecvTensor w"] * 3
    # Every step when told so; the run asked for.
    every = run_timeline(result, "ps-throughput", trace, steps=None).groups[-1]
    assert [s.name for s in every.rows[0].slices] == [f"replayed step {n}" for n in (0, 1, 2)]
    other = run_timeline(result, "ps-throughput", trace, run_index=1).groups[-1]
    assert [(s.name, s.start_ns) for s in other.rows[0].slices] == [("replayed step 1", 0)]
    document = dataclasses.replace(oracle.documents()[0], benchmarks=(result,))
    events, _ = write_run_timelines(document, tmp_path, trace, steps=1, run_index=1)
    data = json.loads(events.read_text())
    steps_drawn = [e["name"] for e in data["traceEvents"] if e.get("cat") == "step"]
    # One step of the trace (worker 0's, ps 0's); the step of run 1's one call.
    assert [n for n in steps_drawn if n.startswith("replayed")] == ["replayed step 1"]
    assert steps_drawn.count("step 0") >= 2 and "step 1" not in steps_drawn


def test_a_pairs_timeline_draws_both_ends_and_a_synthetic_one_no_captured_task() -> None:
    trace = make_trace(steps=2, workers=2, ps=2)
    pair = _pulls([(0, 0, 0, 0)], pair="/job:worker/task:1->/job:ps/task:1")
    names = [g.name for g in run_timeline(pair, "p2p", trace).groups]
    assert {"captured /job:worker/task:1", "captured /job:ps/task:1"} <= set(names)
    assert "captured /job:ps/task:0" not in names and names[-1] == "replayed /job:worker/task:1"
    # Tasks the trace does not have: every captured task.
    elsewhere = _pulls([(0, 0, 0, 0)], client_tasks="/job:worker/task:7")
    assert len(run_timeline(elsewhere, "p2p", trace).groups) == 5
    synthetic = dataclasses.replace(pair, workload="synthetic")
    assert [g.name for g in run_timeline(synthetic, "p2p", trace).groups] == [
        "replayed /job:worker/task:1"
    ]


def test_workers_come_first_then_ps_then_every_other_job() -> None:
    trace = make_trace(steps=1, workers=1, ps=2)
    tasks = (dataclasses.replace(trace.tasks[0], job="chief"), *trace.tasks[1:])
    renamed = dataclasses.replace(trace, tasks=tasks)
    assert [g.name for g in trace_timeline(renamed, title="t").groups] == [
        "captured /job:worker/task:0", "captured /job:ps/task:1", "captured /job:chief/task:0",
    ]  # fmt: skip


def test_a_call_the_trace_cannot_name_is_drawn_by_its_size_and_server_number() -> None:
    trace = make_trace(steps=1, workers=1, ps=1, sizes=(21, 4096))
    named = _Replayed(trace=trace, clients=[], servers=["/job:ps/task:0"], origin=0)
    bare = CallSample(
        start_ns=0, latency_ns=1, request_bytes=120, response_bytes=9, payload_bytes=120,
        server_index=1, step=0, rpc_index=2,
    )  # fmt: skip
    for sample in (
        bare,  # past the step's two RPCs, to a server past the list
        dataclasses.replace(bare, rpc_index=-1),  # a synthetic call, though step 0 exists
        dataclasses.replace(bare, step=5, rpc_index=0),  # a step the trace lacks
    ):
        drawn = named.slice(sample)
        assert drawn.name == "call 120 B"
        assert dict(drawn.args)["server"] == "ps 1" and "replayed_as" not in dict(drawn.args)
    untraced = _Replayed(trace=None, clients=[], servers=[], origin=0)
    assert untraced.slice(dataclasses.replace(bare, rpc_index=0)).name == "call 120 B"
    # A traced call to a server past the list is a pull.
    args = dict(named.slice(dataclasses.replace(bare, rpc_index=1)).args)
    assert args["replayed_as"] == "pull" and args["server"] == "ps 1"
    # One call drawn: its step, however few.
    (group,) = run_timeline(_synthetic([dataclasses.replace(bare, step=-1, rpc_index=-1)]),
                            "p2p", None).groups  # fmt: skip
    assert [s.name for s in group.rows[0].slices] == ["calls"]
    result = BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY, workload="synthetic", parameters={}, runs=()
    )
    with pytest.raises(ResultError, match=r"^--run 0: no such run \(runs: none\)$"):
        chosen_run(result, 0)


def test_a_run_of_a_shipped_trace_finds_it_when_its_recorded_path_is_gone() -> None:
    shipped = trace_files.shipped_trace_path("resnet50-tf2ps.tfgbtrace")
    document = oracle.documents()[0]
    info = dataclasses.replace(
        document.trace,  # type: ignore[type-var]
        path="/nonexistent/resnet50-tf2ps.tfgbtrace",
        sha256=hashlib.sha256(shipped.read_bytes()).hexdigest(),
    )
    found = replayed_trace(dataclasses.replace(document, trace=info))
    assert found is not None and found.metadata == trace_files.read_trace(shipped).metadata


def test_a_replays_captured_groups_are_the_tasks_it_played_and_no_other_workers_path() -> None:
    # Every worker of the trace has a critical path; only the tasks played are drawn.
    trace = make_trace(steps=2, workers=2, ps=2)
    pair = _pulls([(0, 0, 0, 0)], pair="/job:worker/task:1->/job:ps/task:1")
    assert [g.name for g in run_timeline(pair, "p2p", trace).groups] == [
        "captured /job:worker/task:1", "captured /job:ps/task:1", "replayed /job:worker/task:1",
    ]  # fmt: skip
    played = _pulls(
        [(0, 0, 0, 0)], client_tasks="/job:worker/task:0", server_tasks="/job:ps/task:0,"
    )
    drawn = run_timeline(played, "ps-throughput", trace)
    assert [g.name for g in drawn.groups] == [
        "captured /job:worker/task:0", "captured /job:ps/task:0", "replayed /job:worker/task:0",
    ]  # fmt: skip
    assert [row.name for row in drawn.groups[0].rows] == ["steps", "critical path", "calls"]


def test_a_what_if_runs_timeline_names_its_calls_in_the_trace_derived_for_it(
    tmp_path: Path,
) -> None:
    """A what-if replay of 2 workers from a capture of 1: its calls index the derived
    trace's RPCs, where worker 1 makes the captured worker's pulls beside worker 0."""
    from tf_grpc_bench.replay.core.whatif import Derivation

    path = tmp_path / "toy.tfgbtrace"
    trace_files.write_trace(make_trace(steps=2, workers=1, ps=1), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    document = oracle.documents()[0]
    info = dataclasses.replace(document.trace, path=str(path), sha256=digest)  # type: ignore[type-var]
    what_if = Derivation(
        workers=2, ps=1, placement="round-robin", scale_tensors=1.0, trace="toy",
        captured_workers=1, captured_ps=1, variables=3,
    )  # fmt: skip
    trace = replayed_trace(dataclasses.replace(document, trace=info, what_if=what_if))
    assert trace is not None
    assert [(t.job, t.index) for t in trace.tasks] == [("ps", 0), ("worker", 0), ("worker", 1)]
    pulls = [(1, 21), (2, 21), (1, 4096), (2, 4096), (1, 1 << 20), (2, 1 << 20)]
    assert [[(r.caller_task, r.response_bytes) for r in s.rpcs] for s in trace.steps] == [
        pulls,
        pulls,
    ]
    result = _pulls(
        [(1, 0, 1, 1_000), (1, 0, 5, 1_500)],
        client_tasks="/job:worker/task:1", server_tasks="/job:ps/task:0",
    )  # fmt: skip
    drawn = run_timeline(result, "ps-throughput", trace)
    assert [g.name for g in drawn.groups] == [
        "captured /job:worker/task:1", "captured /job:ps/task:0", "replayed worker 1",
    ]  # fmt: skip
    calls = [
        dict(s.args)
        for g in drawn.groups
        if g.name == "replayed worker 1"
        for r in g.rows
        for s in r.slices
        if s.category == "rpc"
    ]
    assert [(c["trace_caller"], c["trace_response_bytes"]) for c in calls] == [
        ("/job:worker/task:1", 21),
        ("/job:worker/task:1", 1 << 20),
    ]
