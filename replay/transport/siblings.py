"""One ps served by several processes behind one address, counted as one server.

``serve --procs-per-server K`` (and a replay's own servers with
``--procs-per-server K``) starts K server processes that bind the same port
with ``SO_REUSEPORT`` (grpcio's ``grpc.so_reuseport`` option, which replay
servers otherwise turn off): the kernel hands each new TCP connection to one
of them.  Each process also listens on a port of its own for its siblings.  A
client's ``Stats`` or ``Reset`` lands on one of the K; that process asks its
siblings (on their own ports, the call marked with ``SIBLING_METADATA`` so
that they answer for themselves only) and answers with the K processes'
counts merged: one server's statistics, whichever process answered.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import grpc

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.transport.wire import (
    SESSION_METADATA,
    TOKEN_METADATA,
    ServerStats,
    identity,
)

#: Marks a control call from a sibling process: answer for this process only.
SIBLING_METADATA = "tfgb-sibling"
#: How long a process waits for a sibling's statistics.
SIBLING_TIMEOUT_S = 10.0


def merge_stats(own: ServerStats, others: Sequence[ServerStats]) -> ServerStats:
    """The counts of one server's processes as one server's (``own`` answered the call)."""
    every = [own, *others]
    per_method: dict[str, list[int]] = {}
    for stats in every:
        for method, (messages, size) in stats.per_method.items():
            entry = per_method.setdefault(method, [0, 0])
            entry[0] += messages
            entry[1] += size
    return ServerStats(
        mode=own.mode,
        received_bytes=sum(s.received_bytes for s in every),
        received_messages=sum(s.received_messages for s in every),
        sent_bytes=sum(s.sent_bytes for s in every),
        sent_messages=sum(s.sent_messages for s in every),
        cpu_ns=sum(s.cpu_ns for s in every),
        wall_ns=max(s.wall_ns for s in every),
        pid=own.pid,
        address=own.address,
        per_method=per_method,
        session=own.session,
        other_sessions=max(s.other_sessions for s in every),
        processes=len(every),
        received_messages_per_process=[s.received_messages for s in every],
    )


class Siblings:
    """The other processes serving the same address, reached on their own ports.

    Thread-safe (handlers call it from gRPC's threads).
    """

    def __init__(self, addresses: Sequence[str], *, control_token: str | None) -> None:
        self.addresses = tuple(addresses)
        self._token = control_token
        self._lock = threading.Lock()
        self._channels: list[grpc.Channel] = []

    def _calls(self, method: str) -> list[grpc.UnaryUnaryMultiCallable[bytes, bytes]]:
        with self._lock:
            if not self._channels:
                self._channels = [grpc.insecure_channel(a) for a in self.addresses]
            channels = list(self._channels)
        return [
            channel.unary_unary(method, request_serializer=identity, response_deserializer=identity)
            for channel in channels
        ]

    def call(self, method: str, session: str) -> list[bytes]:
        """``method`` (a control call) on every sibling for ``session``; their answers.

        ``TransportError`` naming the sibling that did not answer.
        """
        pairs: list[tuple[str, str | bytes]] = [(SIBLING_METADATA, "1")]
        if session:
            pairs.append((SESSION_METADATA, session))
        if self._token is not None:
            pairs.append((TOKEN_METADATA, self._token))
        metadata = tuple(pairs)
        answers = []
        for address, call in zip(self.addresses, self._calls(method), strict=True):
            try:
                answers.append(call(b"", timeout=SIBLING_TIMEOUT_S, metadata=metadata))
            except grpc.RpcError as error:
                raise TransportError(
                    f"server process at {address} (same port) did not answer {method}: "
                    f"{error.code().name}"
                ) from None
        return answers

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels = []
