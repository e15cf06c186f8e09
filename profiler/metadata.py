"""What a capture records of its run: a launcher job's ``RunMetadata``, the command line.

``run_metadata`` is the trace metadata of a ``capture`` job (``training``): the
model, setup and batch, the tool's, TensorFlow's, grpcio's and Python's
versions, the capture machine (its CPU and kernel release: ``KERNEL_EXTRA``),
and the emulated network and compute calibration when there are;
``userjob`` writes its own from the same keys.  ``command_line`` is this
process's command line, which every capture command records.
"""

from __future__ import annotations

import datetime
import platform
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tf_grpc_bench import __version__
from tf_grpc_bench.calibration import Calibration
from tf_grpc_bench.host import capture_machine
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.physics import VARIABLES_EXTRA, encode_variables
from tf_grpc_bench.profiler.recorders.recorder import CAPTURE_METHODS, DEFAULT_RECORDER
from tf_grpc_bench.trace import RunMetadata

#: ``RunMetadata.extra`` key of the capture machine's kernel release.
KERNEL_EXTRA = "kernel"

#: Launcher setup -> the trace's strategy name (see protos/trace.proto).
STRATEGY_NAMES = {
    "tf2-ps": "tf2-parameter-server",
    "tf1-ps": "tf1-parameter-server",
    "mwms": "multi-worker-mirrored",
}


def utc_now() -> str:
    """Now, as a trace's ``created_utc`` records it (ISO 8601, whole seconds, UTC)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_metadata(
    config: TrainingConfig,
    job_info: Mapping[str, Any],
    command: Sequence[str],
    *,
    recorder: str = DEFAULT_RECORDER,
    network: Sequence[tuple[str, str]] = (),
    calibration: Calibration | None = None,
) -> RunMetadata:
    """The trace's RunMetadata for a launcher job (job_info may be empty if it failed early);
    ``network`` are the emulated network's entries of ``extra`` (``TaskHosts.metadata``)."""
    import grpc

    extra = {
        "setup": config.setup,
        "ps": str(config.ps),
        "workers": str(config.workers),
        "warmup_steps": str(config.warmup_steps),
        "steps": str(config.steps),
        "keras": f"{job_info.get('keras_flavour', config.keras)} "
        f"{job_info.get('keras_version', '')}".strip(),
        "grpcio_version": grpc.__version__,
        "python_version": platform.python_version(),
        **dict(capture_machine()),
        # The instance's kernel build: machines of one CPU model differ by it (bench/README.md).
        KERNEL_EXTRA: platform.release(),
    }
    if "trainable_bytes" in job_info:
        extra["trainable_bytes"] = str(job_info["trainable_bytes"])
    if job_info.get("variables"):
        extra[VARIABLES_EXTRA] = encode_variables(job_info["variables"])
    extra.update(network)
    if calibration is not None:
        extra.update(calibration.extra())
    return RunMetadata(
        model=config.model,
        tensorflow_version=str(job_info.get("tensorflow_version", "")),
        strategy=STRATEGY_NAMES[config.setup],
        synchronous=config.synchronous,
        batch_size=config.batch_size,
        input_shape=tuple(config.input_shape),
        trainable_parameters=int(job_info.get("trainable_parameters", 0)),
        capture_method=CAPTURE_METHODS[recorder],
        host=socket.gethostname(),
        command=tuple(command),
        tool_version=__version__,
        created_utc=utc_now(),
        extra=tuple(sorted(extra.items())),
    )


def command_line() -> tuple[str, ...]:
    """The command line of this process, as a user would retype it."""
    if not sys.argv:
        return ("tf-grpc-bench",)
    program = Path(sys.argv[0]).name
    if program == "__main__.py":  # python -m tf_grpc_bench ...
        return ("python", "-m", "tf_grpc_bench", *sys.argv[1:])
    return (program, *sys.argv[1:])
