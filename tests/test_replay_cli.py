"""``tf-grpc-bench serve`` and ``replay`` as a user runs them: subprocesses, output, exit codes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.wire import ChannelSettings, new_session_id

from .conftest import make_trace

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))
TINY = ["--duration", "0.2", "--warmup", "0", "--runs", "1"]


def _run(*arguments: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _document_from(output: str, cwd: Path) -> results.ResultDocument:
    """The result document whose path the command printed (relative to its cwd)."""
    line = next(line for line in output.splitlines() if line.startswith("results: "))
    return read_document(cwd / line.removeprefix("results: ").strip())


def _results_path(output: str, cwd: Path) -> Path:
    line = next(line for line in output.splitlines() if line.startswith("results: "))
    return cwd / line.removeprefix("results: ").strip()


def test_synthetic_replay_runs_all_three_benchmarks_and_writes_results_and_tensorboard(
    tmp_path: Path,
) -> None:
    completed = _run("replay", "--synthetic", *TINY, "--output-dir", "out", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    document = _document_from(completed.stdout, tmp_path)
    assert [b.benchmark for b in document.benchmarks] == list(Benchmark)
    assert not document.partial
    for result in document.benchmarks:
        run = result.runs[0]
        assert run.server_received_bytes == run.request_bytes > 0
    assert "tensorboard --logdir" in completed.stdout
    logdir = tmp_path / completed.stdout.split("tensorboard --logdir ")[1].split()[0]
    assert logdir == tmp_path / "out"
    run_directory = _results_path(completed.stdout, tmp_path).parent
    assert run_directory.parent == logdir
    for label in document.labels:
        assert list((run_directory / label).glob("events.out.tfevents*"))
    assert "p2p-latency" in completed.stdout  # the table


def test_trace_replay_with_exact_steps_in_serialized_mode(tmp_path: Path) -> None:
    path = tmp_path / "toy.tfgbtrace"
    trace_files.write_trace(make_trace(steps=2, workers=2, ps=2), path)
    completed = _run(
        "replay",
        str(path),
        "--steps",
        "2",
        "--warmup",
        "0",
        "--runs",
        "1",
        "--mode",
        "serialized",
        "--quiet",
        "--output-dir",
        "out",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    document = _document_from(completed.stdout, tmp_path)
    assert document.trace is not None and document.trace.step_count == 2
    throughput = document.benchmarks[-1]
    assert throughput.benchmark is Benchmark.PS_THROUGHPUT
    assert throughput.rpc_count == 2 * 2 * 2 * 3  # steps x workers x ps x tensors
    assert throughput.parameters["mode"] == "serialized"


@pytest.mark.parametrize(
    "pacing",
    [
        ["--pacing", "rate", "--rate", "400", "--duration", "0.3"],
        ["--pacing", "recorded", "--speedup", "2", "--passes", "1"],
    ],
    ids=["rate", "recorded"],
)
def test_trace_replay_under_open_loop_pacing(
    tmp_path: Path, small_trace_file: Path, pacing: list[str]
) -> None:
    completed = _run(
        "replay",
        str(small_trace_file),
        "--benchmark",
        "p2p-bandwidth",
        *pacing,
        "--warmup",
        "0",
        "--runs",
        "1",
        "--quiet",
        "--output-dir",
        "out",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    result = _document_from(completed.stdout, tmp_path).benchmarks[0]
    assert result.parameters["pacing"] == pacing[1]
    run = result.runs[0]
    assert run.server_received_bytes == run.request_bytes > 0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = _free_port()
    process = subprocess.Popen(
        [COMMAND, "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert f"127.0.0.1:{port}" in line, line + process.stderr.read()
        yield process, f"127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def test_serve_answers_a_replay_from_another_process_then_stops_on_sigterm(
    tmp_path: Path, served: tuple[subprocess.Popen[str], str]
) -> None:
    process, target = served
    completed = _run(
        "replay",
        "--synthetic",
        "--benchmark",
        "p2p-latency",
        "--target",
        target,
        *TINY,
        "--quiet",
        "--output-dir",
        "out",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    run = _document_from(completed.stdout, tmp_path).benchmarks[0].runs[0]
    assert run.server_received_messages == run.rpc_count > 0
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    # Stopped like Ctrl-C: one line, the shell's 128 + signal.
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "stopped; received" in out
    assert err == "tf-grpc-bench serve: interrupted (SIGTERM); servers stopped\n"


def test_a_server_that_dies_mid_replay_leaves_partial_results_and_one_error_line(
    tmp_path: Path, served: tuple[subprocess.Popen[str], str]
) -> None:
    process, target = served
    replay = subprocess.Popen(
        [
            COMMAND,
            "replay",
            "--synthetic",
            "--benchmark",
            "p2p-bandwidth",
            "--target",
            target,
            "--duration",
            "60",
            "--warmup",
            "0",
            "--runs",
            "1",
            "--deadline",
            "5",
            "--quiet",
            "--output-dir",
            "out",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Kill the server once it has answered calls of the measured run: the
    # replay's session, another than the observer's, made calls.
    observer = ReplayClient(
        target, mode=Mode.NON_SERIALIZED, settings=ChannelSettings(session=new_session_id())
    )
    try:
        for _ in range(600):
            if observer.stats().other_sessions > 0:
                break
            time.sleep(0.1)
    finally:
        observer.close()
    process.kill()
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == 3
    assert err.count("\n") == 1 and "partial results written" in err and "Traceback" not in err
    document = _document_from(out, tmp_path)
    assert document.partial
    assert document.benchmarks[0].runs[0].rpc_count > 0


def test_serve_on_a_port_in_use_is_one_line_and_exit_3(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        completed = _run("serve", "--host", "127.0.0.1", "--port", str(port), cwd=tmp_path)
    assert completed.returncode == 3
    assert completed.stderr.count("\n") == 1 and str(port) in completed.stderr


@pytest.mark.parametrize(
    ("arguments", "culprit"),
    [
        (["--synthetic", "--runs", "0"], "--runs"),
        (["--synthetic", "--duration", "0"], "--duration"),
        (["--synthetic", "--warmup", "-1"], "--warmup"),
        (["--synthetic", "--ps", "0"], "--ps"),
        (["--synthetic", "--workers", "-2"], "--workers"),
        (["--synthetic", "--buffers", "0"], "--buffers"),
        (["--synthetic", "--small-size", "-5"], "--small-size"),
        (["--synthetic", "--large-size", "20MB"], "--large-size"),
        (["--synthetic", "--categories", "tiny"], "--categories"),
        (["--synthetic", "--generator", "zipf"], "--generator"),
        (["--synthetic", "--target", "nowhere"], "--target"),
        (["--synthetic", "--target", "localhost:99999"], "--target"),
        (["--synthetic", "--pacing", "recorded"], "--pacing recorded"),
        (["--synthetic", "--pacing", "rate"], "--rate"),
        (["--synthetic", "--rate", "5"], "--rate"),
        (["--synthetic", "--steps", "3"], "--steps"),
        (["--synthetic", "--outstanding", "0"], "--outstanding"),
        (["--benchmark", "p2p-everything"], "--benchmark"),
        (["--synthetic", "--seed", "-1"], "--seed"),
        (["--synthetic", "--rpc", "streaming", "--channels", "70"], "--channels"),
        (["--synthetic", "--rpc", "datagram"], "--rpc"),
    ],
)
def test_bad_flags_give_one_line_naming_the_flag_and_a_nonzero_exit(
    tmp_path: Path, arguments: list[str], culprit: str
) -> None:
    completed = _run("replay", *arguments, "--output-dir", "out", cwd=tmp_path, timeout=60)
    assert completed.returncode != 0
    assert completed.stderr.count("\n") == 1, completed.stderr
    assert culprit in completed.stderr and "Traceback" not in completed.stderr
    assert not (tmp_path / "out").exists()


def test_generator_flags_with_a_trace_are_refused(tmp_path: Path, small_trace_file: Path) -> None:
    completed = _run("replay", str(small_trace_file), "--generator", "skew", cwd=tmp_path)
    assert completed.returncode == 2
    assert "--generator" in completed.stderr and completed.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], {"p2p-latency": "unary", "p2p-bandwidth": "streaming", "ps-throughput": "unary"}),
        (
            ["--rpc", "unary"],
            dict.fromkeys(("p2p-latency", "p2p-bandwidth", "ps-throughput"), "unary"),
        ),
        (
            ["--rpc", "streaming", "--mode", "serialized"],
            dict.fromkeys(("p2p-latency", "p2p-bandwidth", "ps-throughput"), "streaming"),
        ),
    ],
    ids=["default", "unary", "streaming-serialized"],
)
def test_each_benchmark_records_the_rpc_kind_it_ran_with_and_every_byte_arrives(
    tmp_path: Path, arguments: list[str], expected: dict[str, str]
) -> None:
    completed = _run("replay", "--synthetic", *TINY, *arguments, "--quiet", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    document = _document_from(completed.stdout, tmp_path)
    assert {r.benchmark.value: r.parameters["rpc"] for r in document.benchmarks} == expected
    for result in document.benchmarks:
        for run in result.runs:
            assert run.server_received_messages == run.rpc_count > 0
            assert run.server_received_bytes == run.request_bytes


def test_streaming_a_trace_is_refused_in_one_line(tmp_path: Path, small_trace_file: Path) -> None:
    completed = _run("replay", str(small_trace_file), "--rpc", "streaming", cwd=tmp_path)
    assert completed.returncode == 2
    assert "--rpc" in completed.stderr and completed.stderr.count("\n") == 1


def test_an_unreachable_target_is_one_line_and_exit_3(tmp_path: Path) -> None:
    completed = _run(
        "replay",
        "--synthetic",
        "--target",
        f"127.0.0.1:{_free_port()}",
        "--connect-timeout",
        "1",
        *TINY,
        "--output-dir",
        "out",
        cwd=tmp_path,
        timeout=60,
    )
    assert completed.returncode == 3
    assert completed.stderr.count("\n") == 1 and "no replay server" in completed.stderr


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated", "corrupt", "not-a-trace"])
def test_bad_trace_files_give_one_line_naming_the_file(
    tmp_path: Path, small_trace_file: Path, damage: str
) -> None:
    path = tmp_path / f"{damage}.tfgbtrace"
    data = small_trace_file.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "corrupt":
        path.write_bytes(data[:20] + bytes(b ^ 0xFF for b in data[20:40]) + data[40:])
    elif damage == "not-a-trace":
        path.write_text("hello")
    completed = _run("replay", str(path), *TINY, "--output-dir", "out", cwd=tmp_path, timeout=60)
    assert completed.returncode == 2
    assert completed.stderr.count("\n") == 1 and str(path) in completed.stderr
    assert "Traceback" not in completed.stderr


def test_replay_does_not_import_tensorflow() -> None:
    code = (
        "import sys; from tf_grpc_bench.replay import cli, runner, throughput; "
        "from tf_grpc_bench.replay.transport import server; "
        "print('tensorflow' in sys.modules)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert completed.stdout.strip() == "False"


def test_a_trace_throughput_replay_paces_by_dependencies_and_predicts_the_step(
    tmp_path: Path,
) -> None:
    path = tmp_path / "toy.tfgbtrace"
    trace_files.write_trace(make_trace(steps=2, workers=2, ps=2), path)
    completed = _run(
        "replay",
        str(path),
        "--benchmark",
        "ps-throughput",
        "--passes",
        "2",
        "--warmup",
        "0",
        "--runs",
        "1",
        "--compute",
        "0.5",
        "--quiet",
        "--output-dir",
        "out",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    (throughput,) = _document_from(completed.stdout, tmp_path).benchmarks
    assert throughput.parameters["pacing"] == "dependencies"
    assert throughput.parameters["compute_scale"] == 0.5
    # Two passes of two steps on each of two workers: a step time and a critical
    # path for each, every call of the trace sent once per pass.
    assert len(throughput.step_times_ns) == len(throughput.step_compute_ns) == 2 * 2 * 2
    pairs = zip(throughput.step_compute_ns, throughput.step_times_ns, strict=True)
    assert all(0 <= compute <= step for compute, step in pairs)
    assert throughput.rpc_count == 2 * 2 * 2 * 2 * 3


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--compute", "fast"], "--compute 'fast': expected 'auto', 'here', 'recorded', 'none'"),
        (["--compute", "-1"], "--compute '-1': a scale must be in [0, 100]"),
        (["--pacing", "asap", "--compute", "none"], "--compute applies only to --pacing dep"),
        (["--synthetic", "--pacing", "dependencies"], "--pacing dependencies needs a trace"),
    ],
)
def test_compute_and_dependency_pacing_misuse_is_one_line(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    path = tmp_path / "toy.tfgbtrace"
    trace_files.write_trace(make_trace(steps=2, workers=2, ps=2), path)
    trace = [] if "--synthetic" in arguments else [str(path), "--benchmark", "ps-throughput"]
    completed = _run("replay", *trace, *arguments, "--quiet", cwd=tmp_path)
    assert completed.returncode == 2, completed.stderr
    assert message in completed.stderr
    assert "Traceback" not in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1


def test_inspect_prints_each_worker_steps_critical_path(tmp_path: Path) -> None:
    completed = _run("inspect", "resnet50-tf2ps", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    start = lines.index(
        "critical path per step and worker (the dependency model, docs/fidelity.md):"
    )
    rows = [line.split() for line in lines[start + 2 :]]
    # Five steady steps, two workers each; step = compute + communication (to 0.1 ms).
    assert len(rows) == 5 * 2
    for _, task, step, compute, communication in rows:
        assert task.startswith("/job:worker/task:")
        assert abs(float(step) - float(compute) - float(communication)) <= 0.2
