"""Traces of worker-steps (asynchronous training) replayed step for step, on loopback.

In such a trace each step is one worker's: every other worker makes no call in
it.  A pass of PS throughput is still every trace step once, for every worker,
and ``--steps N`` is the same N trace steps on every worker (from the middle
step on), so a pass moves exactly the trace's RPCs and bytes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest

from tf_grpc_bench import trace as trace_model
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode, WorkloadStep
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.loop import begin_mid_trace
from tf_grpc_bench.trace import (
    RECV_TENSOR,
    WORKER_STEP,
    Rpc,
    RunMetadata,
    Step,
    StepDetection,
    Task,
    TensorInfo,
    Trace,
)

#: Which worker made each trace step: uneven, as asynchronous workers are.
OWNERS = (0, 1, 0, 0, 1, 1, 0)
#: Weights pulled by a worker, and the gradients the ps pulls back, per step.
SIZES = (21, 4096, 70_000)


def _transfer(caller: int, callee: int, size: int, start: int, edge: str) -> Rpc:
    return Rpc(
        method=RECV_TENSOR,
        caller_task=caller,
        callee_task=callee,
        request_bytes=90,
        response_bytes=size,
        start_ns=start,
        response_start_ns=start + 300,
        end_ns=start + 1_000,
        tensor=TensorInfo(rendezvous_key=f"a;1;b;{edge};0:0", dtype="float32", shape=(size // 4,)),
    )


def worker_step_trace(owners: Sequence[int] = OWNERS) -> Trace:
    """ps:0 and two workers; step k is worker ``owners[k]``'s: its pulls, then the ps's."""
    tasks = (
        Task(job="ps", index=0),
        Task(job="worker", index=0),
        Task(job="worker", index=1),
    )
    steps = []
    clock = 10_000
    for index, owner in enumerate(owners):
        worker = 1 + owner
        start = clock
        rpcs = []
        for n, size in enumerate(SIZES):
            rpcs.append(_transfer(worker, 0, size, clock, f"edge_{n}_w"))
            clock += 2_000
        for n, size in enumerate(SIZES):
            rpcs.append(_transfer(0, worker, size, clock, f"edge_{n}_g"))
            clock += 2_000
        steps.append(
            Step(
                index=index,
                start_ns=start,
                end_ns=clock,
                rpcs=trace_model.with_outstanding(rpcs),
            )
        )
        clock += 1_000  # the next worker-step starts before this one's compute ends
    return Trace(
        metadata=RunMetadata(model="toy", strategy="tf1-parameter-server", synchronous=False),
        tasks=tasks,
        steps=tuple(steps),
        step_detection=StepDetection(source="step-id", unit=WORKER_STEP, rule="test"),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServers]:
    with LocalServers(1, mode=Mode.NON_SERIALIZED) as running:
        yield running


PACINGS = {
    "asap": Pacing(timing=Timing.ASAP, window=None),
    "dependencies": Pacing(timing=Timing.DEPENDENCIES, window=None),
    "recorded": Pacing(timing=Timing.RECORDED, window=None),
}


@pytest.mark.parametrize("pacing", PACINGS, ids=str)
def test_one_pass_moves_exactly_the_traces_rpcs_and_bytes(
    server: LocalServers, pacing: str
) -> None:
    trace = worker_step_trace()
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    assert len(workload.steps) == len(trace.steps)
    plan = RunPlan(warmup_ns=0, duration_ns=1, runs=1, passes=1, deadline_s=20)
    result = run_benchmark(workload, server.targets, pacing=PACINGS[pacing], plan=plan)
    (run,) = result.runs
    assert not run.partial, run.partial_reason
    rpcs = [rpc for step in trace.steps for rpc in step.rpcs]
    assert run.rpc_count == len(rpcs) == run.server_received_messages
    moved = sum(s.request_bytes + s.response_bytes for s in run.samples)
    assert moved == sum(r.request_bytes + r.response_bytes for r in rpcs)
    # Gradients pulled by the ps travel as the workers' requests: the server got them.
    assert run.server_received_bytes == sum(s.request_bytes for s in run.samples)
    # Each worker replayed its own steps, each once.
    made = Counter((s.worker_index, s.step) for s in run.samples)
    assert made == Counter({(owner, index): 2 * len(SIZES) for index, owner in enumerate(OWNERS)})
    # A worker's step time is its own steps', not the other worker's.
    assert len(run.step_times_ns) == len(OWNERS)


@pytest.mark.parametrize("steps", [1, 2, 4, 9])
def test_steps_n_are_the_same_trace_steps_on_every_worker(server: LocalServers, steps: int) -> None:
    workload = trace_workload(
        worker_step_trace(), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    plan = RunPlan(warmup_ns=0, duration_ns=1, runs=1, steps=steps, deadline_s=20)
    result = run_benchmark(workload, server.targets, plan=plan)
    (run,) = result.runs
    # From the middle step on (a capture's first steps may be start-up still), round.
    replayed = [(len(OWNERS) // 2 + index) % len(OWNERS) for index in range(steps)]
    expected = Counter({(OWNERS[i], i): replayed.count(i) * 2 * len(SIZES) for i in set(replayed)})
    assert Counter((s.worker_index, s.step) for s in run.samples) == expected


@pytest.mark.parametrize("count", [0, 1, 2, 7, 8])
def test_a_replay_begins_mid_trace_and_a_pass_is_still_every_step_once(count: int) -> None:
    steps = tuple(WorkloadStep(index=i, calls=()) for i in range(count))
    order = [step.index for step in begin_mid_trace(steps)]
    assert sorted(order) == list(range(count))  # a pass: every step once
    if count:
        assert order[0] == count // 2  # the middle step first (for 8: 4, past the first half)
        assert all((b - a) % count == 1 for a, b in itertools.pairwise(order))  # in trace order
