"""The replay service's messages: how they are laid out and their exact wire sizes (proto3).

Pure: no gRPC, no clocks, no IO.  ``workload`` sizes its calls with these;
the client and the server (``transport``) build and check the messages the
same way.

Message layouts
---------------
Non-serialized mode (raw bytes, identity serializers):

* echo: request = the payload's buffers concatenated; response = the request.
* ack: request = the payload; response = 8 bytes, the little-endian count of
  request bytes received.
* pull (and every trace method): request of ``request_bytes`` whose first 8
  bytes are the little-endian response length when ``request_bytes >= 8`` (else
  the length travels in the ``tfgb-response-bytes`` call metadata); response of
  exactly that many bytes.

Serialized mode (``protos/bench.proto``):

* echo / ack: ``Payload{buffers}``, one bytes field per buffer; ack answers
  ``Ack{received_bytes}``.
* pull: ``PullRequest{response_bytes, tensor_name, padding}`` padded to the
  recorded request length, answered by ``PullResponse{content}`` whose length
  makes the whole message the recorded response length.  A few lengths cannot
  be encoded exactly: 1 and 2 bytes (sent as an empty message), and one length
  just past each varint-size step (e.g. 130 B, sent one byte short).  The call
  records what is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Method paths of the replay service (``protos/bench.proto``); the raw mode uses the same paths.
ECHO_METHOD = "/tf_grpc_bench.Replay/Echo"
PUSH_METHOD = "/tf_grpc_bench.Replay/Push"
PULL_METHOD = "/tf_grpc_bench.Replay/Pull"

#: Non-serialized ack: the received byte count as a little-endian uint64.
RAW_ACK_BYTES = 8
#: Non-serialized pull: the response length as a little-endian uint64 at the request's start.
RAW_PULL_HEADER_BYTES = 8


def varint_bytes(value: int) -> int:
    """Length of ``value``'s protobuf varint encoding."""
    if value < 0:
        raise ValueError(f"varint of a negative number: {value}")
    length = 1
    while value >= 0x80:
        value >>= 7
        length += 1
    return length


def bytes_field_bytes(length: int, *, repeated: bool = False) -> int:
    """Encoded size of a bytes/string field (tag < 16) holding ``length`` bytes.

    A singular proto3 field that is empty is not encoded at all.
    """
    if length == 0 and not repeated:
        return 0
    return 1 + varint_bytes(length) + length


def uint_field_bytes(value: int) -> int:
    """Encoded size of a singular uint64 field (tag < 16)."""
    return 0 if value == 0 else 1 + varint_bytes(value)


def payload_message_bytes(buffers: Sequence[int]) -> int:
    """Serialized size of ``Payload{buffers}``."""
    return sum(bytes_field_bytes(size, repeated=True) for size in buffers)


def ack_message_bytes(received_bytes: int) -> int:
    """Serialized size of ``Ack{received_bytes}``."""
    return uint_field_bytes(received_bytes)


def _fitting_bytes_field(target: int) -> int | None:
    """A content length whose singular bytes field encodes to exactly ``target`` bytes."""
    if target == 0:
        return 0
    guess = max(target - 1 - varint_bytes(target), 0)
    for content in (guess, guess + 1, guess + 2):
        if content > 0 and bytes_field_bytes(content) == target:
            return content
    return None


def pull_response_content_bytes(target_bytes: int) -> int:
    """Content length of the ``PullResponse`` closest to ``target_bytes`` without exceeding it."""
    for target in range(target_bytes, -1, -1):
        content = _fitting_bytes_field(target)
        if content is not None:
            return content
    raise AssertionError("unreachable: an empty PullResponse always fits")


@dataclass(frozen=True, slots=True, kw_only=True)
class PullRequestLayout:
    """How a serialized ``PullRequest`` reaches its target length."""

    response_content_bytes: int
    tensor_name: str
    padding_bytes: int
    message_bytes: int


def pull_request_layout(
    target_bytes: int, response_content_bytes: int, tensor_name: str = ""
) -> PullRequestLayout:
    """Lay out a ``PullRequest`` of ``target_bytes`` (or the nearest size it can have).

    Keeps as much of the tensor name as fits, then pads.  When the target is
    smaller than the mandatory response-length field, the request is that field
    alone.  Deterministic, so the client and the workload agree on the size.
    """
    base = uint_field_bytes(response_content_bytes)
    name = tensor_name.encode()
    best: PullRequestLayout | None = None
    for name_length in range(len(name), -1, -1):
        # Only whole characters: a truncated name must stay valid UTF-8.
        shortened = name[:name_length].decode("utf-8", errors="ignore")
        if len(shortened.encode()) != name_length:
            continue
        used = base + bytes_field_bytes(name_length)
        if used > target_bytes:
            continue
        padding_field = _fitting_bytes_field(target_bytes - used)
        if padding_field is not None:
            return PullRequestLayout(
                response_content_bytes=response_content_bytes,
                tensor_name=shortened,
                padding_bytes=padding_field,
                message_bytes=target_bytes,
            )
        if best is None and name_length == 0:
            # Off by one at a varint step: go one byte short.
            padding = pull_response_content_bytes(target_bytes - used)
            best = PullRequestLayout(
                response_content_bytes=response_content_bytes,
                tensor_name="",
                padding_bytes=padding,
                message_bytes=used + bytes_field_bytes(padding),
            )
    if best is not None:
        return best
    return PullRequestLayout(
        response_content_bytes=response_content_bytes,
        tensor_name="",
        padding_bytes=0,
        message_bytes=base,
    )
