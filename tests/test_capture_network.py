"""Training on an emulated link: ``capture`` and ``capture-job`` with ``--network``.

Pure parts first (layouts, the refusal without root, metadata, the cluster's
new hosts), then real captures of the tiny model whose tasks run inside
network namespaces (root and TensorFlow).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tf_grpc_bench import capture_cpu, trace_files, trace_summary
from tf_grpc_bench.errors import ConfigError, NetworkError
from tf_grpc_bench.netns import links
from tf_grpc_bench.profiler.launch.hosts import (
    NetworkRequest,
    TaskHosts,
    check_network_allowed,
    place_tasks,
)
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.profiler.launch.user_job import rehost_cluster
from tf_grpc_bench.profiler.physics import check_physics
from tf_grpc_bench.trace import RECV_TENSOR

from .conftest import environment_without_coverage, namespaces_made_by, run_with_pid

CLI = shutil.which("tf-grpc-bench") or str(Path(sys.executable).parent / "tf-grpc-bench")
SCRIPT = Path(__file__).parent / "data" / "user_train_ps.py"
CLUSTER = '{"ps": ["localhost:2222"], "worker": ["localhost:2223"]}'
TF2_TASKS = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("chief", 0)]


def test_ps_together_puts_the_ps_on_one_host_and_everything_else_on_the_other() -> None:
    placed = place_tasks(TF2_TASKS, "ps-together")
    assert [placed[key] for key in TF2_TASKS] == [0, 0, 1, 1, 1]


def test_one_per_host_gives_every_task_its_own_host_ps_first() -> None:
    placed = place_tasks(TF2_TASKS, "one-per-host")
    assert [placed[key] for key in TF2_TASKS] == [0, 1, 2, 3, 4]
    # Without ps tasks (mwms) ps-together has nothing to group.
    workers = [("worker", 0), ("worker", 1)]
    assert place_tasks(workers, "ps-together") == {("worker", 0): 0, ("worker", 1): 1}


def test_without_root_network_is_a_one_line_error_naming_the_flag() -> None:
    with pytest.raises(NetworkError, match=r"--network.*root") as refused:
        check_network_allowed("preload", euid=1000)
    message = str(refused.value)
    assert "--network" in message and "root" in message and "\n" not in message
    with pytest.raises(ConfigError, match="--recorder preload"):
        check_network_allowed("proxy", euid=0)
    check_network_allowed("preload", euid=0)


def test_unknown_profiles_and_layouts_are_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--network"):
        NetworkRequest.parse("fast")
    with pytest.raises(ConfigError, match="--layout"):
        NetworkRequest.parse("1gbit", "ring")
    assert NetworkRequest.parse("2.5gbit").profile.rate_bits_per_s == 2_500_000_000


def test_layout_without_network_is_refused_before_anything_starts(tmp_path: Path) -> None:
    output = tmp_path / "never.tfgbtrace"
    result = run_cli("capture", "--model", "tiny", "--layout", "one-per-host", "-o", str(output))
    assert result.returncode != 0 and "--network" in result.stderr
    assert not output.exists()


def test_a_user_cluster_moves_to_the_hosts_keeping_its_ports() -> None:
    cluster = {"ps": ("localhost:2222",), "worker": ("localhost:2223", "localhost:2224")}
    hosts = {("ps", 0): "10.0.0.1", ("worker", 0): "10.0.0.2", ("worker", 1): "10.0.0.3"}
    assert rehost_cluster(cluster, hosts.__getitem__) == {
        "ps": ("10.0.0.1:2222",),
        "worker": ("10.0.0.2:2223", "10.0.0.3:2224"),
    }
    with pytest.raises(ConfigError, match="port 2222"):
        rehost_cluster({"ps": ("localhost:2222",), "worker": ("127.0.0.1:2222",)}, str)


def test_the_network_is_recorded_in_the_metadata() -> None:
    hosts = TaskHosts(
        request=NetworkRequest(profile=links.PROFILES["1gbit"], layout="ps-together"),
        host_of={("ps", 0): 0, ("worker", 0): 1},
        addresses=("10.233.0.1", "10.233.0.2"),
        namespaces=("tfgb-1-a-h0", "tfgb-1-a-h1"),
        run_id="1-a",
    )
    extra = dict(hosts.metadata())
    assert extra["network"] == "1gbit" and extra["network_rate_bits_per_s"] == "1000000000"
    assert extra["network_layout"] == "ps-together" and extra["network_hosts"] == "2"
    assert extra["network_placement"] == "ps:0=h0, worker:0=h1"
    assert hosts.prefix(("worker", 0)) == ("ip", "netns", "exec", "tfgb-1-a-h1")
    assert trace_summary.rate_text("1000000000") == "1 Gbit/s"
    assert trace_summary.rate_text("unlimited") == "unlimited"
    assert (extra["network_delay_ns"], extra["network_jitter_ns"], extra["network_loss"]) == (
        "0",
        "0",
        "0",
    )
    delayed = dataclasses.replace(
        hosts,
        request=NetworkRequest(
            profile=links.parse_profile("10gbit-crossrack:loss=0.1%"), layout="ps-together"
        ),
    )
    extra = dict(delayed.metadata())
    assert (extra["network_delay_ns"], extra["network_jitter_ns"], extra["network_loss"]) == (
        "50000",
        "10000",
        "0.001",
    )


# --------------------------------------------------------------------------
# Real captures on emulated hosts.


def run_cli(*arguments: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *arguments], capture_output=True, text=True, timeout=timeout, check=False
    )


def _check_network_trace(output: Path, profile: str, layout: str, hosts: int) -> None:
    """Tasks at the hosts' addresses, every task a caller, physics holds, network named."""
    trace = trace_files.read_trace(output)
    assert not trace.partial, trace.partial_reason
    extra = dict(trace.metadata.extra)
    assert (extra["network"], extra["network_layout"]) == (profile, layout)
    assert extra["network_hosts"] == str(hosts)
    assert extra["unattributed_calls"] == "0"
    addresses = {t.address.rpartition(":")[0] for t in trace.tasks}
    assert all(a.startswith("10.233.0.") for a in addresses), addresses
    assert len(addresses) == hosts
    callers = {r.caller_task for step in trace.steps for r in step.rpcs}
    assert callers == set(range(len(trace.tasks)))  # every task's sends were recorded
    pulled = {r.callee_task for step in trace.steps for r in step.rpcs if r.method == RECV_TENSOR}
    assert set(trace.tasks_of_job("ps")) <= pulled
    report = check_physics(trace)
    assert report.ok, report.format()


@pytest.mark.netns
@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("profile", "layout", "hosts"), [("1gbit", "ps-together", 2), ("unlimited", "one-per-host", 4)]
)
def test_capture_on_an_emulated_link(tmp_path: Path, profile: str, layout: str, hosts: int) -> None:
    output = tmp_path / "tiny.tfgbtrace"
    # Not timed (--no-calibrate): nothing here reads the compute calibration (test_capture.py
    # checks a capture's), and a loaded machine's would take minutes.
    flags = "--model tiny --setup tf2-ps --ps 1 --workers 2 --steps 2 --batch-size 4"
    flags += " --no-calibrate"
    network = ("--network", profile, "--layout", layout)
    result, pid = run_with_pid(
        [CLI, "capture", *flags.split(), "--input-size", "16", "-q", "-o", str(output), *network],
        timeout_s=600,
    )
    assert result.returncode == 0, result.stderr
    assert namespaces_made_by(pid) == []
    _check_network_trace(output, profile, layout, hosts)
    shown = run_cli("inspect", str(output))
    assert f"network: emulated {profile}" in shown.stdout and "10.233.0." in shown.stdout


@pytest.mark.netns
@pytest.mark.tensorflow
def test_capture_job_runs_the_users_tasks_on_emulated_hosts(tmp_path: Path) -> None:
    ports = free_ports(4)
    cluster = {
        "chief": [f"localhost:{ports[0]}"],
        "ps": [f"localhost:{ports[1]}"],
        "worker": [f"localhost:{ports[2]}", f"localhost:{ports[3]}"],
    }
    output = tmp_path / "user.tfgbtrace"
    variables_file = tmp_path / "variables.json"
    user_command = (
        sys.executable,
        str(SCRIPT),
        "--rounds",
        "3",
        "--variables",
        str(variables_file),
    )
    result, pid = run_with_pid(
        [
            *(CLI, "capture-job", "--cluster", json.dumps(cluster), "-o", str(output)),
            # Not timed: test_userjob.py checks capture-job's calibration.
            *("--timeout", "300", "--no-calibrate", "--network", "1gbit", "--", *user_command),
        ],
        timeout_s=600,
    )
    assert result.returncode == 0, result.stderr
    assert namespaces_made_by(pid) == []
    trace = trace_files.read_trace(output)
    assert not trace.partial
    extra = dict(trace.metadata.extra)
    assert (extra["network"], extra["network_layout"]) == ("1gbit", "ps-together")
    assert extra["unattributed_calls"] == "0"
    by_task = {t.name: t.address for t in trace.tasks}
    assert by_task["/job:ps/task:0"] == f"10.233.0.1:{ports[1]}"
    assert by_task["/job:worker/task:1"] == f"10.233.0.2:{ports[3]}"
    variables = [dict(v, trainable=True) for v in json.loads(variables_file.read_text())]
    report = check_physics(trace, {"variables": variables})
    assert report.ok, report.format()
    # The CPU of the user's own processes, started inside the hosts' namespaces.
    cpu = capture_cpu.from_extra(trace.metadata.extra)
    assert cpu is not None
    assert {name for name, _ in cpu.task_cores} == {"chief:0", "ps:0", "worker:0", "worker:1"}
    assert cpu.tasks_cores > 0


@pytest.mark.netns
@pytest.mark.tensorflow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.usefixtures("temporary_files_here")
def test_an_interrupted_capture_removes_its_hosts(tmp_path: Path, signum: int) -> None:
    output = tmp_path / "cut.tfgbtrace"
    # No compute calibration: timed before the job starts, it is no part of what an interrupt
    # does to the hosts, and nothing here reads it.
    flags = "--model tiny --setup tf2-ps --ps 1 --workers 1 --steps 500 --batch-size 4"
    flags += " --no-calibrate"
    # Not quiet: the progress lines on stderr say when the first step is done.
    capture = subprocess.Popen(
        [CLI, "capture", *flags.split(), "-o", str(output), "--network", "1gbit"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    training = threading.Event()

    def read_stderr() -> None:
        assert capture.stderr is not None
        for line in capture.stderr:
            lines.append(line)
            if re.search(r": [1-9][0-9]*(/[0-9]+)? step markers", line):
                training.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        # Into the training (a loaded machine takes minutes to get there), hosts up.
        assert training.wait(timeout=600), "".join(lines)
        assert namespaces_made_by(capture.pid)
        capture.send_signal(signum)
        capture.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait()
    stderr = "".join(lines)
    assert capture.returncode != 0
    assert namespaces_made_by(capture.pid) == [], stderr
    assert "interrupted" in stderr and trace_files.read_trace(output).partial


@pytest.mark.skipif(
    shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv"
)
@pytest.mark.parametrize(
    ("flags", "job_command"),
    [(("capture", "--model", "tiny"), ()), (("capture-job", "--cluster", CLUSTER), ("--", "true"))],
)
def test_an_unprivileged_user_gets_one_line_and_nothing_starts(
    tmp_path: Path, flags: tuple[str, ...], job_command: tuple[str, ...]
) -> None:
    output = tmp_path / "never.tfgbtrace"
    tmp_path.chmod(0o777)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    result = subprocess.run(
        [*nobody, CLI, *flags, "--network", "1gbit", "-q", "-o", str(output), *job_command],
        env=environment_without_coverage(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 5, result.stderr
    assert result.stderr.count("\n") == 1 and "--network needs root" in result.stderr
    assert not output.exists()
