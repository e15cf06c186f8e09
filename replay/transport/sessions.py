"""The client sessions a replay server counts apart (``wire.SESSION_METADATA``).

Every call names its session in its metadata; ``Stats``/``Reset`` read and
reset only the caller's own, so clients sharing a server neither see nor clear
each other's figures.  Calls naming none share the default session "".

A shared server's clients may not play fair, so the table is bounded three ways:

- at most ``limit`` sessions at once (``ServerSettings.max_sessions``);
- at most ``PER_CLIENT_LIMIT`` of them made by one client, a client being one
  connection (its peer address, as gRPC gives it): a client inventing session
  ids is refused once it has made that many, and the others keep their room;
- a session whose client has gone is dropped when a new one needs its room:
  each session remembers the connections it was made on and made control calls
  on, and is gone once none of them is still established (the kernel's TCP
  table, which the server's keepalive pings keep true of peers that vanished).
  Payload calls are not looked at one by one, so a client whose connection
  broke and came back counts its calls in a new session until its next
  control call.  A session made by a call another process serving the address
  passed on, that counted nothing here, is gone ``SESSION_RECENT_NS`` after
  its last control call; one whose connections cannot be checked (no TCP
  table) after ``SESSION_IDLE_NS`` without calls.
"""

from __future__ import annotations

import ipaddress
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from tf_grpc_bench.replay.transport.wire import Counters


def cpu_ns() -> int:
    """This process's CPU time (ns)."""
    return time.process_time_ns()


#: A session whose connections cannot be checked, with no call and no control call
#: for this long, may be dropped to make room for a new one when the table is full.
SESSION_IDLE_NS = 600 * 1_000_000_000
#: A session with no connection of its own and no counts (made by a control call
#: another process serving the address passed on) is kept this long after its last one.
SESSION_RECENT_NS = 5 * 1_000_000_000
#: Sessions one client (connection) may have made and the server still keeps.
PER_CLIENT_LIMIT = 16
#: Connections remembered per session (the latest replace the oldest).
MAX_SESSION_PEERS = 8
#: A TCP peer as gRPC names it, e.g. ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``.
Peer = str
#: An established TCP connection's remote end: (address, port).
Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


class Session:
    """One client session's counts since its last reset (the default session "" is
    every call that names none).  ``handlers`` caches its method handlers."""

    def __init__(self, session_id: str, peer: Peer | None = None) -> None:
        self.id = session_id
        self.counters = Counters()
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self.created_ns = time.monotonic_ns()
        self.control_ns = self.created_ns
        self.reset_wall_ns = self.created_ns
        self.reset_cpu_ns = cpu_ns()
        #: Received (bytes, messages) counted before the last reset.
        self.earlier = (0, 0)
        #: The client that made it (None: this process, or a call naming no peer).
        self.maker = peer
        #: Connections it was used on (see ``Sessions.touch``), oldest first.
        self.peers: list[Peer] = [] if peer is None else [peer]

    @property
    def active_ns(self) -> int:
        """When the session last made a call or a control call (monotonic ns)."""
        return max(self.counters.last_call_ns, self.control_ns)

    def received(self) -> tuple[int, int]:
        """Bytes and messages received over the session's life."""
        counters = self.counters
        return (
            self.earlier[0] + counters.received_bytes,
            self.earlier[1] + counters.received_messages,
        )

    def reset(self) -> None:
        self.earlier = self.received()
        self.counters.reset()
        self.reset_wall_ns = time.monotonic_ns()
        self.reset_cpu_ns = cpu_ns()


class Refusal(Exception):
    """Why a new session was not made: a sentence for the client."""


class Sessions:
    """The sessions a server counts apart, at most ``limit`` at once (see the module).

    Thread-safe.  ``connections`` returns the remote ends of the established TCP
    connections (None where that cannot be known); it is read only when the table
    is full.
    """

    def __init__(
        self,
        limit: int,
        *,
        connections: Callable[[], frozenset[Endpoint] | None] | None = None,
    ) -> None:
        self.limit = limit
        self._by_id: dict[str, Session] = {"": Session("")}
        self._lock = threading.Lock()
        self._connections = connections or established_connections
        #: Sessions kept per client that made them.
        self._made_by: dict[Peer, int] = {}
        #: Received (bytes, messages) of sessions dropped.
        self._dropped = (0, 0)

    def get(self, session_id: str, peer: Peer | None = None) -> Session:
        """The session named ``session_id`` (a valid name: ``SESSION_ID``), made if new
        for the client at ``peer`` (None: this process); ``Refusal`` saying why not."""
        session = self._by_id.get(session_id)
        if session is not None:
            return session
        with self._lock:
            session = self._by_id.get(session_id)
            if session is not None:
                return session
            if peer is not None and self._made_by.get(peer, 0) >= PER_CLIENT_LIMIT:
                raise Refusal(
                    f"this client (connection {peer}) has made {PER_CLIENT_LIMIT} sessions "
                    f"this server still keeps, at most {PER_CLIENT_LIMIT} per client; "
                    "name one of them, or end the connection"
                )
            if not self._make_room():
                raise Refusal(
                    f"this server keeps at most {self.limit} client sessions at once and "
                    "all belong to clients still connected; try again when one leaves"
                )
            session = self._by_id[session_id] = Session(session_id, peer)
            if peer is not None:
                self._made_by[peer] = self._made_by.get(peer, 0) + 1
            return session

    def touch(self, session: Session, peer: Peer | None) -> None:
        """``session`` was used on the connection ``peer``: it lives while that does."""
        session.control_ns = time.monotonic_ns()
        if peer is None or peer in session.peers or not session.id:
            return
        with self._lock:
            session.peers = [*session.peers[-(MAX_SESSION_PEERS - 1) :], peer]

    def _make_room(self) -> bool:
        """Drop sessions whose clients have gone if the table is full; whether there is
        room now (hold the lock)."""
        if len(self._by_id) < self.limit + 1:  # the default session is not counted
            return True
        established = self._connections()
        now = time.monotonic_ns()
        for session_id, session in list(self._by_id.items()):
            if session_id and _gone(session, established, now):
                self._drop(session)
        return len(self._by_id) < self.limit + 1

    def _drop(self, session: Session) -> None:
        received = session.received()
        self._dropped = (self._dropped[0] + received[0], self._dropped[1] + received[1])
        del self._by_id[session.id]
        if session.maker is not None:
            left = self._made_by.pop(session.maker) - 1
            if left:
                self._made_by[session.maker] = left

    def known(self, session_id: str) -> Session | None:
        """The session named ``session_id`` if the server has it (per call: a lookup only)."""
        return self._by_id.get(session_id)

    def active_since(self, since_ns: int, *, besides: Session) -> int:
        """How many other sessions made calls at or after ``since_ns``."""
        sessions = list(self._by_id.values())
        return sum(1 for s in sessions if s is not besides and s.counters.last_call_ns >= since_ns)

    def received(self) -> tuple[int, int]:
        """Bytes and messages received by every session, over the server's life."""
        totals = [session.received() for session in list(self._by_id.values())]
        return (
            self._dropped[0] + sum(t[0] for t in totals),
            self._dropped[1] + sum(t[1] for t in totals),
        )

    def all(self) -> list[Session]:
        return list(self._by_id.values())


def _gone(session: Session, established: frozenset[Endpoint] | None, now_ns: int) -> bool:
    """Whether ``session``'s client has left (at monotonic ``now_ns``).

    Gone: none of its connections is established; or it never had one, counted
    nothing (what another process serving the address passes on) and made no
    control call for ``SESSION_RECENT_NS``; where connections cannot be checked,
    idle for ``SESSION_IDLE_NS``.
    """
    idle_ns = now_ns - session.active_ns
    endpoints = [tcp_endpoint(peer) for peer in session.peers]
    if not endpoints and session.received() == (0, 0):
        return idle_ns > SESSION_RECENT_NS
    if established is None or not endpoints or None in endpoints:
        return idle_ns > SESSION_IDLE_NS
    return not any(endpoint in established for endpoint in endpoints)


def tcp_endpoint(peer: Peer) -> Endpoint | None:
    """(address, port) of a gRPC peer name over TCP; None for any other (``unix:``...)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return None
    if not port.isdigit():
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return (address.ipv4_mapped, int(port))
    return (address, int(port))


#: ``st`` of an established connection in ``/proc/net/tcp``.
_ESTABLISHED = "01"


def established_connections(
    tables: Iterable[Path] = (Path("/proc/self/net/tcp"), Path("/proc/self/net/tcp6")),
) -> frozenset[Endpoint] | None:
    """The remote ends of this network namespace's established TCP connections; None
    where the kernel does not list them (not Linux)."""
    found: set[Endpoint] = set()
    readable = False
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _ESTABLISHED:
                endpoint = _proc_endpoint(fields[2])
                if endpoint is not None:
                    found.add(endpoint)
    return frozenset(found) if readable else None


def _proc_endpoint(text: str) -> Endpoint | None:
    """``0100007F:1F90`` (address as the kernel's 32-bit words in host order) -> endpoint."""
    address_hex, _, port_hex = text.partition(":")
    try:
        raw = bytes.fromhex(address_hex)
        port = int(port_hex, 16)
    except ValueError:
        return None
    # Each 32-bit word is printed as an integer of this machine's byte order.
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    data = raw
    if len(data) == 4:
        return (ipaddress.IPv4Address(data), port)
    if len(data) == 16:
        address = ipaddress.IPv6Address(data)
        return (address.ipv4_mapped or address, port)
    return None
