"""``tf-grpc-bench role`` and ``record`` under a real Slurm: ``srun -n 5`` places every replay
task from Slurm's environment (``--slurm-jobs``), and the chief writes one merged document;
``srun -n 4`` runs a tiny TensorFlow job with every task under ``record --slurm-jobs``, whose
assembled trace equals the single-machine assembly of the same records; the shipped sbatch
examples run as a user submits them.

The Slurm is Debian's, installed when missing and started by ``tests/slurm_cluster.py``
(root only: without root these tests skip, saying why).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.test_record import (
    FLAGS_SCRIPT,
    SCRIPT,
    _assert_same_calls,
    _assert_same_steps_up_to_the_clocks,
    _single_machine_trace,
)
from tf_grpc_bench import trace_files
from tf_grpc_bench.profiler.assemble import assemble_records
from tf_grpc_bench.profiler.assembly.clocks import WIRE
from tf_grpc_bench.profiler.launch.user_job import UserJob
from tf_grpc_bench.profiler.physics import check_physics
from tf_grpc_bench.profiler.record import read_task_record
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.trace import Task

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
    document = read_document(documents[0])
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
    # The script asks for 3 nodes; this Slurm has one, which the command line overrides.
    result = slurm.batch(
        ["--nodes=1", f"--chdir={tmp_path}", f"--output={tmp_path}/job.out", str(script)],
        environment,
        STEP_LIMIT_S,
    )
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + log + slurm.logs()
    (path,) = output.glob("*/results.json")
    document = read_document(path)
    assert not document.partial
    assert document.network is not None and document.network.name == "slurm-test"
    (throughput,) = document.benchmarks
    # The workers and the side clients of whole steps (the chief's, ps:0's).
    assert {s.worker_index for run in throughput.runs for s in run.samples} == {0, 1, 2, 3}


# --------------------------------------------------------------------------
# record under srun: a tiny TF2 parameter-server job captured task by task.

#: The jobs by name take the ranks: chief 0, ps 1, workers 2-3.
TRAINING_JOBS = "ps:1,worker:2,chief:1"


def test_under_srun_end_step_ends_the_servers_when_the_chief_has_ended(
    slurm: slurm_cluster.Slurm, tmp_path: Path
) -> None:
    """Every task's command gets the chief's SIGTERM once (Slurm's; record does not pass
    it on as well) and every record writes its manifest (what Slurm's own SIGKILL would
    not let it do); no process of the step is left."""
    out = tmp_path / "records"
    before = frozenset(slurm_cluster.tagged_pids(slurm.root))
    (tmp_path / "server.py").write_text(COUNTS_SIGTERMS)
    # The chief ends once the servers' commands are ready for the signal, as a real chief
    # ends long after.
    serve = (
        f"if [ {{job}} != chief ]; then exec {sys.executable} server.py {{job}}.terms; fi; "
        "echo '{cluster}' > chief.txt; "
        "until [ -e ps.terms.ready ] && [ -e worker.terms.ready ]; do sleep 0.1; done"
    )
    result = subprocess.run(
        ["srun", "--ntasks=3", "--time=5", "--kill-on-bad-exit=0", f"--chdir={tmp_path}",
         sys.executable, "-m", "tf_grpc_bench", "record", "--slurm-jobs", "worker:1,ps:1,chief:1",
         "--port-base", "7000", "--end-step", "--out", str(out), "--", "sh", "-c", serve],
        env=slurm.environment, capture_output=True, text=True, timeout=STEP_LIMIT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 143, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "scancel" not in result.stderr, result.stderr
    laid_out = {"chief": ["localhost:7000"], "ps": ["localhost:7001"], "worker": ["localhost:7002"]}
    assert json.loads((tmp_path / "chief.txt").read_text()) == laid_out
    statuses = {
        read_task_record(folder).name: read_task_record(folder).exit_status
        for folder in out.iterdir()
    }
    assert statuses == {"chief:0": 0, "ps:0": 143, "worker:0": 143}
    for server in ("ps", "worker"):
        assert (tmp_path / f"{server}.terms").read_text().splitlines() == ["SIGTERM"], server
    left = slurm_cluster.wait_for_no_leftovers(slurm.root, besides=before)
    assert not left, f"processes left after the step: {left}"


#: A server task's command that notes each SIGTERM it gets, until a second has passed
#: since the first (two sent at once both land), then exits 143.
COUNTS_SIGTERMS = """
import signal, sys, time
path = sys.argv[1]
first = []
def note(signum, frame):
    first.append(first[0] if first else time.monotonic())
    with open(path, "a") as out:
        out.write("SIGTERM\\n")
signal.signal(signal.SIGTERM, note)
open(path + ".ready", "w").close()
while not first or time.monotonic() - first[0] < 1.0:
    time.sleep(0.01)
sys.exit(143)
"""


def _laid_out(port_base: int) -> dict[str, tuple[str, ...]]:
    return {
        "chief": (f"localhost:{port_base}",),
        "ps": (f"localhost:{port_base + 1}",),
        "worker": (f"localhost:{port_base + 2}", f"localhost:{port_base + 3}"),
    }


def _check_records(out: Path, port_base: int) -> list[Path]:
    """Every task's folder, the manifests as Slurm laid the job out: the chief trained
    (0), the servers ended on the SIGTERM (143; 137 if TensorFlow still handled it when
    record's grace ended)."""
    folders = sorted(p for p in out.iterdir() if (p / "manifest.json").exists())
    records = {read_task_record(folder).name: read_task_record(folder) for folder in folders}
    assert sorted(records) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    for record in records.values():
        assert dict(record.cluster) == _laid_out(port_base)
    assert records["chief:0"].exit_status == 0
    assert {records[t].exit_status for t in ("ps:0", "worker:0", "worker:1")} <= {143, 137}
    return folders


@pytest.mark.tensorflow
def test_a_job_recorded_under_srun_assembles_to_the_single_machine_trace(
    slurm: slurm_cluster.Slurm, tmp_path: Path
) -> None:
    """``srun -n 4 record --slurm-jobs ... --end-step -- python train.py --job {job} ...``: a
    script that takes its role as flags, every task placed by Slurm's environment, the
    chief's end ending the ps and workers."""
    port_base = slurm_cluster.free_port_block(4)
    out = tmp_path / "records"
    before = frozenset(slurm_cluster.tagged_pids(slurm.root))
    result = subprocess.run(
        ["srun", "--ntasks=4", "--time=10", "--kill-on-bad-exit=0", f"--chdir={tmp_path}",
         sys.executable, "-m", "tf_grpc_bench", "record",
         "--slurm-jobs", TRAINING_JOBS, "--port-base", str(port_base), "--end-step",
         "--out", str(out), "--",
         sys.executable, str(FLAGS_SCRIPT), "--job", "{job}", "--task", "{task}",
         "--cluster", "{cluster}", "--rounds", "3"],
        env=slurm.environment, capture_output=True, text=True, timeout=STEP_LIMIT_S, check=False,
    )  # fmt: skip
    # srun's status is the servers' (ended by SIGTERM); the chief's is in its manifest.
    assert result.returncode in (143, 137), result.stdout + result.stderr + slurm.logs()
    assert "trained 3 rounds on 2 workers" in result.stdout, result.stderr
    folders = _check_records(out, port_base)
    left = slurm_cluster.wait_for_no_leftovers(slurm.root, besides=before)
    assert not left, f"processes left after the step: {left}"

    output = tmp_path / "job.tfgbtrace"
    assembled = subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "assemble", str(out), "-o", str(output)],
        capture_output=True, text=True, timeout=STEP_LIMIT_S, check=False,
    )  # fmt: skip
    assert assembled.returncode == 0, assembled.stderr
    trace = trace_files.read_trace(output)
    assert not trace.partial, trace.partial_reason
    assert [(t.job, t.index) for t in trace.tasks] == [
        ("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0),
    ]  # fmt: skip
    assert [t.address for t in trace.tasks] == [f"localhost:{port_base + n}" for n in (1, 2, 3, 0)]
    assert dict(trace.metadata.extra)["unattributed_calls"] == "0"
    assert len(trace.steps) == 5  # 3 rounds of 2 workers, the first worker-step start-up
    assert trace.metadata.trainable_parameters == 8 * 32 + 32 + 32 * 4 + 4
    assert check_physics(trace).ok, check_physics(trace).format()
    # The same records assembled the single-machine way (callers by pid, callees by
    # port, one clock), call for call.
    job = UserJob(cluster=_laid_out(port_base), command=("x",))
    tasks = tuple(Task(job=n, index=i, address=a) for n, i, a in job.tasks)
    reference = _single_machine_trace(folders, tasks, tmp_path / "one-machine")
    assert not reference.partial, reference.partial_reason
    _assert_same_calls(trace, reference)
    # Every task placed by the wire alone, as across hosts: the true offsets (one node,
    # one clock: 0) lie within the bounds found, and every call stays in its step but one
    # the bounds may move across a step's edge (a call starting within them of it).
    wired = assemble_records([out], clocks="wire")
    for offset in wired.clock_alignment.tasks[1:]:
        assert offset.source == WIRE and offset.lower_ns is not None
        assert offset.upper_ns is not None and offset.lower_ns <= 0 <= offset.upper_ns
    _assert_same_steps_up_to_the_clocks(wired, trace)


@pytest.mark.tensorflow
def test_the_shipped_sbatch_capture_example_runs(
    slurm: slurm_cluster.Slurm, tmp_path: Path
) -> None:
    """``examples/slurm/capture.sbatch`` as a user submits it, with a training script that
    reads TF_CONFIG (which record, placed by Slurm, gives it)."""
    script = Path(__file__).resolve().parent.parent / "examples" / "slurm" / "capture.sbatch"
    port_base = slurm_cluster.free_port_block(4)
    records = tmp_path / "records"
    trace_path = tmp_path / "job.tfgbtrace"
    variables = tmp_path / "variables.json"
    environment = {
        **slurm.environment,
        "PATH": f"{Path(sys.executable).parent}:{slurm.environment.get('PATH', '')}",
        "JOBS": TRAINING_JOBS,
        "PORT_BASE": str(port_base),
        "RECORDS": str(records),
        "TRACE": str(trace_path),
    }
    before = frozenset(slurm_cluster.tagged_pids(slurm.root))
    # The script asks for 3 nodes and 5 tasks; this Slurm has one node, and the job
    # here has 4 tasks, which the command line overrides.
    result = slurm.batch(
        ["--nodes=1", "--ntasks=4", f"--chdir={tmp_path}", f"--output={tmp_path}/job.out",
         str(script), "python", str(SCRIPT), "--rounds", "3", "--variables", str(variables)],
        environment,
        STEP_LIMIT_S,
    )  # fmt: skip
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + log + slurm.logs()
    assert "trained 3 rounds on 2 workers" in log and "5 steady steps; trace written" in log
    _check_records(records, port_base)
    left = slurm_cluster.wait_for_no_leftovers(slurm.root, besides=before)
    assert not left, f"processes left after the job: {left}"
    trace = trace_files.read_trace(trace_path)
    assert not trace.partial and len(trace.steps) == 5, trace.partial_reason
    model = json.loads(variables.read_text())
    assert trace.metadata.trainable_parameters == sum(math.prod(v["shape"]) for v in model)
    assert check_physics(trace).ok, check_physics(trace).format()
