"""One replay server shared by several clients, and clients that do not play fair.

Real servers (in this process or a ``tf-grpc-bench serve``) and real clients
over loopback.  The CANCELLED failures of a shared server: gRPC core cancels
calls that wait too many to be accepted (``wire.MAX_PENDING_CALLS``).
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.replay.transport.server import ReplayServer
from tf_grpc_bench.replay.transport.wire import raw_pull_request
from tf_grpc_bench.trace import RECV_TENSOR

CLI = str(Path(sys.executable).parent / "tf-grpc-bench")
WIDE_SCRIPT = Path(__file__).parent / "data" / "user_train_ps_wide.py"

#: More calls at once than gRPC core lets wait by default (it cancels some
#: past 1000, all past 3000).
BURST_CALLS = 4000


def _burst(address: str, calls: int) -> collections.Counter[str]:
    """``calls`` pulls issued at once on one channel; how they ended, by status name."""
    outcomes: collections.Counter[str] = collections.Counter()
    with grpc.insecure_channel(address) as channel:
        pull = channel.unary_unary(RECV_TENSOR, None, None)
        request, _ = raw_pull_request(16, 100)
        futures = [pull.future(request, timeout=120) for _ in range(calls)]
        for future in futures:
            try:
                future.result()
                outcomes["OK"] += 1
            except grpc.RpcError as error:
                outcomes[error.code().name] += 1
    return outcomes


def test_a_burst_of_calls_beyond_grpcs_waiting_limit_is_served_not_cancelled() -> None:
    with ReplayServer() as server:
        outcomes: collections.Counter[str] = collections.Counter()
        for _ in range(3):
            outcomes += _burst(server.address, BURST_CALLS)
        assert outcomes == {"OK": 3 * BURST_CALLS}
        assert server.stats().received_messages == 3 * BURST_CALLS


# --------------------------------------------------------------------------
# A capture-job trace replayed by two clients of one shared serve.


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[str]:
    """A ``tf-grpc-bench serve`` on a free port; its address.  Stopped with SIGTERM."""
    port = free_ports(1)[0]
    process = subprocess.Popen(
        [CLI, "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "serving" in line, line + process.stderr.read() if process.stderr else line
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


def _capture_wide_job(output: Path) -> None:
    chief, ps, worker0, worker1 = (f"localhost:{p}" for p in free_ports(4))
    cluster = {"chief": [chief], "ps": [ps], "worker": [worker0, worker1]}
    result = subprocess.run(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "--output", str(output),
         "--quiet", "--timeout", "300", "--",
         sys.executable, str(WIDE_SCRIPT), "--rounds", "3", "--variables", "400"],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def _replay_command(trace: Path, target: str, output_dir: Path) -> list[str]:
    # asap pacing with the recorded concurrency releases each worker-step's
    # ~800 calls together: two workers per client, two clients, one server.
    return [
        CLI, "replay", str(trace), "--benchmark", "ps-throughput", "--pacing", "asap",
        "--steps", "2", "--warmup", "1", "--runs", "1", "--quiet",
        "--target", target, "--output-dir", str(output_dir),
    ]  # fmt: skip


@pytest.mark.tensorflow
def test_two_clients_replay_a_capture_job_trace_by_steps_on_one_serve(
    tmp_path: Path, serve: str
) -> None:
    trace = tmp_path / "wide.tfgbtrace"
    _capture_wide_job(trace)
    failures = []
    for repetition in range(8):
        output_dir = tmp_path / f"runs-{repetition}"
        clients = [
            subprocess.Popen(
                _replay_command(trace, serve, output_dir),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for client in clients:
            _, stderr = client.communicate(timeout=300)
            if client.returncode != 0:
                failures.append(f"repetition {repetition}: {stderr.strip()}")
        documents = [json.loads(p.read_text()) for p in output_dir.glob("*/results.json")]
        assert len(documents) == 2
        for document in documents:
            (benchmark,) = document["benchmarks"]
            assert not benchmark["partial"], benchmark["partial_reason"]
            assert benchmark["parameters"]["steps_per_run"] == 2
    assert not failures, failures
