"""The in-process recorder's record files: what they hold, and the one place they are read.

The library (``wiretap.c``) writes one file per process, ``tap-<pid>.bin``: a
header (pid, parent pid, head bytes, records dropped), then one record per
connection it follows (the two addresses, client or server side), per send
call on one (its time, how long it took, and its bytes as "feed these" and
"skip this many" operations), per connection closed, and per connection whose
later sends it could not record.  ``read_tap_file`` reads a whole file into a
``TapFile``; ``TapFileGrowth`` reads one as it grows, for
``wiretap.TapRecorder.activity``; ``trim_record_files`` cuts the files of
ended processes to their records (``profiler/record.py``, ``TapRecorder.stop``).
``shift_tap_file`` moves a file's times onto another clock and
``with_sends_at_their_start`` times each send when its call began, for the
records of tasks on several hosts (``profiler/assemble.py``).

Record file layout: see ``wiretap.c``; it is read only here
(``read_tap_file``, ``TapFileGrowth``).  Version history: 1 (2026-11-29) first version; 2
(2026-12-01) a SENT record says how long its send call took (``took_ns``, 0 in
version 1), so a peer on another host's clock can be bounded by when the send
began (``TapFile.began``); version 1 files are still read.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from tf_grpc_bench.errors import CaptureError

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
#: A SENT record's operation word: skip (else feed) and its byte count (see wiretap.c).
SKIP_BIT = 0x80000000
COUNT_MASK = 0x7FFFFFFF
_AF_INET = 2


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


@dataclass(frozen=True, slots=True)
class _Header:
    """A record file's header (see ``wiretap.c``)."""

    magic: bytes
    version: int
    pid: int
    parent: int
    head: int
    capacity: int
    end: int  # the end of the records reserved (a record left unfinished included)
    dropped: int

    @property
    def records_end(self) -> int:
        """Where the records end: the reserved end, within the file's capacity."""
        return min(self.end, self.capacity)


def _read_header(handle: BinaryIO) -> _Header | None:
    """The header at the start of an open record file; None if the file is shorter."""
    raw = handle.read(FILE_HEADER_BYTES)
    if len(raw) < _FILE_HEADER.size:
        return None
    return _Header(*_FILE_HEADER.unpack_from(raw)[:8])  # all but the creation time


def _read_records(path: Path) -> tuple[tuple[int, int, int, int], bytes]:
    """((pid, parent pid, head bytes, dropped records), the records) of a record file."""
    try:
        with open(path, "rb") as handle:
            header = _read_header(handle)
            if header is None:
                raise CaptureError(f"{path}: too short for a recorder file header")
            if header.magic != FILE_MAGIC:
                raise CaptureError(f"{path}: not an in-process recorder file (bad magic)")
            if header.version not in READABLE_FILE_VERSIONS:
                raise CaptureError(
                    f"{path}: recorder file version {header.version}; this tool reads "
                    f"{', '.join(map(str, sorted(READABLE_FILE_VERSIONS)))}"
                )
            data = handle.read(max(0, header.records_end - FILE_HEADER_BYTES))
    except OSError as error:
        raise CaptureError(f"{path}: {error.strerror}") from None
    return (header.pid, header.parent, header.head, header.dropped), data


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
class TapFileGrowth:
    """What ``TapRecorder.activity`` has read of one record file so far."""

    offset: int = FILE_HEADER_BYTES
    local: dict[int, tuple[str, int]] = field(default_factory=dict)
    peer: dict[int, tuple[str, int]] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)

    def read_more(self, path: Path) -> None:
        """Read the records written since the last call (whole records only)."""
        try:
            with open(path, "rb") as handle:
                header = _read_header(handle)
                if header is None:
                    return
                handle.seek(self.offset)
                data = handle.read(max(0, header.records_end - self.offset))
        except OSError:
            return
        records, used, _ = _walk(data, dropped=header.dropped)
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


def _mapped_record_inodes() -> set[int]:
    """Inodes of the record files (``tap-*``) some process on this host has mapped now.

    Read from every ``/proc/<pid>/maps``, which also lists the processes of child pid
    namespaces (a task's container); a process whose map cannot be read is not ours.
    """
    inodes: set[int] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if "/tap-" in line:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[4].isdigit():
                    inodes.add(int(fields[4]))
    return inodes


def trim_record_files(directory: Path) -> list[Path]:
    """Cut every record file in ``directory`` that no process maps any more to the
    records it holds; the files cut.

    The library makes each file its whole capacity long (1 GiB, sparse) and
    maps it; once its process has ended, only the header's end holds records.
    Sparse files stay sparse on a local disk but not through ``scp``, ``tar``
    without ``-S`` or most copies: cut, a task folder copies as the size of its
    records.  A file some process still maps (a child the command left running)
    is left whole: cutting it would fault that process's next record.  Files
    that are not record files are left to ``read_tap_file`` to refuse.
    """
    paths = sorted(directory.glob("tap-*.bin"))
    if not paths:
        return []
    mapped = _mapped_record_inodes()
    trimmed = []
    for path in paths:
        try:
            with open(path, "r+b") as handle:
                header = _read_header(handle)
                if header is None or header.magic != FILE_MAGIC:
                    continue
                status = os.fstat(handle.fileno())
                length = max(FILE_HEADER_BYTES, header.records_end)
                if status.st_ino in mapped or status.st_size <= length:
                    continue
                handle.truncate(length)
        except OSError:
            continue
        trimmed.append(path)
    return trimmed


def _operation_bytes(operations: bytes) -> tuple[int, int]:
    """(bytes sent, of which skipped) in one send call's operations."""
    total = skipped = position = 0
    end = len(operations)
    while position + 4 <= end:
        word = int.from_bytes(operations[position : position + 4], "little")
        position += 4
        if not word:
            break  # the record's padding
        count = word & COUNT_MASK
        total += count
        if word & SKIP_BIT:
            skipped += count
        else:
            position += (count + 3) & ~3
    return total, skipped


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
