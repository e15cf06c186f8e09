"""The flags of ``serve``, ``replay`` (and so ``role`` and ``network compare``), and the
typed records they make: argparse ends here.

``configure_*`` add a command's flags to a parser; ``serve_spec``, ``replay_spec``
and ``grpc_flags`` turn the parsed flags into ``spec.ServeSpec``,
``spec.ReplaySpec`` and ``spec.GrpcFlags``, parsing every text flag once
(sizes, targets, categories, ``--compute``, ``--time-dilation``, ...) with a
one-line error naming the flag.  ``replay_from_argv`` parses a replay's command
line (``ReplaySpec.to_argv``'s inverse).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay.core import benchmarks, compute_load, planning, processes, whatif
from tf_grpc_bench.replay.core.benchmarks import RpcKind
from tf_grpc_bench.replay.core.generators import GeneratorKind
from tf_grpc_bench.replay.core.pacing import Compute, Timing, timing_names, timing_spec
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.spec import (
    DEFAULT_ENGINE,
    DEFAULT_OUTPUT_DIR,
    GrpcFlags,
    ReplaySpec,
    ServeSpec,
)
from tf_grpc_bench.replay.transport.client import parse_target
from tf_grpc_bench.replay.transport.grpc_settings import (
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    Compression,
    GrpcSettings,
)
from tf_grpc_bench.replay.transport.server import DEFAULT_PORT
from tf_grpc_bench.sizes import SizeCategory, parse_size


def size(flag: str, text: str) -> int:
    """A size flag (``10``, ``64KB``, ``1.5MiB``) in bytes; ConfigError naming the flag."""
    try:
        return parse_size(text)
    except ValueError as error:
        raise ConfigError(f"{flag} {text!r}: {error}") from None


def _optional_size(flag: str, text: str | None) -> int | None:
    return None if text is None else size(flag, text)


# --------------------------------------------------------------------------
# gRPC settings.


def add_grpc_flags(parser: argparse.ArgumentParser) -> None:
    """The gRPC settings flags, shared by ``serve``, ``replay`` and ``network compare``."""
    defaults = GrpcSettings()
    group = parser.add_argument_group("gRPC settings")
    group.add_argument(
        "--channels",
        type=int,
        default=defaults.channels,
        help="channels (TCP connections) per client",
    )
    group.add_argument(
        "--outstanding",
        type=int,
        default=None,
        metavar="N",
        help="RPCs in flight per client (default: the benchmark's own: 1, or the trace's)",
    )
    group.add_argument(
        "--compression",
        default=defaults.compression.value,
        choices=[c.value for c in Compression],
        help="message compression (default: none)",
    )
    group.add_argument(
        "--max-message-size",
        default=str(defaults.max_message_bytes),
        metavar="SIZE",
        help="largest message sent or accepted, e.g. 64MB (default: 2 GiB - 1, as TensorFlow)",
    )
    group.add_argument(
        "--chunk-size",
        default="0",
        metavar="SIZE",
        help="send payloads larger than SIZE as several messages on a stream (default 0: off)",
    )
    group.add_argument(
        "--tls",
        action="store_true",
        help="TLS with a CA and server certificate generated for the run (default: plaintext)",
    )
    group.add_argument(
        "--tls-dir",
        default=None,
        metavar="DIR",
        help="where the run's TLS files are (reused) or made (default: the run directory/tls)",
    )
    group.add_argument(
        "--keepalive-ms",
        type=int,
        default=0,
        metavar="MS",
        help="HTTP/2 keepalive ping interval in ms (default 0: off)",
    )
    group.add_argument(
        "--keepalive-timeout-ms",
        type=int,
        default=DEFAULT_KEEPALIVE_TIMEOUT_MS,
        metavar="MS",
        help=f"keepalive ping timeout in ms (default {DEFAULT_KEEPALIVE_TIMEOUT_MS})",
    )


def grpc_flags(args: argparse.Namespace) -> GrpcFlags:
    """``add_grpc_flags``' flags as ``GrpcFlags`` (validated)."""
    return GrpcFlags(
        channels=args.channels,
        outstanding=args.outstanding,
        compression=Compression.parse(args.compression),
        max_message_bytes=size("--max-message-size", args.max_message_size),
        chunk_bytes=size("--chunk-size", args.chunk_size),
        tls=bool(args.tls),
        tls_dir=args.tls_dir,
        keepalive_ms=args.keepalive_ms,
        keepalive_timeout_ms=args.keepalive_timeout_ms,
    )


def settings_from_args(args: argparse.Namespace, *, default_outstanding: int = 1) -> GrpcSettings:
    """Build and validate GrpcSettings from ``add_grpc_flags``' flags."""
    return grpc_flags(args).settings(default_outstanding=default_outstanding)


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
    _add_engine_flag(parser, "what runs the servers")
    add_grpc_flags(parser)


def _add_engine_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    parser.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        metavar="NAME",
        help=f"{what}: grpcio (gRPC's Python binding), grpc-cpp (gRPC C++, built on first "
        "use; 'tf-grpc-bench engine' says whether it is) or auto: grpc-cpp where it builds "
        f"here, grpcio otherwise (default {DEFAULT_ENGINE})",
    )


def serve_spec(args: argparse.Namespace) -> ServeSpec:
    """``configure_serve``'s flags as a ``ServeSpec`` (validated)."""
    grpc = grpc_flags(args)
    return ServeSpec(
        host=args.host,
        port=args.port,
        mode=Mode(args.mode),
        servers=args.servers,
        procs_per_server=args.procs_per_server,
        max_response_bytes=_optional_size("--max-response", args.max_response),
        token_file=args.token_file,
        grpc=grpc,
        engine=args.engine,
    )


# --------------------------------------------------------------------------
# replay


def configure_replay(parser: argparse.ArgumentParser) -> None:
    _add_what_flags(parser)
    _add_synthetic_flags(parser)
    _add_trace_flags(parser)
    _add_timing_flags(parser)
    _add_where_flags(parser)
    add_grpc_flags(parser)


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
        help=f"default: {_default_timings()}; "
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
    timing.add_argument(
        "--compute-load",
        default=compute_load.AUTO,
        metavar="|".join(compute_load.MODES),
        help="dependencies pacing: burner processes keep the cores as busy as training's "
        "tasks kept them (the trace's capture CPU less the replay's own, measured in the "
        "warm-up): gaps in each task's compute gaps, uniform all along, none adds nothing; "
        "auto (default): uniform for a ps-throughput replay of a trace that records its "
        "capture CPU, else none, saying why (docs/fidelity.md, Compute load)",
    )
    timing.add_argument("--compute-load-wait", action="store_true", help=compute_load.WAIT_HELP)
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
        help="seconds to wait for the servers to answer (default 10); for their figures after a "
        "run cut short, no longer than --deadline",
    )


def _default_timings() -> str:
    """Each benchmark's timing unless told: ``dependencies for a trace's ps-throughput, asap
    otherwise`` (the rows' defaults)."""
    special = [
        f"{spec.trace.timing.value} for a trace's {spec.name}"
        for spec in benchmarks.registered()
        if spec.trace.timing is not Timing.ASAP
    ]
    return ", ".join([*special, "asap otherwise"])


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
    _add_engine_flag(where, "what runs the servers started here and the benchmarks' calls")


def replay_spec(args: argparse.Namespace, *, auto_dilation: bool = False) -> ReplaySpec:
    """``configure_replay``'s flags as a ``ReplaySpec`` (validated); ``auto_dilation``:
    ``--time-dilation auto`` is allowed (None, as not given: ``network compare``)."""
    return ReplaySpec(
        trace=args.trace,
        synthetic=args.synthetic,
        benchmarks=benchmarks.parse_benchmarks(args.benchmark),
        mode=Mode(args.mode),
        rpc=None if args.rpc is None else RpcKind(args.rpc),
        generator=None if args.generator is None else GeneratorKind(args.generator),
        categories=None if args.categories is None else parse_categories(args.categories),
        skew_bias=None if args.skew_bias is None else SizeCategory(args.skew_bias),
        buffers=args.buffers,
        payloads=args.payloads,
        random_sizes=bool(args.random_sizes),
        small_bytes=_optional_size("--small-size", args.small_size),
        medium_bytes=_optional_size("--medium-size", args.medium_size),
        large_bytes=_optional_size("--large-size", args.large_size),
        seed=args.seed,
        ps=args.ps,
        workers=args.workers,
        pair=args.pair,
        steps=args.steps,
        passes=args.passes,
        placement=None if args.placement is None else whatif.Placement(args.placement),
        scale_tensors=args.scale_tensors,
        warmup_s=args.warmup,
        duration_s=args.duration,
        runs=args.runs,
        pacing=None if args.pacing is None else Timing(args.pacing),
        compute=None if args.compute is None else Compute.parse(args.compute),
        time_dilation=_time_dilation(args.time_dilation, auto_dilation),
        compute_load=args.compute_load,
        compute_load_wait=args.compute_load_wait,
        rate=args.rate,
        speedup=args.speedup,
        deadline_s=args.deadline,
        connect_timeout_s=args.connect_timeout,
        targets=None if args.target is None else parse_targets(args.target),
        token_file=args.token_file,
        procs_per_server=args.procs_per_server,
        procs_per_worker=processes.parse_procs_per_worker(args.procs_per_worker),
        client_netns=parse_client_netns(args.client_netns),
        network_name=args.network_name,
        output_dir=args.output_dir,
        quiet=args.quiet,
        engine=args.engine,
        grpc=grpc_flags(args),
    )


def _time_dilation(text: str | None, auto: bool) -> float | None:
    """``--time-dilation``: None when not given (1), or ``auto`` where allowed."""
    if text is None:
        return None
    return planning.parse_time_dilation(text, allow_auto=auto)


def parse_categories(text: str) -> tuple[SizeCategory, ...]:
    """``--categories small,large``; ConfigError for a name that is not a category."""
    categories = []
    for name in (part.strip().lower() for part in text.split(",") if part.strip()):
        try:
            categories.append(SizeCategory(name))
        except ValueError:
            raise ConfigError(
                f"--categories {text!r}: {name!r} is not small, medium or large"
            ) from None
    return tuple(categories)


def parse_targets(text: str) -> tuple[str, ...]:
    """``--target HOST:PORT[,HOST:PORT...]``; ConfigError for a malformed one."""
    targets = tuple(parse_target(t) for t in text.split(",") if t.strip())
    if not targets:
        raise ConfigError("--target: expected HOST:PORT[,HOST:PORT...]")
    return targets


def parse_client_netns(text: str) -> tuple[tuple[str, str], ...]:
    """``--client-netns JOB=NAMESPACE[,JOB=NAMESPACE...]``; UsageError if malformed."""
    if not text.strip():
        return ()
    flag = f"--client-netns {text!r}"
    placed: dict[str, str] = {}
    for item in text.split(","):
        job, equals, namespace = (part.strip() for part in item.partition("="))
        if not equals or not job or not namespace:
            raise UsageError(f"{flag}: expected JOB=NAMESPACE[,JOB=NAMESPACE...]")
        if job in placed:
            raise UsageError(f"{flag}: job {job!r} given twice")
        placed[job] = namespace
    return tuple(placed.items())


def replay_parser() -> argparse.ArgumentParser:
    """A parser of ``replay``'s flags alone."""
    parser = argparse.ArgumentParser(prog="tf-grpc-bench replay", add_help=False)
    configure_replay(parser)
    return parser


def replay_from_argv(argv: Sequence[str]) -> ReplaySpec:
    """The ``ReplaySpec`` of a ``replay`` command line (``ReplaySpec.to_argv``'s inverse)."""
    return replay_spec(replay_parser().parse_args(list(argv)))
