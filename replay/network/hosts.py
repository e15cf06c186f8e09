"""The two emulated hosts of a network comparison: which servers and clients run where.

Host 0 stands for training's ps tasks, host 1 for its workers and chief, as
``capture --network`` places them (ps tasks together): a trace replay's
stand-in servers (the workers the chief calls) are served in host 1, and its
side clients that stand for a ps (a ps calling the other) run in host 0
(``--client-netns``), so only what crossed the link in training crosses it
here (``host_layout``).  ``start_servers`` runs ``tf-grpc-bench serve`` in
the hosts as a layout says.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns import emulated, topology
from tf_grpc_bench.replay.core.benchmarks import spec_of
from tf_grpc_bench.replay.core.workload import Workload

#: Port the servers listen on inside host 0 (each network is private, so fixed is fine).
SERVE_PORT = 50001

#: The job whose tasks host 0 stands for; every other job's tasks are on host 1.
PS_JOB = "ps"


@dataclass(frozen=True, slots=True, kw_only=True)
class HostLayout:
    """Which servers and clients of a replay run on which emulated host."""

    #: Servers on host 0: the ps tasks (targets 0 .. ps_servers - 1).
    ps_servers: int
    #: Servers on host 1, after them: stand-ins for the workers the chief calls.
    stand_ins: int = 0
    #: Whether some clients stand for ps tasks (to run on host 0).
    ps_clients: bool = False

    def __post_init__(self) -> None:
        if self.ps_servers < 1 or self.stand_ins < 0:
            raise ValueError(f"{self.ps_servers} ps servers, {self.stand_ins} stand-ins")


#: One ps server in host 0, every client in host 1 (a synthetic replay with one ps).
ONE_PS = HostLayout(ps_servers=1)


def host_layout(workloads: Sequence[Workload]) -> HostLayout:
    """Where ``workloads``' servers and clients go: a trace's PS-throughput workload
    names the task each stands for (``Workload.server_tasks``, ``client_tasks``); the
    others address ps servers only, from host 1."""
    servers = max(w.server_count for w in workloads)
    stand_ins = 0
    ps_clients = False
    for workload in workloads:
        if spec_of(workload.benchmark).point_to_point or not workload.server_tasks:
            continue
        stand_ins = max(stand_ins, sum(t.job != PS_JOB for t in workload.server_tasks))
        ps_clients = ps_clients or any(t.job == PS_JOB for t in workload.client_tasks)
    return HostLayout(ps_servers=servers - stand_ins, stand_ins=stand_ins, ps_clients=ps_clients)


def start_servers(
    network: emulated.EmulatedNetwork,
    layout: HostLayout,
    serve_arguments: Sequence[str],
    *,
    timeout_s: float,
) -> tuple[list[str], list[subprocess.Popen[str]]]:
    """``tf-grpc-bench serve`` in the network's two hosts as ``layout`` says (the ps
    servers in host 0, the stand-ins in host 1), each up and serving: the replay's
    targets in server order, and the serve processes (stopped with the network)."""
    server_host, client_host = network.hosts[:2]
    targets: list[str] = []
    processes: list[subprocess.Popen[str]] = []
    for host, count in ((server_host, layout.ps_servers), (client_host, layout.stand_ins)):
        if not count:
            continue
        server = network.spawn(
            host,
            tool_command(
                "serve",
                "--host",
                "0.0.0.0",
                "--port",
                str(SERVE_PORT),
                "--servers",
                str(count),
                *serve_arguments,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        processes.append(server)
        _wait_for_line(server, "serving", timeout_s)
        targets += [f"{host.address}:{SERVE_PORT + i}" for i in range(count)]
    return targets, processes


_LOCAL_ADDRESSES = (
    "from tf_grpc_bench.replay.network.netinfo import local_addresses; "
    "print(*local_addresses(), sep=chr(10))"
)


#: How long ``serving_addresses`` waits for the hosts' IPv6 link-local addresses.
ADDRESSES_SETTLE_S = 10.0


def _listed_addresses(network: emulated.EmulatedNetwork, host: topology.Host) -> list[str]:
    listed = network.run(host, [sys.executable, "-c", _LOCAL_ADDRESSES])
    if listed.returncode != 0:
        raise NetworkError(f"could not list {host.namespace}'s addresses: {listed.stderr}")
    return listed.stdout.split()


def serving_addresses(network: emulated.EmulatedNetwork) -> list[str]:
    """Every address a ``serve --host 0.0.0.0`` in either host names in its TLS certificate
    (``runner.serving_hosts``, read inside each host): one certificate made for all of
    them is the one both serves reuse.  Made for one host only, the other's serve would
    make a new one, with a new authority, under the first one's feet.

    A veth's IPv6 link-local address comes a moment after the link is up (over a
    second here), and a serve that saw one the certificate lacks would make a new
    one: with IPv6 on (``::1`` listed), wait up to ``ADDRESSES_SETTLE_S`` for each."""
    deadline = time.monotonic() + ADDRESSES_SETTLE_S
    while True:
        listings = [_listed_addresses(network, host) for host in network.hosts[:2]]
        settled = all(
            "::1" not in listed or any(a.startswith("fe80:") for a in listed) for listed in listings
        )
        if settled or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    addresses: list[str] = []
    for listed in listings:
        addresses += [a for a in listed if a not in addresses]
    return addresses


def client_placement(network: emulated.EmulatedNetwork, layout: HostLayout) -> list[str]:
    """The replay flags that run ``layout``'s ps clients in host 0 (none without)."""
    if not layout.ps_clients:
        return []
    return ["--client-netns", f"{PS_JOB}={network.hosts[0].namespace}"]


def tool_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "tf_grpc_bench", *arguments]


def _wait_for_line(process: subprocess.Popen[str], prefix: str, timeout_s: float) -> str:
    """Read the process's stdout until a line starts with ``prefix`` (blocking, bounded)."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = process.stdout.readline()
            if not line:
                break
            seen.append(line.strip())
            if line.startswith(prefix):
                return line
    finally:
        selector.close()
    if process.poll() is not None and process.stderr is not None:
        seen += process.stderr.read().strip().splitlines()[-1:]
    last = seen[-1] if seen else "no output"
    raise NetworkError(f"server in the emulated network did not start: {last}")
