"""``tf-grpc-bench inspect``: validate a trace, print its per-step summary, export JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tf_grpc_bench import trace as trace_model
from tf_grpc_bench import trace_files, trace_summary
from tf_grpc_bench.command import Command
from tf_grpc_bench.errors import BenchError, TraceError


def configure_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace",
        metavar="TRACE",
        help="trace file, or the name of a shipped trace (e.g. resnet50-tf2ps)",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help="also export the whole trace as JSON to FILE ('-' for stdout, "
        "which then replaces the summary)",
    )


def resolve_trace_argument(text: str) -> Path:
    """A path if it exists, else a shipped trace of that name."""
    path = Path(text)
    # A symbolic link is a path even when it leads nowhere (read_trace says why).
    if path.exists() or path.is_symlink() or "/" in text or text.endswith(trace_model.SUFFIX):
        return path
    try:
        return trace_files.shipped_trace_path(text)
    except BenchError:
        shipped = ", ".join(trace_files.shipped_trace_names()) or "none"
        raise TraceError(
            f"{text}: no such trace file, nor a shipped trace of that name (shipped: {shipped})"
        ) from None


def _critical_paths(trace: trace_model.Trace) -> str:
    """Per step and worker: the captured critical path, compute against communication."""
    from tf_grpc_bench.critical_path import captured_critical_paths

    try:
        paths = captured_critical_paths(trace)
    except TraceError:
        return ""
    lines = [
        "critical path per step and worker (the dependency model, docs/fidelity.md):",
        f"{'step':>8} {'task':<18} {'step ms':>9} {'compute ms':>11} {'comm ms':>9}",
    ]
    for index, task, path in paths:
        lines.append(
            f"{index:>8} {task:<18} {path.step_ns / 1e6:>9.1f} "
            f"{path.compute_ns / 1e6:>11.1f} {path.communication_ns / 1e6:>9.1f}"
        )
    return "\n".join(lines)


def run_inspect(args: argparse.Namespace) -> int:
    path = resolve_trace_argument(args.trace)
    trace = trace_files.read_trace(path)
    if args.json == "-":
        trace_files.export_json(trace, sys.stdout)
        return 0
    print(trace_summary.format_summary(trace, source=str(path)))
    paths = _critical_paths(trace)
    if paths:
        print(paths)
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as stream:
                trace_files.export_json(trace, stream)
        except OSError as error:
            raise BenchError(f"--json {args.json}: cannot write ({error.strerror})") from None
        print(f"exported JSON to {args.json}")
    return 0


#: ``tf-grpc-bench inspect``.
COMMANDS = (
    Command(
        name="inspect",
        help="validate a trace and print a per-step summary",
        add_arguments=configure_inspect,
        run=run_inspect,
    ),
)
