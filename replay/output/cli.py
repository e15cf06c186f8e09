"""``tf-grpc-bench timeline`` and ``export``: flags in, one library call, paths out."""

from __future__ import annotations

import argparse
from pathlib import Path

from tf_grpc_bench.command import Command
from tf_grpc_bench.errors import ResultError, UsageError
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output import export, timeline
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.run_directories import new_run_directory

DEFAULT_OUTPUT_DIR = "runs"


def _steps(text: str) -> int | None:
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--steps {text!r}: expected a number of steps >= 1, or 'all'")
    return int(text)


def _run_documents(text: str) -> list[tuple[Path, results.ResultDocument]] | None:
    """(run directory, document) of each run ``text`` names: a run directory or its
    results file (one run), or a directory holding run directories one level down (each
    of them, by name).  None when ``text`` names neither a directory nor a .json file."""
    path = Path(text)
    if path.is_dir():
        if (path / results.RESULTS_FILE_NAME).is_file():
            paths = [path / results.RESULTS_FILE_NAME]
        else:
            paths = sorted(path.glob(f"*/{results.RESULTS_FILE_NAME}"))
            if not paths:
                raise ResultError(
                    f"{text}: a directory without {results.RESULTS_FILE_NAME}, nor run "
                    "directories holding one"
                )
    elif path.suffix == ".json":
        paths = [path]
    else:
        return None
    return [(found.parent, read_document(found)) for found in paths]


def configure_timeline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="TRACE|RUN",
        help="a trace (file or shipped name) or a replay's run directory (or its results.json)",
    )
    parser.add_argument(
        "--steps",
        default=str(timeline.DEFAULT_STEPS),
        metavar="N|all",
        help=f"steps drawn per task, captured and replayed (default {timeline.DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--run", type=int, default=None, metavar="INDEX", help="RUN: the measured run to draw"
    )
    parser.add_argument(
        "--benchmark",
        default=None,
        metavar="LABEL[,...]",
        help="RUN: only these benchmarks (default all), e.g. ps-throughput",
    )
    parser.add_argument(
        "--trace",
        default=None,
        metavar="TRACE",
        help="RUN: the trace it replayed, if no longer where the run recorded it",
    )
    parser.add_argument(
        "--output-dir",
        default=DEFAULT_OUTPUT_DIR,
        help="where a new directory for the timeline is made, never over an existing one "
        f"(default {DEFAULT_OUTPUT_DIR}/)",
    )


def run_timeline(args: argparse.Namespace) -> int:
    steps = _steps(args.steps)
    runs = _run_documents(args.source)
    if runs is None:
        for flag, value in (("--run", args.run), ("--benchmark", args.benchmark)):
            if value is not None:
                raise UsageError(f"{flag} applies to a run directory, not to a trace")
        return _trace_timeline(args.source, steps, Path(args.output_dir))
    labels = args.benchmark.split(",") if args.benchmark else None
    # New directories, so each run's own timelines (drawn by the replay) stay as they were.
    output_dir = Path(args.output_dir)
    for run_directory, document in runs:
        try:
            trace = timeline.replayed_trace(document, Path(args.trace) if args.trace else None)
            directory = new_run_directory(output_dir, f"timeline-{run_directory.name}")
            written = timeline.write_run_timelines(
                document, directory, trace, steps=steps, run_index=args.run, labels=labels
            )
        except ResultError as error:
            if len(runs) == 1:
                raise
            raise ResultError(f"{run_directory}: {error}") from None
        if not written:
            directory.rmdir()
            raise ResultError(f"{run_directory}: no benchmark with measured calls to draw")
        for path in written:
            print(f"written: {path}")
    _print_view(output_dir)
    return 0


def _trace_timeline(source: str, steps: int | None, output_dir: Path) -> int:
    from tf_grpc_bench import trace_files
    from tf_grpc_bench.inspect import resolve_trace_argument

    path = resolve_trace_argument(source)
    trace = trace_files.read_trace(path)
    stem = path.name.removesuffix(".tfgbtrace")
    drawn = timeline.trace_timeline(trace, title=f"{stem}: captured steps", steps=steps)
    if not drawn.groups:
        raise ResultError(f"{path}: no steady-state steps to draw")
    directory = new_run_directory(output_dir, f"timeline-{stem}")
    written = timeline.write_timeline(
        drawn,
        events_path=directory / f"{stem}{timeline.TRACE_EVENTS_SUFFIX}",
        tensorboard_run=directory / stem,
        host=stem,
    )
    for item in written:
        print(f"written: {item}")
    print(f"{drawn.slice_count} slices on {len(drawn.groups)} tasks")
    _print_view(output_dir)
    return 0


def _print_view(logdir: Path) -> None:
    print(
        "view:    open the .trace.json in Perfetto (ui.perfetto.dev) or chrome://tracing, or\n"
        f"         tensorboard --logdir {logdir}  (Profile tab, Trace Viewer tool)"
    )


def configure_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="a run directory (or its results.json)")
    parser.add_argument(
        "--csv",
        required=True,
        metavar="DIR",
        help="write samples.csv, runs.csv, steps.csv, summary.csv, parameters.csv into DIR",
    )
    parser.add_argument(
        "--trace",
        default=None,
        metavar="TRACE",
        help="the trace the run replayed, if moved (adds method and tensor to each sample)",
    )


def run_export(args: argparse.Namespace) -> int:
    runs = _run_documents(args.run)
    if runs is None:
        raise UsageError(f"RUN {args.run!r}: expected a run directory or its results.json")
    if len(runs) > 1:
        names = ", ".join(directory.name for directory, _ in runs[:3])
        raise UsageError(
            f"RUN {args.run!r}: holds {len(runs)} run directories ({names}"
            f"{', ...' if len(runs) > 3 else ''}); export one at a time, as its tables "
            "would overwrite another's"
        )
    ((_, document),) = runs
    trace = None
    try:
        trace = timeline.replayed_trace(document, Path(args.trace) if args.trace else None)
    except ResultError as missing:
        if args.trace:
            raise
        print(f"note: {missing}; samples.csv has no method and tensor columns filled")
    for path in export.export_csv(document, Path(args.csv), trace):
        print(f"written: {path}")
    return 0


#: ``tf-grpc-bench timeline`` and ``export``.
COMMANDS = (
    Command(
        name="timeline",
        help="every RPC of a step on its task's rows, from a trace or a replay run",
        add_arguments=configure_timeline,
        run=run_timeline,
    ),
    Command(
        name="export",
        help="a run's raw samples and summary as CSV tables",
        add_arguments=configure_export,
        run=run_export,
    ),
)
