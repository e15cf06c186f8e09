"""One ps served by K processes behind one address (``--procs-per-server``), counted as one.

Real server processes sharing a port (SO_REUSEPORT), real grpcio clients:
every call reaches one of the K, and the statistics any of them answers with
are the K processes' merged, equal to what the clients sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tf_grpc_bench.replay.core.benchmarks import synthetic_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig, GeneratorKind
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode, echo_call
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.siblings import merge_stats
from tf_grpc_bench.replay.transport.wire import ChannelSettings, ServerStats

#: Clients, each with a channel (a TCP connection) of its own, and calls each makes.
CLIENTS = 12
CALLS = 5


@pytest.fixture(scope="module")
def shared() -> Iterator[LocalServers]:
    with LocalServers(1, mode=Mode.NON_SERIALIZED, procs_per_server=3) as running:
        yield running


def _clients(target: str, session: str, count: int) -> list[ReplayClient]:
    # A subchannel pool per channel, as replays have (``grpc_settings``): a TCP connection
    # per client (grpcio otherwise shares one between equal channels of a process).
    settings = ChannelSettings(session=session, options=(("grpc.use_local_subchannel_pool", 1),))
    return [ReplayClient(target, mode=Mode.NON_SERIALIZED, settings=settings) for _ in range(count)]


def test_three_processes_share_one_address(shared: LocalServers) -> None:
    assert len(shared.targets) == 1
    assert len(shared.pids) == 3


def test_every_call_reaches_one_of_the_processes_and_the_merged_counts_equal_what_was_sent(
    shared: LocalServers,
) -> None:
    (target,) = shared.targets
    clients = _clients(target, "shared-port-counts", CLIENTS)
    try:
        clients[0].reset_stats()
        sent_bytes = 0
        for number, client in enumerate(clients):
            for size in range(CALLS):
                call = echo_call((100 * number + size + 1,), Mode.NON_SERIALIZED)
                client.invoke(call, 10.0)
                sent_bytes += call.request_bytes
        # Whichever process each client's stats call lands on, it answers for all three.
        for client in (clients[0], clients[-1]):
            stats = client.stats()
            assert stats.processes == 3
            assert stats.received_messages == CLIENTS * CALLS
            assert stats.received_bytes == sent_bytes
            assert sum(stats.received_messages_per_process) == CLIENTS * CALLS
            # The kernel spread the 12 connections: all on one of 3 has odds of 3 / 3**12.
            assert sum(1 for n in stats.received_messages_per_process if n) >= 2
        clients[5].reset_stats()
        after = clients[0].stats()
        assert after.received_messages == after.received_bytes == 0
        assert after.received_messages_per_process == [0, 0, 0]
    finally:
        for client in clients:
            client.close()


def test_a_replay_against_shared_servers_counts_every_call_once() -> None:
    generator = GeneratorConfig(kind=GeneratorKind.UNIFORM, payload_count=4, buffers_per_payload=2)
    workload = synthetic_workload(
        Benchmark.PS_THROUGHPUT, generator, mode=Mode.NON_SERIALIZED, ps_count=2, worker_count=2
    )
    plan = RunPlan(warmup_ns=0, duration_ns=300_000_000, runs=2, deadline_s=30)
    with LocalServers(2, mode=Mode.NON_SERIALIZED, procs_per_server=2) as servers:
        result = run_benchmark(
            workload,
            servers.targets,
            pacing=Pacing(timing=Timing.ASAP, window=None),
            plan=plan,
            procs_per_worker=2,
        )
    assert not result.partial, result.partial_reason
    for run in result.runs:
        assert run.rpc_count > 0
        assert run.server_received_messages == run.rpc_count
        assert run.server_received_bytes == run.request_bytes


def test_merged_statistics_add_counts_and_cpu_and_keep_the_longest_wall_time() -> None:
    own = ServerStats(
        mode="non-serialized", received_bytes=10, received_messages=1, sent_bytes=10,
        sent_messages=1, cpu_ns=5, wall_ns=100, pid=7, per_method={"/a": [1, 10]},
        session="s", other_sessions=0,
    )  # fmt: skip
    other = ServerStats(
        mode="non-serialized", received_bytes=30, received_messages=2, sent_bytes=3,
        sent_messages=2, cpu_ns=6, wall_ns=120, pid=8, per_method={"/a": [1, 20], "/b": [1, 10]},
        session="s", other_sessions=2,
    )  # fmt: skip
    merged = merge_stats(own, [other])
    assert (merged.received_bytes, merged.received_messages) == (40, 3)
    assert (merged.sent_bytes, merged.sent_messages, merged.cpu_ns) == (13, 3, 11)
    assert (merged.wall_ns, merged.pid, merged.other_sessions) == (120, 7, 2)
    assert merged.per_method == {"/a": [2, 30], "/b": [1, 10]}
    assert (merged.processes, merged.received_messages_per_process) == (2, [1, 2])
    assert ServerStats.from_json(merged.to_json(), source="t") == merged
