"""The dependency model of a replayed step: inference rules and the release tracker."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench.critical_path import captured_critical_path
from tf_grpc_bench.dependencies import (
    Dependencies,
    TimedCall,
    infer_dependencies,
    is_sync_token,
    is_variable_read,
    source_op,
)
from tf_grpc_bench.dependency_tracker import DependencyTracker, StepPath

MS = 1_000_000


def _call(
    start: int, ready: int, end: int, *, server: int, back: bool, tensor: bool = True, op: str = ""
) -> TimedCall:
    """Times in ms; ``back``: a reversed call (the ps pulled it from the worker)."""
    return TimedCall(
        server=server,
        reversed_direction=back,
        carries_tensor=tensor,
        start_ns=start * MS,
        response_start_ns=ready * MS,
        end_ns=end * MS,
        source_op=op,
    )


def _pull(start: int, ready: int, end: int, server: int = 0, tensor: bool = True) -> TimedCall:
    return _call(start, ready, end, server=server, back=False, tensor=tensor)


def _push(start: int, ready: int, end: int, server: int = 0, op: str = "") -> TimedCall:
    return _call(start, ready, end, server=server, back=True, op=op)


def _read(start: int, ready: int, end: int, server: int = 0) -> TimedCall:
    """A pull of a variable (its op a ``ReadVariableOp``)."""
    return _call(start, ready, end, server=server, back=False, op="model/dense/ReadVariableOp")


# A PS step as training makes it: two variables pulled, compute, two gradients
# pulled by the ps (requested early, answered when they exist), one variable
# read back after the update.
STEP = (
    _pull(1, 2, 10),  # 0: variable a arrives at 10 ms
    _pull(1, 3, 20),  # 1: variable b arrives at 20 ms
    _push(2, 50, 60),  # 2: gradient a leaves at 50 ms (30 ms after the last variable)
    _push(2, 55, 70),  # 3: gradient b leaves at 55 ms
    _pull(65, 75, 80),  # 4: a read after gradient a reached the ps (60 ms)
)


def test_a_gradient_waits_for_every_variable_that_arrived_before_it_left() -> None:
    deps = infer_dependencies(STEP)
    assert deps[2] == Dependencies(
        ready_offset_ns=50 * MS,
        arrival_offset_ns=60 * MS,
        lands_on_worker=False,
        transfer_offset_ns=50 * MS,
        is_arrival=True,
        arrival_rank=0,
        after_worker_arrivals=2,
        after_server_arrivals=0,
    )
    assert deps[3].after_worker_arrivals == 2
    assert deps[3].arrival_rank == 1


def test_a_pull_waits_for_gradients_that_reached_its_ps_before_the_variable_left() -> None:
    deps = infer_dependencies(STEP)
    # Variable read at 75 ms: gradient a (arrived 60 ms) and b (70 ms) were at the ps.
    assert deps[4].after_server_arrivals == 2
    # Its request left the worker at 65 ms, after both variables had arrived.
    assert deps[4].after_worker_arrivals == 2
    # The first pulls wait for nothing.
    assert (deps[0].after_worker_arrivals, deps[0].after_server_arrivals) == (0, 0)
    assert (deps[1].after_worker_arrivals, deps[1].after_server_arrivals) == (0, 0)


def test_each_wait_is_keyed_on_its_own_timestamp_of_the_call() -> None:
    """A pull asked for before an arrival at its worker and answered after it, and a
    gradient reaching the ps between a pull's request and its response and another
    after it: start, response start and end of each call give different counts, and
    each wait takes the one the rule names (worked out by hand)."""
    deps = infer_dependencies(
        (
            _pull(1, 2, 10),  # 0: variable a, at the worker at 10 ms
            _pull(1, 3, 20),  # 1: variable b, at 20 ms
            _push(2, 12, 18),  # 2: gradient g leaves at 12 ms, at the ps at 18 ms
            _pull(15, 25, 30),  # 3: asked at 15 ms (a in), answered at 25 ms (b and g in)
            _push(2, 26, 27),  # 4: gradient h leaves at 26 ms, at the ps at 27 ms
        )
    )
    # (waits for worker arrivals, for server arrivals, place in its arrival list):
    # a pull waits for the worker's arrivals before its request left (start) and the
    # ps's before its response left (response start); a gradient for the worker's
    # arrivals before it left (response start).
    assert [(d.after_worker_arrivals, d.after_server_arrivals, d.arrival_rank) for d in deps] == [
        (0, 0, 0),
        (0, 0, 1),
        (1, 0, 0),
        (1, 1, 2),
        (2, 0, 1),
    ]


def test_an_arrival_at_the_very_instant_data_leaves_is_not_waited_for() -> None:
    deps = infer_dependencies((_pull(0, 0, 10), _push(0, 10, 12)))
    assert deps[1].after_worker_arrivals == 0


def test_control_calls_wait_but_are_not_waited_for() -> None:
    control = _pull(
        0, 0, 300, tensor=False
    )  # e.g. RunComponentFunction, answered when the ps is done
    deps = infer_dependencies((control, _pull(1, 5, 10), _push(1, 40, 45)))
    assert deps[0].is_arrival is False
    assert deps[2].after_worker_arrivals == 1  # only the tensor that arrived
    assert deps[0].ready_offset_ns == 0  # a control call's data is its request


def test_times_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="call 0: times out of order"):
        infer_dependencies((_pull(5, 4, 10),))


# --------------------------------------------------------------------------
# When data was ready: queueing in the trace is not compute.


@pytest.mark.parametrize(
    ("edge", "op"),
    [
        ("edge_6836_sgd/IdentityN", "sgd/IdentityN"),
        ("edge_12_resnet50_1/conv1_conv_1/convolution/ReadVariableOp",
         "resnet50_1/conv1_conv_1/convolution/ReadVariableOp"),
        ("edge_x_sgd/IdentityN", ""),  # not an edge number
        ("sgd/IdentityN", ""),
        ("", ""),
    ],
)  # fmt: skip
def test_the_source_op_is_the_edge_name_without_its_number(edge: str, op: str) -> None:
    assert source_op(edge) == op


@pytest.mark.parametrize(
    ("op", "read"),
    [
        ("m/conv/ReadVariableOp", True),
        ("m/bn/Cast_2/ReadVariableOp_1", True),
        ("GroupCrossDeviceControlEdges_0/Identity", False),
        ("sync_token_q_Dequeue", False),
        ("ReadVariableOpOops/Identity", False),
        ("", False),
    ],
)
def test_which_ops_read_a_variable(op: str, read: bool) -> None:
    assert is_variable_read(op) is read


# Two gradients out of one IdentityN, the trace sees the second leave 25 ms after
# the first (the connection was draining the first): both were ready at 40 ms.
# A variable read in between (30 ms) arrived before the first left.
OPTIMIZER_STEP = (
    _read(1, 2, 30),  # 0
    _push(2, 40, 60, server=0, op="sgd/IdentityN"),  # 1: first output leaves at 40
    _read(1, 3, 50, server=1),  # 2: arrives at 50, between the two
    _push(2, 65, 90, server=1, op="sgd/IdentityN"),  # 3: seen leaving at 65
    _push(2, 70, 95, server=1, op="model/other_op"),  # 4: another op: its own time
)


def test_outputs_of_one_op_are_ready_when_its_first_output_left() -> None:
    deps = infer_dependencies(OPTIMIZER_STEP)
    assert deps[3].ready_offset_ns == 40 * MS
    # So it waits for what had arrived by 40 ms only (not the read that arrived at 50).
    assert deps[3].after_worker_arrivals == 1
    assert deps[1].ready_offset_ns == 40 * MS
    # Another op's output keeps its own time, and what arrived before it.
    assert deps[4].ready_offset_ns == 70 * MS
    assert deps[4].after_worker_arrivals == 2


def test_an_output_is_never_ready_before_it_was_asked_for() -> None:
    late_ask = (
        _push(2, 40, 60, op="sgd/IdentityN"),
        _push(45, 65, 90, server=1, op="sgd/IdentityN"),  # the ps asked at 45
    )
    assert infer_dependencies(late_ask)[1].ready_offset_ns == 45 * MS


def test_ops_are_grouped_per_sender() -> None:
    # The same op name on two ps tasks is two ops: pulls keep their own times.
    named = (
        _call(1, 5, 10, server=0, back=False, op="ps/Identity"),
        _call(1, 20, 30, server=1, back=False, op="ps/Identity"),
    )
    assert [d.ready_offset_ns for d in infer_dependencies(named)] == [5 * MS, 20 * MS]


def test_a_variable_read_is_ready_when_asked_whatever_reached_the_ps_before() -> None:
    calls = (
        _push(0, 1, 5, op="model/bn/add"),  # a batch-norm statistic reaches the ps at 5 ms
        _read(2, 40, 41),  # asked at 2; the ps answered at 40 (its queue)
        _pull(2, 40, 41),  # not a read (no op known): answered when it existed
    )
    deps = infer_dependencies(calls)
    assert (deps[1].ready_offset_ns, deps[1].after_server_arrivals) == (2 * MS, 0)
    assert (deps[2].ready_offset_ns, deps[2].after_server_arrivals) == (40 * MS, 1)


def test_on_a_slow_link_the_queued_gradient_leaves_with_the_first() -> None:
    # Every transfer takes 100 ms.  The reads arrive at 101 and 101; the first
    # gradient leaves 10 ms after (its gap in the trace: 40 - 30), and the
    # second with it, not 25 ms later.
    _, released, _ = _replay(OPTIMIZER_STEP, transfer_ns=dict.fromkeys(range(5), 100 * MS))
    begin = 1000 * MS
    assert released[1] - begin == released[3] - begin == 111 * MS


def _replay(
    calls: tuple[TimedCall, ...],
    *,
    transfer_ns: dict[int, int],
    scale: float = 1.0,
    period_ms: int = 100,
    begin: int = 1000 * MS,
    step_compute_ns: int = 0,
    round_gradients: tuple[int, ...] = (),
) -> tuple[DependencyTracker, dict[int, int], dict[int, int]]:
    """Drive a tracker as the driver does, with each call taking ``transfer_ns[i]``."""
    deps = infer_dependencies(calls, round_gradient_arrivals=round_gradients)
    tracker = DependencyTracker(
        deps,
        servers=[c.server for c in calls],
        step_begin_ns=begin,
        period_ns=period_ms * MS,
        compute_scale=scale,
        step_compute_ns=step_compute_ns,
    )
    released: dict[int, int] = {}
    done: dict[int, int] = {}
    # As the driver does: calls join a heap by release time once what they wait
    # for has arrived; the earliest event (a release or a completion) goes next.
    due: list[tuple[int, int]] = []
    in_flight: list[tuple[int, int]] = []

    def schedule() -> None:
        for index in tracker.take_releasable():
            release = tracker.release_ns(index)
            assert release is not None
            heapq.heappush(due, (release, index))

    schedule()
    while due or in_flight:
        if due and (not in_flight or due[0][0] <= in_flight[0][0]):
            release, index = heapq.heappop(due)
            released[index] = release
            heapq.heappush(in_flight, (release + transfer_ns[index], index))
            continue
        end, index = heapq.heappop(in_flight)
        tracker.complete(index, end)
        done[index] = end
        schedule()
    return tracker, released, done


def test_on_a_link_as_fast_as_the_trace_the_replay_keeps_the_trace_times() -> None:
    transfers = {i: c.end_ns - (c.response_start_ns) for i, c in enumerate(STEP)}
    tracker, released, _done = _replay(STEP, transfer_ns=transfers)
    begin = 1000 * MS
    assert {i: t - begin for i, t in released.items()} == {
        i: c.response_start_ns for i, c in enumerate(STEP)
    }
    assert tracker.next_step_begin_ns() - begin == 100 * MS


def test_on_a_slow_link_gradients_leave_after_the_variables_plus_the_compute() -> None:
    # Every transfer takes 100 ms: variables arrive at 102 and 103 ms.
    tracker, released, done = _replay(STEP, transfer_ns=dict.fromkeys(range(5), 100 * MS))
    begin = 1000 * MS
    assert (done[0] - begin, done[1] - begin) == (102 * MS, 103 * MS)
    # Gradient a left 30 ms after the last variable it waited for arrived (b, at
    # 20 ms): that compute is kept after the replay's last arrival, 103 + 30.  The
    # 40 ms since variable a are not all compute: 10 of them were waiting for b.
    assert released[2] - begin == 133 * MS
    assert released[3] - begin == 138 * MS  # 103 + (55 - 20)
    # The variable read waits for the gradients at the ps too; the last of all it
    # waited for arrived at 70 ms in the trace (read at 75) and at 238 here: 238 + 5.
    assert released[4] - begin == 243 * MS
    # The step ends with everything done plus the recorded tail (80 -> 100 ms).
    assert done[4] - begin == 343 * MS
    assert tracker.next_step_begin_ns() - begin == 363 * MS


def test_an_early_arrival_that_comes_late_does_not_add_the_wait_it_overlapped() -> None:
    # In the trace variable a arrived at 10 ms and b at 20; the gradient left at 50.
    # Here a arrives last (at 150, b at 103): the gradient keeps the 30 ms that
    # followed the last arrival, and leaves at 180, not 150 + 40.
    _, released, done = _replay(
        STEP, transfer_ns={0: 148 * MS, 1: 100 * MS, 2: 100 * MS, 3: 100 * MS, 4: 100 * MS}
    )
    begin = 1000 * MS
    assert (done[0] - begin, done[1] - begin) == (150 * MS, 103 * MS)
    assert released[2] - begin == 180 * MS


# TF1's PS step on loopback: the forward pass ran while the last layer's variable b
# was still on its way, so the first gradient left 5 ms after b arrived, 15 ms after
# variable a (the first layer's).  b is a variable read (ready when asked, at 1 ms);
# its data was on the way for the last 2 ms only: the rest of the 10 ms from a's
# arrival to b's was compute.
FORWARD_OVERLAPPED = (
    _pull(1, 2, 10),  # 0: variable a, first layer
    _read(1, 18, 20),  # 1: variable b, last layer
    _push(2, 25, 60),  # 2: the first gradient
)


def test_the_input_last_here_keeps_what_followed_it_in_the_trace_up_to_a_step() -> None:
    # Here a arrives last (150; b at 101): the forward pass that followed a in the
    # trace runs after it: 15 ms, less the 2 ms the trace spent receiving b.  Without
    # a step's compute to bound it, the replay keeps only the 5 ms that followed the
    # trace's last arrival.
    transfers = {0: 148 * MS, 1: 100 * MS, 2: 100 * MS}
    begin = 1000 * MS
    _, released, done = _replay(FORWARD_OVERLAPPED, transfer_ns=transfers)
    assert (done[0] - begin, done[1] - begin) == (150 * MS, 101 * MS)
    assert released[2] - begin == 155 * MS
    _, released, _ = _replay(FORWARD_OVERLAPPED, transfer_ns=transfers, step_compute_ns=30 * MS)
    assert released[2] - begin == 163 * MS
    # A whole step's compute bounds it: 8 ms here, so 150 + 8.
    _, released, _ = _replay(FORWARD_OVERLAPPED, transfer_ns=transfers, step_compute_ns=8 * MS)
    assert released[2] - begin == 158 * MS
    # It never keeps less than what followed the trace's last arrival: 150 + 5.
    _, released, _ = _replay(FORWARD_OVERLAPPED, transfer_ns=transfers, step_compute_ns=2 * MS)
    assert released[2] - begin == 155 * MS
    # Scaled like every gap: half the compute (a now leaves at 1 ms and arrives at
    # 149), 149 + 6.5.
    _, released, done = _replay(
        FORWARD_OVERLAPPED, transfer_ns=transfers, step_compute_ns=30 * MS, scale=0.5
    )
    assert done[0] - begin == 149 * MS
    assert released[2] - begin == 155.5 * MS


def test_the_time_the_trace_spent_receiving_later_inputs_is_not_kept_as_compute() -> None:
    # On a link the later inputs are on the way for most of the time after a arrived:
    # b from 12 to 16 ms, c from 14 to 20 (together 12 to 20: 8 ms, not 4 + 6).  Of
    # the 15 ms from a's arrival to the gradient, 7 are kept when a arrives last here.
    on_a_link = (
        _pull(1, 2, 10),  # 0: variable a
        _read(1, 12, 16),  # 1: variable b
        _read(1, 14, 20),  # 2: variable c
        _push(2, 25, 60),  # 3: the gradient
    )
    transfers = {0: 148 * MS, 1: 100 * MS, 2: 100 * MS, 3: 100 * MS}
    _, released, done = _replay(on_a_link, transfer_ns=transfers, step_compute_ns=30 * MS)
    assert done[0] - 1000 * MS == 150 * MS
    assert released[3] - 1000 * MS == 157 * MS
    # Inputs on the way the whole time (b's data from 3 ms on): only the 5 ms that
    # followed the last arrival are sure to be compute.
    busy = (_pull(1, 2, 10), _pull(1, 3, 20), _push(2, 25, 60))
    _, released, done = _replay(busy, transfer_ns=transfers, step_compute_ns=30 * MS)
    assert released[2] - 1000 * MS == 155 * MS


def test_when_the_last_input_is_the_same_the_step_compute_changes_nothing() -> None:
    # b arrives last here as in the trace: 111 + 5, whatever the step's compute.
    transfers = {0: 100 * MS, 1: 110 * MS, 2: 100 * MS}
    for step_compute in (0, 30 * MS):
        _, released, done = _replay(
            FORWARD_OVERLAPPED, transfer_ns=transfers, step_compute_ns=step_compute
        )
        assert done[1] - 1000 * MS == 111 * MS
        assert released[2] - 1000 * MS == 116 * MS


def test_compute_none_drops_every_gap_and_half_halves_them() -> None:
    slow = dict.fromkeys(range(5), 100 * MS)
    _, released, done = _replay(STEP, transfer_ns=slow, scale=0.0)
    begin = 1000 * MS
    assert released[2] == done[1]  # no compute between the last variable and the gradient
    assert released[0] == begin
    _, released_half, done_half = _replay(STEP, transfer_ns=slow, scale=0.5)
    # Variables released at 1 and 1.5 ms, arrive 100 ms later; the gap of 30 ms halved.
    assert (done_half[0] - begin, done_half[1] - begin) == (101 * MS, 101.5 * MS)
    assert released_half[2] - begin == 116.5 * MS


def test_critical_path_splits_the_step_into_compute_and_communication() -> None:
    tracker, _, _ = _replay(STEP, transfer_ns=dict.fromkeys(range(5), 100 * MS))
    path = tracker.critical_path()
    # Walked back from the end: tail 20; the read released 5 after gradient b
    # arrived; gradient b released 35 after variable b arrived; variable b
    # released 3 ms into the step.  The three transfers are the rest.
    assert path.step_ns == 363 * MS
    assert path.compute_ns == (20 + 5 + 35 + 3) * MS
    assert path.communication_ns == 300 * MS


def test_captured_critical_path_of_the_trace_itself() -> None:
    path = captured_critical_path(STEP, period_ns=100 * MS)
    assert path.step_ns == 100 * MS
    # Trace: b released at 3 (compute 3), arrives 20; gradient b at 55 (compute 35),
    # arrives 70; read at 75 (compute 5), arrives 80; tail 20.
    assert path.compute_ns == (3 + 35 + 5 + 20) * MS
    assert path.communication_ns == (17 + 15 + 5) * MS


@st.composite
def _steps(draw: st.DrawFn) -> tuple[TimedCall, ...]:
    count = draw(st.integers(min_value=1, max_value=25))
    calls = []
    for _ in range(count):
        start = draw(st.integers(min_value=0, max_value=200))
        ready = start + draw(st.integers(min_value=0, max_value=50))
        end = ready + draw(st.integers(min_value=0, max_value=50))
        calls.append(
            TimedCall(
                server=draw(st.integers(min_value=0, max_value=2)),
                reversed_direction=draw(st.booleans()),
                carries_tensor=draw(st.booleans()),
                start_ns=start,
                response_start_ns=ready,
                end_ns=end,
                source_op=draw(st.sampled_from(["", "sgd/IdentityN", "m/ReadVariableOp", "m/add"])),
            )
        )
    return tuple(calls)


@settings(max_examples=300, deadline=None)
@given(
    calls=_steps(),
    transfers=st.lists(st.integers(min_value=0, max_value=500), min_size=25, max_size=25),
    scale=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    step_compute=st.sampled_from([0, 20, 300]),
)
def test_no_call_is_released_before_what_it_waits_for_has_arrived(
    calls: tuple[TimedCall, ...], transfers: list[int], scale: float, step_compute: int
) -> None:
    deps = infer_dependencies(calls)
    tracker, released, done = _replay(
        calls,
        transfer_ns=dict(enumerate(transfers)),
        scale=scale,
        begin=0,
        step_compute_ns=step_compute,
    )
    assert set(done) == set(range(len(calls)))  # every call becomes releasable: no deadlock
    for index, dep in enumerate(deps):
        waited = [
            j
            for j, other in enumerate(deps)
            if other.is_arrival
            and (
                (other.lands_on_worker and other.arrival_rank < dep.after_worker_arrivals)
                or (
                    not other.lands_on_worker
                    and calls[j].server == calls[index].server
                    and other.arrival_rank < dep.after_server_arrivals
                )
            )
        ]
        # Data is ready no later than the trace saw it leave, and not before it was asked for.
        trace_ready = (
            calls[index].response_start_ns if calls[index].carries_tensor else calls[index].start_ns
        )
        assert calls[index].start_ns <= dep.ready_offset_ns <= trace_ready
        for j in waited:
            # Waited-for data arrived strictly before this call's data was ready...
            assert calls[j].end_ns < dep.ready_offset_ns
            # ... and in the replay, no call goes before it arrived.
            assert released[index] >= done[j]
        if waited:
            # The compute kept follows the last of them to arrive in the replay: what
            # followed the last waited-for arrival in the trace, or what followed the
            # replay's last one in the trace, up to a step's compute, if more.
            last = max(deps[j].arrival_offset_ns for j in waited)
            latest = max(done[j] for j in waited)
            binding = [j for j in waited if done[j] == latest]
            binding_arrival = max(deps[j].arrival_offset_ns for j in binding)
            # Less the time the trace spent receiving waited-for inputs after it.
            covered = set()
            for j in waited:
                if binding_arrival < deps[j].arrival_offset_ns <= last:
                    start = max(deps[j].transfer_start_ns, binding_arrival)
                    covered.update(range(start, deps[j].arrival_offset_ns))
            since = dep.ready_offset_ns - binding_arrival - len(covered)
            gap = max(dep.ready_offset_ns - last, min(since, step_compute))
            assert released[index] == latest + round(scale * gap)
        else:
            assert released[index] == round(scale * dep.ready_offset_ns)
    path = tracker.critical_path()
    assert 0 <= path.compute_ns <= path.step_ns
    assert path.step_ns >= max(done.values())


# --------------------------------------------------------------------------
# Refusals with their messages, and small steps worked out by hand.


@pytest.mark.parametrize("name", ["arrival_rank", "after_worker_arrivals", "after_server_arrivals"])
def test_dependencies_refuse_negative_counts(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be >= 0, got -2$"):
        Dependencies(ready_offset_ns=0, arrival_offset_ns=0, lands_on_worker=True, **{name: -2})


def test_data_cannot_arrive_before_it_left() -> None:
    with pytest.raises(ValueError, match=r"^a call's data cannot arrive before it left$"):
        Dependencies(ready_offset_ns=5, arrival_offset_ns=4, lands_on_worker=True)
    assert Dependencies(ready_offset_ns=5, arrival_offset_ns=5, lands_on_worker=True)


@pytest.mark.parametrize("transfer", [4, 11])
def test_dependencies_refuse_a_transfer_outside_leaving_and_arriving(transfer: int) -> None:
    with pytest.raises(ValueError, match="must begin to arrive between leaving and arriving"):
        Dependencies(
            ready_offset_ns=5,
            arrival_offset_ns=10,
            lands_on_worker=True,
            transfer_offset_ns=transfer,
        )
    ok = Dependencies(ready_offset_ns=5, arrival_offset_ns=10, lands_on_worker=True)
    assert ok.transfer_start_ns == 10  # unknown: at its arrival


def _tracker(deps: list[Dependencies], servers: list[int], **options: object) -> DependencyTracker:
    return DependencyTracker(
        deps,
        servers=servers,
        step_begin_ns=1000,
        period_ns=500,
        **options,  # type: ignore[arg-type]
    )


def test_the_tracker_refuses_a_negative_scale_and_a_server_list_of_another_length() -> None:
    deps = [Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=True)]
    with pytest.raises(ValueError, match=r"^compute scale must be >= 0, got -0.5$"):
        _tracker(deps, [0], compute_scale=-0.5)
    with pytest.raises(ValueError, match=r"^one server per call$"):
        _tracker(deps, [0, 1])
    tracker = _tracker(deps, [0])
    with pytest.raises(ValueError, match=r"^the step still has calls in flight$"):
        tracker.next_step_begin_ns()
    assert tracker.take_releasable() == [0]
    assert tracker.take_releasable() == []
    assert tracker.release_ns(0) == 1000
    tracker.complete(0, 1030)
    with pytest.raises(ValueError, match=r"^arrival 0 recorded twice$"):
        tracker.complete(0, 1040)


def test_a_two_call_step_by_hand() -> None:
    # Call 0 pulls a variable: leaves at 0, arrives at 10 (ns from the step's start).
    # Call 1 pushes its gradient, computed from it: leaves at 40 (30 of compute).
    deps = [
        Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=True),
        Dependencies(
            ready_offset_ns=40,
            arrival_offset_ns=45,
            lands_on_worker=False,
            after_worker_arrivals=1,
        ),
    ]
    tracker = _tracker(deps, [0, 0])
    assert tracker.step_begin_ns == 1000
    assert tracker.take_releasable() == [0]
    assert tracker.release_ns(0) == 1000
    assert tracker.release_ns(1) is None  # the variable is not in yet
    tracker.complete(0, 1025)  # 15 late
    assert tracker.take_releasable() == [1]
    assert tracker.release_ns(1) == 1000 + 40 + 15
    tracker.complete(1, 1100)  # arrives 55 late (1045 in the trace)
    # Next step: the period (500) plus the latest lag (55), and never before the last done.
    assert tracker.next_step_begin_ns() == 1555
    path = tracker.critical_path()
    # Compute on the path: the tail (1555 - 1100), the gradient's compute (1055 - 1025).
    assert path == StepPath(step_ns=555, compute_ns=455 + 30, communication_ns=555 - 485)


def test_half_the_compute_halves_the_gaps_and_the_period() -> None:
    deps = [
        Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=True),
        Dependencies(
            ready_offset_ns=40,
            arrival_offset_ns=45,
            lands_on_worker=False,
            after_worker_arrivals=1,
        ),
    ]
    tracker = _tracker(deps, [0, 0], compute_scale=0.5)
    tracker.take_releasable()
    tracker.complete(0, 1010)  # lag 1010 - 1000 - 5 = 5
    tracker.take_releasable()
    assert tracker.release_ns(1) == 1000 + 20 + 5
    tracker.complete(1, 1040)  # lag 1040 - 1000 - round(22.5) = 18
    assert tracker.next_step_begin_ns() == 1000 + 250 + 18


def test_a_step_of_control_calls_only_begins_the_next_after_its_period() -> None:
    deps = [
        Dependencies(
            ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=True, is_arrival=False
        )
    ]
    tracker = _tracker(deps, [0])
    tracker.complete(0, 2000)  # later than the period: the next step waits for it
    assert tracker.next_step_begin_ns() == 2000
    assert tracker.critical_path() == StepPath(step_ns=1000, compute_ns=0, communication_ns=1000)
    quick = _tracker(deps, [0])
    quick.complete(0, 1100)
    assert quick.next_step_begin_ns() == 1500


def test_an_empty_step_lasts_its_period() -> None:
    tracker = _tracker([], [])
    assert tracker.take_releasable() == []
    assert tracker.next_step_begin_ns() == 1500
    assert tracker.critical_path() == StepPath(step_ns=500, compute_ns=0, communication_ns=500)


def test_in_a_round_a_worker_keeps_the_rounds_tail_not_its_wait_for_the_others() -> None:
    # The trace: this worker's gradient arrived at +100, the round's last arrival (the
    # other worker's) at +450, the round ended at +500.  Its own tail, 400, was mostly
    # waiting for the other worker, which the replay's barrier waits for anew.
    deps = [Dependencies(ready_offset_ns=0, arrival_offset_ns=100, lands_on_worker=False)]
    own = _tracker(deps, [0])
    own.complete(0, 1300)  # here it arrived last, 200 after the trace's
    assert own.next_step_begin_ns() == 1300 + 400
    in_round = _tracker(deps, [0], round_tail_ns=50)
    in_round.complete(0, 1300)
    assert in_round.next_step_begin_ns() == 1300 + 50
    # The round's tail is compute, scaled like the rest.
    slow = _tracker(deps, [0], round_tail_ns=50, compute_scale=4.0)
    slow.complete(0, 1300)
    assert slow.next_step_begin_ns() == 1300 + 200
    assert slow.critical_path() == StepPath(step_ns=500, compute_ns=200, communication_ns=300)


def test_in_a_round_control_calls_go_as_it_begins_and_end_the_step() -> None:
    # The chief's control calls: in the trace the last went when the workers had finished
    # there; their times, or the step's period, would hold every round to the trace's.
    deps = [
        Dependencies(
            ready_offset_ns=300, arrival_offset_ns=310, lands_on_worker=True, is_arrival=False
        )
    ]
    timed = _tracker(deps, [0])
    assert timed.release_ns(0) == 1300
    tracker = _tracker(deps, [0], round_tail_ns=0)
    assert tracker.take_releasable() == [0]
    assert tracker.release_ns(0) == 1000
    tracker.complete(0, 1020)
    assert tracker.next_step_begin_ns() == 1020
    assert _tracker([], [], round_tail_ns=0).next_step_begin_ns() == 1000
    with pytest.raises(ValueError, match=r"^round tail must be >= 0, got -1$"):
        _tracker(deps, [0], round_tail_ns=-1)


def test_a_pull_waits_for_its_workers_arrival_at_its_own_server_only() -> None:
    # Gradients to ps 0 and ps 1 (ranks 0 at each), then a read from ps 1 after its update.
    deps = [
        Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=False),
        Dependencies(ready_offset_ns=0, arrival_offset_ns=20, lands_on_worker=False),
        Dependencies(
            ready_offset_ns=30,
            arrival_offset_ns=40,
            lands_on_worker=True,
            after_server_arrivals=1,
        ),
    ]
    tracker = _tracker(deps, [0, 1, 1])
    assert sorted(tracker.take_releasable()) == [0, 1]
    tracker.complete(0, 1500)  # ps 0's gradient, very late: the read does not wait for it
    assert tracker.take_releasable() == []
    tracker.complete(1, 1022)  # ps 1's gradient, 2 late
    assert tracker.take_releasable() == [2]
    assert tracker.release_ns(2) == 1000 + 30 + 2


def test_a_one_call_step_keeps_its_tail_as_compute() -> None:
    deps = [Dependencies(ready_offset_ns=10, arrival_offset_ns=20, lands_on_worker=True)]
    tracker = _tracker(deps, [0])
    assert tracker.take_releasable() == [0]
    assert tracker.release_ns(0) == 1010
    tracker.complete(0, 1030)  # lag 1030 - 1000 - 20 = 10
    assert tracker.next_step_begin_ns() == 1510
    # The wait before the first call (10) and the tail after it (1510 - 1030).
    assert tracker.critical_path() == StepPath(
        step_ns=510, compute_ns=10 + 480, communication_ns=20
    )


def test_a_captured_round_counts_an_early_workers_wait_for_the_others_as_communication() -> None:
    # The variable in from 0 to 10 ms, the gradient out at 20 and in at 30; the round's
    # last arrival (the other worker's) at 90, its end at 100.
    calls = (_pull(0, 0, 10), _push(5, 20, 30))
    own = captured_critical_path(calls, period_ns=100 * MS)
    assert own == StepPath(step_ns=100 * MS, compute_ns=80 * MS, communication_ns=20 * MS)
    in_round = captured_critical_path(calls, period_ns=100 * MS, round_tail_ns=10 * MS)
    assert in_round == StepPath(step_ns=100 * MS, compute_ns=20 * MS, communication_ns=80 * MS)


def test_the_captured_path_takes_the_servers_it_is_given() -> None:
    calls = (_pull(0, 1, 5, server=0), _push(1, 8, 9, server=0))
    own = captured_critical_path(calls, period_ns=20 * MS)
    assert captured_critical_path(calls, servers=[0, 0], period_ns=20 * MS) == own
    assert own == StepPath(step_ns=20 * MS, compute_ns=15 * MS, communication_ns=5 * MS)


def _timed_tensor(start: int, end: int, *, reversed_direction: bool = False) -> TimedCall:
    return TimedCall(
        server=0,
        reversed_direction=reversed_direction,
        carries_tensor=True,
        start_ns=start,
        response_start_ns=start,
        end_ns=end,
    )


def test_captured_path_segments_worked_out_by_hand() -> None:
    from tf_grpc_bench.critical_path import captured_critical_path_segments
    from tf_grpc_bench.dependency_tracker import PathSegment

    # Two pulls (0-1,000 and 100-1,100), then the gradient (3,000-4,000), which waits for
    # both; the later pull is the binding one.  The step lasts 10,000.
    calls = [
        _timed_tensor(0, 1_000),
        _timed_tensor(100, 1_100),
        _timed_tensor(3_000, 4_000, reversed_direction=True),
    ]
    assert captured_critical_path_segments(calls, period_ns=10_000) == (
        PathSegment(start_ns=0, end_ns=100, call=-1),
        PathSegment(start_ns=100, end_ns=1_100, call=1),
        PathSegment(start_ns=1_100, end_ns=3_000, call=-1),
        PathSegment(start_ns=3_000, end_ns=4_000, call=2),
        PathSegment(start_ns=4_000, end_ns=10_000, call=-1),
    )
    # A step that ends as its last call does has no tail; a first call released at the
    # step's begin has no compute before it.
    assert captured_critical_path_segments([_timed_tensor(0, 1_000)], period_ns=1_000) == (
        PathSegment(start_ns=0, end_ns=1_000, call=0),
    )
    path = captured_critical_path(calls, period_ns=10_000)
    assert (path.step_ns, path.communication_ns, path.compute_ns) == (10_000, 2_000, 8_000)


# --------------------------------------------------------------------------
# TF1's sync token: given once every worker's gradients are in.


@pytest.mark.parametrize(
    ("op", "token"),
    [
        ("sync_token_q_Dequeue", True),
        ("GroupCrossDeviceControlEdges_0/sync_token_q_Dequeue", True),
        ("sync_replicas/sync_token_q_Dequeue", True),
        ("model/dense/ReadVariableOp", False),
        ("sync_token_q_x/Identity", False),
        ("", False),
    ],
)
def test_which_ops_take_a_sync_token(op: str, token: bool) -> None:
    assert is_sync_token(op) is token


def _token(start: int, ready: int, end: int, server: int = 0) -> TimedCall:
    """TF1's worker taking its sync token from the ps (``sync_token_q_Dequeue``)."""
    return _call(start, ready, end, server=server, back=False, op="sync_token_q_Dequeue")


# A TF1 worker's step in a round of two workers: this worker's gradient reached ps:0
# at 60 ms, the other worker's at 190 and 195 ms; the ps applied them and gave the
# token at 200 ms.  The 140 ms from this worker's gradient to its token were the wait
# for the other worker, not compute.
TF1_STEP = (
    _pull(1, 2, 10),  # 0: variable
    _push(2, 50, 60),  # 1: this worker's gradient
    _token(3, 200, 201),  # 2: the sync token
)
OTHER_GRADIENTS = (190 * MS, 195 * MS)


def test_a_sync_token_follows_the_last_gradient_of_any_worker_before_it_left() -> None:
    gradients = (60 * MS, *OTHER_GRADIENTS, 250 * MS)  # 250: after the token, not waited for
    deps = infer_dependencies(TF1_STEP, round_gradient_arrivals=gradients)
    assert deps[2].others_arrival_offset_ns == 195 * MS
    # The rule is the token's alone, and only where the round's gradients are given.
    assert deps[0].others_arrival_offset_ns is None
    assert deps[1].others_arrival_offset_ns is None
    assert infer_dependencies(TF1_STEP)[2].others_arrival_offset_ns is None
    # Not an arrival at the very instant the token left, as for every wait.
    at_once = infer_dependencies(TF1_STEP, round_gradient_arrivals=(200 * MS,))
    assert at_once[2].others_arrival_offset_ns is None


def test_a_sync_token_keeps_the_apply_not_the_wait_for_the_other_workers() -> None:
    # Every transfer takes 100 ms: the variable arrives at 102, the gradient leaves at
    # 142 (40 ms of compute) and reaches the ps at 242.  The token keeps the 5 ms of
    # apply after the round's last gradient (195 -> 200 ms): 247.  The round barrier
    # waits for the other worker, whose gradients come over the replay's own link.
    transfers = dict.fromkeys(range(3), 100 * MS)
    begin = 1000 * MS
    _, released, done = _replay(
        TF1_STEP, transfer_ns=transfers, round_gradients=(60 * MS, *OTHER_GRADIENTS)
    )
    assert done[1] - begin == 242 * MS
    assert released[2] - begin == 247 * MS
    # Without the round's gradients the other worker's 140 ms are kept as compute:
    # 242 + 140.
    _, released, _ = _replay(TF1_STEP, transfer_ns=transfers)
    assert released[2] - begin == 382 * MS
    # Even when this worker's gradient arrives last here, a whole step's compute does
    # not bring the wait back (what followed it in the trace is the wait).
    _, released, _ = _replay(
        TF1_STEP,
        transfer_ns=transfers,
        round_gradients=(60 * MS, *OTHER_GRADIENTS),
        step_compute_ns=500 * MS,
    )
    assert released[2] - begin == 247 * MS


def test_captured_path_counts_the_wait_for_the_other_workers_as_communication() -> None:
    alone = captured_critical_path(TF1_STEP, period_ns=210 * MS, round_tail_ns=9 * MS)
    rounds = captured_critical_path(
        TF1_STEP,
        period_ns=210 * MS,
        round_tail_ns=9 * MS,
        round_gradient_arrivals=(60 * MS, *OTHER_GRADIENTS),
    )
    assert rounds.step_ns == alone.step_ns == 210 * MS
    # Compute: 2 before the first pull left, 40 before the gradient, the round's 9 ms
    # tail, and 140 (alone) or 5 (the apply) before the token.
    assert alone.compute_ns == (2 + 40 + 140 + 9) * MS
    assert rounds.compute_ns == (2 + 40 + 5 + 9) * MS


def test_dependencies_refuse_waiting_for_an_arrival_after_the_data_left() -> None:
    with pytest.raises(ValueError, match="after its data left"):
        Dependencies(
            ready_offset_ns=10,
            arrival_offset_ns=20,
            lands_on_worker=True,
            others_arrival_offset_ns=11,
        )


# --------------------------------------------------------------------------
# Edges of the inference's rules, worked out by hand.


def test_a_call_without_a_tensor_has_no_transfer_and_times_out_of_order_are_refused() -> None:
    (control,) = infer_dependencies([_pull(0, 2, 5, tensor=False)])
    assert control.transfer_offset_ns is None and control.transfer_start_ns == 5 * MS
    assert not control.is_arrival
    with pytest.raises(ValueError) as refused:
        infer_dependencies([_pull(0, 2, 5), _pull(1, 4, 3)])
    assert str(refused.value) == (
        f"call 1: times out of order (start {MS}, response start {4 * MS}, end {3 * MS})"
    )


def test_only_a_pulled_sync_token_waits_for_the_other_workers_gradients() -> None:
    token = "sync_token_q_Dequeue"
    calls = [
        _call(10, 12, 14, server=0, back=False, op=f"sync/{token}"),  # the token: 5 before
        _call(10, 12, 14, server=0, back=True, op=f"sync/{token}"),  # pushed: not a take
        _call(10, 12, 14, server=0, back=False, tensor=False, op=f"sync/{token}"),  # no tensor
        _call(10, 12, 14, server=0, back=False, op="dense/kernel/read"),  # another pull
    ]
    deps = infer_dependencies(calls, round_gradient_arrivals=(11 * MS, 5 * MS, 13 * MS))
    assert [d.others_arrival_offset_ns for d in deps] == [11 * MS, None, None, None]
    # Without arrivals of the round, no call has any.
    assert [d.others_arrival_offset_ns for d in infer_dependencies(calls)] == [None] * 4


def test_a_calls_bounds_may_meet_but_not_cross() -> None:
    met = Dependencies(
        ready_offset_ns=5,
        arrival_offset_ns=9,
        lands_on_worker=True,
        transfer_offset_ns=5,
        others_arrival_offset_ns=5,
    )
    assert met.transfer_start_ns == 5
    with pytest.raises(ValueError) as refused:
        Dependencies(ready_offset_ns=5, arrival_offset_ns=9, lands_on_worker=True,
                     transfer_offset_ns=10)  # fmt: skip
    assert str(refused.value) == "a call's data must begin to arrive between leaving and arriving"
    with pytest.raises(ValueError) as refused:
        Dependencies(ready_offset_ns=5, arrival_offset_ns=9, lands_on_worker=True,
                     others_arrival_offset_ns=6)  # fmt: skip
    assert str(refused.value) == "a call cannot wait for an arrival after its data left"


def test_each_call_of_a_step_keeps_its_own_time_spent_receiving_later_inputs() -> None:
    # Variables a, b and c arrive at the worker at 10, 20 and 30 (ns into the trace's
    # step); b's data was on its way from 16, c's from 22.  Gradient 1 waited for a
    # and b, gradient 2 for all three.  Here a arrives last (at +200), so each keeps
    # what followed a in the trace less the time the trace spent receiving its later
    # inputs: 40 - 10 - 4 for the first, 50 - 10 - (4 + 8) for the second.
    deps = [
        Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=True),
        Dependencies(
            ready_offset_ns=0,
            arrival_offset_ns=20,
            transfer_offset_ns=16,
            lands_on_worker=True,
            arrival_rank=1,
        ),
        Dependencies(
            ready_offset_ns=0,
            arrival_offset_ns=30,
            transfer_offset_ns=22,
            lands_on_worker=True,
            arrival_rank=2,
        ),
        Dependencies(
            ready_offset_ns=40,
            arrival_offset_ns=45,
            lands_on_worker=False,
            after_worker_arrivals=2,
        ),
        Dependencies(
            ready_offset_ns=50,
            arrival_offset_ns=55,
            lands_on_worker=False,
            arrival_rank=1,
            after_worker_arrivals=3,
        ),
    ]
    tracker = _tracker(deps, [0] * 5, step_compute_ns=100)
    assert sorted(tracker.take_releasable()) == [0, 1, 2]
    tracker.complete(1, 1100)
    tracker.complete(2, 1100)
    tracker.complete(0, 1200)
    assert sorted(tracker.take_releasable()) == [3, 4]
    assert tracker.release_ns(3) == 1200 + (40 - 10 - 4)
    assert tracker.release_ns(4) == 1200 + (50 - 10 - 4 - 8)
    # Asked again, each the same.
    assert (tracker.release_ns(3), tracker.release_ns(4)) == (1226, 1228)


def test_a_read_after_its_updates_keeps_less_the_time_its_server_spent_receiving() -> None:
    # Gradients a and b arrive at the ps at 10 and 20, b's data on its way from 14; a
    # control call reads the ps after both (ready at 40).  No arrival lands on the
    # worker.  Here a arrives last (at +200): 40 - 10, less the 6 the ps spent
    # receiving b.
    deps = [
        Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=False),
        Dependencies(
            ready_offset_ns=0,
            arrival_offset_ns=20,
            transfer_offset_ns=14,
            lands_on_worker=False,
            arrival_rank=1,
        ),
        Dependencies(
            ready_offset_ns=40,
            arrival_offset_ns=45,
            lands_on_worker=True,
            is_arrival=False,
            after_server_arrivals=2,
        ),
    ]
    tracker = _tracker(deps, [0, 0, 0], step_compute_ns=100)
    assert sorted(tracker.take_releasable()) == [0, 1]
    tracker.complete(1, 1100)
    tracker.complete(0, 1200)
    assert tracker.take_releasable() == [2]
    assert tracker.release_ns(2) == 1200 + (40 - 10 - 6)
