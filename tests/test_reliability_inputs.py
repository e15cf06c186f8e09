"""Inputs at the edges of what a path, a trace or a JSON file can be: a pipe, a symbolic
link loop, timestamps at the ends of int64, JSON nested past Python's recursion limit,
a directory of run directories, a trace listing far more tasks than it uses.

Each either gives the right result or one line naming the input, never a traceback.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.cli import main
from tf_grpc_bench.errors import TraceError
from tf_grpc_bench.replay.output import timeline
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.trace import MAX_SPAN_NS, MAX_TASKS, Step, Task, Trace

from .conftest import make_trace

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))
#: Deeper than Python's recursion limit lets ``json.loads`` go.
DEEP = "[" * 100_000 + "]" * 100_000


def _run(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *arguments], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str], *, code: int = 2) -> str:
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert status == code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _shifted(trace: Trace, first_ns: int) -> Trace:
    """``trace`` with every timestamp moved so that the earliest is ``first_ns``."""
    shift = first_ns - min(step.start_ns for step in trace.steps)

    def moved(step: Step) -> Step:
        rpcs = tuple(
            dataclasses.replace(
                rpc,
                start_ns=rpc.start_ns + shift,
                response_start_ns=rpc.response_start_ns + shift,
                end_ns=rpc.end_ns + shift,
            )
            for rpc in step.rpcs
        )
        return dataclasses.replace(
            step, start_ns=step.start_ns + shift, end_ns=step.end_ns + shift, rpcs=rpcs
        )

    return dataclasses.replace(trace, steps=tuple(moved(step) for step in trace.steps))


# --------------------------------------------------------------------------
# Traces: what passes validation replays and renders; the rest is refused by it.


def test_a_trace_spanning_past_the_limit_is_refused_by_validation() -> None:
    trace = make_trace(steps=2)
    first, last = trace.steps

    def at(step: Step, first_ns: int) -> Step:
        return _shifted(dataclasses.replace(trace, steps=(step,)), first_ns).steps[0]

    with pytest.raises(TraceError, match="a trace spans at most 30 days"):
        Trace(
            metadata=trace.metadata,
            tasks=trace.tasks,
            steps=(at(first, -(2**63)), at(last, 2**63 - 10**6)),
        )
    # Within the limit, it is a trace.
    span = last.end_ns - last.start_ns
    Trace(
        metadata=trace.metadata,
        tasks=trace.tasks,
        steps=(at(first, 0), at(last, MAX_SPAN_NS - span)),
    )


def test_a_timestamp_past_int64_is_refused_by_validation() -> None:
    trace = make_trace(steps=1)
    with pytest.raises(TraceError, match="is not a 64-bit timestamp"):
        _shifted(trace, 2**63)


@pytest.mark.parametrize("first_ns", [2**63 - 10**7, -(2**63)], ids=["top", "bottom"])
def test_timestamps_at_the_ends_of_int64_replay_recorded_and_render(
    first_ns: int, tmp_path: Path
) -> None:
    trace_files.write_trace(_shifted(make_trace(steps=3), first_ns), tmp_path / "edge.tfgbtrace")
    replayed = _run(
        "replay", "edge.tfgbtrace", "--pacing", "recorded", "--benchmark",
        "p2p-latency,ps-throughput", "--duration", "0.5", "--runs", "1", "--warmup", "0",
        "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    assert "Traceback" not in replayed.stderr
    drawn = _run("timeline", "edge.tfgbtrace", "--output-dir", "drawn", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    (events,) = (tmp_path / "drawn").glob("*/*.trace.json")
    slices = [e for e in json.loads(events.read_text())["traceEvents"] if e["ph"] == "X"]
    assert slices and min(e["ts"] for e in slices) == 0


def test_a_trace_listing_more_tasks_than_the_limit_is_refused(tmp_path: Path) -> None:
    trace = make_trace(steps=1)
    crowd = trace.tasks + tuple(
        Task(job="worker", index=i, address=f"h{i}:1") for i in range(1, MAX_TASKS)
    )
    with pytest.raises(TraceError, match=f"a trace lists at most {MAX_TASKS}"):
        dataclasses.replace(trace, tasks=crowd)


def test_a_timeline_draws_only_the_tasks_with_calls() -> None:
    trace = make_trace(steps=2, workers=1, ps=1)
    idle = tuple(Task(job="worker", index=i, address=f"h{i}:1") for i in range(1, 1000))
    drawn = timeline.trace_timeline(dataclasses.replace(trace, tasks=trace.tasks + idle), title="t")
    assert [g.name for g in drawn.groups] == [
        "captured /job:worker/task:0",
        "captured /job:ps/task:0",
    ]


def test_trace_events_written_one_by_one_are_the_whole_document() -> None:
    drawn = timeline.trace_timeline(make_trace(steps=3, workers=2, ps=2), title="t", steps=None)
    stream = io.BytesIO()
    timeline.write_trace_events(drawn, stream)
    assert stream.getvalue().decode() == timeline.trace_events_json(drawn)


# --------------------------------------------------------------------------
# Paths: a pipe is read once; a symbolic link loop is one line.


def _fifo_fed(path: Path, data: bytes) -> threading.Thread:
    os.mkfifo(path)

    def feed() -> None:
        with path.open("wb") as stream:
            stream.write(data)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    return writer


def test_a_trace_from_a_pipe_is_read_once_and_hashed_from_what_was_read(tmp_path: Path) -> None:
    file = tmp_path / "toy.tfgbtrace"
    trace_files.write_trace(make_trace(steps=2), file)
    pipe = tmp_path / "pipe"
    writer = _fifo_fed(pipe, file.read_bytes())
    first = trace_files.read_trace(pipe)
    writer.join(timeout=10)
    assert trace_files.read_trace(pipe) == first
    assert trace_files.file_sha256(pipe) == trace_files.file_sha256(file)
    assert not trace_files.is_regular_file(pipe)


def test_a_replay_of_a_piped_trace_records_it(tmp_path: Path) -> None:
    trace_files.write_trace(make_trace(steps=2), tmp_path / "toy.tfgbtrace")
    completed = subprocess.run(
        [
            "bash", "-c",
            f"{COMMAND} replay <(cat toy.tfgbtrace) --benchmark p2p-latency --duration 0.3 "
            "--runs 1 --warmup 0 --quiet",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    (path,) = (tmp_path / "runs").glob("*/results.json")
    recorded = read_document(path).trace
    assert recorded is not None
    assert recorded.sha256 == trace_files.file_sha256(tmp_path / "toy.tfgbtrace")
    assert recorded.path.startswith("/dev/fd/")


@pytest.mark.parametrize("name", ["loop", "loop.tfgbtrace"])
@pytest.mark.parametrize("command", ["inspect", "timeline", "replay"])
def test_a_symbolic_link_loop_as_the_trace_is_one_line(
    name: str,
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    os.symlink(name, name)
    err = _one_line_error([command, name], capsys)
    assert f"{name}: cannot read (Too many levels of symbolic links)" in err


# --------------------------------------------------------------------------
# JSON nested past the recursion limit, and directories of runs.


@pytest.mark.parametrize("command", [["timeline"], ["export", "--csv", "tables"]])
@pytest.mark.parametrize("where", ["file", "run directory"])
def test_json_nested_past_the_recursion_limit_is_one_line(
    command: list[str],
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    Path("run/results.json").write_text(DEEP)
    source = "run/results.json" if where == "file" else "run"
    err = _one_line_error([command[0], source, *command[1:]], capsys)
    assert "run/results.json: result document is not valid JSON (nested too deeply" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["capture-job", "--cluster", "@deep.json", "--", "true"],
        ["role", "--cluster", "deep.json", "--task", "ps:0", "--synthetic"],
    ],
    ids=["capture-job", "role"],
)
def test_a_cluster_nested_past_the_recursion_limit_is_one_line(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("deep.json").write_text(DEEP)
    assert "nested too deeply" in _one_line_error(argv, capsys)


def test_a_directory_of_runs_draws_each_and_is_no_export(tmp_path: Path) -> None:
    for _ in range(2):
        completed = _run(
            "replay", "--synthetic", "--benchmark", "p2p-latency", "--duration", "0.3",
            "--runs", "1", "--warmup", "0", "--quiet", "--output-dir", "runs", cwd=tmp_path,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
    runs = sorted(p.parent for p in (tmp_path / "runs").glob("*/results.json"))
    assert len(runs) == 2
    drawn = _run("timeline", "runs", "--output-dir", "drawn", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    for run in runs:
        (directory,) = (tmp_path / "drawn").glob(f"*-timeline-{run.name}")
        assert list((directory / "timeline").glob("*.trace.json")), drawn.stdout
    exported = _run("export", "runs", "--csv", "tables", cwd=tmp_path)
    assert exported.returncode == 2
    assert "holds 2 run directories" in exported.stderr
    assert len(exported.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "tables").exists()


# --------------------------------------------------------------------------
# A partial trace says so wherever it is used.


def test_a_replay_of_a_partial_trace_says_so_in_its_result_and_summary(tmp_path: Path) -> None:
    reason = "the job looks hung: its tasks exchanged nothing for 120 s"
    partial = dataclasses.replace(make_trace(steps=3), partial=True, partial_reason=reason)
    trace_files.write_trace(partial, tmp_path / "partial.tfgbtrace")
    inspected = _run("inspect", "partial.tfgbtrace", cwd=tmp_path)
    assert f"PARTIAL trace: {reason}" in inspected.stdout
    replayed = _run(
        "replay", "partial.tfgbtrace", "--benchmark", "p2p-latency", "--duration", "0.3",
        "--runs", "1", "--warmup", "0", cwd=tmp_path,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    first_line = replayed.stdout.splitlines()[0]
    assert f"PARTIAL trace ({reason})" in first_line
    assert f"partial trace: {reason}" in replayed.stdout
    (path,) = (tmp_path / "runs").glob("*/results.json")
    recorded = read_document(path).trace
    assert recorded is not None and recorded.partial_reason == reason
    whole = _run(
        "replay", "--synthetic", "--benchmark", "p2p-latency", "--duration", "0.3",
        "--runs", "1", "--warmup", "0", cwd=tmp_path,
    )  # fmt: skip
    assert "partial" not in whole.stdout.lower()


def test_an_output_dir_too_long_to_make_leaves_no_directory_behind(tmp_path: Path) -> None:
    too_long = "runs/" + "x" * 300
    completed = _run(
        "replay", "--synthetic", "--duration", "0.2", "--runs", "1", "--output-dir", too_long,
        cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 2
    assert "cannot create a run directory (File name too long)" in completed.stderr
    assert list(tmp_path.iterdir()) == []


def test_network_compare_refuses_a_piped_trace_before_making_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each profile's replay is a process of its own, which a pipe read once cannot feed."""
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "toy.tfgbtrace"
    trace_files.write_trace(make_trace(steps=2), file)
    writer = _fifo_fed(tmp_path / "pipe", file.read_bytes())
    err = _one_line_error(["network", "compare", str(tmp_path / "pipe")], capsys)
    writer.join(timeout=10)
    assert "a pipe cannot feed; give a trace file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "toy.tfgbtrace"]
