"""A synthetic workload's one step, replayed for a duration under ``asap`` pacing, is cycled
by the gRPC C++ engine's program itself (``R`` frames' mode ``STEP_CYCLED``): one frame
each way per run instead of per step, and the same calls as the grpcio engine's loop
makes (each cycle's calls drained before the next begins, none begun past the stop)."""

from __future__ import annotations

import itertools

import pytest

from tf_grpc_bench.replay.core.benchmarks import synthetic_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark, CallSample
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.native.driver import NativeDriver
from tf_grpc_bench.replay.native.process import EngineProcess
from tf_grpc_bench.replay.native.protocol import STEP_CYCLED, STEP_ORDERED
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.wire import ChannelSettings, RpcKind

from .test_grpc_cpp_client import native_loop, servers_of

PAYLOADS = 3
DURATION_NS = 400_000_000


class _StepFrames:
    """Counts the ``R`` frames a program is sent, by mode (the frames still go)."""

    def __init__(self, process: EngineProcess) -> None:
        self.modes: list[int] = []
        self._send = process.send
        process.send = self.send

    def send(self, frame: bytes) -> None:
        if frame[4:5] == b"R":
            self.modes.append(frame[13])
        self._send(frame)


def _cycles(samples: list[CallSample]) -> list[list[CallSample]]:
    ordered = sorted(samples, key=lambda s: s.start_ns)
    return [ordered[i : i + PAYLOADS] for i in range(0, len(ordered), PAYLOADS)]


@pytest.mark.parametrize("rpc", [RpcKind.UNARY, RpcKind.STREAMING])
def test_a_synthetic_step_is_cycled_by_the_program_drained_between_cycles(rpc: RpcKind) -> None:
    workload = synthetic_workload(
        Benchmark.P2P_BANDWIDTH, GeneratorConfig(payload_count=PAYLOADS), mode=Mode.NON_SERIALIZED
    )
    settings = ChannelSettings(session="cycles", rpc=rpc)
    with servers_of("grpc-cpp", 1, Mode.NON_SERIALIZED) as targets:
        loop, engine = native_loop(workload, targets, Pacing(window=2), settings)
        control = ReplayClient(targets[0], mode=workload.mode, settings=settings)
        try:
            frames = _StepFrames(engine.process)
            control.reset_stats()
            outcome = loop.measure(duration_ns=DURATION_NS, step_count=None)
            stats = control.stats()
        finally:
            engine.close()
            control.close()
    assert not outcome.partial, outcome.partial_reason
    assert frames.modes == [STEP_CYCLED]
    cycles = _cycles(list(outcome.samples))
    assert len(cycles) > 2
    assert stats.received_messages == len(outcome.samples)
    for before, after in itertools.pairwise(cycles):
        assert len(before) == PAYLOADS
        assert min(s.start_ns for s in after) >= max(s.start_ns + s.latency_ns for s in before)
    # The stop is checked before each cycle (as the loop checks it before each step): every
    # cycle but the last ended before it.
    assert max(s.start_ns + s.latency_ns for s in cycles[-2]) < DURATION_NS


def test_steps_counted_or_paced_are_not_cycled() -> None:
    workload = synthetic_workload(
        Benchmark.P2P_LATENCY, GeneratorConfig(payload_count=PAYLOADS), mode=Mode.NON_SERIALIZED
    )
    rate = Pacing(timing=Timing.RATE, rate_per_s=5000, window=None)
    with servers_of("grpc-cpp", 1, Mode.NON_SERIALIZED) as targets:
        for pacing, steps in ((Pacing(window=1), 4), (rate, None)):
            loop, engine = native_loop(workload, targets, pacing, ChannelSettings())
            try:
                frames = _StepFrames(engine.process)
                outcome = loop.measure(duration_ns=DURATION_NS // 4, step_count=steps)
            finally:
                engine.close()
            assert not outcome.partial, outcome.partial_reason
            assert isinstance(loop.driver, NativeDriver)
            # Each step its own frame, none cycled (a cycled run is one frame of its own mode).
            # How many steps a rate fits into the duration is the machine's: at least one.
            assert frames.modes and set(frames.modes) == {STEP_ORDERED}
            assert len(outcome.samples) <= PAYLOADS * len(frames.modes)
            if steps is not None:
                assert len(outcome.samples) == PAYLOADS * steps == PAYLOADS * len(frames.modes)
