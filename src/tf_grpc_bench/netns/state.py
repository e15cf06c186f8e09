"""What a running emulated network leaves in ``/run`` for the processes inside it.

A process started inside an emulated host (a replay, a training task) reads
from here what link it is on: each host namespace has a record
(``<namespace>.link.json``: the profile as built, and its relays' statistics
files), each relay a statistics file (``<namespace>-<link>.relay``, written
by ``relay.c`` while it runs).  Every file is named after a namespace of the
network, so removing a namespace removes its files (``remove_namespace_state``)
and nothing outlives the network.

Version history of the record: 1 (2026-12) first version; `kept_up` added later, optional
(absent: false).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.files import write_atomically
from tf_grpc_bench.netns.links import LinkProfile
from tf_grpc_bench.netns.topology import PREFIX, NetworkPlan, RelayPlan

#: Where the files live (a tmpfs: gone at reboot, as the namespaces are).
STATE_DIRECTORY = Path(os.environ.get("TFGB_NETNS_STATE", "/run/tf-grpc-bench"))
RECORD_SUFFIX = ".link.json"
RELAY_SUFFIX = ".relay"
RECORD_FORMAT = "tf-grpc-bench emulated link"
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRecord:
    """The link an emulated host is on, as built (a dilated network's own figures)."""

    namespace: str
    profile: LinkProfile
    #: The statistics files of the relays on this host's paths to the others.
    relay_stats: tuple[Path, ...] = ()
    #: Left up on purpose (``network up``): ``network cleanup`` keeps it.
    kept_up: bool = False


def relay_stats_path(plan: NetworkPlan, relay: RelayPlan) -> Path:
    """``tfgb-<run id>-<link>.relay`` (``h0-h1``, ``h2-sw``): it starts with the name of
    the namespace of the link's host, so it goes with that namespace."""
    return STATE_DIRECTORY / f"{PREFIX}{plan.run_id}-{relay.link}{RELAY_SUFFIX}"


def record_path(namespace: str) -> Path:
    return STATE_DIRECTORY / f"{namespace}{RECORD_SUFFIX}"


def write_records(plan: NetworkPlan, relay_stats: Sequence[Path], *, kept_up: bool = False) -> None:
    """A record for each host of ``plan``; every relay serves every host's paths (a
    point-to-point link's one relay, or the switch's relays that a host's packets cross).
    ``kept_up``: the network outlives the command that made it (``network up``)."""
    profile = plan.profile
    for host in plan.hosts:
        document = {
            "format": RECORD_FORMAT,
            "format_version": RECORD_VERSION,
            "namespace": host.namespace,
            "profile": profile.name,
            "rate_bits_per_s": profile.rate_bits_per_s,
            "delay_ns": profile.delay_ns,
            "jitter_ns": profile.jitter_ns,
            "loss": profile.loss,
            "relay_stats": [str(path) for path in relay_stats],
            "kept_up": kept_up,
        }
        text = (json.dumps(document, indent=1) + "\n").encode()
        write_atomically(
            record_path(host.namespace),
            functools.partial(_write, text),
            error=NetworkError,
            what="link record",
        )


def _write(data: bytes, stream: IO[bytes]) -> None:
    stream.write(data)


def read_record(namespace: str) -> HostRecord | None:
    """The record of emulated host ``namespace``; None if it has none (not one of ours,
    or a network from before records).  NetworkError for a record this tool cannot read."""
    path = record_path(namespace)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise NetworkError(f"{path}: unreadable link record ({error})") from None
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        raise NetworkError(f"{path}: not a link record")
    if data.get("format_version") != RECORD_VERSION:
        raise NetworkError(
            f"{path}: link record version {data.get('format_version')}; this tool reads "
            f"{RECORD_VERSION}"
        )
    try:
        profile = LinkProfile(
            name=str(data["profile"]),
            rate_bits_per_s=data["rate_bits_per_s"],
            delay_ns=int(data["delay_ns"]),
            jitter_ns=int(data["jitter_ns"]),
            loss=float(data["loss"]),
        )
        stats = tuple(Path(p) for p in data["relay_stats"])
        kept_up = data.get("kept_up", False)
        if not isinstance(kept_up, bool):
            raise TypeError(f"kept_up {kept_up!r} is not true or false")
    except (KeyError, TypeError, ValueError) as error:
        raise NetworkError(f"{path}: bad link record ({error})") from None
    return HostRecord(namespace=namespace, profile=profile, relay_stats=stats, kept_up=kept_up)


def remove_namespace_state(namespace: str) -> None:
    """Remove the files named after ``namespace`` (its record, the relays of its side)."""
    if not namespace.startswith(PREFIX) or "/" in namespace:
        return
    for path in (*STATE_DIRECTORY.glob(f"{namespace}.*"), *STATE_DIRECTORY.glob(f"{namespace}-*")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
