"""bench/fidelity.py's repeated side-by-side pairs (``--repeats``, ``--order``): the order each
pair's runs are made in, how the runs of each side are pooled, how far apart the reference's
runs were, and the rows and tables that say so, in its own-machine and cross-machine modes
(pure: fixed runs, no training, no replay)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BENCH, load_bench_script

fidelity = load_bench_script("fidelity.py", "bench_fidelity")
training = sys.modules["training"]

# Two uncaptured runs whose medians are 0.60 s and 0.70 s apart (16.7%: the reference moved),
# and two captures of 0.62 s and 0.72 s rounds.
FIRST = (0.60, 0.62, 0.58, 0.61, 0.59, 0.60, 0.63, 0.57)
SECOND = (0.70, 0.68, 0.72, 0.69, 0.71, 0.70, 0.70, 0.73)


def _uncaptured(rounds: tuple[float, ...], cpu: float | None = 1.0) -> Any:
    return training.Uncaptured(
        round_s=sorted(rounds)[len(rounds) // 2], tasks_cpu_per_round_s=cpu,
        rounds=len(rounds), rounds_s=rounds,
    )  # fmt: skip


def _prediction(step_s: float, document: Path, **extra: float) -> Any:
    return fidelity.Prediction(
        step_s=step_s, compute_s=0.1, cpu_cores=0.5, cpu_per_round_s=None, document=document,
        **extra,
    )  # fmt: skip


def _repeat(
    plain: tuple[float, ...],
    captured_s: float,
    prediction: Any,
    link: str = "10gbit",
    *,
    captured_first: bool = False,
) -> Any:
    uncaptured = _uncaptured(plain)
    facts = training.CaptureFacts(
        link=link, round_s=captured_s, cpu=None, tasks_cpu_per_round_s=None,
        path_compute_s=None, path_communication_s=None, uncaptured=uncaptured,
    )  # fmt: skip
    return fidelity.Repeat(
        uncaptured=uncaptured, capture=facts, captured_rounds_s=(captured_s,) * 8,
        prediction=prediction, captured_first=captured_first,
    )  # fmt: skip


def test_each_order_schedules_the_pairs_trainings_the_replay_after_its_capture() -> None:
    a, b = fidelity.UNCAPTURED, fidelity.CAPTURED
    assert fidelity.schedule("alternate", 3) == ((a, b, "R"), (b, a, "R"), (a, b, "R"))
    assert fidelity.schedule("uncaptured-first", 2) == ((a, b, "R"), (a, b, "R"))
    assert fidelity.schedule("captured-first", 2) == ((b, a, "R"), (b, a, "R"))
    # One pair alternates to nothing: uncaptured first, as before.
    assert fidelity.schedule("alternate", 1) == ((a, b, "R"),)
    assert fidelity.schedule_text(fidelity.schedule("alternate", 2)) == "A B R | B A R"
    assert fidelity.ORDERS[0] == "alternate" == fidelity.arguments([]).order
    with pytest.raises(ValueError, match="--order: one of alternate, uncaptured-first"):
        fidelity.schedule("random", 2)
    # A pair says its own order as the schedule made it.
    for order in fidelity.ORDERS:
        made = [
            _repeat(FIRST, 0.62, None, captured_first=runs[0] == b)
            for runs in fidelity.schedule(order, 4)
        ]
        assert tuple(r.runs for r in made) == fidelity.schedule(order, 4)


def test_a_pairs_trainings_are_made_in_its_order_and_returned_by_kind() -> None:
    made: list[str] = []

    def uncaptured() -> str:
        made.append("uncaptured")
        return "plain"

    def captured() -> str:
        made.append("captured")
        return "trace"

    for runs, expected in (
        (fidelity.pair_runs(False), ["uncaptured", "captured"]),
        (fidelity.pair_runs(True), ["captured", "uncaptured"]),
    ):
        made.clear()
        assert fidelity.in_order(runs, uncaptured, captured) == ("plain", "trace")
        assert made == expected


def test_runs_pool_every_rounds_median_and_say_how_far_apart_they_were() -> None:
    runs = training.Runs((FIRST, SECOND))
    assert runs.medians_s == pytest.approx((0.60, 0.70))
    # The median of the 16 rounds together: between the 8th (0.63) and the 9th (0.68).
    assert runs.median_s == pytest.approx(0.655)
    assert runs.spread == pytest.approx(0.70 / 0.60 - 1)
    assert runs.moved
    # Interquartile range over median, quartiles inclusive: (0.6125 - 0.5875) / 0.60.
    assert runs.rounds_spreads == pytest.approx((0.025 / 0.60, 0.015 / 0.70))
    steady = training.Runs((FIRST, tuple(r * 1.04 for r in FIRST)))
    assert steady.spread == pytest.approx(0.04) and not steady.moved
    one = training.Runs((FIRST,))
    assert one.spread is None and not one.moved and one.median_s == pytest.approx(0.60)
    assert training.rounds_spread((0.5, 0.6, 0.7)) is None  # too few rounds for quartiles
    assert training.percent(None) == "-" and training.percent(0.16667) == "16.7%"


def test_uncaptured_runs_pool_into_one_reference() -> None:
    pooled = training.pooled_uncaptured([_uncaptured(FIRST, 1.0), _uncaptured(SECOND, 1.2)])
    assert pooled.round_s == pytest.approx(0.655) and pooled.rounds == 16
    assert pooled.tasks_cpu_per_round_s == pytest.approx(1.1)
    assert pooled.rounds_s == FIRST + SECOND
    # A run known by its median alone (no rounds) counts as one round of that median.
    bare = training.Uncaptured(round_s=0.5, tasks_cpu_per_round_s=None, rounds=8)
    alone = training.pooled_uncaptured([bare])
    assert alone.round_s == 0.5 and alone.tasks_cpu_per_round_s is None
    assert training.uncaptured_runs([bare, _uncaptured(FIRST)]).medians_s == pytest.approx(
        (0.5, 0.60)
    )


def test_a_row_of_repeats_gives_the_pooled_ratios_each_repeats_and_the_references_spread(
    tmp_path: Path,
) -> None:
    repeats = [
        _repeat(FIRST, 0.62, _prediction(0.62, tmp_path), "10gbit #1"),
        _repeat(SECOND, 0.72, _prediction(0.70, tmp_path), "10gbit #2", captured_first=True),
    ]
    row = fidelity.pooled_row(
        "resnet50", "10gbit", repeats, link_bound_s=0.16, from_loopback=_prediction(0.60, tmp_path)
    )
    assert row.uncaptured.round_s == pytest.approx(0.655) and row.training_s == pytest.approx(0.67)
    assert row.predicted_s == pytest.approx(0.66) and row.from_link is None
    body = fidelity.report([row], "tf2-ps", "cmd", "0", "0")
    lines = body.splitlines()
    # Loopback trace: 0.60 / 0.655 and / 0.67; link traces: their median 0.66 / 0.655, / 0.67.
    assert (
        "| resnet50 | 10gbit | 0.66 s | 0.67 s | 0.16 s | 0.60 s | **0.92** / 0.90 (reference "
        "moved 16.7%) | 0.66 s | **1.01** / 0.99 (reference moved 16.7%) | - | - |"
    ) in lines
    assert "Each link: 2 side-by-side pairs" in body
    assert "the capture's trace replayed (R) after its pair: A B R | B A R" in lines
    assert (
        "| 10gbit | 0.60 s, 0.70 s | 16.7% | 4.2%, 2.1% | 0.62 s, 0.72 s | 0.62 s, 0.70 s | "
        "**1.03** / 1.00, **1.00** / 0.97 | 1.033, 1.029 | A B, B A |"
    ) in lines
    # The pooling does not depend on the order: the same runs, all A B, pool alike.
    same = [dataclasses.replace(r, captured_first=False) for r in repeats]
    assert fidelity.pooled_row(
        "resnet50", "10gbit", same, link_bound_s=0.16, from_loopback=None
    ).predicted_s == pytest.approx(row.predicted_s)
    assert (
        "Capture cost by order, mean over the pairs above: uncaptured first (A B) 1.033 "
        "(1 pair), captured first (B A) 1.029 (1 pair)."
    ) in lines
    # The capture table has a row per repeat's capture.
    assert any(line.startswith("| 10gbit #1 | 0.62 s |") for line in lines)
    assert any(line.startswith("| 10gbit #2 | 0.72 s |") for line in lines)


def test_the_tables_say_each_pairs_order_and_the_mean_capture_cost_per_order(
    tmp_path: Path,
) -> None:
    """Two links of two pairs each, A B then B A: the repeats' table marks every pair's order,
    and the line under it averages the captures' cost over each order's pairs, every link's."""
    close = tuple(r * 1.02 for r in FIRST)  # medians 0.60 and 0.612
    links = [
        ("5gbit", [_repeat(FIRST, 0.59, None), _repeat(close, 0.63, None, captured_first=True)]),
        ("10gbit", [_repeat(SECOND, 0.68, None), _repeat(SECOND, 0.72, None, captured_first=True)]),
    ]
    lines = fidelity.repeats_table(links)
    rows = [line for line in lines if line.startswith(("| 5gbit |", "| 10gbit |"))]
    assert [row.rsplit(" | ", 2)[1:] for row in rows] == [
        ["0.983, 1.029", "A B, B A |"],
        ["0.971, 1.029", "A B, B A |"],
    ]
    # Uncaptured first: 0.59 / 0.60 and 0.68 / 0.70; captured first: 0.63 / 0.612, 0.72 / 0.70.
    uncaptured_first = (0.59 / 0.60 + 0.68 / 0.70) / 2
    captured_first = (0.63 / 0.612 + 0.72 / 0.70) / 2
    assert lines[-1] == (
        f"Capture cost by order, mean over the pairs above: uncaptured first (A B) "
        f"{uncaptured_first:.3f} (2 pairs), captured first (B A) {captured_first:.3f} (2 pairs)."
    )
    assert f"{uncaptured_first:.3f}" == "0.977" and f"{captured_first:.3f}" == "1.029"
    # One order run: its mean alone.
    captured = [r for _, repeats in links for r in repeats if r.captured_first]
    assert fidelity.order_costs(captured) == (
        f"Capture cost by order, mean over the pairs above: captured first (B A) "
        f"{captured_first:.3f} (2 pairs)."
    )
    rows_of_links = [
        fidelity.pooled_row("resnet50", link, repeats, link_bound_s=None, from_loopback=None)
        for link, repeats in links
    ]
    body = fidelity.report(rows_of_links, "tf2-ps", "cmd", "0", "0")
    assert lines[-1] in body.splitlines()
    # The capture table says the uncaptured run is beside its capture, not before it.
    assert "right before each capture" not in body and "just\nbefore or after it" in body


def test_a_steady_reference_is_not_flagged_and_a_failed_replay_is_counted(tmp_path: Path) -> None:
    close = tuple(r * 1.03 for r in FIRST)
    dilated = _prediction(0.64, tmp_path, time_dilation=2.0)
    repeats = [_repeat(FIRST, 0.62, dilated), _repeat(close, 0.63, None)]
    row = fidelity.pooled_row("resnet50", "10gbit", repeats, link_bound_s=None, from_loopback=None)
    body = fidelity.report([row], "tf2-ps", "cmd", "0", "0")
    (line,) = [line for line in body.splitlines() if line.startswith("| resnet50 | 10gbit |")]
    assert "reference moved" not in body.split("Each link's repeats")[1].split("\n\n")[1]
    assert "| failed | - | 0.64 s (x2) (1 of 2 failed) | **" in line
    assert "reference moved" not in line
    (each,) = [line for line in body.splitlines() if line.startswith("| 10gbit | 0.60 s, ")]
    assert "| 3.0% |" in each and "| 0.64 s (x2), failed |" in each
    failed = fidelity.pooled_row(
        "resnet50", "10gbit", [_repeat(FIRST, 0.62, None)], link_bound_s=None, from_loopback=None
    )
    assert fidelity._pooled_cells(failed) == ["failed", "-"]


def test_a_row_of_one_pair_reads_as_before(tmp_path: Path) -> None:
    """Without repeats (a row built of one pair's figures) the table is the one-pair table."""
    plain = training.Uncaptured(round_s=0.75, tasks_cpu_per_round_s=0.70, rounds=8)
    row = fidelity.Row(
        model="tiny", profile="5gbit", training_s=0.80, link_bound_s=0.33,
        from_loopback=_prediction(0.80, tmp_path), from_link=_prediction(0.78, tmp_path),
        uncaptured=plain,
    )  # fmt: skip
    body = fidelity.report([row], "tf2-ps", "cmd", "0", "0")
    assert "| tiny | 5gbit | 0.75 s | 0.80 s | 0.33 s | 0.80 s | **1.07** / 1.00 | 0.78 s |" in body
    assert "repeats" not in body and row.uncaptured_runs is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--repeats", "0"], "error: --repeats: at least 1 pair a link is measured, got 0"),
        (["--repeats", "-2"], "error: --repeats: at least 1 pair a link is measured, got -2"),
        (["--repeats", "two"], "error: argument --repeats: invalid int value: 'two'"),
        (["--steps", "0"], "error: --steps: at least 1 round a run is measured, got 0"),
        (
            ["--order", "random"],
            "error: argument --order: invalid choice: 'random' (choose from 'alternate', "
            "'uncaptured-first', 'captured-first')",
        ),
    ],
)
def test_bad_repeats_are_one_line_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        fidelity.arguments(flags)
    assert stopped.value.code == 2
    (last,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert last.endswith(message)


def test_a_bad_order_stops_the_script_with_one_line_and_no_traceback() -> None:
    completed = subprocess.run(
        [sys.executable, str(BENCH / "fidelity.py"), "--order", "A-B", "--no-readme"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 2 and completed.stdout == ""
    assert "Traceback" not in completed.stderr
    (error,) = [line for line in completed.stderr.splitlines() if "error" in line]
    assert error.startswith("fidelity.py: error: argument --order: invalid choice: 'A-B'")


def test_each_side_is_measured_twice_unless_asked() -> None:
    assert fidelity.arguments([]).repeats == 2
    assert fidelity.arguments(["--repeats", "3", "--cross-machine", "x"]).repeats == 3
    assert fidelity.arguments(["--order", "uncaptured-first"]).order == "uncaptured-first"


def test_the_cross_machine_mode_pools_its_repeats_and_writes_the_pooled_ratio(
    tmp_path: Path,
) -> None:
    from tf_grpc_bench import cross_machine, trace_files

    bench = load_bench_script("cross_machine.py", "bench_cross_machine")
    document = tmp_path / "results.json"
    document.write_text(
        json.dumps({"benchmarks": [{"parameters": {"compute_calibration": "x: compute x1.25"}}]})
    )
    repeats = [
        _repeat(FIRST, 0.62, _prediction(0.62, document)),
        _repeat(SECOND, 0.72, _prediction(0.70, document), captured_first=True),
    ]
    row = bench.cross_row("10gbit", repeats, link_bound_s=0.16)
    assert row.ratio == pytest.approx(0.66 / 0.655) and row.compute == "compute x1.25"
    shipped = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps"))
    body = bench.report("resnet50-tf2ps", shipped, [row], "cmd", "0")
    assert (
        "| 10gbit | 0.66 s | 0.67 s | 0.16 s | 0.66 s | **1.01** / 0.99 (reference moved "
        "16.7%) | compute x1.25 | none |"
    ) in body
    assert "| 10gbit | 0.60 s, 0.70 s | 16.7% | 4.2%, 2.1% |" in body
    assert "| 1.033, 1.029 | A B, B A |" in body
    assert "(B), the trace replayed (R) after each: A B R | B A R;" in body
    assert "uncaptured first (A B) 1.033 (1 pair), captured first (B A) 1.029 (1 pair)." in body
    # The pairs file keeps its format: the pooled ratio, read back as written.
    (pair,) = bench.measured_pairs("resnet50-tf2ps", shipped, [row], "cmd --repeats 2")
    assert pair.ratio == pytest.approx(0.66 / 0.655)
    written = tmp_path / "pairs.json"
    written.write_text(cross_machine.pairs_document([pair]))
    assert cross_machine.read_pairs(written) == (
        cross_machine.MeasuredPair.from_json(pair.as_json(), "x"),
    )
    # Every replay failed: no ratio, no pair.
    failed = bench.cross_row("10gbit", [_repeat(FIRST, 0.62, None)], link_bound_s=None)
    assert failed.ratio is None and failed.compute == "-"
    assert bench.measured_pairs("resnet50-tf2ps", shipped, [failed], "cmd") == []
