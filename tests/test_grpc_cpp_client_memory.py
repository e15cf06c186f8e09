"""The gRPC C++ client program keeps the buffers of the responses it receives for the next
ones, as the servers keep their requests' (``wire.KEPT_ALLOCATION_BYTES``, the set-up
frame's last field): received 1 MiB responses then cost it far fewer page faults than
with the C library's defaults, where each one's buffers are mapped and zeroed afresh."""

from __future__ import annotations

import time

import pytest

from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode, WorkloadStep, pull_call
from tf_grpc_bench.replay.native import driver as native_driver
from tf_grpc_bench.replay.native.driver import EngineClient, NativeDriver, rows_of
from tf_grpc_bench.replay.native.servers import NativeServers
from tf_grpc_bench.replay.transport.wire import ChannelSettings

from .engines import grpc_cpp_program

MIB = 1 << 20
#: What a TensorFlow worker pulls its variables with.
RECV_TENSOR = "/tensorflow.WorkerService/RecvTensor"
WARM_UP = 4
MEASURED = 16


def _page_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def _faults_receiving(target: str) -> int:
    """Page faults of a client program pulling 8 responses of 1 MiB a step, ``MEASURED`` steps."""
    mode, pacing = Mode.NON_SERIALIZED, Pacing(timing=Timing.ASAP)
    calls = tuple(
        pull_call(method=RECV_TENSOR, request_bytes=120, response_bytes=MIB, mode=mode)
        for _ in range(8)
    )
    step = WorkloadStep(index=0, calls=calls)
    engine = EngineClient(
        grpc_cpp_program(), rows=rows_of([step], mode, pacing), targets=[target], mode=mode,
        settings=ChannelSettings(), pacing=pacing, deadline_s=30, connect_timeout_s=10,
    )  # fmt: skip
    try:
        driver = NativeDriver(engine, [step], mode, pacing)
        driver.begin_run()
        before = 0
        for number in range(WARM_UP + MEASURED):
            if number == WARM_UP:
                before = _page_faults(engine.process.pid)
            now = time.perf_counter_ns()
            driver.run_step(step, run_begin_ns=now, step_begin_ns=now)
        return _page_faults(engine.process.pid) - before
    finally:
        engine.close()


def test_the_client_program_keeps_the_buffers_of_the_responses_it_receives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with NativeServers(1, grpc_cpp_program(), mode=Mode.NON_SERIALIZED) as servers:
        kept = _faults_receiving(servers.targets[0])
        monkeypatch.setattr(native_driver, "KEPT_ALLOCATION_BYTES", 0)
        given_back = _faults_receiving(servers.targets[0])
    assert kept * 2 < given_back, (kept, given_back)
