"""The limit of the replayed step as the time dilation grows, fitted through dilated replays.

Pure arithmetic over (dilation, step) pairs (``network compare``'s automatic
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
