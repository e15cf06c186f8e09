"""What crossed the emulated link, and when: the ps host's byte counters while a command runs.

Runs a command that brings up emulated hosts (``capture --network``, ``network
compare``) and, while it runs, reads the byte counters of the first emulated
host (``tfgb-*-h0``: the ps tasks' host in ``capture --network``'s default
layout and in ``network compare``) every ``--every`` seconds, through
``/proc/PID/net/dev`` of a process in that namespace.  Then it prints, for each
direction, the phases in which bytes moved (a pause of ``--pause`` seconds or
more ends one; phases under 1 MB, the control calls, are left out): when,
how many bytes, how long, the rate against ``--rate``, and the idle time
before the next phase in either direction.

What it is for: telling a replay's transfers from its waits.  A step that is
longer than training's either moves its bytes more slowly on the wire or
leaves the link idle longer between transfers; the counters say which
(docs/history.md: the rounds rule of 41ed473).  A dilated replay (``network compare``
at time dilation K) runs on a link K times slower: pass that link's rate, and
divide the times by K to compare them with training's.

Needs root (the namespaces).  Run from the repository root::

    sudo .venv/bin/python bench/link_phases.py --rate 5gbit -- \\
        .venv/bin/tf-grpc-bench capture --model vgg16 --network 5gbit --output /tmp/v.tfgbtrace
    sudo .venv/bin/python bench/link_phases.py --rate 1.25gbit -- \\
        .venv/bin/tf-grpc-bench network compare /tmp/v.tfgbtrace --profiles 5gbit \\
        --benchmark ps-throughput --time-dilation 4 --max-message-size 1GB
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns import links, topology

#: Emulated hosts' namespaces are named PREFIX<run>-h<index>.
HOST0_SUFFIX = "-h0"
#: A phase moves at least this much (smaller ones are control calls).
MIN_PHASE_BYTES = 1_000_000


@dataclass(frozen=True, slots=True)
class Sample:
    """Bytes host 0 had received and sent (every interface but loopback) at ``t_s``."""

    t_s: float
    received: int
    sent: int


@dataclass(frozen=True, slots=True)
class Phase:
    start_s: float
    end_s: float
    bytes: int


def _namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in listing.stdout.splitlines() if line.strip()]


def _counters_file(namespace: str) -> str | None:
    """``/proc/PID/net/dev`` of a process in ``namespace``, or None if none is there yet."""
    pids = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
    ).stdout.split()
    for pid in pids:
        path = f"/proc/{pid}/net/dev"
        try:
            with open(path) as handle:
                handle.read()
        except OSError:
            continue
        return path
    return None


def parse_net_dev(text: str) -> tuple[int, int]:
    """(received, sent) bytes over every interface but loopback, from ``/proc/net/dev``."""
    received = sent = 0
    for line in text.splitlines()[2:]:
        name, _, fields = line.partition(":")
        if name.strip() == "lo" or not fields:
            continue
        values = fields.split()
        received += int(values[0])
        sent += int(values[8])
    return received, sent


class Sampler:
    """Reads host 0's counters every ``every_s`` until stopped (a thread)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        path: str | None = None
        while not self._stop.is_set():
            if path is None:
                hosts = [
                    n
                    for n in _namespaces()
                    if n.startswith(topology.PREFIX) and n.endswith(HOST0_SUFFIX)
                ]
                path = _counters_file(hosts[0]) if hosts else None
                if path is None:
                    self._stop.wait(0.1)
                    continue
            try:
                with open(path) as handle:
                    text = handle.read()
            except OSError:
                text = ""
            if not text:  # the process (or the namespace) is gone: find another
                path = None
                continue
            received, sent = parse_net_dev(text)
            self.samples.append(Sample(time.monotonic(), received, sent))
            self._stop.wait(self.every_s)


def phases(points: list[tuple[float, int]], pause_s: float) -> list[Phase]:
    """Stretches in which the counter grew, split at pauses of ``pause_s`` or more.

    A counter that went down (another namespace's counters, after a restart) starts
    afresh.
    """
    found: list[Phase] = []
    start = last_move = None
    for (t0, b0), (t1, b1) in itertools.pairwise(points):
        if b1 < b0:
            start = last_move = None
            continue
        if b1 > b0:
            if start is None:
                start = (t0, b0)
            last_move = (t1, b1)
        elif start is not None and last_move is not None and t1 - last_move[0] >= pause_s:
            found.append(Phase(start[0], last_move[0], last_move[1] - start[1]))
            start = last_move = None
    if start is not None and last_move is not None:
        found.append(Phase(start[0], last_move[0], last_move[1] - start[1]))
    return [p for p in found if p.bytes >= MIN_PHASE_BYTES]


def report(samples: list[Sample], rate_bits: float, pause_s: float) -> list[str]:
    if len(samples) < 2:
        return ["no emulated host 0 was seen: nothing sampled"]
    origin = samples[0].t_s
    sent = phases([(s.t_s, s.sent) for s in samples], pause_s)
    received = phases([(s.t_s, s.received) for s in samples], pause_s)
    starts = sorted(p.start_s for p in sent + received)
    lines = [
        f"{len(samples)} samples over {samples[-1].t_s - origin:.1f} s; rate {rate_bits / 1e6:.0f} "
        f"Mbit/s; a phase ends at a pause of {pause_s * 1e3:.0f} ms"
    ]
    for title, found in (("host 0 sent", sent), ("host 0 received", received)):
        lines.append(f"{title}:")
        for phase in found:
            length = max(phase.end_s - phase.start_s, 1e-9)
            bits_per_s = phase.bytes * 8 / length
            following = [s for s in starts if s > phase.end_s]
            idle = f"{following[0] - phase.end_s:7.3f} s" if following else "      -"
            lines.append(
                f"  at {phase.start_s - origin:8.2f} s: {phase.bytes / 1e6:9.1f} MB in "
                f"{length:7.3f} s, {bits_per_s / 1e6:6.0f} Mbit/s "
                f"({bits_per_s / rate_bits:6.1%} of the rate), wire time at the rate "
                f"{phase.bytes * 8 / rate_bits:7.3f} s; idle before the next phase {idle}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", required=True, help="the link's rate, e.g. 5gbit, 1.25gbit")
    parser.add_argument("--every", type=float, default=0.004, help="seconds between samples")
    parser.add_argument("--pause", type=float, default=0.03, help="seconds that end a phase")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    arguments = parser.parse_args(argv)
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    if not command:
        parser.error("a command to run is expected after --")
    try:
        rate_bits = links.parse_profile(arguments.rate).rate_bits_per_s
    except NetworkError as error:
        parser.error(f"--rate: {error}")
    if rate_bits is None:
        parser.error("--rate: a limited rate is expected (5gbit, 1.25gbit), not unlimited")
    sampler = Sampler(arguments.every)
    sampler.start()
    try:
        returncode = subprocess.run(command, check=False).returncode
    finally:
        sampler.stop()
    print("\n".join(report(sampler.samples, rate_bits, arguments.pause)))
    return returncode


if __name__ == "__main__":
    sys.exit(main())
