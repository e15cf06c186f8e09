"""bench/relay_use.py: what the relays of a bench's runs took (their CPU per byte moved).

The sampler is checked on a real delayed network (root, ``netns``): it finds the relay
started below it, reads its CPU and bytes, and leaves out relays started elsewhere.
The table and bench/fidelity.py's use of it need no root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tf_grpc_bench.netns import emulated, links

from .conftest import load_bench_script

relay_use = load_bench_script("relay_use.py", "bench_relay_use")

ECHO = textwrap.dedent(
    """
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 9000))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)
    """
)
PINGS = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((sys.argv[1], 9000))
    s.settimeout(5)
    for i in range(50):
        s.send(b"x" * 1000)
        s.recv(2048)
    """
)


def _traffic_on_a_delayed_link(samplers: list[object]) -> None:
    with emulated.EmulatedNetwork(
        hosts=2, profile=links.parse_profile("1gbit:delay=200us")
    ) as network:
        server = network.spawn(0, [sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        network.run(1, [sys.executable, "-c", PINGS, network.hosts[0].address])
        for sampler in samplers:
            sampler.sample()  # type: ignore[attr-defined]


@pytest.mark.netns
def test_the_sampler_reads_the_relays_started_below_it_and_only_those() -> None:
    elsewhere = subprocess.Popen(["sleep", "60"])
    try:
        with (
            relay_use.RelaySampler(interval_s=0.05) as ours,
            relay_use.RelaySampler(elsewhere.pid, interval_s=0.05) as theirs,
        ):
            _traffic_on_a_delayed_link([ours, theirs])
    finally:
        elsewhere.kill()
        elsewhere.wait()
    use = ours.use()
    assert use.relays == 1
    # 50 pings of 1000 bytes each way, and the calibration's before them.
    assert use.bytes >= 2 * 50 * 1000
    assert use.cpu_s > 0 and use.cpu_s_per_gb is not None and use.cpu_s_per_gb > 0
    assert theirs.use() == relay_use.RelayUse(relays=0, cpu_s=0.0, bytes=0)


def test_a_process_is_below_its_parent_and_not_the_other_way() -> None:
    assert relay_use.is_descendant(os.getpid(), os.getppid())
    assert relay_use.is_descendant(os.getpid(), os.getpid())
    assert not relay_use.is_descendant(os.getppid(), os.getpid())


def test_the_table_gives_cpu_per_gb_moved_and_a_dash_for_nothing() -> None:
    use = relay_use.RelayUse(relays=1, cpu_s=4.0, bytes=2_000_000_000)
    assert use.cpu_s_per_gb == pytest.approx(2.0)
    assert relay_use.RelayUse(relays=1, cpu_s=0.1, bytes=0).cpu_s_per_gb is None
    lines = relay_use.relay_table([("10gbit-crossrack", [use, None, use])])
    assert lines[-1] == ("| 10gbit-crossrack | 2.00 (4.0 s, 2.0 GB) | - | 2.00 (4.0 s, 2.0 GB) |")


def test_the_fidelity_report_lists_the_relays_of_delayed_links_only(tmp_path: Path) -> None:
    fidelity = load_bench_script("fidelity.py", "bench_fidelity")
    prediction = fidelity.Prediction(
        step_s=0.6, compute_s=0.1, cpu_cores=0.5, cpu_per_round_s=None, document=tmp_path
    )
    use = relay_use.RelayUse(relays=1, cpu_s=4.8, bytes=4_000_000_000)
    rows = [
        fidelity.Row(
            model="tiny",
            profile=profile,
            training_s=0.7,
            link_bound_s=0.2,
            from_loopback=prediction,
            from_link=prediction,
            relays=relays,
        )
        for profile, relays in (("10gbit", ()), ("10gbit-crossrack", (use, use, None)))
    ]
    body = fidelity.report(rows, "tf2-ps", "cmd", "0", "0")
    assert "| 10gbit-crossrack | 1.20 (4.8 s, 4.0 GB) | 1.20 (4.8 s, 4.0 GB) | - |" in body
    assert "| 10gbit |" not in body.split("The links' relays")[1]
