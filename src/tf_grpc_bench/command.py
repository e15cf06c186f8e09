"""A subcommand of ``tf-grpc-bench`` as an object: its name, help, flags and what runs it.

Each command-line module defines its commands as ``Command`` objects (a
``COMMANDS`` tuple); ``tf_grpc_bench.cli`` lists them, importing a module
only when one of its commands is asked for (or for ``--help``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One subcommand."""

    #: What the user types: ``replay``, ``capture-job``, ...
    name: str
    #: One line for ``tf-grpc-bench --help`` and the command's own description.
    help: str
    #: Adds its flags to its parser.
    add_arguments: Callable[[argparse.ArgumentParser], None]
    #: Runs it on the parsed flags; returns the exit status (errors raise ``BenchError``).
    run: Callable[[argparse.Namespace], int]
    #: What it refuses at start whatever its inputs and host, without running
    #: (``cli.check_command``; UsageError/ConfigError); None: nothing beyond its parser.
    check: Callable[[argparse.Namespace], object] | None = None
