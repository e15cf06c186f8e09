"""Operations on the machine's network namespaces: run, list, enter, delete, clean up.

Only namespaces with the tool's prefix (``plan.PREFIX``) are ever deleted.
Commands run through an injectable ``CommandRunner`` so that callers (and
tests) can see which commands run, in which order.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tf_grpc_bench.errors import NetworkError
from tf_grpc_bench.netns.links import FALLBACK_HZ
from tf_grpc_bench.netns.state import read_record, remove_namespace_state
from tf_grpc_bench.netns.topology import NAMESPACE_NAME, PREFIX, RUN_ID


def kernel_hz() -> int:
    """The running kernel's CONFIG_HZ, from /proc/config.gz or /boot; FALLBACK_HZ if unknown."""
    sources = (Path("/proc/config.gz"), Path(f"/boot/config-{os.uname().release}"))
    for source in sources:
        try:
            if source.suffix == ".gz":
                with gzip.open(source, "rt") as stream:
                    text = stream.read()
            else:
                text = source.read_text()
        except OSError:
            continue
        match = re.search(r"^CONFIG_HZ=([0-9]+)$", text, re.MULTILINE)
        if match:
            return int(match.group(1))
    return FALLBACK_HZ


#: Runs one command (argv), returns its stdout; raises NetworkError on failure.
CommandRunner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str]) -> str:
    """Run ``argv``; NetworkError naming the command and tool's message on failure."""
    try:
        completed = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError:
        raise NetworkError(f"{argv[0]}: not found (install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)}: timed out after 60 s") from None
    if completed.returncode != 0:
        message = (completed.stderr.strip() or completed.stdout.strip()).splitlines()
        detail = message[-1] if message else f"exit status {completed.returncode}"
        raise NetworkError(f"{' '.join(argv)}: {detail}")
    return completed.stdout


def require_root() -> None:
    """NetworkError unless this process may create namespaces and qdiscs."""
    if os.geteuid() != 0:
        raise NetworkError(
            "emulated networks need root (network namespaces, veth, tc); "
            "run as root, or replay between real hosts with --target"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetworkError(f"{tool}: not found (install iproute2)")


def list_namespaces(runner: CommandRunner = run_command) -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in runner(("ip", "netns", "list")).splitlines() if line]


#: Where ``ip netns add`` keeps a named namespace (a bind mount ``setns`` can open).
NAMED_NAMESPACES = Path("/run/netns")
_CLONE_NEWNET = 0x40000000


def namespace_path(name: str) -> Path:
    """The file of named network namespace ``name``; NetworkError if there is none."""
    path = NAMED_NAMESPACES / name
    if "/" in name or name in ("", ".", "..") or not path.exists():
        raise NetworkError(f"network namespace {name!r}: not found (ip netns list names them)")
    return path


def enter_namespace(name: str) -> None:
    """Move the calling thread into named network namespace ``name`` (``setns``), as
    ``ip netns exec`` does for a new process.

    Call it first thing in a fresh process: threads made afterwards by this thread
    (gRPC's among them) are in ``name`` too, threads made before stay where they were,
    so no socket may be opened before.  NetworkError if it cannot.
    """
    import ctypes

    path = namespace_path(name)
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise NetworkError(f"network namespace {name!r}: {error.strerror}") from None
    try:
        if libc.setns(descriptor, _CLONE_NEWNET) != 0:
            reason = os.strerror(ctypes.get_errno())
            raise NetworkError(f"cannot enter network namespace {name!r}: {reason}")
    finally:
        os.close(descriptor)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs.  A zombie does not: it has ended, and only
    waits for a parent to reap it (an orphan's new parent may never do so)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _namespace_pids(namespace: str, runner: CommandRunner) -> list[int]:
    try:
        return [int(p) for p in runner(("ip", "netns", "pids", namespace)).split()]
    except NetworkError:
        return []


def _kill_namespace_processes(namespace: str, runner: CommandRunner, grace_s: float) -> None:
    """Stop every process still inside one of our namespaces (started by our run).

    A namespace outlives ``ip netns del`` while any process is in it, so they
    must go first.  SIGTERM, then SIGKILL after ``grace_s``.
    """
    pids = _namespace_pids(namespace, runner)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if pid_alive(p) and p in _namespace_pids(namespace, runner)]
        if pids:
            time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def delete_namespace(namespace: str, runner: CommandRunner = run_command) -> None:
    """Remove one of our namespaces and whatever runs in it; refuses foreign names."""
    if not namespace.startswith(PREFIX):
        raise NetworkError(f"{namespace}: not a tf-grpc-bench namespace (prefix {PREFIX})")
    _kill_namespace_processes(namespace, runner, grace_s=3.0)
    runner(("ip", "netns", "del", namespace))
    remove_namespace_state(namespace)


def cleanup_leftovers(
    *, include_live: bool = False, runner: CommandRunner = run_command
) -> list[str]:
    """Remove namespaces left by earlier runs; returns the names removed.

    Only namespaces starting with ``PREFIX`` are considered.  By default those
    of a run whose creating process is still alive are kept (another run in
    progress), and so are those of a network left up on purpose (``network
    up``: its hosts' records say ``kept_up``; ``network down`` removes it);
    ``include_live=True`` removes them too.  Namespaces with our prefix but an
    unrecognised shape are removed as well: nothing but this tool creates names
    under the prefix.
    """
    require_root()
    names = [name for name in list_namespaces(runner) if name.startswith(PREFIX)]
    kept = set() if include_live else _runs_kept_up(names)
    removed = []
    for name in names:
        match = NAMESPACE_NAME.match(name)
        if match and not include_live:
            run_match = RUN_ID.match(match["run"])
            if (run_match and pid_alive(int(run_match["pid"]))) or match["run"] in kept:
                continue
        delete_namespace(name, runner)
        removed.append(name)
    return removed


def _runs_kept_up(names: Sequence[str]) -> set[str]:
    """The runs among ``names`` left up on purpose; a record that cannot be read
    keeps nothing (the network is then a leftover like any other)."""
    kept = set()
    for name in names:
        match = NAMESPACE_NAME.match(name)
        if match is None:
            continue
        with contextlib.suppress(NetworkError):
            record = read_record(name)
            if record is not None and record.kept_up:
                kept.add(match["run"])
    return kept


def run_namespaces(run_id: str, runner: CommandRunner = run_command) -> list[str]:
    """The namespaces of one run."""
    return [
        name
        for name in list_namespaces(runner)
        if (m := NAMESPACE_NAME.match(name)) is not None and m["run"] == run_id
    ]


def run_pids(run_id: str, runner: CommandRunner = run_command) -> list[int]:
    """The processes inside the namespaces of one run (its relays, what runs in its
    hosts), sorted."""
    return sorted(
        {pid for name in run_namespaces(run_id, runner) for pid in _namespace_pids(name, runner)}
    )


def remove_run(run_id: str, runner: CommandRunner = run_command) -> list[str]:
    """Remove every namespace of one run (``network down``); returns their names.

    NetworkError, naming ``RUN_ID``, for a malformed run id or a run with no
    namespaces; without root, before anything is looked at.
    """
    if not RUN_ID.match(run_id):
        raise NetworkError(f"RUN_ID {run_id!r}: expected <pid>-<hex> as 'network up' printed")
    require_root()
    names = run_namespaces(run_id, runner)
    if not names:
        raise NetworkError(f"RUN_ID {run_id}: no such network (see 'tf-grpc-bench network list')")
    for name in names:
        delete_namespace(name, runner)
    return names


def namespaces_by_run(runner: CommandRunner = run_command) -> dict[str, list[str]]:
    """The tool's namespaces (prefix ``PREFIX``) by run id, each run's sorted."""
    require_root()
    by_run: dict[str, list[str]] = {}
    for name in list_namespaces(runner):
        if name.startswith(PREFIX):
            run = name[len(PREFIX) :].rsplit("-", 1)[0]
            by_run.setdefault(run, []).append(name)
    return {run: sorted(names) for run, names in sorted(by_run.items())}
