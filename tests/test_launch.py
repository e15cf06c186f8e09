"""``profiler/launch/`` runs real distributed TensorFlow training, one process per task."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tf_grpc_bench.errors import CaptureError, ConfigError, ServeError
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.job import JobOutcome, TrainingJob
from tf_grpc_bench.profiler.launch.markers import StepMarker, read_step_markers
from tf_grpc_bench.profiler.launch.plan import TaskSpec, plan_tasks
from tf_grpc_bench.profiler.launch.ports import free_ports, port_is_free


class ByteRelay:
    """Forwards every TCP connection on its own port to ``target_port``, counting bytes.

    Stands where a recording proxy would: peers dial the relay, the task binds
    the target port.  The relay listens only once its task does, so a peer that
    dials early is refused, as it would be without a relay (a relay that took
    the connection and held it would make gRPC wait out its connect timeout
    while TensorFlow starts, which the chief's first calls do not survive on a
    loaded machine).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.forwarded_bytes = 0
        self._lock = threading.Lock()
        self._closed = False
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _upstream(self) -> socket.socket | None:
        """A connection to the task's port, waiting for it to listen; None once closed."""
        while not self._closed:
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                time.sleep(0.05)
                continue
            if upstream.getsockname() != upstream.getpeername():
                return upstream
            upstream.close()  # TCP's self-connect to a port nobody listens on yet
        return None

    def _accept(self) -> None:
        probe = self._upstream()
        if probe is None:
            return
        probe.close()
        self._listener.listen()
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                with self._lock:
                    self.forwarded_bytes += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for connection in self._sockets:
            connection.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _config(setup: str, **overrides: object) -> TrainingConfig:
    settings: dict[str, object] = {
        "model": "tiny",
        "setup": setup,
        "ps": 0 if setup == "mwms" else 1,
        "workers": 2,
        "steps": 2,
        "warmup_steps": 1,
        "input_size": 16,
    }
    settings.update(overrides)
    return TrainingConfig(**settings)  # type: ignore[arg-type]


def _wait_for(predicate, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


# -- configuration (no TensorFlow) ---------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"setup": "tf2-ps", "ps": 0}, "at least 1 parameter server"),
        ({"setup": "tf1-ps", "workers": 0}, "at least 1 worker"),
        ({"setup": "mwms", "ps": 1}, "set ps=0"),
        ({"setup": "mwms", "ps": 0, "synchronous": False}, "synchronous by nature"),
        ({"setup": "tf1-ps", "keras_flavour": "keras"}, "tf_keras"),
        ({"setup": "horovod"}, "unknown setup 'horovod'"),
        ({"model": "lenet"}, "unknown model 'lenet'.*tiny"),
        ({"model": "inceptionv3", "input_size": 32}, "75x75"),
        ({"steps": 0}, "steps must be >= 1"),
        ({"batch_size": 0}, "batch_size"),
        ({"ps": 20, "workers": 20}, "too many"),
    ],
)
def test_impossible_configs_are_config_errors_naming_the_culprit(
    settings: dict[str, object], message: str
) -> None:
    base: dict[str, object] = {"model": "tiny"}
    base.update(settings)
    with pytest.raises(ConfigError, match=message):
        TrainingConfig(**base)  # type: ignore[arg-type]


def test_plan_gives_each_task_its_own_free_port_advertised_as_bound() -> None:
    config = _config("tf2-ps", ps=2, workers=3)
    tasks = plan_tasks(config)
    assert [t.name for t in tasks] == [
        "ps:0",
        "ps:1",
        "worker:0",
        "worker:1",
        "worker:2",
        "chief:0",
    ]
    assert len({t.bind_port for t in tasks}) == len(tasks)
    assert all(t.advertised_address == f"127.0.0.1:{t.bind_port}" for t in tasks)
    assert all(port_is_free(t.bind_port) for t in tasks)


def test_task_list_must_match_the_cluster_of_the_config(tmp_path: Path) -> None:
    config = _config("tf1-ps")
    tasks = plan_tasks(config)
    with pytest.raises(ConfigError, match=r"missing \[\('worker', 1\)\]"):
        TrainingJob(config, tasks[:-1], tmp_path)


def test_a_bind_port_in_use_is_a_serve_error_naming_the_port(tmp_path: Path) -> None:
    config = _config("tf1-ps")
    tasks = plan_tasks(config)
    with socket.create_server(("127.0.0.1", tasks[1].bind_port)):
        job = TrainingJob(config, tasks, tmp_path)
        with pytest.raises(ServeError, match=rf"port {tasks[1].bind_port} \(for worker:0\)"):
            job.start()
        assert job.pids() == {}


def test_free_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    ports = free_ports(20)
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert len(set(ports)) == 20
    assert all(port < low for port in ports)


def test_step_markers_round_trip_and_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    marker = StepMarker(task="worker:1", step=3, phase="steady", start_ns=10, end_ns=25)
    path = tmp_path / "steps.jsonl"
    path.write_text(marker.to_line() + '{"task": "worker:0", "st', encoding="utf-8")
    assert read_step_markers(path) == [marker]
    with pytest.raises(ValueError, match="phase"):
        StepMarker(task="worker:1", step=0, phase="cooldown", start_ns=0, end_ns=0)


def test_task_spec_rejects_an_advertised_address_without_port() -> None:
    with pytest.raises(ConfigError, match="host:port"):
        TaskSpec(job="ps", index=0, bind_port=2222, advertised_address="localhost")


# -- real training -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RelayedRun:
    """A training job whose peers dialled relays: what it ended with, and what went through."""

    outcome: JobOutcome
    pids: tuple[int, ...]
    relayed_bytes: dict[tuple[str, int], int]


def _train_through_relays(config: TrainingConfig, workdir: Path) -> RelayedRun:
    """Trains ``config`` with every peer dialling a relay in front of each task's bound port;
    checks that every task, the coordinator included, listened on its bind port."""
    planned = plan_tasks(config)
    relays = {task.key: ByteRelay(task.bind_port) for task in planned}
    tasks = [
        dataclasses.replace(task, advertised_address=f"127.0.0.1:{relays[task.key].port}")
        for task in planned
    ]
    try:
        with TrainingJob(config, tasks, workdir) as job:
            job.start()
            outcome = job.wait(timeout_s=600)
            for task in tasks:
                socket.create_connection(("127.0.0.1", task.bind_port), timeout=5).close()
            pids = tuple(job.pids().values())
    finally:
        for relay in relays.values():
            relay.close()
    return RelayedRun(outcome, pids, {key: r.forwarded_bytes for key, r in relays.items()})


def _assert_trained_through_the_relays(config: TrainingConfig, run: RelayedRun) -> None:
    steady = run.outcome.steady_markers
    driving = {f"{job}:{index}" for job, index in config.driving_tasks}
    assert {m.task for m in steady} == driving
    # One marker per round for synchronous tf2-ps, else one per worker-step.
    rounds = config.setup == "tf2-ps" and config.synchronous
    assert len(steady) == config.steps * (1 if rounds else config.workers)
    # Weights and gradients went through the relays, not straight to the ports.
    weights = config.workers * (config.warmup_steps + config.steps) * 548_730 * 4
    if config.setup == "mwms":
        assert sum(run.relayed_bytes.values()) >= weights
    else:
        assert run.relayed_bytes[("ps", 0)] >= weights
        gradients = sum(n for key, n in run.relayed_bytes.items() if key[0] == "worker")
        assert gradients >= weights


@pytest.mark.tensorflow
@pytest.mark.usefixtures("temporary_files_here")
def test_tf2_parameter_server_training_writes_steady_markers_and_job_info(
    tmp_path: Path,
) -> None:
    """Also the relay test's synchronous tf2-ps case (one job for both: the markers, the
    job information and the stopped tasks do not depend on which port a peer dials)."""
    config = _config("tf2-ps")
    run = _train_through_relays(config, tmp_path)
    outcome = run.outcome
    assert not any(_alive(pid) for pid in run.pids)
    assert [(m.task, m.step, m.phase) for m in outcome.markers] == [
        ("chief:0", 0, "warmup"),
        ("chief:0", 1, "steady"),
        ("chief:0", 2, "steady"),
    ]
    assert all(m.start_ns <= m.end_ns for m in outcome.markers)
    assert outcome.markers[0].end_ns <= outcome.markers[1].start_ns
    info = json.loads((tmp_path / "job.json").read_text())
    assert info == dict(outcome.job_info)
    assert info["trainable_parameters"] == 548_730
    assert info["trainable_bytes"] == 548_730 * 4
    assert sum(v["bytes"] for v in info["variables"] if v["trainable"]) == 548_730 * 4
    assert info["setup"] == "tf2-ps" and info["synchronous"] is True
    assert info["input_shape"] == [16, 16, 3] and info["batch_size"] == 4
    assert info["keras_flavour"] == "keras" and info["tensorflow_version"].startswith("2.")
    _assert_trained_through_the_relays(config, run)


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("setup", "synchronous"),
    # Synchronous tf2-ps: test_tf2_parameter_server_training_writes_steady_markers_and_job_info.
    [("tf2-ps", False), ("tf1-ps", True), ("tf1-ps", False), ("mwms", True)],
)
@pytest.mark.usefixtures("temporary_files_here")
def test_training_works_when_peers_dial_a_relay_instead_of_the_bound_port(
    tmp_path: Path, setup: str, synchronous: bool
) -> None:
    config = _config(setup, synchronous=synchronous)
    _assert_trained_through_the_relays(config, _train_through_relays(config, tmp_path))


@pytest.mark.tensorflow
@pytest.mark.usefixtures("temporary_files_here")
def test_a_killed_worker_is_a_capture_error_and_every_task_is_stopped(tmp_path: Path) -> None:
    config = _config("tf2-ps", steps=100_000)
    with TrainingJob(config, plan_tasks(config), tmp_path) as job:
        job.start()
        _wait_for(lambda: any(m.phase == "steady" for m in job.step_markers()), timeout_s=300)
        pids = job.pids()
        os.kill(pids[("worker", 1)], signal.SIGKILL)
        with pytest.raises(CaptureError, match=r"task worker:1 was killed by signal 9"):
            job.wait(timeout_s=300)
        assert not any(_alive(pid) for pid in pids.values())


@pytest.mark.tensorflow
@pytest.mark.usefixtures("temporary_files_here")
def test_a_hung_worker_is_a_capture_error_after_the_step_timeout(tmp_path: Path) -> None:
    config = _config("tf1-ps", steps=100_000, step_timeout_s=3.0)
    # A stopped process ignores SIGTERM: do not wait long before SIGKILL.
    with TrainingJob(config, plan_tasks(config), tmp_path, stop_grace_s=1.0) as job:
        job.start()
        _wait_for(lambda: any(m.phase == "steady" for m in job.step_markers()), timeout_s=300)
        pids = job.pids()
        os.kill(pids[("ps", 0)], signal.SIGSTOP)
        with pytest.raises(CaptureError, match=r"hangs: no step finished within 3 s"):
            job.wait(timeout_s=300)
        assert not any(_alive(pid) for pid in pids.values())
