"""The in-process recorder (``--recorder preload``): its library, its record files,
and real traffic recorded by it.

The library follows HTTP/2 and gRPC framing in C only to tell the bytes a
trace needs from those it may skip; the records are then replayed through the
proxy's Python follower.  These tests send frames written by hyperframe and
hpack through real sockets in a process running under the library, in
awkward pieces and through every wrapped system call, and check that what the
recorder gives back is exactly what following the whole byte streams directly
gives.  Real gRPC (the replayer, streaming included) and real TensorFlow
(test_capture.py, test_userjob.py) are recorded too.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import hpack
import pytest
from hyperframe.frame import (
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import CaptureError
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.profiler.recorders.calls import CallTable, Direction, RecordedCall
from tf_grpc_bench.profiler.recorders.http2 import PREFACE
from tf_grpc_bench.profiler.recorders.tapfile import (
    FILE_HEADER_BYTES,
    read_tap_file,
    trim_record_files,
)
from tf_grpc_bench.profiler.recorders.wiretap import (
    TapRecorder,
    build_library,
    recorder_environment,
)
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.wire import PUSH_STREAM_METHOD

from .conftest import make_trace, replayed_sequences, workload_sequences
from .engines import grpc_cpp_program
from .http2_frames import REQUEST_HEADERS, data_frames, grpc_message, headers_frames

DATA = Path(__file__).parent / "data"
PEER = DATA / "wiretap_peer.py"
PYTHON_BIN = Path(sys.executable).parent
CLI = str(PYTHON_BIN / "tf-grpc-bench")

METHOD = "/tensorflow.WorkerService/RecvTensor"


def _request_headers(path: str) -> list[tuple[str, str]]:
    return [(name, path if name == ":path" else value) for name, value in REQUEST_HEADERS]


def conversation() -> tuple[bytes, bytes]:
    """Client and server bytes of one connection with five calls:

    1. a unary call whose request (3 KB) spans two frames and whose response
       (50 KB, far past the kept head) spans four;
    2. a streaming call: three messages in PADDED frames, two sharing a frame,
       one starting mid-frame, one empty; its request headers in CONTINUATIONs;
    3. a call reset by the client;
    4. a call answered trailers-only (HEADERS with END_STREAM, no DATA);
    5. a call with a HEADERS frame carrying PADDED and PRIORITY.
    """
    encoder, answers = hpack.Encoder(), hpack.Encoder()
    ok = [(":status", "200"), ("content-type", "application/grpc")]
    trailers = [("grpc-status", "0")]
    client = PREFACE + SettingsFrame(0, {SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 24}).serialize()
    server = SettingsFrame(0, {}).serialize() + SettingsFrame(0, flags=["ACK"]).serialize()
    # 1
    client += headers_frames(encoder, 1, _request_headers(METHOD))
    client += data_frames(1, grpc_message(bytes(range(256)) * 12), size=2000, end_stream=True)
    server += headers_frames(answers, 1, ok)
    server += data_frames(1, grpc_message(os.urandom(50_000)), size=16384, end_stream=False)
    server += headers_frames(answers, 1, trailers, end_stream=True)
    # 2
    stream = grpc_message(b"a" * 10) + grpc_message(b"b" * 3000) + grpc_message(b"")
    client += headers_frames(encoder, 3, _request_headers("/tf_grpc_bench.Bench/Stream"), split=7)
    client += data_frames(3, stream, size=1500, end_stream=True, pad=5)
    client += WindowUpdateFrame(0, 1000).serialize() + PingFrame(0, b"12345678").serialize()
    server += headers_frames(answers, 3, ok)
    server += data_frames(3, grpc_message(b"c" * 20_000) * 2, size=9000, end_stream=False, pad=2)
    server += headers_frames(answers, 3, trailers, end_stream=True)
    # 3
    client += headers_frames(encoder, 5, _request_headers(METHOD))
    client += data_frames(5, grpc_message(b"x" * 40_000)[:30_000], size=16384, end_stream=False)
    client += RstStreamFrame(5, error_code=8).serialize()
    # 4
    client += headers_frames(encoder, 7, _request_headers("/tensorflow.WorkerService/GetStatus"))
    client += data_frames(7, grpc_message(b""), size=16384, end_stream=True)
    server += headers_frames(answers, 7, [*ok, ("grpc-status", "5")], end_stream=True)
    # 5
    client += headers_frames(encoder, 9, _request_headers(METHOD), padded=True)
    client += data_frames(9, grpc_message(b"q" * 100), size=16384, end_stream=True)
    server += headers_frames(answers, 9, ok) + data_frames(
        9, grpc_message(b"r" * 2000), size=16384, end_stream=False
    )
    server += headers_frames(answers, 9, trailers, end_stream=True)
    return client, server


def direct_calls(client: bytes, server: bytes) -> list[tuple]:
    """The calls that following the whole byte streams gives (no library involved)."""
    table = CallTable(callee="ps:0", connection=0)
    for data, client_side in ((client, True), (server, False)):
        direction = Direction(client_side=client_side)
        direction.new_follower(1024).feed(data, 0)
        table.fold(direction)
        assert not direction.error
    return sorted(_essence(call) for call in table.take(caller_pid=None, final=True))


def _essence(call: RecordedCall) -> tuple:
    return (
        call.stream_id,
        call.method,
        call.request_bytes,
        call.response_bytes,
        call.request_messages,
        call.response_messages,
        call.status_code,
        call.reset,
        call.complete,
        call.request_head,
        call.response_head,
    )


def pieces(data: bytes, rng: random.Random, ways: list[str]) -> list[list[str]]:
    """``data`` cut at random places (many cuts inside frame headers), each piece
    sent by a randomly chosen system call; with ``spawn`` in ``ways``, child
    processes are started (vfork or fork) between some pieces."""
    out = []
    senders = [way for way in ways if way != "spawn"]
    position = 0
    while position < len(data):
        size = rng.choice([1, 2, 5, 9, 13, 100, 4000, 17000, 70000])
        out.append([rng.choice(senders), data[position : position + size].hex()])
        position += size
        if "spawn" in ways and rng.random() < 0.05:
            out.append([rng.choice(["spawn", "fork"]), ""])
    return out


def record_conversation(
    tmp_path: Path,
    client: bytes,
    server: bytes,
    *,
    seed: int,
    ways: list[str],
    client_in_child: bool = False,
    dual_stack: bool = False,
    **options: int,
) -> TapRecorder:
    port = free_ports(1)[0]
    recorder = TapRecorder({"ps:0": port}, tmp_path / "tap", **options)
    recorder.start()
    rng = random.Random(seed)
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "port": port,
                "client": pieces(client, rng, ways),
                "server": pieces(server, rng, ways),
                "client_in_child": client_in_child,
                "dual_stack": dual_stack,
            }
        )
    )
    done = subprocess.run(
        [sys.executable, str(PEER), str(spec)],
        env=recorder.environment(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return recorder


@pytest.mark.parametrize(
    ("seed", "ways"),
    [
        (1, ["send"]),
        (2, ["sendmsg"]),
        (3, ["write", "writev"]),
        (4, ["send", "sendmsg", "write", "writev"]),
        (6, ["send", "sendmsg", "spawn"]),
    ],
)
def test_the_recorder_gives_the_calls_that_following_every_byte_gives(
    tmp_path: Path, seed: int, ways: list[str]
) -> None:
    client, server = conversation()
    recorder = record_conversation(tmp_path, client, server, seed=seed, ways=ways)
    assert recorder.errors() == ()  # before collect: it assembles the calls first
    calls = recorder.collect()
    assert sorted(_essence(call) for call in calls) == direct_calls(client, server)
    by_stream = {call.stream_id: call for call in calls}
    assert set(by_stream) == {1, 3, 5, 7, 9}
    assert (by_stream[1].request_bytes, by_stream[1].response_bytes) == (3072, 50_000)
    assert (by_stream[3].request_messages, by_stream[3].request_bytes) == (3, 3010)
    assert by_stream[5].reset and by_stream[7].status_code == 5
    assert len(by_stream[1].response_head) == 1024  # the kept head, no more
    # Both sides came from this one process, which called.
    assert {call.caller_pid for call in calls} == {recorder.files()[0].pid}
    assert {call.callee for call in calls} == {"ps:0"}
    sent, skipped = recorder.forwarded_bytes()
    assert sent == len(client) + len(server)
    assert skipped > 0.8 * 150_000  # the bulk was only counted


def test_an_ipv4_client_of_a_dual_stack_server_is_named_alike_on_both_sides(
    tmp_path: Path,
) -> None:
    """gRPC's servers listen on an IPv6 socket on [::]: an IPv4 client's connection reaches
    them as ::ffff:127.0.0.1 while the client's own socket says 127.0.0.1.  Both sides give
    the IPv4 form, so they pair into one connection's calls, and a server is named by the
    cluster's address."""
    client, server = conversation()
    recorder = record_conversation(
        tmp_path, client, server, seed=10, ways=["send"], client_in_child=True, dual_stack=True
    )
    files = recorder.files()
    sides = {connection.server_side: connection for tap in files for connection in tap.connections}
    assert set(sides) == {False, True}
    client_side, server_side = sides[False], sides[True]
    port = server_side.local[1]
    assert server_side.local == client_side.peer == ("127.0.0.1", port)
    assert server_side.peer == client_side.local
    assert client_side.local[0] == "127.0.0.1"
    assert client_side.endpoints == server_side.endpoints
    pids = {f.pid for f in files}
    (child,) = [f for f in files if f.parent_pid in pids]
    (parent,) = [f for f in files if f is not child]
    recorder.expected_pids = {parent.pid: "worker:0"}
    calls = recorder.collect()
    assert recorder.errors() == ()
    assert sorted(_essence(call) for call in calls) == direct_calls(client, server)


def test_calls_from_a_tasks_child_process_are_the_tasks(tmp_path: Path) -> None:
    client, server = conversation()
    recorder = record_conversation(
        tmp_path, client, server, seed=8, ways=["send"], client_in_child=True
    )
    files = recorder.files()
    assert len(files) == 2  # the child wrote its own file, naming its parent
    pids = {f.pid for f in files}
    (child,) = [f for f in files if f.parent_pid in pids]
    (parent,) = [f for f in files if f is not child]
    recorder.expected_pids = {parent.pid: "worker:0"}  # the task is the parent
    calls = recorder.collect()
    assert recorder.errors() == ()
    assert sorted(_essence(call) for call in calls) == direct_calls(client, server)
    assert {call.caller_pid for call in calls} == {parent.pid}


def test_activity_counts_only_what_a_process_sends_to_another(tmp_path: Path) -> None:
    """A task calling itself (a coordination service's heartbeat, say) is no sign that the
    job moves: only bytes between different processes count as activity."""
    client, server = conversation()
    alone = record_conversation(tmp_path / "alone", client, server, seed=9, ways=["send"])
    assert alone.forwarded_bytes()[0] == len(client) + len(server)  # recorded all the same
    assert alone.activity() == 0
    apart = record_conversation(
        tmp_path / "apart", client, server, seed=9, ways=["send"], client_in_child=True
    )
    assert apart.activity() == len(client) + len(server)
    assert apart.activity() == len(client) + len(server)  # read once, counted once


def test_a_record_cut_short_by_a_killed_process_ends_the_file_and_is_reported(
    tmp_path: Path,
) -> None:
    client, server = conversation()
    recorder = record_conversation(tmp_path, client, server, seed=5, ways=["send"])
    path = recorder.files()[0].path
    whole = read_tap_file(path)
    # Unfinish the 4th record: its length word, stored last by the library, back to 0
    # (written in place: the file is 1 GiB long, sparse).
    with open(path, "r+b") as handle:
        position = FILE_HEADER_BYTES
        for _ in range(3):
            handle.seek(position)
            position += int.from_bytes(handle.read(4), "little")
        handle.seek(position)
        handle.write(bytes(4))
    damaged = TapRecorder({"ps:0": 1}, path.parent, library=recorder.library)
    assert "was never finished" in read_tap_file(path).damage
    assert not whole.damage
    errors = damaged.errors()
    assert any(path.name in line and "never finished" in line for line in errors), errors


def test_record_files_of_ended_processes_are_cut_to_their_records(tmp_path: Path) -> None:
    client, server = conversation()
    recorder = record_conversation(tmp_path, client, server, seed=11, ways=["send"])
    path = recorder.files()[0].path
    before = read_tap_file(path)
    assert path.stat().st_size == 1 << 30  # the library's capacity, sparse
    (tmp_path / "tap" / "tap-1.bin").write_bytes(b"NOTATAP!" + bytes(100))  # left alone
    # A file some process still maps is left whole (here this process maps it).
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ):
        assert trim_record_files(tmp_path / "tap") == []
        assert path.stat().st_size == 1 << 30
    assert trim_record_files(tmp_path / "tap") == [path]
    with open(path, "rb") as handle:
        end = int.from_bytes(handle.read(FILE_HEADER_BYTES)[32:40], "little")
    assert FILE_HEADER_BYTES < end == path.stat().st_size < 1 << 20
    after = read_tap_file(path)
    assert after.sends == before.sends and after.connections == before.connections
    assert not after.damage and after.sent_bytes == before.sent_bytes > 0
    assert trim_record_files(tmp_path / "tap") == []  # cut once
    assert (tmp_path / "tap" / "tap-1.bin").stat().st_size == 108


def test_records_past_the_files_capacity_are_counted_and_reported(tmp_path: Path) -> None:
    encoder, answers = hpack.Encoder(), hpack.Encoder()
    client = PREFACE + headers_frames(encoder, 1, _request_headers(METHOD))
    client += data_frames(1, grpc_message(os.urandom(3 << 20)), size=16384, end_stream=True)
    server = headers_frames(answers, 1, [(":status", "200")])
    server += headers_frames(answers, 1, [("grpc-status", "0")], end_stream=True)
    # Keep every byte (a 4 MiB head) in a file of 1 MiB: most records cannot fit.
    recorder = record_conversation(
        tmp_path, client, server, seed=7, ways=["send"], head_bytes=4 << 20, capacity_bytes=1 << 20
    )
    recorder.collect()
    (tap,) = recorder.files()
    assert tap.dropped_records > 0 and not tap.damage
    assert any("records did not fit in 1048576 bytes" in line for line in recorder.errors())


def test_files_that_are_not_record_files_are_refused_in_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "tap-1.bin"
    bogus.write_bytes(b"NOTATAP!" + bytes(100))
    with pytest.raises(CaptureError, match="not an in-process recorder file"):
        read_tap_file(bogus)
    future = tmp_path / "tap-2.bin"
    future.write_bytes(b"TFGBTAP1" + (99).to_bytes(4, "little") + bytes(100))
    with pytest.raises(CaptureError, match="version 99; this tool reads 1"):
        read_tap_file(future)


def test_a_task_that_left_no_file_is_reported(tmp_path: Path) -> None:
    recorder = TapRecorder({"ps:0": 2222}, tmp_path, library=build_library())
    recorder.start()
    recorder.expected_pids = {123456: "worker:1"}
    assert recorder.collect() == []
    (line,) = recorder.errors()
    assert "task worker:1 (pid 123456) left no record file" in line


def test_the_library_is_built_once_and_a_missing_compiler_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = build_library(tmp_path / "cache")
    built = library.stat().st_mtime_ns
    assert build_library(tmp_path / "cache") == library
    assert library.stat().st_mtime_ns == built
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(CaptureError, match="cannot run the C compiler") as caught:
        build_library(tmp_path / "elsewhere")
    assert "\n" not in str(caught.value)


def test_the_environment_puts_the_library_first_and_lists_the_ports(tmp_path: Path) -> None:
    library = tmp_path / "lib.so"
    environment = recorder_environment(
        {"LD_PRELOAD": "/other.so", "HOME": "/root"},
        library=library,
        directory=tmp_path,
        ports=[2223, 2222, 2223],
    )
    assert environment["LD_PRELOAD"] == f"{library}:/other.so"
    assert environment["TFGB_WIRETAP_PORTS"] == "2222,2223"
    assert environment["HOME"] == "/root"


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_real_grpc_traffic_of_the_replayer_is_recorded_call_by_call(
    tmp_path: Path, engine: str
) -> None:
    """Replay servers and the replayer, both under the library: the recorded calls are
    the trace's PS-throughput calls, in order and to the byte (streaming RPCs too).
    gRPC C++ calls close() from its constructors, before the library's own ran."""
    if engine == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    trace = make_trace(steps=2, workers=2, ps=2, sizes=(21, 4096, 300_000))
    trace_file = tmp_path / "small.tfgbtrace"
    trace_files.write_trace(trace, trace_file)
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    count = workload.server_count
    base = _free_port_run(count)
    ports = {f"ps:{n}": base + n for n in range(count)}
    recorder = TapRecorder(ports, tmp_path / "tap")
    recorder.start()
    environment = recorder.environment(os.environ)
    serving = f"serve --host 127.0.0.1 --port {base} --servers {count} --engine {engine}"
    serve = subprocess.Popen(
        [CLI, *serving.split()],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()  # printed once every server listens
        assert line.startswith("serving"), line + (serve.stderr.read() if serve.stderr else "")
        targets = ",".join(f"127.0.0.1:{port}" for port in ports.values())
        flags = f"--runs 1 --warmup 0 --channels 1 --quiet --steps {len(trace.steps)}"
        flags += f" --engine {engine}"
        replay = subprocess.run(
            [CLI, "replay", str(trace_file), "--benchmark", "ps-throughput", "--target", targets,
             *flags.split(), "--output-dir", str(tmp_path / "runs")],
            env=environment, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stderr
        bandwidth = subprocess.run(
            [CLI, "replay", "--synthetic", "--benchmark", "p2p-bandwidth", "--categories",
             "medium", "--medium-size", "100000", "--buffers", "1",
             "--target", f"127.0.0.1:{base}", "--rpc", "streaming", "--runs", "1",
             "--warmup", "0", "--duration", "0.3", "--quiet", "--engine", engine,
             "--output-dir", str(tmp_path / "runs2")],
            env=environment, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert bandwidth.returncode == 0, bandwidth.stderr
    finally:
        os.killpg(serve.pid, signal.SIGINT)
        serve.communicate(timeout=30)
    calls = recorder.collect()
    assert recorder.errors() == ()
    replayed = [c for c in calls if not c.method.startswith("/tf_grpc_bench.Control/")]
    # The bandwidth run's stream, by its method: how many messages it carries in its 0.3 s
    # depends on the machine's load, so only "at least one" is asserted.
    streamed = [c for c in replayed if c.method == PUSH_STREAM_METHOD]
    assert streamed, "the bandwidth run's streaming call was not recorded"
    assert all(c.request_messages >= 1 for c in streamed)
    for call in streamed:
        # The bandwidth run cancels its stream when its time is up (a reset).
        assert call.complete and (call.reset or call.status_code == 0)
        assert call.request_messages == call.response_messages  # one ack a message
        assert call.request_bytes >= 100_000 * call.request_messages
    unary = [c for c in replayed if c not in streamed]
    assert all(c.complete and c.status_code == 0 and not c.reset for c in unary)
    captured = replayed_sequences(unary)
    expected = workload_sequences(workload)
    assert sorted(captured.values()) == sorted(expected.values())
    methods = Counter(m for sequence in captured.values() for m, _, _ in sequence)
    assert methods[METHOD] > 0


def _free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports (``serve --servers`` takes a run)."""
    for _ in range(50):
        base = free_ports(1)[0]
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no run of free ports")
