"""``tf-grpc-bench network``, run as a user runs it.

The commands that make namespaces are marked ``netns`` (they need root and skip without
it); listing the profiles and refusing bad input need neither."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator

from tf_grpc_bench import trace_files
from tf_grpc_bench.netns import links, namespaces, topology
from tf_grpc_bench.replay.output.document_reader import read_document

from .conftest import (
    environment_without_coverage,
    make_whole_step_trace,
    namespaces_made_by,
    run_with_pid,
)


def tool(*arguments: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", *arguments],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def tool_with_pid(
    *arguments: str, timeout_s: float = 120
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``tool`` and the pid it ran as, whose namespaces are ``namespaces_made_by(pid)``."""
    return run_with_pid([sys.executable, "-m", "tf_grpc_bench", *arguments], timeout_s=timeout_s)


@contextlib.contextmanager
def network_up(*flags: str) -> Iterator[tuple[str, str]]:
    """``network up FLAGS``: its run id and output; its namespaces removed afterwards,
    whatever the test left."""
    up = tool("network", "up", *flags)
    assert up.returncode == 0, up.stderr
    match = re.search(r"^run ([0-9]+-[0-9a-f]+):", up.stdout, re.MULTILINE)
    assert match, up.stdout
    run_id = match.group(1)
    try:
        yield run_id, up.stdout
    finally:
        for name in namespaces.run_namespaces(run_id):
            namespaces.delete_namespace(name)


def test_profiles_lists_every_named_profile_with_its_burst_delay_jitter_and_loss() -> None:
    result = tool("network", "profiles")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = re.fullmatch(
        r"named link profiles \(tbf rate on both ends of each link, kernel HZ ([0-9]+); delay "
        r"and jitter one way, by a relay; loss at each receiver\):",
        lines[0],
    )
    assert header, lines[0]
    hz = int(header.group(1))
    assert lines[1].split() == [
        "profile",
        "rate",
        "tbf",
        "burst",
        "delay",
        "jitter",
        "loss",
        "stands",
        "for",
    ]
    rows = {line.split()[0]: line.split() for line in lines[2:-1]}
    assert list(rows) == list(links.PROFILES)
    # tc-tbf(8): the bucket holds one tick of the rate, and never less than two 64 KiB packets.
    for name, gbit in [("1gbit", 1), ("10gbit", 10), ("25gbit", 25), ("40gbit", 40)]:
        burst = max(-(-gbit * 10**9 // (8 * hz)), 131_072)
        assert rows[name] == [name, name, str(burst), "B", "-", "-", "-"]
    assert rows["unlimited"] == ["unlimited", "unlimited", "-", "-", "-", "-"]
    assert rows["10gbit-crossrack"][:7] == [
        "10gbit-crossrack",
        "10gbit",
        "5000000",
        "B",
        "50us",
        "10us",
        "-",
    ]
    assert rows["1gbit-wan"][4:7] == ["25ms", "500us", "-"]
    assert "IPoIB" in " ".join(rows["ipoib-edr"])
    assert ":delay=D:jitter=J:loss=P%" in lines[-1]


@pytest.mark.netns
def test_up_with_a_delay_leaves_its_relay_running_until_down() -> None:
    with network_up("--profile", "100mbit", "--delay", "2ms", "--loss", "1%") as (run_id, out):
        assert re.search(
            rf"^run {run_id}: 2 hosts, links 100mbit, 2ms one way, 1% loss$", out, re.MULTILINE
        ), out
        pids = namespaces.run_pids(run_id)
        assert len(pids) == 1, "the relay outlives 'network up', in its hosts' namespaces"
        down = tool("network", "down", run_id)
        assert down.returncode == 0, down.stderr
        assert namespaces.run_namespaces(run_id) == []
        assert not namespaces.pid_alive(pids[0])


@pytest.mark.netns
def test_cleanup_keeps_a_network_left_up_on_purpose() -> None:
    with network_up("--hosts", "3", "--profile", "100mbit:delay=1ms") as (run_id, _):
        made = namespaces.run_namespaces(run_id)
        assert len(made) == 4, "three hosts and their switch"
        relays = namespaces.run_pids(run_id)
        assert relays, "a delayed link's relays outlive 'network up'"
        # The process that made it is gone, as a crashed run's is: cleanup tells them apart.
        assert not namespaces.pid_alive(int(run_id.split("-")[0]))
        cleaned = tool("network", "cleanup")
        assert cleaned.returncode == 0, cleaned.stderr
        assert run_id not in cleaned.stdout
        assert namespaces.run_namespaces(run_id) == made
        assert all(namespaces.pid_alive(pid) for pid in relays)
        down = tool("network", "down", run_id)
        assert down.returncode == 0, down.stderr
        assert namespaces.run_namespaces(run_id) == []


@pytest.mark.netns
def test_up_leaves_a_network_that_down_removes() -> None:
    with network_up("--hosts", "3", "--profile", "100mbit") as (run_id, _):
        assert len(namespaces.run_namespaces(run_id)) == 4
        listed = tool("network", "list")
        assert run_id in listed.stdout
        shaped = subprocess.run(
            ["tc", "-n", topology.namespace_name(run_id, "h1"), "qdisc", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "100Mbit" in shaped.stdout
        down = tool("network", "down", run_id)
        assert down.returncode == 0, down.stderr
        assert namespaces.run_namespaces(run_id) == []


@pytest.mark.netns
def test_cleanup_removes_what_a_crashed_run_left() -> None:
    leftover = topology.namespace_name("99999998-dead", "h1")
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    try:
        result = tool("network", "cleanup")
        assert result.returncode == 0, result.stderr
        assert leftover in result.stdout
        assert leftover not in namespaces.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", leftover], check=False, capture_output=True)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ("network", "up", "--profile", "fast"),
            f"unknown network profile 'fast': expected one of {', '.join(links.PROFILES)}, "
            "or a rate such as 100mbit, optionally followed by :delay=50us:jitter=10us:loss=0.1%",
        ),
        (
            ("network", "up", "--profile", "1gbit", "--delay", "1ms", "--jitter", "2ms"),
            "profile 1gbit:delay=1ms:jitter=2ms: jitter 2ms must be in [0, the delay 1ms]: a "
            "packet cannot leave before it arrived",
        ),
        (
            ("network", "compare", "--profiles", "1gbit", "--loss", "0.1"),
            "--loss '0.1': expected a percentage in [0%, 100%), such as 0.1%",
        ),
        (("network", "up", "--hosts", "1"), "--hosts must be >= 2, got 1"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(arguments: tuple[str, ...], message: str) -> None:
    result = tool(*arguments)
    assert result.returncode == 5
    assert result.stderr == f"tf-grpc-bench network: error: {message}\n"


@pytest.mark.netns
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("network", "down", "1-ab"), "RUN_ID 1-ab: no such network"),
        (("network", "down", "nonsense"), "RUN_ID 'nonsense': expected"),
    ],
)
def test_a_bad_run_id_is_one_line_and_a_nonzero_exit(
    arguments: tuple[str, ...], message: str
) -> None:
    result = tool(*arguments)
    assert result.returncode == 5
    assert result.stderr.startswith(f"tf-grpc-bench network: error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_root_the_command_says_so_in_one_line() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from tf_grpc_bench import cli
        cli.build_parser("network")  # imports done as root: nobody cannot read the venv
        import logging, grpc
        if os.geteuid() == 0:
            os.setuid(65534)
        sys.exit(cli.main(["network", "up"]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=environment_without_coverage(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 5
    assert result.stderr == (
        "tf-grpc-bench network: error: emulated networks need root (network namespaces, veth, "
        "tc); run as root, or replay between real hosts with --target\n"
    )


@pytest.mark.netns
def test_compare_replays_across_rate_limited_links_under_their_rates(tmp_path: Path) -> None:
    result, pid = tool_with_pid(
        "network",
        "compare",
        "--profiles",
        "100mbit,200mbit",
        "--synthetic",
        "--benchmark",
        "p2p-bandwidth",
        "--categories",
        "large",
        "--buffers",
        "1",
        "--warmup",
        "0.3",
        "--duration",
        "1.5",
        "--runs",
        "1",
        "--output-dir",
        str(tmp_path),
        timeout_s=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert namespaces_made_by(pid) == []
    (compare_dir,) = tmp_path.glob("*-compare")
    assert (compare_dir / "comparison.md").read_text().count("| p2p-bandwidth |") == 2
    assert "| 100mbit |" in result.stdout
    # The TensorBoard comparison beside the runs: latency per size class over the link rate.
    accumulator = plugin_event_accumulator.EventAccumulator(str(compare_dir / "comparison"))
    accumulator.Reload()
    tags = accumulator.Tags()["tensors"]
    assert "plots/latency/p2p-bandwidth" in tags
    steps = [e.step for e in accumulator.Tensors("latency_vs_rate/p2p-bandwidth/large_p50_us")]
    assert steps == [100, 200]
    for name, rate in (("100mbit", 100e6), ("200mbit", 200e6)):
        (path,) = (compare_dir / name).glob("*/results.json")
        document = read_document(path)
        assert document.network is not None
        assert document.network.name == name
        assert document.network.emulated_rate_bits_per_s == rate
        (interface,) = document.network.interfaces
        assert interface.name == "eth0" and interface.namespace.startswith(topology.PREFIX)
        assert list(path.parent.glob("p2p-bandwidth/events.out.tfevents.*"))
        (bandwidth,) = document.benchmarks
        # Never over the link's rate (tbf's first burst allows a little over); how close
        # it gets depends on the machine's load, which bench/network_profiles.py measures.
        assert bandwidth.bytes_per_s > 0
        assert bandwidth.bytes_per_s * 8 / rate <= 1.1, f"{name}: {bandwidth.bytes_per_s} B/s"


#: The compare test's link, and the size of every call its trace makes large.
_SLOW_LINK_BITS_PER_S = 16e6
_LARGE = 1_000_000


@pytest.mark.netns
@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_compare_keeps_ps_to_ps_and_chief_to_worker_calls_off_the_link(
    tmp_path: Path, tls: bool
) -> None:
    """Host 0 stands for the ps tasks, host 1 for the workers and the chief, as in a
    capture on a link: a ps's pulls from the other ps and the chief's calls to the
    workers (their stand-ins) stay on their host; only worker <-> ps calls cross.
    With TLS the certificate covers both hosts (the stand-ins serve from host 1)."""
    trace = make_whole_step_trace(pull=(_LARGE, _LARGE), ps_to_ps=_LARGE, enqueue=_LARGE)
    path = trace_files.write_trace(trace, tmp_path / "whole-steps.tfgbtrace")
    result, pid = tool_with_pid(
        "network",
        "compare",
        str(path),
        "--profiles",
        "16mbit",
        "--benchmark",
        "ps-throughput",
        "--time-dilation",
        "1",
        "--passes",
        "1",
        "--warmup",
        "0",
        "--runs",
        "1",
        "--output-dir",
        str(tmp_path),
        *(["--tls"] if tls else []),
        timeout_s=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert namespaces_made_by(pid) == []
    (path,) = tmp_path.glob("*-compare/16mbit/*/results.json")
    (throughput,) = read_document(path).benchmarks
    parameters = throughput.parameters
    clients = str(parameters["client_tasks"]).split(",")
    servers = str(parameters["server_tasks"]).split(",")
    assert servers == [
        "/job:ps/task:0",
        "/job:ps/task:1",
        "/job:worker/task:0",
        "/job:worker/task:1",
    ]
    assert str(parameters["client_netns"]).startswith(f"ps={topology.PREFIX}")
    # The ps servers on host 0, the stand-ins on host 1 (the replay's own).
    hosts = [target.rsplit(":", 1)[0] for target in str(parameters["targets"]).split(",")]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    # A megabyte over 16 Mbit/s takes at least (1 MB - tbf's bucket) x 8 / rate; a call
    # kept on its host's loopback takes a small part of that.
    crossing_s = (_LARGE - links.MIN_BURST_BYTES) * 8 / _SLOW_LINK_BITS_PER_S
    (run,) = throughput.runs
    seen: dict[tuple[str, str], list[float]] = {}
    for sample in run.samples:
        key = (clients[sample.worker_index], servers[sample.server_index])
        if max(sample.request_bytes, sample.response_bytes) >= _LARGE:
            seen.setdefault(key, []).append(sample.latency_ns / 1e9)
    crossed = {key: min(times) for key, times in seen.items() if key[0].startswith("/job:worker")}
    stayed = {key: max(times) for key, times in seen.items() if key not in crossed}
    assert set(stayed) == {
        ("/job:ps/task:0", "/job:ps/task:1"),
        ("/job:chief/task:0", "/job:worker/task:0"),
    }, seen
    assert len(crossed) == 2 and all(t >= crossing_s for t in crossed.values()), crossed
    assert all(t < crossing_s for t in stayed.values()), stayed


def test_compare_refuses_an_unknown_profile_before_making_anything() -> None:
    result, pid = tool_with_pid("network", "compare", "--profiles", "1gbit,warp9", "--synthetic")
    assert result.returncode == 5
    assert "unknown network profile 'warp9'" in result.stderr
    assert namespaces_made_by(pid) == []
