"""Whole steps under ``role``: a cluster replay sends every call of a step between two tasks.

A ps task that called the other ps in training runs that side client besides
serving, the chief runs its calls to the workers, and each worker the chief
called serves a stand-in on its own cluster address.  Checked against a one-host
``replay`` of the same trace and against the trace's own counts, per kind.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.test_placement import free_ports
from tests.test_reliability_faults import _descendants, _parent_of
from tf_grpc_bench import trace_files
from tf_grpc_bench.cluster import TaskId
from tf_grpc_bench.replay import cli
from tf_grpc_bench.replay.cli_flags import replay_spec
from tf_grpc_bench.replay.core.measurement import Benchmark, BenchmarkResult
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.placement import cluster as placement_cluster
from tf_grpc_bench.replay.placement import role
from tf_grpc_bench.replay.spec import ReplaySpec
from tf_grpc_bench.trace import Trace

TRACE = "resnet50-tf2ps"
#: One pass, communication only: every call of the trace's steps once.
ONE_PASS = (
    "--benchmark",
    "ps-throughput",
    "--passes",
    "1",
    "--runs",
    "1",
    "--warmup",
    "0",
    "--compute",
    "none",
    "--quiet",
)

#: The shipped resnet50-tf2ps trace's steady steps (5 steps, 8,100 RPCs, 2,053,079,577 B
#: both ways), per kind of call: RPCs and bytes (requests plus responses), written out by
#: hand from ``tf-grpc-bench inspect resnet50-tf2ps --json``.  worker<->ps is 3,760
#: RecvTensor, 20 Enqueue and 20 RunComponentFunction from workers to ps tasks and 3,210
#: RecvTensor from ps tasks to workers (the gradients).
TRACE_KINDS = {
    "ps->ps": (1_070, 189_345),
    "chief->worker": (20, 281_850),
    "worker<->ps": (7_010, 2_052_608_290),
}


def _kind(trace: Trace, caller: int, callee: int) -> str:
    jobs = (trace.tasks[caller].job, trace.tasks[callee].job)
    if jobs == ("ps", "ps"):
        return "ps->ps"
    if set(jobs) == {"worker", "ps"}:
        return "worker<->ps"
    return f"{jobs[0]}->{jobs[1]}"


def _inspected_kinds(trace: Trace, tmp_path: Path) -> dict[str, tuple[int, int]]:
    """Per kind, the RPCs and bytes of the steps ``inspect --json`` exports."""
    exported = tmp_path / "inspected.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "inspect", TRACE, "--json", str(exported)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for step in json.loads(exported.read_text())["steps"]:
        for rpc in step["rpcs"]:
            kind = _kind(trace, rpc["caller_task"], rpc["callee_task"])
            counts[kind] += 1
            sizes[kind] += rpc["request_bytes"] + rpc["response_bytes"]
    return {kind: (counts[kind], sizes[kind]) for kind in counts}


def _replayed_kinds(trace: Trace, result: BenchmarkResult) -> dict[str, tuple[int, int]]:
    """RPCs and bytes (both directions) the run's samples moved, per kind of trace call."""
    steps = {step.index: step for step in trace.steps}
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    (run,) = result.runs
    for sample in run.samples:
        rpc = steps[sample.step].rpcs[sample.rpc_index]
        kind = _kind(trace, rpc.caller_task, rpc.callee_task)
        counts[kind] += 1
        sizes[kind] += sample.request_bytes + sample.response_bytes
    return {kind: (counts[kind], sizes[kind]) for kind in counts}


def _replay_args(*arguments: str) -> ReplaySpec:
    parser = argparse.ArgumentParser()
    cli.configure_role(parser)
    return replay_spec(parser.parse_args(list(arguments)))


def _placement(cluster: dict[str, list[str]], task: str) -> placement_cluster.Placement:
    return placement_cluster.parse_tf_config(
        json.dumps(
            {"cluster": cluster, "task": {"type": task.split(":")[0], "index": int(task[-1])}}
        )
    )


CLUSTER = {
    "chief": ["h0:2222"],
    "ps": ["h1:2222", "h2:2222"],
    "worker": ["h3:2222", "h4:2222"],
}


def test_every_task_places_the_side_clients_and_stand_ins_alike() -> None:
    args = _replay_args(TRACE, "--benchmark", "ps-throughput")
    for task in ("chief:0", "ps:0", "ps:1", "worker:0", "worker:1"):
        request, parts = role.cluster_request(_placement(CLUSTER, task), args)
        assert request.targets == ("h1:2222", "h2:2222", "h3:2222", "h4:2222")
        # The workload's clients: training's workers, then the chief and ps:0 (which
        # called ps:1); its servers: the ps tasks, then stand-ins for the two workers.
        assert parts.clients == (
            (TaskId(type="worker", index=0), 0),
            (TaskId(type="worker", index=1), 1),
            (TaskId(type="chief", index=0), 2),
            (TaskId(type="ps", index=0), 3),
        )
        assert parts.stand_ins == (TaskId(type="worker", index=0), TaskId(type="worker", index=1))
        (workload,) = request.workloads
        parameters = workload.parameters()
        assert parameters["dropped_rpcs_per_pass"] == 0
        assert parameters["client_tasks"] == (
            "/job:worker/task:0,/job:worker/task:1,/job:chief/task:0,/job:ps/task:0"
        )


@pytest.mark.parametrize("name", [n for n in trace_files.shipped_trace_names() if "tf2ps" in n])
def test_a_cluster_with_a_chief_drops_nothing_of_a_shipped_tf2_trace(name: str) -> None:
    # --compute none: the calls and their placement do not depend on it, and the default
    # (auto) would time each model's training step here first (tens of seconds each).
    args = _replay_args(
        name.removesuffix(".tfgbtrace"), "--benchmark", "ps-throughput", "--compute", "none"
    )
    request, parts = role.cluster_request(_placement(CLUSTER, "worker:0"), args)
    parameters = request.workloads[0].parameters()
    assert parameters["dropped_rpcs_per_pass"] == parameters["dropped_bytes_per_pass"] == 0
    assert len(parts.clients) == request.workloads[0].worker_count
    assert len(request.targets or ()) == request.workloads[0].server_count


def test_without_a_chief_the_chiefs_calls_are_dropped_and_ps_to_ps_still_replayed() -> None:
    no_chief = {"ps": CLUSTER["ps"], "worker": CLUSTER["worker"]}
    args = _replay_args(TRACE, "--benchmark", "ps-throughput")
    request, parts = role.cluster_request(_placement(no_chief, "ps:0"), args)
    assert request.targets == ("h1:2222", "h2:2222")
    assert parts.side_tasks == (TaskId(type="ps", index=0),) and parts.stand_ins == ()
    parameters = request.workloads[0].parameters()
    assert parameters["whole_steps"] == "ps-to-ps by ps clients"
    assert parameters["dropped_rpcs"] == "chief->worker Enqueue: 20 RPCs, 281850 B"


def test_a_synthetic_cluster_replay_has_no_side_parts() -> None:
    args = _replay_args("--synthetic", "--benchmark", "ps-throughput")
    request, parts = role.cluster_request(_placement(CLUSTER, "worker:1"), args)
    assert request.targets == ("h1:2222", "h2:2222")
    assert parts.side_tasks == () and parts.stand_ins == ()
    assert parts.client_of(TaskId(type="worker", index=1)) == 1


# -- real processes ------------------------------------------------------------------


def _run_cluster(
    cluster: dict[str, list[str]], output: Path
) -> tuple[dict[str, tuple[int, str, str]], set[int]]:
    """Every task its own process, as a launcher starts them; their outcomes, and every
    process they started (seen while they ran)."""
    processes = {}
    for job, addresses in cluster.items():
        for index in range(len(addresses)):
            env = {
                **os.environ,
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": job, "index": index}}
                ),
            }
            command = [sys.executable, "-m", "tf_grpc_bench", "role", TRACE, *ONE_PASS]
            processes[f"{job}:{index}"] = subprocess.Popen(
                [*command, "--job-timeout", "300", "--output-dir", str(output)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
    started: set[int] = set()
    deadline = time.monotonic() + 600
    try:
        while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
            started |= _descendants(*(p.pid for p in processes.values()))
            time.sleep(0.5)
        outcomes = {}
        for task, process in processes.items():
            stdout, stderr = process.communicate(timeout=30)
            outcomes[task] = (process.returncode, stdout, stderr)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    return outcomes, started


def _one_host_replay(output: Path) -> results.ResultDocument:
    command = [sys.executable, "-m", "tf_grpc_bench", "replay", TRACE, *ONE_PASS]
    completed = subprocess.run(
        [*command, "--output-dir", str(output)], capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return read_document(next(output.glob("*/results.json")))


def _throughput(document: results.ResultDocument) -> BenchmarkResult:
    (result,) = [r for r in document.benchmarks if r.benchmark is Benchmark.PS_THROUGHPUT]
    return result


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for processes left")
def test_a_cluster_pass_replays_every_kind_of_call_as_a_one_host_replay_does(
    tmp_path: Path,
) -> None:
    trace = trace_files.read_trace(trace_files.shipped_trace_path(TRACE))
    assert _inspected_kinds(trace, tmp_path) == TRACE_KINDS

    chief, ps0, ps1, worker0, worker1 = (f"127.0.0.1:{p}" for p in free_ports(5))
    cluster = {"chief": [chief], "ps": [ps0, ps1], "worker": [worker0, worker1]}
    outcomes, started = _run_cluster(cluster, tmp_path / "cluster")
    for task, (code, stdout, stderr) in outcomes.items():
        assert code == 0, f"{task}: {stdout}{stderr}"
    assert "side client" in outcomes["ps:0"][1] and "side client" in outcomes["chief:0"][1]
    assert "stand-in server" in outcomes["worker:1"][1]
    assert "side client" not in outcomes["ps:1"][1]

    gathered = read_document(next((tmp_path / "cluster").glob("*/results.json")))
    assert not gathered.partial, gathered.partial_reason
    local = _one_host_replay(tmp_path / "local")
    in_cluster, on_one_host = _throughput(gathered), _throughput(local)

    assert _replayed_kinds(trace, in_cluster) == TRACE_KINDS
    assert _replayed_kinds(trace, on_one_host) == TRACE_KINDS
    for name in ("client_tasks", "server_tasks", "side_clients", "stand_in_servers", "whole_steps"):
        assert in_cluster.parameters[name] == on_one_host.parameters[name], name
    assert in_cluster.parameters["dropped_rpcs_per_pass"] == 0
    assert in_cluster.parameters["cluster_workers"] == 2
    (cluster_run,) = in_cluster.runs
    (local_run,) = on_one_host.runs
    assert cluster_run.rpc_count == local_run.rpc_count == 8_100
    assert cluster_run.request_bytes == local_run.request_bytes
    assert cluster_run.response_bytes == local_run.response_bytes
    # Side clients (worker indices 2 and 3) record no step time: the workers' 5 steps each.
    assert {s.worker_index for s in cluster_run.samples} == {0, 1, 2, 3}
    assert len(cluster_run.step_times_ns) == len(local_run.step_times_ns) == 2 * 5

    # Nothing left: no process any task started, no server on the cluster's ports.
    time.sleep(1)
    assert not {pid for pid in started if _parent_of(pid) is not None}
    for address in cluster.values():
        for host_port in address:
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", int(host_port.rpartition(":")[2]))) != 0
