"""What a trace or a result says about the machine it was made on.

A trace's compute is the capture machine's: the trace names that machine so
that a replay elsewhere knows to scale it (``calibration``) or to say whose
compute its prediction carries; and how busy the machine is (``/proc/stat``),
so that a measurement can tell whether it had the machine to itself; and how
much memory this process may still take (``memory_room``: its memory cgroup's
limit, where it has one, or the machine's).  The other facts of this host the
tool records are read here too: installed package versions, the kernel's boot
id, the ephemeral port range, a network interface's ``/sys`` values.  Reads
``/proc``, ``/sys``, the cgroup file systems and installed package metadata
only.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from dataclasses import dataclass
from importlib import metadata as package_metadata
from pathlib import Path

#: ``RunMetadata.extra`` keys a capture fills with ``capture_machine()``.
CPU_MODEL_EXTRA = "cpu_model"
CPU_COUNT_EXTRA = "cpus"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name as ``/proc/cpuinfo`` gives it, else what
    ``platform.processor()`` says (possibly "")."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in {"model name", "Hardware", "cpu model"}:
            return value.strip()
    return platform.processor()


def capture_machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[tuple[str, str], ...]:
    """The ``extra`` entries naming the machine a capture ran on: its CPU model and count."""
    return ((CPU_MODEL_EXTRA, cpu_model(cpuinfo)), (CPU_COUNT_EXTRA, str(os.cpu_count() or 0)))


def machine_name(model: str, count: int | str) -> str:
    """A machine as traces and results name it: ``"<CPU model>, <count> CPUs"``."""
    return f"{model}, {count} CPUs" if count else model


def captured_on(extra: tuple[tuple[str, str], ...]) -> str:
    """The capture machine a trace's ``extra`` names; "" for traces that do not name it."""
    entries = dict(extra)
    model = entries.get(CPU_MODEL_EXTRA, "")
    return machine_name(model, entries.get(CPU_COUNT_EXTRA, "")) if model else ""


def this_machine() -> str:
    """This machine as a trace captured here names it (``captured_on(capture_machine())``),
    so that a replay can tell whether it runs where its trace was captured."""
    return captured_on(capture_machine())


def machine_line(extra: tuple[tuple[str, str], ...]) -> str:
    """``inspect``'s line for the capture machine; "" for traces that do not name it."""
    machine = captured_on(extra)
    return f"captured on: {machine}" if machine else ""


# --------------------------------------------------------------------------
# Other facts of this host: packages, boot, ports, network interfaces.


def package_version(name: str) -> str:
    """The installed version of the distribution ``name``; "" if it is not installed."""
    try:
        return package_metadata.version(name)
    except package_metadata.PackageNotFoundError:
        return ""


def tensorflow_version() -> str:
    """TensorFlow's version in this environment ("" if none): what a command most
    likely runs with (a label, as ``capture-job`` and ``record`` record it)."""
    for distribution in ("tensorflow", "tensorflow-cpu"):
        with contextlib.suppress(package_metadata.PackageNotFoundError):
            return package_metadata.version(distribution)
    return ""


def boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    """The kernel's boot id: tasks with the same one read the same monotonic clock; ""
    where it cannot be read."""
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""


#: Where Linux says which local ports it hands out to outgoing connections.
EPHEMERAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_port_low(path: Path = EPHEMERAL_PORT_RANGE) -> int:
    """The lowest port the kernel hands out to outgoing connections (32768 where unknown)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def sysfs_int(path: Path) -> int:
    """A ``/sys`` file holding one integer (an interface's ``mtu``, ``speed``); -1 where it
    cannot be read or is not one (loopback and veth answer EINVAL for ``speed``)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return -1


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineCpuTimes:
    """CPU time the machine spent since boot, summed over its cores, in ``/proc/stat`` ticks."""

    #: user + nice + system + irq + softirq + steal.
    busy_ticks: int
    #: busy + idle + iowait.
    total_ticks: int


#: ``/proc/stat``'s aggregate ``cpu`` line: user, nice, system, idle, iowait, irq,
#: softirq, steal (then guest and guest_nice, already counted in user and nice).
_PROC_STAT_BUSY = (0, 1, 2, 5, 6, 7)
_PROC_STAT_IDLE = (3, 4)


def parse_proc_stat(text: str) -> MachineCpuTimes:
    """The machine's CPU times from the text of Linux's ``/proc/stat``.

    Reads the aggregate ``cpu`` line (all cores); fields a kernel does not
    report (older kernels stop after idle) count as 0.  ``ValueError`` when
    there is no such line or its fields are not counts.
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                values = [int(value) for value in fields[1:]]
            except ValueError:
                raise ValueError(
                    f"/proc/stat: the cpu line's fields are not counts: {line!r}"
                ) from None
            if len(values) < 4 or any(value < 0 for value in values):
                raise ValueError(f"/proc/stat: expected 4 or more counts on the cpu line: {line!r}")
            values += [0] * (8 - len(values))
            busy = sum(values[i] for i in _PROC_STAT_BUSY)
            return MachineCpuTimes(
                busy_ticks=busy, total_ticks=busy + sum(values[i] for i in _PROC_STAT_IDLE)
            )
    raise ValueError("/proc/stat: no aggregate 'cpu' line")


#: Where Linux says how busy the machine's cores have been since boot.
PROC_STAT = Path("/proc/stat")


def process_stat_fields(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command name, the state first (so field N of
    proc(5) is at index N - 3); None when the process is gone or cannot be read."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": the command name may hold spaces and parentheses.
    return text[text.rfind(")") + 2 :].split()


def read_machine_cpu(path: Path = PROC_STAT) -> MachineCpuTimes | None:
    """The machine's CPU times now (``parse_proc_stat``); None where there is no such file."""
    try:
        return parse_proc_stat(path.read_text())
    except (OSError, ValueError):
        return None


def others_cpu_share(
    begin: MachineCpuTimes | None,
    end: MachineCpuTimes | None,
    own_cpu_ns: int,
    *,
    ticks_per_s: int | None = None,
) -> float | None:
    """Share of the machine's CPU time between two readings that went to anything but the
    process that used ``own_cpu_ns`` of it in between: other processes, the kernel's work
    for them, and the hypervisor's steal.  0 on a machine left to that process; None where
    the readings are missing or span no tick."""
    if begin is None or end is None:
        return None
    total = end.total_ticks - begin.total_ticks
    if total <= 0:
        return None
    hertz = ticks_per_s or os.sysconf("SC_CLK_TCK")
    others = end.busy_ticks - begin.busy_ticks - own_cpu_ns * hertz / 1e9
    return min(1.0, max(0.0, others / total))


# --------------------------------------------------------------------------
# Memory: what this process may still take before something stops it.

#: A cgroup v1 memory limit at or above this is no limit (the kernel writes its
#: largest page count times the page size, 0x7ffffffffffff000 on x86-64).
_V1_NO_LIMIT_BYTES = 1 << 62


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRoom:
    """How many more bytes this process may take now, and what bounds them."""

    available_bytes: int
    #: The bound, as a sentence's end reads it: "the machine's MemAvailable" or
    #: "its memory cgroup /job (limit 3221225472 B)".
    bound: str

    def __post_init__(self) -> None:
        if self.available_bytes < 0:
            raise ValueError(f"available_bytes must be >= 0, got {self.available_bytes}")


def memory_room(*, proc: Path = Path("/proc")) -> MemoryRoom | None:
    """The least room of the machine (``MemAvailable``) and of every memory cgroup this
    process is in, up to the root (cgroup v2 ``memory.max`` less ``memory.current``,
    v1 ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``, each less the page
    cache it can drop at once): what a container, a Kubernetes pod or a Slurm job
    with ``--mem`` leaves.  None where none of them can be read.

    Reads a handful of small files (microseconds); call it when sizing, not per call.
    """
    rooms = _cgroup_rooms(proc)
    machine = _meminfo_bytes(proc / "meminfo", "MemAvailable")
    if machine is not None:
        rooms.append(MemoryRoom(available_bytes=machine, bound="the machine's MemAvailable"))
    return min(rooms, key=lambda room: room.available_bytes, default=None)


def _meminfo_bytes(meminfo: Path, field: str) -> int | None:
    """A ``/proc/meminfo`` field in bytes; None where there is none."""
    try:
        text = meminfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == [f"{field}:"] and len(fields) >= 2 and fields[1].isdigit():
            return int(fields[1]) * (1024 if fields[2:3] == ["kB"] else 1)
    return None


@dataclass(frozen=True, slots=True)
class _Hierarchy:
    """One mounted cgroup hierarchy holding this process's memory cgroup."""

    #: This process's cgroup folder, and the hierarchy's mount point above it.
    folder: Path
    mount: Path
    #: The cgroup's path as ``/proc/self/cgroup`` names it.
    name: str
    version: int


def _cgroup_rooms(proc: Path) -> list[MemoryRoom]:
    """The room each limited memory cgroup this process is in leaves it."""
    rooms = [_cgroup_room(folder, hierarchy) for folder, hierarchy in _cgroup_folders(proc)]
    return [room for room in rooms if room is not None]


def _cgroup_folders(proc: Path) -> list[tuple[Path, _Hierarchy]]:
    """Every memory cgroup folder this process is in, each hierarchy's up to its mount."""
    found = []
    for hierarchy in _memory_hierarchies(proc):
        folder = hierarchy.folder
        while True:
            found.append((folder, hierarchy))
            if folder == hierarchy.mount or folder.parent == folder:
                break
            folder = folder.parent
    return found


def memory_cgroups(*, proc: Path = Path("/proc")) -> list[tuple[str, int, str]]:
    """The memory cgroups ``memory_room`` reads, for a program that reads their room
    itself (the gRPC C++ server): each one's folder, cgroup version (1 or 2) and name as
    ``MemoryRoom.bound`` gives it."""
    return [
        (str(folder), hierarchy.version, _cgroup_name(folder, hierarchy))
        for folder, hierarchy in _cgroup_folders(proc)
    ]


def _cgroup_name(folder: Path, hierarchy: _Hierarchy) -> str:
    return "/" + str(folder.relative_to(hierarchy.mount)).removeprefix(".").lstrip("/")


def _memory_hierarchies(proc: Path) -> list[_Hierarchy]:
    """Where this process's memory cgroups are mounted: the v2 one and the v1 memory one."""
    try:
        membership = (proc / "self" / "cgroup").read_text()
        mounts = (proc / "self" / "mountinfo").read_text()
    except OSError:
        return []
    names: dict[int, str] = {}
    for line in membership.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, name = rest.partition(":")
        if number == "0" and not controllers:
            names[2] = name
        elif "memory" in controllers.split(","):
            names[1] = name
    found = []
    for line in mounts.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        after = fields.index("-", 6)
        kind, options = fields[after + 1], fields[after + 3 : after + 4]
        version = 2 if kind == "cgroup2" else 1 if kind == "cgroup" else 0
        if version == 1 and "memory" not in ",".join(options).split(","):
            continue
        if version not in names:
            continue
        name = names.pop(version)
        root, mount = _unescape(fields[3]).rstrip("/"), Path(_unescape(fields[4]))
        if name != root and not name.startswith(root + "/"):
            continue  # the process's cgroup lies outside what is mounted here
        relative = name[len(root) :].strip("/")
        found.append(_Hierarchy(mount / relative if relative else mount, mount, name, version))
    return found


def _unescape(field: str) -> str:
    """A ``mountinfo`` path field, whose spaces and the like are octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), field)


def _cgroup_room(folder: Path, hierarchy: _Hierarchy) -> MemoryRoom | None:
    """What the cgroup at ``folder`` leaves, if it has a memory limit."""
    if hierarchy.version == 2:
        files = ("memory.max", "memory.current", "inactive_file")
    else:
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    limit, used = _read_count(folder / files[0]), _read_count(folder / files[1])
    if limit is None or used is None or limit >= _V1_NO_LIMIT_BYTES:
        return None
    droppable = _memory_stat(folder / "memory.stat", files[2])
    return MemoryRoom(
        available_bytes=max(0, limit - max(0, used - droppable)),
        bound=f"its memory cgroup {_cgroup_name(folder, hierarchy)} (limit {limit} B)",
    )


def _read_count(path: Path) -> int | None:
    """A cgroup file holding one count; None where it is missing, unlimited ("max") or not one."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _memory_stat(path: Path, field: str) -> int:
    """One field of a cgroup's ``memory.stat``; 0 where it has none."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == field and value.strip().isdigit():
            return int(value)
    return 0
