"""Replay servers in processes of their own (so their CPU time and GIL are their
own), as the replay command runs them on loopback, and ``serve``'s loop."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import ServeError
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.server import ReplayServer, dial_address
from tf_grpc_bench.replay.transport.wire import ServerSettings, keep_freed_memory


def _serve_in_process(
    connection: multiprocessing.connection.Connection,
    mode_value: str,
    host: str,
    port: int,
    settings: ServerSettings,
    parent_pid: int = 0,
    shared: bool = False,
    sibling: bool = False,
) -> None:
    """Entry point of a server process: report the port, serve until SIGTERM.

    Dies with its parent (``parent_pid``), even one killed by SIGKILL.  ``shared``
    and ``sibling`` as ``ReplayServer`` takes them; a shared server then waits
    for the addresses of its siblings (("siblings", [...]) -> ("ready",)).
    """
    lifetime.die_with_parent(parent_pid)
    if settings.keep_freed_memory:
        keep_freed_memory()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C and a hang-up reach the whole process group: the parent decides when
    # servers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    server = ReplayServer(
        mode=Mode(mode_value), host=host, port=port, settings=settings, shared=shared,
        sibling=sibling,
    )  # fmt: skip
    try:
        server.start()
    except ServeError as error:
        connection.send(("error", str(error)))
        return
    connection.send(("ok", server.port, server.sibling_address))
    try:
        if shared or sibling:
            _, addresses = connection.recv()
            server.set_siblings(addresses)
            connection.send(("ready",))
    except (EOFError, OSError):
        stop.set()  # the parent is gone
    connection.close()
    while not stop.wait(0.5):
        pass
    server.stop(1.0)


class LocalServers:
    """``count`` replay servers, each in its own process (spawned, so nothing is inherited),
    or each in ``procs_per_server`` processes sharing its port (``siblings``).

    ``targets`` lists their addresses, in order.  ``stop`` terminates exactly
    the processes this object started; each also dies with this process
    (``lifetime.die_with_parent``), so start them from a thread that outlives
    them.  A context manager.
    """

    def __init__(
        self,
        count: int,
        *,
        mode: Mode = Mode.NON_SERIALIZED,
        host: str = "127.0.0.1",
        ports: Sequence[int] | None = None,
        settings: ServerSettings | None = None,
        start_timeout_s: float = 60.0,
        procs_per_server: int = 1,
    ) -> None:
        if count < 1:
            raise ServeError(f"need at least one server, got {count}")
        if procs_per_server < 1:
            raise ServeError(f"need at least one process per server, got {procs_per_server}")
        self.count = count
        self.mode = mode
        self.host = host
        self.ports = list(ports) if ports is not None else [0] * count
        if len(self.ports) != count:
            raise ServeError(f"{count} servers but {len(self.ports)} ports")
        self.settings = settings or ServerSettings()
        self.start_timeout_s = start_timeout_s
        self.procs_per_server = procs_per_server
        self.processes: list[Any] = []
        self.targets: list[str] = []
        self._pending: list[multiprocessing.connection.Connection] = []

    def _spawn(
        self, context: Any, port: int, *, sibling: bool
    ) -> tuple[Any, multiprocessing.connection.Connection]:
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=_serve_in_process,
            args=(
                child_end,
                self.mode.value,
                self.host,
                port,
                self.settings,
                os.getpid(),
                self.procs_per_server > 1,
                sibling,
            ),
            name=f"tf-grpc-bench-server-{len(self.processes)}",
            daemon=True,
        )
        # A stop signal waits until the child has its arguments and is listed here, to be
        # stopped: one that cut the write short left it a traceback of a truncated pickle.
        with lifetime.deferred_signals():
            process.start()
            child_end.close()
            self.processes.append(process)
            self._pending.append(parent_end)
        return process, parent_end

    def _report(
        self, process: Any, connection: multiprocessing.connection.Connection
    ) -> tuple[object, ...]:
        """The next message of a starting server process; ServeError if it failed."""
        if not connection.poll(self.start_timeout_s):
            raise ServeError(
                f"server process {process.pid} did not report its port within "
                f"{self.start_timeout_s:g} s"
            )
        try:
            message: tuple[object, ...] = connection.recv()
        except EOFError:
            raise ServeError(
                f"server process {process.pid} exited while starting (exit code {process.exitcode})"
            ) from None
        if message[0] == "error":
            raise ServeError(str(message[1]))
        return message

    def start(self) -> LocalServers:
        context = multiprocessing.get_context("spawn")
        try:
            firsts = [self._spawn(context, port, sibling=False) for port in self.ports]
            reports = [self._report(*first) for first in firsts]
            groups = [
                [first] + [
                    self._spawn(context, int(str(report[1])), sibling=True)
                    for _ in range(self.procs_per_server - 1)
                ]
                for first, report in zip(firsts, reports, strict=True)
            ]  # fmt: skip
            for group, report in zip(groups, reports, strict=True):
                if len(group) > 1:
                    self._introduce(group, [report] + [self._report(*m) for m in group[1:]])
                self.targets.append(dial_address(self.host, int(str(report[1]))))
        except BaseException:
            self.stop()
            raise
        finally:
            for connection in self._pending:
                connection.close()
            self._pending = []
        return self

    def _introduce(
        self,
        group: Sequence[tuple[Any, multiprocessing.connection.Connection]],
        reports: Sequence[tuple[object, ...]],
    ) -> None:
        """Tell each process serving one address where the others are, and wait for them."""
        addresses = [str(report[2]) for report in reports]
        for index, (_, connection) in enumerate(group):
            connection.send(("siblings", addresses[:index] + addresses[index + 1 :]))
        for member in group:
            self._report(*member)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask each server process to stop (SIGTERM), then kill any that lingers."""
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
                process.join(timeout_s)
        self.processes = []

    def __enter__(self) -> LocalServers:
        if not self.processes:
            self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
