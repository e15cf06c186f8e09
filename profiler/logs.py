"""The profiler's logging: ``absl.logging``, at the verbosity TensorFlow's convention asks for.

``TF_CPP_MIN_LOG_LEVEL`` (the variable TensorFlow's own C++ logging obeys)
sets the threshold: ``0`` shows INFO and up, ``1`` WARNING and up, ``2`` ERROR
and up, ``3`` only FATAL.  Unset (or unreadable), WARNING and up, as
TensorFlow's Python logging does.  In a program that parses absl flags (the
task program), an explicit ``-v``/``--verbosity`` wins.

What the profiler logs is diagnostics (which tasks started, what the
recorder saw, where a trace went); what a command prints as its result is
not logging and stays on stdout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from absl import flags, logging

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"

_VERBOSITY = {
    "0": logging.INFO,
    "1": logging.WARNING,
    "2": logging.ERROR,
    "3": logging.FATAL,
}


def verbosity_from_environment(environment: Mapping[str, str] | None = None) -> int:
    """The absl verbosity that ``TF_CPP_MIN_LOG_LEVEL`` in ``environment`` asks for."""
    environment = os.environ if environment is None else environment
    return _VERBOSITY.get(environment.get(LEVEL_VARIABLE, "").strip(), logging.WARNING)


def configure(environment: Mapping[str, str] | None = None) -> None:
    """Log through absl's handler (stderr) at the environment's verbosity.

    For programs that do not parse absl flags (the ``tf-grpc-bench`` command):
    absl's flags keep their defaults.
    """
    if not flags.FLAGS.is_parsed():
        # The defaults are all a command without absl flags has; absl would
        # otherwise first warn that logging began before flag parsing.
        flags.FLAGS.mark_as_parsed()
    logging.use_absl_handler()
    logging.set_verbosity(verbosity_from_environment(environment))
