"""WHEN to send: pacing strategies, apart from WHAT is sent (``workload``).

A pacing combines a *timing* (when a call may be released) with a *window*
(how many calls may be in flight):

* ``asap``: closed loop, as fast as possible; each call goes as soon as the
  window allows.
* ``recorded``: open loop at the trace's recorded offsets: call *i* of a step is
  released at ``step begin + offset_ns / speedup``, computed from absolute
  deadlines so lateness never accumulates.  A step begins at its recorded
  distance from the previous step's begin, or when the previous step's calls
  have all completed, whichever is later (compute time is kept as idle time).
* ``rate``: open loop at a fixed rate: call *n* of a run is released at
  ``run begin + n / rate``.
* ``dependencies``: training's causality (``dependencies``): a trace call goes
  once what it waits for has arrived in the replay, plus the recorded compute
  gap times ``compute_scale`` (1 keeps the recorded compute, 0 drops it); a
  worker's next step begins when its step's calls are done plus the step's
  recorded tail.  The default for trace replays of PS throughput.

Time dilation (``time_dilation`` K, dependencies timing only): the replay runs
K times slower than the training it predicts, on a link K times slower
(``network compare`` shapes it so), with every compute gap K times longer;
its measurements are then divided by K (``measurement.in_link_time``).  The
replay's own CPU per call does not grow with K, so a replay too slow on this
machine to keep up with a fast link keeps up with the dilated one.  This is
time-dilated network emulation (Gupta et al., "To Infinity and Beyond:
Time-Warped Network Emulation", NSDI 2006); docs/fidelity.md has its limits.

Window: an integer N allows at most N calls in flight per worker (under
``dependencies`` the default is no window beyond ``OPEN_LOOP_MAX_IN_FLIGHT``:
the dependencies shape the concurrency);
``RECORDED_WINDOW`` (None) keeps the trace's concurrency: a call waits until no
more of its (worker, ps) pair's calls are in flight than were open when it
started in the trace (``Call.outstanding_at_start``; 0 for synthetic calls,
so synthetic fan-out keeps one call per ps in flight).

Each timing is a row of one table (``TimingSpec``: the settings it reads, whether
it needs a trace, how it releases calls and begins steps), and each pacing
setting is a row too (``PacingSetting``: its flag, its value when unset).  The
rule "a setting applies only to the timings whose rows read it" is checked in
one place (``check_settings``) with one error type (``PacingError``); what a
replay asks for (``PacingChoice``) is resolved into a ``Pacing`` once
(``resolve_pacing``).  A new timing is one ``register_timing`` call.

Pure: functions of the times they are given, no clock of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, ClassVar

from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay.core.named import OpenName
from tf_grpc_bench.replay.core.workload import Call

#: Largest compute scale accepted (100x slower compute than recorded).
MAX_COMPUTE_SCALE = 100.0
#: Largest time dilation accepted (a 10 Gbit/s link replayed at 156 Mbit/s).
MAX_TIME_DILATION = 64.0
#: Fastest --rate (calls per second per worker) and largest --speedup: far past what a
#: replay reaches, finite so that schedules stay computable.
MAX_RATE_PER_S = 1e7
MAX_SPEEDUP = 1e6
#: Window value meaning "the concurrency recorded in the trace".
RECORDED_WINDOW = None
#: Cap on calls in flight for open-loop timings without an explicit window,
#: so a server that falls behind cannot make the client queue without bound.
OPEN_LOOP_MAX_IN_FLIGHT = 1024


class PacingError(UsageError, ConfigError):
    """A pacing setting out of its range, or one its timing does not use.

    Both a bad combination of flags and a value out of range, so it is both
    error kinds (the exit status is the same)."""


class Timing(OpenName):
    """When a call may be released: the name of a ``TimingSpec`` row.

    Pickled with its row, so a worker process spawned without the module that
    registered a timing still paces by it."""

    __slots__ = ()
    ASAP: ClassVar[Timing]
    RECORDED: ClassVar[Timing]
    RATE: ClassVar[Timing]
    DEPENDENCIES: ClassVar[Timing]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return restore_timing, (self.value, _TIMINGS.get(self))


# --------------------------------------------------------------------------
# The settings and the timings, as tables.


@dataclass(frozen=True, slots=True, kw_only=True)
class PacingSetting:
    """A pacing knob that only some timings read (``TimingSpec.settings``)."""

    #: Its field in ``Pacing`` and ``PacingChoice``.
    field: str
    #: How a user gives it.
    flag: str
    metavar: str
    #: Its value in a ``Pacing`` whose timing does not read it; None: not checked there.
    unset: float | None
    #: Recorded as a result parameter of its own (``timing_parameters``).
    parameter: bool = True


#: The pacing settings, in the order their rules are checked.
SETTINGS = (
    PacingSetting(field="compute_scale", flag="--compute", metavar="SCALE", unset=1.0),
    PacingSetting(
        field="time_dilation", flag="--time-dilation", metavar="K", unset=1.0, parameter=False
    ),
    PacingSetting(field="rate_per_s", flag="--rate", metavar="CALLS_PER_S", unset=0.0),
    PacingSetting(field="speedup", flag="--speedup", metavar="N", unset=None),
)
_SETTINGS = {setting.field: setting for setting in SETTINGS}

#: When a call may go: (pacing, call, calls this worker issued since the run began,
#: step begin, run begin) -> absolute ns, or None for "now".
ReleaseRule = Callable[["Pacing", Call, int, int, int], "int | None"]
#: When the next step begins: (pacing, previous begin, previous end, recorded period) -> ns.
StepRule = Callable[["Pacing", int, int, int], int]


def named_label(pacing: Pacing) -> str:
    return pacing.timing.value


def release_now(pacing: Pacing, call: Call, number: int, step_ns: int, run_ns: int) -> None:
    """Closed loop, or releases decided elsewhere (dependencies): no planned time."""
    return None


def when_previous_ends(pacing: Pacing, begin_ns: int, end_ns: int, period_ns: int) -> int:
    return end_ns


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingSpec:
    """One timing: what it reads, what it needs, and how it releases calls and steps."""

    name: str
    #: One line for ``--pacing``'s help.
    summary: str
    #: The ``PacingSetting`` fields it reads.
    settings: tuple[str, ...] = ()
    #: Of those, the ones it cannot do without.
    required: tuple[str, ...] = ()
    #: Why it needs a trace ("" when synthetic workloads can use it too).
    needs_trace: str = ""
    #: An unset window caps calls in flight at ``OPEN_LOOP_MAX_IN_FLIGHT`` (the calls
    #: follow the clock or the dependencies); False: it keeps the trace's concurrency.
    open_loop: bool = False
    #: Why a worker may have only one client process under it ("": it may have more):
    #: its settings are per client process.
    per_process: str = ""
    release: ReleaseRule = release_now
    next_step_begin: StepRule = when_previous_ends
    #: The pacing in a few words, before its window (``Pacing.describe``).
    label: Callable[[Pacing], str] = named_label

    @property
    def timing(self) -> Timing:
        return Timing(self.name)


_TIMINGS: dict[Timing, TimingSpec] = {}


def register_timing(spec: TimingSpec) -> Timing:
    """Add a timing row (``--pacing NAME``); ValueError if its name is taken."""
    unknown = set(spec.settings) - set(_SETTINGS)
    if unknown or not set(spec.required) <= set(spec.settings):
        raise ValueError(f"timing {spec.name}: unknown or unread settings {sorted(unknown)}")
    timing = Timing.define(spec.name)
    if timing in _TIMINGS:
        raise ValueError(f"a timing named {spec.name!r} is already registered")
    _TIMINGS[timing] = spec
    return timing


def restore_timing(name: str, spec: TimingSpec | None) -> Timing:
    """``name`` unpickled: with its row registered here if it was not (``Timing``)."""
    timing = Timing.define(name)
    if spec is not None and timing not in _TIMINGS:
        _TIMINGS[timing] = spec
    return timing


def withdraw_timing(timing: Timing) -> None:
    """Remove a timing row (a test's own)."""
    _TIMINGS.pop(timing, None)
    Timing.withdraw(timing)


def timing_spec(timing: Timing) -> TimingSpec:
    try:
        return _TIMINGS[timing]
    except KeyError:
        raise ConfigError(f"--pacing {timing.value}: no such timing here") from None


def _recorded_release(pacing: Pacing, call: Call, number: int, step_ns: int, run_ns: int) -> int:
    return step_ns + round(call.offset_ns / pacing.speedup)


def _rate_release(pacing: Pacing, call: Call, number: int, step_ns: int, run_ns: int) -> int:
    return run_ns + round(number * 1e9 / pacing.rate_per_s)


def _recorded_step(pacing: Pacing, begin_ns: int, end_ns: int, period_ns: int) -> int:
    return max(begin_ns + round(period_ns / pacing.speedup), end_ns)


def _recorded_label(pacing: Pacing) -> str:
    return f"recorded x{pacing.speedup:g}"


def _rate_label(pacing: Pacing) -> str:
    return f"rate {pacing.rate_per_s:g}/s"


def _dependencies_label(pacing: Pacing) -> str:
    dilation = f", time dilation {pacing.time_dilation:g}" if pacing.time_dilation != 1 else ""
    return f"dependencies, compute x{pacing.compute_scale:g}{dilation}"


Timing.ASAP = register_timing(
    TimingSpec(name="asap", summary="closed loop, as fast as the window allows")
)
Timing.RECORDED = register_timing(
    TimingSpec(
        name="recorded",
        summary="the trace's offsets",
        settings=("speedup",),
        needs_trace="synthetic payloads have no timestamps",
        release=_recorded_release,
        next_step_begin=_recorded_step,
        label=_recorded_label,
    )
)
Timing.RATE = register_timing(
    TimingSpec(
        name="rate",
        summary="a fixed rate (--rate)",
        settings=("rate_per_s",),
        required=("rate_per_s",),
        open_loop=True,
        per_process="is a rate per client process",
        release=_rate_release,
        label=_rate_label,
    )
)
Timing.DEPENDENCIES = register_timing(
    TimingSpec(
        name="dependencies",
        summary="training's causality, compute gaps kept",
        settings=("compute_scale", "time_dilation"),
        needs_trace="synthetic payloads have no dependencies",
        open_loop=True,
        label=_dependencies_label,
    )
)


# --------------------------------------------------------------------------
# The rules, each checked here and nowhere else.


def check_settings(timing: Timing, given: Collection[str], *, context: str = "") -> None:
    """PacingError for the first setting in ``given`` (``PacingSetting.field`` names)
    that ``timing`` does not read: "X applies only to --pacing Y" (``context`` after)."""
    for setting in SETTINGS:
        if setting.field in given and setting.field not in timing_spec(timing).settings:
            readers = [t.name for t in _TIMINGS.values() if setting.field in t.settings]
            raise PacingError(
                f"{setting.flag} applies only to --pacing {' or '.join(readers)}{context}"
            )


def check_source(timing: Timing, source: str) -> None:
    """PacingError when ``timing`` needs a trace and the workload is ``source`` synthetic."""
    why = timing_spec(timing).needs_trace
    if why and source == "synthetic":
        raise PacingError(f"--pacing {timing.value} needs a trace ({why})")


def check_processes_per_worker(timing: Timing, processes: int | None) -> None:
    """PacingError for more than one client process per worker (None: ``auto``, allowed)
    under a timing whose settings are per client process."""
    why = timing_spec(timing).per_process
    if why and processes not in (None, 1):
        raise PacingError(
            f"--procs-per-worker {processes}: --pacing {timing.value} {why}; "
            "give --procs-per-worker 1"
        )


def _check_ranges(pacing: Pacing, reads: Collection[str]) -> None:
    if pacing.window is not None and pacing.window < 1:
        raise PacingError(f"--outstanding must be >= 1, got {pacing.window}")
    if "rate_per_s" in reads and not 0 < pacing.rate_per_s <= MAX_RATE_PER_S:
        raise PacingError(
            f"--rate must be in (0, {MAX_RATE_PER_S:g}] calls/s, got {pacing.rate_per_s:g}"
        )
    if not 0 < pacing.speedup <= MAX_SPEEDUP:
        raise PacingError(f"--speedup must be in (0, {MAX_SPEEDUP:g}], got {pacing.speedup:g}")
    check_compute_scale(pacing.compute_scale)
    if not 1 <= pacing.time_dilation <= MAX_TIME_DILATION:
        raise PacingError(
            f"--time-dilation must be in [1, {MAX_TIME_DILATION:g}], got {pacing.time_dilation:g}"
        )


def check_compute_scale(scale: float) -> None:
    """PacingError unless ``scale`` is a compute scale ``--compute`` takes."""
    if not 0 <= scale <= MAX_COMPUTE_SCALE:
        raise PacingError(
            f"--compute must be 'recorded', 'none' or a scale in [0, {MAX_COMPUTE_SCALE:g}], "
            f"got {scale}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Pacing:
    timing: Timing = Timing.ASAP
    #: Calls in flight per worker; None keeps the recorded per-pair concurrency.
    window: int | None = 1
    #: Calls per second per worker (``rate`` timing only).
    rate_per_s: float = 0.0
    #: Recorded timing only: 2.0 replays twice as fast as recorded.
    speedup: float = 1.0
    #: Dependencies timing only: the recorded compute gaps times this (0: none).
    compute_scale: float = 1.0
    #: Dependencies timing only: the replay runs this many times slower than the
    #: training it predicts (the link shaped as much slower); see the module's doc.
    time_dilation: float = 1.0

    def __post_init__(self) -> None:
        reads = timing_spec(self.timing).settings
        _check_ranges(self, reads)
        given = [
            s.field for s in SETTINGS if s.unset is not None and getattr(self, s.field) != s.unset
        ]
        check_settings(self.timing, given)

    @property
    def wall_compute_scale(self) -> float:
        """The recorded compute gaps' scale in the replay's own (dilated) time."""
        return self.compute_scale * self.time_dilation

    @property
    def closed_loop(self) -> bool:
        return self.timing is Timing.ASAP

    def describe(self) -> str:
        window = "recorded" if self.window is None else str(self.window)
        return f"{timing_spec(self.timing).label(self)}, window {window}"


def timing_parameters(pacing: Pacing) -> dict[str, str | int | float | bool]:
    """The result parameters of ``pacing``'s own knobs (rate, compute scale, speed-up)."""
    reads = timing_spec(pacing.timing).settings
    return {
        s.field: float(getattr(pacing, s.field))
        for s in SETTINGS
        if s.parameter and s.field in reads
    }


# --------------------------------------------------------------------------
# What a replay asks for, resolved into a Pacing.


@dataclass(frozen=True, slots=True, kw_only=True)
class PacingChoice:
    """The pacing a replay asks for; None where it leaves the benchmark's default."""

    #: ``--pacing``; default: the benchmark's (``benchmarks.Defaults.timing``).
    timing: Timing | None = None
    #: ``--rate``: calls per second per worker (rate pacing only).
    rate_per_s: float | None = None
    #: ``--speedup``: recorded pacing N times faster (recorded pacing only).
    speedup: float | None = None
    #: ``--compute``: the scale of the recorded compute gaps (dependencies pacing only).
    compute_scale: float | None = None
    #: The scale dependencies pacing takes without ``--compute`` (``--compute auto``'s: the
    #: trace's compute brought to this machine), None for 1; other pacings ignore it.
    default_compute_scale: float | None = None
    #: ``--outstanding``: calls in flight (ignored by benchmarks that make one at a time).
    outstanding: int | None = None
    #: ``--time-dilation``: the replay runs this many times slower than the training it
    #: predicts, on a link as much slower (dependencies pacing only).
    time_dilation: float = 1.0

    def given(self) -> tuple[str, ...]:
        """The ``PacingSetting`` fields this choice sets."""
        return tuple(
            s.field
            for s in SETTINGS
            if (s.field == "time_dilation" and self.time_dilation != 1)
            or (s.field != "time_dilation" and getattr(self, s.field) is not None)
        )


def resolve_timing(choice: PacingChoice, default: Timing, *, context: str = "") -> Timing:
    """The timing ``choice`` asks for (``default`` if none); PacingError for a setting that
    timing does not read."""
    timing = choice.timing if choice.timing is not None else default
    check_settings(timing, choice.given(), context=context)
    return timing


def resolve_pacing(
    choice: PacingChoice, *, default: Timing, window: int | None, context: str = ""
) -> Pacing:
    """``choice`` resolved into a ``Pacing`` with ``window``: its timing (``default`` if
    it names none), every rule checked (``PacingError``)."""
    timing = resolve_timing(choice, default, context=context)
    spec = timing_spec(timing)
    for field in spec.required:
        if getattr(choice, field) is None:
            setting = _SETTINGS[field]
            raise PacingError(f"--pacing {timing.value} needs {setting.flag} {setting.metavar}")
    compute_scale = choice.compute_scale
    if compute_scale is None:
        compute_scale = choice.default_compute_scale or 1.0
    return Pacing(
        timing=timing,
        window=window,
        rate_per_s=choice.rate_per_s
        if "rate_per_s" in spec.settings and choice.rate_per_s
        else 0.0,
        speedup=choice.speedup if choice.speedup is not None else 1.0,
        compute_scale=compute_scale if "compute_scale" in spec.settings else 1.0,
        time_dilation=choice.time_dilation,
    )


# --------------------------------------------------------------------------
# ``--compute``: one parse.

#: ``--compute`` words: scale the trace's compute to this machine when the trace was
#: captured elsewhere (auto), always or fail (here), keep it (recorded), drop it (none).
COMPUTE_AUTO = "auto"
COMPUTE_HERE = "here"
COMPUTE_WORDS = {"recorded": 1.0, "none": 0.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Compute:
    """``--compute``: a word, or a scale of the recorded compute gaps."""

    #: ``auto``, ``here``, ``recorded``, ``none``, or "" for an explicit ``scale``.
    word: str = COMPUTE_AUTO
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.word and self.word not in (COMPUTE_AUTO, COMPUTE_HERE, *COMPUTE_WORDS):
            raise PacingError(f"--compute: unknown word {self.word!r}")
        if not self.word and not 0 <= self.scale <= MAX_COMPUTE_SCALE:
            raise PacingError(
                f"--compute {self.text!r}: a scale must be in [0, {MAX_COMPUTE_SCALE:g}]"
            )

    @classmethod
    def parse(cls, text: str) -> Compute:
        """``auto``, ``here``, ``recorded``, ``none`` or a scale such as 0.5; PacingError else."""
        if text in (COMPUTE_AUTO, COMPUTE_HERE, *COMPUTE_WORDS):
            return cls(word=text, scale=COMPUTE_WORDS.get(text, 1.0))
        try:
            scale = float(text)
        except ValueError:
            raise PacingError(
                f"--compute {text!r}: expected 'auto', 'here', 'recorded', 'none' or a scale "
                "such as 0.5"
            ) from None
        if not math.isfinite(scale) or not 0 <= scale <= MAX_COMPUTE_SCALE:
            raise PacingError(f"--compute {text!r}: a scale must be in [0, {MAX_COMPUTE_SCALE:g}]")
        return cls(word="", scale=scale)

    @property
    def text(self) -> str:
        """As ``--compute`` takes it (``parse`` gives this record back)."""
        return self.word or repr(self.scale)

    @property
    def to_this_machine(self) -> bool:
        """``auto`` or ``here``: scaled by the calibrations of both machines."""
        return self.word in (COMPUTE_AUTO, COMPUTE_HERE)


# --------------------------------------------------------------------------
# Releases and windows.


def release_time_ns(
    pacing: Pacing, call: Call, *, call_number: int, step_begin_ns: int, run_begin_ns: int
) -> int | None:
    """Absolute time at which ``call`` may be issued, or None for "now".

    ``call_number`` counts the calls this worker issued since ``run_begin_ns``.
    Under ``dependencies`` the release depends on completions: the driver asks
    a ``DependencyTracker`` instead, and this returns None.
    """
    return _TIMINGS[pacing.timing].release(pacing, call, call_number, step_begin_ns, run_begin_ns)


def may_issue(pacing: Pacing, call: Call, *, in_flight: int, in_flight_to_server: int) -> bool:
    """Whether the window lets ``call`` go with this many calls in flight."""
    if pacing.window is not None:
        return in_flight < pacing.window
    if _TIMINGS[pacing.timing].open_loop:
        return in_flight < OPEN_LOOP_MAX_IN_FLIGHT
    return in_flight_to_server <= call.outstanding_at_start


def keeps_recorded_window(pacing: Pacing) -> bool:
    """Whether ``pacing`` holds calls to the trace's per-(worker, ps) concurrency."""
    return pacing.window is None and not _TIMINGS[pacing.timing].open_loop


def next_step_begin_ns(
    pacing: Pacing, *, previous_begin_ns: int, previous_end_ns: int, recorded_period_ns: int
) -> int:
    """When the next step begins, given when the previous one began and ended."""
    rule = _TIMINGS[pacing.timing].next_step_begin
    return rule(pacing, previous_begin_ns, previous_end_ns, recorded_period_ns)


def blocking_calls_suffice(pacing: Pacing) -> bool:
    """True when at most one call is ever in flight, so a driver may block on each."""
    return pacing.window == 1


def timing_names() -> tuple[str, ...]:
    """The registered timings' names, for ``--pacing``."""
    return tuple(spec.name for spec in _TIMINGS.values())
