"""The machine's and each task's CPU while a captured job runs (``tf_grpc_bench.capture_cpu``).

``CpuSampler`` reads ``/proc/stat`` (the machine, every process) and the
``/proc/PID/stat`` of every process of each task's session (user and system
time, all threads) ten times a second on a thread of the capture's own
process, stamped with ``CLOCK_MONOTONIC``: the clock the recorders stamp calls
with, so a trace's steps (relative to the recorder's start) can be laid over
the samples.  Every task runs on this machine, emulated hosts too (network
namespaces share the kernel and its clock).  A few small file reads a sample
and a look through ``/proc`` once a second (about 3.5 ms of CPU a second for a
5-task job, measured); nothing is sent to the tasks.

``summarize`` is pure: the averages over the steady steps' span, each
counter read at the span's ends by linear interpolation between the samples
around them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench import host
from tf_grpc_bench.capture_cpu import CaptureCpu

#: Seconds between samples.
INTERVAL_S = 0.1
#: Every this many samples, each task's session is looked for again (``session_members``).
RESCAN_SAMPLES = 10
#: The span must be covered by samples for at least this share, else nothing is recorded.
MIN_COVERED_SHARE = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuSample:
    monotonic_ns: int
    #: ``/proc/stat`` ticks, all cores (``host.MachineCpuTimes``).
    busy_ticks: int
    total_ticks: int
    #: Each task alive then: its user + system ticks.
    task_ticks: Mapping[str, int]


def process_ticks(pid: int, proc: Path = Path("/proc")) -> int | None:
    """User plus system clock ticks ``pid`` has used (all its threads); None when it is gone."""
    fields = host.process_stat_fields(pid, proc)
    try:
        return None if fields is None else int(fields[11]) + int(fields[12])  # utime, stime
    except (IndexError, ValueError):
        return None


def session_members(leaders: set[int], proc: Path = Path("/proc")) -> dict[int, set[int]]:
    """Every process of each session ``leaders`` lead (a task started in a session of its
    own: the task itself and whatever it started, a launcher's children too)."""
    members: dict[int, set[int]] = {leader: {leader} for leader in leaders}
    try:
        entries = [entry.name for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return members
    for name in entries:
        fields = host.process_stat_fields(int(name), proc)
        with contextlib.suppress(IndexError, ValueError):
            if fields is not None and int(fields[3]) in members:  # session id
                members[int(fields[3])].add(int(name))
    return members


class CpuSampler:
    """Samples the machine's and the tasks' CPU on a thread until ``stop``.

    A task's CPU is its session's (``session_members``, looked for again every
    ``RESCAN_SAMPLES`` samples and whenever a task starts): a process of it that ended
    keeps counting with the ticks it was last seen with, so each task's count only grows.
    """

    def __init__(
        self,
        pids: Callable[[], Mapping[str, int]],
        *,
        interval_s: float = INTERVAL_S,
        proc: Path = Path("/proc"),
    ) -> None:
        self._pids = pids
        self._interval_s = interval_s
        self._proc = proc
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._members: dict[int, set[int]] = {}
        self._last: dict[int, int] = {}
        self._gone: dict[str, int] = {}
        self._count = 0
        self._tasks: dict[str, int] = {}
        self.samples: list[CpuSample] = []

    def _task_ticks(self, tasks: Mapping[str, int]) -> dict[str, int]:
        leaders = set(tasks.values())
        if leaders != set(self._members) or self._count % RESCAN_SAMPLES == 0:
            found = session_members(leaders, self._proc)
            # Members already known stay until they are seen gone.
            self._members = {
                leader: found[leader] | self._members.get(leader, set()) for leader in leaders
            }
        self._count += 1
        ticks = {}
        for name, leader in tasks.items():
            members = self._members.get(leader, set())
            for pid in list(members):
                used = process_ticks(pid, self._proc)
                if used is None:
                    members.discard(pid)
                    if pid in self._last:
                        self._gone[name] = self._gone.get(name, 0) + self._last.pop(pid)
                else:
                    self._last[pid] = used
            alive = [self._last[pid] for pid in members if pid in self._last]
            if alive or name in self._gone:
                ticks[name] = self._gone.get(name, 0) + sum(alive)
        return ticks

    def sample(self) -> CpuSample | None:
        """One sample now; None where the machine's counters cannot be read."""
        machine = host.read_machine_cpu(self._proc / "stat")
        if machine is None:
            return None
        # RuntimeError: the job's table of tasks changed while read here (a task starting
        # on the launcher's thread): the tasks known before, read again next time.
        with contextlib.suppress(RuntimeError):
            self._tasks = dict(self._pids())
        return CpuSample(
            monotonic_ns=time.monotonic_ns(),
            busy_ticks=machine.busy_ticks,
            total_ticks=machine.total_ticks,
            task_ticks=self._task_ticks(self._tasks),
        )

    def _run(self) -> None:
        while True:
            taken = self.sample()
            if taken is not None:
                self.samples.append(taken)
            if self._stop.wait(self._interval_s):
                break
        # One last sample at the stop, so that the samples reach past everything before it
        # (the job's last step ends just before its run returns).
        taken = self.sample()
        if taken is not None:
            self.samples.append(taken)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling, after one last sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _at(points: Sequence[tuple[int, int]], t: int) -> float:
    """The counter ``points`` (time, value; by time) at ``t``, linear between samples and
    clamped to the first and last."""
    if t <= points[0][0]:
        return float(points[0][1])
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else float(v1)
    return float(points[-1][1])


def summarize(
    samples: Sequence[CpuSample],
    windows: Sequence[tuple[int, int]],
    tasks: Sequence[str],
    *,
    cores: int | None = None,
    ticks_per_s: int | None = None,
) -> CaptureCpu | None:
    """The CPU over the span of ``windows`` (the steps, monotonic ns), for ``tasks`` in order;
    None without steps, or when the samples cover less than ``MIN_COVERED_SHARE`` of it."""
    if not windows or len(samples) < 2:
        return None
    ordered = sorted(samples, key=lambda s: s.monotonic_ns)
    begin = max(min(start for start, _ in windows), ordered[0].monotonic_ns)
    end = min(max(stop for _, stop in windows), ordered[-1].monotonic_ns)
    span = max(stop for _, stop in windows) - min(start for start, _ in windows)
    if end <= begin or end - begin < MIN_COVERED_SHARE * span:
        return None
    hertz = ticks_per_s or os.sysconf("SC_CLK_TCK")
    count = cores or os.cpu_count() or 1
    busy = [(s.monotonic_ns, s.busy_ticks) for s in ordered]
    total = [(s.monotonic_ns, s.total_ticks) for s in ordered]
    total_ticks = _at(total, end) - _at(total, begin)
    if total_ticks <= 0:
        return None
    busy_cores = count * (_at(busy, end) - _at(busy, begin)) / total_ticks
    seconds = (end - begin) / 1e9
    per_task = []
    for name in tasks:
        points = [(s.monotonic_ns, s.task_ticks[name]) for s in ordered if name in s.task_ticks]
        if points:
            used = (_at(points, end) - _at(points, begin)) / hertz
            per_task.append((name, max(0.0, used / seconds)))
    return CaptureCpu(
        cores=count,
        busy_cores=max(0.0, min(float(count), busy_cores)),
        task_cores=tuple(per_task),
        span_ns=end - begin,
    )
