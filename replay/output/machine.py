"""The machine and network a run went over: what a result document records about them.

``MachineInfo``, ``InterfaceInfo`` and ``NetworkInfo`` are plain records.
``probe_machine`` and ``describe_interface`` fill them from this host
(``/proc``, ``/sys/class/net``, installed package metadata; read by
``tf_grpc_bench.host``'s probes but for the memory total); nothing else here
touches the system.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench.host import cpu_model, package_version, sysfs_int


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineInfo:
    """The host the client side of the benchmark ran on."""

    hostname: str
    platform: str
    kernel: str
    cpu_model: str
    #: Logical CPUs the operating system reports.
    cpu_count: int
    #: Total physical memory; -1 where unknown.
    memory_bytes: int
    python_version: str
    #: Versions of the packages that shape the figures ("" if not installed).
    grpcio_version: str
    protobuf_version: str
    numpy_version: str
    tensorboard_version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InterfaceInfo:
    """One network interface the benchmark's traffic crossed."""

    name: str
    #: -1 where the kernel does not say.
    mtu_bytes: int = -1
    #: Link speed in Mbit/s as the kernel reports it; -1 for interfaces that
    #: have none (loopback, veth) or where it cannot be read.
    speed_mbit_per_s: int = -1
    #: Network namespace the interface lives in ("" for the caller's own).
    namespace: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayDirection:
    """One direction of an emulated link's relay over the run (``netns.relay``): what it
    moved and how late its releases were, as its histogram gives them."""

    #: The link within its network ("h0-h1", "h2-sw") and the direction
    #: ("tfgb-...-h0:eth0 -> tfgb-...-h1:eth0").
    link: str
    direction: str
    delay_ns: int
    jitter_ns: int
    packets: int
    bytes: int
    #: Packets its full queue dropped; failed writes to the receiving side.
    queue_drops: int = 0
    write_errors: int = 0
    late_p50_ns: int = 0
    late_p99_ns: int = 0
    late_max_ns: int = 0
    late_mean_ns: int = 0
    #: The lateness histogram's non-empty buckets: (lower bound in ns, count).
    late_histogram: tuple[tuple[int, int], ...] = ()
    #: Why this direction did not hold its profile ("" if it did).
    behind: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkInfo:
    """The network a run went over (filled by whoever set the network up)."""

    #: Short name shown in tables and TensorBoard: "loopback", "veth-1gbit", ...
    name: str
    #: Addresses the client connected to ("host:port").
    addresses: tuple[str, ...] = ()
    interfaces: tuple[InterfaceInfo, ...] = ()
    #: Rate limit of an emulated link in bit/s; 0 when the link is not emulated.
    emulated_rate_bits_per_s: int = 0
    #: How the link was emulated, e.g. "tbf rate 1gbit burst 128kb latency 50ms".
    emulation: str = ""
    #: An emulated link's one-way delay and jitter (ns) and loss probability (0 none).
    emulated_delay_ns: int = 0
    emulated_jitter_ns: int = 0
    emulated_loss: float = 0.0
    #: What the link's relays did over the run (none without a delay or jitter).
    relays: tuple[RelayDirection, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("NetworkInfo.name must not be empty")
        for field in ("emulated_rate_bits_per_s", "emulated_delay_ns", "emulated_jitter_ns"):
            if getattr(self, field) < 0:
                raise ValueError(f"NetworkInfo.{field} must be >= 0, got {getattr(self, field)}")
        if not 0 <= self.emulated_loss < 1:
            raise ValueError(
                f"NetworkInfo.emulated_loss must be in [0, 1), got {self.emulated_loss}"
            )

    @property
    def relay_behind(self) -> str:
        """Why the link's relays did not hold its profile over the run ("" if they did)."""
        return "; ".join(f"{r.direction}: {r.behind}" for r in self.relays if r.behind)


def _memory_bytes(meminfo: Path, field: str = "MemTotal") -> int:
    try:
        text = meminfo.read_text(errors="replace")
    except OSError:
        return -1
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                unit = 1024 if len(fields) > 2 and fields[2].lower() == "kb" else 1
                return int(fields[1]) * unit
    return -1


def probe_machine(*, proc: Path = Path("/proc")) -> MachineInfo:
    """This host, as a result records it (``tf_grpc_bench.host``'s probes: ``/proc`` and
    installed package metadata)."""
    return MachineInfo(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        kernel=platform.release(),
        cpu_model=cpu_model(proc / "cpuinfo"),
        cpu_count=os.cpu_count() or 0,
        memory_bytes=_memory_bytes(proc / "meminfo"),
        python_version=platform.python_version(),
        grpcio_version=package_version("grpcio"),
        protobuf_version=package_version("protobuf"),
        numpy_version=package_version("numpy"),
        tensorboard_version=package_version("tensorboard"),
    )


def describe_interface(
    name: str, *, namespace: str = "", sys_class_net: Path = Path("/sys/class/net")
) -> InterfaceInfo:
    """MTU and link speed of interface ``name`` as seen from this process's namespace.

    Reads ``/sys/class/net/<name>``; values the kernel does not report are -1.
    ``namespace`` is only recorded: the caller reads from inside it.
    """
    base = sys_class_net / name
    speed = sysfs_int(base / "speed")
    return InterfaceInfo(
        name=name,
        mtu_bytes=sysfs_int(base / "mtu"),
        speed_mbit_per_s=speed if speed > 0 else -1,
        namespace=namespace,
    )


def loopback_network(addresses: Sequence[str] = ()) -> NetworkInfo:
    """The NetworkInfo of a run over this host's loopback interface."""
    return NetworkInfo(
        name="loopback", addresses=tuple(addresses), interfaces=(describe_interface("lo"),)
    )
