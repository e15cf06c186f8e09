"""Rates and sizes as people read them, in one place for every report and dashboard.

``format_rate`` writes a link rate as the results, the dashboards and ``inspect``
show it (``1 Gbit/s``); a rate as ``tc`` and the link profiles write it
(``1gbit``) is ``netns.links.format_tc_rate``.  ``format_bytes`` writes a size in
powers of 1000, as the paper's tables do; ``format_seconds`` a duration in a
table.  Pure.
"""

from __future__ import annotations


def format_rate(bits_per_s: int) -> str:
    """``1000000000`` -> ``1 Gbit/s``; 0 -> ``unlimited``."""
    if bits_per_s <= 0:
        return "unlimited"
    for factor, unit in ((10**9, "Gbit/s"), (10**6, "Mbit/s"), (10**3, "kbit/s")):
        if bits_per_s >= factor:
            return f"{bits_per_s / factor:g} {unit}"
    return f"{bits_per_s} bit/s"


def format_bytes(count: float) -> str:
    """Human-readable bytes in powers of 1000 (MB as the paper's tables use)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def format_seconds(value: float | None, *, digits: int = 2) -> str:
    """A duration in seconds for a table: ``1.234`` -> ``1.23 s``; None -> ``-``."""
    return "-" if value is None else f"{value:.{digits}f} s"
