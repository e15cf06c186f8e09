"""What a replay can read about the network it runs over.

Given the targets a client connects to, find the local interface each one is
reached through (the kernel's choice of source address), and read what the
kernel says of it: MTU and link speed from ``/sys/class/net/<if>``, any ``tbf``
rate limit on it (``tc -j qdisc show``), and the network namespace the process
runs in; inside an emulated host, also its link's delay, jitter and loss and
what its relays did so far (``netns.state``, ``netns.relay``).  The result is
the ``NetworkInfo`` every result document carries.

Reads are from the calling process's own view: a client started inside an
emulated host's namespace (``ip netns exec``) describes that host's link.  Note
that a veth reports a nominal speed of 10000 Mbit/s whatever its rate limit:
the ``tbf`` rate is what bounds it, and is recorded separately.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import shutil
import socket
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tf_grpc_bench.cluster import split_address
from tf_grpc_bench.errors import ConfigError, NetworkError
from tf_grpc_bench.netns.links import format_duration, format_loss, format_tc_rate
from tf_grpc_bench.netns.relay import RelayStats, bucket_bounds, read_relay_stats
from tf_grpc_bench.netns.state import read_record
from tf_grpc_bench.netns.topology import PREFIX
from tf_grpc_bench.replay.output.machine import (
    InterfaceInfo,
    NetworkInfo,
    RelayDirection,
    describe_interface,
)

#: ioctl(2) request that reads an interface's IPv4 address (linux/sockios.h).
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True, slots=True, kw_only=True)
class Shaping:
    """A rate limit found on an interface (only ``tbf`` is recognised)."""

    interface: str
    rate_bits_per_s: int
    burst_bytes: int

    def describe(self) -> str:
        rate = format_tc_rate(self.rate_bits_per_s)
        return f"tbf rate {rate} burst {self.burst_bytes}B on {self.interface}"


def local_address_for(host: str, port: int) -> str:
    """The source address the kernel picks to reach ``host:port`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as error:
        raise ConfigError(f"--target {host}:{port}: cannot resolve ({error.strerror})") from None
    family, kind, _, _, address = infos[0]
    with socket.socket(family, kind) as probe:
        try:
            # connect() on UDP only routes: it fixes the source address.
            probe.connect(address)
        except OSError as error:
            raise ConfigError(f"--target {host}:{port}: no route ({error.strerror})") from None
        local: str = probe.getsockname()[0]
    return local.split("%")[0]


def _ipv4_of(interface: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", interface.encode()[:15])
        try:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def _ipv6_interfaces(proc_if_inet6: Path) -> dict[str, str]:
    """IPv6 address -> interface, from /proc/net/if_inet6."""
    found: dict[str, str] = {}
    try:
        lines = proc_if_inet6.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) >= 6:
            packed = bytes.fromhex(fields[0])
            found[str(ipaddress.IPv6Address(packed))] = fields[5]
    return found


def interface_with_address(
    address: str, *, proc_if_inet6: Path = Path("/proc/net/if_inet6")
) -> str | None:
    """The local interface holding ``address`` in this namespace, or None."""
    parsed = ipaddress.ip_address(address)
    if parsed.version == 6:
        mapped = parsed.ipv4_mapped
        if mapped is None:
            return _ipv6_interfaces(proc_if_inet6).get(str(parsed))
        parsed = mapped
    if parsed.is_loopback:
        return "lo"
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == str(parsed):
            return name
    return None


def local_addresses(*, proc_if_inet6: Path = Path("/proc/net/if_inet6")) -> tuple[str, ...]:
    """Every address of this namespace's interfaces (IPv4, then IPv6), plus the host name.

    What a server's TLS certificate must name so that clients can reach it by
    any of them.
    """
    found: list[str] = [socket.gethostname()]
    for _, name in socket.if_nameindex():
        address = _ipv4_of(name)
        if address and address not in found:
            found.append(address)
    found += [a for a in _ipv6_interfaces(proc_if_inet6) if a not in found]
    return tuple(found)


def read_shaping(interface: str) -> Shaping | None:
    """The ``tbf`` root qdisc on ``interface``, if any (None also without ``tc``)."""
    if shutil.which("tc") is None:
        return None
    completed = subprocess.run(
        ["tc", "-j", "qdisc", "show", "dev", interface],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if completed.returncode != 0:
        return None
    try:
        qdiscs = json.loads(completed.stdout or "[]")
    except json.JSONDecodeError:
        return None
    for qdisc in qdiscs:
        if qdisc.get("kind") == "tbf" and qdisc.get("root"):
            options = qdisc.get("options", {})
            # tc's JSON gives the rate in bytes per second.
            return Shaping(
                interface=interface,
                rate_bits_per_s=int(options.get("rate", 0)) * 8,
                burst_bytes=int(options.get("burst", 0)),
            )
    return None


def current_namespace() -> str:
    """The name of the network namespace this process is in ("" if unnamed or unknown)."""
    if shutil.which("ip") is None:
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        completed = subprocess.run(
            ["ip", "netns", "identify"], capture_output=True, text=True, timeout=10, check=False
        )
        if completed.returncode == 0:
            return completed.stdout.strip().split("\n")[0]
    return ""


def relay_directions(link: str, stats: RelayStats) -> tuple[RelayDirection, ...]:
    """``stats`` (a relay's statistics file, as read) as the result document records it."""
    directions = []
    for (source, target), direction in zip(
        (stats.sides, stats.sides[::-1]), stats.directions, strict=True
    ):
        directions.append(
            RelayDirection(
                link=link,
                direction=f"{source.rsplit('/', 1)[-1]} -> {target.rsplit('/', 1)[-1]}",
                delay_ns=direction.delay_ns,
                jitter_ns=direction.jitter_ns,
                packets=direction.packets,
                bytes=direction.bytes,
                queue_drops=direction.queue_drops,
                write_errors=direction.write_errors,
                late_p50_ns=direction.late_percentile_ns(0.5),
                late_p99_ns=direction.late_percentile_ns(0.99),
                late_max_ns=direction.late_max_ns,
                late_mean_ns=direction.late_mean_ns,
                late_histogram=tuple(
                    (bucket_bounds(bucket)[0], count)
                    for bucket, count in enumerate(direction.histogram)
                    if count
                ),
                behind=direction.behind(),
            )
        )
    return tuple(directions)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkEmulation:
    """What an emulated host's record and relays say of its link ("" / 0 / () if none)."""

    delay_ns: int = 0
    jitter_ns: int = 0
    loss: float = 0.0
    relays: tuple[RelayDirection, ...] = ()
    #: What to add to the network's ``emulation`` description.
    description: str = ""


def read_link_emulation(namespace: str) -> LinkEmulation:
    """The delay, jitter, loss and relay statistics of emulated host ``namespace``'s link
    (``netns.state``), now; nothing for a namespace that is not an emulated host.  A
    record or statistics file that cannot be read is said in the description."""
    if not namespace.startswith(PREFIX):
        return LinkEmulation()
    try:
        record = read_record(namespace)
    except NetworkError as error:
        return LinkEmulation(description=str(error))
    if record is None:
        return LinkEmulation()
    profile = record.profile
    relays: list[RelayDirection] = []
    notes = []
    for path in record.relay_stats:
        link = path.name.removesuffix(".relay").split("-", 3)[-1]
        try:
            relays += relay_directions(link, read_relay_stats(path))
        except NetworkError as error:
            notes.append(str(error))
    parts = []
    if profile.delayed:
        jitter = f" +- {format_duration(profile.jitter_ns)}" if profile.jitter_ns else ""
        parts.append(f"relay {format_duration(profile.delay_ns)}{jitter} one way")
    if profile.lossy:
        parts.append(f"{format_loss(profile.loss)} loss at each receiver")
    return LinkEmulation(
        delay_ns=profile.delay_ns,
        jitter_ns=profile.jitter_ns,
        loss=profile.loss,
        relays=tuple(relays),
        description="; ".join([*parts, *notes]),
    )


def describe_network(targets: Sequence[str], *, name: str = "") -> NetworkInfo:
    """The NetworkInfo of a client reaching ``targets`` (``host:port`` each).

    ``name`` is the user's name for the network (``--network-name``); without
    one it is ``loopback`` when every target is reached over ``lo``, else the
    interface names joined with any tbf rate (``eth0-tbf-1gbit``).  Blocking:
    runs ``tc`` and ``ip`` once each per interface.
    """
    namespace = current_namespace()
    interfaces: list[InterfaceInfo] = []
    shapings: list[Shaping] = []
    for target in targets:
        host, port = split_address(target, where=f"--target {target}")
        interface = interface_with_address(local_address_for(host, port))
        if interface is None or any(i.name == interface for i in interfaces):
            continue
        interfaces.append(describe_interface(interface, namespace=namespace))
        shaping = read_shaping(interface)
        if shaping is not None:
            shapings.append(shaping)
    rate = min((s.rate_bits_per_s for s in shapings), default=0)
    link = read_link_emulation(namespace)
    if not name:
        if interfaces and all(i.name == "lo" for i in interfaces):
            name = "loopback"
        else:
            name = "-".join(i.name for i in interfaces) or "network"
            if rate:
                name += f"-tbf-{format_tc_rate(rate)}"
            if link.delay_ns:
                name += f"-delay-{format_duration(link.delay_ns)}"
    return NetworkInfo(
        name=name,
        addresses=tuple(targets),
        interfaces=tuple(interfaces),
        emulated_rate_bits_per_s=rate,
        emulation="; ".join([*(s.describe() for s in shapings), *filter(None, [link.description])]),
        emulated_delay_ns=link.delay_ns,
        emulated_jitter_ns=link.jitter_ns,
        emulated_loss=link.loss,
        relays=link.relays,
    )


def undilated(network: NetworkInfo, time_dilation: float) -> NetworkInfo:
    """``network`` as the link a replay ``time_dilation`` times slower predicts: its rate
    times the dilation, its delay and jitter divided by it (the link actually shaped
    stays in ``emulation``, and the relays' figures are the dilated link's)."""
    rate, delay = network.emulated_rate_bits_per_s, network.emulated_delay_ns
    if time_dilation == 1 or not (rate or delay or network.emulated_jitter_ns):
        return network
    predicted = round(rate * time_dilation)
    delay = round(delay / time_dilation)
    said = [format_tc_rate(predicted)] if predicted else []
    if delay:
        said.append(f"{format_duration(delay)} one way")
    return replace(
        network,
        emulated_rate_bits_per_s=predicted,
        emulated_delay_ns=delay,
        emulated_jitter_ns=round(network.emulated_jitter_ns / time_dilation),
        emulation=f"{network.emulation}; time dilation {time_dilation:g}: replays a "
        f"{', '.join(said)} link",
    )
