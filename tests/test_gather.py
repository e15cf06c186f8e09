"""The gatherer's barrier and result collection over real gRPC on loopback."""

from __future__ import annotations

import sys
import threading
import time
import traceback

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


def test_a_document_larger_than_grpcs_default_limit_is_gathered() -> None:
    """A long run's document (a sample per call) passes gRPC's 4 MiB default: a worker's
    partial results were once refused as RESOURCE_EXHAUSTED at the gatherer."""
    document = '{"samples": "' + "x" * (6 << 20) + '"}'
    with gather.GatherServer(bind="127.0.0.1:0", workers=("worker:0",)) as server:
        gather.submit(f"127.0.0.1:{server.port}", task="worker:0", document=document)
        documents, failures = server.wait(timeout_s=30)
    assert documents == {"worker:0": document} and not failures


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


def _threads_in_barrier_handlers() -> int:
    return sum(
        1
        for frame in sys._current_frames().values()
        for summary in traceback.extract_stack(frame)
        if summary.name == "_barrier" and summary.filename == gather.__file__
    )


@pytest.mark.parametrize("ending", ["gatherer stops", "caller goes away"])
def test_a_barrier_still_waiting_lets_the_gatherers_threads_go(ending: str) -> None:
    """A job stopped before every task reached the barrier: the handler waiting in a
    pool thread returns (the gatherer stops, or its caller's deadline passed) rather
    than hold the thread for the barrier's timeout, which the process's exit waits for."""
    failures: list[BaseException] = []
    with gather.GatherServer(bind="127.0.0.1:0", workers=WORKERS, barrier_timeout_s=600) as server:
        address = f"127.0.0.1:{server.port}"

        def waiting() -> None:
            try:
                gather.barrier(
                    address,
                    name="start",
                    task="worker:0",
                    timeout_s=1 if ending == "caller goes away" else 600,
                )
            except TransportError as error:
                failures.append(error)

        thread = threading.Thread(target=waiting)
        thread.start()
        deadline = time.monotonic() + 30
        while not _threads_in_barrier_handlers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _threads_in_barrier_handlers() == 1
        if ending == "caller goes away":
            thread.join(timeout=30)
            deadline = time.monotonic() + 30
            while _threads_in_barrier_handlers() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _threads_in_barrier_handlers() == 0
    thread.join(timeout=30)
    assert not thread.is_alive() and len(failures) == 1
    assert _threads_in_barrier_handlers() == 0
