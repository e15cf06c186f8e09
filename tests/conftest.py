"""Shared fixtures and helpers: small traces built in memory, replayed call sequences."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import hypothesis
import pytest

from tf_grpc_bench import trace as trace_model
from tf_grpc_bench import trace_files
from tf_grpc_bench.calibration import CACHE_ENV
from tf_grpc_bench.netns import namespaces, topology
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.replay.core.workload import Workload
from tf_grpc_bench.replay.transport.loop import begin_mid_trace
from tf_grpc_bench.trace import RECV_TENSOR, Rpc, RunMetadata, Step, Task, TensorInfo, Trace

TESTS = Path(__file__).resolve().parent

# No property test has a time limit: Hypothesis's default deadline (200 ms an example) is a
# wall-clock bound that a loaded machine breaks.  Tests that set their own settings keep
# this unless they name a deadline.
hypothesis.settings.register_profile("suite", deadline=None)
hypothesis.settings.load_profile("suite")


def _runs_the_whole_suite(config: pytest.Config) -> bool:
    """True for ``python -m pytest`` as CI runs it: every test, no selection."""
    named = config.args_source is pytest.Config.ArgsSource.ARGS and any(
        Path(argument).resolve() != TESTS for argument in config.args
    )
    option = config.option
    chosen = any(
        getattr(option, name, None) for name in ("markexpr", "keyword", "deselect", "lf", "maxfail")
    )
    return not named and not chosen


def pytest_configure(config: pytest.Config) -> None:
    """Coverage's floor (``fail_under`` in pyproject.toml) is for the whole suite: a run of
    some tests still prints coverage but is not held to it."""
    plugin = config.pluginmanager.getplugin("_cov")
    if plugin is not None and not _runs_the_whole_suite(config):
        plugin.options.cov_fail_under = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``netns`` make network namespaces, tests marked ``slurm`` (which carry
    ``netns`` too, so that ``-m "not netns"`` leaves out everything that needs root) install
    and start Slurm's daemons: without root they skip, saying why."""
    del config
    if os.geteuid() == 0:
        return
    reasons = {
        "slurm": "needs root: installs and starts munged, slurmctld and slurmd (CI runs as root)",
        "netns": "needs root: makes network namespaces (CI runs as root; run the suite with sudo)",
    }
    for item in items:
        marker = next((m for m in reasons if item.get_closest_marker(m) is not None), None)
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=reasons[marker]))


@pytest.fixture(scope="session", autouse=True)
def calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's own cache of compute calibrations (``tf_grpc_bench.calibration``), for
    every test and the commands they run: the user's cache is neither read nor written,
    and a model's step is timed once per run of the suite."""
    path = tmp_path_factory.mktemp("calibration") / "calibrations.json"
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture
def temporary_files_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own temporary directory (``TMPDIR``, and ``tempfile``'s in this process)
    for what its commands leave there: the task logs a failed or killed capture keeps
    (``tfgb-capture-*``, ``tfgb-userjob-*``), TensorFlow's autograph files.  They go with
    the test's ``tmp_path`` instead of staying in /tmp."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


#: The bench scripts, which import each other (``common``) with this folder on the path.
BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench_script(file_name: str, module_name: str) -> ModuleType:
    """A bench script loaded from its file as ``module_name``, with bench/ on the path as
    when it runs."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(module_name, BENCH / file_name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def environment_without_coverage() -> dict[str, str]:
    """This environment, less coverage's: for a process that gives up root and so could not
    write its coverage data (it would say so on stderr, which these tests read)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}


def run_with_pid(
    argv: Sequence[str], *, timeout_s: float
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``subprocess.run(argv)`` with its output as text, and the pid the command ran as."""
    with subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr), process.pid


def namespaces_made_by(pid: int) -> list[str]:
    """The tool's network namespaces that the process ``pid`` made: a run's id begins with
    the pid of the process that made it.  Other tests' and other users' namespaces (a
    machine running several suites at once has them come and go) never match."""
    mine = f"{topology.PREFIX}{pid}-"
    return [name for name in namespaces.list_namespaces() if name.startswith(mine)]


def make_trace(
    *, steps: int = 2, workers: int = 1, ps: int = 1, sizes: tuple[int, ...] = (21, 4096, 1 << 20)
) -> Trace:
    """A small synthetic-but-valid PS trace: each worker pulls ``sizes`` from each ps."""
    tasks = tuple(
        Task(job="ps", index=i, address=f"localhost:{2000 + i}") for i in range(ps)
    ) + tuple(Task(job="worker", index=i, address=f"localhost:{3000 + i}") for i in range(workers))
    step_list = []
    clock = 1_000_000
    for step_index in range(steps):
        rpcs = []
        start = clock
        for w in range(workers):
            for p in range(ps):
                for n, size in enumerate(sizes):
                    rpcs.append(
                        Rpc(
                            method=RECV_TENSOR,
                            caller_task=ps + w,
                            callee_task=p,
                            request_bytes=120,
                            response_bytes=size,
                            start_ns=clock,
                            response_start_ns=clock + 500,
                            end_ns=clock + 1000,
                            tensor=TensorInfo(
                                rendezvous_key=f"/job:ps/replica:0/task:{p}/device:CPU:0;1;"
                                f"/job:worker/replica:0/task:{w}/device:CPU:0;edge_{n}_w;0:0",
                                dtype="float32",
                                shape=(max(size // 4, 0),),
                                content_bytes=size,
                            ),
                        )
                    )
                    clock += 2000
        step_list.append(
            Step(
                index=step_index,
                start_ns=start,
                end_ns=clock,
                rpcs=trace_model.with_outstanding(rpcs),
            )
        )
        clock += 10_000
    return Trace(
        metadata=RunMetadata(
            model="toy",
            strategy="synthetic",
            batch_size=4,
            input_shape=(8, 8, 3),
            capture_method="synthetic",
            command=("pytest",),
        ),
        tasks=tasks,
        steps=tuple(step_list),
    )


def with_step_lengths(trace: Trace, lengths_ms: Sequence[float]) -> Trace:
    """``trace`` with its steps lasting ``lengths_ms`` (each step's calls kept, its end moved)."""
    steps = tuple(
        dataclasses.replace(step, end_ns=step.start_ns + int(length * 1e6))
        for step, length in zip(trace.steps, lengths_ms, strict=True)
    )
    return dataclasses.replace(trace, steps=steps)


@pytest.fixture
def small_trace() -> Trace:
    return make_trace()


@pytest.fixture
def small_trace_file(tmp_path: Path, small_trace: Trace) -> Path:
    path = tmp_path / "small.tfgbtrace"
    trace_files.write_trace(small_trace, path)
    return path


#: One call as a replay round trip compares it: method, request and response bytes.
Call = tuple[str, int, int]


def replayed_sequences(calls: Sequence[RecordedCall]) -> dict[tuple[int | None, str], list[Call]]:
    """Recorded calls of a replay, per (calling process, callee), in stream order, as
    (method, request bytes, response bytes); the replayer's own statistics calls left out."""
    sequences: dict[tuple[int | None, str], list[Call]] = {}
    for call in sorted(calls, key=lambda c: (c.callee, c.connection, c.stream_id)):
        if call.method.startswith("/tf_grpc_bench.Control/"):
            continue
        key = (call.caller_pid, call.callee)
        sequences.setdefault(key, []).append((call.method, call.request_bytes, call.response_bytes))
    return sequences


def workload_sequences(workload: Workload) -> dict[tuple[int, int], list[Call]]:
    """What each (worker, ps server) pair of a replay workload sends in a pass, in the
    order a replay sends it (from the trace's middle step on: ``begin_mid_trace``)."""
    sequences: dict[tuple[int, int], list[Call]] = {}
    for step in begin_mid_trace(workload.steps):
        for c in step.calls:
            sequences.setdefault((c.worker_index, c.server_index), []).append(
                (c.method, c.request_bytes, c.response_bytes)
            )
    return sequences


ENQUEUE = "/tensorflow.eager.EagerService/Enqueue"


def _whole_step_rpc(
    method: str, caller: int, callee: int, request: int, response: int, start: int
) -> Rpc:
    return Rpc(
        method=method,
        caller_task=caller,
        callee_task=callee,
        request_bytes=request,
        response_bytes=response,
        start_ns=start,
        response_start_ns=start + 2_000,
        end_ns=start + 10_000,
    )


def make_whole_step_trace(
    *, pull: tuple[int, int] = (300_000, 200_000), ps_to_ps: int = 177, enqueue: int = 14_093
) -> Trace:
    """ps:0, ps:1, worker:0, worker:1, chief:0; per step: the chief's Enqueue to each worker
    (``enqueue`` bytes of request to worker:0), variable pulls (``pull``: worker:0's from
    ps:0, worker:1's from ps:1), ps:0 pulling from ps:1 twice, one after the other
    (``ps_to_ps`` bytes of response the first time), gradient pulls (``pull`` again)."""
    tasks = (
        Task(job="ps", index=0),
        Task(job="ps", index=1),
        Task(job="worker", index=0),
        Task(job="worker", index=1),
        Task(job="chief", index=0),
    )
    rpc = _whole_step_rpc
    steps = []
    for number in range(2):
        base = 1_000_000 * (number + 1)
        rpcs = (
            rpc(ENQUEUE, 4, 2, enqueue, 40, base),  # chief -> worker:0
            rpc(ENQUEUE, 4, 3, 14_001, 41, base + 500),  # chief -> worker:1
            rpc(RECV_TENSOR, 2, 0, 120, pull[0], base + 1_000),  # worker:0 pulls from ps:0
            rpc(RECV_TENSOR, 3, 1, 121, pull[1], base + 1_000),  # worker:1 pulls from ps:1
            rpc(RECV_TENSOR, 0, 1, 130, ps_to_ps, base + 20_000),  # ps:0 pulls from ps:1
            rpc(RECV_TENSOR, 0, 1, 131, 21, base + 40_000),  # and again, after it
            rpc(RECV_TENSOR, 0, 2, 140, pull[0], base + 60_000),  # ps:0 pulls worker:0's grad
            rpc(RECV_TENSOR, 1, 3, 141, pull[1], base + 60_000),  # ps:1 pulls worker:1's grad
        )
        steps.append(Step(index=number, start_ns=base, end_ns=base + 200_000, rpcs=rpcs))
    return Trace(metadata=RunMetadata(model="toy"), tasks=tasks, steps=tuple(steps))
