"""The task plan of a launched job: every task's ports, and the plan file the tasks read.

Each task binds its gRPC server on ``TaskSpec.bind_port`` while every task's
cluster definition lists the ``advertised_address`` of its peers; a recording
proxy can sit between the two.  Without a proxy they are the same.

Files in the job's work directory: ``plan.json`` (what the tasks read),
``steps.jsonl`` (step markers, ``markers.py``), ``job.json`` (model, variables,
settings), ``ready-<job>-<index>`` and ``finished-<job>-<index>.json`` per
driving task, ``<job>-<index>.stdout`` and ``.stderr`` per task.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tf_grpc_bench.cluster import split_address
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.files import loads_json
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.markers import MARKERS_FILE
from tf_grpc_bench.profiler.launch.ports import free_ports

#: Version of plan.json and job.json.  History: 1 (2026-11): first version.
PLAN_VERSION = 1

PLAN_FILE = "plan.json"
JOB_INFO_FILE = "job.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """One task: its gRPC server binds ``bind_port`` (every interface); peers dial
    ``advertised_address`` (``host:port``), which is a proxy's when capturing
    with the recording proxy (the in-process recorder leaves it the bound one)."""

    job: str
    index: int
    bind_port: int
    advertised_address: str

    def __post_init__(self) -> None:
        if self.job not in ("chief", "ps", "worker"):
            raise ConfigError(f"task job must be chief, ps or worker, got {self.job!r}")
        if self.index < 0:
            raise ConfigError(f"task {self.job} index must be >= 0, got {self.index}")
        if not 0 < self.bind_port < 65536:
            raise ConfigError(f"task {self.name}: bind_port {self.bind_port} is not a TCP port")
        split_address(self.advertised_address, where=f"task {self.name}: advertised_address")

    @property
    def name(self) -> str:
        """``job:index``, as in step markers (e.g. ``worker:0``)."""
        return f"{self.job}:{self.index}"

    @property
    def key(self) -> tuple[str, int]:
        return (self.job, self.index)

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "index": self.index,
            "bind_port": self.bind_port,
            "advertised_address": self.advertised_address,
        }


def plan_tasks(config: TrainingConfig, *, host: str = "127.0.0.1") -> list[TaskSpec]:
    """One TaskSpec per task of ``config``, on free ports, advertised == bound.

    Order: ps, workers, then the chief (tf2-ps).  To put proxies in between,
    replace ``advertised_address`` (``dataclasses.replace``) before starting.
    """
    jobs = config.jobs
    ports = iter(free_ports(sum(jobs.values())))
    tasks = []
    for job, count in jobs.items():
        for index in range(count):
            port = next(ports)
            tasks.append(
                TaskSpec(job=job, index=index, bind_port=port, advertised_address=f"{host}:{port}")
            )
    return tasks


def cluster_definition(tasks: Sequence[TaskSpec]) -> dict[str, list[str]]:
    """The cluster as TensorFlow wants it: job -> advertised addresses by index."""
    cluster: dict[str, list[str]] = {}
    for task in sorted(tasks, key=lambda t: (t.job, t.index)):
        cluster.setdefault(task.job, []).append(task.advertised_address)
    return cluster


def check_tasks(config: TrainingConfig, tasks: Sequence[TaskSpec]) -> None:
    """ConfigError unless ``tasks`` are exactly the tasks of ``config``, each on its own port."""
    expected = {(job, i) for job, count in config.jobs.items() for i in range(count)}
    given = [t.key for t in tasks]
    if len(set(given)) != len(given):
        raise ConfigError(f"duplicate tasks in the task list: {sorted(given)}")
    if set(given) != expected:
        missing = sorted(expected - set(given))
        extra = sorted(set(given) - expected)
        raise ConfigError(
            f"tasks do not match the {config.setup} cluster of the config: "
            f"missing {missing}, unexpected {extra}"
        )
    ports = [t.bind_port for t in tasks]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"two tasks share a bind port: {sorted(ports)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPlan:
    """Everything a task process needs: the config, every task, the work directory."""

    config: TrainingConfig
    tasks: tuple[TaskSpec, ...]
    workdir: Path
    version: int = PLAN_VERSION

    def task(self, job: str, index: int) -> TaskSpec:
        for task in self.tasks:
            if task.key == (job, index):
                return task
        raise ConfigError(f"plan {self.workdir / PLAN_FILE} has no task {job}:{index}")

    @property
    def cluster(self) -> dict[str, list[str]]:
        return cluster_definition(self.tasks)

    @property
    def markers_path(self) -> Path:
        return self.workdir / MARKERS_FILE

    @property
    def job_info_path(self) -> Path:
        return self.workdir / JOB_INFO_FILE

    def finished_path(self, job: str, index: int) -> Path:
        return self.workdir / f"finished-{job}-{index}.json"

    def ready_path(self, job: str, index: int) -> Path:
        return self.workdir / f"ready-{job}-{index}"

    def log_path(self, job: str, index: int, stream: str) -> Path:
        return self.workdir / f"{job}-{index}.{stream}"

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "config": self.config.as_json(),
            "tasks": [t.as_json() for t in self.tasks],
            "workdir": str(self.workdir),
        }

    def write(self) -> Path:
        path = self.workdir / PLAN_FILE
        path.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> JobPlan:
        try:
            data = loads_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ConfigError(f"{path}: cannot read the job plan ({error})") from None
        if data.get("version") != PLAN_VERSION:
            raise ConfigError(
                f"{path}: plan version {data.get('version')!r}, this tool reads {PLAN_VERSION}"
            )
        return cls(
            config=TrainingConfig.from_json(data["config"]),
            tasks=tuple(TaskSpec(**t) for t in data["tasks"]),
            workdir=Path(data["workdir"]),
        )
