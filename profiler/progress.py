"""Progress of a running capture, and its display on the terminal.

The capture reports ``Progress`` (step markers written so far) to a callback
on its own thread; ``terminal_display`` is the callback the commands use: a
bar on a terminal, one line per change otherwise (logs, CI).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """What the progress display shows: markers written so far out of expected."""

    steps_done: int
    steps_expected: int
    last_step_ns: int


ProgressCallback = Callable[[Progress], None]


def terminal_display(quiet: bool, label: str) -> tuple[ProgressCallback | None, Callable[[], None]]:
    """A progress callback for the capture and a function that closes the display.

    Writes to stderr: a bar (tqdm) when it is a terminal, else a line per
    change; nothing at all when ``quiet``.
    """
    if quiet:
        return None, lambda: None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc=label, unit="step", file=sys.stderr, leave=False)

        def update(progress: Progress) -> None:
            steps_done = progress.steps_done
            expected = progress.steps_expected
            if expected and bar.total != expected:
                bar.total = expected
            bar.n = steps_done
            last_ns = progress.last_step_ns
            if last_ns:
                bar.set_postfix_str(f"last step {last_ns / 1e6:.0f} ms", refresh=False)
            bar.refresh()

        return update, bar.close

    def line(progress: Progress) -> None:
        steps_done = progress.steps_done
        expected = progress.steps_expected
        last_ns = progress.last_step_ns
        total = f"/{expected}" if expected else ""
        timing = f" (last {last_ns / 1e6:.0f} ms)" if last_ns else ""
        sys.stderr.write(f"{label}: {steps_done}{total} steps{timing}\n")
        sys.stderr.flush()

    return line, lambda: None
