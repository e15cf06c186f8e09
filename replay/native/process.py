"""The engine program as a child process, spoken to in frames (``protocol``).

Started with its pipes to this process, dying with the thread that starts it
(the program sets ``PR_SET_PDEATHSIG`` itself, given this process's pid), stopped
by ``close``.  Reading a frame
blocks; a program that exits instead of answering is a ``TransportError``
naming its pid and exit status.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.native.protocol import Decoder

#: How long a program told to quit has before it is killed.
QUIT_GRACE_S = 5.0


class EngineProcess:
    """``tfgb-engine ROLE``: one child process.  ``send`` is thread-safe; ``receive``
    is for one thread at a time."""

    def __init__(self, program: Path, role: str) -> None:
        self.role = role
        try:
            # No preexec_fn: the program arranges to die with this process itself (a
            # fork that runs Python before exec would run grpcio's fork handlers there).
            self._process = subprocess.Popen(
                [str(program), role, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        except OSError as error:
            raise TransportError(
                f"cannot start the gRPC C++ engine {program} ({error.strerror})"
            ) from None
        assert self._process.stdin is not None and self._process.stdout is not None
        self._in: IO[bytes] = self._process.stdin
        self._out: IO[bytes] = self._process.stdout
        self._send_lock = threading.Lock()
        #: Bytes read and not yet taken as frames: kept across a read that a stop
        #: signal interrupts, so the next read resumes mid-frame.
        self._pending = bytearray()

    @property
    def pid(self) -> int:
        return self._process.pid

    def _gone(self) -> TransportError:
        try:
            status = self._process.wait(QUIT_GRACE_S)
        except subprocess.TimeoutExpired:
            status = None
        how = "is not answering" if status is None else f"exited (exit status {status})"
        return TransportError(f"the gRPC C++ engine ({self.role}, pid {self.pid}) {how}")

    def send(self, frame: bytes) -> None:
        with self._send_lock:
            try:
                self._in.write(frame)
                self._in.flush()
            except (BrokenPipeError, ValueError, OSError):
                raise self._gone() from None

    def _fill(self, size: int, deadline: float | None = None) -> None:
        """Read until ``size`` bytes are pending (an interrupting signal loses none);
        ``TransportError`` past ``deadline`` (``time.monotonic``)."""
        while len(self._pending) < size:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._out.fileno()], [], [], left)[0]:
                    raise TransportError(
                        f"the gRPC C++ engine ({self.role}, pid {self.pid}) did not answer"
                    )
            data = os.read(self._out.fileno(), max(size - len(self._pending), 1 << 16))
            if not data:
                raise self._gone()
            self._pending += data

    def receive(self, timeout_s: float | None = None) -> Decoder:
        """The next frame; ``TransportError`` if the program ended instead (or sent none
        within ``timeout_s``)."""
        self.await_frame(timeout_s)
        return self.take()

    def await_frame(self, timeout_s: float | None = None) -> str:
        """Wait until the next frame is here whole, taking none of it (a stop signal
        meanwhile loses nothing); its kind.  ``TransportError`` as ``receive``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._fill(4, deadline)
        length = int.from_bytes(self._pending[:4], "little")
        if length == 0:
            raise TransportError(f"the gRPC C++ engine (pid {self.pid}) sent an empty frame")
        self._fill(4 + length, deadline)
        return chr(self._pending[4])

    def take(self) -> Decoder:
        """The frame ``await_frame`` waited for (it does not wait)."""
        length = int.from_bytes(self._pending[:4], "little")
        assert 0 < length <= len(self._pending) - 4, "take() before await_frame()"
        body = bytes(self._pending[4 : 4 + length])
        del self._pending[: 4 + length]
        return Decoder(body)

    def close(self) -> int | None:
        """Tell the program to quit and wait for it (kill it past ``QUIT_GRACE_S``);
        its exit status."""
        with contextlib.suppress(TransportError):
            self.send(b"\x01\x00\x00\x00Q")
        with contextlib.suppress(OSError):
            self._in.close()
        try:
            status = self._process.wait(QUIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            status = self._process.wait()
        with contextlib.suppress(OSError):
            self._out.close()
        return status

    def terminate(self) -> None:
        """SIGTERM now (a server's stop)."""
        with contextlib.suppress(ProcessLookupError):
            self._process.terminate()

    def wait(self, timeout_s: float) -> int | None:
        """The exit status once the program has ended, None if it is still running."""
        try:
            return self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        self._process.wait()
