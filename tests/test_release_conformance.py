"""One release rule, two engines: the same plans replayed by the grpcio engine's driver and
by the gRPC C++ engine's, each checked against the rule itself.

The rule is Python's alone (``core.pacing`` and the dependency model's
``DependencyTracker``); the gRPC C++ program is only told release times and
windows.  For every call either engine made, the rule is worked out again here
from what the engine itself measured (the step's begin, the completion times of
what the call waited for) and must say: the call went no earlier than its
release, the lag the engine reported is exactly how much later it went, and the
window held when it went.  Under dependencies pacing the step's end must be the
tracker's too.  Nothing here is timed against the wall clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tf_grpc_bench.dependency_tracker import DependencyTracker
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload, trace_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark, CallSample
from tf_grpc_bench.replay.core.pacing import (
    OPEN_LOOP_MAX_IN_FLIGHT,
    Pacing,
    Timing,
    may_issue,
    release_time_ns,
)
from tf_grpc_bench.replay.core.workload import Call, Mode, Shape, Workload, WorkloadStep
from tf_grpc_bench.replay.native.driver import (
    EngineClient,
    NativeDriver,
    rows_of,
    window_limits,
)
from tf_grpc_bench.replay.native.protocol import NO_LIMIT
from tf_grpc_bench.replay.native.servers import NativeServers
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.driver import Driver, StepOutcome
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.loop import WorkerLoop
from tf_grpc_bench.replay.transport.wire import ChannelSettings

from .conftest import make_trace, make_whole_step_trace
from .engines import grpc_cpp_program

ENGINES = ("grpcio", "grpc-cpp")


@dataclass
class ReplayedStep:
    step: WorkloadStep
    run_begin_ns: int
    step_begin_ns: int
    samples: list[CallSample]
    outcome: StepOutcome


class Recording:
    """A driver, with what it was asked and what it measured, step by step."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.steps: list[ReplayedStep] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)

    def run_step(
        self,
        step: WorkloadStep,
        *,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None = None,
        give_up_at_ns: int | None = None,
        samples: list[CallSample] | None = None,
    ) -> StepOutcome:
        assert samples is not None
        before = len(samples)
        outcome = self.driver.run_step(
            step,
            run_begin_ns=run_begin_ns,
            step_begin_ns=step_begin_ns,
            stop_at_ns=stop_at_ns,
            give_up_at_ns=give_up_at_ns,
            samples=samples,
        )
        self.steps.append(
            ReplayedStep(step, run_begin_ns, step_begin_ns, samples[before:], outcome)
        )
        return outcome


@contextlib.contextmanager
def recorded_replay(
    engine: str, workload: Workload, pacing: Pacing, steps: int
) -> Iterator[Recording]:
    """``steps`` steps of ``workload`` (one worker) replayed by ``engine``, recorded."""
    mode = workload.mode
    settings = ChannelSettings()
    if engine == "grpc-cpp":
        with NativeServers(workload.server_count, grpc_cpp_program(), mode=mode) as servers:
            client = EngineClient(
                grpc_cpp_program(),
                rows=rows_of(workload.steps, mode, pacing),
                targets=servers.targets,
                mode=mode,
                settings=settings,
                pacing=pacing,
                deadline_s=30,
                connect_timeout_s=10,
            )
            try:
                recording = Recording(NativeDriver(client, workload.steps, mode, pacing))
                WorkerLoop(workload, recording).measure(duration_ns=10**9, step_count=steps)
                yield recording
            finally:
                client.close()
        return
    with LocalServers(workload.server_count, mode=mode) as python_servers:
        clients = {
            index: ReplayClient(target, mode=mode, settings=settings)
            for index, target in enumerate(python_servers.targets)
        }
        try:
            driver = Driver(clients, pacing, timeout_s=30)
            driver.prepare(workload.steps)
            recording = Recording(driver)
            WorkerLoop(workload, recording).measure(duration_ns=10**9, step_count=steps)
            yield recording
        finally:
            for client in clients.values():
                client.close()


def _index_of(step: WorkloadStep, sample: CallSample, taken: set[int]) -> int:
    """The call of ``step`` a sample is of (trace calls by their RPC, synthetic by size)."""
    for index, call in enumerate(step.calls):
        if index in taken:
            continue
        same = (call.rpc_index, call.request_bytes, call.server_index)
        if same == (sample.rpc_index, sample.request_bytes, sample.server_index):
            taken.add(index)
            return index
    raise AssertionError(f"no call of the step for {sample}")


def _check_windows(pacing: Pacing, replayed: ReplayedStep, calls: list[Call]) -> None:
    """At each call's issue, what was in flight (issued before, not yet ended) fit the window."""
    spans = [
        (replayed.run_begin_ns + s.start_ns, replayed.run_begin_ns + s.start_ns + s.latency_ns)
        for s in replayed.samples
    ]
    for (start, _), call in zip(spans, calls, strict=True):
        open_calls = [
            other
            for (other_start, other_end), other in zip(spans, calls, strict=True)
            if other_start < start < other_end
        ]
        to_server = sum(1 for other in open_calls if other.server_index == call.server_index)
        assert may_issue(pacing, call, in_flight=len(open_calls), in_flight_to_server=to_server)


def check_against_the_rule(pacing: Pacing, recording: Recording) -> int:
    """Every call's issue against its release under the rule; how many calls were checked."""
    checked = 0
    issued = 0
    for replayed in recording.steps:
        taken: set[int] = set()
        indices = [_index_of(replayed.step, s, taken) for s in replayed.samples]
        calls = [replayed.step.calls[i] for i in indices]
        assert len(indices) == len(replayed.step.calls), "every call of the step, once"
        starts = [replayed.run_begin_ns + s.start_ns for s in replayed.samples]
        if pacing.timing is Timing.DEPENDENCIES:
            releases = _dependency_releases(pacing, replayed, indices)
        else:
            order = sorted(range(len(starts)), key=lambda n: starts[n])
            number = {n: issued + rank for rank, n in enumerate(order)}
            releases = [
                release_time_ns(
                    pacing,
                    call,
                    call_number=number[n],
                    step_begin_ns=replayed.step_begin_ns,
                    run_begin_ns=replayed.run_begin_ns,
                )
                for n, call in enumerate(calls)
            ]
        issued += len(calls)
        ends = [start + s.latency_ns for start, s in zip(starts, replayed.samples, strict=True)]
        for sample, start, release in zip(replayed.samples, starts, releases, strict=True):
            if release is None:
                assert sample.release_lag_ns == 0
                assert sample.window_held == 0, "no release, nothing to hold back"
                continue
            assert start >= release, "issued before its release"
            assert sample.release_lag_ns == start - release, "the lag reported is the lag"
            if sample.window_held:
                # measurement.release_held: the completion that opened the window came
                # after the call's release and before it went.
                assert any(release <= end <= start for end in ends), "held with no opening"
            checked += 1
        _check_windows(pacing, replayed, calls)
    return checked


def _dependency_releases(
    pacing: Pacing, replayed: ReplayedStep, indices: list[int]
) -> list[int | None]:
    """Each sample's release as the tracker gives it from the engine's own completions."""
    step = replayed.step
    tracker = DependencyTracker(
        [call.dependencies for call in step.calls if call.dependencies is not None],
        servers=[call.server_index for call in step.calls],
        step_begin_ns=replayed.step_begin_ns,
        period_ns=step.period_ns,
        compute_scale=pacing.wall_compute_scale,
        step_compute_ns=step.step_compute_ns,
        round_tail_ns=step.round_tail_ns,
    )
    for sample, index in zip(replayed.samples, indices, strict=True):
        end = replayed.run_begin_ns + sample.start_ns + sample.latency_ns
        tracker.complete(index, end)
    assert replayed.outcome.next_begin_ns == tracker.next_step_begin_ns()
    return [tracker.release_ns(index) for index in indices]


def _trace_workload(trace: Any) -> Workload:
    return trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED).for_worker(0)


PLANS = {
    "dependencies, whole steps": (
        lambda: _trace_workload(make_whole_step_trace()),
        Pacing(timing=Timing.DEPENDENCIES, window=None, compute_scale=20.0),
    ),
    "dependencies, dilated, window 2": (
        lambda: _trace_workload(make_trace(steps=3, ps=2, sizes=(21, 4096, 300_000))),
        Pacing(timing=Timing.DEPENDENCIES, window=2, time_dilation=3.0),
    ),
    "recorded, recorded window": (
        lambda: _trace_workload(make_trace(steps=3, ps=2, sizes=(21, 4096, 300_000))),
        Pacing(timing=Timing.RECORDED, window=None, speedup=0.5),
    ),
    "rate": (
        lambda: synthetic_workload(
            Benchmark.PS_THROUGHPUT,
            GeneratorConfig(payload_count=5),
            mode=Mode.NON_SERIALIZED,
            ps_count=2,
        ),
        Pacing(timing=Timing.RATE, rate_per_s=3000.0, window=None),
    ),
    "rate past the link, window 1": (
        lambda: synthetic_workload(
            Benchmark.PS_THROUGHPUT,
            GeneratorConfig(payload_count=4),
            mode=Mode.NON_SERIALIZED,
            ps_count=1,
        ),
        Pacing(timing=Timing.RATE, rate_per_s=1_000_000.0, window=1),
    ),
    "closed loop, window 3": (
        lambda: synthetic_workload(
            Benchmark.P2P_BANDWIDTH, GeneratorConfig(payload_count=6), mode=Mode.NON_SERIALIZED
        ),
        Pacing(window=3),
    ),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("plan", list(PLANS))
def test_both_engines_release_every_call_as_the_one_rule_says(engine: str, plan: str) -> None:
    make, pacing = PLANS[plan]
    workload = make()
    steps = 2 * len([s for s in workload.steps if s.calls])
    with recorded_replay(engine, workload, pacing, steps) as recording:
        checked = check_against_the_rule(pacing, recording)
    timed = pacing.timing is not Timing.ASAP
    assert len(recording.steps) == steps
    assert (checked > 0) == timed
    held = sum(s.window_held for replayed in recording.steps for s in replayed.samples)
    if plan == "rate past the link, window 1":
        # Released a microsecond apart, one call at a time: each call's release came
        # while the one before it was in flight, so the window held calls back.
        assert held > 0
    if not timed:
        assert held == 0


@pytest.mark.parametrize(
    "pacing",
    [
        Pacing(window=4),
        Pacing(window=None),
        Pacing(timing=Timing.RATE, rate_per_s=10.0, window=None),
        Pacing(timing=Timing.DEPENDENCIES, window=None),
        Pacing(timing=Timing.RECORDED, window=None),
        Pacing(timing=Timing.RECORDED, window=2),
    ],
)
def test_the_programs_window_is_the_pacings_window(pacing: Pacing) -> None:
    """``window_limits`` (what the program applies) allows exactly what ``may_issue`` does."""
    for outstanding in range(4):
        call = Call(
            shape=Shape.PULL, method="/m", request_bytes=1, response_bytes=1,
            outstanding_at_start=outstanding,
        )  # fmt: skip
        total, to_server_limit = window_limits(pacing, call)
        for in_flight in (0, 1, 3, 4, 5, OPEN_LOOP_MAX_IN_FLIGHT - 1, OPEN_LOOP_MAX_IN_FLIGHT):
            for to_server in range(min(in_flight, 6) + 1):
                program = (total == 0 or in_flight < total) and (
                    to_server_limit == NO_LIMIT or to_server <= to_server_limit
                )
                rule = may_issue(pacing, call, in_flight=in_flight, in_flight_to_server=to_server)
                assert program == rule, (in_flight, to_server, outstanding)
