"""Burner processes: the compute load's real CPU work (``core.compute_load``).

A burner is a process of its own (never a thread of a replay process: its
GIL and its core would be the replay's), at normal priority, that does
arithmetic.  A task's gap burner (``--compute-load gaps``) works at a share of a
core while one of the compute gaps its task's worker process told it of runs:
work owed while others held the core is done when it gets the core back (up to
``MAX_CREDIT_NS``), so the work stays near its gaps.  A quota burner
(``uniform``) owes a fixed amount of CPU a replayed round (its quota), from the
round's start, due evenly over the sized step (or ``PACE_SHARE`` of the round
before, where that was shorter), and does it however long others holding the cores make that take
(the real-time relays of a delayed link, the replay's own processes), until the
next round starts: what it has not done then is counted short, not carried into
the next round.  The rounds are the first training worker's steps, told by its
process through shared memory (``RoundClock``, ``RoundSignal``: the throughput
loop's ``on_round``).  With ``--compute-load-wait`` that process, its round's
path done, makes the rest of the round's quota due at once and lets the next
round begin only once every quota burner has done it (``RoundSignal.wait``:
bounded, a burner gone not waited for).  Both count CPU on the burner's own
thread CPU clock, not in wall time.  Each
burner dies with the process that started it (``lifetime.die_with_parent``: no
burner outlives a replay killed with SIGKILL), and ``Burners.close`` ends them
all.

A worker process's ``GapSender`` is its driver's ``on_compute``: it sends each
gap, as far as it extends the ones sent before, to its burner as two CLOCK_MONOTONIC
times.  ``tree_cpu_ns`` measures the replay's own processes (the CPU the load
does not have to add), burners left out.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from tf_grpc_bench import lifetime
from tf_grpc_bench.host import process_stat_fields
from tf_grpc_bench.replay.transport.peers import perf_minus_monotonic_ns

#: A gap on the wire: start and end, CLOCK_MONOTONIC ns.
GAP = struct.Struct("<qq")
#: The most work a burner owes (CPU ns) and does later when it gets a core back.
MAX_CREDIT_NS = 50_000_000
#: How much CPU a burner spends before it looks at its messages and the clock again.
SLICE_NS = 1_000_000
#: A round's quota is due over this share of the round before, where that is shorter
#: than the step: a round up to 10% shorter than the one before still has all its
#: quota due before it ends (rounds vary), so a round short of its quota is one whose
#: burner did not get the CPU, not one shorter than its pace.
PACE_SHARE = 0.9
#: How often a quota burner with no round open looks for one to begin (ns).
ROUND_POLL_NS = 10_000_000
#: How long ``close`` waits for burners told to stop, then for terminated ones.
STOP_GRACE_S = 2.0
#: The most quota burners a round can wait for (``RoundClock``'s slots).
MAX_WAITED_BURNERS = 64
#: How often a round waiting for its quotas looks at them (s), and how many looks apart
#: (from the first) it looks whether the burners not done yet are still alive.
QUOTA_POLL_S = 0.0005
ALIVE_EVERY = 20


class GapSender:
    """A driver's ``on_compute`` (perf-counter ns) sending the gaps to one burner."""

    def __init__(self, connection: multiprocessing.connection.Connection) -> None:
        self._connection = connection
        self._offset = perf_minus_monotonic_ns()
        self._lock = threading.Lock()
        self._end = -(1 << 62)

    def __call__(self, start_ns: int, end_ns: int) -> None:
        with self._lock:
            if end_ns <= self._end or end_ns <= start_ns:
                return
            start = max(start_ns, self._end)
            self._end = end_ns
            with contextlib.suppress(OSError):
                self._connection.send_bytes(GAP.pack(start - self._offset, end_ns - self._offset))


#: ``RoundClock``'s shared entries: rounds begun, the last one's start, the last round
#: whose path is done (its quota due at once), the rounds that looked for their quotas
#: (all, those that waited at all, those let go with a quota not done) and the ns waited,
#: the quota burners waited for; then their pids, then the last round each did its quota of.
_COUNT, _START, _DUE, _ROUNDS, _WAITED, _UNMET, _WAITED_NS, _BURNERS = range(8)
_PIDS = 8
_DONE = _PIDS + MAX_WAITED_BURNERS


@dataclass(frozen=True, slots=True)
class QuotaWaits:
    """What rounds waiting for their quotas waited (``--compute-load-wait``): the rounds
    that looked, those that waited at all, those let go with a quota not done (the bound
    reached, or its burner gone), and the wall ns waited past their paths' ends, in all."""

    rounds: int = 0
    waited: int = 0
    unmet: int = 0
    waited_ns: int = 0

    def __add__(self, other: QuotaWaits) -> QuotaWaits:
        return QuotaWaits(
            self.rounds + other.rounds,
            self.waited + other.waited,
            self.unmet + other.unmet,
            self.waited_ns + other.waited_ns,
        )

    def __sub__(self, other: QuotaWaits) -> QuotaWaits:
        return QuotaWaits(
            self.rounds - other.rounds,
            self.waited - other.waited,
            self.unmet - other.unmet,
            self.waited_ns - other.waited_ns,
        )


def _alive(pid: int) -> bool:
    fields = process_stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


class RoundClock:
    """When the replay's rounds begin: how many have begun and the last one's start
    (CLOCK_MONOTONIC ns), in shared memory, written by one process (``begin``) and read
    by any (``read``).  Handed to processes as they are started (spawn arguments).

    Also where a round waits for its quotas (``await_quotas``, by that one process): the
    quota burners it waits for (``wait_for``; none unless set), each one's last round
    with its quota done (``quota_done``), and what the waits took (``waits``)."""

    def __init__(self, context: Any) -> None:
        self._shared = context.RawArray("q", _DONE + MAX_WAITED_BURNERS)

    def begin(self, start_ns: int) -> None:
        """A round began at ``start_ns`` (the one writer: its start, then the count)."""
        self._shared[1] = start_ns
        self._shared[0] += 1

    def read(self) -> tuple[int, int]:
        """(rounds begun, the last one's start); read again if one began meanwhile."""
        while True:
            count, start = self._shared[0], self._shared[1]
            if self._shared[0] == count:
                return count, start

    def wait_for(self, pids: Sequence[int]) -> None:
        """Rounds wait for these quota burners' quotas from now (none: rounds do not wait)."""
        if len(pids) > MAX_WAITED_BURNERS:
            raise ValueError(f"at most {MAX_WAITED_BURNERS} quota burners can be waited for")
        self._shared[_BURNERS] = 0
        for slot, pid in enumerate(pids):
            self._shared[_PIDS + slot] = pid
            self._shared[_DONE + slot] = self._shared[_COUNT]
        self._shared[_BURNERS] = len(pids)

    def waits_for(self) -> int:
        """How many quota burners a round waits for (0: rounds do not wait)."""
        return int(self._shared[_BURNERS])

    def due(self) -> int:
        """The last round whose path is done: the rest of its quota is due at once."""
        return int(self._shared[_DUE])

    def quota_done(self, slot: int, count: int) -> None:
        """The burner of ``slot`` has done the ``count``th round's quota."""
        if 0 <= slot < MAX_WAITED_BURNERS:
            self._shared[_DONE + slot] = count

    def await_quotas(
        self, until_ns: int, poll: Callable[[float], None] = time.sleep
    ) -> tuple[bool, bool]:
        """The open round's path is done: the rest of its quotas is due at once; wait until
        every quota burner waited for has done its quota of it or is gone, or until
        CLOCK_MONOTONIC reads ``until_ns``.  (Whether it waited at all, whether a quota
        was not done: the bound reached or its burner gone); added to ``waits``."""
        count, burners = self._shared[_COUNT], int(self._shared[_BURNERS])
        if burners <= 0:
            return False, False
        began = time.monotonic_ns()
        self._shared[_DUE] = count
        pending, gone, looks = list(range(burners)), False, 0
        while pending := [s for s in pending if self._shared[_DONE + s] < count]:
            if looks % ALIVE_EVERY == 0:
                alive = [s for s in pending if _alive(int(self._shared[_PIDS + s]))]
                pending, gone = alive, gone or len(alive) < len(pending)
            if not pending or time.monotonic_ns() >= until_ns:
                break
            looks += 1
            poll(QUOTA_POLL_S)
        waited, unmet = looks > 0, bool(pending) or gone
        self._shared[_ROUNDS] += 1
        self._shared[_WAITED] += int(waited)
        self._shared[_UNMET] += int(unmet)
        self._shared[_WAITED_NS] += time.monotonic_ns() - began if waited else 0
        return waited, unmet

    def waits(self) -> QuotaWaits:
        """What the rounds' waits for their quotas took so far."""
        return QuotaWaits(
            rounds=int(self._shared[_ROUNDS]),
            waited=int(self._shared[_WAITED]),
            unmet=int(self._shared[_UNMET]),
            waited_ns=int(self._shared[_WAITED_NS]),
        )


class RoundSignal:
    """A worker loop's ``on_round`` (perf-counter ns) telling a ``RoundClock``; and, with
    ``--compute-load-wait``, its ``quota_wait`` (``wait``)."""

    def __init__(self, rounds: RoundClock) -> None:
        self._rounds = rounds
        self._offset = perf_minus_monotonic_ns()

    def __call__(self, start_ns: int) -> None:
        self._rounds.begin(start_ns - self._offset)

    def wait(self, round_ns: int) -> bool:
        """The open round's path is done now, ``round_ns`` after it began: wait for its
        quotas (``RoundClock.await_quotas``), at most as long again; whether it waited."""
        until = time.monotonic_ns() + max(0, round_ns)
        return self._rounds.await_quotas(until)[0]


class RoundHooks(TypedDict):
    """A worker loop's ``on_round`` and ``quota_wait`` (``transport.loop.WorkerLoop``)."""

    on_round: Callable[[int], None] | None
    quota_wait: Callable[[int], bool] | None


def round_hooks(rounds: RoundClock | None, *, wait: bool) -> RoundHooks:
    """The hooks of the process that tells ``rounds`` (None: it does not): each round's
    start, and with ``wait`` (``--compute-load-wait``) each round's wait for its quotas."""
    signal_rounds = None if rounds is None else RoundSignal(rounds)
    quota_wait = signal_rounds.wait if signal_rounds is not None and wait else None
    return RoundHooks(on_round=signal_rounds, quota_wait=quota_wait)


@dataclass(frozen=True, slots=True)
class QuotaRounds:
    """What quota burners did over rounds: the rounds their quotas were owed over, the
    CPU owed (ns: each burner's quota every round) and done in time (a round's work
    done before the next began, at most its quota), and the rounds a burner ended
    short of its quota (each burner's counted: two burners short in one round, 2)."""

    rounds: int = 0
    owed_ns: float = 0.0
    done_ns: float = 0.0
    short: int = 0


def _overlap(intervals: Iterable[tuple[int, int]], begin: int, end: int) -> int:
    return sum(max(0, min(e, end) - max(s, begin)) for s, e in intervals)


class _Burner:
    """A burner's state: its gap duty and the gaps still to come, the gap work owed, its
    quota a round and the rounds; read on ``wall`` (CLOCK_MONOTONIC) and ``cpu`` (its
    thread's CPU)."""

    def __init__(
        self,
        wall: Callable[[], int] = time.monotonic_ns,
        cpu: Callable[[], int] = time.thread_time_ns,
    ) -> None:
        self._wall_clock, self._cpu_clock = wall, cpu
        self.gap_duty = 0.0
        self.gaps: deque[tuple[int, int]] = deque()
        self.credit = 0.0
        self.wall = wall()
        self.cpu = cpu()
        #: CPU ns owed a round (0: no quota), due evenly over at most ``step`` wall ns.
        self.quota = 0.0
        self.step = 1
        #: The rounds begun so far (``RoundClock``'s count), the open round's start (None:
        #: none open), this thread's CPU then, and the wall time its quota is due over.
        self.rounds_seen = 0
        self.round_start: int | None = None
        self.round_cpu = 0
        self.pace = 1
        #: The rounds closed since the quota was set, and what was done in them.
        self.closed = QuotaRounds()
        #: This quota burner's slot in ``RoundClock``; whether the open round's path is
        #: done (``--compute-load-wait``): the rest of its quota is due at once.
        self.slot = -1
        self.due_now = False

    def set_quota(self, quota_ns: float, step_ns: int, rounds_seen: int) -> None:
        """Owe ``quota_ns`` of CPU every round begun after the ``rounds_seen``th, due
        over ``step_ns`` at most (nothing owed before is owed now; no round is open)."""
        self.quota, self.step = quota_ns, max(1, step_ns)
        self.rounds_seen, self.round_start = rounds_seen, None
        self.closed = QuotaRounds()

    def _close_round(self, cpu: int, unseen: int = 0) -> None:
        """End the open round (if any) with this thread's CPU at ``cpu``, and count
        ``unseen`` rounds begun and ended between two looks: none of theirs done."""
        rounds, done, short = unseen, 0.0, unseen
        if self.round_start is not None:
            done = min(self.quota, float(cpu - self.round_cpu))
            rounds, short = rounds + 1, short + int(done < self.quota)
        self.closed = QuotaRounds(
            rounds=self.closed.rounds + rounds,
            owed_ns=self.closed.owed_ns + rounds * self.quota,
            done_ns=self.closed.done_ns + done,
            short=self.closed.short + short,
        )

    def begin_round(self, count: int, start_ns: int) -> None:
        """Rounds up to the ``count``th have begun, the last at ``start_ns``: the open one
        ends (what of its quota is not done is short, not carried over), and the last
        owes its quota from its start, due evenly over the step or, where shorter,
        ``PACE_SHARE`` of the rounds since the one before began."""
        if count <= self.rounds_seen or self.quota <= 0:
            self.rounds_seen = max(self.rounds_seen, count)
            return
        cpu = self._cpu_clock()
        began = count - self.rounds_seen
        previous = self.round_start
        self._close_round(cpu, unseen=began - 1)
        self.pace = self.step
        if previous is not None:
            self.pace = max(1, min(self.step, round(PACE_SHARE * (start_ns - previous) / began)))
        self.rounds_seen, self.round_start, self.round_cpu = count, start_ns, cpu

    def end_rounds(self) -> QuotaRounds:
        """End the open round now; what the rounds closed since the quota was set owed
        and had done (the next round, if any, begins a new count)."""
        self._close_round(self._cpu_clock())
        self.round_start = None
        closed, self.closed = self.closed, QuotaRounds()
        return closed

    def account(self) -> None:
        """Add the gap work owed since the last look, less the CPU spent."""
        now, cpu = self._wall_clock(), self._cpu_clock()
        owed = self.gap_duty * _overlap(self.gaps, self.wall, now)
        while self.gaps and self.gaps[0][1] <= now:
            self.gaps.popleft()
        if self.gap_duty > 0:
            self.credit = max(-SLICE_NS, min(MAX_CREDIT_NS, self.credit + owed - (cpu - self.cpu)))
        self.wall, self.cpu = now, cpu

    def quota_owed_ns(self) -> float:
        """The open round's quota due and not done (as of the last ``account``; 0 with
        no round open): due evenly over its pace, all of it once that is over."""
        if self.round_start is None or self.quota <= 0:
            return 0.0
        share = 1.0 if self.due_now else min(1.0, max(0, self.wall - self.round_start) / self.pace)
        return self.quota * share - (self.cpu - self.round_cpu)

    def quota_done(self) -> bool:
        """Whether the open round's quota is all done (its thread's CPU now)."""
        if self.round_start is None or self.quota <= 0:
            return False
        return self._cpu_clock() - self.round_cpu >= self.quota

    def owed_ns(self) -> float:
        """CPU to do now (as of the last ``account``)."""
        return max(self.credit, self.quota_owed_ns() if self.quota > 0 else 0.0)

    def add_gap(self, start: int, end: int) -> None:
        if self.gaps and start <= self.gaps[-1][1]:
            last = self.gaps.pop()
            self.gaps.append((last[0], max(last[1], end)))
        else:
            self.gaps.append((start, end))

    def idle_s(self) -> float | None:
        """How long nothing is owed at the least (None: until a message)."""
        if self.quota > 0:
            return (SLICE_NS if self.round_start is not None else ROUND_POLL_NS) / 1e9
        if self.gap_duty > 0 and self.gaps:
            return max(0, self.gaps[0][0] - self._wall_clock()) / 1e9 + SLICE_NS / 1e9
        return None


def _spin(cpu_ns: float) -> None:
    end = time.thread_time_ns() + cpu_ns
    value = 1
    while time.thread_time_ns() < end:
        for _ in range(200):
            value = (value * 1103515245 + 12345) & 0xFFFFFFFF


def work(burner: _Burner, spin: Callable[[float], None] = _spin) -> float | None:
    """One turn of a burner: account, then do a slice (``SLICE_NS`` at most) of what is
    owed; the time to wait for messages after (0: none, None: until one comes)."""
    burner.account()
    owed = burner.owed_ns()
    if owed > 0:
        spin(min(owed, SLICE_NS))
        return 0.0
    return burner.idle_s()


def _read(burner: _Burner, ready: Sequence[Any], control: Any, rounds: RoundClock) -> str:
    """Take the messages that came: "stop" when told to (or the parent is gone),
    "closed" when the gaps' sender is gone, else "ok"; "end" is answered with what
    the rounds since the quota was set owed and had done (``QuotaRounds``)."""
    for connection in ready:
        try:
            if connection is control:
                message = connection.recv()
                if message[0] == "duty":
                    burner.gap_duty = float(message[1])
                elif message[0] == "quota":
                    burner.set_quota(float(message[1]), int(message[2]), int(message[3]))
                    burner.slot = int(message[4])
                elif message[0] == "end":
                    burner.begin_round(*rounds.read())
                    connection.send(burner.end_rounds())
                else:
                    return "stop"
            else:
                burner.add_gap(*GAP.unpack(connection.recv_bytes()))
        except (EOFError, OSError):
            return "stop" if connection is control else "closed"
    return "ok"


def _burner_main(control: Any, gaps: Any, rounds: RoundClock, parent_pid: int) -> None:
    """A burner: obey ``control`` (("duty", gap share), ("quota", CPU ns, step ns, rounds
    begun before, slot), ("end",) or ("stop",)), burn in ``gaps`` and in ``rounds``'s
    rounds, and tell ``rounds`` when it has done a round's quota."""
    lifetime.die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    burner = _Burner()
    sources = [control] if gaps is None else [control, gaps]
    while True:
        burner.begin_round(*rounds.read())
        burner.due_now = burner.round_start is not None and rounds.due() >= burner.rounds_seen
        timeout = work(burner)
        if burner.quota_done():
            rounds.quota_done(burner.slot, burner.rounds_seen)
        ready = multiprocessing.connection.wait(sources, timeout)
        state = _read(burner, ready, control, rounds) if ready else "ok"
        if state == "stop":
            return
        if state == "closed":
            sources = [control]


def process_cpu_ns(pid: int, proc: Path = Path("/proc")) -> int:
    """A process's user + system CPU (ns; 0 when it is gone)."""
    fields = process_stat_fields(pid, proc)
    if fields is None:
        return 0
    ticks = int(fields[11]) + int(fields[12])
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def tree_cpu_ns(root: int, exclude: Sequence[int] = (), proc: Path = Path("/proc")) -> int:
    """CPU of ``root`` and every process descending from it (ns), but ``exclude``'s."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (fields := process_stat_fields(int(entry.name), proc)):
            parents[int(entry.name)] = int(fields[1])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo, skip = 0, [root], set(exclude)
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        total += process_cpu_ns(pid, proc)
        todo.extend(children.get(pid, ()))
    return total


class Burners:
    """The burner processes of one benchmark: one per task that reports gaps, and one per
    quota (``set_load``), owed every round ``rounds`` counts (a worker process tells it,
    ``RoundSignal``).  Start them from the thread that stops them (``lifetime``)."""

    def __init__(self, gap_tasks: int) -> None:
        self._context = multiprocessing.get_context("spawn")
        #: When the replay's rounds begin: hand it to the process that tells.
        self.rounds = RoundClock(self._context)
        self._rounds_before = 0
        self._processes: list[Any] = []
        self._controls: list[multiprocessing.connection.Connection] = []
        #: The write end each task's worker process sends its gaps on.
        self.gap_writers: list[multiprocessing.connection.Connection] = []
        self._gap_burners = 0
        self._quotas: tuple[tuple[float, ...], int] = ((), 1)
        try:
            for _ in range(gap_tasks):
                reader, writer = self._context.Pipe(duplex=False)
                self._start(reader)
                reader.close()
                self.gap_writers.append(writer)
            self._gap_burners = gap_tasks
        except BaseException:
            self.close()
            raise

    def _start(self, gaps: Any) -> None:
        control, child = self._context.Pipe()
        with lifetime.deferred_signals():
            process = self._context.Process(
                target=_burner_main,
                args=(child, gaps, self.rounds, os.getpid()),
                name="tf-grpc-bench-burner",
                daemon=True,
            )
            process.start()
        child.close()
        self._processes.append(process)
        self._controls.append(control)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self._processes if p.pid is not None)

    def set_load(
        self,
        gap_cores: float,
        quotas: Sequence[float] = (),
        step_ns: int = 1,
        *,
        wait: bool = False,
    ) -> None:
        """Each task's burner at ``gap_cores`` (at most 1) in its gaps; one more burner per
        quota in ``quotas``, owing that much CPU (ns) every round, due over ``step_ns``
        at most; with ``wait``, a round waits for their quotas (``RoundSignal.wait``)."""
        for control in self._controls[: self._gap_burners]:
            control.send(("duty", min(1.0, gap_cores)))
        for _ in quotas:
            self._start(None)
        self._quotas = (tuple(quotas), step_ns)
        self.restart_quotas()
        if wait:
            self.rounds.wait_for(self.pids[self._gap_burners :])

    def restart_quotas(self) -> None:
        """The quota burners owe their quotas every round from the next one (what was
        owed before is forgiven)."""
        quotas, step_ns = self._quotas
        self._rounds_before = self.rounds.read()[0]
        if not self._controls:
            return
        controls = self._controls[self._gap_burners :]
        for slot, (control, quota) in enumerate(zip(controls, quotas, strict=True)):
            with contextlib.suppress(OSError):  # a burner gone: its quota is not met, and says so
                control.send(("quota", quota, step_ns, self._rounds_before, slot))

    def cpu_ns(self) -> int:
        """The burners' CPU so far (ns)."""
        return sum(process_cpu_ns(pid) for pid in self.pids)

    def end_rounds(self, timeout_s: float = STOP_GRACE_S) -> QuotaRounds:
        """What the quotas owed over the rounds begun since ``restart_quotas`` and what
        the quota burners did of it (each ends its open round now).  A burner that does
        not answer within ``timeout_s`` (gone) did none of its quota."""
        quotas, _ = self._quotas
        rounds = self.rounds.read()[0] - self._rounds_before
        done, short = 0.0, 0
        for control in self._controls[self._gap_burners :]:
            try:
                control.send(("end",))
                answer = control.recv() if control.poll(timeout_s) else None
            except (EOFError, OSError):
                answer = None
            if isinstance(answer, QuotaRounds):
                done, short = done + answer.done_ns, short + answer.short
            else:
                short += rounds
        return QuotaRounds(rounds=rounds, owed_ns=sum(quotas) * rounds, done_ns=done, short=short)

    def close(self) -> None:
        """End every burner (told, then terminated, then killed).  Idempotent."""
        for control in self._controls:
            with contextlib.suppress(OSError):
                control.send(("stop",))
        lifetime.end_processes(
            self._processes, [(ending, STOP_GRACE_S) for ending in ("", "terminate", "kill")]
        )
        for connection in [*self._controls, *self.gap_writers]:
            connection.close()
        self._controls, self.gap_writers = [], []
