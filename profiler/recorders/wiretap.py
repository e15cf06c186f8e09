"""Record gRPC traffic inside the tasks' own processes: no proxy, no second hop.

The recording proxy (``proxy.py``) puts a second TCP hop on every connection;
on a 2-core machine that hop alone costs more step time than the capture is
allowed (bench/README.md, "Capture overhead").  This recorder instead loads a
small C library into every task process (``LD_PRELOAD``; source in
``wiretap.c``, built on first use with the system's C compiler and cached by
``tf_grpc_bench.native``).
The library wraps the send calls, and after each send on a cluster connection
walks the sent bytes with just enough HTTP/2 and gRPC framing to tell which
bytes a trace needs (frame headers, header blocks, message prefixes and the
first ``head_bytes`` of each message) from those it only has to count (the
bulk of every tensor).  It appends that to a per-process record file
(``tapfile.py``); no parsing, decoding or system call happens on the send path.

After the job, ``TapRecorder`` reads the files (``tapfile.read_tap_file``) and
makes them calls (``tapcalls.calls_of_files``).  The caller of a call is the
process whose file holds the client side (a child of a task counts as the task,
through its recorded parent pid); the callee is the task listening on the
server side's port.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from tf_grpc_bench.errors import CaptureError
from tf_grpc_bench.native import NativeSource, build
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.profiler.recorders.http2 import MESSAGE_HEAD_BYTES

# ``as``: also named here for profiler/assemble.py, which imports them from this module.
from tf_grpc_bench.profiler.recorders.tapcalls import ConnectionFrames as ConnectionFrames
from tf_grpc_bench.profiler.recorders.tapcalls import calls_of_files as calls_of_files
from tf_grpc_bench.profiler.recorders.tapfile import TapFile as TapFile
from tf_grpc_bench.profiler.recorders.tapfile import TapFileGrowth, trim_record_files
from tf_grpc_bench.profiler.recorders.tapfile import read_tap_file as read_tap_file
from tf_grpc_bench.profiler.recorders.tapfile import shift_tap_file as shift_tap_file
from tf_grpc_bench.profiler.recorders.tapfile import (
    with_sends_at_their_start as with_sends_at_their_start,
)

LIBRARY_SOURCE = Path(__file__).with_name("wiretap.c")
#: Environment variables the library reads (see wiretap.c).
ENV_DIRECTORY = "TFGB_WIRETAP_DIR"
ENV_PORTS = "TFGB_WIRETAP_PORTS"
ENV_HEAD_BYTES = "TFGB_WIRETAP_HEAD"
ENV_CAPACITY_BYTES = "TFGB_WIRETAP_BYTES"
#: Room for one process's records: a sparse file, so only what is written
#: takes space (ResNet-50 under tf2-ps writes about 2 MB per step per task).
DEFAULT_CAPACITY_BYTES = 1 << 30


# --------------------------------------------------------------------------
# The library.


LIBRARY = NativeSource(
    name="wiretap",
    source=LIBRARY_SOURCE,
    kind="shared",
    link_flags=("-ldl", "-pthread"),
    purpose="the in-process recorder (--recorder preload)",
    alternative="--recorder proxy needs no compiler",
)


def build_library(cache_directory: Path | None = None) -> Path:
    """The compiled recorder library, built from ``wiretap.c`` if not cached yet
    (``native.build``: CaptureError if no compiler is found or the build fails)."""
    return build(LIBRARY, error=CaptureError, cache=cache_directory)


def recorder_environment(
    base: Mapping[str, str],
    *,
    library: Path,
    directory: Path,
    ports: Iterable[int],
    head_bytes: int = MESSAGE_HEAD_BYTES,
    capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
) -> dict[str, str]:
    """``base`` plus what makes a process record its cluster connections into ``directory``.

    ``ports`` are the tasks' listening ports: a TCP connection is followed when
    its local or peer port is one of them.  The library goes first in
    ``LD_PRELOAD``, before whatever the base environment preloads.
    """
    environment = dict(base)
    preload = environment.get("LD_PRELOAD", "")
    environment["LD_PRELOAD"] = f"{library}:{preload}" if preload else str(library)
    environment[ENV_DIRECTORY] = str(directory)
    environment[ENV_PORTS] = ",".join(str(port) for port in sorted(set(ports)))
    environment[ENV_HEAD_BYTES] = str(head_bytes)
    environment[ENV_CAPACITY_BYTES] = str(capacity_bytes)
    return environment


# --------------------------------------------------------------------------
# The recorder.


class TapRecorder:
    """In-process recording for one job: the environment to start its tasks
    with, and, once they have stopped, their calls.

    ``task_ports`` maps each task's name (``job:index``) to the port it listens
    on.  Record files go to ``directory``.  ``library`` defaults to
    ``build_library()`` (CaptureError if it cannot be built).  A
    ``recorder.Recorder``, as the proxies' ``ProxySet`` is.  ``expected_pids``
    (``expect_process``, before ``collect``) are processes that must have
    left a file: a task in which the library did not load is reported in
    ``errors``.  Not thread-safe.
    """

    def __init__(
        self,
        task_ports: Mapping[str, int],
        directory: Path,
        *,
        head_bytes: int = MESSAGE_HEAD_BYTES,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        library: Path | None = None,
    ) -> None:
        if capacity_bytes < 1 << 20:
            raise CaptureError(f"recorder capacity must be >= 1 MiB, got {capacity_bytes} bytes")
        self.library = library or build_library()
        self.directory = Path(directory)
        self.task_ports = dict(task_ports)
        self._callee_of_port = {port: name for name, port in self.task_ports.items()}
        self.head_bytes = head_bytes
        self.capacity_bytes = capacity_bytes
        self.started_ns = 0
        self.expected_pids: dict[int, str] = {}
        self._files: list[TapFile] | None = None
        self._calls: list[RecordedCall] | None = None
        self._errors: list[str] = []
        self._growth: dict[Path, TapFileGrowth] = {}

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment to start every task of the job with."""
        return recorder_environment(
            base,
            library=self.library,
            directory=self.directory,
            ports=self.task_ports.values(),
            head_bytes=self.head_bytes,
            capacity_bytes=self.capacity_bytes,
        )

    def peer_address(self, task: str, address: str) -> str:
        """Where peers dial ``task``, whose server is at ``address``: there (no proxy)."""
        del task
        return address

    def expect_process(self, pid: int, task: str) -> None:
        """Process ``pid`` runs ``task``: it must leave a record file (see ``errors``)."""
        self.expected_pids[pid] = task

    def start(self) -> None:
        """Prepare the record directory (emptied of earlier files); note the start time."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._growth.clear()
            for stale in self.directory.glob("tap-*.bin"):
                stale.unlink()
        except OSError as error:
            raise CaptureError(f"recorder directory {self.directory}: {error.strerror}") from None
        self.started_ns = time.monotonic_ns()

    def stop(self) -> None:
        """The tasks have ended (the library ends with each): their record files are cut
        to the records they hold (``tapfile.trim_record_files``), so that a kept work
        directory holds its records, not 1 GiB a process."""
        trim_record_files(self.directory)

    def activity(self) -> int:
        """Bytes the tasks have sent to other processes so far, over every record file
        (read as the files grow: each call reads only the records written since the
        last).  A task talking to itself does not count, so a job whose tasks wait for a
        peer that never came shows no activity however often each calls itself."""
        total = 0
        for path in self.directory.glob("tap-*.bin"):
            growth = self._growth.setdefault(path, TapFileGrowth())
            growth.read_more(path)
            total += growth.between_processes()
        return total

    # -- reading -----------------------------------------------------------

    def files(self) -> list[TapFile]:
        """Every record file of the job (read once)."""
        if self._files is None:
            files = []
            for path in sorted(self.directory.glob("tap-*.bin")):
                try:
                    files.append(read_tap_file(path))
                except CaptureError as error:
                    self._errors.append(str(error))
            self._files = files
        return self._files

    def collect(self, *, final: bool = True) -> list[RecordedCall]:
        """Every recorded call, oldest first.  Call once the tasks have stopped:
        a call still open in a file is returned incomplete.  ``final`` is
        accepted for the proxies' interface; every collect is final here."""
        del final
        if self._calls is None:
            self._calls = self._assemble(self.files())
        return list(self._calls)

    def errors(self) -> tuple[str, ...]:
        """One line per file, connection side or task the recording lost track of."""
        self.collect()  # assembling finds the connections it could not follow
        files = self.files()
        lines = list(self._errors)
        seen_pids = {f.pid for f in files}
        for pid, task in sorted(self.expected_pids.items()):
            if pid not in seen_pids:
                lines.append(
                    f"task {task} (pid {pid}) left no record file: the recorder library "
                    "did not load in it, or it made no connection"
                )
        for tap in files:
            if tap.damage:
                lines.append(f"{tap.path.name}: {tap.damage}")
            if tap.dropped_records:
                lines.append(
                    f"{tap.path.name}: {tap.dropped_records} records did not fit in "
                    f"{self.capacity_bytes} bytes"
                )
        return tuple(lines)

    def forwarded_bytes(self) -> tuple[int, int]:
        """(bytes sent on followed connections, of which never copied by the recorder)."""
        files = self.files()
        return sum(f.sent_bytes for f in files), sum(f.skipped_bytes for f in files)

    def _caller_pid(self, tap: TapFile) -> int:
        """The task process a file belongs to: its own pid, or its parent's if that is a task."""
        if tap.pid not in self.expected_pids and tap.parent_pid in self.expected_pids:
            return tap.parent_pid
        return tap.pid

    def _assemble(self, files: list[TapFile]) -> list[RecordedCall]:
        return calls_of_files(
            files,
            callee_of=lambda server, address: self._callee_of_port.get(
                address[1], f"port {address[1]}"
            ),
            caller_pid_of=self._caller_pid,
            errors=self._errors,
        )
