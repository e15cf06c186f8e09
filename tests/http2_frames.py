"""HTTP/2 frames as real peers send them, written by hyperframe and hpack, for the
tests of the follower (test_http2_follower.py) and of the in-process recorder
(test_wiretap.py)."""

from __future__ import annotations

import hpack
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame

REQUEST_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/tensorflow.WorkerService/RecvTensor"),
    (":authority", "127.0.0.1:2222"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def grpc_message(payload: bytes, *, compressed: bool = False) -> bytes:
    return bytes([1 if compressed else 0]) + len(payload).to_bytes(4, "big") + payload


def data_frames(stream_id: int, data: bytes, *, size: int, end_stream: bool, pad: int = 0) -> bytes:
    """``data`` cut into DATA frames of at most ``size`` bytes (optionally PADDED)."""
    out = b""
    pieces = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
    for number, piece in enumerate(pieces):
        frame = DataFrame(stream_id, piece)
        if pad:
            frame.flags.add("PADDED")
            frame.pad_length = pad
        if end_stream and number == len(pieces) - 1:
            frame.flags.add("END_STREAM")
        out += frame.serialize()
    return out


def headers_frames(
    encoder: hpack.Encoder,
    stream_id: int,
    headers: list[tuple[str, str]],
    *,
    end_stream: bool = False,
    split: int = 0,
    padded: bool = False,
) -> bytes:
    """A header block as one HEADERS frame, or HEADERS + CONTINUATIONs of ``split`` bytes."""
    block = encoder.encode(headers)
    fragments = [block[i : i + split] for i in range(0, len(block), split)] if split else [block]
    first = HeadersFrame(stream_id, fragments[0])
    if padded:
        first.flags.add("PADDED")
        first.pad_length = 7
        first.flags.add("PRIORITY")
        first.depends_on = 0
        first.stream_weight = 15
    if end_stream:
        first.flags.add("END_STREAM")
    out = b""
    frames = [first] + [ContinuationFrame(stream_id, f) for f in fragments[1:]]
    frames[-1].flags.add("END_HEADERS")
    for frame in frames:
        out += frame.serialize()
    return out
