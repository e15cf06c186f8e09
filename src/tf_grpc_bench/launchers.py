"""Where a launcher put this task: Slurm's environment read as TensorFlow's resolver reads it.

``srun`` starts every task of a job step with the step's layout in its
environment: the task's rank (``SLURM_PROCID``), the step's nodes
(``SLURM_STEP_NODELIST``, a hostlist expression such as ``node[01-03,07]``),
how many tasks run on each (``SLURM_STEP_TASKS_PER_NODE``, such as
``2(x3),1``), and the task's place on its node (``SLURM_LOCALID``).

TensorFlow's ``SlurmClusterResolver`` turns that into a cluster: given the jobs
and their task counts (``{"ps": 2, "worker": 2, "chief": 1}``) and a base port,
every node's tasks get the addresses ``node:port_base``, ``node:port_base+1``,
...; the jobs, in order of their names, take the ranks in order (so ``chief``
gets rank 0, ``ps`` ranks 1-2, ``worker`` ranks 3-4 in that example).  This
module does the same, without TensorFlow, with one difference: the nodes go in
the order Slurm gives them, the order in which its block distribution hands out
ranks, where TensorFlow sorts them by name (the two agree whenever node names
sort as Slurm numbers them, e.g. zero-padded; where they do not, as with
``node9,node10``, TensorFlow's layout gives a rank an address on another node).
A rank's address is then always on the node Slurm ran it on, which
``slurm_placement`` checks against ``SLURMD_NODENAME`` and ``SLURM_LOCALID``
(a ``--distribution=cyclic`` step fails that check, with a message saying so).

Pure: it reads a mapping of environment variables and returns plain data, so
both the replay's ``role`` and the capture's per-task wrapper can use it.
Errors are ``ConfigError`` with one line naming the variable or flag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from tf_grpc_bench.cluster import JOBS, split_address
from tf_grpc_bench.errors import ConfigError

#: TensorFlow's default first port of a node's tasks (``SlurmClusterResolver(port_base=8888)``).
DEFAULT_PORT_BASE = 8888
#: Most tasks a step may have: the layout is built in memory for every task.
MAX_TASKS = 65_536

_RANGE = re.compile(r"(\d+)(?:-(\d+))?$")
_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str, *, source: str) -> list[str]:
    """``a[1,2],b`` -> ``["a[1,2]", "b"]``: commas outside brackets separate parts."""
    parts: list[str] = []
    depth = 0
    current = ""
    for character in text:
        if character == "[":
            if depth:
                raise ConfigError(f"{source} {text!r}: nested '['")
            depth = 1
        elif character == "]":
            if not depth:
                raise ConfigError(f"{source} {text!r}: ']' without '['")
            depth = 0
        elif character == "," and not depth:
            parts.append(current)
            current = ""
            continue
        current += character
    if depth:
        raise ConfigError(f"{source} {text!r}: '[' without ']'")
    parts.append(current)
    if any(not part for part in parts):
        raise ConfigError(f"{source} {text!r}: an empty host name")
    return parts


def _expand_range(body: str, *, source: str) -> list[str]:
    """``01-03,7`` -> ``["01", "02", "03", "7"]``: each range keeps its lower bound's width."""
    numbers: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item)
        if match is None:
            raise ConfigError(f"{source}: [{body}]: expected numbers or ranges like 1-3")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ConfigError(f"{source}: [{body}]: range {item} goes down")
        if int(high) - int(low) + len(numbers) >= MAX_TASKS:
            raise ConfigError(f"{source}: [{body}]: more than {MAX_TASKS} hosts")
        width = len(low)
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return numbers


def expand_hostlist(text: str, *, source: str = "SLURM_STEP_NODELIST") -> tuple[str, ...]:
    """A Slurm hostlist expression -> host names, in order, duplicates kept.

    ``n[1-2],m5,o[3-4,6]`` -> n1 n2 m5 o3 o4 o6; ``node[08-10]`` keeps the
    padding (node08 node09 node10); several brackets in one name expand as
    Slurm does, the last varying fastest (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2).
    """
    stripped = text.strip()
    if not stripped:
        raise ConfigError(f"{source}: empty")
    hosts: list[str] = []
    for part in _split_top_level(stripped, source=source):
        expanded = [""]
        for match in re.finditer(r"([^\[\]]*)(\[([^\]]*)\])?", part):
            literal, bracket, body = match.groups()
            choices = [literal]
            if bracket is not None:
                choices = [literal + n for n in _expand_range(body, source=source)]
            expanded = [prefix + choice for prefix in expanded for choice in choices]
            if len(expanded) + len(hosts) > MAX_TASKS:
                raise ConfigError(f"{source}: more than {MAX_TASKS} hosts")
        hosts += expanded
    return tuple(hosts)


def expand_tasks_per_node(
    text: str, *, source: str = "SLURM_STEP_TASKS_PER_NODE"
) -> tuple[int, ...]:
    """Slurm's tasks-per-node list -> one count per node: ``2(x3),1`` -> (2, 2, 2, 1)."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _TASKS_PER_NODE.match(part.strip())
        if match is None:
            raise ConfigError(f"{source} {text!r}: expected counts like 2(x3),1")
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat == 0 or len(counts) + repeat > MAX_TASKS:
            raise ConfigError(f"{source} {text!r}: repeat count {repeat} out of range")
        counts += [count] * repeat
    return tuple(counts)


def parse_jobs(text: str, *, source: str = "--slurm-jobs") -> tuple[tuple[str, int], ...]:
    """``ps:2,worker:2,chief:1`` -> ((chief, 1), (ps, 2), (worker, 2)): sorted by name, as
    TensorFlow's resolver hands out ranks."""
    jobs: dict[str, int] = {}
    for item in text.split(","):
        name, _, count = item.strip().partition(":")
        if name not in JOBS:
            raise ConfigError(f"{source} {text!r}: job {name!r} is not one of {', '.join(JOBS)}")
        if name in jobs:
            raise ConfigError(f"{source} {text!r}: job {name!r} given twice")
        if not count.isdigit() or int(count) == 0:
            raise ConfigError(f"{source} {text!r}: {name}: expected a task count >= 1")
        jobs[name] = int(count)
    if jobs.get("chief", 0) > 1:
        raise ConfigError(f"{source} {text!r}: there must be at most one chief task")
    return tuple(sorted(jobs.items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmStep:
    """What ``srun`` tells one task about its step."""

    rank: int
    task_count: int
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    #: This task's index on its node (SLURM_LOCALID); None when not given.
    local_id: int | None = None
    #: The node this task runs on (SLURMD_NODENAME); "" when not given.
    node_name: str = ""

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.tasks_per_node):
            raise ValueError(
                f"{len(self.nodes)} nodes but tasks per node for {len(self.tasks_per_node)}"
            )
        if sum(self.tasks_per_node) != self.task_count:
            raise ValueError(
                f"tasks per node add up to {sum(self.tasks_per_node)}, not {self.task_count} tasks"
            )
        if not 0 <= self.rank < self.task_count:
            raise ValueError(f"rank {self.rank} is not in 0..{self.task_count - 1}")


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str]:
    """(name, value) of the first of ``names`` set in ``environ``; ConfigError if none is."""
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    raise ConfigError(f"{' or '.join(names)}: not set (not inside an srun job step?)")


def _integer(name: str, value: str) -> int:
    if not value.isdigit():
        raise ConfigError(f"{name}: expected an integer >= 0, got {value!r}")
    return int(value)


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """True when ``srun`` started this process (a job step's task, not the batch script)."""
    return bool(environ.get("SLURM_PROCID", "").strip()) and bool(
        environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID", "")).strip()
    )


def read_slurm_step(environ: Mapping[str, str]) -> SlurmStep:
    """The step's layout from ``srun``'s variables (the step's, else the job's).

    ConfigError naming the variable when one is missing or malformed, or when
    this is a batch script rather than a task ``srun`` started.
    """
    if not in_slurm_step(environ):
        raise ConfigError(
            "SLURM_PROCID and SLURM_STEP_ID: not set, so not a task of an srun job step "
            "(in a batch script, start the tasks with srun)"
        )
    rank = _integer(*_first(environ, ("SLURM_PROCID",)))
    count = _integer(*_first(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")))
    nodes_name, nodes = _first(environ, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    tasks_name, tasks = _first(environ, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    local = environ.get("SLURM_LOCALID", "").strip()
    try:
        return SlurmStep(
            rank=rank,
            task_count=count,
            nodes=expand_hostlist(nodes, source=nodes_name),
            tasks_per_node=expand_tasks_per_node(tasks, source=tasks_name),
            local_id=_integer("SLURM_LOCALID", local) if local else None,
            node_name=environ.get("SLURMD_NODENAME", "").strip(),
        )
    except ValueError as error:
        raise ConfigError(f"Slurm environment ({nodes_name}, {tasks_name}): {error}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchedTask:
    """A cluster (job name -> addresses, jobs sorted by name) and this task in it."""

    cluster: tuple[tuple[str, tuple[str, ...]], ...]
    job: str
    index: int

    def cluster_dict(self) -> dict[str, list[str]]:
        """The ``cluster`` object of a TF_CONFIG."""
        return {name: list(addresses) for name, addresses in self.cluster}


def slurm_addresses(step: SlurmStep, port_base: int) -> tuple[str, ...]:
    """Every rank's address: each node's tasks at ``port_base``, ``port_base + 1``, ..."""
    if port_base <= 0 or port_base + max(step.tasks_per_node) - 1 > 65_535:
        raise ConfigError(
            f"--port-base {port_base}: the node's {max(step.tasks_per_node)} tasks need ports "
            "in 1..65535"
        )
    return tuple(
        f"{node}:{port_base + offset}"
        for node, count in zip(step.nodes, step.tasks_per_node, strict=True)
        for offset in range(count)
    )


def slurm_placement(
    step: SlurmStep, jobs: tuple[tuple[str, int], ...], *, port_base: int = DEFAULT_PORT_BASE
) -> LaunchedTask:
    """This task's cluster and place, laid out as ``SlurmClusterResolver`` lays them out.

    ``jobs`` as ``parse_jobs`` returns them; their counts must add up to the
    step's tasks.  ConfigError when they do not, or when Slurm ran this rank
    somewhere other than its address (a non-block distribution).
    """
    wanted = sum(count for _, count in jobs)
    if wanted != step.task_count:
        given = ",".join(f"{name}:{count}" for name, count in jobs)
        raise ConfigError(
            f"--slurm-jobs {given}: {wanted} tasks, but the Slurm step has {step.task_count} "
            "(srun -n)"
        )
    addresses = slurm_addresses(step, port_base)
    cluster = []
    job, index, start = "", 0, 0
    for name, count in jobs:
        cluster.append((name, addresses[start : start + count]))
        if start <= step.rank < start + count:
            job, index = name, step.rank - start
        start += count
    host, port = split_address(addresses[step.rank], where="Slurm layout")
    offset = port - port_base
    if (step.node_name and step.node_name != host) or (
        step.local_id is not None and step.local_id != offset
    ):
        raise ConfigError(
            f"Slurm ran rank {step.rank} as task {step.local_id} of node "
            f"{step.node_name or '?'}, but the block layout puts it as task {offset} of {host}: "
            "start the step with srun --distribution=block (the default)"
        )
    return LaunchedTask(cluster=tuple(cluster), job=job, index=index)
