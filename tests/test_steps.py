"""Finding the steps of a capture from what training does (pure, no TensorFlow).

The recorded calls here are built as TensorFlow 1's parameter-server training
sends them (``tests/data/user_train_tf1.py`` captured: readiness checks of
boolean tensors, graph registration, training runs that pull the weights and
push gradients of the same shapes, a queue runner that moves a little, global
step reads at the end), with the byte layouts of TensorFlow's messages.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import TraceError
from tf_grpc_bench.profiler.assembly.phases import assemble_trace
from tf_grpc_bench.profiler.assembly.steps import (
    MOVED_NO_VARIABLES,
    SESSION_SETUP,
    WARMUP_STEP,
    find_runs,
    find_steps,
    run_windows,
    training_runs,
)
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.trace import (
    RECV_BUF,
    RECV_TENSOR,
    ROUND,
    WORKER_STEP,
    RunMetadata,
    SetAside,
    StepDetection,
    Task,
    Trace,
)
from tf_grpc_bench.trace_format import load_trace, trace_from_proto, trace_to_proto
from tf_grpc_bench.trace_json import trace_from_json_dict, trace_to_json_dict

DATA = Path(__file__).parent / "data"
TASKS = (
    Task(job="ps", index=0, address="127.0.0.1:1000"),
    Task(job="worker", index=0, address="127.0.0.1:1001"),
    Task(job="worker", index=1, address="127.0.0.1:1002"),
)
#: Worker task index -> the pid of its process (callers are found by pid).
PIDS = {0: 21, 1: 22}
CALLER_OF_PID = {21: 1, 22: 2}
RUN_GRAPH = "/tensorflow.WorkerService/RunGraph"
CLEANUP_GRAPH = "/tensorflow.WorkerService/CleanupGraph"
REGISTER_GRAPH = "/tensorflow.WorkerService/RegisterGraph"
FLOAT32, INT64, BOOL = 1, 9, 10
#: The small model of user_train_tf1.py: kernel, bias, BN gamma and beta, kernel, bias.
VARIABLES = [(16, 128), (128,), (128,), (128,), (128, 10), (10,)]
VARIABLE_BYTES = 4 * (16 * 128 + 3 * 128 + 128 * 10 + 10)


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


def _tensor_response(dtype: int, shape: tuple[int, ...], content_bytes: int) -> bytes:
    """The kept head of a RecvTensorResponse: it ends inside the tensor's content, whose
    declared length is the tensor's size."""
    dims = b"".join(_field(2, _field(1, size)) for size in shape)
    header = _field(1, dtype) + _field(2, dims) + _varint(4 << 3 | 2) + _varint(content_bytes)
    kept = b"\0" * min(content_bytes, 64)
    return _varint(1 << 3 | 2) + _varint(len(header) + content_bytes) + header + kept


class Clock:
    """Hands out call start times, 10 ns apart."""

    def __init__(self) -> None:
        self.now = 1_000

    def tick(self) -> int:
        self.now += 10
        return self.now


def _transfer(
    clock: Clock, worker: int, step_id: int, *, up: bool, dtype: int, shape: tuple[int, ...]
) -> RecordedCall:
    """A RecvTensor of one tensor between ps:0 and ``worker`` (``up``: pulled by the ps)."""
    ps_device = "/job:ps/replica:0/task:0/device:CPU:0"
    worker_device = f"/job:worker/replica:0/task:{worker}/device:CPU:0"
    source, destination = (worker_device, ps_device) if up else (ps_device, worker_device)
    key = f"{source};1;{destination};edge_{step_id}_t;0:0"
    size = 1
    for dim in shape:
        size *= dim
    content = size * (1 if dtype == BOOL else 8 if dtype == INT64 else 4)
    start = clock.tick()
    return RecordedCall(
        callee=f"worker:{worker}" if up else "ps:0",
        connection=worker * 2 + int(up),
        stream_id=1,
        caller_pid=None if up else PIDS[worker],
        method=RECV_TENSOR,
        start_ns=start,
        response_start_ns=start + 2,
        end_ns=start + 5,
        request_bytes=len(key) + 10,
        response_bytes=content + 20,
        request_messages=1,
        response_messages=1,
        status_code=0,
        reset=False,
        complete=True,
        request_head=_field(1, step_id) + _field(2, key.encode()),
        response_head=_tensor_response(dtype, shape, content),
    )


def _control(clock: Clock, worker: int, method: str, step_id: int = 0) -> RecordedCall:
    request = b"\x0a\x02gh"
    if method == RUN_GRAPH:
        request += _field(2, step_id)
    elif method == CLEANUP_GRAPH:
        request = _field(1, step_id)
    start = clock.tick()
    return RecordedCall(
        callee="ps:0",
        connection=10 + worker,
        stream_id=1,
        caller_pid=PIDS[worker],
        method=method,
        start_ns=start,
        response_start_ns=start + 2,
        end_ns=start + 5,
        request_bytes=len(request) + (5000 if method == REGISTER_GRAPH else 0),
        response_bytes=4,
        request_messages=1,
        response_messages=1,
        status_code=0,
        reset=False,
        complete=True,
        request_head=request,
    )


class Job:
    """Builds the calls of a TF1 parameter-server job, run by run."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.calls: list[RecordedCall] = []
        self.next_step_id = 1000

    def _run(self, worker: int, transfers: Sequence[tuple[bool, int, tuple[int, ...]]]) -> int:
        step_id = self.next_step_id
        self.next_step_id += 7
        self.calls.append(_control(self.clock, worker, RUN_GRAPH, step_id))
        for up, dtype, shape in transfers:
            self.calls.append(
                _transfer(self.clock, worker, step_id, up=up, dtype=dtype, shape=shape)
            )
        self.calls.append(_control(self.clock, worker, CLEANUP_GRAPH, step_id))
        return step_id

    def readiness_check(self, worker: int) -> int:
        """A session-start run: which variables are initialised (booleans, pulled)."""
        self.calls.append(_control(self.clock, worker, REGISTER_GRAPH))
        return self._run(worker, [(False, BOOL, ())] * 9)

    def training_step(self, worker: int) -> int:
        """Weights down, their gradients and the batch-norm statistics' updates up."""
        down = [(False, FLOAT32, shape) for shape in VARIABLES] + [(False, INT64, ())]
        up = [(True, FLOAT32, shape) for shape in VARIABLES] + [(True, FLOAT32, (128,))] * 2
        return self._run(worker, [*down, *up, (False, FLOAT32, (0,)), (True, FLOAT32, (0,))])

    def queue_runner(self, worker: int) -> int:
        """A run that recomputes the statistics: one kernel and bias down, two vectors up."""
        return self._run(
            worker,
            [
                (False, FLOAT32, (16, 128)),
                (False, FLOAT32, (128,)),
                (True, FLOAT32, (128,)),
                (True, FLOAT32, (128,)),
            ],
        )

    def global_step_read(self, worker: int) -> int:
        return self._run(worker, [(False, INT64, ()), (False, BOOL, ())])


def _assemble(job: Job, **options: object) -> Trace:
    return assemble_trace(
        job.calls,
        tasks=TASKS,
        caller_of_pid=CALLER_OF_PID,
        origin_ns=0,
        metadata=RunMetadata(model="tf1"),
        **options,  # type: ignore[arg-type]
    )


def _tensor_bytes(trace: Trace, index: int) -> int:
    return sum(r.tensor.content_bytes for r in trace.steps[index].rpcs if r.tensor is not None)


def test_a_training_run_moves_the_variables_and_a_readiness_check_does_not() -> None:
    job = Job()
    check = job.readiness_check(0)
    train = job.training_step(0)
    queue = job.queue_runner(0)
    end = job.global_step_read(0)
    runs = {run.step_id: run for run in find_runs(job.calls)}
    assert set(runs) == {check, train, queue, end}
    assert runs[train].task == "worker:0" and runs[train].variable_bytes == VARIABLE_BYTES
    assert runs[check].variable_bytes == 0 and runs[end].variable_bytes == 0
    assert 0 < runs[queue].variable_bytes < VARIABLE_BYTES / 10
    training, others = training_runs(list(runs.values()))
    assert [r.step_id for r in training] == [train]
    assert {r.step_id for r in others} == {check, queue, end}


@settings(max_examples=25, deadline=None)
@given(checks=st.lists(st.integers(0, 6), min_size=2, max_size=2), warmup=st.integers(0, 2))
def test_set_up_runs_go_to_start_up_however_many_there_are(checks: list[int], warmup: int) -> None:
    """Worker 1 joins late: its readiness checks happen while worker 0 trains."""
    job = Job()
    for _ in range(checks[0]):
        job.readiness_check(0)
    first = [job.training_step(0) for _ in range(2)]
    for _ in range(checks[1]):
        job.readiness_check(1)
    job.queue_runner(0)  # between worker 0's steps
    job.training_step(0)
    second = [job.training_step(1) for _ in range(2)]
    job.global_step_read(0)  # after worker 0's last step, while worker 1 trains
    job.training_step(1)
    job.global_step_read(1)
    trace = _assemble(job, warmup_steps=warmup)

    assert len(trace.steps) == 6 - warmup
    expected = VARIABLE_BYTES * 2 + 8 + 2 * 512  # + global step read, statistics' updates
    assert all(_tensor_bytes(trace, n) == expected for n in range(len(trace.steps)))
    for step in trace.steps:
        methods = sorted(r.short_method for r in step.rpcs if r.method != RECV_TENSOR)
        assert methods == ["CleanupGraph", "RunGraph"]  # the run's own, found by step id
        assert len({r.caller_task for r in step.rpcs if r.caller_task != 0}) == 1
    detection = trace.step_detection
    assert (detection.source, detection.unit) == ("step-id", WORKER_STEP)
    assert detection.candidates == 6 + sum(checks) + 3
    aside = {(s.phase, s.reason): s for s in detection.set_aside}
    assert aside[("startup", MOVED_NO_VARIABLES)].runs == sum(checks) + 1  # + the queue runner
    assert aside[("teardown", MOVED_NO_VARIABLES)].runs == 2  # each worker's last read
    if sum(checks):
        assert aside[("startup", SESSION_SETUP)].rpcs == sum(checks)  # graph registrations
    if warmup:
        assert aside[("startup", WARMUP_STEP)].runs == warmup
        assert first[0] not in _step_ids(trace)
    assert second[0] in _step_ids(trace)
    # Every RPC is in one place, and the record counts every one kept out of the steps.
    in_steps = sum(len(s.rpcs) for s in trace.steps)
    outside = len(trace.startup.rpcs) + len(trace.teardown.rpcs)
    assert in_steps + outside == len(job.calls)
    assert sum(s.rpcs for s in detection.set_aside) == outside


def _step_ids(trace: Trace) -> set[int]:
    """The step ids a trace's steps came from, by their RecvTensor edges (``edge_<id>_t``)."""
    return {
        int(r.tensor.edge_name.split("_")[1])
        for step in trace.steps
        for r in step.rpcs
        if r.tensor is not None and r.tensor.edge_name
    }


def test_with_markers_a_run_that_moves_no_variables_stays_out_of_the_marked_step() -> None:
    job = Job()
    job.readiness_check(0)
    begin = job.clock.now
    job.training_step(0)
    job.queue_runner(0)  # inside the marker, moves (almost) nothing of the model
    end = job.clock.now
    marker = StepMarker(task="worker:0", step=0, phase="steady", start_ns=begin, end_ns=end)
    trace = _assemble(job, markers=[marker], unit=ROUND)
    assert len(trace.steps) == 1 and _tensor_bytes(trace, 0) == 2 * VARIABLE_BYTES + 8 + 1024
    assert (trace.step_detection.source, trace.step_detection.unit) == ("markers", ROUND)


def test_asynchronous_steps_within_markers_are_as_many_as_the_markers() -> None:
    job = Job()
    job.training_step(0)  # a warm-up step
    begin = job.clock.now
    runs = [job.training_step(worker) for worker in (0, 1, 0)]
    markers = [
        StepMarker(task="worker:0", step=1, phase="steady", start_ns=begin, end_ns=job.clock.now),
        StepMarker(task="worker:1", step=1, phase="steady", start_ns=begin, end_ns=job.clock.now),
    ]
    found = find_steps(job.calls, markers=markers, per_run=True)
    assert [w.step_id for w in found.windows] == runs[1:]  # the last two: as many as markers
    assert [w.task for w in found.windows] == ["worker:1", "worker:0"]
    assert found.source == "step-id"


def test_a_launcher_job_without_markers_has_no_steps() -> None:
    job = Job()
    job.training_step(0)
    assert find_steps(job.calls, need_markers=True).windows == ()
    assert len(find_steps(job.calls).windows) == 1


def test_collectives_give_the_steps_when_no_run_moves_variables() -> None:
    def recv_buf(start: int, instance: int, size: int) -> RecordedCall:
        request = _field(2, f"1:{instance}:0:0:0:1:1".encode()) + _field(3, size)
        return RecordedCall(
            callee="worker:1", connection=0, stream_id=1, caller_pid=21, method=RECV_BUF,
            start_ns=start, response_start_ns=start, end_ns=start + 5, request_bytes=20,
            response_bytes=size, request_messages=1, response_messages=1, status_code=0,
            reset=False, complete=True, request_head=request,
        )  # fmt: skip

    calls = [recv_buf(10 * i, 100 + i, 64 * (i + 1)) for i in range(3)]  # broadcasts
    calls += [recv_buf(1000 + 10 * i, 200 + i, 4096) for i in range(4)]
    found = find_steps(calls, warmup_steps=1)
    assert found.source == "collective-instance"
    assert (len(found.windows), found.candidates) == (3, 4)
    assert [w.number for w in found.windows] == [0, 1, 2]


def test_a_collective_call_goes_to_the_step_of_its_instance_key_whatever_its_time() -> None:
    """Two workers all-reduce each step; worker 1 lags, so its last RecvBuf of a step
    starts after worker 0's first of the next step (seen in a real 2-worker
    MultiWorkerMirrored capture): by time it would go to the next step."""

    def recv_buf(start: int, instance: int, caller: int, size: int) -> RecordedCall:
        request = _field(2, f"1:{instance}:0:0:0:1:1".encode()) + _field(3, size)
        return RecordedCall(
            callee=f"worker:{1 - caller}", connection=caller, stream_id=1,
            caller_pid=PIDS[caller], method=RECV_BUF, start_ns=start,
            response_start_ns=start + 1, end_ns=start + 5, request_bytes=20,
            response_bytes=size, request_messages=1, response_messages=1, status_code=0,
            reset=False, complete=True, request_head=request,
        )  # fmt: skip

    calls = [recv_buf(10 * i, 100 + i, 0, 64) for i in range(2)]  # broadcasts
    for step in range(4):  # the first is warm-up
        base = 1000 + 100 * step
        calls += [
            recv_buf(base, 200 + 2 * step, 0, 4096),
            recv_buf(base + 10, 201 + 2 * step, 0, 4000),
            recv_buf(base + 20, 200 + 2 * step, 1, 4096),
            recv_buf(base + 120, 201 + 2 * step, 1, 4000),  # after the next step began
        ]
    trace = assemble_trace(
        calls, tasks=TASKS, caller_of_pid=CALLER_OF_PID, origin_ns=0,
        metadata=RunMetadata(model="mwms"), warmup_steps=1,
    )  # fmt: skip
    assert trace.step_detection.source == "collective-instance"
    assert len(trace.steps) == 3
    for step in trace.steps:
        assert sorted((r.caller_task, r.callee_task, r.response_bytes) for r in step.rpcs) == [
            (1, 2, 4000), (1, 2, 4096), (2, 1, 4000), (2, 1, 4096),
        ]  # fmt: skip
    # The broadcasts and the warm-up step (its lagging call too) are start-up.
    assert len(trace.startup.rpcs) == 2 + 4 and not trace.teardown.rpcs


def test_step_detection_round_trips_and_needs_format_version_2(tmp_path: Path) -> None:
    job = Job()
    job.readiness_check(0)
    job.training_step(0)
    trace = _assemble(job)
    assert trace.format_version == 3 and not trace.step_detection.empty
    assert trace_from_proto(trace_to_proto(trace)) == trace
    assert trace_from_json_dict(trace_to_json_dict(trace)) == trace
    path = trace_files.write_trace(trace, tmp_path / "t.tfgbtrace")
    assert trace_files.read_trace(path) == trace
    with pytest.raises(TraceError, match="format version 2"):
        dataclasses.replace(trace, format_version=1)
    with pytest.raises(ValueError, match="startup or teardown"):
        SetAside(reason="x", phase="step")


def test_a_version_1_trace_still_reads_and_says_its_unit_in_extra() -> None:
    """``tests/data/trace-v1.tfgbtrace`` was written by the version 1 writer."""
    with open(DATA / "trace-v1.tfgbtrace", "rb") as stream:
        trace = load_trace(stream, source="trace-v1")
    assert trace.format_version == 1
    assert trace.step_detection == StepDetection()
    assert trace.step_unit == WORKER_STEP  # from metadata.extra["step_unit"]
    assert len(trace.steps) == 2


def test_asynchronous_steps_set_aside_the_runs_outside_and_before_the_markers() -> None:
    from tf_grpc_bench.profiler.assembly.steps import OUTSIDE_MARKERS

    job = Job()
    check = job.readiness_check(0)
    warm = job.training_step(0)
    begin = job.clock.now
    runs = [job.training_step(worker) for worker in (0, 1, 0)]
    markers = [
        StepMarker(task="worker:0", step=1, phase="steady", start_ns=begin, end_ns=job.clock.now),
        StepMarker(task="worker:1", step=1, phase="steady", start_ns=begin, end_ns=job.clock.now),
    ]
    found = find_steps(job.calls, markers=markers, per_run=True)
    assert found.set_aside_runs == {
        check: MOVED_NO_VARIABLES,
        warm: OUTSIDE_MARKERS,
        runs[0]: OUTSIDE_MARKERS,
    }
    assert [(w.number, w.step_id) for w in found.windows] == [(0, runs[1]), (1, runs[2])]
    assert found.candidates == 5  # every run, the readiness check included
    # 6 variables and a step counter down, 6 gradients and 2 statistics up, 2 empty.
    assert [r.transfers for r in find_runs(job.calls)] == [9, 17, 17, 17, 17]
    # Without per_run the markers are the steps, whatever runs they hold: both markers are
    # of step 1, one window.
    by_markers = find_steps(job.calls, markers=markers)
    assert by_markers.source == "markers" and by_markers.candidates == 1
    assert [(w.number, w.start_ns) for w in by_markers.windows] == [(1, begin)]
    assert by_markers.set_aside_runs == {check: MOVED_NO_VARIABLES}


def test_a_launcher_job_without_markers_still_sets_aside_its_idle_runs() -> None:
    job = Job()
    check = job.readiness_check(0)
    job.training_step(0)
    found = find_steps(job.calls, need_markers=True)
    assert (found.windows, found.source, found.candidates) == ((), "markers", 0)
    assert found.set_aside_runs == {check: MOVED_NO_VARIABLES}


def test_collective_steps_set_nothing_aside_without_runs() -> None:
    def recv_buf(start: int, instance: int) -> RecordedCall:
        request = _field(2, f"1:{instance}:0:0:0:1:1".encode()) + _field(3, 4096)
        return RecordedCall(
            callee="worker:1", connection=0, stream_id=1, caller_pid=21, method=RECV_BUF,
            start_ns=start, response_start_ns=start, end_ns=start + 5, request_bytes=20,
            response_bytes=4096, request_messages=1, response_messages=1, status_code=0,
            reset=False, complete=True, request_head=request,
        )  # fmt: skip

    found = find_steps([recv_buf(1000 + 10 * i, 200 + i) for i in range(3)])
    assert found.source == "collective-instance" and found.set_aside_runs == {}


def test_a_run_spans_its_own_tasks_transfers_from_the_first_start_to_the_last_end() -> None:
    job = Job()
    first = job.training_step(0)
    second = job.queue_runner(1)
    transfers = {
        step_id: [c for c in job.calls if c.method == RECV_TENSOR and c.request_head[1:3] == sid]
        for step_id, sid in ((first, _varint(first)), (second, _varint(second)))
    }
    runs = find_runs(job.calls)
    assert [(r.step_id, r.start_ns, r.end_ns) for r in runs] == [
        (step_id, calls[0].start_ns, calls[-1].end_ns) for step_id, calls in transfers.items()
    ]
    windows = run_windows(runs)
    assert [(w.number, w.step_id, w.task, w.start_ns, w.end_ns) for w in windows] == [
        (0, first, "worker:0", transfers[first][0].start_ns, transfers[first][-1].end_ns),
        (1, second, "worker:1", transfers[second][0].start_ns, transfers[second][-1].end_ns),
    ]


def test_a_run_that_moves_no_tensor_spans_its_own_calls() -> None:
    job = Job()
    job.training_step(0)
    idle = job._run(1, [])
    controls = [c for c in job.calls if c.connection == 11]
    (run,) = [r for r in find_runs(job.calls) if r.step_id == idle]
    assert (run.task, run.transfers, run.variable_bytes) == ("", 0, 0)
    assert (run.start_ns, run.end_ns) == (controls[0].start_ns, controls[-1].end_ns)


def test_assembly_keeps_every_training_run_and_calls_the_trace_whole_unless_told() -> None:
    job = Job()
    job.readiness_check(0)
    runs = [job.training_step(worker) for worker in (0, 1)]
    job.global_step_read(0)
    trace = _assemble(job)
    assert len(trace.steps) == 2 and runs[0] in _step_ids(trace)  # no warm-up by default
    assert (trace.partial, trace.partial_reason) == (False, "")
    detection = trace.step_detection
    assert (detection.source, detection.unit, detection.candidates) == ("step-id", WORKER_STEP, 4)
    assert detection.rule.startswith("a step is a TensorFlow run that moves the model's variables")
    assert detection.rule.endswith("; the first 0 training runs are warm-up")


def test_assembly_passes_asynchronous_steps_and_the_need_for_markers_on() -> None:
    job = Job()
    job.training_step(0)
    begin = job.clock.now
    runs = [job.training_step(worker) for worker in (0, 1, 0)]
    markers = [
        StepMarker(task=f"worker:{w}", step=1, phase="steady", start_ns=begin, end_ns=job.clock.now)
        for w in (0, 1)
    ]
    # Per run: as many steps as steady markers, the latest training runs among them.
    per_run = _assemble(job, markers=markers, per_run=True)
    assert per_run.step_detection.source == "step-id"
    assert len(per_run.steps) == 2 and runs[1] in _step_ids(per_run)
    assert runs[0] not in _step_ids(per_run)
    # Needing markers and given none: no steps, every call start-up.
    unmarked = _assemble(job, need_markers=True)
    assert (unmarked.step_detection.source, unmarked.steps) == ("markers", ())
    assert len(unmarked.startup.rpcs) == len(job.calls)


def test_a_jobs_variables_come_from_its_traffic_unless_its_metadata_gives_them() -> None:
    from tf_grpc_bench.profiler.assembly.variables import FROM_TRAFFIC
    from tf_grpc_bench.profiler.physics import VARIABLES_SOURCE_EXTRA, decode_variables

    job = Job()
    job.training_step(0)
    job.training_step(1)
    parameters = sum(math.prod(shape) for shape in VARIABLES)  # 3,722
    derived = _assemble(job)
    extra = dict(derived.metadata.extra)
    assert decode_variables(extra["trainable_variables"]) == [
        ("float32", shape) for shape in VARIABLES
    ]
    assert extra[VARIABLES_SOURCE_EXTRA] == FROM_TRAFFIC
    assert derived.metadata.trainable_parameters == parameters == 3722
    # A count the job gave stays, with the variables the traffic shows.
    counted = assemble_trace(
        job.calls, tasks=TASKS, caller_of_pid=CALLER_OF_PID, origin_ns=0,
        metadata=RunMetadata(model="tf1", trainable_parameters=99),
    )  # fmt: skip
    assert counted.metadata.trainable_parameters == 99
    assert dict(counted.metadata.extra)[VARIABLES_SOURCE_EXTRA] == FROM_TRAFFIC
    # Variables the job gave stay, and nothing says they came from the traffic.
    given = assemble_trace(
        job.calls, tasks=TASKS, caller_of_pid=CALLER_OF_PID, origin_ns=0,
        metadata=RunMetadata(model="tf1", extra=(("trainable_variables", "float32:4x4"),)),
    )  # fmt: skip
    assert dict(given.metadata.extra)["trainable_variables"] == "float32:4x4"
    assert VARIABLES_SOURCE_EXTRA not in dict(given.metadata.extra)
    assert given.metadata.trainable_parameters == 0
