"""The gRPC C++ engine's client executing a worker's calls (``NativeDriver`` under the
measuring loop), against a grpcio server and against its own: the servers count what a
grpcio client makes them count, and the samples are the calls."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark, CallSample
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode, Workload, WorkloadStep, pull_call
from tf_grpc_bench.replay.native.driver import EngineClient, NativeDriver, rows_of
from tf_grpc_bench.replay.native.servers import NativeServers
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.driver import Driver
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.loop import WorkerLoop, WorkerOutcome
from tf_grpc_bench.replay.transport.wire import ChannelSettings, RpcKind, ServerStats

from .engines import grpc_cpp_program


@contextlib.contextmanager
def servers_of(engine: str, count: int, mode: Mode) -> Iterator[list[str]]:
    if engine == "grpc-cpp":
        with NativeServers(count, grpc_cpp_program(), mode=mode) as native:
            yield native.targets
    else:
        with LocalServers(count, mode=mode) as python:
            yield python.targets


def native_loop(
    workload: Workload,
    targets: list[str],
    pacing: Pacing,
    settings: ChannelSettings,
    *,
    connect_timeout_s: float = 10,
) -> tuple[WorkerLoop, EngineClient]:
    engine = EngineClient(
        grpc_cpp_program(),
        rows=rows_of(workload.steps, workload.mode, pacing),
        targets=targets,
        mode=workload.mode,
        settings=settings,
        pacing=pacing,
        deadline_s=30,
        connect_timeout_s=connect_timeout_s,
    )
    driver = NativeDriver(engine, workload.steps, workload.mode, pacing)
    return WorkerLoop(workload, driver, cpu_clock=driver.cpu_ns), engine


def measure(
    client_engine: str,
    workload: Workload,
    targets: list[str],
    pacing: Pacing,
    settings: ChannelSettings,
    steps: int,
) -> tuple[WorkerOutcome, list[ServerStats]]:
    """One run of ``steps`` steps; the servers' counts of it."""
    controls = {
        index: ReplayClient(target, mode=workload.mode, settings=settings)
        for index, target in enumerate(targets)
    }
    engine = None
    try:
        if client_engine == "grpc-cpp":
            loop, engine = native_loop(workload, targets, pacing, settings)
        else:
            driver = Driver(controls, pacing, timeout_s=30)
            driver.prepare(workload.steps)
            loop = WorkerLoop(workload, driver)
        for control in controls.values():
            control.reset_stats()
        outcome = loop.measure(duration_ns=10**9, step_count=steps)
        return outcome, [control.stats() for control in controls.values()]
    finally:
        if engine is not None:
            engine.close()
        for control in controls.values():
            control.close()


@pytest.mark.parametrize("server_engine", ["grpcio", "grpc-cpp"])
@pytest.mark.parametrize(
    ("mode", "rpc"),
    [
        (Mode.NON_SERIALIZED, RpcKind.UNARY),
        (Mode.SERIALIZED, RpcKind.UNARY),
        (Mode.NON_SERIALIZED, RpcKind.STREAMING),
    ],
    ids=["raw", "serialized", "streaming"],
)
def test_the_native_client_makes_the_servers_count_what_a_grpcio_client_does(
    server_engine: str, mode: Mode, rpc: RpcKind
) -> None:
    generator = GeneratorConfig(payload_count=4)
    seen = {}
    for benchmark, pacing in (
        (Benchmark.P2P_LATENCY, Pacing(window=1)),
        (Benchmark.P2P_BANDWIDTH, Pacing(window=3)),
        (Benchmark.PS_THROUGHPUT, Pacing(timing=Timing.RATE, rate_per_s=2000, window=None)),
    ):
        workload = synthetic_workload(
            benchmark,
            generator,
            mode=mode,
            ps_count=2 if benchmark is Benchmark.PS_THROUGHPUT else 1,
        )
        for client_engine in ("grpcio", "grpc-cpp"):
            with servers_of(server_engine, workload.server_count, mode) as targets:
                settings = ChannelSettings(session=f"s-{client_engine}", rpc=rpc)
                outcome, stats = measure(client_engine, workload, targets, pacing, settings, 3)
            assert not outcome.partial, outcome.partial_reason
            calls = Counter(
                (s.server_index, s.request_bytes, s.response_bytes, s.worker_index, s.step)
                for s in outcome.samples
            )
            counts = [
                (s.received_messages, s.received_bytes, s.sent_bytes, s.per_method) for s in stats
            ]
            seen[client_engine] = (calls, counts)
            assert sum(calls.values()) == 3 * len(workload.calls)
            assert outcome.cpu_ns > 0 and all(s.latency_ns > 0 for s in outcome.samples)
            if pacing.timing is Timing.RATE:
                assert all(s.release_lag_ns >= 0 for s in outcome.samples)
        assert seen["grpc-cpp"] == seen["grpcio"], benchmark


def test_an_unreachable_target_and_a_server_of_the_other_mode_are_one_line_errors() -> None:
    generator = GeneratorConfig(payload_count=2)
    pacing = Pacing(window=1)
    raw = synthetic_workload(Benchmark.P2P_LATENCY, generator, mode=Mode.NON_SERIALIZED)
    # Nothing listens there: the connect timeout is waited out whole, so a short one.
    with pytest.raises(TransportError, match=r"^127\.0\.0\.1:9: no replay server reachable"):
        native_loop(raw, ["127.0.0.1:9"], pacing, ChannelSettings(), connect_timeout_s=1)
    serialized = synthetic_workload(Benchmark.P2P_BANDWIDTH, generator, mode=Mode.SERIALIZED)
    reasons = []
    for workload, server_mode in ((raw, Mode.SERIALIZED), (serialized, Mode.NON_SERIALIZED)):
        with servers_of("grpc-cpp", 1, server_mode) as targets:
            loop, engine = native_loop(workload, targets, pacing, ChannelSettings())
            try:
                outcome = loop.measure(duration_ns=10**9, step_count=1)
            finally:
                engine.close()
        assert outcome.partial and not outcome.samples
        reasons.append(outcome.partial_reason)
    assert reasons[0].endswith("/tf_grpc_bench.Replay/Echo: call failed [INTERNAL]: "
                               "Exception deserializing request!")  # fmt: skip
    assert reasons[1].endswith("(is the server running in serialized mode?)")


# --------------------------------------------------------------------------
# One deadline for the chunks of one payload


def _replay_step(
    engine: str, target: str, step: WorkloadStep, deadline_s: float
) -> tuple[list[CallSample], str]:
    """``step`` (non-serialized, recorded pacing) replayed once by ``engine`` against
    ``target``: its samples, and its error ("" none)."""
    pacing, mode = Pacing(timing=Timing.RECORDED), Mode.NON_SERIALIZED
    samples: list[CallSample] = []
    native = None
    if engine == "grpc-cpp":
        native = EngineClient(
            grpc_cpp_program(), rows=rows_of([step], mode, pacing), targets=[target], mode=mode,
            settings=ChannelSettings(), pacing=pacing, deadline_s=deadline_s, connect_timeout_s=10,
        )  # fmt: skip
        driver: NativeDriver | Driver = NativeDriver(
            native, [step], mode, pacing, deadline_s=deadline_s
        )
        client = None
    else:
        client = ReplayClient(target, mode=mode, settings=ChannelSettings())
        driver = Driver({0: client}, pacing, timeout_s=deadline_s)
        driver.prepare([step])
    try:
        driver.begin_run()
        now = time.perf_counter_ns()
        driver.run_step(step, run_begin_ns=now, step_begin_ns=now, samples=samples)
    except TransportError as error:
        return samples, str(error)
    finally:
        if native is not None:
            native.close()
        if client is not None:
            client.close()
    return samples, ""


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_a_payloads_chunks_share_the_deadline_its_first_chunk_got(engine: str) -> None:
    # Three chunks of one payload at --deadline 2, the last released 3 s after the first:
    # each would answer in time on its own, the payload does not.  Both engines fail the
    # third chunk at once, DEADLINE_EXCEEDED, worded alike; the same calls as whole
    # payloads each get a deadline of their own and all arrive.
    whole = pull_call(
        method="/tensorflow.WorkerService/RecvTensor", request_bytes=120, response_bytes=1000,
        mode=Mode.NON_SERIALIZED, tensor_name="w",
    )  # fmt: skip
    offsets = (0, 0, 3 * 10**9)
    chunks = tuple(
        replace(whole, offset_ns=offset, chunk_index=index, chunk_count=3)
        for index, offset in enumerate(offsets)
    )
    wholes = tuple(replace(whole, offset_ns=offset) for offset in offsets)
    began = time.monotonic()
    with LocalServers(1, mode=Mode.NON_SERIALIZED) as servers:
        (target,) = servers.targets
        samples, error = _replay_step(engine, target, WorkloadStep(index=0, calls=chunks), 2.0)
        unchunked, none = _replay_step(engine, target, WorkloadStep(index=0, calls=wholes), 2.0)
    assert time.monotonic() - began < 120  # generous: two steps of 3 s
    assert [s.response_bytes for s in samples] == [1000, 1000]
    assert error == (
        f"{target}/tensorflow.WorkerService/RecvTensor: no answer within the deadline "
        "(--deadline) [DEADLINE_EXCEEDED]: Deadline Exceeded (chunk 3 of the 3 that carry one "
        "payload: --deadline bounds them together)"
    )
    assert none == "" and len(unchunked) == 3
