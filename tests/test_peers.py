"""A worker's client processes share their completions (``transport.peers``): what one
publishes, at once or several together, the others read back exactly, woken once."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np

from tf_grpc_bench.replay.core.benchmarks import synthetic_workload
from tf_grpc_bench.replay.core.generators import GeneratorConfig, GeneratorKind
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.processes import split_worker
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.peers import Peers, make_links


def _two_peers() -> tuple[Peers, Peers, int]:
    generator = GeneratorConfig(kind=GeneratorKind.UNIFORM, payload_count=1, buffers_per_payload=4)
    workload = synthetic_workload(
        Benchmark.PS_THROUGHPUT, generator, mode=Mode.NON_SERIALIZED, ps_count=2, worker_count=1
    ).for_worker(0)
    links = make_links(multiprocessing.get_context("spawn"), workload, split_worker(workload, 2))
    first, second = (Peers(link, workload.steps, timeout_s=5.0) for link in links)
    for peers in (first, second):
        peers.begin_step()
    return first, second, len(workload.steps[0].calls)


def test_completions_published_together_are_read_back_exactly_with_one_wake_up() -> None:
    first, second, calls = _two_peers()
    woken = threading.Semaphore(0)
    second.on_arrivals(woken.release)
    published = [(index, 1_000_000 + 7 * index) for index in range(calls)]
    first.publish_many(published)
    assert woken.acquire(timeout=10)
    fed = np.zeros(calls, dtype=bool)
    assert sorted(second.arrivals(fed)) == published
    assert fed.all() and second.arrivals(fed) == []
    # One frame each way: the listener was not woken once per completion.
    assert not woken.acquire(timeout=0.2)


def test_one_completion_at_a_time_reads_back_as_it_was_published() -> None:
    first, second, calls = _two_peers()
    fed = np.zeros(calls, dtype=bool)
    first.publish(1, 42)
    assert second.arrivals(fed) == [(1, 42)]
    first.publish_many([])
    assert second.arrivals(fed) == []
    # A completion of another step (an older number) is not this step's.
    second.begin_step()
    first.publish(0, 7)
    assert second.arrivals(fed) == []
