"""A real ``tensorboard`` program, started as a user starts it, for the tests to query.

``tensorboard --logdir DIR --port 0``: the default mode, in which TensorBoard
loads event files with its Rust data server (``tensorboard-data-server``,
"fast loading"), the mode a user gets with no flag.  The test reads what the
dashboards would show through TensorBoard's HTTP API.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tf_grpc_bench.lifetime import die_with_parent_preexec

#: What TensorBoard prints when its fast (Rust) loader started.
FAST_LOADER_NOTE = "Using experimental fast data loading logic"
#: Guards against a hang only; nothing is timed.
STARTUP_LIMIT_S = 180.0


class TensorBoard:
    """A running TensorBoard: its base URL and JSON helpers over its HTTP API."""

    def __init__(self, url: str, stderr_path: Path) -> None:
        self.url = url
        self.stderr_path = stderr_path

    def get(self, route: str, **query: str) -> Any:
        """GET ``data/...`` with ``query``, decoded from JSON."""
        return json.loads(self.get_bytes(route, **query))

    def get_bytes(self, route: str, **query: str) -> bytes:
        """GET ``data/...``; gzip-encoded answers (the Profile plugin's) are unpacked."""
        address = self.url + route + ("?" + urllib.parse.urlencode(query) if query else "")
        with urllib.request.urlopen(address, timeout=120) as response:
            body = bytes(response.read())
            if response.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return body

    def post(self, route: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.url + route, data=json.dumps(body).encode())
        request.add_header("Content-Type", "application/json")
        request.add_header("X-XSRF-Protected", "1")
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll ``ready`` until true (TensorBoard loads event files in the background)."""
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while not ready():
            assert time.monotonic() < deadline, f"tensorboard never showed {what}"
            time.sleep(0.5)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@contextlib.contextmanager
def running_tensorboard(logdir: Path, scratch: Path) -> Iterator[TensorBoard]:
    """``tensorboard --logdir LOGDIR --port 0``, stopped on exit with its data server (its
    own process group).  A test process killed outright (a mutation run's timeout) takes
    it along too: the kernel sends it SIGTERM when the test process ends."""
    program = Path(sys.executable).parent / "tensorboard"
    stderr_path = scratch / "tensorboard.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [str(program), "--logdir", str(logdir), "--port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=die_with_parent_preexec(signal.SIGTERM),
        )
    try:
        deadline = time.monotonic() + STARTUP_LIMIT_S
        url = None
        while url is None:
            text = stderr_path.read_text(errors="replace")
            assert process.poll() is None, text[-2000:]
            assert time.monotonic() < deadline, "tensorboard never said where it serves"
            found = re.search(r"TensorBoard \S+ at (http://\S+?:\d+/)", text)
            url = found.group(1) if found else None
            time.sleep(0.2)
        yield TensorBoard(url, stderr_path)
    finally:
        _stop_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # The data server TensorBoard started, if it outlived TensorBoard.
        _stop_group(process, signal.SIGKILL)


def _stop_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """``signum`` to TensorBoard's process group (its leader's pid is the group's id)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
