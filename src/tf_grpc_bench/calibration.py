"""Compute calibration: how fast a machine computes its trace's training step.

A trace keeps the compute of the machine that captured it: the gaps between
a tensor's arrival at a task and the tensors computed from it leaving.  A
replay on another machine that keeps those gaps predicts training on the
*capture* machine.  To predict training here instead, the compute is scaled
by how much faster this machine computes the same thing: ``capture`` times a
local training step of the trace's model before its training starts
(``profiler.calibrate``) and records it in the trace (``calibration_extra``);
a replay times the same step here (``measure_here``, once per machine and
workload, kept in a cache file) and scales the kept compute by here / there
(``compute_scale``).

One timing cached for good scales every later replay, so a machine's step is
timed in fresh processes until two agree (``time_steadily``), and a timing
during which anything else took a good share of the CPU (``/proc/stat``:
other processes, the hypervisor's steal) counts for nothing; a step no two
timings confirmed is used, said, and not cached.

Limits (docs/fidelity.md): one ratio for all of a step's compute, measured
on one process with the machine to itself, while training's tasks share the
cores; a machine faster at convolutions than at the ps's element-wise apply
(or at gRPC's own CPU work, which is in the gaps too) is scaled by the
convolution-heavy ratio.

This module imports no TensorFlow: a replay host without it simply cannot
calibrate (``CalibrationUnavailable``) and keeps the recorded compute.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench import cross_machine, files, host, lifetime
from tf_grpc_bench.errors import BenchError, ConfigError
from tf_grpc_bench.trace import CALIBRATION_STEP_EXTRA, calibration_step_ns

#: ``RunMetadata.extra`` keys of a trace's calibration (its step: ``CALIBRATION_STEP_EXTRA``).
CALIBRATION_WORKLOAD_EXTRA = "calibration_workload"
#: Environment variable naming the cache file of this machine's calibrations.
CACHE_ENV = "TF_GRPC_BENCH_CALIBRATION_CACHE"
#: How long one calibration may take (TensorFlow's import and the model's build included).
TIMEOUT_S = 900.0
#: A timing is disturbed when anything else (other processes, the hypervisor's steal) took
#: more than this share of the machine's CPU while it ran: a 2-core machine's 0.3 cores.
DISTURBED_SHARE = 0.15
#: Two timings agree when the slower is at most this times the faster.
AGREE_RATIO = 1.2
#: At most this many timings, each in a fresh process, to find two that agree.
MAX_TIMINGS = 4
#: Keras flavours a workload may name (``models.registry.KERAS_FLAVOURS``, without importing it).
KERAS_FLAVOURS = ("keras", "tf_keras")

_WORKLOAD = re.compile(
    r"^(?P<model>[a-z0-9_]+) (?P<size>\d+)x(?P=size) batch (?P<batch>\d+) (?P<keras>[a-z_]+)"
    r"(?:, (?P<processes>\d+) processes at once)?$"
)
#: ``RunMetadata.extra`` keys of the parts of a calibrated step and how far apart the two
#: timings that confirmed it were (the slower over the faster).
CALIBRATION_PARTS_EXTRA = "calibration_parts_ns"
CALIBRATION_SPREAD_EXTRA = "calibration_spread"
#: The kinds of work a calibration times apart (``profiler.calibrate``), and their names.
PART_NAMES = {
    "forward_backward": "forward/backward",
    "apply": "apply",
    "serialize": "serialization",
}

#: A step's parts: (kind of work, median ns), in ``PART_NAMES``' order.
Parts = tuple[tuple[str, int], ...]


def parts_text(parts: Parts) -> str:
    """How traces write a step's parts: ``forward_backward=51000000,apply=...``."""
    return ",".join(f"{name}={ns}" for name, ns in parts)


def parse_parts(text: str, *, where: str) -> Parts:
    """``parts_text`` read back; ConfigError naming ``where`` when it is not one."""
    parts = []
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in PART_NAMES or not value.isdigit() or int(value) <= 0:
            raise ConfigError(
                f"{where}={text!r}: expected NAME=NANOSECONDS, comma-separated, NAME one of "
                f"{', '.join(PART_NAMES)}"
            )
        parts.append((name, int(value)))
    return tuple(parts)


class CalibrationUnavailable(BenchError):
    """This machine cannot time the workload (no TensorFlow, or the timing failed)."""


@dataclass(frozen=True, slots=True)
class Timing:
    """One process's timing of a workload: its median step, and the share of the machine's
    CPU that went to anything else meanwhile (None: not known)."""

    step_ns: int
    others_share: float | None = None
    #: The step's kinds of work timed apart (none from a calibration that does not time them).
    parts: Parts = ()

    @property
    def disturbed(self) -> bool:
        """Others took more of the machine than a timing can ignore."""
        return self.others_share is not None and self.others_share > DISTURBED_SHARE

    def text(self) -> str:
        busy = f" (others {self.others_share:.0%} of the CPU)" if self.disturbed else ""
        return f"{self.step_ns / 1e6:.1f} ms{busy}"


@dataclass(frozen=True, slots=True)
class StepHere:
    """This machine's step for a workload, as ``measure_here`` has it."""

    step_ns: int
    #: "cached", "measured now", or "measured now, unsteady: ..., not cached".
    source: str
    #: False: no two undisturbed timings agreed (the step is the best there was).
    steady: bool = True
    parts: Parts = ()
    #: The slower of the two timings that agreed over the faster (None: not known).
    spread: float | None = None


@dataclass(frozen=True, slots=True)
class Measured:
    """What ``time_steadily`` found: the step taken, every timing, and whether two agreed."""

    step_ns: int
    timings: tuple[Timing, ...]
    steady: bool
    #: The parts of the timing taken.
    parts: Parts = ()
    #: The slower of the agreeing pair over the faster (None: unsteady).
    spread: float | None = None

    def unsteady_text(self) -> str:
        """Why the step is not to be trusted (for a steady one, "")."""
        if self.steady:
            return ""
        disturbed = all(timing.disturbed for timing in self.timings)
        taken = "fastest" if disturbed else "fastest undisturbed"
        return (
            f"unsteady: no two undisturbed timings within {AGREE_RATIO - 1:.0%} "
            f"({', '.join(timing.text() for timing in self.timings)}), the {taken} taken"
        )


@dataclass(frozen=True, slots=True)
class CalibrationWorkload:
    """What a calibration times: a local training step of ``model`` on square images."""

    model: str
    input_size: int
    batch_size: int
    keras: str
    #: How many processes time the step at once, sharing the cores (a job's workers).
    processes: int = 1

    def __post_init__(self) -> None:
        if self.input_size < 1 or self.batch_size < 1 or self.processes < 1:
            raise ConfigError(
                f"calibration workload {self.text!r}: sizes and processes must be >= 1"
            )
        if self.keras not in KERAS_FLAVOURS:
            raise ConfigError(
                f"calibration workload {self.text!r}: keras must be one of "
                f"{', '.join(KERAS_FLAVOURS)}"
            )

    @property
    def text(self) -> str:
        """How traces and results write it: ``"resnet50 32x32 batch 4 keras"``."""
        size = self.input_size
        text = f"{self.model} {size}x{size} batch {self.batch_size} {self.keras}"
        return text if self.processes == 1 else f"{text}, {self.processes} processes at once"

    @classmethod
    def parse(cls, text: str) -> CalibrationWorkload:
        match = _WORKLOAD.match(text.strip())
        if match is None:
            raise ConfigError(
                f"calibration workload {text!r}: expected 'MODEL SIZExSIZE batch N KERAS', "
                "such as 'resnet50 32x32 batch 4 keras', and optionally ', P processes at once'"
            )
        return cls(
            model=match["model"],
            input_size=int(match["size"]),
            batch_size=int(match["batch"]),
            keras=match["keras"],
            processes=int(match["processes"] or 1),
        )


@dataclass(frozen=True, slots=True)
class Calibration:
    """One machine's median local step of ``workload``."""

    workload: CalibrationWorkload
    step_ns: int
    #: The step's kinds of work timed apart (none from older captures).
    parts: Parts = ()
    #: How far apart the two timings that confirmed the step were (None: not recorded).
    spread: float | None = None

    @classmethod
    def measured(cls, workload: CalibrationWorkload, here: StepHere) -> Calibration:
        """What ``measure_here`` found, to record in a trace."""
        return cls(workload, here.step_ns, parts=here.parts, spread=here.spread)

    def extra(self) -> tuple[tuple[str, str], ...]:
        """The trace's ``extra`` entries recording it."""
        entries = [
            (CALIBRATION_STEP_EXTRA, str(self.step_ns)),
            (CALIBRATION_WORKLOAD_EXTRA, self.workload.text),
        ]
        if self.parts:
            entries.append((CALIBRATION_PARTS_EXTRA, parts_text(self.parts)))
        if self.spread is not None:
            entries.append((CALIBRATION_SPREAD_EXTRA, f"{self.spread:.4f}"))
        return tuple(entries)


def from_extra(extra: tuple[tuple[str, str], ...]) -> Calibration | None:
    """The calibration a trace's ``extra`` records; None if it records none.

    A malformed entry raises ``ConfigError`` naming it: a trace is data the
    user hands us, and a silently ignored calibration would mean a silently
    wrong prediction.
    """
    entries = dict(extra)
    if CALIBRATION_STEP_EXTRA not in entries and CALIBRATION_WORKLOAD_EXTRA not in entries:
        return None
    # A workload without its step is as malformed as a step that is not a number.
    step_ns = calibration_step_ns(((CALIBRATION_STEP_EXTRA, ""), *extra))
    assert step_ns is not None
    workload = CalibrationWorkload.parse(entries.get(CALIBRATION_WORKLOAD_EXTRA, ""))
    parts: Parts = ()
    if CALIBRATION_PARTS_EXTRA in entries:
        where = f"trace metadata {CALIBRATION_PARTS_EXTRA}"
        parts = parse_parts(entries[CALIBRATION_PARTS_EXTRA], where=where)
    spread = None
    if CALIBRATION_SPREAD_EXTRA in entries:
        text = entries[CALIBRATION_SPREAD_EXTRA]
        try:
            spread = float(text)
        except ValueError:
            spread = 0.0
        if not spread >= 1.0:
            raise ConfigError(
                f"trace metadata {CALIBRATION_SPREAD_EXTRA}={text!r}: expected a ratio >= 1"
            )
    return Calibration(workload, step_ns, parts=parts, spread=spread)


def cache_path() -> Path:
    """Where this machine's calibrations are kept (``$TF_GRPC_BENCH_CALIBRATION_CACHE``,
    else ``$XDG_CACHE_HOME/tf-grpc-bench/calibrations.json``)."""
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tf-grpc-bench" / "calibrations.json"


def _cache_key(machine: str, workload: CalibrationWorkload) -> str:
    return f"{machine} | {workload.text}"


def _read_cache(path: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached(machine: str, workload: CalibrationWorkload, path: Path | None = None) -> int | None:
    """The step ``machine`` measured for ``workload`` before, if the cache has it."""
    known = cached_step(machine, workload, path)
    return None if known is None else known.step_ns


def cached_step(
    machine: str, workload: CalibrationWorkload, path: Path | None = None
) -> StepHere | None:
    """What the cache keeps of ``machine``'s step for ``workload``: the step, its parts and
    spread (an entry whose parts or spread cannot be read keeps the step alone)."""
    entry = _read_cache(path or cache_path()).get(_cache_key(machine, workload))
    step = entry.get("step_ns") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not isinstance(step, int) or step <= 0:
        return None
    try:
        parts = (
            parse_parts(str(entry.get("parts") or ""), where="cache") if entry.get("parts") else ()
        )
    except ConfigError:
        parts = ()
    spread = entry.get("spread")
    return StepHere(
        step,
        "cached",
        parts=parts,
        spread=float(spread) if isinstance(spread, (int, float)) and spread >= 1 else None,
    )


def remember(
    machine: str,
    workload: CalibrationWorkload,
    step_ns: int,
    path: Path | None = None,
    *,
    timings: tuple[Timing, ...] = (),
    parts: Parts = (),
    spread: float | None = None,
) -> None:
    """Keep a measured step in the cache, with the timings it was taken from (each step
    and others' share of the CPU, for whoever reads the file); a cache that cannot be
    written is skipped."""
    path = path or cache_path()
    data = _read_cache(path)
    data[_cache_key(machine, workload)] = {
        "step_ns": step_ns,
        "measured_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timings": [
            {"step_ns": timing.step_ns, "others_cpu_share": timing.others_share}
            for timing in timings
        ],
    }
    if parts:
        data[_cache_key(machine, workload)]["parts"] = parts_text(parts)
    if spread is not None:
        data[_cache_key(machine, workload)]["spread"] = round(spread, 4)
    try:
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        files.write_atomically(
            path,
            lambda stream: stream.write(text.encode()),
            error=BenchError,
            what="the calibration cache",
        )
    except BenchError:
        pass


def run_calibration(workload: CalibrationWorkload, *, timeout_s: float = TIMEOUT_S) -> Timing:
    """Time ``workload`` on this machine in a child process: its median step, and how much
    of the machine went to anything else meanwhile.

    Raises ``CalibrationUnavailable`` when TensorFlow is not installed here or
    the child fails (its last line of stderr says why).
    """
    if importlib.util.find_spec("tensorflow") is None:
        raise CalibrationUnavailable(
            "TensorFlow is not installed on this machine (pip install 'tf-grpc-bench[profiler]')"
        )
    command = [
        sys.executable,
        "-m",
        "tf_grpc_bench.profiler.calibrate",
        "--workload",
        workload.text,
    ]
    try:
        completed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            preexec_fn=lifetime.die_with_parent_preexec(),
        )
    except subprocess.TimeoutExpired:
        raise CalibrationUnavailable(
            f"timing {workload.text} took longer than {timeout_s:g} s"
        ) from None
    lines = completed.stdout.strip().splitlines()
    try:
        printed = json.loads(lines[-1]) if completed.returncode == 0 else {}
        step = int(printed["step_ns"])
        others = printed.get("others_cpu_share")
        share = None if others is None else float(others)
        parts = tuple((name, int(printed["parts_ns"][name])) for name in PART_NAMES)
    except (IndexError, KeyError, TypeError, ValueError, AttributeError):
        step, share, parts = 0, None, ()
    if step <= 0:
        reason = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise CalibrationUnavailable(f"timing {workload.text} failed: {reason}")
    return Timing(step, share, parts)


def time_steadily(
    workload: CalibrationWorkload,
    time_once: Callable[[CalibrationWorkload], Timing] = run_calibration,
) -> Measured:
    """Time ``workload`` in fresh processes until two undisturbed timings agree (within
    ``AGREE_RATIO``), at most ``MAX_TIMINGS`` times; the step is the faster of the fastest
    agreeing pair, else (unsteady) the fastest undisturbed timing, else the fastest.

    A slowdown only ever lengthens a step, so of timings that agree the faster is
    the machine's; two are needed because one process can be slowed by what no
    counter here sees (a neighbour on the host, the CPU's clock).
    """
    timings: list[Timing] = []
    while len(timings) < MAX_TIMINGS:
        timings.append(time_once(workload))
        steady = sorted(
            (timing for timing in timings if not timing.disturbed), key=lambda t: t.step_ns
        )
        for faster, slower in itertools.pairwise(steady):
            if slower.step_ns <= faster.step_ns * AGREE_RATIO:
                spread = slower.step_ns / faster.step_ns
                return Measured(
                    faster.step_ns, tuple(timings), steady=True, parts=faster.parts, spread=spread
                )
    pool = [timing for timing in timings if not timing.disturbed] or timings
    best = min(pool, key=lambda timing: timing.step_ns)
    return Measured(best.step_ns, tuple(timings), steady=False, parts=best.parts)


def measure_here(
    machine: str,
    workload: CalibrationWorkload,
    time_once: Callable[[CalibrationWorkload], Timing] = run_calibration,
) -> StepHere:
    """This machine's step for ``workload``: from the cache, else timed now
    (``time_steadily``) and cached if steady; an unsteady step is used but not cached."""
    known = cached_step(machine, workload)
    if known is not None:
        return known
    measured = time_steadily(workload, time_once)
    if not measured.steady:
        source = f"measured now, {measured.unsteady_text()}, not cached"
        return StepHere(measured.step_ns, source, steady=False, parts=measured.parts)
    remember(
        machine,
        workload,
        measured.step_ns,
        timings=measured.timings,
        parts=measured.parts,
        spread=measured.spread,
    )
    return StepHere(measured.step_ns, "measured now", parts=measured.parts, spread=measured.spread)


def calibration_line(extra: tuple[tuple[str, str], ...]) -> str:
    """``inspect``'s line on the trace's compute calibration ("" for a trace naming no
    capture machine and no calibration)."""
    try:
        recorded = from_extra(extra)
    except ConfigError as error:
        return f"compute calibration: unreadable ({error})"
    if recorded is not None:
        details = [", ".join(f"{PART_NAMES[n]} {ns / 1e6:.1f} ms" for n, ns in recorded.parts)]
        details = [text for text in details if text]
        if recorded.spread is not None:
            details.append(f"confirmed by a timing {recorded.spread - 1:.0%} slower")
        kinds = f" ({'; '.join(details)})" if details else ""
        return (
            f"compute calibration: {recorded.workload.text}, {recorded.step_ns / 1e6:.1f} ms "
            f"a step{kinds} (a replay on another machine scales the compute by its own step "
            "/ this)"
        )
    if host.captured_on(extra):
        return "compute calibration: none (a replay on another machine keeps this one's compute)"
    return ""


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
    uncertainty = cross_machine.uncertainty_text(captured, here, known)
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
    steps = (
        f"{recorded.workload.text}: {recorded.step_ns / 1e6:.1f} ms a step on "
        f"{captured or 'the capture machine'}, {measured.step_ns / 1e6:.1f} ms on {here} "
        f"({measured.source})"
    )
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
    return ComputeToHere(scale, f"{steps}: compute x{scale:.3g}", calibrated=True)
