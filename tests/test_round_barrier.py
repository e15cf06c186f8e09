"""A worker's replay loop where the trace's steps are rounds ended by a barrier.

A fake driver and barrier on a fake clock: what the loop records as a worker's
step, and which tail the steps keep with and without the barrier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tf_grpc_bench.dependencies import Dependencies
from tf_grpc_bench.dependency_tracker import StepPath
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.workload import Mode, Workload, WorkloadStep, pull_call
from tf_grpc_bench.replay.transport.driver import StepOutcome
from tf_grpc_bench.replay.transport.loop import WorkerLoop

#: Each step's work on the fake clock, and how much later the other worker reaches the barrier.
WORK_NS = 100
OTHER_WORKER_LATER_NS = 50


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


class _Driver:
    """Each step takes WORK_NS and may be followed at once; it remembers the steps' tails."""

    pacing: Any = None
    peers: Any = None

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.round_tails: list[int | None] = []
        #: Each step's first call's wait for the other workers' gradients (TF1's sync token).
        self.others: list[int | None] = []

    def begin_run(self) -> None:
        pass

    def run_step(self, step: WorkloadStep, **_: Any) -> StepOutcome:
        self.round_tails.append(step.round_tail_ns)
        deps = step.calls[0].dependencies
        self.others.append(None if deps is None else deps.others_arrival_offset_ns)
        self.clock.now += WORK_NS
        path = StepPath(step_ns=WORK_NS, compute_ns=10, communication_ns=WORK_NS - 10)
        return StepOutcome(last_end_ns=self.clock.now, next_begin_ns=self.clock.now, path=path)


class _Barrier:
    """The other worker arrives OTHER_WORKER_LATER_NS after this one."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.waits = 0

    def wait(self) -> bool:
        self.waits += 1
        self.clock.now += OTHER_WORKER_LATER_NS
        return True

    def leave(self) -> None:
        pass


def _workload(round_tails: Sequence[int | None]) -> Workload:
    # As a TF1 sync token: the round's last gradient arrived 2 ns before it left.
    deps = Dependencies(
        ready_offset_ns=5, arrival_offset_ns=10, lands_on_worker=True, others_arrival_offset_ns=3
    )
    steps = tuple(
        WorkloadStep(
            index=index,
            calls=(
                pull_call(
                    method="/tensorflow.WorkerService/RecvTensor",
                    request_bytes=90,
                    response_bytes=4096,
                    mode=Mode.NON_SERIALIZED,
                    step=index,
                    dependencies=deps,
                ),
            ),
            period_ns=500,
            round_tail_ns=tail,
        )
        for index, tail in enumerate(round_tails)
    )
    return Workload(
        benchmark=Benchmark.PS_THROUGHPUT,
        source="trace",
        mode=Mode.NON_SERIALIZED,
        steps=steps,
        server_count=1,
        worker_count=1,
        round_barrier=True,
    )


def _measure(barrier: bool) -> tuple[tuple[int, ...], _Driver, _Barrier]:
    clock = _Clock()
    driver = _Driver(clock)
    fake_barrier = _Barrier(clock)
    loop = WorkerLoop(
        _workload([5, 7, 9]),
        driver,  # type: ignore[arg-type]
        clock=clock,
        cpu_clock=lambda: 0,
        machine_cpu=lambda: None,
        step_barrier=fake_barrier if barrier else None,
    )
    outcome = loop.measure(begin_ns=clock.now, duration_ns=10**9, step_count=3)
    return outcome.step_times_ns, driver, fake_barrier


def test_in_a_round_a_workers_step_lasts_until_the_last_worker_may_begin_the_next() -> None:
    # Training's round lasts until its slowest worker's step is joined: a worker that
    # finished first records the round, not its own part of it.
    steps, driver, barrier = _measure(barrier=True)
    assert barrier.waits == 3
    assert steps == (WORK_NS + OTHER_WORKER_LATER_NS,) * 3
    # The middle step first (a replay begins mid-trace), each with its round's tail.
    assert driver.round_tails == [7, 9, 5]
    # TF1's sync token keeps only what followed every worker's gradients: the barrier
    # waits for the others.
    assert driver.others == [3, 3, 3]


def test_without_a_barrier_a_step_is_the_workers_own_and_keeps_its_own_tail() -> None:
    # One worker (no barrier to meet at): a round's tail would assume the others' wait.
    steps, driver, _ = _measure(barrier=False)
    assert steps == (WORK_NS,) * 3
    assert driver.round_tails == [None, None, None]
    # Nor does the sync token leave the wait for the other workers to a barrier.
    assert driver.others == [None, None, None]
