"""The compute load (``--compute-load``): its sizing, the gaps it runs in, its burner
processes' lives, its report apart from the replay's CPU, its flag's errors."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.capture_cpu import CaptureCpu
from tf_grpc_bench.dependencies import Dependencies
from tf_grpc_bench.dependency_tracker import DependencyTracker
from tf_grpc_bench.errors import ConfigError, TransportError, UsageError
from tf_grpc_bench.host import process_stat_fields
from tf_grpc_bench.replay import cli as replay_cli
from tf_grpc_bench.replay.core import compute_load
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing
from tf_grpc_bench.replay.core.workload import Call, Mode, Shape, Workload, WorkloadStep
from tf_grpc_bench.replay.placement import role
from tf_grpc_bench.replay.request import Host
from tf_grpc_bench.replay.request import plan as plan_request
from tf_grpc_bench.replay.spec import ReplaySpec
from tf_grpc_bench.replay.transport import burners
from tf_grpc_bench.replay.transport.load import ComputeLoad
from tf_grpc_bench.replay.transport.loop import WorkerLoop
from tf_grpc_bench.replay.transport.seam import WorkerJob
from tf_grpc_bench.replay.transport.wire import ChannelSettings
from tf_grpc_bench.trace import Trace

from .conftest import make_trace, with_step_lengths
from .engines import grpc_cpp_program

ROOT = Path(__file__).resolve().parents[1]
BUSY = CaptureCpu(
    cores=2,
    busy_cores=1.9,
    task_cores=(("ps:0", 0.5), ("worker:0", 0.6), ("worker:1", 0.6)),
    span_ns=4_000_000_000,
)


# --------------------------------------------------------------------------
# Sizing (pure).


def test_the_load_is_trainings_cpu_a_step_less_the_replays_spread_over_the_gaps() -> None:
    # Training's tasks: 1.7 cores over a 0.6 s step = 1.02 CPU-s; the replay 0.52.
    sizing = compute_load.size_load(
        "gaps", tasks_cores=1.7, step_ns=600e6, gaps_ns=1000e6, replay_cpu_ns=520e6
    )
    assert sizing.training_cpu_ns == pytest.approx(1020e6)
    assert sizing.load_cpu_ns == pytest.approx(500e6)
    assert sizing.gap_cores == pytest.approx(0.5)  # 0.5 CPU-s over 1 s of gaps
    assert sizing.uniform_cores == 0
    assert sizing.text() == (
        "gaps: 0.50 CPU-s a step (training's tasks 1.02, the replay 0.52), 0.50 cores in "
        "each task's compute gaps (1.00 s a step), 0.00 all along"
    )


def test_what_one_core_per_task_cannot_hold_in_the_gaps_goes_uniform() -> None:
    sizing = compute_load.size_load(
        "gaps", tasks_cores=2.0, step_ns=500e6, gaps_ns=200e6, replay_cpu_ns=400e6
    )
    # 0.6 CPU-s: 0.2 in the gaps at 1 core, 0.4 over the 0.5 s step.
    assert sizing.gap_cores == 1.0
    assert sizing.uniform_cores == pytest.approx(0.8)


def test_uniform_spreads_the_load_over_the_step_and_a_replay_as_busy_as_training_adds_none() -> (
    None
):
    uniform = compute_load.size_load(
        "uniform", tasks_cores=1.8, step_ns=500e6, gaps_ns=300e6, replay_cpu_ns=400e6
    )
    assert (uniform.gap_cores, uniform.uniform_cores) == (0.0, pytest.approx(1.0))
    assert uniform.text() == (
        "uniform: 0.50 CPU-s a step (training's tasks 0.90, the replay 0.40), 1.00 cores all along"
    )
    busy = compute_load.size_load(
        "gaps", tasks_cores=1.0, step_ns=500e6, gaps_ns=300e6, replay_cpu_ns=700e6
    )
    assert (busy.load_cpu_ns, busy.gap_cores, busy.uniform_cores) == (0.0, 0.0, 0.0)
    # No gaps at all: everything uniform.
    gapless = compute_load.size_load(
        "gaps", tasks_cores=1.0, step_ns=500e6, gaps_ns=0, replay_cpu_ns=250e6
    )
    assert (gapless.gap_cores, gapless.uniform_cores) == (0.0, pytest.approx(0.5))


def test_dilation_spreads_the_same_load_over_more_time() -> None:
    sizing = compute_load.size_load(
        "gaps", tasks_cores=2.0, step_ns=500e6, gaps_ns=200e6, replay_cpu_ns=400e6
    )
    assert sizing.wall_cores(4) == (0.25, pytest.approx(0.2))
    with pytest.raises(ValueError, match="no load to size"):
        compute_load.size_load("none", tasks_cores=1, step_ns=1, gaps_ns=0, replay_cpu_ns=0)
    with pytest.raises(ValueError, match="step must be > 0"):
        compute_load.size_load("gaps", tasks_cores=1, step_ns=0, gaps_ns=0, replay_cpu_ns=0)


def test_across_cpu_models_the_compute_part_of_trainings_cpu_is_scaled() -> None:
    # Training's tasks 1.8 cores over 0.5 s = 0.90 CPU-s at the capture machine's speed,
    # 0.40 of it in the compute gaps (one core a task): x1.5 here, 0.90 + 0.40 x 0.5 = 1.10.
    uniform = compute_load.size_load(
        "uniform",
        tasks_cores=1.8,
        step_ns=500e6,
        gaps_ns=400e6,
        replay_cpu_ns=300e6,
        compute_scale=1.5,
        path_gaps_ns=200e6,
    )
    assert uniform.captured_cpu_ns == pytest.approx(900e6)
    assert uniform.compute_cpu_ns == pytest.approx(400e6)
    assert uniform.training_cpu_ns == pytest.approx(1100e6)
    assert uniform.load_cpu_ns == pytest.approx(800e6)
    # The step lengthened by the longest task's gaps: 0.5 + 0.2 x 0.5 = 0.6 s.
    assert uniform.step_here_ns == pytest.approx(600e6)
    assert uniform.uniform_cores == pytest.approx(800 / 600)
    assert uniform.text() == (
        "uniform: 0.80 CPU-s a step (training's tasks 1.10 here: 0.90 at the capture "
        "machine's speed with its 0.40 in compute gaps x1.5; the replay 0.30), 1.33 cores "
        "all along over a 0.60 s step"
    )
    # In the gaps: they last x2 here (0.4 s), a core each holds 0.4 of the 0.8 CPU-s.
    gaps = compute_load.size_load(
        "gaps",
        tasks_cores=2.0,
        step_ns=500e6,
        gaps_ns=200e6,
        replay_cpu_ns=400e6,
        compute_scale=2.0,
        path_gaps_ns=100e6,
    )
    assert gaps.training_cpu_ns == pytest.approx(1200e6)
    assert (gaps.gaps_here_ns, gaps.step_here_ns) == (pytest.approx(400e6), pytest.approx(600e6))
    assert gaps.gap_cores == 1.0
    assert gaps.uniform_cores == pytest.approx(400 / 600)
    # A faster machine (x0.5): less CPU, a shorter step; the compute part is at most
    # training's CPU (gaps longer than its CPU: all of it is compute).
    faster = compute_load.size_load(
        "uniform",
        tasks_cores=0.5,
        step_ns=1000e6,
        gaps_ns=800e6,
        replay_cpu_ns=0,
        compute_scale=0.5,
        path_gaps_ns=400e6,
    )
    assert faster.compute_cpu_ns == pytest.approx(500e6)
    assert faster.training_cpu_ns == pytest.approx(250e6)
    assert faster.uniform_cores == pytest.approx(250 / 800)
    # Scale 1 keeps the capture's figures, and the text as before.
    same = compute_load.size_load(
        "uniform", tasks_cores=1.8, step_ns=500e6, gaps_ns=400e6, replay_cpu_ns=300e6
    )
    assert same.training_cpu_ns == pytest.approx(900e6)
    assert "here:" not in same.text()
    with pytest.raises(ValueError, match="compute scale, gaps and the replayed step must be >= 0"):
        compute_load.size_load(
            "uniform", tasks_cores=1, step_ns=1, gaps_ns=0, replay_cpu_ns=0, compute_scale=-1
        )


def test_a_replay_slower_than_its_trace_spreads_the_load_over_its_own_step() -> None:
    # A loopback trace's step of 0.5 s replayed on a slow link takes 3.5 s: the 0.6 CPU-s
    # of load a step are spread over the 3.5 s (0.6 / 3.5 cores), not run at 0.6 / 0.5
    # cores for all of it (4.2 CPU-s a step).
    slow = compute_load.size_load(
        "uniform",
        tasks_cores=1.8,
        step_ns=500e6,
        gaps_ns=400e6,
        replay_cpu_ns=300e6,
        replayed_step_ns=3500e6,
    )
    assert slow.load_cpu_ns == pytest.approx(600e6)
    assert slow.step_here_ns == pytest.approx(3500e6)
    assert slow.uniform_cores == pytest.approx(600 / 3500)
    assert slow.text() == (
        "uniform: 0.60 CPU-s a step (training's tasks 0.90, the replay 0.30), 0.17 cores "
        "all along over a 3.50 s step"
    )
    # A replay as fast as its trace, or faster, keeps the trace's step.
    fast = compute_load.size_load(
        "uniform",
        tasks_cores=1.8,
        step_ns=500e6,
        gaps_ns=400e6,
        replay_cpu_ns=300e6,
        replayed_step_ns=420e6,
    )
    assert fast.step_here_ns == pytest.approx(500e6)
    assert fast.uniform_cores == pytest.approx(600 / 500)
    assert "over a" not in fast.text()
    # In the gaps the rate follows the gaps; only what they cannot hold is spread.
    gaps = compute_load.size_load(
        "gaps",
        tasks_cores=2.0,
        step_ns=500e6,
        gaps_ns=200e6,
        replay_cpu_ns=400e6,
        replayed_step_ns=2000e6,
    )
    assert gaps.gap_cores == 1.0
    assert gaps.uniform_cores == pytest.approx((600 - 200) / 2000)
    with pytest.raises(ValueError, match="the replayed step must be >= 0"):
        compute_load.size_load(
            "uniform", tasks_cores=1, step_ns=1, gaps_ns=0, replay_cpu_ns=0, replayed_step_ns=-1
        )


@pytest.mark.parametrize(
    ("requested", "facts", "chosen"),
    [
        ("auto", {}, ("uniform", "the trace records its capture CPU")),
        ("auto", {"capture_cpu": False}, ("none", "the trace records no capture CPU")),
        (
            "auto",
            {"paced": False},
            ("none", "no ps-throughput benchmark paced by its dependencies"),
        ),
        (
            "auto",
            {"trace": False, "capture_cpu": False},
            ("none", "a synthetic workload has no training CPU to stand for"),
        ),
        (
            "auto",
            {"one_task": True},
            ("none", "role sizes no load: each task would add the whole job's"),
        ),
        ("gaps", {"capture_cpu": False}, ("gaps", "")),
        ("none", {}, ("none", "")),
    ],
)
def test_auto_chooses_the_uniform_load_where_the_trace_can_size_it(
    requested: str, facts: dict[str, bool], chosen: tuple[str, str]
) -> None:
    given = {"trace": True, "paced": True, "capture_cpu": True, **facts}
    assert compute_load.choose(requested, **given) == chosen


def test_a_task_job_gaps_are_each_tasks_mean_over_the_steps() -> None:
    step = _two_call_step()  # gaps (10, 40) and (45, 100): 85
    one = Workload(
        benchmark=Benchmark.PS_THROUGHPUT,
        source="trace",
        mode=Mode.NON_SERIALIZED,
        steps=(step, step),
        server_count=1,
        worker_count=1,
    )
    assert compute_load.task_gaps_ns([one, one]) == [85.0, 85.0]
    assert compute_load.trace_gaps_ns([one, one]) == 170.0


def test_each_steps_quota_is_the_sized_load_split_evenly_over_whole_cores() -> None:
    # 1.5 CPU-s a step over a 1 s step: two burners of 0.75 each, every step.
    sizing = compute_load.size_load(
        "uniform", tasks_cores=2.0, step_ns=1e9, gaps_ns=0, replay_cpu_ns=0.5e9
    )
    quotas, step = compute_load.burner_quotas(sizing, 1.0)
    assert (quotas, step) == ([pytest.approx(0.75e9)] * 2, 1_000_000_000)
    assert sum(quotas) == pytest.approx(sizing.load_cpu_ns)
    # Dilated 4x: the same CPU a step, over a 4 s step, so one burner holds it.
    quotas, step = compute_load.burner_quotas(sizing, 4.0)
    assert (quotas, step) == ([pytest.approx(1.5e9)], 4_000_000_000)
    # gaps: the quotas hold only what the gaps could not (0.7 of 0.9 CPU-s: 1.4 cores).
    gaps = compute_load.size_load(
        "gaps", tasks_cores=2.0, step_ns=500e6, gaps_ns=200e6, replay_cpu_ns=100e6
    )
    quotas, step = compute_load.burner_quotas(gaps, 1.0)
    assert sum(quotas) == pytest.approx(gaps.load_cpu_ns - gaps.gap_cores * gaps.gaps_here_ns)
    assert (quotas, step) == ([pytest.approx(0.35e9)] * 2, 500_000_000)
    # A replay as busy as training: no quota, no burner.
    idle = compute_load.size_load(
        "uniform", tasks_cores=1.0, step_ns=1e9, gaps_ns=0, replay_cpu_ns=2e9
    )
    assert compute_load.burner_quotas(idle, 1.0) == ([], 1_000_000_000)
    # Rounds waiting for the quota: a burner per core at least, the quota the same.
    quotas, step = compute_load.burner_quotas(sizing, 4.0, at_least=2)
    assert (quotas, step) == ([pytest.approx(0.75e9)] * 2, 4_000_000_000)
    assert compute_load.burner_quotas(idle, 1.0, at_least=2) == ([], 1_000_000_000)


class _Clocks:
    """A burner's wall and CPU clocks, moved by hand: a spin runs ``share`` of the wall
    time it takes (the rest: the core held by others, a real-time relay's)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0
        self.share = 1.0
        self.spun: list[float] = []

    def spin(self, cpu_ns: float) -> None:
        self.spun.append(cpu_ns)
        self.cpu += math.ceil(cpu_ns)
        self.wall += math.ceil(cpu_ns / self.share)


def _quota_burner(clocks: _Clocks, quota_ns: int, step_ns: int) -> burners._Burner:
    burner = burners._Burner(wall=lambda: clocks.wall, cpu=lambda: clocks.cpu)
    burner.set_quota(quota_ns, step_ns, rounds_seen=0)
    return burner


def _catch_up(burner: burners._Burner, clocks: _Clocks) -> None:
    """Work until nothing is owed (the burner says how long to wait)."""
    while burners.work(burner, clocks.spin) == 0.0:
        pass


def test_a_quota_is_owed_from_each_rounds_start_and_no_more_than_once_a_round() -> None:
    clocks = _Clocks()
    burner = _quota_burner(clocks, 200_000_000, 1_000_000_000)  # 0.2 CPU-s a round, 1 s step
    # No round begun: nothing owed, however long it waits.
    clocks.wall = 5_000_000_000
    assert burners.work(burner, clocks.spin) == burners.ROUND_POLL_NS / 1e9
    assert clocks.spun == []
    # A round from 5 s: due evenly over the step, done as it comes due.
    burner.begin_round(1, 5_000_000_000)
    clocks.wall = 5_500_000_000
    burner.account()
    assert burner.quota_owed_ns() == 100_000_000
    _catch_up(burner, clocks)
    assert clocks.cpu == pytest.approx(0.2 * (clocks.wall - 5_000_000_000), abs=2)
    # A round longer than the step owes its quota once: 0.2 CPU-s over 3 s, not 0.6.
    clocks.wall = 8_000_000_000
    _catch_up(burner, clocks)
    assert clocks.cpu == 200_000_000
    assert max(clocks.spun) <= burners.SLICE_NS
    # The next round owes afresh from its start.
    burner.begin_round(2, 8_000_000_000)
    clocks.wall = 9_000_000_000
    _catch_up(burner, clocks)
    assert clocks.cpu == 400_000_000
    assert burner.end_rounds() == burners.QuotaRounds(
        rounds=2, owed_ns=400_000_000, done_ns=400_000_000, short=0
    )
    # Ended: nothing owed until a round begins again.
    clocks.wall = 20_000_000_000
    burner.account()
    assert burner.owed_ns() == 0


def test_what_a_round_did_not_do_by_the_next_ones_start_is_short_not_carried_over() -> None:
    clocks = _Clocks()
    burner = _quota_burner(clocks, 200_000_000, 1_000_000_000)
    burner.begin_round(1, 0)
    # Half the step with no core at all (the relays had it): 0.1 CPU-s due, none done.
    clocks.wall = 500_000_000
    burner.account()
    assert burner.quota_owed_ns() == 100_000_000
    # The next round begins at 0.5 s: the first's 0.2 CPU-s go short, and are not owed
    # now; this round's quota is due over 90% of the round before's 0.5 s (shorter than
    # the step): half of it by 0.725 s.
    burner.begin_round(2, 500_000_000)
    burner.account()
    assert burner.quota_owed_ns() == 0
    assert burner.pace == 450_000_000 == burners.PACE_SHARE * 500_000_000
    clocks.wall = 725_000_000
    burner.account()
    assert burner.quota_owed_ns() == 100_000_000
    # At 40% of a core it still does all of it, later.
    clocks.share = 0.4
    clocks.wall = 1_000_000_000
    _catch_up(burner, clocks)
    assert clocks.cpu == 200_000_000
    # Two rounds begin and end between two looks (the fourth is open): one short of all of it.
    burner.begin_round(4, 2_000_000_000)
    assert burner.end_rounds() == burners.QuotaRounds(
        rounds=4, owed_ns=800_000_000, done_ns=200_000_000, short=3
    )
    # A new quota counts from the rounds it is told have begun, and opens none.
    burner.set_quota(100_000_000, 1_000_000_000, rounds_seen=9)
    burner.begin_round(9, 3_000_000_000)
    burner.account()
    assert burner.quota_owed_ns() == 0
    assert burner.end_rounds() == burners.QuotaRounds()


def test_a_round_clock_counts_rounds_and_keeps_the_last_start() -> None:
    import multiprocessing

    rounds = burners.RoundClock(multiprocessing.get_context("spawn"))
    assert rounds.read() == (0, 0)
    rounds.begin(7)
    rounds.begin(11)
    assert rounds.read() == (2, 11)
    # A worker's perf-counter times go out as CLOCK_MONOTONIC ones.
    now = time.perf_counter_ns()
    burners.RoundSignal(rounds)(now)
    count, start = rounds.read()
    assert count == 3
    assert start == pytest.approx(now - burners.perf_minus_monotonic_ns(), abs=1_000_000)


def test_the_worker_loop_tells_each_rounds_start() -> None:
    from .test_round_barrier import WORK_NS, _Barrier, _Clock, _Driver, _workload

    clock = _Clock()
    told: list[int] = []
    loop = WorkerLoop(
        _workload([5, 7, 9]),
        _Driver(clock),  # type: ignore[arg-type]
        clock=clock,
        cpu_clock=lambda: 0,
        machine_cpu=lambda: None,
        step_barrier=_Barrier(clock),
        on_round=told.append,
    )
    begin = clock.now
    outcome = loop.measure(begin_ns=begin, duration_ns=10**9, step_count=3)
    # Each round begins when the last worker may begin it (the barrier's).
    assert told == [begin + n * outcome.step_times_ns[0] for n in range(3)]
    assert outcome.step_times_ns[0] > WORK_NS


def test_a_gap_burners_credit_is_still_capped() -> None:
    clocks = _Clocks()
    burner = burners._Burner(wall=lambda: clocks.wall, cpu=lambda: clocks.cpu)
    burner.gap_duty = 1.0
    burner.add_gap(0, 10_000_000_000)
    clocks.wall = 1_000_000_000
    burner.account()
    assert burner.owed_ns() == burners.MAX_CREDIT_NS


def test_intervals_merge_into_their_union() -> None:
    assert compute_load.merge([(5, 9), (0, 3), (2, 4), (9, 12), (20, 20)]) == [(0, 4), (5, 12)]


# --------------------------------------------------------------------------
# The gaps: what the tracker reports, and the trace's own.


def _two_call_step() -> WorkloadStep:
    # Call 0 pulls a variable (leaves at 0, arrives at 10); call 1 pushes the gradient
    # computed from it (leaves at 40: 30 of compute); the step lasts 100 (tail 55).
    deps = [
        Dependencies(ready_offset_ns=0, arrival_offset_ns=10, lands_on_worker=True),
        Dependencies(
            ready_offset_ns=40, arrival_offset_ns=45, lands_on_worker=False, after_worker_arrivals=1
        ),
    ]
    calls = tuple(
        Call(
            shape=Shape.PULL,
            method="/tensorflow.WorkerService/RecvTensor",
            request_bytes=10,
            response_bytes=10,
            step=0,
            dependencies=d,
        )
        for d in deps
    )
    return WorkloadStep(index=0, calls=calls, period_ns=100)


def test_the_tracker_tells_each_gap_as_it_plans_it_and_the_tail_once() -> None:
    step = _two_call_step()
    told: list[tuple[int, int]] = []
    tracker = DependencyTracker(
        [c.dependencies for c in step.calls if c.dependencies is not None],
        servers=[0, 0],
        step_begin_ns=1000,
        period_ns=100,
        compute_scale=2.0,
        on_compute=lambda start, end: told.append((start, end)),
    )
    assert tracker.take_releasable() == [0]
    assert tracker.release_ns(0) == 1000
    tracker.complete(0, 1025)
    assert tracker.take_releasable() == [1]
    assert tracker.release_ns(1) == 1025 + 60  # 30 of compute, scaled x2
    tracker.complete(1, 1100)
    tracker.next_step_begin_ns()
    tracker.critical_path()  # asks for the next begin again: the tail is told once
    # The first call's (empty: it waits for nothing at 0), the gradient's, the tail (55 x 2).
    assert told == [(1000, 1000), (1025, 1085), (1100, 1210)]


def test_a_steps_gaps_are_its_trace_replayed_onto_itself() -> None:
    assert compute_load.step_gaps(_two_call_step()) == [(10, 40), (45, 100)]
    # A synthetic step has none.
    synthetic = WorkloadStep(
        index=-1, calls=(dataclasses.replace(_two_call_step().calls[0], dependencies=None),)
    )
    assert compute_load.step_gaps(synthetic) == []


def _request(path: Path, *flags: str) -> object:
    parser = argparse.ArgumentParser()
    replay_cli.configure_replay(parser)
    return replay_cli.build_request(
        parser.parse_args([str(path), "--benchmark", "ps-throughput", *flags])
    )


def _busy_trace(tmp_path: Path, trace: Trace | None = None) -> Path:
    trace = trace or make_trace(steps=4, workers=2)
    recorded = dataclasses.replace(
        trace, metadata=dataclasses.replace(trace.metadata, extra=BUSY.extra())
    )
    return trace_files.write_trace(recorded, tmp_path / "busy.tfgbtrace")


def test_a_trace_workload_carries_the_capture_tasks_cores_and_its_gaps(tmp_path: Path) -> None:
    request = _request(_busy_trace(tmp_path), "--compute-load", "gaps")
    workload = request.workloads[0]  # type: ignore[attr-defined]
    assert compute_load.tasks_cores_of(workload) == pytest.approx(1.7)
    assert request.plan.compute_load == "gaps"  # type: ignore[attr-defined]
    workers = [workload.for_worker(w) for w in range(workload.worker_count)]
    expected = sum(
        end - start
        for w in workers
        for step in w.steps[:1]
        for start, end in compute_load.step_gaps(step)
    )
    per_step = [
        sum(end - start for w in workers for start, end in compute_load.step_gaps(w.steps[n]))
        for n in range(len(workload.steps))
    ]
    assert per_step[0] == expected
    assert compute_load.trace_gaps_ns(workers) == pytest.approx(sum(per_step) / len(per_step))
    assert compute_load.mean_period_ns(workload) > 0


# --------------------------------------------------------------------------
# The flag.


def test_the_flags_errors_are_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^--compute-load 'busy': expected one of auto, none, gaps, uniform$"
    ):
        ReplaySpec(trace="x.tfgbtrace", compute_load="busy")
    with pytest.raises(UsageError, match=r"^--compute-load gaps needs a TRACE"):
        ReplaySpec(synthetic=True, compute_load="gaps")
    bare = trace_files.write_trace(make_trace(), tmp_path / "bare.tfgbtrace")
    with pytest.raises(ConfigError, match=r"records no capture CPU .*--compute-load none$"):
        _request(bare, "--compute-load", "uniform")
    # auto (the default): a trace without capture CPU replays without a load, and says why.
    plan = _request(bare).plan  # type: ignore[attr-defined]
    assert (plan.compute_load, plan.compute_load_auto) == (
        "none",
        "the trace records no capture CPU",
    )
    given = _request(bare, "--compute-load", "none").plan  # type: ignore[attr-defined]
    assert (given.compute_load, given.compute_load_auto) == ("none", "")
    completed = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "replay", str(bare), "--compute-load", "hot"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode != 0
    assert completed.stderr.strip().splitlines() == [
        "tf-grpc-bench replay: error: --compute-load 'hot': expected one of auto, none, gaps, "
        "uniform"
    ]


# --------------------------------------------------------------------------
# Burner processes.


def _alive(pid: int) -> bool:
    fields = process_stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_burner_works_in_its_gaps_and_ends_when_closed() -> None:
    pool = burners.Burners(1)
    try:
        pool.set_load(1.0)
        sender = burners.GapSender(pool.gap_writers[0])
        now = time.perf_counter_ns()
        sender(now, now + 400_000_000)
        sender(now, now + 100_000_000)  # inside what was sent: nothing more to send
        deadline = time.monotonic() + 20
        while pool.cpu_ns() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.cpu_ns() > 0
        pids = list(pool.pids)
    finally:
        pool.close()
    assert _wait_gone(pids) == []


def _settled_cpu(pool: burners.Burners) -> int:
    """The burners' CPU once it stops growing (their start-up done)."""
    deadline = time.monotonic() + 20
    last = pool.cpu_ns()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = pool.cpu_ns()
        if now == last:
            return now
        last = now
    raise AssertionError("the burners never went idle")


def test_a_burner_spends_nothing_outside_its_gaps() -> None:
    tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    pool = burners.Burners(1)
    try:
        pool.set_load(1.0)
        idle = _settled_cpu(pool)
        time.sleep(0.3)
        assert pool.cpu_ns() - idle <= tick
        # A gap to come: nothing until it begins, then work.
        now = time.perf_counter_ns()
        burners.GapSender(pool.gap_writers[0])(now + 1_000_000_000, now + 1_500_000_000)
        time.sleep(0.3)
        assert pool.cpu_ns() - idle <= tick
        deadline = time.monotonic() + 20
        while pool.cpu_ns() - idle <= tick and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.cpu_ns() - idle > tick
    finally:
        pool.close()


_PARENT = textwrap.dedent(
    """
    import signal, sys, time
    from tf_grpc_bench.replay.transport import burners
    # SIGHUP's default action, whatever this test's runner left (nohup ignores it): the
    # hang-up a terminal or a launcher sends ends a replay that has not changed it.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    pool = burners.Burners(2)
    pool.set_load(0.5, [50_000_000], 100_000_000)
    print(" ".join(str(p) for p in pool.pids), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP])
def test_burners_die_with_the_process_that_started_them(ending: signal.Signals) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        os.kill(parent.pid, ending)
        parent.wait(20)
        assert _wait_gone(pids) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_quota_burner_gone_leaves_its_quota_owed_and_the_run_going() -> None:
    pool = burners.Burners(0)
    try:
        pool.set_load(0.0, [50_000_000], 100_000_000)
        (pid,) = pool.pids
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone([pid]) == []
        pool.restart_quotas()  # no error: the next run goes on without it
        pool.rounds.begin(time.monotonic_ns())
        pool.rounds.begin(time.monotonic_ns())
        assert pool.end_rounds() == burners.QuotaRounds(
            rounds=2, owed_ns=100_000_000, done_ns=0.0, short=2
        )
    finally:
        pool.close()


def test_the_replays_cpu_leaves_the_burners_out() -> None:
    """A burner that has used the 50 ms waited for is still starting (0.6-1 CPU-s of
    imports here), and this process's own CPU grows as it reads /proc: read one after the
    other while the burner ran, the two sums fell short of the burners' CPU by 0-20 ms
    (20 ms, the old margin, in 3 of 30 reads on a busy machine).  So the burners are
    stopped while they are read, and the sum without them is read first: the difference is
    their CPU and what this process used between the reads, never less than theirs.  A sum
    that leaves nothing out gives 0-10 ms against their 50-70 (10 of 10 caught)."""
    pool = burners.Burners(0)
    try:
        pool.set_load(0.0, [100_000_000], 100_000_000)
        deadline = time.monotonic() + 20
        while pool.cpu_ns() < 50_000_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pool.pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            held = pool.cpu_ns()
            without = burners.tree_cpu_ns(os.getpid(), exclude=pool.pids)
            with_burners = burners.tree_cpu_ns(os.getpid())
        finally:
            for pid in pool.pids:
                os.kill(pid, signal.SIGCONT)
        assert with_burners - without >= held >= 50_000_000, (with_burners - without, held)
    finally:
        pool.close()


# --------------------------------------------------------------------------
# A replay with a compute load.


def _replay(path: Path, output: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """A short PS-throughput replay of the trace at ``path`` with ``flags``, into ``output``."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "tf_grpc_bench", "replay", str(path)),
            *("--benchmark", "ps-throughput", *flags),
            *("--warmup", "0.5", "--duration", "1", "--runs", "1", "--output-dir", str(output)),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("engine", "mode"), [("grpcio", "uniform"), ("grpcio", "gaps"), ("grpc-cpp", "gaps")]
)
def test_a_replay_reports_the_load_apart_from_its_own_cpu(
    tmp_path: Path, engine: str, mode: str
) -> None:
    if engine == "grpc-cpp":
        grpc_cpp_program()
    # uniform: steps of 100 ms, so that training's CPU a step outweighs the replay's.
    lengths = [100.0] * 4 if mode == "uniform" else None
    trace = make_trace(steps=4, workers=2)
    path = _busy_trace(tmp_path, with_step_lengths(trace, lengths) if lengths else trace)
    output = tmp_path / "out"
    completed = _replay(path, output, "--engine", engine, "--compute-load", mode)
    assert completed.returncode == 0, completed.stderr
    assert f"compute load: {mode}: " in completed.stdout
    (results,) = output.glob("*/results.json")
    benchmark = json.loads(results.read_text())["benchmarks"][0]
    parameters = benchmark["parameters"]
    assert parameters["compute_load"] == mode
    assert parameters["compute_load_sizing"].startswith(f"{mode}: ")
    assert parameters["compute_load_cpu_cores"] >= 0
    assert "compute_load_cpu_s_per_step" in parameters
    if mode == "uniform":
        # The first worker's process told the rounds; the quotas were owed over them.
        assert parameters[compute_load.ROUNDS_ENTRY] >= 1
        assert 0 <= parameters[compute_load.QUOTA_MET_ENTRY] <= 1
    # The replay's own CPU is its workers' and servers': the burners are not among them.
    assert benchmark["runs"][0]["client_cpu_ns"] > 0
    # Not asked to, no round waited for its quota.
    assert compute_load.WAIT_ENTRY not in parameters


def _load_jobs(path: Path) -> list[WorkerJob]:
    request = _request(path)
    workload = request.workloads[0]  # type: ignore[attr-defined]
    return [
        WorkerJob(
            worker_index=w,
            workload=workload.for_worker(w),
            targets=("127.0.0.1:1",) * workload.server_count,
            pacing=request.pacings[0],  # type: ignore[attr-defined]
            plan=request.plan,  # type: ignore[attr-defined]
            channel=ChannelSettings(),
        )
        for w in range(workload.worker_count)
    ]


def test_a_load_records_what_its_quota_burners_did_of_their_rounds_quotas(
    tmp_path: Path,
) -> None:
    trace = with_step_lengths(make_trace(steps=4, workers=2), [100.0] * 4)
    jobs = _load_jobs(_busy_trace(tmp_path, trace))
    load = ComputeLoad(jobs)
    try:
        # A 100 ms replayed step: the quota is the sized load, owed every round.
        load.size(replay_cpu_ns=0, steps=2, wall_ns=200_000_000)
        assert load.sizing is not None and load.sizing.load_cpu_ns > 0
        quotas, step = compute_load.burner_quotas(load.sizing, 1.0)
        assert (sum(quotas), step) == (pytest.approx(load.sizing.load_cpu_ns), 100_000_000)
        # The first training worker's first process tells the rounds; no other does.
        rounds = load.round_clock(0)
        assert rounds is not None and load.round_clock(1) is None
        pool = load._burners
        assert pool is not None
        # Every burner answers (its start-up done): no round began, none owed.
        assert pool.end_rounds() == burners.QuotaRounds(short=0)
        with load.measuring() as measured:
            measured.steps = 1
            before = pool.cpu_ns()
            burners.RoundSignal(rounds)(time.perf_counter_ns())
            deadline = time.monotonic() + 20
            while pool.cpu_ns() - before < 50_000_000 and time.monotonic() < deadline:
                time.sleep(0.05)
        parameters = load.parameters()
        assert parameters[compute_load.ROUNDS_ENTRY] == 1
        assert 0 < parameters[compute_load.QUOTA_MET_ENTRY] <= 1
        assert parameters[compute_load.ROUNDS_SHORT_ENTRY] in range(len(quotas) + 1)
        assert parameters["compute_load_cpu_s_per_step"] > 0
        assert "of their quota over 1 rounds, a burner short of it " in (
            compute_load.report_line(parameters)
        )
        # A run in which no round began owes nothing, and reports no share of nothing.
        idle = ComputeLoad(jobs)
        try:
            idle.size(replay_cpu_ns=0, steps=2, wall_ns=200_000_000)
            with idle.measuring():
                pass
            assert compute_load.QUOTA_MET_ENTRY not in idle.parameters()
        finally:
            idle.close()
    finally:
        load.close()


def test_the_terminal_report_names_the_load_and_what_the_burners_spent() -> None:
    assert compute_load.report_line({"compute_load": "none"}) == ""
    assert compute_load.report_line({}) == ""
    assert compute_load.report_line({"compute_load": "gaps"}) == "compute load: gaps"
    line = compute_load.report_line(
        {
            "compute_load": "uniform",
            "compute_load_sizing": "uniform: 0.50 CPU-s a step",
            "compute_load_cpu_s_per_step": 0.4412,
            "compute_load_cpu_cores": 0.66,
        }
    )
    assert line == (
        "compute load: uniform: 0.50 CPU-s a step; the burners spent 0.44 CPU-s a step "
        "(0.66 cores), not counted as the replay's"
    )
    met = compute_load.report_line(
        {
            "compute_load": "uniform",
            "compute_load_cpu_s_per_step": 0.4412,
            "compute_load_cpu_cores": 0.66,
            compute_load.QUOTA_MET_ENTRY: 0.987,
        }
    )
    assert met.endswith("(0.66 cores, 99% of their quota), not counted as the replay's")
    rounds = compute_load.report_line(
        {
            "compute_load": "uniform",
            "compute_load_cpu_s_per_step": 0.4412,
            "compute_load_cpu_cores": 0.66,
            compute_load.QUOTA_MET_ENTRY: 0.87,
            compute_load.ROUNDS_ENTRY: 25,
            compute_load.ROUNDS_SHORT_ENTRY: 6,
        }
    )
    assert rounds.endswith(
        "(0.66 cores, 87% of their quota over 25 rounds, a burner short of it 6 times), "
        "not counted as the replay's"
    )


def test_auto_loads_a_paced_ps_throughput_replay_of_a_trace_with_capture_cpu(
    tmp_path: Path,
) -> None:
    busy = _busy_trace(tmp_path)
    plan = _request(busy).plan  # type: ignore[attr-defined]
    assert (plan.compute_load, plan.compute_load_auto) == (
        "uniform",
        "the trace records its capture CPU",
    )
    workload = _request(busy).workloads[0]  # type: ignore[attr-defined]
    assert compute_load.tasks_cores_of(workload) == pytest.approx(1.7)
    # Paced as soon as possible, nothing stands for training's compute: no load.
    asap = _request(busy, "--pacing", "asap").plan  # type: ignore[attr-defined]
    assert (asap.compute_load, asap.compute_load_auto) == (
        "none",
        "no ps-throughput benchmark paced by its dependencies",
    )
    parser = argparse.ArgumentParser()
    replay_cli.configure_replay(parser)
    spec = ReplaySpec(trace=str(busy), compute_load="auto", benchmarks=(Benchmark.PS_THROUGHPUT,))
    one = plan_request(spec, Host(name="here"), one_task=True).plan
    assert (one.compute_load, one.compute_load_auto) == (
        "none",
        "role sizes no load: each task would add the whole job's",
    )
    # auto is the default.
    synthetic = replay_cli.build_request(parser.parse_args(["--synthetic"])).plan
    assert synthetic.compute_load_auto == "a synthetic workload has no training CPU to stand for"


def test_the_load_of_a_scaled_replay_is_sized_at_its_compute_scale(tmp_path: Path) -> None:
    request = _request(_busy_trace(tmp_path), "--compute", "2")
    workload = request.workloads[0]  # type: ignore[attr-defined]
    pacing = request.pacings[0]  # type: ignore[attr-defined]
    assert pacing.compute_scale == 2.0
    workers = [workload.for_worker(w) for w in range(workload.worker_count)]
    jobs = [
        WorkerJob(
            worker_index=w,
            workload=worker,
            targets=("127.0.0.1:1",) * workload.server_count,
            pacing=pacing,
            plan=request.plan,  # type: ignore[attr-defined]
            channel=ChannelSettings(),
        )
        for w, worker in enumerate(workers)
    ]
    load = ComputeLoad(jobs)
    try:
        load.size(replay_cpu_ns=600_000_000, steps=2, wall_ns=9_000_000_000)
        gaps = compute_load.task_gaps_ns(workers)
        assert load.sizing == compute_load.size_load(
            "uniform",
            tasks_cores=1.7,
            step_ns=compute_load.mean_period_ns(workers[0]),
            gaps_ns=sum(gaps),
            replay_cpu_ns=300_000_000,
            compute_scale=2.0,
            path_gaps_ns=max(gaps),
            replayed_step_ns=4_500_000_000,
        )
        assert load.sizing is not None and load.sizing.step_here_ns == 4_500_000_000
        assert load.parameters()["compute_load_auto"] == "the trace records its capture CPU"
    finally:
        load.close()
    # auto's load is a default: a warm-up without a whole step replays without it, saying so.
    unsized = ComputeLoad(jobs)
    try:
        unsized.size(replay_cpu_ns=0, steps=0)
        assert unsized.sizing is None
        assert unsized.parameters() == {
            "compute_load": "none",
            "compute_load_auto": "the warm-up replayed no whole step to size it by "
            "(lengthen --warmup)",
        }
    finally:
        unsized.close()
    # auto loads only the ps-throughput benchmark paced by its dependencies.
    asap = ComputeLoad([dataclasses.replace(job, pacing=Pacing()) for job in jobs])
    assert asap.gap_writer(0) is None and asap.parameters() == {
        "compute_load": "none",
        "compute_load_auto": "not a ps-throughput benchmark paced by its dependencies",
    }
    asked = [dataclasses.replace(job, plan=dataclasses.replace(job.plan, compute_load_auto=""))
             for job in jobs]  # fmt: skip
    given = ComputeLoad(asked)
    try:
        with pytest.raises(TransportError, match="lengthen --warmup"):
            given.size(replay_cpu_ns=0, steps=0)
    finally:
        given.close()


def test_the_terminal_and_markdown_say_what_auto_chose_and_why() -> None:
    none = {"compute_load": "none", "compute_load_auto": "the trace records no capture CPU"}
    assert compute_load.report_line(none) == (
        "compute load: none (auto: the trace records no capture CPU)"
    )
    chosen = {
        "compute_load": "uniform",
        "compute_load_auto": "the trace records its capture CPU",
        "compute_load_sizing": "uniform: 0.50 CPU-s a step",
    }
    assert compute_load.report_line(chosen) == (
        "compute load: uniform (auto: the trace records its capture CPU); "
        "uniform: 0.50 CPU-s a step"
    )


def test_role_refuses_the_load_each_task_would_add_whole() -> None:
    job = role.RoleJob(
        spec=ReplaySpec(trace="x.tfgbtrace", compute_load="gaps"), flags=role.RoleFlags()
    )
    with pytest.raises(
        UsageError, match=r"^--compute-load sizes one replay's load .* network compare$"
    ):
        role.check_job(job)
    # auto (the default) runs none under role (``choose``'s one_task).
    role.check_job(dataclasses.replace(job, spec=ReplaySpec(trace="x.tfgbtrace")))
    assert ReplaySpec(trace="x.tfgbtrace").compute_load == "auto"


# --------------------------------------------------------------------------
# Rounds that wait for their quotas (``--compute-load-wait``).


def test_a_round_whose_path_is_done_owes_the_rest_of_its_quota_at_once() -> None:
    clocks = _Clocks()
    burner = _quota_burner(clocks, 200_000_000, 1_000_000_000)
    burner.begin_round(1, 0)
    clocks.wall = 100_000_000
    _catch_up(burner, clocks)
    # Due evenly over the step: a fifth of the wall time so far.
    done = clocks.cpu
    assert done == pytest.approx(0.2 * clocks.wall, abs=2) and not burner.quota_done()
    # The round's path is done (the first worker's process waits): all of it is due now.
    burner.due_now = True
    burner.account()
    assert burner.quota_owed_ns() == 200_000_000 - done
    _catch_up(burner, clocks)
    assert clocks.cpu == 200_000_000 and burner.quota_done()


def _waiting_loop(
    quota_done: Callable[[Any], bool] | None, barrier: bool
) -> tuple[tuple[int, ...], list[int], list[int]]:
    """Three rounds of the fake loop (``test_round_barrier``'s): the step times, each
    round's start, and the round lengths the quota wait was asked with; the wait is
    ``quota_done`` on the fake clock (None: no wait)."""
    from .test_round_barrier import _Barrier, _Clock, _Driver, _workload

    clock = _Clock()
    told: list[int] = []
    asked: list[int] = []

    def wait(round_ns: int) -> bool:
        asked.append(round_ns)
        assert quota_done is not None
        return quota_done(clock)

    loop = WorkerLoop(
        _workload([5, 7, 9]),
        _Driver(clock),  # type: ignore[arg-type]
        clock=clock,
        cpu_clock=lambda: 0,
        machine_cpu=lambda: None,
        step_barrier=_Barrier(clock) if barrier else None,
        on_round=told.append,
        quota_wait=None if quota_done is None else wait,
    )
    outcome = loop.measure(begin_ns=clock.now, duration_ns=10**9, step_count=3)
    return outcome.step_times_ns, told, asked


def test_a_round_ends_only_once_the_quota_wait_returns() -> None:
    from .test_round_barrier import OTHER_WORKER_LATER_NS, WORK_NS

    def quota_late(clock: Any) -> bool:
        clock.now += 30
        return True

    plain, _, _ = _waiting_loop(None, barrier=True)
    assert plain == (WORK_NS + OTHER_WORKER_LATER_NS,) * 3
    # The quota done 30 ns after the path: the barrier is reached that much later, and the
    # next round begins after it; the wait is asked with the round's length so far.
    waited, told, asked = _waiting_loop(quota_late, barrier=True)
    assert waited == (WORK_NS + 30 + OTHER_WORKER_LATER_NS,) * 3
    assert [b - a for a, b in itertools.pairwise(told)] == list(waited[:2])
    assert asked == [WORK_NS] * 3
    # Without a barrier (one worker) the round still lasts until its quota is done.
    alone, _, _ = _waiting_loop(quota_late, barrier=False)
    assert alone == (WORK_NS + 30,) * 3
    # A quota done by the path's end: the round is the path's, as without the wait.
    assert _waiting_loop(lambda clock: False, barrier=True)[0] == plain


def test_a_round_waits_until_its_quota_burner_has_done_its_quota() -> None:
    quota = 200_000_000
    tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    pool = burners.Burners(0)
    try:
        # Due evenly over a step of days: only the round's end makes it due at once.
        pool.set_load(0.0, [quota], 10**15, wait=True)
        assert pool.rounds.waits_for() == 1
        idle = _settled_cpu(pool)
        pool.rounds.begin(time.monotonic_ns())
        waited, unmet = pool.rounds.await_quotas(time.monotonic_ns() + 600 * 10**9)
        released = pool.cpu_ns() - idle
        assert (waited, unmet) == (True, False)
        # The round was let go after the burner's CPU had done its quota.
        assert released >= quota - 2 * tick
        waits = pool.rounds.waits()
        assert (waits.rounds, waits.waited, waits.unmet) == (1, 1, 0) and waits.waited_ns > 0
        assert pool.end_rounds() == burners.QuotaRounds(
            rounds=1, owed_ns=quota, done_ns=quota, short=0
        )
        # A bound already passed lets the next round go at once, its quota not done.
        pool.restart_quotas()
        pool.rounds.begin(time.monotonic_ns())
        looks: list[float] = []
        assert pool.rounds.await_quotas(time.monotonic_ns() - 1, looks.append) == (False, True)
        assert looks == [] and pool.rounds.waits().unmet == 1
    finally:
        pool.close()


def test_a_round_does_not_wait_for_a_quota_burner_gone() -> None:
    pool = burners.Burners(0)
    try:
        pool.set_load(0.0, [50_000_000, 50_000_000], 10**15, wait=True)
        first, _ = pool.pids
        os.kill(first, signal.SIGKILL)
        assert _wait_gone([first]) == []
        pool.rounds.begin(time.monotonic_ns())
        # The one alive is waited for; the one gone is not, and its quota is not met.
        assert pool.rounds.await_quotas(time.monotonic_ns() + 600 * 10**9) == (True, True)
        assert pool.end_rounds() == burners.QuotaRounds(
            rounds=1, owed_ns=100_000_000, done_ns=50_000_000, short=1
        )
        os.kill(pool.pids[1], signal.SIGKILL)
        assert _wait_gone([pool.pids[1]]) == []
        pool.rounds.begin(time.monotonic_ns())
        looks: list[float] = []
        assert pool.rounds.await_quotas(time.monotonic_ns() + 600 * 10**9, looks.append) == (
            False,
            True,
        )
        assert looks == []
    finally:
        pool.close()


def test_without_the_wait_no_round_waits_nor_owes_its_quota_at_once() -> None:
    pool = burners.Burners(0)
    try:
        pool.set_load(0.0, [50_000_000], 10**15)
        assert pool.rounds.waits_for() == 0
        pool.rounds.begin(time.monotonic_ns())
        looks: list[float] = []
        assert pool.rounds.await_quotas(time.monotonic_ns() + 600 * 10**9, looks.append) == (
            False,
            False,
        )
        assert looks == [] and pool.rounds.due() == 0
        assert pool.rounds.waits() == burners.QuotaWaits()
    finally:
        pool.close()


def test_the_wait_flag_needs_a_load_and_goes_to_the_plan(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--compute-load-wait waits for a compute load's"):
        ReplaySpec(trace="x.tfgbtrace", compute_load="none", compute_load_wait=True)
    spec = ReplaySpec(trace="x.tfgbtrace", compute_load_wait=True)
    assert "--compute-load-wait" in spec.to_argv()
    busy = _busy_trace(tmp_path)
    assert _request(busy, "--compute-load-wait").plan.compute_load_wait  # type: ignore[attr-defined]
    assert not _request(busy).plan.compute_load_wait  # type: ignore[attr-defined]
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "tf_grpc_bench", "replay", str(busy)),
            *("--compute-load", "none", "--compute-load-wait"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode != 0
    assert completed.stderr.strip().splitlines() == [
        "tf-grpc-bench replay: error: --compute-load-wait waits for a compute load's quotas: "
        "not with none"
    ]


def test_the_terminal_report_says_how_long_rounds_waited_for_their_quota() -> None:
    entries = compute_load.wait_entries(
        rounds=25, waited=6, unmet=1, waited_ns=600_000_000, time_dilation=2.0
    )
    assert entries == {
        compute_load.WAIT_ENTRY: True,
        compute_load.WAIT_S_ENTRY: 0.3,
        compute_load.WAIT_S_PER_ROUND_ENTRY: 0.012,
        compute_load.WAIT_ROUNDS_ENTRY: 6,
        compute_load.WAIT_UNMET_ENTRY: 1,
    }
    line = compute_load.report_line(
        {
            "compute_load": "uniform",
            "compute_load_cpu_s_per_step": 0.4412,
            "compute_load_cpu_cores": 0.66,
            compute_load.QUOTA_MET_ENTRY: 0.97,
            compute_load.ROUNDS_ENTRY: 25,
            compute_load.ROUNDS_SHORT_ENTRY: 1,
            **entries,
        }
    )
    assert line.endswith(
        "not counted as the replay's; rounds waited for the quota 0.012 s a round "
        "(6 of 25, 1 let go short)"
    )
    unused = compute_load.wait_entries(rounds=0, waited=0, unmet=0, waited_ns=0, time_dilation=1.0)
    assert compute_load.report_line({"compute_load": "uniform", **unused}) == (
        "compute load: uniform; no round had a quota to wait for"
    )


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_a_replay_whose_rounds_wait_for_their_quota_says_how_long(
    tmp_path: Path, engine: str
) -> None:
    if engine == "grpc-cpp":
        grpc_cpp_program()
    trace = with_step_lengths(make_trace(steps=4, workers=2), [100.0] * 4)
    path = _busy_trace(tmp_path, trace)
    output = tmp_path / "out"
    completed = _replay(
        path, output, "--engine", engine, "--compute-load", "uniform", "--compute-load-wait"
    )
    assert completed.returncode == 0, completed.stderr
    assert "; rounds waited for the quota " in completed.stdout
    (results,) = output.glob("*/results.json")
    parameters = json.loads(results.read_text())["benchmarks"][0]["parameters"]
    assert parameters[compute_load.WAIT_ENTRY] is True
    rounds = parameters[compute_load.ROUNDS_ENTRY]
    assert rounds >= 1
    assert parameters[compute_load.WAIT_ROUNDS_ENTRY] in range(rounds + 1)
    assert parameters[compute_load.WAIT_UNMET_ENTRY] in range(rounds + 1)
    assert parameters[compute_load.WAIT_S_PER_ROUND_ENTRY] >= 0


def test_a_load_whose_rounds_wait_splits_its_quota_over_a_burner_per_core(
    tmp_path: Path,
) -> None:
    trace = with_step_lengths(make_trace(steps=4, workers=2), [100.0] * 4)
    jobs = [
        dataclasses.replace(job, plan=dataclasses.replace(job.plan, compute_load_wait=True))
        for job in _load_jobs(_busy_trace(tmp_path, trace))
    ]
    load = ComputeLoad(jobs)
    try:
        load.size(replay_cpu_ns=0, steps=2, wall_ns=200_000_000)
        assert load.sizing is not None
        whole, _ = compute_load.burner_quotas(load.sizing, 1.0)
        pool = load._burners
        assert pool is not None
        cores = len(os.sched_getaffinity(0))
        assert len(pool.pids) == pool.rounds.waits_for() == max(len(whole), cores)
        with load.measuring():
            pass
        assert load.parameters()[compute_load.WAIT_ENTRY] is True
    finally:
        load.close()
