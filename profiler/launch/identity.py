"""Which task of a cluster this process is, and its command with the task filled in.

A launcher (a shell loop, ``srun``, a Kubernetes pod) starts the same command on
every host; each copy must learn which task it runs.  TensorFlow's own
convention is the ``TF_CONFIG`` environment variable (``{"cluster": {...},
"task": {"type": "ps", "index": 0}}``); a plain script may instead take its role
as flags (``--job ps --task 0 --cluster JSON``).  ``identify_task`` is the one
place a task's identity is decided (``record`` and ``capture-job`` use it; a
launcher's own environment, Slurm's for one, belongs here too), and
``expand_placeholders`` writes it into a command: ``{job}``, ``{task}``,
``{cluster}`` (the cluster as JSON) and ``{port}`` (this task's port).

Pure: no IO beyond reading the mapping it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.profiler.launch.user_job import parse_cluster, split_address

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
    #: Where the identity came from ("TF_CONFIG", "flags"), for messages.
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


def identify_task(
    environment: Mapping[str, str],
    *,
    job: str = "",
    index: int | None = None,
    cluster: str = "",
) -> TaskIdentity:
    """This process's task: from ``TF_CONFIG`` in ``environment``, else from the flags.

    ``TF_CONFIG`` wins when it is set and names a task; the flags (``job``,
    ``index`` and ``cluster``, JSON or ``@FILE`` as ``parse_cluster`` reads it)
    are for launchers that set no ``TF_CONFIG``.  Giving both, differently, is
    an error rather than a silent choice.  ConfigError (one line naming the
    variable or flag) when neither says which task this is.
    """
    text = environment.get("TF_CONFIG", "").strip()
    if text:
        found = _from_tf_config(text)
        if (job and job != found.job) or (index is not None and index != found.index):
            raise ConfigError(
                f"TF_CONFIG names task {found.name} but --job/--task say "
                f"{job or found.job}:{found.index if index is None else index}"
            )
        if cluster and dict(parse_cluster(cluster)) != dict(found.cluster):
            raise ConfigError("TF_CONFIG's cluster differs from --cluster: give one of them")
        return found
    if not job or index is None or not cluster:
        raise ConfigError(
            "which task is this? TF_CONFIG is not set; give --job, --task and --cluster"
        )
    return TaskIdentity(job=job, index=index, cluster=parse_cluster(cluster), source="flags")


def _from_tf_config(text: str) -> TaskIdentity:
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"TF_CONFIG: not JSON ({error})") from None
    task = document.get("task") if isinstance(document, dict) else None
    if not isinstance(task, dict) or not isinstance(task.get("type"), str):
        raise ConfigError('TF_CONFIG: expected a "task" like {"type": "ps", "index": 0}')
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        raise ConfigError(f"TF_CONFIG: task index must be an integer, got {index!r}")
    if not isinstance(document.get("cluster"), dict):
        raise ConfigError('TF_CONFIG: expected a "cluster" like {"ps": ["host:2222"], ...}')
    cluster = parse_cluster(json.dumps(document["cluster"]))
    return TaskIdentity(job=task["type"], index=index, cluster=cluster, source="TF_CONFIG")


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
