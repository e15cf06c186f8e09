"""Whole steps: ps-to-ps calls and the chief's calls to workers replayed over real grpcio.

The servers' own statistics (per server, per session) are checked against what
the trace says each task received, worked out by hand from the trace's jobs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.host import PROC_STAT
from tf_grpc_bench.replay import cli
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.network import compare as network_compare
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.loop import begin_mid_trace
from tf_grpc_bench.replay.transport.wire import ChannelSettings
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import WORKERS_AND_PS_ONLY

from .conftest import make_whole_step_trace

ONE_PASS = RunPlan(warmup_ns=0, duration_ns=1, runs=1, passes=1, deadline_s=60)


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
    trace = make_whole_step_trace()
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
    # The step a replay begins with: the trace's middle one.
    begun = next(s for s in trace.steps if s.index == begin_mid_trace(workload.steps)[0].index)
    first = Trace(metadata=trace.metadata, tasks=trace.tasks, steps=(begun,))
    received = _received_by_task(first)
    ps = trace.tasks_of_job("ps")
    workers = trace.tasks_of_job("worker")
    expected = [tuple(received[task]) for task in (*ps, *workers)]
    assert _server_counts(servers, 4, session) == expected
    (run,) = result.runs
    assert run.rpc_count == len(begun.rpcs)
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
        "chief->worker Enqueue: 20 RPCs, 281850 B; ps->ps RecvTensor: 1070 RPCs, 189345 B"
    )


def test_network_compare_places_ps_servers_and_ps_clients_on_one_host_the_rest_on_the_other() -> (
    None
):
    # The shipped tf2-ps trace: 2 ps servers on host 0 with the calling ps's side client,
    # the 2 stand-ins (workers the chief calls) on host 1 with the workers and the chief.
    shipped = cli.build_request(_replay_args("resnet50-tf2ps", "--benchmark", "all"))
    assert network_compare.host_layout(shipped.workloads) == network_compare.HostLayout(
        ps_servers=2, stand_ins=2, ps_clients=True
    )
    # --compute none: the layout does not depend on it, and the default (auto) would first
    # time the tf1 trace's model here (its tf_keras step, which no other test times).
    tf1 = cli.build_request(
        _replay_args("resnet50-tf1ps", "--benchmark", "ps-throughput", "--compute", "none")
    )
    assert network_compare.host_layout(tf1.workloads).stand_ins == 0
    synthetic = cli.build_request(_replay_args("--synthetic", "--ps", "3"))
    assert network_compare.host_layout(synthetic.workloads) == network_compare.HostLayout(
        ps_servers=3
    )


def test_a_side_client_whose_namespace_is_gone_ends_the_replay_partial_naming_it(
    servers: LocalServers,
) -> None:
    # --client-netns checks its namespaces; one deleted before the worker starts is
    # still reported by the worker, naming it, and nothing is measured.
    workload = trace_workload(
        make_whole_step_trace(), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )
    result = run_benchmark(
        workload, servers.targets, plan=ONE_PASS, client_namespaces={"ps": "tfgb-gone"}
    )
    assert result.partial
    assert "worker 3: network namespace 'tfgb-gone': not found" in result.partial_reason
    assert result.parameters["client_netns"] == "ps=tfgb-gone"
    assert not any(run.samples for run in result.runs)
