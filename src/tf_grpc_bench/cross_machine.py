"""How far a prediction carries from the capture's machine to another: the pairs measured.

A trace's compute is its capture machine's; a replay on a machine of another
CPU model scales it by the two machines' calibrations (``calibration``).  How
well that holds is measured, not assumed: bench/fidelity.py's cross-machine
mode replays a trace captured on one instance against uncaptured training of
the same job on another, and keeps each measurement in
``cross_machine_pairs.json`` beside this module (and the table of every pair
of CPU models in bench/README.md).  Until the calibration holds across CPUs, a
replay of a trace from another CPU model says how uncertain its prediction is:
the spread of the predicted-over-training ratios measured across pairs of
different CPU models (``uncertainty_text``), widened where a calibration was unsteady.

Pure but for ``read_pairs`` (the package's file).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tf_grpc_bench.errors import ConfigError

#: The measured pairs shipped with the package (bench/fidelity.py --cross-machine writes it).
PAIRS_FILE = Path(__file__).with_name("cross_machine_pairs.json")
FORMAT = "tf-grpc-bench-cross-machine-pairs"
VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredPair:
    """One prediction across machines set against training: a trace captured on
    ``captured_on`` replayed on ``replayed_on`` across ``link``."""

    captured_on: str
    replayed_on: str
    trace: str
    link: str
    #: The predicted step over uncaptured training's median round on ``replayed_on``.
    ratio: float
    #: How the replay's compute was scaled ("compute x1.64", "none: ...").
    compute: str = ""
    #: How the calibrations were measured (``calibration.CalibrationMethod``'s text).
    calibration: str = ""
    measured_utc: str = ""
    code: str = ""
    #: Where the figure comes from (the command that measured it).
    source: str = ""
    #: The replay's compute load (``--compute-load``: "uniform", "none (auto: ...)");
    #: "" for pairs measured before it was recorded.
    compute_load: str = ""

    @property
    def across_models(self) -> bool:
        """Captured and replayed on different machines (CPU model or count)."""
        return self.captured_on != self.replayed_on

    def key(self) -> tuple[str, str, str, str]:
        return (self.captured_on, self.replayed_on, self.trace, self.link)

    def as_json(self) -> dict[str, Any]:
        return {
            "captured_on": self.captured_on,
            "replayed_on": self.replayed_on,
            "trace": self.trace,
            "link": self.link,
            "ratio": round(self.ratio, 4),
            "compute": self.compute,
            "calibration": self.calibration,
            "measured_utc": self.measured_utc,
            "code": self.code,
            "source": self.source,
            "compute_load": self.compute_load,
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> MeasuredPair:
        try:
            ratio = float(data["ratio"])
            pair = cls(
                captured_on=str(data["captured_on"]),
                replayed_on=str(data["replayed_on"]),
                trace=str(data["trace"]),
                link=str(data["link"]),
                ratio=ratio,
                **{name: str(data.get(name) or "") for name in _OPTIONAL},
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"{where}: not a measured pair ({error!r})") from None
        if not ratio > 0:
            raise ConfigError(f"{where}: ratio must be > 0, got {ratio}")
        return pair


_OPTIONAL = ("compute", "calibration", "measured_utc", "code", "source", "compute_load")


def read_pairs(path: Path = PAIRS_FILE) -> tuple[MeasuredPair, ...]:
    """The pairs a file holds (none when it does not exist); ConfigError naming the file
    and entry when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: not a file of measured pairs ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path}: format must be {FORMAT!r}")
    entries = data.get("pairs")
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'pairs' must be a list")
    return tuple(
        MeasuredPair.from_json(entry, f"{path}: pairs[{i}]") for i, entry in enumerate(entries)
    )


def merged(old: Iterable[MeasuredPair], new: Iterable[MeasuredPair]) -> list[MeasuredPair]:
    """``old`` with each of ``new`` in place of the entry for the same machines, trace and
    link (the latest measurement of a pair stands), sorted by machines, trace and link."""
    by_key = {pair.key(): pair for pair in old}
    by_key.update((pair.key(), pair) for pair in new)
    return [by_key[key] for key in sorted(by_key)]


def pairs_document(pairs: Sequence[MeasuredPair]) -> str:
    """The text of a pairs file holding ``pairs``."""
    document = {"format": FORMAT, "version": VERSION, "pairs": [p.as_json() for p in pairs]}
    return json.dumps(document, indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class Spread:
    """The ratios measured across CPU models: lowest, highest, how many."""

    low: float
    high: float
    count: int
    machine_pairs: tuple[tuple[str, str], ...]


def spread(pairs: Iterable[MeasuredPair]) -> Spread | None:
    """The spread of the ratios measured across CPU models (None: none measured)."""
    across = [pair for pair in pairs if pair.across_models]
    if not across:
        return None
    ratios = [pair.ratio for pair in across]
    machines = tuple(sorted({(pair.captured_on, pair.replayed_on) for pair in across}))
    return Spread(min(ratios), max(ratios), len(across), machines)


def uncertainty_text(
    captured_on: str, here: str, pairs: Iterable[MeasuredPair], *, widen: float = 1.0
) -> str:
    """What a replay of a trace from ``captured_on`` on ``here`` says of its prediction's
    uncertainty ("" on the capture's own machine or one that is not named).  ``widen``
    (> 1: an unsteady calibration's spread, ``compute_scale.ComputeToHere``) widens the
    measured spread both ways and is said."""
    if not captured_on or not here or captured_on == here:
        return ""
    unsteady = f"an unsteady calibration, its timings up to {widen - 1:.0%} apart"
    measured = spread(pairs)
    if measured is None:
        text = (
            "uncertain across CPU models: no prediction across CPU models has been "
            "measured against training yet"
        )
        return text if widen <= 1 else f"{text}; and {unsteady}"
    this_pair = (captured_on, here) in measured.machine_pairs
    machines = len(measured.machine_pairs)
    text = (
        f"uncertain across CPU models: predictions of traces from another CPU model have "
        f"been {measured.low:.2f} to {measured.high:.2f} of training ({measured.count} "
        f"measured, {machines} pair{'s' if machines != 1 else ''} of machines"
        f"{', this pair among them' if this_pair else ''}; bench/README.md)"
    )
    if widen <= 1:
        return text
    return f"{text}; with {unsteady}: {measured.low / widen:.2f} to {measured.high * widen:.2f}"
