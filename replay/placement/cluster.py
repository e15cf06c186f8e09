"""Placement of replay roles by TensorFlow's cluster conventions, without TensorFlow.

A launcher that starts distributed TensorFlow training (a Kubernetes TFJob, a
SLURM script using TensorFlow's cluster resolvers) gives every task the same
``TF_CONFIG`` environment variable, differing only in ``task``::

    {"cluster": {"chief": ["h0:2222"], "ps": ["h1:2222"], "worker": ["h2:2222", "h3:2222"]},
     "task": {"type": "worker", "index": 1}}

This module reads it the way TensorFlow's ``TFConfigClusterResolver`` and
``multi_worker_util`` do (job names chief/worker/ps/evaluator, at most one
chief, a job's tasks as a list or as an ``{"index": address}`` object, the task
type and index given by ``task`` or overridden by flags), and maps each task to
its replay role:

- ``ps`` tasks serve (each ps owns part of the traffic, as in training);
- ``worker`` tasks replay against all ps tasks;
- one task gathers everyone's results into one document: the chief, or worker 0
  when there is no chief (TensorFlow's own choice of chief);
- an ``evaluator`` has nothing to do in a replay.

Pure: parsing and validation only, no sockets, no TensorFlow.  Errors are
``ConfigError`` with one line naming the source and field.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tf_grpc_bench import launchers
from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.files import loads_json
from tf_grpc_bench.replay.transport.client import split_address

TF_CONFIG = "TF_CONFIG"
CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
#: The job names TensorFlow's multi-worker strategies accept.
JOBS = (CHIEF, WORKER, PS, EVALUATOR)


class Role(enum.Enum):
    """What a task does in a replay."""

    SERVE = "serve"
    REPLAY = "replay"
    GATHER = "gather"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Job name -> task addresses (index i at position i).  Jobs in ``JOBS`` order."""

    jobs: tuple[tuple[str, tuple[str, ...]], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"a job is listed twice: {names}")
        for name, addresses in self.jobs:
            if name not in JOBS:
                raise ValueError(f"job {name!r} is not one of {', '.join(JOBS)}")
            if not addresses:
                raise ValueError(f"job {name!r} has no tasks")

    def addresses(self, job: str) -> tuple[str, ...]:
        """The job's task addresses; () if the cluster has no such job."""
        return dict(self.jobs).get(job, ())

    def address(self, job: str, index: int) -> str:
        tasks = self.addresses(job)
        if not 0 <= index < len(tasks):
            raise ConfigError(f"cluster has no task {job}:{index} ({len(tasks)} {job} tasks)")
        return tasks[index]

    def task_count(self, job: str) -> int:
        return len(self.addresses(job))

    def as_dict(self) -> dict[str, list[str]]:
        """The ``cluster`` object of TF_CONFIG."""
        return {name: list(addresses) for name, addresses in self.jobs}


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskId:
    """One task of the cluster: job name and index."""

    type: str
    index: int

    def __post_init__(self) -> None:
        if self.type not in JOBS:
            raise ValueError(f"task type {self.type!r} is not one of {', '.join(JOBS)}")
        if self.index < 0:
            raise ValueError(f"task index must be >= 0, got {self.index}")

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """A validated cluster and this process's task in it."""

    cluster: ClusterSpec
    task: TaskId

    def __post_init__(self) -> None:
        if self.cluster.task_count(CHIEF) > 1:
            raise ValueError("there must be at most one chief task")
        if self.cluster.task_count(PS) == 0:
            raise ValueError("a replay needs at least one ps task")
        if self.cluster.task_count(WORKER) == 0:
            raise ValueError("a replay needs at least one worker task")
        if self.task.type == EVALUATOR and self.task.type not in dict(self.cluster.jobs):
            return  # TensorFlow allows an evaluator outside the cluster.
        count = self.cluster.task_count(self.task.type)
        if count == 0:
            raise ValueError(f"task type {self.task.type!r} is not a job of the cluster")
        if self.task.index >= count:
            raise ValueError(
                f"task index {self.task.index} is out of range: {self.task.type} has {count} tasks"
            )

    @property
    def gatherer(self) -> TaskId:
        """The chief, or worker 0 when there is no chief (TensorFlow's rule)."""
        if self.cluster.task_count(CHIEF):
            return TaskId(type=CHIEF, index=0)
        return TaskId(type=WORKER, index=0)

    @property
    def gatherer_address(self) -> str:
        gatherer = self.gatherer
        return self.cluster.address(gatherer.type, gatherer.index)

    @property
    def roles(self) -> frozenset[Role]:
        """This task's roles: a ps serves; a worker replays; the gatherer gathers."""
        roles: set[Role] = set()
        if self.task.type == PS:
            roles.add(Role.SERVE)
        if self.task.type == WORKER:
            roles.add(Role.REPLAY)
        if self.task == self.gatherer:
            roles.add(Role.GATHER)
        return frozenset(roles)

    @property
    def address(self) -> str:
        """This task's own address ("" for an evaluator outside the cluster)."""
        if self.cluster.task_count(self.task.type) == 0:
            return ""
        return self.cluster.address(self.task.type, self.task.index)

    @property
    def ps_addresses(self) -> tuple[str, ...]:
        return self.cluster.addresses(PS)

    @property
    def worker_count(self) -> int:
        return self.cluster.task_count(WORKER)

    def tf_config(self) -> str:
        """This placement as a TF_CONFIG value (what a launcher would set)."""
        return json.dumps(
            {
                "cluster": self.cluster.as_dict(),
                "task": {"type": self.task.type, "index": self.task.index},
            }
        )


def parse_cluster(value: Any, *, source: str) -> ClusterSpec:
    """A ``cluster`` object (already decoded JSON) -> ClusterSpec.

    Each job's tasks are a list of addresses, or an object mapping task index
    (as a string or number) to address; indices must then be 0..n-1.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: cluster must be a JSON object of job -> addresses")
    jobs = []
    for job in JOBS:
        if job not in value:
            continue
        where = f"{source}: cluster.{job}"
        tasks = value[job]
        if isinstance(tasks, Mapping):
            try:
                indexed = {int(k): v for k, v in tasks.items()}
            except (TypeError, ValueError):
                raise ConfigError(f"{where}: task indices must be integers") from None
            if sorted(indexed) != list(range(len(indexed))):
                raise ConfigError(f"{where}: task indices must be 0..{len(indexed) - 1}")
            tasks = [indexed[i] for i in range(len(indexed))]
        if not isinstance(tasks, list) or not tasks:
            raise ConfigError(f"{where}: expected a non-empty list of 'host:port'")
        for i, address in enumerate(tasks):
            if not isinstance(address, str):
                raise ConfigError(f"{where}[{i}]: expected 'host:port', got {address!r}")
            split_address(address, where=f"{where}[{i}]")
        jobs.append((job, tuple(tasks)))
    unknown = sorted(str(k) for k in value if k not in JOBS)
    if unknown:
        raise ConfigError(
            f"{source}: cluster.{unknown[0]}: unknown job (expected {', '.join(JOBS)})"
        )
    if len(dict(jobs).get(CHIEF, ())) > 1:
        raise ConfigError(f"{source}: cluster.chief: there must be at most one chief task")
    return ClusterSpec(jobs=tuple(jobs))


def parse_task(value: Any, *, source: str) -> TaskId:
    """A ``task`` object ``{"type": ..., "index": ...}`` -> TaskId."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: task must be a JSON object with type and index")
    task_type = value.get("type")
    if task_type not in JOBS:
        raise ConfigError(
            f"{source}: task.type: expected one of {', '.join(JOBS)}, got {task_type!r}"
        )
    index = value.get("index", 0)
    if isinstance(index, str) and index.isdigit():
        index = int(index)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"{source}: task.index: expected an integer >= 0, got {index!r}")
    return TaskId(type=task_type, index=index)


def parse_task_flag(text: str) -> TaskId:
    """``--task worker:1`` (or a JSON ``task`` object)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        return parse_task(_decode(stripped, source="--task"), source="--task")
    task_type, _, index = stripped.partition(":")
    if not index.isdigit():
        raise ConfigError(f"--task {text!r}: expected TYPE:INDEX, e.g. worker:0")
    return parse_task({"type": task_type, "index": int(index)}, source="--task")


def _decode(text: str, *, source: str) -> Any:
    try:
        return loads_json(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source}: not valid JSON ({error.msg} at char {error.pos})") from None


def _placement(cluster: ClusterSpec, task: TaskId, *, source: str) -> Placement:
    try:
        return Placement(cluster=cluster, task=task)
    except ValueError as error:
        raise ConfigError(f"{source}: {error}") from None


def _read_tf_config(text: str, *, source: str) -> tuple[ClusterSpec | None, TaskId | None]:
    """The cluster and task a TF_CONFIG document gives (either may be absent).

    ``rpc_layer``, when given, must be ``grpc`` (the only transport replayed);
    ``environment`` and other keys TensorFlow tolerates are ignored.
    """
    document = _decode(text, source=source)
    if not isinstance(document, Mapping):
        raise ConfigError(f"{source}: expected a JSON object with cluster and task")
    rpc_layer = document.get("rpc_layer", "grpc")
    if rpc_layer != "grpc":
        raise ConfigError(f"{source}: rpc_layer: only 'grpc' is replayed, got {rpc_layer!r}")
    spec = parse_cluster(document["cluster"], source=source) if "cluster" in document else None
    task = parse_task(document["task"], source=source) if "task" in document else None
    return spec, task


def parse_tf_config(text: str, *, source: str = TF_CONFIG) -> Placement:
    """A full TF_CONFIG document (cluster and task both required) -> Placement."""
    spec, task = _read_tf_config(text, source=source)
    if spec is None:
        raise ConfigError(f"{source}: cluster: missing")
    if task is None:
        raise ConfigError(f"{source}: task: missing")
    return _placement(spec, task, source=source)


def _cluster_flag(text: str) -> tuple[ClusterSpec, TaskId | None]:
    """``--cluster``: JSON text or a JSON file; a bare cluster object or a whole TF_CONFIG."""
    stripped = text.strip()
    source = "--cluster"
    if not stripped.startswith("{"):
        path = Path(stripped)
        try:
            stripped = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(
                f"--cluster {text}: not JSON, nor a readable file ({error.strerror})"
            ) from None
        source = f"--cluster {path}"
    document = _decode(stripped, source=source)
    if isinstance(document, Mapping) and "cluster" in document:
        task = parse_task(document["task"], source=source) if "task" in document else None
        return parse_cluster(document["cluster"], source=source), task
    return parse_cluster(document, source=source), None


def slurm_placement(
    jobs: str, *, port_base: int, environ: Mapping[str, str] | None = None
) -> Placement:
    """This task's placement from ``srun``'s environment and ``--slurm-jobs``, laid out as
    TensorFlow's ``SlurmClusterResolver`` does (``tf_grpc_bench.launchers``)."""
    env = os.environ if environ is None else environ
    step = launchers.read_slurm_step(env)
    launched = launchers.slurm_placement(step, launchers.parse_jobs(jobs), port_base=port_base)
    spec = parse_cluster(launched.cluster_dict(), source="Slurm layout")
    return _placement(spec, TaskId(type=launched.job, index=launched.index), source="--slurm-jobs")


def resolve_placement(
    *,
    cluster: str | None = None,
    task: str | None = None,
    environ: Mapping[str, str] | None = None,
    slurm_jobs: str | None = None,
    port_base: int = launchers.DEFAULT_PORT_BASE,
) -> Placement | None:
    """This process's placement from flags and TF_CONFIG, as TensorFlow resolves it.

    ``--cluster`` replaces TF_CONFIG's cluster, ``--task`` its task (like
    ``TFConfigClusterResolver(task_type=..., task_id=...)``).  ``--slurm-jobs``
    places the task by Slurm's environment instead (``slurm_placement``), TF_CONFIG
    ignored.  Returns None when neither flags nor TF_CONFIG say anything (no
    cluster placement).
    """
    env = os.environ if environ is None else environ
    if slurm_jobs is not None:
        if cluster is not None or task is not None:
            raise UsageError("--slurm-jobs places the task from Slurm; drop --cluster and --task")
        return slurm_placement(slurm_jobs, port_base=port_base, environ=env)
    tf_config_text = env.get(TF_CONFIG, "").strip()
    if cluster is None and task is None and not tf_config_text:
        return None
    spec: ClusterSpec | None = None
    task_id: TaskId | None = None
    source = TF_CONFIG
    if tf_config_text:
        spec, task_id = _read_tf_config(tf_config_text, source=TF_CONFIG)
    if cluster is not None:
        spec, flag_task = _cluster_flag(cluster)
        task_id = flag_task or task_id
        source = "--cluster"
    if task is not None:
        task_id = parse_task_flag(task)
        source = "--task"
    if spec is None:
        raise ConfigError(f"{TF_CONFIG}: cluster: missing (or give --cluster)")
    if task_id is None:
        raise ConfigError(f"{TF_CONFIG}: task: missing (or give --task TYPE:INDEX)")
    return _placement(spec, task_id, source=source)


# -- whole steps: which cluster task runs which part of a trace replay -----------


@dataclass(frozen=True, slots=True, kw_only=True)
class WholeStepParts:
    """Which cluster task runs which client and server of a PS-throughput workload.

    Training's worker ``i`` is cluster worker ``i``; a side client runs in the
    task it stands for (a ps calling another ps in that ps task, the chief's
    calls in the chief task); a stand-in server is served by the cluster worker
    that replays that worker, on its own cluster address (a TensorFlow worker
    listens there too).
    """

    #: Server index -> address: the ps tasks', then each stand-in's worker's.
    targets: tuple[str, ...]
    #: (cluster task, workload client index it replays), workers first.
    clients: tuple[tuple[TaskId, int], ...]
    #: Cluster workers that serve a stand-in on their own address.
    stand_ins: tuple[TaskId, ...] = ()

    def client_of(self, task: TaskId) -> int | None:
        """The workload client index ``task`` replays, None when it replays none."""
        return dict(self.clients).get(task)

    @property
    def side_tasks(self) -> tuple[TaskId, ...]:
        """Tasks that replay a side client (not a worker)."""
        return tuple(task for task, _ in self.clients if task.type != WORKER)


def place_whole_steps(
    cluster: ClusterSpec,
    *,
    step_clients: int,
    client_tasks: Sequence[tuple[str, int]],
    server_tasks: Sequence[tuple[str, int]],
) -> WholeStepParts | None:
    """Place a workload's clients and servers (trace tasks as (job, index), in the
    workload's client and server order; the first ``step_clients`` clients are
    training's workers) on the cluster; None when a side client or stand-in has
    no task to run in (a trace's chief in a cluster without one, say)."""
    ps = cluster.addresses(PS)
    workers = cluster.addresses(WORKER)
    stand_in_servers = [task for task in server_tasks if task[0] != PS]
    if len(server_tasks) - len(stand_in_servers) > len(ps):
        return None
    clients = [(TaskId(type=WORKER, index=i), i) for i in range(min(step_clients, len(workers)))]
    targets = list(ps[: len(server_tasks) - len(stand_in_servers)])
    stand_ins = []
    for task in stand_in_servers:
        trained = list(client_tasks[:step_clients])
        replayed_by = trained.index(task) if task in trained else -1
        if not 0 <= replayed_by < len(workers):
            return None
        targets.append(workers[replayed_by])
        stand_ins.append(TaskId(type=WORKER, index=replayed_by))
    for index, (job, task_index) in enumerate(client_tasks[step_clients:], start=step_clients):
        if job == PS and (job, task_index) in server_tasks:
            runner = TaskId(type=PS, index=list(server_tasks).index((job, task_index)))
        elif job == CHIEF and cluster.task_count(CHIEF):
            runner = TaskId(type=CHIEF, index=0)
        else:
            return None
        clients.append((runner, index))
    if len({task for task, _ in clients}) != len(clients):
        return None  # two side clients in one task
    return WholeStepParts(
        targets=tuple(targets), clients=tuple(clients), stand_ins=tuple(stand_ins)
    )
