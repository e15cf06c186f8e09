"""What ``bench/mutation.py`` mutates: every module on the path from samples to a figure a
user reads, the fast tests that pin each, and the hand-made bugs that must be caught.

The result path, in order: the trace model and its size classes; the workload the
replay plays and its pacing and dependencies (core); the samples the transport
builds from each call and the run it makes of them; the statistics, the prediction
and every writer (the result document, the terminal and markdown tables,
TensorBoard's scalars, hparams and text, the CSV tables, the step timeline, the
comparison); the assembly of a trace from what the profiler recorded; and the plan
of an emulated network's links.  A module's test list holds files that run in
seconds without TensorFlow or root.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One module to mutate: its path in the repository and the test files that pin it."""

    path: str
    tests: tuple[str, ...]
    #: Which of the tests run (pytest -m): by default neither TensorFlow nor namespaces.
    markers: str = "not tensorflow and not netns"
    #: Only these functions of the module are mutated and scored (a module whose other
    #: functions are no part of the result path; a method as ``Class.method``); empty: all.
    functions: tuple[str, ...] = ()
    #: The module's functions run in processes the tests start (the replay's workers),
    #: where mutmut neither sees which tests call them nor activates its mutants: every
    #: mutant mutmut did not kill is put into the code and run against the test files.
    in_children: bool = False


_ORACLES = "tests/test_output_oracles.py"

#: The modules of the result path, by short name, with the fast tests that pin each.
TARGETS: dict[str, Target] = {
    # The trace and the size classes.
    "trace": Target(path="src/tf_grpc_bench/trace.py", tests=("tests/test_trace.py",)),
    "trace_format": Target(
        path="src/tf_grpc_bench/trace_format.py", tests=("tests/test_trace.py",)
    ),
    "trace_json": Target(path="src/tf_grpc_bench/trace_json.py", tests=("tests/test_trace.py",)),
    "sizes": Target(path="src/tf_grpc_bench/sizes.py", tests=("tests/test_sizes.py",)),
    # Core: what is replayed, when, and what waits for what.
    "generators": Target(path="replay/core/generators.py", tests=("tests/test_generators.py",)),
    "workload": Target(
        path="replay/core/workload.py", tests=("tests/test_workload.py", "tests/test_chunking.py")
    ),
    "messages": Target(path="replay/core/messages.py", tests=("tests/test_workload.py",)),
    "synthetic": Target(path="replay/core/synthetic.py", tests=("tests/test_workload.py",)),
    "trace_workload": Target(
        path="replay/core/trace_workload.py", tests=("tests/test_workload.py",)
    ),
    "trace_mapping": Target(
        path="src/tf_grpc_bench/trace_mapping.py", tests=("tests/test_workload.py",)
    ),
    # Pacing's flags are resolved with the benchmark table and the replay's spec.
    "pacing": Target(
        path="replay/core/pacing.py",
        tests=(
            "tests/test_pacing.py",
            "tests/test_replay_spec.py",
            "tests/test_benchmark_table.py",
            "tests/test_planning.py",
        ),
    ),
    "dependencies": Target(
        path="src/tf_grpc_bench/dependencies.py", tests=("tests/test_dependencies.py",)
    ),
    "dependency_tracker": Target(
        path="src/tf_grpc_bench/dependency_tracker.py",
        tests=(
            "tests/test_dependencies.py",
            # The compute-gap hook the compute load plans with.
            "tests/test_compute_load.py::test_the_tracker_tells_each_gap_as_it_plans_it_and_the_tail_once",
        ),
    ),
    "critical_path": Target(
        path="src/tf_grpc_bench/critical_path.py",
        tests=("tests/test_dependencies.py", "tests/test_workload.py"),
    ),
    "measurement": Target(
        path="replay/core/measurement.py",
        tests=(
            "tests/test_measurement.py",
            "tests/test_machine_cpu.py",
            "tests/test_time_dilation.py",
            _ORACLES,
        ),
    ),
    "chunking": Target(path="replay/core/chunking.py", tests=("tests/test_chunking.py",)),
    # The transport's samples: one per call, the worker processes' merged into a run.
    "transport_samples": Target(
        path="replay/transport/driver.py",
        # The tests that replay with grpcio's driver (the rest read fixed samples).
        tests=(
            f"{_ORACLES}::test_a_replayed_call_is_counted_in_the_class_of_its_larger_message",
            f"{_ORACLES}::test_a_call_the_window_of_one_held_back_says_so_in_its_sample",
        ),
        functions=("_sample",),
        in_children=True,
    ),
    # The gRPC C++ engine's samples, built by its Python driver from the program's reports.
    "native_samples": Target(
        path="replay/native/driver.py",
        tests=tuple(
            f"{_ORACLES}::{test}[grpc-cpp{case}]"
            for test, cases in (
                (
                    "test_a_replayed_call_is_counted_in_the_class_of_its_larger_message",
                    ("-ps-throughput", "-p2p-latency", "-p2p-latency-rate"),
                ),
                ("test_a_call_the_window_of_one_held_back_says_so_in_its_sample", ("",)),
            )
            for case in cases
        ),
        functions=("NativeDriver._keep",),
        in_children=True,
    ),
    "sample_arrays": Target(
        path="replay/throughput.py",
        tests=(_ORACLES,),
        functions=("pack_samples", "unpack_samples"),
    ),
    "run_samples": Target(
        path="replay/transport/loop.py",
        tests=("tests/test_run_measurement.py", "tests/test_machine_cpu.py"),
        functions=("run_measurement", "machine_cpu_over"),
    ),
    # Figures and every writer of them.
    "statistics": Target(
        path="replay/output/statistics.py", tests=("tests/test_measurement.py", _ORACLES)
    ),
    "prediction": Target(
        path="replay/output/prediction.py", tests=("tests/test_document.py", _ORACLES)
    ),
    "document": Target(
        path="replay/output/document.py",
        tests=("tests/test_document_names.py", "tests/test_document.py"),
    ),
    "document_reader": Target(
        path="replay/output/document_reader.py", tests=("tests/test_document.py",)
    ),
    "document_writer": Target(
        path="replay/output/document_writer.py", tests=("tests/test_document.py",)
    ),
    "run_directories": Target(
        path="replay/output/run_directories.py", tests=("tests/test_document.py",)
    ),
    "report": Target(
        path="replay/output/report.py",
        tests=(_ORACLES, "tests/test_report.py", "tests/test_capture_cpu.py"),
    ),
    "tensorboard": Target(
        path="replay/output/tensorboard.py",
        tests=(_ORACLES, "tests/test_tensorboard_output.py"),
    ),
    "hparams": Target(
        path="replay/output/hparams.py", tests=(_ORACLES, "tests/test_tensorboard_output.py")
    ),
    "events": Target(
        path="replay/output/events.py",
        tests=("tests/test_event_files.py", _ORACLES, "tests/test_tensorboard_output.py"),
    ),
    "export": Target(path="replay/output/export.py", tests=(_ORACLES,)),
    "timeline": Target(
        path="replay/output/timeline.py", tests=(_ORACLES, "tests/test_timeline.py")
    ),
    "comparison": Target(
        path="replay/output/comparison.py",
        tests=(_ORACLES, "tests/test_comparison.py", "tests/test_comparison_charts.py"),
    ),
    # Assembly of a trace from what the profiler recorded.
    "physics": Target(path="profiler/physics.py", tests=("tests/test_physics.py",)),
    "http2": Target(path="profiler/recorders/http2.py", tests=("tests/test_http2_follower.py",)),
    "calls": Target(path="profiler/recorders/calls.py", tests=("tests/test_calls.py",)),
    "clocks": Target(
        path="profiler/assembly/clocks.py",
        tests=("tests/test_record.py", "tests/test_skewed_clocks.py"),
    ),
    "assemble": Target(path="profiler/assemble.py", tests=("tests/test_skewed_clocks.py",)),
    "phases": Target(
        path="profiler/assembly/phases.py",
        # The tests that assemble traces in the test process (test_skewed_clocks.py's
        # records come from a real job, run again for each mutant).
        tests=(
            "tests/test_phases.py",
            "tests/test_steps.py",
            "tests/test_capture.py",
            "tests/test_record.py",
        ),
    ),
    "rpcs": Target(
        path="profiler/assembly/rpcs.py", tests=("tests/test_assembly.py", "tests/test_capture.py")
    ),
    "steps": Target(
        path="profiler/assembly/steps.py",
        tests=("tests/test_steps.py", "tests/test_assembly.py", "tests/test_capture.py"),
    ),
    "variables": Target(
        path="profiler/assembly/variables.py",
        tests=("tests/test_record.py", "tests/test_physics.py"),
    ),
    # Its tests decode messages that TensorFlow's own protobuf modules wrote (imported,
    # nothing trained): they run too.
    "tf_messages": Target(
        path="profiler/assembly/tf_messages.py",
        tests=("tests/test_tf_messages.py",),
        markers="not netns",
    ),
    # The plan of an emulated network's links.
    "links": Target(
        path="src/tf_grpc_bench/netns/links.py",
        tests=(
            "tests/test_network_plans.py",
            "tests/test_link_profiles.py",
            "tests/test_tbf_buckets.py",
        ),
    ),
    "topology": Target(
        path="src/tf_grpc_bench/netns/topology.py",
        tests=(
            "tests/test_network_plans.py",
            "tests/test_link_profiles.py",
            "tests/test_tbf_buckets.py",
        ),
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class HandMutant:
    """A small bug put in by hand, the issue that found it, and the test file that must
    catch it."""

    name: str
    issue: int
    path: str
    original: str
    mutated: str
    tests: str


#: The bugs that once survived the suite; ``--named`` checks that each is now caught.
HAND_MUTANTS = (
    HandMutant(
        name="trace: a binary trace's version checked with > max instead of not in",
        issue=15,
        path="src/tf_grpc_bench/trace_format.py",
        original="    if message.format_version not in READABLE_VERSIONS:",
        mutated="    if message.format_version > max(READABLE_VERSIONS):",
        tests="tests/test_trace.py",
    ),
    HandMutant(
        name="trace: a JSON trace's version checked with > max instead of not in",
        issue=15,
        path="src/tf_grpc_bench/trace_json.py",
        original="    if version not in READABLE_VERSIONS:",
        mutated="    if version > max(READABLE_VERSIONS):",
        tests="tests/test_trace.py",
    ),
    HandMutant(
        name="generators: two-category skew 3:1 instead of 2:1",
        issue=15,
        path="replay/core/generators.py",
        original="        return tuple(zip(ordered, SKEW_SHARES, strict=False))",
        mutated="        return tuple(zip(ordered, SKEW_SHARES if len(ordered) != 2 else (6, 2), "
        "strict=False))",
        tests="tests/test_generators.py",
    ),
    HandMutant(
        name="generators: the deal order reversed",
        issue=15,
        path="replay/core/generators.py",
        original="key=lambda i: (deficits[i], -i))",
        mutated="key=lambda i: (deficits[i], i))",
        tests="tests/test_generators.py",
    ),
    HandMutant(
        name="physics: extra bytes never flagged (-err > tol)",
        issue=15,
        path="profiler/physics.py",
        original="        if abs(self.relative_error) > tolerance:",
        mutated="        if -self.relative_error > tolerance:",
        tests="tests/test_physics.py",
    ),
    HandMutant(
        name="physics: tolerance widened from 0.01 to 0.2",
        issue=15,
        path="profiler/physics.py",
        original="DEFAULT_TOLERANCE = 0.01",
        mutated="DEFAULT_TOLERANCE = 0.2",
        tests="tests/test_physics.py",
    ),
    HandMutant(
        name="run measurement: lost server statistics with `and partial`",
        issue=15,
        path="replay/transport/loop.py",
        original="    if stats is None and not partial:",
        mutated="    if stats is None and partial:",
        tests="tests/test_run_measurement.py",
    ),
    HandMutant(
        name="http2: padding checked with > left instead of > left - 1",
        issue=15,
        path="profiler/recorders/http2.py",
        original="                if padding > self._left - 1:",
        mutated="                if padding > self._left:",
        tests="tests/test_http2_follower.py",
    ),
    HandMutant(
        name="transport: a sample's size class by its response, not its larger message",
        issue=41,
        path="replay/transport/driver.py",
        original="        payload_bytes=call.payload_bytes,",
        mutated="        payload_bytes=call.response_bytes,",
        tests=_ORACLES,
    ),
    HandMutant(
        name="report: the text summary's p90 column shows the p99",
        issue=41,
        path="replay/output/report.py",
        original="                    summary.p90_ns,",
        mutated="                    summary.p99_ns,",
        tests=_ORACLES,
    ),
    HandMutant(
        name="assemble: step markers moved by minus their task's clock offset",
        issue=41,
        path="profiler/assemble.py",
        original="marker, start_ns=marker.start_ns + offset, end_ns=marker.end_ns + offset",
        mutated="marker, start_ns=marker.start_ns - offset, end_ns=marker.end_ns - offset",
        tests="tests/test_skewed_clocks.py",
    ),
    HandMutant(
        name="netns: the tbf burst at the fallback HZ instead of the kernel's",
        issue=41,
        path="src/tf_grpc_bench/netns/emulated.py",
        original="            hz=kernel_hz(),\n",
        mutated="",
        tests="tests/test_tbf_buckets.py",
    ),
    HandMutant(
        name="export: samples.csv's trace_callee holds the caller task",
        issue=41,
        path="replay/output/export.py",
        original="                trace.task_name(rpc.callee_task),",
        mutated="                trace.task_name(rpc.caller_task),",
        tests=_ORACLES,
    ),
    HandMutant(
        name="dependencies: a pull's wait for its worker keyed on its response start",
        issue=41,
        path="src/tf_grpc_bench/dependencies.py",
        original="after_worker = bisect.bisect_left(worker_ends, call.start_ns)",
        mutated="after_worker = bisect.bisect_left(worker_ends, call.response_start_ns)",
        tests="tests/test_dependencies.py",
    ),
)
