"""The client sessions a replay server counts apart (``wire.SESSION_METADATA``).

Every call names its session in its metadata; ``Stats``/``Reset`` read and
reset only the caller's own, so clients sharing a server neither see nor clear
each other's figures.  Calls naming none share the default session "".
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

from tf_grpc_bench.replay.transport.wire import Counters


def cpu_ns() -> int:
    """This process's CPU time (ns)."""
    return time.process_time_ns()


#: A session with no call and no control call for this long may be dropped to
#: make room for a new one when the server holds ``max_sessions``.
SESSION_IDLE_NS = 600 * 1_000_000_000


class Session:
    """One client session's counts since its last reset (the default session "" is
    every call that names none).  ``handlers`` caches its method handlers."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.counters = Counters()
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self.created_ns = time.monotonic_ns()
        self.control_ns = self.created_ns
        self.reset_wall_ns = self.created_ns
        self.reset_cpu_ns = cpu_ns()
        #: Received (bytes, messages) counted before the last reset.
        self.earlier = (0, 0)

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


class Sessions:
    """The sessions a server counts apart, at most ``limit`` at once.

    Thread-safe.  A new session takes the place of one idle for
    ``SESSION_IDLE_NS`` when there is no room; with none idle it is refused
    (``get`` returns None), so clients inventing sessions cannot grow the
    server or drop the sessions of clients still at work.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._by_id: dict[str, Session] = {"": Session("")}
        self._lock = threading.Lock()
        #: Received (bytes, messages) of sessions dropped.
        self._dropped = (0, 0)

    def get(self, session_id: str) -> Session | None:
        """The session named ``session_id`` (a valid name: ``SESSION_ID``), made if
        new and there is room; None if there is none."""
        session = self._by_id.get(session_id)
        if session is not None:
            return session
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None and self._make_room():
                session = self._by_id[session_id] = Session(session_id)
            return session

    def _make_room(self) -> bool:
        """Drop idle sessions if the table is full; whether there is room now (hold the lock)."""
        if len(self._by_id) < self.limit + 1:  # the default session is not counted
            return True
        idle_before = time.monotonic_ns() - SESSION_IDLE_NS
        for session_id, session in list(self._by_id.items()):
            if session_id and session.active_ns < idle_before:
                received = session.received()
                self._dropped = (self._dropped[0] + received[0], self._dropped[1] + received[1])
                del self._by_id[session_id]
        return len(self._by_id) < self.limit + 1

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
