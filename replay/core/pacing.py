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

Pure: functions of the times they are given, no clock of their own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tf_grpc_bench.errors import ConfigError
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


class Timing(enum.Enum):
    ASAP = "asap"
    RECORDED = "recorded"
    RATE = "rate"
    DEPENDENCIES = "dependencies"


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
        if self.window is not None and self.window < 1:
            raise ConfigError(f"--outstanding must be >= 1, got {self.window}")
        if self.timing is Timing.RATE:
            if not 0 < self.rate_per_s <= MAX_RATE_PER_S:
                raise ConfigError(
                    f"--rate must be in (0, {MAX_RATE_PER_S:g}] calls/s, got {self.rate_per_s:g}"
                )
        elif self.rate_per_s:
            raise ConfigError("--rate applies only to --pacing rate")
        if not 0 < self.speedup <= MAX_SPEEDUP:
            raise ConfigError(f"--speedup must be in (0, {MAX_SPEEDUP:g}], got {self.speedup:g}")
        if not 0 <= self.compute_scale <= MAX_COMPUTE_SCALE:
            raise ConfigError(
                f"--compute must be 'recorded', 'none' or a scale in [0, {MAX_COMPUTE_SCALE:g}], "
                f"got {self.compute_scale}"
            )
        if self.compute_scale != 1.0 and self.timing is not Timing.DEPENDENCIES:
            raise ConfigError("--compute applies only to --pacing dependencies")
        if not 1 <= self.time_dilation <= MAX_TIME_DILATION:
            raise ConfigError(
                f"--time-dilation must be in [1, {MAX_TIME_DILATION:g}], got {self.time_dilation:g}"
            )
        if self.time_dilation != 1.0 and self.timing is not Timing.DEPENDENCIES:
            raise ConfigError("--time-dilation applies only to --pacing dependencies")

    @property
    def wall_compute_scale(self) -> float:
        """The recorded compute gaps' scale in the replay's own (dilated) time."""
        return self.compute_scale * self.time_dilation

    @property
    def closed_loop(self) -> bool:
        return self.timing is Timing.ASAP

    def describe(self) -> str:
        window = "recorded" if self.window is None else str(self.window)
        if self.timing is Timing.RATE:
            return f"rate {self.rate_per_s:g}/s, window {window}"
        if self.timing is Timing.RECORDED:
            return f"recorded x{self.speedup:g}, window {window}"
        if self.timing is Timing.DEPENDENCIES:
            dilation = f", time dilation {self.time_dilation:g}" if self.time_dilation != 1 else ""
            return f"dependencies, compute x{self.compute_scale:g}{dilation}, window {window}"
        return f"asap, window {window}"


def release_time_ns(
    pacing: Pacing, call: Call, *, call_number: int, step_begin_ns: int, run_begin_ns: int
) -> int | None:
    """Absolute time at which ``call`` may be issued, or None for "now".

    ``call_number`` counts the calls this worker issued since ``run_begin_ns``.
    Under ``dependencies`` the release depends on completions: the driver asks
    a ``DependencyTracker`` instead, and this returns None.
    """
    if pacing.timing is Timing.RECORDED:
        return step_begin_ns + round(call.offset_ns / pacing.speedup)
    if pacing.timing is Timing.RATE:
        return run_begin_ns + round(call_number * 1e9 / pacing.rate_per_s)
    return None


def may_issue(pacing: Pacing, call: Call, *, in_flight: int, in_flight_to_server: int) -> bool:
    """Whether the window lets ``call`` go with this many calls in flight."""
    if pacing.window is not None:
        return in_flight < pacing.window
    if pacing.timing in (Timing.RATE, Timing.DEPENDENCIES):
        return in_flight < OPEN_LOOP_MAX_IN_FLIGHT
    return in_flight_to_server <= call.outstanding_at_start


def next_step_begin_ns(
    pacing: Pacing, *, previous_begin_ns: int, previous_end_ns: int, recorded_period_ns: int
) -> int:
    """When the next step begins, given when the previous one began and ended."""
    if pacing.timing is Timing.RECORDED:
        return max(previous_begin_ns + round(recorded_period_ns / pacing.speedup), previous_end_ns)
    return previous_end_ns


def blocking_calls_suffice(pacing: Pacing) -> bool:
    """True when at most one call is ever in flight, so a driver may block on each."""
    return pacing.window == 1
