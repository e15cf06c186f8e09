"""What a dependencies-paced replay predicts of a training step, and whether the
replay's machine rather than the link bounds that prediction.  Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tf_grpc_bench.replay.core.measurement import BenchmarkResult, machine_cpu_busy_share
from tf_grpc_bench.replay.output.statistics import cpu_utilization


def _median_or_none(values: Sequence[int]) -> float | None:
    return float(np.median(values)) if values else None


#: Share of the machine's cores the replay's own processes (client and server) may
#: use before its prediction is flagged as bound by the replay rather than by the
#: link: past it, its processes wait for one another's cores.
REPLAY_BOUND_CPU_SHARE = 0.7
#: Share of all the machine's cores busy (any process) from which the evidence says
#: other processes were busy too.  Reported only: the machine's load does not flag a
#: prediction by itself (a link-bound step does not depend on the replay's speed,
#: whoever else ran; the replay's own CPU says whether it kept up).
MACHINE_BUSY_CPU_SHARE = 0.9
#: Share of the predicted step from which the replay's own lateness binds it: the 90th
#: percentile of how late the calls the window did not hold went after their release
#: (``BenchmarkResult.unheld_release_lag``).  Such a call was late because the replay
#: (its CPU, its wake-ups) did not keep up, not because the link held calls in flight;
#: a step's critical path chains tens of calls, so one call in ten late by 1% of the
#: step adds a share of it that a prediction aiming at 5% cannot carry.
REPLAY_BOUND_LAG_SHARE = 0.01


def replay_cpu_cores(result: BenchmarkResult) -> float:
    """Cores the replay's client and (local or reporting) server processes kept busy."""
    total = cpu_utilization(result.client_cpu_ns + result.server_cpu_ns, result)
    return 0.0 if math.isnan(total) else total


def replay_bound_verdict(
    replay_cores: float,
    cpu_count: int,
    machine_busy_share: float | None,
    *,
    lag_p90_ns: float | None = None,
    step_ns: float | None = None,
) -> tuple[bool, str]:
    """Whether a prediction is bound by the replay's machine rather than the link, and why.

    Judged from the replay's own processes: bound when they kept at least
    ``REPLAY_BOUND_CPU_SHARE`` of the ``cpu_count`` cores busy, or when the calls the
    window did not hold went late by ``lag_p90_ns`` (90th percentile, None: not known)
    of at least ``REPLAY_BOUND_LAG_SHARE`` of the step (``step_ns``).  The whole
    machine's share (None: not known) is evidence only: from ``MACHINE_BUSY_CPU_SHARE``
    the evidence says other processes were busy, and the prediction is not flagged for it.
    """
    own = cpu_count > 0 and replay_cores >= REPLAY_BOUND_CPU_SHARE * cpu_count
    machine = machine_busy_share is not None and machine_busy_share >= MACHINE_BUSY_CPU_SHARE
    late = (
        lag_p90_ns is not None
        and step_ns is not None
        and step_ns > 0
        and lag_p90_ns >= REPLAY_BOUND_LAG_SHARE * step_ns
    )
    evidence = f"replay client and server processes used {replay_cores:.2f} of {cpu_count} cores"
    if machine_busy_share is not None:
        evidence += (
            f"; the machine's cores were {100 * machine_busy_share:.0f}% busy "
            f"({machine_busy_share * cpu_count:.2f} of {cpu_count}, every process)"
        )
    if lag_p90_ns is not None and step_ns:
        evidence += (
            f"; the calls the window did not hold went up to {lag_p90_ns / 1e6:.3f} ms late "
            f"(p90, {100 * lag_p90_ns / step_ns:.1f}% of the step)"
        )
    if own:
        evidence += " (the step may be the replay's CPU, not the link)"
    elif late:
        evidence += " (the replay did not keep up with its own plan: the step may be its lateness)"
    elif machine:
        evidence += (
            " (other processes kept the machine busy; the replay's own processes did not "
            "bind the step, so it is not flagged)"
        )
    return own or late, evidence


def prediction_json(result: BenchmarkResult, cpu_count: int) -> dict[str, Any] | None:
    """What the replay predicts of a training step (dependencies pacing), else None.

    ``step_ns``: median replayed worker-step, compute kept; ``compute_ns`` and
    ``communication_ns``: medians of the critical path's two parts.
    ``replay_bound`` (``replay_bound_verdict``): the replay's own processes
    (``replay_cpu_cores``) kept the machine's cores busy, or its calls the window did
    not hold went late (``unheld_release_lag_p90_ns``, null without samples), so the
    step may be the replay's machine rather than the network; ``replay_bound_evidence``
    says which and gives every process's share (``machine_cpu_busy_share``, null when
    unknown), which does not flag the prediction by itself.
    """
    if not result.step_compute_ns:
        return None
    cores = replay_cpu_cores(result)
    machine = machine_cpu_busy_share(result.runs)
    step = _median_or_none(result.step_times_ns)
    unheld = result.unheld_release_lag
    lag = None if unheld.count == 0 else unheld.p90_ns
    bound, evidence = replay_bound_verdict(cores, cpu_count, machine, lag_p90_ns=lag, step_ns=step)
    return {
        "step_ns": step,
        "compute_ns": _median_or_none(result.step_compute_ns),
        "communication_ns": _median_or_none(result.step_communication_ns),
        "steps": len(result.step_compute_ns),
        "replay_bound": bound,
        "replay_bound_evidence": evidence,
        "replay_cpu_cores": cores,
        "machine_cpu_busy_share": machine,
        "unheld_release_lag_p90_ns": lag,
    }
