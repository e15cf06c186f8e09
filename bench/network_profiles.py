"""Is the link emulation real?  iperf3 and our replay at every profile, as ratios to the rate.

For each link profile (default: 1gbit, 10gbit, 25gbit, 40gbit, unlimited) this
brings up two emulated hosts (``tf_grpc_bench.netns``) and measures,
one after the other on the same link:

1. iperf3, one TCP stream from host 1 to host 0 (``iperf3 -c -J``), as a ratio
   to the profile's rate;
2. our P2P bandwidth: ``tf-grpc-bench serve`` in host 0, ``tf-grpc-bench replay
   --synthetic --benchmark p2p-bandwidth`` (1 MiB messages) in host 1, as a
   ratio to the rate and to iperf3's figure on the same link;
3. PS-throughput replay of a trace (``--trace``, default: a synthetic trace this
   script writes, one worker and one ps, see ``SYNTHETIC_TENSORS``): replayed
   step time, next to the least time the link allows for a step, bytes on the
   busier direction x 8 / rate.  Servers and clients are placed as ``network
   compare`` places them (a trace's stand-ins in host 1, its ps side client in
   host 0).

Then it rewrites the "Emulated networks" section of ``bench/README.md`` with
the command, the machine, the figures and the ratios.  Only figures measured in
this run are written.  Needs root (namespaces) and iperf3 (``apt-get install -y
iperf3``); a missing iperf3 leaves its column out.

Run from the repository root::

    .venv/bin/python bench/network_profiles.py                 # ~1 minute per profile
    .venv/bin/python bench/network_profiles.py --profiles 1gbit --seconds 2 --no-readme
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    MIB,
    README,
    command_line,
    iperf3_client_command,
    iperf3_received_bits_per_s,
    iperf3_server_command,
    table_head,
    tf_grpc_bench_command,
    write_section,
)

from tf_grpc_bench import trace as trace_model
from tf_grpc_bench import trace_files
from tf_grpc_bench.netns import emulated, links, namespaces
from tf_grpc_bench.replay.core.benchmarks import trace_workload
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.network import compare as network_compare
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.machine import probe_machine
from tf_grpc_bench.trace import RECV_TENSOR, Rpc, RunMetadata, Step, Task, TensorInfo, Trace

SECTION = "## Emulated networks"
IPERF_PORT = 5201
#: The synthetic trace's tensors per step, pulled by the worker from the ps: a
#: mix like a convolutional network's (few large, many small), 24.6 MiB a step.
SYNTHETIC_TENSORS = (
    9 * MIB,
    4 * MIB,
    4 * MIB,
    2 * MIB,
    *([MIB] * 4),
    *([64 << 10] * 40),
    *([21] * 20),
)


def synthetic_trace(steps: int = 4) -> Trace:
    """A one-worker, one-ps trace pulling ``SYNTHETIC_TENSORS`` every step (made, not captured)."""
    tasks = (Task(job="ps", index=0, address="ps:0"), Task(job="worker", index=0, address="w:0"))
    step_list, clock = [], 1_000_000
    for index in range(steps):
        begin, rpcs = clock, []
        for n, size in enumerate(SYNTHETIC_TENSORS):
            rpcs.append(
                Rpc(
                    method=RECV_TENSOR,
                    caller_task=1,
                    callee_task=0,
                    request_bytes=120,
                    response_bytes=size,
                    start_ns=clock,
                    response_start_ns=clock + 500,
                    end_ns=clock + 1000,
                    tensor=TensorInfo(
                        rendezvous_key=f"/job:ps/replica:0/task:0/device:CPU:0;1;"
                        f"/job:worker/replica:0/task:0/device:CPU:0;edge_{n}_t;0:0",
                        dtype="float32",
                        shape=(size // 4,),
                        content_bytes=size,
                    ),
                )
            )
            clock += 2000
        step_list.append(
            Step(index=index, start_ns=begin, end_ns=clock, rpcs=trace_model.with_outstanding(rpcs))
        )
        clock += 10_000
    return Trace(
        metadata=RunMetadata(
            model="synthetic-24.6MiB",
            strategy="synthetic",
            batch_size=1,
            input_shape=(1,),
            capture_method="synthetic (bench/network_profiles.py)",
            command=("bench/network_profiles.py",),
        ),
        tasks=tasks,
        steps=tuple(step_list),
    )


@dataclass
class ProfileFigures:
    profile: links.LinkProfile
    iperf3_bits_per_s: float | None = None
    replay_bits_per_s: float | None = None
    step_time_s: float | None = None
    step_bytes_busier_direction: int = 0
    note: str = ""


def measure_iperf3(network: emulated.EmulatedNetwork, seconds: float) -> float | None:
    if shutil.which("iperf3") is None:
        return None
    server = network.spawn(0, iperf3_server_command(IPERF_PORT), stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    client = network.run(
        1,
        iperf3_client_command(network.hosts[0].address, IPERF_PORT, seconds),
        timeout_s=seconds + 60,
    )
    server.wait(timeout=30)
    if client.returncode != 0:
        raise RuntimeError(f"iperf3 failed: {client.stdout[-300:]} {client.stderr[-300:]}")
    return iperf3_received_bits_per_s(json.loads(client.stdout))


def replay_in(
    network: emulated.EmulatedNetwork,
    arguments: list[str],
    output: Path,
    timeout_s: float,
    layout: network_compare.HostLayout = network_compare.ONE_PS,
) -> results.ResultDocument:
    # The servers and clients on network compare's hosts: the ps servers (one process
    # per ps task) in host 0, a trace's stand-ins in host 1 and its ps side client in
    # host 0, the rest of the replay in host 1.
    targets, servers = network_compare.start_servers(network, layout, [], timeout_s=60)
    try:
        replay = network.run(
            1,
            tf_grpc_bench_command(
                "replay",
                *arguments,
                *network_compare.client_placement(network, layout),
                "--target",
                ",".join(targets),
                "--network-name",
                network.profile.name,
                "--output-dir",
                str(output),
                "--quiet",
            ),
            timeout_s=timeout_s,
        )
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
    match = re.search(r"^results:\s+(\S+)", replay.stdout, re.MULTILINE)
    if replay.returncode != 0 or not match:
        raise RuntimeError(f"replay failed: {replay.stderr.strip()[-400:]}")
    return read_document(match.group(1))


def measure_profile(
    profile: links.LinkProfile, *, seconds: float, trace_path: Path, output: Path
) -> ProfileFigures:
    figures = ProfileFigures(profile=profile)
    with emulated.EmulatedNetwork(hosts=2, profile=profile) as network:
        figures.iperf3_bits_per_s = measure_iperf3(network, seconds)
        bandwidth = replay_in(
            network,
            [
                "--synthetic",
                "--benchmark",
                "p2p-bandwidth",
                "--categories",
                "large",
                "--buffers",
                "1",
                "--warmup",
                "1",
                "--duration",
                f"{seconds:g}",
                "--runs",
                "1",
            ],
            output / profile.name,
            timeout_s=seconds * 4 + 120,
        )
        (result,) = bandwidth.benchmarks
        figures.replay_bits_per_s = result.bytes_per_s * 8
        steps = replay_in(
            network,
            [
                str(trace_path),
                "--benchmark",
                "ps-throughput",
                # Communication only, as fast as possible: compared with the link's bound.
                "--pacing",
                "asap",
                "--warmup",
                "1",
                "--passes",
                "3",
                "--runs",
                "1",
            ],
            output / profile.name,
            timeout_s=600,
            layout=network_compare.host_layout(
                [
                    trace_workload(
                        trace_files.read_trace(trace_path),
                        Benchmark.PS_THROUGHPUT,
                        mode=Mode.NON_SERIALIZED,
                    )
                ]
            ),
        )
        (throughput,) = steps.benchmarks
        assert throughput.benchmark is Benchmark.PS_THROUGHPUT
        figures.step_time_s = throughput.step_time.mean_ns / 1e9
        # iperf3 again after the replays: the better of the two, as other
        # processes share the CPUs and a single figure can be cut by them.
        again = measure_iperf3(network, seconds)
        if again is not None and figures.iperf3_bits_per_s is not None:
            figures.iperf3_bits_per_s = max(figures.iperf3_bits_per_s, again)
    figures.step_bytes_busier_direction = busier_direction_bytes(trace_files.read_trace(trace_path))
    return figures


def busier_direction_bytes(trace: Trace) -> int:
    """Bytes of the trace's first step on the busier direction of the ps host's link.

    The ps servers run in host 0 and the workers in host 1, as the replay maps
    them: a call served by a ps sends its request up (worker -> ps) and its
    response down; a call made by a ps (a ps pulling a gradient from a worker,
    replayed as that worker pushing it) moves its response up and its request
    down.  Calls between two ps or two non-ps tasks are not replayed.
    """
    ps_tasks = set(trace.tasks_of_job("ps"))
    down = up = 0
    for rpc in trace.steps[0].rpcs:
        if rpc.callee_task in ps_tasks and rpc.caller_task not in ps_tasks:
            down += rpc.response_bytes
            up += rpc.request_bytes
        elif rpc.caller_task in ps_tasks and rpc.callee_task not in ps_tasks:
            up += rpc.response_bytes
            down += rpc.request_bytes
    return max(down, up)


def _ratio(value: float | None, rate: int | None) -> str:
    if value is None or rate is None:
        return "-"
    return f"{value / rate:.2f}"


def _gbit(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.2f}"


def render(figures: list[ProfileFigures], command: str, seconds: float, trace_name: str) -> str:
    machine = probe_machine()
    lines = [
        SECTION,
        "",
        "(written by `bench/network_profiles.py`)",
        "",
        f"Command: `{command}`, run as root on {machine.cpu_count} CPUs ({machine.cpu_model}), "
        f"kernel {machine.kernel}, at {results.utc_timestamp()}; load average before the run "
        f"{os.getloadavg()[0]:.2f}. Two emulated hosts per profile (network namespaces, one veth "
        f"pair, tbf on both ends; see docs/networks.md). iperf3: one TCP stream for {seconds:g} s, "
        "before and after the replays, the better of the two. "
        "Replay P2P bandwidth: `replay --synthetic --benchmark p2p-bandwidth --categories large "
        f"--buffers 1` (1 MiB messages, raw bytes, one in flight), 1 s warm-up, {seconds:g} s. "
        f"Step time: `replay {trace_name} --benchmark ps-throughput --pacing asap --passes 3`, "
        "mean replayed "
        "step time; the bound is the step's bytes on the busier direction x 8 / rate.",
        "",
        *table_head(
            "profile",
            "rate Gbit/s",
            "iperf3 Gbit/s",
            "iperf3 / rate",
            "replay P2P Gbit/s",
            "replay / rate",
            "replay / iperf3",
            "step ms",
            "bound ms",
            "step / bound",
        ),
    ]
    for f in figures:
        rate = f.profile.rate_bits_per_s
        bound_s = None if rate is None else f.step_bytes_busier_direction * 8 / rate
        replay_vs_iperf = (
            f"{f.replay_bits_per_s / f.iperf3_bits_per_s:.2f}"
            if f.replay_bits_per_s and f.iperf3_bits_per_s
            else "-"
        )
        step_ms = "-" if f.step_time_s is None else f"{f.step_time_s * 1e3:.1f}"
        bound_ms = "-" if bound_s is None else f"{bound_s * 1e3:.1f}"
        step_ratio = (
            "-" if bound_s is None or f.step_time_s is None else f"{f.step_time_s / bound_s:.2f}"
        )
        lines.append(
            f"| {f.profile.name} | {'-' if rate is None else f'{rate / 1e9:g}'} "
            f"| {_gbit(f.iperf3_bits_per_s)} | {_ratio(f.iperf3_bits_per_s, rate)} "
            f"| {_gbit(f.replay_bits_per_s)} | {_ratio(f.replay_bits_per_s, rate)} "
            f"| {replay_vs_iperf} "
            f"| {step_ms} | {bound_ms} | {step_ratio} |"
        )
    notes = [f"- {f.profile.name}: {f.note}" for f in figures if f.note]
    ceiling = max((f.iperf3_bits_per_s or 0.0 for f in figures), default=0.0) or None
    for f in figures:
        rate = f.profile.rate_bits_per_s
        if rate is None or f.iperf3_bits_per_s is None:
            continue
        if f.iperf3_bits_per_s < 0.8 * rate and ceiling is not None and ceiling < rate:
            notes.append(
                f"- {f.profile.name}: the limit does not bind here: no link of this run "
                f"carried more than {ceiling / 1e9:.1f} Gbit/s (iperf3), less than "
                f"{rate / 1e9:g} Gbit/s"
            )
        if f.step_time_s is not None and f.step_bytes_busier_direction:
            bound_s = f.step_bytes_busier_direction * 8 / rate
            ratio = f.step_time_s / bound_s
            kind = (
                "link-bound: the replayed step is within 1.5x of what the link allows"
                if ratio <= 1.5
                else "replay-bound: client and server (sharing the CPUs) take longer than the link"
            )
            notes.append(f"- {f.profile.name}: step time {ratio:.2f} x the link bound, {kind}")
    if notes:
        lines += ["", *notes]
    lines += ["", f"Load average after the run: {os.getloadavg()[0]:.2f}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="1gbit,10gbit,25gbit,40gbit,unlimited")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement (default 5)")
    parser.add_argument(
        "--trace", default=None, help="trace for the step-time rows (default: synthetic)"
    )
    parser.add_argument("--no-readme", action="store_true", help="print only, do not touch README")
    args = parser.parse_args()
    profiles = links.parse_profiles(args.profiles)
    namespaces.require_root()
    with tempfile.TemporaryDirectory(prefix="tfgb-bench-") as scratch:
        if args.trace:
            trace_path = Path(args.trace)
        else:
            trace_path = Path(scratch) / "synthetic.tfgbtrace"
            trace_files.write_trace(synthetic_trace(), trace_path)
        figures = []
        for profile in profiles:
            print(f"{profile.name}: measuring", flush=True)
            try:
                figures.append(
                    measure_profile(
                        profile, seconds=args.seconds, trace_path=trace_path, output=Path(scratch)
                    )
                )
            except RuntimeError as error:
                figures.append(ProfileFigures(profile=profile, note=f"failed: {error}"))
    command = command_line(__file__, sys.argv[1:], python="python")
    text = render(figures, command, args.seconds, args.trace or "<synthetic 24.6 MiB/step trace>")
    print(text)
    for f in figures:
        rate = f.profile.rate_bits_per_s
        print(f"{f.profile.name}: configured {links.format_tc_rate(rate) if rate else 'unlimited'}")
    if not args.no_readme:
        write_section(README, SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
