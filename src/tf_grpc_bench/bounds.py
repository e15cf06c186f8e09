"""The bounds every command's numbers share: one home for the checks of counts and seconds.

A count or a duration far past anything a run could use is a typo (or a
hostile input), refused with a message naming the flag before anything
starts.  ``replay``, ``serve``, ``role``, ``network compare``, ``capture`` and
``capture-job`` all check their flags with these.

Pure: no IO.
"""

from __future__ import annotations

import math

from tf_grpc_bench.errors import ConfigError

#: Most of anything counted (runs, steps, passes, buffers, batch size): beyond, a typo.
MAX_COUNT = 1_000_000
#: Longest warm-up, measured run or capture: a week.
MAX_RUN_S = 7 * 86_400.0
#: Longest call deadline or wait for servers: a day.
MAX_WAIT_S = 86_400.0
NS_PER_S = 1_000_000_000


def count_problem(value: int, *, minimum: int = 1, maximum: int = MAX_COUNT) -> str:
    """What is wrong with a count (``"must be in 1..N, got V"``), "" if nothing."""
    if minimum <= value <= maximum:
        return ""
    return f"must be in {minimum}..{maximum}, got {value}"


def check_count(
    flag: str, value: int | None, *, minimum: int = 1, maximum: int = MAX_COUNT
) -> None:
    """ConfigError unless ``value`` (None: not given) is in ``minimum..maximum``."""
    if value is None:
        return
    problem = count_problem(value, minimum=minimum, maximum=maximum)
    if problem:
        raise ConfigError(f"{flag} {problem}")


def seconds_problem(value: float, *, allow_zero: bool, maximum: float = MAX_WAIT_S) -> str:
    """What is wrong with seconds (finite, in [0 or >0, ``maximum``]), "" if nothing."""
    low = value >= 0 if allow_zero else value > 0
    if math.isfinite(value) and low and value <= maximum:
        return ""
    bound = "[0" if allow_zero else "(0"
    return f"must be in {bound}, {maximum:g}] seconds, got {value:g}"


def check_seconds(flag: str, value: float, *, allow_zero: bool, maximum: float = MAX_WAIT_S) -> int:
    """``value`` seconds as ns; ConfigError naming ``flag`` if it is out of bounds."""
    problem = seconds_problem(value, allow_zero=allow_zero, maximum=maximum)
    if problem:
        raise ConfigError(f"{flag} {problem}")
    return round(value * NS_PER_S)
