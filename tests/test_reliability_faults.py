"""Faults as launchers, terminals and operators cause them: stop signals, kill -9, a frozen server.

Every long-running command stops on SIGTERM and SIGHUP as on Ctrl-C (what it
measured written, marked partial, one line, exit status 128 + signal), and
no process it started outlives it, even when it is killed with SIGKILL and
can clean nothing up.  These tests run the installed command as subprocesses
(signals need real processes) and look for orphans by process id (every
descendant the command had while it ran) and by listening port (``ss``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay import throughput
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.transport import peers
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.wire import ChannelSettings, new_session_id

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))
IDLE_TASK = Path(__file__).parent / "data" / "idle_task.py"


# --------------------------------------------------------------------------
# Processes, ports and waiting.


def _parent_of(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[1])


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever adopted it, counts as gone)."""
    return _parent_of(pid) is not None


def _descendants(*pids: int) -> set[int]:
    """Every live process below any of ``pids`` (one read of /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = _parent_of(int(entry.name))
            if parent is not None:
                parents[int(entry.name)] = parent
    found: set[int] = set()
    frontier = set(pids)
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _listening_ports(pids: set[int]) -> set[int]:
    """TCP ports on which any of ``pids`` listens (``ss -ltnp``)."""
    output = subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    ports = set()
    for line in output.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            ports.add(int(line.split()[3].rpartition(":")[2]))
    return ports


def _listened(ports: set[int]) -> set[int]:
    """Which of ``ports`` anything listens on now."""
    output = subprocess.run(
        ["ss", "-Hltn"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return {int(line.split()[3].rpartition(":")[2]) for line in output.splitlines()} & ports


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` if it never does."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def _free_port(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count < 65536 and all(_bindable(first + i) for i in range(count)):
            return first
    raise AssertionError("no free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; whatever still runs at its end is killed, by pid."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _start(
    started: list[subprocess.Popen[str]], *arguments: str, cwd: Path, **popen: object
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [COMMAND, *arguments],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[arg-type]
    )
    started.append(process)
    return process


def _assert_nothing_left(pids: set[int], ports: set[int]) -> None:
    _wait_for(lambda: not any(_alive(pid) for pid in pids), f"processes {sorted(pids)} to end")
    _wait_for(lambda: not _listened(ports), f"ports {sorted(ports)} to close", timeout_s=30)


def _wait_for_servers(pids: set[int]) -> set[int]:
    """The ports ``pids`` listen on, once any does (a server starting takes a moment)."""
    _wait_for(lambda: bool(_listening_ports(pids)), "a server to listen")
    time.sleep(0.5)  # its siblings too
    return _listening_ports(pids)


def _wait_for_calls(target: str) -> None:
    """Until the replay server at ``target`` has answered another client's calls (it
    may not be up yet): the observer's own session sees other sessions' calls."""
    observer = ReplayClient(
        target, mode=Mode.NON_SERIALIZED, settings=ChannelSettings(session=new_session_id())
    )

    def answered() -> bool:
        try:
            return observer.stats(timeout_s=2).other_sessions > 0
        except TransportError:
            return False

    try:
        _wait_for(answered, f"calls answered by {target}")
    finally:
        observer.close()


def _document(out: str, cwd: Path) -> results.ResultDocument:
    line = next(line for line in out.splitlines() if line.startswith("results: "))
    return read_document(cwd / line.removeprefix("results: ").strip())


# --------------------------------------------------------------------------
# replay


REPLAY = ["--synthetic", "--warmup", "0", "--runs", "2", "--quiet", "--output-dir", "out"]


@pytest.mark.parametrize(
    ("signum", "benchmark", "processes"),
    [
        # PS throughput: 2 servers, 2 worker processes (and multiprocessing's helper).
        (signal.SIGTERM, "ps-throughput", 4),
        (signal.SIGHUP, "p2p-latency", 1),
        (signal.SIGINT, "ps-throughput", 4),
    ],
    ids=["sigterm-throughput", "sighup-latency", "sigint-throughput"],
)
def test_a_stop_signal_keeps_the_interrupted_runs_calls_and_leaves_no_process(
    tmp_path: Path,
    started: list[subprocess.Popen[str]],
    signum: int,
    benchmark: str,
    processes: int,
) -> None:
    flags = ["--ps", "2", "--workers", "2"] if benchmark == "ps-throughput" else []
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", benchmark, *flags, "--duration", "60",
        cwd=tmp_path,
    )  # fmt: skip
    _wait_for(lambda: len(_descendants(replay.pid)) >= processes, "the replay's processes")
    children = _descendants(replay.pid)
    ports = _wait_for_servers(children)
    _wait_for_calls(f"127.0.0.1:{min(ports)}")  # no warm-up: the first measured run
    time.sleep(1)
    replay.send_signal(signum)
    out, err = replay.communicate(timeout=120)
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    assert replay.returncode == 128 + signum, err
    assert err.count("\n") == 1 and f"interrupted ({name}); partial results written" in err
    document = _document(out, tmp_path)
    (result,) = document.benchmarks
    assert document.partial and result.partial
    (run,) = result.runs  # the run under way, with the calls it completed
    assert run.partial and run.partial_reason.startswith("interrupted by")
    assert run.rpc_count > 0 and run.duration_ns > 0
    _assert_nothing_left(children, ports)


#: A stop signal, then more of every kind while the command keeps what it measured:
#: (signal, seconds after the one before).
SIGNAL_BURST = (
    (signal.SIGINT, 0.0),
    (signal.SIGTERM, 0.1),
    (signal.SIGINT, 0.1),
    (signal.SIGHUP, 0.05),
    (signal.SIGTERM, 0.2),
    (signal.SIGINT, 0.3),
)


@pytest.mark.parametrize("benchmark", ["ps-throughput", "p2p-latency"])
def test_more_stop_signals_after_the_first_keep_the_run_and_the_first_decides(
    tmp_path: Path, started: list[subprocess.Popen[str]], benchmark: str
) -> None:
    flags = ["--ps", "2", "--workers", "2"] if benchmark == "ps-throughput" else []
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", benchmark, *flags, "--duration", "60",
        cwd=tmp_path,
    )  # fmt: skip
    processes = 4 if benchmark == "ps-throughput" else 1
    _wait_for(lambda: len(_descendants(replay.pid)) >= processes, "the replay's processes")
    children = _descendants(replay.pid)
    ports = _wait_for_servers(children)
    _wait_for_calls(f"127.0.0.1:{min(ports)}")
    time.sleep(1)
    for signum, after_s in SIGNAL_BURST:
        time.sleep(after_s)
        with contextlib.suppress(ProcessLookupError):
            replay.send_signal(signum)
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == 128 + signal.SIGINT, err
    assert (
        err
        == "tf-grpc-bench replay: interrupted (Ctrl-C); partial results written to "
        + (err.rpartition(" to ")[2])
    )
    (result,) = _document(out, tmp_path).benchmarks
    (run,) = result.runs
    assert run.partial and run.partial_reason == "interrupted by the user (Ctrl-C)"
    assert run.rpc_count > 0
    _assert_nothing_left(children, ports)


def test_a_signal_before_any_call_is_measured_says_so(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", "p2p-latency", "--warmup", "60",
        cwd=tmp_path,
    )  # fmt: skip
    _wait_for(lambda: len(_descendants(replay.pid)) >= 1, "the replay's server")
    (port,) = _wait_for_servers(_descendants(replay.pid))
    _wait_for_calls(f"127.0.0.1:{port}")  # the warm-up has begun
    replay.send_signal(signal.SIGTERM)
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == 128 + signal.SIGTERM, err
    (run,) = _document(out, tmp_path).benchmarks[0].runs
    assert run.rpc_count == 0
    assert run.partial_reason == "interrupted by SIGTERM before run 1 measured any call"


def test_kill_9_of_replay_leaves_no_server_worker_or_helper(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", "ps-throughput", "--ps", "2",
        "--workers", "2", "--duration", "60", cwd=tmp_path,
    )  # fmt: skip
    _wait_for(lambda: len(_descendants(replay.pid)) >= 5, "the replay's processes")
    time.sleep(2)
    children = _descendants(replay.pid)
    ports = _listening_ports(children)
    assert len(ports) >= 2  # the two servers
    replay.kill()
    replay.wait(timeout=30)
    _assert_nothing_left(children, ports)


def test_sigterm_with_two_processes_per_worker_keeps_the_run_and_leaves_no_process(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", "ps-throughput", "--ps", "2",
        "--workers", "2", "--procs-per-worker", "2", "--duration", "60", cwd=tmp_path,
    )  # fmt: skip
    # 2 servers and 2 x 2 client processes.
    _wait_for(lambda: len(_descendants(replay.pid)) >= 6, "the replay's processes")
    children = _descendants(replay.pid)
    ports = _wait_for_servers(children)
    _wait_for_calls(f"127.0.0.1:{min(ports)}")
    time.sleep(1)
    replay.send_signal(signal.SIGTERM)
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == 128 + signal.SIGTERM, err
    (result,) = _document(out, tmp_path).benchmarks
    assert result.parameters["procs_per_worker"] == 2
    assert result.parameters["client_processes"] == 4
    (run,) = result.runs
    assert run.partial and run.partial_reason.startswith("interrupted by")
    assert run.rpc_count > 0
    assert {s.worker_index for s in run.samples} == {0, 1}
    _assert_nothing_left(children, ports)


def test_the_run_interrupt_in_a_shared_barrier_breaks_it_and_is_raised_outside_it() -> None:
    """A worker process's run interrupt (``INTERRUPT_SIGNAL``) while it waits at a barrier
    shared with its other processes: the barrier is broken (the wait ends, as another
    process's leaving would end it) and the ``KeyboardInterrupt`` comes out of the hold,
    not from inside ``multiprocessing``'s wait, where it left the barrier's shared state
    inconsistent: the other process failed an assertion or waited out its timeout, and
    both processes' calls of the interrupted run were lost."""
    barrier = multiprocessing.get_context("spawn").Barrier(2)
    previous = signal.getsignal(throughput.INTERRUPT_SIGNAL)
    try:
        interrupt = throughput._RunInterrupt()
        shared = peers.RoundBarrier(barrier, 600.0, interrupt.held)
        interrupt.measuring = True

        def interrupt_once_waiting() -> None:
            _wait_for(lambda: barrier.n_waiting == 1, "the barrier's wait")
            os.kill(os.getpid(), throughput.INTERRUPT_SIGNAL)

        sender = threading.Thread(target=interrupt_once_waiting)
        sender.start()
        with pytest.raises(KeyboardInterrupt) as raised:
            shared.wait()
        sender.join()
    finally:
        signal.signal(throughput.INTERRUPT_SIGNAL, previous)
    assert raised.traceback[-1].name == "held"
    assert barrier.broken
    # Whole: reset, it lets two waiters through.
    barrier.reset()
    other = threading.Thread(target=barrier.wait, args=(60.0,))
    other.start()
    barrier.wait(60.0)
    other.join()


def test_kill_9_of_replay_with_two_processes_per_worker_leaves_none_behind(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", "ps-throughput", "--ps", "2",
        "--workers", "2", "--procs-per-worker", "2", "--duration", "60", cwd=tmp_path,
    )  # fmt: skip
    _wait_for(lambda: len(_descendants(replay.pid)) >= 7, "the replay's processes")
    time.sleep(2)
    children = _descendants(replay.pid)
    ports = _listening_ports(children)
    assert len(ports) >= 2
    replay.kill()
    replay.wait(timeout=30)
    _assert_nothing_left(children, ports)


def test_kill_9_of_a_local_server_mid_run_ends_the_replay_partial_and_stops_the_rest(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", "ps-throughput", "--ps", "2",
        "--workers", "2", "--duration", "60", "--deadline", "5", cwd=tmp_path,
    )  # fmt: skip
    _wait_for(lambda: len(_descendants(replay.pid)) >= 5, "the replay's processes")
    children = _descendants(replay.pid)
    ports = _wait_for_servers(children)
    _wait_for_calls(f"127.0.0.1:{min(ports)}")  # the measured run
    time.sleep(1)
    server = next(pid for pid in children if _listening_ports({pid}))
    os.kill(server, signal.SIGKILL)
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == 3, err
    assert err.count("\n") == 1 and "partial results written" in err and "Traceback" not in err
    assert _document(out, tmp_path).partial
    _assert_nothing_left(children, ports)


# --------------------------------------------------------------------------
# serve


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_serve_with_several_servers_leaves_no_server_behind(
    tmp_path: Path, started: list[subprocess.Popen[str]], signum: int
) -> None:
    port = _free_port(2)
    serve = _start(
        started, "serve", "--host", "127.0.0.1", "--port", str(port), "--servers", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert serve.stdout is not None
    assert "serving" in serve.stdout.readline()
    children = _descendants(serve.pid)
    assert _listened({port, port + 1}) == {port, port + 1}
    serve.send_signal(signum)
    _, err = serve.communicate(timeout=60)
    if signum == signal.SIGTERM:
        assert serve.returncode == 128 + signal.SIGTERM, err
        assert err == "tf-grpc-bench serve: interrupted (SIGTERM); servers stopped\n"
    _assert_nothing_left(children, {port, port + 1})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_serve_with_two_processes_per_server_counts_a_replay_once_and_leaves_none_behind(
    tmp_path: Path, started: list[subprocess.Popen[str]], signum: int
) -> None:
    port = _free_port()
    serve = _start(
        started, "serve", "--host", "127.0.0.1", "--port", str(port), "--procs-per-server", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert serve.stdout is not None
    assert "serving" in serve.stdout.readline()
    children = _descendants(serve.pid)
    # Both processes listen on the port, each on a loopback port of its own too.
    sharing = [pid for pid in children if port in _listening_ports({pid})]
    assert len(sharing) == 2
    ports = _listening_ports(children)
    assert len(ports) == 3
    replay = subprocess.run(
        [
            COMMAND, "replay", *REPLAY, "--benchmark", "ps-throughput", "--workers", "2",
            "--target", f"127.0.0.1:{port}", "--duration", "1", "--runs", "1",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    (run,) = _document(replay.stdout, tmp_path).benchmarks[0].runs
    assert run.rpc_count > 0
    assert (run.server_received_messages, run.server_received_bytes) == (
        run.rpc_count,
        run.request_bytes,
    )
    serve.send_signal(signum)
    _, err = serve.communicate(timeout=60)
    if signum == signal.SIGTERM:
        assert serve.returncode == 128 + signal.SIGTERM, err
    _assert_nothing_left(children, ports)


def test_a_frozen_server_ends_the_replay_at_its_deadline_with_partial_results(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    port = _free_port()
    serve = _start(started, "serve", "--host", "127.0.0.1", "--port", str(port), cwd=tmp_path)
    assert serve.stdout is not None
    assert "serving" in serve.stdout.readline()
    target = f"127.0.0.1:{port}"
    replay = _start(
        started, "replay", *REPLAY, "--benchmark", "p2p-latency", "--target", target,
        "--duration", "60", "--deadline", "2", "--connect-timeout", "600", cwd=tmp_path,
    )  # fmt: skip
    # The servers' figures after a run cut short get no longer than --deadline: waited for
    # as long as --connect-timeout, the replay would outlast communicate's 120 s below.
    _wait_for_calls(target)
    # The replay's session shows with its first call, which may still be in flight: a
    # moment more lets calls complete (thousands a second), so the run has samples.
    time.sleep(0.5)
    # The serve and whatever it started (an engine's server program answers for it).
    frozen = [serve.pid, *_descendants(serve.pid)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        out, err = replay.communicate(timeout=120)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert replay.returncode == 3, err
    assert err.count("\n") == 1 and "DEADLINE_EXCEEDED" in err and "Traceback" not in err
    run = _document(out, tmp_path).benchmarks[0].runs[0]
    assert run.partial and run.rpc_count > 0
    serve.send_signal(signal.SIGTERM)
    serve.communicate(timeout=60)
    _assert_nothing_left({serve.pid}, {port})


# --------------------------------------------------------------------------
# capture-job (the capture machinery with stand-in tasks; no TensorFlow)


def _idle_job(tmp_path: Path, **variables: str) -> tuple[list[str], set[int], dict[str, str]]:
    first = _free_port(2)
    ports = {first, first + 1}
    cluster = json.dumps({"ps": [f"localhost:{first}"], "worker": [f"localhost:{first + 1}"]})
    environment = {**os.environ, "TMPDIR": str(tmp_path), **variables}
    flags = [
        "capture-job", "--cluster", cluster, "-o", str(tmp_path / "t.tfgbtrace"), "-q",
        "--no-calibrate",
    ]  # fmt: skip
    return [*flags, "--", sys.executable, str(IDLE_TASK)], ports, environment


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_capture_job_stopped_or_killed_leaves_no_task_running(
    tmp_path: Path, started: list[subprocess.Popen[str]], signum: int
) -> None:
    arguments, ports, environment = _idle_job(tmp_path)
    capture = _start(started, *arguments, cwd=tmp_path, env=environment)
    _wait_for(lambda: _listened(ports) == ports, "both tasks to listen")
    tasks = _descendants(capture.pid)
    capture.send_signal(signum)
    _, err = capture.communicate(timeout=120)
    if signum == signal.SIGTERM:
        assert capture.returncode == 128 + signal.SIGTERM, err
        assert err.count("\n") == 1 and "interrupted (SIGTERM); partial trace written" in err
        assert trace_files.read_trace(tmp_path / "t.tfgbtrace").partial
    _assert_nothing_left(tasks, ports)


def test_capture_job_of_a_command_that_trains_nothing_fails_in_one_line(tmp_path: Path) -> None:
    arguments, _, environment = _idle_job(tmp_path)
    arguments[arguments.index("--") + 1 :] = ["true"]
    completed = subprocess.run(
        [COMMAND, *arguments], cwd=tmp_path, env=environment, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 4, completed.stderr
    assert completed.stderr.count("\n") == 1
    assert "without a training step recorded" in completed.stderr
    trace = trace_files.read_trace(tmp_path / "t.tfgbtrace")
    assert trace.partial and "without a training step" in trace.partial_reason
    # Its work directory held no logs: none is left in TMPDIR.
    assert not list(tmp_path.glob("tfgb-userjob-*"))


def test_a_killed_tasks_error_line_says_what_happened_not_its_start_up_logs(
    tmp_path: Path,
) -> None:
    arguments, _, environment = _idle_job(tmp_path, IDLE_TASK_NOISE="20", IDLE_TASK_DIE="SIGKILL")
    completed = subprocess.run(
        [COMMAND, *arguments], cwd=tmp_path, env=environment, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 4, completed.stderr
    line = completed.stderr
    assert line.count("\n") == 1 and "was killed by signal 9" in line
    assert "tensorflow/core" not in line and "grpc_server_lib" not in line
    # The logs are kept, and the line says where.
    (work,) = tmp_path.glob("tfgb-userjob-*")
    assert f"task logs in {work}" in line


# --------------------------------------------------------------------------
# role


def test_role_tasks_stopped_by_their_launcher_write_partial_results(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    first = _free_port(3)
    cluster = json.dumps(
        {
            "ps": [f"localhost:{first}"],
            "worker": [f"localhost:{first + 1}", f"localhost:{first + 2}"],
        }
    )
    flags = ["--cluster", cluster, *REPLAY, "--benchmark", "ps-throughput", "--duration", "60"]
    tasks = {
        task: _start(started, "role", "--task", task, *flags, cwd=tmp_path)
        for task in ("ps:0", "worker:0", "worker:1")
    }
    ps = tasks["ps:0"]
    _wait_for_calls(f"127.0.0.1:{first}")
    time.sleep(1)
    for process in tasks.values():
        process.send_signal(signal.SIGTERM)  # as a launcher ends a job: every task at once
    outputs = {task: process.communicate(timeout=120) for task, process in tasks.items()}
    for task, process in tasks.items():
        assert process.returncode == 128 + signal.SIGTERM, outputs[task]
        assert outputs[task][1].count("\n") == 1 and "interrupted (SIGTERM)" in outputs[task][1]
    document = _document(outputs["worker:0"][0], tmp_path)
    (throughput,) = document.benchmarks
    assert document.partial and throughput.rpc_count > 0
    _assert_nothing_left({ps.pid}, {first, first + 1})


def test_a_stopped_worker_whose_gatherer_is_gone_does_not_wait_for_it(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    """The chief (gatherer) dies first; the worker, stopped, keeps its partial run and
    tries to send it: it gives up after a short while, not after --job-timeout (its
    call waits for the gatherer to be ready; this held a task in the suite once)."""
    first = _free_port(3)
    cluster = json.dumps(
        {
            "chief": [f"localhost:{first}"],
            "ps": [f"localhost:{first + 1}"],
            "worker": [f"localhost:{first + 2}"],
        }
    )
    flags = [
        "--cluster", cluster, *REPLAY, "--benchmark", "ps-throughput", "--duration", "60",
        "--job-timeout", "900",
    ]  # fmt: skip
    tasks = {
        task: _start(started, "role", "--task", task, *flags, cwd=tmp_path)
        for task in ("chief:0", "ps:0", "worker:0")
    }
    _wait_for_calls(f"127.0.0.1:{first + 1}")
    tasks["chief:0"].kill()
    tasks["chief:0"].wait(timeout=30)
    tasks["worker:0"].send_signal(signal.SIGTERM)
    _, err = tasks["worker:0"].communicate(timeout=120)
    assert tasks["worker:0"].returncode == 128 + signal.SIGTERM, err
    assert err.count("\n") == 1 and "interrupted (SIGTERM); partial results not sent" in err
    tasks["ps:0"].send_signal(signal.SIGTERM)
    tasks["ps:0"].communicate(timeout=120)
    _assert_nothing_left({p.pid for p in tasks.values()}, {first, first + 1, first + 2})


def test_a_whole_step_cluster_stopped_by_its_launcher_leaves_no_server_or_side_client(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    # A trace with a chief: ps:0 serves and runs its side client (it called ps:1), the
    # chief gathers and makes its calls to the workers, each worker serves a stand-in.
    # The recorded compute: with the default (auto), each of the five tasks times the model
    # here first, and five TensorFlow calibrations at once on the suite's empty cache
    # outlast the minute this waits for calls (for either engine).
    first = _free_port(5)
    chief, ps0, ps1, worker0, worker1 = (f"localhost:{first + i}" for i in range(5))
    cluster = json.dumps({"chief": [chief], "ps": [ps0, ps1], "worker": [worker0, worker1]})
    flags = [
        "--cluster", cluster, "resnet50-tf2ps", "--warmup", "0", "--runs", "2", "--quiet",
        "--output-dir", "out", "--benchmark", "ps-throughput", "--duration", "60",
        "--compute", "recorded",
    ]  # fmt: skip
    tasks = {
        task: _start(started, "role", "--task", task, *flags, cwd=tmp_path)
        for task in ("chief:0", "ps:0", "ps:1", "worker:0", "worker:1")
    }
    _wait_for_calls(f"127.0.0.1:{first + 4}")  # the chief's calls reach worker:1's stand-in
    time.sleep(1)
    pids = {p.pid for p in tasks.values()}
    pids |= {child for pid in set(pids) for child in _descendants(pid)}
    for process in tasks.values():
        process.send_signal(signal.SIGTERM)  # as a launcher ends a job: every task at once
    outputs = {task: process.communicate(timeout=120) for task, process in tasks.items()}
    for task, process in tasks.items():
        assert process.returncode == 128 + signal.SIGTERM, outputs[task]
        assert outputs[task][1].count("\n") == 1 and "interrupted (SIGTERM)" in outputs[task][1]
    assert "side client" in outputs["ps:0"][0] and "stand-in server" in outputs["worker:1"][0]
    document = _document(outputs["chief:0"][0], tmp_path)
    (throughput,) = document.benchmarks
    assert document.partial and throughput.rpc_count > 0
    # The chief's side client (client 2) made calls before the stop.
    assert 2 in {s.worker_index for run in throughput.runs for s in run.samples}
    _assert_nothing_left(pids, set(range(first, first + 5)))


# --------------------------------------------------------------------------
# capture (real TensorFlow) and network compare (namespaces)


@pytest.mark.tensorflow
@pytest.mark.usefixtures("temporary_files_here")
def test_kill_9_of_capture_leaves_no_tensorflow_task(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    capture = _start(
        started, "capture", "--model", "tiny", "--ps", "1", "--workers", "1", "--steps", "500",
        "--no-calibrate", "-q", "-o", str(tmp_path / "t.tfgbtrace"), cwd=tmp_path,
    )  # fmt: skip
    # No compute calibration: it is timed before the tasks start, and this kills them.
    # Chief, ps and worker each serve gRPC once TensorFlow is up in them.
    _wait_for(
        lambda: len(_listening_ports(_descendants(capture.pid))) >= 3,
        "the training tasks' servers",
        timeout_s=300,
    )
    tasks = _descendants(capture.pid)
    ports = _listening_ports(tasks)
    capture.kill()
    capture.wait(timeout=30)
    _assert_nothing_left(tasks, ports)


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_network_compare_stopped_keeps_the_profiles_done_and_the_partial_one(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    compare = _start(
        started, "network", "compare", "--profiles", "unlimited,1gbit", *REPLAY,
        "--benchmark", "p2p-latency", "--runs", "1", "--duration", "10", cwd=tmp_path,
    )  # fmt: skip
    _wait_for(
        lambda: any(tmp_path.glob("out/*-compare/1gbit/*")), "the second profile's replay", 180
    )
    time.sleep(5)  # into its measured run (connected within a second or two, 10 s long)
    processes = _descendants(compare.pid)
    compare.send_signal(signal.SIGTERM)
    out, err = compare.communicate(timeout=180)
    assert compare.returncode == 128 + signal.SIGTERM, err
    assert err.count("\n") == 1 and "interrupted (SIGTERM)" in err
    comparison = next(tmp_path.glob("out/*-compare/comparison.md")).read_text()
    assert "| unlimited |" in comparison and "Interrupted (SIGTERM)." in comparison
    summary = json.loads(next(tmp_path.glob("out/*-compare/comparison.json")).read_text())
    assert summary["interrupted"] == "SIGTERM"
    assert [p["profile"] for p in summary["profiles"]][:1] == ["unlimited"]
    assert "1gbit, p2p-latency: interrupted by SIGTERM" in out
    _assert_nothing_left(processes, set())
