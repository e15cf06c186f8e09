"""The in-process recorder's cost on a task's send path: no system call of its own per send,
and a record of every byte (bench/recorder_cost.c sends a trace's round as gRPC lays it out)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import load_bench_script
from tf_grpc_bench.profiler.launch.ports import free_ports
from tf_grpc_bench.profiler.recorders.calls import Direction
from tf_grpc_bench.profiler.recorders.tapcalls import replay_sends
from tf_grpc_bench.profiler.recorders.tapfile import read_tap_file
from tf_grpc_bench.profiler.recorders.wiretap import build_library, recorder_environment

HARNESS = Path(__file__).resolve().parent.parent / "bench" / "recorder_cost.c"
#: Messages of a round: small control tensors, a 1 MB tensor and a 9.4 MB one.
SIZES = (16, 195, 28_161, 1_048_615, 9_437_225) * 4


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("harness") / "recorder_cost"
    subprocess.run(["cc", "-O2", "-pthread", "-o", str(built), str(HARNESS)], check=True)
    return built


def _run(harness: Path, tmp_path: Path, chunk: int, *, recorded: bool) -> tuple[int, int, Path]:
    """(send calls, system calls strace counted, the records' folder) of one round."""
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("".join(f"{size}\n" for size in SIZES))
    records = tmp_path / ("records" if recorded else "bare")
    records.mkdir()
    (port,) = free_ports(1)
    environment = {"PATH": "/usr/bin:/bin"}
    if recorded:
        environment = recorder_environment(
            environment, library=build_library(), directory=records, ports=[port]
        )
    counted = tmp_path / f"strace-{recorded}.txt"
    completed = subprocess.run(
        # The draining thread's reads vary with the timing: left out.
        ["strace", "-f", "-c", "-e", "trace=!read", "-o", str(counted), str(harness), str(port),
         str(sizes), str(chunk), "1"],
        env=environment, capture_output=True, text=True, check=True,
    )  # fmt: skip
    sent, calls, _ = (int(word) for word in completed.stdout.split())
    assert sent > sum(SIZES)
    total = re.search(r"^100\.00\s+\S+\s+\S+\s+(\d+)", counted.read_text(), re.MULTILINE)
    assert total is not None, counted.read_text()
    return calls, int(total[1]), records


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize("chunk", [16_384, 4_096])
def test_the_recorder_makes_no_system_call_per_send(
    harness: Path, tmp_path: Path, chunk: int
) -> None:
    calls, bare, _ = _run(harness, tmp_path, chunk, recorded=False)
    recorded_calls, recorded, records = _run(harness, tmp_path, chunk, recorded=True)
    assert recorded_calls == calls > 1000
    # Opening its record file and looking at the socket once: a few dozen calls in all,
    # however many sends (a getpid() per send once doubled a shaped link's system calls).
    assert bare >= calls
    assert recorded - bare < 50, (bare, recorded, calls)
    # And every byte is accounted for: the follower agrees with the library's records.
    (path,) = records.glob("tap-*.bin")
    tap = read_tap_file(path)
    (connection,) = tap.connections
    direction = Direction(client_side=False)
    replay_sends(direction.new_follower(tap.head_bytes), tap.sends[connection.number])
    assert not direction.error
    assert tap.sent_bytes - tap.skipped_bytes < 30_000 + len(SIZES) * 1100


def test_the_recorder_cost_bench_reads_a_rounds_messages() -> None:
    bench = load_bench_script("recorder_cost.py", "bench_recorder_cost")
    sizes = bench.round_sizes("resnet50-tf2ps")
    assert len(sizes) > 1000 and sum(sizes) > 400_000_000
