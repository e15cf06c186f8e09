"""A trace's compute taken to this machine: the scale from the two machines' calibrations.

A trace records its capture machine's calibration (``calibration.Calibration``);
a replay elsewhere times the same workload here (``calibration.measure_here``)
and scales the trace's compute gaps by here / there (``scale_to_here``).  For a
trace from another machine, ``compute_to_here`` adds how uncertain that makes
the prediction: the spread measured across pairs of CPU models
(``cross_machine``), widened by the spread of an unsteady calibration's timings
on either machine.

Pure but for ``measure`` (default: timing or the cache) and the package's
pairs file.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tf_grpc_bench import cross_machine, host
from tf_grpc_bench.calibration import (
    PART_NAMES,
    CalibrationUnavailable,
    CalibrationWorkload,
    Parts,
    StepHere,
    from_extra,
    measure_here,
)
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.trace import CALIBRATION_STEP_EXTRA


def part_scales(there: Parts, here: Parts) -> tuple[tuple[str, float], ...]:
    """Each kind of work's scale, here over there; none unless both timed the same kinds."""
    if not there or [name for name, _ in there] != [name for name, _ in here]:
        return ()
    return tuple(
        (name, mine / theirs) for (name, theirs), (_, mine) in zip(there, here, strict=True)
    )


@dataclass(frozen=True, slots=True)
class ComputeToHere:
    """A replay's compute scale to this machine, and what results say of it."""

    #: Times the trace's compute gaps (1: kept as recorded).
    scale: float
    #: ``compute_calibration`` in the results: both steps and the scale, or why none.
    description: str
    #: Whether the scale came from both machines' calibrations.
    calibrated: bool
    #: How far the scale may be off because a calibration was unsteady: the product of
    #: the unsteady calibrations' spreads, the trace's and this machine's (1: both steady).
    unsteady_spread: float = 1.0


def compute_to_here(
    extra: tuple[tuple[str, str], ...],
    here: str,
    *,
    required: bool,
    max_scale: float,
    measure: Callable[[str, CalibrationWorkload], StepHere] = measure_here,
    pairs: Sequence[cross_machine.MeasuredPair] | None = None,
) -> ComputeToHere | None:
    """``scale_to_here``, and for a trace from another machine, how uncertain that
    makes the prediction: the spread measured across pairs of CPU models (``pairs``,
    default the package's ``cross_machine.read_pairs()``), said in the description."""
    to_here = scale_to_here(extra, here, required=required, max_scale=max_scale, measure=measure)
    captured = host.captured_on(extra)
    if to_here is None or not captured or captured == here:
        return to_here
    known = cross_machine.read_pairs() if pairs is None else pairs
    uncertainty = cross_machine.uncertainty_text(
        captured, here, known, widen=to_here.unsteady_spread
    )
    return dataclasses.replace(to_here, description=f"{to_here.description}; {uncertainty}")


def scale_to_here(
    extra: tuple[tuple[str, str], ...],
    here: str,
    *,
    required: bool,
    max_scale: float,
    measure: Callable[[str, CalibrationWorkload], StepHere] = measure_here,
) -> ComputeToHere | None:
    """The scale taking a trace's compute (``extra`` records its calibration) to ``here``.

    ``required`` (``--compute here``): ``ConfigError`` when it cannot be had.
    Otherwise (``--compute auto``) None when there is nothing to do (same
    machine, or a trace that records neither machine nor calibration), and a
    scale of 1 saying why when the scale cannot be had.  A scale above
    ``max_scale`` (the largest ``--compute`` takes) is taken as a calibration
    gone wrong, not as a machine that much slower.
    """
    recorded = from_extra(extra)
    captured = host.captured_on(extra)
    if recorded is None:
        if required:
            raise ConfigError(
                "--compute here: the trace records no compute calibration (captured before "
                "captures recorded one, or with --no-calibrate); re-capture it, or give a SCALE"
            )
        if not captured or captured == here:
            return None
        return ComputeToHere(1.0, "none: the trace records no calibration", calibrated=False)
    if not required and captured == here:
        return None
    try:
        measured = measure(here, recorded.workload)
    except CalibrationUnavailable as error:
        if required:
            raise ConfigError(f"--compute here: {error}") from None
        return ComputeToHere(1.0, f"none: {error}", calibrated=False)
    scale = measured.step_ns / recorded.step_ns
    there_unsteady = recorded.unsteady_spread
    unsteady = "" if recorded.steady else ", unsteady"
    if there_unsteady is not None:
        unsteady = f", unsteady: its timings {there_unsteady - 1:.0%} apart"
    steps = (
        f"{recorded.workload.text}: {recorded.step_ns / 1e6:.1f} ms a step on "
        f"{captured or 'the capture machine'}{unsteady}, {measured.step_ns / 1e6:.1f} ms on "
        f"{here} ({measured.source})"
    )
    spreads = [there_unsteady, None if measured.steady else measured.spread]
    widen = math.prod(spread for spread in spreads if spread is not None)
    by_part = part_scales(recorded.parts, measured.parts)
    if by_part:
        # The path computes each kind of work: scale by their sum, say each kind's.
        scale = sum(ns for _, ns in measured.parts) / sum(ns for _, ns in recorded.parts)
        kinds = ", ".join(f"{PART_NAMES[name]} x{ratio:.3g}" for name, ratio in by_part)
        steps = f"{steps}; by kind of work: {kinds}; their sum"
    if scale > max_scale:
        why = (
            f"trace metadata {CALIBRATION_STEP_EXTRA}={recorded.step_ns}: this machine's step is "
            f"{scale:.3g} times it, over the {max_scale:g} --compute takes"
        )
        if required:
            raise ConfigError(f"--compute here: {why}; give a SCALE instead")
        return ComputeToHere(1.0, f"none: {why} ({steps})", calibrated=False)
    return ComputeToHere(
        scale, f"{steps}: compute x{scale:.3g}", calibrated=True, unsteady_spread=widen
    )
