"""A trace as plain JSON, for other tools: export and import.  Integers stay integers.

``trace_to_json_dict`` gives every field of the model under its own name (the
names of the protobuf message, docs/trace-format.md); ``trace_from_json_dict``
reads that back and validates it as the file format's reader does.  Pure:
plain dicts in and out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tf_grpc_bench.errors import TraceError, UnsupportedVersionError
from tf_grpc_bench.trace import (
    READABLE_VERSIONS,
    ClockAlignment,
    ClockOffset,
    Phase,
    Rpc,
    RunMetadata,
    SetAside,
    Step,
    StepDetection,
    Task,
    TensorInfo,
    Trace,
)


def trace_to_json_dict(trace: Trace) -> dict[str, Any]:
    """A plain-JSON view of the trace (``format`` names the document kind)."""

    def convert(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [convert(item) for item in value]
        return value

    document = convert(trace)
    document["metadata"]["extra"] = dict(trace.metadata.extra)
    return {"format": "tf-grpc-bench-trace", **document}


def trace_from_json_dict(document: dict[str, Any], *, source: str = "trace JSON") -> Trace:
    """Inverse of ``trace_to_json_dict``; validates like ``load_trace``."""
    if document.get("format") != "tf-grpc-bench-trace":
        raise TraceError(f"{source}: 'format' must be 'tf-grpc-bench-trace'")
    version = document.get("format_version")
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"{source}: format_version {version!r} is not supported "
            f"(this tool reads versions {sorted(READABLE_VERSIONS)})"
        )

    def rpc(item: dict[str, Any]) -> Rpc:
        tensor = item.get("tensor")
        fields = {k: v for k, v in item.items() if k != "tensor"}
        return Rpc(
            **fields,
            tensor=None
            if tensor is None
            else TensorInfo(**{**tensor, "shape": tuple(tensor.get("shape", ()))}),
        )

    def phase(item: dict[str, Any] | None) -> Phase:
        item = item or {}
        return Phase(
            start_ns=item.get("start_ns", 0),
            end_ns=item.get("end_ns", 0),
            rpcs=tuple(rpc(r) for r in item.get("rpcs", ())),
        )

    try:
        meta = dict(document.get("metadata", {}))
        meta["input_shape"] = tuple(meta.get("input_shape", ()))
        meta["command"] = tuple(meta.get("command", ()))
        meta["extra"] = tuple(sorted(dict(meta.get("extra", {})).items()))
        return Trace(
            format_version=version,
            metadata=RunMetadata(**meta),
            tasks=tuple(Task(**t) for t in document["tasks"]),
            startup=phase(document.get("startup")),
            steps=tuple(
                Step(
                    index=s["index"],
                    start_ns=s["start_ns"],
                    end_ns=s["end_ns"],
                    rpcs=tuple(rpc(r) for r in s["rpcs"]),
                )
                for s in document["steps"]
            ),
            teardown=phase(document.get("teardown")),
            partial=bool(document.get("partial", False)),
            partial_reason=str(document.get("partial_reason", "")),
            step_detection=_detection_from_json(document.get("step_detection")),
            clock_alignment=_alignment_from_json(document.get("clock_alignment")),
        )
    except TraceError as error:
        raise type(error)(f"{source}: {error}") from None
    except KeyError as error:
        raise TraceError(f"{source}: missing field {error}") from None
    except (TypeError, ValueError) as error:
        raise TraceError(f"{source}: invalid trace: {error}") from None


def _detection_from_json(item: dict[str, Any] | None) -> StepDetection:
    item = dict(item or {})
    item["set_aside"] = tuple(SetAside(**s) for s in item.get("set_aside", ()))
    return StepDetection(**item)


def _alignment_from_json(item: dict[str, Any] | None) -> ClockAlignment:
    item = dict(item or {})
    item["tasks"] = tuple(ClockOffset(**t) for t in item.get("tasks", ()))
    return ClockAlignment(**item)
