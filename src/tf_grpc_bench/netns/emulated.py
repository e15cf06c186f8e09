"""``EmulatedNetwork``: a planned network brought up, used and torn down.

Everything a network made is removed when its ``with`` block (or ``down``)
ends: normally, on an exception, on Ctrl-C, and on SIGTERM or SIGHUP.  The
processes started inside its hosts are stopped first (a namespace lives on
while a process is in it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns.calibration import Calibration, calibrate, unattainable
from tf_grpc_bench.netns.links import DEFAULT_TBF_LATENCY_US, PROFILES, LinkProfile, TokenBucket
from tf_grpc_bench.netns.namespaces import (
    CommandRunner,
    delete_namespace,
    kernel_hz,
    list_namespaces,
    require_root,
    run_command,
)
from tf_grpc_bench.netns.relay import (
    RelayStats,
    build_relay,
    read_relay_stats,
    set_compensation,
    start_relay,
)
from tf_grpc_bench.netns.state import (
    STATE_DIRECTORY,
    relay_stats_path,
    remove_namespace_state,
    write_records,
)
from tf_grpc_bench.netns.topology import DEFAULT_SUBNET, Host, RelayPlan, new_run_id, plan_network


class _Terminated(SystemExit):
    """Raised from the SIGTERM/SIGHUP handler so that teardown runs."""


@contextlib.contextmanager
def _teardown_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into exceptions while the network exists.

    SIGINT already raises KeyboardInterrupt.  Signal handlers can only be set
    from the main thread; elsewhere this does nothing, and so it does under
    ``lifetime.interrupt_on_signals`` (the command line's), whose exception
    unwinds the network as well.
    """
    if threading.current_thread() is not threading.main_thread() or lifetime.handlers_installed():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise _Terminated(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while tearing down, so teardown is not cut short."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class EmulatedNetwork:
    """Hosts as namespaces on an emulated link; a context manager.

    ``with EmulatedNetwork(hosts=2, profile=parse_profile("1gbit")) as net:``
    builds the network, and removes everything it made (processes it spawned,
    relays, namespaces, links, qdiscs, the state files in ``state``) when the
    block ends: normally, by an exception, by Ctrl-C, or by SIGTERM/SIGHUP
    (which then exit with 128+signal).  ``up``/``down`` do the same without the
    context manager.  After ``down``, ``relay_stats`` holds each relay's final
    statistics by link.  ``detached`` relays (``network up``) outlive this
    process and end when their namespaces are deleted.  Not thread-safe.
    """

    def __init__(
        self,
        *,
        hosts: int = 2,
        profile: LinkProfile = PROFILES["unlimited"],
        subnet: str = DEFAULT_SUBNET,
        run_id: str = "",
        tbf_latency_us: int = DEFAULT_TBF_LATENCY_US,
        runner: CommandRunner = run_command,
        detached: bool = False,
    ) -> None:
        self.run_id = run_id or new_run_id()
        self.runner = runner
        self.detached = detached
        self.plan = plan_network(
            hosts=hosts,
            profile=profile,
            run_id=self.run_id,
            subnet=subnet,
            hz=kernel_hz(),
            tbf_latency_us=tbf_latency_us,
        )
        self._processes: list[subprocess.Popen[Any]] = []
        self._relays: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.relay_stats: dict[str, RelayStats] = {}
        #: The relays' own cost as measured by ``up`` (None without relays).
        self.calibration: Calibration | None = None
        self._signals: contextlib.ExitStack | None = None

    @property
    def profile(self) -> LinkProfile:
        return self.plan.profile

    @property
    def hosts(self) -> tuple[Host, ...]:
        return self.plan.hosts

    @property
    def compensation_ns(self) -> int:
        """How much earlier than its delay each relay releases a packet (its own cost)."""
        return self.calibration.compensation_ns if self.calibration else 0

    def unattainable(self) -> str:
        """Why the profile's delay cannot be had over these relays ("" if it can)."""
        return unattainable(self.profile.delay_ns, self.compensation_ns)

    @property
    def token_bucket(self) -> TokenBucket | None:
        return self.plan.token_bucket

    def up(self) -> EmulatedNetwork:
        """Create everything; on any failure remove what was made and raise NetworkError.

        A delayed link's relay is built first (NetworkError without a compiler,
        before anything is made)."""
        require_root()
        executable = build_relay() if self.plan.relays else None
        try:
            STATE_DIRECTORY.mkdir(parents=True, exist_ok=True)
            for step in self.plan.steps:
                if isinstance(step, RelayPlan):
                    assert executable is not None
                    path = relay_stats_path(self.plan, step)
                    process = start_relay(step, executable, path, detached=self.detached)
                    self._relays[step.link] = (process, path)
                else:
                    self.runner(step)
            write_records(
                self.plan, [path for _, path in self._relays.values()], kept_up=self.detached
            )
            if self._relays:
                self.calibration = calibrate(self, self.runner)
                for _, path in self._relays.values():
                    set_compensation(path, self.calibration.compensation_ns)
        except OSError as error:
            self.down()
            raise NetworkError(f"{STATE_DIRECTORY}: {error.strerror}") from None
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop spawned processes and relays (keeping the relays' final statistics in
        ``relay_stats``) and delete this run's namespaces.  Idempotent."""
        with _signals_blocked():
            for process in self._processes:
                _stop_process(process)
            self._processes.clear()
            for link, (relay, path) in self._relays.items():
                _stop_process(relay)
                with contextlib.suppress(NetworkError):
                    self.relay_stats[link] = read_relay_stats(path)
            self._relays.clear()
            existing = set(list_namespaces(self.runner))
            for name in self.plan.namespaces:
                if name in existing:
                    delete_namespace(name, self.runner)
                remove_namespace_state(name)

    def __enter__(self) -> EmulatedNetwork:
        stack = contextlib.ExitStack()
        stack.enter_context(_teardown_on_signals())
        self._signals = stack
        try:
            return self.up()
        except BaseException:
            stack.close()
            raise

    def __exit__(self, *_exc: object) -> None:
        try:
            self.down()
        finally:
            if self._signals is not None:
                self._signals.close()
                self._signals = None

    def host(self, index: int) -> Host:
        if not 0 <= index < len(self.hosts):
            raise NetworkError(f"host {index}: the network has hosts 0..{len(self.hosts) - 1}")
        return self.hosts[index]

    def command(self, host: Host | int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside ``host``'s namespace."""
        chosen = self.host(host) if isinstance(host, int) else host
        return ["ip", "netns", "exec", chosen.namespace, *argv]

    def run(
        self, host: Host | int, argv: Sequence[str], *, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host`` and wait (blocking); output captured as text.

        Does not raise on a non-zero exit: the caller reads ``returncode``.
        """
        return subprocess.run(
            self.command(host, argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            preexec_fn=lifetime.die_with_parent_preexec(),
        )

    def spawn(self, host: Host | int, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host`` in its own process group; stopped by ``down``,
        and killed if this process dies (``lifetime.die_with_parent_preexec``)."""
        process = subprocess.Popen(
            self.command(host, argv),
            start_new_session=True,
            preexec_fn=lifetime.die_with_parent_preexec(),
            **popen,
        )
        self._processes.append(process)
        return process


def _stop_process(process: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """SIGTERM the process group we started, SIGKILL it after ``grace_s``."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
