"""A TensorFlow cluster as launchers describe it: job names, task addresses and ``TF_CONFIG``.

A launcher that starts distributed TensorFlow training (a Kubernetes TFJob, a
SLURM script using TensorFlow's cluster resolvers) gives every task the same
``TF_CONFIG`` environment variable, differing only in ``task``::

    {"cluster": {"chief": ["h0:2222"], "ps": ["h1:2222"], "worker": ["h2:2222", "h3:2222"]},
     "task": {"type": "worker", "index": 1}}

This module is the one reader of that document and of its parts, the way
TensorFlow's ``TFConfigClusterResolver`` and ``multi_worker_util`` read them (job
names chief/worker/ps/evaluator, at most one chief, a job's tasks as a list or
as an ``{"index": address}`` object), and of a task's ``host:port``
(``split_address``).  The replay's placement (``replay/placement/cluster.py``)
and the capture's task identity (``profiler/launch/identity.py``) both read
clusters here; the capture, which records a user's own script, also takes job
names TensorFlow's multi-worker strategies do not know (``jobs=None``).

Pure: parsing and validation only, no sockets, no TensorFlow; the one file it
reads is the one a ``--cluster @FILE`` flag names.  Errors are ``ConfigError``
with one line naming the source and field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.files import loads_json

TF_CONFIG = "TF_CONFIG"
CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
#: The job names TensorFlow's multi-worker strategies accept.
JOBS = (CHIEF, WORKER, PS, EVALUATOR)

_ADDRESS = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:\[\]/]+)):(?P<port>[0-9]+)$")


def split_address(address: str, *, where: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ConfigError naming ``where``."""
    match = _ADDRESS.match(address)
    port = int(match["port"]) if match else 0
    if not match or not 0 < port < 65536:
        raise ConfigError(f"{where}: expected 'host:port', got {address!r}")
    return (match["ipv6"] or match["host"], port)


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

    @classmethod
    def of(cls, jobs: Mapping[str, tuple[str, ...]]) -> ClusterSpec:
        """The cluster of ``jobs`` (``cluster_jobs``' result), its jobs in ``JOBS`` order."""
        return cls(jobs=tuple((job, jobs[job]) for job in JOBS if job in jobs))

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


def _job_tasks(tasks: Any, *, where: str) -> tuple[str, ...]:
    """One job's task addresses: a list, or an object mapping index (0..n-1) to address."""
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
    return tuple(tasks)


def cluster_jobs(
    value: Any, *, source: str, jobs: Sequence[str] | None = JOBS
) -> dict[str, tuple[str, ...]]:
    """A ``cluster`` object (already decoded JSON) -> job -> task addresses, in its order.

    Each job's tasks are a list of addresses, or an object mapping task index
    (as a string or number) to address; indices must then be 0..n-1.  ``jobs``:
    the job names allowed (None: any name, as a user's own script may use).
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: cluster must be a JSON object of job -> addresses")
    names = JOBS if jobs is None else tuple(jobs)
    found = {
        job: _job_tasks(value[job], where=f"{source}: cluster.{job}")
        for job in (*names, *(k for k in value if k not in names and jobs is None))
        if job in value
    }
    unknown = sorted(str(k) for k in value if k not in found)
    if unknown:
        raise ConfigError(
            f"{source}: cluster.{unknown[0]}: unknown job (expected {', '.join(names)})"
        )
    if len(found.get(CHIEF, ())) > 1:
        raise ConfigError(f"{source}: cluster.chief: there must be at most one chief task")
    return {job: found[job] for job in value}


def parse_cluster(value: Any, *, source: str) -> ClusterSpec:
    """A ``cluster`` object (already decoded JSON) -> ClusterSpec (``cluster_jobs``)."""
    return ClusterSpec.of(cluster_jobs(value, source=source))


def task_type_and_index(
    value: Any, *, source: str, jobs: Sequence[str] | None = JOBS
) -> tuple[str, int]:
    """A ``task`` object ``{"type": ..., "index": ...}`` -> (type, index).

    ``jobs``: the task types allowed (None: any name).  The index may be a
    number or a string of digits, 0 when absent.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: task must be a JSON object with type and index")
    task_type = value.get("type")
    if not isinstance(task_type, str) or (jobs is not None and task_type not in jobs):
        expected = ", ".join(JOBS if jobs is None else jobs)
        raise ConfigError(f"{source}: task.type: expected one of {expected}, got {task_type!r}")
    index = value.get("index", 0)
    if isinstance(index, str) and index.isdigit():
        index = int(index)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"{source}: task.index: expected an integer >= 0, got {index!r}")
    return task_type, index


def parse_task(value: Any, *, source: str) -> TaskId:
    """A ``task`` object ``{"type": ..., "index": ...}`` -> TaskId."""
    task_type, index = task_type_and_index(value, source=source)
    return TaskId(type=task_type, index=index)


def decode_json(text: str, *, source: str) -> Any:
    """``text`` as JSON; ConfigError naming ``source`` and where it stops being JSON."""
    try:
        return loads_json(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source}: not valid JSON ({error.msg} at char {error.pos})") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterDocument:
    """What a TF_CONFIG document or a ``--cluster`` flag gives: either part may be absent."""

    #: Job -> task addresses, in the document's order; None when not given.
    cluster: dict[str, tuple[str, ...]] | None
    #: (task type, index); None when not given.
    task: tuple[str, int] | None


def read_tf_config(
    text: str, *, source: str = TF_CONFIG, jobs: Sequence[str] | None = JOBS
) -> ClusterDocument:
    """The cluster and task a TF_CONFIG document gives (either may be absent).

    ``rpc_layer``, when given, must be ``grpc`` (the only transport captured and replayed);
    ``environment`` and other keys TensorFlow tolerates are ignored.  ``jobs``:
    the job names allowed (None: any).
    """
    document = decode_json(text, source=source)
    if not isinstance(document, Mapping):
        raise ConfigError(f"{source}: expected a JSON object with cluster and task")
    rpc_layer = document.get("rpc_layer", "grpc")
    if rpc_layer != "grpc":
        raise ConfigError(f"{source}: rpc_layer: only 'grpc' is supported, got {rpc_layer!r}")
    cluster = task = None
    if "cluster" in document:
        cluster = cluster_jobs(document["cluster"], source=source, jobs=jobs)
    if "task" in document:
        task = task_type_and_index(document["task"], source=source, jobs=jobs)
    return ClusterDocument(cluster=cluster, task=task)


def read_cluster_flag(
    text: str, *, flag: str = "--cluster", jobs: Sequence[str] | None = JOBS
) -> ClusterDocument:
    """A ``--cluster`` value: JSON text, or a JSON file (``PATH`` or ``@PATH``); a bare
    cluster object or a whole TF_CONFIG document (whose task, if any, comes too)."""
    stripped = text.strip()
    source = flag
    if not stripped.startswith("{"):
        path = Path(stripped.removeprefix("@"))
        try:
            stripped = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(
                f"{flag} {text}: not JSON, nor a readable file ({error.strerror})"
            ) from None
        source = f"{flag} {path}"
    document = decode_json(stripped, source=source)
    if isinstance(document, Mapping) and "cluster" in document:
        task = None
        if "task" in document:
            task = task_type_and_index(document["task"], source=source, jobs=jobs)
        return ClusterDocument(
            cluster=cluster_jobs(document["cluster"], source=source, jobs=jobs), task=task
        )
    return ClusterDocument(cluster=cluster_jobs(document, source=source, jobs=jobs), task=None)


def read_cluster(
    text: str, *, flag: str = "--cluster", jobs: Sequence[str] | None = JOBS
) -> dict[str, tuple[str, ...]]:
    """The cluster of a ``--cluster`` value (``read_cluster_flag``), any task it names left out."""
    cluster = read_cluster_flag(text, flag=flag, jobs=jobs).cluster
    assert cluster is not None  # a --cluster value always gives one
    return cluster
