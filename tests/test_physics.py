"""The physics check of a trace, with figures worked out by hand: tolerances at their edges,
crossings counted per worker, the expected bytes of every setup."""

from __future__ import annotations

import pytest

from tf_grpc_bench.profiler import physics
from tf_grpc_bench.profiler.physics import (
    DEFAULT_TOLERANCE,
    VARIABLES_EXTRA,
    StepPhysics,
    WorkerCrossings,
    check_physics,
    decode_variables,
    encode_variables,
)
from tf_grpc_bench.trace import (
    RECV_BUF,
    RECV_TENSOR,
    Rpc,
    RunMetadata,
    Step,
    Task,
    TensorInfo,
    Trace,
)


def _step(tensor_bytes: int, *, expected: int = 1000, crossings=()) -> StepPhysics:  # type: ignore[no-untyped-def]
    return StepPhysics(
        index=3,
        tensor_bytes=tensor_bytes,
        expected_bytes=expected,
        worker_steps=2,
        crossings=crossings,
    )


def test_the_default_tolerance_is_one_percent() -> None:
    assert DEFAULT_TOLERANCE == 0.01


@pytest.mark.parametrize("tensor_bytes", [1000, 1010, 990, 1009, 991])
def test_a_step_within_one_percent_either_way_is_fine(tensor_bytes: int) -> None:
    assert _step(tensor_bytes).problems(0.01) == []


@pytest.mark.parametrize(
    ("tensor_bytes", "shown"),
    [
        (1015, "step 3: 1,015 B of tensors, expected 1,000 B (+1.50%)"),
        (985, "step 3: 985 B of tensors, expected 1,000 B (-1.50%)"),
        (1011, "step 3: 1,011 B of tensors, expected 1,000 B (+1.10%)"),
        (989, "step 3: 989 B of tensors, expected 1,000 B (-1.10%)"),
        (0, "step 3: 0 B of tensors, expected 1,000 B (-100.00%)"),
    ],
)
def test_a_step_off_by_more_than_the_tolerance_either_way_is_flagged(
    tensor_bytes: int, shown: str
) -> None:
    assert _step(tensor_bytes).problems(0.01) == [shown]


def test_the_tolerance_is_the_callers() -> None:
    assert _step(1150).problems(0.2) == []
    assert _step(1150).problems(0.1) == ["step 3: 1,150 B of tensors, expected 1,000 B (+15.00%)"]


def test_relative_error_with_nothing_expected() -> None:
    assert _step(0, expected=0).relative_error == 0.0
    assert _step(5, expected=0).relative_error == float("inf")
    assert _step(1250, expected=1000).relative_error == 0.25
    assert _step(750, expected=1000).relative_error == -0.25


def test_crossings_must_be_one_copy_per_worker_step_each_way() -> None:
    good = (
        WorkerCrossings(worker="/job:worker/task:0", pulled=1, pushed=1),
        WorkerCrossings(worker="/job:worker/task:1", pulled=1, pushed=1),
    )
    assert _step(1000, crossings=good).problems(0.01) == []
    short = (
        WorkerCrossings(worker="/job:worker/task:0", pulled=1, pushed=1),
        WorkerCrossings(worker="/job:worker/task:1", pulled=1, pushed=0),
    )
    assert _step(1000, crossings=short).problems(0.01) == [
        "step 3: variables pulled 2x and pushed 1x, expected 2x each way"
    ]
    twice = (WorkerCrossings(worker="/job:worker/task:0", pulled=3, pushed=2),)
    assert _step(1000, crossings=twice).problems(0.01) == [
        "step 3: variables pulled 3x and pushed 2x, expected 2x each way"
    ]


def test_variables_are_encoded_as_dtype_and_shape_trainable_only() -> None:
    variables = [
        {"dtype": "float32", "shape": [3, 4]},
        {"dtype": "int64", "shape": []},
        {"dtype": "float32", "shape": [7], "trainable": False},
        {"dtype": "float16", "shape": [2, 5, 1], "trainable": True},
    ]
    text = encode_variables(variables)
    assert text == "float32:3x4;int64:;float16:2x5x1"
    assert decode_variables(text) == [
        ("float32", (3, 4)),
        ("int64", ()),
        ("float16", (2, 5, 1)),
    ]
    assert decode_variables("") == []
    assert decode_variables(";float32:2;") == [("float32", (2,))]


# --------------------------------------------------------------------------
# Whole traces: tasks 0 = ps0, 1 = worker0, 2 = worker1.

TASKS = (
    Task(job="ps", index=0),
    Task(job="worker", index=0),
    Task(job="worker", index=1),
)
# Two variables: float32 [10] (40 B) and float16 [3, 2] (12 B): 52 B, 16 parameters.
VARIABLES = "float32:10;float16:3x2"


def _tensor(dtype: str, shape: tuple[int, ...], size: int, method: str = RECV_TENSOR) -> Rpc:
    return Rpc(
        method=method,
        caller_task=0,
        callee_task=0,
        request_bytes=100,
        response_bytes=size + 30,
        tensor=TensorInfo(dtype=dtype, shape=shape, content_bytes=size),
    )


def _between(rpc: Rpc, caller: int, callee: int) -> Rpc:
    return Rpc(
        method=rpc.method,
        caller_task=caller,
        callee_task=callee,
        request_bytes=rpc.request_bytes,
        response_bytes=rpc.response_bytes,
        tensor=rpc.tensor,
    )


def _full_round(worker: int) -> list[Rpc]:
    """One worker-step: the worker pulls both variables, the ps pulls both gradients."""
    weights = [_tensor("float32", (10,), 40), _tensor("float16", (3, 2), 12)]
    return [_between(r, worker, 0) for r in weights] + [_between(r, 0, worker) for r in weights]


def _trace(
    rpcs_per_step: list[list[Rpc]],
    *,
    strategy: str = "tf2-parameter-server",
    synchronous: bool = True,
    extra: tuple[tuple[str, str], ...] = ((VARIABLES_EXTRA, VARIABLES),),
) -> Trace:
    return Trace(
        metadata=RunMetadata(model="toy", strategy=strategy, synchronous=synchronous, extra=extra),
        tasks=TASKS,
        steps=tuple(
            Step(index=i + 1, start_ns=0, end_ns=10, rpcs=tuple(rpcs))
            for i, rpcs in enumerate(rpcs_per_step)
        ),
    )


def test_a_synchronous_round_of_two_workers_moves_twice_the_variables_each_way() -> None:
    report = check_physics(_trace([_full_round(1) + _full_round(2)]))
    assert (report.workers, report.variables) == (2, 2)
    assert (report.trainable_parameters, report.trainable_bytes) == (16, 52)
    assert report.tolerance == 0.01
    (step,) = report.steps
    assert (step.index, step.tensor_bytes, step.expected_bytes, step.worker_steps) == (
        1,
        208,
        208,
        2,
    )
    assert step.crossings == (
        WorkerCrossings(worker="/job:worker/task:0", pulled=1, pushed=1),
        WorkerCrossings(worker="/job:worker/task:1", pulled=1, pushed=1),
    )
    assert report.ok and report.problems == []
    assert report.format() == (
        "model toy, tf2-parameter-server, 2 workers: 16 trainable parameters in 2 variables "
        "(52 B)\n"
        "step 1: 208 B moved, expected 208 B (+0.000%); variables pulled 2x, pushed 2x; "
        "0 other tensors\n"
        "OK"
    )


def test_a_missing_gradient_is_found_by_bytes_and_by_crossings() -> None:
    rpcs = _full_round(1) + _full_round(2)
    del rpcs[-1]  # worker 1's float16 gradient never reached the ps
    report = check_physics(_trace([rpcs]))
    assert report.steps[0].crossings[1] == WorkerCrossings(
        worker="/job:worker/task:1", pulled=1, pushed=0, extra_pushes=1
    )
    assert report.problems == [
        "step 1: 196 B of tensors, expected 208 B (-5.77%)",
        "step 1: variables pulled 2x and pushed 1x, expected 2x each way",
    ]
    assert not report.ok
    assert report.format().endswith(
        "MISMATCH: step 1: 196 B of tensors, expected 208 B (-5.77%); "
        "step 1: variables pulled 2x and pushed 1x, expected 2x each way"
    )


def test_other_tensors_are_counted_apart_and_empty_ones_ignored() -> None:
    rpcs = _full_round(1) + _full_round(2)
    rpcs.append(_between(_tensor("int64", (), 8), 1, 0))  # the optimizer's step counter
    rpcs.append(_between(_tensor("float32", (0,), 0), 1, 0))  # a control edge
    rpcs.append(_between(_tensor("float32", (10,), 40), 0, 2))  # a third copy of one gradient
    report = check_physics(_trace([rpcs]), tolerance=0.5)
    crossings = report.steps[0].crossings
    assert crossings[0] == WorkerCrossings(
        worker="/job:worker/task:0", pulled=1, pushed=1, extra_pulls=1
    )
    assert crossings[1] == WorkerCrossings(
        worker="/job:worker/task:1", pulled=1, pushed=1, extra_pushes=1
    )
    assert report.steps[0].tensor_bytes == 208 + 8 + 40
    assert report.tolerance == 0.5
    assert report.format().splitlines()[1] == (
        "step 1: 256 B moved, expected 208 B (+23.077%); variables pulled 2x, pushed 2x; "
        "2 other tensors"
    )


def test_variables_of_the_same_shape_count_once_each() -> None:
    extra = ((VARIABLES_EXTRA, "float32:10;float32:10"),)
    weight = _tensor("float32", (10,), 40)
    rpcs = [_between(weight, 1, 0), _between(weight, 1, 0), _between(weight, 0, 1)]
    rpcs.append(_between(weight, 0, 1))
    report = check_physics(_trace([rpcs], synchronous=False, extra=extra))
    assert report.steps[0].crossings[0] == WorkerCrossings(
        worker="/job:worker/task:0", pulled=1, pushed=1
    )
    assert report.ok, report.problems


def test_with_no_trainable_variable_every_tensor_is_another_tensor() -> None:
    job = {"variables": [{"dtype": "float32", "shape": [10], "trainable": False}]}
    rpcs = [_between(_tensor("float32", (10,), 40), 1, 0)]
    report = check_physics(_trace([rpcs], synchronous=False), job, tolerance=10.0)
    assert report.steps[0].crossings[0] == WorkerCrossings(
        worker="/job:worker/task:0", pulled=0, pushed=0, extra_pulls=1
    )
    assert (report.trainable_bytes, report.variables) == (0, 0)


def test_only_tensor_methods_count_as_tensor_bytes() -> None:
    rpcs = _full_round(1) + _full_round(2)
    rpcs.append(
        Rpc(
            method="/tensorflow.WorkerService/RunGraph",
            caller_task=1,
            callee_task=0,
            request_bytes=5000,
            response_bytes=5000,
            tensor=TensorInfo(dtype="float32", shape=(10,), content_bytes=40),
        )
    )
    rpcs.append(
        Rpc(method=RECV_TENSOR, caller_task=1, callee_task=0, request_bytes=50, response_bytes=5000)
    )
    report = check_physics(_trace([rpcs]))
    assert report.steps[0].tensor_bytes == 208
    assert report.ok


def test_recv_buf_bytes_count_but_not_as_variable_crossings() -> None:
    rpcs = [_between(_tensor("float32", (10,), 40, method=RECV_BUF), 1, 2)]
    rpcs += [_between(_tensor("float32", (10,), 40, method=RECV_BUF), 2, 1)]
    report = check_physics(_trace([rpcs]), tolerance=1.0)
    assert report.steps[0].tensor_bytes == 80
    assert report.steps[0].crossings == (
        WorkerCrossings(worker="/job:worker/task:0", pulled=0, pushed=0),
        WorkerCrossings(worker="/job:worker/task:1", pulled=0, pushed=0),
    )


def test_an_asynchronous_tf2_step_is_one_worker_step() -> None:
    report = check_physics(_trace([_full_round(1)], synchronous=False))
    (step,) = report.steps
    assert (step.expected_bytes, step.worker_steps, step.tensor_bytes) == (104, 1, 104)
    assert report.ok, report.problems


def test_a_user_jobs_worker_step_is_one_worker_step() -> None:
    extra = ((VARIABLES_EXTRA, VARIABLES), ("step_unit", "worker-step"))
    report = check_physics(_trace([_full_round(2)], strategy="tf1-ps", extra=extra))
    assert (report.steps[0].expected_bytes, report.steps[0].worker_steps) == (104, 1)
    assert report.ok, report.problems


def test_synchronous_tf1_steps_count_every_worker() -> None:
    report = check_physics(
        _trace([_full_round(1) + _full_round(2)], strategy="tf1-ps", synchronous=False)
    )
    assert (report.steps[0].expected_bytes, report.steps[0].worker_steps) == (208, 2)


def test_mirrored_training_expects_the_ring_all_reduce_and_no_crossings() -> None:
    rpcs = [_between(_tensor("float32", (13,), 52, method=RECV_BUF), 1, 2)]
    rpcs.append(_between(_tensor("float32", (13,), 52, method=RECV_BUF), 2, 1))
    report = check_physics(_trace([rpcs], strategy="multi-worker-mirrored"))
    (step,) = report.steps
    # 2 x (W - 1) x trainable bytes = 2 x 1 x 52.
    assert (step.expected_bytes, step.tensor_bytes, step.crossings) == (104, 104, ())
    assert report.ok
    assert report.format().splitlines()[1] == "step 1: 104 B moved, expected 104 B (+0.000%)"


def test_mirrored_training_with_one_worker_expects_no_traffic() -> None:
    tasks = (Task(job="worker", index=0),)
    trace = Trace(
        metadata=RunMetadata(
            strategy="multi-worker-mirrored", extra=((VARIABLES_EXTRA, VARIABLES),)
        ),
        tasks=tasks,
        steps=(Step(index=0, start_ns=0, end_ns=1, rpcs=()),),
    )
    report = check_physics(trace)
    assert report.steps[0].expected_bytes == 0
    assert report.ok


def test_the_job_files_variables_win_over_the_traces() -> None:
    job = {"variables": [{"dtype": "float32", "shape": [26]}]}  # 104 B
    report = check_physics(_trace([_full_round(1) + _full_round(2)]), job)
    assert (report.trainable_bytes, report.variables, report.steps[0].expected_bytes) == (
        104,
        1,
        416,
    )
    # Its crossings are then of the job's variable set, which no tensor matches.
    assert report.steps[0].crossings[0].pulled == 0
    assert check_physics(_trace([_full_round(1) + _full_round(2)]), {"variables": []}).ok


def test_unknown_dtypes_count_four_bytes_an_element() -> None:
    extra = ((VARIABLES_EXTRA, "complex64:3;bool:5;float64:2;int8:4;bfloat16:1"),)
    report = check_physics(_trace([], extra=extra))
    assert report.trainable_bytes == 3 * 4 + 5 * 1 + 2 * 8 + 4 * 1 + 1 * 2
    assert report.trainable_parameters == 3 + 5 + 2 + 4 + 1


def test_a_trace_without_steps_or_variables_is_not_ok() -> None:
    report = check_physics(_trace([]))
    assert report.problems == ["the trace has no steady-state steps"]
    assert not report.ok
    # Without variables (a capture-job trace): not a ValueError, a report that says so.
    unchecked = check_physics(_trace([], extra=()))
    assert not unchecked.ok and unchecked.steps == ()
    assert unchecked.unchecked_reason.startswith("the trace does not record the model's")
    assert unchecked.problems == [f"cannot check: {unchecked.unchecked_reason}"]
    # What cannot be checked is said so, and is no mismatch.
    assert unchecked.format().splitlines()[-1] == f"cannot check: {unchecked.unchecked_reason}"
    assert report.format().splitlines()[-1] == ("cannot check: the trace has no steady-state steps")
    assert "MISMATCH" not in unchecked.format() + report.format()


def test_the_module_reads_its_variables_under_one_key() -> None:
    assert physics.VARIABLES_EXTRA == "trainable_variables"


def test_an_unchecked_report_says_what_it_knows_and_why_it_checked_nothing() -> None:
    report = check_physics(_trace([_full_round(1)], extra=()), tolerance=0.05)
    assert (report.model, report.strategy, report.workers) == ("toy", "tf2-parameter-server", 2)
    assert (report.trainable_parameters, report.trainable_bytes, report.variables) == (0, 0, 0)
    assert report.tolerance == 0.05 and report.steps == () and report.variables_source == ""
    assert report.unchecked_reason == (
        "the trace does not record the model's trainable variables (none crossed both ways "
        "between a worker and a ps task, or the trace predates recording them from the "
        'traffic); pass them as check_physics(trace, {"variables": [{"dtype": "float32", '
        '"shape": [...]}, ...]})'
    )


def test_variables_taken_from_the_traffic_say_so_in_the_report() -> None:
    source = "traffic: tensors a worker pulled from the ps tasks and pushed back in one step"
    extra = ((VARIABLES_EXTRA, VARIABLES), (physics.VARIABLES_SOURCE_EXTRA, source))
    trace = _trace([_full_round(1) + _full_round(2)], extra=extra)
    report = check_physics(trace)
    assert report.variables_source == source
    assert report.format().splitlines()[1] == f"variables from the {source}"
    # The model's own variables (no source recorded), or the job's: no such line.
    plain = check_physics(_trace([_full_round(1) + _full_round(2)]))
    assert plain.variables_source == ""
    assert plain.format().splitlines()[1].startswith("step 1: ")
    given = check_physics(trace, {"variables": [{"dtype": "float32", "shape": [10]}]})
    assert given.variables_source == ""
