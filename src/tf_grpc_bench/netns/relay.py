"""The link relay: delay and jitter on an emulated link, and what it reports.

This kernel has no ``netem`` (nor ``fq`` or ``etf``), so no qdisc can hold a
packet for a time.  A delayed link is instead two tap devices, one in each
namespace, and a relay process between them (``relay.c``, built on first use
by ``tf_grpc_bench.native``) that reads what one side sends and writes it to
the other when it is due: its delay, plus a jitter drawn uniformly from
``[-jitter, +jitter]``, never before the packet ahead of it (order is kept).
mahimahi's DelayShell works the same way.  One relay serves one link, both
directions; rate limits stay ``tbf`` qdiscs on the taps, loss a BPF filter
(``links.loss_filter_bytecode``).

The relay keeps its statistics in a file (``state.relay_stats_path``) that
any process may read while it runs: per direction the packets and bytes it
moved, the drops of its bounded queue, and a histogram of how late each
release was.  ``read_relay_stats`` is the one place that file is parsed;
``RelayStats.behind`` says when the relay did not hold the profile.  The
relay's own cost, measured when the network comes up (``calibration``), is
written into the same file (``set_compensation``): the relay releases each
packet that much earlier.

``start_relay`` starts one, tied to its parent's life
(``lifetime.die_with_parent_preexec``) unless the network is to outlive the
command (``network up``): then deleting its namespaces ends it.
"""

from __future__ import annotations

import mmap
import selectors
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.native import NativeSource, build
from tf_grpc_bench.netns.links import format_duration
from tf_grpc_bench.netns.topology import RelayPlan

RELAY = NativeSource(
    name="relay",
    source=Path(__file__).with_name("relay.c"),
    kind="executable",
    purpose="the link relay (profiles with a delay or jitter)",
    alternative="profiles without delay or jitter need none",
)
#: The relay spins (rather than sleeps) this long before each release (ns): a sleeping
#: process took 40-80 us to wake here (a virtual machine), a spin of 100 us put 99% of
#: releases within 4 us of their time.
SPIN_NS = 100_000
#: How long the relay keeps spinning after a packet before it sleeps (ns; relay.c's
#: --busy-poll-ns), so that a reply soon after (a ping-pong's, an acknowledgement) is
#: read at once instead of after a wake-up (tens of microseconds on this virtual
#: machine, more from an idle core).  The window is spun only while a core is free
#: (relay.c's core_free: runnable tasks, the relay included, no more than the cores):
#: a 200 us window spun regardless took a ping-pong's round trip from 54 us to 462 us
#: on the loaded 2-core machine, the real-time relay taking the core the echoing
#: process needed.  100 us: a quiet machine's veth round trip is about 11 us, so a
#: reply comes well inside it; an idle link's relay still sleeps.
BUSY_POLL_NS = 100_000
#: The relay's SCHED_FIFO priority: it is woken ahead of ordinary processes, which
#: keeps its releases on time on a busy machine; the kernel's real-time throttling
#: still leaves others 5% of each core.  0 runs it as an ordinary process.
PRIORITY = 1
#: How long a relay may take to make its devices and say it is ready.
START_TIMEOUT_S = 10.0

STATS_MAGIC = b"TFGBRLY1"
STATS_VERSION = 3
HISTOGRAM_BUCKETS = 688
_HEADER = struct.Struct("<8sIIQQQQQQQ6Q8x64s64s")
#: Where the tool writes the compensation (relay.c).
_COMPENSATION_OFFSET = 56
_DIRECTION = struct.Struct("<12Q")
_HISTOGRAM = struct.Struct(f"<{HISTOGRAM_BUCKETS}Q")
_DIRECTION_BYTES = _DIRECTION.size + _HISTOGRAM.size
#: The counters before each direction's histogram, in the file's order (relay.c).
_DIRECTION_FIELDS = (
    "delay_ns",
    "jitter_ns",
    "queue_capacity_bytes",
    "packets",
    "bytes",
    "queue_drops",
    "queue_drop_bytes",
    "write_errors",
    "late_sum_ns",
    "late_max_ns",
    "queue_peak_bytes",
    "queued_at_stop",
)
STATS_BYTES = _HEADER.size + 2 * _DIRECTION_BYTES
#: A release later than the larger of these is one the profile did not get.
BEHIND_MIN_NS = 20_000
BEHIND_SHARE = 0.05


def build_relay(cache: Path | None = None) -> Path:
    """The relay executable, built from ``relay.c`` if not cached yet (NetworkError if
    it cannot be)."""
    return build(RELAY, error=NetworkError, cache=cache)


def bucket_bounds(bucket: int) -> tuple[int, int]:
    """The lateness values (ns) histogram ``bucket`` counts, ``[lower, upper)``; the
    mirror of ``histogram_bucket`` in relay.c (exact below 32 ns, then 16 buckets per
    power of two)."""
    if not 0 <= bucket < HISTOGRAM_BUCKETS:
        raise ValueError(f"bucket {bucket} outside [0, {HISTOGRAM_BUCKETS})")
    if bucket < 32:
        return bucket, bucket + 1
    top, sub = 5 + (bucket - 32) // 16, (bucket - 32) % 16
    step = 1 << (top - 4)
    return (16 + sub) * step, (17 + sub) * step


def percentile_ns(histogram: tuple[int, ...], quantile: float) -> int:
    """The ``quantile`` (0-1) of a lateness histogram, as the upper bound of the bucket
    that holds it (within 6.25% above 32 ns); 0 for an empty histogram."""
    total = sum(histogram)
    if total == 0:
        return 0
    rank = max(1, quantile * total)
    seen = 0
    for bucket, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return bucket_bounds(bucket)[1] - 1
    return bucket_bounds(len(histogram) - 1)[1] - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DirectionStats:
    """One direction of a relay: what it moved and how late its releases were."""

    delay_ns: int
    jitter_ns: int
    queue_capacity_bytes: int
    packets: int
    bytes: int
    queue_drops: int
    queue_drop_bytes: int
    write_errors: int
    late_sum_ns: int
    late_max_ns: int
    queue_peak_bytes: int
    queued_at_stop: int
    histogram: tuple[int, ...]
    #: How much earlier than its delay each packet was released: the relay's own
    #: one-way cost, measured when the link was set up (netns/calibration.py).
    compensation_ns: int = 0
    #: Packets whose send the relay saw stamped by the sending kernel (relay.c's stamp
    #: socket): their delay counts from that send, not from when the relay read them.
    stamped: int = 0
    #: How long those waited for the relay to read them, in all and at most (ns): its
    #: wake-ups, which the send stamps keep out of the delay.
    read_wait_sum_ns: int = 0
    read_wait_max_ns: int = 0

    @property
    def late_mean_ns(self) -> int:
        return self.late_sum_ns // self.packets if self.packets else 0

    @property
    def read_wait_mean_ns(self) -> int:
        return self.read_wait_sum_ns // self.stamped if self.stamped else 0

    def late_percentile_ns(self, quantile: float) -> int:
        """The lateness ``quantile`` (its bucket's upper bound, never above the maximum)."""
        return min(percentile_ns(self.histogram, quantile), self.late_max_ns)

    @property
    def tolerance_ns(self) -> int:
        """How late a release may be and still hold the profile: 20 us or 5% of the
        delay, whichever is larger."""
        return max(BEHIND_MIN_NS, round(BEHIND_SHARE * self.delay_ns))

    @property
    def attainable(self) -> bool:
        """Whether the delay is at least the relay's own cost (else packets leave as
        they arrive and still take longer than the delay)."""
        return self.delay_ns == 0 or self.delay_ns >= self.compensation_ns

    def behind(self) -> str:
        """Why this direction did not hold its profile ("" if it did): a delay shorter
        than the relay's own cost, releases later than the tolerance at the 99th
        percentile, or a full queue."""
        reasons = []
        if not self.attainable:
            reasons.append(
                f"a delay of {format_duration(self.delay_ns)} is not attainable: the relay "
                f"itself takes {format_duration(self.compensation_ns)}"
            )
        p99 = self.late_percentile_ns(0.99)
        if self.packets and p99 > self.tolerance_ns:
            reasons.append(
                f"99% of releases within {p99 / 1000:.0f} us of their time, not "
                f"{self.tolerance_ns / 1000:.0f} us"
            )
        if self.queue_drops:
            reasons.append(f"{self.queue_drops} packets dropped by its full queue")
        return "; ".join(reasons)


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayStats:
    """A relay's statistics file, as read (``read_relay_stats``)."""

    pid: int
    started_ns: int
    #: Whether the relay has ended (and stopped counting).
    stopped: bool
    #: The relay's own one-way cost that each release is made earlier by (ns).
    compensation_ns: int
    #: The relay's own CPU time so far, user and system (ns; sampled every 10 ms while
    #: it moves packets, and when it stops).  It runs on the hosts' cores: training or a
    #: replay on the link shares them with it.
    cpu_ns: int
    #: "namespace path:interface" of side a and side b.
    sides: tuple[str, str]
    #: A to b, then b to a.
    directions: tuple[DirectionStats, DirectionStats]

    def behind(self) -> str:
        """Why the relay did not hold its profile, per direction ("" if it did)."""
        parts = []
        for (source, target), direction in zip(
            (self.sides, self.sides[::-1]), self.directions, strict=True
        ):
            reason = direction.behind()
            if reason:
                parts.append(f"{_interface(source)} -> {_interface(target)}: {reason}")
        return "; ".join(parts)


def _interface(side: str) -> str:
    """``/run/netns/tfgb-1-ab-h0:eth0`` -> ``tfgb-1-ab-h0:eth0``."""
    return side.rsplit("/", 1)[-1]


def _parse_stats(data: bytes, path: Path) -> tuple[int, RelayStats]:
    if len(data) < STATS_BYTES:
        raise NetworkError(f"{path}: too short for relay statistics ({len(data)} bytes)")
    magic, version, directions, pid, started, sequence, stopped, buckets, *rest = (
        _HEADER.unpack_from(data)
    )
    compensation, cpu, *reads, a, b = rest
    stamped, read_wait_sum, read_wait_max = reads[0:2], reads[2:4], reads[4:6]
    if magic != STATS_MAGIC:
        raise NetworkError(f"{path}: not a relay statistics file")
    if version != STATS_VERSION or directions != 2 or buckets != HISTOGRAM_BUCKETS:
        raise NetworkError(
            f"{path}: relay statistics version {version} with {buckets} buckets; this tool "
            f"reads version {STATS_VERSION} with {HISTOGRAM_BUCKETS}"
        )
    parsed = []
    for index in range(2):
        offset = _HEADER.size + index * _DIRECTION_BYTES
        fields = _DIRECTION.unpack_from(data, offset)
        histogram = _HISTOGRAM.unpack_from(data, offset + _DIRECTION.size)
        parsed.append(
            DirectionStats(
                **dict(zip(_DIRECTION_FIELDS, fields, strict=True)),
                histogram=histogram,
                compensation_ns=compensation,
                stamped=stamped[index],
                read_wait_sum_ns=read_wait_sum[index],
                read_wait_max_ns=read_wait_max[index],
            )
        )
    stats = RelayStats(
        pid=pid,
        started_ns=started,
        stopped=bool(stopped),
        compensation_ns=compensation,
        cpu_ns=cpu,
        sides=(a.rstrip(b"\0").decode(errors="replace"), b.rstrip(b"\0").decode(errors="replace")),
        directions=(parsed[0], parsed[1]),
    )
    return sequence, stats


def read_relay_stats(path: Path, *, attempts: int = 100) -> RelayStats:
    """A relay's statistics (NetworkError if unreadable).  A running relay updates the
    file in place; a read that saw an update under way is tried again."""
    for _ in range(attempts):
        try:
            data = path.read_bytes()
        except OSError as error:
            raise NetworkError(f"{path}: {error.strerror}") from None
        sequence, stats = _parse_stats(data, path)
        if sequence % 2 == 0:
            again = _HEADER.unpack_from(path.read_bytes())[5]
            if again == sequence:
                return stats
        time.sleep(0.001)
    raise NetworkError(f"{path}: the relay kept updating it; no consistent read")


def set_compensation(path: Path, compensation_ns: int) -> None:
    """Tell the running relay of ``path`` its own cost (ns): from now on it releases each
    packet that much earlier (NetworkError if the file cannot be written)."""
    if compensation_ns < 0:
        raise ValueError(f"compensation must be >= 0 ns, got {compensation_ns}")
    try:
        with path.open("r+b") as file, mmap.mmap(file.fileno(), STATS_BYTES) as shared:
            struct.pack_into("<Q", shared, _COMPENSATION_OFFSET, compensation_ns)
    except (OSError, ValueError) as error:
        raise NetworkError(f"{path}: cannot set the relay's compensation: {error}") from None


def start_relay(
    plan: RelayPlan,
    executable: Path,
    stats_path: Path,
    *,
    detached: bool = False,
    timeout_s: float = START_TIMEOUT_S,
) -> subprocess.Popen[bytes]:
    """Start the relay of ``plan`` and wait until it has made its devices (blocking).

    It starts without compensation (``set_compensation``).

    The relay dies with this process, unless ``detached`` (``network up``): then it
    lives until its namespaces are deleted.  NetworkError, with the relay's own
    message, if it does not start.
    """
    argv = plan.argv(
        str(executable), stats_path=str(stats_path), spin_ns=SPIN_NS, priority=PRIORITY
    )
    argv += ["--busy-poll-ns", str(BUSY_POLL_NS)]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if detached else subprocess.PIPE,
        start_new_session=True,
        preexec_fn=None if detached else lifetime.die_with_parent_preexec(),
    )
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        line = process.stdout.readline() if selector.select(timeout=timeout_s) else b""
    if line.startswith(b"ready"):
        process.stdout.close()
        return process
    process.kill()
    _, stderr = process.communicate()
    message = (stderr or b"").decode(errors="replace").strip().splitlines()
    detail = message[-1] if message else f"no answer within {timeout_s:g} s"
    raise NetworkError(f"relay of link {plan.link} did not start: {detail}")
