"""A transparent TCP proxy that records every gRPC call passing through it.

One ``RecordingProxy`` stands in front of one TensorFlow task (the *callee*):
peers dial the proxy, the proxy dials the task.  Each accepted connection gets
two forwarding threads, one per direction, on blocking sockets with
``TCP_NODELAY``.  Recording never delays forwarding:

* a chunk is forwarded first, then shown to that direction's
  ``http2.Http2Follower``, which reads frame headers, header blocks, gRPC
  message prefixes and the first ``head_bytes`` of each message;
* the bytes the follower does not need (the bulk of every tensor) are moved
  from socket to socket with ``os.splice`` through a pipe, never copied into
  Python;
* the follower only appends small events to a list; HPACK decoding, stream
  bookkeeping and building ``RecordedCall`` records happen when ``collect`` is
  called, after (or between) the training steps, on the caller's thread.

Which process made a call: a connection arrives from an ephemeral port; the
socket's inode in ``/proc/net/tcp`` (or ``tcp6``), found by that port pair, is
looked up among the ``/proc/<pid>/fd`` links of the candidate processes (the
training tasks, given by ``owner_pids``) and then of every process; the first
candidate that is the owner or an ancestor of the owner names the caller.
Done once per connection, right after accept, while the socket exists.

Times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC, comparable with other
processes on the same machine) taken when the bytes were received.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tf_grpc_bench.errors import ServeError
from tf_grpc_bench.host import process_stat_fields
from tf_grpc_bench.profiler.recorders.calls import CallTable, Direction, RecordedCall
from tf_grpc_bench.profiler.recorders.http2 import MESSAGE_HEAD_BYTES, FramingError

#: Largest read into Python at once (frame headers, header blocks, small messages).
RECV_BYTES = 1 << 16
#: Below this many skippable bytes, copying beats two splice calls.
SPLICE_MIN_BYTES = 1 << 14
#: Pipe capacity asked for (Linux caps it at /proc/sys/fs/pipe-max-size).
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
#: splice(2) errors that mean "not supported here" rather than a broken connection.
_NO_SPLICE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
#: TCP congestion control of the proxy's own sockets.  Measured on loopback
#: (bench/README.md, "Capture overhead"): with the machine's default, BBR,
#: whose pacing suits real links, ResNet-50 steps through the proxy took
#: longer than with cubic for the same CPU.  Falls back to the system's
#: default where cubic is not available.
DEFAULT_CONGESTION_CONTROL = "cubic"
#: How long to keep retrying the callee while it is not listening yet.
UPSTREAM_CONNECT_TIMEOUT_S = 30.0


@dataclass(slots=True)
class _Direction(Direction):
    """One direction of a connection: its events (``Direction``) and forwarding counters."""

    forwarded_bytes: int = 0
    spliced_bytes: int = 0
    splices: int = 0
    receives: int = 0
    error: str = ""
    done: bool = False


class _Connection:
    """An accepted connection, its upstream, and the calls assembled from it."""

    def __init__(
        self, number: int, client: socket.socket, peer: tuple[str, int], *, callee: str
    ) -> None:
        self.number = number
        self.client = client
        self.upstream: socket.socket | None = None
        self.peer = peer
        self.caller_pid: int | None = None
        self.opened_ns = time.monotonic_ns()
        self.requests = _Direction(client_side=True)
        self.responses = _Direction(client_side=False)
        self.table = CallTable(callee=callee, connection=number)
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.upstream):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()


OwnerPids = Callable[[], Iterable[int]]


class RecordingProxy:
    """Forward ``listen_host:listen_port`` to ``target`` and record the gRPC calls.

    The listening socket is bound on construction (``ServeError`` if the port
    is taken), so ``address`` is known before ``start``.  ``callee`` names the
    task behind the proxy in records.  ``owner_pids`` returns the pids of the
    processes that may dial the proxy (see the module docstring).  A client
    that connects before the callee listens is held for up to
    ``connect_timeout_s`` while the proxy retries, then disconnected.
    ``use_splice`` false copies every byte through Python, ``follow`` false
    forwards without recording anything (both for measuring the proxy);
    ``congestion_control`` is the TCP congestion control of the proxy's
    sockets (None: the system's default).

    Thread-safety: ``start``, ``stop`` and ``collect`` may be called from any
    one controlling thread; the forwarding threads are the proxy's own.
    """

    def __init__(
        self,
        *,
        target: tuple[str, int],
        callee: str,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        owner_pids: OwnerPids | None = None,
        head_bytes: int = MESSAGE_HEAD_BYTES,
        use_splice: bool = True,
        follow: bool = True,
        congestion_control: str | None = DEFAULT_CONGESTION_CONTROL,
        connect_timeout_s: float = UPSTREAM_CONNECT_TIMEOUT_S,
    ) -> None:
        self.target = target
        self._follow = follow
        self._congestion_control = congestion_control
        self._connect_timeout_s = connect_timeout_s
        self.callee = callee
        self._owner_pids = owner_pids
        self._head_bytes = head_bytes
        self._use_splice = use_splice and hasattr(os, "splice")
        family = socket.AF_INET6 if ":" in listen_host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((listen_host, listen_port))
            listener.listen(128)
        except OSError as error:
            listener.close()
            if error.errno == errno.EADDRINUSE:
                raise ServeError(
                    f"proxy for {callee}: port {listen_port} on {listen_host} is already in use"
                ) from None
            raise ServeError(
                f"proxy for {callee}: cannot listen on {listen_host}:{listen_port}: "
                f"{error.strerror}"
            ) from None
        self._listener = listener
        self.listen_host = listen_host
        self.port: int = listener.getsockname()[1]
        self._connections: list[_Connection] = []
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.started_ns = 0

    @property
    def address(self) -> str:
        """``host:port`` peers should dial."""
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start accepting connections (returns at once)."""
        if self._accept_thread is not None:
            raise RuntimeError("proxy already started")
        self.started_ns = time.monotonic_ns()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"proxy-{self.callee}", daemon=True
        )
        self._accept_thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every connection, wait for the threads.  Idempotent."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout_s)
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close()
        deadline = time.monotonic() + timeout_s
        for connection in connections:
            for thread in connection.threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> RecordingProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- forwarding --------------------------------------------------------

    def _accept_loop(self) -> None:
        number = 0
        while not self._stopping.is_set():
            try:
                client, peer = self._listener.accept()
            except OSError:
                return
            connection = _Connection(number, client, peer[:2], callee=self.callee)
            number += 1
            with self._lock:
                self._connections.append(connection)
            thread = threading.Thread(
                target=self._serve_connection,
                args=(connection,),
                name=f"proxy-{self.callee}-{connection.number}",
                daemon=True,
            )
            connection.threads.append(thread)
            thread.start()

    def _connect_upstream(self) -> socket.socket | None:
        deadline = time.monotonic() + self._connect_timeout_s
        delay = 0.01
        while not self._stopping.is_set():
            try:
                return socket.create_connection(self.target, timeout=5)
            except OSError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        return None

    def _serve_connection(self, connection: _Connection) -> None:
        """Find the caller, connect upstream, start both pumps.

        The caller is looked up first, while its socket surely exists: nothing
        can cross before the pumps run, so a short call cannot end (and its
        client exit) first.  It costs the connection's first bytes a few ms.
        """
        try:
            self._open(connection)
        except OSError:
            connection.close()  # the client went away, or the callee refused
        except Exception as error:
            # A bug: never leave the client hanging on a connection nobody serves.
            connection.close()
            with self._lock:
                self._errors.append(f"{self.callee} connection {connection.number}: {error!r}")
            raise

    def _open(self, connection: _Connection) -> None:
        client = connection.client
        if self._owner_pids is not None:
            connection.caller_pid = find_socket_owner(
                connection.peer, client.getsockname()[:2], candidates=list(self._owner_pids())
            )
        upstream = self._connect_upstream()
        if upstream is None:
            connection.close()
            return
        upstream.settimeout(None)
        connection.upstream = upstream
        for sock in (client, upstream):
            tune_socket(sock, congestion_control=self._congestion_control)
        for direction, source, sink in (
            (connection.requests, client, upstream),
            (connection.responses, upstream, client),
        ):
            direction.new_follower(self._head_bytes)
            thread = threading.Thread(
                target=self._pump,
                args=(connection, direction, source, sink),
                name=f"proxy-{self.callee}-{connection.number}-"
                + ("req" if direction.client_side else "resp"),
                daemon=True,
            )
            connection.threads.append(thread)
            thread.start()

    def _pump(
        self,
        connection: _Connection,
        direction: _Direction,
        source: socket.socket,
        sink: socket.socket,
    ) -> None:
        follower = direction.follower
        assert follower is not None
        clock = time.monotonic_ns
        buffer = bytearray(RECV_BYTES)
        view = memoryview(buffer)
        pipe = _open_pipe() if self._use_splice else None
        following = self._follow
        source_fd, sink_fd = source.fileno(), sink.fileno()
        try:
            while True:
                skippable = follower.skippable if following else PIPE_BYTES
                if pipe is not None and skippable >= SPLICE_MIN_BYTES:
                    read_end, write_end, capacity = pipe
                    try:
                        moved = os.splice(source_fd, write_end, min(skippable, capacity))
                    except OSError as error:
                        if error.errno not in _NO_SPLICE or direction.spliced_bytes:
                            raise
                        # This kernel or socket cannot splice: copy instead.
                        os.close(read_end)
                        os.close(write_end)
                        pipe = None
                        continue
                    if not moved:
                        break
                    now = clock()
                    left = moved
                    while left:
                        left -= os.splice(read_end, sink_fd, left)
                    direction.forwarded_bytes += moved
                    direction.spliced_bytes += moved
                    direction.splices += 1
                    if following:
                        follower.skip(moved, now)
                else:
                    received = source.recv_into(buffer)
                    if not received:
                        break
                    now = clock()
                    sink.sendall(view[:received])
                    direction.forwarded_bytes += received
                    direction.receives += 1
                    if following:
                        try:
                            follower.feed(view[:received], now)
                        except FramingError as error:
                            # Keep forwarding; this direction's calls are lost.
                            following = False
                            direction.error = str(error)
        except OSError:
            pass  # reset by a peer or closed by stop(): the other pump ends too
        finally:
            direction.done = True
            if pipe is not None:
                os.close(pipe[0])
                os.close(pipe[1])
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            if connection.requests.done and connection.responses.done:
                connection.close()

    # -- recording ---------------------------------------------------------

    def collect(self, *, final: bool = False) -> list[RecordedCall]:
        """Calls that finished since the last ``collect``, oldest first.

        ``final`` also returns the calls still open (``complete`` false), for
        use after ``stop``.  Decodes header blocks and assembles calls, then
        drops the events it used (the forwarding threads only append events,
        so memory grows with the traffic until this runs); call it from one
        thread at a time.
        """
        with self._lock:
            connections = list(self._connections)
        finished: list[RecordedCall] = []
        for connection in connections:
            finished.extend(self._assemble(connection, final=final))
        finished.sort(key=lambda call: call.start_ns)
        return finished

    def follower_errors(self) -> list[str]:
        """One line per connection direction where framing could not be followed,
        and per connection the proxy failed to serve."""
        with self._lock:
            connections = list(self._connections)
            errors = list(self._errors)
        for connection in connections:
            for direction in (connection.requests, connection.responses):
                if direction.error:
                    side = "requests" if direction.client_side else "responses"
                    errors.append(
                        f"{self.callee} connection {connection.number} {side}: {direction.error}"
                    )
        return errors

    def forwarded_bytes(self) -> tuple[int, int]:
        """(bytes forwarded, of which moved by splice) over every connection."""
        with self._lock:
            connections = list(self._connections)
        total = spliced = 0
        for connection in connections:
            for direction in (connection.requests, connection.responses):
                total += direction.forwarded_bytes
                spliced += direction.spliced_bytes
        return total, spliced

    def _assemble(self, connection: _Connection, *, final: bool) -> list[RecordedCall]:
        for direction in (connection.requests, connection.responses):
            connection.table.fold(direction)
        return connection.table.take(caller_pid=connection.caller_pid, final=final)


class ProxySet:
    """One RecordingProxy per task, started and stopped together.

    ``owner_pids`` tells every proxy which processes may dial it; ``options``
    are more RecordingProxy arguments (``use_splice``, ``follow``...).
    """

    def __init__(
        self,
        targets: Mapping[str, tuple[str, int]],
        *,
        listen_host: str = "127.0.0.1",
        owner_pids: Callable[[], list[int]] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.proxies: dict[str, RecordingProxy] = {}
        try:
            for name, target in targets.items():
                self.proxies[name] = RecordingProxy(
                    target=target,
                    callee=name,
                    listen_host=listen_host,
                    owner_pids=owner_pids,
                    **dict(options or {}),
                )
        except BaseException:
            self.stop()
            raise
        self.started_ns = 0

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The tasks need nothing of the proxies: ``base`` unchanged."""
        return dict(base)

    def peer_address(self, task: str, address: str) -> str:
        """Where peers dial ``task`` (whose server is at ``address``): its proxy."""
        del address
        return self.proxies[task].address

    def expect_process(self, pid: int, task: str) -> None:
        """Nothing: every proxy asks ``owner_pids`` who may dial it."""

    def start(self) -> None:
        for proxy in self.proxies.values():
            proxy.start()
        self.started_ns = min(p.started_ns for p in self.proxies.values())

    def stop(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()

    def collect(self, *, final: bool = False) -> list[RecordedCall]:
        calls = [c for p in self.proxies.values() for c in p.collect(final=final)]
        return sorted(calls, key=lambda c: c.start_ns)

    def errors(self) -> tuple[str, ...]:
        return tuple(e for p in self.proxies.values() for e in p.follower_errors())

    def forwarded_bytes(self) -> tuple[int, int]:
        totals = [p.forwarded_bytes() for p in self.proxies.values()]
        return sum(t for t, _ in totals), sum(s for _, s in totals)

    def activity(self) -> int:
        """Bytes forwarded so far by every proxy."""
        return self.forwarded_bytes()[0]


def tune_socket(sock: socket.socket, *, congestion_control: str | None = None) -> None:
    """Socket options of both ends of a proxied connection.

    TCP_NODELAY: a forwarded chunk must leave at once, never wait for more.
    ``congestion_control`` names a TCP congestion control module for the
    proxy's sends (the system default if None or not available).
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if congestion_control:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion_control.encode())


def _open_pipe() -> tuple[int, int, int] | None:
    """A pipe for splice (read end, write end, capacity), or None if unavailable."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    capacity = 1 << 16
    with contextlib.suppress(OSError):
        capacity = fcntl.fcntl(write_end, _F_SETPIPE_SZ, PIPE_BYTES)
    return read_end, write_end, capacity


# --------------------------------------------------------------------------
# Which process owns the other end of a connection.

_PROC = Path("/proc")


def _socket_inodes(local_port: int, remote_port: int) -> set[int]:
    """Inodes of TCP sockets whose local port is ``local_port`` and remote ``remote_port``."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote = fields[1], fields[2]
            if (
                int(local.rsplit(":", 1)[1], 16) == local_port
                and int(remote.rsplit(":", 1)[1], 16) == remote_port
            ):
                inode = int(fields[9])
                if inode:
                    inodes.add(inode)
    return inodes


def _holds_socket(pid: int, targets: set[str]) -> bool:
    try:
        entries = os.scandir(f"/proc/{pid}/fd")
    except OSError:
        return False
    with entries:
        for entry in entries:
            try:
                if os.readlink(entry.path) in targets:
                    return True
            except OSError:
                continue
    return False


def _parent(pid: int) -> int | None:
    fields = process_stat_fields(pid, _PROC)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def find_socket_owner(
    peer: tuple[str, int], local: tuple[str, int], *, candidates: Iterable[int]
) -> int | None:
    """The candidate pid whose process (or a descendant) holds the client socket.

    ``peer`` is the connection's remote end as the proxy sees it (the client's
    ephemeral port), ``local`` the proxy's end.  Looks at the candidates first,
    then at every process, walking up from the owner to a candidate.  Returns
    the owner itself if no candidate is its ancestor, None if the socket is gone
    or not visible (another network namespace, no permission).
    """
    inodes = _socket_inodes(peer[1], local[1])
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    candidate_list = [pid for pid in candidates if pid > 0]
    for pid in candidate_list:
        if _holds_socket(pid, targets):
            return pid
    owner = None
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and _holds_socket(int(entry.name), targets):
            owner = int(entry.name)
            break
    if owner is None:
        return None
    wanted = set(candidate_list)
    ancestor: int | None = owner
    for _ in range(64):
        if ancestor is None or ancestor <= 1:
            break
        if ancestor in wanted:
            return ancestor
        ancestor = _parent(ancestor)
    return owner
