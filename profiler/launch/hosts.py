"""Training tasks placed on emulated hosts (``capture --network``, ``capture-job --network``).

An emulated host is a network namespace of ``tf_grpc_bench.netns`` (the same
machinery as ``tf-grpc-bench network``), joined to the others by a link of the
chosen profile.  A *layout* says which task runs on which host:

* ``ps-together`` (default): every ps task on host 0, every other task (chief,
  workers) on host 1: two hosts on one point-to-point link.  With no ps tasks
  (mwms) every task gets its own host, as in ``one-per-host``;
* ``one-per-host``: every task on its own host (ps, then workers, then the
  chief), cabled to one switch when there are three or more.

Each task process is started under ``ip netns exec <namespace>`` (which execs,
so the task keeps the pid it was started with), listens on its host's address,
and every task's cluster lists those addresses.  The network is torn down when
the ``emulated_hosts`` block ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import ConfigError, NetworkError
from tf_grpc_bench.netns import emulated, links

LAYOUTS = ("ps-together", "one-per-host")
DEFAULT_LAYOUT = "ps-together"

TaskKey = tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkRequest:
    """What ``--network`` and ``--layout`` asked for: a link profile and a layout."""

    profile: links.LinkProfile
    layout: str = DEFAULT_LAYOUT

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"--layout {self.layout!r}: expected one of {', '.join(LAYOUTS)}")

    @classmethod
    def parse(cls, profile: str, layout: str = DEFAULT_LAYOUT) -> NetworkRequest:
        """From flag text; ConfigError naming ``--network`` for an unknown profile."""
        try:
            link = links.parse_profile(profile)
        except NetworkError as error:
            raise ConfigError(f"--network: {error}") from None
        return cls(profile=link, layout=layout)


def check_network_allowed(recorder: str, *, euid: int | None = None) -> None:
    """NetworkError (one line, naming ``--network``; exit 5 as for the ``network``
    command) without root; ConfigError with a recorder other than ``preload``.

    Needs root (namespaces, veth, tc) and the in-process recorder: recording
    proxies listen in this machine's own namespace, where the tasks' host
    addresses do not exist.
    """
    if (os.geteuid() if euid is None else euid) != 0:
        raise NetworkError(
            "--network needs root: emulated hosts are network namespaces with rate-limited "
            "links (run as root, or capture without --network)"
        )
    if recorder != "preload":
        raise ConfigError(
            f"--network works only with --recorder preload, not {recorder}: the recording "
            "proxies cannot reach tasks inside emulated hosts"
        )


def place_tasks(keys: Sequence[TaskKey], layout: str) -> dict[TaskKey, int]:
    """The host index of every task (``job``, ``index``) under ``layout``."""
    if layout not in LAYOUTS:
        raise ConfigError(f"--layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    order = {"ps": 0, "worker": 1, "chief": 2}
    ordered = sorted(keys, key=lambda k: (order.get(k[0], 3), k[0], k[1]))
    has_ps = any(job == "ps" for job, _ in keys)
    if layout == "ps-together" and has_ps:
        return {key: 0 if key[0] == "ps" else 1 for key in ordered}
    return {key: i for i, key in enumerate(ordered)}


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskHosts:
    """Tasks on the hosts of a running emulated network."""

    request: NetworkRequest
    host_of: Mapping[TaskKey, int]
    addresses: tuple[str, ...]
    namespaces: tuple[str, ...]
    run_id: str

    def address(self, key: TaskKey) -> str:
        """The address ``key``'s task listens on (its host's)."""
        return self.addresses[self.host_of[key]]

    def prefix(self, key: TaskKey) -> tuple[str, ...]:
        """What goes before a task's command to run it inside its host."""
        return ("ip", "netns", "exec", self.namespaces[self.host_of[key]])

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The trace's ``extra`` entries that describe the network."""
        rate = self.request.profile.rate_bits_per_s
        placement = ", ".join(
            f"{job}:{index}=h{host}" for (job, index), host in sorted(self.host_of.items())
        )
        profile = self.request.profile
        return (
            ("network", profile.name),
            ("network_rate_bits_per_s", "unlimited" if rate is None else str(rate)),
            ("network_delay_ns", str(profile.delay_ns)),
            ("network_jitter_ns", str(profile.jitter_ns)),
            ("network_loss", f"{profile.loss:g}"),
            ("network_layout", self.request.layout),
            ("network_hosts", str(len(self.addresses))),
            ("network_placement", placement),
        )


@contextlib.contextmanager
def emulated_hosts(request: NetworkRequest, keys: Sequence[TaskKey]) -> Iterator[TaskHosts]:
    """Build the hosts ``keys`` need under ``request``; remove them when the block ends.

    Teardown (every namespace, and any process still inside one) runs on a
    normal end, an exception, Ctrl-C and SIGTERM/SIGHUP.
    """
    host_of = place_tasks(keys, request.layout)
    count = max(2, len(set(host_of.values())))
    with emulated.EmulatedNetwork(hosts=count, profile=request.profile) as network:
        hosts = network.hosts
        # Ctrl-C, SIGTERM and SIGHUP interrupt the capture alike: its tasks stop and
        # its partial trace is written, then the network is torn down.
        with lifetime.interrupt_on_signals():
            yield TaskHosts(
                request=request,
                host_of=host_of,
                addresses=tuple(h.address for h in hosts),
                namespaces=tuple(h.namespace for h in hosts),
                run_id=network.run_id,
            )
