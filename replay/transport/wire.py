"""What travels between the replay client and server, shared by both ends.

Method paths, message encodings, gRPC settings (message size limits, TLS),
the control service that reports what a server received, preallocated
payload bytes, and the one place where ``grpc.RpcError`` becomes
``TransportError``.  Message layouts are described in ``messages``.

RPC kinds
---------
``RpcKind.UNARY`` makes one gRPC call per workload call, on the call's own
method path.  ``RpcKind.STREAMING`` carries echo and ack calls as messages on
one long-lived bidirectional stream per channel (``ECHO_STREAM_METHOD``,
``PUSH_STREAM_METHOD``): each request message is answered by exactly one
response message (the echo, or the ack), in order, so a workload call is still
one request and one response with the same bytes; what goes away is the per-
call setup (headers, stream creation, trailers) and one thread hand-off per
call.  Pulls (trace replays) always stay unary on the trace's method paths.
See ``docs/performance.md`` for what each kind measures.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import re
import secrets
import struct
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import grpc

from tf_grpc_bench.errors import ConfigError, TransportError
from tf_grpc_bench.files import loads_json
from tf_grpc_bench.protos import bench_pb2
from tf_grpc_bench.replay.core.benchmarks import RpcKind as RpcKind
from tf_grpc_bench.replay.core.messages import (
    ECHO_METHOD,
    PUSH_METHOD,
    RAW_PULL_HEADER_BYTES,
    pull_request_layout,
    pull_response_content_bytes,
)
from tf_grpc_bench.replay.core.workload import Mode

#: Largest message either end accepts: TensorFlow tensors reach ~50 MB, and a
#: payload of 10 Large buffers at their 10 MiB maximum is 100 MiB.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: grpcio's own ceiling on a message (an int32), what "no limit" means.
GRPC_MESSAGE_LIMIT_BYTES = 2**31 - 1

#: Call metadata carrying a raw pull's response length when the request is shorter than 8 bytes.
RESPONSE_LENGTH_METADATA = "tfgb-response-bytes"

CONTROL_SERVICE = "tf_grpc_bench.Control"
STATS_METHOD = f"/{CONTROL_SERVICE}/Stats"
RESET_METHOD = f"/{CONTROL_SERVICE}/Reset"

#: Call metadata naming the client session a call belongs to (every call of a
#: replay, control calls included).  A call without it belongs to the default
#: session "", so a client that names none sees the server as one shared count.
SESSION_METADATA = "tfgb-session"
#: Call metadata carrying the shared token a server's control calls need.
TOKEN_METADATA = "tfgb-token"
#: What a session id may be: letters, digits, '-' and '_', at most 64 of them.
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Largest token file read.
MAX_TOKEN_BYTES = 4096

CallMetadata = tuple[tuple[str, str], ...]

#: Bidirectional streams carrying echo and ack calls in ``RpcKind.STREAMING``.
ECHO_STREAM_METHOD = "/tf_grpc_bench.Replay/EchoStream"
PUSH_STREAM_METHOD = "/tf_grpc_bench.Replay/PushStream"
#: The stream that carries each unary payload method.
STREAM_OF_METHOD = {ECHO_METHOD: ECHO_STREAM_METHOD, PUSH_METHOD: PUSH_STREAM_METHOD}

_UINT64 = struct.Struct("<Q")


_SIZE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

#: Calls a server's gRPC core keeps waiting for the Python server to accept them.
#:
#: grpcio's server accepts one call at a time, from one thread, so a burst of
#: calls (a trace step's hundreds of RecvTensor calls released together, from
#: every worker of every client sharing the server) waits in gRPC core first.
#: Past gRPC's default of 1000 waiting calls core starts cancelling new ones
#: at random, all of them past 3000: the client sees CANCELLED.  A waiting call
#: costs the server about 16 KB (measured), so this bound is about 256 MiB.
MAX_PENDING_CALLS = 16384
#: How long a call may wait to be accepted before gRPC core cancels it (its
#: default is 30 s; TensorFlow's own servers raise it to an hour for the same
#: reason).  A client's deadline ends a call that waits too long, visibly.
MAX_PENDING_CALL_WAIT_S = 3600

#: A server pings each client this often (even one with no call in flight) and closes
#: the connection of a client that does not answer within the timeout, so a client
#: that vanished (its host down, its network gone) leaves no connection behind and
#: its sessions are free to be reclaimed (``sessions``).
SERVER_KEEPALIVE_MS = 60_000
SERVER_KEEPALIVE_TIMEOUT_MS = 20_000

_SERVER_DEFAULTS: tuple[tuple[str, int], ...] = (
    *_SIZE_OPTIONS,
    ("grpc.keepalive_time_ms", SERVER_KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", SERVER_KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    # Else it stops pinging a connection after two pings that carried no data.
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC sets SO_REUSEPORT by default, which lets a second server bind a
    # port already in use and silently share it: refuse that.
    ("grpc.so_reuseport", 0),
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
    ("grpc.server_max_unrequested_time_in_server", MAX_PENDING_CALL_WAIT_S),
)


def with_defaults(
    defaults: tuple[tuple[str, str | int], ...], options: tuple[tuple[str, str | int], ...]
) -> list[tuple[str, str | int]]:
    """``options`` after those ``defaults`` they do not set themselves.

    grpcio keeps the *first* of two options with the same key, so a default
    listed before a user's setting would silently win over it.
    """
    given = {key for key, _ in options}
    return [*(option for option in defaults if option[0] not in given), *options]


def identity(data: bytes) -> bytes:
    """Serializer and deserializer of the non-serialized mode: the bytes themselves."""
    return data


def new_session_id() -> str:
    """A fresh client session id: 128 random bits, so no other client names it by chance."""
    return secrets.token_hex(16)


def session_of(metadata: Any) -> str:
    """The session a call's metadata names, unchecked ("" when it names none).

    Per call, so no more than a scan: a name is checked (``SESSION_ID``) once,
    when a server first meets it.
    """
    for key, value in metadata or ():
        if key == SESSION_METADATA:
            return str(value)
    return ""


def read_token_file(path: str | Path, *, flag: str = "--token-file") -> str:
    """The shared token in the file at ``path``, surrounding whitespace dropped.

    A token is 1 to ``MAX_TOKEN_BYTES`` visible ASCII characters (what call
    metadata can carry).  ``ConfigError`` naming ``flag`` and the file otherwise;
    the token itself is never put in a message.
    """
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_TOKEN_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{flag} {path}: cannot read ({error.strerror or error})") from None
    token = data.strip()
    if len(data) > MAX_TOKEN_BYTES:
        raise ConfigError(f"{flag} {path}: longer than {MAX_TOKEN_BYTES} bytes")
    if not token:
        raise ConfigError(
            f"{flag} {path}: empty (expected a token, e.g. from 'openssl rand -hex 32')"
        )
    if any(not 0x21 <= byte <= 0x7E for byte in token):
        raise ConfigError(f"{flag} {path}: expected visible ASCII characters only, no spaces")
    return token.decode("ascii")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelSettings:
    """How clients open channels: gRPC options and optional TLS.  Picklable, so
    worker processes receive it as is.

    ``options`` replace the default size limits they set (``with_defaults``).
    With ``root_certificates`` set the channel uses TLS; ``private_key`` and
    ``certificate_chain`` add a client certificate.
    """

    options: tuple[tuple[str, str | int], ...] = ()
    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    #: Channels per server per worker; calls take them in turn.
    channels_per_server: int = 1
    #: Echo and ack calls as unary calls, or as messages on one stream per channel.
    rpc: RpcKind = RpcKind.UNARY
    #: The client session every call names (``SESSION_METADATA``); "" names none.
    session: str = ""
    #: The token of the servers' control calls (``TOKEN_METADATA``), if they need one.
    control_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.channels_per_server < 1:
            raise ValueError(f"channels_per_server must be >= 1, got {self.channels_per_server}")
        if not isinstance(self.rpc, RpcKind):
            raise ValueError(f"rpc must be an RpcKind, got {self.rpc!r}")
        if self.session and not SESSION_ID.fullmatch(self.session):
            raise ValueError(f"session must match {SESSION_ID.pattern}, got {self.session!r}")

    def all_options(self) -> list[tuple[str, str | int]]:
        return with_defaults(_SIZE_OPTIONS, self.options)

    def call_metadata(self) -> CallMetadata:
        """What every call carries: the session, if any."""
        return ((SESSION_METADATA, self.session),) if self.session else ()

    def control_metadata(self) -> CallMetadata:
        """What control calls carry: the session and the token, if any."""
        token = ((TOKEN_METADATA, self.control_token),) if self.control_token else ()
        return (*self.call_metadata(), *token)

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.root_certificates is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def describe(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.options)
        tls = "tls" if self.root_certificates is not None else "insecure"
        described = f"{tls};channels={self.channels_per_server};rpc={self.rpc.value}"
        return described + (f";{extra}" if extra else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    """How a replay server listens.  Picklable, for server processes.

    With ``private_key`` and ``certificate_chain`` the port uses TLS; with
    ``root_certificates`` too, clients must present certificates.
    """

    options: tuple[tuple[str, str | int], ...] = ()
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    root_certificates: bytes | None = None
    #: Threads answering calls; bounds how many calls are served at once (a
    #: stream of the streaming kind holds one thread for as long as it is open).
    max_workers: int = 64
    #: Server processes reuse freed message buffers (``keep_freed_memory``).
    keep_freed_memory: bool = True
    #: Largest response content a pull may ask for; None: as large as the
    #: message size limit (``send_limit_bytes``) lets the response be.
    max_response_bytes: int | None = None
    #: Control calls (statistics, reset) are refused without this token; None: no token.
    control_token: str | None = field(default=None, repr=False)
    #: Client sessions counted apart at once (``SESSION_METADATA``).
    max_sessions: int = 256

    def __post_init__(self) -> None:
        if self.max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {self.max_workers}")
        if (self.private_key is None) != (self.certificate_chain is None):
            raise ValueError("TLS needs both private_key and certificate_chain")
        if self.max_response_bytes is not None and self.max_response_bytes < 0:
            raise ValueError(f"max_response_bytes must be >= 0, got {self.max_response_bytes}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")

    def all_options(self) -> list[tuple[str, str | int]]:
        return with_defaults(_SERVER_DEFAULTS, self.options)

    def send_limit_bytes(self) -> int:
        """The largest message the server sends, as its gRPC options set it."""
        limit = dict(self.all_options()).get("grpc.max_send_message_length", -1)
        return GRPC_MESSAGE_LIMIT_BYTES if not isinstance(limit, int) or limit < 0 else limit

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.private_key is None or self.certificate_chain is None:
            return None
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.root_certificates,
            require_client_auth=self.root_certificates is not None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerStats:
    """What a server counted since its last reset (payload RPCs only, not control calls).

    Bytes are gRPC message body lengths, as ``Call.request_bytes`` counts them.
    """

    mode: str
    received_bytes: int = 0
    received_messages: int = 0
    sent_bytes: int = 0
    sent_messages: int = 0
    #: CPU time (user + system) of the server process since the reset.
    cpu_ns: int = 0
    #: Wall time since the reset.
    wall_ns: int = 0
    pid: int = 0
    address: str = ""
    #: Per method path: [messages, bytes] received.
    per_method: dict[str, list[int]] = field(default_factory=dict)
    #: The client session these counts are of ("": the calls that named none).
    session: str = ""
    #: Other sessions that made calls since this one's reset: the server (and
    #: its ``cpu_ns``, which is the whole process's) was shared with them.
    other_sessions: int = 0
    #: Processes serving this address (``--procs-per-server``), their counts merged
    #: here (``siblings``); with more than one, the messages each received.
    processes: int = 1
    received_messages_per_process: list[int] = field(default_factory=list)

    def to_json(self) -> bytes:
        document = asdict(self)
        if not self.session:
            # What a client that names no session (an older one) knows how to read.
            del document["session"], document["other_sessions"]
        if self.processes == 1:
            del document["processes"], document["received_messages_per_process"]
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, source: str) -> ServerStats:
        try:
            document: dict[str, Any] = loads_json(data)
            known = {f.name for f in fields(cls)}
            # Fields a newer server adds are left for a newer client.
            return cls(**{key: value for key, value in document.items() if key in known})
        except (ValueError, TypeError, AttributeError) as error:
            raise TransportError(f"{source}: unreadable server statistics ({error})") from None


class PayloadBytes:
    """Zero-filled ``bytes`` of each size, made once and shared (never per call).

    Holds at most ``limit_bytes`` in total (a server answers whatever sizes
    clients ask for); past that, sizes not yet held are made per call.
    Thread-safe: a race makes the same buffer twice and keeps one.
    """

    def __init__(self, limit_bytes: int = 2 * 1024**3) -> None:
        self._by_size: dict[int, bytes] = {}
        self._limit_bytes = limit_bytes
        self._held_bytes = 0

    def get(self, size: int) -> bytes:
        data = self._by_size.get(size)
        if data is None:
            if self._held_bytes + size > self._limit_bytes:
                return bytes(size)
            data = self._by_size.setdefault(size, bytes(size))
            self._held_bytes = sum(self._by_size)
        return data

    def holds(self, size: int) -> bool:
        """Whether a buffer of ``size`` is already made (asking for it allocates nothing)."""
        return size in self._by_size

    @property
    def held_bytes(self) -> int:
        return self._held_bytes


def raw_pull_request(
    request_bytes: int, response_bytes: int
) -> tuple[bytes, tuple[tuple[str, str], ...] | None]:
    """A non-serialized pull request and its call metadata (None when not needed)."""
    if request_bytes >= RAW_PULL_HEADER_BYTES:
        return _UINT64.pack(response_bytes) + bytes(request_bytes - RAW_PULL_HEADER_BYTES), None
    return bytes(request_bytes), ((RESPONSE_LENGTH_METADATA, str(response_bytes)),)


def raw_response_length(request: bytes, metadata: Any) -> int:
    """The response length a non-serialized pull asks for (server side)."""
    if len(request) >= RAW_PULL_HEADER_BYTES:
        return int(_UINT64.unpack_from(request)[0])
    for key, value in metadata or ():
        if key == RESPONSE_LENGTH_METADATA:
            return int(value)
    return 0


def raw_ack(received_bytes: int) -> bytes:
    return _UINT64.pack(received_bytes)


def serialized_pull_request(
    request_bytes: int, response_bytes: int, tensor_name: str, padding: PayloadBytes
) -> bench_pb2.PullRequest:
    """The ``PullRequest`` whose encoding is ``request_bytes`` long (see ``messages``)."""
    content = pull_response_content_bytes(response_bytes)
    layout = pull_request_layout(request_bytes, content, tensor_name)
    return bench_pb2.PullRequest(
        response_bytes=content,
        tensor_name=layout.tensor_name,
        padding=padding.get(layout.padding_bytes),
    )


def serialized_payload(buffers: tuple[int, ...], cache: PayloadBytes) -> bench_pb2.Payload:
    return bench_pb2.Payload(buffers=[cache.get(size) for size in buffers])


def message_length(message: Any, mode: Mode) -> int:
    """Wire length of a request or response as the mode carries it."""
    if mode is Mode.NON_SERIALIZED:
        return len(message)
    return int(message.ByteSize())


def translate_rpc_error(error: grpc.RpcError, *, target: str, method: str) -> TransportError:
    """The one boundary where gRPC failures become ``TransportError``."""
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return TransportError(failure_message(target, method, code, details))


def failure_message(
    target: str, method: str, code: grpc.StatusCode | None, details: str | None
) -> str:
    """A failed call in one line, as every engine words it: where, what it means, the
    status's name, gRPC's first line of detail."""
    name = code.name if code is not None else "UNKNOWN"
    detail = (details or "").splitlines()[0] if details else ""
    if code is grpc.StatusCode.UNAVAILABLE:
        what = "server unavailable (not running, unreachable, or gone mid-run)"
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
        what = "no answer within the deadline (--deadline)"
    elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        # gRPC's own refusal of a message past a size limit says "larger than max";
        # a tf-grpc-bench server's refusals say which of its limits (sessions,
        # response size, memory) the call met.
        too_large = "larger than max" in detail
        what = "message too large (--max-message-size)" if too_large else "refused by the server"
    elif code is grpc.StatusCode.UNAUTHENTICATED:
        what = (
            "the server's control calls need its token: give replay --token-file the file "
            "given to serve --token-file"
        )
    elif code is grpc.StatusCode.UNIMPLEMENTED:
        what = "the server does not answer this method (is it a tf-grpc-bench server?)"
    elif code is grpc.StatusCode.CANCELLED:
        # This client cancels nothing it still waits for: the server did (an
        # older tf-grpc-bench server cancels calls beyond ~1000 waiting to be
        # accepted) or the connection went.
        what = "call cancelled by the server (more calls waiting than it accepts?)"
    else:
        what = "call failed"
    suffix = f": {detail}" if detail else ""
    return f"{target}{method}: {what} [{name}]{suffix}"


def chunk_failure_message(
    failure: str, code: grpc.StatusCode | None, chunk_index: int, chunk_count: int
) -> str:
    """``failure`` of chunk ``chunk_index`` of the ``chunk_count`` that carry one payload,
    as every engine words it: a deadline missed says the chunks share it."""
    if code is not grpc.StatusCode.DEADLINE_EXCEEDED or chunk_count <= 1:
        return failure
    return (
        f"{failure} (chunk {chunk_index + 1} of the {chunk_count} that carry one payload: "
        "--deadline bounds them together)"
    )


#: Method paths counted apart per session; calls on more paths than this, or on
#: paths longer than ``MAX_METHOD_CHARS`` (only a client making up paths makes
#: them), are counted under ``OTHER_METHODS``.
MAX_COUNTED_METHODS = 64
MAX_METHOD_CHARS = 256
OTHER_METHODS = "(other methods)"


class Counters:
    """Message and byte counts of a server (or of one client session); thread-safe.

    ``last_call_ns`` is the ``time.monotonic_ns`` of the latest call counted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.received_bytes = 0
        self.received_messages = 0
        self.sent_bytes = 0
        self.sent_messages = 0
        self.per_method: dict[str, list[int]] = {}
        self.last_call_ns = 0

    def add(self, method: str, received_bytes: int, sent_bytes: int) -> None:
        with self._lock:
            self.received_bytes += received_bytes
            self.received_messages += 1
            self.sent_bytes += sent_bytes
            self.sent_messages += 1
            entry = self.per_method.get(method)
            if entry is None:
                if len(self.per_method) >= MAX_COUNTED_METHODS or len(method) > MAX_METHOD_CHARS:
                    method = OTHER_METHODS
                entry = self.per_method.setdefault(method, [0, 0])
            entry[0] += 1
            entry[1] += received_bytes
            self.last_call_ns = time.monotonic_ns()

    def reset(self) -> None:
        with self._lock:
            self.received_bytes = self.received_messages = 0
            self.sent_bytes = self.sent_messages = 0
            self.per_method = {}

    def snapshot(self) -> tuple[int, int, int, int, dict[str, list[int]]]:
        with self._lock:
            return (
                self.received_bytes,
                self.received_messages,
                self.sent_bytes,
                self.sent_messages,
                {k: list(v) for k, v in self.per_method.items()},
            )


# --------------------------------------------------------------------------
# Memory of replay processes.

#: glibc ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations up to this size come from malloc's heap instead of fresh mmaps.
KEPT_ALLOCATION_BYTES = 512 * 1024 * 1024
_kept = False


def keep_freed_memory() -> bool:
    """Make this process reuse freed message buffers instead of mapping new pages.

    grpcio allocates a new buffer for every message it receives or sends (the
    Python ``bytes`` of a received message, the slice a sent one is copied
    into).  With glibc's defaults, buffers of more than 128 KiB are fresh
    ``mmap`` regions returned to the kernel when freed, so each message costs
    its size in page faults and zeroing; measured here that is about a tenth
    to a quarter of the CPU time per MB a 1-10 MiB payload costs
    (``docs/performance.md``).  Raising glibc's mmap and trim thresholds keeps
    freed buffers in the heap for the next message.  The price is memory: a
    process keeps its peak heap instead of giving it back.

    Process-wide and irreversible; call it from a process this tool owns (a
    server process, the ``replay`` command, a worker process).  Returns False
    (and changes nothing) where the C library has no ``mallopt``.
    """
    global _kept
    if _kept:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _kept = bool(
        mallopt(_M_MMAP_THRESHOLD, KEPT_ALLOCATION_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, 2 * KEPT_ALLOCATION_BYTES)
    )
    return _kept
