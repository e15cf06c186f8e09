"""Whole steps: ps-to-ps calls and the chief's calls to workers replayed over real grpcio.

The servers' own statistics (per server, per session) are checked against what
the trace says each task received, worked out by hand from the trace's jobs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.replay import cli
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import WORKERS_AND_PS_ONLY, Mode, trace_workload
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.loop import PROC_STAT
from tf_grpc_bench.replay.transport.server import LocalServers
from tf_grpc_bench.replay.transport.wire import ChannelSettings
from tf_grpc_bench.trace import RECV_TENSOR, Rpc, RunMetadata, Step, Task, Trace

ENQUEUE = "/tensorflow.eager.EagerService/Enqueue"
ONE_PASS = RunPlan(warmup_ns=0, duration_ns=1, runs=1, passes=1, deadline_s=60)


def _rpc(method: str, caller: int, callee: int, request: int, response: int, start: int) -> Rpc:
    return Rpc(
        method=method,
        caller_task=caller,
        callee_task=callee,
        request_bytes=request,
        response_bytes=response,
        start_ns=start,
        response_start_ns=start + 2_000,
        end_ns=start + 10_000,
    )


def _whole_step_trace() -> Trace:
    """ps:0, ps:1, worker:0, worker:1, chief:0; per step: the chief's Enqueue to each worker,
    variable pulls, ps:0 pulling from ps:1 twice (one after the other), gradient pulls."""
    tasks = (
        Task(job="ps", index=0),
        Task(job="ps", index=1),
        Task(job="worker", index=0),
        Task(job="worker", index=1),
        Task(job="chief", index=0),
    )
    steps = []
    for number in range(2):
        base = 1_000_000 * (number + 1)
        rpcs = (
            _rpc(ENQUEUE, 4, 2, 14_093, 40, base),  # chief -> worker:0
            _rpc(ENQUEUE, 4, 3, 14_001, 41, base + 500),  # chief -> worker:1
            _rpc(RECV_TENSOR, 2, 0, 120, 300_000, base + 1_000),  # worker:0 pulls from ps:0
            _rpc(RECV_TENSOR, 3, 1, 121, 200_000, base + 1_000),  # worker:1 pulls from ps:1
            _rpc(RECV_TENSOR, 0, 1, 130, 177, base + 20_000),  # ps:0 pulls from ps:1
            _rpc(RECV_TENSOR, 0, 1, 131, 21, base + 40_000),  # and again, after it
            _rpc(RECV_TENSOR, 0, 2, 140, 300_000, base + 60_000),  # ps:0 pulls worker:0's grad
            _rpc(RECV_TENSOR, 1, 3, 141, 200_000, base + 60_000),  # ps:1 pulls worker:1's grad
        )
        steps.append(Step(index=number, start_ns=base, end_ns=base + 200_000, rpcs=rpcs))
    return Trace(metadata=RunMetadata(model="toy"), tasks=tasks, steps=tuple(steps))


def _received_by_task(trace: Trace) -> dict[int, list[int]]:
    """Per called task: [messages, bytes] it received, as the replay's servers see them.

    A ps pulling from a worker is replayed as the worker pushing to the ps: the ps
    server receives the response's bytes.  Anything else reaches the callee's server.
    """
    received: dict[int, list[int]] = {}
    for step in trace.steps:
        for rpc in step.rpcs:
            caller = trace.tasks[rpc.caller_task].job
            callee = trace.tasks[rpc.callee_task].job
            if caller == "ps" and callee != "ps":
                server, size = rpc.caller_task, rpc.response_bytes
            else:
                server, size = rpc.callee_task, rpc.request_bytes
            entry = received.setdefault(server, [0, 0])
            entry[0] += 1
            entry[1] += size
    return received


@pytest.fixture(scope="module")
def servers() -> Iterator[LocalServers]:
    with LocalServers(4, mode=Mode.NON_SERIALIZED) as running:
        yield running


def _server_counts(servers: LocalServers, count: int, session: str) -> list[tuple[int, int]]:
    """(messages, bytes) each server received from ``session``, read from the servers."""
    counts = []
    for target in servers.targets[:count]:
        client = ReplayClient(target, mode=servers.mode, settings=ChannelSettings(session=session))
        try:
            stats = client.stats()
        finally:
            client.close()
        counts.append((stats.received_messages, stats.received_bytes))
    return counts


def test_a_pass_replays_every_ps_to_ps_and_chief_to_worker_call_with_exact_sizes(
    servers: LocalServers,
) -> None:
    trace = _whole_step_trace()
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    parameters = workload.parameters()
    assert parameters["dropped_rpcs_per_pass"] == 0
    assert parameters["server_tasks"] == (
        "/job:ps/task:0,/job:ps/task:1,/job:worker/task:0,/job:worker/task:1"
    )
    session = "whole-steps-synthetic"
    result = run_benchmark(
        workload,
        servers.targets,
        plan=ONE_PASS,
        settings=ChannelSettings(session=session),
    )
    assert not result.partial, result.partial_reason
    (run,) = result.runs
    received = _received_by_task(trace)
    server_tasks = (0, 1, 2, 3)
    expected = [tuple(received[task]) for task in server_tasks]
    # ps:1 gets worker:1's pulls and gradient and ps:0's two pulls per step; each worker's
    # stand-in server gets the chief's Enqueue.
    assert expected == [(4, 600_240), (8, 400_764), (2, 28_186), (2, 28_002)]
    assert _server_counts(servers, 4, session) == expected
    assert run.server_received_messages == 16 == run.rpc_count
    # The side clients (the chief, ps:0) made their calls but record no step time; the two
    # workers record one per trace step.
    assert {s.worker_index for s in run.samples} == {0, 1, 2, 3}
    assert len(run.step_times_ns) == 2 * 2
    # ps:0's second pull from ps:1 waited for its first (dependencies pacing).
    ps_pulls = sorted(
        (s for s in run.samples if s.worker_index == 3 and s.step == 0), key=lambda s: s.start_ns
    )
    assert [s.request_bytes for s in ps_pulls] == [130, 131]
    assert ps_pulls[1].start_ns >= ps_pulls[0].start_ns + ps_pulls[0].latency_ns


@pytest.mark.parametrize("name", [n for n in trace_files.shipped_trace_names() if "tf2ps" in n])
def test_shipped_tf2_traces_drop_nothing_and_every_byte_is_replayed(name: str) -> None:
    trace = trace_files.read_trace(trace_files.shipped_trace_path(name))
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    parameters = workload.parameters()
    assert parameters["dropped_rpcs_per_pass"] == parameters["dropped_bytes_per_pass"] == 0
    assert parameters["dropped_rpcs"] == ""
    rpcs = [rpc for step in trace.steps for rpc in step.rpcs]
    assert parameters["calls_per_pass"] == len(workload.calls) == len(rpcs)
    assert sum(c.request_bytes + c.response_bytes for c in workload.calls) == sum(
        r.request_bytes + r.response_bytes for r in rpcs
    )


def test_the_shipped_trace_replays_a_step_of_every_kind_onto_the_servers(
    servers: LocalServers,
) -> None:
    trace = trace_files.read_trace(trace_files.default_trace_path())
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    one_step = RunPlan(warmup_ns=0, duration_ns=1, runs=1, steps=1, deadline_s=120)
    session = "whole-steps-shipped"
    result = run_benchmark(
        workload,
        servers.targets,
        pacing=Pacing(timing=Timing.DEPENDENCIES, compute_scale=0.0),
        plan=one_step,
        settings=ChannelSettings(session=session),
    )
    assert not result.partial, result.partial_reason
    first = Trace(metadata=trace.metadata, tasks=trace.tasks, steps=trace.steps[:1])
    received = _received_by_task(first)
    ps = trace.tasks_of_job("ps")
    workers = trace.tasks_of_job("worker")
    expected = [tuple(received[task]) for task in (*ps, *workers)]
    assert _server_counts(servers, 4, session) == expected
    (run,) = result.runs
    assert run.rpc_count == len(trace.steps[0].rpcs)
    # The worker processes read the machine's CPU (/proc/stat) at their run's begin and
    # end: a step moving 410 MB lasts many of the kernel's ticks.
    if PROC_STAT.exists():
        assert 0 <= run.machine_cpu_busy_ticks <= run.machine_cpu_total_ticks
        assert run.machine_cpu_total_ticks > 0


def _replay_args(*arguments: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure_replay(parser)
    return parser.parse_args(list(arguments))


def test_targets_for_the_ps_only_drop_the_chiefs_calls_and_say_so() -> None:
    request = cli.build_request(
        _replay_args("--benchmark", "ps-throughput", "--target", "127.0.0.1:1,127.0.0.1:2")
    )
    (workload,) = request.workloads
    parameters = workload.parameters()
    assert workload.server_count == 2
    assert parameters["dropped_rpcs"] == "chief->worker Enqueue: 20 RPCs, 281850 B"
    assert parameters["dropped_bytes_per_pass"] == 281_850
    assert parameters["side_clients"] == "/job:ps/task:0"  # ps-to-ps still replayed
    local = cli.build_request(_replay_args("--benchmark", "ps-throughput"))
    assert local.workloads[0].server_count == 4
    assert local.workloads[0].parameters()["dropped_rpcs_per_pass"] == 0


def test_a_cluster_replay_of_workers_and_ps_only_counts_the_rest_as_dropped() -> None:
    # What role falls back to when its cluster cannot place side clients or stand-ins.
    request = cli.build_request(
        _replay_args("--benchmark", "ps-throughput"), whole_steps=WORKERS_AND_PS_ONLY
    )
    (workload,) = request.workloads
    parameters = workload.parameters()
    assert (workload.server_count, workload.worker_count) == (2, 2)
    assert parameters["whole_steps"] == "worker <-> ps only"
    assert parameters["dropped_rpcs"] == (
        "chief->worker Enqueue: 20 RPCs, 281850 B; ps->ps RecvTensor: 1070 RPCs, 189348 B"
    )
