"""What a dependencies-paced replay predicts of a training step, and whether the
replay's machine rather than the link bounds that prediction.  Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tf_grpc_bench.replay.core.measurement import (
    BenchmarkResult,
    RunMeasurement,
    machine_cpu_busy_share,
)
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
#: Share of a client's run from which the replay's own lateness binds the prediction
#: (``replay_lateness_share``): the lateness of the calls at the head of the replay's
#: queue, summed, bounds what lateness can have added to that client's steps, and a
#: prediction aiming at 5% cannot carry 5% more.
REPLAY_BOUND_LATENESS_SHARE = 0.05


def replay_cpu_cores(result: BenchmarkResult) -> float:
    """Cores the replay's client and (local or reporting) server processes kept busy."""
    total = cpu_utilization(result.client_cpu_ns + result.server_cpu_ns, result)
    return 0.0 if math.isnan(total) else total


def _client_lateness(starts: np.ndarray, lags: np.ndarray, held: np.ndarray) -> int:
    """The summed lag (ns) of one client's calls at the head of its queue: taken in
    release order, a call whose every earlier-released call had started by its release,
    and that the window did not hold (``held``)."""
    releases = starts - lags
    order = np.lexsort((starts, releases))
    starts, releases, lags, held = starts[order], releases[order], lags[order], held[order]
    started = np.maximum.accumulate(starts)
    head = np.ones(len(starts), dtype=bool)
    head[1:] = started[:-1] < releases[1:]
    return int(lags[head & ~held].sum())


def replay_lateness_share(runs: Sequence[RunMeasurement]) -> float | None:
    """How much of its runs' time the replay's own lateness can have added to a client's
    steps, at most: the largest over clients (``CallSample.worker_index``) of the lag of
    its calls at the head of its queue (``_client_lateness``), summed over the runs, over
    the runs' time; None without samples.

    A call released while calls released before it were still being issued waits for
    them: gRPC writes a call's bytes to its connection as the call starts, so a burst of
    calls released together goes out one after the other, as TensorFlow's do.  That
    wait is the transport's, not lateness; the call at the head of the queue was late
    because the replay (its wake-ups, its CPU, its hand-offs) did not keep up, and
    everything queued behind it went as late.  A client split over several processes
    (``--procs-per-worker``) is read as one queue.
    """
    late: dict[int, int] = {}
    duration = sum(run.duration_ns for run in runs)
    for run in runs:
        if not run.samples:
            continue
        columns = np.array(
            [(s.worker_index, s.start_ns, s.release_lag_ns, s.window_held) for s in run.samples]
        )
        for client in np.unique(columns[:, 0]):
            own = columns[columns[:, 0] == client]
            lateness = _client_lateness(own[:, 1], own[:, 2], own[:, 3] != 0)
            late[int(client)] = late.get(int(client), 0) + lateness
    if not late or duration <= 0:
        return None
    return max(late.values()) / duration


def replay_bound_verdict(
    replay_cores: float,
    cpu_count: int,
    machine_busy_share: float | None,
    *,
    lag_p90_ns: float | None = None,
    step_ns: float | None = None,
    lateness_share: float | None = None,
    compute_load: bool = False,
) -> tuple[bool, str]:
    """Whether a prediction is bound by the replay's machine rather than the link, and why.

    Judged from the replay's own processes: bound when they kept at least
    ``REPLAY_BOUND_CPU_SHARE`` of the ``cpu_count`` cores busy, or when their lateness
    can have added ``lateness_share`` (``replay_lateness_share``, None: not known) of at
    least ``REPLAY_BOUND_LATENESS_SHARE`` to a client's steps.  The 90th percentile of
    how late the calls the window did not hold went (``lag_p90_ns``, against the step
    ``step_ns``) is evidence only: most of it is calls waiting for the calls released
    with them to be sent.  So is the whole machine's share (None: not known): from
    ``MACHINE_BUSY_CPU_SHARE`` the evidence says other processes were busy, and the
    prediction is not flagged for it.  Under a compute load (``compute_load``: burners
    kept the cores as busy as training's compute did, ``core.compute_load``) the
    lateness is evidence only too: calls go late because the load contends for the
    cores on purpose, as training's calls contended with its compute; the replay's own
    CPU still flags it.
    """
    own = cpu_count > 0 and replay_cores >= REPLAY_BOUND_CPU_SHARE * cpu_count
    machine = machine_busy_share is not None and machine_busy_share >= MACHINE_BUSY_CPU_SHARE
    late = lateness_share is not None and lateness_share >= REPLAY_BOUND_LATENESS_SHARE
    loaded = late and compute_load
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
    if lateness_share is not None:
        evidence += (
            f"; the replay's own lateness (its calls at the head of its queue) can have "
            f"added up to {100 * lateness_share:.1f}% to a client's steps"
        )
    if own:
        evidence += " (the step may be the replay's CPU, not the link)"
    elif loaded:
        evidence += (
            " (under the compute load: the contention it adds for the cores, as training's "
            "compute added it, so it is not flagged)"
        )
    elif late:
        evidence += " (the replay did not keep up with its own plan: the step may be its lateness)"
    elif machine:
        evidence += (
            " (other processes kept the machine busy; the replay's own processes did not "
            "bind the step, so it is not flagged)"
        )
    return own or (late and not loaded), evidence


def prediction_json(result: BenchmarkResult, cpu_count: int) -> dict[str, Any] | None:
    """What the replay predicts of a training step (dependencies pacing), else None.

    ``step_ns``: median replayed worker-step, compute kept; ``compute_ns`` and
    ``communication_ns``: medians of the critical path's two parts.
    ``replay_bound`` (``replay_bound_verdict``): the replay's own processes
    (``replay_cpu_cores``) kept the machine's cores busy, or their lateness can have
    added a share of a client's steps (``replay_lateness_share``, given in the evidence),
    so the step may be the replay's machine rather than the network;
    ``replay_bound_evidence`` says which and gives how late the calls the window did not
    hold went (``unheld_release_lag_p90_ns``, null without samples) and every process's
    share (``machine_cpu_busy_share``, null when unknown), which do not flag the
    prediction by themselves.
    """
    if not result.step_compute_ns:
        return None
    cores = replay_cpu_cores(result)
    machine = machine_cpu_busy_share(result.runs)
    step = _median_or_none(result.step_times_ns)
    unheld = result.unheld_release_lag
    lag = None if unheld.count == 0 else unheld.p90_ns
    lateness = replay_lateness_share(result.runs)
    bound, evidence = replay_bound_verdict(
        cores,
        cpu_count,
        machine,
        lag_p90_ns=lag,
        step_ns=step,
        lateness_share=lateness,
        compute_load=result.parameters.get("compute_load", "none") != "none",
    )
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
