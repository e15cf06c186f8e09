"""How the tool's processes end: stop signals handled as Ctrl-C is, children that die with us.

Stop signals.  Ctrl-C (SIGINT), SIGTERM (what ``timeout``, Slurm, Kubernetes
and container runtimes send) and SIGHUP (a closed terminal or SSH session)
all stop a command the same way: ``interrupt_on_signals`` makes each raise
``Interrupted`` (a ``KeyboardInterrupt``) in the main thread, so every place
that keeps what was measured on Ctrl-C keeps it on the other two as well; the
command then exits with 128 + the signal's number.  Only the first stop
signal interrupts: the command is stopping from then on, keeping what it
measured, and later ones (a second Ctrl-C, a supervisor's SIGTERM after a
SIGINT) are noted and ignored, so no sequence of them can cut that short.
``deferred_signals`` holds the first while a child is being started or a
result written, and raises it when the block ends.

Children.  Every process the tool starts (replay servers, PS-throughput
workers, training tasks, processes in emulated hosts) must die with the
process that started it, even when that one is killed with SIGKILL and can
clean nothing up.  Linux's ``PR_SET_PDEATHSIG`` asks the kernel to send the
child a signal when its parent ends: a child started by ``multiprocessing``
calls ``die_with_parent(parent_pid)`` first thing; a child started by
``subprocess`` gets it from ``die_with_parent_preexec()`` before it runs its
program (the setting survives ``exec``).  Both compare ``getppid()`` with the
expected parent afterwards, which closes the race of a parent that died
before the setting was made.  The kernel's "parent" is the *thread* that
started the child: start children from a thread that outlives them (the main
thread, or the thread that also stops them).  Elsewhere than Linux these do
nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

#: Signals that stop a command the way Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: ``prctl`` option (linux/prctl.h): signal to receive when the parent thread ends.
_PR_SET_PDEATHSIG = 1


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived: raised in the main thread, handled wherever Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    """``Ctrl-C`` for SIGINT (what users press), else the signal's name (``SIGTERM``)."""
    if signum == signal.SIGINT:
        return "Ctrl-C"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_of(error: BaseException) -> int:
    """The signal a ``KeyboardInterrupt`` stands for (SIGINT unless it is ``Interrupted``)."""
    return error.signum if isinstance(error, Interrupted) else signal.SIGINT


def exit_status(signum: int) -> int:
    """The shell's convention for a command stopped by ``signum``: 128 + its number."""
    return 128 + signum


class _Received:
    """The stop signals seen since handlers were installed; shared by every thread."""

    def __init__(self) -> None:
        #: Reentrant: the handler runs in the main thread between any two bytecodes,
        #: also while the main thread holds the lock (``deferred_signals``' bookkeeping);
        #: a plain lock would wait for itself there for good.
        self.lock = threading.RLock()
        self.first: int | None = None
        #: Stop signals received after the first (ignored).
        self.later = 0
        self.deferring = 0
        self.pending: int | None = None


_received = _Received()


def stop_signal() -> int | None:
    """The first stop signal received since ``interrupt_on_signals`` began, or None."""
    return _received.first


def _handle(signum: int, _frame: FrameType | None) -> None:
    with _received.lock:
        if _received.first is not None:
            _received.later += 1
            return  # already stopping: the first one is being handled
        _received.first = signum
        if _received.deferring:
            _received.pending = signum
            return
    raise Interrupted(signum)


def later_signals() -> int:
    """Stop signals received after the first (which alone interrupted), since
    ``interrupt_on_signals`` began."""
    return _received.later


@contextlib.contextmanager
def interrupt_on_signals(*, ending_the_process: bool = False) -> Iterator[None]:
    """While the block runs, the first of SIGINT, SIGTERM and SIGHUP raises ``Interrupted``.

    Handlers can be set only from the main thread; elsewhere, or inside
    another such block, this does nothing.  The previous handlers come back
    when the block ends, except with ``ending_the_process`` (a command's own
    block, after which it exits) once a stop signal came: later ones are then
    ignored, so they can neither kill the process on its way out nor change
    its exit status.
    """
    if threading.current_thread() is not threading.main_thread() or handlers_installed():
        yield
        return
    with _received.lock:
        _received.first = _received.pending = None
        _received.later = 0
    previous = {number: signal.signal(number, _handle) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        stopping = ending_the_process and _received.first is not None
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_IGN if stopping else handler)


def handlers_installed() -> bool:
    """Whether ``interrupt_on_signals`` handles SIGTERM now (a caller need not add its own)."""
    return signal.getsignal(signal.SIGTERM) is _handle


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold the first stop signal while the block runs (starting a child, writing
    results); raise it after the block.

    Thread-safe; nests.  The first signal that arrives meanwhile is remembered, and
    ``Interrupted`` is raised when the outermost block ends normally.
    """
    with _received.lock:
        _received.deferring += 1
    try:
        yield
    finally:
        with _received.lock:
            _received.deferring -= 1
            pending = _received.pending if _received.deferring == 0 else None
            if pending is not None:
                _received.pending = None
    if pending is not None and sys.exc_info()[0] is None:
        raise Interrupted(pending)


class StopSignals:
    """While entered, a stop signal (Ctrl-C, SIGTERM, SIGHUP) sets ``event`` instead of
    interrupting, so a serving loop ends cleanly; ``signum`` is the first that came
    (None while none did).  Main thread only; the previous handlers come back on exit."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        self.event.set()

    def __exit__(self, *_exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


class _QuietGrpcAfterStop:
    """A ``sys.unraisablehook`` that drops gRPC objects' ``__del__`` errors once a stop
    signal came and passes everything else to the hook it replaced."""

    def __init__(self, previous: Callable[[Any], object]) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        where = getattr(unraisable.object, "__module__", None) or ""
        if stop_signal() is not None and where.split(".")[0] == "grpc":
            return
        self.previous(unraisable)


def quiet_grpc_after_stop() -> None:
    """From now on, after a stop signal, gRPC objects' ``__del__`` errors stay off stderr.

    The signal's ``Interrupted`` can land inside the constructor of a gRPC call
    object (``_MultiThreadedRendezvous``); the half-built object then fails in
    its ``__del__`` ("Exception ignored in ..."), a traceback on stderr after the
    command's one line.  It is the interruption's fallout, not a fault.
    Installed once; other unraisable errors go to the hook that was in place.
    """
    if not isinstance(sys.unraisablehook, _QuietGrpcAfterStop):
        sys.unraisablehook = _QuietGrpcAfterStop(sys.unraisablehook)


#: How long a stopped command's interpreter may take to exit before it is ended (s).
EXIT_GRACE_S = 30.0


def exit_within(status: int, seconds: float = EXIT_GRACE_S) -> None:
    """Make sure this process has ended ``seconds`` from now, with ``status``.

    For a command that a stop signal ended, once it has kept what it measured:
    the interpreter's exit joins every thread still running (gRPC's and
    ``concurrent.futures``' pools are not daemon threads), and one stuck there
    would leave the process behind its launcher's back.  A daemon thread waits
    ``seconds``, flushes the standard streams and ends the process with
    ``os._exit``; a normal exit before then ends the thread with it.
    """

    def end() -> None:
        time.sleep(seconds)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)

    threading.Thread(target=end, name="tf-grpc-bench-exit", daemon=True).start()


# --------------------------------------------------------------------------
# Children that die with their parent.


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        function = libc.prctl
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    function.restype = ctypes.c_int
    prctl: Callable[..., int] = function
    return prctl


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Make the kernel send ``signum`` to this process when ``parent_pid`` (its parent) ends.

    Call it first thing in a child process.  If the parent is already gone
    (this process was re-parented), the signal is sent now.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def die_with_parent_preexec(signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child dies with this process.

    Everything is looked up here, in the parent; the function the child runs
    between fork and exec only makes two system calls.
    """
    prctl = _prctl()
    parent = os.getpid()
    getppid, kill = os.getppid, os.kill

    def in_child() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signum, 0, 0)
        if getppid() != parent:
            kill(os.getpid(), signum)

    return in_child


def end_processes(processes: Sequence[Any], graces: Sequence[tuple[str, float]]) -> None:
    """End ``multiprocessing`` processes already told to stop: for each (``ending``,
    seconds) of ``graces`` in turn, apply ``ending`` ("" for none, "terminate", "kill")
    to every one still alive, then wait up to that long for them all together (one
    deadline, not one wait per process in turn)."""
    for ending, grace_s in graces:
        alive = [p for p in processes if p.is_alive()]
        for process in alive if ending else ():
            with contextlib.suppress(ProcessLookupError):
                getattr(process, ending)()
        deadline = time.monotonic() + grace_s
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))
