"""The one error hierarchy of tf-grpc-bench.

Library code raises these; only the command-line entry point turns them into a
one-line message and an exit status.  Foreign errors (``grpc.RpcError``,
TensorFlow's, ``OSError`` from trace files) are translated into these at one
boundary each, so callers never need to catch a third-party type.
"""

from __future__ import annotations

import signal


class BenchError(Exception):
    """Root of every error tf-grpc-bench raises on purpose.

    ``str(error)`` is a complete one-line message for the user, naming the
    file, field or flag at fault and what was expected.
    """

    #: Process exit status the command line uses for this kind of error.
    exit_code: int = 2


class UsageError(BenchError):
    """A flag, or a combination of flags, that makes no sense."""


class ConfigError(BenchError):
    """A configuration value out of range (negative size, zero runs, ...)."""


class TraceError(BenchError):
    """A trace file that is missing, empty, truncated, corrupt or invalid."""


class UnsupportedVersionError(TraceError):
    """A trace or result document of a format version this tool does not know."""


class ResultError(BenchError):
    """A result document that cannot be read or written."""


class TransportError(BenchError):
    """gRPC failed: target unreachable, server gone mid-run, deadline exceeded."""

    exit_code = 3


class ServeError(BenchError):
    """A server could not start: port in use, address not available."""

    exit_code = 3


class CaptureError(BenchError):
    """A training task crashed or hung, or the recording proxy failed."""

    exit_code = 4


class NetworkError(BenchError):
    """Emulated-network set-up failed: not root, namespaces, veth, tc."""

    exit_code = 5


class UnsupportedResultVersionError(ResultError):
    """A result document of a format version this tool does not know."""


class RunInterrupted(BenchError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) ended a run; what was measured was
    written, marked partial.  Exits with 128 + the signal's number, as shells do."""

    exit_code = 130

    def __init__(self, message: str, *, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum
