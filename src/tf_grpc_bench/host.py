"""What a trace or a result says about the machine it was made on.

A trace's compute is the capture machine's: the trace names that machine so
that a replay elsewhere knows to scale it (``calibration``) or to say whose
compute its prediction carries.  Reads ``/proc`` only.
"""

from __future__ import annotations

import os
import platform
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
