"""What a result document names, by value: each benchmark's label (repeats numbered), the
file-name-safe form of a name, and the trace it replayed as read from the trace file
itself (its hash worked out here with hashlib)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from tests.result_factory import make_results
from tf_grpc_bench import trace_files
from tf_grpc_bench.replay.output.document import benchmark_labels, describe_trace, safe_name


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
