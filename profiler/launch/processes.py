"""Task processes: each started in its own process group, stopped with its children.

Shared by the launcher's ``TrainingJob`` and ``capture-job``'s user tasks.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO


def signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to a process group; nothing if it is gone or not ours."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop_groups(
    processes: Sequence[subprocess.Popen[bytes]],
    streams: Sequence[IO[bytes]] = (),
    *,
    grace_s: float = 5.0,
) -> None:
    """SIGTERM every still running process's group, SIGKILL every group after
    ``grace_s``, reap them all and close ``streams`` (their log files).

    Blocks for at most about ``grace_s`` plus 5 s per process.  The processes
    must have been started with ``start_new_session=True`` (pid == pgid).
    """
    alive = [process for process in processes if process.poll() is None]
    for process in alive:
        signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        # Also the groups whose leader is gone: a child may linger.
        signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
    for stream in streams:
        if not stream.closed:
            stream.close()


def tail_lines(path: Path, *, tail_bytes: int) -> list[str] | None:
    """The non-blank lines (stripped) of the last ``tail_bytes`` of a log file;
    None if it cannot be read."""
    try:
        with path.open("rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - tail_bytes))
            text = stream.read().decode("utf-8", "replace")
    except OSError:
        return None
    return [line.strip() for line in text.splitlines() if line.strip()]


#: Log lines of TensorFlow's C++ runtime, absl and gRPC below error level (start-up
#: chatter: devices, oneDNN, cuda absent, servers started), and their banners.
_NOISE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?: [IW] "  # TF:   "2026-12-01 ...: I tens..."
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "  # absl: "I0000 00:00:17.1 12 a.cc:3] "
    r"|WARNING: All log messages before absl::InitializeLog\(\)"
    r"|To enable the following instructions: |.*rebuild TensorFlow with the appropriate"
    r"|\s*warnings\.warn\(|.*(?:Warning|warning): )"
)
#: The line a Python traceback ends with: ``SomeError: what happened``.
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)\b")
#: Longest line quoted from a task's log in an error message.
MAX_QUOTED_CHARS = 200


def meaningful_line(lines: Sequence[str]) -> str:
    """The line of a task's log tail that says what went wrong: the last exception
    line of a traceback, else the last line that is not start-up chatter; "" if none.
    Cut to ``MAX_QUOTED_CHARS``."""
    kept = [line for line in lines if line.strip() and not _NOISE.match(line)]
    exceptions = [line for line in kept if _EXCEPTION.match(line)]
    chosen = (exceptions or kept or [""])[-1].strip()
    if len(chosen) > MAX_QUOTED_CHARS:
        chosen = chosen[: MAX_QUOTED_CHARS - 3] + "..."
    return chosen
