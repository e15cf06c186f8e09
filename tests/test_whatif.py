"""What-if clusters (``replay/core/whatif.py``): bytes per ps and per worker against hand
computation, the captured cluster giving the trace's own workload, and the flags' errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.whatif import (
    Placement,
    WhatIf,
    captured_cluster,
    derive_trace,
    place_variables,
    trace_variables,
)
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.trace import RECV_TENSOR, Rpc, RunMetadata, Step, Task, TensorInfo, Trace
from tf_grpc_bench.trace_format import dump_trace

#: Content bytes of the toy model's five float32 variables, in creation order.
SIZES = (4000, 1000, 600, 300, 100)
#: Bytes a tensor response carries besides its content (TensorProto and RecvTensorResponse).
HEADER = 24
PULL_REQUEST = 100
PUSH_REQUEST = 90
#: The step's per-ps control traffic: RunComponentFunction (request, response) and a
#: 21-byte empty control-edge tensor (request, response).
CONTROL = ((500, 0), (PULL_REQUEST, 21))
RUN_FUNCTION = "/tensorflow.eager.EagerService/RunComponentFunction"


def _tensor(source: str, destination: str, edge: str, size: int) -> TensorInfo:
    return TensorInfo(
        rendezvous_key=f"{source}/device:CPU:0;1;{destination}/device:CPU:0;{edge};0:0",
        dtype="float32",
        shape=(size // 4,),
        content_bytes=size,
    )


def _toy_step(index: int, start: int) -> Step:
    """One captured step of 1 worker (task 1) and 1 ps (task 0): pull every variable,
    compute, push every gradient; plus the per-ps control traffic."""
    ps, worker = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"
    rpcs = []
    clock = start
    for n, size in enumerate(SIZES):
        rpcs.append(
            Rpc(
                method=RECV_TENSOR,
                caller_task=1,
                callee_task=0,
                request_bytes=PULL_REQUEST,
                response_bytes=size + HEADER,
                start_ns=clock,
                response_start_ns=clock + 100,
                end_ns=clock + 1_000,
                tensor=_tensor(ps, worker, f"edge_{n}_layer{n}/ReadVariableOp", size),
            )
        )
        clock += 1_000
    rpcs.append(
        Rpc(
            method=RECV_TENSOR,
            caller_task=1,
            callee_task=0,
            request_bytes=CONTROL[1][0],
            response_bytes=CONTROL[1][1],
            start_ns=clock,
            response_start_ns=clock + 10,
            end_ns=clock + 20,
            tensor=TensorInfo(rendezvous_key="x;1;y;edge_90_control;0:0", shape=(0,)),
        )
    )
    rpcs.append(
        Rpc(
            method=RUN_FUNCTION,
            caller_task=1,
            callee_task=0,
            request_bytes=CONTROL[0][0],
            response_bytes=CONTROL[0][1],
            start_ns=clock,
            response_start_ns=clock + 50,
            end_ns=clock + 50,
        )
    )
    clock += 50_000  # forward and backward
    for n, size in enumerate(reversed(SIZES)):
        rpcs.append(
            Rpc(
                method=RECV_TENSOR,
                caller_task=0,
                callee_task=1,
                request_bytes=PUSH_REQUEST,
                response_bytes=size + HEADER,
                start_ns=start + 10,
                response_start_ns=clock,
                end_ns=clock + 1_000,
                tensor=_tensor(worker, ps, f"edge_{50 + n}_sgd/IdentityN", size),
            )
        )
        clock += 1_000
    return Step(index=index, start_ns=start, end_ns=clock, rpcs=tuple(rpcs))


def toy_trace(steps: int = 2) -> Trace:
    return Trace(
        metadata=RunMetadata(model="toy", strategy="synthetic"),
        tasks=(Task(job="ps", index=0), Task(job="worker", index=0)),
        steps=tuple(_toy_step(n, 1_000_000 + n * 200_000) for n in range(steps)),
    )


def _bytes_by(workload: Workload, key: str) -> dict[tuple[int, int], int]:
    """(step, server or worker index) -> request plus response bytes."""
    totals: Counter[tuple[int, int]] = Counter()
    for step in workload.steps:
        for call in step.calls:
            totals[(step.index, getattr(call, key))] += call.request_bytes + call.response_bytes
    return dict(totals)


def _variable_bytes(size: int) -> int:
    """One variable's traffic per worker-step: its pull and its gradient, both ways."""
    return PULL_REQUEST + size + HEADER + PUSH_REQUEST + size + HEADER


CONTROL_BYTES = sum(request + response for request, response in CONTROL)


def _what_if_workload(trace: Trace, what_if: WhatIf) -> Workload:
    return trace_workload(
        derive_trace(trace, what_if), Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED
    )


# --------------------------------------------------------------------------
# Variables and placement.


def test_the_toy_traces_variables_pair_each_pull_with_its_gradient_in_order() -> None:
    variables = trace_variables(toy_trace())
    assert [v.content_bytes for v in variables] == list(SIZES)
    assert [v.name for v in variables] == [f"layer{n}/ReadVariableOp" for n in range(5)]
    # Pulled 4000 first and pushed it last: paired by dtype and shape, not by position.
    assert variables[0].push_edge == "edge_54_sgd/IdentityN"
    assert all(v.push_edge for v in variables)


def test_round_robin_deals_variables_out_in_the_traces_order_and_size_balances_bytes() -> None:
    variables = trace_variables(toy_trace())
    assert place_variables(variables, 2, Placement.ROUND_ROBIN) == (0, 1, 0, 1, 0)
    # Greedy: 4000 -> ps 0; then ps 1 is always the lighter one.
    assert place_variables(variables, 2, Placement.SIZE) == (0, 1, 1, 1, 1)
    # 3 ps: loads 4000, 1000, 600; 300 and then 100 to the ps holding 600 (900 < 1000).
    assert place_variables(variables, 3, Placement.SIZE) == (0, 1, 2, 2, 2)


def test_the_captured_ps_count_keeps_the_captured_placement() -> None:
    trace = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps"))
    variables = trace_variables(trace)
    _, ps = captured_cluster(trace)
    placed = place_variables(variables, 2, Placement.ROUND_ROBIN, captured_ps=ps)
    assert placed == tuple(ps.index(v.ps_task) for v in variables)
    # The trace's order interleaves the ps, so plain round-robin over 2 gives the same.
    assert placed == place_variables(variables, 2, Placement.ROUND_ROBIN)
    assert len(variables) == 321 and Counter(placed) == {0: 161, 1: 160}


# --------------------------------------------------------------------------
# Bytes per ps and per worker, by hand.


def test_four_workers_two_ps_round_robin_bytes_per_ps_and_worker() -> None:
    workload = _what_if_workload(toy_trace(), WhatIf(workers=4, ps=2))
    assert (workload.worker_count, workload.server_count) == (4, 2)
    # ps 0 holds 4000, 600 and 100; ps 1 holds 1000 and 300; each ps gets the
    # captured ps's control traffic from every worker.
    ps0 = _variable_bytes(4000) + _variable_bytes(600) + _variable_bytes(100) + CONTROL_BYTES
    ps1 = _variable_bytes(1000) + _variable_bytes(300) + CONTROL_BYTES
    # Per variable 238 B of requests and response headers, and its content twice.
    assert (ps0, ps1) == (3 * 238 + 2 * 4700 + 621, 2 * 238 + 2 * 1300 + 621) == (10_735, 3_697)
    per_worker = ps0 + ps1
    for step in (0, 1):
        assert _bytes_by(workload, "server_index")[(step, 0)] == 4 * ps0
        assert _bytes_by(workload, "server_index")[(step, 1)] == 4 * ps1
        for worker in range(4):
            assert _bytes_by(workload, "worker_index")[(step, worker)] == per_worker


def test_size_placement_and_wider_tensors_move_the_bytes_computed_by_hand() -> None:
    what_if = WhatIf(workers=4, ps=2, placement=Placement.SIZE, scale_tensors=2.0)
    workload = _what_if_workload(toy_trace(), what_if)

    def wide(size: int) -> int:
        return _variable_bytes(2 * size)

    # The empty control edge stays 21 bytes: 0 times 2.
    ps0 = wide(4000) + CONTROL_BYTES
    ps1 = wide(1000) + wide(600) + wide(300) + wide(100) + CONTROL_BYTES
    for step in (0, 1):
        assert _bytes_by(workload, "server_index")[(step, 0)] == 4 * ps0
        assert _bytes_by(workload, "server_index")[(step, 1)] == 4 * ps1


def test_an_empty_control_edge_of_a_variables_read_follows_that_variable() -> None:
    def renamed(rpc: Rpc) -> Rpc:
        if rpc.tensor is None or rpc.tensor.edge_name != "edge_90_control":
            return rpc
        key = rpc.tensor.rendezvous_key.replace("edge_90_control", "edge_90_layer1/ReadVariableOp")
        return dataclasses.replace(rpc, tensor=dataclasses.replace(rpc.tensor, rendezvous_key=key))

    trace = toy_trace()
    trace = dataclasses.replace(
        trace,
        steps=tuple(
            dataclasses.replace(step, rpcs=tuple(renamed(r) for r in step.rpcs))
            for step in trace.steps
        ),
    )
    workload = _what_if_workload(trace, WhatIf(workers=4, ps=2))
    # The 121-byte empty edge goes with variable 1 (1000 B, on ps 1), once per worker;
    # the RunComponentFunction call stays per-task traffic, on both ps.
    ps0 = _variable_bytes(4000) + _variable_bytes(600) + _variable_bytes(100) + 500
    ps1 = _variable_bytes(1000) + _variable_bytes(300) + 500 + 121
    for step in (0, 1):
        assert _bytes_by(workload, "server_index")[(step, 0)] == 4 * ps0
        assert _bytes_by(workload, "server_index")[(step, 1)] == 4 * ps1


def test_every_worker_keeps_the_captured_workers_order_and_compute_gaps() -> None:
    trace = toy_trace()
    captured = trace_workload(trace, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    workload = _what_if_workload(trace, WhatIf(workers=3, ps=1))
    for worker in range(3):
        mine = workload.for_worker(worker)
        for ours, theirs in zip(mine.steps, captured.steps, strict=True):
            assert [(c.request_bytes, c.response_bytes, c.offset_ns) for c in ours.calls] == [
                (c.request_bytes, c.response_bytes, c.offset_ns) for c in theirs.calls
            ]
            assert [c.dependencies for c in ours.calls] == [c.dependencies for c in theirs.calls]


def test_the_captured_cluster_gives_exactly_the_traces_own_workload() -> None:
    for name in ("resnet50-tf2ps", "resnet50-tf1ps"):
        trace = trace_files.read_trace(trace_files.shipped_trace_path(name))
        workers, ps = captured_cluster(trace)
        what_if = WhatIf(workers=len(workers), ps=len(ps))
        assert derive_trace(trace, what_if) == trace
        for benchmark in Benchmark:
            own = trace_workload(trace, benchmark, mode=Mode.NON_SERIALIZED)
            derived = trace_workload(derive_trace(trace, what_if), benchmark, mode=own.mode)
            assert derived == own


def test_resnet50_at_four_workers_one_ps_moves_what_its_variables_predict() -> None:
    trace = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps"))
    derived = derive_trace(trace, WhatIf(workers=4, ps=1))
    workload = trace_workload(derived, Benchmark.PS_THROUGHPUT, mode=Mode.NON_SERIALIZED)
    extra = dict(trace.metadata.extra)
    trainable_bytes = int(extra["trainable_bytes"])
    trainable = Counter(extra["trainable_variables"].split(";"))
    step = trace.steps[0]
    # What else a worker pulls besides the trainable variables: the non-trainable
    # state on the ps (batch-norm moving means and variances, and a step counter).
    pulled = [
        r.tensor
        for r in step.rpcs
        if r.caller_task == 2 and r.tensor is not None and r.tensor.content_bytes > 0
    ]
    keys = Counter(f"{t.dtype}:{'x'.join(map(str, t.shape))}" for t in pulled)
    assert not trainable - keys  # every trainable variable is pulled
    state = keys - trainable
    assert sum(state.values()) == 107
    assert all(key.count("x") == 0 for key in state)  # 1-D statistics and a scalar
    state_bytes = sum(t.content_bytes for t in pulled) - trainable_bytes
    assert state_bytes == 212_488
    # Per derived worker-step, the tensor content is every variable and state once each way.
    for derived_step in derived.steps:
        content: Counter[int] = Counter()
        for rpc in derived_step.rpcs:
            if rpc.tensor is not None and derived.tasks[rpc.callee_task].job == "worker":
                content[rpc.callee_task] += rpc.tensor.content_bytes
            elif rpc.tensor is not None and derived.tasks[rpc.caller_task].job == "worker":
                content[rpc.caller_task] += rpc.tensor.content_bytes
        assert sorted(content.values()) == [2 * (trainable_bytes + state_bytes)] * 4
    # On the wire: the captured worker's traffic with both ps, less what it sent only
    # because there were two ps (ps 1's control calls and empty control edges).
    for captured_worker, derived_workers in ((2, (0, 2)), (3, (1, 3))):
        both = sum(
            r.request_bytes + r.response_bytes
            for r in step.rpcs
            if captured_worker in (r.caller_task, r.callee_task)
            and trace.tasks[r.caller_task].job != "chief"
        )
        ps1_only = sum(
            r.request_bytes + r.response_bytes
            for r in step.rpcs
            if {r.caller_task, r.callee_task} == {captured_worker, 1}
            and (r.tensor is None or r.tensor.content_bytes == 0)
        )
        for worker in derived_workers:
            assert _bytes_by(workload, "worker_index")[(step.index, worker)] == both - ps1_only
    # The one ps, then a stand-in server for each derived worker the chief calls
    # (whole steps: the chief's control calls are replayed too).
    assert workload.servers_used == (0, 1, 2, 3, 4)
    assert workload.parameters()["server_tasks"] == ",".join(
        ["/job:ps/task:0"] + [f"/job:worker/task:{i}" for i in range(4)]
    )


# --------------------------------------------------------------------------
# Refusals.


@pytest.mark.parametrize(
    ("what_if", "message"),
    [
        (WhatIf(workers=0, ps=1), "--workers must be >= 1, got 0"),
        (WhatIf(workers=1, ps=0), "--ps must be >= 1, got 0"),
        (WhatIf(workers=1, ps=6), "--ps 6: the trace has 5 variables to place, so at most 5 ps"),
        (WhatIf(workers=1, ps=1, scale_tensors=0.0), "--scale-tensors must be in (0, 100], got 0"),
        (WhatIf(workers=1, ps=1, scale_tensors=-2), "--scale-tensors must be in (0, 100], got -2"),
    ],
)
def test_a_cluster_that_cannot_be_derived_is_refused_naming_the_flag(
    what_if: WhatIf, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        derive_trace(toy_trace(), what_if)
    assert str(error.value) == message


def test_a_trace_without_ps_tasks_is_refused() -> None:
    trace = toy_trace()
    renamed = Trace(
        metadata=trace.metadata,
        tasks=(Task(job="chief", index=0), Task(job="worker", index=0)),
        steps=trace.steps,
    )
    with pytest.raises(ConfigError, match="needs a parameter-server trace"):
        derive_trace(renamed, WhatIf(workers=2, ps=1))


def _replay(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "replay", *arguments],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "0"], "--workers must be in 1..64, got 0"),
        (["--ps", "0"], "--ps must be in 1..64, got 0"),
        (["--ps", "6"], "--ps 6: the trace has 5 variables to place, so at most 5 ps"),
        (["--scale-tensors", "0"], "--scale-tensors must be in (0, 100], got 0"),
        (["--scale-tensors", "-1"], "--scale-tensors must be in (0, 100], got -1"),
    ],
)
def test_bad_what_if_flags_get_one_line_and_a_non_zero_exit(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    path = tmp_path / "toy.tfgbtrace"
    with path.open("wb") as stream:
        dump_trace(toy_trace(), stream)
    result = _replay(str(path), *flags, "--benchmark", "ps-throughput", cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"tf-grpc-bench replay: error: {message}"]
    assert not (tmp_path / "runs").exists()


def test_placement_and_scale_flags_are_refused_on_a_synthetic_workload(tmp_path: Path) -> None:
    result = _replay("--synthetic", "--placement", "size", cwd=tmp_path)
    assert result.returncode != 0
    assert "--placement applies to trace replays" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------
# The result says it is a what-if.


def test_a_what_if_replay_says_so_in_its_results_and_report(tmp_path: Path) -> None:
    path = tmp_path / "toy.tfgbtrace"
    with path.open("wb") as stream:
        dump_trace(toy_trace(), stream)
    result = _replay(
        str(path),
        "--workers",
        "3",
        "--ps",
        "2",
        "--placement",
        "size",
        "--benchmark",
        "ps-throughput",
        "--steps",
        "2",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--output-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "what-if: 3 workers x 2 ps (size placement of 5 variables), derived from toy "
        "captured with 1 workers x 1 ps, not captured on that cluster"
    ) in result.stdout.splitlines()
    (results_file,) = (tmp_path / "runs").glob("*-toy-whatif-3w2ps/results.json")
    document = read_document(results_file)
    assert document.what_if is not None
    assert document.what_if.asked() == WhatIf(workers=3, ps=2, placement=Placement.SIZE)
    assert (document.what_if.trace, document.what_if.captured_workers) == ("toy", 1)
    assert document.config["workload"] == "what-if"
    assert document.config["what_if_placement"] == "size"
    (throughput,) = document.benchmarks
    # Every worker's two steps, each the captured step: 12 calls to 2 ps, by hand.
    run = throughput.runs[0]
    assert run.rpc_count == 3 * 2 * (5 * 2 + 2 * 2)
    ps0 = _variable_bytes(4000) + CONTROL_BYTES
    ps1 = sum(_variable_bytes(size) for size in SIZES[1:]) + CONTROL_BYTES
    assert run.request_bytes + run.response_bytes == 3 * 2 * (ps0 + ps1)
    assert {s.server_index for s in run.samples} == {0, 1}
    # The step timeline names the derived cluster's tasks (the calls index the derived trace).
    drawn = (results_file.parent / "timeline" / "ps-throughput.trace.json").read_text()
    assert '"replayed /job:worker/task:2"' in drawn


def test_network_compare_hands_the_what_if_flags_to_its_replays() -> None:
    import argparse

    from tf_grpc_bench.replay import cli as replay_cli
    from tf_grpc_bench.replay.cli_flags import replay_from_argv, replay_spec
    from tf_grpc_bench.replay.network.cli import replay_arguments

    parser = argparse.ArgumentParser()
    replay_cli.configure_replay(parser)
    flags = "resnet50-tf2ps --workers 4 --ps 1 --placement size --scale-tensors 1.5"
    args = parser.parse_args(flags.split())
    spec = replay_spec(args)
    passed = replay_arguments(spec)
    assert replay_from_argv(passed) == spec
    what_if = replay_cli.what_if_of(
        args, trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps"))
    )
    assert what_if == WhatIf(workers=4, ps=1, placement=Placement.SIZE, scale_tensors=1.5)


def test_role_replays_a_what_if_cluster_placed_by_tf_config(tmp_path: Path) -> None:
    """Each task of a 3-worker, 2-ps cluster runs ``role`` on the toy trace's what-if."""
    import json
    import os

    from tests.test_placement import free_ports

    path = tmp_path / "toy.tfgbtrace"
    with path.open("wb") as stream:
        dump_trace(toy_trace(), stream)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(5)]
    cluster = {"ps": addresses[:2], "worker": addresses[2:]}
    flags = [str(path), "--workers", "3", "--ps", "2", "--benchmark", "ps-throughput"]
    flags += ["--warmup", "0", "--steps", "2", "--runs", "1", "--job-timeout", "120"]
    processes = {}
    for job, members in cluster.items():
        for index in range(len(members)):
            config = {"cluster": cluster, "task": {"type": job, "index": index}}
            processes[f"{job}:{index}"] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tf_grpc_bench",
                    "role",
                    *flags,
                    "--output-dir",
                    str(tmp_path),
                ],
                env={**os.environ, "TF_CONFIG": json.dumps(config)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
    try:
        outcomes = {
            task: (p.communicate(timeout=300), p.returncode) for task, p in processes.items()
        }
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    for task, ((stdout, stderr), code) in outcomes.items():
        assert code == 0, f"{task}: {stdout}{stderr}"
    (results_file,) = tmp_path.glob("*/results.json")
    document = read_document(results_file)
    assert document.what_if is not None
    assert (document.what_if.workers, document.what_if.ps) == (3, 2)
    (throughput,) = document.benchmarks
    (run,) = throughput.runs
    assert {s.worker_index for s in run.samples} == {0, 1, 2}
    # Every worker's two steps, to the two ps, as in the loopback what-if above.
    ps0 = _variable_bytes(4000) + _variable_bytes(600) + _variable_bytes(100) + CONTROL_BYTES
    ps1 = _variable_bytes(1000) + _variable_bytes(300) + CONTROL_BYTES
    by_server = Counter[int]()
    for sample in run.samples:
        by_server[sample.server_index] += sample.request_bytes + sample.response_bytes
    assert by_server == {0: 3 * 2 * ps0, 1: 3 * 2 * ps1}
