"""Does a delayed link hold its profile?  The relay's precision and throughput.

For each one-way delay (default: 50 us to 50 ms) this brings up two emulated
hosts joined by a relay with that delay (``tf_grpc_bench.netns``) and measures,
in the same run:

1. precision: the median round trip of 64-byte UDP pings, one at a time, over the
   delayed link, minus the same over an undelayed link (a veth pair, measured
   first and again last: the better of the two), against twice the delay; and
   minus the same over a relay with a 1 ns delay (what the delay adds, without the
   relay's own cost: a delay that short is below it, so it is not compensated;
   no specification is judged against it).  A round trip is the link's, as the
   two kernels saw it (receive timestamps; ``netns/calibration.py``): without the
   pinger's and the echo's wake-ups, which are the machine's; the pinger's own
   round trip, wake-ups and all, is shown beside it.  The link's specification:
   within max(20 us, 5%) of twice the delay, against veth.  With each, the relay's own
   one-way cost as measured when the link came up and taken off each release
   (``netns/calibration.py``), and its lateness (p50, p99, max over both
   directions), from its statistics;
2. throughput: one TCP connection over a 200 Mbit/s link with 10 ms each way
   (default; ``--throughput``), as a ratio to the rate (at least 0.8 asked), next
   to the same link without delay.

Then it rewrites the "Link relay" section of ``bench/README.md`` with the
command, the machine and the figures (``--no-readme``: print only).  Needs root.
Timing figures need a quiet machine: run it when nothing else runs.

Run from the repository root::

    .venv/bin/python bench/link_relay.py                           # about 2 minutes
    .venv/bin/python bench/link_relay.py --delays 1ms --pings 100 --no-readme
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

from common import README, command_line, load_average, machine_line, table_head, write_section

from tf_grpc_bench.netns import emulated, links, namespaces
from tf_grpc_bench.netns.calibration import stamping_script, udp_echo_script
from tf_grpc_bench.netns.relay import RelayStats

SECTION = "## Link relay"
PORT = 9000

ECHO = udp_echo_script(PORT)
# Prints the median round trips (ns): the link's (from the kernels' receive timestamps,
# as netns/calibration.py measures them) and the pinger's own.
PING = stamping_script(
    """
    import json, socket, struct, sys, time
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, STAMPING, 1)
    s.connect((sys.argv[1], PORT))
    s.settimeout(5)
    STAMP_NS
    rtts, link = [], []
    for _ in range(int(sys.argv[2])):
        start, sent = time.perf_counter_ns(), time.time_ns()
        s.send(b"x" * 64)
        data, ancillary, _, _ = s.recvmsg(2048, 64)
        rtts.append(time.perf_counter_ns() - start)
        echo_received, echo_sent = struct.unpack_from("qq", data)
        link.append(echo_received - sent + stamp_ns(ancillary) - echo_sent)
        time.sleep(0.0005)
    print(json.dumps([sorted(link)[len(link) // 2], sorted(rtts)[len(rtts) // 2]]))
    """
).replace("PORT", str(PORT))
SINK = textwrap.dedent(
    """
    import json, socket, time
    server = socket.create_server(("0.0.0.0", PORT))
    print("ready", flush=True)
    connection, _ = server.accept()
    total, first = 0, None
    while chunk := connection.recv(1 << 20):
        first = first or time.perf_counter_ns()
        total += len(chunk)
    print(json.dumps({"bytes": total, "ns": time.perf_counter_ns() - first}), flush=True)
    """
).replace("PORT", str(PORT))
SOURCE = textwrap.dedent(
    """
    import socket, sys
    block, remaining = b"x" * (1 << 16), int(sys.argv[2])
    with socket.create_connection((sys.argv[1], PORT), timeout=60) as s:
        while remaining > 0:
            s.sendall(block[: min(remaining, len(block))])
            remaining -= len(block)
    """
).replace("PORT", str(PORT))


def _serve(network: emulated.EmulatedNetwork, script: str) -> subprocess.Popen[str]:
    server = network.spawn(0, [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        raise RuntimeError("the server in host 0 did not start")
    return server


def median_round_trip(
    profile: links.LinkProfile, pings: int
) -> tuple[tuple[float, float], RelayStats | None]:
    """Median UDP round trips (ns) over a fresh link of ``profile``, the link's and the
    pinger's own, and its relay's stats."""
    with emulated.EmulatedNetwork(hosts=2, profile=profile) as network:
        _serve(network, ECHO)
        pinged = network.run(
            1, [sys.executable, "-c", PING, network.hosts[0].address, str(pings)], timeout_s=600
        )
        if pinged.returncode != 0:
            raise RuntimeError(f"ping failed: {pinged.stderr.strip()[-300:]}")
    stats = next(iter(network.relay_stats.values()), None)
    link, pinger = json.loads(pinged.stdout)
    return (float(link), float(pinger)), stats


def throughput_bits_per_s(profile: links.LinkProfile, total_bytes: int) -> float:
    with emulated.EmulatedNetwork(hosts=2, profile=profile) as network:
        sink = _serve(network, SINK)
        sent = network.run(
            1,
            [sys.executable, "-c", SOURCE, network.hosts[0].address, str(total_bytes)],
            timeout_s=600,
        )
        if sent.returncode != 0:
            raise RuntimeError(f"sender failed: {sent.stderr.strip()[-300:]}")
        assert sink.stdout is not None
        report = json.loads(sink.stdout.readline())
    return float(report["bytes"] * 8 / (report["ns"] / 1e9))


@dataclass
class Precision:
    delay_ns: int
    round_trip_ns: float
    added_over_veth_ns: float
    added_over_relay_ns: float
    #: The pinger's own round trip, wake-ups and all, and what it added over veth's.
    pinger_round_trip_ns: float
    pinger_added_ns: float
    compensation_ns: int
    late_p50_ns: int
    late_p99_ns: int
    late_max_ns: int
    read_wait_mean_ns: int


def measure_precision(
    delays: list[int], pings: int
) -> tuple[tuple[float, float], float, list[Precision]]:
    unlimited = links.PROFILES["unlimited"]
    veth_first, _ = median_round_trip(unlimited, pings)
    (relay_base, _), _ = median_round_trip(links.with_timing(unlimited, delay_ns=1), pings)
    rows = []
    for delay in delays:
        print(f"delay {links.format_duration(delay)}", flush=True)
        (rtt, pinger), stats = median_round_trip(
            links.with_timing(unlimited, delay_ns=delay), pings
        )
        assert stats is not None
        directions = stats.directions
        rows.append(
            Precision(
                delay_ns=delay,
                round_trip_ns=rtt,
                added_over_veth_ns=rtt,
                added_over_relay_ns=rtt - relay_base,
                pinger_round_trip_ns=pinger,
                pinger_added_ns=pinger,
                compensation_ns=stats.compensation_ns,
                late_p50_ns=max(d.late_percentile_ns(0.5) for d in directions),
                late_p99_ns=max(d.late_percentile_ns(0.99) for d in directions),
                late_max_ns=max(d.late_max_ns for d in directions),
                read_wait_mean_ns=max(d.read_wait_mean_ns for d in directions),
            )
        )
    veth_last, _ = median_round_trip(unlimited, pings)
    veth = min(veth_first[0], veth_last[0]), min(veth_first[1], veth_last[1])
    for row in rows:
        row.added_over_veth_ns = row.round_trip_ns - veth[0]
        row.pinger_added_ns = row.pinger_round_trip_ns - veth[1]
    return veth, relay_base, rows


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f}"


def _held(added_ns: float, delay_ns: int) -> str:
    expected = 2 * delay_ns
    error = added_ns - expected
    limit = max(20_000, 0.05 * expected)
    return f"{error / 1000:+.1f} us ({'yes' if abs(error) <= limit else 'no'})"


def render(
    command: str,
    machine: str,
    pings: int,
    veth_ns: tuple[float, float],
    relay_ns: float,
    rows: list[Precision],
    throughput: list[tuple[str, float, float]],
) -> str:
    lines = [
        SECTION,
        "",
        "(written by `bench/link_relay.py`)",
        "",
        f"Command: `{command}`, run as root. {machine} Precision: median round trip of "
        f"{pings} UDP pings of 64 bytes, one at a time, over two emulated hosts, as the two "
        "kernels saw it (from the send to the far kernel's receive timestamp, both ways: "
        "without the pinger's and the echo's wake-ups, which are the machine's); the round "
        f"trip a delay adds is measured against a veth link ({_us(veth_ns[0])} us here, the "
        f"better of before and after) and against a relay with a 1 ns delay "
        f"({_us(relay_ns)} us: the relay's own cost, which a delay that short cannot have "
        "taken off). The specification: within max(20 us, 5%) of twice the delay, against "
        "veth. Pinger's: what the delay added to the pinger's own round trip, wake-ups and "
        f"all (veth: {_us(veth_ns[1])} us). Own cost: the relay's one-way cost measured when "
        "the link came up and taken off each release. Lateness: how late the relay's "
        "releases were (the worse of the two directions). Read wait: how long after its "
        "send the relay read a packet, on average (the worse direction): its wake-up, which "
        "a delay counted from the send stamp leaves out.",
        "",
        *table_head(
            "one-way delay",
            "round trip us",
            "added over veth us",
            "error, held?",
            "pinger's added us",
            "added over 1 ns relay us",
            "own cost us",
            "lateness p50 us",
            "p99 us",
            "max us",
            "read wait us",
        ),
    ]
    for row in rows:
        lines.append(
            f"| {links.format_duration(row.delay_ns)} | {_us(row.round_trip_ns)} "
            f"| {_us(row.added_over_veth_ns)} | {_held(row.added_over_veth_ns, row.delay_ns)} "
            f"| {_us(row.pinger_added_ns)} | {_us(row.added_over_relay_ns)} "
            f"| {_us(row.compensation_ns)} "
            f"| {_us(row.late_p50_ns)} | {_us(row.late_p99_ns)} | {_us(row.late_max_ns)} "
            f"| {_us(row.read_wait_mean_ns)} |"
        )
    lines += [
        "",
        "Throughput: one TCP connection, bytes over the time from the first to the last, against "
        "the same rate without delay.",
        "",
        *table_head("profile", "Mbit/s", "/ rate", "without delay Mbit/s"),
    ]
    for name, rate, undelayed in throughput:
        profile = links.parse_profile(name)
        assert profile.rate_bits_per_s is not None
        lines.append(
            f"| {name} | {rate / 1e6:.0f} | {rate / profile.rate_bits_per_s:.2f} "
            f"| {undelayed / 1e6:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", default="50us,100us,200us,500us,1ms,5ms,10ms,50ms")
    parser.add_argument("--pings", type=int, default=400, help="pings per link (default 400)")
    parser.add_argument(
        "--throughput",
        default="200mbit:delay=10ms",
        help="comma-separated profiles for the throughput rows (default 200mbit:delay=10ms)",
    )
    parser.add_argument("--megabytes", type=int, default=60, help="bytes sent per throughput row")
    parser.add_argument("--no-readme", action="store_true", help="print only, do not touch README")
    args = parser.parse_args()
    delays = [links.parse_duration(d) for d in args.delays.split(",") if d.strip()]
    namespaces.require_root()
    load_before = load_average()
    veth, relay_base, rows = measure_precision(delays, args.pings)
    throughput = []
    for profile in links.parse_profiles(args.throughput):
        print(f"throughput {profile.name}", flush=True)
        plain = links.with_timing(profile, delay_ns=0, jitter_ns=0, loss=0.0)
        throughput.append(
            (
                profile.name,
                throughput_bits_per_s(profile, args.megabytes << 20),
                throughput_bits_per_s(plain, args.megabytes << 20),
            )
        )
    command = command_line(__file__, sys.argv[1:], python="python")
    machine = machine_line(load_before, load_average())
    text = render(command, machine, args.pings, veth, relay_base, rows, throughput)
    print(text)
    if not args.no_readme:
        write_section(README, SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
