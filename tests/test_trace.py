"""The trace format: round trips, validation, and every way a file can be bad."""

from __future__ import annotations

import io
import json
import os
import re
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench import trace as trace_model
from tf_grpc_bench import trace_files, trace_summary
from tf_grpc_bench.errors import TraceError, UnsupportedVersionError
from tf_grpc_bench.protos import trace_pb2
from tf_grpc_bench.sizes import MIB, SizeCategory, classify
from tf_grpc_bench.trace import Rpc, RunMetadata, Step, Task, TensorInfo, Trace

from .conftest import make_trace

_tensor = st.builds(
    TensorInfo,
    rendezvous_key=st.text(max_size=40),
    dtype=st.sampled_from(["", "float32", "bool"]),
    shape=st.lists(st.integers(0, 1 << 20), max_size=4).map(tuple),
    content_bytes=st.integers(0, 1 << 40),
)


@st.composite
def _traces(draw: st.DrawFn) -> Trace:
    task_count = draw(st.integers(1, 4))
    tasks = tuple(
        Task(
            job=draw(st.sampled_from(["ps", "worker", "chief"])) + str(i),
            index=i,
            address=draw(st.text(max_size=20)),
        )
        for i in range(task_count)
    )

    def rpc() -> Rpc:
        start = draw(st.integers(0, 1 << 50))
        return Rpc(
            method="/" + draw(st.text(min_size=1, max_size=30)),
            caller_task=draw(st.integers(0, task_count - 1)),
            callee_task=draw(st.integers(0, task_count - 1)),
            request_bytes=draw(st.integers(0, 1 << 40)),
            response_bytes=draw(st.integers(0, 1 << 40)),
            start_ns=start,
            response_start_ns=start + draw(st.integers(0, 1000)),
            end_ns=start + draw(st.integers(0, 10**9)),
            tensor=draw(st.none() | _tensor),
            outstanding_at_start=draw(st.integers(0, 100)),
            status_code=draw(st.integers(0, 16)),
        )

    steps = tuple(
        Step(
            index=i * 2,
            start_ns=i,
            end_ns=i + 5,
            rpcs=tuple(rpc() for _ in range(draw(st.integers(0, 5)))),
        )
        for i in range(draw(st.integers(0, 4)))
    )
    return Trace(
        metadata=RunMetadata(
            model=draw(st.text(max_size=10)),
            batch_size=draw(st.integers(0, 512)),
            input_shape=tuple(draw(st.lists(st.integers(0, 512), max_size=3))),
            command=tuple(draw(st.lists(st.text(max_size=8), max_size=3))),
            extra=tuple(
                sorted(draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5))).items())
            ),
        ),
        tasks=tasks,
        steps=steps,
        partial=draw(st.booleans()),
        partial_reason=draw(st.text(max_size=10)),
    )


@settings(max_examples=60, deadline=None)
@given(_traces())
def test_binary_round_trip_gives_back_the_same_trace(trace: Trace) -> None:
    buffer = io.BytesIO()
    trace_model.dump_trace(trace, buffer)
    assert trace_model.load_trace(io.BytesIO(buffer.getvalue())) == trace


@settings(max_examples=60, deadline=None)
@given(_traces())
def test_json_export_round_trips_and_is_plain_json(trace: Trace) -> None:
    document = json.loads(json.dumps(trace_model.trace_to_json_dict(trace)))
    assert trace_model.trace_from_json_dict(document) == trace


def test_write_then_read_file(tmp_path: Path, small_trace: Trace) -> None:
    path = tmp_path / "a" / "t.tfgbtrace"
    trace_files.write_trace(small_trace, path)
    assert trace_files.read_trace(path) == small_trace
    assert len(trace_files.file_sha256(path)) == 64


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty"),
        (b"TFGB", "truncated"),
        (b"PK\x03\x04 something else", "not a tf-grpc-bench trace"),
        (trace_model.MAGIC + b"garbage that is not zlib", "corrupt"),
    ],
)
def test_bad_files_are_refused_with_the_reason(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "bad.tfgbtrace"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=expected) as error:
        trace_files.read_trace(path)
    assert str(path) in str(error.value)


def test_truncated_file_is_refused(small_trace_file: Path) -> None:
    data = small_trace_file.read_bytes()
    small_trace_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated"):
        trace_files.read_trace(small_trace_file)


def test_flipped_byte_is_detected(small_trace_file: Path) -> None:
    data = bytearray(small_trace_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    small_trace_file.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=r"small\.tfgbtrace: trace is (corrupt|truncated)"):
        trace_files.read_trace(small_trace_file)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        trace_files.read_trace(tmp_path / "nope.tfgbtrace")


def _raw(message: trace_pb2.Trace) -> io.BytesIO:
    return io.BytesIO(trace_model.MAGIC + zlib.compress(message.SerializeToString()))


# Version 0 is what a message without the field reads as; 2 is the next, not yet defined.
@pytest.mark.parametrize("version", [0, 2, 99, 2**32 - 1])
def test_a_binary_trace_of_any_other_version_than_1_is_refused(
    small_trace: Trace, version: int
) -> None:
    message = trace_model.trace_to_proto(small_trace)
    message.format_version = version
    with pytest.raises(
        UnsupportedVersionError,
        match=rf"^t\.tfgbtrace: format_version {version} is not supported "
        r"\(this tool reads versions \[1\]\); upgrade tf-grpc-bench or re-capture the trace$",
    ):
        trace_model.load_trace(_raw(message), source="t.tfgbtrace")


def test_a_binary_trace_without_a_format_version_is_refused(small_trace: Trace) -> None:
    message = trace_model.trace_to_proto(small_trace)
    message.ClearField("format_version")
    with pytest.raises(UnsupportedVersionError, match=r"^trace: format_version 0 is not supported"):
        trace_model.load_trace(_raw(message))


def test_version_1_is_the_one_written_and_read() -> None:
    assert trace_model.FORMAT_VERSION == 1
    assert frozenset({1}) == trace_model.READABLE_VERSIONS
    message = trace_model.trace_to_proto(make_trace(steps=1))
    assert message.format_version == 1
    assert trace_model.load_trace(_raw(message)).format_version == 1


@pytest.mark.parametrize("version", [0, 2, -1, 99, None, "1", 1.5])
def test_a_json_trace_of_any_other_version_than_1_is_refused(
    small_trace: Trace, version: object
) -> None:
    document = trace_model.trace_to_json_dict(small_trace)
    document["format_version"] = version
    with pytest.raises(
        UnsupportedVersionError,
        match=rf"^t\.json: format_version {re.escape(repr(version))} is not supported "
        r"\(this tool reads versions \[1\]\)$",
    ):
        trace_model.trace_from_json_dict(document, source="t.json")


def test_a_json_trace_without_a_format_version_is_refused(small_trace: Trace) -> None:
    document = trace_model.trace_to_json_dict(small_trace)
    del document["format_version"]
    with pytest.raises(UnsupportedVersionError, match=r"^trace JSON: format_version None is not"):
        trace_model.trace_from_json_dict(document)


@pytest.mark.parametrize("version", [0, 2, -1])
def test_a_trace_built_in_memory_with_another_version_is_refused(version: int) -> None:
    with pytest.raises(
        UnsupportedVersionError,
        match=rf"^format_version {version} is not supported \(this tool reads versions \[1\]\)$",
    ):
        Trace(metadata=RunMetadata(), tasks=(), steps=(), format_version=version)


def test_rpc_naming_a_missing_task_is_refused(small_trace: Trace) -> None:
    message = trace_model.trace_to_proto(small_trace)
    message.steps[1].rpcs[2].callee_task = 7
    with pytest.raises(TraceError, match=r"steps\[1\]\.rpcs\[2\]\.callee_task"):
        trace_model.load_trace(_raw(message))


def test_rpc_ending_before_it_starts_is_refused(small_trace: Trace) -> None:
    message = trace_model.trace_to_proto(small_trace)
    message.steps[0].rpcs[0].end_ns = message.steps[0].rpcs[0].start_ns - 1
    with pytest.raises(TraceError, match="end_ns"):
        trace_model.load_trace(_raw(message))


def test_negative_sizes_in_json_are_refused(small_trace: Trace) -> None:
    document = trace_model.trace_to_json_dict(small_trace)
    document["steps"][0]["rpcs"][0]["response_bytes"] = -5
    with pytest.raises(TraceError, match="response_bytes must be >= 0"):
        trace_model.trace_from_json_dict(document)


def test_outstanding_counts_overlapping_calls_on_the_same_pair() -> None:
    def call(start: int, end: int, callee: int = 0) -> Rpc:
        return Rpc(
            method="/a/B",
            caller_task=1,
            callee_task=callee,
            request_bytes=1,
            response_bytes=1,
            start_ns=start,
            end_ns=end,
        )

    result = trace_model.with_outstanding(
        [call(0, 10), call(5, 20), call(12, 30), call(6, 7, callee=2)]
    )
    assert [r.outstanding_at_start for r in result] == [0, 1, 0, 1]


def test_summary_counts_categories_bytes_and_methods() -> None:
    trace = make_trace(steps=1, sizes=(21, 4096, 2 * MIB))
    summary = trace_summary.summarize_rpcs(trace.steps[0].rpcs)
    assert summary.rpc_count == 3
    assert dict(summary.category_counts) == {
        SizeCategory.SMALL: 1,
        SizeCategory.MEDIUM: 1,
        SizeCategory.LARGE: 1,
    }
    assert summary.response_bytes == 21 + 4096 + 2 * MIB
    assert summary.request_bytes == 3 * 120
    assert dict(summary.rpcs_per_method) == {"RecvTensor": 3}
    text = trace_summary.format_summary(trace)
    assert "RecvTensor=3" in text


@given(st.integers(0, 20 * MIB))
def test_every_size_has_exactly_one_category(size: int) -> None:
    category = classify(size)
    if size == 0:
        assert category is SizeCategory.SMALL
    elif size > 10 * MIB:
        assert category is SizeCategory.LARGE
    else:
        assert category.minimum_bytes <= size <= category.maximum_bytes


def test_written_trace_is_readable_by_others_as_the_umask_allows(
    tmp_path: Path, small_trace: Trace
) -> None:
    path = tmp_path / "shared.tfgbtrace"
    previous = os.umask(0o022)
    try:
        trace_files.write_trace(small_trace, path)
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o644


def test_shipped_traces_are_valid_and_the_default_is_resnet50() -> None:
    names = trace_files.shipped_trace_names()
    assert {
        "resnet50-tf2ps.tfgbtrace",
        "inceptionv3-tf2ps.tfgbtrace",
        "vgg16-tf2ps.tfgbtrace",
        "alexnet-tf2ps.tfgbtrace",
        "resnet50-tf1ps.tfgbtrace",
    } <= set(names)
    default = trace_files.default_trace_path()
    assert default is not None and default.name == "resnet50-tf2ps.tfgbtrace"
    for name in names:
        shipped = trace_files.read_trace(trace_files.shipped_trace_path(name))
        assert shipped.steps and not shipped.partial
        assert shipped.metadata.command[:2] == ("tf-grpc-bench", "capture")
