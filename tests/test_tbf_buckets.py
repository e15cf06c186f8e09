"""The token bucket of every named link profile, against the kernel's HZ and ``tc``'s own
reading of it.

tc-tbf(8) asks for a burst of at least one timer tick of the rate: the bucket a
plan gives must be sized by the HZ of the kernel it runs on (read here from the
kernel's build configuration, not by the code under test), and ``network
profiles`` must print what the network gets.  What ``tc -j qdisc show`` reports
for each profile's tbf was recorded into ``tests/data/tc/`` (the kernel's
reading: rate in bytes/s, burst in bytes, latency in us), one per rate of the named
profiles (a profile's tbf depends on its rate alone), with the HZ of the
recording machine, so a plan is checked against it without root; the root test
builds each profile's link again and compares what tc says now.  The kernel keeps
a burst as a time, so from 10 Gbit/s on tc reads it back a little below what was
asked (4,998,750 B for 5,000,000 at 10 Gbit/s and HZ 250).

Re-record the fixtures as root: ``.venv/bin/python -m tests.test_tbf_buckets``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tf_grpc_bench.netns import emulated, links, namespaces, topology

FIXTURES = Path(__file__).parent / "data" / "tc"
CLI = str(Path(sys.executable).with_name("tf-grpc-bench"))
RATED = [p for p in links.PROFILES.values() if p.rate_bits_per_s is not None]
#: Every named profile's rate, as a profile of that rate alone (its tbf is the rate's):
#: what the fixtures record, one per rate.
RATES = [
    links.parse_profile(f"{rate // 10**9}gbit")
    for rate in sorted({p.rate_bits_per_s for p in RATED if p.rate_bits_per_s})
]


def _configured_hz() -> int | None:
    """The running kernel's HZ from its build configuration (the ``CONFIG_HZ_<n>=y``
    choice), or None where the configuration is not readable."""
    for source in (Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")):
        try:
            raw = source.read_bytes()
        except OSError:
            continue
        text = (gzip.decompress(raw) if source.suffix == ".gz" else raw).decode()
        chosen = re.findall(r"^CONFIG_HZ_([0-9]+)=y$", text, re.MULTILINE)
        if chosen:
            return int(chosen[0])
    return None


def _kernel_hz() -> int:
    hz = _configured_hz()
    if hz is None:
        pytest.skip("the kernel's build configuration (/proc/config.gz, /boot) is not readable")
    return hz


def _tbf_arguments(command: tuple[str, ...]) -> list[str]:
    return list(command[command.index("tbf") :])


def _fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / f"tbf-{name}.json").read_text()))


def _assert_read_back(options: dict[str, int], rate_bits_per_s: int, burst: int) -> None:
    """tc's reading of a tbf asked for ``rate_bits_per_s``, ``burst`` bytes and 20 ms: the
    rate in bytes/s exactly; the kernel keeps the burst and the latency as times in
    its own clock units, so they read back rounded (the burst up to 0.05% less, the
    latency up to 1 us more)."""
    assert set(options) == {"rate", "burst", "lat"}
    assert options["rate"] == rate_bits_per_s // 8
    assert burst * (1 - 5e-4) <= options["burst"] <= burst
    assert 20_000 <= options["lat"] <= 20_001


def test_the_kernels_hz_is_the_one_it_was_built_with() -> None:
    assert namespaces.kernel_hz() == _kernel_hz()


@pytest.mark.parametrize("profile", RATED, ids=lambda p: p.name)
def test_each_named_profile_gets_a_burst_of_one_tick_at_the_kernels_hz(
    profile: links.LinkProfile,
) -> None:
    """What ``network up`` would run here, planned without root."""
    hz = _kernel_hz()
    rate = profile.rate_bits_per_s
    assert rate is not None
    burst = max(math.ceil(rate / 8 / hz), 2 * 65_536)
    network = emulated.EmulatedNetwork(hosts=2, profile=profile)
    assert network.token_bucket is not None
    assert network.token_bucket.burst_bytes == burst
    shaping = [c for c in network.plan.setup_commands if c[0] == "tc" and "tbf" in c]
    assert len(shaping) == 2
    for command in shaping:
        assert _tbf_arguments(command) == [
            "tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", "20000us",
        ]  # fmt: skip


def test_network_profiles_prints_the_bursts_the_links_get() -> None:
    hz = _kernel_hz()
    shown = subprocess.run(
        [CLI, "network", "profiles"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert f"kernel HZ {hz}" in shown
    for profile in RATED:
        assert profile.rate_bits_per_s is not None
        burst = max(math.ceil(profile.rate_bits_per_s / 8 / hz), 2 * 65_536)
        line = re.search(rf"^\s+{re.escape(profile.name)}\s+\S+\s+([0-9]+) B\s", shown, re.M)
        assert line is not None, shown
        assert int(line.group(1)) == burst, line.group(0)


@pytest.mark.parametrize("profile", RATED, ids=lambda p: p.name)
def test_tcs_recorded_reading_of_each_profiles_bucket_is_what_the_plan_asks(
    profile: links.LinkProfile,
) -> None:
    """The plan for the recording kernel's HZ asks tc for exactly what was recorded for
    the profile's rate, and tc read it back as the same rate (bytes/s), burst and
    latency."""
    assert profile.rate_bits_per_s is not None
    recorded = _fixture(f"{profile.rate_bits_per_s // 10**9}gbit")
    plan = topology.plan_network(hosts=2, profile=profile, run_id="1-ab", hz=recorded["hz"])
    shaping = [c for c in plan.setup_commands if c[0] == "tc" and "tbf" in c]
    assert {tuple(_tbf_arguments(c)) for c in shaping} == {tuple(recorded["arguments"])}
    assert profile.rate_bits_per_s is not None and plan.token_bucket is not None
    (qdisc,) = recorded["shown"]
    assert qdisc["kind"] == "tbf" and qdisc["root"] is True
    _assert_read_back(qdisc["options"], profile.rate_bits_per_s, plan.token_bucket.burst_bytes)


def record(profile: links.LinkProfile) -> dict[str, Any]:
    """Bring a two-host network of ``profile`` up, and what ``tc -j`` says of its tbf."""
    with emulated.EmulatedNetwork(hosts=2, profile=profile) as network:
        host = network.hosts[0]
        shown = json.loads(
            subprocess.run(
                ["tc", "-n", host.namespace, "-j", "qdisc", "show", "dev", host.interface],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout
        )  # fmt: skip
        (command,) = [
            c
            for c in network.plan.setup_commands
            if c[0] == "tc" and "tbf" in c and host.namespace in c
        ]
    for qdisc in shown:
        qdisc.pop("handle", None)  # a number the kernel picks
        qdisc.pop("refcnt", None)
    version = subprocess.run(["tc", "-V"], capture_output=True, text=True, check=False).stdout
    return {
        "profile": profile.name,
        "hz": namespaces.kernel_hz(),
        "kernel": platform.release(),
        "tc": version.strip(),
        "arguments": _tbf_arguments(command),
        "shown": shown,
    }


@pytest.mark.netns
@pytest.mark.parametrize("profile", RATES, ids=lambda p: p.name)
def test_tc_reads_each_profiles_bucket_back_as_recorded(profile: links.LinkProfile) -> None:
    live = record(profile)
    assert live["hz"] == _kernel_hz()
    (qdisc,) = live["shown"]
    assert profile.rate_bits_per_s is not None
    burst = max(math.ceil(profile.rate_bits_per_s / 8 / live["hz"]), 2 * 65_536)
    _assert_read_back(qdisc["options"], profile.rate_bits_per_s, burst)
    recorded = _fixture(profile.name)
    if live["hz"] == recorded["hz"]:
        assert (live["arguments"], live["shown"]) == (recorded["arguments"], recorded["shown"])


if __name__ == "__main__":
    # As root: record what tc says of each named profile's bucket on this kernel.
    if os.geteuid() != 0:
        raise SystemExit("recording the tc fixtures makes network namespaces: run as root")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for rated in RATES:
        path = FIXTURES / f"tbf-{rated.name}.json"
        path.write_text(json.dumps(record(rated), indent=1) + "\n")
        print(path)
