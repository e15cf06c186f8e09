"""What a capture needs of a recorder: one face for ``wiretap.TapRecorder`` and ``proxy.ProxySet``.

A recorder is made for one job's tasks (``job:index`` -> the address its
server listens on) before any task starts.  The job starts its tasks with
``environment(...)``, lists every peer at ``peer_address(...)`` in their
cluster definitions and names its processes with ``expect_process``; after
the tasks have stopped, ``collect`` gives the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tf_grpc_bench.profiler.recorders.calls import RecordedCall

#: How the traffic is recorded (``--recorder``) -> the trace's capture_method.
CAPTURE_METHODS = {"preload": "in-process-recorder", "proxy": "recording-proxy"}
RECORDERS = tuple(CAPTURE_METHODS)
DEFAULT_RECORDER = "preload"


class Recorder(Protocol):
    """One job's recording, whichever recorder makes it."""

    @property
    def started_ns(self) -> int:
        """When recording started (monotonic ns): the trace's time origin."""
        ...

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment to start every task of the job with (``base`` plus the recorder's)."""
        ...

    def peer_address(self, task: str, address: str) -> str:
        """``host:port`` at which the other tasks must dial ``task``, whose server is at
        ``address`` (there, or a proxy in between)."""
        ...

    def expect_process(self, pid: int, task: str) -> None:
        """Process ``pid`` runs ``task`` (started by the job)."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def collect(self, *, final: bool = False) -> list[RecordedCall]: ...

    def errors(self) -> tuple[str, ...]: ...

    def forwarded_bytes(self) -> tuple[int, int]: ...

    def activity(self) -> int:
        """A count that grows whenever the tasks send each other anything; cheap enough
        to read every fraction of a second while the job runs (a hang shows as a count
        that stops growing)."""
        ...
