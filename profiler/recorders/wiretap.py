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
bulk of every tensor).  It appends that to a per-process record file; no
parsing, decoding or system call happens on the send path.

Every task sends its own bytes, so the requests of a connection are in its
client's file and the responses in its server's.  After the job, ``TapRecorder``
reads the files, pairs the two sides of each connection by their addresses,
and replays each side through the same ``http2.Http2Follower`` and
``calls.CallTable`` as the proxy: the parsing is the proxy's, only the
transport differs.  The caller of a call is the process whose file holds the
client side (a child of a task counts as the task, through its recorded parent
pid); the callee is the task listening on the server side's port.

Record file layout: see ``wiretap.c``; it is read only here
(``read_tap_file``).  Version history: 1 (2026-11-29) first version; 2
(2026-12-01) a SENT record says how long its send call took (``took_ns``, 0 in
version 1), so a peer on another host's clock can be bounded by when the send
began (``TapFile.began``); version 1 files are still read.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tf_grpc_bench.errors import CaptureError
from tf_grpc_bench.native import NativeSource, build
from tf_grpc_bench.profiler.recorders.calls import CallTable, Direction, RecordedCall
from tf_grpc_bench.profiler.recorders.http2 import (
    MESSAGE_HEAD_BYTES,
    ControlFrame,
    FramingError,
    Http2Follower,
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

FILE_MAGIC = b"TFGBTAP1"
FILE_VERSION = 2
#: Versions ``read_tap_file`` reads.
READABLE_FILE_VERSIONS = frozenset({1, 2})
_FILE_HEADER = struct.Struct("<8sIIIIQQQQ")  # magic .. created_ns; the header is 64 B
FILE_HEADER_BYTES = 64
_RECORD_HEAD = struct.Struct("<IHHIIQ")  # length, type, 0, connection, took_ns, time_ns
_CONNECTION = struct.Struct("<HHHH16s16siI")
_RECORD_CONNECTION = 1
_RECORD_SENT = 2
_RECORD_CLOSED = 3
_RECORD_LOST = 4
_SKIP_BIT = 0x80000000
_COUNT_MASK = 0x7FFFFFFF
_AF_INET = 2


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
# Record files (the one place they are parsed).


@dataclass(frozen=True, slots=True, kw_only=True)
class TapConnection:
    """One followed connection, as one process saw it."""

    number: int
    server_side: bool
    local: tuple[str, int]
    peer: tuple[str, int]
    opened_ns: int
    closed_ns: int = 0

    @property
    def endpoints(self) -> tuple[tuple[str, int], tuple[str, int]]:
        """(client address, server address): the same for both sides of a connection."""
        return (self.peer, self.local) if self.server_side else (self.local, self.peer)


@dataclass(frozen=True, slots=True, kw_only=True)
class TapFile:
    """What one process recorded.

    ``sends`` maps a connection number to its send calls, in order, each
    ``(time_ns, operations)`` (see ``wiretap.c``).  ``damage`` says why the
    file ends early ("" if it does not); ``dropped_records`` did not fit;
    ``lost`` are the connections whose later sends the library could not
    record (it ran out of memory).
    """

    path: Path
    pid: int
    parent_pid: int
    head_bytes: int
    dropped_records: int
    damage: str
    connections: tuple[TapConnection, ...]
    sends: Mapping[int, tuple[tuple[int, bytes], ...]] = field(default_factory=dict)
    lost: frozenset[int] = frozenset()
    #: Connection number -> when each of its send calls began (parallel to
    #: ``sends``; the same as the returns' times in version 1 files).
    began: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    #: Bytes sent on the followed connections (kept and skipped), and of
    #: those, the ones the library counted without copying.
    sent_bytes: int = 0
    skipped_bytes: int = 0


def _address(family: int, raw: bytes, port: int) -> tuple[str, int]:
    import ipaddress

    if family == _AF_INET:
        return (str(ipaddress.IPv4Address(raw[:4])), port)
    address = ipaddress.IPv6Address(raw)
    # An IPv4 peer of a dual-stack socket (gRPC's, listening on [::]) reads as
    # ::ffff:a.b.c.d: given as a.b.c.d, as the other side's IPv4 socket and the
    # cluster's addresses give it, so both sides of a connection name it alike.
    return (str(address.ipv4_mapped or address), port)


def _read_records(path: Path) -> tuple[tuple[int, int, int, int], bytes]:
    """((pid, parent pid, head bytes, dropped records), the records) of a record file."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(FILE_HEADER_BYTES)
            if len(header) < _FILE_HEADER.size:
                raise CaptureError(f"{path}: too short for a recorder file header")
            magic, version, pid, parent, head, capacity, end, dropped, _created = (
                _FILE_HEADER.unpack_from(header)
            )
            if magic != FILE_MAGIC:
                raise CaptureError(f"{path}: not an in-process recorder file (bad magic)")
            if version not in READABLE_FILE_VERSIONS:
                raise CaptureError(
                    f"{path}: recorder file version {version}; this tool reads "
                    f"{', '.join(map(str, sorted(READABLE_FILE_VERSIONS)))}"
                )
            end = min(end, capacity)
            data = handle.read(max(0, end - FILE_HEADER_BYTES))
    except OSError as error:
        raise CaptureError(f"{path}: {error.strerror}") from None
    return (pid, parent, head, dropped), data


@dataclass(frozen=True, slots=True)
class _Record:
    kind: int
    connection: int
    took_ns: int
    time_ns: int
    payload: bytes


def _walk(data: bytes, *, dropped: int) -> tuple[list[_Record], int, str]:
    """(the whole records in ``data``, the bytes they take, what cut the walk short or "")."""
    records: list[_Record] = []
    position = 0
    while position < len(data):
        if len(data) - position < _RECORD_HEAD.size:
            return (
                records,
                position,
                f"record at offset {FILE_HEADER_BYTES + position} is cut short",
            )
        length, kind, _, number, took_ns, time_ns = _RECORD_HEAD.unpack_from(data, position)
        if length == 0:
            if dropped:
                break  # the records that did not fit left their room unwritten
            return (
                records,
                position,
                (
                    f"record at offset {FILE_HEADER_BYTES + position} was never finished "
                    "(the process was stopped while writing it)"
                ),
            )
        if length < _RECORD_HEAD.size or length % 8 or position + length > len(data):
            damage = f"record at offset {FILE_HEADER_BYTES + position} has a bad length {length}"
            return records, position, damage
        payload = data[position + _RECORD_HEAD.size : position + length]
        records.append(_Record(kind, number, took_ns, time_ns, payload))
        position += length
    return records, position, ""


def _connection(record: _Record) -> TapConnection:
    family, side, local_port, peer_port, local, peer, _fd, _ = _CONNECTION.unpack_from(
        record.payload
    )
    return TapConnection(
        number=record.connection,
        server_side=side == 1,
        local=_address(family, local, local_port),
        peer=_address(family, peer, peer_port),
        opened_ns=record.time_ns,
    )


def read_tap_file(path: Path) -> TapFile:
    """Parse one record file.  CaptureError if it is not one (magic, version)."""
    (pid, parent, head, dropped), data = _read_records(path)
    connections: dict[int, TapConnection] = {}
    sends: dict[int, list[tuple[int, bytes]]] = {}
    began: dict[int, list[int]] = {}
    lost: set[int] = set()
    sent_bytes = skipped_bytes = 0
    records, _, damage = _walk(data, dropped=dropped)
    for record in records:
        number = record.connection
        if record.kind == _RECORD_SENT:
            sends.setdefault(number, []).append((record.time_ns, record.payload))
            began.setdefault(number, []).append(record.time_ns - record.took_ns)
            sent, skipped = _operation_bytes(record.payload)
            sent_bytes += sent
            skipped_bytes += skipped
        elif record.kind == _RECORD_CONNECTION:
            connections[number] = _connection(record)
        elif record.kind == _RECORD_LOST:
            lost.add(number)
        elif record.kind == _RECORD_CLOSED and number in connections:
            connections[number] = dataclasses.replace(connections[number], closed_ns=record.time_ns)
    return TapFile(
        path=path,
        pid=pid,
        parent_pid=parent,
        head_bytes=head,
        dropped_records=dropped,
        damage=damage,
        connections=tuple(connections.values()),
        sends={number: tuple(calls) for number, calls in sends.items()},
        lost=frozenset(lost),
        began={number: tuple(times) for number, times in began.items()},
        sent_bytes=sent_bytes,
        skipped_bytes=skipped_bytes,
    )


@dataclass
class _Growth:
    """What ``TapRecorder.activity`` has read of one record file so far."""

    offset: int = FILE_HEADER_BYTES
    local: dict[int, tuple[str, int]] = field(default_factory=dict)
    peer: dict[int, tuple[str, int]] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)

    def read_more(self, path: Path) -> None:
        """Read the records written since the last call (whole records only)."""
        try:
            with open(path, "rb") as handle:
                header = handle.read(FILE_HEADER_BYTES)
                if len(header) < _FILE_HEADER.size:
                    return
                _magic, _version, _pid, _parent, _head, capacity, end, dropped, _created = (
                    _FILE_HEADER.unpack_from(header)
                )
                handle.seek(self.offset)
                data = handle.read(max(0, min(end, capacity) - self.offset))
        except OSError:
            return
        records, used, _ = _walk(data, dropped=dropped)
        self.offset += used
        for record in records:
            if record.kind == _RECORD_CONNECTION:
                connection = _connection(record)
                self.local[record.connection] = connection.local
                self.peer[record.connection] = connection.peer
            elif record.kind == _RECORD_SENT:
                sent = self.sent.get(record.connection, 0)
                self.sent[record.connection] = sent + _operation_bytes(record.payload)[0]

    def between_processes(self) -> int:
        """Bytes sent on connections whose other end is not in this same process: a
        task's calls to itself (a coordination service's heartbeat, say) are not the
        job making progress."""
        own = set(self.local.values())
        return sum(n for c, n in self.sent.items() if self.peer.get(c) not in own)


def _operation_bytes(operations: bytes) -> tuple[int, int]:
    """(bytes sent, of which skipped) in one send call's operations."""
    total = skipped = position = 0
    end = len(operations)
    while position + 4 <= end:
        word = int.from_bytes(operations[position : position + 4], "little")
        position += 4
        if not word:
            break  # the record's padding
        count = word & _COUNT_MASK
        total += count
        if word & _SKIP_BIT:
            skipped += count
        else:
            position += (count + 3) & ~3
    return total, skipped


def replay_sends(follower: Http2Follower, sends: Iterable[tuple[int, bytes]]) -> None:
    """Show a follower what one side sent, as the library recorded it.

    FramingError if the bytes break HTTP/2 or gRPC framing, or if the library
    skipped bytes the follower needed (the two disagree on framing).
    """
    for time_ns, operations in sends:
        view = memoryview(operations)
        position = 0
        end = len(operations)
        while position + 4 <= end:
            word = int.from_bytes(view[position : position + 4], "little")
            position += 4
            if not word:
                break
            count = word & _COUNT_MASK
            if word & _SKIP_BIT:
                if count > follower.skippable:
                    raise FramingError(
                        f"the recorder skipped {count} bytes where the follower could skip "
                        f"only {follower.skippable}"
                    )
                follower.skip(count, time_ns)
            else:
                follower.feed(view[position : position + count], time_ns)
                position += (count + 3) & ~3


# --------------------------------------------------------------------------
# The recorder.


@dataclass(slots=True)
class _Side:
    file: TapFile
    connection: TapConnection


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
        self._growth: dict[Path, _Growth] = {}

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
        """Nothing to stop: the library lives and ends with each task."""

    def activity(self) -> int:
        """Bytes the tasks have sent to other processes so far, over every record file
        (read as the files grow: each call reads only the records written since the
        last).  A task talking to itself does not count, so a job whose tasks wait for a
        peer that never came shows no activity however often each calls itself."""
        total = 0
        for path in self.directory.glob("tap-*.bin"):
            growth = self._growth.setdefault(path, _Growth())
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


def shift_tap_file(tap: TapFile, offset_ns: int) -> TapFile:
    """``tap`` with every time moved by ``offset_ns`` (onto another clock)."""
    return dataclasses.replace(
        tap,
        connections=tuple(
            dataclasses.replace(
                c,
                opened_ns=c.opened_ns + offset_ns,
                closed_ns=c.closed_ns + offset_ns if c.closed_ns else 0,
            )
            for c in tap.connections
        ),
        sends={
            number: tuple((time_ns + offset_ns, operations) for time_ns, operations in sends)
            for number, sends in tap.sends.items()
        },
        began={number: tuple(t + offset_ns for t in times) for number, times in tap.began.items()},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionFrames:
    """The SETTINGS and PING frames each side of one connection sent, in order, and
    the files holding the sides (None: that side was not recorded)."""

    client_file: Path | None
    server_file: Path | None
    client: tuple[ControlFrame, ...]
    server: tuple[ControlFrame, ...]


def with_sends_at_their_start(tap: TapFile) -> TapFile:
    """``tap`` with every send timed when its call began, not when it returned.

    A frame in such a file was sent no earlier than its time, whatever the other
    hosts' clocks say: what ``assembly.clocks`` needs of the side that spoke first
    (a request, a PING, a SETTINGS frame).
    """
    sends = dict(tap.sends)
    for connection in tap.connections:
        number = connection.number
        if number not in sends:
            continue
        starts = tap.began.get(number, ())
        sends[number] = tuple(
            (starts[i] if i < len(starts) else time_ns, operations)
            for i, (time_ns, operations) in enumerate(sends[number])
        )
    return dataclasses.replace(tap, sends=sends)


def calls_of_files(
    files: Sequence[TapFile],
    *,
    callee_of: Callable[[TapFile | None, tuple[str, int]], str],
    caller_pid_of: Callable[[TapFile], int],
    errors: list[str],
    frames: list[ConnectionFrames] | None = None,
) -> list[RecordedCall]:
    """Every call recorded in ``files``, oldest first: both sides of each connection
    paired by their addresses, followed and folded into calls.

    ``callee_of(server_file, server_address)`` names the task serving a connection
    (``server_file`` is the file holding its server side, None if none does);
    ``caller_pid_of(file)`` is the caller pid of the connections whose client side
    ``file`` holds.  What could not be followed is appended to ``errors``;
    ``frames``, if given, gets every connection's SETTINGS and PING frames.
    """
    by_endpoints: dict[tuple[tuple[str, int], tuple[str, int]], list[list[_Side]]] = {}
    for tap in files:
        for connection in tap.connections:
            by_endpoints.setdefault(connection.endpoints, [[], []])[connection.server_side].append(
                _Side(tap, connection)
            )
    calls: list[RecordedCall] = []
    number = 0
    for (client_address, server_address), (clients, servers) in sorted(by_endpoints.items()):
        clients.sort(key=lambda side: side.connection.opened_ns)
        servers.sort(key=lambda side: side.connection.opened_ns)
        # The same address pair can come back after TIME_WAIT: pair in order.
        for index in range(max(len(clients), len(servers))):
            client = clients[index] if index < len(clients) else None
            server = servers[index] if index < len(servers) else None
            callee = callee_of(server.file if server else None, server_address)
            table = CallTable(callee=callee, connection=number)
            number += 1
            control = _follow_connection(
                table,
                client,
                server,
                f"connection {client_address[0]}:{client_address[1]} -> {callee}",
                errors,
            )
            if frames is not None:
                frames.append(
                    ConnectionFrames(
                        client_file=client.file.path if client else None,
                        server_file=server.file.path if server else None,
                        client=control[0],
                        server=control[1],
                    )
                )
            calls.extend(
                table.take(caller_pid=caller_pid_of(client.file) if client else None, final=True)
            )
    calls.sort(key=lambda call: call.start_ns)
    return calls


def _follow_connection(
    table: CallTable, client: _Side | None, server: _Side | None, label: str, errors: list[str]
) -> tuple[tuple[ControlFrame, ...], tuple[ControlFrame, ...]]:
    """Fold both recorded sides of one connection into ``table``; the SETTINGS and
    PING frames (client's, server's) it saw."""
    control: tuple[list[ControlFrame], list[ControlFrame]] = ([], [])
    if client is None:
        # The responses are here but not the requests: calls are lost.
        errors.append(f"{label}: its client side was not recorded")
    # A server side that never sent (it stopped first) loses nothing:
    # its calls are kept, incomplete.
    for side, client_side in ((client, True), (server, False)):
        if side is None:
            continue
        kind = "requests" if client_side else "responses"
        if side.connection.number in side.file.lost:
            errors.append(
                f"{label}: the recorder ran out of memory in pid {side.file.pid} "
                "and stopped recording this connection"
            )
        direction = Direction(client_side=client_side)
        follower = direction.new_follower(side.file.head_bytes)
        try:
            replay_sends(follower, side.file.sends.get(side.connection.number, ()))
        except FramingError as error:
            errors.append(f"{label} {kind}: {error}")
        control[not client_side].extend(e for e in direction.events if isinstance(e, ControlFrame))
        table.fold(direction)
        if direction.error:
            errors.append(f"{label} {kind}: {direction.error}")
    return tuple(control[0]), tuple(control[1])
