"""A stop signal to a gRPC C++ client at the worst moment: just after the step's ``F``
frame was taken from the program's output, before its samples were kept.

The signal is delivered there, not at a random time: the client (a worker process, the
real ``throughput._worker_main`` with its real ``_RunInterrupt``; or the one worker a
replay drives in its own process, ``InProcessWorkers``, under the session's handlers)
takes frames through ``EngineProcess``, which this test's child wraps to send itself the
signal as the first ``F`` of the measured run is taken.  Raised there, the interrupt
lost the step's samples, and the ``X`` the driver sent then came after the step had
ended: the program ignored it and the client waited for good (its run's samples lost, as
about 2 in 15 SIGTERMs did).  Held while a frame is taken and kept, the step's calls are
in the run's result.  The child is given a minute, not a wall-clock threshold: a client
that waits for good is what this finds.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tf_grpc_bench import lifetime
from tf_grpc_bench.replay import throughput
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload, trace_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.engines.grpc_cpp import InProcessWorkers
from tf_grpc_bench.replay.native import process
from tf_grpc_bench.replay.native.driver import EngineClient, rows_of
from tf_grpc_bench.replay.native.protocol import Encoder
from tf_grpc_bench.replay.native.servers import NativeServers
from tf_grpc_bench.replay.transport.loop import RunPlan
from tf_grpc_bench.replay.transport.seam import WorkerJob
from tf_grpc_bench.replay.transport.wire import ChannelSettings

from .conftest import make_trace
from .engines import grpc_cpp_program

#: How long the worker has to answer its run (it answers in well under a second).
ANSWER_S = 60.0


def _signal_after_the_first_f(signum: int) -> None:
    """Each ``F`` frame taken from the program (``take``; ``receive`` where there is none)
    followed at once by ``signum`` to this process, the first only: delivered while the
    driver has the frame and not yet its samples."""
    sent = []
    for name in ("take", "receive"):
        original = getattr(process.EngineProcess, name, None)
        if original is None:
            continue

        def taken_then_signal(self: Any, *args: Any, _original: Any = original) -> Any:
            frame = _original(self, *args)
            if frame.kind == "F" and not sent:
                sent.append(True)
                os.kill(os.getpid(), signum)
            return frame

        setattr(process.EngineProcess, name, taken_then_signal)


def _worker_interrupted_after_the_first_f(
    connection: multiprocessing.connection.Connection, spec: throughput.WorkerSpec
) -> None:
    """``throughput._worker_main``, its program's first ``F`` of the run followed at once
    by ``INTERRUPT_SIGNAL``."""
    _signal_after_the_first_f(throughput.INTERRUPT_SIGNAL)
    throughput._worker_main(connection, spec, parent_pid=os.getppid())


def _in_process_interrupted_after_the_first_f(
    connection: multiprocessing.connection.Connection, job: WorkerJob, program: str
) -> None:
    """``InProcessWorkers`` under the session's stop signal handlers, its program's first
    ``F`` of the run followed at once by SIGTERM; what the run kept, sent back."""
    _signal_after_the_first_f(signal.SIGTERM)
    with lifetime.interrupt_on_signals():
        workers = InProcessWorkers(job, Path(program))
        try:
            (outcome,) = workers.run(duration_ns=10**9, steps=None)
        finally:
            workers.close()
    connection.send((len(outcome.samples), outcome.partial_reason))


def _ordered_workload() -> tuple[Workload, Pacing]:
    generator = GeneratorConfig(payload_count=4)
    workload = synthetic_workload(Benchmark.P2P_LATENCY, generator, mode=Mode.NON_SERIALIZED)
    return workload, Pacing(window=1)


def _dependent_workload() -> tuple[Workload, Pacing]:
    trace = make_trace(steps=3, ps=1, sizes=(21, 4096))
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    return workload.for_worker(0), Pacing(timing=Timing.DEPENDENCIES, window=None)


@pytest.mark.parametrize(
    "workload_of", [_ordered_workload, _dependent_workload], ids=["ordered", "dependencies"]
)
def test_an_interrupt_just_after_the_steps_f_was_read_keeps_its_calls(workload_of: Any) -> None:
    program = grpc_cpp_program()
    workload, pacing = workload_of()
    with NativeServers(workload.server_count, program, mode=workload.mode) as servers:
        spec = throughput.WorkerSpec(
            worker_index=0,
            workload=workload,
            targets=tuple(servers.targets),
            pacing=pacing,
            plan=RunPlan(deadline_s=30, connect_timeout_s=10),
            settings=ChannelSettings(),
            native_program=str(program),
        )
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        worker = context.Process(target=_worker_interrupted_after_the_first_f, args=(theirs, spec))
        worker.start()
        try:
            assert ours.poll(ANSWER_S) and ours.recv() == ("ready",)
            ours.send(("run", time.monotonic_ns(), 10**9, len(workload.steps)))
            answered = ours.poll(ANSWER_S)
            result = ours.recv() if answered else None
        finally:
            worker.kill()
            worker.join()
    assert answered, "the worker waited for good after the interrupt"
    assert result is not None and result[0] == "result"
    samples = throughput.unpack_samples(result[1])
    assert result[6] is not None and result[6].startswith("interrupted by")
    # The first step whole (its F was read, then the interrupt came), and no other.
    assert len(workload.steps[0].calls) >= 2
    assert len(samples) == len(workload.steps[0].calls)


def test_a_stop_signal_just_after_the_runs_f_was_taken_in_process_keeps_its_calls() -> None:
    # One worker replayed from the replay's own process: its synthetic step cycled by the
    # program until the run's end, every sample of the run in the one F.
    program = grpc_cpp_program()
    workload, _ = _ordered_workload()
    with NativeServers(workload.server_count, program, mode=workload.mode) as servers:
        job = WorkerJob(
            worker_index=0,
            workload=workload,
            targets=tuple(servers.targets),
            pacing=Pacing(),
            plan=RunPlan(deadline_s=30, connect_timeout_s=10),
            channel=ChannelSettings(),
        )
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        child = context.Process(
            target=_in_process_interrupted_after_the_first_f, args=(theirs, job, str(program))
        )
        child.start()
        try:
            answered = ours.poll(ANSWER_S)
            kept = ours.recv() if answered else None
        finally:
            child.kill()
            child.join()
    assert answered, "the replay waited for good after the stop signal"
    assert kept is not None
    count, reason = kept
    assert reason == "interrupted by SIGTERM"
    assert count >= len(workload.steps[0].calls)


def test_a_stop_with_no_step_under_way_is_answered_with_an_empty_f() -> None:
    # An X that comes after the step's F: the program answers it, so a side waiting
    # for an F after sending one never waits for good.
    program = grpc_cpp_program()
    workload, pacing = _ordered_workload()
    with NativeServers(1, program, mode=workload.mode) as servers:
        client = EngineClient(
            program,
            rows=rows_of(workload.steps, workload.mode, pacing),
            targets=servers.targets,
            mode=workload.mode,
            settings=ChannelSettings(),
            pacing=pacing,
            deadline_s=30,
            connect_timeout_s=10,
        )
        try:
            client.process.send(Encoder("X").frame())
            frame = client.process.receive(ANSWER_S)
            assert frame.kind == "F"
            assert (frame.u32(), frame.text(), frame.u32()) == (0, "", 0)
            assert client.cpu_ns() > 0  # and it goes on answering
        finally:
            client.close()
