"""Emulated networks on one machine: Linux network namespaces joined by veth pairs.

Shared by replay (``tf-grpc-bench network``) and capture (``capture --network``,
which runs each training task inside an emulated host), so it imports neither.

Each emulated host is a network namespace named ``tfgb-<run id>-h<i>``.  Two
hosts are joined by one veth pair (a point-to-point link); three or more each
get a veth pair to a bridge ``br0`` inside a switch namespace
``tfgb-<run id>-sw``, like hosts cabled to one switch.  Every link is
rate-limited on both ends with a token-bucket filter (``tc qdisc ... tbf``), so
each host's link carries at most the profile's rate in each direction.
Addresses come from a private /24 that exists only inside these namespaces:
traffic never leaves the machine and no route of the root namespace changes.

This kernel has no ``netem`` (``tc qdisc add ... netem`` answers "Specified
qdisc kind is unknown"), so there is no delay or loss emulation: links differ in
rate only.

Links are created directly inside their namespaces (``ip link add ... netns``),
never in the root namespace, so deleting a namespace removes its links and a
crash leaves nothing behind but namespaces.  The run id starts with the pid of
the process that made the network; ``cleanup_leftovers`` removes the namespaces
of runs whose process is gone (and, on request, all of them).

Everything here needs root.  Commands run through an injectable
``CommandRunner`` so the plan (which commands, in which order) is plain data.
"""

from __future__ import annotations

import contextlib
import gzip
import ipaddress
import itertools
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import NetworkError

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
#: tbf's queue bound, as the time a packet may wait (tc's ``latency``).
DEFAULT_TBF_LATENCY_US = 20_000
#: A veth sends TSO/GSO packets of up to 64 KiB.  A bucket smaller than one such
#: packet makes tbf split it in software; two of them keeps that off the path.
MIN_BURST_BYTES = 2 * 65_536
#: Used when the kernel's HZ cannot be read; the smallest common HZ gives the
#: largest (safest) bucket.
FALLBACK_HZ = 100

_RUN_ID = re.compile(r"^(?P<pid>[0-9]+)-(?P<token>[0-9a-f]+)$")
_NAMESPACE = re.compile(
    r"^" + re.escape(PREFIX) + r"(?P<run>[0-9]+-[0-9a-f]+)-(?P<role>[a-z0-9]+)$"
)
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


def kernel_hz() -> int:
    """The running kernel's CONFIG_HZ, from /proc/config.gz or /boot; FALLBACK_HZ if unknown."""
    sources = (Path("/proc/config.gz"), Path(f"/boot/config-{os.uname().release}"))
    for source in sources:
        try:
            if source.suffix == ".gz":
                with gzip.open(source, "rt") as stream:
                    text = stream.read()
            else:
                text = source.read_text()
        except OSError:
            continue
        match = re.search(r"^CONFIG_HZ=([0-9]+)$", text, re.MULTILINE)
        if match:
            return int(match.group(1))
    return FALLBACK_HZ


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
    if not _RUN_ID.match(run_id):
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


#: Runs one command (argv), returns its stdout; raises NetworkError on failure.
CommandRunner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str]) -> str:
    """Run ``argv``; NetworkError naming the command and tool's message on failure."""
    try:
        completed = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError:
        raise NetworkError(f"{argv[0]}: not found (install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)}: timed out after 60 s") from None
    if completed.returncode != 0:
        message = (completed.stderr.strip() or completed.stdout.strip()).splitlines()
        detail = message[-1] if message else f"exit status {completed.returncode}"
        raise NetworkError(f"{' '.join(argv)}: {detail}")
    return completed.stdout


def require_root() -> None:
    """NetworkError unless this process may create namespaces and qdiscs."""
    if os.geteuid() != 0:
        raise NetworkError(
            "emulated networks need root (network namespaces, veth, tc); "
            "run as root, or replay between real hosts with --target"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetworkError(f"{tool}: not found (install iproute2)")


def list_namespaces(runner: CommandRunner = run_command) -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in runner(("ip", "netns", "list")).splitlines() if line]


#: Where ``ip netns add`` keeps a named namespace (a bind mount ``setns`` can open).
NAMED_NAMESPACES = Path("/run/netns")
_CLONE_NEWNET = 0x40000000


def namespace_path(name: str) -> Path:
    """The file of named network namespace ``name``; NetworkError if there is none."""
    path = NAMED_NAMESPACES / name
    if "/" in name or name in ("", ".", "..") or not path.exists():
        raise NetworkError(f"network namespace {name!r}: not found (ip netns list names them)")
    return path


def enter_namespace(name: str) -> None:
    """Move the calling thread into named network namespace ``name`` (``setns``), as
    ``ip netns exec`` does for a new process.

    Call it first thing in a fresh process: threads made afterwards by this thread
    (gRPC's among them) are in ``name`` too, threads made before stay where they were,
    so no socket may be opened before.  NetworkError if it cannot.
    """
    import ctypes

    path = namespace_path(name)
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise NetworkError(f"network namespace {name!r}: {error.strerror}") from None
    try:
        if libc.setns(descriptor, _CLONE_NEWNET) != 0:
            reason = os.strerror(ctypes.get_errno())
            raise NetworkError(f"cannot enter network namespace {name!r}: {reason}")
    finally:
        os.close(descriptor)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespace_pids(namespace: str, runner: CommandRunner) -> list[int]:
    try:
        return [int(p) for p in runner(("ip", "netns", "pids", namespace)).split()]
    except NetworkError:
        return []


def _kill_namespace_processes(namespace: str, runner: CommandRunner, grace_s: float) -> None:
    """Stop every process still inside one of our namespaces (started by our run).

    A namespace outlives ``ip netns del`` while any process is in it, so they
    must go first.  SIGTERM, then SIGKILL after ``grace_s``.
    """
    pids = _namespace_pids(namespace, runner)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _pid_alive(p) and p in _namespace_pids(namespace, runner)]
        if pids:
            time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def delete_namespace(namespace: str, runner: CommandRunner = run_command) -> None:
    """Remove one of our namespaces and whatever runs in it; refuses foreign names."""
    if not namespace.startswith(PREFIX):
        raise NetworkError(f"{namespace}: not a tf-grpc-bench namespace (prefix {PREFIX})")
    _kill_namespace_processes(namespace, runner, grace_s=3.0)
    runner(("ip", "netns", "del", namespace))


def cleanup_leftovers(
    *, include_live: bool = False, runner: CommandRunner = run_command
) -> list[str]:
    """Remove namespaces left by earlier runs; returns the names removed.

    Only namespaces starting with ``PREFIX`` are considered.  By default those
    of a run whose creating process is still alive are kept (another run in
    progress); ``include_live=True`` removes them too.  Namespaces with our
    prefix but an unrecognised shape are removed as well: nothing but this
    tool creates names under the prefix.
    """
    require_root()
    removed = []
    for name in list_namespaces(runner):
        if not name.startswith(PREFIX):
            continue
        match = _NAMESPACE.match(name)
        if match and not include_live:
            run_match = _RUN_ID.match(match["run"])
            if run_match and _pid_alive(int(run_match["pid"])):
                continue
        delete_namespace(name, runner)
        removed.append(name)
    return removed


def run_namespaces(run_id: str, runner: CommandRunner = run_command) -> list[str]:
    """The namespaces of one run."""
    return [
        name
        for name in list_namespaces(runner)
        if (m := _NAMESPACE.match(name)) is not None and m["run"] == run_id
    ]


def remove_run(run_id: str, runner: CommandRunner = run_command) -> list[str]:
    """Remove every namespace of one run (``network down``); returns their names.

    NetworkError, naming ``RUN_ID``, for a malformed run id or a run with no
    namespaces; without root, before anything is looked at.
    """
    if not _RUN_ID.match(run_id):
        raise NetworkError(f"RUN_ID {run_id!r}: expected <pid>-<hex> as 'network up' printed")
    require_root()
    names = run_namespaces(run_id, runner)
    if not names:
        raise NetworkError(f"RUN_ID {run_id}: no such network (see 'tf-grpc-bench network list')")
    for name in names:
        delete_namespace(name, runner)
    return names


def namespaces_by_run(runner: CommandRunner = run_command) -> dict[str, list[str]]:
    """The tool's namespaces (prefix ``PREFIX``) by run id, each run's sorted."""
    require_root()
    by_run: dict[str, list[str]] = {}
    for name in list_namespaces(runner):
        if name.startswith(PREFIX):
            run = name[len(PREFIX) :].rsplit("-", 1)[0]
            by_run.setdefault(run, []).append(name)
    return {run: sorted(names) for run, names in sorted(by_run.items())}


def netem_available(namespace: str, runner: CommandRunner = run_command) -> bool:
    """Whether ``tc ... netem`` (delay/loss emulation) works, tried on ``lo`` of ``namespace``."""
    try:
        runner(
            ("tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        )
    except NetworkError:
        return False
    runner(("tc", "-n", namespace, "qdisc", "del", "dev", "lo", "root"))
    return True


class _Terminated(SystemExit):
    """Raised from the SIGTERM/SIGHUP handler so that teardown runs."""


@contextlib.contextmanager
def _teardown_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into exceptions while the network exists.

    SIGINT already raises KeyboardInterrupt.  Signal handlers can only be set
    from the main thread; elsewhere this does nothing, and so it does under
    ``lifetime.interrupt_on_signals`` (the command line's), whose exception
    unwinds the network as well.
    """
    if threading.current_thread() is not threading.main_thread() or lifetime.handlers_installed():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise _Terminated(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while tearing down, so teardown is not cut short."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class EmulatedNetwork:
    """Hosts as namespaces on a rate-limited link; a context manager.

    ``with EmulatedNetwork(hosts=2, profile=parse_profile("1gbit")) as net:``
    builds the network, and removes everything it made (processes it spawned,
    namespaces, links, qdiscs) when the block ends: normally, by an exception,
    by Ctrl-C, or by SIGTERM/SIGHUP (which then exit with 128+signal).
    ``up``/``down`` do the same without the context manager.  Not thread-safe.
    """

    def __init__(
        self,
        *,
        hosts: int = 2,
        profile: LinkProfile = PROFILES["unlimited"],
        subnet: str = DEFAULT_SUBNET,
        run_id: str = "",
        tbf_latency_us: int = DEFAULT_TBF_LATENCY_US,
        runner: CommandRunner = run_command,
    ) -> None:
        self.run_id = run_id or new_run_id()
        self.runner = runner
        self.plan = plan_network(
            hosts=hosts,
            profile=profile,
            run_id=self.run_id,
            subnet=subnet,
            hz=kernel_hz(),
            tbf_latency_us=tbf_latency_us,
        )
        self._processes: list[subprocess.Popen[Any]] = []
        self._signals: contextlib.ExitStack | None = None

    @property
    def profile(self) -> LinkProfile:
        return self.plan.profile

    @property
    def hosts(self) -> tuple[Host, ...]:
        return self.plan.hosts

    @property
    def token_bucket(self) -> TokenBucket | None:
        return self.plan.token_bucket

    def up(self) -> EmulatedNetwork:
        """Create everything; on any failure remove what was made and raise NetworkError."""
        require_root()
        try:
            for command in self.plan.setup_commands:
                self.runner(command)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop spawned processes and delete this run's namespaces.  Idempotent."""
        with _signals_blocked():
            for process in self._processes:
                _stop_process(process)
            self._processes.clear()
            existing = set(list_namespaces(self.runner))
            for name in self.plan.namespaces:
                if name in existing:
                    delete_namespace(name, self.runner)

    def __enter__(self) -> EmulatedNetwork:
        stack = contextlib.ExitStack()
        stack.enter_context(_teardown_on_signals())
        self._signals = stack
        try:
            return self.up()
        except BaseException:
            stack.close()
            raise

    def __exit__(self, *_exc: object) -> None:
        try:
            self.down()
        finally:
            if self._signals is not None:
                self._signals.close()
                self._signals = None

    def host(self, index: int) -> Host:
        if not 0 <= index < len(self.hosts):
            raise NetworkError(f"host {index}: the network has hosts 0..{len(self.hosts) - 1}")
        return self.hosts[index]

    def command(self, host: Host | int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside ``host``'s namespace."""
        chosen = self.host(host) if isinstance(host, int) else host
        return ["ip", "netns", "exec", chosen.namespace, *argv]

    def run(
        self, host: Host | int, argv: Sequence[str], *, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host`` and wait (blocking); output captured as text.

        Does not raise on a non-zero exit: the caller reads ``returncode``.
        """
        return subprocess.run(
            self.command(host, argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            preexec_fn=lifetime.die_with_parent_preexec(),
        )

    def spawn(self, host: Host | int, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host`` in its own process group; stopped by ``down``,
        and killed if this process dies (``lifetime.die_with_parent_preexec``)."""
        process = subprocess.Popen(
            self.command(host, argv),
            start_new_session=True,
            preexec_fn=lifetime.die_with_parent_preexec(),
            **popen,
        )
        self._processes.append(process)
        return process


def _stop_process(process: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """SIGTERM the process group we started, SIGKILL it after ``grace_s``."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
