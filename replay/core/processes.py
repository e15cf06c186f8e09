"""How many client processes a worker gets, and which of its calls each one makes.

Pure: no gRPC, no clocks, no IO (the cores a process may use are given).

A PS-throughput worker's share of a step may be spread over K client
processes (``--procs-per-worker``), so that a host with more cores than
workers is not held to one Python interpreter per worker.  The split
(docs/scaling.md, "More than one process per worker"):

* Calls are grouped into *lanes*, and every call of a lane goes to the same
  process in every step, in the step's order.  While the worker calls at least
  K ps, a lane is one ps: each (worker, ps) pair keeps its order and its
  recorded concurrency exactly as with one process.  With fewer ps than K, a
  lane is one tensor of one ps (its trace edge, or for calls without a name
  their place in the step), so a single ps's calls can be spread too.
* Lanes go to processes greedily by the bytes they move over a pass, largest
  first, each to the least-loaded process (the lowest index on a tie):
  deterministic, so every process computes the same split.
* Dependencies (``dependencies``) are a worker's, across lanes: a gradient
  waits for the forward pass's variables from every ps.  Each process tracks
  the whole worker-step and learns of the other processes' completions as they
  happen (``transport.peers``); a step ends when all of the worker's calls
  have ended, in every process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.workload import Call, Workload

#: ``--procs-per-worker auto``: from the cores this process may use.
AUTO = "auto"
#: Most client processes one worker may have (the whole replay is also held to
#: ``runner.MAX_LOCAL_PROCESSES``).
MAX_PROCS_PER_WORKER = 64


def parse_procs_per_worker(text: str, flag: str = "--procs-per-worker") -> int | None:
    """A count in 1..``MAX_PROCS_PER_WORKER``, or None for ``auto``; ConfigError otherwise."""
    value = text.strip()
    if value.lower() == AUTO:
        return None
    try:
        count = int(value)
    except ValueError:
        raise ConfigError(f"{flag}: expected {_EXPECTED}, got {text!r}") from None
    check_procs_per_worker(count, flag)
    return count


_EXPECTED = f"a whole number in 1..{MAX_PROCS_PER_WORKER} or '{AUTO}'"


def check_procs_per_worker(count: int, flag: str = "--procs-per-worker") -> None:
    """ConfigError unless ``count`` is in 1..``MAX_PROCS_PER_WORKER``."""
    if not 1 <= count <= MAX_PROCS_PER_WORKER:
        raise ConfigError(f"{flag}: expected {_EXPECTED}, got {count}")


def automatic_procs_per_worker(*, cores: int, workers: int, servers: int) -> int:
    """Client processes per worker for ``auto``: the cores left by the local servers,
    shared by the workers (at least one each, at most ``MAX_PROCS_PER_WORKER``).

    ``servers`` counts the ps server processes that share these cores (0 when the
    servers run elsewhere); ``workers`` the workers replayed from here.
    """
    if cores < 1 or workers < 1 or servers < 0:
        raise ValueError(f"cores {cores}, workers {workers}, servers {servers}")
    return max(1, min((cores - servers) // workers, MAX_PROCS_PER_WORKER))


def lane_of(call: Call, position: int, *, by_server: bool) -> tuple[int, str]:
    """The lane of a call at ``position`` in its step (see the module docstring)."""
    if by_server:
        return call.server_index, ""
    if call.tensor_name:
        return call.server_index, call.tensor_name
    # The chunks of one payload share the lane of its first chunk.
    place = call.rpc_index if call.rpc_index >= 0 else position - call.chunk_index
    return call.server_index, f"#{place}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessSplit:
    """Which process makes each call of one worker's steps.

    ``owners[s][i]`` is the process of call ``i`` of step ``s`` (in
    ``workload.steps`` order); ``count`` is how many processes the worker has
    (at most the number of lanes: a process without a lane would make no call).
    """

    count: int
    owners: tuple[tuple[int, ...], ...]

    def owned(self, step: int, process: int) -> tuple[int, ...]:
        """Indices of the calls of step ``step`` that ``process`` makes, in order."""
        return tuple(i for i, owner in enumerate(self.owners[step]) if owner == process)


def split_worker(workload: Workload, processes: int) -> ProcessSplit:
    """Split one worker's calls (``Workload.for_worker``) over ``processes`` processes."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    by_server = len(workload.servers_used) >= processes
    lanes = [
        [lane_of(call, position, by_server=by_server) for position, call in enumerate(step.calls)]
        for step in workload.steps
    ]
    weights: dict[tuple[int, str], int] = {}
    for step, step_lanes in zip(workload.steps, lanes, strict=True):
        for call, lane in zip(step.calls, step_lanes, strict=True):
            weights[lane] = weights.get(lane, 0) + call.request_bytes + call.response_bytes
    count = min(processes, len(weights)) or 1
    owner = _greedy(weights, count)
    return ProcessSplit(
        count=count,
        owners=tuple(tuple(owner[lane] for lane in step_lanes) for step_lanes in lanes),
    )


def _greedy(weights: dict[tuple[int, str], int], count: int) -> dict[tuple[int, str], int]:
    loads = [0] * count
    owner: dict[tuple[int, str], int] = {}
    for lane in sorted(weights, key=lambda lane: (-weights[lane], lane)):
        process = min(range(count), key=lambda p: (loads[p], p))
        owner[lane] = process
        loads[process] += weights[lane]
    return owner


def process_loads(workload: Workload, split: ProcessSplit) -> tuple[int, ...]:
    """Bytes (both directions) each process moves over a pass."""
    loads = [0] * split.count
    for step, owners in zip(workload.steps, split.owners, strict=True):
        for call, owner in zip(step.calls, owners, strict=True):
            loads[owner] += call.request_bytes + call.response_bytes
    return tuple(loads)


def calls_of(calls: Sequence[Call], owned: Sequence[int]) -> tuple[Call, ...]:
    return tuple(calls[i] for i in owned)


def client_processes(workload: Workload, procs_per_worker: int) -> tuple[int, ...]:
    """How many client processes each worker that makes calls gets (at most one per lane)."""
    return tuple(
        split_worker(workload.for_worker(worker), procs_per_worker).count
        for worker in sorted({call.worker_index for call in workload.calls})
    )
