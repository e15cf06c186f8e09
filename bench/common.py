"""What the bench scripts share: ports and processes on loopback, the iperf3 and
sockperf runners, sizes and loads as text, the machine line, Markdown tables, and
the rewriting of one ``## `` section of bench/README.md (or docs/performance.md).

Used as ``from common import ...`` by the scripts next to it (they run as
``python bench/<script>.py``, so this folder is on the path).  Imports nothing
of ``tf_grpc_bench`` until a function needs it.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "bench" / "README.md"
LOOPBACK = "127.0.0.1"
KIB = 1024
MIB = 1024 * 1024
INSTALL_HINT = "apt-get install -y iperf3 sockperf"
#: sockperf's smallest message.
SOCKPERF_MIN_BYTES = 14


# --------------------------------------------------------------------------
# Text.


def size_name(size_bytes: int) -> str:
    """``10 B``, ``10 KiB``, ``1 MiB``: the largest unit that divides the size."""
    if size_bytes >= MIB and size_bytes % MIB == 0:
        return f"{size_bytes // MIB} MiB"
    if size_bytes >= KIB and size_bytes % KIB == 0:
        return f"{size_bytes // KIB} KiB"
    return f"{size_bytes} B"


def load_average(*, digits: int = 2, separator: str = " / ") -> str:
    """The 1, 5 and 15 minute load averages, e.g. ``0.52 / 0.61 / 0.70``."""
    return separator.join(f"{value:.{digits}f}" for value in os.getloadavg())


def utc_minute() -> str:
    """Now, to the minute: ``2026-01-31 18:05 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def command_line(script: str, arguments: Sequence[str], *, python: str = ".venv/bin/python") -> str:
    """How a bench script was run, as a shell line from the repository root."""
    return shlex.join([python, f"bench/{Path(script).name}", *arguments])


def machine_line(
    load_before: str, load_after: str, *, memory_and_protobuf: bool = False, load_remark: str = ""
) -> str:
    """The machine, the load before and after the measurements, and when they were taken."""
    from tf_grpc_bench.replay.output.machine import probe_machine

    machine = probe_machine()
    hardware = f"{machine.cpu_model}, {machine.cpu_count} CPUs"
    versions = f"Python {machine.python_version}, grpcio {machine.grpcio_version}"
    if memory_and_protobuf:
        memory = f"{machine.memory_bytes / 1024**3:.0f} GiB" if machine.memory_bytes > 0 else "?"
        hardware += f", {memory}"
        versions += f", protobuf {machine.protobuf_version}"
    return (
        f"Machine: {hardware}, kernel {machine.kernel}, {versions}. "
        f"Load average (1/5/15 min) before: {load_before}, after: {load_after}{load_remark}. "
        f"Measured {utc_minute()}."
    )


def table_head(*columns: str) -> list[str]:
    """A Markdown table's header line and the line under it."""
    return [table_row(*columns), "|" + "---|" * len(columns)]


def table_row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


# --------------------------------------------------------------------------
# Markdown sections.


def replace_section(path: Path, heading: str, body: str, *, title: str = "# Benchmarks") -> None:
    """Put ``body`` (which starts with the ``heading`` line) in place of the section of
    ``path`` that starts with ``heading``, up to the next ``## `` heading; append it
    if the file has no such section, and create the file (with ``title``) if needed."""
    text = path.read_text(encoding="utf-8") if path.exists() else f"{title}\n"
    body = body.rstrip("\n") + "\n"
    start = text.find(heading + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        following = text.find("\n## ", start + len(heading))
        rest = "" if following < 0 else "\n" + text[following + 1 :]
        text = text[:start] + body + rest
    path.write_text(text, encoding="utf-8")


def write_section(path: Path, heading: str, body: str, *, title: str = "# Benchmarks") -> None:
    """``replace_section``, then say which section of which file was written."""
    replace_section(path, heading, body, title=title)
    print(f"wrote the '{heading.removeprefix('## ')}' section of {path.relative_to(ROOT)}")


# --------------------------------------------------------------------------
# Processes and ports.


def tf_grpc_bench_command(*arguments: str) -> list[str]:
    """The command line of ``tf-grpc-bench`` under this interpreter."""
    return [sys.executable, "-m", "tf_grpc_bench", *arguments]


def free_port() -> int:
    """A port free on loopback right now (a benchmark, not a test: the race is acceptable)."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def stop_process(process: subprocess.Popen[Any], timeout_s: float = 5.0) -> None:
    """Stop a process this script started, by its pid."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_listening(port: int, process: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """Wait until something accepts on ``port`` (for servers that take many connections)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with status {process.returncode} before listening")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s") from None
            time.sleep(0.05)


@contextlib.contextmanager
def server_process(
    serve: Callable[..., None], *arguments: Any, what: str, timeout_s: float = 60.0
) -> Iterator[tuple[int, BaseProcess]]:
    """Run ``serve(connection, *arguments)`` in a fresh (spawned) process, which sends the
    port it listens on through ``connection``; yield that port and the process, and stop
    the process (by its handle) when done."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=serve, args=(child, *arguments), daemon=True)
    process.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise RuntimeError(f"{what} did not start")
        yield int(parent.recv()), process
    finally:
        process.terminate()
        process.join(5)


def _run_client(command: list[str], seconds: float) -> subprocess.CompletedProcess[str]:
    """Run a measuring client for about ``seconds``: its output as text, its status unchecked."""
    return subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=seconds + 60
    )


# --------------------------------------------------------------------------
# iperf3.


def iperf3_server_command(port: int, *, bind: str | None = None) -> list[str]:
    """A one-off iperf3 server (``-s -1``): it serves one test, then exits."""
    return ["iperf3", "-s", "-1", *(["-B", bind] if bind else []), "-p", str(port)]


def iperf3_client_command(host: str, port: int, seconds: float, streams: int = 1) -> list[str]:
    """An iperf3 client sending for ``seconds`` over ``streams`` TCP streams, JSON report."""
    parallel = ["-P", str(streams)] if streams != 1 else []
    return ["iperf3", "-c", host, "-p", str(port), "-J", "-t", f"{seconds:g}", *parallel]


def iperf3_received_bits_per_s(report: dict[str, Any]) -> float:
    """Bits per second as the receiver counted them, from an ``iperf3 -J`` report."""
    return float(report["end"]["sum_received"]["bits_per_second"])


def iperf3_loopback(seconds: float, streams: int = 1) -> float:
    """iperf3 on loopback, client to server for ``seconds``: bits/s the receiver counted."""
    port = free_port()
    server = subprocess.Popen(
        iperf3_server_command(port, bind=LOOPBACK),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # A probe connection would use up the one-off server: retry the client instead.
        deadline = time.monotonic() + 10
        while True:
            completed = _run_client(
                iperf3_client_command(LOOPBACK, port, seconds, streams), seconds
            )
            report = json.loads(completed.stdout or "{}")
            if completed.returncode == 0 and "sum_received" in report.get("end", {}):
                return iperf3_received_bits_per_s(report)
            if time.monotonic() > deadline:
                raise RuntimeError(f"iperf3 client failed: {report.get('error', completed.stderr)}")
            time.sleep(0.1)
    finally:
        stop_process(server)


# --------------------------------------------------------------------------
# sockperf.


@dataclass(frozen=True, slots=True, kw_only=True)
class SockperfRoundTrip:
    """What ``sockperf ping-pong`` reports for one message size, in microseconds."""

    size_bytes: int
    p50_us: float
    p99_us: float
    mean_us: float
    count: int


_SOCKPERF_FIGURE = {
    "mean_us": re.compile(r"avg-rtt=\s*([0-9.]+)"),
    "p50_us": re.compile(r"percentile 50\.000 =\s*([0-9.]+)"),
    "p99_us": re.compile(r"percentile 99\.000 =\s*([0-9.]+)"),
    "count": re.compile(r"Total (\d+) observations"),
}


def parse_sockperf(output: str, size_bytes: int) -> SockperfRoundTrip:
    """The figures of one ``sockperf ping-pong`` run from what it printed."""
    # sockperf colours its output; strip the escapes before parsing.
    text = re.sub(r"\x1b\[[0-9;]*m", "", output)
    values = {}
    for name, pattern in _SOCKPERF_FIGURE.items():
        found = pattern.search(text)
        if found is None:
            last = text.strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"sockperf -m {size_bytes}: no {name} in its output ({last[0]})")
        values[name] = float(found.group(1))
    return SockperfRoundTrip(
        size_bytes=size_bytes,
        p50_us=values["p50_us"],
        p99_us=values["p99_us"],
        mean_us=values["mean_us"],
        count=int(values["count"]),
    )


def sockperf_loopback(sizes: Sequence[int], seconds: float) -> list[SockperfRoundTrip]:
    """``sockperf ping-pong --tcp --full-rtt`` against ``sockperf server``, one size at a time."""
    port = free_port()
    server = subprocess.Popen(
        ["sockperf", "sr", "--tcp", "-i", LOOPBACK, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    figures = []
    try:
        wait_listening(port, server)
        for size in sizes:
            command = ["sockperf", "pp", "--tcp", "-i", LOOPBACK, "-p", str(port), "-m", str(size)]
            command += ["-t", f"{max(1, round(seconds))}", "--full-rtt"]
            completed = _run_client(command, seconds)
            figures.append(parse_sockperf(completed.stdout + completed.stderr, size))
    finally:
        stop_process(server)
    return figures


# --------------------------------------------------------------------------
# A slower machine out of this one.

#: The CPU controller's period; a cgroup's quota is ``cores`` of it.
PERIOD_US = 100_000


@contextlib.contextmanager
def cpu_cgroup(cores: float) -> Iterator[list[str]]:
    """A CPU cgroup capped at ``cores`` CPUs' worth of time; yields the command prefix
    that starts a program inside it.  Removed at the end (its processes are gone)."""
    name = f"tfgb-slow-{os.getpid()}"
    quota = round(cores * PERIOD_US)
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        folder = v1 / name
        folder.mkdir()
        (folder / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (folder / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        root = Path("/sys/fs/cgroup")
        with contextlib.suppress(OSError):
            (root / "cgroup.subtree_control").write_text("+cpu")
        folder = root / name
        folder.mkdir()
        (folder / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    try:
        yield ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(folder)]
    finally:
        with contextlib.suppress(OSError):
            folder.rmdir()


@contextlib.contextmanager
def calibration_cache(path: Path) -> Iterator[None]:
    """Commands started inside keep their calibrations in ``path`` (a fresh one: measured now)."""
    from tf_grpc_bench import calibration

    before = os.environ.get(calibration.CACHE_ENV)
    os.environ[calibration.CACHE_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(calibration.CACHE_ENV, None)
        else:
            os.environ[calibration.CACHE_ENV] = before
