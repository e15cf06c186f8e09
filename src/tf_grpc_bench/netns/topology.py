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
    loss_filter_bytecode,
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


#: One command line (argv) of a plan.
Command = tuple[str, ...]
#: Where ``ip netns add`` binds a named namespace (what ``setns`` opens).
NAMED_NAMESPACES_DIR = "/run/netns"


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayPlan:
    """One relay (``relay.c``): a link's two tap devices, made by the relay itself
    in their namespaces, and each direction's delay and jitter in nanoseconds."""

    #: The link's name within its network: ``h0-h1``, ``h2-sw``.
    link: str
    #: (namespace, interface) of each end.
    side_a: tuple[str, str]
    side_b: tuple[str, str]
    #: (delay_ns, jitter_ns) from a to b, and from b to a.
    a_to_b: tuple[int, int]
    b_to_a: tuple[int, int]
    #: Each direction's queue bound (bytes); what does not fit is dropped.
    queue_bytes: int
    #: Whether 64 KiB offload packets cross whole (off on a lossy link: loss is per
    #: wire-sized packet).
    offload: bool = True
    #: Seeds the jitter's random numbers (the same plan gives the same draws).
    seed: int = 0

    def argv(
        self,
        executable: str,
        *,
        stats_path: str,
        spin_ns: int,
        priority: int,
        namespaces_dir: str = NAMED_NAMESPACES_DIR,
    ) -> list[str]:
        """The relay's command line."""
        a_namespace, a_interface = self.side_a
        b_namespace, b_interface = self.side_b
        return [
            executable,
            "run",
            "--a",
            f"{namespaces_dir}/{a_namespace}:{a_interface}",
            "--b",
            f"{namespaces_dir}/{b_namespace}:{b_interface}",
            "--ab",
            f"{self.a_to_b[0]}:{self.a_to_b[1]}",
            "--ba",
            f"{self.b_to_a[0]}:{self.b_to_a[1]}",
            "--queue-bytes",
            str(self.queue_bytes),
            "--seed",
            str(self.seed),
            "--spin-ns",
            str(spin_ns),
            "--priority",
            str(priority),
            "--stats",
            stats_path,
            *([] if self.offload else ["--no-offload"]),
        ]


#: A step of a plan: a command, or a relay to start (which makes its link's devices).
Step = Command | RelayPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkPlan:
    """What an emulated network consists of, and the steps that build it.

    Pure data: ``plan_network`` computes it, ``EmulatedNetwork`` executes it.
    """

    run_id: str
    profile: LinkProfile
    hosts: tuple[Host, ...]
    #: The switch namespace for three or more hosts; "" for a point-to-point link.
    switch_namespace: str
    token_bucket: TokenBucket | None
    #: In order: commands, and the relays of a delayed link (started where they
    #: stand: the commands after them configure the devices they make).
    steps: tuple[Step, ...]

    @property
    def namespaces(self) -> tuple[str, ...]:
        names = tuple(h.namespace for h in self.hosts)
        return (*names, self.switch_namespace) if self.switch_namespace else names

    @property
    def setup_commands(self) -> tuple[Command, ...]:
        """The plan's commands, in order, without its relays."""
        return tuple(step for step in self.steps if not isinstance(step, RelayPlan))

    @property
    def relays(self) -> tuple[RelayPlan, ...]:
        return tuple(step for step in self.steps if isinstance(step, RelayPlan))


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


#: The rate a relay's queue is sized for on a link without a rate limit: about
#: the most an unshaped link between two namespaces carried here.
UNLIMITED_QUEUE_RATE_BITS_PER_S = 25 * 10**9
#: A relay queue's bounds (bytes): room for a few 64 KiB packets at least, and
#: never more than this however long the link.
MIN_RELAY_QUEUE_BYTES = 8 << 20
MAX_RELAY_QUEUE_BYTES = 1 << 30


def relay_queue_bytes(profile: LinkProfile) -> int:
    """A relay direction's queue bound: twice what the link holds in flight (its rate
    times its longest delay), within [MIN_RELAY_QUEUE_BYTES, MAX_RELAY_QUEUE_BYTES]."""
    rate = profile.rate_bits_per_s or UNLIMITED_QUEUE_RATE_BITS_PER_S
    in_flight = rate / 8 * (profile.delay_ns + profile.jitter_ns) / 1e9
    return int(min(MAX_RELAY_QUEUE_BYTES, max(MIN_RELAY_QUEUE_BYTES, 2 * in_flight)))


def _namespace_commands(host_list: tuple[Host, ...], switch: str) -> list[Step]:
    steps: list[Step] = [("ip", "netns", "add", host.namespace) for host in host_list]
    if switch:
        steps.append(("ip", "netns", "add", switch))
        steps.append(("ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge"))
        steps.append(("ip", "-n", switch, "link", "set", "lo", "up"))
        steps.append(("ip", "-n", switch, "link", "set", BRIDGE, "up"))
    return steps


def _link_steps(
    host_list: tuple[Host, ...], switch: str, profile: LinkProfile
) -> tuple[list[Step], list[tuple[str, str]], list[tuple[str, str]]]:
    """Steps making the namespaces and their links (through a bridge in ``switch``, if
    any): veth pairs, or relays for a delayed link; the (namespace, interface) ends a
    rate limit goes on, and the ends a lossy link drops arriving packets at (one per
    path between two hosts)."""
    steps = _namespace_commands(host_list, switch)
    timing = (profile.delay_ns, profile.jitter_ns)
    queue = relay_queue_bytes(profile)
    ends: list[tuple[str, str]] = []
    if switch:
        for host in host_list:
            port = f"p{host.index}"
            if profile.delayed:
                # Delayed host -> switch only, so a packet between two hosts waits once.
                steps.append(
                    RelayPlan(
                        link=f"h{host.index}-sw",
                        side_a=(host.namespace, host.interface),
                        side_b=(switch, port),
                        a_to_b=timing,
                        b_to_a=(0, 0),
                        queue_bytes=queue,
                        offload=not profile.lossy,
                        seed=host.index,
                    )
                )
            else:
                steps.append(_veth(host.namespace, host.interface, switch, port))
            steps.append(("ip", "-n", switch, "link", "set", port, "master", BRIDGE))
            steps.append(("ip", "-n", switch, "link", "set", port, "up"))
            ends += [(host.namespace, host.interface), (switch, port)]
        return steps, ends, [(switch, f"p{host.index}") for host in host_list]
    a, b = host_list
    if profile.delayed:
        steps.append(
            RelayPlan(
                link="h0-h1",
                side_a=(a.namespace, a.interface),
                side_b=(b.namespace, b.interface),
                a_to_b=timing,
                b_to_a=timing,
                queue_bytes=queue,
                offload=not profile.lossy,
            )
        )
    else:
        steps.append(_veth(a.namespace, a.interface, b.namespace, b.interface))
    ends += [(a.namespace, a.interface), (b.namespace, b.interface)]
    return steps, ends, list(ends)


def _loss_commands(
    loss: float, ends: list[tuple[str, str]], receivers: list[tuple[str, str]]
) -> list[Step]:
    """A lossy link: every end sends one wire-sized packet per skb (``gso_max_segs 1``,
    so that a drop is one packet's, not a 64 KiB offload packet's), and each receiving
    end drops arrivals with probability ``loss`` (``loss_filter_bytecode``)."""
    steps: list[Step] = [
        ("ip", "-n", namespace, "link", "set", "dev", interface, "gso_max_segs", "1")
        for namespace, interface in ends
    ]
    for namespace, interface in receivers:
        steps.append(("tc", "-n", namespace, "qdisc", "add", "dev", interface, "clsact"))
        steps.append(
            (
                "tc",
                "-n",
                namespace,
                "filter",
                "add",
                "dev",
                interface,
                "ingress",
                "bpf",
                "da",
                "bytecode",
                loss_filter_bytecode(loss),
            )
        )
    return steps


def plan_network(
    *,
    hosts: int,
    profile: LinkProfile,
    run_id: str,
    subnet: str = DEFAULT_SUBNET,
    hz: int = FALLBACK_HZ,
    tbf_latency_us: int = DEFAULT_TBF_LATENCY_US,
) -> NetworkPlan:
    """The namespaces, addresses, relays and ``ip``/``tc`` commands for ``hosts`` hosts."""
    host_list = _plan_hosts(hosts, run_id, subnet)
    bucket = (
        None
        if profile.rate_bits_per_s is None
        else token_bucket_for(profile.rate_bits_per_s, hz=hz, latency_us=tbf_latency_us)
    )
    switch = namespace_name(run_id, "sw") if hosts > 2 else ""
    steps, ends, receivers = _link_steps(host_list, switch, profile)
    for host in host_list:
        steps.append(("ip", "-n", host.namespace, "link", "set", "lo", "up"))
        steps.append(("ip", "-n", host.namespace, "addr", "add", host.cidr, "dev", host.interface))
        steps.append(("ip", "-n", host.namespace, "link", "set", host.interface, "up"))
    if bucket is not None:
        for namespace, interface in ends:
            steps.append(
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
    if profile.lossy:
        steps += _loss_commands(profile.loss, ends, receivers)
    return NetworkPlan(
        run_id=run_id,
        profile=profile,
        hosts=host_list,
        switch_namespace=switch,
        token_bucket=bucket,
        steps=tuple(steps),
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
