"""Terminal and markdown tables of results."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest

from tests.result_factory import GOLDEN_MACHINE, make_results
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    RunMeasurement,
)
from tf_grpc_bench.replay.core.whatif import Derivation
from tf_grpc_bench.replay.output import machine
from tf_grpc_bench.replay.output.document import ResultDocument, TraceInfo, build_document
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.report import (
    compute_machine_note,
    format_benchmark_markdown,
    format_markdown_table,
    format_number,
    format_table,
)
from tf_grpc_bench.sizes import SizeCategory

CREATED = datetime(2026, 11, 29, 12, 30, 5, tzinfo=timezone.utc)


def _document(network: str = "loopback", seed: int = 7) -> ResultDocument:
    return build_document(
        make_results(seed=seed, runs=2, calls=12),
        config={"command": "replay"},
        trace_path=None,
        network=NetworkInfo(name=network),
        created=CREATED,
    )


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_terminal_table_has_one_row_per_benchmark_with_its_figures() -> None:
    document = _document()
    lines = format_table(document).splitlines()
    assert "loopback" in lines[0] and "synthetic workload" in lines[0]
    header, rows = lines[1], lines[2:]
    assert header.split()[:3] == ["benchmark", "workload", "rpcs"]
    assert len(rows) == 3
    for row, result, label in zip(rows, document.benchmarks, document.labels, strict=True):
        fields = row.split()
        assert fields[:3] == [label, result.workload, str(result.rpc_count)]
        assert format_number(result.bandwidth_mb_per_s) in fields
        assert format_number(result.rpcs_per_s) in fields
        by_category = dict(result.latency_by_category)
        large = by_category[SizeCategory.LARGE]
        assert f"{format_number(large.p50_ns / 1e3)} / {format_number(large.p99_ns / 1e3)}" in row


def test_terminal_table_shows_step_time_only_for_trace_replays() -> None:
    document = _document()
    rows = format_table(document).splitlines()[2:]
    throughput = document.benchmarks[2]
    assert rows[2].split()[-1] == format_number(throughput.step_time.p50_ns / 1e6)
    assert rows[0].split()[-1] == "-"


def test_partial_benchmark_is_marked_and_its_reason_given() -> None:
    found = make_results(runs=2, calls=6)
    found[1] = dataclasses.replace(found[1], partial=True, partial_reason="server 0 gone")
    document = build_document(found, config={}, trace_path=None, created=CREATED)
    text = format_table(document)
    assert "p2p-bandwidth*" in text
    assert text.splitlines()[-1] == "* partial: p2p-bandwidth: server 0 gone"
    assert "p2p-latency*" not in text


def test_what_a_trace_replay_could_not_send_is_said_once_below_the_table() -> None:
    kinds = "chief->worker Enqueue: 20 RPCs, 281850 B; ps->ps RecvTensor: 1070 RPCs, 189348 B"
    found = [
        dataclasses.replace(r, parameters={**r.parameters, "dropped_rpcs": kinds})
        for r in make_results(runs=2, calls=6)
    ]
    document = build_document(found, config={}, trace_path=None, created=CREATED)
    lines = format_table(document).splitlines()
    assert lines[-1] == f"not replayed (no replay task makes these calls), per pass: {kinds}"
    assert sum("not replayed" in line for line in lines) == 1
    assert "not replayed" not in format_table(_document())
    # A replay that left kinds out on purpose (``role``: workers and ps only) says so.
    only = [
        dataclasses.replace(r, parameters={**r.parameters, "whole_steps": "worker <-> ps only"})
        for r in found
    ]
    document = build_document(only, config={}, trace_path=None, created=CREATED)
    assert format_table(document).splitlines()[-1] == (
        f"not replayed (no replay task makes these calls), per pass: {kinds} "
        "(replayed beyond worker <-> ps: worker <-> ps only)"
    )


def test_markdown_comparison_has_a_row_per_network_and_benchmark() -> None:
    documents = [_document("loopback"), _document("veth-100mbit", seed=9)]
    lines = format_markdown_table(documents).splitlines()
    header = _cells(lines[0])
    assert header[:3] == ["network", "trace", "benchmark"]
    assert set(lines[1]) <= {"|", "-"}
    rows = [_cells(line) for line in lines[2:]]
    assert len(rows) == 6
    assert all(len(row) == len(header) for row in rows)
    assert [row[0] for row in rows] == ["loopback"] * 3 + ["veth-100mbit"] * 3
    bandwidth = documents[1].benchmarks[1]
    assert rows[4][2] == "p2p-bandwidth"
    assert rows[4][header.index("MB/s")] == format_number(bandwidth.bandwidth_mb_per_s)


def test_markdown_table_of_benchmark_results_without_documents() -> None:
    found = make_results(runs=1, calls=4)
    lines = format_markdown_table(found).splitlines()
    assert _cells(lines[0])[0] == "benchmark"
    assert [_cells(line)[0] for line in lines[2:]] == [r.benchmark.value for r in found]


def test_markdown_table_refuses_a_mixture() -> None:
    document = _document()
    with pytest.raises(
        TypeError, match=r"^format_markdown_table takes result documents or benchmark results$"
    ):
        format_markdown_table([document, document.benchmarks[0]])  # type: ignore[list-item]


def test_benchmark_detail_lists_each_size_class_and_each_run() -> None:
    result = _document().benchmarks[0]
    text = format_benchmark_markdown(result)
    first_column = [_cells(line)[0] for line in text.splitlines() if line.startswith("| ")]
    assert first_column == ["class", "small", "medium", "large", "all", "run", "0", "1"]


def test_numbers_keep_about_three_significant_digits() -> None:
    assert [format_number(v) for v in (1234.5, 56.78, 3.14159, float("nan"))] == [
        "1234",
        "56.8",
        "3.14",
        "-",
    ]


def test_loopback_network_is_named_in_the_context_line() -> None:
    document = build_document(
        make_results(runs=1, calls=3),
        config={},
        trace_path=None,
        network=machine.loopback_network(),
        created=CREATED,
    )
    assert ", loopback, " in format_table(document).splitlines()[0]


def _replayed_on(model: str, count: int, **throughput: str | float) -> ResultDocument:
    """A trace replay's document made on a ``model`` machine with ``count`` CPUs, its
    PS-throughput parameters updated with ``throughput``."""
    found = make_results(runs=2, calls=6)
    found[2] = dataclasses.replace(found[2], parameters={**found[2].parameters, **throughput})
    document = build_document(found, config={}, trace_path=None, created=CREATED)
    return dataclasses.replace(
        document,
        machine=dataclasses.replace(document.machine, cpu_model=model, cpu_count=count),
    )


def test_a_step_carrying_another_machines_compute_says_whose_below_the_tables() -> None:
    xeon = "Intel(R) Xeon(R) Processor, 2 CPUs"
    kept = {"pacing": "dependencies", "compute_scale": 1.0, "captured_on": xeon}
    elsewhere = _replayed_on("AMD EPYC", 2, **kept)
    note = (
        "compute kept from another machine: the trace was captured on Intel(R) Xeon(R) "
        "Processor, 2 CPUs, replayed on AMD EPYC, 2 CPUs; the step carries the capture "
        "machine's compute (capture on this machine to predict its training)"
    )
    assert compute_machine_note(elsewhere) == note
    assert format_table(elsewhere).splitlines()[-1] == note
    # network compare's comparison: once, however many links.
    markdown = format_markdown_table([elsewhere, elsewhere]).splitlines()
    assert markdown[-1] == note and markdown.count(note) == 1
    # The same model with more cores is another machine too.
    assert compute_machine_note(_replayed_on("Intel(R) Xeon(R) Processor", 8, **kept))
    # Nothing to say: the capture machine, no compute kept, or a trace that names no machine.
    assert compute_machine_note(_replayed_on("Intel(R) Xeon(R) Processor", 2, **kept)) == ""
    assert compute_machine_note(_replayed_on("AMD EPYC", 2, **{**kept, "compute_scale": 0})) == ""
    assert compute_machine_note(_replayed_on("AMD EPYC", 2, **{**kept, "pacing": "asap"})) == ""
    assert compute_machine_note(_replayed_on("AMD EPYC", 2, pacing="recorded", captured_on=xeon))
    assert compute_machine_note(_replayed_on("AMD EPYC", 2, pacing="dependencies")) == ""
    assert compute_machine_note(_document()) == ""


def test_a_step_whose_compute_was_scaled_to_this_machine_says_by_what() -> None:
    xeon = "Intel(R) Xeon(R) Processor, 2 CPUs"
    scaled = (
        "resnet50 32x32 batch 4 keras: 100.0 ms a step on Intel(R) Xeon(R) Processor, 2 CPUs, "
        "60.0 ms on AMD EPYC, 2 CPUs (measured now): compute x0.6"
    )
    calibrated = {
        "pacing": "dependencies",
        "compute_scale": 0.6,
        "captured_on": xeon,
        "compute_calibration": scaled,
    }
    document = _replayed_on("AMD EPYC", 2, **calibrated)
    assert compute_machine_note(document) == f"compute scaled to this machine: {scaled}"
    assert format_table(document).splitlines()[-1] == f"compute scaled to this machine: {scaled}"
    # Not scaled, and why: the reason goes into the line on the capture machine's compute.
    unscaled = {**calibrated, "compute_scale": 1.0}
    unscaled["compute_calibration"] = "none: the trace records no calibration"
    assert compute_machine_note(_replayed_on("AMD EPYC", 2, **unscaled)) == (
        "compute kept from another machine: the trace was captured on Intel(R) Xeon(R) "
        "Processor, 2 CPUs, replayed on AMD EPYC, 2 CPUs; the step carries the capture "
        "machine's compute (not scaled: the trace records no calibration; capture on this "
        "machine to predict its training)"
    )
    # Communication only: no compute, nothing to say of it.
    dropped = _replayed_on("AMD EPYC", 2, **{**calibrated, "compute_scale": 0})
    assert compute_machine_note(dropped) == ""


# Exact renderings of a document's edges, worked out by hand (the mutation run of
# report.py showed these unpinned).


def _one_call(*, partial: bool = True) -> BenchmarkResult:
    """One 500 B echo taking 2 ms in a 1 s run: a small class of exactly one call, the
    others absent, no steps; stopped early without a reason, as its run."""
    run = RunMeasurement(
        run_index=0,
        duration_ns=1_000_000_000,
        samples=(
            CallSample(
                start_ns=0, latency_ns=2_000_000, request_bytes=500, response_bytes=500,
                payload_bytes=500,
            ),
        ),
        partial=partial,
    )  # fmt: skip
    return BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY,
        workload="synthetic",
        parameters={},
        runs=(run,),
        partial=partial,
    )


def _aligned(*rows: tuple[str, ...]) -> list[str]:
    """Columns two spaces apart, the first two left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


HEADER = (
    "benchmark", "workload", "rpcs", "in flight p50", "small p50/p99 us", "medium p50/p99 us",
    "large p50/p99 us", "MB/s", "RPCs/s", "step p50 ms",
)  # fmt: skip
ONE_CALL_ROW = ("synthetic", "1", "1.00", "2000 / 2000", "-", "-", "0.00", "1.00", "-")


def test_the_terminal_table_of_an_unrecorded_network_without_a_trace_is_exactly_this() -> None:
    document = build_document(
        [_one_call()], config={}, trace_path=None, machine=GOLDEN_MACHINE, created=CREATED
    )
    assert format_table(document).splitlines() == [
        "2026-11-29T12:30:05.000Z on golden-host (2 CPUs), unrecorded network, synthetic workload",
        *_aligned(HEADER, ("p2p-latency*", *ONE_CALL_ROW)),
        "* partial: p2p-latency: stopped early",
    ]
    # A document stopped early with no benchmark marked partial says why (or that it did).
    complete = build_document([_one_call(partial=False)], config={}, trace_path=None,
                              machine=GOLDEN_MACHINE, created=CREATED, partial=True)  # fmt: skip
    assert format_table(complete).splitlines()[-1] == "* partial: stopped early"
    told = dataclasses.replace(complete, partial_reason="interrupted (SIGINT)")
    assert format_table(told).splitlines()[-1] == "* partial: interrupted (SIGINT)"
    # A what-if replay says what it asked, right below the context.
    asked = Derivation(
        workers=4, ps=1, placement="size", scale_tensors=1.0, trace="t", captured_workers=2,
        captured_ps=2, variables=10,
    )  # fmt: skip
    lines = format_table(dataclasses.replace(document, what_if=asked)).splitlines()
    assert lines[1] == asked.describe() and lines[2].startswith("benchmark")


def test_the_markdown_tables_of_edges_are_exactly_these() -> None:
    unnamed = TraceInfo(
        path="/t.tfgbtrace", sha256="0" * 64, model="", strategy="", tensorflow_version="",
        format_version=3, step_count=1,
    )  # fmt: skip
    plain = build_document(
        [_one_call()], config={}, trace_path=None, machine=GOLDEN_MACHINE, created=CREATED
    )
    piped = dataclasses.replace(plain, network=NetworkInfo(name="lab|10g"), trace=unnamed)
    row = ("p2p-latency*", *ONE_CALL_ROW)
    assert format_markdown_table([plain, piped]).splitlines() == [
        "| network | trace | " + " | ".join(HEADER) + " |",
        "|" + "|".join(["---"] * 12) + "|",
        "| - | synthetic | " + " | ".join(row) + " |",
        "| lab\\|10g | ? | " + " | ".join(row) + " |",
        "",
        "* partial: -, p2p-latency: stopped early",
        "* partial: lab|10g, p2p-latency: stopped early",
    ]
    assert format_table(piped).splitlines()[0].endswith(", lab|10g, trace ? (000000000000)")
    # Benchmark results: every partial one noted, in order.
    second = dataclasses.replace(_one_call(), benchmark=Benchmark.P2P_BANDWIDTH)
    assert format_markdown_table([_one_call(), second]).splitlines()[-3:] == [
        "",
        "* partial: p2p-latency: stopped early",
        "* partial: p2p-bandwidth: stopped early",
    ]
    # Nothing to note: the table alone.
    assert len(format_markdown_table([_one_call(partial=False)]).splitlines()) == 3


def test_the_markdown_table_notes_calls_in_flight_and_whose_compute_apart() -> None:
    crowded = dataclasses.replace(
        _one_call(partial=False),
        runs=(
            dataclasses.replace(
                _one_call().runs[0],
                partial=False,
                samples=_one_call().runs[0].samples * 3,  # three calls open at once
            ),
        ),
    )
    document = build_document([crowded], config={}, trace_path=None,
                              network=NetworkInfo(name="n"), machine=GOLDEN_MACHINE,
                              created=CREATED)  # fmt: skip
    note = (
        "n: latency with calls in flight (median open when each call was issued): p2p-latency 3.00"
    )
    assert format_markdown_table([document]).splitlines()[-2:] == ["", note]
    kept = {"pacing": "recorded", "captured_on": "Other CPU, 8 CPUs"}
    elsewhere = dataclasses.replace(
        document, benchmarks=(dataclasses.replace(crowded, parameters=kept),)
    )
    lines = format_markdown_table([elsewhere]).splitlines()
    assert lines[-4:-2] == ["", note]
    assert lines[-2] == "" and lines[-1].startswith("compute kept from another machine:")


def test_a_partial_run_without_a_reason_says_yes_in_the_detail() -> None:
    lines = format_benchmark_markdown(_one_call()).splitlines()
    assert lines[2] == "| small | 1 | 2000 | 2000 | 2000 | 2000 | 2000 | 2000 |"
    assert lines[-1] == "| 0 | 1 | 1.00 | 0.00 | 1.00 | 1.00 | 2000 | 2000 | - | yes |"


@pytest.mark.parametrize(
    ("value", "shown"),
    [(100.0, "100"), (-100.0, "-100"), (99.99, "100.0"), (10.0, "10.0"), (-10.0, "-10.0"),
     (9.999, "10.00"), (0.0, "0.00")],
)  # fmt: skip
def test_numbers_change_their_decimals_exactly_at_100_and_10(value: float, shown: str) -> None:
    assert format_number(value) == shown


def test_times_are_shown_in_their_own_units_to_the_last_digit() -> None:
    # 100.00005 ms and 100.00005 s read "100"; a divisor one part in a million off would
    # make them 99.99995, "100.0".
    one = _one_call(partial=False)
    run = dataclasses.replace(
        one.runs[0], duration_ns=100_000_000_050, step_times_ns=(100_000_050,)
    )
    stepped = dataclasses.replace(one, runs=(run,))
    document = build_document(
        [stepped], config={}, trace_path=None, machine=GOLDEN_MACHINE, created=CREATED
    )
    assert format_table(document).splitlines()[2].split()[-1] == "100"
    run_cells = _cells(format_benchmark_markdown(stepped).splitlines()[-1])
    assert (run_cells[2], run_cells[8]) == ("100", "100")
    # A run that answered no call had no call in flight.
    silent = dataclasses.replace(one, runs=(dataclasses.replace(one.runs[0], samples=()),))
    assert _cells(format_benchmark_markdown(silent).splitlines()[-1])[5] == "-"


def test_a_partial_trace_is_said_after_the_trace_it_is() -> None:
    hung = TraceInfo(
        path="/t.tfgbtrace", sha256="ab" * 32, model="m", strategy="", tensorflow_version="",
        format_version=3, step_count=1, partial_reason="the job looks hung",
    )  # fmt: skip
    document = build_document(
        [_one_call(partial=False)], config={}, trace_path=None, machine=GOLDEN_MACHINE,
        created=CREATED,
    )  # fmt: skip
    assert format_table(dataclasses.replace(document, trace=hung)).splitlines()[0] == (
        "2026-11-29T12:30:05.000Z on golden-host (2 CPUs), unrecorded network, "
        "trace m (abababababab), PARTIAL trace (the job looks hung)"
    )
