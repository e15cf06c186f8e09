"""The link relay's release schedule and queue, on a fake clock (no root, no devices).

``relay simulate`` runs the relay's own schedule and queue code (``relay.c``,
built as the tool builds it) on arrivals and clock ticks given on its standard
input, so these tests check the C the relay runs, not a copy of it.  Loss is a
kernel filter, not the relay's: its binomial test is in test_relay.py.
"""

from __future__ import annotations

import random
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.native import find_compiler
from tf_grpc_bench.netns import relay

pytestmark = pytest.mark.skipif(
    find_compiler() is None, reason="no C compiler: the relay is built from source on first use"
)


@dataclass(frozen=True)
class Release:
    direction: int
    sequence: int
    arrival_ns: int
    due_ns: int
    released_ns: int
    size: int


@dataclass(frozen=True)
class Outcome:
    releases: list[Release]
    drops: list[tuple[int, int]]  # (direction, sequence)
    stats: relay.RelayStats


def simulate(
    tmp_path: Path,
    events: list[str],
    *,
    ab: tuple[int, int] = (0, 0),
    ba: tuple[int, int] = (0, 0),
    seed: int = 0,
    queue_bytes: int = 64 << 20,
    compensation_ns: int = 0,
) -> Outcome:
    stats_path = tmp_path / "simulated.relay"
    completed = subprocess.run(
        [
            str(relay.build_relay()),
            "simulate",
            "--ab",
            f"{ab[0]}:{ab[1]}",
            "--ba",
            f"{ba[0]}:{ba[1]}",
            "--seed",
            str(seed),
            "--queue-bytes",
            str(queue_bytes),
            "--compensation-ns",
            str(compensation_ns),
            "--stats",
            str(stats_path),
        ],
        input="\n".join(events) + "\n",
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    releases, drops = [], []
    for line in completed.stdout.splitlines():
        kind, *fields = line.split()
        if kind == "R":
            releases.append(Release(*map(int, fields)))
        else:
            assert kind == "D", line
            drops.append((int(fields[0]), int(fields[1])))
    return Outcome(releases=releases, drops=drops, stats=relay.read_relay_stats(stats_path))


def test_a_packet_leaves_exactly_its_delay_after_it_arrived(tmp_path: Path) -> None:
    arrivals = [0, 7, 1_000, 250_000, 250_001, 3_000_000]
    delay = 1_000_000
    # Tick exactly at every release time: nothing is late.
    timeline = sorted(
        [(t, "P", f"P {t} 0 100") for t in arrivals]
        + [(t + delay, "T", f"T {t + delay}") for t in arrivals]
    )
    events = [event for _, _, event in timeline]
    outcome = simulate(tmp_path, events, ab=(delay, 0))
    assert [(r.arrival_ns, r.due_ns, r.released_ns) for r in outcome.releases] == [
        (t, t + delay, t + delay) for t in arrivals
    ]
    forward, backward = outcome.stats.directions
    assert forward.packets == len(arrivals) and forward.bytes == 100 * len(arrivals)
    assert forward.late_max_ns == 0 and forward.histogram[0] == len(arrivals)
    assert backward.packets == 0 and forward.delay_ns == delay and backward.delay_ns == 0
    assert outcome.stats.stopped and outcome.stats.behind() == ""


def test_each_direction_has_its_own_delay(tmp_path: Path) -> None:
    events = ["P 0 0 64", "P 0 1 64", "T 10000", "T 50000"]
    outcome = simulate(tmp_path, events, ab=(50_000, 0), ba=(10_000, 0))
    assert [(r.direction, r.released_ns) for r in outcome.releases] == [(1, 10_000), (0, 50_000)]


def test_a_late_tick_is_counted_as_lateness_in_the_histogram(tmp_path: Path) -> None:
    """The clock reaches each release ``late`` ns after it was due; the stats file's
    histogram (read by relay.py's mirror of the C bucket function) holds each value in
    the bucket whose bounds contain it."""
    lateness = [0, 1, 31, 32, 33, 100, 999, 1_000, 20_000, 65_535, 65_536, 1_000_000, 7 * 10**9]
    events, clock = [], 0
    for late in lateness:
        events += [f"P {clock} 0 64", f"T {clock + 1_000 + late}"]
        clock += 1_000 + late + 1
    outcome = simulate(tmp_path, events, ab=(1_000, 0))
    assert [r.released_ns - r.due_ns for r in outcome.releases] == lateness
    histogram = outcome.stats.directions[0].histogram
    expected = [0] * relay.HISTOGRAM_BUCKETS
    for late in lateness:
        (bucket,) = [
            b for b in range(relay.HISTOGRAM_BUCKETS) if relay.bucket_bounds(b)[0] <= late
            and late < relay.bucket_bounds(b)[1]
        ]  # fmt: skip
        expected[bucket] += 1
    assert list(histogram) == expected
    forward = outcome.stats.directions[0]
    assert forward.late_max_ns == max(lateness) and forward.late_sum_ns == sum(lateness)
    assert forward.late_percentile_ns(1.0) >= max(lateness)
    assert "99% of releases within" in outcome.stats.behind()


def test_the_bucket_bounds_tile_the_line_and_stay_within_a_sixteenth(tmp_path: Path) -> None:
    previous_upper = 0
    for bucket in range(relay.HISTOGRAM_BUCKETS):
        lower, upper = relay.bucket_bounds(bucket)
        assert lower == previous_upper and upper > lower
        assert bucket < 32 or (upper - lower) * 16 <= lower
        previous_upper = upper


def test_jitter_draws_uniformly_around_the_delay_and_never_reorders(tmp_path: Path) -> None:
    delay, jitter = 1_000_000, 200_000
    # Spaced wider than the jitter's span: the order constraint never binds, so each
    # packet's delay is its own draw.
    spaced = [f"P {i * 1_000_000} 0 100" for i in range(4000)]
    outcome = simulate(tmp_path, spaced, ab=(delay, jitter), seed=7)
    offsets = [r.due_ns - r.arrival_ns - delay for r in outcome.releases]
    assert len(offsets) == 4000
    assert min(offsets) >= -jitter and max(offsets) <= jitter
    assert min(offsets) < -0.95 * jitter and max(offsets) > 0.95 * jitter
    # Uniform on [-j, j]: mean 0 with standard error j / sqrt(3 n); quartiles at +-j/2.
    assert abs(statistics.fmean(offsets)) < 4 * jitter / (3 * 4000) ** 0.5
    quartiles = statistics.quantiles(offsets, n=4)
    assert quartiles[0] == pytest.approx(-jitter / 2, abs=0.06 * jitter)
    assert quartiles[2] == pytest.approx(jitter / 2, abs=0.06 * jitter)
    # Back to back (10 us apart, much less than the jitter): never reordered, never
    # earlier than the delay minus the jitter, each no later than its own draw or
    # the packet ahead of it.
    dense = simulate(
        tmp_path, [f"P {i * 10_000} 0 100" for i in range(4000)], ab=(delay, jitter), seed=7
    )
    sequences = [r.sequence for r in dense.releases]
    assert sequences == sorted(sequences) == list(range(4000))
    dues = [r.due_ns for r in dense.releases]
    assert dues == sorted(dues)
    assert all(r.due_ns - r.arrival_ns >= delay - jitter for r in dense.releases)
    assert all(r.due_ns - r.arrival_ns <= delay + jitter for r in dense.releases)


def test_the_same_seed_draws_the_same_jitter(tmp_path: Path) -> None:
    events = [f"P {i * 1_000_000} 0 100" for i in range(50)]
    first = simulate(tmp_path, events, ab=(500_000, 100_000), seed=3).releases
    again = simulate(tmp_path, events, ab=(500_000, 100_000), seed=3).releases
    other = simulate(tmp_path, events, ab=(500_000, 100_000), seed=4).releases
    assert first == again and first != other


def test_a_full_queue_drops_what_does_not_fit_and_takes_packets_again_once_released(
    tmp_path: Path,
) -> None:
    """Each queued packet takes a 16-byte header and its bytes padded to 16: a
    minimum-size queue (two largest packets) holds exactly this many 1000-byte ones."""
    entry = 16 + 1008
    capacity = 2 * (16 + 65536 + 1024)
    fits = capacity // entry
    events = [f"P {i} 0 1000" for i in range(fits + 10)]
    events += ["T 2000000", "P 2000001 0 1000"]
    outcome = simulate(tmp_path, events, ab=(1_000_000, 0), queue_bytes=1)
    assert [seq for _, seq in outcome.drops] == list(range(fits, fits + 10))
    assert [r.sequence for r in outcome.releases] == [*range(fits), fits + 10]
    forward = outcome.stats.directions[0]
    assert forward.queue_capacity_bytes == capacity
    assert forward.queue_drops == 10 and forward.queue_drop_bytes == 10_000
    assert forward.queue_peak_bytes == fits * entry <= capacity
    assert "dropped by its full queue" in outcome.stats.behind()


def test_the_ring_keeps_every_packet_whole_and_in_order_across_wraps(tmp_path: Path) -> None:
    """Random sizes and arrival bursts through a small queue: every packet is either
    released, with its size, in arrival order, or dropped; none is lost or duplicated."""
    generator = random.Random(11)
    events, clock, sizes = [], 0, []
    for _ in range(6000):
        clock += generator.choice([0, 0, 1_000, 50_000])
        size = generator.choice([16, 64, 1500, generator.randint(16, 66_560)])
        sizes.append(size)
        events.append(f"P {clock} {generator.randint(0, 1)} {size}")
    outcome = simulate(tmp_path, events, ab=(300_000, 0), ba=(100_000, 0), queue_bytes=400_000)
    for direction in (0, 1):
        released = [r for r in outcome.releases if r.direction == direction]
        dropped = [seq for d, seq in outcome.drops if d == direction]
        arrived = sum(1 for e in events if e.split()[2] == str(direction))
        assert sorted([r.sequence for r in released] + dropped) == list(range(arrived))
        assert [r.sequence for r in released] == sorted(r.sequence for r in released)
    by_arrival = [int(e.split()[3]) for e in events]
    assert sizes == by_arrival
    for direction in (0, 1):
        wanted = [int(e.split()[3]) for e in events if e.split()[2] == str(direction)]
        got = {r.sequence: r.size for r in outcome.releases if r.direction == direction}
        assert all(wanted[seq] == size for seq, size in got.items())
    assert outcome.drops, "the queue was meant to overflow"
    assert all(d.queue_peak_bytes <= d.queue_capacity_bytes for d in outcome.stats.directions)


def test_a_damaged_stats_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.relay"
    path.write_bytes(b"TFGBRLY1" + b"\0" * 10)
    with pytest.raises(NetworkError, match="too short"):
        relay.read_relay_stats(path)
    path.write_bytes(b"NOTRELAY" + b"\0" * relay.STATS_BYTES)
    with pytest.raises(NetworkError, match="not a relay statistics file"):
        relay.read_relay_stats(path)
    with pytest.raises(NetworkError, match="No such file"):
        relay.read_relay_stats(tmp_path / "missing.relay")


def _ticked(arrivals: list[int], releases_at: list[int]) -> list[str]:
    timeline = sorted(
        [(t, 0, f"P {t} 0 100") for t in arrivals] + [(t, 1, f"T {t}") for t in releases_at]
    )
    return [event for _, _, event in timeline]


def test_a_compensated_packet_leaves_its_delay_less_the_relays_own_cost(tmp_path: Path) -> None:
    arrivals, delay, cost = [0, 5_000, 900_000], 200_000, 37_000
    events = _ticked(arrivals, [t + delay - cost for t in arrivals])
    outcome = simulate(tmp_path, events, ab=(delay, 0), compensation_ns=cost)
    assert [(r.arrival_ns, r.due_ns, r.released_ns) for r in outcome.releases] == [
        (t, t + delay - cost, t + delay - cost) for t in arrivals
    ]
    assert outcome.releases == sorted(outcome.releases, key=lambda r: r.due_ns)
    assert outcome.stats.compensation_ns == cost
    forward = outcome.stats.directions[0]
    assert forward.compensation_ns == cost and forward.attainable and not forward.behind()
    assert forward.late_max_ns == 0


def test_a_delay_shorter_than_the_relays_cost_leaves_at_once_and_is_not_attainable(
    tmp_path: Path,
) -> None:
    arrivals, delay, cost = [10, 20, 30_000], 30_000, 92_000
    outcome = simulate(tmp_path, _ticked(arrivals, arrivals), ab=(delay, 0), compensation_ns=cost)
    assert [(r.due_ns, r.released_ns) for r in outcome.releases] == [(t, t) for t in arrivals]
    forward = outcome.stats.directions[0]
    assert not forward.attainable
    assert "30us is not attainable: the relay itself takes 92us" in forward.behind()
    # The other direction has no delay: nothing to attain.
    assert outcome.stats.directions[1].attainable


def test_compensated_jitter_keeps_order_and_stays_within_its_span(tmp_path: Path) -> None:
    rng = random.Random(7)
    delay, jitter, cost = 1_000_000, 400_000, 150_000
    # Dense arrivals (order is kept by holding packets back), then sparse ones (each
    # packet's own draw shows).
    dense = sorted(rng.randrange(0, 50_000_000) for _ in range(1_000))
    sparse = [100_000_000 + i * 5_000_000 for i in range(1_000)]
    events = [f"P {t} 0 100" for t in dense + sparse]
    outcome = simulate(tmp_path, events, ab=(delay, jitter), compensation_ns=cost)
    dues = [r.due_ns for r in outcome.releases]
    assert dues == sorted(dues) and len(dues) == 2_000
    assert [r.sequence for r in outcome.releases] == list(range(2_000))
    offsets = [r.due_ns - r.arrival_ns for r in outcome.releases]
    assert min(offsets) >= delay - jitter - cost
    own = offsets[1_000:]
    assert max(own) <= delay + jitter - cost
    assert abs(statistics.median(own) - (delay - cost)) < jitter / 5
