"""Capturing real distributed TensorFlow training into traces.

Pure parts first (records -> RPCs -> steps, physics), then real captures:
the tiny model through the command line as a user runs it, ResNet-50 at a
tiny input, and the faults (a task that crashes, one that hangs, a port in
use, bad flags).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tf_grpc_bench import calibration, capture_cpu, trace_files, trace_format
from tf_grpc_bench import trace as trace_model
from tf_grpc_bench.errors import ServeError
from tf_grpc_bench.host import cpu_model, machine_name
from tf_grpc_bench.profiler.assembly.phases import assemble_trace, split_into_steps
from tf_grpc_bench.profiler.assembly.rpcs import STATUS_CANCELLED, STATUS_UNKNOWN, calls_to_rpcs
from tf_grpc_bench.profiler.assembly.steps import (
    StepWindow,
    collective_windows,
    repeating_tail,
    step_windows,
)
from tf_grpc_bench.profiler.capture import CaptureResult
from tf_grpc_bench.profiler.cli import _report as capture_report
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.launch.plan import plan_tasks
from tf_grpc_bench.profiler.physics import VARIABLES_EXTRA, check_physics, encode_variables
from tf_grpc_bench.profiler.recorders.proxy import RecordedCall, RecordingProxy
from tf_grpc_bench.profiler.training import capture_training
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.server import ReplayServer
from tf_grpc_bench.trace import RECV_BUF, RECV_TENSOR, Rpc, RunMetadata, Task

from .conftest import make_trace, replayed_sequences, with_step_lengths, workload_sequences

PYTHON_BIN = Path(sys.executable).parent
CLI = str(PYTHON_BIN / "tf-grpc-bench")
TASKS = (
    Task(job="ps", index=0, address="127.0.0.1:1000"),
    Task(job="worker", index=0, address="127.0.0.1:1001"),
    Task(job="worker", index=1, address="127.0.0.1:1002"),
)


# --------------------------------------------------------------------------
# Pure assembly.


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def recv_tensor_request(dst_task: int, *, step_id: int = 0) -> bytes:
    key = (
        "/job:ps/replica:0/task:0/device:CPU:0;1;"
        f"/job:worker/replica:0/task:{dst_task}/device:CPU:0;edge_1_w;0:0"
    )
    return _field(1, step_id) + _field(2, key.encode())


def call(
    start_ns: int,
    *,
    method: str = RECV_TENSOR,
    callee: str = "ps:0",
    connection: int = 0,
    caller_pid: int | None = 11,
    request_head: bytes = b"",
    status: int | None = 0,
    reset: bool = False,
    complete: bool = True,
    response_bytes: int = 100,
) -> RecordedCall:
    return RecordedCall(
        callee=callee,
        connection=connection,
        stream_id=1,
        caller_pid=caller_pid,
        method=method,
        start_ns=start_ns,
        response_start_ns=start_ns + 5,
        end_ns=start_ns + 10,
        request_bytes=len(request_head),
        response_bytes=response_bytes,
        request_messages=1,
        response_messages=1,
        status_code=status,
        reset=reset,
        complete=complete,
        request_head=request_head,
    )


def marker(step: int, start: int, end: int, *, task: str = "chief:0", phase: str = "steady"):
    return StepMarker(task=task, step=step, phase=phase, start_ns=start, end_ns=end)


def test_markers_of_one_step_number_make_one_window_and_warmup_is_left_out() -> None:
    windows = step_windows(
        [
            marker(0, 100, 200, phase="warmup"),
            marker(1, 300, 400, task="worker:0"),
            marker(1, 320, 450, task="worker:1"),
            marker(2, 500, 600, task="worker:0"),
        ]
    )
    assert [(w.number, w.start_ns, w.end_ns) for w in windows] == [(1, 300, 450), (2, 500, 600)]


def _rpc(start: int) -> Rpc:
    return Rpc(
        method=RECV_TENSOR,
        caller_task=1,
        callee_task=0,
        request_bytes=1,
        response_bytes=1,
        start_ns=start,
        end_ns=start + 1,
    )


def test_each_rpc_goes_to_the_step_containing_its_start() -> None:
    windows = [
        StepWindow(number=1, start_ns=1100, end_ns=1200),
        StepWindow(number=2, start_ns=1300, end_ns=1400),
        StepWindow(number=3, start_ns=1350, end_ns=1500),
    ]  # overlaps step 2
    starts = [50, 150, 250, 260, 360, 450, 600]
    startup, steps, teardown = split_into_steps([_rpc(s) for s in starts], windows, origin_ns=1000)
    assert [r.start_ns for r in startup.rpcs] == [50]
    assert [[r.start_ns for r in step.rpcs] for step in steps] == [[150], [250, 260], [360, 450]]
    assert [r.start_ns for r in teardown.rpcs] == [600]
    assert [(s.index, s.start_ns, s.end_ns) for s in steps] == [
        (0, 100, 200),
        (1, 300, 400),
        (2, 350, 500),
    ]
    assert startup.end_ns == 100 and teardown.start_ns == 500


def test_a_step_id_puts_an_rpc_in_its_step_whatever_its_time() -> None:
    windows = [
        StepWindow(number=0, start_ns=100, end_ns=300, step_id=7),
        StepWindow(number=1, start_ns=150, end_ns=400, step_id=9),
    ]
    _, steps, _ = split_into_steps(
        [_rpc(200), _rpc(210), _rpc(220)], windows, origin_ns=0, step_ids=[7, 9, 0]
    )
    assert [[r.start_ns for r in s.rpcs] for s in steps] == [[200], [210, 220]]


def test_callers_come_from_pids_then_from_rendezvous_keys_of_the_connection() -> None:
    calls = [
        call(1000, caller_pid=21, request_head=recv_tensor_request(0)),
        # Unknown pid: this connection's RecvTensor requests name worker 1 as destination.
        call(1010, caller_pid=None, connection=1, request_head=recv_tensor_request(1)),
        call(1020, caller_pid=None, connection=1, method="/tensorflow.WorkerService/RunGraph"),
        # Unknown pid, no key: left out.
        call(1030, caller_pid=None, connection=2, method="/tensorflow.WorkerService/RunGraph"),
        call(1040, caller_pid=21, status=None, reset=True),
        call(1050, caller_pid=21, status=None, complete=False),
        call(1060, caller_pid=21, callee="worker:1"),
    ]
    rpcs, kept, notes = calls_to_rpcs(calls, tasks=TASKS, caller_of_pid={21: 1}, origin_ns=1000)
    assert [(r.caller_task, r.callee_task) for r in rpcs] == [
        (1, 0),
        (2, 0),
        (2, 0),
        (1, 0),
        (1, 0),
        (1, 2),
    ]
    assert len(kept) == len(rpcs)
    assert [r.start_ns for r in rpcs] == [0, 10, 20, 40, 50, 60]
    assert [r.status_code for r in rpcs[3:5]] == [STATUS_CANCELLED, STATUS_UNKNOWN]
    assert rpcs[0].tensor is not None and rpcs[0].tensor.edge_name == "edge_1_w"
    assert rpcs[2].tensor is None
    assert (notes.unattributed_calls, notes.attributed_by_rendezvous_key) == (1, 2)
    assert notes.incomplete_calls == 1


def test_a_recv_buf_tensor_is_as_large_as_its_request_says() -> None:
    request = _field(2, b"1:112:0:0:0:1:1") + _field(3, 1_097_448)
    chunk = _field(1, b"x" * 4096)
    extra = _field(1, b"type.googleapis.com/tensorflow.RecvBufRespExtra") + _field(2, chunk * 268)
    recorded = dataclasses.replace(
        call(1000, method=RECV_BUF, request_head=request),
        response_head=(_field(4, extra) + _field(5, 1))[:1024],
    )
    rpcs, _, _ = calls_to_rpcs([recorded], tasks=TASKS, caller_of_pid={11: 1}, origin_ns=0)
    tensor = rpcs[0].tensor
    assert tensor is not None
    assert (tensor.rendezvous_key, tensor.content_bytes) == ("1:112:0:0:0:1:1", 1_097_448)


@pytest.mark.parametrize(
    ("signatures", "expected"),
    [
        ("abcdXYXYXY", (2, 4)),  # broadcasts, then steps of two collectives
        ("xAAAA", (1, 1)),
        ("AABAABAAB", (3, 0)),  # a period with a repeat inside is still one period
        ("abcdef", (0, 6)),  # nothing repeats
        ("abXYXYX", (2, 2)),  # the run ends mid-step: it still starts where it starts
    ],
)
def test_the_longest_periodic_tail_is_found(signatures: str, expected: tuple[int, int]) -> None:
    assert repeating_tail(list(signatures)) == expected


def _collective_call(start_ns: int, instance: int, size: int, *, pid: int) -> RecordedCall:
    request = _field(2, f"1:{instance}:0:0:0:1:1".encode()) + _field(3, size)
    return call(start_ns, method=RECV_BUF, request_head=request, caller_pid=pid)


def test_collective_steps_are_found_in_their_instance_keys() -> None:
    """Initial broadcasts (one instance each, all sizes differ), then 5 steps of two
    all-reduces (instances counting up), each a transfer both ways."""
    calls = [_collective_call(100 * i, 100 + i, 64 * (i + 1), pid=11) for i in range(4)]
    clock = 10_000
    for step in range(5):
        for k, size in enumerate((4096, 128)):
            instance = 104 + 2 * step + k
            calls += [
                _collective_call(clock, instance, size, pid=11),
                _collective_call(clock + 20, instance, size, pid=12),
            ]
            clock += 100
        clock += 1000
    windows = collective_windows(calls, warmup_steps=1)
    assert len(windows) == 4  # the first of the 5 is warm-up
    assert (windows[0].start_ns, windows[0].end_ns) == (11_200, 11_330)
    assert all(w.step_id == 0 for w in windows)
    assert collective_windows(calls[:4]) == []  # broadcasts alone: no steps


def test_assembled_trace_is_valid_marks_partial_and_keeps_notes() -> None:
    calls = [call(1000 + 10 * i, request_head=recv_tensor_request(0)) for i in range(6)]
    trace = assemble_trace(
        calls,
        tasks=TASKS,
        caller_of_pid={11: 1},
        markers=[marker(1, 1015, 1035), marker(2, 1036, 1045)],
        origin_ns=1000,
        metadata=RunMetadata(model="m", extra=(("setup", "tf2-ps"),)),
        partial_reason="task worker:0 exited with status 1",
    )
    assert trace.partial and "worker:0" in trace.partial_reason
    assert [len(s.rpcs) for s in trace.steps] == [2, 1]
    assert len(trace.startup.rpcs) == 2 and len(trace.teardown.rpcs) == 1
    # Calls overlap on one pair: the concurrency a replay must keep is filled in.
    assert [r.outstanding_at_start for r in trace.startup.rpcs] == [0, 0]
    extra = dict(trace.metadata.extra)
    assert extra["setup"] == "tf2-ps" and extra["unattributed_calls"] == "0"
    again = trace_format.trace_from_proto(trace_format.trace_to_proto(trace))
    assert again == trace


# --------------------------------------------------------------------------
# Physics (pure).


def _physics_trace(*, sizes: tuple[int, ...], drop: int | None = None):
    base = make_trace(steps=2, workers=2, ps=1, sizes=sizes)
    variables = [{"shape": [s // 4], "dtype": "float32", "trainable": True} for s in sizes]
    meta = dataclasses.replace(
        base.metadata,
        strategy="tf2-parameter-server",
        synchronous=True,
        extra=((VARIABLES_EXTRA, encode_variables(variables)),),
    )
    steps = []
    for step in base.steps:
        pulls = list(step.rpcs)
        # make_trace has workers pull weights; add the ps pulling gradients back.
        pushes = [
            dataclasses.replace(r, caller_task=r.callee_task, callee_task=r.caller_task)
            for r in pulls
        ]
        rpcs = pulls + pushes
        if drop is not None and step.index == 1:
            del rpcs[drop]
        steps.append(dataclasses.replace(step, rpcs=tuple(rpcs)))
    return dataclasses.replace(base, metadata=meta, steps=tuple(steps))


def test_physics_holds_for_a_trace_that_moves_each_variable_once_each_way() -> None:
    report = check_physics(_physics_trace(sizes=(4096, 1 << 20, 40)))
    assert report.ok, report.problems
    assert report.steps[0].expected_bytes == 2 * (4096 + (1 << 20) + 40) * 2
    assert "OK" in report.format()


def test_physics_finds_a_missing_tensor() -> None:
    report = check_physics(_physics_trace(sizes=(4096, 1 << 20, 40), drop=1))
    assert not report.ok
    assert any("step 1" in p and "pulled 1x" in p for p in report.problems)
    assert any("step 1" in p and "-" in p for p in report.problems)  # bytes short


def test_physics_without_the_variables_says_it_cannot_check() -> None:
    # A capture-job trace records no variables: a clear answer, not a raw ValueError.
    report = check_physics(make_trace())
    assert not report.ok
    (problem,) = report.problems
    assert problem.startswith("cannot check: the trace does not record the model's trainable")
    assert 'check_physics(trace, {"variables"' in problem
    assert "cannot check" in report.format()


@pytest.mark.parametrize("quiet", [True, False])
def test_a_capture_whose_steps_were_unsteady_says_so_quiet_or_not(
    quiet: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first half's median step over twice the second's.
    trace = with_step_lengths(make_trace(steps=4), (3000, 2600, 1400, 1200))
    result = CaptureResult(
        trace=trace,
        path=tmp_path / "t.tfgbtrace",
        job_info={},
        recorder_errors=(),
        recorded_bytes=0,
        uncopied_bytes=0,
    )
    assert capture_report(result, quiet) == 0
    out, err = capsys.readouterr()
    assert f"wrote {tmp_path / 't.tfgbtrace'}: 4 steady steps" in out
    # Once: in the summary, or (--quiet, no summary) on stderr as a warning.
    where, other = (err, out) if quiet else (out, err)
    assert where.count("steps unsteady: the first 2 steps' median (2800.0 ms) is 2.2 times") == 1
    assert "unsteady" not in other


# --------------------------------------------------------------------------
# Real captures.


def run_cli(*arguments: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *arguments], capture_output=True, text=True, timeout=timeout, check=False
    )


def _tensors_match_variables(trace: trace_model.Trace, variables: list[dict]) -> None:
    shapes = {(v["dtype"], tuple(v["shape"])) for v in variables}
    for step in trace.steps:
        for rpc in step.rpcs:
            if rpc.method != RECV_TENSOR:
                continue
            assert rpc.tensor is not None and rpc.tensor.rendezvous_key.count(";") == 4
            key = (rpc.tensor.dtype, rpc.tensor.shape)
            control_edge = key == ("float32", (0,)) and rpc.tensor.content_bytes == 0
            step_counter = key == ("int64", ())
            assert key in shapes or control_edge or step_counter, key
            if key in shapes:
                count = 1
                for dim in key[1]:
                    count *= dim
                assert rpc.tensor.content_bytes == 4 * count


@pytest.fixture(scope="module")
def tiny_capture(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The tiny model captured once through the command line, as a user runs it."""
    output = tmp_path_factory.mktemp("tiny") / "tiny.tfgbtrace"
    flags = "--model tiny --setup tf2-ps --ps 1 --workers 2 --steps 3 --batch-size 4"
    result = run_cli("capture", *flags.split(), "--input-size", "16", "--output", str(output))
    return output, result


@pytest.fixture(scope="module")
def tiny_capture_by_proxy(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The same job as ``tiny_capture``, recorded by the recording proxy."""
    output = tmp_path_factory.mktemp("tiny-proxy") / "tiny.tfgbtrace"
    flags = (
        "--model tiny --setup tf2-ps --ps 1 --workers 2 --steps 3 --batch-size 4 --recorder proxy "
        "--no-calibrate"
    )
    result = run_cli("capture", *flags.split(), "--input-size", "16", "--output", str(output))
    return output, result


def _step_tensors(trace: trace_model.Trace) -> list[Counter[tuple[object, ...]]]:
    """Per steady step: the tensors moved (who to whom, dtype, shape, content bytes)."""
    return [
        Counter(
            (
                trace.tasks[r.caller_task].name,
                trace.tasks[r.callee_task].name,
                r.tensor.dtype,
                r.tensor.shape,
                r.tensor.content_bytes,
            )
            for r in step.rpcs
            if r.method == RECV_TENSOR and r.tensor is not None
        )
        for step in trace.steps
    ]


@pytest.mark.tensorflow
def test_both_recorders_record_the_same_tensor_transfers(
    tiny_capture: tuple[Path, subprocess.CompletedProcess[str]],
    tiny_capture_by_proxy: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    (preloaded, first), (proxied, second) = tiny_capture, tiny_capture_by_proxy
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    by_library, by_proxy = trace_files.read_trace(preloaded), trace_files.read_trace(proxied)
    assert by_proxy.metadata.capture_method == "recording-proxy"
    # --no-calibrate: no step timed, none recorded.
    assert calibration.from_extra(by_proxy.metadata.extra) is None
    assert not by_proxy.partial
    assert check_physics(by_proxy).ok
    # Same job, two recorders: every step the same tensors between the same
    # tasks (edge names and step ids in the requests differ from run to run).
    assert _step_tensors(by_library) == _step_tensors(by_proxy)


@pytest.mark.tensorflow
def test_capturing_the_tiny_model_gives_a_trace_that_obeys_physics(
    tiny_capture: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    output, result = tiny_capture
    assert result.returncode == 0, result.stderr
    assert f"wrote {output}: 3 steady steps" in result.stdout
    assert "capture tiny:" in result.stderr  # the progress display
    trace = trace_files.read_trace(output)
    meta = trace.metadata
    assert not trace.partial
    assert (meta.model, meta.strategy, meta.synchronous) == ("tiny", "tf2-parameter-server", True)
    assert (meta.batch_size, meta.input_shape) == (4, (16, 16, 3))
    assert meta.trainable_parameters == 548_730
    assert meta.tensorflow_version.startswith("2.")
    assert meta.capture_method == "in-process-recorder"
    assert meta.command[:2] == ("tf-grpc-bench", "capture") and str(output) in meta.command
    assert meta.host and meta.tool_version
    # The compute calibration: the job's model, image and batch, timed on this machine
    # (and kept in its cache, so that a replay here finds the same figure).
    recorded = calibration.from_extra(meta.extra)
    assert recorded is not None and recorded.step_ns > 0
    # The job's 2 workers' step, timed by 2 processes at once, its kinds of work apart.
    assert recorded.workload.text == "tiny 16x16 batch 4 keras, 2 processes at once"
    assert [name for name, _ in recorded.parts] == list(calibration.PART_NAMES)
    here = machine_name(cpu_model(), os.cpu_count() or 0)
    # Kept in the cache, steady or marked unsteady.
    assert calibration.cached(here, recorded.workload) == recorded.step_ns
    datetime.datetime.fromisoformat(meta.created_utc)
    extra = dict(meta.extra)
    assert extra["unattributed_calls"] == "0" and extra["undecodable_messages"] == "0"
    # The machine whose compute the trace carries.
    assert (extra["cpu_model"], extra["cpus"]) == (cpu_model(), str(os.cpu_count()))
    assert [t.name for t in trace.tasks] == [
        "/job:ps/task:0",
        "/job:worker/task:0",
        "/job:worker/task:1",
        "/job:chief/task:0",
    ]
    # Start-up: the eager contexts and the initial variable values.
    startup_methods = Counter(r.short_method for r in trace.startup.rpcs)
    assert startup_methods["CreateContext"] >= 3 and startup_methods["Enqueue"] > 10
    assert len(trace.steps) == 3
    report = check_physics(trace)
    assert report.ok, report.format()
    variables = [
        {"dtype": d, "shape": list(s)}
        for d, s in (part.split(":") for part in extra[VARIABLES_EXTRA].split(";"))
        for s in [[int(x) for x in s.split("x")] if s else []]
    ]
    _tensors_match_variables(trace, variables)
    # Every steady step looks the same: the same tensors in the same amounts.
    per_step = [
        Counter((r.tensor.dtype, r.tensor.shape) for r in s.rpcs if r.tensor) for s in trace.steps
    ]
    assert per_step[0] == per_step[1] == per_step[2]
    workers = set(trace.tasks_of_job("worker"))
    ps = set(trace.tasks_of_job("ps"))
    for step in trace.steps:
        for rpc in step.rpcs:
            if rpc.method == RECV_TENSOR:
                assert (rpc.caller_task in workers) == (rpc.callee_task in ps)
                assert rpc.start_ns <= rpc.response_start_ns <= rpc.end_ns
    # How busy the machine and each task were over the steps (capture_cpu).
    cpu = capture_cpu.from_extra(meta.extra)
    assert cpu is not None and cpu.cores == os.cpu_count()
    span = max(s.end_ns for s in trace.steps) - min(s.start_ns for s in trace.steps)
    assert cpu.span_ns == span > 0
    assert [name for name, _ in cpu.task_cores] == ["ps:0", "worker:0", "worker:1", "chief:0"]
    assert 0 < cpu.busy_cores <= cpu.cores and cpu.tasks_cores > 0
    shown = run_cli("inspect", str(output))
    assert shown.returncode == 0 and "RecvTensor=50" in shown.stdout
    assert "captured by: in-process-recorder" in shown.stdout
    assert f"capture CPU: {cpu.text()}" in shown.stdout


@pytest.mark.tensorflow
@pytest.mark.parametrize("pacing", ["asap", "dependencies"])
def test_replaying_a_captured_trace_through_the_proxy_gives_the_trace_back(
    tiny_capture: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path, pacing: str
) -> None:
    """The round trip: the replayer's calls, captured, are the trace's, to the byte; in
    the trace's request order under closed-loop pacing, in causal (release) order, which
    may differ, under dependencies pacing."""
    output, result = tiny_capture
    assert result.returncode == 0, result.stderr
    trace = trace_files.read_trace(output)
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    servers = [ReplayServer().start() for _ in range(workload.server_count)]
    proxies = [
        RecordingProxy(
            target=("127.0.0.1", server.port), callee=f"ps:{number}", owner_pids=lambda: []
        )
        for number, server in enumerate(servers)
    ]
    try:
        for proxy in proxies:
            proxy.start()
        targets = ",".join(p.address for p in proxies)
        flags = (
            f"--runs 1 --warmup 0 --channels 1 --quiet --steps {len(trace.steps)} --pacing {pacing}"
        )
        replay = run_cli(
            "replay", str(output), "--benchmark", "ps-throughput", "--target", targets,
            *flags.split(), "--output-dir", str(tmp_path / "runs"),
        )  # fmt: skip
        assert replay.returncode == 0, replay.stderr
    finally:
        for proxy in proxies:
            proxy.stop()
        for server in servers:
            server.stop()
    calls = [c for proxy in proxies for c in proxy.collect(final=True)]
    for call in calls:
        if not call.method.startswith("/tf_grpc_bench.Control/"):  # the replayer's own
            assert call.complete and call.status_code == 0
    # Each replay worker process against each server, in the order it issued
    # its calls (HTTP/2 stream order), must be one (worker, ps) pair of the
    # trace's steps: same methods, same sizes, same order.
    captured = replayed_sequences(calls)
    expected = workload_sequences(workload)
    # The two workers with the ps, and (whole steps) the chief with each worker's stand-in.
    assert len(captured) == len(expected) == 4
    if pacing == "asap":
        assert sorted(captured.values()) == sorted(expected.values())
    else:
        assert sorted(sorted(s) for s in captured.values()) == sorted(
            sorted(s) for s in expected.values()
        )
    methods = Counter(m for sequence in captured.values() for m, _, _ in sequence)
    assert methods["/tensorflow.WorkerService/RecvTensor"] == 50 * len(trace.steps)


@pytest.mark.tensorflow
def test_capturing_resnet50_at_a_tiny_input_moves_its_parameters_each_way(tmp_path: Path) -> None:
    config = TrainingConfig(
        model="resnet50", ps=1, workers=2, steps=1, warmup_steps=1, input_size=32
    )
    result = capture_training(config, tmp_path / "r50.tfgbtrace", command=("pytest",))
    assert result.error is None
    assert result.trace.metadata.trainable_parameters > 20_000_000
    report = check_physics(result.trace, result.job_info)
    assert report.ok, report.format()
    # The bulk of the bytes never entered Python.
    assert result.uncopied_bytes > 0.9 * result.recorded_bytes


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("setup", "ps", "synchronous", "recorder"),
    [
        ("tf1-ps", 1, True, "preload"),
        ("tf1-ps", 1, True, "proxy"),
        ("mwms", 0, True, "preload"),
        ("mwms", 0, True, "proxy"),
        ("tf2-ps", 1, False, "preload"),
        ("tf1-ps", 1, False, "preload"),
    ],
)
def test_the_other_setups_are_captured_and_obey_their_physics(
    setup: str, ps: int, synchronous: bool, recorder: str, tmp_path: Path
) -> None:
    config = TrainingConfig(
        model="tiny", setup=setup, ps=ps, workers=2, steps=2, input_size=8, synchronous=synchronous
    )
    result = capture_training(
        config, tmp_path / f"{setup}.tfgbtrace", command=("pytest",), recorder=recorder
    )
    assert result.error is None
    extra = dict(result.trace.metadata.extra)
    assert extra["unattributed_calls"] == "0"
    report = check_physics(result.trace)
    assert report.ok, report.format()
    detection = result.trace.step_detection
    if not synchronous:
        # Asynchronous steps are worker-steps: every worker's, one by one.
        assert (detection.source, detection.unit) == ("step-id", trace_model.WORKER_STEP)
        assert len(result.trace.steps) == config.steps * config.workers
    else:
        assert (detection.source, detection.unit) == ("markers", trace_model.ROUND)
    methods = Counter(r.short_method for s in result.trace.steps for r in s.rpcs)
    # Parameter servers move tensors with RecvTensor, all-reduce with RecvBuf.
    assert methods["RecvBuf" if setup == "mwms" else "RecvTensor"] > 0


def _task_pids(workdir: Path) -> dict[str, int]:
    """Our own task processes, by the unique work directory in their command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(workdir).encode() in b" ".join(argv) and b"tf_grpc_bench.profiler.task" in argv:
            text = [a.decode() for a in argv]
            found[f"{text[text.index('--job') + 1]}:{text[text.index('--index') + 1]}"] = int(
                entry.name
            )
    return found


def _steady_markers(workdir: Path) -> int:
    try:
        lines = (workdir / "steps.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if json.loads(line)["phase"] == "steady")


def _error_lines(stderr: str) -> list[str]:
    """stderr without its warnings: a capture may warn, as on a busy machine that its
    compute calibration was unsteady, beside the one line of its error."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("warning: ")]


def _run_and_interfere(tmp_path: Path, action: str, *extra: str):
    workdir = tmp_path / "work"
    output = tmp_path / "partial.tfgbtrace"
    # No compute calibration: timed before the job starts, it is no part of what a crash or
    # a hang does to the capture, and it took a third of these tests' time.
    flags = f"--model tiny --steps 200 --input-size 8 --quiet --no-calibrate --workdir {workdir}"
    process = subprocess.Popen(
        [CLI, "capture", *flags.split(), "--output", str(output), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while _steady_markers(workdir) < 2:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "training never reached its steady steps"
            time.sleep(0.2)
        pids = _task_pids(workdir)
        if action == "crash":
            os.kill(pids["worker:0"], signal.SIGKILL)
        else:
            os.kill(pids["ps:0"], signal.SIGSTOP)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, stdout, stderr, output, workdir


@pytest.mark.tensorflow
@pytest.mark.parametrize("recorder", ["preload", "proxy"])
def test_a_task_that_crashes_ends_the_capture_with_a_partial_trace(
    tmp_path: Path, recorder: str
) -> None:
    code, stdout, stderr, output, workdir = _run_and_interfere(
        tmp_path, "crash", "--recorder", recorder
    )
    assert code == 4
    lines = _error_lines(stderr)
    assert len(lines) == 1 and "worker:0" in lines[0] and "partial trace written" in lines[0]
    trace = trace_files.read_trace(output)
    assert trace.partial and "worker:0" in trace.partial_reason
    assert len(trace.steps) >= 2
    assert "(PARTIAL)" in stdout
    assert _task_pids(workdir) == {}
    # The kept work directory's record files are cut to their records, the killed
    # task's too (1 GiB each, sparse, while the tasks ran).
    for tap in (workdir / "wiretap").glob("tap-*.bin") if recorder == "preload" else ():
        with open(tap, "rb") as handle:
            end = int.from_bytes(handle.read(64)[32:40], "little")
        assert tap.stat().st_size == end < 1 << 20, tap
    assert recorder != "preload" or any((workdir / "wiretap").glob("tap-*.bin"))


@pytest.mark.tensorflow
def test_a_task_that_hangs_ends_the_capture_with_a_partial_trace(tmp_path: Path) -> None:
    code, _, stderr, output, workdir = _run_and_interfere(tmp_path, "hang", "--step-timeout", "3")
    assert code == 4
    lines = _error_lines(stderr)
    assert len(lines) == 1 and "hangs" in lines[0]
    trace = trace_files.read_trace(output)
    assert trace.partial and len(trace.steps) >= 2
    assert _task_pids(workdir) == {}


def test_a_port_in_use_stops_everything_and_writes_a_partial_trace(tmp_path: Path) -> None:
    config = TrainingConfig(model="tiny", steps=1)
    tasks = plan_tasks(config)
    with socket.create_server(("0.0.0.0", tasks[1].bind_port)):
        result = capture_training(
            config, tmp_path / "t.tfgbtrace", tasks=tasks, workdir=tmp_path / "work"
        )
    assert isinstance(result.error, ServeError)
    assert str(tasks[1].bind_port) in str(result.error)
    trace = trace_files.read_trace(tmp_path / "t.tfgbtrace")
    assert trace.partial and trace.steps == ()
    assert _task_pids(tmp_path / "work") == {}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--model", "lenet"], "unknown model 'lenet'"),
        (["--model", "tiny", "--ps", "0"], "at least 1 parameter server"),
        (["--model", "tiny", "--setup", "mwms", "--ps", "1"], "no parameter servers"),
        (["--model", "tiny", "--workers", "40"], "too many"),
        (["--model", "tiny", "--steps", "x"], "expected an integer"),
        (["--model", "tiny", "--recorder", "tcpdump"], "invalid choice: 'tcpdump'"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path: Path, arguments: list[str], message: str) -> None:
    output = tmp_path / "never.tfgbtrace"
    result = run_cli("capture", *arguments, "--output", str(output), timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not output.exists()


def test_no_c_compiler_for_the_in_process_recorder_is_a_one_line_error(tmp_path: Path) -> None:
    """Nothing is started when the recorder's library cannot be built (fresh cache, no cc)."""
    output = tmp_path / "never.tfgbtrace"
    environment = dict(os.environ, CC=str(tmp_path / "no-cc"), XDG_CACHE_HOME=str(tmp_path))
    result = subprocess.run(
        [CLI, "capture", "--model", "tiny", "--output", str(output)],
        capture_output=True, text=True, timeout=60, check=False, env=environment,
    )  # fmt: skip
    assert result.returncode == 4
    (line,) = result.stderr.strip().splitlines()
    assert "cannot run the C compiler" in line and "--recorder proxy" in line
    assert not output.exists()
