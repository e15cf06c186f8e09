"""Automatic time dilation's arithmetic: when to stop, what the replays predict, and the
limit of the step as the dilation grows, fitted through dilated replays.

Pure arithmetic over (dilation, step, spread) figures (``network compare``'s automatic
time dilation; docs/fidelity.md says why it is ``S + c/K``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class DilationLimit:
    """The replayed step as the dilation grows without bound, from dilated replays.

    A dilation K divides the replay's own costs that do not stretch with the
    link (its CPU per call on the critical path, the copies of a large message
    before its first byte leaves and after its last arrives) by K, so a replay
    at K predicts ``step_s + overhead_s / K`` (the step's limit plus what is
    left of that overhead).  Fitted by least squares through the dilated
    replays' steps (``points``); where the step did not fall with the
    dilation (``overhead_s`` would be 0 or less: the replay's speed no longer
    showed), nothing is extrapolated and ``step_s`` is the last replay's step.
    """

    step_s: float
    overhead_s: float
    #: (dilation, predicted step) of the replays fitted through, in order.
    points: tuple[tuple[float, float], ...]

    @property
    def extrapolated(self) -> bool:
        return self.overhead_s > 0

    def describe(self) -> str:
        through = ", ".join(f"{k:g}" for k, _ in self.points)
        if not self.extrapolated:
            return (
                f"the step did not fall with the dilation (K = {through}): the last "
                f"replay's {self.step_s:.3f} s is the prediction"
            )
        return (
            f"the step's limit as the dilation grows (step = S + c/K through K = {through}): "
            f"S = {self.step_s:.3f} s (c = {self.overhead_s:.3f} s), the prediction"
        )


def dilation_limit(points: Sequence[tuple[float, float]]) -> DilationLimit | None:
    """``DilationLimit`` of replays ``(dilation, step_s)``, in the order replayed; only
    dilated ones (K > 1) count.  None with fewer than two (nothing to fit through)."""
    fitted = tuple((k, step) for k, step in points if k > 1)
    if len(fitted) < 2:
        return None
    xs = [1.0 / k for k, _ in fitted]
    ys = [step for _, step in fitted]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    if slope <= 0:
        return DilationLimit(step_s=ys[-1], overhead_s=0.0, points=fitted)
    return DilationLimit(step_s=mean_y - slope * mean_x, overhead_s=slope, points=fitted)


#: Without a spread (a replay of one run), two replays' steps within this share of the
#: earlier one's are taken to be the same.
CONVERGED_STEP_CHANGE = 0.05
#: The least tolerance, as a share of the first step: runs that agree to the microsecond
#: (a step of compute) would otherwise make differences no prediction resolves count
#: (the aim is 5% of training's step).
MIN_STEP_TOLERANCE = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class DilatedReplay:
    """One replay of automatic dilation: its dilation, the step it predicts, how much
    that step moved between its runs, and whether its own processes bound it."""

    time_dilation: float
    step_s: float
    #: The range (largest less smallest) of its runs' median steps; None with one run.
    spread_s: float | None
    #: The replay's own processes bound it (``prediction.replay_bound_verdict``: their
    #: CPU, or the lateness of the calls the window did not hold): its step may hold the
    #: replay's own waits, not only the link.
    busy: bool

    def describe(self) -> str:
        spread = "" if self.spread_s is None else f" (runs within {self.spread_s:.3f} s)"
        return f"{self.step_s:.3f} s at {self.time_dilation:g}{spread}"


def tolerance_s(replays: Sequence[DilatedReplay]) -> float:
    """How far apart ``replays``' steps may be and still be the same step: the largest
    of their spreads, at least ``MIN_STEP_TOLERANCE`` of the first step, or
    ``CONVERGED_STEP_CHANGE`` of it where none has a spread."""
    spreads = [r.spread_s for r in replays if r.spread_s is not None]
    first = replays[0].step_s
    return max(*spreads, MIN_STEP_TOLERANCE * first) if spreads else CONVERGED_STEP_CHANGE * first


def within_spread(replays: Sequence[DilatedReplay]) -> bool:
    """Whether ``replays``' steps differ by no more than their spread (``tolerance_s``)."""
    steps = [r.step_s for r in replays]
    return not steps or max(steps) - min(steps) <= tolerance_s(replays)


def settled(replays: Sequence[DilatedReplay]) -> bool:
    """Whether automatic dilation stops after ``replays`` (in the order replayed): the
    last two differ by no more than their spread and the last was not bound by its own
    processes, so one more dilation would not change the answer."""
    return len(replays) >= 2 and not replays[-1].busy and within_spread(replays[-2:])


@dataclass(frozen=True, slots=True, kw_only=True)
class DilatedPrediction:
    """What automatic dilation predicts, and from which replays."""

    step_s: float
    #: Why this step (one line for the terminal and ``comparison.md``).
    basis: str
    #: The fit ``S + c/K``, when the dilated replays' steps differed by more than their spread.
    limit: DilationLimit | None = None


def dilated_prediction(replays: Sequence[DilatedReplay]) -> DilatedPrediction | None:
    """The step predicted by automatic dilation's ``replays`` (in the order replayed),
    None without any.

    The undilated replay's step when its own processes did not bind it and every
    dilated replay is within the spread of it (the step did not depend on the
    replay's speed); else, through the dilated replays their own processes did not
    bind, ``S + c/K``
    (``dilation_limit``) when they differ by more than their spread, else the last of
    them; else the last replay's step.
    """
    if not replays:
        return None
    first, dilated = replays[0], [r for r in replays if r.time_dilation > 1]
    undilated = first.time_dilation == 1 and not first.busy
    if undilated and dilated and all(within_spread([first, r]) for r in dilated):
        return DilatedPrediction(
            step_s=first.step_s,
            basis=(
                f"the dilated replays are within the spread of the undilated one "
                f"({_listed(replays)}): the undilated {first.step_s:.3f} s is the prediction"
            ),
        )
    unbound = [r for r in dilated if not r.busy]
    if len(unbound) >= 2 and not within_spread(unbound):
        limit = dilation_limit([(r.time_dilation, r.step_s) for r in unbound])
        assert limit is not None
        return DilatedPrediction(
            step_s=limit.step_s,
            basis=f"the dilated replays differ by more than their spread; {limit.describe()}",
            limit=limit,
        )
    last = unbound[-1] if unbound else replays[-1]
    why = (
        "the replays their own processes did not bind agree"
        if unbound
        else "every replay was bound"
    )
    return DilatedPrediction(
        step_s=last.step_s,
        basis=f"{why} ({_listed(replays)}): {last.step_s:.3f} s at {last.time_dilation:g} "
        "is the prediction",
    )


def _listed(replays: Sequence[DilatedReplay]) -> str:
    return ", ".join(r.describe() + (" bound" if r.busy else "") for r in replays)
