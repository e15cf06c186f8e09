"""Calls from the in-process recorder's files: each connection's two sides, paired and followed.

Every task sends its own bytes, so the requests of a connection are in its
client's record file and the responses in its server's.  ``calls_of_files``
pairs the two sides of each connection by their addresses and replays each
side (``replay_sends``) through the same ``http2.Http2Follower`` and
``calls.CallTable`` as the proxy: the parsing is the proxy's, only the
transport differs.  Who called and who was called, ``calls_of_files`` asks of
its caller (``caller_pid_of``, ``callee_of``): ``wiretap.TapRecorder`` for the
files of one machine, ``profiler/assemble.py`` for those of tasks recorded on
several hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tf_grpc_bench.profiler.recorders.calls import CallTable, Direction, RecordedCall
from tf_grpc_bench.profiler.recorders.http2 import ControlFrame, FramingError, Http2Follower
from tf_grpc_bench.profiler.recorders.tapfile import COUNT_MASK, SKIP_BIT, TapConnection, TapFile


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
            count = word & COUNT_MASK
            if word & SKIP_BIT:
                if count > follower.skippable:
                    raise FramingError(
                        f"the recorder skipped {count} bytes where the follower could skip "
                        f"only {follower.skippable}"
                    )
                follower.skip(count, time_ns)
            else:
                follower.feed(view[position : position + count], time_ns)
                position += (count + 3) & ~3


@dataclass(slots=True)
class _Side:
    file: TapFile
    connection: TapConnection


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionFrames:
    """The SETTINGS and PING frames each side of one connection sent, in order, and
    the files holding the sides (None: that side was not recorded)."""

    client_file: Path | None
    server_file: Path | None
    client: tuple[ControlFrame, ...]
    server: tuple[ControlFrame, ...]


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
