"""A progress bar over a replay's measured runs, on standard error (tqdm)."""

from __future__ import annotations

import sys
from typing import Any, Protocol

from tf_grpc_bench.replay.core.measurement import Benchmark


class Progress(Protocol):
    """What the bar reads of the runner's progress events (``transport.loop.ProgressEvent``)."""

    @property
    def benchmark(self) -> Benchmark: ...

    @property
    def phase(self) -> str: ...

    @property
    def run_index(self) -> int: ...

    @property
    def runs(self) -> int: ...


class ProgressBar:
    """A tqdm bar over ``total_runs`` measured runs, or nothing when not ``enabled``
    (quiet, or standard error is not a terminal).  Call it with each progress event;
    ``close`` it when the replay ends."""

    def __init__(self, total_runs: int, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total_runs, unit="run", file=sys.stderr, leave=False)

    def __call__(self, event: Progress) -> None:
        if self._bar is None:
            return
        label = event.benchmark.value
        if event.phase == "warmup":
            self._bar.set_description(f"{label} warm-up")
        elif event.phase == "run":
            self._bar.set_description(f"{label} run {event.run_index + 1}/{event.runs}")
        elif event.phase == "finished":
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
