"""Memory bounds that see the container: ``host.memory_room`` reads a process's memory
cgroup (v2 and v1) as well as the machine's ``MemAvailable``, and ``serve`` and ``replay``
size what they allocate by it.

The probe is read over made-up ``/proc`` and cgroup trees; then, as root, real memory
cgroups (what a container, a Kubernetes pod or a Slurm job with ``--mem`` gets) hold a
real ``serve`` under concurrent large pulls and a real ``replay`` whose messages do not fit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tf_grpc_bench import trace_files
from tf_grpc_bench.host import MemoryRoom, memory_room
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.replay.transport.response_memory import (
    RESPONSE_COPIES,
    Refused,
    ResponseMemory,
)
from tf_grpc_bench.trace import RECV_TENSOR

from .conftest import make_trace
from .engines import grpc_cpp_program

CLI = str(Path(sys.executable).parent / "tf-grpc-bench")
GIB = 1024**3
MIB = 1024**2


def _proc(tmp_path: Path, *, cgroup: str, mountinfo: str, available_kb: int | None) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    if available_kb is not None:
        (proc / "meminfo").write_text(
            f"MemTotal:       99999999 kB\nMemAvailable:   {available_kb} kB\n"
        )
    return proc


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_a_v2_cgroup_bounds_the_room_by_its_tightest_ancestor_less_droppable_cache(
    tmp_path: Path,
) -> None:
    mount = tmp_path / "cg"
    proc = _proc(
        tmp_path,
        cgroup="0::/job/step\n",
        mountinfo=f"30 23 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n",
        available_kb=20 * 1024 * 1024,
    )
    # The step has no limit of its own; the job has 3 GiB, 2 GiB used of which
    # 512 MiB is page cache the kernel can drop at once.
    _write(mount / "job" / "step", memory_max="max\n", memory_current=f"{GIB}\n")
    _write(
        mount / "job",
        memory_max=f"{3 * GIB}\n",
        memory_current=f"{2 * GIB}\n",
        memory_stat=f"anon 1\ninactive_file {512 * MIB}\nactive_file 7\n",
    )
    room = memory_room(proc=proc)
    assert room == MemoryRoom(
        available_bytes=3 * GIB - (2 * GIB - 512 * MIB),
        bound=f"its memory cgroup /job (limit {3 * GIB} B)",
    )


def test_a_v1_memory_cgroup_counts_and_an_unlimited_one_does_not(tmp_path: Path) -> None:
    mount = tmp_path / "cg" / "memory"
    proc = _proc(
        tmp_path,
        cgroup="5:cpu,cpuacct:/\n4:memory:/slurm/job_7\n0::/\n",
        mountinfo=(
            f"31 23 0:28 / {tmp_path / 'cg'} rw - tmpfs tmpfs rw\n"
            f"32 31 0:29 / {tmp_path / 'cg' / 'cpu'} rw - cgroup cgroup rw,cpu,cpuacct\n"
            f"35 31 0:32 / {mount} rw shared:9 - cgroup cgroup rw,memory\n"
        ),
        available_kb=20 * 1024 * 1024,
    )
    unlimited = "9223372036854771712\n"
    _write(mount, memory_limit_in_bytes=unlimited, memory_usage_in_bytes=f"{5 * GIB}\n")
    _write(mount / "slurm", memory_limit_in_bytes=unlimited, memory_usage_in_bytes="1\n")
    _write(
        mount / "slurm" / "job_7",
        memory_limit_in_bytes=f"{4 * GIB}\n",
        memory_usage_in_bytes=f"{GIB}\n",
        memory_stat=f"cache 5\ntotal_inactive_file {100 * MIB}\n",
    )
    room = memory_room(proc=proc)
    assert room is not None
    assert room.available_bytes == 4 * GIB - (GIB - 100 * MIB)
    assert room.bound == f"its memory cgroup /slurm/job_7 (limit {4 * GIB} B)"


def test_a_container_sees_its_cgroup_at_the_mount_point_and_the_machine_when_tighter(
    tmp_path: Path,
) -> None:
    # No cgroup namespace: the process's cgroup is the mount's root, in a folder
    # whose name holds a space (mountinfo writes it as \040).
    mount = tmp_path / "cg root"
    escaped = str(mount).replace(" ", "\\040")
    proc = _proc(
        tmp_path,
        cgroup="0::/docker/abc\n",
        mountinfo=f"30 23 0:26 /docker/abc {escaped} ro - cgroup2 cgroup2 rw\n",
        available_kb=1024 * 1024,
    )
    _write(mount, memory_max=f"{8 * GIB}\n", memory_current=f"{GIB}\n")
    assert memory_room(proc=proc) == MemoryRoom(
        available_bytes=GIB, bound="the machine's MemAvailable"
    )
    (proc / "meminfo").write_text("MemAvailable:   99999999 kB\n")
    room = memory_room(proc=proc)
    assert room is not None and room.available_bytes == 7 * GIB
    assert room.bound == f"its memory cgroup / (limit {8 * GIB} B)"


def test_nothing_to_read_is_no_room_known_and_damaged_files_are_skipped(tmp_path: Path) -> None:
    assert memory_room(proc=tmp_path / "nothing") is None
    mount = tmp_path / "cg"
    proc = _proc(
        tmp_path,
        cgroup="0::/a\nnot a line\n",
        mountinfo=f"short line\n30 23 0:26 / {mount} rw - cgroup2 cgroup2 rw\n",
        available_kb=None,
    )
    _write(mount / "a", memory_max="lots\n", memory_current="1\n")
    assert memory_room(proc=proc) is None
    _write(mount / "a", memory_max="100\n", memory_current="250\n")
    assert memory_room(proc=proc) == MemoryRoom(
        available_bytes=0, bound="its memory cgroup /a (limit 100 B)"
    )


def test_large_responses_hold_their_memory_until_released_and_one_client_half_of_it() -> None:
    rooms = [MemoryRoom(available_bytes=10 * GIB, bound="its memory cgroup /pod (limit 10 B)")]
    memory = ResponseMemory(room=lambda: rooms[0])
    held = memory.reserve(2 * GIB, "ipv4:10.0.0.1:1")
    assert held == RESPONSE_COPIES * 2 * GIB
    # The same client again: past half of what the server has for responses.
    with pytest.raises(Refused, match="holds at most half") as refused:
        memory.reserve(2 * GIB, "ipv4:10.0.0.1:1")
    assert "/pod" in str(refused.value)
    # Another client: what is left, not more.
    other = memory.reserve(2 * GIB, "ipv4:10.0.0.2:1")
    with pytest.raises(Refused, match=r"to spare .*held by responses still being sent"):
        memory.reserve(GIB + 1, "ipv4:10.0.0.3:1")
    memory.release("ipv4:10.0.0.1:1", held)
    memory.release("ipv4:10.0.0.2:1", other)
    assert memory.held_bytes == 0
    memory.release("ipv4:10.0.0.3:1", memory.reserve(4 * GIB, "ipv4:10.0.0.3:1"))


# --------------------------------------------------------------------------
# Real memory cgroups (root).


def _memory_cgroup_parent() -> tuple[Path, str]:
    """Where a test may make a memory cgroup, and the file that limits it.

    cgroup v1: under this process's own memory cgroup (so it stays within what
    holds this process); v2: under the root (a v2 cgroup with processes of its
    own cannot give its children controllers)."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, name = line.split(":", 2)
        own["v2" if number == "0" else controllers] = name
    for controllers, name in own.items():
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / name.lstrip("/")
            if (folder / "memory.limit_in_bytes").exists():
                return folder, "memory.limit_in_bytes"
    root = Path("/sys/fs/cgroup")
    if "memory" in (root / "cgroup.controllers").read_text().split():
        with contextlib.suppress(OSError):
            (root / "cgroup.subtree_control").write_text("+memory")
        return root, "memory.max"
    pytest.skip("no memory cgroup controller here")


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[tuple[list[str], Path]]:
    """A memory cgroup limited to ``limit_bytes`` (named with the tool's ``tfgb-`` prefix):
    the command prefix that starts a program inside it, and its folder.  Removed at the
    end, once every process started in it is gone."""
    parent, limit_file = _memory_cgroup_parent()
    folder = parent / f"tfgb-memory-{os.getpid()}-{threading.get_ident()}"
    folder.mkdir()
    try:
        (folder / limit_file).write_text(str(limit_bytes))
        yield ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(folder)], folder
    finally:
        folder.rmdir()


def _oom_kills(folder: Path) -> int:
    for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
        with contextlib.suppress(OSError):
            for line in (folder / name).read_text().splitlines():
                if line.split()[:1] == [key]:
                    return int(line.split()[1])
    return 0


@pytest.mark.netns  # root: makes a memory cgroup
def test_the_probe_inside_a_memory_cgroup_reports_the_cgroups_room() -> None:
    with memory_cgroup(512 * MIB) as (prefix, folder):
        code = (
            "from tf_grpc_bench.host import memory_room; "
            "room = memory_room(); print(room.available_bytes, room.bound)"
        )
        completed = subprocess.run(
            [*prefix, sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
    available, bound = completed.stdout.split(" ", 1)
    assert 0 < int(available) <= 512 * MIB
    assert folder.name in bound and f"limit {512 * MIB} B" in bound


def _pull(address: str, size: int) -> tuple[str, str]:
    """One raw pull of ``size`` bytes: ("OK", "") with the whole response, or (status, details)."""
    options = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(address, options=options) as channel:
        try:
            response = channel.unary_unary(RECV_TENSOR, None, None)(
                struct.pack("<Q", size), timeout=300
            )
        except grpc.RpcError as error:
            return error.code().name, error.details() or ""
    assert len(response) == size
    return "OK", ""


@pytest.mark.netns  # root: makes a memory cgroup
@pytest.mark.parametrize("engine", ["grpcio", "grpc-cpp"])
def test_serve_in_a_3_gib_cgroup_refuses_concurrent_large_pulls_it_cannot_hold_and_serves_on(
    tmp_path: Path, engine: str
) -> None:
    if engine == "grpc-cpp":
        grpc_cpp_program()  # a skip, saying why, where it cannot be built
    # Three pulls of 2 GB and two of 1 GiB at once: the server's machine has far more
    # memory available than the cgroup lets serve take (the 2 GB ones killed it so).
    sizes = [2_000_000_000] * 3 + [GIB] * 2
    port = free_ports(1)[0]
    with memory_cgroup(3 * GIB) as (prefix, folder):
        serve = subprocess.Popen(
            [*prefix, CLI, "serve", "--host", "127.0.0.1", "--port", str(port), "--engine", engine],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert serve.stdout is not None and "serving" in serve.stdout.readline()
            address = f"127.0.0.1:{port}"
            outcomes: list[tuple[str, str]] = []
            threads = [
                threading.Thread(target=lambda s=size: outcomes.append(_pull(address, s)))
                for size in sizes
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert serve.poll() is None, serve.communicate()[1]
            assert _pull(address, 1000) == ("OK", "")
            assert _oom_kills(folder) == 0
        finally:
            serve.send_signal(signal.SIGTERM)
            _, err = serve.communicate(timeout=60)
    assert serve.returncode == 128 + signal.SIGTERM, err
    refused = [details for code, details in outcomes if code != "OK"]
    assert len(outcomes) == len(sizes) and len(refused) >= 3
    for details in refused:
        assert details.startswith("a response of") and folder.name in details, details
    # Each refusal is for memory: no 2 GB response fits with its copy in 3 GiB.
    assert sum(1 for code, _ in outcomes if code == "RESOURCE_EXHAUSTED") == len(refused)


@pytest.mark.netns  # root: makes a memory cgroup
def test_a_replay_inside_a_memory_cgroup_refuses_messages_that_do_not_fit_it(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "large.tfgbtrace"
    trace_files.write_trace(make_trace(steps=1, workers=1, ps=1, sizes=(400_000_000,)), trace)
    with memory_cgroup(768 * MIB) as (prefix, folder):
        completed = subprocess.run(
            [*prefix, CLI, "replay", str(trace), "--benchmark", "p2p-bandwidth", "--runs", "1",
             "--output-dir", str(tmp_path / "out"), "--quiet"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert _oom_kills(folder) == 0
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.count("\n") == 1, completed.stderr
    assert "bounded by its memory cgroup" in completed.stderr and folder.name in completed.stderr
