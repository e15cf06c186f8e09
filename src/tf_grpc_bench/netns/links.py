"""Link profiles: what an emulated link is, and the token bucket that shapes its rate.

Pure: no IO.  ``parse_profile`` is the one place a profile given on a command
line is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tf_grpc_bench.errors import NetworkError

_RATE = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[kmg]?)bit$")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_DURATION = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]*)?)(?P<unit>ns|us|ms|s)$")
_DURATION_UNITS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9}
_LOSS = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]*)?)%$")
#: The longest one-way delay a link may have.
MAX_DELAY_NS = 10 * 10**9
#: A profile string's parts after the base: ``BASE:delay=50us:jitter=10us:loss=0.1%``.
MODIFIERS = ("delay", "jitter", "loss")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkProfile:
    """A link to emulate: its rate (None: no limit), one-way delay, jitter and loss.

    ``delay_ns`` is added to every packet in each direction; each packet's delay
    is drawn uniformly from ``delay_ns +- jitter_ns`` (never below the previous
    packet's release: order is kept); ``loss`` is the probability, in [0, 1),
    that a packet is dropped on arrival.  ``note`` says where a named profile's
    figures come from.
    """

    name: str
    rate_bits_per_s: int | None
    delay_ns: int = 0
    jitter_ns: int = 0
    loss: float = 0.0
    note: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("profile name must not be empty")
        if self.rate_bits_per_s is not None and self.rate_bits_per_s <= 0:
            raise ValueError(f"profile {self.name}: rate must be > 0 bit/s")
        if not 0 <= self.delay_ns <= MAX_DELAY_NS:
            raise ValueError(f"profile {self.name}: delay must be in [0, 10 s]")
        if not 0 <= self.jitter_ns <= self.delay_ns:
            raise ValueError(
                f"profile {self.name}: jitter {format_duration(self.jitter_ns)} must be in "
                f"[0, the delay {format_duration(self.delay_ns)}]: a packet cannot leave "
                "before it arrived"
            )
        if not 0 <= self.loss < 1:
            raise ValueError(f"profile {self.name}: loss must be in [0%, 100%)")

    @property
    def limited(self) -> bool:
        return self.rate_bits_per_s is not None

    @property
    def rate_bytes_per_s(self) -> float | None:
        return None if self.rate_bits_per_s is None else self.rate_bits_per_s / 8

    @property
    def delayed(self) -> bool:
        """Whether packets wait in a relay (a delay or a jitter)."""
        return self.delay_ns > 0 or self.jitter_ns > 0

    @property
    def lossy(self) -> bool:
        return self.loss > 0

    @property
    def shaped(self) -> bool:
        """Whether the link is anything but a plain, unlimited one."""
        return self.limited or self.delayed or self.lossy

    def dilated(self, factor: float) -> LinkProfile:
        """The link ``factor`` times slower (time dilation): the rate divided by it, the
        delay and jitter multiplied by it; the loss and the name unchanged."""
        if factor <= 0:
            raise ValueError(f"dilation must be > 0, got {factor}")
        rate = self.rate_bits_per_s
        return replace(
            self,
            rate_bits_per_s=None if rate is None else max(1, round(rate / factor)),
            delay_ns=min(MAX_DELAY_NS, round(self.delay_ns * factor)),
            jitter_ns=min(MAX_DELAY_NS, round(self.jitter_ns * factor)),
        )

    def describe(self) -> str:
        """``10gbit, 50us +- 10us one way, 0.1% loss``."""
        parts = [
            "no rate limit"
            if self.rate_bits_per_s is None
            else format_tc_rate(self.rate_bits_per_s)
        ]
        if self.delayed:
            jitter = f" +- {format_duration(self.jitter_ns)}" if self.jitter_ns else ""
            parts.append(f"{format_duration(self.delay_ns)}{jitter} one way")
        if self.lossy:
            parts.append(f"{format_loss(self.loss)} loss")
        return ", ".join(parts)


def format_tc_rate(bits_per_s: int) -> str:
    """A rate as tc and the profiles write it (``parse_profile`` reads it back; for people,
    ``tf_grpc_bench.units.format_rate``): ``1000000000`` -> ``1gbit``, ``2500000000`` ->
    ``2.5gbit``, ``100000000`` -> ``100mbit``."""
    for factor, unit in ((10**9, "gbit"), (10**6, "mbit"), (10**3, "kbit")):
        if bits_per_s >= factor:
            return f"{bits_per_s / factor:g}{unit}"
    return f"{bits_per_s}bit"


def format_duration(ns: int) -> str:
    """``50000`` -> ``50us``, ``25000000`` -> ``25ms``, ``1500`` -> ``1.5us``: the largest
    unit that keeps the number at least 1, as ``parse_duration`` reads it back."""
    for factor, unit in ((10**9, "s"), (10**6, "ms"), (10**3, "us")):
        if ns >= factor:
            return f"{ns / factor:g}{unit}"
    return f"{ns}ns"


def format_loss(loss: float) -> str:
    """``0.001`` -> ``0.1%``."""
    return f"{loss * 100:g}%"


def parse_duration(text: str, *, what: str = "delay") -> int:
    """``50us``, ``1.5ms``, ``20ms``, ``1s``, ``800ns`` in nanoseconds; NetworkError naming
    ``what`` otherwise."""
    match = _DURATION.match(text.strip().lower())
    if not match:
        raise NetworkError(f"{what} {text!r}: expected a duration such as 50us, 1.5ms or 20ms")
    ns = round(float(match["number"]) * _DURATION_UNITS[match["unit"]])
    if ns > MAX_DELAY_NS:
        raise NetworkError(f"{what} {text}: at most {format_duration(MAX_DELAY_NS)}")
    return ns


def parse_loss(text: str, *, what: str = "loss") -> float:
    """``0.1%`` as 0.001; NetworkError naming ``what`` unless a percentage in [0%, 100%)."""
    match = _LOSS.match(text.strip())
    loss = float(match["number"]) / 100 if match else -1.0
    if not 0 <= loss < 1:
        raise NetworkError(f"{what} {text!r}: expected a percentage in [0%, 100%), such as 0.1%")
    return loss


def _timing_profile(
    name: str, rate_gbit: float, delay: str, jitter: str = "0ns", note: str = ""
) -> LinkProfile:
    return LinkProfile(
        name=name,
        rate_bits_per_s=round(rate_gbit * 10**9),
        delay_ns=parse_duration(delay),
        jitter_ns=parse_duration(jitter),
        note=note,
    )


#: The named profiles; docs/networks.md says where each figure comes from.  An
#: unshaped link between two namespaces on a 2-CPU machine carried 9-23 Gbit/s in
#: our runs, so rates of 25 Gbit/s and more do not bind there (bench/README.md).
PROFILES: Mapping[str, LinkProfile] = {
    p.name: p
    for p in (
        LinkProfile(name="1gbit", rate_bits_per_s=10**9),
        LinkProfile(name="10gbit", rate_bits_per_s=10 * 10**9),
        LinkProfile(name="25gbit", rate_bits_per_s=25 * 10**9),
        LinkProfile(name="40gbit", rate_bits_per_s=40 * 10**9),
        LinkProfile(name="unlimited", rate_bits_per_s=None),
        _timing_profile("10gbit-samerack", 10, "5us", note="NICs and one top-of-rack switch"),
        _timing_profile("25gbit-samerack", 25, "5us", note="NICs and one top-of-rack switch"),
        _timing_profile(
            "10gbit-crossrack", 10, "50us", "10us", note="through the spine, with its queues"
        ),
        _timing_profile("1gbit-wan", 1, "25ms", "500us", note="a cross-region WAN link"),
        _timing_profile("40gbit-ethernet", 40, "24us", note="the paper's 40G Ethernet (Cluster A)"),
        _timing_profile(
            "ipoib-edr", 100, "30us", note="the paper's IPoIB over EDR InfiniBand (Cluster A)"
        ),
    )
}


def _modifier(key: str, value: str) -> int | float:
    if key == "delay":
        return parse_duration(value, what="delay")
    if key == "jitter":
        return parse_duration(value, what="jitter")
    if key == "loss":
        return parse_loss(value)
    raise NetworkError(
        f"network profile modifier {key!r}: expected {', '.join(m + '=' for m in MODIFIERS)}"
    )


def _base_profile(base: str, text: str) -> LinkProfile:
    if base in PROFILES:
        return PROFILES[base]
    match = _RATE.match(base)
    if match:
        rate = round(float(match["number"]) * _UNITS[match["unit"]])
        if rate > 0:
            return LinkProfile(name=base, rate_bits_per_s=rate)
    raise NetworkError(
        f"unknown network profile {text!r}: expected one of {', '.join(PROFILES)}, "
        "or a rate such as 100mbit, optionally followed by :delay=50us:jitter=10us:loss=0.1%"
    )


def parse_profile(text: str) -> LinkProfile:
    """A named profile or a rate written like tc's (``100mbit``, ``2.5gbit``), each
    optionally followed by ``:delay=D``, ``:jitter=J`` and ``:loss=P%`` (these replace
    the named profile's own).  The profile's name is the text in its canonical form
    (``10gbit-crossrack:loss=0.1%``).  NetworkError names what is wrong.
    """
    base, *modifiers = [part.strip() for part in text.strip().lower().split(":")]
    profile = _base_profile(base, text)
    given: dict[str, int | float] = {}
    for modifier in modifiers:
        key, equals, value = modifier.partition("=")
        if not equals:
            raise NetworkError(f"network profile {text!r}: {modifier!r} is not KEY=VALUE")
        given[key] = _modifier(key, value)
    return with_timing(
        profile,
        delay_ns=None if "delay" not in given else int(given["delay"]),
        jitter_ns=None if "jitter" not in given else int(given["jitter"]),
        loss=given.get("loss"),
    )


def with_timing(
    profile: LinkProfile,
    *,
    delay_ns: int | None = None,
    jitter_ns: int | None = None,
    loss: float | None = None,
) -> LinkProfile:
    """``profile`` with the given delay, jitter or loss (None: its own), named canonically:
    the base profile's name, then the figures that differ from the base's
    (``1gbit:delay=1ms``).  NetworkError if the jitter exceeds the delay."""
    delay = profile.delay_ns if delay_ns is None else delay_ns
    jitter = profile.jitter_ns if jitter_ns is None else jitter_ns
    lost = profile.loss if loss is None else loss
    base_name = profile.name.split(":")[0]
    base = PROFILES.get(base_name, LinkProfile(name=base_name, rate_bits_per_s=None))
    suffix = [
        f"{key}={text}"
        for key, text, differs in (
            ("delay", format_duration(delay), delay != base.delay_ns),
            ("jitter", format_duration(jitter), jitter != base.jitter_ns),
            ("loss", format_loss(lost), lost != base.loss),
        )
        if differs
    ]
    try:
        return replace(
            profile,
            name=":".join([base_name, *suffix]),
            delay_ns=delay,
            jitter_ns=jitter,
            loss=lost,
        )
    except ValueError as error:
        raise NetworkError(str(error)) from None


def parse_profiles(text: str) -> tuple[LinkProfile, ...]:
    """Comma-separated profiles, e.g. ``1gbit,10gbit-crossrack,1gbit:delay=1ms``; no
    duplicates."""
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


#: Direct-action verdicts of a tc filter (linux/pkt_cls.h): let the packet through, drop it.
TC_ACT_OK = 0
TC_ACT_SHOT = 2
#: Classic BPF's ancillary loads (``BPF_LD|BPF_W|BPF_ABS`` at SKF_AD_OFF + n):
#: ``ld proto``, the packet's EtherType in host order (SKF_AD_PROTOCOL), and ``ld
#: rand``, a fresh random 32-bit number (SKF_AD_RANDOM).
_LOAD_PROTOCOL = (0x20, 0, 0, 0xFFFFF000)
_LOAD_RANDOM = (0x20, 0, 0, 0xFFFFF038)
#: ARP's EtherType (linux/if_ether.h ETH_P_ARP).
ETH_P_ARP = 0x0806


def loss_filter_bytecode(loss: float) -> str:
    """tc's ``bytecode`` argument for a classic-BPF direct-action filter that drops a
    packet with probability ``loss``: load a random 32-bit number, drop it when below
    ``loss * 2**32`` (``TC_ACT_SHOT``), else let it through (``TC_ACT_OK``).  Needs no
    compiler: classic BPF is written as numbers.

    ARP passes untouched: the loss is the link's, on what hosts send each other; a
    neighbour's lost ARP request or reply would instead stop all traffic to it for
    the kernel's retry time (1 s): at 10% loss, one first contact between two hosts in
    five would begin with that pause."""
    if not 0 < loss < 1:
        raise ValueError(f"loss must be in (0, 1), got {loss}")
    threshold = min(2**32 - 1, round(loss * 2**32))
    program = (
        _LOAD_PROTOCOL,
        (0x15, 3, 0, ETH_P_ARP),  # BPF_JMP|BPF_JEQ|BPF_K: ARP jumps to "keep"
        _LOAD_RANDOM,
        (0x35, 1, 0, threshold),  # BPF_JMP|BPF_JGE|BPF_K: >= threshold jumps to "keep"
        (0x06, 0, 0, TC_ACT_SHOT),  # BPF_RET|BPF_K
        (0x06, 0, 0, TC_ACT_OK),  # keep
    )
    return f"{len(program)}," + ",".join(f"{c} {jt} {jf} {k}" for c, jt, jf, k in program)
