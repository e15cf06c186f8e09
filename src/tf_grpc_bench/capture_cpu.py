"""How busy the capture machine's cores were over a trace's steps.

A trace's compute gaps are what training took between an input's arrival at
a task and the tensors computed from it leaving, on the capture's machine and
link.  Whether that machine had cores to spare says how far those gaps are
training's own work and how far its tasks waited for a core: a loopback
capture on 2 cores keeps both busy (every task's transfers and compute
contending for them).  ``capture`` samples the machine's CPU (``/proc/stat``)
and every task's (``/proc/PID/stat``, its whole session) while its job runs
(``profiler.cpu_sampler``), and records over the span of the steady steps
(``RunMetadata.extra``):

* ``capture_cpu_cores``: the cores the machine has;
* ``capture_cpu_busy_cores``: the cores busy on average, every process's work
  and the kernel's and the hypervisor's steal;
* ``capture_cpu_task_cores``: each task's own average (``ps:0=0.152,...``);
* ``capture_cpu_span_ns``: the span those averages are over.

``inspect`` prints them, and a replay that keeps the compute of a trace
captured with the cores (nearly) all busy, on another link, says so
(``contention_note``): loopback traces of such captures have predicted a
link's training short (docs/fidelity.md, Limits).  Pure: reads and writes the
entries, says what they mean.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tf_grpc_bench.errors import ConfigError

CORES_EXTRA = "capture_cpu_cores"
BUSY_EXTRA = "capture_cpu_busy_cores"
TASKS_EXTRA = "capture_cpu_task_cores"
SPAN_EXTRA = "capture_cpu_span_ns"
EXTRA_KEYS = (CORES_EXTRA, BUSY_EXTRA, TASKS_EXTRA, SPAN_EXTRA)

#: Share of the machine's cores busy over the steps from which a capture is
#: taken as bound by its CPU (``CaptureCpu.contended``), as a replay's
#: ``replay_bound`` takes the whole machine (replay/output/prediction.py).
CONTENDED_SHARE = 0.9

_TASK = re.compile(r"^([A-Za-z_][\w-]*):(\d+)=(\d+(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureCpu:
    """The capture machine's CPU over a trace's steps, in cores busy on average."""

    cores: int
    busy_cores: float
    #: ``("ps:0", 0.152)``, in the trace's task order.
    task_cores: tuple[tuple[str, float], ...]
    span_ns: int

    def __post_init__(self) -> None:
        if self.cores <= 0 or self.span_ns <= 0:
            raise ValueError("cores and span_ns must be positive")
        values = [self.busy_cores, *(c for _, c in self.task_cores)]
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError("cores busy must be finite and >= 0")

    @property
    def busy_share(self) -> float:
        """Share of the machine's cores busy (at most 1)."""
        return min(1.0, self.busy_cores / self.cores)

    @property
    def tasks_cores(self) -> float:
        """The job's tasks together."""
        return sum(cores for _, cores in self.task_cores)

    @property
    def contended(self) -> bool:
        """Whether the machine's cores were (nearly) all busy: training was bound by them."""
        return self.busy_share >= CONTENDED_SHARE

    def extra(self) -> tuple[tuple[str, str], ...]:
        """The trace's ``extra`` entries recording it."""
        return (
            (CORES_EXTRA, str(self.cores)),
            (BUSY_EXTRA, f"{self.busy_cores:.3f}"),
            (TASKS_EXTRA, ",".join(f"{name}={cores:.3f}" for name, cores in self.task_cores)),
            (SPAN_EXTRA, str(self.span_ns)),
        )

    def text(self) -> str:
        """``1.95 of 2 cores busy (98%) over 4.8 s of steps; the job's tasks 1.90
        (ps:0 0.15, ...)``."""
        tasks = ", ".join(f"{name} {cores:.2f}" for name, cores in self.task_cores)
        return (
            f"{self.busy_cores:.2f} of {self.cores} cores busy ({100 * self.busy_share:.0f}%) "
            f"over {self.span_ns / 1e9:.1f} s of steps; the job's tasks "
            f"{self.tasks_cores:.2f}" + (f" ({tasks})" if tasks else "")
        )


def _entry_error(key: str, text: str, expected: str) -> ConfigError:
    return ConfigError(f"trace metadata {key}={text!r}: expected {expected}")


def from_extra(extra: tuple[tuple[str, str], ...]) -> CaptureCpu | None:
    """The capture's CPU a trace's ``extra`` records; None if it records none (a trace
    captured before 2026-12-04, or by hand).

    A malformed or missing entry of the four raises ``ConfigError`` naming it.
    """
    entries = dict(extra)
    if not any(key in entries for key in EXTRA_KEYS):
        return None
    for key in EXTRA_KEYS:
        if key not in entries:
            raise ConfigError(
                f"trace metadata: {key} is missing (the capture's CPU entries come together: "
                f"{', '.join(EXTRA_KEYS)})"
            )
    cores_text, span_text = entries[CORES_EXTRA], entries[SPAN_EXTRA]
    if not cores_text.isdigit() or int(cores_text) <= 0:
        raise _entry_error(CORES_EXTRA, cores_text, "a positive whole number of cores")
    if not span_text.isdigit() or int(span_text) <= 0:
        raise _entry_error(SPAN_EXTRA, span_text, "a positive whole number of nanoseconds")
    busy_text = entries[BUSY_EXTRA]
    try:
        busy = float(busy_text)
    except ValueError:
        busy = -1.0
    if not math.isfinite(busy) or busy < 0:
        raise _entry_error(BUSY_EXTRA, busy_text, "cores busy, a number >= 0")
    tasks = []
    tasks_text = entries[TASKS_EXTRA]
    for item in filter(None, tasks_text.split(",")):
        match = _TASK.match(item.strip())
        if match is None:
            raise _entry_error(TASKS_EXTRA, tasks_text, "JOB:INDEX=CORES[,JOB:INDEX=CORES...]")
        tasks.append((f"{match[1]}:{match[2]}", float(match[3])))
    return CaptureCpu(
        cores=int(cores_text), busy_cores=busy, task_cores=tuple(tasks), span_ns=int(span_text)
    )


def captured_link(extra: tuple[tuple[str, str], ...]) -> str:
    """The link the trace was captured on: its emulated profile, else loopback."""
    return dict(extra).get("network") or "loopback"


def cpu_line(extra: tuple[tuple[str, str], ...]) -> str:
    """``inspect``'s line on the capture machine's CPU ("" for a trace recording none)."""
    try:
        recorded = from_extra(extra)
    except ConfigError as error:
        return f"capture CPU: unreadable ({error})"
    if recorded is None:
        return ""
    line = f"capture CPU: {recorded.text()}"
    if recorded.contended:
        line += "; bound by the machine's cores (docs/fidelity.md, Limits)"
    return line


def described(extra: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str | float], ...]:
    """A replay's result entries on its trace's capture CPU (``capture_cpu``: the text and
    the link, ``capture_cpu_busy_share``, ``capture_link``); () for a trace recording none.
    A malformed entry raises ``ConfigError`` naming it."""
    recorded = from_extra(extra)
    if recorded is None:
        return ()
    link = captured_link(extra)
    return (
        ("capture_cpu", f"{recorded.text()}, on {link}"),
        ("capture_cpu_busy_share", round(recorded.busy_share, 3)),
        ("capture_link", link),
    )


def contention_note(description: str, busy_share: float, *, same_link: bool = False) -> str:
    """A replay result's line when its trace was captured with the machine's cores (nearly)
    all busy (``described``'s entries); "" otherwise, or when the replay's link is the one
    the trace was captured on (``same_link``: the contention is that link's)."""
    if busy_share < CONTENDED_SHARE or same_link:
        return ""
    return (
        f"trace captured bound by its CPU ({description}): its compute gaps were measured with "
        "the cores all busy, and such traces have predicted another link's training up to 15% "
        "short (docs/fidelity.md, Limits); a trace captured on the link in question "
        "(capture --network PROFILE) predicts it better"
    )
