"""Capture overhead: the same training job with capture on and off, side by side.

Runs real distributed training jobs (the launcher's, by default ResNet-50
under TF2 ParameterServerStrategy, 1 ps + 2 workers, batch 4, 32x32) several
times, alternating without capture (``off``: tasks dial each other directly,
nothing loaded) and with each recorder of ``tf-grpc-bench capture`` (the
capture path itself, trace written).  Each repetition runs every variant once,
in a rotating order so that none always runs first or last.  Compared: the
median steady-state step time (from the launcher's step markers) with each
variant over the median without capture, paired per repetition.

Variants (``--variants``):

``preload``
    the in-process recorder (``--recorder preload``, the default): a library
    loaded into every task records what the task sends; tasks dial each other
    directly;
``splice``
    the proxy as shipped: frame and message headers read in Python, the bulk
    of every DATA payload moved socket -> pipe -> socket with ``os.splice``,
    TCP congestion control cubic on the proxy's sockets;
``splice-system-cc``
    the same with the system's default congestion control (BBR here);
``copy``
    the same follower, but every byte read into Python and written back;
``forward``
    splice forwarding with no recording at all: the cost of the extra TCP hop
    alone, as a floor for the others.

Also reported per variant: the CPU time this process (proxies and
orchestrator; the in-process recorder's work is in the tasks, so it shows only
in their step time) used per steady step, bytes recorded and the share never
copied into the recorder (spliced by the proxy, counted only by the library).
Then the "Capture overhead" section of ``bench/README.md`` is rewritten with
the command, the machine, the load and the figures (only figures from this
run).

Run from the repository root::

    .venv/bin/python bench/capture_overhead.py --models resnet50,vgg16   # ~15 min on 2 cores
    .venv/bin/python bench/capture_overhead.py --models tiny --repetitions 2 --no-readme
    sudo .venv/bin/python bench/capture_overhead.py --ps 2 --variants preload \
        --network loopback,1gbit,5gbit,10gbit --repetitions 5   # on links too

``--network PROFILES`` runs every job with its tasks on emulated hosts (ps tasks on one,
the others on another, as ``capture --network`` places them) across each link, and
without capture the same way (``profiler.uncaptured``: the launcher's job with no
recorder); the tables then also give each variant's tasks' CPU per step against the
uncaptured run's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import README, command_line, load_average, machine_line, table_head, write_section

from tf_grpc_bench import capture_cpu, lifetime
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.hosts import NetworkRequest
from tf_grpc_bench.profiler.progress import Progress
from tf_grpc_bench.profiler.recorders.tapfile import read_tap_file
from tf_grpc_bench.profiler.training import capture_training
from tf_grpc_bench.profiler.uncaptured import train_uncaptured

SECTION = "## Capture overhead"
OFF = "off"
#: ``--network``'s name for no emulated link: every task on this host's loopback.
LOOPBACK = "loopback"
#: Variant -> (recorder, RecordingProxy options).
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "preload": ("preload", {}),
    "splice": ("proxy", {}),
    "splice-system-cc": ("proxy", {"congestion_control": None}),
    "copy": ("proxy", {"use_splice": False}),
    "forward": ("proxy", {"follow": False}),
}


#: What the variants are, and where their history is (written under the table).
NOTES = (
    "Variants: `preload` is the in-process recorder, `tf-grpc-bench capture`'s default "
    "(a C library preloaded into every task follows HTTP/2 and gRPC framing over what the "
    "task sends, copies frame headers, header blocks, message prefixes and the first KB of "
    "each message into a shared-memory file and only counts the rest; the same follower as "
    "the proxy's parses the records after the run; no second TCP hop). "
    "`splice` is the proxy (`--recorder proxy`) (frame headers, header blocks, gRPC message "
    "prefixes and the first KB of each message read in Python after the chunk is forwarded; the "
    "rest of every DATA payload moved socket -> pipe -> socket with `os.splice`; TCP congestion "
    "control cubic on the proxy's sockets); `splice-system-cc` the same with the system's "
    "congestion control (BBR on this machine); `copy` reads every byte into Python "
    "(`recv_into` a 64 KiB buffer, `sendall` of a memoryview); `forward` splices everything "
    "and records nothing: the cost of the extra TCP hop alone. 'tasks' CPU per step': every "
    "task's CPU (all its processes, from /proc, sampled from outside) over the steady steps, "
    "with its ratio to the uncaptured run's; 'recorded send calls per step': the send calls "
    "in the in-process recorder's files over the steps (start-up included), what its work "
    "per call (bench/README.md, 'Recorder cost') is multiplied by. "
    "The ratio column that counts "
    "is the median of the per-repetition ratios: each repetition runs the job without capture "
    "and with each variant back to back, so that the load of other work on this shared "
    "machine, which moves the step time by tens of percent over minutes, cancels out.",
    "",
    "How the proxy reached this form, and why the in-process recorder became the default: "
    'docs/history.md, "Capture overhead".',
)


@dataclass
class VariantFigures:
    """Everything measured for one variant over all repetitions."""

    name: str
    steps_ms: list[list[float]] = field(default_factory=list)  # per repetition
    cpu_ms_per_step: list[float] = field(default_factory=list)
    #: The job's tasks' CPU per steady step (all tasks, from /proc), per repetition.
    task_cpu_ms_per_step: list[float] = field(default_factory=list)
    #: The in-process recorder's send calls over the run's steps, per repetition.
    send_calls_per_step: list[float] = field(default_factory=list)
    forwarded_bytes: int = 0
    spliced_bytes: int = 0
    physics: str = ""

    @property
    def all_steps_ms(self) -> list[float]:
        return [s for run in self.steps_ms for s in run]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.all_steps_ms)

    def repetition_medians(self) -> list[float]:
        return [statistics.median(run) for run in self.steps_ms]

    def paired_ratios(self, baseline: VariantFigures) -> list[float]:
        """Per repetition: this variant's median step over the capture-off run's of the same
        repetition (run back to back, so slow changes in the machine's load cancel)."""
        return [
            mine / theirs
            for mine, theirs in zip(
                self.repetition_medians(), baseline.repetition_medians(), strict=True
            )
        ]


def recorded_send_calls(workdir: Path) -> int:
    """How many send calls the in-process recorder recorded in ``workdir`` (every task's
    record file): what its per-call work is multiplied by (bench/recorder_cost.py)."""
    total = 0
    for path in workdir.rglob("tap-*.bin"):
        tap = read_tap_file(path)
        total += sum(len(sends) for sends in tap.sends.values())
    return total


def run_without_capture(
    config: TrainingConfig, workdir: Path, figures: VariantFigures, network: NetworkRequest | None
) -> list[float]:
    """The launcher's job with no recorder (``profiler.uncaptured``), on ``network``'s link
    if given; its steady rounds in ms.  Its tasks' CPU per round goes into ``figures``."""
    run = train_uncaptured(config, network=network, workdir=workdir, timeout_s=1800)
    per_task = run.task_cpu_per_round_s()
    if per_task:
        figures.task_cpu_ms_per_step.append(sum(per_task.values()) * 1e3)
    return [d / 1e6 for d in run.rounds_ns]


def run_with_capture(
    config: TrainingConfig,
    workdir: Path,
    variant: str,
    figures: VariantFigures,
    network: NetworkRequest | None = None,
) -> list[float]:
    samples: list[tuple[int, float]] = []
    warmup = config.warmup_steps

    def progress(update: Progress) -> None:
        times = os.times()
        samples.append((update.steps_done, times.user + times.system))

    result = capture_training(
        config,
        workdir / "capture.tfgbtrace",
        command=("bench/capture_overhead.py",),
        workdir=workdir,
        timeout_s=1800,
        progress=progress,
        recorder=VARIANTS[variant][0],
        proxy_options=VARIANTS[variant][1] or None,
        network=network,
    )
    if result.error is not None:
        raise result.error
    cpu = capture_cpu.from_extra(result.trace.metadata.extra)
    if cpu is not None and result.trace.steps:
        seconds = cpu.tasks_cores * cpu.span_ns / 1e9
        figures.task_cpu_ms_per_step.append(seconds * 1e3 / len(result.trace.steps))
    steady = [(n, cpu) for n, cpu in samples if n >= warmup]
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        figures.cpu_ms_per_step.append(
            (steady[-1][1] - steady[0][1]) * 1e3 / (steady[-1][0] - steady[0][0])
        )
    figures.forwarded_bytes += result.recorded_bytes
    figures.spliced_bytes += result.uncopied_bytes
    sends = recorded_send_calls(workdir)
    if sends and result.trace.steps:
        # Every send call of the run (start-up too) over its steps: an upper bound per step.
        figures.send_calls_per_step.append(sends / len(result.trace.steps))
    if variant != "forward":
        from tf_grpc_bench.profiler.physics import check_physics

        report = check_physics(result.trace, result.job_info)
        figures.physics = "OK" if report.ok else "; ".join(report.problems[:2])
    return [s.duration_ns / 1e6 for s in result.trace.steps]


def _format_ms(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values)


@dataclass(frozen=True, slots=True)
class Job:
    """One job measured: its training and the link its tasks run on (None: loopback)."""

    config: TrainingConfig
    network: NetworkRequest | None = None

    @property
    def name(self) -> str:
        link = "loopback" if self.network is None else self.network.profile.name
        return f"{self.config.model}, {link}"


def _cpu_cell(figure: VariantFigures, off: VariantFigures) -> str:
    """The tasks' CPU per step (median over repetitions) and its ratio to the uncaptured."""
    if not figure.task_cpu_ms_per_step:
        return "-"
    mine = statistics.median(figure.task_cpu_ms_per_step)
    if figure is off or not off.task_cpu_ms_per_step:
        return f"{mine:.0f}"
    return f"{mine:.0f} ({mine / statistics.median(off.task_cpu_ms_per_step):.3f}x)"


def _table(job: Job, figures: dict[str, VariantFigures]) -> list[str]:
    config = job.config
    off = figures[OFF]
    where = (
        "on loopback"
        if job.network is None
        else (
            f"across a {job.network.profile.name} link (ps tasks on one emulated host, the other "
            "tasks on another, as `capture --network` places them)"
        )
    )
    lines = [
        f"### {job.name}",
        "",
        f"{config.model} at {config.image_size}x{config.image_size}, {config.setup}, "
        f"{config.ps} ps + {config.workers} workers, batch {config.batch_size}, {where}.",
        "",
        *table_head(
            "variant",
            "median step (ms)",
            "per-repetition medians (ms)",
            "ratio to off, per repetition",
            "median of those",
            "pooled ratio",
            "capture process CPU per step (ms)",
            "tasks' CPU per step (ms)",
            "recorded send calls per step",
            "not copied",
            "physics",
        ),
    ]
    for name, figure in figures.items():
        ratios = figure.paired_ratios(off)
        cpu = f"{statistics.median(figure.cpu_ms_per_step):.0f}" if figure.cpu_ms_per_step else "-"
        calls = figure.send_calls_per_step
        sends = f"{statistics.median(calls):,.0f}" if calls else "-"
        spliced = (
            f"{figure.spliced_bytes / figure.forwarded_bytes:.1%}"
            if figure.forwarded_bytes
            else "-"
        )
        lines.append(
            f"| {name} | {figure.median_ms:.0f} | {_format_ms(figure.repetition_medians())} | "
            f"{', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f}x | "
            f"{figure.median_ms / off.median_ms:.2f}x | {cpu} | {_cpu_cell(figure, off)} | "
            f"{sends} | {spliced} | {figure.physics or '-'} |"
        )
    return [*lines, ""]


def write_readme(
    command: str,
    jobs: Sequence[tuple[Job, dict[str, VariantFigures]]],
    load_before: str,
    load_after: str,
    repetitions: int,
) -> None:
    first = jobs[0][0].config
    lines = [
        SECTION,
        "",
        "(written by `bench/capture_overhead.py`; rerun it to replace this section)",
        "",
        f"Command: `{command}`. Jobs: {'; '.join(job.name for job, _ in jobs)}, "
        f"{'synchronous' if first.synchronous else 'asynchronous'}, {first.warmup_steps} warm-up "
        f"+ {first.steps} steady steps per run; {repetitions} repetitions per job, each running "
        "every variant once in a rotating order; all figures from one run.",
        "",
        machine_line(load_before, load_after),
        "",
    ]
    for job, figures in jobs:
        lines += _table(job, figures)
    lines += [*NOTES, ""]
    write_section(README, SECTION, "\n".join(lines))


def measure_job(
    job: Job,
    figures: dict[str, VariantFigures],
    order: Sequence[str],
    repetitions: int,
) -> None:
    """Every variant of ``order`` once per repetition, in a rotating order."""
    config = job.config
    for repetition in range(repetitions):
        shift = repetition % len(order)
        for name in [*order[shift:], *order[:shift]]:
            with tempfile.TemporaryDirectory(prefix="tfgb-overhead-") as temporary:
                workdir = Path(temporary)
                if name == OFF:
                    steps = run_without_capture(config, workdir, figures[name], job.network)
                else:
                    steps = run_with_capture(config, workdir, name, figures[name], job.network)
            figures[name].steps_ms.append(steps)
            cpu = figures[name].cpu_ms_per_step
            print(
                f"{job.name} repetition {repetition + 1}/{repetitions} {name:>13}: median "
                f"{statistics.median(steps):.0f} ms  [{_format_ms(steps)}]"
                + (f"  capture process CPU {cpu[-1]:.0f} ms/step" if cpu else ""),
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default="resnet50",
        help="models to measure, comma-separated, one job each (default resnet50)",
    )
    parser.add_argument("--setup", default="tf2-ps")
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--input-size", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument(
        "--variants",
        default="preload,splice,forward",
        help=f"capture variants, comma-separated, of: {', '.join(VARIANTS)} "
        "(default preload,splice,forward)",
    )
    parser.add_argument(
        "--network",
        default=None,
        metavar="PROFILES",
        help="run every job across each of these emulated links, comma-separated, 'loopback' "
        "for none (root; only the preload variant: the proxies cannot reach tasks inside "
        "emulated hosts)",
    )
    parser.add_argument("--no-readme", action="store_true", help="print only")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    profiles = [p.strip() for p in (args.network or "loopback").split(",") if p.strip()]
    links = [profile for profile in profiles if profile != LOOPBACK]
    if links and any(VARIANTS[v][0] != "preload" for v in variants):
        parser.error("--network measures only the preload variant: add --variants preload")
    try:
        networks = [
            None if profile == LOOPBACK else NetworkRequest.parse(profile) for profile in profiles
        ]
    except BenchError as error:
        parser.error(str(error))
    configs = [
        TrainingConfig(
            model=model.strip(),
            setup=args.setup,
            ps=args.ps,
            workers=args.workers,
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            batch_size=args.batch_size,
            input_size=args.input_size,
        )
        for model in args.models.split(",")
        if model.strip()
    ]
    command = command_line(__file__, sys.argv[1:])
    order = [OFF, *variants]
    jobs = [
        (Job(config, network), {name: VariantFigures(name) for name in order})
        for config in configs
        for network in networks
    ]
    load_before = load_average()
    try:
        with lifetime.interrupt_on_signals():
            for job, figures in jobs:
                measure_job(job, figures, order, args.repetitions)
    except BenchError as error:
        print(f"capture_overhead: error: {error}", file=sys.stderr)
        return 1
    load_after = load_average()
    for job, figures in jobs:
        off = figures[OFF]
        for name in order:
            figure = figures[name]
            ratios = figure.paired_ratios(off)
            print(
                f"{job.name} {name:>16}: median {figure.median_ms:.0f} ms; ratio to off: "
                f"pooled {figure.median_ms / off.median_ms:.3f}, per repetition "
                f"[{', '.join(f'{r:.3f}' for r in ratios)}], median "
                f"{statistics.median(ratios):.3f}"
            )
        print("\n".join(_table(job, figures)))
    if not args.no_readme:
        write_readme(command, jobs, load_before, load_after, args.repetitions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
