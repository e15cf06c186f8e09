"""Emulated networks as plain data: profiles, token buckets and the plan of ``ip``/``tc``
commands, none of which needs root (the namespaces themselves are in test_netns.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns import links, state, topology
from tf_grpc_bench.replay.network import netinfo

from .conftest import environment_without_coverage


def test_non_root_gets_a_one_line_network_error() -> None:
    drop = "os.setuid(65534)  # nobody" if os.geteuid() == 0 else ""
    script = textwrap.dedent(
        f"""
        import os
        from tf_grpc_bench.errors import NetworkError
        from tf_grpc_bench.netns import emulated, links, topology
        {drop}
        try:
            emulated.EmulatedNetwork(hosts=2).up()
        except NetworkError as error:
            print(error)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=environment_without_coverage(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "emulated networks need root (network namespaces, veth, tc); run as root, or replay "
        "between real hosts with --target\n"
    )


@pytest.mark.parametrize("hosts", [2, 3, 5])
def test_plan_shapes_every_link_on_both_ends(hosts: int) -> None:
    plan = topology.plan_network(
        hosts=hosts, profile=links.parse_profile("10gbit"), run_id="12-ab", hz=250
    )
    shaping = [c for c in plan.setup_commands if c[0] == "tc"]
    shaped_links = 1 if hosts == 2 else hosts
    assert len(shaping) == 2 * shaped_links
    assert len({h.address for h in plan.hosts}) == hosts
    assert all(n.startswith(topology.PREFIX) for n in plan.namespaces)
    assert bool(plan.switch_namespace) == (hosts > 2)


def test_a_point_to_point_plan_is_exactly_these_commands() -> None:
    plan = topology.plan_network(
        hosts=2, profile=links.parse_profile("1gbit"), run_id="12-ab", hz=250
    )
    h0, h1 = "tfgb-12-ab-h0", "tfgb-12-ab-h1"
    tbf = ("tbf", "rate", "1000000000bit", "burst", "500000", "latency", "20000us")
    assert plan.namespaces == (h0, h1)
    assert plan.switch_namespace == ""
    assert [(h.index, h.namespace, h.interface, h.cidr) for h in plan.hosts] == [
        (0, h0, "eth0", "10.233.0.1/24"),
        (1, h1, "eth0", "10.233.0.2/24"),
    ]
    assert plan.setup_commands == (
        ("ip", "netns", "add", h0),
        ("ip", "netns", "add", h1),
        (
            "ip",
            "link",
            "add",
            "eth0",
            "netns",
            h0,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            h1,
        ),
        ("ip", "-n", h0, "link", "set", "lo", "up"),
        ("ip", "-n", h0, "addr", "add", "10.233.0.1/24", "dev", "eth0"),
        ("ip", "-n", h0, "link", "set", "eth0", "up"),
        ("ip", "-n", h1, "link", "set", "lo", "up"),
        ("ip", "-n", h1, "addr", "add", "10.233.0.2/24", "dev", "eth0"),
        ("ip", "-n", h1, "link", "set", "eth0", "up"),
        ("tc", "-n", h0, "qdisc", "add", "dev", "eth0", "root", *tbf),
        ("tc", "-n", h1, "qdisc", "add", "dev", "eth0", "root", *tbf),
    )


def test_three_hosts_meet_on_a_bridge_in_a_switch_namespace() -> None:
    plan = topology.plan_network(
        hosts=3, profile=links.PROFILES["unlimited"], run_id="7-f", subnet="192.168.5.0/29"
    )
    sw = "tfgb-7-f-sw"
    assert plan.switch_namespace == sw
    assert plan.namespaces == ("tfgb-7-f-h0", "tfgb-7-f-h1", "tfgb-7-f-h2", sw)
    assert [h.cidr for h in plan.hosts] == ["192.168.5.1/29", "192.168.5.2/29", "192.168.5.3/29"]
    assert plan.token_bucket is None
    commands = plan.setup_commands
    assert commands[:7] == (
        ("ip", "netns", "add", "tfgb-7-f-h0"),
        ("ip", "netns", "add", "tfgb-7-f-h1"),
        ("ip", "netns", "add", "tfgb-7-f-h2"),
        ("ip", "netns", "add", sw),
        ("ip", "-n", sw, "link", "add", "br0", "type", "bridge"),
        ("ip", "-n", sw, "link", "set", "lo", "up"),
        ("ip", "-n", sw, "link", "set", "br0", "up"),
    )
    assert ("ip", "-n", sw, "link", "set", "p2", "master", "br0") in commands
    assert ("ip", "-n", sw, "link", "set", "p2", "up") in commands
    assert not [c for c in commands if c[0] == "tc"]


def test_token_bucket_holds_one_tick_of_the_rate_and_at_least_two_gso_packets() -> None:
    assert links.token_bucket_for(10 * 10**9, hz=250).burst_bytes == 5_000_000
    assert links.token_bucket_for(10**9, hz=100).burst_bytes == 1_250_000
    assert links.MIN_BURST_BYTES == 131_072
    assert links.token_bucket_for(10**6, hz=1000).burst_bytes == 131_072
    # The edge: one tick of 131,072 B is the minimum itself; one byte more is the tick.
    assert links.token_bucket_for(131_072 * 8 * 250, hz=250).burst_bytes == 131_072
    assert links.token_bucket_for(131_073 * 8 * 250, hz=250).burst_bytes == 131_073
    # A rate that does not divide evenly rounds the tick up.
    assert links.token_bucket_for(8 * 1_000_001 * 100 + 8, hz=100).burst_bytes == 1_000_002
    bucket = links.token_bucket_for(10**9, hz=250, latency_us=5000)
    assert bucket.tc_arguments() == [
        "tbf",
        "rate",
        "1000000000bit",
        "burst",
        "500000",
        "latency",
        "5000us",
    ]
    with pytest.raises(ValueError, match=r"^hz must be > 0, got 0$"):
        links.token_bucket_for(10**9, hz=0)
    with pytest.raises(ValueError, match=r"^tbf rate, burst and latency must all be > 0$"):
        links.TokenBucket(rate_bits_per_s=1, burst_bytes=1, latency_us=0)


def test_unknown_profile_error_lists_the_named_profiles() -> None:
    with pytest.raises(
        NetworkError,
        match=r"^unknown network profile 'fast': expected one of 1gbit, 10gbit, 25gbit, "
        r"40gbit, unlimited, 10gbit-samerack, .*, ipoib-edr, or a rate such as 100mbit, "
        r"optionally followed by :delay=50us:jitter=10us:loss=0.1%$",
    ):
        links.parse_profile("fast")


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("1gbit", 10**9),
        (" 10GBIT ", 10 * 10**9),
        ("100mbit", 100 * 10**6),
        ("2.5gbit", 2_500_000_000),
        ("64kbit", 64_000),
        ("1bit", 1),
        ("unlimited", None),
    ],
)
def test_profiles_are_names_or_rates_in_tc_units(text: str, rate: int | None) -> None:
    assert links.parse_profile(text).rate_bits_per_s == rate


@pytest.mark.parametrize("text", ["0mbit", "0bit", "1tbit", "-1gbit", "1 gbit", "gbit", ""])
def test_rates_that_are_not_positive_tc_rates_are_refused(text: str) -> None:
    with pytest.raises(NetworkError, match=rf"^unknown network profile {text!r}"):
        links.parse_profile(text)


def test_profiles_parse_names_and_rates() -> None:
    profiles = links.parse_profiles("1gbit, 2.5gbit,unlimited")
    assert [p.rate_bits_per_s for p in profiles] == [10**9, 2_500_000_000, None]
    assert [p.name for p in profiles] == ["1gbit", "2.5gbit", "unlimited"]
    with pytest.raises(NetworkError, match=r"^network profile listed twice: 1gbit$"):
        links.parse_profiles("1gbit,1gbit")
    with pytest.raises(NetworkError, match=r"^no network profile given"):
        links.parse_profiles(" , ")


def test_bad_host_count_and_subnet_are_refused() -> None:
    with pytest.raises(NetworkError, match=r"^--hosts must be >= 2, got 1$"):
        topology.plan_network(hosts=1, profile=links.PROFILES["1gbit"], run_id="1-a")
    with pytest.raises(NetworkError, match=r"^--subnet 10.0.0.1/33: "):
        topology.plan_network(
            hosts=2, profile=links.PROFILES["1gbit"], run_id="1-a", subnet="10.0.0.1/33"
        )
    with pytest.raises(NetworkError, match=r"^--subnet 10.0.0.0/30 has room for 2 hosts, not 3$"):
        topology.plan_network(
            hosts=3, profile=links.PROFILES["1gbit"], run_id="1-a", subnet="10.0.0.0/30"
        )
    with pytest.raises(NetworkError, match=r"^--hosts 201: at most 200 emulated hosts$"):
        topology.plan_network(
            hosts=201, profile=links.PROFILES["1gbit"], run_id="1-a", subnet="10.0.0.0/16"
        )
    with pytest.raises(NetworkError, match=r"^run id 'x-1': expected <pid>-<hex>$"):
        topology.plan_network(hosts=2, profile=links.PROFILES["1gbit"], run_id="x-1")
    # The edges: exactly as many hosts as the subnet holds, and 200 hosts.
    assert (
        len(
            topology.plan_network(
                hosts=2, profile=links.PROFILES["1gbit"], run_id="1-a", subnet="10.0.0.0/30"
            ).hosts
        )
        == 2
    )
    assert (
        len(
            topology.plan_network(
                hosts=200, profile=links.PROFILES["1gbit"], run_id="1-a", subnet="10.0.0.0/16"
            ).hosts
        )
        == 200
    )


def test_namespace_names_carry_the_run_and_the_role() -> None:
    assert topology.namespace_name("123-beef", "h4") == "tfgb-123-beef-h4"
    pid, _, token = topology.new_run_id().partition("-")
    assert pid == str(os.getpid())
    assert len(token) == 4 and int(token, 16) >= 0


def test_loopback_targets_are_described_as_loopback() -> None:
    info = netinfo.describe_network(["127.0.0.1:1", "localhost:2"], name="")
    assert info.name == "loopback"
    assert [i.name for i in info.interfaces] == ["lo"]
    assert info.emulated_rate_bits_per_s == 0
    assert netinfo.describe_network(["127.0.0.1:1"], name="my-lab").name == "my-lab"


def test_a_link_record_says_whether_its_network_was_left_up(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(state, "STATE_DIRECTORY", tmp_path)
    plan = topology.plan_network(hosts=2, profile=links.parse_profile("1gbit"), run_id="4242-ab12")
    h0, h1 = (host.namespace for host in plan.hosts)
    state.write_records(plan, [])
    assert state.read_record(h0) == state.HostRecord(
        namespace=h0, profile=links.parse_profile("1gbit"), kept_up=False
    )
    state.write_records(plan, [], kept_up=True)
    assert [state.read_record(n).kept_up for n in (h0, h1)] == [True, True]  # type: ignore[union-attr]
    # A record from before the field reads as a network that was not left up.
    document = json.loads(state.record_path(h1).read_text())
    del document["kept_up"]
    state.record_path(h1).write_text(json.dumps(document))
    assert state.read_record(h1).kept_up is False  # type: ignore[union-attr]
    document["kept_up"] = "yes"
    state.record_path(h1).write_text(json.dumps(document))
    with pytest.raises(NetworkError, match=r"\.link\.json: bad link record \(kept_up 'yes'"):
        state.read_record(h1)
