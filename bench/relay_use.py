"""What the link relays of a bench's runs took of the machine: their CPU per byte they moved.

A delayed link's relay (``tf_grpc_bench.netns.relay``) runs on the machine's cores,
the emulated hosts' cores: training and replays on the link share them with it
(docs/fidelity.md, Limits).  ``RelaySampler`` watches, while a block runs, every relay
started by a process of this one (a training run's, a capture's, a ``network
compare``'s): their statistics files (``netns.state``) carry each relay's own CPU time
(``cpu_ns``) and the bytes it moved.  A relay's file is gone once its network is torn
down, so the sampler reads them every ``SAMPLE_S`` while they run and keeps the last
reading of each; the CPU and the bytes of one reading go together, so their ratio holds
even if the relay's last second is missed.

Used by bench/fidelity.py (``relay_table``); ``python bench/relay_use.py -- COMMAND``
runs one command and prints what its relays took.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import table_head, table_row

from tf_grpc_bench import host
from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns import state
from tf_grpc_bench.netns.relay import RelayStats, read_relay_stats

#: How often the running relays' statistics are read (s).
SAMPLE_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayUse:
    """What the relays of one block took: their CPU time and the bytes they moved (both
    directions of every relay, summed)."""

    relays: int
    cpu_s: float
    bytes: int

    @property
    def cpu_s_per_gb(self) -> float | None:
        """CPU seconds per 10^9 bytes moved (None if they moved nothing)."""
        return self.cpu_s / (self.bytes / 1e9) if self.bytes else None


def relay_use(readings: dict[Path, RelayStats]) -> RelayUse:
    """The sum of the last readings of each relay."""
    return RelayUse(
        relays=len(readings),
        cpu_s=sum(stats.cpu_ns for stats in readings.values()) / 1e9,
        bytes=sum(d.bytes for stats in readings.values() for d in stats.directions),
    )


def is_descendant(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or below it (False once either is gone)."""
    seen = 0
    while pid > 1 and seen < 4096:
        if pid == ancestor:
            return True
        fields = host.process_stat_fields(pid)
        if fields is None:
            return False
        pid = int(fields[1])  # the parent's pid (field 4 of proc(5))
        seen += 1
    return pid == ancestor


class RelaySampler:
    """Reads, every ``interval_s``, the statistics of the relays started below process
    ``root`` (default: this one); ``use()`` is what they took so far."""

    def __init__(self, root: int | None = None, *, interval_s: float = SAMPLE_S) -> None:
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self.readings: dict[Path, RelayStats] = {}
        self._others: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay-sampler", daemon=True)

    def sample(self) -> None:
        """Read every running relay's statistics that is ours (one pass)."""
        for path in state.STATE_DIRECTORY.glob("*.relay"):
            if path in self._others:
                continue
            try:
                stats = read_relay_stats(path)
            except NetworkError:
                continue  # torn down meanwhile, or not a relay's file
            if path in self.readings or is_descendant(stats.pid, self.root):
                self.readings[path] = stats
            else:
                self._others.add(path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> RelaySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def use(self) -> RelayUse:
        return relay_use(self.readings)


@contextmanager
def sampled(enabled: bool) -> Iterator[RelaySampler | None]:
    """A running ``RelaySampler`` if ``enabled`` (a delayed link), else None."""
    if not enabled:
        yield None
        return
    with RelaySampler() as sampler:
        yield sampler


def _cell(use: RelayUse | None) -> str:
    if use is None or use.cpu_s_per_gb is None:
        return "-"
    return f"{use.cpu_s_per_gb:.2f} ({use.cpu_s:.1f} s, {use.bytes / 1e9:.1f} GB)"


def relay_table(rows: Sequence[tuple[str, Sequence[RelayUse | None]]]) -> list[str]:
    """Per delayed link: its relays' CPU seconds per GB moved in each kind of run."""
    lines = [
        "The links' relays (delayed links; docs/fidelity.md, Limits): CPU seconds per GB they",
        "moved (their CPU and bytes over the run, warm-up and set-up included), in training",
        "uncaptured and captured and in the replay of the link's trace. Training's round pays",
        "this CPU where training is bound by its CPU; a real link takes none.",
        "",
        *table_head("link", "uncaptured training", "capture", "replay (link trace)"),
    ]
    for link, uses in rows:
        lines.append(table_row(link, *(_cell(use) for use in uses)))
    return lines


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] != "--":
        print("usage: python bench/relay_use.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    with RelaySampler() as sampler:
        completed = subprocess.run(list(argv[1:]), check=False)
    use = sampler.use()
    print(f"relays: {use.relays}; CPU-s per GB moved: {_cell(use)}")
    return completed.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
