"""Link profiles: what an emulated link is, and the token bucket that shapes its rate.

Pure: no IO.  ``parse_profile`` is the one place a profile given on a command
line is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tf_grpc_bench.errors import NetworkError

_RATE = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[kmg]?)bit$")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkProfile:
    """A link speed to emulate.  ``rate_bits_per_s`` is None for no limit."""

    name: str
    rate_bits_per_s: int | None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("profile name must not be empty")
        if self.rate_bits_per_s is not None and self.rate_bits_per_s <= 0:
            raise ValueError(f"profile {self.name}: rate must be > 0 bit/s")

    @property
    def limited(self) -> bool:
        return self.rate_bits_per_s is not None

    @property
    def rate_bytes_per_s(self) -> float | None:
        return None if self.rate_bits_per_s is None else self.rate_bits_per_s / 8


#: The named profiles.  Note: an unshaped veth pair on a 2-CPU machine carried
#: 9-23 Gbit/s in our runs, so 25gbit and 40gbit do not bind there (measured;
#: see docs/networks.md and bench/README.md).
PROFILES: Mapping[str, LinkProfile] = {
    p.name: p
    for p in (
        LinkProfile(name="1gbit", rate_bits_per_s=10**9),
        LinkProfile(name="10gbit", rate_bits_per_s=10 * 10**9),
        LinkProfile(name="25gbit", rate_bits_per_s=25 * 10**9),
        LinkProfile(name="40gbit", rate_bits_per_s=40 * 10**9),
        LinkProfile(name="unlimited", rate_bits_per_s=None),
    )
}


def parse_profile(text: str) -> LinkProfile:
    """A named profile, or a rate written like tc's (``100mbit``, ``2.5gbit``).

    Raises NetworkError listing the named profiles when ``text`` is neither.
    """
    name = text.strip().lower()
    if name in PROFILES:
        return PROFILES[name]
    match = _RATE.match(name)
    if match:
        rate = round(float(match["number"]) * _UNITS[match["unit"]])
        if rate > 0:
            return LinkProfile(name=name, rate_bits_per_s=rate)
    raise NetworkError(
        f"unknown network profile {text!r}: expected one of {', '.join(PROFILES)} "
        "or a rate such as 100mbit"
    )


def parse_profiles(text: str) -> tuple[LinkProfile, ...]:
    """Comma-separated profiles, e.g. ``1gbit,10gbit,unlimited``; no duplicates."""
    profiles = tuple(parse_profile(part) for part in text.split(",") if part.strip())
    if not profiles:
        raise NetworkError("no network profile given: expected e.g. 1gbit,10gbit,unlimited")
    names = [p.name for p in profiles]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise NetworkError(f"network profile listed twice: {', '.join(duplicates)}")
    return profiles


#: tbf's queue bound, as the time a packet may wait (tc's ``latency``).
DEFAULT_TBF_LATENCY_US = 20_000
#: A veth sends TSO/GSO packets of up to 64 KiB.  A bucket smaller than one such
#: packet makes tbf split it in software; two of them keeps that off the path.
MIN_BURST_BYTES = 2 * 65_536
#: Used when the kernel's HZ cannot be read; the smallest common HZ gives the
#: largest (safest) bucket.
FALLBACK_HZ = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenBucket:
    """The ``tbf`` settings that emulate one rate."""

    rate_bits_per_s: int
    burst_bytes: int
    latency_us: int

    def __post_init__(self) -> None:
        if self.rate_bits_per_s <= 0 or self.burst_bytes <= 0 or self.latency_us <= 0:
            raise ValueError("tbf rate, burst and latency must all be > 0")

    def tc_arguments(self) -> list[str]:
        """The ``tbf ...`` part of a ``tc qdisc add`` command (sizes in bytes)."""
        return [
            "tbf",
            "rate",
            f"{self.rate_bits_per_s}bit",
            "burst",
            str(self.burst_bytes),
            "latency",
            f"{self.latency_us}us",
        ]


def token_bucket_for(
    rate_bits_per_s: int, *, hz: int, latency_us: int = DEFAULT_TBF_LATENCY_US
) -> TokenBucket:
    """tbf settings for a rate: the bucket holds one timer tick's worth of bytes.

    tc-tbf(8) asks for a burst of at least rate/HZ so that the rate can be
    reached when tokens are refilled once per tick; the bucket is never smaller
    than two 64 KiB GSO packets (``MIN_BURST_BYTES``).  At 1 Gbit/s and HZ 250
    that is 500 kB, at 10 Gbit/s 5 MB: a few ms of traffic, negligible over a
    measured run of seconds.
    """
    if hz <= 0:
        raise ValueError(f"hz must be > 0, got {hz}")
    per_tick_bytes = math.ceil(rate_bits_per_s / 8 / hz)
    return TokenBucket(
        rate_bits_per_s=rate_bits_per_s,
        burst_bytes=max(per_tick_bytes, MIN_BURST_BYTES),
        latency_us=latency_us,
    )
