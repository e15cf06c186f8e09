"""The ``tf-grpc-bench`` command: parses the subcommand, runs it, maps errors to exit codes.

Each subcommand is a ``command.Command`` object (name, help, flags, run),
defined with the package it belongs to in that module's ``COMMANDS``; the
table here names each module's commands and imports the module only when one
of them runs (or for ``--help``), so that ``replay`` never imports TensorFlow.

Errors: every ``BenchError`` becomes one line on stderr and its exit code; no
traceback for user mistakes.  Anything else is a bug and keeps its traceback.
Ctrl-C, SIGTERM and SIGHUP all interrupt a command the same way (``lifetime``):
one line, exit status 128 + the signal's number; run as the command (``argv``
None), the process then ends within ``lifetime.EXIT_GRACE_S`` of that line even
if a thread it leaves does not.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from tf_grpc_bench import __version__, lifetime
from tf_grpc_bench.command import Command
from tf_grpc_bench.errors import BenchError, RunInterrupted, UsageError

PROGRAM = "tf-grpc-bench"

Commands = tuple[Command, ...]


def _inspect() -> Commands:
    from tf_grpc_bench import inspect

    return inspect.COMMANDS


def _replay() -> Commands:
    from tf_grpc_bench.replay import cli

    return cli.COMMANDS


def _engines() -> Commands:
    from tf_grpc_bench.replay.native import cli

    return cli.COMMANDS


def _emit() -> Commands:
    from tf_grpc_bench import emit

    return emit.COMMANDS


def _outputs() -> Commands:
    from tf_grpc_bench.replay.output import cli

    return cli.COMMANDS


def _capture() -> Commands:
    from tf_grpc_bench.profiler import cli

    return cli.COMMANDS


def _record() -> Commands:
    from tf_grpc_bench.profiler import record_cli

    return record_cli.COMMANDS


#: The commands, in ``--help``'s order: their names, and what imports their module.
COMMAND_MODULES: tuple[tuple[tuple[str, ...], Callable[[], Commands]], ...] = (
    (("inspect",), _inspect),
    (("serve", "replay", "network", "role"), _replay),
    (("engine",), _engines),
    (("emit",), _emit),
    (("timeline", "export"), _outputs),
    (("capture", "capture-job"), _capture),
    (("record", "assemble"), _record),
)
#: Every command's name.
COMMAND_NAMES = tuple(name for names, _ in COMMAND_MODULES for name in names)


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
    for names, load in COMMAND_MODULES:
        # Only the chosen command's module is imported (all of them for --help).
        commands = load() if only is None or only in names else ()
        by_name = {command.name: command for command in commands}
        for name in names:
            command = by_name.get(name)
            if command is None:
                subparsers.add_parser(name)
                continue
            sub = subparsers.add_parser(name, help=command.help, description=command.help)
            command.add_arguments(sub)
            sub.set_defaults(_command=command)
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
    # Build only the chosen subcommand's flags: other modules stay unimported.
    chosen = next((a for a in arguments if not a.startswith("-")), None)
    return build_parser(chosen if chosen in COMMAND_NAMES else None, parser_class=parser_class)


def check_command(arguments: Sequence[str]) -> argparse.Namespace:
    """Check ``tf-grpc-bench ARGUMENTS`` as ``main`` would start it, without running it.

    The arguments are parsed by the same parser, then the command's ``check`` runs, where
    it has one: the checks that need neither the command's inputs nor the machine it
    runs on.  Raises UsageError/ConfigError for what the command would refuse at start;
    prints nothing.
    """
    args = _parser_for(arguments, _CheckingParser).parse_args(list(arguments))
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        raise UsageError("expected a tf-grpc-bench command")
    if command.check is not None:
        command.check(args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        quiet_grpc_core()
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = _parser_for(arguments)
    args = parser.parse_args(arguments)
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    name = command.name
    # Run as the command (not called in process with its arguments): this process is ours.
    ours = argv is None
    if ours:
        lifetime.quiet_grpc_after_stop()
    try:
        # SIGTERM and SIGHUP stop a command as Ctrl-C does: what was measured is kept.
        with lifetime.interrupt_on_signals(ending_the_process=ours):
            return int(command.run(args))
    except RunInterrupted as interrupted:
        # Not an error: the user (or a launcher) stopped it; what it measured is kept.
        sys.stderr.write(f"{PROGRAM} {name}: {interrupted}\n")
        if ours:
            lifetime.exit_within(interrupted.exit_code)
        return interrupted.exit_code
    except BenchError as error:
        sys.stderr.write(f"{PROGRAM} {name}: error: {error}\n")
        return error.exit_code
    except KeyboardInterrupt as interrupt:
        signum = lifetime.signal_of(interrupt)
        sys.stderr.write(f"{PROGRAM} {name}: interrupted ({lifetime.signal_name(signum)})\n")
        if ours:
            lifetime.exit_within(lifetime.exit_status(signum))
        return lifetime.exit_status(signum)
    except BrokenPipeError:
        return 0
