"""bench/link_phases.py's reading of interface counters and its phases (loaded from its
file with bench/ on the path, as the script runs)."""

from __future__ import annotations

import pytest

from .conftest import load_bench_script

link_phases = load_bench_script("link_phases.py", "bench_link_phases")

NET_DEV = """\
Inter-|   Receive                        |  Transmit
 face |bytes    packets errs drop ...    |bytes    packets errs drop ...
    lo: 999999 10 0 0 0 0 0 0 999999 10 0 0 0 0 0 0
  eth0: 1108000180 700000 0 0 0 0 0 0 2200000 30000 0 0 0 0 0 0
"""


def test_counters_leave_loopback_out() -> None:
    assert link_phases.parse_net_dev(NET_DEV) == (1_108_000_180, 2_200_000)


def test_phases_split_at_pauses_and_leave_control_traffic_out() -> None:
    points = [
        (0.00, 0),
        (0.01, 0),
        (0.02, 2_000_000),  # a phase: 0.01 s to 0.05 s, 4 MB
        (0.05, 4_000_000),
        (0.06, 4_000_000),
        (0.07, 4_000_000),
        (0.09, 4_000_000),  # 40 ms without a byte: the phase ended at 0.05
        (0.10, 4_000_500),  # control traffic: 500 B, left out
        (0.20, 4_000_500),
        (0.21, 5_500_000),  # a phase still open when the samples end
        (0.22, 7_000_000),
    ]
    found = link_phases.phases(points, pause_s=0.03)
    assert [(p.start_s, p.end_s, p.bytes) for p in found] == [
        (0.01, 0.05, 4_000_000),
        (0.20, 0.22, 2_999_500),
    ]


def test_a_counter_that_goes_down_starts_afresh() -> None:
    points = [(0.0, 5_000_000), (0.01, 9_000_000), (0.02, 0), (0.03, 2_000_000), (0.04, 2_000_000)]
    found = link_phases.phases(points, pause_s=1.0)
    assert [(p.start_s, p.end_s, p.bytes) for p in found] == [(0.02, 0.03, 2_000_000)]


def test_the_report_gives_rates_against_the_link_and_the_idle_time_after_a_phase() -> None:
    samples = [
        link_phases.Sample(0.0, 0, 0),
        link_phases.Sample(1.0, 0, 0),
        link_phases.Sample(2.0, 0, 125_000_000),  # sent: 125 MB in 1 s, 1000 Mbit/s
        link_phases.Sample(3.0, 0, 125_000_000),
        link_phases.Sample(3.5, 50_000_000, 125_000_000),  # received from 3.0 s
        link_phases.Sample(4.0, 50_000_000, 125_000_000),
    ]
    lines = link_phases.report(samples, rate_bits=1.25e9, pause_s=0.4)
    (sent,) = [line for line in lines if "125.0 MB" in line]
    assert "1000 Mbit/s" in sent and "80.0% of the rate" in sent
    assert "wire time at the rate   0.800 s" in sent
    assert "idle before the next phase   1.000 s" in sent
    assert link_phases.report(samples[:1], 1e9, 0.03) == [
        "no emulated host 0 was seen: nothing sampled"
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--rate", "5gbit"], "a command to run is expected after --"),
        (["--rate", "fast", "--", "true"], "--rate: unknown network profile 'fast'"),
        (["--rate", "unlimited", "--", "true"], "--rate: a limited rate is expected"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        link_phases.main(arguments)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
