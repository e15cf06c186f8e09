"""What a result document names, by value: each benchmark's label (repeats numbered), the
file-name-safe form of a name, and the trace it replayed as read from the trace file
itself (its hash worked out here with hashlib)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.result_factory import golden_document, make_results
from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.replay.core.measurement import BenchmarkResult
from tf_grpc_bench.replay.output.document import (
    ResultDocument,
    benchmark_labels,
    build_document,
    describe_trace,
    safe_name,
    utc_timestamp,
)


def test_a_benchmark_run_once_is_named_by_the_benchmark_alone() -> None:
    latency, bandwidth, throughput = make_results(runs=1, calls=2)
    assert benchmark_labels([latency, bandwidth, throughput]) == (
        "p2p-latency",
        "p2p-bandwidth",
        "ps-throughput",
    )
    assert benchmark_labels([]) == ()


def test_a_benchmark_run_twice_is_named_with_each_workload() -> None:
    latency, bandwidth, _ = make_results(runs=1, calls=2)
    trace = dataclasses.replace(latency, workload="trace")
    assert benchmark_labels([latency, bandwidth, trace]) == (
        "p2p-latency-synthetic",
        "p2p-bandwidth",
        "p2p-latency-trace",
    )


def test_repeats_of_one_benchmark_and_workload_are_numbered_from_two() -> None:
    latency = make_results(runs=1, calls=2)[0]
    repeated = [dataclasses.replace(latency, workload="my trace/v2")] * 4
    assert benchmark_labels(repeated) == (
        "p2p-latency-my-trace-v2",
        "p2p-latency-my-trace-v2-2",
        "p2p-latency-my-trace-v2-3",
        "p2p-latency-my-trace-v2-4",
    )
    # A workload with nothing file-name-safe in it is called "workload".
    unnamed = [dataclasses.replace(latency, workload="//"), latency]
    assert benchmark_labels(unnamed) == ("p2p-latency-workload", "p2p-latency-synthetic")


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("resnet50_v1.5-tf2", "resnet50_v1.5-tf2"),
        ("veth 1gbit/x", "veth-1gbit-x"),
        ("--..a b..--", "a-b"),
        ("..x\t\ty..", "x-y"),
        ("a:b;c", "a-b-c"),
        ("Zz09", "Zz09"),
        ("é", ""),
        ("XboxX", "XboxX"),
        ("", ""),
    ],
)
def test_a_safe_name_keeps_letters_digits_dots_underscores_and_dashes(text: str, safe: str) -> None:
    assert safe_name(text) == safe


def test_a_trace_is_described_by_its_own_file(tmp_path: Path) -> None:
    source = trace_files.default_trace_path()
    assert source is not None
    trace = trace_files.read_trace(source)
    partial = dataclasses.replace(trace, partial=True, partial_reason="")
    path = trace_files.write_trace(partial, tmp_path / "cut.tfgbtrace")
    info = describe_trace(path)
    assert info.path == str(path.resolve())
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (info.model, info.strategy, info.tensorflow_version) == (
        trace.metadata.model,
        trace.metadata.strategy,
        trace.metadata.tensorflow_version,
    )
    assert (info.format_version, info.step_count) == (trace.format_version, len(trace.steps))
    assert info.partial_reason == "capture ended early"
    stopped = dataclasses.replace(trace, partial=True, partial_reason="worker 1 died")
    path = trace_files.write_trace(stopped, tmp_path / "stopped.tfgbtrace")
    assert describe_trace(path).partial_reason == "worker 1 died"
    assert describe_trace(source).partial_reason == ""


def _build(results: list[BenchmarkResult], **arguments: object) -> ResultDocument:
    return build_document(
        results,
        config=arguments.pop("config", {}),
        trace_path=None,
        machine=golden_document().machine,
        created=datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc),
        **arguments,
    )


def test_a_partial_documents_reason_names_each_partial_benchmark() -> None:
    latency, bandwidth, throughput = make_results(runs=2, calls=2)
    stopped = dataclasses.replace(latency, partial=True)
    run_cut = dataclasses.replace(
        throughput,
        runs=(
            throughput.runs[0],
            dataclasses.replace(throughput.runs[1], partial=True, partial_reason="server 1 died"),
        ),
    )
    document = _build([stopped, bandwidth, run_cut])
    assert document.partial
    assert document.partial_reason == ("p2p-latency: stopped early; ps-throughput: server 1 died")
    # The caller's reason wins; a caller's partial without one says "stopped early".
    assert _build([stopped], partial_reason="interrupted").partial_reason == "interrupted"
    assert _build([bandwidth], partial=True).partial_reason == "stopped early"
    # A whole document has no reason, whatever it is given.
    whole = _build([bandwidth], partial_reason="not used")
    assert (whole.partial, whole.partial_reason) == (False, "")


@pytest.mark.parametrize(
    ("config", "parameters", "message"),
    [
        ({"": 1}, {}, "config: parameter names must be non-empty strings, got ''"),
        ({1: 1}, {}, "config: parameter names must be non-empty strings, got 1"),
        ({"x": [1]}, {}, "config: parameter 'x' must be a str, int, float or bool, got list"),
        ({"x": math.inf}, {}, "config: parameter 'x' must be finite, got inf"),
        (
            {},
            {"y": None},
            "parameters of p2p-bandwidth: parameter 'y' must be a str, int, float or bool, "
            "got NoneType",
        ),
    ],
)
def test_a_parameter_a_document_cannot_hold_is_named_with_where_it_is(
    config: dict[object, object], parameters: dict[str, object], message: str
) -> None:
    bandwidth = make_results(runs=1, calls=2)[1]
    result = dataclasses.replace(bandwidth, parameters={**bandwidth.parameters, **parameters})
    with pytest.raises(ResultError) as refused:
        _build([result], config=config)
    assert str(refused.value) == f"cannot build the result document: {message}"


def test_a_document_of_a_format_this_tool_does_not_read_is_refused() -> None:
    with pytest.raises(ValueError) as refused:
        dataclasses.replace(golden_document(), format_version=999)
    assert str(refused.value) == "format_version 999 is not supported"


def test_a_trace_reached_by_a_link_is_recorded_by_the_path_it_resolves_to(
    tmp_path: Path,
) -> None:
    source = trace_files.default_trace_path()
    assert source is not None
    link = tmp_path / "link.tfgbtrace"
    link.symlink_to(source)
    assert describe_trace(link).path == str(source.resolve())


def test_timestamps_are_utc_whatever_the_moments_zone_or_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        moment = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
        assert utc_timestamp(moment) == "2026-01-01T10:00:00.123Z"
    finally:
        monkeypatch.undo()
        time.tzset()
