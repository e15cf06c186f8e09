"""Roles placed by TF_CONFIG: each task its own process, started as a launcher would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    RunMeasurement,
)
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.placement import merge as placement

from .conftest import make_trace

FLAGS = (
    "--synthetic",
    "--benchmark",
    "p2p-latency,ps-throughput",
    "--warmup",
    "0",
    "--duration",
    "0.3",
    "--runs",
    "2",
    "--job-timeout",
    "120",
)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start_task(
    cluster: dict[str, list[str]], task: str, output: Path, *extra: str
) -> subprocess.Popen[str]:
    job, index = task.split(":")
    env = {
        **os.environ,
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": int(index)}}),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tf_grpc_bench",
            "role",
            *FLAGS,
            "--output-dir",
            str(output),
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_cluster(
    cluster: dict[str, list[str]], output: Path, *extra: str
) -> dict[str, tuple[int, str, str]]:
    tasks = [f"{job}:{i}" for job, addresses in cluster.items() for i in range(len(addresses))]
    processes = {task: start_task(cluster, task, output, *extra) for task in tasks}
    outcomes = {}
    try:
        for task, process in processes.items():
            stdout, stderr = process.communicate(timeout=300)
            outcomes[task] = (process.returncode, stdout, stderr)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    return outcomes


def test_chief_gathers_the_results_of_workers_replaying_against_a_ps(tmp_path: Path) -> None:
    chief, ps, worker0, worker1 = (f"127.0.0.1:{p}" for p in free_ports(4))
    cluster = {"chief": [chief], "ps": [ps], "worker": [worker0, worker1]}
    outcomes = run_cluster(cluster, tmp_path)
    for task, (code, stdout, stderr) in outcomes.items():
        assert code == 0, f"{task}: {stdout}{stderr}"
    # Only the gatherer writes a document, and the ps ended when the job did.
    documents = list(tmp_path.glob("*/results.json"))
    assert len(documents) == 1
    assert "results:" in outcomes["chief:0"][1]
    assert "stopped" in outcomes["ps:0"][1]
    document = read_document(documents[0])
    by_benchmark = {r.benchmark: r for r in document.benchmarks}
    latency = by_benchmark[Benchmark.P2P_LATENCY]
    assert {s.worker_index for run in latency.runs for s in run.samples} == {0}
    throughput = by_benchmark[Benchmark.PS_THROUGHPUT]
    assert throughput.parameters["cluster_workers"] == 2
    assert len(throughput.runs) == 2
    for run in throughput.runs:
        assert {s.worker_index for s in run.samples} == {0, 1}
    assert document.config["cluster_workers"] == 2
    assert document.network is not None and document.network.addresses == (ps,)
    assert not document.partial
    # The gatherer draws the step timelines too, both workers' replayed steps in one.
    drawn = (documents[0].parent / "timeline" / "ps-throughput.trace.json").read_text()
    assert '"replayed worker 0"' in drawn and '"replayed worker 1"' in drawn


def test_without_a_chief_worker_zero_replays_and_gathers(tmp_path: Path) -> None:
    ps, worker0, worker1 = (f"127.0.0.1:{p}" for p in free_ports(3))
    cluster = {"ps": [ps], "worker": [worker0, worker1]}
    outcomes = run_cluster(cluster, tmp_path)
    for task, (code, stdout, stderr) in outcomes.items():
        assert code == 0, f"{task}: {stdout}{stderr}"
    assert "results:" in outcomes["worker:0"][1]
    document = read_document(next(tmp_path.glob("*/results.json")))
    throughput = next(r for r in document.benchmarks if r.benchmark is Benchmark.PS_THROUGHPUT)
    assert {s.worker_index for run in throughput.runs for s in run.samples} == {0, 1}


def test_a_missing_placement_is_a_one_line_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    result = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "role"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "set TF_CONFIG, or give --cluster and --task" in result.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "role"],
        env={**env, "TF_CONFIG": '{"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {}}'},
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0
    assert "TF_CONFIG: task.type" in bad.stderr
    assert "Traceback" not in bad.stderr


def _run(worker: int, duration_ns: int, calls: int) -> RunMeasurement:
    samples = tuple(
        CallSample(
            start_ns=i,
            latency_ns=1000,
            request_bytes=10,
            response_bytes=100,
            payload_bytes=100,
            worker_index=worker,
        )
        for i in range(calls)
    )
    return RunMeasurement(run_index=0, duration_ns=duration_ns, samples=samples, client_cpu_ns=5)


def _document(result: BenchmarkResult) -> results.ResultDocument:
    return results.build_document([result], config={"x": 1}, trace_path=None)


def test_merged_throughput_is_every_call_over_the_slowest_worker() -> None:
    def result(worker: int, duration_ns: int, calls: int) -> BenchmarkResult:
        return BenchmarkResult(
            benchmark=Benchmark.PS_THROUGHPUT,
            workload="synthetic",
            parameters={"task": f"worker:{worker}"},
            runs=(_run(worker, duration_ns, calls),),
        )

    merged, reason = placement.merge_worker_documents(
        {
            "worker:0": _document(result(0, 1_000_000_000, 30)),
            "worker:1": _document(result(1, 2_000_000_000, 10)),
        }
    )
    assert reason == ""
    (throughput,) = merged
    assert throughput.rpcs_per_s == pytest.approx(40 / 2.0)
    assert throughput.client_cpu_ns == 10
    assert "task" not in throughput.parameters


def test_a_failed_worker_makes_the_merge_partial() -> None:
    result = BenchmarkResult(
        benchmark=Benchmark.PS_THROUGHPUT,
        workload="synthetic",
        parameters={},
        runs=(_run(0, 1_000_000_000, 3),),
    )
    merged, reason = placement.merge_worker_documents(
        {"worker:0": _document(result)}, failures={"worker:1": "target refused"}
    )
    assert reason == "worker:1: target refused"
    assert merged[0].partial


def test_a_ps_that_never_comes_up_leaves_a_partial_document_and_clear_errors(
    tmp_path: Path,
) -> None:
    chief, ps, worker0 = (f"127.0.0.1:{p}" for p in free_ports(3))
    cluster = {"chief": [chief], "ps": [ps], "worker": [worker0]}
    # The launcher starts the chief and the worker; the ps task never starts.
    processes = {
        task: start_task(cluster, task, tmp_path, "--connect-timeout", "2")
        for task in ("chief:0", "worker:0")
    }
    outcomes = {t: (p.wait(timeout=300), p.stdout, p.stderr) for t, p in processes.items()}
    codes = {task: code for task, (code, _, _) in outcomes.items()}
    stderr = {task: err.read() if err else "" for task, (_, _, err) in outcomes.items()}
    assert codes["worker:0"] != 0 and codes["chief:0"] != 0
    for task in processes:
        assert "Traceback" not in stderr[task], stderr[task]
        assert len(stderr[task].strip().splitlines()) == 1, stderr[task]
    assert "partial results written" in stderr["chief:0"]
    document = read_document(next(tmp_path.glob("*/results.json")))
    assert document.partial
    assert "worker:0" in document.partial_reason


def test_a_trace_with_more_workers_than_the_cluster_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    # Two traced workers, one cluster worker: the second worker's calls would go unreplayed.
    trace = tmp_path / "two-workers.tfgbtrace"
    trace_files.write_trace(make_trace(steps=2, workers=2, ps=1), trace)
    ps, worker = (f"127.0.0.1:{p}" for p in free_ports(2))
    cluster = {"ps": [ps], "worker": [worker]}
    config = {"cluster": cluster, "task": {"type": "worker", "index": 0}}
    completed = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "role", str(trace), "--benchmark", "ps-throughput",
         "--job-timeout", "60", "--output-dir", str(tmp_path)],
        env={**os.environ, "TF_CONFIG": json.dumps(config)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    stderr = completed.stderr
    assert completed.returncode != 0, completed.stdout
    assert "the workload has 2 worker(s), the cluster 1" in stderr
    assert "the trace (or --workers) decides how many" in stderr
    assert len(stderr.strip().splitlines()) == 1
