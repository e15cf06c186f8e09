"""The cross-machine mode of bench/fidelity.py: a trace from another instance against training here.

    sudo .venv/bin/python bench/fidelity.py --cross-machine resnet50-tf2ps,/tmp/fid/x.tfgbtrace \\
        --profiles 1gbit,5gbit,10gbit

For each trace (a shipped trace's name, or the file of an earlier run's
capture on another instance), on each link profile, in one run:

1. trains the trace's job here (its model, setup, cluster, batch and image size,
   from the trace's metadata) on the emulated link, uncaptured (A: the launcher
   with no recorder) and captured (B), ``--repeats`` pairs (default 2) in the
   order the own-machine mode runs them (``--order``; alternate: A B | B A),
   pooled as it pools them;
2. replays the trace (R) across the same link after each pair (A B R | B A R:
   the replays' own spread shows beside the reference's, for one replay's length
   a pair) with ``network compare``'s defaults (``--compute auto``: a trace from
   another machine has its compute scaled by the two machines' calibrations;
   ``--compute-load auto``) or the replay flags given (``--engine``,
   ``--time-dilation``, ``--compute-load``), and takes the predicted step (the
   replays' median) and the compute load the replay ran, which its pair records
   (its ratio the pooled one: the pairs file keeps its format);
3. writes the section ``## Fidelity across machines: TRACE`` of bench/README.md
   (the capture machine and this one named), and records each link's ratio as a
   measured pair of machines in ``src/tf_grpc_bench/cross_machine_pairs.json``
   (the latest measurement of a pair, trace and link replaces the one before),
   from which a replay says how uncertain a cross-machine prediction is and the
   section ``## Fidelity across machines: every pair of CPU models`` is written.

``--pairs FILE`` merges the measured pairs into FILE instead (written even with
``--no-readme``); ``--replay-duration S`` shortens each replay (the suite's
smoke run of this mode: a tiny model, a few steps).
"""

from __future__ import annotations

import datetime
import functools
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import README, ROOT, load_average, machine_line, table_head, table_row, write_section
from fidelity import (
    CAPTURED,
    ORDERS,
    REPEATS,
    REPLAY_DURATION_S,
    Prediction,
    Repeat,
    flag,
    in_order,
    pooled_step,
    predict,
    repeats_table,
    schedule,
    schedule_text,
)
from training import (
    Runs,
    Uncaptured,
    capture_facts,
    capture_job,
    job_arguments,
    link_bound_seconds,
    pooled_uncaptured,
    rounds_seconds,
    train_uncaptured,
    uncaptured_runs,
)

from tf_grpc_bench import cross_machine, host, trace_files
from tf_grpc_bench.cross_machine import MeasuredPair
from tf_grpc_bench.trace import Trace

SECTION = "## Fidelity across machines: {trace}"
PAIRS_SECTION = "## Fidelity across machines: every pair of CPU models"
#: ``RunMetadata.strategy`` -> the launcher's setup.
SETUPS = {"tf2-parameter-server": "tf2-ps", "tf1-parameter-server": "tf1-ps"}
#: How traces calibrated before the parts and processes were timed are described.
ONE_PROCESS = "one process, the whole local step"


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossRow:
    profile: str
    #: Uncaptured training here (with ``repeats``: every run's rounds pooled).
    uncaptured: Uncaptured
    #: Training's median round captured here on the link (with ``repeats``: the median of
    #: every capture's rounds pooled).
    captured_s: float
    link_bound_s: float | None
    #: The replay's prediction (with ``repeats``: the first made, whose compute and compute
    #: load the row names; its step is the repeats' median, ``predicted_s``).
    prediction: Prediction | None
    #: The replay's ``compute_calibration`` (how the trace's compute was scaled).
    compute: str
    #: The replay's compute load, and why where ``auto`` chose it (``_compute_load``).
    compute_load: str = "-"
    #: The side-by-side pairs trained here, in the order run, the trace replayed after each.
    repeats: tuple[Repeat, ...] = ()

    @property
    def predicted_s(self) -> float | None:
        if self.repeats:
            return pooled_step([r.prediction for r in self.repeats])
        return None if self.prediction is None else self.prediction.step_s

    @property
    def ratio(self) -> float | None:
        """The prediction over uncaptured training (pooled, with repeats)."""
        predicted = self.predicted_s
        return None if predicted is None else predicted / self.uncaptured.round_s

    @property
    def uncaptured_runs(self) -> Runs | None:
        return uncaptured_runs([r.uncaptured for r in self.repeats]) if self.repeats else None


def cross_row(profile: str, repeats: Sequence[Repeat], *, link_bound_s: float | None) -> CrossRow:
    """A link's row from its repeats, pooled as bench/fidelity.py pools them."""
    made = [r.prediction for r in repeats if r.prediction is not None]
    first = made[0] if made else None
    return CrossRow(
        profile=profile,
        uncaptured=pooled_uncaptured([r.uncaptured for r in repeats]),
        captured_s=Runs(tuple(r.captured_rounds_s for r in repeats)).median_s,
        link_bound_s=link_bound_s,
        prediction=first,
        compute=_compute(first),
        compute_load=_compute_load(first),
        repeats=tuple(repeats),
    )


def trace_path(name: str) -> Path:
    """A shipped trace's file, or the file named."""
    path = Path(name)
    return path if path.exists() else trace_files.shipped_trace_path(name)


def trace_label(name: str) -> str:
    """How tables name a trace: a shipped one by its name, a file by its file name."""
    path = Path(name)
    return path.name if path.exists() else name


def job_shape(trace: Trace, steps: int) -> list[str]:
    """The trace's job as ``capture`` takes it (its setup, cluster, batch and image side)."""
    extra = dict(trace.metadata.extra)
    setup = extra.get("setup") or SETUPS.get(trace.metadata.strategy, "")
    if setup not in SETUPS.values():
        raise SystemExit(f"{trace.metadata.model}: a trace of {setup or 'an unknown setup'} "
                         "(the cross-machine mode trains tf2-ps and tf1-ps jobs)")  # fmt: skip
    return job_arguments(
        trace.metadata.model,
        setup,
        steps,
        workers=int(extra.get("workers") or len(trace.tasks_of_job("worker"))),
        ps=int(extra.get("ps") or len(trace.tasks_of_job("ps"))),
        batch_size=trace.metadata.batch_size,
        input_size=trace.metadata.input_shape[0],
    )


def _compute(prediction: Prediction | None) -> str:
    """How the replay scaled the trace's compute, short: its scale ("compute x1.64") or
    why none ("none: ..."), without the steps and the uncertainty the results give."""
    import json

    if prediction is None:
        return "-"
    benchmark = json.loads(prediction.document.read_text())["benchmarks"][0]
    described = str(benchmark["parameters"].get("compute_calibration", ""))
    if not described:
        return "not scaled (same machine)"
    if described.startswith("none"):
        return described.split("; ")[0]
    scales = re.findall(r"compute x[0-9.e+-]+", described)
    return scales[-1] if scales else described


def _compute_load(prediction: Prediction | None) -> str:
    """The replay's compute load as its results record it: ``uniform``, or ``none (auto:
    the trace records no capture CPU)`` where ``--compute-load auto`` chose."""
    import json

    from tf_grpc_bench.replay.core import compute_load

    if prediction is None:
        return "-"
    benchmark = json.loads(prediction.document.read_text())["benchmarks"][0]
    parameters = benchmark["parameters"]
    mode = str(parameters.get("compute_load") or compute_load.NONE)
    return compute_load.described(mode, str(parameters.get(compute_load.AUTO_ENTRY) or ""))


def measure_cross(
    name: str,
    profiles: list[str],
    steps: int,
    logdir: Path,
    *,
    replay_s: str = REPLAY_DURATION_S,
    replay_flags: tuple[str, ...] = (),
    repeats: int = REPEATS,
    order: str = ORDERS[0],
) -> list[CrossRow]:
    """Training here, uncaptured and captured, and the trace's prediction, per profile:
    ``repeats`` pairs, their trainings in ``order`` (``fidelity.schedule``), the trace
    replayed after each (each replay ``replay_s`` seconds long, with ``replay_flags``:
    ``--compute-load``, ``--engine``, ``--time-dilation``)."""
    path = trace_path(name)
    trace = trace_files.read_trace(path)
    shape = job_shape(trace, steps)
    folder = logdir / f"cross-{trace_label(name).removesuffix('.tfgbtrace')}"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for profile in profiles:
        done: list[Repeat] = []
        bound_s = None
        for number, runs in enumerate(schedule(order, repeats), start=1):
            # Repeat 1 keeps the names a run of one pair has; the others add "-rN".
            suffix = "" if number == 1 else f"-r{number}"
            output = folder / f"here-{profile}{suffix}.tfgbtrace"
            plain, captured = in_order(
                runs,
                functools.partial(train_uncaptured, shape, profile),
                functools.partial(capture_job, shape, output, profile),
            )
            prediction = predict(
                path,
                profile,
                folder / f"{profile}-cross{suffix}",
                length=("--duration", replay_s),
                extra=replay_flags,
            )
            label = profile if repeats == 1 else f"{profile} #{number}"
            done.append(
                Repeat(
                    uncaptured=plain,
                    capture=capture_facts(captured, label, plain),
                    captured_rounds_s=rounds_seconds(captured),
                    prediction=prediction,
                    captured_first=runs[0] == CAPTURED,
                )
            )
            print(done[-1], file=sys.stderr, flush=True)
            if bound_s is None:
                bound_s = link_bound_seconds(captured, profile)
        rows.append(cross_row(profile, done, link_bound_s=bound_s))
    return rows


def code_version() -> str:
    """The checkout's commit (short), "" outside a git checkout."""
    try:
        completed = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    except OSError:
        return ""
    return completed.stdout.strip()


def measured_pairs(
    name: str, trace: Trace, rows: list[CrossRow], command: str
) -> list[MeasuredPair]:
    """Each link's prediction over uncaptured training here, as a measured pair."""
    extra = trace.metadata.extra
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return [
        MeasuredPair(
            captured_on=host.captured_on(extra) or "?",
            replayed_on=host.this_machine(),
            trace=trace_label(name),
            link=row.profile,
            ratio=ratio,
            compute=row.compute,
            calibration=_calibration_method(extra),
            measured_utc=when,
            code=code_version(),
            source=command,
            compute_load=row.compute_load,
        )
        for row in rows
        if (ratio := row.ratio) is not None
    ]


def _calibration_method(extra: tuple[tuple[str, str], ...]) -> str:
    """How the trace's calibration was measured (its workload and whether it has parts)."""
    from tf_grpc_bench import calibration

    recorded = calibration.from_extra(extra)
    if recorded is None:
        return "none"
    if not recorded.parts:
        return ONE_PROCESS
    processes = recorded.workload.processes
    if processes == 1:
        return "one process, by kind of work"
    return f"{processes} processes at once, by kind of work"


def report(name: str, trace: Trace, rows: list[CrossRow], command: str, before: str) -> str:
    captured_on = host.captured_on(trace.metadata.extra) or "an unnamed machine"
    lines = [
        SECTION.format(trace=trace_label(name)),
        "",
        f"`{command}`",
        "",
        machine_line(before, load_average()),
        "",
        f"The trace `{trace_label(name)}` ({trace.metadata.model}, captured on {captured_on},",
        f"{trace.metadata.created_utc}) replayed here ({host.this_machine()}) across each link",
        "with network compare's defaults, against the same job trained here on that link:",
        "uncaptured (the launcher with no recorder) and captured, side by side. Ratios: the",
        "prediction over **uncaptured** training / over captured training.",
        "",
        *_repeats_prose(rows),
        *table_head(
            "link", "training, uncaptured", "captured", "link bound", "prediction", "ratio",
            "compute", "compute load",
        ),
    ]  # fmt: skip
    for row in rows:
        predicted = row.predicted_s
        step = "failed" if predicted is None else f"{predicted:.2f} s"
        ratio = "-"
        if predicted is not None and row.ratio is not None:
            ratio = f"**{row.ratio:.2f}** / {predicted / row.captured_s:.2f}"
            ratio += flag(row.uncaptured_runs)
        bound = "-" if row.link_bound_s is None else f"{row.link_bound_s:.2f} s"
        lines.append(
            table_row(
                row.profile,
                f"{row.uncaptured.round_s:.2f} s",
                f"{row.captured_s:.2f} s",
                bound,
                step,
                ratio,
                row.compute,
                row.compute_load,
            )
        )
    repeated = [(row.profile, row.repeats) for row in rows if row.repeats]
    if repeated:
        lines += ["", *repeats_table(repeated)]
    return "\n".join(lines)


def _repeats_prose(rows: Sequence[CrossRow]) -> list[str]:
    """How a run of repeated pairs pooled them ([] without repeats)."""
    longest = max((row.repeats for row in rows), key=len, default=())
    if not longest:
        return []
    return [
        f"Each link: {len(longest)} side-by-side pairs trained here, uncaptured (A) and captured",
        f"(B), the trace replayed (R) after each: {schedule_text([r.runs for r in longest])};",
        "training is the median of the pairs' rounds pooled, the prediction the median of the",
        "replays'. '(reference moved X)': the uncaptured runs' medians were X apart, more than",
        "the 5% a ratio is judged by (the repeats' table below).",
        "",
    ]


def pairs_section(pairs: list[MeasuredPair]) -> str:
    """Every pair of machines measured so far (the package's pairs file), as a table."""
    measured = cross_machine.spread(pairs)
    summary = "No pair of different CPU models measured yet."
    if measured is not None:
        summary = (
            f"Across CPU models: {measured.low:.2f} to {measured.high:.2f} ({measured.count} "
            "measured), which a replay of a trace from another CPU model states."
        )
    if any(pair.calibration == ONE_PROCESS for pair in pairs):
        summary += (
            f" Rows calibrated '{ONE_PROCESS}' predate the calibration of the workers' step in "
            "processes at once (docs/fidelity.md, Compute from another machine)."
        )
    lines = [
        PAIRS_SECTION,
        "",
        "`bench/fidelity.py --cross-machine` (every pair in "
        "`src/tf_grpc_bench/cross_machine_pairs.json`, the latest of each pair, trace and link). "
        "Ratio: prediction over uncaptured training on the replaying machine (a run of several "
        f"pairs: their replays' median over their rounds pooled). {summary}",
        "",
        *table_head("captured on", "replayed on", "trace, link", "ratio", "calibration",
                    "compute load", "measured (UTC), code"),
    ]  # fmt: skip
    for pair in pairs:
        lines.append(
            table_row(
                pair.captured_on, pair.replayed_on, f"{pair.trace}, {pair.link}",
                f"{pair.ratio:.2f}", pair.calibration or "-", pair.compute_load or "-",
                f"{pair.measured_utc or '-'}, {pair.code or '-'}",
            )
        )  # fmt: skip
    return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossRun:
    """What the cross-machine mode is asked (bench/fidelity.py's flags)."""

    names: list[str]
    profiles: list[str]
    steps: int
    logdir: Path
    command: str
    #: Write bench/README.md's sections (and the package's pairs file).
    readme: bool
    #: Where the measured pairs are merged (None: the package's file, with the README only).
    pairs_file: Path | None = None
    replay_s: str = REPLAY_DURATION_S
    #: Flags of every replay (``--compute-load``, ``--engine``, ``--time-dilation``).
    replay_flags: tuple[str, ...] = ()
    #: Side-by-side pairs per link, the trace replayed after each.
    repeats: int = REPEATS
    #: Which training of a pair runs first (``fidelity.ORDERS``).
    order: str = ORDERS[0]


def run_cross(run: CrossRun) -> None:
    """The cross-machine mode: measure every trace, then write the sections and the pairs."""
    for name in run.names:
        before = load_average()
        rows = measure_cross(
            name,
            run.profiles,
            run.steps,
            run.logdir,
            replay_s=run.replay_s,
            replay_flags=run.replay_flags,
            repeats=run.repeats,
            order=run.order,
        )
        trace = trace_files.read_trace(trace_path(name))
        body = report(name, trace, rows, run.command, before)
        print(body)
        pairs_file = run.pairs_file or cross_machine.PAIRS_FILE
        pairs = cross_machine.merged(
            cross_machine.read_pairs(pairs_file), measured_pairs(name, trace, rows, run.command)
        )
        if run.readme or run.pairs_file is not None:
            pairs_file.write_text(cross_machine.pairs_document(pairs))
        if run.readme:
            write_section(README, SECTION.format(trace=trace_label(name)), body)
            write_section(README, PAIRS_SECTION, pairs_section(pairs))
        else:
            print(pairs_section(pairs))
