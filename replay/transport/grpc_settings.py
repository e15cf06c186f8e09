"""The gRPC settings a replay runs with: one frozen, validated record.

These are the knobs a user turns to ask "what would this RPC stack setting do
to my training": how many channels (TCP connections) each client opens, how
many RPCs it keeps in flight, message compression, the message size limit and
whether large tensors are cut into chunks, TLS, and HTTP/2 keepalive.

``GrpcSettings`` turns them into what grpcio takes: ``channel_options()`` and
``server_options()`` (lists of ``(name, value)`` channel arguments),
``compression_algorithm()`` and, with the run's TLS files, credentials.  Every
setting is recorded in results and shown in TensorBoard's hparams
(``as_parameters()``).

Chunking: with ``chunk_bytes`` > 0, a message whose payload is larger than
``chunk_bytes`` travels as several messages of at most ``chunk_bytes`` on one
streaming call (``chunk_sizes``); the bytes on the wire are the same, the
largest single message is bounded.  0 sends every payload as one message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import grpc

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core import chunking
from tf_grpc_bench.replay.transport.wire import ChannelSettings, ServerSettings

#: grpcio's largest message size (an int32): what TensorFlow itself sets.
MAX_MESSAGE_LIMIT_BYTES = 2**31 - 1
#: Room for a message's framing and non-payload fields, so that a chunk or a
#: payload of exactly the limit still fits.
MESSAGE_OVERHEAD_BYTES = 1024
MIN_CHUNK_BYTES = 1024
MAX_CHANNELS = 256
MAX_OUTSTANDING_RPCS = 4096
#: grpc-core's default keepalive timeout.
DEFAULT_KEEPALIVE_TIMEOUT_MS = 20_000
#: gRPC's keepalive settings are C ints.
MAX_KEEPALIVE_MS = 2**31 - 1


class Compression(enum.Enum):
    """Message compression (grpcio's algorithms)."""

    NONE = "none"
    GZIP = "gzip"
    DEFLATE = "deflate"

    @classmethod
    def parse(cls, text: str) -> Compression:
        try:
            return cls(text.strip().lower())
        except ValueError:
            names = ", ".join(c.value for c in cls)
            raise ConfigError(f"--compression {text!r}: expected one of {names}") from None

    @property
    def grpc_algorithm(self) -> grpc.Compression:
        return {
            Compression.NONE: grpc.Compression.NoCompression,
            Compression.GZIP: grpc.Compression.Gzip,
            Compression.DEFLATE: grpc.Compression.Deflate,
        }[self]


@dataclass(frozen=True, slots=True, kw_only=True)
class GrpcSettings:
    """gRPC settings of a replay.  Immutable; thread-safe to share."""

    #: Channels (each its own TCP connection) a client spreads its calls over.
    channels: int = 1
    #: RPCs a client keeps in flight at once (per worker, over all its channels).
    outstanding_rpcs: int = 1
    compression: Compression = Compression.NONE
    #: Largest message either side sends or accepts.
    max_message_bytes: int = MAX_MESSAGE_LIMIT_BYTES
    #: Payloads larger than this go as several messages on one stream; 0 = never.
    chunk_bytes: int = 0
    tls: bool = False
    #: HTTP/2 keepalive ping interval; 0 = no keepalive pings (grpc's default).
    keepalive_time_ms: int = 0
    #: How long to wait for a ping's answer before the connection is dropped.
    keepalive_timeout_ms: int = DEFAULT_KEEPALIVE_TIMEOUT_MS

    def __post_init__(self) -> None:
        if not 1 <= self.channels <= MAX_CHANNELS:
            raise ConfigError(f"--channels must be in 1..{MAX_CHANNELS}, got {self.channels}")
        if not 1 <= self.outstanding_rpcs <= MAX_OUTSTANDING_RPCS:
            raise ConfigError(
                f"--outstanding must be in 1..{MAX_OUTSTANDING_RPCS}, got {self.outstanding_rpcs}"
            )
        if not isinstance(self.compression, Compression):
            raise ConfigError(f"--compression: expected a Compression, got {self.compression!r}")
        if not 2 * MESSAGE_OVERHEAD_BYTES <= self.max_message_bytes <= MAX_MESSAGE_LIMIT_BYTES:
            raise ConfigError(
                f"--max-message-size must be in {2 * MESSAGE_OVERHEAD_BYTES}.."
                f"{MAX_MESSAGE_LIMIT_BYTES} bytes, got {self.max_message_bytes}"
            )
        if self.chunk_bytes != 0:
            if self.chunk_bytes < MIN_CHUNK_BYTES:
                raise ConfigError(
                    f"--chunk-size must be 0 (off) or >= {MIN_CHUNK_BYTES} bytes, "
                    f"got {self.chunk_bytes}"
                )
            if self.chunk_bytes + MESSAGE_OVERHEAD_BYTES > self.max_message_bytes:
                raise ConfigError(
                    f"--chunk-size {self.chunk_bytes} does not fit in --max-message-size "
                    f"{self.max_message_bytes} (leave {MESSAGE_OVERHEAD_BYTES} bytes for framing)"
                )
        if not 0 <= self.keepalive_time_ms <= MAX_KEEPALIVE_MS:
            raise ConfigError(
                f"--keepalive-ms must be in 0..{MAX_KEEPALIVE_MS}, got {self.keepalive_time_ms}"
            )
        if not 0 < self.keepalive_timeout_ms <= MAX_KEEPALIVE_MS:
            raise ConfigError(
                f"--keepalive-timeout-ms must be in 1..{MAX_KEEPALIVE_MS}, "
                f"got {self.keepalive_timeout_ms}"
            )

    # -- what goes on the wire ------------------------------------------------

    def chunk_sizes(self, payload_bytes: int) -> tuple[int, ...]:
        """How a payload of ``payload_bytes`` is cut: one size per message, in order.

        Without chunking (or when the payload fits) that is ``(payload_bytes,)``.
        The sizes add up to ``payload_bytes``; all but the last equal ``chunk_bytes``.
        """
        return chunking.chunk_sizes(payload_bytes, self.chunk_bytes)

    def check_payload(self, payload_bytes: int, *, what: str = "payload") -> None:
        """ConfigError if a payload cannot be sent under the message size limit."""
        largest = self.chunk_sizes(payload_bytes)[0]
        if largest + MESSAGE_OVERHEAD_BYTES > self.max_message_bytes:
            raise ConfigError(
                f"{what} of {payload_bytes} bytes exceeds --max-message-size "
                f"{self.max_message_bytes}: raise it or set --chunk-size"
            )

    # -- grpcio ---------------------------------------------------------------

    def _message_options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        ]

    def channel_options(self) -> list[tuple[str, Any]]:
        """Channel arguments for ``grpc.insecure_channel``/``secure_channel``.

        Each channel gets a subchannel pool of its own, so ``channels`` channels
        to one target are ``channels`` TCP connections (grpcio otherwise shares
        one connection between channels with equal arguments).
        """
        options = [
            *self._message_options(),
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.default_compression_algorithm", int(self.compression.grpc_algorithm)),
        ]
        if self.keepalive_time_ms:
            options += [
                ("grpc.keepalive_time_ms", self.keepalive_time_ms),
                ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0),
            ]
        return options

    def server_options(self) -> list[tuple[str, Any]]:
        """Server arguments for ``grpc.server(options=...)``.

        With keepalive on, the server accepts pings as often as the client
        sends them (by default it answers frequent pings with GOAWAY
        "too_many_pings"), and pings its clients at the same interval.
        """
        options = list(self._message_options())
        if self.keepalive_time_ms:
            options += [
                ("grpc.keepalive_time_ms", self.keepalive_time_ms),
                ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", self.keepalive_time_ms),
                ("grpc.http2.max_ping_strikes", 0),
            ]
        return options

    def compression_algorithm(self) -> grpc.Compression:
        """For ``grpc.server(compression=...)`` and per-call ``compression=``."""
        return self.compression.grpc_algorithm

    # -- records ----------------------------------------------------------------

    def as_parameters(self) -> dict[str, int | str | bool]:
        """Flat ``grpc_*`` parameters for result documents and hparams."""
        return {f"grpc_{name}": _plain(value) for name, value in asdict(self).items()}

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> GrpcSettings:
        """Inverse of ``as_parameters`` (ignores unrelated keys)."""
        values = {
            name: parameters[f"grpc_{name}"]
            for name in cls.__dataclass_fields__
            if f"grpc_{name}" in parameters
        }
        if "compression" in values:
            values["compression"] = Compression.parse(str(values["compression"]))
        try:
            return cls(**values)
        except TypeError as error:
            raise ConfigError(f"gRPC settings: {error}") from None

    def describe(self) -> str:
        """One line for the terminal."""
        parts = [
            f"{self.channels} channel{'s' if self.channels > 1 else ''}",
            f"{self.outstanding_rpcs} outstanding",
            f"compression {self.compression.value}",
            f"max message {self.max_message_bytes} B",
            f"chunks {self.chunk_bytes} B" if self.chunk_bytes else "no chunking",
            "TLS" if self.tls else "plaintext",
            f"keepalive {self.keepalive_time_ms} ms" if self.keepalive_time_ms else "no keepalive",
        ]
        return ", ".join(parts)


def _plain(value: Any) -> int | str | bool:
    plain: int | str | bool = value.value if isinstance(value, enum.Enum) else value
    return plain


# -- what clients and servers are given ----------------------------------------------

#: (CA certificate, server certificate chain, server private key), PEM.
TlsMaterial = tuple[bytes, bytes, bytes]


def channel_settings(settings: GrpcSettings, tls_material: TlsMaterial | None) -> ChannelSettings:
    """What a replay client's channels are opened with."""
    return ChannelSettings(
        options=tuple(settings.channel_options()),
        root_certificates=tls_material[0] if tls_material else None,
        channels_per_server=settings.channels,
    )


def server_settings(settings: GrpcSettings, tls_material: TlsMaterial | None) -> ServerSettings:
    """What a replay server is started with (compressed answers when compression is on)."""
    options = list(settings.server_options())
    if settings.compression is not Compression.NONE:
        options.append(
            ("grpc.default_compression_algorithm", int(settings.compression_algorithm()))
        )
    return ServerSettings(
        options=tuple(options),
        certificate_chain=tls_material[1] if tls_material else None,
        private_key=tls_material[2] if tls_material else None,
    )
