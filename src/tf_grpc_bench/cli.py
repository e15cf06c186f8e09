"""The ``tf-grpc-bench`` command: parses the subcommand, runs it, maps errors to exit codes.

Each subcommand lives with the package it belongs to, in a module that defines
``configure_<name>(parser)`` (flags) and ``run_<name>(args) -> int``.  Modules
are imported only when their subcommand runs (or for ``--help``), so that
``replay`` never imports TensorFlow.

Errors: every ``BenchError`` becomes one line on stderr and its exit code; no
traceback for user mistakes.  Anything else is a bug and keeps its traceback.
Ctrl-C, SIGTERM and SIGHUP all interrupt a command the same way (``lifetime``):
one line, exit status 128 + the signal's number; run as the command (``argv``
None), the process then ends within ``lifetime.EXIT_GRACE_S`` of that line even
if a thread it leaves does not.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from tf_grpc_bench import __version__, lifetime
from tf_grpc_bench.errors import BenchError, RunInterrupted, UsageError

PROGRAM = "tf-grpc-bench"

#: (subcommand, module, one-line help)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("inspect", "tf_grpc_bench.inspect", "validate a trace and print a per-step summary"),
    ("serve", "tf_grpc_bench.replay.cli", "run replay (ps) servers until Ctrl-C"),
    ("replay", "tf_grpc_bench.replay.cli", "run the paper's 3 benchmarks on a trace or synthetic"),
    (
        "network",
        "tf_grpc_bench.replay.cli",
        "emulated networks: compare links, up/down/cleanup",
    ),
    ("role", "tf_grpc_bench.replay.cli", "run one replay task placed by TF_CONFIG or srun"),
    (
        "engine",
        "tf_grpc_bench.replay.native.cli",
        "the replay engines this host has; 'engine build' builds the gRPC C++ one",
    ),
    (
        "emit",
        "tf_grpc_bench.emit",
        "write a JobSet, a TFJob or TF_CONFIG documents for a replay or a capture",
    ),
    (
        "timeline",
        "tf_grpc_bench.replay.output.cli",
        "every RPC of a step on its task's rows, from a trace or a replay run",
    ),
    ("export", "tf_grpc_bench.replay.output.cli", "a run's raw samples and summary as CSV tables"),
    ("capture", "tf_grpc_bench.profiler.cli", "train a model across processes, record a trace"),
    ("capture-job", "tf_grpc_bench.profiler.cli", "record a trace of your own training job"),
    (
        "record",
        "tf_grpc_bench.profiler.record_cli",
        "run one task of a job launched elsewhere, recording its traffic to a folder",
    ),
    (
        "assemble",
        "tf_grpc_bench.profiler.record_cli",
        "one trace from the record folders of every task of a job",
    ),
)


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2, like BenchError's."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


class _CheckingParser(_Parser):
    """argparse whose refusals raise UsageError and which prints nothing: a command line
    checked, not run (``check_command``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        # --help or --version: the command would print and stop, running nothing.
        raise UsageError("asks for help or the version: the command would run nothing")

    def _print_message(self, message: str, file: object = None) -> None:
        pass


def build_parser(
    only: str | None = None, *, parser_class: type[argparse.ArgumentParser] = _Parser
) -> argparse.ArgumentParser:
    parser = parser_class(
        prog=PROGRAM,
        description=(
            "Capture the tensor traffic of distributed TensorFlow training and replay it "
            "over gRPC as the TF-gRPC-Bench micro-benchmarks."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)
    for name, module_name, help_text in COMMANDS:
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            module = importlib.import_module(module_name)
            getattr(module, f"configure_{name}")(sub)
            sub.set_defaults(_module=module_name, _command=name)
    return parser


#: gRPC core's log level for the command and the processes it starts, unless the user set one.
GRPC_VERBOSITY = "ERROR"


def quiet_grpc_core() -> None:
    """Keep gRPC core's info lines off stderr (``GRPC_VERBOSITY``), unless the user set it.

    Left unset, gRPC (1.85 here; absl logging since 1.6x) writes info lines to stderr, such as
    ``Got goaway [2] ...`` when a peer's connection ends during a stop: noise
    beside a command's one line of outcome.  Errors still show.  Set before gRPC
    starts, in the environment, so tasks this command starts inherit it.
    """
    os.environ.setdefault("GRPC_VERBOSITY", GRPC_VERBOSITY)


def _parser_for(
    arguments: Sequence[str], parser_class: type[argparse.ArgumentParser] = _Parser
) -> argparse.ArgumentParser:
    known = {name for name, _, _ in COMMANDS}
    # Build only the chosen subcommand's flags: other modules stay unimported.
    chosen = next((a for a in arguments if not a.startswith("-")), None)
    return build_parser(chosen if chosen in known else None, parser_class=parser_class)


def check_command(arguments: Sequence[str]) -> argparse.Namespace:
    """Check ``tf-grpc-bench ARGUMENTS`` as ``main`` would start it, without running it.

    The arguments are parsed by the same parser, then the command's module runs its
    ``check_<command>(args)``, where it has one: the checks that need neither the
    command's inputs nor the machine it runs on.  Raises UsageError/ConfigError for
    what the command would refuse at start; prints nothing.
    """
    args = _parser_for(arguments, _CheckingParser).parse_args(list(arguments))
    if not getattr(args, "_command", None):
        raise UsageError("expected a tf-grpc-bench command")
    module = importlib.import_module(args._module)
    check = getattr(module, f"check_{args._command}", None)
    if check is not None:
        check(args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        quiet_grpc_core()
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = _parser_for(arguments)
    args = parser.parse_args(arguments)
    if not getattr(args, "_command", None):
        parser.print_help(sys.stderr)
        return 2
    run = getattr(importlib.import_module(args._module), f"run_{args._command}")
    # Run as the command (not called in process with its arguments): this process is ours.
    command = argv is None
    if command:
        lifetime.quiet_grpc_after_stop()
    try:
        # SIGTERM and SIGHUP stop a command as Ctrl-C does: what was measured is kept.
        with lifetime.interrupt_on_signals(ending_the_process=command):
            return int(run(args))
    except RunInterrupted as interrupted:
        # Not an error: the user (or a launcher) stopped it; what it measured is kept.
        sys.stderr.write(f"{PROGRAM} {args._command}: {interrupted}\n")
        if command:
            lifetime.exit_within(interrupted.exit_code)
        return interrupted.exit_code
    except BenchError as error:
        sys.stderr.write(f"{PROGRAM} {args._command}: error: {error}\n")
        return error.exit_code
    except KeyboardInterrupt as interrupt:
        signum = lifetime.signal_of(interrupt)
        sys.stderr.write(
            f"{PROGRAM} {args._command}: interrupted ({lifetime.signal_name(signum)})\n"
        )
        if command:
            lifetime.exit_within(lifetime.exit_status(signum))
        return lifetime.exit_status(signum)
    except BrokenPipeError:
        return 0
