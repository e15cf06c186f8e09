"""``tf-grpc-bench capture`` and ``capture-job``: record a training job's traffic as a trace.

Thin entry points: the flag tables, and flags -> a config and one call of
``training.capture_training`` or ``userjob.capture_user_job`` (with the
``progress.terminal_display``); then the result lines (where the trace went).
A capture that ends early still writes its partial trace, then fails with the
reason on one line (and its exit code).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tf_grpc_bench import bounds, trace_summary
from tf_grpc_bench.calibration import (
    Calibration,
    CalibrationUnavailable,
    CalibrationWorkload,
    cached,
    measure_here,
)
from tf_grpc_bench.cluster import read_cluster
from tf_grpc_bench.command import Command
from tf_grpc_bench.errors import CaptureError, RunInterrupted, TraceError, UsageError
from tf_grpc_bench.files import check_writable
from tf_grpc_bench.host import this_machine
from tf_grpc_bench.models.registry import available_models
from tf_grpc_bench.profiler import logs
from tf_grpc_bench.profiler.capture import CaptureResult
from tf_grpc_bench.profiler.launch.config import SETUPS, TrainingConfig
from tf_grpc_bench.profiler.launch.hosts import (
    DEFAULT_LAYOUT,
    LAYOUTS,
    NetworkRequest,
    check_network_allowed,
)
from tf_grpc_bench.profiler.launch.user_job import (
    DEFAULT_STEP_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    UserJob,
)
from tf_grpc_bench.profiler.metadata import command_line
from tf_grpc_bench.profiler.progress import terminal_display
from tf_grpc_bench.profiler.recorders.recorder import DEFAULT_RECORDER, RECORDERS
from tf_grpc_bench.profiler.recorders.wiretap import build_library
from tf_grpc_bench.profiler.training import calibration_workload, capture_training
from tf_grpc_bench.profiler.userjob import calibration_workload as user_calibration
from tf_grpc_bench.profiler.userjob import capture_user_job, check_hosts_local

_DEFAULT_OUTPUT = "capture.tfgbtrace"


def _positive_int(text: str) -> int:
    """A count flag (steps, batch size, image side): 0..``bounds.MAX_COUNT``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    problem = bounds.count_problem(value, minimum=0)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _seconds(text: str) -> float:
    """A timeout flag: (0, ``bounds.MAX_RUN_S``] seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    problem = bounds.seconds_problem(value, allow_zero=False, maximum=bounds.MAX_RUN_S)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _check_outputs(args: argparse.Namespace) -> None:
    """TraceError/CaptureError now, before training, if the trace or the logs could not
    be written where asked (the trace would be lost after minutes of training)."""
    check_writable(args.output, error=TraceError, what="trace")
    if args.workdir is not None:
        workdir = Path(args.workdir)
        if workdir.exists() and not workdir.is_dir():
            raise CaptureError(f"--workdir {workdir}: not a directory")
        check_writable(workdir / "probe", error=CaptureError, what="task logs")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recorder",
        choices=RECORDERS,
        default=DEFAULT_RECORDER,
        help="preload: a library in every task process records what it sends (default; "
        "needs a C compiler once, to build it); proxy: a recording proxy in front of every "
        "task (a second TCP hop, slower)",
    )
    parser.add_argument(
        "--output",
        "-o",
        default=_DEFAULT_OUTPUT,
        metavar="FILE",
        help=f"trace file to write (default {_DEFAULT_OUTPUT})",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="keep the tasks' logs here (default: a temporary directory, kept only on failure)",
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress display, only the result line"
    )
    parser.add_argument(
        "--network",
        default=None,
        metavar="PROFILE",
        help="run every task inside an emulated host on links of PROFILE (1gbit, 10gbit, "
        "unlimited, ... or a rate like 2.5gbit; see 'tf-grpc-bench network profiles'); needs root",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=None,
        help=f"with --network: ps-together (every ps on one host, the other tasks on another; "
        f"default {DEFAULT_LAYOUT}) or one-per-host (every task on its own host)",
    )
    parser.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="do not time a local training step of the model before the job (the compute "
        "calibration by which a replay on another machine scales the trace's compute; about "
        "10 s, once per machine and model)",
    )


def _network(args: argparse.Namespace) -> NetworkRequest | None:
    """The emulated network ``--network``/``--layout`` ask for; None without ``--network``.

    NetworkError at once without root (before any other check that could fail for
    an unprivileged user first).
    """
    if args.network is None:
        if args.layout is not None:
            raise UsageError("--layout places tasks on emulated hosts: give --network too")
        return None
    request = NetworkRequest.parse(args.network, args.layout or DEFAULT_LAYOUT)
    # Before anything else is checked or started: without root nothing else matters.
    check_network_allowed(args.recorder)
    return request


def configure_capture(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="resnet50",
        help=f"model to train: {', '.join(available_models())} (default resnet50)",
    )
    parser.add_argument(
        "--setup",
        default="tf2-ps",
        choices=SETUPS,
        help="tf2-ps: TF2 ParameterServerStrategy (default); tf1-ps: TF1 graph-mode "
        "parameter servers; mwms: MultiWorkerMirroredStrategy",
    )
    parser.add_argument("--ps", type=_positive_int, default=1, help="parameter servers (default 1)")
    parser.add_argument("--workers", type=_positive_int, default=2, help="workers (default 2)")
    parser.add_argument(
        "--steps",
        type=_positive_int,
        default=3,
        help="steady-state steps to record, per worker (default 3)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=_positive_int,
        default=1,
        help="steps before the recorded ones, kept as start-up traffic (default 1)",
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, default=4, help="per worker (default 4)"
    )
    parser.add_argument(
        "--input-size",
        type=_positive_int,
        default=None,
        help="image side in pixels (default: the model's smallest; traffic does not depend on it)",
    )
    parser.add_argument(
        "--async",
        dest="synchronous",
        action="store_false",
        help="asynchronous training (default synchronous)",
    )
    parser.add_argument(
        "--keras",
        choices=("keras", "tf_keras"),
        default=None,
        help="Keras flavour (default keras for TF2 setups, tf_keras for tf1-ps)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="give up (partial trace) after S seconds in all",
    )
    parser.add_argument(
        "--step-timeout",
        type=_seconds,
        default=120.0,
        metavar="S",
        help="a task that makes no step in S seconds counts as hung (default 120)",
    )
    _add_common(parser)


def _report(result: CaptureResult, quiet: bool) -> int:
    trace = result.trace
    rpcs = sum(len(s.rpcs) for s in trace.steps)
    if not quiet:
        print(trace_summary.format_summary(trace, source=str(result.path)))
    detection = trace.step_detection
    found = f" ({detection.unit}s, from {detection.source})" if detection.unit else ""
    print(
        f"wrote {result.path}: {len(trace.steps)} steady steps{found}, {rpcs} RPCs in them, "
        f"{len(trace.startup.rpcs)} at start-up" + (" (PARTIAL)" if trace.partial else "")
    )
    # Without --quiet the summary above carries it.
    steadiness = trace_summary.steadiness_line(trace) if quiet else None
    if steadiness:
        print(f"warning: {steadiness}", file=sys.stderr)
    error = result.error
    logs = f"; task logs in {result.logs}" if result.logs is not None else ""
    if isinstance(error, RunInterrupted):
        # Ctrl-C, SIGTERM and SIGHUP (the command line's handlers) stop a capture
        # alike: tasks stopped, partial trace written, exit 128 + signal.
        raise RunInterrupted(
            f"{error}; partial trace written to {result.path}{logs}", signum=error.signum
        )
    if error is not None:
        raise type(error)(f"{error} (partial trace written to {result.path}{logs})")
    return 0


def run_capture(args: argparse.Namespace) -> int:
    config = TrainingConfig(
        model=args.model,
        setup=args.setup,
        ps=args.ps,
        workers=args.workers,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        batch_size=args.batch_size,
        input_size=args.input_size,
        synchronous=args.synchronous,
        keras_flavour=args.keras,
        step_timeout_s=args.step_timeout,
    )
    network = _network(args)
    _check_outputs(args)
    logs.configure()
    _build_recorder(args.recorder)
    measured = _calibrate(calibration_workload(config), args.quiet) if args.calibrate else None
    progress, close = terminal_display(args.quiet, f"capture {args.model}")
    try:
        result = capture_training(
            config,
            args.output,
            command=command_line(),
            workdir=args.workdir,
            timeout_s=args.timeout,
            progress=progress,
            recorder=args.recorder,
            network=network,
            calibration=measured,
        )
    finally:
        close()
    return _report(result, args.quiet)


def _build_recorder(recorder: str) -> None:
    """The in-process recorder's library built (or found in the cache) before the
    calibration's local step, so that a machine without a C compiler is told so at once
    rather than after it (CaptureError; the capture builds nothing again)."""
    if recorder == "preload":
        build_library()


def _calibrate(workload: CalibrationWorkload, quiet: bool) -> Calibration | None:
    """This machine's compute calibration on ``workload``: measured now, or kept from an
    earlier capture or replay here (``calibration.measure_here``); None, said on stderr,
    if it cannot be measured (the capture goes on without it)."""
    here = this_machine()
    # On a terminal only, as the progress bar: a log read later has the trace's line instead.
    if not quiet and sys.stderr.isatty() and cached(here, workload) is None:
        print(f"compute calibration: timing a local step of {workload.text}", file=sys.stderr)
    try:
        measured = measure_here(here, workload)
    except CalibrationUnavailable as error:
        print(f"warning: no compute calibration recorded: {error}", file=sys.stderr)
        return None
    if not measured.steady:
        # Said even under --quiet: the trace carries this step to every replay elsewhere.
        print(f"warning: compute calibration {measured.source}", file=sys.stderr)
    return Calibration.measured(workload, measured)


def configure_capture_job(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s --cluster JSON [options] -- COMMAND [ARGS...]"
    parser.add_argument(
        "--cluster",
        required=True,
        metavar="JSON",
        help='the tasks and the addresses they listen on, e.g. \'{"chief": ["localhost:2221"], '
        '"ps": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]}\', '
        "a TF_CONFIG document, or @FILE",
    )
    parser.add_argument(
        "--warmup-steps",
        type=_positive_int,
        default=1,
        help="training runs found in the traffic (worker-steps) to keep as start-up (default 1)",
    )
    parser.add_argument(
        "--driver",
        action="append",
        default=None,
        metavar="JOB",
        help="job whose tasks end the run by exiting (default: chief if any, else worker)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"give up (partial trace) after S seconds in all (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--step-timeout",
        type=_seconds,
        default=DEFAULT_STEP_TIMEOUT_S,
        metavar="S",
        help="a job whose tasks exchange nothing (and write no step marker) for S seconds "
        f"counts as hung (default {DEFAULT_STEP_TIMEOUT_S:g})",
    )
    parser.add_argument("--model", default="", help="model name to record in the trace")
    parser.add_argument("--strategy", default="", help="strategy name to record in the trace")
    parser.add_argument(
        "--batch-size", type=_positive_int, default=0, help="batch size to record in the trace"
    )
    parser.add_argument(
        "--async",
        dest="synchronous",
        action="store_false",
        help="record the job as asynchronous training",
    )
    _add_common(parser)
    parser.add_argument(
        "job_command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="the command every task runs, after '--' (it gets its TF_CONFIG)",
    )


def run_capture_job(args: argparse.Namespace) -> int:
    command = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to run: put it after '--', e.g. -- python train.py")
    job = UserJob(
        cluster=read_cluster(args.cluster, jobs=None),
        command=tuple(command),
        warmup_steps=args.warmup_steps,
        timeout_s=args.timeout,
        step_timeout_s=args.step_timeout,
        drivers=tuple(args.driver or ()),
        model=args.model,
        strategy=args.strategy,
        batch_size=args.batch_size,
        synchronous=args.synchronous,
    )
    network = _network(args)
    if network is None:
        # Refused before the calibration's minute of timing, not after.
        check_hosts_local(job)
    _check_outputs(args)
    logs.configure()
    _build_recorder(args.recorder)
    measured = _calibrate(user_calibration(job), args.quiet) if args.calibrate else None
    progress, close = terminal_display(args.quiet, "capture-job")
    try:
        result = capture_user_job(
            job,
            args.output,
            command=command_line(),
            workdir=args.workdir,
            progress=progress,
            recorder=args.recorder,
            network=network,
            calibration=measured,
        )
    finally:
        close()
    return _report(result, args.quiet)


#: ``tf-grpc-bench capture`` and ``capture-job``.
COMMANDS = (
    Command(
        name="capture",
        help="train a model across processes, record a trace",
        add_arguments=configure_capture,
        run=run_capture,
    ),
    Command(
        name="capture-job",
        help="record a trace of your own training job",
        add_arguments=configure_capture_job,
        run=run_capture_job,
    ),
)
