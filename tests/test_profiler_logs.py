"""The profiler's logging follows TensorFlow's TF_CPP_MIN_LOG_LEVEL convention."""

from __future__ import annotations

import pytest
from absl import logging

from tf_grpc_bench.profiler.logs import verbosity_from_environment


@pytest.mark.parametrize(
    ("level", "verbosity"),
    [
        ("0", logging.INFO),
        ("1", logging.WARNING),
        ("2", logging.ERROR),
        ("3", logging.FATAL),
        ("", logging.WARNING),
        ("loud", logging.WARNING),
    ],
)
def test_tf_cpp_min_log_level_sets_the_verbosity(level: str, verbosity: int) -> None:
    assert verbosity_from_environment({"TF_CPP_MIN_LOG_LEVEL": level}) == verbosity


def test_without_the_variable_only_warnings_and_errors_show() -> None:
    assert verbosity_from_environment({}) == logging.WARNING
