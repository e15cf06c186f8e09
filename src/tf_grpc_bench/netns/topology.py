"""The plan of an emulated network: hosts, addresses and the commands that build it.

Pure data and pure functions (``plan_network``): no command is run here, so a plan
can be read, printed and tested without root.
``emulated.EmulatedNetwork`` executes it.

Links are created directly inside their namespaces (``ip link add ... netns``),
never in the root namespace, so deleting a namespace removes its links and a
crash leaves nothing behind but namespaces.  The run id starts with the pid of
the process that made the network, so cleanup can tell live runs from crashed
ones.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import secrets
from dataclasses import dataclass

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns.links import (
    DEFAULT_TBF_LATENCY_US,
    FALLBACK_HZ,
    LinkProfile,
    TokenBucket,
    token_bucket_for,
)

#: Every namespace this tool makes starts with this; nothing else is touched.
PREFIX = "tfgb-"
#: Inside each host namespace the link to the others is called this.
HOST_INTERFACE = "eth0"
BRIDGE = "br0"
DEFAULT_SUBNET = "10.233.0.0/24"
#: Most emulated hosts one network has.
MAX_HOSTS = 200
#: Subnets a network may use: private, from a /8 (room for any host count) to a /30.
MIN_SUBNET_PREFIX = 8
MAX_SUBNET_PREFIX = 30

RUN_ID = re.compile(r"^(?P<pid>[0-9]+)-(?P<token>[0-9a-f]+)$")
NAMESPACE_NAME = re.compile(
    r"^" + re.escape(PREFIX) + r"(?P<run>[0-9]+-[0-9a-f]+)-(?P<role>[a-z0-9]+)$"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """One emulated host: a namespace with one interface and one address."""

    index: int
    namespace: str
    interface: str
    address: str
    prefix_length: int

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefix_length}"


def new_run_id() -> str:
    """``<pid>-<random hex>``: the pid lets cleanup tell live runs from crashed ones."""
    return f"{os.getpid()}-{secrets.token_hex(2)}"


def namespace_name(run_id: str, role: str) -> str:
    return f"{PREFIX}{run_id}-{role}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkPlan:
    """What an emulated network consists of, and the commands that build it.

    Pure data: ``plan_network`` computes it, ``EmulatedNetwork`` executes it.
    """

    run_id: str
    profile: LinkProfile
    hosts: tuple[Host, ...]
    #: The switch namespace for three or more hosts; "" for a point-to-point link.
    switch_namespace: str
    token_bucket: TokenBucket | None
    setup_commands: tuple[tuple[str, ...], ...]

    @property
    def namespaces(self) -> tuple[str, ...]:
        names = tuple(h.namespace for h in self.hosts)
        return (*names, self.switch_namespace) if self.switch_namespace else names


def _plan_hosts(hosts: int, run_id: str, subnet: str) -> tuple[Host, ...]:
    """The hosts' namespaces and addresses; NetworkError for a bad count, run id or subnet."""
    if hosts < 2:
        raise NetworkError(f"--hosts must be >= 2, got {hosts}")
    if not RUN_ID.match(run_id):
        raise NetworkError(f"run id {run_id!r}: expected <pid>-<hex>")
    try:
        network = ipaddress.IPv4Network(subnet)
    except ValueError as error:
        raise NetworkError(f"--subnet {subnet}: {error}") from None
    if not (network.is_private and MIN_SUBNET_PREFIX <= network.prefixlen <= MAX_SUBNET_PREFIX):
        raise NetworkError(
            f"--subnet {subnet}: expected a private IPv4 subnet (in 10/8, 172.16/12 or "
            f"192.168/16) of /{MIN_SUBNET_PREFIX} to /{MAX_SUBNET_PREFIX}, e.g. {DEFAULT_SUBNET}"
        )
    if hosts > MAX_HOSTS:
        raise NetworkError(f"--hosts {hosts}: at most {MAX_HOSTS} emulated hosts")
    usable = list(itertools.islice(network.hosts(), hosts))
    if hosts > len(usable):
        room = network.num_addresses - 2
        raise NetworkError(f"--subnet {subnet} has room for {room} hosts, not {hosts}")
    return tuple(
        Host(
            index=i,
            namespace=namespace_name(run_id, f"h{i}"),
            interface=HOST_INTERFACE,
            address=str(usable[i]),
            prefix_length=network.prefixlen,
        )
        for i in range(hosts)
    )


def _link_commands(
    host_list: tuple[Host, ...], switch: str
) -> tuple[list[tuple[str, ...]], list[tuple[str, str]]]:
    """Commands making the namespaces and their links (through a bridge in ``switch``, if
    any), and the (namespace, interface) pairs a rate limit goes on."""
    commands: list[tuple[str, ...]] = []
    for host in host_list:
        commands.append(("ip", "netns", "add", host.namespace))
    if switch:
        commands.append(("ip", "netns", "add", switch))
        commands.append(("ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge"))
        commands.append(("ip", "-n", switch, "link", "set", "lo", "up"))
        commands.append(("ip", "-n", switch, "link", "set", BRIDGE, "up"))
    shaped: list[tuple[str, str]] = []
    if switch:
        for host in host_list:
            port = f"p{host.index}"
            commands.append(_veth(host.namespace, host.interface, switch, port))
            commands.append(("ip", "-n", switch, "link", "set", port, "master", BRIDGE))
            commands.append(("ip", "-n", switch, "link", "set", port, "up"))
            shaped += [(host.namespace, host.interface), (switch, port)]
    else:
        a, b = host_list
        commands.append(_veth(a.namespace, a.interface, b.namespace, b.interface))
        shaped += [(a.namespace, a.interface), (b.namespace, b.interface)]
    return commands, shaped


def plan_network(
    *,
    hosts: int,
    profile: LinkProfile,
    run_id: str,
    subnet: str = DEFAULT_SUBNET,
    hz: int = FALLBACK_HZ,
    tbf_latency_us: int = DEFAULT_TBF_LATENCY_US,
) -> NetworkPlan:
    """The namespaces, addresses and ``ip``/``tc`` commands for ``hosts`` hosts."""
    host_list = _plan_hosts(hosts, run_id, subnet)
    bucket = (
        None
        if profile.rate_bits_per_s is None
        else token_bucket_for(profile.rate_bits_per_s, hz=hz, latency_us=tbf_latency_us)
    )
    switch = namespace_name(run_id, "sw") if hosts > 2 else ""
    commands, shaped = _link_commands(host_list, switch)
    for host in host_list:
        commands.append(("ip", "-n", host.namespace, "link", "set", "lo", "up"))
        commands.append(
            ("ip", "-n", host.namespace, "addr", "add", host.cidr, "dev", host.interface)
        )
        commands.append(("ip", "-n", host.namespace, "link", "set", host.interface, "up"))
    if bucket is not None:
        for namespace, interface in shaped:
            commands.append(
                (
                    "tc",
                    "-n",
                    namespace,
                    "qdisc",
                    "add",
                    "dev",
                    interface,
                    "root",
                    *bucket.tc_arguments(),
                )
            )
    return NetworkPlan(
        run_id=run_id,
        profile=profile,
        hosts=host_list,
        switch_namespace=switch,
        token_bucket=bucket,
        setup_commands=tuple(commands),
    )


def _veth(namespace_a: str, name_a: str, namespace_b: str, name_b: str) -> tuple[str, ...]:
    # Created straight inside both namespaces: never visible in the root one.
    return (
        "ip",
        "link",
        "add",
        name_a,
        "netns",
        namespace_a,
        "type",
        "veth",
        "peer",
        "name",
        name_b,
        "netns",
        namespace_b,
    )
