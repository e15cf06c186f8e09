"""Replay servers of the gRPC C++ engine: ``tfgb-engine serve`` processes.

``NativeServers`` is ``transport.local_servers.LocalServers`` for this engine: the
same constructor, ``targets``, ``pids``, ``start``/``stop`` and context
manager, each server a program of its own (``--procs-per-server`` K: K
programs sharing its port, told of each other's loopback ports for control
calls, as ``transport.siblings`` describes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tf_grpc_bench.errors import ServeError, TransportError
from tf_grpc_bench.host import memory_cgroups
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.native.process import EngineProcess
from tf_grpc_bench.replay.native.protocol import PROTOCOL_VERSION, Encoder, unique_options
from tf_grpc_bench.replay.transport.server import check_port_available, dial_address
from tf_grpc_bench.replay.transport.wire import KEPT_ALLOCATION_BYTES, ServerSettings

#: How long a server program has to stop (SIGTERM) before it is killed.
STOP_GRACE_S = 5.0
#: How long a server program has to say it listens.
START_TIMEOUT_S = 60.0


def setup_frame(
    mode: Mode,
    host: str,
    port: int,
    settings: ServerSettings,
    *,
    shared: bool,
    sibling: bool,
    threads: int = 1,
) -> bytes:
    """The ``S`` frame of a server program (``protocol``)."""
    options = settings.all_options()
    if shared or sibling:
        options = [("grpc.so_reuseport", 1), *options]
    token = settings.control_token
    frame = (
        Encoder("S")
        .u32(PROTOCOL_VERSION)
        .u8(mode is Mode.SERIALIZED)
        .text(host)
        .u32(port)
        .u8(shared or sibling)
        .u8(sibling)
        .options(unique_options(options))
        .text(settings.private_key or b"")
        .text(settings.certificate_chain or b"")
        .text(settings.root_certificates or b"")
        .i64(-1 if settings.max_response_bytes is None else settings.max_response_bytes)
        .i64(settings.send_limit_bytes())
        .u8(token is not None)
        .text(token or "")
        .u32(settings.max_sessions)
        .u32(threads)
        .u32(len(cgroups := memory_cgroups()))
    )
    for folder, version, name in cgroups:
        frame.text(folder).u8(version).text(name)
    frame.i64(KEPT_ALLOCATION_BYTES if settings.keep_freed_memory else 0)
    return frame.frame()


class NativeServer:
    """One ``tfgb-engine serve`` program, started and listening (or ``ServeError``)."""

    def __init__(
        self,
        program: Path,
        *,
        mode: Mode,
        host: str,
        port: int,
        settings: ServerSettings,
        shared: bool = False,
        sibling: bool = False,
        threads: int = 1,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ServeError(f"--port {port}: expected 0..65535")
        if not sibling:
            check_port_available(host, port)
        self.host = host
        self.process = EngineProcess(program, "serve")
        try:
            self.process.send(
                setup_frame(
                    mode, host, port, settings, shared=shared, sibling=sibling, threads=threads
                )
            )
            answer = self.process.receive(START_TIMEOUT_S)
        except TransportError as error:
            self.process.kill()
            raise ServeError(str(error)) from None
        if answer.kind == "E":
            message = answer.text()
            self.process.kill()
            raise ServeError(message)
        self.port = answer.u32()
        #: Where the other programs serving this port reach this one ("" unless shared).
        self.sibling_address = answer.text()

    @property
    def address(self) -> str:
        return dial_address(self.host, self.port)

    def introduce(self, others: Sequence[str]) -> None:
        """The other programs serving this port; returns once this one knows them."""
        try:
            self.process.send(Encoder("B").texts(list(others)).frame())
            if self.process.receive(START_TIMEOUT_S).kind != "K":
                raise ServeError(f"server program {self.process.pid} did not take its siblings")
        except TransportError as error:
            raise ServeError(str(error)) from None

    def stop(self) -> tuple[int, int] | None:
        """Stop (SIGTERM; killed past ``STOP_GRACE_S``); (messages, bytes) it received
        over its life, None if it could not say."""
        self.process.terminate()
        totals = None
        try:
            frame = self.process.receive(STOP_GRACE_S)
            if frame.kind == "Z":
                totals = (frame.i64(), frame.i64())
        except TransportError:
            pass
        if self.process.wait(STOP_GRACE_S) is None:
            self.process.kill()
        return totals


class NativeServers:
    """``count`` servers of the gRPC C++ engine (``procs_per_server`` programs each).

    As ``LocalServers``: ``targets`` in order, ``stop`` ends exactly the programs
    started here, each of which also dies with the thread that started it.
    """

    def __init__(
        self,
        count: int,
        program: Path,
        *,
        mode: Mode = Mode.NON_SERIALIZED,
        host: str = "127.0.0.1",
        ports: Sequence[int] | None = None,
        settings: ServerSettings | None = None,
        procs_per_server: int = 1,
        threads: int = 1,
    ) -> None:
        if count < 1:
            raise ServeError(f"need at least one server, got {count}")
        if procs_per_server < 1:
            raise ServeError(f"need at least one process per server, got {procs_per_server}")
        self.ports = list(ports) if ports is not None else [0] * count
        if len(self.ports) != count:
            raise ServeError(f"{count} servers but {len(self.ports)} ports")
        self.program = program
        self.mode = mode
        self.host = host
        self.settings = settings or ServerSettings()
        self.procs_per_server = procs_per_server
        self.threads = threads
        self.servers: list[NativeServer] = []
        self.targets: list[str] = []

    def _start_one(self, port: int, *, sibling: bool) -> NativeServer:
        server = NativeServer(
            self.program,
            mode=self.mode,
            host=self.host,
            port=port,
            settings=self.settings,
            shared=self.procs_per_server > 1,
            sibling=sibling,
            threads=self.threads,
        )
        self.servers.append(server)
        return server

    def start(self) -> NativeServers:
        try:
            for port in self.ports:
                first = self._start_one(port, sibling=False)
                group = [first] + [
                    self._start_one(first.port, sibling=True)
                    for _ in range(self.procs_per_server - 1)
                ]
                if len(group) > 1:
                    addresses = [member.sibling_address for member in group]
                    for index, member in enumerate(group):
                        member.introduce(addresses[:index] + addresses[index + 1 :])
                self.targets.append(first.address)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        return [server.process.pid for server in self.servers]

    def stop(self) -> tuple[int, int]:
        """Stop every program started here; (messages, bytes) they received over their lives."""
        messages = received = 0
        for server in self.servers:
            totals = server.stop()
            if totals is not None:
                messages += totals[0]
                received += totals[1]
        self.servers = []
        return messages, received

    def __enter__(self) -> NativeServers:
        if not self.servers:
            self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
