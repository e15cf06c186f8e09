"""The relay's own cost, measured when a delayed network is set up, and taken off.

A packet through a relay takes longer than its delay: the relay copies it and
writes it into the receiving stack (its delay counts from its send, the sending
kernel's stamp, so the relay's wake-up to read it is not part of it; a packet
without a stamp adds that too). On this machine (a 2-core virtual machine)
that was 0.5-3.3 us each way, varying from one relay to the next (3.3-62 us
when delays counted from the read). So before a network is handed
over, ``calibrate`` measures it, on the links as the profile made them: UDP
pings, one at a time, between hosts 0 and 1 through the relays and,
alternately, over a veth pair made for the purpose between the same two
namespaces; half of what the relays' median round trip takes beyond the veth
pair's and twice the delay is their own one-way cost. Each relay then releases
every packet that much earlier than its delay says, never before the packet
arrived (``release_offset_ns``, the mirror of relay.c's ``due_time``). Between
more than two hosts a packet crosses two relays, one of them delayed: the cost
of both comes off the delayed one. A delay shorter than that cost cannot be
had; it is reported (``unattainable``, ``DirectionStats.attainable``). Under
time dilation the delay is already the dilated one; the cost is real time and
is taken off it as is.

A round trip here is the link's, as the two kernels saw it: from the ping's
send to the echo's kernel receiving it (its receive timestamp,
``SO_TIMESTAMPNS``), plus from the echo's send to the pinger's kernel receiving
the answer.  It leaves out how long the echo and the pinger took to wake up
for a packet that had arrived: that is the machine's, not the relay's, and it
depends on how long they had been idle (2 ms on a 1 ms link, tens of
microseconds on the veth pair), which on this virtual machine moves a
process's round trip by tens of microseconds from one run to the next, more
when the machine is quiet.  Counted as the relay's cost, it would be taken
off every packet, though a real link of that delay leaves its hosts idle as
long.

The arithmetic here is pure; ``calibrate`` runs processes in the network.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns.links import LinkProfile, format_duration
from tf_grpc_bench.netns.topology import Host

#: Pings of each kind (relay, veth), at most: fewer on a long delay, so that the
#: relay's pings take about CALIBRATION_BUDGET_NS, but never fewer than MIN_PINGS.
CALIBRATION_PINGS = 200
MIN_PINGS = 20
CALIBRATION_BUDGET_NS = 1_000_000_000
#: The echo's UDP port: the namespaces are new, nothing else listens in them.
CALIBRATION_PORT = 47_001
#: The temporary veth pair between hosts 0 and 1 (link-local addresses: the
#: network's subnet is a private one, so they cannot clash).
VETH = ("tfgbcal0", "tfgbcal1")
VETH_ADDRESSES = ("169.254.77.1", "169.254.77.2")
#: How long the pings may take in all (s), beyond their delays.
CALIBRATION_TIMEOUT_S = 60.0
#: A ping not answered within this (s), beyond four times the delay and jitter, was
#: lost (a lossy link): it is not counted.
LOST_AFTER_S = 0.02


#: ``SO_TIMESTAMPNS`` (asm-generic/socket.h; Python's socket module does not name it):
#: each datagram read comes with the time (CLOCK_REALTIME) its host's kernel received it.
SO_TIMESTAMPNS = 35
#: Python source of ``stamp_ns(ancillary, required=True)`` for the scripts that time a
#: link: the time (ns, CLOCK_REALTIME) the kernel received what a ``recvmsg`` read on a
#: socket with SO_TIMESTAMPNS; without a timestamp an exit naming it, or 0 if not
#: ``required``.  ``stamping_script`` puts it in.
_STAMP_NS = """
def stamp_ns(ancillary, required=True):
    stamp = b"".join(d for level, kind, d in ancillary if kind == STAMPING)[:16]
    if not stamp:
        if required:
            sys.exit("no kernel receive timestamps (SO_TIMESTAMPNS)")
        return 0
    seconds, nanoseconds = struct.unpack("qq", stamp)
    return seconds * 1_000_000_000 + nanoseconds
"""


def stamping_script(source: str) -> str:
    """``source``, a Python program indented as in a module, dedented, with ``stamp_ns``
    defined where a line says ``STAMP_NS`` and ``STAMPING`` made SO_TIMESTAMPNS' number
    (the program imports ``struct`` and ``sys``)."""
    program = textwrap.dedent(source).replace("STAMP_NS\n", _STAMP_NS.lstrip("\n"))
    return program.replace("STAMPING", str(SO_TIMESTAMPNS))


def udp_echo_script(port: int) -> str:
    """A Python program that answers every UDP datagram on ``port`` after printing
    ``ready``: the far end of a ping over an emulated link.  The answer is the datagram
    with its first 16 bytes replaced by two int64 (ns, CLOCK_REALTIME): the time its
    kernel received it and the time the answer was sent (0 and the time if the kernel
    gave no timestamp); a ping is longer than that."""
    return stamping_script(
        """
        import socket, struct, sys, time
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, STAMPING, 1)
        s.bind(("0.0.0.0", PORT))
        print("ready", flush=True)
        STAMP_NS
        while True:
            data, ancillary, _, peer = s.recvmsg(2048, 64)
            received = stamp_ns(ancillary, required=False)
            s.sendto(struct.pack("qq", received, time.time_ns()) + data[16:], peer)
        """
    ).replace("PORT", str(port))


ECHO = udp_echo_script(CALIBRATION_PORT)
PING = stamping_script(
    """
    import json, socket, struct, sys, time
    relay, veth, count, wait = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    def socket_to(address):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, STAMPING, 1)
        s.connect((address, PORT))
        s.settimeout(wait)
        return s
    STAMP_NS
    pairs = [socket_to(relay), socket_to(veth)]
    rtts = [[], []]
    for i in range(2 * count + 4):
        s, payload = pairs[i % 2], str(i).encode().rjust(64, b"x")
        sent = time.time_ns()
        s.send(payload)
        try:
            while True:  # a late answer to a lost ping's neighbour is passed over
                data, ancillary, _, _ = s.recvmsg(2048, 64)
                if data[16:] == payload[16:]:
                    break
        except TimeoutError:  # lost on a lossy link: not a round trip
            continue
        echo_received, echo_sent = struct.unpack_from("qq", data)
        if i >= 4 and echo_received:
            rtts[i % 2].append((echo_received - sent) + (stamp_ns(ancillary) - echo_sent))
        time.sleep(0.0002)
    if min(len(r) for r in rtts) < count // 2:
        sys.exit(f"only {len(rtts[0])} of {count} pings through the relays answered")
    print(json.dumps([sorted(r)[len(r) // 2] for r in rtts]))
    """
).replace("PORT", str(CALIBRATION_PORT))


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """What ``calibrate`` measured: median round trips (ns) over the relays with the
    profile's one-way ``delay_ns`` (not yet compensated) and over a veth pair, as the
    kernels saw them (the module's docstring)."""

    delay_ns: int
    relay_round_trip_ns: int
    veth_round_trip_ns: int
    pings: int

    @property
    def compensation_ns(self) -> int:
        return compensation_ns(self.relay_round_trip_ns, self.veth_round_trip_ns, self.delay_ns)


def compensation_ns(relay_round_trip_ns: int, veth_round_trip_ns: int, delay_ns: int) -> int:
    """The relays' own one-way cost: half of what a round trip through them, with a
    one-way delay of ``delay_ns``, takes beyond one over a veth pair and twice the
    delay; 0 if they added nothing."""
    return max(0, round((relay_round_trip_ns - veth_round_trip_ns - 2 * delay_ns) / 2))


def calibration_pings(delay_ns: int) -> int:
    """How many pings of each kind: CALIBRATION_PINGS, fewer on a long delay (each relay
    ping takes twice the delay), never fewer than MIN_PINGS."""
    fitting = CALIBRATION_BUDGET_NS // max(1, 2 * delay_ns)
    return max(MIN_PINGS, min(CALIBRATION_PINGS, fitting))


def release_offset_ns(delay_ns: int, jitter_draw_ns: int, compensation: int) -> int:
    """How long after its arrival a packet leaves (before the order is kept): its delay
    plus its jitter draw (in [-jitter, +jitter]) less the compensation, at least 0."""
    return max(0, delay_ns + jitter_draw_ns - compensation)


def unattainable(delay_ns: int, compensation: int) -> str:
    """Why a one-way ``delay_ns`` cannot be had over relays of this own cost ("" if it can)."""
    if delay_ns == 0 or delay_ns >= compensation:
        return ""
    return (
        f"a one-way delay of {format_duration(delay_ns)} is not attainable: the relay "
        f"itself takes {format_duration(compensation)}; packets leave as they arrive"
    )


class Network(Protocol):
    """What ``calibrate`` needs of an emulated network (``EmulatedNetwork``)."""

    @property
    def hosts(self) -> tuple[Host, ...]: ...

    @property
    def profile(self) -> LinkProfile: ...

    def command(self, host: Host | int, argv: Sequence[str]) -> list[str]: ...


def calibrate(network: Network, runner: Callable[[Sequence[str]], object]) -> Calibration:
    """Measure the relays' own cost between hosts 0 and 1 (blocking, about a second or,
    on a long delay, MIN_PINGS round trips).

    The relays must not be compensating yet.  A veth pair joins the two hosts for the
    measurement and is removed after it; NetworkError if the pings fail.
    """
    first, second = network.hosts[0], network.hosts[1]
    runner(("ip", "-n", first.namespace, "link", "add", VETH[0], "type", "veth",
            "peer", "name", VETH[1], "netns", second.namespace))  # fmt: skip
    try:
        for host, name, address in zip((first, second), VETH, VETH_ADDRESSES, strict=True):
            runner(("ip", "-n", host.namespace, "addr", "add", f"{address}/30", "dev", name))
            runner(("ip", "-n", host.namespace, "link", "set", name, "up"))
        return _ping(network, first.address, network.profile.delay_ns)
    finally:
        runner(("ip", "-n", first.namespace, "link", "del", VETH[0]))


def _ping(network: Network, relay_address: str, delay_ns: int) -> Calibration:
    pings = calibration_pings(delay_ns)
    echo = subprocess.Popen(
        network.command(0, [sys.executable, "-c", ECHO]),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        preexec_fn=lifetime.die_with_parent_preexec(),
    )
    try:
        assert echo.stdout is not None
        if echo.stdout.readline().strip() != "ready":
            raise NetworkError("calibrating the relays: the echo in host 0 did not start")
        wait_s = LOST_AFTER_S + 4 * (delay_ns + network.profile.jitter_ns) / 1e9
        argv = [sys.executable, "-c", PING, relay_address, VETH_ADDRESSES[0], str(pings)]
        pinged = subprocess.run(
            network.command(1, [*argv, str(wait_s)]),
            capture_output=True,
            text=True,
            timeout=CALIBRATION_TIMEOUT_S + 2 * wait_s * pings,
            check=False,
            preexec_fn=lifetime.die_with_parent_preexec(),
        )
    except subprocess.TimeoutExpired:
        raise NetworkError(
            f"calibrating the relays: no answer within {CALIBRATION_TIMEOUT_S:g} s"
        ) from None
    finally:
        echo.kill()
        echo.wait()
    if pinged.returncode != 0:
        detail = (pinged.stderr.strip().splitlines() or ["no output"])[-1]
        raise NetworkError(f"calibrating the relays: the pings failed: {detail}")
    relay, veth = json.loads(pinged.stdout)
    return Calibration(
        delay_ns=delay_ns,
        relay_round_trip_ns=int(relay),
        veth_round_trip_ns=int(veth),
        pings=pings,
    )
