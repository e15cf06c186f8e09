"""The capture machine a trace names (``tf_grpc_bench.host``), how ``inspect`` shows it and
how a replay records it."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from tf_grpc_bench import trace_files
from tf_grpc_bench.host import capture_machine, cpu_model, machine_line
from tf_grpc_bench.replay import cli as replay_cli
from tf_grpc_bench.trace_summary import format_summary

from .conftest import make_trace

X86 = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\n"
    "model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu\n"
)
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\n\nHardware\t: BCM2835\n"


def test_cpu_model_reads_the_model_name_line(tmp_path: Path) -> None:
    (tmp_path / "x86").write_text(X86)
    (tmp_path / "arm").write_text(ARM)
    assert cpu_model(tmp_path / "x86") == "Intel(R) Xeon(R) Processor"
    assert cpu_model(tmp_path / "arm") == "BCM2835"


def test_capture_machine_names_the_model_and_the_cpu_count(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text(X86)
    assert capture_machine(tmp_path / "cpuinfo") == (
        ("cpu_model", "Intel(R) Xeon(R) Processor"),
        ("cpus", str(os.cpu_count())),
    )


def test_machine_line_is_empty_for_traces_that_do_not_name_it() -> None:
    assert machine_line(()) == ""
    assert machine_line((("cpu_model", ""), ("cpus", "2"))) == ""
    assert machine_line((("cpu_model", "EPYC"),)) == "captured on: EPYC"


def test_inspect_prints_the_capture_machine() -> None:
    trace = make_trace()
    named = dataclasses.replace(
        trace,
        metadata=dataclasses.replace(
            trace.metadata, extra=(("cpu_model", "EPYC 7B13"), ("cpus", "2"))
        ),
    )
    lines = format_summary(named).splitlines()
    assert "captured on: EPYC 7B13, 2 CPUs" in lines
    assert (
        "compute calibration: none (a replay on another machine keeps this one's compute)" in lines
    )
    assert "captured on" not in format_summary(make_trace())


def test_a_trace_replay_names_the_capture_machine_among_its_parameters(tmp_path: Path) -> None:
    named = dataclasses.replace(
        make_trace(),
        metadata=dataclasses.replace(
            make_trace().metadata, extra=(("cpu_model", "EPYC 7B13"), ("cpus", "2"))
        ),
    )
    parser = argparse.ArgumentParser()
    replay_cli.configure_replay(parser)
    for trace, expected in ((named, "EPYC 7B13, 2 CPUs"), (make_trace(), None)):
        path = trace_files.write_trace(trace, tmp_path / "named.tfgbtrace")
        request = replay_cli.build_request(parser.parse_args([str(path), "--benchmark", "all"]))
        assert len(request.workloads) == 3
        for workload in request.workloads:
            assert workload.parameters().get("captured_on") == expected
