"""The arithmetic of the relay's compensation (pure; netns/calibration.py)."""

from __future__ import annotations

import pytest

from tf_grpc_bench.netns import calibration, links


def test_the_compensation_is_half_what_the_relays_add_beyond_the_delay() -> None:
    # A quiet machine's figures: 195.5 us through a relay with a 1 ns delay, 10.6 us
    # over veth.
    assert calibration.compensation_ns(195_502, 10_600, 1) == 92_450
    assert calibration.compensation_ns(2_195_500, 10_600, 1_000_000) == 92_450
    assert calibration.compensation_ns(410_601, 10_600, 200_000) == 0  # half a ns: to even
    assert calibration.compensation_ns(410_603, 10_600, 200_000) == 2
    # Relays never measured faster than veth and the delay: nothing to take off.
    assert calibration.compensation_ns(409_000, 10_600, 200_000) == 0
    measured = calibration.Calibration(
        delay_ns=1_000_000, relay_round_trip_ns=2_195_500, veth_round_trip_ns=10_600, pings=200
    )
    assert measured.compensation_ns == 92_450


def test_a_long_delay_is_calibrated_with_fewer_pings_but_never_too_few() -> None:
    assert calibration.calibration_pings(0) == calibration.CALIBRATION_PINGS
    assert calibration.calibration_pings(200_000) == calibration.CALIBRATION_PINGS
    assert calibration.calibration_pings(10_000_000) == 50  # 1 s of 20 ms round trips
    assert calibration.calibration_pings(50_000_000) == calibration.MIN_PINGS
    assert calibration.calibration_pings(links.MAX_DELAY_NS) == calibration.MIN_PINGS


@pytest.mark.parametrize(
    ("delay", "draw", "cost", "offset"),
    [
        (200_000, 0, 92_000, 108_000),
        (200_000, 50_000, 92_000, 158_000),
        (200_000, -150_000, 92_000, 0),  # floor: never before the packet arrived
        (50_000, 0, 92_000, 0),
        (1_000_000, 0, 0, 1_000_000),
    ],
)
def test_a_release_is_the_delay_and_draw_less_the_cost_never_negative(
    delay: int, draw: int, cost: int, offset: int
) -> None:
    assert calibration.release_offset_ns(delay, draw, cost) == offset


def test_a_delay_below_the_relays_cost_is_reported_not_attainable() -> None:
    assert calibration.unattainable(100_000, 92_000) == ""
    assert calibration.unattainable(92_000, 92_000) == ""
    assert calibration.unattainable(0, 92_000) == ""  # no delay asked: no relay either
    assert calibration.unattainable(50_000, 92_000) == (
        "a one-way delay of 50us is not attainable: the relay itself takes 92us; "
        "packets leave as they arrive"
    )


def test_under_time_dilation_the_cost_comes_off_the_dilated_delay() -> None:
    profile = links.parse_profile("10gbit:delay=50us")
    dilated = profile.dilated(4)
    # 50 us cannot be had over a relay that costs 92 us; 200 us (dilated by 4) can,
    # and the relay takes its real-time cost off the dilated delay.
    assert calibration.unattainable(profile.delay_ns, 92_000)
    assert not calibration.unattainable(dilated.delay_ns, 92_000)
    assert calibration.release_offset_ns(dilated.delay_ns, 0, 92_000) == 108_000
