"""``tf-grpc-bench serve`` and ``tf-grpc-bench replay``: flags in, one library call, outputs out.

``replay`` with no arguments runs the three benchmarks on loopback against
servers it starts itself, on the shipped default trace (or, until one is
shipped, on the paper's default synthetic workload), and writes the result
document and TensorBoard logs into a new run directory.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tf_grpc_bench import calibration, capture_cpu, host, lifetime, trace_files
from tf_grpc_bench.errors import ConfigError, RunInterrupted, TransportError, UsageError
from tf_grpc_bench.replay import runner
from tf_grpc_bench.replay.core import benchmarks, planning, whatif
from tf_grpc_bench.replay.core.benchmarks import RpcKind
from tf_grpc_bench.replay.core.generators import (
    MAX_BUFFERS_PER_PAYLOAD,
    MAX_PAYLOADS,
    BufferSizes,
    GeneratorConfig,
    GeneratorKind,
)
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import (
    COMPUTE_AUTO,
    COMPUTE_HERE,
    MAX_COMPUTE_SCALE,
    Compute,
    Pacing,
    PacingChoice,
    Timing,
    check_source,
    timing_names,
    timing_spec,
)
from tf_grpc_bench.replay.core.processes import parse_procs_per_worker
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.network import cli as network_cli
from tf_grpc_bench.replay.output.progress import ProgressBar
from tf_grpc_bench.replay.placement import role
from tf_grpc_bench.replay.runner import ReplayRequest
from tf_grpc_bench.replay.transport import grpc_settings
from tf_grpc_bench.replay.transport.client import parse_target
from tf_grpc_bench.replay.transport.loop import INTERRUPTED_PREFIX, NS_PER_S, RunPlan
from tf_grpc_bench.replay.transport.server import DEFAULT_PORT
from tf_grpc_bench.replay.transport.wire import read_token_file
from tf_grpc_bench.sizes import SizeCategory, parse_size
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import WHOLE_STEPS, WholeSteps

DEFAULT_OUTPUT_DIR = "runs"


# --------------------------------------------------------------------------
# Shared flag parsing.


#: Longest warm-up or measured run: a week.
MAX_RUN_S = 7 * 86_400.0
#: Longest call deadline or wait for servers: a day.
MAX_WAIT_S = 86_400.0
#: Most runs, steps or passes a replay is asked for (beyond, a typo).
MAX_COUNT = 10**9


def _positive_int(flag: str, value: int | None, maximum: int = MAX_COUNT) -> None:
    if value is not None and not 1 <= value <= maximum:
        raise ConfigError(f"{flag} must be in 1..{maximum}, got {value}")


def _seconds(flag: str, value: float, *, allow_zero: bool, maximum: float = MAX_WAIT_S) -> int:
    """Seconds as ns; ConfigError unless finite and in [0 or >0, ``maximum``]."""
    low = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low and value <= maximum):
        bound = "[0" if allow_zero else "(0"
        raise ConfigError(f"{flag} must be in {bound}, {maximum:g}] seconds, got {value:g}")
    return round(value * NS_PER_S)


def _size(flag: str, text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise ConfigError(f"{flag}: {error}") from None


def _token(args: argparse.Namespace) -> str | None:
    """The control-call token of ``--token-file``, if given (never printed)."""
    return None if args.token_file is None else read_token_file(args.token_file)


# --------------------------------------------------------------------------
# serve


def configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="localhost",
        help="address to listen on (default localhost; 0.0.0.0 or :: for other hosts to reach it)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}, the paper's; 0 picks a free one)",
    )
    parser.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.NON_SERIALIZED.value,
        help="payloads as raw bytes (default) or as protobuf messages",
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=1,
        metavar="N",
        help="run N ps servers, each its own process, on ports PORT..PORT+N-1 (default 1)",
    )
    parser.add_argument(
        "--procs-per-server",
        type=int,
        default=1,
        metavar="K",
        help="serve each port from K processes sharing it (SO_REUSEPORT; the kernel spreads "
        "connections over them), their statistics merged as one server's (default 1)",
    )
    parser.add_argument(
        "--max-response",
        default=None,
        metavar="SIZE",
        help="largest response a client may ask for, e.g. 512MB; larger requests are refused "
        "before anything is allocated (default: --max-message-size)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="refuse statistics and reset calls that do not carry the token in FILE "
        "(give clients the same file: replay --token-file); payload calls need none",
    )
    grpc_settings.add_grpc_flags(parser)


def run_serve(args: argparse.Namespace) -> int:
    _positive_int("--servers", args.servers, runner.MAX_LOCAL_PROCESSES)
    runner.check_server_processes(args.servers, args.procs_per_server)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.servers > 1 and args.port == 0:
        raise UsageError("--servers N needs a fixed --port (servers use PORT..PORT+N-1)")
    ports = [args.port + i for i in range(args.servers)]
    if ports[-1] > 65535:
        raise ConfigError(f"--port {args.port} + --servers {args.servers} goes past port 65535")
    summary, signum = runner.serve_until_stopped(
        mode=Mode(args.mode),
        host=args.host,
        ports=ports,
        settings=grpc_settings.settings_from_args(args),
        tls_dir=Path(args.tls_dir) if args.tls_dir else None,
        max_response_bytes=(
            None if args.max_response is None else _size("--max-response", args.max_response)
        ),
        control_token=_token(args),
        announce=lambda line: print(line, flush=True),
        procs_per_server=args.procs_per_server,
    )
    print(summary, flush=True)
    if signum is not None:
        name = lifetime.signal_name(signum)
        raise RunInterrupted(f"interrupted ({name}); servers stopped", signum=signum)
    return 0


# --------------------------------------------------------------------------
# replay


def configure_replay(parser: argparse.ArgumentParser) -> None:
    _add_what_flags(parser)
    _add_synthetic_flags(parser)
    _add_trace_flags(parser)
    _add_timing_flags(parser)
    _add_where_flags(parser)
    grpc_settings.add_grpc_flags(parser)


def _add_what_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace",
        metavar="TRACE",
        nargs="?",
        default=None,
        help="trace file or shipped trace name (default: the shipped default trace; "
        "the paper's synthetic workload when none is shipped)",
    )
    parser.add_argument(
        "--benchmark",
        default="all",
        help=f"all (default), or one or more of {','.join(benchmarks.names())}: "
        + "; ".join(f"{spec.name}: {spec.summary}" for spec in benchmarks.registered()),
    )
    parser.add_argument(
        "--synthetic", action="store_true", help="use the paper's generators instead of a trace"
    )
    parser.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.NON_SERIALIZED.value,
        help="payloads as raw bytes (default, the paper's non-serialized mode) or protobuf",
    )
    parser.add_argument(
        "--rpc",
        choices=[kind.value for kind in RpcKind],
        default=None,
        help="echo and ack calls as one unary call each, or as messages on one stream per "
        "channel, each answered by one message (default: streaming for synthetic P2P "
        "bandwidth, unary otherwise; trace replays are always unary)",
    )


def _add_synthetic_flags(parser: argparse.ArgumentParser) -> None:
    synthetic = parser.add_argument_group("synthetic workload (the paper's generators)")
    synthetic.add_argument(
        "--generator",
        choices=[k.value for k in GeneratorKind],
        default=None,
        help="uniform (default), random or skew",
    )
    synthetic.add_argument(
        "--categories",
        default=None,
        help="size categories to draw from, comma-separated (default small,medium,large)",
    )
    synthetic.add_argument(
        "--skew-bias",
        choices=[c.value for c in SizeCategory],
        default=None,
        help="the skew generator's favoured category (default large): 60%%, then 30%%, 10%%",
    )
    synthetic.add_argument(
        "--buffers", type=int, default=None, help="buffers per payload (default 10)"
    )
    synthetic.add_argument(
        "--payloads",
        type=int,
        default=None,
        help="distinct payloads generated and sent in a cycle (default 10)",
    )
    synthetic.add_argument(
        "--random-sizes",
        action="store_true",
        default=None,
        help="draw each buffer's size uniformly from its category's range",
    )
    for category in SizeCategory:
        synthetic.add_argument(
            f"--{category.value}-size",
            default=None,
            metavar="SIZE",
            help=f"size of a {category.value} buffer (default {category.default_bytes} B)",
        )
    synthetic.add_argument(
        "--seed", type=int, default=None, help="seed of the random generator (default 0)"
    )
    synthetic.add_argument(
        "--ps",
        type=int,
        default=None,
        help="ps servers for PS throughput (default 1); with a TRACE: a what-if, the trace's "
        "variables placed over N ps (default: the captured count)",
    )
    synthetic.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes for PS throughput (default 1); with a TRACE: a what-if, M "
        "workers, worker i replaying captured worker i mod W (default: the captured count)",
    )


def _add_trace_flags(parser: argparse.ArgumentParser) -> None:
    traced = parser.add_argument_group("trace replay")
    traced.add_argument(
        "--pair",
        default=None,
        metavar="WORKER,PS",
        help="the (worker, ps) pair the P2P benchmarks replay, e.g. worker:0,ps:1 "
        "(default: the pair that moved the most bytes)",
    )
    traced.add_argument(
        "--steps",
        type=int,
        default=None,
        help="replay exactly N steps per run (not a duration), from the trace's middle step on",
    )
    traced.add_argument(
        "--passes", type=int, default=None, help="replay the trace's steps N times per run"
    )
    traced.add_argument(
        "--placement",
        choices=[p.value for p in whatif.Placement],
        default=None,
        help="what-if: how variables are spread over --ps: round-robin (default, TensorFlow's) "
        "or size (greedy by bytes, as TF1's GreedyLoadBalancingStrategy)",
    )
    traced.add_argument(
        "--scale-tensors",
        type=float,
        default=None,
        metavar="X",
        help="what-if: every tensor's bytes times X (a wider model; default 1)",
    )


def _add_timing_flags(parser: argparse.ArgumentParser) -> None:
    timing = parser.add_argument_group("timing")
    timing.add_argument(
        "--warmup", type=float, default=2.0, help="warm-up seconds (default 2, the paper's)"
    )
    timing.add_argument(
        "--duration", type=float, default=None, help="measured seconds per run (default 10)"
    )
    timing.add_argument("--runs", type=int, default=5, help="measured runs (default 5)")
    timing.add_argument(
        "--pacing",
        choices=timing_names(),
        default=None,
        help="default: dependencies for a trace's ps-throughput, asap otherwise; "
        + "; ".join(f"{name}: {timing_spec(Timing(name)).summary}" for name in timing_names()),
    )
    timing.add_argument(
        "--compute",
        default=None,
        metavar="auto|here|recorded|none|SCALE",
        help="dependencies pacing: auto (default) scales the trace's compute gaps to this "
        "machine when the trace was captured on another one and both can time its model "
        "(here: always, or an error), recorded keeps them as captured, none drops them "
        "(communication only), SCALE scales them (0.5: compute twice as fast)",
    )
    timing.add_argument(
        "--time-dilation",
        default=None,
        metavar="K",
        help="dependencies pacing: run K times slower than the training predicted, on a link "
        "K times slower than it (the link is yours to shape; network compare shapes it and "
        "defaults to auto), and report every time divided by K: for a replay too slow on "
        "this machine for a fast link (default 1)",
    )
    timing.add_argument("--rate", type=float, default=None, help="calls per second per worker")
    timing.add_argument(
        "--speedup", type=float, default=None, help="recorded pacing: replay N times faster"
    )
    timing.add_argument(
        "--deadline",
        type=float,
        default=60.0,
        help="deadline of each call (the chunks of one payload share one), seconds (default 60)",
    )
    timing.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the servers to answer (default 10)",
    )


def _add_where_flags(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("where")
    where.add_argument(
        "--target",
        default=None,
        metavar="HOST:PORT[,...]",
        help="ps servers already running (tf-grpc-bench serve), in ps order "
        "(default: start servers on loopback)",
    )
    where.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="the token the servers' statistics and reset calls need (serve --token-file FILE)",
    )
    where.add_argument(
        "--procs-per-server",
        type=int,
        default=1,
        metavar="K",
        help="servers started here: each ps served by K processes sharing its port "
        "(SO_REUSEPORT), counted as one server (default 1)",
    )
    where.add_argument(
        "--procs-per-worker",
        default="1",
        metavar="K|auto",
        help="PS throughput: spread each worker's calls over K client processes (default 1); "
        "auto: the cores this process may use, shared by the workers and local servers",
    )
    where.add_argument(
        "--client-netns",
        default="",
        metavar="JOB=NAMESPACE[,...]",
        help="PS throughput of a trace, with --target: run the clients that stand for tasks "
        "of JOB (a ps calling a ps: ps; the chief's calls: chief) in that named network "
        "namespace, the emulated host where JOB ran in training (network compare sets it; "
        "root)",
    )
    where.add_argument(
        "--network-name",
        default="",
        metavar="NAME",
        help="name of the network the replay runs over, recorded in the results and shown "
        "in TensorBoard (default: loopback, or the interface and any tbf rate found on it)",
    )
    where.add_argument(
        "--output-dir",
        default=DEFAULT_OUTPUT_DIR,
        help=f"where run directories are made (default {DEFAULT_OUTPUT_DIR}/)",
    )
    where.add_argument(
        "--quiet", action="store_true", help="no progress bar and no table, just the paths"
    )


_SYNTHETIC_FLAGS = (
    ("generator", "--generator"),
    ("categories", "--categories"),
    ("skew_bias", "--skew-bias"),
    ("buffers", "--buffers"),
    ("payloads", "--payloads"),
    ("random_sizes", "--random-sizes"),
    ("small_size", "--small-size"),
    ("medium_size", "--medium-size"),
    ("large_size", "--large-size"),
    ("seed", "--seed"),
)
_TRACE_FLAGS = (
    ("pair", "--pair"),
    ("steps", "--steps"),
    ("passes", "--passes"),
    ("placement", "--placement"),
    ("scale_tensors", "--scale-tensors"),
)


def _parse_categories(text: str) -> tuple[SizeCategory, ...]:
    categories = []
    for name in (part.strip().lower() for part in text.split(",") if part.strip()):
        try:
            categories.append(SizeCategory(name))
        except ValueError:
            raise ConfigError(
                f"--categories {text!r}: {name!r} is not small, medium or large"
            ) from None
    return tuple(categories)


def _generator_config(args: argparse.Namespace) -> GeneratorConfig:
    defaults = GeneratorConfig()
    sizes = {}
    for category in SizeCategory:
        text = getattr(args, f"{category.value}_size")
        if text is not None:
            sizes[f"{category.value}_bytes"] = _size(f"--{category.value}-size", text)
    return GeneratorConfig(
        kind=GeneratorKind(args.generator) if args.generator else defaults.kind,
        categories=(
            _parse_categories(args.categories)
            if args.categories is not None
            else defaults.categories
        ),
        buffers_per_payload=args.buffers
        if args.buffers is not None
        else defaults.buffers_per_payload,
        sizes=BufferSizes(**sizes),
        seed=args.seed if args.seed is not None else defaults.seed,
        random_sizes=bool(args.random_sizes),
        skew_bias=SizeCategory(args.skew_bias) if args.skew_bias else None,
        payload_count=args.payloads if args.payloads is not None else defaults.payload_count,
    )


def _resolve_trace(args: argparse.Namespace) -> Path | None:
    if args.trace is not None:
        if args.synthetic:
            raise UsageError("give a TRACE or --synthetic, not both")
        from tf_grpc_bench.inspect import resolve_trace_argument

        return resolve_trace_argument(args.trace)
    if args.synthetic:
        return None
    return trace_files.default_trace_path()


def parse_compute(text: str | None) -> float:
    """``--compute``: ``recorded`` (1), ``none`` (0) or a non-negative scale
    (``auto`` and ``here`` are resolved against the trace: ``compute_to_here``)."""
    return Compute.parse(text or "recorded").scale


def _time_dilation(args: argparse.Namespace) -> float:
    return planning.parse_time_dilation(getattr(args, "time_dilation", None)) or 1.0


def _pacing_choice(
    args: argparse.Namespace, to_here: calibration.ComputeToHere | None = None
) -> PacingChoice:
    compute = args.compute
    explicit = compute not in (None, COMPUTE_AUTO)
    scale = to_here.scale if to_here is not None else None
    return PacingChoice(
        timing=None if args.pacing is None else Timing(args.pacing),
        rate_per_s=args.rate,
        speedup=args.speedup,
        compute_scale=_explicit_scale(compute, scale) if explicit else None,
        default_compute_scale=scale,
        outstanding=args.outstanding,
        time_dilation=_time_dilation(args),
    )


def _explicit_scale(compute: str, to_here: float | None) -> float:
    if compute == COMPUTE_HERE:
        # None: no workload paces dependencies, which the runner reports for --compute.
        return to_here if to_here is not None else 1.0
    return parse_compute(compute)


def compute_to_here(
    args: argparse.Namespace, trace: Trace, workloads: Sequence[Workload]
) -> calibration.ComputeToHere | None:
    """``--compute auto`` (the default) or ``here``: the scale taking the trace's compute to
    this machine, for the workloads that keep compute (dependencies pacing); None otherwise."""
    if args.compute not in (None, COMPUTE_AUTO, COMPUTE_HERE):
        return None
    choice = PacingChoice(timing=None if args.pacing is None else Timing(args.pacing))
    if not any(runner.timing_for(w, choice) is Timing.DEPENDENCIES for w in workloads):
        return None
    here = host.this_machine()
    return calibration.compute_to_here(
        trace.metadata.extra,
        here,
        required=args.compute == COMPUTE_HERE,
        max_scale=MAX_COMPUTE_SCALE,
    )


def check_replay_flags(args: argparse.Namespace) -> None:
    """The checks of ``build_request`` that need neither the trace nor this machine:
    what any host refuses at start (``emit`` runs them on the pods' flags).
    Raises UsageError/ConfigError."""
    benchmarks.parse_benchmarks(args.benchmark)
    if args.trace is not None and args.synthetic:
        raise UsageError("give a TRACE or --synthetic, not both")
    _check_counts(args)
    _run_plan(args)
    _targets(args)
    grpc_settings.settings_from_args(args)
    parse_procs_per_worker(args.procs_per_worker)
    if args.compute not in (None, COMPUTE_AUTO, COMPUTE_HERE):
        parse_compute(args.compute)
    if args.synthetic:
        _generator_config(args)


def build_request(
    args: argparse.Namespace, *, whole_steps: WholeSteps = WHOLE_STEPS
) -> ReplayRequest:
    """Validate every flag and build the workloads.  Raises UsageError/ConfigError/TraceError.

    ``whole_steps``: which calls beyond worker <-> ps a trace replay makes.  Given
    ``--target``s too few for the chief-to-worker calls' stand-in servers (the
    trace's ps tasks only, say), those calls are dropped (and counted) instead.
    """
    chosen = benchmarks.parse_benchmarks(args.benchmark)
    trace_path = _resolve_trace(args)
    mode = Mode(args.mode)
    _check_counts(args)
    plan = _run_plan(args)
    targets = _targets(args)
    settings = grpc_settings.settings_from_args(args)
    grpc_parameters = settings.as_parameters()
    if args.outstanding is None:
        # Each benchmark records its own window ("outstanding"): 1 or the trace's.
        grpc_parameters.pop("grpc_outstanding_rpcs", None)
    config: dict[str, str | int | float | bool] = {
        "benchmark": ",".join(b.value for b in chosen),
        "mode": mode.value,
        "rpc": args.rpc or "default",
        "pacing": args.pacing or "default",
        "warmup_s": plan.warmup_ns / NS_PER_S,
        "duration_s": plan.duration_ns / NS_PER_S,
        "runs": args.runs,
        "deadline_s": plan.deadline_s,
        "targets": ",".join(targets) if targets else "loopback",
        **grpc_parameters,
    }
    derivation = None
    to_here = None
    if trace_path is None:
        workloads = _synthetic_workloads(args, chosen, mode)
        config["workload"] = "synthetic"
    else:
        workloads, derivation, to_here = _replayed_trace(
            args, trace_path, chosen, mode, whole_steps, targets
        )
        config["workload"] = "trace" if derivation is None else "what-if"
        if derivation is not None:
            # Flat, for TensorBoard's HParams; the document's what_if says it in full.
            config["what_if_placement"] = derivation.placement
            config["what_if_scale_tensors"] = derivation.scale_tensors
        config["trace"] = str(trace_path)
    planned = runner.plan_workloads(
        workloads,
        settings=settings,
        targets=targets,
        rpc=None if args.rpc is None else RpcKind(args.rpc),
        pacing=_pacing_choice(args, to_here),
    )
    runner.check_procs_per_server(args.procs_per_server, planned.workloads, targets)
    procs_per_worker = _procs_per_worker(args, planned.workloads, planned.pacings, targets)
    config["procs_per_worker"] = args.procs_per_worker.strip().lower()
    namespaces = runner.parse_client_namespaces(args.client_netns, planned.workloads, targets)
    if namespaces:
        config["client_netns"] = runner.format_client_namespaces(dict(namespaces))
    return ReplayRequest(
        benchmarks=chosen,
        trace_path=trace_path,
        workloads=planned.workloads,
        pacings=planned.pacings,
        rpcs=planned.rpcs,
        plan=plan,
        mode=mode,
        targets=targets,
        grpc=settings,
        config=config,
        grpc_parameters=dict(grpc_parameters),
        control_token=_token(args),
        what_if=derivation,
        procs_per_worker=procs_per_worker,
        procs_per_server=args.procs_per_server,
        client_namespaces=namespaces,
    )


def _check_counts(args: argparse.Namespace) -> None:
    """ConfigError for a count flag out of its range."""
    limits = {
        "buffers": MAX_BUFFERS_PER_PAYLOAD,
        "payloads": MAX_PAYLOADS,
        "ps": runner.MAX_LOCAL_PROCESSES,
        "workers": runner.MAX_LOCAL_PROCESSES,
    }
    for name in ("buffers", "payloads", "ps", "workers", "runs", "steps", "passes"):
        _positive_int(f"--{name}", getattr(args, name), limits.get(name, MAX_COUNT))
    if args.outstanding is not None:
        _positive_int("--outstanding", args.outstanding)


def _procs_per_worker(
    args: argparse.Namespace,
    workloads: Sequence[Workload],
    pacings: Sequence[Pacing],
    targets: tuple[str, ...] | None,
) -> int:
    """``--procs-per-worker``, ``auto`` resolved (``runner.procs_per_worker_for``)."""
    requested = parse_procs_per_worker(args.procs_per_worker)
    servers = 0
    if targets is None:
        servers = max(w.server_count for w in workloads) * args.procs_per_server
    return runner.procs_per_worker_for(requested, workloads, pacings, server_processes=servers)


def _run_plan(args: argparse.Namespace) -> RunPlan:
    warmup_ns = _seconds("--warmup", args.warmup, allow_zero=True, maximum=MAX_RUN_S)
    duration_ns = _seconds(
        "--duration",
        args.duration if args.duration is not None else 10.0,
        allow_zero=False,
        maximum=MAX_RUN_S,
    )
    deadline = _seconds("--deadline", args.deadline, allow_zero=False) / NS_PER_S
    connect = _seconds("--connect-timeout", args.connect_timeout, allow_zero=False) / NS_PER_S
    if args.duration is not None and (args.steps is not None or args.passes is not None):
        raise UsageError("--duration and --steps/--passes are alternatives; give one")
    # Times asked are the predicted training's; a dilated run takes that many times longer.
    dilation = _time_dilation(args)
    return RunPlan(
        warmup_ns=round(warmup_ns * dilation),
        duration_ns=round(duration_ns * dilation),
        runs=args.runs,
        steps=args.steps,
        passes=args.passes,
        deadline_s=deadline * dilation,
        connect_timeout_s=connect,
        time_dilation=dilation,
    )


def _targets(args: argparse.Namespace) -> tuple[str, ...] | None:
    if args.target is None:
        return None
    targets = tuple(parse_target(t) for t in args.target.split(",") if t.strip())
    if not targets:
        raise ConfigError("--target: expected HOST:PORT[,HOST:PORT...]")
    return targets


def _synthetic_workloads(
    args: argparse.Namespace, benchmarks: tuple[Benchmark, ...], mode: Mode
) -> list[Workload]:
    for flag_attribute, flag in _TRACE_FLAGS:
        if getattr(args, flag_attribute) is not None:
            raise UsageError(f"{flag} applies to trace replays, not to --synthetic workloads")
    if args.pacing is not None:
        check_source(Timing(args.pacing), "synthetic")
    return planning.synthetic_workloads(
        benchmarks,
        _generator_config(args),
        mode=mode,
        ps_count=args.ps if args.ps is not None else 1,
        worker_count=args.workers if args.workers is not None else 1,
    )


def _replayed_trace(
    args: argparse.Namespace,
    trace_path: Path,
    benchmarks: tuple[Benchmark, ...],
    mode: Mode,
    whole_steps: WholeSteps,
    targets: tuple[str, ...] | None,
) -> tuple[list[Workload], whatif.Derivation | None, calibration.ComputeToHere | None]:
    """The trace's workloads (``_trace_workloads``; without the stand-in servers of the
    chief's calls when ``targets`` are too few for them), and its compute brought to this
    machine (``compute_to_here``), which their results name."""
    trace = trace_files.read_trace(trace_path)
    workloads, derivation = _trace_workloads(args, trace, trace_path, benchmarks, mode, whole_steps)
    if targets is not None and len(targets) < max(w.server_count for w in workloads):
        without_stand_ins = replace(whole_steps, stand_in_servers=False)
        workloads, derivation = _trace_workloads(
            args, trace, trace_path, benchmarks, mode, without_stand_ins
        )
    to_here = compute_to_here(args, trace, workloads)
    if to_here is not None:
        entry = ("compute_calibration", to_here.description)
        workloads = [replace(w, description=(*w.description, entry)) for w in workloads]
    return workloads, derivation, to_here


def _trace_workloads(
    args: argparse.Namespace,
    trace: Trace,
    trace_path: Path,
    benchmarks: tuple[Benchmark, ...],
    mode: Mode,
    whole_steps: WholeSteps,
) -> tuple[list[Workload], whatif.Derivation | None]:
    """The trace's workloads, of the what-if cluster the flags ask for if any, and how
    that cluster was derived (None for the captured one)."""
    for flag_attribute, flag in _SYNTHETIC_FLAGS:
        if getattr(args, flag_attribute) is not None:
            raise UsageError(
                f"{flag} shapes the synthetic workload; a trace brings its own "
                "(add --synthetic to use the generators)"
            )
    workloads, derivation = planning.trace_workloads(
        trace,
        benchmarks,
        mode=mode,
        source=str(trace_path),
        trace_name=trace_path.stem,
        what_if=what_if_of(args, trace),
        pair=args.pair,
        whole_steps=whole_steps,
    )
    machine = host.captured_on(trace.metadata.extra)
    if machine:
        # Whose compute the trace's gaps are (``report.compute_machine_note``).
        workloads = [
            replace(w, description=(*w.description, ("captured_on", machine))) for w in workloads
        ]
    # How busy the capture machine was (``report.capture_cpu_note``).
    cpu = capture_cpu.described(trace.metadata.extra)
    if cpu:
        workloads = [replace(w, description=(*w.description, *cpu)) for w in workloads]
    return workloads, derivation


def what_if_of(args: argparse.Namespace, trace: Trace) -> whatif.WhatIf | None:
    """The cluster ``--workers``/``--ps``/``--placement``/``--scale-tensors`` ask a trace
    replay about (the captured one where a flag is not given), or None without them."""
    return planning.what_if_of(
        trace,
        workers=args.workers,
        ps=args.ps,
        placement=None if args.placement is None else whatif.Placement(args.placement),
        scale_tensors=args.scale_tensors,
    )


def run_replay(args: argparse.Namespace) -> int:
    from tf_grpc_bench.replay.output import document as results
    from tf_grpc_bench.replay.output import report
    from tf_grpc_bench.replay.output.run_directories import discard_run_directory, new_run_directory

    request = build_request(args)
    # Made (and so checked writable) before anything is measured.
    base_existed = Path(args.output_dir).exists()
    run_directory = new_run_directory(args.output_dir, runner.run_label(request))
    tls_dir: Path | None = None
    if request.grpc.tls:
        tls_dir = Path(args.tls_dir) if args.tls_dir else run_directory / "tls"
    progress = ProgressBar(
        len(request.workloads) * request.plan.runs,
        enabled=not args.quiet and sys.stderr.isatty(),
    )
    try:
        with contextlib.closing(progress):
            executed = runner.execute(request, tls_dir=tls_dir, on_progress=progress)
    except BaseException:
        # Nothing was measured: leave no empty run directory behind.
        discard_run_directory(run_directory, base_existed=base_existed)
        raise
    document = runner.record(request, executed, run_directory, network_name=args.network_name)
    if not args.quiet:
        print(report.format_table(document))
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
    print(f"view:    tensorboard --logdir {args.output_dir}")
    _raise_if_partial(document.partial, document.partial_reason, run_directory)
    return 0


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
# role and network: their own flags, then the replay flags and request above.


def configure_role(parser: argparse.ArgumentParser) -> None:
    role.add_placement_flags(parser)
    configure_replay(parser)


def check_role(args: argparse.Namespace) -> None:
    """What every ``role`` task refuses at start, whatever its host (``cli.check_command``)."""
    role.check_flags(args)
    check_replay_flags(args)


def run_role(args: argparse.Namespace) -> int:
    # role places every call of a step that its cluster can (``role.WHOLE_STEP_CHOICES``).
    return role.run_role(args, build_request=build_request)


def configure_network(parser: argparse.ArgumentParser) -> None:
    network_cli.configure_network(parser, replay_flags=configure_replay)


def run_network(args: argparse.Namespace) -> int:
    return network_cli.run_network(
        args,
        build_request=build_request,
        replay_flags=configure_replay,
        serve_flags=configure_serve,
    )
