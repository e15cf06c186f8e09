"""``record`` placed by Slurm: ``--slurm-jobs`` lays the task out from ``srun``'s variables
as ``role`` does (``tf_grpc_bench.launchers``), after TF_CONFIG and the flags.

The environments are what ``srun`` sets (Slurm 22.05's names); the real ``srun`` runs
in ``tests/test_slurm.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.profiler.launch.identity import SLURM, TF_CONFIG, identify_task
from tf_grpc_bench.profiler.record import read_task_record

CLI = str(Path(sys.executable).parent / "tf-grpc-bench")

#: Rank 3 of a 4-task step on two nodes, two tasks each: the second task of node02.
STEP = {
    "SLURM_PROCID": "3",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_LOCALID": "1",
    "SLURMD_NODENAME": "node02",
}
#: What ``--slurm-jobs ps:1,worker:2,chief:1 --port-base 7000`` lays out for that step:
#: the jobs by name take the ranks (chief 0, ps 1, workers 2-3), each node's tasks on
#: 7000, 7001.
LAID_OUT = {
    "chief": ("node01:7000",),
    "ps": ("node01:7001",),
    "worker": ("node02:7000", "node02:7001"),
}
JOBS = "ps:1,worker:2,chief:1"


def test_under_srun_the_task_is_laid_out_from_slurms_environment() -> None:
    task = identify_task(STEP, slurm_jobs=JOBS, port_base=7000)
    assert (task.job, task.index, task.address, task.port, task.source) == (
        "worker",
        1,
        "node02:7001",
        7001,
        SLURM,
    )
    assert dict(task.cluster) == LAID_OUT
    assert list(task.cluster) == ["chief", "ps", "worker"]
    assert json.loads(task.tf_config()) == {
        "cluster": {job: list(addresses) for job, addresses in LAID_OUT.items()},
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc",
    }
    chief = identify_task(
        {**STEP, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "node01"},
        slurm_jobs=JOBS,
        port_base=7000,
    )
    assert (chief.name, chief.address) == ("chief:0", "node01:7000")
    # The job's variables stand in for the step's when those are missing; the default
    # port base is TensorFlow's.
    job_only = {
        "SLURM_PROCID": "1",
        "SLURM_STEPID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": "2",
    }
    task = identify_task(job_only, slurm_jobs="worker:1,ps:1")
    assert (task.name, dict(task.cluster)) == (
        "worker:0",
        {"ps": ("localhost:8888",), "worker": ("localhost:8889",)},
    )


def test_flags_that_agree_with_slurm_are_fine_and_flags_that_contradict_it_are_one_line() -> None:
    laid_out = json.dumps({job: list(addresses) for job, addresses in LAID_OUT.items()})
    task = identify_task(STEP, slurm_jobs=JOBS, port_base=7000)
    agreeing = identify_task(
        STEP, job="worker", index=1, cluster=laid_out, slurm_jobs=JOBS, port_base=7000
    )
    assert agreeing == task
    with pytest.raises(
        ConfigError, match=r"^--slurm-jobs names task worker:1 but --job/--task say worker:0$"
    ):
        identify_task(STEP, index=0, slurm_jobs=JOBS, port_base=7000)
    with pytest.raises(
        ConfigError, match=r"^--slurm-jobs names task worker:1 but --job/--task say ps:1$"
    ):
        identify_task(STEP, job="ps", slurm_jobs=JOBS, port_base=7000)
    with pytest.raises(
        ConfigError, match=r"^--slurm-jobs's cluster differs from --cluster: give one of them$"
    ):
        identify_task(STEP, cluster=laid_out, slurm_jobs=JOBS, port_base=7001)


def test_tf_config_comes_first_and_must_agree_with_the_slurm_layout() -> None:
    cluster = {job: list(addresses) for job, addresses in LAID_OUT.items()}
    same = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    task = identify_task({**STEP, "TF_CONFIG": same}, slurm_jobs=JOBS, port_base=7000)
    assert (task.name, task.source, dict(task.cluster)) == ("worker:1", TF_CONFIG, LAID_OUT)
    other_task = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    with pytest.raises(
        ConfigError,
        match=r"^TF_CONFIG names task worker:0 but --slurm-jobs lays this srun task out as "
        r"worker:1: give one of them$",
    ):
        identify_task({**STEP, "TF_CONFIG": other_task}, slurm_jobs=JOBS, port_base=7000)
    with pytest.raises(
        ConfigError,
        match=r"^TF_CONFIG's cluster differs from the one --slurm-jobs lays out from Slurm's "
        r'environment \(\{"chief":\["node01:7001"\],',
    ):
        identify_task({**STEP, "TF_CONFIG": same}, slurm_jobs=JOBS, port_base=7001)
    # Without --slurm-jobs, Slurm's variables are not read: TF_CONFIG alone places the task.
    assert identify_task({**STEP, "TF_CONFIG": other_task}).name == "worker:0"


@pytest.mark.parametrize(
    ("environment", "jobs", "message"),
    [
        (
            {},
            JOBS,
            r"^SLURM_PROCID and SLURM_STEP_ID: not set, so not a task of an srun job step "
            r"\(in a batch script, start the tasks with srun\)$",
        ),
        (
            {k: v for k, v in STEP.items() if k != "SLURM_STEP_NODELIST"},
            JOBS,
            r"^SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: not set",
        ),
        (
            {**STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x3)"},
            JOBS,
            r"^Slurm environment \(SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE\): 2 nodes "
            r"but tasks per node for 3$",
        ),
        ({**STEP, "SLURM_PROCID": "x"}, JOBS, r"^SLURM_PROCID: expected an integer >= 0, got 'x'$"),
        (
            STEP,
            "ps:1,worker:2",
            r"^--slurm-jobs ps:1,worker:2: 3 tasks, but the Slurm step has 4 \(srun -n\)$",
        ),
        (STEP, "ps:1,learner:3", r"^--slurm-jobs 'ps:1,learner:3': job 'learner' is not one of"),
        (
            {**STEP, "SLURM_LOCALID": "0"},
            JOBS,
            r"^Slurm ran rank 3 as task 0 of node node02, but the block layout puts it as task 1 "
            r"of node02: start the step with srun --distribution=block \(the default\)$",
        ),
    ],
)
def test_an_incomplete_or_inconsistent_slurm_environment_is_one_line_naming_it(
    environment: dict[str, str], jobs: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        identify_task(environment, slurm_jobs=jobs, port_base=7000)


def test_under_srun_without_a_placement_record_asks_for_slurm_jobs() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^which task is this\? TF_CONFIG is not set; under srun, give --slurm-jobs "
        r"\(e\.g\. ps:1,worker:2\), or --job, --task and --cluster$",
    ):
        identify_task(STEP)
    # The flags alone still place a task under srun.
    cluster = json.dumps({"ps": ["h:1"]})
    assert identify_task(STEP, job="ps", index=0, cluster=cluster).name == "ps:0"


def _record(out: Path, environment: dict[str, str], *arguments: str):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k != "TF_CONFIG"}
    return subprocess.run(
        [CLI, "record", "--out", str(out), *arguments],
        env={**base, **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_record_placed_by_slurm_fills_the_placeholders_and_exports_tf_config(
    tmp_path: Path,
) -> None:
    seen = tmp_path / "seen"
    script = (
        f"echo {{job}} {{task}} {{port}} '{{cluster}}' > {seen}; "
        f'printf %s "$TF_CONFIG" > {tmp_path / "tf_config"}'
    )
    result = _record(
        tmp_path / "out",
        STEP,
        "--slurm-jobs",
        JOBS,
        "--port-base",
        "7000",
        "--",
        "sh",
        "-c",
        script,
    )
    assert result.returncode == 0, result.stderr
    compact = json.dumps(
        {job: list(addresses) for job, addresses in LAID_OUT.items()}, separators=(",", ":")
    )
    assert seen.read_text().split() == ["worker", "1", "7001", compact]
    assert json.loads((tmp_path / "tf_config").read_text()) == {
        "cluster": json.loads(compact),
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc",
    }
    record = read_task_record(tmp_path / "out" / "worker-1")
    assert (record.name, record.exit_status, dict(record.cluster)) == ("worker:1", 0, LAID_OUT)


@pytest.mark.parametrize(
    ("environment", "arguments", "message"),
    [
        (
            {},
            ("--slurm-jobs", JOBS),
            "SLURM_PROCID and SLURM_STEP_ID: not set, so not a task of an srun job step",
        ),
        (STEP, (), "under srun, give --slurm-jobs (e.g. ps:1,worker:2), or --job, --task"),
        (STEP, ("--slurm-jobs", JOBS, "--task", "0"), "but --job/--task say worker:0"),
        (STEP, ("--port-base", "7000"), "--port-base lays out a Slurm step: give it with"),
        (STEP, ("--slurm-jobs", JOBS, "--port-base", "65535"), "--port-base 65535: the node's"),
        (
            {},
            ("--job", "ps", "--task", "0", "--cluster", '{"ps": ["h:1"]}', "--end-step"),
            "--end-step ends an srun job step: run record under srun",
        ),
    ],
)
def test_record_with_a_bad_slurm_placement_is_one_line_and_runs_nothing(
    tmp_path: Path, environment: dict[str, str], arguments: tuple[str, ...], message: str
) -> None:
    ran = tmp_path / "ran"
    result = _record(tmp_path / "out", environment, *arguments, "--", "touch", str(ran))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not ran.exists() and not (tmp_path / "out").exists()


def test_a_command_stopped_with_its_record_keeps_its_status(tmp_path: Path) -> None:
    """Every process of a Slurm step gets ``scancel``'s SIGTERM at once: record and its
    command together.  The command's status (143) must not be lost on the way (a handler
    that raised inside ``Popen.wait`` could drop it once ``waitpid`` had reaped the
    command, and record then reported 0)."""
    tf_config = json.dumps({"cluster": {"ps": ["h:1"]}, "task": {"type": "ps", "index": 0}})
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    for attempt in range(6):
        out = tmp_path / f"out{attempt}"
        record = subprocess.Popen(
            [CLI, "record", "--out", str(out), "--", "sleep", "300"],
            env={**base, "TF_CONFIG": tf_config},
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while not (
                (out / "ps-0" / "manifest.json").exists() and read_task_record(out / "ps-0").pid
            ):
                assert time.monotonic() < deadline and record.poll() is None
                time.sleep(0.05)
            time.sleep(0.3)  # record is waiting now
            os.kill(read_task_record(out / "ps-0").pid, signal.SIGTERM)
            record.send_signal(signal.SIGTERM)
            assert record.wait(timeout=60) == 143
        finally:
            record.kill()
            record.wait()
        assert read_task_record(out / "ps-0").exit_status == 143
