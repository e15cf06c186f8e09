"""The trace format: round trips, validation, and every way a file can be bad."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_grpc_bench import (
    calibration,
    capture_cpu,
    host,
    trace_files,
    trace_format,
    trace_json,
    trace_summary,
)
from tf_grpc_bench import trace as trace_model
from tf_grpc_bench.errors import ConfigError, TraceError, UnsupportedVersionError
from tf_grpc_bench.protos import trace_pb2
from tf_grpc_bench.sizes import MIB, SizeCategory, classify
from tf_grpc_bench.trace import Rpc, RunMetadata, Step, Task, TensorInfo, Trace

from .conftest import make_trace, with_step_lengths

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
    trace_format.dump_trace(trace, buffer)
    assert trace_format.load_trace(io.BytesIO(buffer.getvalue())) == trace


@settings(max_examples=60, deadline=None)
@given(_traces())
def test_json_export_round_trips_and_is_plain_json(trace: Trace) -> None:
    document = json.loads(json.dumps(trace_json.trace_to_json_dict(trace)))
    assert trace_json.trace_from_json_dict(document) == trace


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
        (trace_format.MAGIC + b"garbage that is not zlib", "corrupt"),
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
    return io.BytesIO(trace_format.MAGIC + zlib.compress(message.SerializeToString()))


# Version 0 is what a message without the field reads as; 3 is the next, not yet defined.
@pytest.mark.parametrize("version", [0, 4, 99, 2**32 - 1])
def test_a_binary_trace_of_a_version_this_tool_does_not_read_is_refused(
    small_trace: Trace, version: int
) -> None:
    message = trace_format.trace_to_proto(small_trace)
    message.format_version = version
    with pytest.raises(
        UnsupportedVersionError,
        match=rf"^t\.tfgbtrace: format_version {version} is not supported "
        r"\(this tool reads versions \[1, 2, 3\]\); upgrade tf-grpc-bench or re-capture the trace$",
    ):
        trace_format.load_trace(_raw(message), source="t.tfgbtrace")


def test_a_binary_trace_without_a_format_version_is_refused(small_trace: Trace) -> None:
    message = trace_format.trace_to_proto(small_trace)
    message.ClearField("format_version")
    with pytest.raises(UnsupportedVersionError, match=r"^trace: format_version 0 is not supported"):
        trace_format.load_trace(_raw(message))


def test_version_3_is_written_and_versions_1_2_and_3_are_read() -> None:
    assert trace_model.FORMAT_VERSION == 3
    assert frozenset({1, 2, 3}) == trace_model.READABLE_VERSIONS
    message = trace_format.trace_to_proto(make_trace(steps=1))
    assert message.format_version == 3
    assert trace_format.load_trace(_raw(message)).format_version == 3
    for older in (2, 1):
        message.format_version = older
        trace = trace_format.load_trace(_raw(message))
        assert trace.format_version == older and trace.clock_alignment.empty


def test_clock_alignment_round_trips_and_needs_format_version_3(tmp_path: Path) -> None:
    alignment = trace_model.ClockAlignment(
        reference="ps:0",
        method="wire",
        tasks=(
            trace_model.ClockOffset(task="ps:0", host="a", source="reference"),
            trace_model.ClockOffset(
                task="worker:0",
                host="b",
                offset_ns=-7,
                lower_ns=-9,
                upper_ns=-5,
                source="wire",
                constraints=4,
            ),
            trace_model.ClockOffset(
                task="worker:1", host="c", offset_ns=3, lower_ns=3, source="wire"
            ),
        ),
    )
    trace = dataclasses.replace(make_trace(steps=1), clock_alignment=alignment)
    assert trace_format.trace_from_proto(trace_format.trace_to_proto(trace)) == trace
    assert trace_json.trace_from_json_dict(trace_json.trace_to_json_dict(trace)) == trace
    assert alignment.tasks[1].uncertainty_ns == 2 and alignment.tasks[2].uncertainty_ns is None
    with pytest.raises(TraceError, match=r"^clock_alignment needs format version 3 or later"):
        dataclasses.replace(trace, format_version=2)
    with pytest.raises(ValueError, match="lower bound above upper bound"):
        trace_model.ClockOffset(task="x:0", lower_ns=2, upper_ns=1)


@pytest.mark.parametrize("version", [0, 4, -1, 99, None, "1", 1.5])
def test_a_json_trace_of_a_version_this_tool_does_not_read_is_refused(
    small_trace: Trace, version: object
) -> None:
    document = trace_json.trace_to_json_dict(small_trace)
    document["format_version"] = version
    with pytest.raises(
        UnsupportedVersionError,
        match=rf"^t\.json: format_version {re.escape(repr(version))} is not supported "
        r"\(this tool reads versions \[1, 2, 3\]\)$",
    ):
        trace_json.trace_from_json_dict(document, source="t.json")


def test_a_json_trace_without_a_format_version_is_refused(small_trace: Trace) -> None:
    document = trace_json.trace_to_json_dict(small_trace)
    del document["format_version"]
    with pytest.raises(UnsupportedVersionError, match=r"^trace JSON: format_version None is not"):
        trace_json.trace_from_json_dict(document)


@pytest.mark.parametrize("version", [0, 4, -1])
def test_a_trace_built_in_memory_with_another_version_is_refused(version: int) -> None:
    with pytest.raises(
        UnsupportedVersionError,
        match=rf"^format_version {version} is not supported "
        r"\(this tool reads versions \[1, 2, 3\]\)$",
    ):
        Trace(metadata=RunMetadata(), tasks=(), steps=(), format_version=version)


def test_rpc_naming_a_missing_task_is_refused(small_trace: Trace) -> None:
    message = trace_format.trace_to_proto(small_trace)
    message.steps[1].rpcs[2].callee_task = 7
    with pytest.raises(TraceError, match=r"steps\[1\]\.rpcs\[2\]\.callee_task"):
        trace_format.load_trace(_raw(message))


def test_rpc_ending_before_it_starts_is_refused(small_trace: Trace) -> None:
    message = trace_format.trace_to_proto(small_trace)
    message.steps[0].rpcs[0].end_ns = message.steps[0].rpcs[0].start_ns - 1
    with pytest.raises(TraceError, match="end_ns"):
        trace_format.load_trace(_raw(message))


def test_negative_sizes_in_json_are_refused(small_trace: Trace) -> None:
    document = trace_json.trace_to_json_dict(small_trace)
    document["steps"][0]["rpcs"][0]["response_bytes"] = -5
    with pytest.raises(TraceError, match="response_bytes must be >= 0"):
        trace_json.trace_from_json_dict(document)


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


def test_the_same_job_is_shipped_from_two_cpu_models_with_what_a_calibration_needs() -> None:
    def extra(name: str) -> tuple[tuple[str, str], ...]:
        return trace_files.read_trace(trace_files.shipped_trace_path(name)).metadata.extra

    first = dict(extra("resnet50-tf2ps"))
    others = [n for n in trace_files.shipped_trace_names() if n.startswith("resnet50-tf2ps-")]
    assert others, "resnet50-tf2ps captured again on another CPU model"
    for name in others:
        other = extra(name)
        assert dict(other)[host.CPU_MODEL_EXTRA] != first[host.CPU_MODEL_EXTRA]
        # Its step timed by kind of work, and the CPU its tasks spent: what a replay on
        # another machine scales and what a compute load is sized from.
        assert dict(other)[calibration.CALIBRATION_PARTS_EXTRA]
        recorded = capture_cpu.from_extra(other)
        assert recorded is not None and recorded.tasks_cores > 0


# --------------------------------------------------------------------------
# The model's rules and every refusal, with their exact messages.


def test_tasks_are_named_as_tensorflow_names_them_and_refuse_nonsense() -> None:
    assert Task(job="ps", index=3).name == "/job:ps/task:3"
    with pytest.raises(ValueError, match=r"^task job name must not be empty$"):
        Task(job="", index=0)
    with pytest.raises(ValueError, match=r"^task index must be >= 0, got -1$"):
        Task(job="ps", index=-1)
    assert Task(job="ps", index=0).address == ""


def test_edge_name_is_the_fourth_part_of_a_full_rendezvous_key() -> None:
    key = "/job:ps/task:0/device:CPU:0;1;/job:worker/task:0/device:CPU:0;edge_7_w;0:0"
    assert TensorInfo(rendezvous_key=key).edge_name == "edge_7_w"
    assert TensorInfo(rendezvous_key="a;b;c;d").edge_name == ""
    assert TensorInfo(rendezvous_key="a;b;c;d;e;f").edge_name == "d"
    assert TensorInfo().edge_name == ""


def _rpc(**fields: object) -> Rpc:
    values: dict[str, object] = {
        "method": "/pkg.Service/Name",
        "caller_task": 0,
        "callee_task": 1,
        "request_bytes": 10,
        "response_bytes": 20,
        "start_ns": 5,
        "end_ns": 12,
    }
    values.update(fields)
    return Rpc(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    [
        "caller_task",
        "callee_task",
        "request_bytes",
        "response_bytes",
        "outstanding_at_start",
        "status_code",
    ],
)
def test_an_rpc_refuses_a_negative_count(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be >= 0, got -1$"):
        _rpc(**{name: -1})
    assert getattr(_rpc(**{name: 0}), name) == 0


def test_an_rpc_has_a_full_method_path_and_does_not_end_before_it_starts() -> None:
    with pytest.raises(
        ValueError,
        match=r"^method must be a full gRPC path like /pkg\.Service/Name, got 'RecvTensor'$",
    ):
        _rpc(method="RecvTensor")
    with pytest.raises(ValueError, match=r"^end_ns \(4\) is before start_ns \(5\)$"):
        _rpc(end_ns=4)
    rpc = _rpc(end_ns=5)
    assert (rpc.duration_ns, rpc.short_method) == (0, "Name")
    assert _rpc().duration_ns == 7
    assert trace_model.payload_bytes(_rpc()) == 20
    assert trace_model.payload_bytes(_rpc(request_bytes=30)) == 30


def test_a_step_does_not_end_before_it_starts() -> None:
    with pytest.raises(ValueError, match=r"^step 3: end_ns is before start_ns$"):
        Step(index=3, start_ns=10, end_ns=9, rpcs=())
    assert Step(index=3, start_ns=10, end_ns=10, rpcs=()).duration_ns == 0
    assert Step(index=3, start_ns=10, end_ns=25, rpcs=()).duration_ns == 15


TWO_TASKS = (Task(job="worker", index=1), Task(job="ps", index=0), Task(job="worker", index=0))


def test_a_trace_finds_its_tasks_by_job_in_index_order() -> None:
    trace = Trace(metadata=RunMetadata(), tasks=TWO_TASKS, steps=())
    assert trace.tasks_of_job("worker") == [2, 0]
    assert trace.tasks_of_job("ps") == [1]
    assert trace.tasks_of_job("chief") == []
    assert trace.task_name(2) == "/job:worker/task:0"
    assert (trace.partial, trace.partial_reason, trace.format_version) == (False, "", 3)


def test_a_trace_refuses_a_task_twice_a_missing_task_and_steps_out_of_order() -> None:
    with pytest.raises(TraceError, match=r"^tasks: /job:ps/task:0 is listed twice$"):
        Trace(metadata=RunMetadata(), tasks=(*TWO_TASKS, Task(job="ps", index=0)), steps=())
    late = Step(index=1, start_ns=0, end_ns=1, rpcs=(_rpc(caller_task=3),))
    with pytest.raises(
        TraceError,
        match=r"^steps\[0\]\.rpcs\[0\]\.caller_task: task 3 does not exist "
        r"\(the trace lists 3 tasks\)$",
    ):
        Trace(metadata=RunMetadata(), tasks=TWO_TASKS, steps=(late,))
    ok = _rpc(caller_task=2, callee_task=2)
    assert Trace(
        metadata=RunMetadata(),
        tasks=TWO_TASKS,
        steps=(Step(index=0, start_ns=0, end_ns=1, rpcs=(ok,)),),
    )
    for phase in ("startup", "teardown"):
        with pytest.raises(TraceError, match=rf"^{phase}\.rpcs\[0\]\.callee_task: task 3 does"):
            Trace(
                metadata=RunMetadata(),
                tasks=TWO_TASKS,
                steps=(),
                **{phase: trace_model.Phase(rpcs=(_rpc(callee_task=3),))},
            )
    steps = (
        Step(index=2, start_ns=0, end_ns=1, rpcs=()),
        Step(index=2, start_ns=1, end_ns=2, rpcs=()),
    )
    with pytest.raises(TraceError, match=r"^steps\[1\]\.index: 2 does not follow 2$"):
        Trace(metadata=RunMetadata(), tasks=TWO_TASKS, steps=steps)


def test_binary_files_that_are_not_whole_traces_are_refused_with_the_reason() -> None:
    whole = io.BytesIO()
    trace_format.dump_trace(make_trace(steps=1), whole)
    data = whole.getvalue()
    assert data.startswith(b"TFGBTRC\n")
    assert zlib.decompress(data[8:])  # the rest is one zlib stream
    cases = [
        (b"", r"^t: file is empty \(expected a tf-grpc-bench trace\)$"),
        (b"TFGB", r"^t: file is truncated \(only 4 bytes\)$"),
        (b"TFGBTRC", r"^t: file is truncated \(only 7 bytes\)$"),
        (b"XFGBTRC\nabc", r"^t: not a tf-grpc-bench trace \(missing the TFGBTRC header\)$"),
        (data[:-3], r"^t: trace is truncated \(compressed stream ends early\)$"),
        (data + b"abc", r"^t: trace is corrupt \(3 unexpected bytes after the end of the trace\)$"),
        (b"TFGBTRC\n" + b"\x78\x9c" + b"\xff" * 20, r"^t: trace is corrupt \(Error -3 "),
        (
            b"TFGBTRC\n" + zlib.compress(b"\xff\xff\xff"),
            r"^t: trace is corrupt \(protobuf: Error parsing message",
        ),
    ]
    for content, message in cases:
        with pytest.raises(TraceError, match=message):
            trace_format.load_trace(io.BytesIO(content), source="t")


def test_json_that_is_not_a_trace_is_refused_with_the_reason(small_trace: Trace) -> None:
    document = trace_json.trace_to_json_dict(small_trace)
    assert document["format"] == "tf-grpc-bench-trace"
    assert document["metadata"]["extra"] == {}
    with pytest.raises(TraceError, match=r"^j: 'format' must be 'tf-grpc-bench-trace'$"):
        trace_json.trace_from_json_dict({**document, "format": "other"}, source="j")
    with pytest.raises(TraceError, match=r"^j: missing field 'tasks'$"):
        trace_json.trace_from_json_dict(
            {k: v for k, v in document.items() if k != "tasks"}, source="j"
        )
    broken = json.loads(json.dumps(document))
    broken["steps"][0]["rpcs"][0]["colour"] = "blue"
    with pytest.raises(TraceError, match=r"^j: invalid trace: .*colour"):
        trace_json.trace_from_json_dict(broken, source="j")
    twice = json.loads(json.dumps(document))
    twice["tasks"].append(twice["tasks"][0])
    with pytest.raises(TraceError, match=r"^j: tasks: /job:ps/task:0 is listed twice$"):
        trace_json.trace_from_json_dict(twice, source="j")


def test_json_phases_and_flags_may_be_left_out(small_trace: Trace) -> None:
    document = trace_json.trace_to_json_dict(small_trace)
    for key in ("startup", "teardown", "partial", "partial_reason", "metadata"):
        document.pop(key)
    document["steps"][0]["rpcs"][0].pop("tensor")
    trace = trace_json.trace_from_json_dict(document)
    assert trace.startup == trace_model.Phase() == trace.teardown
    assert (trace.partial, trace.partial_reason, trace.metadata) == (False, "", RunMetadata())
    assert trace.steps[0].rpcs[0].tensor is None
    phase = {"rpcs": [trace_json.trace_to_json_dict(small_trace)["steps"][0]["rpcs"][0]]}
    phase["rpcs"][0]["tensor"].pop("shape")
    document["startup"] = phase
    assert trace_json.trace_from_json_dict(document).startup.rpcs[0].tensor.shape == ()  # type: ignore[union-attr]
    assert trace_json.trace_from_json_dict(document).startup.start_ns == 0


def test_every_field_survives_the_binary_and_the_json_round_trip() -> None:
    rpc = _rpc(
        caller_task=0,
        callee_task=1,
        request_bytes=11,
        response_bytes=22,
        start_ns=33,
        response_start_ns=44,
        end_ns=55,
        outstanding_at_start=6,
        status_code=7,
        tensor=TensorInfo(rendezvous_key="k", dtype="float16", shape=(2, 3), content_bytes=12),
    )
    trace = Trace(
        metadata=RunMetadata(
            model="m",
            tensorflow_version="2.21.0",
            strategy="s",
            synchronous=True,
            batch_size=4,
            input_shape=(8, 8, 3),
            trainable_parameters=99,
            capture_method="preload",
            host="h",
            command=("a", "b"),
            tool_version="0.1.0",
            created_utc="2026-12-01T00:00:00Z",
            extra=(("k1", "v1"), ("k2", "v2")),
        ),
        tasks=(Task(job="ps", index=0, address="a:1"), Task(job="worker", index=0, address="b:2")),
        startup=trace_model.Phase(start_ns=1, end_ns=2, rpcs=(rpc,)),
        steps=(Step(index=4, start_ns=30, end_ns=60, rpcs=(rpc,)),),
        teardown=trace_model.Phase(start_ns=70, end_ns=80, rpcs=(rpc,)),
        partial=True,
        partial_reason="stopped",
    )
    buffer = io.BytesIO()
    trace_format.dump_trace(trace, buffer)
    assert trace_format.load_trace(io.BytesIO(buffer.getvalue())) == trace
    assert (
        trace_json.trace_from_json_dict(
            json.loads(json.dumps(trace_json.trace_to_json_dict(trace)))
        )
        == trace
    )
    message = trace_format.trace_to_proto(trace)
    assert (message.teardown.start_ns, message.teardown.end_ns) == (70, 80)
    assert dict(message.metadata.extra) == {"k1": "v1", "k2": "v2"}


def test_a_call_ending_as_the_next_starts_is_not_outstanding() -> None:
    def call(start: int, end: int) -> Rpc:
        return _rpc(caller_task=1, callee_task=0, start_ns=start, end_ns=end)

    result = trace_model.with_outstanding([call(10, 20), call(0, 10), call(10, 11), call(19, 30)])
    assert [(r.start_ns, r.outstanding_at_start) for r in result] == [
        (0, 0),
        (10, 0),
        (10, 1),
        (19, 1),
    ]


# --------------------------------------------------------------------------
# Format version 2: how the steps were found.

DETECTION = trace_model.StepDetection(
    source="step-id",
    unit="WORKER_STEP",
    rule="runs that move every variable both ways",
    candidates=9,
    set_aside=(
        trace_model.SetAside(reason="warm-up", phase="startup", runs=2, rpcs=40, bytes=5000),
        trace_model.SetAside(reason="cut short", phase="teardown", runs=1, rpcs=3, bytes=60),
    ),
)


def test_step_detection_survives_the_binary_and_the_json_round_trip() -> None:
    trace = dataclasses.replace(make_trace(steps=1), step_detection=DETECTION)
    buffer = io.BytesIO()
    trace_format.dump_trace(trace, buffer)
    again = trace_format.load_trace(io.BytesIO(buffer.getvalue()))
    assert again.step_detection == DETECTION
    message = trace_format.trace_to_proto(trace)
    assert [
        (s.reason, s.phase, s.runs, s.rpcs, s.bytes) for s in message.step_detection.set_aside
    ] == [
        ("warm-up", "startup", 2, 40, 5000),
        ("cut short", "teardown", 1, 3, 60),
    ]
    assert (message.step_detection.source, message.step_detection.unit) == (
        "step-id",
        "WORKER_STEP",
    )
    assert message.step_detection.candidates == 9
    assert message.step_detection.rule == "runs that move every variable both ways"
    document = json.loads(json.dumps(trace_json.trace_to_json_dict(trace)))
    assert trace_json.trace_from_json_dict(document).step_detection == DETECTION
    del document["step_detection"]
    assert trace_json.trace_from_json_dict(document).step_detection.empty


def test_an_empty_step_detection_is_not_written() -> None:
    message = trace_format.trace_to_proto(make_trace(steps=1))
    assert not message.HasField("step_detection")
    assert trace_model.StepDetection().empty and not DETECTION.empty


def test_a_version_1_trace_cannot_carry_a_step_detection() -> None:
    with pytest.raises(
        TraceError,
        match=r"^step_detection needs format version 2 or later \(this trace says 1\)$",
    ):
        dataclasses.replace(make_trace(steps=1), format_version=1, step_detection=DETECTION)


def test_a_version_2_trace_keeps_its_step_detection_and_a_version_3_its_clocks() -> None:
    """The first versions that carry each record take it (the boundaries of both checks)."""
    version_2 = dataclasses.replace(make_trace(steps=1), format_version=2, step_detection=DETECTION)
    assert version_2.step_detection == DETECTION
    alignment = trace_model.ClockAlignment(reference="ps:0", method="wire")
    version_3 = dataclasses.replace(version_2, format_version=3, clock_alignment=alignment)
    assert version_3.clock_alignment == alignment


def test_set_aside_records_refuse_nonsense() -> None:
    with pytest.raises(
        ValueError, match=r"^set-aside phase must be startup or teardown, got 'steady'$"
    ):
        trace_model.SetAside(reason="r", phase="steady")
    for name in ("runs", "rpcs", "bytes"):
        with pytest.raises(ValueError, match=rf"^set-aside {name} must be >= 0, got -1$"):
            trace_model.SetAside(reason="r", phase="startup", **{name: -1})
        assert getattr(trace_model.SetAside(reason="r", phase="teardown", **{name: 0}), name) == 0
    with pytest.raises(ValueError, match=r"^candidates must be >= 0, got -1$"):
        trace_model.StepDetection(candidates=-1)


def test_the_step_unit_comes_from_the_detection_or_from_a_version_1_extra() -> None:
    assert dataclasses.replace(make_trace(steps=1), step_detection=DETECTION).step_unit == (
        "WORKER_STEP"
    )
    old = make_trace(steps=1)
    old = dataclasses.replace(
        old,
        format_version=1,
        metadata=dataclasses.replace(old.metadata, extra=(("step_unit", "worker-step"),)),
    )
    assert old.step_unit == "worker-step"
    assert make_trace(steps=1).step_unit == ""


def test_a_trace_whose_first_steps_last_twice_its_last_says_so() -> None:
    # In the ranges of a VGG-16 capture's rounds: first four 2.3 to 3.4 s, last four 1.1 to 1.7 s
    lengths_ms = [2300, 3400, 2600, 2900, 1100, 1700, 1400, 1300]
    trace = with_step_lengths(make_trace(steps=8), lengths_ms)
    line = trace_summary.steadiness_line(trace)
    assert line is not None
    # Medians of the halves: 2750 ms and 1350 ms.
    assert line.startswith("steps unsteady: the first 4 steps' median (2750.0 ms) is 2.0 times")
    assert "the last 4's (1350.0 ms)" in line and "starting up" in line
    assert line in trace_summary.format_summary(trace).splitlines()


def test_a_trace_whose_last_steps_slowed_down_says_so_the_other_way() -> None:
    trace = with_step_lengths(make_trace(steps=5), [100, 110, 150, 160, 170])
    line = trace_summary.steadiness_line(trace)
    assert line is not None and line.startswith("steps unsteady: the last 2 steps' median")
    assert "1.6 times the first 2's (105.0 ms)" in line and "busier towards the end" in line


@pytest.mark.parametrize(
    "lengths_ms",
    [
        [980, 1020, 960, 940, 850, 980, 940, 980],  # a steady capture (tf1-ps on a 5 Gbit/s link)
        [100, 100, 100, 100, 100, 100, 100, 149],  # one slow step: the medians do not move
        [300, 300, 100],  # too few steps to compare halves
    ],
)
def test_a_steady_or_short_trace_gets_no_warning(lengths_ms: list[float]) -> None:
    trace = with_step_lengths(make_trace(steps=len(lengths_ms)), lengths_ms)
    assert trace_summary.steadiness_line(trace) is None
    assert "unsteady" not in trace_summary.format_summary(trace)


# --------------------------------------------------------------------------
# The model's own bounds, at their edges, with the messages that name the field.

INT64_BELOW = -(2**63) - 1
INT64_ABOVE = 2**63


def _bare_trace(**fields: object) -> Trace:
    values: dict[str, object] = {
        "metadata": RunMetadata(),
        "tasks": (
            Task(job="ps", index=0),
            Task(job="worker", index=0),
            Task(job="worker", index=1),
        ),
        "steps": (),
    }
    values.update(fields)
    return Trace(**values)  # type: ignore[arg-type]


def _step(*rpcs: Rpc, start: int = 0, end: int = 100) -> Step:
    return Step(index=0, start_ns=start, end_ns=end, rpcs=rpcs)


@pytest.mark.parametrize(
    ("fields", "where", "value"),
    [
        ({"startup": trace_model.Phase(start_ns=INT64_BELOW)}, "startup.start_ns", INT64_BELOW),
        ({"startup": trace_model.Phase(end_ns=INT64_ABOVE)}, "startup.end_ns", INT64_ABOVE),
        ({"teardown": trace_model.Phase(start_ns=INT64_ABOVE)}, "teardown.start_ns", INT64_ABOVE),
        ({"teardown": trace_model.Phase(end_ns=INT64_BELOW)}, "teardown.end_ns", INT64_BELOW),
        ({"steps": (_step(start=INT64_BELOW),)}, "steps[0].start_ns", INT64_BELOW),
        ({"steps": (_step(end=INT64_ABOVE),)}, "steps[0].end_ns", INT64_ABOVE),
        (
            {"steps": (_step(_rpc(start_ns=INT64_BELOW, end_ns=3)),)},
            "steps[0].rpcs[0].start_ns",
            INT64_BELOW,
        ),
        (
            {"steps": (_step(_rpc(start_ns=2, end_ns=INT64_ABOVE)),)},
            "steps[0].rpcs[0].end_ns",
            INT64_ABOVE,
        ),
        (
            {"steps": (_step(_rpc(start_ns=0, end_ns=0, response_start_ns=INT64_ABOVE)),)},
            "steps[0].rpcs[0].response_start_ns",
            INT64_ABOVE,
        ),
        (
            {"startup": trace_model.Phase(rpcs=(_rpc(start_ns=2, end_ns=INT64_ABOVE),))},
            "startup.rpcs[0].end_ns",
            INT64_ABOVE,
        ),
        (
            {"teardown": trace_model.Phase(rpcs=(_rpc(start_ns=INT64_BELOW, end_ns=1),))},
            "teardown.rpcs[0].start_ns",
            INT64_BELOW,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_timestamp_outside_int64_is_refused_naming_where_it_is(
    fields: dict[str, object], where: str, value: int
) -> None:
    with pytest.raises(TraceError) as refused:
        _bare_trace(**fields)
    assert str(refused.value) == f"{where}: {value} is not a 64-bit timestamp"


def test_a_trace_spans_at_most_thirty_days_to_the_nanosecond() -> None:
    limit = 30 * 24 * 3600 * 10**9
    assert limit == trace_model.MAX_SPAN_NS
    # The first and last times are each shared with a call: the step's are named.
    first, last = -1_000, limit - 1_000
    _bare_trace(steps=(_step(_rpc(start_ns=first, end_ns=last), start=first, end=last),))
    with pytest.raises(TraceError) as refused:
        _bare_trace(
            steps=(_step(_rpc(start_ns=first, end_ns=last + 1), start=first, end=last + 1),)
        )
    assert str(refused.value) == (
        f"timestamps span 30 days (steps[0].start_ns -1000 to steps[0].end_ns {last + 1}); "
        "a trace spans at most 30 days"
    )
    # Past the span by a day and a half, from 5 days in, and the last time a call's.
    start, end = 5 * 86_400 * 10**9, 5 * 86_400 * 10**9 + limit + 36 * 3600 * 10**9
    with pytest.raises(TraceError) as refused:
        _bare_trace(steps=(_step(_rpc(start_ns=start, end_ns=end), start=start, end=start),))
    assert str(refused.value) == (
        f"timestamps span 31.5 days (steps[0].start_ns {start} to steps[0].rpcs[0].end_ns "
        f"{end}); a trace spans at most 30 days"
    )


def test_a_trace_lists_at_most_ten_thousand_tasks() -> None:
    trace_model.check_task_count(10_000)
    with pytest.raises(TraceError) as refused:
        trace_model.check_task_count(10_001)
    assert str(refused.value) == "tasks: 10001 listed; a trace lists at most 10000"


def test_a_clock_offsets_bounds_may_meet_but_not_cross() -> None:
    met = trace_model.ClockOffset(task="worker:0", lower_ns=7, upper_ns=7)
    assert met.uncertainty_ns == 0
    # Half the width of [-10, 10], 21 ns counted inclusively, rounded up.
    assert trace_model.ClockOffset(task="worker:0", lower_ns=-10, upper_ns=10).uncertainty_ns == 10
    assert trace_model.ClockOffset(task="worker:0", lower_ns=3).uncertainty_ns is None
    assert trace_model.ClockOffset(task="worker:0", upper_ns=3).uncertainty_ns is None
    with pytest.raises(ValueError) as crossed:
        trace_model.ClockOffset(task="worker:1", lower_ns=8, upper_ns=7)
    assert str(crossed.value) == "clock offset of worker:1: lower bound above upper bound"
    with pytest.raises(ValueError) as negative:
        trace_model.ClockOffset(task="worker:1", constraints=-1)
    assert str(negative.value) == "constraints must be >= 0, got -1"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [((), None), ((("other", "5"),), None), ((("calibration_step_ns", "1"),), 1),
     ((("calibration_step_ns", "250000000"), ("other", "x")), 250_000_000)],
)  # fmt: skip
def test_a_calibrated_step_is_read_from_the_metadata(
    extra: tuple[tuple[str, str], ...], expected: int | None
) -> None:
    assert trace_model.calibration_step_ns(extra) == expected


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "fast", ""])
def test_a_calibrated_step_that_is_not_a_positive_whole_number_is_refused(text: str) -> None:
    with pytest.raises(ConfigError) as refused:
        trace_model.calibration_step_ns((("calibration_step_ns", text),))
    assert str(refused.value) == (
        f"trace metadata calibration_step_ns={text!r}: expected a positive whole number of "
        "nanoseconds"
    )


def test_calls_are_ordered_by_start_then_end_and_counted_per_caller_and_callee() -> None:
    def call(caller: int, start: int, end: int) -> Rpc:
        return _rpc(caller_task=caller, callee_task=0, start_ns=start, end_ns=end)

    result = trace_model.with_outstanding(
        [call(1, 0, 20), call(1, 0, 5), call(2, 6, 30), call(1, 6, 9)]
    )
    # Worker 2's call overlaps worker 1's to the same ps: another pair, not outstanding.
    assert [(r.caller_task, r.start_ns, r.end_ns, r.outstanding_at_start) for r in result] == [
        (1, 0, 5, 0),
        (1, 0, 20, 1),
        (1, 6, 9, 1),
        (2, 6, 30, 0),
    ]
