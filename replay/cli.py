"""``tf-grpc-bench serve``, ``replay``, ``role`` and ``network``: flags in, one call, outputs out.

``replay`` with no arguments runs the three benchmarks on loopback against
servers it starts itself, on the shipped default trace (or, until one is
shipped, on the paper's default synthetic workload), and writes the result
document and TensorBoard logs into a new run directory.

The flags and the typed specs they make are ``cli_flags``'; a replay is
planned by ``request.plan`` and carried out by ``session``; ``serve`` is
``serving``'s, ``role`` ``placement.role``'s, ``network`` ``network.cli``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tf_grpc_bench import launchers, lifetime
from tf_grpc_bench.command import Command
from tf_grpc_bench.errors import RunInterrupted, TransportError
from tf_grpc_bench.replay import serving, session
from tf_grpc_bench.replay.cli_flags import (
    configure_replay,
    configure_serve,
    replay_spec,
    serve_spec,
)
from tf_grpc_bench.replay.core import compute_load
from tf_grpc_bench.replay.core.whatif import WhatIf
from tf_grpc_bench.replay.engines.registry import AUTO, resolve_auto
from tf_grpc_bench.replay.network import cli as network_cli
from tf_grpc_bench.replay.output.progress import ProgressBar
from tf_grpc_bench.replay.placement import role
from tf_grpc_bench.replay.request import (
    ReplayRequest,
    generator_config,
    plan,
    run_label,
    this_host,
)
from tf_grpc_bench.replay.request import what_if_of as spec_what_if
from tf_grpc_bench.replay.spec import ReplaySpec, ServeSpec
from tf_grpc_bench.replay.transport.loop import INTERRUPTED_PREFIX
from tf_grpc_bench.replay.transport.wire import read_token_file
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import WHOLE_STEPS, WholeSteps

if TYPE_CHECKING:
    from tf_grpc_bench.replay.output.document import ResultDocument

# --------------------------------------------------------------------------
# serve


def run_serve(args: argparse.Namespace) -> int:
    spec = with_engine(serve_spec(args))
    summary, signum = serving.serve_until_stopped(
        mode=spec.mode,
        host=spec.host,
        ports=spec.ports,
        settings=spec.grpc.settings(),
        tls_dir=Path(spec.grpc.tls_dir) if spec.grpc.tls_dir else None,
        max_response_bytes=spec.max_response_bytes,
        control_token=None if spec.token_file is None else read_token_file(spec.token_file),
        announce=lambda line: print(line, flush=True),
        procs_per_server=spec.procs_per_server,
        engine=spec.engine,
    )
    print(summary, flush=True)
    if signum is not None:
        name = lifetime.signal_name(signum)
        raise RunInterrupted(f"interrupted ({name}); servers stopped", signum=signum)
    return 0


# --------------------------------------------------------------------------
# replay


def build_request(
    args: argparse.Namespace, *, whole_steps: WholeSteps = WHOLE_STEPS
) -> ReplayRequest:
    """The request ``replay``'s flags ask for on this machine (``request.plan``).
    Raises UsageError/ConfigError/TraceError."""
    return plan(replay_spec(args), this_host(), whole_steps=whole_steps)


def what_if_of(args: argparse.Namespace, trace: Trace) -> WhatIf | None:
    """The what-if cluster ``replay``'s flags ask a trace about (``request.what_if_of``)."""
    return spec_what_if(replay_spec(args), trace)


def check_replay(args: argparse.Namespace) -> ReplaySpec:
    """What any host refuses of ``replay``'s flags at start, needing neither the trace nor
    this machine (``emit`` runs it on the pods' flags; ``cli.check_command``): the spec,
    and the paper's generators when ``--synthetic``.  Raises UsageError/ConfigError."""
    spec = replay_spec(args)
    if spec.synthetic:
        generator_config(spec)
    return spec


SpecWithEngine = TypeVar("SpecWithEngine", ReplaySpec, ServeSpec)


def run_replay(args: argparse.Namespace) -> int:
    return replay(with_engine(replay_spec(args)))


def with_engine(spec: SpecWithEngine) -> SpecWithEngine:
    """``spec`` with ``--engine auto`` resolved here, the choice said on stderr where that
    is a terminal (as the progress bar is; the results name the engine either way, and a
    replay's table says it on stdout): a command's error output stays its one line."""
    if spec.engine != AUTO:
        return spec
    interactive = sys.stderr.isatty()
    return replace(
        spec,
        engine=resolve_auto(
            lambda line: print(line, file=sys.stderr, flush=True) if interactive else None
        ),
    )


def replay(spec: ReplaySpec) -> int:
    """Plan ``spec``, carry it out into a new run directory and say where it went."""
    from tf_grpc_bench.replay.output import document as results
    from tf_grpc_bench.replay.output import report
    from tf_grpc_bench.replay.output.run_directories import discard_run_directory, new_run_directory

    request = plan(spec, this_host())
    # Made (and so checked writable) before anything is measured.
    base_existed = Path(spec.output_dir).exists()
    run_directory = new_run_directory(spec.output_dir, run_label(request))
    tls_dir: Path | None = None
    if request.grpc.tls:
        tls_dir = Path(spec.grpc.tls_dir) if spec.grpc.tls_dir else run_directory / "tls"
    progress = ProgressBar(
        len(request.workloads) * request.plan.runs,
        enabled=not spec.quiet and sys.stderr.isatty(),
    )
    try:
        with contextlib.closing(progress):
            executed = session.execute(request, tls_dir=tls_dir, on_progress=progress)
    except BaseException:
        # Nothing was measured: leave no empty run directory behind.
        discard_run_directory(run_directory, base_existed=base_existed)
        raise
    document = session.record(request, executed, run_directory, network_name=spec.network_name)
    if not spec.quiet:
        print(report.format_table(document))
        print(_engine_line(document))
        for result in document.benchmarks:
            if line := compute_load.report_line(result.parameters):
                print(line)
    if document.trace is not None and document.trace.partial_reason:
        print(f"partial trace: {document.trace.partial_reason}; its last step may be cut short")
    print(f"results: {run_directory / results.RESULTS_FILE_NAME}")
    if document.network is not None and document.network.relay_behind:
        print(
            f"warning: the link's relay fell behind its profile: {document.network.relay_behind}",
            file=sys.stderr,
        )
    timelines = run_directory / "timeline"
    if timelines.is_dir():
        print(f"timeline: {timelines}/ (Perfetto, chrome://tracing; TensorBoard's Profile tab)")
    print(f"view:    tensorboard --logdir {spec.output_dir}")
    _raise_if_partial(document.partial, document.partial_reason, run_directory)
    return 0


def _engine_line(document: ResultDocument) -> str:
    """What made the calls, as the results record it."""
    parameters = document.benchmarks[0].parameters if document.benchmarks else {}
    return f"engine:  {parameters.get('engine', '?')} (gRPC {parameters.get('grpc_version', '?')})"


def _raise_if_partial(partial: bool, reason: str, run_directory: Path) -> None:
    """RunInterrupted (exit 128 + signal) or TransportError for a partial replay."""
    if not partial:
        return
    signum = lifetime.stop_signal()
    if signum is None and INTERRUPTED_PREFIX in reason:
        signum = signal.SIGINT
    if signum is not None:
        raise RunInterrupted(
            f"interrupted ({lifetime.signal_name(signum)}); partial results written to "
            f"{run_directory}",
            signum=signum,
        )
    raise TransportError(f"stopped early, partial results written to {run_directory}: {reason}")


# --------------------------------------------------------------------------
# role and network: their own flags, then the replay flags and spec above.


def add_placement_flags(parser: argparse.ArgumentParser) -> None:
    """The flags ``role`` adds to every replay flag."""
    placement = parser.add_argument_group("placement (TensorFlow's conventions)")
    placement.add_argument(
        "--cluster",
        default=None,
        metavar="JSON|FILE",
        help="cluster spec ({'ps': [...], 'worker': [...], 'chief': [...]}) or a whole TF_CONFIG; "
        "default: the TF_CONFIG environment variable",
    )
    placement.add_argument(
        "--task",
        default=None,
        metavar="TYPE:INDEX",
        help="this task, e.g. worker:1 (default: TF_CONFIG's task)",
    )
    placement.add_argument(
        "--slurm-jobs",
        default=None,
        metavar="JOB:N,...",
        help="place the task from srun's environment as TensorFlow's SlurmClusterResolver does: "
        "the jobs and their task counts, e.g. ps:2,worker:2,chief:1 (they must add up to srun -n; "
        "ranks go to the jobs in order of their names)",
    )
    placement.add_argument(
        "--port-base",
        type=int,
        default=launchers.DEFAULT_PORT_BASE,
        metavar="PORT",
        help="with --slurm-jobs: a node's tasks listen on PORT, PORT+1, ... "
        f"(default {launchers.DEFAULT_PORT_BASE}, TensorFlow's)",
    )
    placement.add_argument(
        "--job-timeout",
        type=float,
        default=role.DEFAULT_JOB_TIMEOUT_S,
        metavar="S",
        help=f"seconds to wait for the other tasks (default {role.DEFAULT_JOB_TIMEOUT_S:g})",
    )


def role_flags(args: argparse.Namespace) -> role.RoleFlags:
    """``add_placement_flags``' flags, validated."""
    return role.RoleFlags(
        cluster=args.cluster,
        task=args.task,
        slurm_jobs=args.slurm_jobs,
        port_base=args.port_base,
        job_timeout_s=args.job_timeout,
    )


def configure_role(parser: argparse.ArgumentParser) -> None:
    add_placement_flags(parser)
    configure_replay(parser)


def check_role(args: argparse.Namespace) -> None:
    """What every ``role`` task refuses at start, whatever its host (``cli.check_command``)."""
    role.check_job(role.RoleJob(spec=check_replay(args), flags=role_flags(args)))


def run_role(args: argparse.Namespace) -> int:
    # role places every call of a step that its cluster can (``role.WHOLE_STEP_CHOICES``).
    return role.run_role(role.RoleJob(spec=with_engine(replay_spec(args)), flags=role_flags(args)))


def configure_network(parser: argparse.ArgumentParser) -> None:
    network_cli.configure_network(parser, replay_flags=configure_replay)


def run_network(args: argparse.Namespace) -> int:
    return network_cli.run_network(
        args,
        spec_of=lambda parsed: with_engine(replay_spec(parsed, auto_dilation=True)),
        plan=lambda spec: plan(spec, this_host()),
    )


#: The commands of this module (``tf_grpc_bench.cli``).
COMMANDS = (
    Command(
        name="serve",
        help="run replay (ps) servers until Ctrl-C",
        add_arguments=configure_serve,
        run=run_serve,
    ),
    Command(
        name="replay",
        help="run the paper's 3 benchmarks on a trace or synthetic",
        add_arguments=configure_replay,
        run=run_replay,
        check=check_replay,
    ),
    Command(
        name="network",
        help="emulated networks: compare links, up/down/cleanup",
        add_arguments=configure_network,
        run=run_network,
    ),
    Command(
        name="role",
        help="run one replay task placed by TF_CONFIG or srun",
        add_arguments=configure_role,
        run=run_role,
        check=check_role,
    ),
)
