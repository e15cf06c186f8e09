"""Capturing training scripts this tool did not write (tests/data/user_train_*.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.cluster import read_cluster
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.host import cpu_model
from tf_grpc_bench.profiler.assembly.steps import MOVED_NO_VARIABLES, WARMUP_STEP
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.profiler.launch.user_job import (
    DEFAULT_STEP_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    UserJob,
    task_tf_config,
)
from tf_grpc_bench.profiler.physics import check_physics
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.trace import RECV_BUF, RECV_TENSOR, ROUND, WORKER_STEP, Trace

CLI = str(Path(sys.executable).parent / "tf-grpc-bench")
SCRIPT = Path(__file__).parent / "data" / "user_train_ps.py"
MWMS_SCRIPT = Path(__file__).parent / "data" / "user_train_mwms.py"


def test_each_task_sees_its_own_address_and_every_peers_proxy() -> None:
    cluster = {"ps": ("localhost:2222",), "worker": ("localhost:2223", "localhost:2224")}
    proxies = {("ps", 0): "127.0.0.1:9000", ("worker", 0): "127.0.0.1:9001"}
    proxies[("worker", 1)] = "127.0.0.1:9002"
    config = task_tf_config(cluster, proxies, "worker", 1)
    assert config == {
        "cluster": {
            "ps": ["127.0.0.1:9000"],
            "worker": ["127.0.0.1:9001", "localhost:2224"],
        },
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc",
    }


def test_clusters_are_read_from_json_tf_config_or_a_file(tmp_path: Path) -> None:
    plain = {"ps": ["localhost:1"], "worker": ["localhost:2"]}
    read = read_cluster(json.dumps(plain), jobs=None)
    assert read == {"ps": ("localhost:1",), "worker": ("localhost:2",)}
    assert list(read) == ["ps", "worker"]  # the document's order, for {cluster}
    document = {"cluster": plain, "task": {"type": "ps", "index": 0}}
    (tmp_path / "tf_config.json").write_text(json.dumps(document))
    assert read_cluster(f"@{tmp_path / 'tf_config.json'}", jobs=None) == read
    assert read_cluster(str(tmp_path / "tf_config.json"), jobs=None) == read
    # A user's own script may name its jobs as it likes (TF1's "master").
    assert read_cluster('{"master": ["h:1"]}', jobs=None) == {"master": ("h:1",)}
    for bad, message in [
        ("not json", "not JSON"),
        ('{"ps": "localhost:1"}', r"cluster\.ps: expected a non-empty list"),
        ('{"ps": ["localhost"]}', r"cluster\.ps\[0\]: expected 'host:port'"),
        (f"@{tmp_path / 'missing.json'}", "not JSON, nor a readable file"),
    ]:
        with pytest.raises(ConfigError, match=message):
            read_cluster(bad, jobs=None)


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"ps": ("localhost",)}, "expected 'host:port'"),
        ({"ps": ("localhost:1", "localhost:1")}, "listed twice"),
        ({"ps": ()}, "no tasks"),
        ({"worker": tuple(f"localhost:{2000 + i}" for i in range(40))}, "too many"),
    ],
)
def test_impossible_clusters_are_refused(cluster: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        UserJob(cluster=cluster, command=("python", "train.py"))


def test_a_busy_port_is_a_one_line_error(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    with socket.create_server(("0.0.0.0", port)):
        result = subprocess.run(
            [
                CLI,
                "capture-job",
                "--cluster",
                json.dumps({"ps": [f"localhost:{port}"]}),
                "--output",
                str(tmp_path / "t.tfgbtrace"),
                "--no-calibrate",
                "--",
                sys.executable,
                "-c",
                "pass",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and f"port {port}" in result.stderr
    assert "partial trace written" in result.stderr
    trace = trace_files.read_trace(tmp_path / "t.tfgbtrace")
    assert trace.partial and trace.steps == ()


def test_tasks_on_another_machine_are_refused(tmp_path: Path) -> None:
    cluster = {"ps": ["192.0.2.10:2222"]}  # TEST-NET-1: never an address of this machine
    result = subprocess.run(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "--output",
         str(tmp_path / "t.tfgbtrace"), "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not an address of this machine" in result.stderr


@pytest.mark.usefixtures("temporary_files_here")
def test_a_failing_task_stops_the_job_and_leaves_a_partial_trace(tmp_path: Path) -> None:
    ports = free_ports(2)
    cluster = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    script = (
        "import json, os, sys, time\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "if task['type'] == 'worker':\n"
        "    sys.stderr.write('worker gives up\\n'); sys.exit(3)\n"
        "time.sleep(600)\n"
    )
    output = tmp_path / "t.tfgbtrace"
    result = subprocess.run(
        [
            CLI,
            "capture-job",
            "--cluster",
            json.dumps(cluster),
            "--output",
            str(output),
            "--quiet",
            "--no-calibrate",
            "--",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 4
    line = result.stderr.strip()
    assert "\n" not in line and "worker:0 exited with 3" in line and "worker gives up" in line
    trace = trace_files.read_trace(output)
    assert trace.partial and "worker:0" in trace.partial_reason


#: A job of two plain Python tasks: the ps listens on its cluster port; the worker
#: connects and, with TALK=1, sends a few bytes every 0.1 s forever, else nothing.
_QUIET_OR_TALKING_JOB = """
import json, os, socket, time
config = json.loads(os.environ["TF_CONFIG"])
me = config["task"]
ps_host, ps_port = config["cluster"]["ps"][0].rsplit(":", 1)
if me["type"] == "ps":
    server = socket.create_server(("127.0.0.1", int(ps_port)))
    peer, _ = server.accept()
    while peer.recv(65536):
        pass
    time.sleep(600)
else:
    time.sleep(0.5)
    connection = socket.create_connection(("127.0.0.1", int(ps_port)))
    while os.environ.get("TALK") == "1":
        connection.sendall(b"x" * 100)
        time.sleep(0.1)
    time.sleep(600)
"""


def _run_job(
    tmp_path: Path, *flags: str, talk: bool = False, quiet: bool = True
) -> tuple[subprocess.CompletedProcess[str], Path]:
    ports = free_ports(2)
    cluster = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    output = tmp_path / "t.tfgbtrace"
    # Not timed (--no-calibrate): a loaded machine's calibration would take minutes here.
    command = [
        CLI, "capture-job", "--cluster", json.dumps(cluster), "-o", str(output), "--no-calibrate",
        *flags,
    ]  # fmt: skip
    result = subprocess.run(
        [*command, *(["-q"] if quiet else []), "--", sys.executable, "-c", _QUIET_OR_TALKING_JOB],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "TALK": "1" if talk else "0"},
    )
    return result, output


def test_a_job_whose_tasks_exchange_nothing_counts_as_hung(tmp_path: Path) -> None:
    """No step markers and no traffic for --step-timeout: the job is stopped, exit 4;
    the progress lines never claim steps the job did not mark."""
    result, output = _run_job(tmp_path, "--step-timeout", "3", quiet=False)
    assert result.returncode == 4, result.stderr
    progress, _, error = result.stderr.strip().rpartition("\n")
    assert "looks hung" in error and "--step-timeout" in error and "worker:0" in error
    assert "partial trace written" in error
    assert progress and all("no step markers" in line for line in progress.splitlines())
    assert re.search(r"\d+(/\d+)? steps", progress) is None  # no step count it cannot know
    assert "0 steady steps (worker-steps, from step-id)" in result.stdout
    trace = trace_files.read_trace(output)
    assert trace.partial and "looks hung" in trace.partial_reason


@pytest.mark.usefixtures("temporary_files_here")
def test_a_job_whose_tasks_keep_talking_ends_at_its_timeout(tmp_path: Path) -> None:
    """Traffic between the tasks keeps a job alive past --step-timeout (the recorder
    sees it), and --timeout still ends it."""
    # Margins a loaded machine keeps: the talk starts well within --step-timeout.
    result, output = _run_job(tmp_path, "--step-timeout", "5", "--timeout", "12", talk=True)
    assert result.returncode == 4, result.stderr
    assert "did not finish within 12 s" in result.stderr and "hung" not in result.stderr
    assert trace_files.read_trace(output).partial


@pytest.mark.tensorflow
@pytest.mark.usefixtures("temporary_files_here")
def test_a_multi_worker_job_whose_second_worker_never_starts_counts_as_hung(
    tmp_path: Path,
) -> None:
    """Worker 0 waits for a worker 1 that never comes, calling only itself meanwhile:
    that is no progress, so --step-timeout stops the job, not --timeout."""
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    output = tmp_path / "mwms.tfgbtrace"
    only_worker_0 = (
        "import json, os, runpy, sys, time\n"
        "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
        "    time.sleep(600)\n"
        f"sys.argv = [{str(MWMS_SCRIPT)!r}, '--steps', '6']\n"
        f"runpy.run_path({str(MWMS_SCRIPT)!r}, run_name='__main__')\n"
    )
    result = subprocess.run(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "--output", str(output),
         "--step-timeout", "20", "--timeout", "600", "--quiet", "--no-calibrate", "--",
         sys.executable, "-c", only_worker_0],
        capture_output=True, text=True, timeout=700, check=False,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert "looks hung" in result.stderr and "did not finish within" not in result.stderr
    trace = trace_files.read_trace(output)
    assert trace.partial and "looks hung" in trace.partial_reason


def test_capture_job_has_a_finite_default_timeout() -> None:
    job = UserJob(cluster={"ps": ("localhost:1",)}, command=("true",))
    assert job.timeout_s == DEFAULT_TIMEOUT_S and job.step_timeout_s == DEFAULT_STEP_TIMEOUT_S
    help_text = subprocess.run(
        [CLI, "capture-job", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert f"(default {DEFAULT_TIMEOUT_S:g})" in help_text and "--step-timeout" in help_text


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_capture_job_exits_128_plus_the_signal_with_a_partial_trace(
    tmp_path: Path, signum: int
) -> None:
    ports = free_ports(2)
    cluster = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    output = tmp_path / "t.tfgbtrace"
    capture = subprocess.Popen(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "-o", str(output), "-q",
         "--no-calibrate", "--workdir", str(tmp_path / "work"), "--",
         sys.executable, "-c", _QUIET_OR_TALKING_JOB],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TALK": "1"},
    )  # fmt: skip
    try:
        logs = [tmp_path / "work" / f"{name}.stderr" for name in ("ps-0", "worker-0")]
        deadline = time.monotonic() + 120
        while not all(log.exists() for log in logs) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # the tasks run
        capture.send_signal(signum)
        _, stderr = capture.communicate(timeout=120)
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait()
    assert capture.returncode == 128 + signum, stderr
    line = stderr.strip()
    assert "\n" not in line and "interrupted" in line and "partial trace written" in line
    trace = trace_files.read_trace(output)
    assert trace.partial and "interrupted" in trace.partial_reason


@pytest.mark.tensorflow
@pytest.mark.parametrize("recorder", ["preload", "proxy"])
def test_a_users_own_parameter_server_script_is_captured(tmp_path: Path, recorder: str) -> None:
    ports = free_ports(4)
    cluster = {
        "chief": [f"localhost:{ports[0]}"],
        "ps": [f"localhost:{ports[1]}"],
        "worker": [f"localhost:{ports[2]}", f"localhost:{ports[3]}"],
    }
    output = tmp_path / "user.tfgbtrace"
    variables_file = tmp_path / "variables.json"
    result = subprocess.run(
        [
            CLI,
            "capture-job",
            "--cluster",
            json.dumps(cluster),
            "--output",
            str(output),
            "--model",
            "user-mlp",
            "--timeout",
            "300",
            "--recorder",
            recorder,
            "--",
            sys.executable,
            str(SCRIPT),
            "--rounds",
            "4",
            "--variables",
            str(variables_file),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    trace = trace_files.read_trace(output)
    assert not trace.partial
    extra = dict(trace.metadata.extra)
    assert (trace.step_detection.source, trace.step_unit) == ("step-id", WORKER_STEP)
    assert extra["unattributed_calls"] == "0"
    assert extra["cpu_model"] == cpu_model() and int(extra["cpus"]) >= 1
    assert trace.metadata.model == "user-mlp" and trace.metadata.command[1] == "capture-job"
    # A job whose model is none of models/ is calibrated on the reference workload, in as
    # many processes at once as it has workers.
    assert extra["calibration_workload"] == "resnet50 32x32 batch 4 keras, 2 processes at once"
    assert int(extra["calibration_step_ns"]) > 0
    assert (
        trace.metadata.capture_method
        == {
            "preload": "in-process-recorder",
            "proxy": "recording-proxy",
        }[recorder]
    )
    # 4 rounds of 2 workers = 8 worker-steps, the first kept as start-up.
    assert len(trace.steps) == 7
    variables = [dict(v, trainable=True) for v in json.loads(variables_file.read_text())]
    report = check_physics(trace, {"variables": variables})
    assert report.ok, report.format()
    workers = set(trace.tasks_of_job("worker"))
    for step in trace.steps:
        pullers = {
            r.caller_task for r in step.rpcs if r.method == RECV_TENSOR and r.caller_task in workers
        }
        assert len(pullers) == 1  # one worker-step: one worker pulls its weights


@pytest.mark.tensorflow
def test_a_users_own_multi_worker_mirrored_script_gets_its_steps_from_collectives(
    tmp_path: Path,
) -> None:
    """No markers and step id 0 on every RecvBuf: the steps are the periods of the
    collectives' instance keys."""
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    output = tmp_path / "mwms.tfgbtrace"
    # Not timed (--no-calibrate): test_a_users_own_parameter_server_script_is_captured checks
    # capture-job's calibration, and a loaded machine's would take minutes here.
    result = subprocess.run(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "--output", str(output),
         "--timeout", "300", "--no-calibrate", "--", sys.executable, str(MWMS_SCRIPT),
         "--steps", "6"],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    trace = trace_files.read_trace(output)
    assert not trace.partial
    assert (trace.step_detection.source, trace.step_unit) == ("collective-instance", ROUND)
    assert len(trace.steps) == 5  # 6 steps, the first kept as start-up
    per_step = [
        Counter(
            (r.caller_task, r.callee_task, r.response_bytes)
            for r in step.rpcs
            if r.method == RECV_BUF
        )
        for step in trace.steps
    ]
    # Each step: the same all-reduce, both workers sending to each other.
    assert per_step[0] and all(counts == per_step[0] for counts in per_step), per_step
    assert {caller for caller, _, _ in per_step[0]} == {0, 1}
    # The initial broadcasts of the variables are start-up.
    assert any(r.method == RECV_BUF for r in trace.startup.rpcs)


TF1_SCRIPT = Path(__file__).parent / "data" / "user_train_tf1.py"


def _capture_tf1(
    tmp_path: Path, *script_flags: str
) -> tuple[subprocess.CompletedProcess[str], Trace, list[dict]]:
    """capture-job of the TF1 MonitoredTrainingSession script, 1 ps and 2 workers, no
    markers; the trace and each worker's report (training runs, variables)."""
    ports = free_ports(3)
    cluster = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{p}" for p in ports[1:]]}
    output, reports = tmp_path / "tf1.tfgbtrace", tmp_path / "reports"
    reports.mkdir()
    # Not timed (--no-calibrate), as the MWMS script's capture above.
    result = subprocess.run(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "--output", str(output),
         "--timeout", "300", "--no-calibrate", "--", sys.executable, str(TF1_SCRIPT),
         "--report", str(reports),
         *script_flags],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = [json.loads(path.read_text()) for path in sorted(reports.glob("worker-*.json"))]
    return result, trace_files.read_trace(output), found


def _variable_bytes(report: dict, *, trainable: bool) -> int:
    total = 0
    for variable in report["variables"]:
        if variable["trainable"] == trainable:
            count = 1
            for dim in variable["shape"]:
                count *= dim
            total += 4 * count
    return total


#: A capture of the TF1 script: what capture-job said, the trace, the workers' reports and
#: the trace's file.
Tf1Capture = tuple[subprocess.CompletedProcess[str], Trace, list[dict], Path]


@pytest.fixture(scope="module")
def tf1_async(tmp_path_factory: pytest.TempPathFactory) -> Tf1Capture:
    """The TF1 script's asynchronous job, 4 training runs per worker, captured once for the
    two tests that read it."""
    folder = tmp_path_factory.mktemp("tf1-async")
    return (*_capture_tf1(folder, "--local-steps", "4"), folder / "tf1.tfgbtrace")


@pytest.mark.tensorflow
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_tf1_monitored_session_script_without_markers_gives_only_training_steps(
    tmp_path: Path, sync: bool, request: pytest.FixtureRequest
) -> None:
    """However many session-start runs the workers make, the steps are the training
    runs: each one worker's, each 2 x parameters x 4 B plus the statistics' updates.
    Asynchronous: the job the replay test below reads (4 runs a worker); synchronous: 10
    global steps, ended by TensorFlow's StopAtStepHook."""
    if sync:
        result, trace, reports = _capture_tf1(tmp_path, "--steps", "10", "--sync")
    else:
        result, trace, reports, _ = request.getfixturevalue("tf1_async")
    assert not trace.partial
    runs = sum(report["train_runs"] for report in reports)
    assert len(trace.steps) == runs - 1  # the first training run is warm-up
    detection = trace.step_detection
    assert (detection.source, detection.unit) == ("step-id", WORKER_STEP)
    aside = {(item.phase, item.reason): item for item in detection.set_aside}
    assert aside[("startup", MOVED_NO_VARIABLES)].runs >= 2  # readiness checks, at least
    assert aside[("startup", WARMUP_STEP)].runs == 1
    expected = 2 * _variable_bytes(reports[0], trainable=True)
    expected += _variable_bytes(reports[0], trainable=False)  # moving statistics, pushed
    workers = set(trace.tasks_of_job("worker"))
    for step in trace.steps:
        moved = sum(r.tensor.content_bytes for r in step.rpcs if r.tensor is not None)
        assert abs(moved - expected) <= 0.005 * expected, (step.index, moved, expected)
        owners = {r.caller_task for r in step.rpcs if r.caller_task in workers}
        assert len(owners) == 1  # one worker-step
        graphs = [r for r in step.rpcs if r.short_method == "RunGraph"]
        assert len(graphs) == 1 and graphs[0].caller_task in owners  # found by its step id
        assert not any(r.short_method == "RegisterGraph" for r in step.rpcs)
    assert f"{len(trace.steps)} steady steps (worker-steps, from step-id)" in result.stdout
    assert re.search(r"\d+(/\d+)? steps", result.stderr) is None  # no marker counts


@pytest.mark.tensorflow
def test_an_asynchronous_tf1_trace_replays_one_pass_exactly(
    tmp_path: Path, tf1_async: Tf1Capture
) -> None:
    """Both workers train 4 runs each; ps-throughput --passes 1 moves the trace's RPCs and
    bytes, every worker its own steps once."""
    _, trace, _, trace_path = tf1_async
    owners = [
        {r.caller_task for r in s.rpcs if r.caller_task in trace.tasks_of_job("worker")}
        for s in trace.steps
    ]
    assert len(trace.steps) == 7 and {w for o in owners for w in o} == {1, 2}
    result = subprocess.run(
        [CLI, "replay", str(trace_path), "--benchmark", "ps-throughput",
         "--passes", "1", "--runs", "1", "--warmup", "0", "--output-dir", str(tmp_path / "out"),
         "--quiet"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (path,) = (tmp_path / "out").glob("*/results.json")
    (benchmark,) = read_document(path).benchmarks
    (run,) = benchmark.runs
    rpcs = [r for step in trace.steps for r in step.rpcs]
    assert run.rpc_count == len(rpcs) == run.server_received_messages
    assert sum(s.request_bytes + s.response_bytes for s in run.samples) == sum(
        r.request_bytes + r.response_bytes for r in rpcs
    )
    ps = set(trace.tasks_of_job("ps"))
    # What the workers sent: their own requests, and the tensors the ps pulled from them.
    sent = sum(r.response_bytes if r.caller_task in ps else r.request_bytes for r in rpcs)
    assert run.server_received_bytes == sent
    worker_of = {task: n for n, task in enumerate(sorted({w for o in owners for w in o}))}
    assert {(s.worker_index, s.step) for s in run.samples} == {
        (worker_of[w], index) for index, o in enumerate(owners) for w in o
    }
