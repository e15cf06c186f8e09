"""The gatherer's barrier and result collection over real gRPC on loopback."""

from __future__ import annotations

import threading

import pytest

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.placement import gather

WORKERS = ("worker:0", "worker:1")


def test_a_barrier_releases_only_when_every_worker_has_arrived() -> None:
    with gather.GatherServer(bind="127.0.0.1:0", workers=WORKERS) as server:
        address = f"127.0.0.1:{server.port}"
        released = threading.Event()

        def first() -> None:
            gather.barrier(address, name="start", task="worker:0", timeout_s=30)
            released.set()

        thread = threading.Thread(target=first)
        thread.start()
        # The first worker is still held: nothing can release it but the second.
        assert not released.wait(timeout=0.5)
        gather.barrier(address, name="start", task="worker:1", timeout_s=30)
        thread.join(timeout=30)
        assert released.is_set()


def test_documents_and_failures_are_gathered_and_ps_tasks_learn_the_job_is_done() -> None:
    with gather.GatherServer(bind="127.0.0.1:0", workers=WORKERS) as server:
        address = f"127.0.0.1:{server.port}"
        gather.submit(address, task="worker:0", document='{"a": 1}')
        assert gather.wait_until_job_done(address, timeout_s=0.5, poll_s=0.1) is False
        gather.submit(address, task="worker:1", error="target refused")
        documents, failures = server.wait(timeout_s=10)
        assert documents == {"worker:0": '{"a": 1}'}
        assert failures == {"worker:1": "target refused"}
        assert gather.wait_until_job_done(address, timeout_s=10, poll_s=0.1) is True


def test_an_unknown_task_is_refused_at_the_barrier() -> None:
    with (
        gather.GatherServer(bind="127.0.0.1:0", workers=WORKERS) as server,
        pytest.raises(TransportError, match="worker:7: not a worker"),
    ):
        gather.barrier(f"127.0.0.1:{server.port}", name="x", task="worker:7", timeout_s=10)


def test_a_gatherer_that_is_not_there_is_a_transport_error() -> None:
    with gather.GatherServer(bind="127.0.0.1:0", workers=WORKERS) as server:
        port = server.port
    with pytest.raises(TransportError, match=r"gatherer 127\.0\.0\.1"):
        gather.submit(f"127.0.0.1:{port}", task="worker:0", document="{}", timeout_s=1)
