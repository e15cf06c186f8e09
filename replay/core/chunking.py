"""Chunking of large tensors: a payload above ``--chunk-size`` sent as several calls.

``chunk_workload(workload, limit)`` rewrites a workload so that no call
carries a message larger than ``limit.chunk_bytes`` either way: a call whose
payload is larger becomes consecutive calls of the same shape, method, worker,
server and step, each with one chunk (``chunk_sizes``: all chunks full but the
last).  A pull is cut in whichever direction is too large (a reversed call's
tensor travels in its request), and its small direction is repeated on each
chunk's call.  ``limit`` is anything with a ``chunk_bytes`` (``GrpcSettings``
is one).  The bytes of the cut direction add up to the original's (less
per-message overhead in serialized mode, where sizes are as close as protobuf
allows); order within a step is kept, the chunks of one tensor next to each
other, numbered (``Call.chunk_index`` of ``chunk_count``) so that the
driver gives the chunks of one payload one deadline together.

This is chunking by several unary calls, the form TensorFlow's own transfers
take when a tensor is cut (and what gRPC's message limit forces on a client
that cannot stream).  Latency samples are then per chunk; step times and
bandwidth still cover whole tensors.  Pure: no gRPC (the settings arrive as a
plain number).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from tf_grpc_bench.replay.core.workload import (
    Call,
    Mode,
    Shape,
    Workload,
    ack_call,
    echo_call,
    pull_call,
)


class ChunkLimit(Protocol):
    """What chunking needs to know: the largest payload of one call (0 = no chunking)."""

    @property
    def chunk_bytes(self) -> int: ...


def chunk_sizes(payload_bytes: int, chunk_bytes: int) -> tuple[int, ...]:
    """How a payload of ``payload_bytes`` is cut: one size per message, in order.

    Without chunking (``chunk_bytes`` 0) or when the payload fits that is
    ``(payload_bytes,)``.  The sizes add up to ``payload_bytes``; all but the
    last equal ``chunk_bytes``.
    """
    if payload_bytes < 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes}")
    if chunk_bytes == 0 or payload_bytes <= chunk_bytes:
        return (payload_bytes,)
    full, rest = divmod(payload_bytes, chunk_bytes)
    return (chunk_bytes,) * full + ((rest,) if rest else ())


def _split_buffers(buffers: tuple[int, ...], sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Cut a payload's buffers into groups whose totals are ``sizes`` (splitting buffers)."""
    groups: list[tuple[int, ...]] = []
    remaining = list(buffers)
    for size in sizes:
        group: list[int] = []
        need = size
        while need > 0 and remaining:
            take = min(need, remaining[0])
            group.append(take)
            need -= take
            remaining[0] -= take
            if remaining[0] == 0:
                remaining.pop(0)
        groups.append(tuple(group) or (0,))
    return groups


def _pull_chunks(
    request_bytes: int, response_bytes: int, chunk_bytes: int
) -> list[tuple[int, int]]:
    """(request, response) sizes of the calls carrying one pull in chunks.

    Whichever direction is too large is cut (a reversed call carries its
    tensor in the request); the other, small direction is repeated on every
    chunk's call, as each call of a cut transfer has its own request.  When
    both are too large, both are cut and the shorter list ends in empty messages.
    """
    requests = list(chunk_sizes(request_bytes, chunk_bytes))
    responses = list(chunk_sizes(response_bytes, chunk_bytes))
    count = max(len(requests), len(responses))
    if len(requests) == 1:
        requests *= count
    elif len(responses) == 1:
        responses *= count
    requests += [0] * (count - len(requests))
    responses += [0] * (count - len(responses))
    return list(zip(requests, responses, strict=True))


def _chunk_pull(call: Call, chunk_bytes: int, mode: Mode) -> tuple[Call, ...]:
    pieces = _pull_chunks(call.request_bytes, call.response_bytes, chunk_bytes)
    if len(pieces) == 1:
        return (call,)
    if mode is Mode.NON_SERIALIZED:
        return tuple(
            replace(call, request_bytes=request, response_bytes=response)
            for request, response in pieces
        )
    return tuple(
        pull_call(
            method=call.method,
            request_bytes=request,
            response_bytes=response,
            mode=mode,
            tensor_name=call.tensor_name,
            server_index=call.server_index,
            worker_index=call.worker_index,
            step=call.step,
            offset_ns=call.offset_ns,
            outstanding_at_start=call.outstanding_at_start,
            reversed_direction=call.reversed_direction,
        )
        for request, response in pieces
    )


def chunk_count(call: Call, chunk_bytes: int) -> int:
    """How many calls ``call`` becomes in chunks of ``chunk_bytes`` (without making them)."""
    if chunk_bytes == 0:
        return 1
    sizes = (
        (call.request_bytes, call.response_bytes)
        if call.shape is Shape.PULL
        else (sum(call.buffers),)
    )
    return max(1, *(-(-size // chunk_bytes) for size in sizes))


def chunk_call(call: Call, limit: ChunkLimit, mode: Mode) -> tuple[Call, ...]:
    """One call as the calls that carry it in chunks (itself when it fits), each
    numbered (``Call.chunk_index`` of ``chunk_count``)."""
    chunks = _chunks(call, limit, mode)
    if len(chunks) == 1:
        return chunks
    return tuple(
        replace(chunk, chunk_index=index, chunk_count=len(chunks))
        for index, chunk in enumerate(chunks)
    )


def _chunks(call: Call, limit: ChunkLimit, mode: Mode) -> tuple[Call, ...]:
    if call.shape is Shape.PULL:
        return _chunk_pull(call, limit.chunk_bytes, mode)
    payload = sum(call.buffers)
    sizes = chunk_sizes(payload, limit.chunk_bytes)
    if len(sizes) == 1:
        return (call,)
    make = echo_call if call.shape is Shape.ECHO else ack_call
    return tuple(
        replace(
            make(group, mode, server_index=call.server_index, worker_index=call.worker_index),
            method=call.method,
            step=call.step,
            offset_ns=call.offset_ns,
            tensor_name=call.tensor_name,
            outstanding_at_start=call.outstanding_at_start,
            reversed_direction=call.reversed_direction,
        )
        for group in _split_buffers(call.buffers, sizes)
    )


def chunk_workload(workload: Workload, limit: ChunkLimit) -> Workload:
    """The workload with every payload above ``limit.chunk_bytes`` cut into chunks."""
    if limit.chunk_bytes == 0:
        return workload
    steps = tuple(
        replace(
            step,
            calls=tuple(c for call in step.calls for c in chunk_call(call, limit, workload.mode)),
        )
        for step in workload.steps
    )
    description = (*workload.description, ("chunk_bytes", limit.chunk_bytes))
    return replace(workload, steps=steps, description=description)
