"""Where each recorded RPC goes: start-up, a step or teardown (pure, no TensorFlow).

``profiler.assembly.phases`` places RPCs that the steps' own runs and collective keys
do not claim by time, and sets aside the calls of runs that are no step and the
session set-up calls, to teardown only after their worker's last step.  Each test
here builds the RPCs and windows by hand and writes out, by value, where every one
must go, the phases' bounds and the set-aside tallies.
"""

from __future__ import annotations

from collections.abc import Sequence

from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.profiler.assembly.phases import (
    SplitTraffic,
    detection,
    partial_reason,
    split_traffic,
)
from tf_grpc_bench.profiler.assembly.steps import FoundSteps, StepWindow
from tf_grpc_bench.trace import (
    MARKER,
    RECV_BUF,
    RECV_TENSOR,
    ROUND,
    WORKER_STEP,
    Rpc,
    SetAside,
    StepDetection,
    Task,
)

GET_STATUS = "/tensorflow.WorkerService/GetStatus"
TASKS = (
    Task(job="ps", index=0, address="127.0.0.1:1000"),
    Task(job="worker", index=0, address="127.0.0.1:1001"),
    Task(job="worker", index=1, address="127.0.0.1:1002"),
    Task(job="worker", index=2, address="127.0.0.1:1003"),
)
PS, WORKER_0, WORKER_1, WORKER_2 = 0, 1, 2, 3


def _rpc(
    start: int,
    *,
    caller: int = WORKER_0,
    callee: int = PS,
    method: str = RECV_TENSOR,
    request: int = 1,
    response: int = 1,
    response_start: int | None = None,
    end: int | None = None,
) -> Rpc:
    return Rpc(
        method=method,
        caller_task=caller,
        callee_task=callee,
        request_bytes=request,
        response_bytes=response,
        start_ns=start,
        response_start_ns=start if response_start is None else response_start,
        end_ns=start + 1 if end is None else end,
    )


def _session(start: int, *, caller: int = WORKER_0, end: int | None = None) -> Rpc:
    """A session set-up call (GetStatus) of 30 request and 4 response bytes."""
    return _rpc(start, caller=caller, method=GET_STATUS, request=30, response=4, end=end)


def _places(rpcs: Sequence[Rpc]) -> list[tuple[int, int, str]]:
    """(start, caller, method name) of each RPC, in the order the phase holds them."""
    return [(r.start_ns, r.caller_task, r.short_method) for r in rpcs]


def test_set_aside_calls_go_to_teardown_only_after_their_own_workers_last_step() -> None:
    """Worker 0's steps end at 500 (its earlier window ends last), worker 1's at 900;
    worker 2 has none, so the last step of all counts for it.  A call the ps makes
    counts for the worker it calls.  Whether a call is after is decided by its start."""
    windows = [
        StepWindow(number=0, start_ns=1100, end_ns=1500, step_id=11, task="worker:0"),
        StepWindow(number=1, start_ns=1200, end_ns=1300, step_id=12, task="worker:0"),
        StepWindow(number=2, start_ns=1400, end_ns=1900, step_id=13, task="worker:1"),
    ]
    placed = [
        # (rpc, its step id)
        (_session(450), 0),  # 1: before worker 0's last end
        (_session(500), 0),  # 2: at it: not after
        (
            _rpc(490, response_start=510, end=520, request=20, response=1000),
            21,
        ),  # 3: started before
        (_rpc(501, request=20, response=1000), 21),  # 4: after
        (_rpc(600, caller=PS, callee=WORKER_0, request=20, response=1000), 22),  # 5: ps to worker 0
        (_session(800, caller=WORKER_2), 0),  # 6: before the last end of all
        (_session(950, caller=WORKER_2, end=990), 0),  # 7: after it
        (_session(850, caller=WORKER_1), 0),  # 8: worker 1 still steps
        (_rpc(50, request=10, response=500), 0),  # by time: before the first step
        (_rpc(950, request=10, response=500, end=960), 0),  # by time: after the last
        (_rpc(50, caller=WORKER_0), 12),  # a step's own run, whatever its time
    ]
    split = split_traffic(
        [rpc for rpc, _ in placed],
        windows,
        origin_ns=1000,
        tasks=TASKS,
        step_ids=[step_id for _, step_id in placed],
        set_aside_runs={21: "moved no variables", 22: "moved no variables"},
    )
    assert _places(split.startup.rpcs) == [
        (50, WORKER_0, "RecvTensor"),
        (450, WORKER_0, "GetStatus"),
        (490, WORKER_0, "RecvTensor"),
        (500, WORKER_0, "GetStatus"),
        (800, WORKER_2, "GetStatus"),
        (850, WORKER_1, "GetStatus"),
    ]
    assert _places(split.teardown.rpcs) == [
        (501, WORKER_0, "RecvTensor"),
        (600, PS, "RecvTensor"),
        (950, WORKER_0, "RecvTensor"),
        (950, WORKER_2, "GetStatus"),
    ]
    assert [_places(step.rpcs) for step in split.steps] == [[], [(50, WORKER_0, "RecvTensor")], []]
    # Start-up runs from the capture's start to the first step; teardown from the last
    # step's end to the last end of its calls (990, not their starts).
    assert (split.startup.start_ns, split.startup.end_ns) == (0, 100)
    assert (split.teardown.start_ns, split.teardown.end_ns) == (900, 990)
    # Start-up's first, each phase's by reason; runs counted once; request + response bytes.
    assert split.set_aside == (
        SetAside(reason="before the first step", phase="startup", runs=0, rpcs=1, bytes=510),
        SetAside(reason="moved no variables", phase="startup", runs=1, rpcs=1, bytes=1020),
        SetAside(reason="session and graph set-up", phase="startup", runs=0, rpcs=4, bytes=136),
        SetAside(reason="after the last step", phase="teardown", runs=0, rpcs=1, bytes=510),
        SetAside(reason="moved no variables", phase="teardown", runs=2, rpcs=2, bytes=2040),
        SetAside(reason="session and graph set-up", phase="teardown", runs=0, rpcs=1, bytes=34),
    )


def test_a_call_at_a_windows_edge_is_in_it_and_one_in_a_gap_in_the_next() -> None:
    """Step 2 starts where step 1 ends: a call at that instant is in the later one."""
    windows = [
        StepWindow(number=0, start_ns=100, end_ns=200),
        StepWindow(number=1, start_ns=300, end_ns=500),
        StepWindow(number=2, start_ns=500, end_ns=600),
    ]
    rpcs = [_rpc(t) for t in (99, 100, 200, 250, 500, 600)]
    rpcs.append(_rpc(601, response_start=620, end=650))
    split = split_traffic(rpcs, windows, origin_ns=0)
    assert [r.start_ns for r in split.startup.rpcs] == [99]
    assert [[r.start_ns for r in step.rpcs] for step in split.steps] == [
        [100, 200],
        [250],
        [500, 600],
    ]
    assert [r.start_ns for r in split.teardown.rpcs] == [601]
    assert [(s.index, s.start_ns, s.end_ns) for s in split.steps] == [
        (0, 100, 200),
        (1, 300, 500),
        (2, 500, 600),
    ]
    assert (split.startup.start_ns, split.startup.end_ns) == (0, 100)
    assert (split.teardown.start_ns, split.teardown.end_ns) == (600, 650)
    assert split.set_aside == (
        SetAside(reason="before the first step", phase="startup", runs=0, rpcs=1, bytes=2),
        SetAside(reason="after the last step", phase="teardown", runs=0, rpcs=1, bytes=2),
    )


def test_a_step_that_began_before_the_capture_starts_at_its_start() -> None:
    windows = [
        StepWindow(number=0, start_ns=900, end_ns=1000),  # ended as the capture began
        StepWindow(number=1, start_ns=1000, end_ns=1200),
    ]
    split = split_traffic([], windows, origin_ns=1000)
    assert [(s.index, s.start_ns, s.end_ns) for s in split.steps] == [(0, 0, 0), (1, 0, 200)]
    assert (split.startup.start_ns, split.startup.end_ns) == (0, 0)
    assert (split.teardown.start_ns, split.teardown.end_ns) == (200, 200)


def test_without_steps_everything_is_start_up_until_its_last_call_ends() -> None:
    rpcs = [
        _rpc(10, response_start=20, end=40, request=3, response=70),
        _rpc(30, end=35, method=GET_STATUS, request=5, response=2),
    ]
    split = split_traffic(rpcs, [], origin_ns=0, tasks=TASKS)
    assert [r.start_ns for r in split.startup.rpcs] == [10, 30]
    assert split.steps == () and split.teardown.rpcs == ()
    assert (split.startup.start_ns, split.startup.end_ns) == (0, 40)
    assert (split.teardown.start_ns, split.teardown.end_ns) == (40, 40)
    # No step ids given: the calls are of no run.
    assert split.set_aside == (
        SetAside(reason="before the first step", phase="startup", runs=0, rpcs=1, bytes=73),
        SetAside(reason="session and graph set-up", phase="startup", runs=0, rpcs=1, bytes=7),
    )
    empty = split_traffic([], [], origin_ns=5)
    assert empty == SplitTraffic(
        startup=empty.startup, steps=(), teardown=empty.teardown, set_aside=()
    )
    assert (empty.startup.start_ns, empty.startup.end_ns) == (0, 0)
    assert (empty.teardown.start_ns, empty.teardown.end_ns) == (0, 0)


def _recv_buf(start: int, ident: int) -> Rpc:
    """A RecvBuf from worker 0 to worker 1; ``ident`` (its response size) names it."""
    return _rpc(start, caller=WORKER_0, callee=WORKER_1, method=RECV_BUF, response=ident)


def test_a_collective_key_between_the_steps_periods_goes_by_time_and_one_outside_by_key() -> None:
    windows = [
        StepWindow(number=0, start_ns=100, end_ns=200, instances=frozenset({(1, 10), (1, 11)})),
        StepWindow(number=1, start_ns=300, end_ns=400, instances=frozenset({(1, 14)})),
        StepWindow(number=2, start_ns=500, end_ns=600, instances=frozenset({(1, 16), (1, 17)})),
    ]
    calls: list[tuple[Rpc, tuple[int, int] | None]] = [
        (_recv_buf(350, 1), (1, 5)),  # before the first step's keys: start-up
        (_recv_buf(550, 2), (1, 11)),  # step 0's key, whatever its time
        (_recv_buf(550, 3), (1, 12)),  # in no step's keys, between them: by time
        (_recv_buf(350, 4), (1, 15)),  # the same, between steps 1 and 2
        (_recv_buf(150, 5), (1, 20)),  # after the last step's keys: teardown
        (_recv_buf(450, 6), None),  # no key: by time, in the gap before step 2
    ]
    split = split_traffic(
        [rpc for rpc, _ in calls], windows, origin_ns=0, instances=[key for _, key in calls]
    )
    assert [r.response_bytes for r in split.startup.rpcs] == [1]
    assert [sorted(r.response_bytes for r in s.rpcs) for s in split.steps] == [[2], [4], [3, 6]]
    assert [r.response_bytes for r in split.teardown.rpcs] == [5]
    assert split.set_aside == (
        SetAside(reason="before the first step", phase="startup", runs=0, rpcs=1, bytes=2),
        SetAside(reason="after the last step", phase="teardown", runs=0, rpcs=1, bytes=6),
    )


def test_one_collective_step_takes_its_keys_and_sends_the_others_before_or_after() -> None:
    windows = [StepWindow(number=0, start_ns=100, end_ns=200, instances=frozenset({(1, 10)}))]
    calls = [
        (_recv_buf(500, 1), (1, 10)),
        (_recv_buf(150, 2), (1, 3)),
        (_recv_buf(150, 3), (1, 30)),
    ]
    split = split_traffic(
        [rpc for rpc, _ in calls], windows, origin_ns=0, instances=[key for _, key in calls]
    )
    assert [[r.response_bytes for r in s.rpcs] for s in split.steps] == [[1]]
    assert [r.response_bytes for r in split.startup.rpcs] == [2]
    assert [r.response_bytes for r in split.teardown.rpcs] == [3]


def test_the_detection_names_the_unit_of_how_steps_were_found_unless_told() -> None:
    split = split_traffic([_rpc(5)], [], origin_ns=0)
    for source, unit in (
        ("markers", MARKER),
        ("step-id", WORKER_STEP),
        ("collective-instance", ROUND),
    ):
        found = FoundSteps(
            windows=(), set_aside_runs={}, source=source, rule=f"rule of {source}", candidates=4
        )
        assert detection(found, split) == StepDetection(
            source=source,
            unit=unit,
            rule=f"rule of {source}",
            candidates=4,
            set_aside=(SetAside(reason="before the first step", phase="startup", rpcs=1, bytes=2),),
        )
        assert detection(found, split, unit=ROUND).unit == ROUND


def test_a_partial_trace_says_the_runs_error_else_the_recorders_first() -> None:
    error = BenchError("task worker:0 exited with status 1")
    assert partial_reason(error, ["lost stream 3"]) == "task worker:0 exited with status 1"
    assert partial_reason(None, ["lost stream 3", "lost stream 5"]) == (
        "the recorder lost track of some traffic: lost stream 3"
    )
    assert partial_reason(None, []) == ""
