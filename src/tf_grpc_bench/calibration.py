"""Compute calibration: how fast a machine computes its trace's training step.

A trace keeps the compute of the machine that captured it: the gaps between
a tensor's arrival at a task and the tensors computed from it leaving.  A
replay on another machine that keeps those gaps predicts training on the
*capture* machine.  To predict training here instead, the compute is scaled
by how much faster this machine computes the same thing: ``capture`` times the
job's workers' local training step (``profiler.calibrate``: as many processes
at once as the job has workers, each kind of work apart) before its training
starts and records it in the trace (``Calibration.extra``); a replay times the
same step here (``measure_here``, once per machine and workload, kept in a
cache file) and scales the kept compute by here / there
(``tf_grpc_bench.compute_scale``).

One timing cached for good scales every later replay, so a machine's step is
timed in fresh processes until two agree (``time_steadily``), and a timing
during which anything else took a good share of the CPU (``/proc/stat``:
other processes, the hypervisor's steal) counts for nothing.

The cache's policy (``measure_here``): every step is cached, a steady one
(two timings agreed) and an unsteady one (none did: the fastest taken, kept
with how far apart its timings were and marked unsteady), so that a busy
machine does not time the step again at every replay.  A cached step is timed
again only when asked (``$TF_GRPC_BENCH_RECALIBRATE=1``), or when it is
unsteady, others disturbed some of its timings, and the machine is quiet now
(``time_again``).  A replay says when a step is unsteady, and the spread of
its timings widens the uncertainty it states (``compute_scale``).

This module imports no TensorFlow: a replay host without it simply cannot
calibrate (``CalibrationUnavailable``) and keeps the recorded compute.
"""

from __future__ import annotations

import datetime
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench import files, host, lifetime
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
#: Environment variable: "1" times a calibration again even where the cache has it.
RECALIBRATE_ENV = "TF_GRPC_BENCH_RECALIBRATE"
#: How long ``machine_is_quiet`` watches ``/proc/stat``.
QUIET_SAMPLE_S = 0.5
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
#: ``"false"`` where no two timings confirmed the step (absent: steady).
CALIBRATION_STEADY_EXTRA = "calibration_steady"
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
    #: "cached", "measured now", "measured now, unsteady: ..." or "cached, unsteady: ...".
    source: str
    #: False: no two undisturbed timings agreed (the step is the best there was).
    steady: bool = True
    parts: Parts = ()
    #: Steady: the slower of the two timings that agreed over the faster; unsteady: the
    #: slowest timing over the fastest (``Measured.spread``); None: not known.
    spread: float | None = None
    #: Some of its timings were disturbed (others took the machine meanwhile).
    disturbed: bool = False


@dataclass(frozen=True, slots=True)
class Measured:
    """What ``time_steadily`` found: the step taken, every timing, and whether two agreed."""

    step_ns: int
    timings: tuple[Timing, ...]
    steady: bool
    #: The parts of the timing taken.
    parts: Parts = ()
    #: Steady: the slower of the agreeing pair over the faster.  Unsteady: the slowest
    #: undisturbed timing over the fastest (of every timing where fewer than two were
    #: undisturbed): how far the step taken may be off.
    spread: float | None = None

    @property
    def disturbed(self) -> bool:
        """Some of the timings were disturbed."""
        return any(timing.disturbed for timing in self.timings)

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
    #: How far apart the two timings that confirmed the step were, or for an unsteady
    #: step its timings (None: not recorded).
    spread: float | None = None
    #: False: no two timings confirmed the step (``StepHere.steady``).
    steady: bool = True

    @classmethod
    def measured(cls, workload: CalibrationWorkload, here: StepHere) -> Calibration:
        """What ``measure_here`` found, to record in a trace."""
        return cls(workload, here.step_ns, parts=here.parts, spread=here.spread, steady=here.steady)

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
        if not self.steady:
            entries.append((CALIBRATION_STEADY_EXTRA, "false"))
        return tuple(entries)

    @property
    def unsteady_spread(self) -> float | None:
        """How far apart an unsteady step's timings were (None: steady, or not known)."""
        return None if self.steady else self.spread


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
    steady = entries.get(CALIBRATION_STEADY_EXTRA, "true")
    if steady not in ("true", "false"):
        raise ConfigError(
            f"trace metadata {CALIBRATION_STEADY_EXTRA}={steady!r}: expected true or false"
        )
    return Calibration(workload, step_ns, parts=parts, spread=spread, steady=steady == "true")


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
    known = float(spread) if isinstance(spread, (int, float)) and spread >= 1 else None
    steady = entry.get("steady", True) is not False
    timings = entry.get("timings")
    disturbed = isinstance(timings, list) and any(
        isinstance(timing, dict)
        and isinstance(share := timing.get("others_cpu_share"), (int, float))
        and share > DISTURBED_SHARE
        for timing in timings
    )
    source = "cached"
    if not steady:
        apart = "" if known is None else f": its timings {known - 1:.0%} apart"
        source = f"cached, unsteady{apart}"
    return StepHere(step, source, steady=steady, parts=parts, spread=known, disturbed=disturbed)


def remember(
    machine: str,
    workload: CalibrationWorkload,
    step_ns: int,
    path: Path | None = None,
    *,
    timings: tuple[Timing, ...] = (),
    parts: Parts = (),
    spread: float | None = None,
    steady: bool = True,
) -> None:
    """Keep a measured step in the cache, with the timings it was taken from (each step
    and others' share of the CPU, for whoever reads the file), marked unsteady where no
    two confirmed it; a cache that cannot be written is skipped."""
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
    if not steady:
        data[_cache_key(machine, workload)]["steady"] = False
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
    pool = [timing for timing in timings if not timing.disturbed]
    best = min(pool or timings, key=lambda timing: timing.step_ns)
    apart = [timing.step_ns for timing in (pool if len(pool) > 1 else timings)]
    return Measured(
        best.step_ns, tuple(timings), steady=False, parts=best.parts,
        spread=max(apart) / min(apart),
    )  # fmt: skip


def machine_is_quiet(sample_s: float = QUIET_SAMPLE_S) -> bool:
    """Whether anything else took at most ``DISTURBED_SHARE`` of the machine's CPU over
    the next ``sample_s`` seconds (False where ``/proc/stat`` cannot tell)."""
    begin, own = host.read_machine_cpu(), time.process_time_ns()
    time.sleep(sample_s)
    share = host.others_cpu_share(begin, host.read_machine_cpu(), time.process_time_ns() - own)
    return share is not None and share <= DISTURBED_SHARE


def time_again(known: StepHere, quiet: Callable[[], bool] = machine_is_quiet) -> bool:
    """Whether a cached step is to be timed again: when asked (``$TF_GRPC_BENCH_RECALIBRATE``
    is 1), or when it is unsteady, others disturbed some of its timings and the machine
    is quiet now.  A steady step, or an unsteady one timed on a quiet machine, stands."""
    if os.environ.get(RECALIBRATE_ENV) == "1":
        return True
    return not known.steady and known.disturbed and quiet()


def measure_here(
    machine: str,
    workload: CalibrationWorkload,
    time_once: Callable[[CalibrationWorkload], Timing] = run_calibration,
    quiet: Callable[[], bool] = machine_is_quiet,
) -> StepHere:
    """This machine's step for ``workload``: from the cache (unless ``time_again``), else
    timed now (``time_steadily``) and cached, steady or marked unsteady."""
    known = cached_step(machine, workload)
    if known is not None and not time_again(known, quiet):
        return known
    measured = time_steadily(workload, time_once)
    remember(
        machine,
        workload,
        measured.step_ns,
        timings=measured.timings,
        parts=measured.parts,
        spread=measured.spread,
        steady=measured.steady,
    )
    source = "measured now"
    if not measured.steady:
        source = f"measured now, {measured.unsteady_text()}, cached as unsteady"
    return StepHere(
        measured.step_ns, source, steady=measured.steady, parts=measured.parts,
        spread=measured.spread, disturbed=measured.disturbed,
    )  # fmt: skip


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
        if not recorded.steady:
            apart = (
                "" if recorded.spread is None else f", its timings {recorded.spread - 1:.0%} apart"
            )
            details.append(f"unsteady: no two timings confirmed it{apart}")
        elif recorded.spread is not None:
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
