"""Flags that do what they say, and resources that stay bounded.

``--max-message-size`` is the limit on both sides and ``--chunk-size`` cuts
both directions (seen on the wire by a recording proxy); a client keeps
only a bounded amount of built requests whatever the trace declares; a
serialized replay says which traced sizes it could not reproduce; and the
pieces the signal handling stands on (``lifetime``, the line quoted from a
failed task's log) behave as documented.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tf_grpc_bench import lifetime, trace_files
from tf_grpc_bench import trace as trace_model
from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.profiler.launch.processes import MAX_QUOTED_CHARS, meaningful_line
from tf_grpc_bench.profiler.recorders.proxy import RecordingProxy
from tf_grpc_bench.replay.core.workload import Mode, pull_call
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.transport import grpc_settings
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.grpc_settings import GrpcSettings
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.server import ReplayServer

from .conftest import make_trace
from .engines import grpc_cpp_program

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))
MB = 1024 * 1024


def _document(out: str, cwd: Path) -> results.ResultDocument:
    line = next(line for line in out.splitlines() if line.startswith("results: "))
    return read_document(cwd / line.removeprefix("results: ").strip())


# --------------------------------------------------------------------------
# One line, whatever gRPC's own threads and logs would have said


def test_a_connect_timeout_too_short_for_any_server_is_one_line_every_time(
    tmp_path: Path,
) -> None:
    # It printed a gRPC polling thread's traceback first in 4 tries of 6.
    for attempt in range(6):
        completed = subprocess.run(
            [COMMAND, "replay", "--synthetic", "--benchmark", "p2p-latency", "--duration", "1",
             "--warmup", "0", "--runs", "1", "--connect-timeout", "1e-9", "--quiet",
             "--output-dir", f"out-{attempt}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert completed.returncode == 3
        (line,) = completed.stderr.splitlines()
        assert line.endswith("no replay server reachable within 1e-09 s"), line


@pytest.mark.parametrize("port", ["0", "free"])
def test_serve_on_an_empty_host_is_refused_in_one_line_of_its_own(
    tmp_path: Path, port: str
) -> None:
    number = str(free_ports(1)[0]) if port == "free" else port
    completed = subprocess.run(
        [COMMAND, "serve", "--host", "", "--port", number],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 3
    assert completed.stderr == (
        "tf-grpc-bench serve: error: --host '': expected a host name or address "
        "(0.0.0.0 or :: for every interface)\n"
    )


# --------------------------------------------------------------------------
# A trace step longer than the run


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
@pytest.mark.parametrize("pacing", ["recorded", "dependencies"])
def test_a_step_planning_a_call_days_later_ends_the_run_past_duration_not_days_later(
    tmp_path: Path, pacing: str, engine: str
) -> None:
    if engine == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    # Two calls 10^15 ns (11.6 days) apart in one step, as a trace with extreme
    # timestamps has: the run stops twice --duration after it began, marked partial.
    base = make_trace(steps=1, workers=1, ps=1, sizes=(100, 200))
    first, second = base.steps[0].rpcs
    far = 10**15
    rpcs = (
        replace(first, start_ns=0, response_start_ns=1, end_ns=2),
        replace(second, start_ns=far, response_start_ns=far + 1, end_ns=far + 2),
    )
    step = replace(
        base.steps[0], start_ns=0, end_ns=far + 3, rpcs=trace_model.with_outstanding(rpcs)
    )
    path = tmp_path / "far.tfgbtrace"
    trace_files.write_trace(replace(base, steps=(step,)), path)
    completed = subprocess.run(
        [COMMAND, "replay", str(path), "--benchmark", "ps-throughput", "--pacing", pacing,
         "--duration", "1", "--warmup", "0.5", "--runs", "1", "--quiet", "--output-dir", "out",
         "--engine", engine],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 3, completed.stderr
    (line,) = completed.stderr.splitlines()
    assert "trace step 0 plans a call later than twice --duration after the run began" in line
    (document,) = [read_document(p) for p in (tmp_path / "out").glob("*/results.json")]
    (run,) = document.benchmarks[0].runs
    assert run.partial and len(run.samples) == 1  # the first call, not the second


# --------------------------------------------------------------------------
# --max-message-size and --chunk-size


def test_max_message_size_and_chunk_size_hold_on_the_wire_both_ways(tmp_path: Path) -> None:
    # The shipped ResNet-50 pair moves tensors of up to 9.4 MB both ways: pulled
    # weights in responses, gradients (a ps pulling from the worker, replayed
    # reversed) in requests.  With a 1 MB limit every one must go in 64 KB chunks.
    settings = GrpcSettings(max_message_bytes=MB, chunk_bytes=64 * 1024)
    server = ReplayServer(settings=grpc_settings.server_settings(settings, None))
    with server, RecordingProxy(target=("127.0.0.1", server.port), callee="ps") as proxy:
        proxy.start()
        completed = subprocess.run(
            [
                COMMAND, "replay", "resnet50-tf2ps", "--benchmark", "p2p-bandwidth",
                "--steps", "1", "--warmup", "0", "--runs", "1", "--max-message-size", "1MB",
                "--chunk-size", "64KB", "--target", f"{proxy.address},{proxy.address}",
                "--output-dir", "out",
            ],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        calls = [c for c in proxy.collect(final=True) if "Control" not in c.method]
    assert completed.returncode == 0, completed.stderr
    (run,) = _document(completed.stdout, tmp_path).benchmarks[0].runs
    assert run.server_received_messages == run.rpc_count == len(calls)
    assert all(c.complete and c.status_code == 0 for c in calls)
    assert max(c.request_bytes for c in calls) == 64 * 1024  # requests cut too
    assert max(c.response_bytes for c in calls) <= 64 * 1024 + 64
    assert sum(c.request_bytes for c in calls) > 10 * MB  # the gradients went


def test_the_message_limit_binds_the_client_too() -> None:
    settings = GrpcSettings(max_message_bytes=64 * 1024)
    call = pull_call(
        method="/x.Y/Pull", request_bytes=16, response_bytes=100_000, mode=Mode.NON_SERIALIZED
    )
    with ReplayServer() as server:  # the server's own limit is the default
        client = ReplayClient(
            server.address,
            mode=Mode.NON_SERIALIZED,
            settings=grpc_settings.channel_settings(settings, None),
        )
        try:
            with pytest.raises(TransportError, match="RESOURCE_EXHAUSTED"):
                client.invoke(call, 10)
        finally:
            client.close()


# --------------------------------------------------------------------------
# Requests built for reuse: bounded.


def test_requests_past_the_cache_are_built_call_by_call_and_arrive_whole() -> None:
    # A trace may declare many distinct large messages (40 x 200 MB in a crafted
    # 8 KB file): building them all up front would take their sum in memory.
    calls = [
        pull_call(
            method="/tensorflow.WorkerService/RecvTensor",
            request_bytes=2 * MB + i,
            response_bytes=8,
            mode=Mode.NON_SERIALIZED,
        )
        for i in range(20)
    ]
    with ReplayServer() as server:
        client = ReplayClient(server.address, mode=Mode.NON_SERIALIZED, request_cache_bytes=8 * MB)
        try:
            client.prepare(calls)
            assert 0 < client.cached_request_bytes <= 8 * MB
            for call in calls:
                client.invoke(call, 30)
            assert client.cached_request_bytes <= 8 * MB
            stats = client.stats()
        finally:
            client.close()
    assert stats.received_messages == len(calls)
    assert stats.received_bytes == sum(c.request_bytes for c in calls)


# --------------------------------------------------------------------------
# A serialized replay says which sizes it could not reproduce.


@pytest.mark.parametrize("mode", ["serialized", "non-serialized"])
def test_a_replay_says_which_traced_sizes_it_could_not_reproduce(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "tiny.tfgbtrace"
    trace_files.write_trace(make_trace(steps=1, sizes=(1, 2, 130, 4096)), path)
    completed = subprocess.run(
        [
            COMMAND, "replay", str(path), "--benchmark", "p2p-latency", "--steps", "1",
            "--warmup", "0", "--runs", "1", "--mode", mode, "--output-dir", "out",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    (result,) = _document(completed.stdout, tmp_path).benchmarks
    inexact = result.inexact_sizes
    if mode == "non-serialized":
        assert inexact is None and "sizes not exact" not in completed.stdout
        return
    assert inexact is not None
    # 1 and 2 B go empty; 130 B goes one byte short (just past a varint step).
    assert inexact.calls_per_pass == 3
    assert "1 B -> 0 B x1" in inexact.examples and "2 B -> 0 B x1" in inexact.examples
    assert "130 B -> 129 B x1" in inexact.examples
    assert inexact.traced_bytes - inexact.replayed_bytes == 1 + 2 + 1
    assert result.rpc_count == 4
    assert "sizes not exact: p2p-latency: 3 traced message sizes per pass" in completed.stdout


# --------------------------------------------------------------------------
# lifetime: stop signals and children that die with their parent.


def test_the_first_stop_signal_interrupts_a_deferred_one_after_the_block_later_ones_never() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with lifetime.interrupt_on_signals():
        with pytest.raises(lifetime.Interrupted) as caught:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        assert caught.value.signum == signal.SIGHUP
        assert lifetime.exit_status(lifetime.signal_of(caught.value)) == 129
        # Stopping now: more signals, deferred or not, are noted and change nothing.
        written = []
        with lifetime.deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            written.append("the whole document")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert written == ["the whole document"]
        assert lifetime.stop_signal() == signal.SIGHUP and lifetime.later_signals() == 2
    assert signal.getsignal(signal.SIGTERM) is before
    with lifetime.interrupt_on_signals():
        # A first signal while deferred comes when the block ends.
        with pytest.raises(lifetime.Interrupted) as caught, lifetime.deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            written.append("another document")
        assert written[-1] == "another document" and caught.value.signum == signal.SIGTERM
    assert lifetime.signal_of(KeyboardInterrupt()) == signal.SIGINT


def test_a_stop_signal_while_the_main_thread_holds_its_bookkeeping_is_no_deadlock() -> None:
    # The handler runs in the main thread between two bytecodes, so also inside
    # deferred_signals' own bookkeeping, where the main thread holds the lock the
    # handler takes. In a child: a deadlock there would hang the test process.
    script = textwrap.dedent(
        """
        import signal
        from tf_grpc_bench import lifetime
        with lifetime.interrupt_on_signals():
            try:
                with lifetime._received.lock:
                    signal.raise_signal(signal.SIGTERM)
                    for _ in range(1000):
                        pass
            except lifetime.Interrupted as error:
                print("interrupted", error.signum, flush=True)
        with lifetime.interrupt_on_signals():
            try:
                with lifetime.deferred_signals():
                    with lifetime._received.lock:
                        signal.raise_signal(signal.SIGHUP)
                        for _ in range(1000):
                            pass
                    print("deferred", flush=True)
            except lifetime.Interrupted as error:
                print("after the block", error.signum, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        f"interrupted {int(signal.SIGTERM)}",
        "deferred",
        f"after the block {int(signal.SIGHUP)}",
    ]


def test_a_subprocess_child_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        from tf_grpc_bench import lifetime
        child = subprocess.Popen(["sleep", "600"], preexec_fn=lifetime.die_with_parent_preexec())
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_child_whose_parent_is_already_gone_ends_at_once() -> None:
    # The race die_with_parent closes: the expected parent died before the call.
    completed = subprocess.run(
        [sys.executable, "-c", "from tf_grpc_bench import lifetime\n"
         "lifetime.die_with_parent(1)\nprint('still here')"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == -signal.SIGKILL
    assert "still here" not in completed.stdout


def test_a_stopped_command_ends_even_if_a_thread_it_leaves_never_does() -> None:
    """The interpreter's exit joins non-daemon threads (gRPC's and the executors'
    pools): ``exit_within`` ends the process with its status all the same."""
    script = textwrap.dedent(
        """
        import sys, threading
        from tf_grpc_bench import lifetime
        threading.Thread(target=threading.Event().wait).start()  # never ends
        print("kept", flush=True)
        lifetime.exit_within(143, 1.0)
        sys.exit(143)
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert (completed.returncode, completed.stdout) == (143, "kept\n")


def test_after_a_stop_signal_grpc_objects_failing_in_del_stay_off_stderr() -> None:
    """A stop signal inside a gRPC call's constructor leaves a half-built object that
    fails in ``__del__``; the command's stderr keeps its one line all the same."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from tf_grpc_bench import lifetime

        class Call:
            def __del__(self):
                raise AttributeError("half-built")

        Call.__del__.__module__ = "grpc._channel"
        lifetime.quiet_grpc_after_stop()
        lifetime.quiet_grpc_after_stop()  # installed once, however often asked
        Call()  # before any signal: reported as usual
        with lifetime.interrupt_on_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                signal.pause()
            except lifetime.Interrupted:
                Call()  # after it: quiet
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr.count("Exception ignored in") == 1
    assert completed.stderr.count("half-built") == 1


#: An info line of gRPC core (absl's format): "I1204 08:21:37.092384   21078 file.cc:1403] ...".
_GRPC_INFO_LINE = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ", re.MULTILINE)


@pytest.mark.parametrize("user_verbosity", [None, "INFO"])
def test_the_command_keeps_grpc_cores_info_lines_off_stderr_unless_the_user_asks(
    tmp_path: Path, user_verbosity: str | None
) -> None:
    """gRPC core writes info lines to stderr when left to itself (a peer's "Got goaway"
    during a stop did, beside the command's one line); the command asks it for errors
    only, and a GRPC_VERBOSITY the user set is theirs.  GRPC_TRACE makes gRPC write
    info lines on every connection, so their absence shows the level took."""
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    environment["GRPC_TRACE"] = "http"
    if user_verbosity is not None:
        environment["GRPC_VERBOSITY"] = user_verbosity
    command = [
        sys.executable, "-m", "tf_grpc_bench", "replay", "--benchmark", "p2p-latency",
        "--warmup", "0", "--runs", "1", "--duration", "0.5", "--quiet",
        "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, env=environment
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    info_lines = _GRPC_INFO_LINE.findall(completed.stderr)
    if user_verbosity is None:
        assert info_lines == [], completed.stderr[:2000]
    else:
        assert info_lines, "GRPC_VERBOSITY=INFO set by the user was not kept"


def test_a_stop_signal_while_server_processes_spawn_stops_every_one_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The signal comes as the first child is being spawned: it waits until that child
    has its whole pickled start and is listed, so ``stop`` ends it (no orphan left
    reading a truncated pickle until this process dies)."""
    started: list[multiprocessing.process.BaseProcess] = []
    spawn = multiprocessing.context.SpawnProcess.start

    def signalled_start(process: multiprocessing.context.SpawnProcess) -> None:
        if not started:
            os.kill(os.getpid(), signal.SIGTERM)
        started.append(process)
        spawn(process)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", signalled_start)
    servers = LocalServers(2)
    with lifetime.interrupt_on_signals(), pytest.raises(lifetime.Interrupted):
        servers.start()
    assert len(started) == 1 and servers.processes == []
    assert started[0].exitcode is not None  # stopped and joined, not left running


# --------------------------------------------------------------------------
# The line quoted from a failed task's log.

_START_UP = [
    "2026-12-01 03:12:45.123456: I tensorflow/core/util/port.cc:153] oneDNN custom ops are on.",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1764559000.123456 4242 grpc_server_lib.cc:467] Started server with target: x",
    "2026-12-01 03:12:46.000001: W tensorflow/core/framework/cpu_allocator.cc:1] big alloc",
]


@pytest.mark.parametrize(
    ("tail", "quoted"),
    [
        (_START_UP, ""),
        ([*_START_UP, "worker gives up"], "worker gives up"),
        (
            [
                "Traceback (most recent call last):",
                '  File "t.py", line 1',
                "ValueError: bad",
                *_START_UP,
            ],
            "ValueError: bad",
        ),
        (
            ["tensorflow.python.framework.errors_impl.UnavailableError: ps:0 is gone", "done"],
            "tensorflow.python.framework.errors_impl.UnavailableError: ps:0 is gone",
        ),
    ],
    ids=["only-start-up", "plain-line", "traceback", "tf-error"],
)
def test_a_failed_tasks_log_is_quoted_by_the_line_that_says_what_went_wrong(
    tail: list[str], quoted: str
) -> None:
    assert meaningful_line(tail) == quoted


def test_a_quoted_line_is_cut_short() -> None:
    quoted = meaningful_line(["x" * 1000])
    assert len(quoted) == MAX_QUOTED_CHARS and quoted.endswith("...")
