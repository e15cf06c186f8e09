"""A worker's share of a step spread over K client processes (``--procs-per-worker``).

The split itself is pure (``core.processes``); the replays run real worker
processes against real loopback servers and compare what the servers counted
and what the clients measured with K = 1, 2, 3.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tf_grpc_bench import lifetime, trace_files
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay import cli, throughput
from tf_grpc_bench.replay.core.benchmarks import synthetic_workload, trace_workload
from tf_grpc_bench.replay.core.chunking import chunk_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig, GeneratorKind
from tf_grpc_bench.replay.core.measurement import Benchmark, BenchmarkResult, RunMeasurement
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.processes import (
    MAX_PROCS_PER_WORKER,
    automatic_procs_per_worker,
    parse_procs_per_worker,
    process_loads,
    split_worker,
)
from tf_grpc_bench.replay.core.whatif import WhatIf, derive_trace
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.fitting import procs_per_worker_for
from tf_grpc_bench.replay.runner import RunPlan, run_benchmark
from tf_grpc_bench.replay.throughput import measure_throughput
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.grpc_settings import GrpcSettings
from tf_grpc_bench.replay.transport.local_servers import LocalServers
from tf_grpc_bench.replay.transport.loop import open_clients
from tf_grpc_bench.replay.transport.wire import ChannelSettings

from .conftest import make_trace

ONE_PASS = RunPlan(warmup_ns=0, duration_ns=1, runs=1, passes=1, deadline_s=120)
COMMUNICATION_ONLY = Pacing(timing=Timing.DEPENDENCIES, window=None, compute_scale=0.0)
#: The shipped trace the replays use: the smallest, AlexNet (2 workers, 2 ps) with its
#: tensors scaled down so that three passes stay light on a loaded test machine.
SHIPPED = "alexnet-tf2ps"


def _shipped_workload() -> Workload:
    trace = trace_files.read_trace(trace_files.shipped_trace_path(SHIPPED))
    derived = derive_trace(trace, WhatIf(workers=2, ps=2, scale_tensors=0.05))
    return trace_workload(derived, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)


# --------------------------------------------------------------------------
# The split (pure).


@pytest.mark.parametrize("processes", [1, 2, 3, 5])
def test_every_call_of_a_worker_goes_to_exactly_one_process_the_same_in_every_step(
    processes: int,
) -> None:
    workload = trace_workload(
        make_trace(steps=3, workers=2, ps=2), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    ).for_worker(1)
    split = split_worker(workload, processes)
    assert 1 <= split.count <= processes
    for position, step in enumerate(workload.steps):
        owned = [split.owned(position, p) for p in range(split.count)]
        assert sorted(i for indices in owned for i in indices) == list(range(len(step.calls)))
    # A tensor's calls go to the same process in every step.
    first = dict(
        zip((c.tensor_name for c in workload.steps[0].calls), split.owners[0], strict=True)
    )
    for step, owners in zip(workload.steps, split.owners, strict=True):
        assert {c.tensor_name: o for c, o in zip(step.calls, owners, strict=True)} == first
    assert sum(process_loads(workload, split)) == sum(
        c.request_bytes + c.response_bytes for c in workload.calls
    )


def test_with_as_many_ps_as_processes_each_ps_stays_in_one_process() -> None:
    workload = trace_workload(
        make_trace(steps=2, workers=1, ps=3), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    ).for_worker(0)
    split = split_worker(workload, 3)
    assert split.count == 3
    for step, owners in zip(workload.steps, split.owners, strict=True):
        by_server: dict[int, set[int]] = {}
        for call, owner in zip(step.calls, owners, strict=True):
            by_server.setdefault(call.server_index, set()).add(owner)
        assert all(len(owners_of) == 1 for owners_of in by_server.values())
        assert len({next(iter(o)) for o in by_server.values()}) == 3


def test_fewer_ps_than_processes_spread_one_ps_by_tensor_balanced_by_bytes() -> None:
    workload = trace_workload(
        make_trace(steps=1, workers=1, ps=1, sizes=(1000, 1000, 1000, 1000)),
        Benchmark.PS_THROUGHPUT,
        mode=Mode.NON_SERIALIZED,
    ).for_worker(0)
    split = split_worker(workload, 2)
    assert split.count == 2
    assert process_loads(workload, split) == (2 * 1120, 2 * 1120)
    # More processes than tensors: a process per tensor, no idle ones.
    assert split_worker(workload, 7).count == 4


def test_the_chunks_of_one_payload_stay_in_one_process() -> None:
    synthetic = synthetic_workload(
        Benchmark.PS_THROUGHPUT,
        GeneratorConfig(payload_count=5, buffers_per_payload=3),
        mode=Mode.NON_SERIALIZED,
        ps_count=1,
        worker_count=1,
    )
    workload = chunk_workload(synthetic, GrpcSettings(chunk_bytes=1024)).for_worker(0)
    split = split_worker(workload, 3)
    assert split.count > 1
    for step, owners in zip(workload.steps, split.owners, strict=True):
        for position, call in enumerate(step.calls):
            first = position - call.chunk_index
            assert owners[position] == owners[first]
    assert any(call.chunk_count > 1 for call in workload.calls)


@pytest.mark.parametrize("text", ["0", "-1", "65", "1.5", "two", ""])
def test_bad_counts_are_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--procs-per-worker"):
        parse_procs_per_worker(text)


def test_counts_and_auto_parse() -> None:
    assert parse_procs_per_worker("3") == 3
    assert parse_procs_per_worker(str(MAX_PROCS_PER_WORKER)) == MAX_PROCS_PER_WORKER
    assert parse_procs_per_worker("auto") is None
    assert parse_procs_per_worker(" AUTO ") is None


def test_auto_shares_the_cores_left_by_the_local_servers_among_the_workers() -> None:
    assert automatic_procs_per_worker(cores=2, workers=1, servers=1) == 1
    assert automatic_procs_per_worker(cores=16, workers=2, servers=2) == 7
    assert automatic_procs_per_worker(cores=16, workers=2, servers=0) == 8
    assert automatic_procs_per_worker(cores=4, workers=8, servers=2) == 1


def test_more_client_processes_than_a_host_allows_are_refused() -> None:
    workload = synthetic_workload(
        Benchmark.PS_THROUGHPUT, GeneratorConfig(), mode=Mode.NON_SERIALIZED, worker_count=8
    )
    assert procs_per_worker_for(8, [workload], server_processes=1) == 8
    with pytest.raises(ConfigError, match="--procs-per-worker 9: 8 workers x 9"):
        procs_per_worker_for(9, [workload], server_processes=1)
    assert 1 <= procs_per_worker_for(None, [workload], server_processes=1) <= 8


def test_the_replay_command_resolves_auto_from_the_cores_it_may_use() -> None:
    parser = argparse.ArgumentParser()
    cli.configure_replay(parser)
    arguments = "--synthetic --benchmark ps-throughput --workers 2 --ps 1 --procs-per-server 1"
    request = cli.build_request(
        parser.parse_args([*arguments.split(), "--procs-per-worker", "auto"])
    )
    cores = len(os.sched_getaffinity(0))
    assert request.procs_per_worker == max(1, min((cores - 1) // 2, 32))
    assert request.config["procs_per_worker"] == "auto"
    request = cli.build_request(parser.parse_args([*arguments.split(), "--procs-per-worker", "3"]))
    assert request.procs_per_worker == 3


# --------------------------------------------------------------------------
# Replays over real processes and servers.


@pytest.fixture(scope="module")
def servers() -> Iterator[LocalServers]:
    # The shipped trace's two ps and stand-ins for its two workers (the chief calls them).
    with LocalServers(4, mode=Mode.NON_SERIALIZED) as running:
        yield running


def _server_counts(servers: LocalServers, session: str) -> list[tuple[int, int]]:
    """(messages, bytes) each server received from ``session``, read from the servers."""
    counts = []
    for target in servers.targets:
        client = ReplayClient(target, mode=servers.mode, settings=ChannelSettings(session=session))
        try:
            stats = client.stats()
        finally:
            client.close()
        counts.append((stats.received_messages, stats.received_bytes))
    return counts


def _per_pair(run: RunMeasurement) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(RPCs, request bytes, response bytes) per (worker, ps), from the clients' samples."""
    totals: Counter[tuple[int, int, str]] = Counter()
    for sample in run.samples:
        pair = (sample.worker_index, sample.server_index)
        totals[(*pair, "rpcs")] += 1
        totals[(*pair, "request")] += sample.request_bytes
        totals[(*pair, "response")] += sample.response_bytes
    pairs = {(w, s) for w, s, _ in totals}
    return {
        pair: (totals[(*pair, "rpcs")], totals[(*pair, "request")], totals[(*pair, "response")])
        for pair in pairs
    }


def _trace_replay(servers: LocalServers, k: int, pacing: Pacing) -> tuple[BenchmarkResult, str]:
    session = f"procs-trace-{k}-{pacing.timing.value}"
    result = run_benchmark(
        _shipped_workload(),
        servers.targets,
        pacing=pacing,
        plan=ONE_PASS,
        settings=ChannelSettings(session=session),
        procs_per_worker=k,
    )
    assert not result.partial, result.partial_reason
    return result, session


def test_a_shipped_trace_pass_moves_the_same_rpcs_and_bytes_per_worker_and_ps_for_k_1_2_3(
    servers: LocalServers,
) -> None:
    workload = _shipped_workload()
    expected_pairs: Counter[tuple[int, int]] = Counter(
        (c.worker_index, c.server_index) for c in workload.calls
    )
    seen = {}
    for k in (1, 2, 3):
        result, session = _trace_replay(servers, k, COMMUNICATION_ONLY)
        (run,) = result.runs
        assert result.parameters["procs_per_worker"] == k
        assert result.parameters["client_processes"] == sum(
            split_worker(workload.for_worker(w), k).count for w in range(workload.worker_count)
        )
        pairs = _per_pair(run)
        assert {pair: counts[0] for pair, counts in pairs.items()} == expected_pairs
        seen[k] = (pairs, _server_counts(servers, session))
        # Each worker counted once: one step time per worker per trace step (the side
        # clients, the chief and a ps calling a ps, record none).
        assert len(run.step_times_ns) == 2 * len(workload.steps)
        assert run.server_received_messages == run.rpc_count == len(workload.calls)
    assert seen[2] == seen[1]
    assert seen[3] == seen[1]


def _step_spans(run: RunMeasurement, worker: int) -> list[tuple[int, int, int]]:
    """Per trace step of ``worker``, in the order replayed: (step, first call's start,
    last call's end) over all its processes' samples."""
    spans = []
    for step in sorted({s.step for s in run.samples if s.worker_index == worker}):
        samples = [s for s in run.samples if s.worker_index == worker and s.step == step]
        first = min(s.start_ns for s in samples)
        last = max(s.start_ns + s.latency_ns for s in samples)
        spans.append((step, first, last))
    return sorted(spans, key=lambda span: span[1])


@pytest.mark.parametrize(
    "pacing", [COMMUNICATION_ONLY, Pacing(timing=Timing.ASAP, window=None)], ids=["deps", "asap"]
)
def test_a_step_runs_from_its_first_call_start_to_its_last_call_end_over_all_processes(
    servers: LocalServers, pacing: Pacing
) -> None:
    result, _ = _trace_replay(servers, 2, pacing)
    (run,) = result.runs
    steps = len(_shipped_workload().steps)
    # The workers' step times, leader by leader (worker 0's steps, then worker 1's).
    for worker in (0, 1):
        times = run.step_times_ns[worker * steps : (worker + 1) * steps]
        spans = _step_spans(run, worker)
        assert len(times) == len(spans) == steps
        for number, (time_ns, (_, first, last)) in enumerate(zip(times, spans, strict=True)):
            # At least from the first call's start to the last call's end of the step over
            # both processes ...
            assert time_ns >= last - first
            # ... and no more than from the previous step's last end to the next one's
            # first start (the trace's steps are rounds: a step lasts until the other
            # worker too has finished it).
            if 0 < number < steps - 1:
                assert time_ns <= spans[number + 1][1] - spans[number - 1][2]


def test_a_call_waits_for_what_it_depends_on_whichever_process_made_that(
    servers: LocalServers,
) -> None:
    """A gradient waits for the forward pass's variables from every ps, made by the
    worker's other process too: each call starts after every call it waits for ended."""
    result, _ = _trace_replay(servers, 2, COMMUNICATION_ONLY)
    (run,) = result.runs
    workload = _shipped_workload()
    ends = {(s.worker_index, s.step, s.rpc_index): s.start_ns + s.latency_ns for s in run.samples}
    starts = {(s.worker_index, s.step, s.rpc_index): s.start_ns for s in run.samples}
    across = 0
    for worker in (0, 1):
        own = workload.for_worker(worker)
        split = split_worker(own, 2)
        for position, step in enumerate(own.steps):
            owner = dict(
                zip((c.rpc_index for c in step.calls), split.owners[position], strict=True)
            )
            arrivals: dict[tuple[bool, int], list[tuple[int, int]]] = {}
            for call in step.calls:
                deps = call.dependencies
                assert deps is not None
                if deps.is_arrival:
                    key = (deps.lands_on_worker, -1 if deps.lands_on_worker else call.server_index)
                    arrivals.setdefault(key, []).append((deps.arrival_rank, call.rpc_index))
            ranked = {key: [i for _, i in sorted(value)] for key, value in arrivals.items()}
            for call in step.calls:
                deps = call.dependencies
                assert deps is not None
                waited = ranked.get((True, -1), [])[: deps.after_worker_arrivals]
                waited += ranked.get((False, call.server_index), [])[: deps.after_server_arrivals]
                for other in waited:
                    start = starts[(worker, step.index, call.rpc_index)]
                    assert start >= ends[(worker, step.index, other)]
                    across += owner[other] != owner[call.rpc_index]
    assert across > 0  # some waits crossed from one process to the other


def test_a_synthetic_cycle_moves_the_same_rpcs_and_bytes_per_worker_and_ps_for_k_1_2_3(
    servers: LocalServers,
) -> None:
    generator = GeneratorConfig(kind=GeneratorKind.SKEW, payload_count=5, buffers_per_payload=3)
    workload = synthetic_workload(
        Benchmark.PS_THROUGHPUT, generator, mode=Mode.NON_SERIALIZED, ps_count=2, worker_count=2
    )
    # Exactly two payload cycles per run (the library allows it; the command line says
    # --steps and --passes are for traces).
    plan = RunPlan(warmup_ns=0, duration_ns=1, runs=1, steps=2, deadline_s=60)
    seen = {}
    for k in (1, 2, 3):
        session = f"procs-synthetic-{k}"
        settings = ChannelSettings(session=session)
        clients = open_clients(workload, servers.targets, settings=settings)
        try:
            (run,) = measure_throughput(
                workload,
                servers.targets,
                clients,
                Pacing(timing=Timing.ASAP, window=None),
                plan,
                settings=settings,
                procs_per_worker=k,
            )
        finally:
            for client in clients.values():
                client.close()
        assert not run.partial, run.partial_reason
        assert run.rpc_count == 2 * len(workload.calls)
        seen[k] = (_per_pair(run), _server_counts(servers, session))
    assert seen[2] == seen[1]
    assert seen[3] == seen[1]


class _Deaf:
    """A worker process that reads no "stop" (one in its warm-up) and ends only when
    terminated or killed; ``join`` advances the shared fake clock by what it waits."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.ended_by = ""

    def is_alive(self) -> bool:
        return not self.ended_by

    def join(self, timeout: float) -> None:
        if self.is_alive():
            self.clock[0] += timeout

    def terminate(self) -> None:
        self.ended_by = "terminate"

    def kill(self) -> None:
        self.ended_by = "kill"


def test_workers_told_to_stop_share_one_grace_not_one_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Four worker processes in their warm-up (two workers and two side clients): a stop
    # signal used to wait 10 s for each in turn, 40 s, past network compare's 30 s grace.
    clock = [0.0]
    # The ladder of waits is lifetime.end_processes, shared with the compute load's burners.
    monkeypatch.setattr(lifetime, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    workers = object.__new__(throughput._WorkerProcesses)
    workers.processes = [_Deaf(clock) for _ in range(4)]
    workers.connections = []
    workers.stop()
    assert [p.ended_by for p in workers.processes] == ["terminate"] * 4
    assert clock[0] == throughput.STOP_GRACE_S
