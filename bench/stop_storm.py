"""Stop role clusters at random moments: does every task end, in one line, leaving nothing?

A launcher (``timeout``, Slurm's ``scancel``, a container runtime) stops every
task of a job at once, at whatever moment it has reached: starting up, waiting
at the barrier, replaying, sending its results.  The suite stops clusters at
one moment each (``tests/test_reliability_faults.py``); a race in a stop path
shows only now and then, so this script repeats it:

1. starts the five tasks of a ``tf-grpc-bench role`` job replaying the shipped
   ``resnet50-tf2ps`` trace in whole steps (chief gathering and running its side
   client, two ps serving, one with a side client, two workers replaying and
   serving stand-ins), on loopback;
2. after a random delay (``--earliest`` to ``--latest`` seconds) sends SIGTERM to
   all five, and waits ``--hang-s`` for each;
3. sorts each task's end: *clean* (exit 143, one line on stderr saying it was
   interrupted), *before start-up* (ended by SIGTERM's default action before the
   command had set its handlers: it had started nothing), *hung* (still running
   after ``--hang-s``: killed with SIGKILL), *noisy* (exit 143 but more than one
   line on stderr; the first extra line is kept) or *other*; and checks that every
   process of the job is gone 10 s after the last task ended (*left behind*);
4. repeats ``--rounds`` times, with ``--busy`` busy loops beside it (a shared
   machine), prints a table and rewrites the "Reliability: role clusters
   stopped at random moments" section of ``bench/README.md``.

Usage: ``.venv/bin/python bench/stop_storm.py [--rounds 40] [--busy 1] [--no-readme]``
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import (
    README,
    command_line,
    free_port,
    load_average,
    machine_line,
    stop_process,
    table_head,
    table_row,
    tf_grpc_bench_command,
    write_section,
)

from tf_grpc_bench import host

TASKS = ("chief:0", "ps:0", "ps:1", "worker:0", "worker:1")
HEADING = "## Reliability: role clusters stopped at random moments"
OUTCOMES = ("clean", "before start-up", "hung", "noisy", "other")


def _parents() -> dict[int, int]:
    """Every process's parent (one read of /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = host.process_stat_fields(int(entry.name))
            if fields is not None:
                parents[int(entry.name)] = int(fields[1])
    return parents


def _descendants(pids: set[int]) -> set[int]:
    parents = _parents()
    found: set[int] = set()
    frontier = set(pids)
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    fields = host.process_stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _outcome(code: int | None, stderr: str) -> tuple[str, str]:
    """The task's end (one of OUTCOMES) and, for a noisy or other one, what it said."""
    lines = stderr.splitlines()
    if code == 128 + signal.SIGTERM and len(lines) == 1 and "interrupted (SIGTERM)" in lines[0]:
        return "clean", ""
    if code == -signal.SIGTERM and not lines:
        return "before start-up", ""
    if code == 128 + signal.SIGTERM:
        extra = next((line for line in lines if "interrupted (SIGTERM)" not in line), "")
        return "noisy", extra.strip()[:160]
    return "other", f"exit {code}: {(lines or [''])[-1].strip()[:160]}"


def _round(
    rng: random.Random, earliest: float, latest: float, hang_s: float
) -> list[tuple[str, str, str]]:
    """One cluster stopped at a random moment: (task, outcome, remark) per task, plus
    ("job", "left behind", pids) when processes of it outlived the tasks."""
    ports = [free_port() for _ in TASKS]
    cluster = {
        "chief": [f"localhost:{ports[0]}"],
        "ps": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"],
        "worker": [f"localhost:{ports[3]}", f"localhost:{ports[4]}"],
    }
    flags = [
        "--cluster", json.dumps(cluster), "resnet50-tf2ps", "--warmup", "0", "--runs", "2",
        "--quiet", "--output-dir", "out", "--benchmark", "ps-throughput", "--duration", "60",
    ]  # fmt: skip
    results: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="stop-storm-") as work:
        processes = {
            task: subprocess.Popen(
                tf_grpc_bench_command("role", "--task", task, *flags),
                cwd=work,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for task in TASKS
        }
        try:
            time.sleep(rng.uniform(earliest, latest))
            job = set(p.pid for p in processes.values())
            job |= _descendants(job)
            for process in processes.values():
                process.send_signal(signal.SIGTERM)
            for task, process in processes.items():
                try:
                    _, stderr = process.communicate(timeout=hang_s)
                    results.append((task, *_outcome(process.returncode, stderr)))
                except subprocess.TimeoutExpired:
                    results.append((task, "hung", f"still running {hang_s:g} s after SIGTERM"))
                    process.kill()
                    process.communicate()
            deadline = time.monotonic() + 10
            while any(_alive(pid) for pid in job) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = sorted(pid for pid in job if _alive(pid))
            if left:
                results.append(("job", "left behind", " ".join(map(str, left))))
        finally:
            for process in processes.values():
                stop_process(process)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--busy", type=int, default=1, help="busy loops running beside it")
    parser.add_argument("--earliest", type=float, default=1.5, help="earliest stop (s after start)")
    parser.add_argument("--latest", type=float, default=9.0, help="latest stop (s after start)")
    parser.add_argument(
        "--hang-s",
        type=float,
        default=60.0,
        help="a task still running this long after SIGTERM hung",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    load_before = load_average()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    counts: Counter[str] = Counter()
    remarks: list[str] = []
    rounds_done = 0
    try:
        for index in range(args.rounds):
            for task, outcome, remark in _round(rng, args.earliest, args.latest, args.hang_s):
                counts[outcome] += 1
                if remark:
                    remarks.append(f"round {index}, {task}: {outcome}: {remark}")
                    print(remarks[-1], flush=True)
            rounds_done += 1
            print(f"round {index}: {dict(counts)}", flush=True)
    except KeyboardInterrupt:
        print(f"stopped after {rounds_done} rounds", file=sys.stderr)
    finally:
        for process in busy:
            stop_process(process)
    load_after = load_average()
    arguments = sys.argv[1:]
    rows = [table_row(outcome, str(counts[outcome])) for outcome in (*OUTCOMES, "left behind")]
    body = "\n".join(
        [
            HEADING,
            "",
            f"`{command_line(__file__, arguments)}`",
            "",
            machine_line(load_before, load_after),
            "",
            f"{rounds_done} clusters of five `role` tasks (the shipped `resnet50-tf2ps` in whole "
            f"steps), each stopped with SIGTERM to every task {args.earliest:g} to "
            f"{args.latest:g} s after its start, {args.busy} busy loop(s) beside them "
            f"({len(TASKS) * rounds_done} task ends). 'before start-up': ended by SIGTERM's "
            "default action before the command set its handlers (it had started "
            "nothing); 'left behind': a process of the job alive 10 s after its tasks ended.",
            "",
            *table_head("task end", "count"),
            *rows,
            "",
            *(
                [f"- {remark}" for remark in remarks]
                or ["No remark: every task ended clean or before start-up."]
            ),
        ]
    )
    print(body)
    if not args.no_readme:
        write_section(README, HEADING, body)
    return 0 if rounds_done == args.rounds else 130


if __name__ == "__main__":
    sys.exit(main())
