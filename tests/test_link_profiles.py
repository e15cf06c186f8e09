"""Link profiles with delay, jitter and loss, and the plans of their networks (pure:
no root, nothing runs).  The networks themselves are in test_relay.py."""

from __future__ import annotations

import pytest

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns import links, topology


@pytest.mark.parametrize(
    ("text", "name", "rate", "delay", "jitter", "loss"),
    [
        ("1gbit", "1gbit", 10**9, 0, 0, 0.0),
        ("10gbit-crossrack", "10gbit-crossrack", 10**10, 50_000, 10_000, 0.0),
        ("10GBIT-CrossRack:loss=0.1%", "10gbit-crossrack:loss=0.1%", 10**10, 50_000, 10_000, 0.001),
        ("100mbit:delay=10ms", "100mbit:delay=10ms", 10**8, 10_000_000, 0, 0.0),
        ("unlimited:jitter=100us:delay=1.5ms", "unlimited:delay=1.5ms:jitter=100us", None,
         1_500_000, 100_000, 0.0),
        ("1gbit-wan:jitter=0ns", "1gbit-wan:jitter=0ns", 10**9, 25_000_000, 0, 0.0),
        ("2.5gbit:delay=800ns", "2.5gbit:delay=800ns", 25 * 10**8, 800, 0, 0.0),
        ("10gbit-crossrack:delay=50us", "10gbit-crossrack", 10**10, 50_000, 10_000, 0.0),
    ],
)  # fmt: skip
def test_a_profile_string_gives_rate_delay_jitter_loss_and_a_canonical_name(
    text: str, name: str, rate: int | None, delay: int, jitter: int, loss: float
) -> None:
    profile = links.parse_profile(text)
    assert (profile.name, profile.rate_bits_per_s) == (name, rate)
    assert (profile.delay_ns, profile.jitter_ns, profile.loss) == (delay, jitter, loss)
    assert links.parse_profile(profile.name) == profile


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1gbit:delay=fast", r"^delay 'fast': expected a duration such as 50us, 1.5ms or 20ms$"),
        ("1gbit:loss=2", r"^loss '2': expected a percentage in \[0%, 100%\), such as 0.1%$"),
        ("1gbit:loss=100%", r"^loss '100%': expected a percentage"),
        ("1gbit:delay=11s", r"^delay 11s: at most 10s$"),
        ("1gbit:jitter=10us", r"jitter 10us must be in \[0, the delay 0ns\]"),
        ("10gbit:delay=5us:jitter=10us", r"jitter 10us must be in \[0, the delay 5us\]"),
        ("1gbit:color=red", r"^network profile modifier 'color': expected delay=, jitter=, loss=$"),
        ("1gbit:delay", r"^network profile '1gbit:delay': 'delay' is not KEY=VALUE$"),
    ],
)
def test_a_bad_profile_string_is_refused_naming_the_part(text: str, message: str) -> None:
    with pytest.raises(NetworkError, match=message):
        links.parse_profile(text)


def test_flags_override_a_profile_and_rename_it() -> None:
    crossrack = links.PROFILES["10gbit-crossrack"]
    assert links.with_timing(crossrack, loss=0.001).name == "10gbit-crossrack:loss=0.1%"
    assert links.with_timing(crossrack).name == "10gbit-crossrack"
    changed = links.with_timing(links.PROFILES["1gbit"], delay_ns=2_000_000, jitter_ns=10_000)
    assert changed.name == "1gbit:delay=2ms:jitter=10us"
    with pytest.raises(NetworkError, match="jitter 1ms must be in"):
        links.with_timing(links.PROFILES["1gbit"], jitter_ns=1_000_000)


def test_durations_and_losses_read_back_as_written() -> None:
    for ns in (0, 1, 999, 1_000, 1_500, 50_000, 1_000_000, 25_000_000, 10**9):
        assert links.parse_duration(links.format_duration(ns)) == ns
    assert links.parse_loss(links.format_loss(0.001)) == 0.001
    assert links.PROFILES["10gbit-crossrack"].describe() == "10gbit, 50us +- 10us one way"
    assert links.parse_profile("unlimited:loss=1%").describe() == "no rate limit, 1% loss"


def test_dilation_slows_the_rate_and_stretches_the_delay() -> None:
    dilated = links.PROFILES["10gbit-crossrack"].dilated(4)
    assert dilated.rate_bits_per_s == 2_500_000_000
    assert (dilated.delay_ns, dilated.jitter_ns, dilated.loss) == (200_000, 40_000, 0.0)
    assert dilated.name == "10gbit-crossrack"
    assert links.PROFILES["unlimited"].dilated(2).rate_bits_per_s is None


def test_every_named_profile_is_consistent() -> None:
    for name, profile in links.PROFILES.items():
        assert profile.name == name and links.parse_profile(name) == profile
        assert profile.delayed == (profile.delay_ns > 0)
    assert not any("rdma" in name for name in links.PROFILES)
    assert links.PROFILES["ipoib-edr"].note and links.PROFILES["40gbit-ethernet"].note


def test_the_loss_filter_is_classic_bpf_on_a_random_number() -> None:
    # ld proto; jeq #ETH_P_ARP keep; ld rand; jge #threshold keep; ret TC_ACT_SHOT;
    # keep: ret TC_ACT_OK
    assert links.loss_filter_bytecode(0.2) == (
        "6,32 0 0 4294963200,21 3 0 2054,32 0 0 4294963256,53 1 0 858993459,6 0 0 2,6 0 0 0"
    )
    assert links.loss_filter_bytecode(0.5).split(",")[4] == "53 1 0 2147483648"
    assert links.loss_filter_bytecode(1 - 1e-12).split(",")[4] == "53 1 0 4294967295"
    with pytest.raises(ValueError):
        links.loss_filter_bytecode(0)


def plan(profile: str, hosts: int = 2) -> topology.NetworkPlan:
    return topology.plan_network(
        hosts=hosts, profile=links.parse_profile(profile), run_id="12-ab", hz=250
    )


def test_a_delayed_point_to_point_link_is_one_relay_in_place_of_the_veth() -> None:
    delayed = plan("200mbit:delay=10ms:jitter=1ms")
    (relay,) = delayed.relays
    assert relay == topology.RelayPlan(
        link="h0-h1",
        side_a=("tfgb-12-ab-h0", "eth0"),
        side_b=("tfgb-12-ab-h1", "eth0"),
        a_to_b=(10_000_000, 1_000_000),
        b_to_a=(10_000_000, 1_000_000),
        queue_bytes=8 << 20,
        offload=True,
    )
    assert not any("veth" in command for command in delayed.setup_commands)
    # The relay comes after the namespaces and before the commands that configure its taps.
    index = delayed.steps.index(relay)
    assert delayed.steps[:index] == (
        ("ip", "netns", "add", "tfgb-12-ab-h0"),
        ("ip", "netns", "add", "tfgb-12-ab-h1"),
    )
    # Everything else is what a veth link of the same rate gets.
    undelayed = plan("200mbit")
    assert delayed.setup_commands[2:] == undelayed.setup_commands[3:]
    assert delayed.token_bucket == undelayed.token_bucket


def test_a_delayed_switch_delays_each_host_to_switch_path_once() -> None:
    switched = plan("1gbit:delay=1ms", hosts=3)
    assert [(r.link, r.side_a, r.side_b, r.a_to_b, r.b_to_a) for r in switched.relays] == [
        (f"h{i}-sw", (f"tfgb-12-ab-h{i}", "eth0"), ("tfgb-12-ab-sw", f"p{i}"), (1_000_000, 0),
         (0, 0))
        for i in range(3)
    ]  # fmt: skip
    steps = list(switched.steps)
    for relay in switched.relays:
        port = relay.side_b[1]
        master = ("ip", "-n", "tfgb-12-ab-sw", "link", "set", port, "master", "br0")
        assert steps.index(master) == steps.index(relay) + 1


def test_a_lossy_link_drops_at_each_receiver_and_sends_wire_sized_packets() -> None:
    lossy = plan("1gbit:loss=1%")
    bytecode = links.loss_filter_bytecode(0.01)
    for namespace in ("tfgb-12-ab-h0", "tfgb-12-ab-h1"):
        assert ("tc", "-n", namespace, "qdisc", "add", "dev", "eth0", "clsact") in lossy.steps
        assert (
            "tc", "-n", namespace, "filter", "add", "dev", "eth0", "ingress", "bpf", "da",
            "bytecode", bytecode,
        ) in lossy.steps  # fmt: skip
        assert (
            "ip", "-n", namespace, "link", "set", "dev", "eth0", "gso_max_segs", "1"
        ) in lossy.steps  # fmt: skip
    assert not lossy.relays, "loss alone needs no relay"
    switched = plan("1gbit:delay=1ms:loss=1%", hosts=3)
    filtered = [s[2:6] for s in switched.setup_commands if "filter" in s]
    assert filtered == [("tfgb-12-ab-sw", "filter", "add", "dev")] * 3
    assert all(not r.offload for r in switched.relays)


def test_the_relay_command_line_names_both_ends_and_each_direction() -> None:
    (relay,) = plan("1gbit:delay=50us:jitter=10us:loss=1%").relays
    assert relay.argv("/cache/relay", stats_path="/run/x.relay", spin_ns=7, priority=1) == [
        "/cache/relay", "run",
        "--a", "/run/netns/tfgb-12-ab-h0:eth0", "--b", "/run/netns/tfgb-12-ab-h1:eth0",
        "--ab", "50000:10000", "--ba", "50000:10000",
        "--queue-bytes", str(8 << 20), "--seed", "0", "--spin-ns", "7", "--priority", "1",
        "--stats", "/run/x.relay", "--no-offload",
    ]  # fmt: skip


def test_a_relay_queue_holds_twice_what_is_in_flight_within_bounds() -> None:
    assert topology.relay_queue_bytes(links.parse_profile("1gbit:delay=1ms")) == 8 << 20
    long_fat = links.parse_profile("10gbit:delay=50ms:jitter=10ms")
    assert topology.relay_queue_bytes(long_fat) == 2 * 10**10 // 8 * 60 // 1000
    assert topology.relay_queue_bytes(links.parse_profile("unlimited:delay=10s")) == 1 << 30


def test_a_result_records_the_link_and_its_relays_and_older_ones_read_without() -> None:
    from pathlib import Path

    from tf_grpc_bench.replay.output.document import FORMAT_VERSION
    from tf_grpc_bench.replay.output.document_reader import read_document
    from tf_grpc_bench.replay.output.document_writer import dumps_document

    from .result_factory import golden_document

    data = Path(__file__).parent / "data"
    newest = data / f"results-v{FORMAT_VERSION}.json"
    current = read_document(newest)
    assert current == golden_document()
    network = current.network
    assert network is not None
    assert (network.emulated_delay_ns, network.emulated_jitter_ns) == (50_000, 10_000)
    assert network.emulated_loss == 0.001
    (relay,) = network.relays
    assert relay.late_histogram[-1] == (40960, 2)
    assert network.relay_behind == (
        "tfgb-12-ab-h1:eth0 -> tfgb-12-ab-h0:eth0: 99% of releases within 31 us of their "
        "time, not 20 us"
    )
    assert dumps_document(current) == newest.read_text()
    # Format 6 added the link's delay, jitter, loss and relays; 7 the trace's partial reason.
    assert read_document(data / "results-v7.json").network == network
    assert read_document(data / "results-v6.json").network == network
    older = read_document(data / "results-v5.json").network
    assert older is not None and older.name == "loopback"
    assert (older.emulated_delay_ns, older.emulated_loss, older.relays) == (0, 0.0, ())


def test_a_dilated_replay_records_the_link_it_predicts() -> None:
    from tf_grpc_bench.replay.network.netinfo import undilated
    from tf_grpc_bench.replay.output.machine import NetworkInfo

    shaped = NetworkInfo(
        name="10gbit-crossrack",
        emulated_rate_bits_per_s=2_500_000_000,
        emulated_delay_ns=200_000,
        emulated_jitter_ns=40_000,
        emulation="tbf rate 2.5gbit",
    )
    predicted = undilated(shaped, 4)
    assert predicted.emulated_rate_bits_per_s == 10**10
    assert (predicted.emulated_delay_ns, predicted.emulated_jitter_ns) == (50_000, 10_000)
    assert predicted.emulation.endswith("time dilation 4: replays a 10gbit, 50us one way link")
    delay_only = NetworkInfo(name="x", emulated_delay_ns=400_000)
    assert undilated(delay_only, 2).emulated_delay_ns == 200_000


def test_rates_read_in_the_largest_unit_they_fill_from_bits_to_gigabits() -> None:
    shown = [
        links.format_tc_rate(rate)
        for rate in (10**9, 2_500_000_000, 10**6, 999_999, 5 * 10**6, 10**3, 1500, 999)
    ]
    assert shown == ["1gbit", "2.5gbit", "1mbit", "999.999kbit", "5mbit", "1kbit", "1.5kbit",
                     "999bit"]  # fmt: skip


def test_a_named_profile_is_built_from_its_rate_delay_jitter_and_note() -> None:
    built = links._timing_profile("wan", 1.5, "2ms", "100us", note="measured")
    assert built == links.LinkProfile(
        name="wan", rate_bits_per_s=1_500_000_000, delay_ns=2_000_000, jitter_ns=100_000,
        note="measured",
    )  # fmt: skip
    plain = links._timing_profile("lan", 0.1, "50us")
    assert (plain.rate_bits_per_s, plain.jitter_ns, plain.note) == (100_000_000, 0, "")


def test_every_bound_of_a_link_and_its_bucket_holds_at_its_edge() -> None:
    assert links.parse_loss("0%") == 0.0
    for refused in ("100%", "-1%", "x"):
        with pytest.raises(NetworkError, match=r"expected a percentage in \[0%, 100%\)"):
            links.parse_loss(refused)
    assert links.loss_filter_bytecode(0.5).startswith("6,")
    for bad_loss in (0.0, 1.0):
        with pytest.raises(ValueError, match=rf"^loss must be in \(0, 1\), got {bad_loss}$"):
            links.loss_filter_bytecode(bad_loss)
    with pytest.raises(ValueError, match=r"^profile x: loss must be in \[0%, 100%\)$"):
        links.LinkProfile(name="x", rate_bits_per_s=None, loss=1.0)
    with pytest.raises(ValueError, match=r"^profile x: rate must be > 0 bit/s$"):
        links.LinkProfile(name="x", rate_bits_per_s=0)
    with pytest.raises(ValueError, match=r"^profile name must not be empty$"):
        links.LinkProfile(name="", rate_bits_per_s=None)
    slow = links.LinkProfile(name="x", rate_bits_per_s=1, delay_ns=10)
    assert slow.dilated(1) == slow
    assert slow.dilated(2).rate_bits_per_s == 1  # never below one bit per second
    with pytest.raises(ValueError, match=r"^dilation must be > 0, got 0$"):
        slow.dilated(0)
    assert slow.describe() == "1bit, 10ns one way"
    assert links.TokenBucket(rate_bits_per_s=1, burst_bytes=1, latency_us=1).burst_bytes == 1
    for zero in ({"rate_bits_per_s": 0}, {"burst_bytes": 0}, {"latency_us": 0}):
        settings = {"rate_bits_per_s": 8, "burst_bytes": 8, "latency_us": 8, **zero}
        with pytest.raises(ValueError, match=r"^tbf rate, burst and latency must all be > 0$"):
            links.TokenBucket(**settings)
    assert links.token_bucket_for(8_000, hz=1).rate_bits_per_s == 8_000


def test_timing_put_on_a_profile_already_timed_is_named_from_its_base() -> None:
    delayed = links.with_timing(links.PROFILES["1gbit"], delay_ns=1_000_000)
    assert delayed.name == "1gbit:delay=1ms"
    both = links.with_timing(delayed, jitter_ns=100_000)
    assert both.name == "1gbit:delay=1ms:jitter=100us"
    assert links.with_timing(both, delay_ns=0, jitter_ns=0).name == "1gbit"
