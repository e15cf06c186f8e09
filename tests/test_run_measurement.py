"""How one run's worker outcomes and server counts become its measurement: complete only when
every worker finished and the servers' statistics came back; the first worker's own reason
kept when one stopped early."""

from __future__ import annotations

import dataclasses

from tf_grpc_bench.host import MachineCpuTimes
from tf_grpc_bench.replay.core.measurement import CallSample
from tf_grpc_bench.replay.transport.loop import WorkerOutcome, run_measurement
from tf_grpc_bench.replay.transport.wire import ServerStats


def _sample(start_ns: int, worker: int) -> CallSample:
    return CallSample(
        start_ns=start_ns,
        latency_ns=100,
        request_bytes=10,
        response_bytes=20,
        payload_bytes=20,
        worker_index=worker,
    )


def _outcome(worker: int, *, starts: tuple[int, ...], reason: str = "") -> WorkerOutcome:
    return WorkerOutcome(
        samples=tuple(_sample(s, worker) for s in starts),
        step_times_ns=(1000 + worker, 2000 + worker),
        step_compute_ns=(5 + worker,),
        elapsed_ns=7000 + worker,
        cpu_ns=300 + worker,
        partial=bool(reason),
        partial_reason=reason,
    )


STATS = [
    ServerStats(mode="raw", received_bytes=400, received_messages=4, cpu_ns=11),
    ServerStats(mode="raw", received_bytes=100, received_messages=1, cpu_ns=22),
]


def test_a_run_with_every_worker_done_and_the_servers_counts_is_complete() -> None:
    run = run_measurement(2, [_outcome(0, starts=(30, 10)), _outcome(1, starts=(20,))], STATS)
    assert (run.partial, run.partial_reason) == (False, "")
    assert run.run_index == 2
    assert [(s.start_ns, s.worker_index) for s in run.samples] == [(10, 0), (20, 1), (30, 0)]
    assert run.duration_ns == 7001
    assert run.step_times_ns == (1000, 2000, 1001, 2001)
    assert run.step_compute_ns == (5, 6)
    assert run.client_cpu_ns == 601
    assert run.server_cpu_ns == 33
    assert (run.server_received_bytes, run.server_received_messages) == (500, 5)


def test_a_run_whose_server_statistics_were_lost_is_partial() -> None:
    run = run_measurement(0, [_outcome(0, starts=(1,)), _outcome(1, starts=(2,))], None)
    assert run.partial
    assert run.partial_reason == "server statistics unavailable after the run"
    assert (run.server_cpu_ns, run.server_received_bytes, run.server_received_messages) == (
        0,
        -1,
        -1,
    )
    assert len(run.samples) == 2


def test_a_dead_servers_own_error_is_kept_when_the_statistics_are_lost_too() -> None:
    outcomes = [
        _outcome(0, starts=(1,)),
        _outcome(1, starts=(2,), reason="ps 1 at 127.0.0.1:5 went away: UNAVAILABLE"),
        _outcome(2, starts=(3,), reason="a later reason"),
    ]
    run = run_measurement(0, outcomes, None)
    assert run.partial
    assert run.partial_reason == "ps 1 at 127.0.0.1:5 went away: UNAVAILABLE"


def test_a_partial_worker_makes_the_run_partial_even_with_the_servers_counts() -> None:
    outcomes = [_outcome(0, starts=(1,), reason="interrupted"), _outcome(1, starts=(2,))]
    run = run_measurement(0, outcomes, STATS)
    assert (run.partial, run.partial_reason) == (True, "interrupted")
    assert run.server_received_bytes == 500


def test_empty_server_statistics_count_nothing_but_are_not_lost() -> None:
    run = run_measurement(0, [_outcome(0, starts=())], [])
    assert (run.partial, run.server_received_bytes, run.server_cpu_ns) == (False, -1, 0)


def test_a_run_carries_the_machines_ticks_from_the_first_begin_to_the_last_end() -> None:
    begin = MachineCpuTimes(busy_ticks=10, total_ticks=100)
    end = MachineCpuTimes(busy_ticks=70, total_ticks=180)
    outcomes = [
        dataclasses.replace(_outcome(0, starts=(1,)), machine_cpu_begin=begin, machine_cpu_end=end),
    ]
    run = run_measurement(0, outcomes, STATS)
    assert (run.machine_cpu_busy_ticks, run.machine_cpu_total_ticks) == (60, 80)
