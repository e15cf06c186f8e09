"""Does scaling a trace's compute by the calibrations predict training on another machine?

A trace keeps its capture machine's compute; ``--compute here`` (and ``auto``,
the default, when the trace names another machine) scales it by this
machine's local training step over the one the trace records
(``tf_grpc_bench.calibration``).  This script checks that against real
training, in one run (root: it builds network namespaces and a cgroup):

1. trains ResNet-50 (tf2-ps, 2 ps on one emulated host, chief and 2 workers on
   another) on each link profile on this machine, and takes training's step:
   the median steady round of ``capture --network PROFILE``;
2. makes "another, slower machine" out of this one: a CPU cgroup capping its
   processes at ``--cores`` of this machine's CPU time, and captures the same
   job on loopback inside it (its calibration measured inside it too, in a
   cache of its own);
3. replays that trace across each link (``network compare``) three ways:
   ``--compute recorded`` (the slow machine's compute kept), ``--compute here``
   (scaled to this machine by the two calibrations), and, for the done-when of
   issue 9, the shipped ``resnet50-tf2ps`` with no flag at all;
4. writes the predicted step over training's into the ``## Compute calibration``
   section of ``bench/README.md``.

Usage: ``sudo .venv/bin/python bench/calibration.py [--profiles 1gbit,5gbit]
[--cores 1.2] [--steps 8] [--no-readme]`` (needs the profiler extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import (
    README,
    calibration_cache,
    command_line,
    cpu_cgroup,
    load_average,
    machine_line,
    table_head,
    table_row,
    write_section,
)
from fidelity import Prediction, predict
from training import capture, link_bound_seconds, round_seconds

from tf_grpc_bench import host, lifetime, trace_files

SECTION = "## Compute calibration: a trace from a slower machine"
MODEL = "resnet50"


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    profile: str
    training_s: float
    link_bound_s: float | None
    kept: Prediction | None
    scaled: Prediction | None
    shipped: Prediction | None


def capture_slowed(prefix: list[str], steps: int, output: Path, cache: Path) -> None:
    with calibration_cache(cache):
        capture(MODEL, "tf2-ps", steps, output, None, prefix=tuple(prefix))


def _scale(prediction: Prediction | None) -> str:
    if prediction is None:
        return "-"
    benchmark = json.loads(prediction.document.read_text())["benchmarks"][0]
    return str(benchmark["parameters"].get("compute_calibration", "-"))


def measure(profiles: list[str], cores: float, steps: int, scratch: Path) -> list[Row]:
    slow_trace = scratch / "slow-loopback.tfgbtrace"
    with cpu_cgroup(cores) as prefix:
        capture_slowed(prefix, steps, slow_trace, scratch / "slow-calibrations.json")
    shipped = trace_files.shipped_trace_path("resnet50-tf2ps")
    rows = []
    # This machine's calibration measured now, not taken from an older cache.
    with calibration_cache(scratch / "calibrations.json"):
        for profile in profiles:
            trained = capture(MODEL, "tf2-ps", steps, scratch / f"{profile}.tfgbtrace", profile)
            rows.append(
                Row(
                    profile=profile,
                    training_s=round_seconds(trained),
                    link_bound_s=link_bound_seconds(trained, profile),
                    kept=predict(
                        slow_trace, profile, scratch / f"{profile}-kept",
                        extra=("--compute", "recorded"),
                    ),
                    scaled=predict(
                        slow_trace, profile, scratch / f"{profile}-here",
                        extra=("--compute", "here"),
                    ),
                    shipped=predict(shipped, profile, scratch / f"{profile}-shipped"),
                )
            )  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _cells(prediction: Prediction | None, training_s: float) -> list[str]:
    """The predicted step (with the compute on its critical path) and its ratio to training."""
    if prediction is None:
        return ["failed", "-"]
    step = f"{prediction.step_s:.2f} s ({prediction.compute_s:.2f} s)"
    return [step, f"{prediction.step_s / training_s:.2f}"]


def report(rows: list[Row], cores: float, command: str, before: str, after: str) -> str:
    shipped = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps"))
    lines = [
        SECTION,
        "",
        f"`{command}`",
        "",
        machine_line(before, after),
        "",
        "Training: ResNet-50 tf2-ps (2 ps on one emulated host, chief and 2 workers on another),",
        "median steady round captured on the link, on this machine. 'Slower machine': the same",
        f"job captured on loopback inside a CPU cgroup capped at {cores:g} of this machine's",
        "2 CPUs, its calibration timed inside it. Its replay across the link (network compare,",
        "dependencies pacing) keeps its compute ('recorded') or scales it to this machine by the",
        "two calibrations ('here'). 'Shipped': `network compare resnet50-tf2ps --profiles P",
        "--benchmark ps-throughput`, no other flag (the shipped trace, captured on",
        f"{host.captured_on(shipped.metadata.extra) or '?'}). In brackets: the",
        "compute on the predicted round's critical path (`statistics.prediction.compute_ns`).",
        "",
        *table_head(
            "link", "training round", "link bound", "slower, recorded", "ratio",
            "slower, here", "ratio", "shipped, default", "ratio",
        ),
    ]  # fmt: skip
    for row in rows:
        bound = "-" if row.link_bound_s is None else f"{row.link_bound_s:.2f} s"
        lines.append(
            table_row(
                row.profile,
                f"{row.training_s:.2f} s",
                bound,
                *_cells(row.kept, row.training_s),
                *_cells(row.scaled, row.training_s),
                *_cells(row.shipped, row.training_s),
            )
        )
    scales = {_scale(row.scaled) for row in rows} | {_scale(row.shipped) for row in rows}
    lines += ["", "The replays' `compute_calibration` (none: not scaled):", ""]
    lines += [f"- {scale}" for scale in sorted(scales - {"-"})] or ["- none"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", default="1gbit,5gbit")
    parser.add_argument("--cores", type=float, default=1.2, help="the slower machine's CPUs")
    parser.add_argument("--steps", type=int, default=8, help="steady rounds per capture")
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    command = command_line("bench/calibration.py", sys.argv[1:])
    with (
        lifetime.interrupt_on_signals(),
        tempfile.TemporaryDirectory(prefix="tfgb-calibration-") as scratch,
    ):
        before = load_average()
        rows = measure(args.profiles.split(","), args.cores, args.steps, Path(scratch))
        body = report(rows, args.cores, command, before, load_average())
        print(body)
        if not args.no_readme:
            write_section(README, SECTION, body)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        signum = lifetime.signal_of(stopped)
        print(f"calibration: interrupted ({lifetime.signal_name(signum)})", file=sys.stderr)
        sys.exit(lifetime.exit_status(signum))
