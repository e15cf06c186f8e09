"""``tf-grpc-bench role`` under a real Slurm: ``srun -n 5`` places every task from Slurm's
environment (``--slurm-jobs``), and the chief writes one merged document.

The Slurm is Debian's, installed when missing and started by ``tests/slurm_cluster.py``
(root only: without root these tests skip, saying why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slurm_cluster
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.output import document as results

# Root only, like the netns tests (and left out with them by -m "not netns").
pytestmark = [pytest.mark.slurm, pytest.mark.netns]

#: Guards against a hang only; nothing is timed.
STEP_LIMIT_S = 600


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.Slurm]:
    reason = slurm_cluster.ensure_installed()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    with slurm_cluster.running_slurm(root) as running:
        yield running
    left = slurm_cluster.wait_for_no_leftovers(root, besides=frozenset())
    assert not left, f"processes left after Slurm stopped: {left}"


def srun(
    slurm: slurm_cluster.Slurm,
    tasks: int,
    *role_arguments: str,
    cwd: Path,
    kill_on_bad_exit: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``srun -n tasks tf-grpc-bench role ...``; with ``kill_on_bad_exit``, a task that fails
    ends the step (what a job script should ask for: the others would wait for it)."""
    return subprocess.run(
        [
            "srun",
            f"--ntasks={tasks}",
            "--time=10",
            f"--kill-on-bad-exit={int(kill_on_bad_exit)}",
            f"--chdir={cwd}",
            sys.executable,
            "-m",
            "tf_grpc_bench",
            "role",
            *role_arguments,
        ],
        env=slurm.environment,
        capture_output=True,
        text=True,
        timeout=STEP_LIMIT_S,
        check=False,
    )


def test_srun_places_five_tasks_and_the_chief_merges_every_workers_samples(
    slurm: slurm_cluster.Slurm, tmp_path: Path
) -> None:
    port_base = slurm_cluster.free_port_block(5)
    output = tmp_path / "runs"
    before = frozenset(slurm_cluster.tagged_pids(slurm.root))
    result = srun(
        slurm,
        5,
        "resnet50-tf2ps",
        "--slurm-jobs",
        "ps:2,worker:2,chief:1",
        "--port-base",
        str(port_base),
        "--benchmark",
        "ps-throughput",
        "--steps",
        "1",
        "--runs",
        "2",
        "--warmup",
        "0",
        "--compute",
        "none",
        "--job-timeout",
        "300",
        "--output-dir",
        str(output),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr + slurm.logs()
    # Ranks by job name, as TensorFlow's SlurmClusterResolver hands them out.
    for line in ("chief:0: gather", "ps:0: serve", "ps:1: serve", "worker:0: replay"):
        assert line in result.stdout
    # Whole steps: ps:0 (which called ps:1 in training) and the chief run side clients, and
    # each worker serves a stand-in for the chief's calls.
    for line in ("chief:0: gather, side client", "ps:0: serve, side client"):
        assert line in result.stdout
    assert "ps:1: serve\n" in result.stdout
    assert "worker:1: replay, stand-in server" in result.stdout
    assert f"worker:1: serving on 0.0.0.0:{port_base + 4}" in result.stdout
    assert f"ps:0: serving on 0.0.0.0:{port_base + 1}" in result.stdout
    assert f"ps:1: serving on 0.0.0.0:{port_base + 2}" in result.stdout
    # The two workers, ps:0's side client and the chief's.
    assert result.stdout.count(f"results sent to localhost:{port_base}") == 4
    assert "ps:0: stopped" in result.stdout and "ps:1: stopped" in result.stdout

    documents = list(output.glob("*/results.json"))
    assert len(documents) == 1
    document = results.read_document(documents[0])
    assert not document.partial
    assert document.config["cluster_workers"] == 2
    assert document.config["placement"] == "cluster"
    assert document.network is not None
    assert document.network.addresses == tuple(
        f"localhost:{port_base + rank}" for rank in (1, 2, 3, 4)
    )
    (throughput,) = document.benchmarks
    assert throughput.benchmark is Benchmark.PS_THROUGHPUT
    assert throughput.parameters["cluster_workers"] == 2
    assert len(throughput.runs) == 2
    assert throughput.parameters["dropped_rpcs_per_pass"] == 0
    for run in throughput.runs:
        assert {s.worker_index for s in run.samples} == {0, 1, 2, 3}
    # Every task of the step (and its slurmstepd) has exited; only the daemons remain.
    left = slurm_cluster.wait_for_no_leftovers(slurm.root, besides=before)
    assert not left, f"processes left after the step: {left}"


def test_under_srun_a_missing_or_wrong_job_layout_is_one_line_per_task(
    slurm: slurm_cluster.Slurm, tmp_path: Path
) -> None:
    # Each task fails on its own here (no task killed by srun before it could say why).
    missing = srun(slurm, 2, "--synthetic", cwd=tmp_path, kill_on_bad_exit=False)
    assert missing.returncode != 0
    complaints = [line for line in missing.stderr.splitlines() if "tf-grpc-bench role" in line]
    assert len(complaints) == 2, missing.stderr
    assert all("under srun, give --slurm-jobs" in line for line in complaints)
    assert "Traceback" not in missing.stderr

    wrong = srun(
        slurm,
        2,
        "--synthetic",
        "--slurm-jobs",
        "ps:1,worker:2",
        cwd=tmp_path,
        kill_on_bad_exit=False,
    )
    assert wrong.returncode != 0
    assert "ps:1,worker:2: 3 tasks, but the Slurm step has 2 (srun -n)" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_emit_tf_config_gives_each_srun_task_its_tf_config(
    slurm: slurm_cluster.Slurm, tmp_path: Path
) -> None:
    """For a command that reads TF_CONFIG (a training script under ``record``)."""
    result = subprocess.run(
        [
            "srun",
            "--ntasks=3",
            "--time=5",
            f"--chdir={tmp_path}",
            sys.executable,
            "-m",
            "tf_grpc_bench",
            "emit",
            "tf-config",
            "--slurm-jobs",
            "worker:2,ps:1",
            "--port-base",
            "7000",
        ],
        env=slurm.environment,
        capture_output=True,
        text=True,
        timeout=STEP_LIMIT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    assert {json.dumps(d["cluster"], sort_keys=True) for d in documents} == {
        json.dumps({"ps": ["localhost:7000"], "worker": ["localhost:7001", "localhost:7002"]})
    }
    assert sorted((d["task"]["type"], d["task"]["index"]) for d in documents) == [
        ("ps", 0),
        ("worker", 0),
        ("worker", 1),
    ]


def test_the_shipped_sbatch_replay_example_runs(slurm: slurm_cluster.Slurm, tmp_path: Path) -> None:
    """``examples/slurm/replay.sbatch`` as a user submits it, on this one node."""
    script = Path(__file__).resolve().parent.parent / "examples" / "slurm" / "replay.sbatch"
    output = tmp_path / "runs"
    environment = {
        **slurm.environment,
        "PATH": f"{Path(sys.executable).parent}:{slurm.environment.get('PATH', '')}",
        "TRACE": "resnet50-tf2ps",
        "RUNS": str(output),
        "PORT_BASE": str(slurm_cluster.free_port_block(5)),
        "REPLAY_FLAGS": "--benchmark ps-throughput --steps 1 --runs 1 --warmup 0 --compute none",
    }
    result = subprocess.run(
        # The script asks for 3 nodes; this Slurm has one, which the command line overrides.
        [
            "sbatch",
            "--wait",
            "--nodes=1",
            f"--chdir={tmp_path}",
            f"--output={tmp_path}/job.out",
            str(script),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=STEP_LIMIT_S,
        check=False,
    )
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + log + slurm.logs()
    (path,) = output.glob("*/results.json")
    document = results.read_document(path)
    assert not document.partial
    assert document.network is not None and document.network.name == "slurm-test"
    (throughput,) = document.benchmarks
    assert {s.worker_index for run in throughput.runs for s in run.samples} == {0, 1}
