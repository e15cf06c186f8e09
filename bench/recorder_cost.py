"""What the in-process recorder costs a task, counted rather than timed.

The recorder (``profiler/recorders/wiretap.c``) is loaded into every task of a
capture and does its work on the tasks' own sending threads.  Its cost is
small next to a training step, too small to see through wall-clock time on a
shared machine, so this script counts it: a program (``bench/recorder_cost.c``)
sends one training round's gRPC responses (the message sizes of a trace's
middle step, HTTP/2 DATA frames of 16 KB as gRPC lays them out) over a loopback
TCP connection, with and without the recorder preloaded, and

* ``valgrind --tool=callgrind`` counts the instructions each way: the
  difference is the recorder's user-space work per round, per send call and
  per MB sent;
* ``perf stat`` (software events: they need no hardware counters) counts the
  system calls and page faults each way: what the recorder adds in the kernel
  (its record file is a shared mapping, so a new page of records is a fault).

Each chunk size is how many bytes one ``sendmsg`` call passes: a whole
write on loopback (1 MB), a few KB on a shaped link, where the socket's
buffer drains at the link's rate and gRPC sends as room frees up.  A task's
send calls per round on a link are in the ``Capture overhead`` section's
tables (``bench/capture_overhead.py`` counts them in the record files).

Usage: ``.venv/bin/python bench/recorder_cost.py [--trace resnet50-tf2ps]
[--chunks 1048576,65536,16384,4096] [--no-readme]`` (needs ``valgrind``,
``perf`` optional, and a C compiler).  Counts do not depend on the machine's
load; the figures go into the ``## Recorder cost`` section of bench/README.md.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import (
    README,
    command_line,
    free_port,
    load_average,
    machine_line,
    table_head,
    table_row,
    write_section,
)

from tf_grpc_bench import trace_files
from tf_grpc_bench.profiler.recorders import wiretap

SECTION = "## Recorder cost"
HARNESS_SOURCE = Path(__file__).with_name("recorder_cost.c")
DEFAULT_CHUNKS = (1 << 20, 1 << 16, 1 << 14, 1 << 12)


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    """One run of the harness: instructions (callgrind), and the kernel's counts (perf)."""

    instructions: int
    send_calls: int
    sent_bytes: int
    syscalls: int | None
    page_faults: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    chunk: int
    bare: Counts
    recorded: Counts

    @property
    def instructions(self) -> int:
        return self.recorded.instructions - self.bare.instructions


def round_sizes(trace_name: str) -> list[int]:
    """The larger message of every call of the trace's middle step: one round's messages."""
    path = Path(trace_name)
    trace = trace_files.read_trace(
        path if path.exists() else trace_files.shipped_trace_path(trace_name)
    )
    step = trace.steps[len(trace.steps) // 2]
    return [max(rpc.request_bytes, rpc.response_bytes) for rpc in step.rpcs]


def _environment(library: Path | None, records: Path, port: int) -> dict[str, str]:
    import os

    environment = dict(os.environ)
    if library is not None:
        environment.update(
            wiretap.recorder_environment({}, library=library, directory=records, ports=[port])
        )
    return environment


def run_counted(
    harness: Path, sizes: Path, chunk: int, library: Path | None, scratch: Path
) -> Counts:
    """The harness's instructions under callgrind, and its system calls and page faults
    under perf (None without perf), sending one round in ``chunk``-byte send calls."""
    records = scratch / "records"
    shutil.rmtree(records, ignore_errors=True)
    records.mkdir()
    port = free_port()
    arguments = [str(harness), str(port), str(sizes), str(chunk), "1"]
    callgrind = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={scratch / 'callgrind.out'}",
         *arguments],
        env=_environment(library, records, port), capture_output=True, text=True, check=True,
    )  # fmt: skip
    instructions = int(re.search(r"refs:\s+([\d,]+)", callgrind.stderr)[1].replace(",", ""))  # type: ignore[index]
    sent, calls, _ = (int(word) for word in callgrind.stdout.split())
    syscalls = faults = None
    if shutil.which("perf"):
        shutil.rmtree(records, ignore_errors=True)
        records.mkdir()
        port = free_port()
        arguments[1] = str(port)
        perf = subprocess.run(
            ["perf", "stat", "-x,", "-e",
             "raw_syscalls:sys_enter,syscalls:sys_enter_read,page-faults", *arguments],
            env=_environment(library, records, port), capture_output=True, text=True, check=False,
        )  # fmt: skip
        found = {line.split(",")[2]: line.split(",")[0] for line in perf.stderr.splitlines()
                 if line.count(",") >= 2}  # fmt: skip
        if found.get("raw_syscalls:sys_enter", "").isdigit():
            # The draining thread's reads vary with the timing: left out.
            syscalls = int(found["raw_syscalls:sys_enter"]) - int(found["syscalls:sys_enter_read"])
            faults = int(found["page-faults"])
    shutil.rmtree(records, ignore_errors=True)
    return Counts(
        instructions=instructions,
        send_calls=calls,
        sent_bytes=sent,
        syscalls=syscalls,
        page_faults=faults,
    )


def measure(trace_name: str, chunks: list[int], scratch: Path) -> list[Row]:
    harness = scratch / "recorder_cost"
    subprocess.run(["cc", "-O2", "-pthread", "-o", str(harness), str(HARNESS_SOURCE)], check=True)
    library = wiretap.build_library()
    sizes = scratch / "sizes.txt"
    sizes.write_text("".join(f"{size}\n" for size in round_sizes(trace_name)))
    rows = []
    for chunk in chunks:
        bare = run_counted(harness, sizes, chunk, None, scratch)
        recorded = run_counted(harness, sizes, chunk, library, scratch)
        rows.append(Row(chunk=chunk, bare=bare, recorded=recorded))
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _difference(recorded: int | None, bare: int | None) -> str:
    return "-" if recorded is None or bare is None else f"{recorded - bare:+,}"


def report(rows: list[Row], trace_name: str, command: str, before: str, after: str) -> str:
    first = rows[0].bare
    lines = [
        SECTION,
        "",
        f"`{command}`",
        "",
        machine_line(before, after),
        "",
        f"One round of `{trace_name}` ({len(round_sizes(trace_name)):,} messages, "
        f"{first.sent_bytes / 1e6:,.0f} MB with HTTP/2 and gRPC framing) sent by one process "
        "over loopback TCP as gRPC lays it out (`bench/recorder_cost.c`), without and with the "
        "recorder preloaded; 'chunk': the bytes one sendmsg call passes (a whole write on "
        "loopback, a few KB on a shaped link). The recorder's instructions (callgrind, with "
        "less without) and what it adds in the kernel (perf's software events: system calls but "
        "the draining thread's reads; a page fault is "
        "a new page of its record file). Counts, not times: the load does not change them.",
        "",
        *table_head(
            "chunk", "send calls", "recorder instructions", "per send call", "per MB",
            "system calls added", "page faults added",
        ),
    ]  # fmt: skip
    for row in rows:
        calls = row.recorded.send_calls
        lines.append(
            table_row(
                f"{row.chunk:,} B",
                f"{calls:,}",
                f"{row.instructions:,}",
                f"{row.instructions / calls:,.0f}",
                f"{row.instructions / (row.recorded.sent_bytes / 1e6):,.0f}",
                _difference(row.recorded.syscalls, row.bare.syscalls),
                _difference(row.recorded.page_faults, row.bare.page_faults),
            )
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default="resnet50-tf2ps", help="shipped trace name or file")
    parser.add_argument(
        "--chunks",
        default=",".join(str(chunk) for chunk in DEFAULT_CHUNKS),
        help="bytes per sendmsg call, comma-separated",
    )
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("needs valgrind (apt-get install -y valgrind)")
    chunks = [int(chunk) for chunk in args.chunks.split(",") if chunk.strip()]
    command = command_line("bench/recorder_cost.py", sys.argv[1:])
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="tfgb-recorder-cost-") as scratch:
        rows = measure(args.trace, chunks, Path(scratch))
    body = report(rows, args.trace, command, before, load_average())
    print(body)
    if not args.no_readme:
        write_section(README, SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
