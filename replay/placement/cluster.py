"""Placement of replay roles by TensorFlow's cluster conventions, without TensorFlow.

A launcher that starts distributed TensorFlow training gives every task the
same ``TF_CONFIG`` environment variable, differing only in ``task``; it is read
by ``tf_grpc_bench.cluster`` (the one reader of clusters and TF_CONFIG).  This
module resolves this task's placement as TensorFlow's ``TFConfigClusterResolver``
does (the task type and index given by ``task`` or overridden by flags), and
maps each task to its replay role:

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

from tf_grpc_bench import launchers
from tf_grpc_bench.cluster import (
    CHIEF,
    EVALUATOR,
    PS,
    TF_CONFIG,
    WORKER,
    ClusterDocument,
    ClusterSpec,
    TaskId,
    decode_json,
    parse_cluster,
    parse_task,
    read_cluster_flag,
    read_tf_config,
)
from tf_grpc_bench.errors import ConfigError, UsageError


class Role(enum.Enum):
    """What a task does in a replay."""

    SERVE = "serve"
    REPLAY = "replay"
    GATHER = "gather"


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


def parse_task_flag(text: str) -> TaskId:
    """``--task worker:1`` (or a JSON ``task`` object)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        return parse_task(decode_json(stripped, source="--task"), source="--task")
    task_type, _, index = stripped.partition(":")
    if not index.isdigit():
        raise ConfigError(f"--task {text!r}: expected TYPE:INDEX, e.g. worker:0")
    return parse_task({"type": task_type, "index": int(index)}, source="--task")


def _placement(cluster: ClusterSpec, task: TaskId, *, source: str) -> Placement:
    try:
        return Placement(cluster=cluster, task=task)
    except ValueError as error:
        raise ConfigError(f"{source}: {error}") from None


def _spec_and_task(document: ClusterDocument) -> tuple[ClusterSpec | None, TaskId | None]:
    """A document's cluster and task (``read_tf_config``, ``read_cluster_flag``) as typed values."""
    spec = None if document.cluster is None else ClusterSpec.of(document.cluster)
    task = None if document.task is None else TaskId(type=document.task[0], index=document.task[1])
    return spec, task


def parse_tf_config(text: str, *, source: str = TF_CONFIG) -> Placement:
    """A full TF_CONFIG document (cluster and task both required) -> Placement."""
    spec, task = _spec_and_task(read_tf_config(text, source=source))
    if spec is None:
        raise ConfigError(f"{source}: cluster: missing")
    if task is None:
        raise ConfigError(f"{source}: task: missing")
    return _placement(spec, task, source=source)


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
        spec, task_id = _spec_and_task(read_tf_config(tf_config_text, source=TF_CONFIG))
    if cluster is not None:
        spec, flag_task = _spec_and_task(read_cluster_flag(cluster))
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
