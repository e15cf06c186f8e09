"""Capturing a job launched elsewhere: ``record`` on every task, ``assemble`` of their folders,
task identity and placeholders, and clock offsets from the wire."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files, trace_summary
from tf_grpc_bench.cluster import split_address
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.profiler import record as record_module
from tf_grpc_bench.profiler.assemble import assemble_records
from tf_grpc_bench.profiler.assembly.clocks import (
    REFERENCE,
    SHARED_CLOCK,
    WIRE,
    ClockError,
    Precedence,
    estimate_offsets,
)
from tf_grpc_bench.profiler.assembly.phases import assemble_trace
from tf_grpc_bench.profiler.assembly.variables import derive_variables, encode_keys, parameter_count
from tf_grpc_bench.profiler.launch.hosts import NetworkRequest, emulated_hosts
from tf_grpc_bench.profiler.launch.identity import (
    TaskIdentity,
    expand_placeholders,
    identify_task,
)
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.profiler.launch.user_job import UserJob
from tf_grpc_bench.profiler.physics import check_physics, decode_variables
from tf_grpc_bench.profiler.record import STOP_GRACE_S, read_task_record
from tf_grpc_bench.profiler.recorders.wiretap import TapRecorder
from tf_grpc_bench.trace import (
    RECV_BUF,
    RECV_TENSOR,
    Rpc,
    RunMetadata,
    Step,
    Task,
    TensorInfo,
    Trace,
)

CLI = str(Path(sys.executable).parent / "tf-grpc-bench")
SCRIPT = Path(__file__).parent / "data" / "user_train_ps.py"
FLAGS_SCRIPT = Path(__file__).parent / "data" / "user_train_ps_flags.py"
CLUSTER = {"ps": ("h0:2222",), "worker": ("h1:2223", "h2:2224")}


# --------------------------------------------------------------------------
# Task identity and placeholders.


def test_the_task_comes_from_tf_config_first() -> None:
    tf_config = {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}}
    task = identify_task({"TF_CONFIG": json.dumps(tf_config)})
    assert (task.job, task.index, task.address, task.port) == ("worker", 1, "h2:2224", 2224)
    assert task.cluster == CLUSTER and task.source == "TF_CONFIG"
    # Flags that agree are fine; flags that disagree are a one-line error.
    assert identify_task({"TF_CONFIG": json.dumps(tf_config)}, job="worker", index=1) == task
    with pytest.raises(
        ConfigError, match=r"^TF_CONFIG names task worker:1 but --job/--task say ps:1$"
    ):
        identify_task({"TF_CONFIG": json.dumps(tf_config)}, job="ps")
    with pytest.raises(ConfigError, match=r"^TF_CONFIG's cluster differs from --cluster"):
        identify_task({"TF_CONFIG": json.dumps(tf_config)}, cluster='{"ps": ["h0:2222"]}')
    assert identify_task({"TF_CONFIG": json.dumps(tf_config)}, cluster=json.dumps(CLUSTER)) == task


def test_without_tf_config_the_task_comes_from_the_flags() -> None:
    task = identify_task({}, job="ps", index=0, cluster=json.dumps(CLUSTER))
    assert (task.name, task.port, task.source) == ("ps:0", 2222, "flags")
    with pytest.raises(
        ConfigError, match=r"^which task is this\? TF_CONFIG is not set; give --job"
    ):
        identify_task({}, job="ps", index=0)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"TF_CONFIG": "{"}, r"^TF_CONFIG: not valid JSON"),
        ({"TF_CONFIG": '{"cluster": {"ps": ["h:1"]}}'}, r'^TF_CONFIG: expected a "task"'),
        (
            {"TF_CONFIG": '{"cluster": {"ps": ["h:1"]}, "task": {"type": "ps", "index": "a"}}'},
            r"^TF_CONFIG: task\.index: expected an integer >= 0, got 'a'$",
        ),
        (
            {"TF_CONFIG": '{"cluster": {"ps": ["h:1"]}, "task": {"type": "ps", "index": 1}}'},
            r"^TF_CONFIG: task index 1 is out of range: job 'ps' has 1 task$",
        ),
        (
            {"TF_CONFIG": '{"cluster": {"ps": ["h:1"]}, "task": {"type": "chief", "index": 0}}'},
            r"^TF_CONFIG: job 'chief' is not in the cluster \(jobs: ps\)$",
        ),
        (
            {"TF_CONFIG": '{"task": {"type": "ps", "index": 0}}'},
            r'^TF_CONFIG: expected a "cluster"',
        ),
    ],
)
def test_a_bad_tf_config_is_one_line_naming_it(environment: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        identify_task(environment)


def test_placeholders_become_the_tasks_job_index_cluster_and_port() -> None:
    task = TaskIdentity(job="worker", index=1, cluster=CLUSTER)
    command = ["train", "--job", "{job}", "--task={task}", "--cluster", "{cluster}", "-p{port}"]
    assert expand_placeholders(command, task) == (
        "train",
        "--job",
        "worker",
        "--task=1",
        "--cluster",
        '{"ps":["h0:2222"],"worker":["h1:2223","h2:2224"]}',
        "-p2224",
    )
    # Other braces, JSON among them, stay as written.
    assert expand_placeholders(['{"a": 1}', "{jobs}", "{{job}}"], task) == (
        '{"a": 1}',
        "{jobs}",
        "{worker}",
    )


# --------------------------------------------------------------------------
# Clock offsets from the wire.


def _call(caller: str, callee: str, sent_ref: int, answered_ref: int, truth: Mapping[str, int]):
    """A call whose request left at ``sent_ref`` and whose response began at ``answered_ref``
    (reference ns), each time read on its own task's clock (own = reference - offset)."""
    return Precedence(
        before=caller,
        before_ns=sent_ref - truth[caller],
        after=callee,
        after_ns=answered_ref - truth[callee],
    )


TRUTH = {"a": 0, "b": 1000, "c": -500}


def test_offsets_are_bounded_by_calls_both_ways_and_chain_through_tasks() -> None:
    calls = [
        _call("a", "b", 10_000, 10_300, TRUTH),  # o[b] >= 700
        _call("b", "a", 20_000, 20_200, TRUTH),  # o[b] <= 1200
        _call("b", "c", 30_000, 30_100, TRUTH),  # o[c] >= o[b] - 1600
        _call("c", "b", 40_000, 40_050, TRUTH),  # o[c] <= o[b] - 1450
    ]
    found = estimate_offsets(["a", "b", "c"], calls, reference="a")
    assert found["a"].offset_ns == 0 and found["a"].source == REFERENCE
    b, c = found["b"], found["c"]
    assert (b.lower_ns, b.upper_ns, b.offset_ns, b.uncertainty_ns) == (700, 1200, 950, 250)
    assert (c.lower_ns, c.upper_ns, c.offset_ns, c.uncertainty_ns) == (-900, -250, -575, 325)
    assert (b.source, c.source, b.constraints, c.constraints) == (WIRE, WIRE, 4, 2)
    for estimate in found.values():
        assert estimate.lower_ns is not None and estimate.upper_ns is not None
        assert estimate.lower_ns <= TRUTH[estimate.task] <= estimate.upper_ns


def test_calls_one_way_only_bound_one_side() -> None:
    found = estimate_offsets(["a", "b"], [_call("a", "b", 10_000, 10_300, TRUTH)], reference="a")
    assert (found["b"].lower_ns, found["b"].upper_ns, found["b"].offset_ns) == (700, None, 700)
    assert found["b"].uncertainty_ns is None and not found["b"].bounded


def test_tasks_sharing_a_clock_share_its_offset() -> None:
    truth = {"a": 0, "b": 1000, "c": 1000}
    calls = [_call("a", "b", 10_000, 10_300, truth), _call("c", "a", 20_000, 20_200, truth)]
    found = estimate_offsets(["a", "b", "c"], calls, reference="a", shared_clocks=[["b", "c"]])
    assert (found["b"].lower_ns, found["b"].upper_ns) == (700, 1200)
    assert found["c"].lower_ns == 700 and found["c"].upper_ns == 1200
    same = estimate_offsets(["a", "b"], [], reference="a", shared_clocks=[["a", "b"]])
    assert (same["b"].offset_ns, same["b"].uncertainty_ns, same["b"].source) == (0, 0, SHARED_CLOCK)


def test_records_that_contradict_each_other_are_refused() -> None:
    calls = [
        Precedence(before="a", before_ns=100, after="b", after_ns=0),  # o[b] >= 100
        Precedence(before="b", before_ns=100, after="a", after_ns=50),  # o[b] <= -50
    ]
    with pytest.raises(ClockError, match="clocks contradict each other"):
        estimate_offsets(["a", "b"], calls, reference="a")


# --------------------------------------------------------------------------
# What a trace knows without the user's help: the variables.


def _pull(caller: int, callee: int, dtype: str, shape: tuple[int, ...], size: int) -> Rpc:
    tensor = TensorInfo(rendezvous_key="k", dtype=dtype, shape=shape, content_bytes=size)
    return Rpc(
        method=RECV_TENSOR, caller_task=caller, callee_task=callee, request_bytes=50,
        response_bytes=size + 30, tensor=tensor,
    )  # fmt: skip


def test_the_variables_are_what_a_worker_step_pulled_from_ps_and_pushed_back() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0), Task(job="worker", index=1))
    step = (
        _pull(1, 0, "float32", (3, 4), 48),  # weights down
        _pull(1, 0, "float32", (4,), 16),
        _pull(1, 0, "float32", (4,), 16),  # the same shape twice: two variables
        _pull(1, 0, "float32", (9,), 36),  # read, never updated: not a variable here
        _pull(1, 0, "int64", (), 8),  # the optimizer's step counter, both ways: no gradient
        _pull(0, 1, "int64", (), 8),
        _pull(0, 1, "float32", (4,), 16),  # gradients up
        _pull(0, 1, "float32", (3, 4), 48),
        _pull(0, 1, "float32", (4,), 16),
        _pull(0, 1, "float32", (0,), 0),  # a control edge
    )
    partial = (_pull(2, 0, "float32", (3, 4), 48), _pull(0, 2, "float32", (3, 4), 48))
    steps = [
        Step(index=0, start_ns=0, end_ns=1, rpcs=partial),
        Step(index=1, start_ns=1, end_ns=2, rpcs=step),
    ]
    assert derive_variables(steps, tasks) == [
        ("float32", (3, 4)), ("float32", (4,)), ("float32", (4,)),
    ]  # fmt: skip
    assert derive_variables(steps[:1], tasks) == [("float32", (3, 4))]
    assert derive_variables([], tasks) == []


def test_the_variables_are_counted_by_their_own_dtype_and_only_from_tensor_pulls() -> None:
    tasks = (Task(job="worker", index=0), Task(job="ps", index=0), Task(job="worker", index=1))
    recv_buf_tensor = TensorInfo(rendezvous_key="k", dtype="float64", shape=(7,), content_bytes=56)
    step = (
        _pull(0, 1, "float32_ref", (5,), 20),  # a reference variable's weights down
        _pull(1, 0, "float32", (5,), 20),  # its gradient up, without the suffix
        _pull(0, 1, "float64", (7,), 56),  # back as a RecvBuf, which is no RecvTensor pull
        Rpc(
            method=RECV_BUF,
            caller_task=1,
            callee_task=0,
            request_bytes=50,
            response_bytes=38,
            tensor=recv_buf_tensor,
        ),
        _pull(0, 1, "float32", (3,), 12),  # back as a call whose tensor was not decoded
        Rpc(method=RECV_TENSOR, caller_task=1, callee_task=0, request_bytes=50, response_bytes=9),
        _pull(0, 2, "float32", (2,), 8),  # between workers: no ps involved
        _pull(2, 0, "float32", (2,), 8),
        _pull(0, 1, "bfloat16", (6,), 12),
        _pull(0, 1, "bfloat16", (6,), 12),  # pulled twice, pushed back once: one variable
        _pull(1, 0, "bfloat16", (6,), 12),
        _pull(0, 1, "float32", (0,), 0),  # an empty tensor both ways: a control edge
        _pull(1, 0, "float32", (0,), 0),
    )
    found = derive_variables([Step(index=0, start_ns=0, end_ns=1, rpcs=step)], tasks)
    assert found == [("float32", (5,)), ("bfloat16", (6,))]


def test_a_variable_is_pulled_and_pushed_back_by_the_same_worker() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0), Task(job="worker", index=1))
    step = (
        _pull(1, 0, "float16", (11,), 22),  # worker 0 pulls it; the ps pushes it to worker 1
        _pull(0, 2, "float16", (11,), 22),
        _pull(2, 0, "float64", (9,), 72),  # worker 1 pulls it; the ps pushes it to worker 0
        _pull(0, 1, "float64", (9,), 72),
        _pull(1, 0, "float32", (2,), 8),  # worker 0's own variable
        _pull(0, 1, "float32", (2,), 8),
    )
    found = derive_variables([Step(index=0, start_ns=0, end_ns=1, rpcs=step)], tasks)
    assert found == [("float32", (2,))]


def test_of_steps_moving_as_many_variable_bytes_the_first_is_kept() -> None:
    tasks = (Task(job="ps", index=0), Task(job="worker", index=0))
    first = (_pull(1, 0, "float32", (4,), 16), _pull(0, 1, "float32", (4,), 16))
    same_bytes = (_pull(1, 0, "float16", (8,), 16), _pull(0, 1, "float16", (8,), 16))
    more = (_pull(1, 0, "float64", (3,), 24), _pull(0, 1, "float64", (3,), 24))
    steps = [
        Step(index=index, start_ns=index, end_ns=index + 1, rpcs=rpcs)
        for index, rpcs in enumerate((first, same_bytes))
    ]
    assert derive_variables(steps, tasks) == [("float32", (4,))]
    steps.append(Step(index=2, start_ns=2, end_ns=3, rpcs=more))
    assert derive_variables(steps, tasks) == [("float64", (3,))]


def test_variables_are_written_as_dtype_and_shape_and_counted_element_by_element() -> None:
    keys = [("float32", (3, 4)), ("float16", ()), ("float64", (5,)), ("float32", (2, 0, 7))]
    assert encode_keys(keys) == "float32:3x4;float16:;float64:5;float32:2x0x7"
    assert encode_keys([]) == ""
    # 12 + 1 (a scalar) + 5 + 0.
    assert parameter_count(keys) == 18
    assert parameter_count([]) == 0
    assert parameter_count([("float32", (10, 10, 3))]) == 300


# --------------------------------------------------------------------------
# record and assemble, as a launcher runs them.


def _tf_config(cluster: Mapping[str, Sequence[str]], job: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


def _record(out: Path, cluster: Mapping[str, Sequence[str]], job: str, index: int, *command: str):
    environment = dict(os.environ, TF_CONFIG=_tf_config(cluster, job, index))
    return subprocess.run(
        [CLI, "record", "--out", str(out), "--", *command],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_record_runs_the_command_as_its_task_and_passes_its_exit_status(tmp_path: Path) -> None:
    cluster = {"ps": ["localhost:2222"], "worker": ["localhost:2223"]}
    seen = tmp_path / "seen"
    result = _record(
        tmp_path / "out", cluster, "worker", 0,
        "sh", "-c", f"echo {{job}} {{task}} {{port}} '{{cluster}}' > {seen}; exit 3",
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert seen.read_text().split() == [
        "worker", "0", "2223", '{"ps":["localhost:2222"],"worker":["localhost:2223"]}',
    ]  # fmt: skip
    record = read_task_record(tmp_path / "out" / "worker-0")
    assert (record.name, record.exit_status, record.cluster["ps"]) == (
        "worker:0",
        3,
        ("localhost:2222",),
    )
    assert record.command[:2] == ("sh", "-c") and "worker 0 2223" in record.command[2]
    assert record.end is not None and record.end.monotonic_ns >= record.start.monotonic_ns
    assert record.end.wall_ns >= record.start.wall_ns and record.boot_id and record.pid > 0
    # The same task again into the same folder: refused, nothing run.
    again = _record(tmp_path / "out", cluster, "worker", 0, "sh", "-c", f"rm {seen}")
    assert again.returncode == 4 and seen.exists()
    assert (
        again.stderr.count("\n") == 1
        and "already holds the record of task worker:0" in again.stderr
    )


def test_record_without_a_task_is_one_line_and_runs_nothing(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    result = subprocess.run(
        [CLI, "record", "--out", str(tmp_path), "--", "touch", str(tmp_path / "ran")],
        env=environment, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "TF_CONFIG is not set; give --job, --task and --cluster" in result.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_reaches_the_command_and_record_exits_with_its_status(
    tmp_path: Path, signum: int
) -> None:
    cluster = {"ps": ["localhost:2222"]}
    out = tmp_path / "out"
    environment = dict(os.environ, TF_CONFIG=_tf_config(cluster, "ps", 0))
    record = subprocess.Popen(
        [CLI, "record", "--out", str(out), "--", "sleep", "300"],
        env=environment,
        stderr=subprocess.PIPE,
        text=True,
    )
    manifest = out / "ps-0" / "manifest.json"
    deadline = time.monotonic() + 60
    while not (manifest.exists() and read_task_record(out / "ps-0").pid):
        assert time.monotonic() < deadline and record.poll() is None
        time.sleep(0.05)
    child = read_task_record(out / "ps-0").pid
    assert _alive(child)
    record.send_signal(signum)
    assert record.wait(timeout=30) == 128 + signum
    assert not _alive(child)
    assert read_task_record(out / "ps-0").exit_status == 128 + signum


def test_a_stop_signal_before_the_command_started_reaches_it_once_it_has() -> None:
    """The handler is in place before the command starts (its first manifest is
    written then), so a launcher's signal in that window is kept and passed on."""
    before = signal.getsignal(signal.SIGTERM)
    with record_module._Forwarding() as forwarding:
        os.kill(os.getpid(), signal.SIGTERM)
        assert forwarding.signum == signal.SIGTERM
        process = subprocess.Popen(["sleep", "300"], start_new_session=True)
        try:
            forwarding.started(process)
            assert record_module._wait(process, forwarding) == 128 + signal.SIGTERM
        finally:
            process.kill()
            process.wait()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_signal_as_the_record_begins_ends_it_with_a_finished_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal that arrives while the first manifest is written: the command is
    not started, and the manifest still says how the task ended (128 + signal)."""
    read_clock = record_module.ClockReading.now

    def signalled_clock() -> record_module.ClockReading:
        monkeypatch.setattr(record_module.ClockReading, "now", read_clock)
        os.kill(os.getpid(), signal.SIGHUP)
        return read_clock()

    cluster = {"ps": ["localhost:2222"], "worker": ["localhost:2223"]}
    out = tmp_path / "out"
    assert _record(out, cluster, "ps", 0, "true").returncode == 0
    monkeypatch.setattr(record_module.ClockReading, "now", signalled_clock)
    ran = tmp_path / "ran"
    task = identify_task({"TF_CONFIG": _tf_config(cluster, "worker", 0)})
    status = record_module.record_task(out, ["touch", str(ran)], task, environment={})
    assert status == 128 + signal.SIGHUP and not ran.exists()
    written = read_task_record(out / "worker-0")
    assert written.exit_status == 128 + signal.SIGHUP and written.end is not None
    trace = assemble_records([out])
    assert trace.partial and "worker:0 was stopped before its command started" in (
        trace.partial_reason
    )


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    """TensorFlow's servers catch SIGTERM and keep serving: record must not wait
    for them forever (a blocking wait resumes after a signal handler returns)."""
    cluster = {"ps": ["localhost:2222"]}
    out = tmp_path / "out"
    environment = dict(os.environ, TF_CONFIG=_tf_config(cluster, "ps", 0))
    ignoring = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    record = subprocess.Popen(
        [CLI, "record", "--out", str(out), "--", sys.executable, "-c", ignoring],
        env=environment,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ((out / "ps-0" / "manifest.json").exists() and read_task_record(out / "ps-0").pid):
        assert time.monotonic() < deadline and record.poll() is None
        time.sleep(0.05)
    child = read_task_record(out / "ps-0").pid
    time.sleep(1)  # let the command set its handler
    record.send_signal(signal.SIGTERM)
    try:
        status = record.wait(timeout=STOP_GRACE_S + 50)
    finally:
        record.kill()
    assert status == 128 + signal.SIGKILL
    assert not _alive(child)
    assert read_task_record(out / "ps-0").exit_status == 128 + signal.SIGKILL


def test_assemble_refuses_missing_duplicate_and_mixed_records(tmp_path: Path) -> None:
    cluster = {"ps": ["localhost:2222"], "worker": ["localhost:2223"]}
    other = {"ps": ["localhost:3222"], "worker": ["localhost:3223"]}
    assert _record(tmp_path / "a", cluster, "ps", 0, "true").returncode == 0
    assert _record(tmp_path / "b", cluster, "ps", 0, "true").returncode == 0
    assert _record(tmp_path / "c", other, "worker", 0, "true").returncode == 0

    def assemble(*folders: str) -> str:
        result = subprocess.run(
            [CLI, "assemble", *(str(tmp_path / f) for f in folders), "-o", str(tmp_path / "t")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 4 and result.stderr.count("\n") == 1, result.stderr
        assert not (tmp_path / "t").exists()
        return result.stderr

    assert "no record of task worker:0 (the cluster has 2 tasks" in assemble("a")
    assert "task ps:0 is recorded twice" in assemble("a", "b")
    assert "are records of different jobs (their clusters differ)" in assemble("a", "c")
    assert "nowhere-made: not a directory" in assemble("nowhere-made")
    (tmp_path / "empty").mkdir()
    assert "empty: no task records in it" in assemble("empty")


# --------------------------------------------------------------------------
# A real job: every task under record, then assemble.


def _run_recorded_job(
    out: Path,
    cluster: Mapping[str, Sequence[str]],
    command: Sequence[str],
    *,
    prefixes: Mapping[str, Sequence[str]] | None = None,
    flags: bool = False,
) -> dict[str, int]:
    """Start ``record --out out/<task>`` for every task (as a launcher would: the chief
    last), wait for the chief, then SIGTERM the servers' records; their exit statuses."""
    processes = {}
    for job in sorted(cluster, key=lambda j: j == "chief"):
        for index in range(len(cluster[job])):
            name = f"{job}:{index}"
            environment = dict(os.environ)
            identity = ["--job", job, "--task", str(index), "--cluster", json.dumps(cluster)]
            if flags:
                environment.pop("TF_CONFIG", None)
            else:
                environment["TF_CONFIG"] = _tf_config(cluster, job, index)
            processes[name] = subprocess.Popen(
                [
                    *(prefixes or {}).get(name, ()),
                    CLI, "record", "--out", str(out / f"{job}{index}"),
                    *(identity if flags else ()), "--", *command,
                ],
                env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
    statuses = {}
    try:
        statuses["chief:0"] = processes["chief:0"].wait(timeout=300)
    finally:
        for name, process in processes.items():
            if name != "chief:0":
                process.send_signal(signal.SIGTERM)
        try:
            for name, process in processes.items():
                statuses[name] = process.wait(timeout=60)
        finally:
            for process in processes.values():
                process.kill()  # nothing once it has ended; else its command dies with it
                process.wait(timeout=60)
                assert process.stderr is not None
                process.stderr.close()
    return statuses


def _records_end(path: Path) -> int:
    """Where a record file's records end, by its header (``wiretap.c``)."""
    with open(path, "rb") as handle:
        return int.from_bytes(handle.read(64)[32:40], "little")


def _single_machine_trace(folders: Sequence[Path], tasks: Sequence[Task], work: Path) -> Trace:
    """The same records assembled the single-machine way: every file in one directory,
    callers by pid, callees by port, one clock (what capture-job does)."""
    work.mkdir()
    records = [read_task_record(folder) for folder in folders]
    for record in records:
        for path in (record.folder / "wiretap").glob("tap-*.bin"):
            os.link(path, work / path.name)
    ports = {f"{t.job}:{t.index}": split_address(t.address, where="test")[1] for t in tasks}
    recorder = TapRecorder(ports, work)
    for record in records:
        recorder.expect_process(record.pid, record.name)
    index = {f"{t.job}:{t.index}": i for i, t in enumerate(tasks)}
    return assemble_trace(
        recorder.collect(),
        tasks=tasks,
        caller_of_pid={record.pid: index[record.name] for record in records},
        warmup_steps=1,
        origin_ns=min(record.start.monotonic_ns for record in records),
        metadata=RunMetadata(),
        partial_reason="; ".join(recorder.errors()),
    )


def _calls(rpcs: Sequence[Rpc], trace: Trace, times: bool) -> list[tuple[object, ...]]:
    calls = [
        (
            r.method, r.request_bytes, r.response_bytes, r.tensor, r.status_code,
            trace.tasks[r.caller_task].name, trace.tasks[r.callee_task].name,
            r.start_ns if times else 0,
        )
        for r in rpcs
    ]  # fmt: skip
    return calls if times else sorted(calls, key=repr)


def _assert_same_calls(trace: Trace, reference: Trace, *, times: bool = True) -> None:
    """Call for call: methods, sizes, tensors, caller and callee, step membership, and
    with ``times`` the times and order."""
    assert [t.name for t in trace.tasks] == [t.name for t in reference.tasks]
    assert len(trace.steps) == len(reference.steps) > 0
    for phase in ("startup", "teardown"):
        ours, theirs = getattr(trace, phase).rpcs, getattr(reference, phase).rpcs
        assert _calls(ours, trace, times) == _calls(theirs, reference, times)
    for step, expected in zip(trace.steps, reference.steps, strict=True):
        assert step.index == expected.index
        if times:
            assert (step.start_ns, step.end_ns) == (expected.start_ns, expected.end_ns)
        assert _calls(step.rpcs, trace, times) == _calls(expected.rpcs, reference, times)


def _assert_same_steps_up_to_the_clocks(wired: Trace, reference: Trace) -> None:
    """The same calls as ``reference``; in the same step too, except a call the wire's
    clock bounds may have moved across a step boundary: one that starts, on ``wired``'s
    clocks, within twice the widest bound of a step's start or end."""
    aside = ("startup", "teardown")
    assert [t.name for t in wired.tasks] == [t.name for t in reference.tasks]
    assert [s.index for s in wired.steps] == [s.index for s in reference.steps]
    assert len(wired.steps) > 0
    whole = [*(getattr(wired, p).rpcs for p in aside), *(s.rpcs for s in wired.steps)]
    theirs = [*(getattr(reference, p).rpcs for p in aside), *(s.rpcs for s in reference.steps)]
    flat = [r for rpcs in whole for r in rpcs]
    assert _calls(flat, wired, False) == _calls([r for x in theirs for r in x], reference, False)
    slack = 2 * max((o.upper_ns or 0) - (o.lower_ns or 0) for o in wired.clock_alignment.tasks)
    boundaries = [t for s in wired.steps for t in (s.start_ns, s.end_ns)]
    for ours, expected in zip(whole, theirs, strict=True):
        missing = Counter(_calls(expected, reference, False))
        for rpc in ours:
            (key,) = _calls([rpc], wired, False)
            if missing[key] > 0:
                missing[key] -= 1
                continue
            nearest = min(abs(rpc.start_ns - b) for b in boundaries)
            assert nearest <= slack, (rpc, nearest, slack)


def _tf2_ps_cluster() -> dict[str, list[str]]:
    ports = free_ports(4)
    return {
        "chief": [f"localhost:{ports[0]}"],
        "ps": [f"localhost:{ports[1]}"],
        "worker": [f"localhost:{ports[2]}", f"localhost:{ports[3]}"],
    }


@pytest.mark.tensorflow
def test_a_job_recorded_task_by_task_assembles_to_the_single_machine_trace(
    tmp_path: Path,
) -> None:
    cluster = _tf2_ps_cluster()
    out = tmp_path / "records"
    variables_file = tmp_path / "variables.json"  # the chief writes its model's variables
    command = [sys.executable, str(SCRIPT), "--rounds", "4", "--variables", str(variables_file)]
    statuses = _run_recorded_job(out, cluster, command)
    # The servers stop on the forwarded SIGTERM (143), or, if TensorFlow is still
    # handling it after record's grace, by SIGKILL (137); the chief ends by itself.
    assert statuses["chief:0"] == 0
    assert {statuses[t] for t in ("ps:0", "worker:0", "worker:1")} <= {143, 137}
    folders = sorted(p for p in out.glob("*/*") if (p / "manifest.json").exists())
    for folder in folders:
        assert not _alive(read_task_record(folder).pid)
        # Each record file is cut to its records (1 GiB while its process ran): the
        # folders copy as what they hold.
        taps = list((folder / "wiretap").glob("tap-*.bin"))
        assert taps and all(t.stat().st_size == _records_end(t) < 1 << 20 for t in taps)
    output = tmp_path / "job.tfgbtrace"
    result = subprocess.run(
        [CLI, "assemble", *(str(p) for p in out.iterdir()), "-o", str(output)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    trace = trace_files.read_trace(output)
    assert not trace.partial, trace.partial_reason
    assert dict(trace.metadata.extra)["unattributed_calls"] == "0"
    # 4 rounds of 2 workers: 8 worker-steps, the first kept as start-up.
    assert len(trace.steps) == 7
    alignment = trace.clock_alignment
    assert alignment.reference == "ps:0" and trace.format_version == 3
    assert [(c.task, c.offset_ns, c.uncertainty_ns) for c in alignment.tasks] == [
        ("ps:0", 0, 0), ("worker:0", 0, 0), ("worker:1", 0, 0), ("chief:0", 0, 0),
    ]  # fmt: skip
    # What the trace knows without help: the model's variables, from the traffic.
    model = [(v["dtype"], tuple(v["shape"])) for v in json.loads(variables_file.read_text())]
    extra = dict(trace.metadata.extra)
    assert Counter(decode_variables(extra["trainable_variables"])) == Counter(model)
    assert trace.metadata.trainable_parameters == 16 * 256 + 256 + 256 * 64 + 64 + 64 * 10 + 10
    report = check_physics(trace)
    assert report.ok and report.variables_source.startswith("traffic"), report.format()
    job = UserJob(cluster={k: tuple(v) for k, v in cluster.items()}, command=("x",))
    tasks = tuple(Task(job=n, index=i, address=a) for n, i, a in job.tasks)
    reference = _single_machine_trace(folders, tasks, tmp_path / "one-machine")
    assert not reference.partial, reference.partial_reason
    _assert_same_calls(trace, reference)

    # Every task placed by the wire alone: the true offsets (one kernel clock: 0) lie
    # within the bounds found, bounded on both sides for every task (the chief, which
    # no task calls, by the SETTINGS and PING frames its peers acknowledge).
    wired = assemble_records([out], clocks="wire")
    for offset in wired.clock_alignment.tasks[1:]:
        assert offset.source == WIRE and offset.lower_ns is not None
        assert offset.upper_ns is not None and offset.lower_ns <= 0 <= offset.upper_ns
    _assert_same_steps_up_to_the_clocks(wired, trace)
    summary = trace_summary.format_summary(wired)
    assert "clocks: on ps:0's; every task placed by the wire" in summary
    assert re.search(r"chief:0 on \S+: [-+][\d.]+ us \(within -[\d.]+ us \.\. [\d.]+ us", summary)


@pytest.mark.tensorflow
def test_a_script_taking_its_role_as_flags_runs_under_record_and_capture_job(
    tmp_path: Path,
) -> None:
    """No TF_CONFIG and no shim: {job}, {task} and {cluster} go into the script's own flags."""
    cluster = _tf2_ps_cluster()
    command = [sys.executable, str(FLAGS_SCRIPT), "--job", "{job}", "--task", "{task}",
               "--cluster", "{cluster}", "--rounds", "3"]  # fmt: skip
    out = tmp_path / "records"
    statuses = _run_recorded_job(out, cluster, command, flags=True)
    assert statuses["chief:0"] == 0
    trace = assemble_records([out])
    assert len(trace.steps) == 5 and not trace.partial, trace.partial_reason  # 6 - 1 warm-up

    output = tmp_path / "captured.tfgbtrace"
    # Not timed (--no-calibrate): nothing here reads the compute calibration (test_userjob.py
    # checks capture-job's), and a loaded machine's would take minutes.
    result = subprocess.run(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "-o", str(output),
         "--timeout", "300", "--no-calibrate", "--", *command],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    captured = trace_files.read_trace(output)
    assert len(captured.steps) == 5 and not captured.partial


@pytest.mark.tensorflow
@pytest.mark.netns
def test_a_job_with_every_task_on_its_own_emulated_host_assembles_to_the_single_machine_trace(
    tmp_path: Path,
) -> None:
    """Each task in its own network namespace (its own address, talking over veth links),
    started there by ``ip netns exec record ...`` as a launcher would on each host."""
    ports = free_ports(4)
    keys = [("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0)]
    request = NetworkRequest.parse("unlimited", "one-per-host")
    with emulated_hosts(request, keys) as hosts:
        cluster = {
            "ps": [f"{hosts.address(('ps', 0))}:{ports[0]}"],
            "worker": [f"{hosts.address(('worker', i))}:{ports[1 + i]}" for i in range(2)],
            "chief": [f"{hosts.address(('chief', 0))}:{ports[3]}"],
        }
        assert len({a.rpartition(":")[0] for v in cluster.values() for a in v}) == 4
        out = tmp_path / "records"
        statuses = _run_recorded_job(
            out,
            cluster,
            [sys.executable, str(SCRIPT), "--rounds", "4"],
            prefixes={f"{job}:{index}": hosts.prefix((job, index)) for job, index in keys},
        )
    # The servers stop on the forwarded SIGTERM (143), or, if TensorFlow is still
    # handling it after record's grace, by SIGKILL (137); the chief ends by itself.
    assert statuses["chief:0"] == 0
    assert {statuses[t] for t in ("ps:0", "worker:0", "worker:1")} <= {143, 137}
    trace = assemble_records([out])
    assert not trace.partial, trace.partial_reason
    assert dict(trace.metadata.extra)["unattributed_calls"] == "0" and len(trace.steps) == 7
    assert check_physics(trace).ok
    folders = sorted(p for p in out.glob("*/*") if (p / "manifest.json").exists())
    job = UserJob(cluster={k: tuple(v) for k, v in cluster.items()}, command=("x",))
    tasks = tuple(Task(job=n, index=i, address=a) for n, i, a in job.tasks)
    reference = _single_machine_trace(folders, tasks, tmp_path / "one-machine")
    _assert_same_calls(trace, reference)
    for offset in assemble_records([out], clocks="wire").clock_alignment.tasks:
        assert (offset.lower_ns is None or offset.lower_ns <= 0) and (
            offset.upper_ns is None or offset.upper_ns >= 0
        )


def test_capture_job_fills_in_each_tasks_placeholders(tmp_path: Path) -> None:
    ports = free_ports(2)
    cluster = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    seen = tmp_path / "seen"
    result = subprocess.run(
        [CLI, "capture-job", "--cluster", json.dumps(cluster), "-o", str(tmp_path / "t"),
         "--driver", "ps", "--driver", "worker", "--no-calibrate", "--",
         "sh", "-c", f"echo {{job}} {{task}} {{port}} '{{cluster}}' >> {seen}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # No training: the job fails as any job without a step does, after every task ran.
    assert result.returncode == 4 and "without a training step" in result.stderr
    compact = json.dumps(cluster, separators=(",", ":"))
    assert sorted(seen.read_text().splitlines()) == [
        f"ps 0 {ports[0]} {compact}",
        f"worker 0 {ports[1]} {compact}",
    ]


def test_a_killed_record_takes_its_command_along_and_its_trace_is_partial(tmp_path: Path) -> None:
    cluster = {"ps": ["localhost:2222"], "worker": ["localhost:2223"]}
    out = tmp_path / "out"
    assert _record(out, cluster, "ps", 0, "true").returncode == 0
    environment = dict(os.environ, TF_CONFIG=_tf_config(cluster, "worker", 0))
    record = subprocess.Popen(
        [CLI, "record", "--out", str(out), "--", "sleep", "300"], env=environment
    )
    deadline = time.monotonic() + 60
    while not (
        (out / "worker-0" / "manifest.json").exists() and read_task_record(out / "worker-0").pid
    ):
        assert time.monotonic() < deadline and record.poll() is None
        time.sleep(0.05)
    child = read_task_record(out / "worker-0").pid
    record.kill()
    assert record.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(child):  # PR_SET_PDEATHSIG: the command dies with record
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert read_task_record(out / "worker-0").exit_status is None
    trace = assemble_records([out])
    assert trace.partial and "worker:0 never finished" in trace.partial_reason
