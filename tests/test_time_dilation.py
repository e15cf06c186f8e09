"""Time dilation: a replay K times slower, on a link K times slower, reported in training's time.

The arithmetic (``measurement.in_link_time``, ``RunPlan``, ``Pacing``), the flag,
the network record, ``network compare``'s automatic choice, and real replays:
on loopback (the compute gaps stretched and the times divided) and, as root,
across an emulated link shaped K times slower.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import statistics
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tf_grpc_bench import lifetime, trace_files
from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.netns import links
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    RunMeasurement,
    in_link_time,
)
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.planning import parse_time_dilation
from tf_grpc_bench.replay.network import compare
from tf_grpc_bench.replay.network.dilation import (
    DilatedReplay,
    dilated_prediction,
    settled,
    within_spread,
)
from tf_grpc_bench.replay.network.netinfo import undilated
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.transport.loop import RunPlan
from tf_grpc_bench.trace import Trace

from .conftest import make_trace, namespaces_made_by, run_with_pid
from .result_factory import GOLDEN_MACHINE

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))
#: The paced trace's recorded step period: one small call, then compute until the next step.
PERIOD_NS = 40_000_000


def _sample(start_ns: int, latency_ns: int, lag_ns: int) -> CallSample:
    return CallSample(
        start_ns=start_ns,
        latency_ns=latency_ns,
        request_bytes=120,
        response_bytes=4096,
        payload_bytes=4096,
        step=0,
        release_lag_ns=lag_ns,
    )


def test_in_link_time_divides_every_time_and_keeps_the_counts() -> None:
    run = RunMeasurement(
        run_index=1,
        duration_ns=9_000,
        samples=(_sample(0, 300, 30), _sample(600, 903, -6)),
        step_times_ns=(4_500, 4_503),
        step_compute_ns=(3_000, 2_999),
        client_cpu_ns=1_200,
        server_cpu_ns=600,
        server_received_bytes=240,
        server_received_messages=2,
        machine_cpu_busy_ticks=50,
        machine_cpu_total_ticks=200,
    )
    link = in_link_time(run, 3)
    assert link.duration_ns == 3_000
    assert [(s.start_ns, s.latency_ns, s.release_lag_ns) for s in link.samples] == [
        (0, 100, 10),
        (200, 301, -2),
    ]
    assert link.step_times_ns == (1_500, 1_501)
    assert link.step_compute_ns == (1_000, 1_000)
    # CPU over wall time reads as measured: a share of the cores is not a duration.
    assert (link.client_cpu_ns, link.server_cpu_ns) == (400, 200)
    assert (link.machine_cpu_busy_ticks, link.machine_cpu_total_ticks) == (50, 200)
    assert (link.server_received_bytes, link.server_received_messages) == (240, 2)
    assert [(s.request_bytes, s.response_bytes) for s in link.samples] == [(120, 4096)] * 2
    assert link.run_index == 1
    assert in_link_time(run, 1) is run
    assert in_link_time(run, 2).duration_ns == 4_500  # any dilation above 1, 2 included
    with pytest.raises(ValueError, match="time dilation must be >= 1"):
        in_link_time(run, 0.5)


def test_a_dilated_pacing_stretches_the_compute_it_keeps() -> None:
    pacing = Pacing(timing=Timing.DEPENDENCIES, compute_scale=0.5, time_dilation=4)
    assert pacing.wall_compute_scale == 2.0
    assert "time dilation 4" in pacing.describe()
    assert Pacing(timing=Timing.DEPENDENCIES).wall_compute_scale == 1.0
    assert "dilation" not in Pacing(timing=Timing.DEPENDENCIES).describe()
    with pytest.raises(ConfigError, match="--time-dilation applies only to --pacing dependencies"):
        Pacing(timing=Timing.ASAP, time_dilation=2)
    for factor in (0.5, 65.0):
        with pytest.raises(ConfigError, match=r"--time-dilation must be in \[1, 64\]"):
            Pacing(timing=Timing.DEPENDENCIES, time_dilation=factor)


def test_a_dilated_plan_reports_the_times_asked_in_training_time() -> None:
    plan = RunPlan(warmup_ns=6_000_000_000, duration_ns=30_000_000_000, deadline_s=180.0)
    assert "time_dilation" not in plan.parameters()
    dilated = dataclasses.replace(plan, time_dilation=3.0)
    parameters = dilated.parameters()
    assert parameters["warmup_s"] == 2.0
    assert parameters["duration_s"] == 10.0
    assert parameters["deadline_s"] == 60.0
    assert parameters["time_dilation"] == 3.0
    with pytest.raises(ConfigError, match="--time-dilation must be >= 1"):
        dataclasses.replace(plan, time_dilation=0.9)


@pytest.mark.parametrize(
    ("text", "allow_auto", "expected"),
    [(None, False, 1.0), (None, True, None), ("auto", True, None), ("2.5", False, 2.5)],
)
def test_the_flag_reads_a_factor_or_auto_where_allowed(
    text: str | None, allow_auto: bool, expected: float | None
) -> None:
    assert parse_time_dilation(text, allow_auto=allow_auto) == expected


@pytest.mark.parametrize(
    ("text", "allow_auto", "message"),
    [
        ("auto", False, "--time-dilation 'auto': expected a factor such as 4"),
        ("fast", True, "--time-dilation 'fast': expected 'auto' or a factor such as 4"),
        ("0.5", False, r"--time-dilation '0.5': must be in \[1, 64\]"),
        ("nan", False, r"--time-dilation 'nan': must be in \[1, 64\]"),
        ("100", True, r"--time-dilation '100': must be in \[1, 64\]"),
    ],
)
def test_a_bad_factor_names_the_flag(text: str, allow_auto: bool, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_time_dilation(text, allow_auto=allow_auto)


def test_the_network_record_names_the_link_predicted_and_the_rate_shaped() -> None:
    shaped = NetworkInfo(
        name="5gbit", emulated_rate_bits_per_s=1_250_000_000, emulation="tbf rate 1.25gbit on eth0"
    )
    network = undilated(shaped, 4)
    assert network.emulated_rate_bits_per_s == 5_000_000_000
    assert network.emulation.startswith("tbf rate 1.25gbit on eth0; time dilation 4: replays a ")
    assert network.name == "5gbit"
    assert undilated(shaped, 1) is shaped
    loopback = NetworkInfo(name="loopback")
    assert undilated(loopback, 4) is loopback


def _document(
    *,
    cores: float,
    step_ns: int,
    cpu_count: int = 2,
    compute_ns: int = 0,
    runs_step_ns: tuple[int, ...] = (),
    machine_share: float = 0.0,
) -> results.ResultDocument:
    """A PS throughput replay's document whose client and server kept ``cores`` busy,
    with ``compute_ns`` of each step's critical path compute (the rest communication):
    one run of steps of ``step_ns``, or one run per ``runs_step_ns`` with steps of that
    length; the whole machine ``machine_share`` busy (0: unknown)."""
    duration_ns = 10_000_000_000
    runs = tuple(
        RunMeasurement(
            run_index=index,
            duration_ns=duration_ns,
            samples=(_sample(0, 1_000, 0),),
            step_times_ns=(run_step_ns,) * 4,
            step_compute_ns=(compute_ns,) * 4,
            client_cpu_ns=round(cores * duration_ns / 2),
            server_cpu_ns=round(cores * duration_ns / 2),
            machine_cpu_busy_ticks=round(1000 * machine_share),
            machine_cpu_total_ticks=1000 if machine_share else 0,
        )
        for index, run_step_ns in enumerate(runs_step_ns or (step_ns,))
    )
    result = BenchmarkResult(
        benchmark=Benchmark.PS_THROUGHPUT,
        workload="trace",
        parameters={"pacing": "dependencies"},
        runs=runs,
    )
    return results.ResultDocument(
        created_utc="2026-12-01T00:00:00Z",
        tool_version="test",
        machine=dataclasses.replace(GOLDEN_MACHINE, cpu_count=cpu_count),
        config={},
        benchmarks=(result,),
    )


def test_automatic_dilation_doubles_up_to_the_cap() -> None:
    # Busy or quiet, the next dilation is twice the last: averages hide bursts.
    assert compare.next_dilation(_document(cores=1.7, step_ns=10**9), 1.0) == 2.0
    assert compare.next_dilation(_document(cores=0.2, step_ns=10**9), 1.0) == 2.0
    assert compare.next_dilation(_document(cores=0.2, step_ns=10**9), 2.0) == 4.0
    assert compare.next_dilation(_document(cores=3.9, step_ns=10**9, cpu_count=4), 3.0) == 6.0
    # At most the cap; none past it, nor without a prediction.
    assert compare.next_dilation(_document(cores=2.0, step_ns=10**9), 12.0) == 16.0
    assert compare.next_dilation(_document(cores=2.0, step_ns=10**9), 16.0) is None
    assert compare.next_dilation(None, 1.0) is None


def test_cores_while_communicating_say_whether_the_replay_was_busy() -> None:
    # VGG-16 at 2.5 Gbit/s (2026-12-01): 0.97 of 2 cores over an 11.09 s step of which
    # 1.27 s was compute: 1.10 cores while it communicated, busy.
    vgg = _document(cores=0.97, step_ns=11_090_000_000, compute_ns=1_270_000_000)
    assert compare.communicating_cores(compare._prediction(vgg) or {}, 2) == pytest.approx(
        0.97 * 11.09 / 9.82, rel=1e-3
    )
    assert compare.cpu_busy(vgg)
    # ResNet-50 at 1 Gbit/s: 0.71 cores over 3.72 s with 0.27 s compute: 0.77, not busy.
    resnet = _document(cores=0.71, step_ns=3_720_000_000, compute_ns=270_000_000)
    assert not compare.cpu_busy(resnet)
    # Half the step compute: 0.6 cores on average are 1.2 while communicating, busy;
    # the same 0.6 over a step without compute is not.
    half = _document(cores=0.6, step_ns=10**9, compute_ns=5 * 10**8)
    assert compare.communicating_cores(compare._prediction(half) or {}, 2) == pytest.approx(1.2)
    assert compare.cpu_busy(half)
    assert not compare.cpu_busy(_document(cores=0.6, step_ns=10**9))
    # A step that is nearly all compute cannot have had more than every core busy
    # while it communicated: capped at the machine's 2.
    compute_bound = _document(cores=0.5, step_ns=10**9, compute_ns=99 * 10**7)
    assert compare.communicating_cores(compare._prediction(compute_bound) or {}, 2) == 2.0
    assert not compare.cpu_busy(None)
    # The progress line gives both figures.
    assert "kept 0.97 of 2 cores busy (1.10 while it communicated)" in compare._busy(vgg)


def _automatic(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    steps_s: Mapping[float, float | tuple[float, ...]],
    *,
    dilatable: bool = True,
    cores: float | dict[float, float] = 0.5,
    machine_share: float = 0.0,
) -> tuple[compare.ProfileOutcome, list[float], list[str]]:
    """``_replay_profile`` of a 1gbit link in automatic mode, each replay at dilation K
    predicting ``steps_s[K]`` (one run, or a run per step given): what it returned, the
    dilations replayed, its lines."""
    replayed: list[float] = []

    def run_profile(
        config: compare.CompareConfig, profile: links.LinkProfile, on_line: object, k: float
    ) -> compare.ProfileOutcome:
        replayed.append(k)
        busy = cores[k] if isinstance(cores, dict) else cores
        step = steps_s[k]
        per_run = step if isinstance(step, tuple) else (step,)
        document = _document(
            cores=busy,
            step_ns=round(statistics.median(per_run) * 1e9),
            runs_step_ns=tuple(round(s * 1e9) for s in per_run),
            machine_share=machine_share,
        )
        return compare.ProfileOutcome(
            profile=profile, results_path=None, document=document, time_dilation=k
        )

    monkeypatch.setattr(compare, "_run_profile", run_profile)
    profile = links.LinkProfile(name="1gbit", rate_bits_per_s=10**9)
    config = compare.CompareConfig(profiles=(profile,), output_dir=tmp_path, dilatable=dilatable)
    lines: list[str] = []
    outcome = compare._replay_profile(config, profile, lines.append)
    return outcome, replayed, lines


def test_automatic_dilation_replays_until_the_step_stops_moving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The replay's own speed mattered up to dilation 4: 10 -> 9 -> 8.2 s, then 8.0 (2.4%).
    steps = {1.0: 10.0, 2.0: 9.0, 4.0: 8.2, 8.0: 8.0, 16.0: 7.0}
    outcome, replayed, lines = _automatic(monkeypatch, tmp_path, steps)
    assert replayed == [1.0, 2.0, 4.0, 8.0]
    assert outcome.time_dilation == 8.0
    assert outcome.tried == ((1.0, 10.0), (2.0, 9.0), (4.0, 8.2))
    # One run per replay: said once, before the first progress line.
    assert lines[0] == (
        "1gbit: one run per replay: no spread over runs is measured, 5% of the step stands "
        "in for it (--runs 3 or more measures it)"
    )
    assert sum("one run per replay" in line for line in lines) == 1
    assert lines[1].startswith("1gbit: at time dilation 1 the replay predicted a 10.000 s step")
    assert lines[1].endswith("replaying again at time dilation 2 (does the step depend on the "
                             "replay's own speed?)")  # fmt: skip
    line = compare._dilation_line(outcome)
    assert "(predicted before: 10.000 s at 1, 9.000 s at 2, 8.200 s at 4); " in line
    # A quiet replay whose step does not move (within 5% without runs to spread over) is
    # dilated once, to check, and its undilated step stands.
    outcome, replayed, _ = _automatic(monkeypatch, tmp_path, {1.0: 3.7, 2.0: 3.65, 4.0: 3.66})
    assert replayed == [1.0, 2.0] and outcome.tried == ((1.0, 3.7),)
    assert outcome.predicted_step_s == 3.7 and outcome.limit is None
    # Never past the cap.
    moving = {1.0: 32.0, 2.0: 16.0, 4.0: 8.0, 8.0: 4.0, 16.0: 2.0}
    outcome, replayed, _ = _automatic(monkeypatch, tmp_path, moving)
    assert replayed == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_automatic_dilation_of_a_mixed_run_says_why_it_did_not_dilate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # P2P benchmarks ride along (not dilatable): one replay; a line only if it was busy.
    outcome, replayed, lines = _automatic(monkeypatch, tmp_path, {1.0: 2.0}, dilatable=False)
    assert replayed == [1.0] and lines == [] and outcome.tried == ()
    _, replayed, lines = _automatic(monkeypatch, tmp_path, {1.0: 2.0}, dilatable=False, cores=1.5)
    assert replayed == [1.0]
    assert lines == [
        "1gbit: the replay kept 1.50 of 2 cores busy (1.50 while it communicated) (bound by "
        "its machine); time dilation applies to a trace's ps-throughput replay alone "
        "(--benchmark ps-throughput)"
    ]


def test_the_limit_is_fitted_through_the_dilated_replays() -> None:
    # A step of S + c/K is found again exactly, from any two dilated replays or more;
    # the undilated replay (often the replay's CPU) takes no part.
    exact = [(k, 4.0 + 1.3 / k) for k in (1.0, 2.0, 4.0, 8.0)]
    limit = compare.dilation_limit(exact)
    assert limit is not None and limit.extrapolated
    assert limit.step_s == pytest.approx(4.0) and limit.overhead_s == pytest.approx(1.3)
    assert [k for k, _ in limit.points] == [2.0, 4.0, 8.0]
    two = compare.dilation_limit(exact[2:])
    assert two is not None and two.step_s == pytest.approx(4.0)
    # VGG-16 at 5 Gbit/s (2026-12-03 08:22, the loopback trace): 4.579, 4.348, 4.190 s at
    # K = 2, 4, 8, still falling by 3.6% when the 5% rule stopped; the fit says 4.07 s.
    vgg = compare.dilation_limit([(1.0, 5.250), (2.0, 4.579), (4.0, 4.348), (8.0, 4.190)])
    assert vgg is not None and vgg.step_s == pytest.approx(4.0745, abs=1e-3)
    assert vgg.describe() == (
        "the step's limit as the dilation grows (step = S + c/K through K = 2, 4, 8): "
        "S = 4.075 s (c = 1.021 s), the prediction"
    )
    # A step that did not fall with the dilation is not extrapolated (upwards or at all):
    # the last replay's step stands.
    flat = compare.dilation_limit([(2.0, 0.815), (4.0, 0.836)])
    assert flat is not None and not flat.extrapolated and flat.step_s == 0.836
    assert flat.describe().startswith("the step did not fall with the dilation (K = 2, 4)")
    # Fewer than two dilated replays: nothing to fit through.
    assert compare.dilation_limit([(1.0, 3.0), (2.0, 2.9)]) is None
    assert compare.dilation_limit([]) is None


def test_automatic_dilation_predicts_the_limit_of_the_replays_that_left_the_machine_idle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    steps = {1.0: 6.0, 2.0: 4.0 + 1.2 / 2, 4.0: 4.0 + 1.2 / 4, 8.0: 4.0 + 1.2 / 8}
    outcome, replayed, lines = _automatic(monkeypatch, tmp_path, steps)
    assert replayed == [1.0, 2.0, 4.0, 8.0]
    assert outcome.limit is not None and outcome.predicted_step_s == pytest.approx(4.0)
    assert lines[-1].startswith("1gbit: the dilated replays differ by more than their spread; "
                                "the step's limit as the dilation grows")  # fmt: skip
    assert compare._dilation_line(outcome).endswith("S = 4.000 s (c = 1.200 s), the prediction")
    # A replay bound by its own processes (1.5 of 2 cores at K = 2) waited for cores: no
    # point of S + c/K.  The two left (K = 4 and 8) differ by less than 5%: no fit, the
    # last of them.  Half the cores busy while communicating (1.0 here) is no verdict.
    busy = {1.0: 1.9, 2.0: 1.5, 4.0: 0.5, 8.0: 1.0}
    bound_steps = {**steps, 2.0: 5.5}
    outcome, replayed, _ = _automatic(monkeypatch, tmp_path, bound_steps, cores=busy)
    assert replayed == [1.0, 2.0, 4.0, 8.0] and outcome.limit is None
    assert outcome.predicted_step_s == pytest.approx(4.15)
    assert [r.busy for r in outcome.replays] == [True, True, False, False]
    # A flat step behind a bound K = 2: dilated once more, to a replay not bound; every
    # dilated step is within 5% of the undilated one, which stands.
    flat = {1.0: 3.0, 2.0: 3.0, 4.0: 3.0, 8.0: 3.0, 16.0: 3.0}
    outcome, replayed, _ = _automatic(
        monkeypatch, tmp_path, flat, cores={1.0: 0.5, 2.0: 1.9, 4.0: 0.5, 8.0: 0.5}
    )
    assert replayed == [1.0, 2.0, 4.0]
    assert outcome.limit is None and outcome.predicted_step_s == 3.0
    assert outcome.decision is not None and "the undilated 3.000 s" in outcome.decision.basis
    # Bound up to the cap: the one replay not bound, K = 16.
    outcome, replayed, _ = _automatic(
        monkeypatch, tmp_path, flat, cores={1.0: 1.9, 2.0: 1.9, 4.0: 1.9, 8.0: 1.9, 16.0: 0.5}
    )
    assert replayed == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert outcome.limit is None and outcome.predicted_step_s == pytest.approx(3.0)
    # The comparison's JSON says all of it, per profile.
    outcome, _, _ = _automatic(monkeypatch, tmp_path, steps)
    (written,) = compare.comparison_json([outcome])["profiles"]
    assert written["profile"] == "1gbit" and written["time_dilation"] == 8.0
    assert [r["time_dilation"] for r in written["replays"]] == [1.0, 2.0, 4.0, 8.0]
    assert written["replays"][0]["step_s"] == pytest.approx(6.0)
    assert written["step_s"] == pytest.approx(4.15)
    assert written["predicted_step_s"] == pytest.approx(4.0)
    assert written["limit"]["time_dilations"] == [2.0, 4.0, 8.0]
    assert written["limit"]["extrapolated"] is True
    assert [r["spread_s"] for r in written["replays"]] == [None] * 4
    assert [r["busy"] for r in written["replays"]] == [False] * 4
    assert written["prediction_basis"].startswith("the dilated replays differ by more than")


def test_a_link_bound_step_keeps_its_undilated_figure_when_the_dilated_ones_are_within_spread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The 4-worker what-if at 1 Gbit/s (real training: 6.66 s): 6.80 s at K = 1, 7.04 at
    # K = 2 and 6.46 at K = 4, single replays, while other work kept the machine 95% busy
    # and the replay used 0.54 of 2 cores.  The S + c/K fit through K = 2 and 8 said
    # 6.08 s.  Here each replay has five runs, whose medians spread over 0.5 s.
    steps = {
        1.0: (6.55, 6.70, 6.80, 6.90, 7.05),
        2.0: (6.80, 6.95, 7.04, 7.15, 7.30),
        4.0: (6.20, 6.35, 6.46, 6.55, 6.70),
        8.0: (6.00, 6.05, 6.10, 6.15, 6.20),
    }
    outcome, replayed, lines = _automatic(
        monkeypatch, tmp_path, steps, cores=0.54, machine_share=0.95
    )
    assert replayed == [1.0, 2.0]
    assert outcome.predicted_step_s == pytest.approx(6.80)
    assert outcome.limit is None
    assert [(r.time_dilation, r.spread_s, r.busy) for r in outcome.replays] == [
        (1.0, pytest.approx(0.5), False),
        (2.0, pytest.approx(0.5), False),
    ]
    # The machine's load is in the evidence, not in the verdict.
    prediction = compare._prediction(outcome.document) or {}
    assert prediction["replay_bound"] is False
    assert "other processes kept the machine busy" in prediction["replay_bound_evidence"]
    assert lines[0].startswith(
        "1gbit: at time dilation 1 the replay predicted a 6.800 s step (its runs within "
        "0.500 s) and kept 0.54 of 2 cores busy"
    )
    assert lines[-1] == (
        "1gbit: the dilated replays are within the spread of the undilated one (6.800 s at 1 "
        "(runs within 0.500 s), 7.040 s at 2 (runs within 0.500 s)): the undilated 6.800 s "
        "is the prediction"
    )
    (written,) = compare.comparison_json([outcome])["profiles"]
    assert written["predicted_step_s"] == pytest.approx(6.80)
    assert [r["spread_s"] for r in written["replays"]] == [pytest.approx(0.5)] * 2
    assert "the undilated 6.800 s" in compare._dilation_line(outcome)


def test_a_replay_bound_by_its_own_cpu_is_still_dilated_and_its_limit_fitted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The replay's own processes kept 1.8 of 2 cores busy undilated; dilated, 0.5.  The
    # step falls as S + c/K with S = 5 s, c = 2 s, by more than its runs' 0.04 s spread at
    # every doubling: dilated to the cap, the limit fitted through the idle dilated replays.
    steps = {k: tuple(5.0 + 2.0 / k + d for d in (-0.02, 0.0, 0.02)) for k in (1.0, 2.0, 4.0)}
    steps |= {k: tuple(5.0 + 2.0 / k + d for d in (-0.02, 0.0, 0.02)) for k in (8.0, 16.0)}
    cores = {1.0: 1.8, 2.0: 0.5, 4.0: 0.5, 8.0: 0.5, 16.0: 0.5}
    outcome, replayed, _ = _automatic(monkeypatch, tmp_path, steps, cores=cores)
    assert replayed == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert outcome.replays[0].busy and not any(r.busy for r in outcome.replays[1:])
    assert outcome.limit is not None and [k for k, _ in outcome.limit.points] == [2, 4, 8, 16]
    assert outcome.predicted_step_s == pytest.approx(5.0)
    # Bound undilated, the undilated figure never stands, even within the spread of the rest.
    flat = {k: (3.0, 3.1) for k in (1.0, 2.0, 4.0)}
    outcome, replayed, _ = _automatic(monkeypatch, tmp_path, flat, cores={1.0: 1.8, 2.0: 0.5})
    assert replayed == [1.0, 2.0]
    assert outcome.decision is not None and outcome.decision.basis.startswith(
        "the replays their own processes did not bind agree"
    )


def test_the_dilation_decision_reads_spreads_and_verdicts() -> None:
    def replay(k: float, step: float, spread: float | None, busy: bool = False) -> DilatedReplay:
        return DilatedReplay(time_dilation=k, step_s=step, spread_s=spread, busy=busy)

    # The largest spread of the two decides; without any, 5% of the first step.
    assert within_spread([replay(1, 6.8, 0.1), replay(2, 7.04, 0.3)])
    assert not within_spread([replay(1, 6.8, 0.1), replay(2, 7.04, 0.2)])
    assert within_spread([replay(1, 10.0, None), replay(2, 10.5, None)])
    assert not within_spread([replay(1, 10.0, None), replay(2, 10.51, None)])
    # Runs that agree to the microsecond (a step of compute): at least 1% of the step.
    assert within_spread([replay(1, 0.0410, 0.00001), replay(2, 0.0414, 0.0)])
    assert not within_spread([replay(1, 0.0410, 0.00001), replay(2, 0.0415, 0.0)])
    # Settled: two replays, within spread, the last one idle.
    assert not settled([replay(1, 6.8, 0.5)])
    assert settled([replay(1, 6.8, 0.5), replay(2, 7.0, 0.5)])
    assert not settled([replay(1, 6.8, 0.5), replay(2, 7.0, 0.5, busy=True)])
    assert not settled([replay(1, 6.8, 0.1), replay(2, 7.0, 0.1)])
    # The prediction: undilated within spread; a fit only past the spread; else the last idle.
    kept = dilated_prediction([replay(1, 6.8, 0.5), replay(2, 7.04, 0.5), replay(4, 6.46, 0.5)])
    assert kept is not None and kept.step_s == 6.8 and kept.limit is None
    fitted = dilated_prediction(
        [replay(1, 9.0, 0.1, busy=True), replay(2, 6.0, 0.1), replay(4, 5.5, 0.1)]
    )
    assert fitted is not None and fitted.limit is not None and fitted.step_s == pytest.approx(5.0)
    agreed = dilated_prediction(
        [replay(1, 9.0, 0.1, busy=True), replay(2, 6.0, 0.6), replay(4, 5.5, 0.6)]
    )
    assert agreed is not None and agreed.limit is None and agreed.step_s == 5.5
    busy = dilated_prediction([replay(1, 9.0, None, busy=True), replay(2, 8.0, None, busy=True)])
    assert (
        busy is not None and busy.step_s == 8.0 and busy.basis.startswith("every replay was bound")
    )
    assert dilated_prediction([]) is None


def _paced_trace(steps: int) -> Trace:
    """One worker, one ps, one small call per step, steps ``PERIOD_NS`` apart: each
    replayed step lasts the recorded period (compute), whatever the call took."""
    trace = make_trace(steps=steps, workers=1, ps=1, sizes=(4096,))
    spaced = []
    for number, step in enumerate(trace.steps):
        shift = number * PERIOD_NS - (step.start_ns - trace.steps[0].start_ns)
        rpcs = tuple(
            dataclasses.replace(
                rpc,
                start_ns=rpc.start_ns + shift,
                response_start_ns=rpc.response_start_ns + shift,
                end_ns=rpc.end_ns + shift,
            )
            for rpc in step.rpcs
        )
        # The last step's period is its duration: a whole period too.
        last = number == len(trace.steps) - 1
        end_ns = step.start_ns + shift + PERIOD_NS if last else step.end_ns + shift
        spaced.append(
            dataclasses.replace(step, start_ns=step.start_ns + shift, end_ns=end_ns, rpcs=rpcs)
        )
    return dataclasses.replace(trace, steps=tuple(spaced))


def _replay(trace_path: Path, cwd: Path, *flags: str) -> results.ResultDocument:
    completed = subprocess.run(
        [
            COMMAND, "replay", str(trace_path), "--benchmark", "ps-throughput",
            "--warmup", "0", "--runs", "1", "--quiet", "--output-dir", "out", *flags,
        ],
        cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    line = next(s for s in completed.stdout.splitlines() if s.startswith("results: "))
    return read_document(cwd / line.removeprefix("results: ").strip())


def test_a_dilated_replay_stretches_the_compute_and_reports_training_time(
    tmp_path: Path,
) -> None:
    path = tmp_path / "paced.tfgbtrace"
    trace_files.write_trace(_paced_trace(steps=4), path)
    document = _replay(path, tmp_path, "--passes", "2", "--time-dilation", "4")
    (throughput,) = document.benchmarks
    assert throughput.parameters["time_dilation"] == 4.0
    assert throughput.parameters["compute_scale"] == 1.0
    steps = throughput.step_times_ns
    assert len(steps) == 2 * 4
    # The pacer never starts a step before its recorded period (times 4 in the run's
    # own time): divided by 4, no step is shorter than the period.  Undilated compute
    # would give a quarter of it.
    assert min(steps) >= PERIOD_NS - 1
    # Not divided, every step would be at least 4 periods: a 4096 B call on loopback
    # would have to take 1.5 periods of the run's time (240 ms) for the median to pass.
    assert statistics.median(steps) < 2 * PERIOD_NS
    assert throughput.rpc_count == 2 * 4
    assert document.network is not None and document.network.emulated_rate_bits_per_s == 0


def _refused(tmp_path: Path, message: str, command: list[str], flags: list[str]) -> None:
    """``tf-grpc-bench COMMAND <a paced trace> FLAGS`` exits 2 with one line holding ``message``."""
    path = tmp_path / "paced.tfgbtrace"
    trace_files.write_trace(_paced_trace(steps=2), path)
    completed = subprocess.run(
        [COMMAND, *command, str(path), *flags],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 2, completed.stderr
    assert message in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--time-dilation", "auto"], "--time-dilation 'auto': expected a factor such as 4"),
        (["--time-dilation", "0"], r"--time-dilation '0': must be in [1, 64]"),
        (["--pacing", "asap", "--time-dilation", "2"], "--time-dilation applies only to --pacing"),
    ],
)
def test_a_misused_time_dilation_is_one_line(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    _refused(tmp_path, message, ["replay"], ["--benchmark", "ps-throughput", *flags, "--quiet"])


@pytest.mark.netns
def test_compare_replays_a_dilated_link_shaped_that_much_slower(tmp_path: Path) -> None:
    path = tmp_path / "paced.tfgbtrace"
    trace_files.write_trace(_paced_trace(steps=4), path)
    completed, pid = run_with_pid(
        [
            COMMAND, "network", "compare", str(path), "--profiles", "200mbit,unlimited",
            "--benchmark", "ps-throughput", "--time-dilation", "2", "--passes", "2",
            "--warmup", "0", "--runs", "1", "--output-dir", str(tmp_path / "out"),
        ],
        timeout_s=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert namespaces_made_by(pid) == []
    assert "unlimited: no rate limit or delay to dilate; replaying undilated" in completed.stdout
    (compare_dir,) = (tmp_path / "out").glob("*-compare")
    (limited,) = (compare_dir / "200mbit").glob("*/results.json")
    document = read_document(limited)
    assert document.network is not None
    # Recorded as the link predicted; shaped at half its rate.
    assert document.network.emulated_rate_bits_per_s == 200_000_000
    assert "time dilation 2: replays a 200mbit link" in document.network.emulation
    assert json.loads(limited.read_text())["network"]["emulation"].startswith("tbf rate 100mbit")
    (throughput,) = document.benchmarks
    assert throughput.parameters["time_dilation"] == 2.0
    assert min(throughput.step_times_ns) >= PERIOD_NS - 1
    (unlimited,) = (compare_dir / "unlimited").glob("*/results.json")
    (plain,) = read_document(unlimited).benchmarks
    assert "time_dilation" not in plain.parameters
    text = (compare_dir / compare.COMPARISON_FILE).read_text()
    assert "- 200mbit: replayed 2 times slower, on a 100mbit link" in text
    assert "unlimited: replayed" not in text
    assert "time dilation (docs/fidelity.md):\n- 200mbit: replayed 2 times" in completed.stdout
    # The JSON beside it: a fixed dilation fits no limit, so the replay's step is the
    # prediction, as the results document has it.
    written = json.loads((compare_dir / compare.COMPARISON_JSON).read_text())
    shaped, unshaped = written["profiles"]
    assert (shaped["profile"], shaped["time_dilation"], shaped["limit"]) == ("200mbit", 2.0, None)
    assert shaped["results"] == str(limited)
    step_s = statistics.median(throughput.step_times_ns) / 1e9
    assert shaped["predicted_step_s"] == shaped["step_s"] == pytest.approx(step_s)
    assert (unshaped["profile"], unshaped["time_dilation"]) == ("unlimited", 1.0)


@pytest.mark.netns
def test_automatic_dilation_of_a_real_link_reports_each_replays_spread(tmp_path: Path) -> None:
    # A step of compute (40 ms) and one small call on a 200 Mbit/s link, three runs per
    # replay: whatever the machine does, every replay has a measured spread, and the
    # prediction says which replays it rests on.
    path = tmp_path / "paced.tfgbtrace"
    trace_files.write_trace(_paced_trace(steps=4), path)
    completed, pid = run_with_pid(
        [
            COMMAND, "network", "compare", str(path), "--profiles", "200mbit",
            "--benchmark", "ps-throughput", "--passes", "2", "--warmup", "0", "--runs", "3",
            "--output-dir", str(tmp_path / "out"),
        ],
        timeout_s=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert namespaces_made_by(pid) == []
    assert "200mbit: at time dilation 1 the replay predicted a " in completed.stdout
    assert "s step (its runs within " in completed.stdout
    (compare_dir,) = (tmp_path / "out").glob("*-compare")
    written = json.loads((compare_dir / compare.COMPARISON_JSON).read_text())
    assert written["format_version"] == 3
    (profile,) = written["profiles"]
    replays = profile["replays"]
    assert len(replays) >= 2 and replays[0]["time_dilation"] == 1.0
    for replay in replays:
        assert replay["spread_s"] >= 0 and isinstance(replay["busy"], bool)
        assert replay["step_s"] >= (PERIOD_NS - 1) / 1e9
    basis = profile["prediction_basis"]
    assert basis and basis in (compare_dir / compare.COMPARISON_FILE).read_text()
    if basis.startswith("the dilated replays are within the spread of the undilated one"):
        assert profile["predicted_step_s"] == replays[0]["step_s"]
    assert profile["predicted_step_s"] >= (PERIOD_NS - 1) / 1e9


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--time-dilation", "fast"], "--time-dilation 'fast': expected 'auto' or a factor"),
        # Every benchmark (the default) includes P2P ones, paced asap: not dilatable.
        (["--time-dilation", "2"], "--time-dilation applies only to --pacing dependencies"),
    ],
)
def test_compare_refuses_a_bad_dilation_before_making_anything(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    _refused(tmp_path, message, ["network", "compare"], ["--profiles", "1gbit", *flags])
    assert not list(tmp_path.glob("runs/*"))


class _StoppedOnce(subprocess.Popen[str]):
    """A child whose first wait is cut short by a SIGTERM to its parent (``compare``)."""

    interrupted = False

    def communicate(self, *args: object, **kwargs: object) -> tuple[str, str]:
        if not self.interrupted:
            self.interrupted = True
            raise lifetime.Interrupted(signal.SIGTERM)
        return super().communicate(*args, **kwargs)  # type: ignore[arg-type]


_DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "signal.signal(signal.SIGINT, signal.SIG_IGN); print('replaying', flush=True); time.sleep(120)"
)


def test_a_replay_that_does_not_stop_is_killed_and_said_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A replay given SIGTERM (compare stopped by its launcher, or its replay overdue) gets
    # the grace to write its partial results; past it, compare kills its process group
    # and says so in the profile's last stderr line instead of raising TimeoutExpired.
    monkeypatch.setattr(compare, "_INTERRUPT_GRACE_S", 0.5)
    deaf = _StoppedOnce(
        [sys.executable, "-c", _DEAF], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert deaf.stdout is not None and deaf.stdout.readline() == "replaying\n"  # deaf now
    _, stderr, interrupt = compare._finish(deaf, timeout_s=60)
    assert isinstance(interrupt, lifetime.Interrupted) and deaf.returncode == -signal.SIGKILL
    assert stderr.strip().splitlines()[-1] == (
        "replay did not stop within 0.5 s of SIGTERM: killed"
    )
    overdue = subprocess.Popen(
        [sys.executable, "-c", _DEAF], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert overdue.stdout is not None and overdue.stdout.readline() == "replaying\n"
    _, stderr, interrupt = compare._finish(overdue, timeout_s=2)
    assert interrupt is None and overdue.returncode == -signal.SIGKILL
    assert stderr.strip().splitlines()[-2:] == [
        "replay did not stop within 0.5 s of SIGTERM: killed",
        "replay did not finish within 2 s",
    ]
