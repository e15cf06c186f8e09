"""Which task of a cluster this process is, and its command with the task filled in.

A launcher (a shell loop, ``srun``, a Kubernetes pod) starts the same command on
every host; each copy must learn which task it runs.  TensorFlow's own
convention is the ``TF_CONFIG`` environment variable (``{"cluster": {...},
"task": {"type": "ps", "index": 0}}``); a plain script may instead take its role
as flags (``--job ps --task 0 --cluster JSON``); under ``srun`` the task can
also be laid out from Slurm's environment (``--slurm-jobs ps:1,worker:2``, as
``role`` does, by ``tf_grpc_bench.launchers``).  ``identify_task`` is the one
place a task's identity is decided (``record`` uses it), and
``expand_placeholders`` writes it into a command: ``{job}``, ``{task}``,
``{cluster}`` (the cluster as JSON) and ``{port}`` (this task's port).

Pure: no IO beyond reading the mapping it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench import launchers
from tf_grpc_bench.cluster import read_cluster, read_tf_config, split_address
from tf_grpc_bench.errors import ConfigError

#: Where a ``TaskIdentity`` came from.
TF_CONFIG = "TF_CONFIG"
FLAGS = "flags"
SLURM = "Slurm"

#: The placeholders ``expand_placeholders`` fills in; other braces are left alone
#: (a JSON argument stays as written).
PLACEHOLDERS = ("job", "task", "cluster", "port")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskIdentity:
    """One task of a cluster: its job, its index and the whole cluster (job -> addresses)."""

    job: str
    index: int
    cluster: Mapping[str, tuple[str, ...]]
    #: Where the identity came from (``TF_CONFIG``, ``FLAGS``, ``SLURM``), for messages.
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "task"
        if self.job not in self.cluster:
            jobs = ", ".join(sorted(self.cluster)) or "none"
            raise ConfigError(f"{where}: job {self.job!r} is not in the cluster (jobs: {jobs})")
        count = len(self.cluster[self.job])
        if not 0 <= self.index < count:
            raise ConfigError(
                f"{where}: task index {self.index} is out of range: job {self.job!r} has "
                f"{count} task{'s' if count != 1 else ''}"
            )

    @property
    def name(self) -> str:
        """``job:index``."""
        return f"{self.job}:{self.index}"

    @property
    def address(self) -> str:
        """This task's ``host:port`` in the cluster."""
        return self.cluster[self.job][self.index]

    @property
    def port(self) -> int:
        return split_address(self.address, where=f"cluster job {self.job!r}")[1]

    def cluster_json(self) -> str:
        """The cluster as compact JSON (what ``{cluster}`` becomes)."""
        return json.dumps(
            {job: list(tasks) for job, tasks in self.cluster.items()}, separators=(",", ":")
        )

    def tf_config(self) -> str:
        """This task's ``TF_CONFIG`` (JSON), for a command that reads it."""
        return json.dumps(
            {
                "cluster": {job: list(tasks) for job, tasks in self.cluster.items()},
                "task": {"type": self.job, "index": self.index},
                "rpc_layer": "grpc",
            },
            separators=(",", ":"),
        )


def identify_task(
    environment: Mapping[str, str],
    *,
    job: str = "",
    index: int | None = None,
    cluster: str = "",
    slurm_jobs: str = "",
    port_base: int = launchers.DEFAULT_PORT_BASE,
) -> TaskIdentity:
    """This process's task: from ``TF_CONFIG`` in ``environment``, else the flags, else Slurm.

    ``TF_CONFIG`` wins when it is set and names a task; the flags (``job``,
    ``index`` and ``cluster``, JSON or ``@FILE`` as ``read_cluster`` reads it)
    are for launchers that set no ``TF_CONFIG``; ``slurm_jobs`` (``ps:1,worker:2``)
    lays the task out from ``srun``'s variables in ``environment`` as
    ``SlurmClusterResolver`` does, each node's tasks on ``port_base``,
    ``port_base + 1``, ...  Every source given must agree with the one used:
    giving two, differently, is an error rather than a silent choice.
    ConfigError (one line naming the variable or flag) when none says which
    task this is.
    """
    text = environment.get("TF_CONFIG", "").strip()
    slurm = _from_slurm(environment, slurm_jobs, port_base) if slurm_jobs else None
    if text:
        found = _from_tf_config(text)
        _check_flags(found, job=job, index=index, cluster=cluster)
        if slurm is not None:
            _check_agree(found, slurm)
        return found
    if slurm is not None:
        _check_flags(slurm, job=job, index=index, cluster=cluster)
        return slurm
    if not job or index is None or not cluster:
        if launchers.in_slurm_step(environment):
            raise ConfigError(
                "which task is this? TF_CONFIG is not set; under srun, give --slurm-jobs "
                "(e.g. ps:1,worker:2), or --job, --task and --cluster"
            )
        raise ConfigError(
            "which task is this? TF_CONFIG is not set; give --job, --task and --cluster"
        )
    return TaskIdentity(
        job=job, index=index, cluster=read_cluster(cluster, jobs=None), source=FLAGS
    )


def _source_name(task: TaskIdentity) -> str:
    return "--slurm-jobs" if task.source == SLURM else task.source


def _check_flags(found: TaskIdentity, *, job: str, index: int | None, cluster: str) -> None:
    """ConfigError when ``--job``, ``--task`` or ``--cluster`` contradict ``found``."""
    where = _source_name(found)
    if (job and job != found.job) or (index is not None and index != found.index):
        raise ConfigError(
            f"{where} names task {found.name} but --job/--task say "
            f"{job or found.job}:{found.index if index is None else index}"
        )
    if cluster and dict(read_cluster(cluster, jobs=None)) != dict(found.cluster):
        raise ConfigError(f"{where}'s cluster differs from --cluster: give one of them")


def _check_agree(found: TaskIdentity, slurm: TaskIdentity) -> None:
    """ConfigError when TF_CONFIG and the Slurm layout place this task differently."""
    if found.name != slurm.name:
        raise ConfigError(
            f"TF_CONFIG names task {found.name} but --slurm-jobs lays this srun task out as "
            f"{slurm.name}: give one of them"
        )
    if dict(found.cluster) != dict(slurm.cluster):
        raise ConfigError(
            "TF_CONFIG's cluster differs from the one --slurm-jobs lays out from Slurm's "
            f"environment ({slurm.cluster_json()}): give one of them"
        )


def _from_slurm(environment: Mapping[str, str], jobs: str, port_base: int) -> TaskIdentity:
    """The task ``srun`` started, laid out by ``launchers`` (the same layout as ``role``'s)."""
    step = launchers.read_slurm_step(environment)
    launched = launchers.slurm_placement(step, launchers.parse_jobs(jobs), port_base=port_base)
    return TaskIdentity(
        job=launched.job,
        index=launched.index,
        cluster={name: addresses for name, addresses in launched.cluster},
        source=SLURM,
    )


def _from_tf_config(text: str) -> TaskIdentity:
    """The task a TF_CONFIG names (``tf_grpc_bench.cluster.read_tf_config``, any job names)."""
    document = read_tf_config(text, source=TF_CONFIG, jobs=None)
    if document.task is None:
        raise ConfigError('TF_CONFIG: expected a "task" like {"type": "ps", "index": 0}')
    if document.cluster is None:
        raise ConfigError('TF_CONFIG: expected a "cluster" like {"ps": ["host:2222"], ...}')
    job, index = document.task
    return TaskIdentity(job=job, index=index, cluster=document.cluster, source=TF_CONFIG)


def expand_placeholders(command: Sequence[str], task: TaskIdentity) -> tuple[str, ...]:
    """``command`` with ``{job}``, ``{task}``, ``{cluster}`` and ``{port}`` replaced by ``task``'s.

    Only those four names in braces are replaced, anywhere in an argument
    (``--port={port}`` too); any other brace stays as written.
    """
    values = {
        "job": task.job,
        "task": str(task.index),
        "cluster": task.cluster_json(),
        "port": str(task.port),
    }
    return tuple(_PLACEHOLDER.sub(lambda match: values[match.group(1)], arg) for arg in command)
