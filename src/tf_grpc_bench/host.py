"""What a trace or a result says about the machine it was made on.

A trace's compute is the capture machine's: the trace names that machine so
that a replay elsewhere knows to scale it (``calibration``) or to say whose
compute its prediction carries; and how busy the machine is (``/proc/stat``),
so that a measurement can tell whether it had the machine to itself.  Reads
``/proc`` only.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
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


def describe_machine(model: str, count: int | str) -> str:
    """A machine as traces and results name it: ``"<CPU model>, <count> CPUs"``."""
    return f"{model}, {count} CPUs" if count else model


def captured_on(extra: tuple[tuple[str, str], ...]) -> str:
    """The capture machine a trace's ``extra`` names; "" for traces that do not name it."""
    entries = dict(extra)
    model = entries.get(CPU_MODEL_EXTRA, "")
    return describe_machine(model, entries.get(CPU_COUNT_EXTRA, "")) if model else ""


def this_machine() -> str:
    """This machine as a trace captured here names it (``captured_on(capture_machine())``),
    so that a replay can tell whether it runs where its trace was captured."""
    return captured_on(capture_machine())


def machine_line(extra: tuple[tuple[str, str], ...]) -> str:
    """``inspect``'s line for the capture machine; "" for traces that do not name it."""
    machine = captured_on(extra)
    return f"captured on: {machine}" if machine else ""


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
