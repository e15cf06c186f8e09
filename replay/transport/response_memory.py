"""The memory a replay server lets large responses take, shared among its clients.

A pull says how large its response is; the server makes it only when the
memory this process may still take (``host.memory_room``: its memory cgroup's
limit where it runs in one, a container's or a Slurm job's, else the machine's
``MemAvailable``) has room for it and its copies, less what the large responses
still being sent hold.  Those are counted until their calls end, because the
kernel counts a response's memory only as gRPC copies it, after the handler
has returned: a second pull checked in between would see the memory as free.

One client (one connection) holds at most half of that memory while another
of its responses is in flight, so a client that asks for many large responses
at once, or reads them slowly, leaves room for the others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tf_grpc_bench.host import MemoryRoom, memory_room

#: Responses at least this large are checked against the memory room before they are
#: made (smaller ones are served from what the server keeps made).
MEMORY_CHECKED_BYTES = 64 * 1024 * 1024
#: Copies of a response a server holds at once: the response's bytes and gRPC's copy.
RESPONSE_COPIES = 2


class Refused(Exception):
    """A response the memory cannot take: a sentence for the client."""


class ResponseMemory:
    """The memory held by large responses in flight, per client.  Thread-safe.

    ``room`` reads the memory this process may still take (``host.memory_room``).
    """

    def __init__(self, room: Callable[[], MemoryRoom | None] = memory_room) -> None:
        self._room = room
        self._lock = threading.Lock()
        self._held = 0
        self._by_client: dict[str, int] = {}

    @property
    def held_bytes(self) -> int:
        return self._held

    def reserve(self, content_bytes: int, client: str) -> int:
        """Hold the memory a response of ``content_bytes`` takes, for ``client``; the
        bytes held, to ``release`` when the call has ended.  ``Refused`` saying why not."""
        needed = RESPONSE_COPIES * content_bytes
        with self._lock:
            room = self._room()
            if room is not None:
                self._check(content_bytes, needed, client, room)
            self._held += needed
            self._by_client[client] = self._by_client.get(client, 0) + needed
        return needed

    def _check(self, content_bytes: int, needed: int, client: str, room: MemoryRoom) -> None:
        spare = room.available_bytes - self._held
        held = f", less {self._held} B held by responses still being sent" if self._held else ""
        if needed > spare:
            raise Refused(
                f"a response of {content_bytes} B needs about {needed} B of memory here (it and "
                f"gRPC's copy); this server has {max(spare, 0)} B to spare "
                f"({room.available_bytes} B free to it, bounded by {room.bound}{held})"
            )
        mine = self._by_client.get(client, 0)
        share = (spare + self._held) // 2
        if mine and mine + needed > share:
            raise Refused(
                f"this client already has responses holding {mine} B in flight here; one "
                f"client holds at most half of the {spare + self._held} B this server has "
                f"for responses ({room.bound}) while another of its responses is sent"
            )

    def release(self, client: str, held_bytes: int) -> None:
        """A response's call has ended: its memory is free again."""
        with self._lock:
            self._held -= held_bytes
            left = self._by_client.pop(client, 0) - held_bytes
            if left > 0:
                self._by_client[client] = left
