"""Progress of a running capture, and its display on the terminal.

The capture reports ``Progress`` to a callback on its own thread: the step
markers written so far, or, for a user's job that writes none, how long it has
run and how long its tasks have been quiet (its steps are found in the
traffic once it ends).  ``terminal_display`` is the callback the commands use:
a bar on a terminal, one line per change otherwise (logs, CI).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """What the progress display shows.

    With ``markers`` (the default): step markers written so far out of
    expected (0: unknown) and the last one's duration.  Without: the job has
    written no step marker, so only ``elapsed_ns`` since it started and
    ``quiet_ns``, the time since its tasks last exchanged anything.
    """

    steps_done: int = 0
    steps_expected: int = 0
    last_step_ns: int = 0
    markers: bool = True
    elapsed_ns: int = 0
    quiet_ns: int = 0

    def describe(self) -> str:
        """The progress in words, for a line or a bar's postfix (no label)."""
        if self.markers:
            total = f"/{self.steps_expected}" if self.steps_expected else ""
            timing = f" (last {self.last_step_ns / 1e6:.0f} ms)" if self.last_step_ns else ""
            return f"{self.steps_done}{total} step markers{timing}"
        quiet = f", no traffic for {self.quiet_ns / 1e9:.0f} s" if self.quiet_ns >= 5e9 else ""
        return (
            f"running {self.elapsed_ns / 1e9:.0f} s{quiet}; no step markers: the steps are "
            "found in the traffic when the job ends"
        )


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

        bar = tqdm(desc=label, unit="marker", file=sys.stderr, leave=False)

        def update(progress: Progress) -> None:
            if not progress.markers:
                bar.set_postfix_str(progress.describe(), refresh=True)
                return
            expected = progress.steps_expected
            if expected and bar.total != expected:
                bar.total = expected
            bar.n = progress.steps_done
            last_ns = progress.last_step_ns
            if last_ns:
                bar.set_postfix_str(f"last step {last_ns / 1e6:.0f} ms", refresh=False)
            bar.refresh()

        return update, bar.close

    def line(progress: Progress) -> None:
        sys.stderr.write(f"{label}: {progress.describe()}\n")
        sys.stderr.flush()

    return line, lambda: None
