"""Chunking of large tensors: a payload above ``--chunk-size`` sent as several calls.

``chunk_workload(workload, chunk_bytes)`` rewrites a workload so that no call
carries a payload larger than ``chunk_bytes``: a call whose payload is larger
becomes consecutive calls of the same shape, method, worker, server and step,
each with one chunk (``GrpcSettings.chunk_sizes``: all chunks full but the
last).  The bytes each way add up to the original's (less per-message
overhead in serialized mode, where sizes are as close as protobuf allows);
order within a step is kept, the chunks of one tensor next to each other.

This is chunking by several unary calls, the form TensorFlow's own transfers
take when a tensor is cut (and what gRPC's message limit forces on a client
that cannot stream).  Latency samples are then per chunk; step times and
bandwidth still cover whole tensors.  Pure: no gRPC.
"""

from __future__ import annotations

from dataclasses import replace

from tf_grpc_bench.replay.grpc_settings import GrpcSettings
from tf_grpc_bench.replay.workload import (
    Call,
    Mode,
    Shape,
    Workload,
    ack_call,
    echo_call,
    pull_call,
)


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


def chunk_call(call: Call, settings: GrpcSettings, mode: Mode) -> tuple[Call, ...]:
    """One call as the calls that carry it in chunks (itself when it fits)."""
    if call.shape is Shape.PULL:
        sizes = settings.chunk_sizes(call.response_bytes)
        if len(sizes) == 1:
            return (call,)
        if mode is Mode.NON_SERIALIZED:
            return tuple(replace(call, response_bytes=size) for size in sizes)
        return tuple(
            pull_call(
                method=call.method,
                request_bytes=call.request_bytes,
                response_bytes=size,
                mode=mode,
                tensor_name=call.tensor_name,
                server_index=call.server_index,
                worker_index=call.worker_index,
                step=call.step,
                offset_ns=call.offset_ns,
                outstanding_at_start=call.outstanding_at_start,
                reversed_direction=call.reversed_direction,
            )
            for size in sizes
        )
    payload = sum(call.buffers)
    sizes = settings.chunk_sizes(payload)
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


def chunk_workload(workload: Workload, settings: GrpcSettings) -> Workload:
    """The workload with every payload above ``settings.chunk_bytes`` cut into chunks."""
    if settings.chunk_bytes == 0:
        return workload
    steps = tuple(
        replace(
            step,
            calls=tuple(
                c for call in step.calls for c in chunk_call(call, settings, workload.mode)
            ),
        )
        for step in workload.steps
    )
    description = (*workload.description, ("chunk_bytes", settings.chunk_bytes))
    return replace(workload, steps=steps, description=description)
