"""Compute load: the replay keeps the cores as busy as training kept them.

A dependencies-paced replay waits through the compute gaps the trace
recorded, so its transfers find free cores where training's contended with
its compute.  Where training was bound by its CPU (ResNet-50 at 10 Gbit/s on
2 cores: the tasks kept 1.9 of them busy) the replay then predicts short.
``--compute-load`` adds the CPU training spent that the replay does not spend
itself, as real work in burner processes of their own (``transport/burners.py``),
at normal priority, so the replay's calls contend for the cores as training's
did.  Pure: the sizing arithmetic and the schedule; no processes, no clocks.

Sizing, per replayed step (``size_load``):

* training's CPU: the job's tasks' cores busy over the capture's steady steps
  (``capture_cpu_task_cores``, ``capture_cpu.CaptureCpu.tasks_cores``) times the
  trace's mean step period;
* the replay's CPU: measured by the replay itself in its warm-up (its client,
  server and engine processes), over the steps it replayed;
* the load: the difference (0 when the replay spends as much).

How it is spread (``MODES``):

* ``gaps``: during each client task's compute gaps, as the dependency tracker
  schedules them (``DependencyTracker``'s ``on_compute``: from the arrival a
  call waited for to its release, and the step's tail), at one rate for every
  task: the load over the gaps' total in the trace replayed onto itself
  (``trace_gaps_ns``), at most one core per task (``MAX_GAP_CORES``); what
  does not fit is spread uniformly;
* ``uniform``: the load as a quota of CPU a replayed round, due evenly over the step
  and done however long others holding the cores make it take, until the next round
  begins (``burner_quotas``); with ``--compute-load-wait`` the next round begins only
  once it is done (bounded), and the result says how long rounds waited
  (``wait_entries``).

Across CPU models (a compute scale ``s`` other than 1: ``--compute``, the
calibrations' scale) the capture's CPU is the capture machine's.  Its compute part
is taken as the tasks' compute gaps at one core each (``trace_gaps_ns``, at most
training's CPU) and scaled by ``s``; the rest (the runtime's transfers, copies and
the ps's work beside them) is kept.  The step the load is spread over is the
trace's, lengthened by the longest task's gaps times ``s - 1`` (the replayed step
keeps its compute scaled); the gaps are ``s`` times the trace's.  Time dilation
stretches the time the load is spread over and not the load itself
(``ComputeLoadSizing.wall_cores``).

``auto`` (the default, ``choose``): ``uniform`` where the trace records its capture
CPU and a ps-throughput benchmark is paced by its dependencies, ``none`` otherwise,
with the reason in the result (``compute_load_auto``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench.dependency_tracker import DependencyTracker
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.workload import Workload, WorkloadStep

AUTO = "auto"
NONE = "none"
GAPS = "gaps"
UNIFORM = "uniform"
#: ``--compute-load`` choices; ``auto`` is the default (``choose``).
MODES = (AUTO, NONE, GAPS, UNIFORM)
#: ``--compute-load-wait``'s help.
WAIT_HELP = (
    "with the compute load's quotas (uniform, auto's): a round ends only once its quotas are "
    "done too, at most as long again as its path (default: it does not wait; docs/fidelity.md, "
    "Compute load)"
)
#: What ``auto`` chooses where the trace can size a load.
AUTO_LOAD = UNIFORM
#: The most cores one task's burner keeps busy during its gaps: a burner is one
#: process, and a task computing on more than one core leaves the rest uniform.
MAX_GAP_CORES = 1.0
#: The workload description entry carrying the capture's tasks' cores busy.
TASKS_CORES_ENTRY = "capture_cpu_tasks_cores"


def check_mode(mode: str) -> str:
    """``mode`` if it is one of ``MODES``; else a ConfigError naming the flag."""
    if mode not in MODES:
        raise ConfigError(f"--compute-load {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def choose(
    requested: str, *, trace: bool, paced: bool, capture_cpu: bool, one_task: bool = False
) -> tuple[str, str]:
    """The mode a replay runs (``requested`` unless ``auto``) and, for ``auto``, why:
    ``uniform`` for a ``trace`` with its ``capture_cpu`` replayed by a ps-throughput
    benchmark ``paced`` by its dependencies; ``none`` otherwise, and under ``role``
    (``one_task``: each task would add the whole job's load)."""
    if requested != AUTO:
        return check_mode(requested), ""
    if one_task:
        return NONE, "role sizes no load: each task would add the whole job's"
    if not trace:
        return NONE, "a synthetic workload has no training CPU to stand for"
    if not paced:
        return NONE, "no ps-throughput benchmark paced by its dependencies"
    if not capture_cpu:
        return NONE, "the trace records no capture CPU"
    return AUTO_LOAD, "the trace records its capture CPU"


def described(mode: str, auto: str) -> str:
    """``uniform (auto: the trace records its capture CPU)``, or the mode alone."""
    return f"{mode} (auto: {auto})" if auto else mode


def tasks_cores_of(workload: Workload) -> float | None:
    """The capture's tasks' cores busy a workload's description carries, None without."""
    value = workload.parameters().get(TASKS_CORES_ENTRY)
    return float(value) if isinstance(value, (int, float)) else None


def merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of ``intervals`` (start, end), as disjoint sorted intervals; empty ones dropped."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def step_gaps(step: WorkloadStep) -> list[tuple[int, int]]:
    """The compute gaps of one worker's step replayed onto the trace's own times (ns from
    the step's start, merged): what the replay's tracker reports as the gaps when every
    call completes when it completed in the trace."""
    dependencies = [call.dependencies for call in step.calls]
    if not dependencies or any(d is None for d in dependencies):
        return []
    deps = [d for d in dependencies if d is not None]
    gaps: list[tuple[int, int]] = []
    tracker = DependencyTracker(
        deps,
        servers=[call.server_index for call in step.calls],
        step_begin_ns=0,
        period_ns=step.period_ns,
        step_compute_ns=step.step_compute_ns,
        round_tail_ns=step.round_tail_ns,
        on_compute=lambda start, end: gaps.append((start, end)),
    )
    # Completions at their trace arrival, releases at their ready time (as ``inspect``).
    events = sorted(
        [(d.arrival_offset_ns, 0, i) for i, d in enumerate(deps)]
        + [(d.ready_offset_ns, 1, i) for i, d in enumerate(deps)],
        key=lambda event: (event[0], -event[1], event[2]),
    )
    for _, kind, index in events:
        if kind == 1:
            tracker.take_releasable()
            tracker.release_ns(index)
        else:
            tracker.complete(index, deps[index].arrival_offset_ns)
    tracker.next_step_begin_ns()
    return merge(gaps)


def task_gaps_ns(workloads: Sequence[Workload]) -> list[float]:
    """Each client task's compute gaps in one step of the trace (ns, the mean over the
    steps): each workload is one client's (``Workload.for_worker``)."""
    return [
        statistics.fmean(
            sum(end - start for start, end in step_gaps(step)) for step in workload.steps
        )
        if workload.steps
        else 0.0
        for workload in workloads
    ]


def trace_gaps_ns(workloads: Sequence[Workload]) -> float:
    """The compute gaps of one step of the trace, all client tasks together (ns, the mean
    over the steps)."""
    return sum(task_gaps_ns(workloads))


def mean_period_ns(workload: Workload) -> float:
    """The trace's mean step period (ns; a round's, where the steps are rounds)."""
    periods = [step.period_ns for step in workload.steps if step.period_ns > 0]
    return statistics.fmean(periods) if periods else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeLoadSizing:
    """How much load, and where: the figures a result records."""

    mode: str
    #: Training's tasks' CPU per step (here: its compute part scaled), and the replay's
    #: own (ns of CPU).
    training_cpu_ns: float
    replay_cpu_ns: float
    #: The trace's mean step and its client tasks' compute gaps per step (ns).
    step_ns: float
    gaps_ns: float
    #: Cores each task's burner keeps busy during its gaps, and cores kept busy all along,
    #: in the trace's time (``wall_cores`` divides them by the dilation).
    gap_cores: float
    uniform_cores: float
    #: The compute scale to this machine, training's CPU per step at the capture
    #: machine's speed and the part of it scaled (its compute gaps at one core a task).
    compute_scale: float = 1.0
    captured_cpu_ns: float = 0.0
    compute_cpu_ns: float = 0.0
    #: The step and the gaps as the replay keeps them (the compute scaled).
    step_here_ns: float = 0.0
    gaps_here_ns: float = 0.0

    @property
    def load_cpu_ns(self) -> float:
        """CPU per step training spent and the replay does not."""
        return max(0.0, self.training_cpu_ns - self.replay_cpu_ns)

    def wall_cores(self, time_dilation: float) -> tuple[float, float]:
        """(gap cores, uniform cores) in a replay ``time_dilation`` times slower."""
        return self.gap_cores / time_dilation, self.uniform_cores / time_dilation

    def text(self) -> str:
        """``gaps: 0.52 CPU-s a step (training's tasks 1.10, the replay 0.58), 0.87 cores
        in each task's compute gaps (0.60 s a step), 0.00 all along``; with a compute
        scale, how training's CPU was scaled and the step it is spread over."""
        where = (
            f"{self.gap_cores:.2f} cores in each task's compute gaps "
            f"({self.gaps_here_ns / 1e9:.2f} s a step), {self.uniform_cores:.2f} all along"
            if self.mode == GAPS
            else f"{self.uniform_cores:.2f} cores all along"
        )
        scaled = ""
        if self.compute_scale != 1.0:
            scaled = (
                f" here: {self.captured_cpu_ns / 1e9:.2f} at the capture machine's speed with "
                f"its {self.compute_cpu_ns / 1e9:.2f} in compute gaps x{self.compute_scale:.3g};"
            )
        if self.compute_scale != 1.0 or self.step_here_ns > self.step_ns:
            where += f" over a {self.step_here_ns / 1e9:.2f} s step"
        return (
            f"{self.mode}: {self.load_cpu_ns / 1e9:.2f} CPU-s a step (training's tasks "
            f"{self.training_cpu_ns / 1e9:.2f}{scaled or ','} the replay "
            f"{self.replay_cpu_ns / 1e9:.2f}), " + where
        )


def size_load(
    mode: str,
    *,
    tasks_cores: float,
    step_ns: float,
    gaps_ns: float,
    replay_cpu_ns: float,
    compute_scale: float = 1.0,
    path_gaps_ns: float = 0.0,
    replayed_step_ns: float = 0.0,
) -> ComputeLoadSizing:
    """The load for ``mode`` (``gaps`` or ``uniform``): training's tasks' CPU per step
    (``tasks_cores`` x ``step_ns``, its compute part times ``compute_scale``) less the
    replay's (``replay_cpu_ns``), in the gaps (``gaps_ns`` per step, all tasks, times the
    scale) at up to ``MAX_GAP_CORES`` each, the rest uniform over the step lengthened by
    the longest task's gaps (``path_gaps_ns``) times the scale less 1, or over the step
    the replay took in its warm-up (``replayed_step_ns``, in the trace's time) where that
    is longer: a trace replayed on a slower link than its capture's spends its load a
    step, not the load's rate over a longer step."""
    if mode not in (GAPS, UNIFORM):
        raise ValueError(f"no load to size for mode {mode!r}")
    if step_ns <= 0 or tasks_cores < 0 or gaps_ns < 0 or replay_cpu_ns < 0:
        raise ValueError("step must be > 0; cores, gaps and CPU >= 0")
    if compute_scale < 0 or path_gaps_ns < 0 or replayed_step_ns < 0:
        raise ValueError("compute scale, gaps and the replayed step must be >= 0")
    captured = tasks_cores * step_ns
    compute = min(gaps_ns * MAX_GAP_CORES, captured)
    training = captured + compute * (compute_scale - 1)
    step_here = max(step_ns + path_gaps_ns * (compute_scale - 1), replayed_step_ns, 1.0)
    gaps_here = gaps_ns * compute_scale
    load = max(0.0, training - replay_cpu_ns)
    gap_cores = 0.0
    if mode == GAPS and gaps_here > 0:
        gap_cores = min(load / gaps_here, MAX_GAP_CORES)
    uniform = (load - gap_cores * gaps_here) / step_here
    return ComputeLoadSizing(
        mode=mode,
        training_cpu_ns=training,
        replay_cpu_ns=replay_cpu_ns,
        step_ns=step_ns,
        gaps_ns=gaps_ns,
        gap_cores=gap_cores,
        uniform_cores=max(0.0, uniform),
        compute_scale=compute_scale,
        captured_cpu_ns=captured,
        compute_cpu_ns=compute,
        step_here_ns=step_here,
        gaps_here_ns=gaps_here,
    )


def burner_quotas(
    sizing: ComputeLoadSizing, time_dilation: float, *, at_least: int = 1
) -> tuple[list[float], int]:
    """The quota burners' quotas (CPU ns a round each) and the step they are due over
    (wall ns): the load not placed in the gaps (``uniform_cores`` over the step the
    load is spread over), all of it every round, split evenly over as many burners as
    the whole cores it keeps busy (``1.5`` -> two of ``0.75``: each has room to catch
    up), and ``at_least`` (``--compute-load-wait``: a burner per core, so that a round
    waiting for its quota waits for the cores, not for one burner doing its share
    alone); the step dilated, the quotas not (``wall_cores``)."""
    quota = sizing.uniform_cores * sizing.step_here_ns
    step = max(1, round(sizing.step_here_ns * time_dilation))
    if quota <= 0:
        return [], step
    burners = max(1, at_least, math.ceil(quota / step - 1e-9))
    return [quota / burners] * burners, step


#: The result entry saying why ``auto`` chose its mode.
AUTO_ENTRY = "compute_load_auto"
#: The result entry: the CPU the quota burners spent on each round's quota before the
#: next round began (at most its quota), over what the measured runs' rounds owed.
QUOTA_MET_ENTRY = "compute_load_quota_met"
#: The result entries: the measured runs' rounds the quotas were owed over, and how many
#: times a quota burner ended one short of its quota (what it had not done then, dropped).
ROUNDS_ENTRY = "compute_load_rounds"
ROUNDS_SHORT_ENTRY = "compute_load_rounds_short"
#: The result entries of ``--compute-load-wait``: that rounds waited for their quotas,
#: how long they waited past their paths' ends (s, all together and a round, in the time
#: of the training predicted), how many waited at all and how many were let go with a
#: quota not done (the bound reached, or a burner gone).
WAIT_ENTRY = "compute_load_wait"
WAIT_S_ENTRY = "compute_load_wait_s"
WAIT_S_PER_ROUND_ENTRY = "compute_load_wait_s_per_round"
WAIT_ROUNDS_ENTRY = "compute_load_wait_rounds"
WAIT_UNMET_ENTRY = "compute_load_wait_unmet"


def wait_entries(
    *, rounds: int, waited: int, unmet: int, waited_ns: int, time_dilation: float
) -> dict[str, str | int | float | bool]:
    """The result's ``--compute-load-wait`` entries from the measured runs' ``rounds``
    that looked for their quotas, ``waited`` of them at all, ``unmet`` let go with a
    quota not done, ``waited_ns`` wall ns in all (divided by ``time_dilation``)."""
    entries: dict[str, str | int | float | bool] = {WAIT_ENTRY: True}
    if rounds > 0:
        total = waited_ns / time_dilation / 1e9
        entries[WAIT_S_ENTRY] = round(total, 4)
        entries[WAIT_S_PER_ROUND_ENTRY] = round(total / rounds, 4)
        entries[WAIT_ROUNDS_ENTRY] = waited
        entries[WAIT_UNMET_ENTRY] = unmet
    return entries


def wait_text(parameters: Mapping[str, object]) -> str:
    """``; rounds waited for the quota 0.012 s a round (37 of 250, 0 let go short)``
    ("" where rounds were not to wait; ``; no round had a quota to wait for`` where
    no measured round did)."""
    if parameters.get(WAIT_ENTRY) is not True:
        return ""
    per_round, waited = parameters.get(WAIT_S_PER_ROUND_ENTRY), parameters.get(WAIT_ROUNDS_ENTRY)
    rounds, unmet = parameters.get(ROUNDS_ENTRY), parameters.get(WAIT_UNMET_ENTRY)
    if not isinstance(per_round, (int, float)):
        return "; no round had a quota to wait for"
    counts = f"{waited} of {rounds}" if isinstance(rounds, int) else f"{waited} rounds"
    return (
        f"; rounds waited for the quota {per_round:.3f} s a round ({counts}, {unmet} let go short)"
    )


def report_line(parameters: Mapping[str, object]) -> str:
    """The terminal report's line on a benchmark's compute load ("" without one, unless
    ``auto`` chose none: ``compute load: none (auto: the trace records no capture CPU)``):
    ``compute load: gaps: ... ; the burners spent 0.44 CPU-s a step (0.66 cores), not
    counted as the replay's``."""
    mode = parameters.get("compute_load")
    auto = str(parameters.get(AUTO_ENTRY) or "")
    if mode is None or (mode == NONE and not auto):
        return ""
    sizing = parameters.get("compute_load_sizing")
    line = f"compute load: {sizing or mode}"
    if auto:
        line = f"compute load: {described(str(mode), auto)}" + (f"; {sizing}" if sizing else "")
    spent, cores = (
        parameters.get("compute_load_cpu_s_per_step"),
        parameters.get("compute_load_cpu_cores"),
    )
    met = parameters.get(QUOTA_MET_ENTRY)
    rounds, short = parameters.get(ROUNDS_ENTRY), parameters.get(ROUNDS_SHORT_ENTRY)
    if isinstance(spent, (int, float)) and isinstance(cores, (int, float)):
        quota = f", {met:.0%} of their quota" if isinstance(met, (int, float)) else ""
        if quota and isinstance(rounds, int) and isinstance(short, int):
            quota += f" over {rounds} rounds, a burner short of it {short} times"
        line += (
            f"; the burners spent {spent:.2f} CPU-s a step ({cores:.2f} cores{quota}), "
            "not counted as the replay's"
        )
    return line + wait_text(parameters)
