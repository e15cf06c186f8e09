"""Step markers: the file format in which driving tasks say when each step ran.

One JSON object per line (``task``, ``step``, ``phase`` = ``warmup``/``steady``,
``start_ns``/``end_ns`` from ``time.monotonic_ns()``), appended by every
driving task of a launched job (``MarkerFile``) and, optionally, by a user's
own script under ``capture-job``.  Read only here (``read_step_markers``); a
torn last line (a task still writing) is skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench.errors import CaptureError

PHASES = ("warmup", "steady")

#: The step-marker file in a launched job's work directory.
MARKERS_FILE = "steps.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMarker:
    """One training step as the driving task saw it.

    Times are ``time.monotonic_ns()`` of the driving process (CLOCK_MONOTONIC,
    system-wide on Linux, so comparable with other processes' monotonic clocks).
    """

    task: str
    step: int
    phase: str
    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"step marker phase must be one of {PHASES}, got {self.phase!r}")
        if self.step < 0:
            raise ValueError(f"step marker step must be >= 0, got {self.step}")
        if self.end_ns < self.start_ns:
            raise ValueError(f"step marker {self.task} step {self.step}: end before start")

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_line(self) -> str:
        return (
            json.dumps(
                {
                    "task": self.task,
                    "step": self.step,
                    "phase": self.phase,
                    "start_ns": self.start_ns,
                    "end_ns": self.end_ns,
                },
                separators=(",", ":"),
            )
            + "\n"
        )

    @classmethod
    def from_line(cls, line: str) -> StepMarker:
        data = json.loads(line)
        return cls(
            task=str(data["task"]),
            step=int(data["step"]),
            phase=str(data["phase"]),
            start_ns=int(data["start_ns"]),
            end_ns=int(data["end_ns"]),
        )


def read_step_markers(path: Path) -> list[StepMarker]:
    """Every complete marker line of a step-marker file (a torn last line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    markers = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if not line.endswith("\n"):
            break
        try:
            markers.append(StepMarker.from_line(line))
        except (ValueError, KeyError, TypeError) as error:
            raise CaptureError(f"{path}:{number}: not a step marker ({error})") from None
    return markers


class MarkerFile:
    """Appends step markers of one task to the job's step-marker file.

    Each marker is one ``write`` on an ``O_APPEND`` descriptor, so lines from
    several processes never interleave.  Thread-safe.
    """

    def __init__(self, path: Path, task: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._task = task

    def write(self, *, step: int, phase: str, start_ns: int, end_ns: int) -> None:
        marker = StepMarker(
            task=self._task, step=step, phase=phase, start_ns=start_ns, end_ns=end_ns
        )
        os.write(self._fd, marker.to_line().encode("utf-8"))

    def close(self) -> None:
        os.close(self._fd)
