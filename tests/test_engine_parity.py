"""Parity on the wire: a trace replayed by either engine, captured by the project's own
recorder (the recording proxy in front of every server), moves the trace's calls: the same
method paths, message sizes to the byte, and counts per (caller, callee) and per step.

Each engine replays with its own servers; a proxy in front of each server records every
call that crosses it and which process made it.  A replay worker's calls of one step all
end before its next step's begin, so its calls to one server, in the order their streams
were opened, cut into the trace's steps by count; each step is compared as a multiset (under
dependencies pacing calls go in causal order, which may differ from the trace's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from tf_grpc_bench.profiler.recorders.proxy import RecordedCall, RecordingProxy
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.engines.registry import engine_named
from tf_grpc_bench.replay.runner import run_benchmark
from tf_grpc_bench.replay.transport.loop import RunPlan, begin_mid_trace
from tf_grpc_bench.replay.transport.wire import ServerSettings
from tf_grpc_bench.trace import Trace

from .conftest import make_trace, make_whole_step_trace
from .engines import grpc_cpp_program

Message = tuple[str, int, int]


def _record_replay(engine_name: str, workload: Workload, pacing: Pacing) -> tuple[
    list[RecordedCall], dict[str, str | int | float | bool]
]:  # fmt: skip
    """One pass of ``workload`` by ``engine_name``, through recording proxies; the calls
    they recorded and the result's parameters."""
    if engine_name == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    engine = engine_named(engine_name)
    with engine.local_servers(
        workload.server_count, mode=workload.mode, settings=ServerSettings(), procs_per_server=1
    ) as targets:
        proxies = [
            RecordingProxy(
                target=("127.0.0.1", int(target.rsplit(":", 1)[1])),
                callee=f"server:{number}",
                owner_pids=lambda: [],
            )
            for number, target in enumerate(targets)
        ]
        try:
            for proxy in proxies:
                proxy.start()
            result = run_benchmark(
                workload,
                [proxy.address for proxy in proxies],
                pacing=pacing,
                plan=RunPlan(warmup_ns=0, runs=1, passes=1),
                engine=engine,
            )
        finally:
            for proxy in proxies:
                proxy.stop()
    assert not result.partial, result.partial_reason
    calls = [call for proxy in proxies for call in proxy.collect(final=True)]
    return calls, dict(result.parameters)


def _captured(calls: Sequence[RecordedCall]) -> dict[tuple[int | None, str], list[Message]]:
    """The replay's calls per (calling process, server), in the order their streams opened."""
    sequences: dict[tuple[int | None, str], list[Message]] = {}
    for call in sorted(calls, key=lambda c: (c.callee, c.connection, c.stream_id)):
        if call.method.startswith("/tf_grpc_bench.Control/"):
            continue  # the runner's own statistics calls
        assert call.complete and call.status_code == 0, call
        sequences.setdefault((call.caller_pid, call.callee), []).append(
            (call.method, call.request_bytes, call.response_bytes)
        )
    return sequences


def _expected(workload: Workload) -> dict[tuple[int, int], list[list[Message]]]:
    """Per (worker, server): its calls of each step of a pass, in the order a replay goes."""
    pairs = {(c.worker_index, c.server_index) for c in workload.calls}
    steps: dict[tuple[int, int], list[list[Message]]] = {pair: [] for pair in pairs}
    for step in begin_mid_trace(workload.steps):
        for pair in pairs:
            steps[pair].append(
                [
                    (c.method, c.request_bytes, c.response_bytes)
                    for c in step.calls
                    if (c.worker_index, c.server_index) == pair
                ]
            )
    return steps


def _by_step(sequence: list[Message], lengths: list[int]) -> list[Counter[Message]]:
    cuts, at = [], 0
    for length in lengths:
        cuts.append(Counter(sequence[at : at + length]))
        at += length
    assert at == len(sequence)
    return cuts


def _trace_messages(trace: Trace) -> Counter[tuple[str, int, int]]:
    """Every RPC of the trace between two tasks, with its two sizes in either order."""
    return Counter(
        (rpc.method, *sorted((rpc.request_bytes, rpc.response_bytes)))
        for step in trace.steps
        for rpc in step.rpcs
        if rpc.caller_task != rpc.callee_task
    )


TRACES = {
    "whole steps": make_whole_step_trace,
    "two workers, two ps": lambda: make_trace(steps=3, workers=2, ps=2, sizes=(21, 4096, 300_001)),
}


@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
@pytest.mark.parametrize("trace_name", list(TRACES))
def test_a_trace_replayed_by_either_engine_moves_the_traces_calls_on_the_wire(
    engine: str, trace_name: str
) -> None:
    trace = TRACES[trace_name]()
    workload = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    pacing = Pacing(timing=Timing.DEPENDENCIES, window=None)
    calls, parameters = _record_replay(engine, workload, pacing)
    assert parameters["engine"] == engine and str(parameters["grpc_version"])[0].isdigit()
    captured = _captured(calls)
    expected = _expected(workload)
    # One calling process per (worker, server) pair of the workload, each pair's steps:
    # the same messages, step by step.
    assert len(captured) == len(expected)
    unmatched = {pair: steps for pair, steps in expected.items()}
    for sequence in captured.values():
        match = next(
            pair
            for pair, steps in unmatched.items()
            if sum(len(s) for s in steps) == len(sequence)
            and _by_step(sequence, [len(s) for s in steps]) == [Counter(s) for s in steps]
        )
        del unmatched[match]
    assert not unmatched
    # And those are the trace's RPCs between tasks, sizes to the byte (a call the replay
    # makes the other way round carries the trace's response as its request).
    replayed = Counter(
        (method, *sorted((request, response)))
        for sequence in captured.values()
        for method, request, response in sequence
    )
    assert replayed == _trace_messages(trace)
