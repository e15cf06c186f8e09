"""A benchmark's compute load at run time (``--compute-load``, ``core.compute_load``).

``ComputeLoad`` starts the burners (``burners``) before the worker processes,
so that each client task's first process gets the write end of its burner's
gaps; after the warm-up it measures the replay's own CPU over the warm-up's
steps (every process descending from this one, burners left out), sizes the
load from it and the trace (``core.compute_load.size_load``) and sets the
burners going (the ``uniform`` part as quotas a round); at each measured run's
start the quotas are owed afresh, every round the first training worker's
process begins (``round_clock``), and around it it measures what the burners
spent, and what of their rounds' quotas they did in time, which the result
reports apart from the replay's CPU (``parameters``); with
``--compute-load-wait`` the rounds wait for the quotas (``burners.RoundSignal.wait``),
and it reports how long.  With ``--compute-load none`` it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core import compute_load
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Timing
from tf_grpc_bench.replay.transport.burners import (
    Burners,
    QuotaRounds,
    QuotaWaits,
    RoundClock,
    tree_cpu_ns,
)
from tf_grpc_bench.replay.transport.client import ReplayClient
from tf_grpc_bench.replay.transport.seam import WorkerJob

#: How long a server has to answer for its CPU.
STATS_TIMEOUT_S = 10.0


@dataclass
class Measured:
    """What one measured run's caller tells: how many steps it replayed."""

    steps: int = 0


class ComputeLoad:
    """The burners of one benchmark's workers (``jobs``), sized after the warm-up."""

    def __init__(self, jobs: Sequence[WorkerJob]) -> None:
        self.mode = compute_load.check_mode(jobs[0].plan.compute_load)
        if self.mode == compute_load.AUTO:
            raise ValueError("the plan's compute load is chosen before it runs (choose)")
        self._auto = jobs[0].plan.compute_load_auto
        job = jobs[0]
        paced = job.pacing.timing is Timing.DEPENDENCIES
        if (
            self._auto
            and self.mode != compute_load.NONE
            and not (paced and job.workload.benchmark == Benchmark.PS_THROUGHPUT)
        ):
            self.mode = compute_load.NONE
            self._auto = "not a ps-throughput benchmark paced by its dependencies"
        self._jobs = tuple(jobs)
        self._dilation = jobs[0].plan.time_dilation
        self._wait = jobs[0].plan.compute_load_wait
        self._waits = QuotaWaits()
        self.sizing: compute_load.ComputeLoadSizing | None = None
        self._burners: Burners | None = None
        self._cpu_ns = self._wall_ns = self._steps = 0
        self._quota = QuotaRounds()
        if self.mode != compute_load.NONE:
            gap_tasks = len(jobs) if self.mode == compute_load.GAPS else 0
            self._burners = Burners(gap_tasks)

    def gap_writer(self, job: int) -> Any:
        """Where job ``job``'s first process sends its gaps (None: nowhere)."""
        if self._burners is None or not self._burners.gap_writers:
            return None
        return self._burners.gap_writers[job]

    def round_clock(self, job: int) -> RoundClock | None:
        """Where job ``job``'s first process tells each round's start (None: it does not):
        the first job standing for a training worker (not a side client)."""
        if self._burners is None:
            return None
        side = self._jobs[0].workload.side_workers
        training = [n for n, j in enumerate(self._jobs) if j.worker_index not in side]
        return self._burners.rounds if training[:1] == [job] else None

    def replay_cpu_ns(self) -> int:
        """The replay's own processes' CPU so far (ns; 0 without a load): the servers'
        as they report it (wherever they run: ``network compare`` starts them beside this
        process), and this process's and its descendants' but the burners' and servers'."""
        if self._burners is None:
            return 0
        job = self._jobs[0]
        servers = sorted({s for j in self._jobs for s in j.workload.servers_used})
        stats = []
        for server in servers:
            client = ReplayClient(job.targets[server], mode=job.workload.mode, settings=job.channel)
            try:
                stats.append(client.stats(STATS_TIMEOUT_S))
            finally:
                client.close()
        own = tree_cpu_ns(os.getpid(), exclude=(*self._burners.pids, *(s.pid for s in stats)))
        return own + sum(s.cpu_ns for s in stats)

    def size(self, *, replay_cpu_ns: int, steps: int, wall_ns: int = 0) -> None:
        """Size the load from the warm-up (``replay_cpu_ns`` over ``steps`` whole steps
        replayed in ``wall_ns``) and start it."""
        if self._burners is None:
            return
        if steps <= 0 and self._auto:
            # auto's load is a default, not asked for: the replay goes on without it.
            self._burners.close()
            self._burners = None
            self.mode = compute_load.NONE
            self._auto = "the warm-up replayed no whole step to size it by (lengthen --warmup)"
            return
        if steps <= 0:
            raise TransportError(
                "during warm-up: --compute-load needs the warm-up to replay a whole step "
                "(it measures the replay's own CPU a step); lengthen --warmup"
            )
        workloads = [job.workload for job in self._jobs]
        cores = compute_load.tasks_cores_of(workloads[0])
        if cores is None:
            raise TransportError(
                "--compute-load: the trace records no capture CPU (capture_cpu_* entries)"
            )
        gaps = compute_load.task_gaps_ns(workloads)
        self.sizing = compute_load.size_load(
            self.mode,
            tasks_cores=cores,
            step_ns=compute_load.mean_period_ns(workloads[0]),
            gaps_ns=sum(gaps),
            replay_cpu_ns=replay_cpu_ns / steps,
            compute_scale=self._jobs[0].pacing.compute_scale,
            path_gaps_ns=max(gaps, default=0.0),
            replayed_step_ns=wall_ns / steps / self._dilation,
        )
        gap_cores, _ = self.sizing.wall_cores(self._dilation)
        # Waited for, the quota is split over a burner per core (``burner_quotas``).
        cores = len(os.sched_getaffinity(0)) if self._wait else 1
        quotas, step = compute_load.burner_quotas(self.sizing, self._dilation, at_least=cores)
        self._burners.set_load(gap_cores, quotas, step, wait=self._wait)

    @contextlib.contextmanager
    def measuring(self) -> Iterator[Measured]:
        """Around a measured run: the quotas owed every round from its first, the
        burners' CPU and wall time over it, and what the rounds' quotas owed and had done
        (the last round's ends with the run)."""
        measured = Measured()
        if self._burners is not None:
            self._burners.restart_quotas()
        cpu = 0 if self._burners is None else self._burners.cpu_ns()
        waits = QuotaWaits() if self._burners is None else self._burners.rounds.waits()
        wall = time.monotonic_ns()
        try:
            yield measured
        finally:
            if self._burners is not None:
                rounds = self._burners.end_rounds()
                elapsed = time.monotonic_ns() - wall
                self._cpu_ns += self._burners.cpu_ns() - cpu
                self._quota = QuotaRounds(
                    rounds=self._quota.rounds + rounds.rounds,
                    owed_ns=self._quota.owed_ns + rounds.owed_ns,
                    done_ns=self._quota.done_ns + rounds.done_ns,
                    short=self._quota.short + rounds.short,
                )
                self._waits += self._burners.rounds.waits() - waits
                self._wall_ns += elapsed
                self._steps += measured.steps

    def parameters(self) -> dict[str, str | int | float | bool]:
        """The result's entries: the mode, its sizing, and the burners' CPU (not the
        replay's: ``client_cpu_ns`` and ``server_cpu_ns`` leave it out), in the time of
        the training predicted, the share of their rounds' quotas the quota burners
        did in time over the measured runs, and of the rounds, those a burner ended
        short."""
        if self.mode == compute_load.NONE and not self._auto:
            return {}
        parameters: dict[str, str | int | float | bool] = {"compute_load": self.mode}
        if self._auto:
            parameters[compute_load.AUTO_ENTRY] = self._auto
        if self.sizing is not None:
            parameters["compute_load_sizing"] = self.sizing.text()
        if self._wall_ns > 0:
            parameters["compute_load_cpu_cores"] = round(self._cpu_ns / self._wall_ns, 3)
        if self._steps > 0:
            parameters["compute_load_cpu_s_per_step"] = round(self._cpu_ns / self._steps / 1e9, 4)
        if self._quota.owed_ns > 0:
            parameters[compute_load.QUOTA_MET_ENTRY] = round(
                self._quota.done_ns / self._quota.owed_ns, 3
            )
            parameters[compute_load.ROUNDS_ENTRY] = self._quota.rounds
            parameters[compute_load.ROUNDS_SHORT_ENTRY] = self._quota.short
        if self._wait and self.mode != compute_load.NONE:
            parameters.update(
                compute_load.wait_entries(
                    rounds=self._waits.rounds,
                    waited=self._waits.waited,
                    unmet=self._waits.unmet,
                    waited_ns=self._waits.waited_ns,
                    time_dilation=self._dilation,
                )
            )
        return parameters

    def close(self) -> None:
        if self._burners is not None:
            self._burners.close()
