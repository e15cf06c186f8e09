"""What a replay or a server is asked to do: typed records built once from the flags.

``ReplaySpec`` holds every flag of ``tf-grpc-bench replay`` (``role`` and
``network compare`` take the same) as a typed field, validated when it is
made; ``ServeSpec`` those of ``serve``; ``GrpcFlags`` the gRPC settings both
take.  They are plain frozen data: ``dataclasses.replace`` derives one from
another (``role`` shapes a synthetic workload like its cluster, ``network
compare`` hands each profile's replay its own targets), and ``to_argv`` gives
the command line that makes the same record again (``replay.cli`` parses it:
``spec == from_argv(spec.to_argv())``), built field by field from ``FLAGS``,
the one table of field -> flag that messages name flags by.

What a spec needs of this machine or of files (the trace, the servers'
token, the calibration) is for ``request.plan``; what is checked here holds
on any machine.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from tf_grpc_bench.bounds import MAX_COUNT, MAX_RUN_S, check_count, check_seconds
from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay.core import benchmarks, compute_load, processes
from tf_grpc_bench.replay.core.benchmarks import RpcKind
from tf_grpc_bench.replay.core.generators import (
    MAX_BUFFERS_PER_PAYLOAD,
    MAX_PAYLOADS,
    GeneratorKind,
)
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.named import OpenName
from tf_grpc_bench.replay.core.pacing import MAX_TIME_DILATION, Compute, PacingError, Timing
from tf_grpc_bench.replay.core.planning import MAX_LOCAL_PROCESSES, check_server_processes
from tf_grpc_bench.replay.core.whatif import Placement
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.transport.client import parse_target
from tf_grpc_bench.replay.transport.grpc_settings import (
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    MAX_MESSAGE_LIMIT_BYTES,
    Compression,
    GrpcSettings,
)
from tf_grpc_bench.replay.transport.server import DEFAULT_PORT
from tf_grpc_bench.sizes import SizeCategory

DEFAULT_OUTPUT_DIR = "runs"
#: The replay engine unless ``--engine`` says otherwise (``engines.registry``): ``auto``,
#: gRPC C++ where it builds on this host, grpcio elsewhere (``registry.resolve_auto``).
DEFAULT_ENGINE = "auto"


# --------------------------------------------------------------------------
# Field -> flag.

#: The flag of each field (``ReplaySpec``, ``ServeSpec``, ``GrpcFlags``) where it is not
#: ``--`` + the field's name with hyphens; the trace is the positional argument.
FLAGS = {
    "benchmarks": "--benchmark",
    "small_bytes": "--small-size",
    "medium_bytes": "--medium-size",
    "large_bytes": "--large-size",
    "warmup_s": "--warmup",
    "duration_s": "--duration",
    "deadline_s": "--deadline",
    "connect_timeout_s": "--connect-timeout",
    "targets": "--target",
    "max_message_bytes": "--max-message-size",
    "chunk_bytes": "--chunk-size",
    "max_response_bytes": "--max-response",
}


def flag_of(name: str) -> str:
    """The command-line flag of a spec field (``warmup_s`` -> ``--warmup``)."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def _text(value: Any) -> str:
    """A field's value as its flag takes it."""
    if isinstance(value, enum.Enum | OpenName):
        return str(value.value)
    if isinstance(value, Compute):
        return value.text
    if isinstance(value, tuple):
        return ",".join(
            "=".join(item) if isinstance(item, tuple) else _text(item) for item in value
        )
    return repr(value) if isinstance(value, float) else str(value)


def _argv(record: Any, formats: dict[str, Callable[[Any], str | None]] | None = None) -> list[str]:
    """``record``'s flags, field by field, where a value differs from the field's default
    (a nested record's own flags in its place).  ``formats`` turns a field's value into
    its flag's text (None: leave the flag out)."""
    default = type(record)()
    argv: list[str] = []
    for item in fields(record):
        value, unset = getattr(record, item.name), getattr(default, item.name)
        if isinstance(value, GrpcFlags):
            argv += value.to_argv()
        elif value != unset and value is not None and item.name != "trace":
            text = (formats or {}).get(item.name, _text)(value)
            if isinstance(value, bool):
                argv += [flag_of(item.name)] if value else []
            elif text is not None:
                # One token: a value may begin with '-' (a negative seed, a file name).
                argv.append(f"{flag_of(item.name)}={text}")
    return argv


# --------------------------------------------------------------------------
# gRPC settings.


@dataclass(frozen=True, slots=True, kw_only=True)
class GrpcFlags:
    """The gRPC settings flags (``replay``, ``serve``, ``network compare``)."""

    channels: int = 1
    #: Calls in flight per client; None: the benchmark's own (1, or the trace's).
    outstanding: int | None = None
    compression: Compression = Compression.NONE
    max_message_bytes: int = MAX_MESSAGE_LIMIT_BYTES
    chunk_bytes: int = 0
    tls: bool = False
    #: Where the run's TLS files are (reused) or made; None: the run directory's ``tls``.
    tls_dir: str | None = None
    keepalive_ms: int = 0
    keepalive_timeout_ms: int = DEFAULT_KEEPALIVE_TIMEOUT_MS

    def __post_init__(self) -> None:
        self.settings()

    def settings(self, *, default_outstanding: int = 1) -> GrpcSettings:
        """The validated ``GrpcSettings`` (ConfigError naming the flag otherwise)."""
        return GrpcSettings(
            channels=self.channels,
            outstanding_rpcs=self.outstanding
            if self.outstanding is not None
            else default_outstanding,
            compression=self.compression,
            max_message_bytes=self.max_message_bytes,
            chunk_bytes=self.chunk_bytes,
            tls=self.tls,
            keepalive_time_ms=self.keepalive_ms,
            keepalive_timeout_ms=self.keepalive_timeout_ms,
        )

    def to_argv(self) -> list[str]:
        return _argv(self)


# --------------------------------------------------------------------------
# serve


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSpec:
    """``tf-grpc-bench serve``: ps servers on ``port`` .. ``port + servers - 1``."""

    host: str = "localhost"
    port: int = DEFAULT_PORT
    mode: Mode = Mode.NON_SERIALIZED
    servers: int = 1
    procs_per_server: int = 1
    #: Largest response a client may ask for; None: the message size limit.
    max_response_bytes: int | None = None
    token_file: str | None = None
    grpc: GrpcFlags = field(default_factory=GrpcFlags)
    #: What runs the servers (``engines.registry``).
    engine: str = DEFAULT_ENGINE

    def __post_init__(self) -> None:
        if not self.engine:
            raise UsageError("--engine: expected an engine's name")
        check_count("--servers", self.servers, maximum=MAX_LOCAL_PROCESSES)
        check_server_processes(self.servers, self.procs_per_server)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {self.port}")
        if self.servers > 1 and self.port == 0:
            raise UsageError("--servers N needs a fixed --port (servers use PORT..PORT+N-1)")
        if self.port + self.servers - 1 > 65535:
            raise ConfigError(f"--port {self.port} + --servers {self.servers} goes past port 65535")

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(self.port + i for i in range(self.servers))

    def to_argv(self) -> list[str]:
        return _argv(self)


# --------------------------------------------------------------------------
# replay


#: Fields that shape the paper's generators (refused with a trace).
SYNTHETIC_FIELDS = (
    "generator",
    "categories",
    "skew_bias",
    "buffers",
    "payloads",
    "random_sizes",
    "small_bytes",
    "medium_bytes",
    "large_bytes",
    "seed",
)
#: Fields of trace replays only (refused with ``--synthetic`` workloads).
TRACE_FIELDS = ("pair", "steps", "passes", "placement", "scale_tensors")


def _all_benchmarks() -> tuple[Benchmark, ...]:
    return benchmarks.parse_benchmarks("all")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySpec:
    """Every flag of ``tf-grpc-bench replay``, typed; None where the flag was not given
    and the default depends on the workload."""

    # What.
    #: Trace file or shipped trace name; None: the shipped default (``synthetic`` False).
    trace: str | None = None
    synthetic: bool = False
    benchmarks: tuple[Benchmark, ...] = field(default_factory=_all_benchmarks)
    mode: Mode = Mode.NON_SERIALIZED
    rpc: RpcKind | None = None
    # The paper's generators.
    generator: GeneratorKind | None = None
    categories: tuple[SizeCategory, ...] | None = None
    skew_bias: SizeCategory | None = None
    buffers: int | None = None
    payloads: int | None = None
    random_sizes: bool = False
    small_bytes: int | None = None
    medium_bytes: int | None = None
    large_bytes: int | None = None
    seed: int | None = None
    #: Synthetic PS throughput's ps and workers; with a trace, a what-if cluster.
    ps: int | None = None
    workers: int | None = None
    # Trace replays.
    pair: str | None = None
    steps: int | None = None
    passes: int | None = None
    placement: Placement | None = None
    scale_tensors: float | None = None
    # Timing.
    warmup_s: float = 2.0
    #: None: 10 s, unless ``steps`` or ``passes`` say how much.
    duration_s: float | None = None
    runs: int = 5
    pacing: Timing | None = None
    #: None: ``auto``.
    compute: Compute | None = None
    #: None: 1 (``network compare`` chooses per link).
    time_dilation: float | None = None
    #: ``core.compute_load.MODES``: burners keep the cores as busy as training did
    #: (``auto``: ``compute_load.choose``).
    compute_load: str = compute_load.AUTO
    #: A round ends once the compute load's quotas of it are done (``RunPlan``).
    compute_load_wait: bool = False
    rate: float | None = None
    speedup: float | None = None
    deadline_s: float = 60.0
    connect_timeout_s: float = 10.0
    # Where.
    #: Servers already running, in ps order; None: servers started here.
    targets: tuple[str, ...] | None = None
    token_file: str | None = None
    procs_per_server: int = 1
    #: None: ``auto`` (the cores this process may use).
    procs_per_worker: int | None = 1
    #: (job, named network namespace) its clients run in.
    client_netns: tuple[tuple[str, str], ...] = ()
    network_name: str = ""
    output_dir: str = DEFAULT_OUTPUT_DIR
    quiet: bool = False
    engine: str = DEFAULT_ENGINE
    grpc: GrpcFlags = field(default_factory=GrpcFlags)

    def __post_init__(self) -> None:
        validate(self)

    @property
    def run_s(self) -> float:
        """Measured seconds per run (``duration_s``, default 10)."""
        return self.duration_s if self.duration_s is not None else 10.0

    def given(self, names: tuple[str, ...]) -> list[str]:
        """The flags of ``names`` that this spec sets (not None, not False)."""
        return [flag_of(n) for n in names if getattr(self, n) not in (None, False)]

    def to_argv(self) -> list[str]:
        """The command line of ``replay`` that makes this spec again (``replay.cli``)."""
        formats: dict[str, Callable[[Any], str | None]] = {
            "benchmarks": lambda chosen: None if chosen == _all_benchmarks() else _text(chosen),
            "procs_per_worker": lambda count: str(count),
        }
        argv = [] if self.trace is None else [self.trace]
        argv += _argv(self, formats)
        if self.procs_per_worker is None:
            argv.append(f"{flag_of('procs_per_worker')}={processes.AUTO}")
        return argv


def validate(spec: ReplaySpec) -> None:
    """ConfigError or UsageError, naming the flag, for what no machine could replay."""
    if spec.trace is not None and spec.synthetic:
        raise UsageError("give a TRACE or --synthetic, not both")
    if spec.trace is not None and spec.trace.startswith("-"):
        raise UsageError(f"TRACE {spec.trace!r} reads as a flag; give it as ./{spec.trace}")
    if not spec.benchmarks:
        raise UsageError("--benchmark: expected all or one or more benchmarks")
    limits = {
        "buffers": MAX_BUFFERS_PER_PAYLOAD,
        "payloads": MAX_PAYLOADS,
        "ps": MAX_LOCAL_PROCESSES,
        "workers": MAX_LOCAL_PROCESSES,
    }
    for name in ("buffers", "payloads", "ps", "workers", "runs", "steps", "passes"):
        check_count(flag_of(name), getattr(spec, name), maximum=limits.get(name, MAX_COUNT))
    check_count("--outstanding", spec.grpc.outstanding)
    check_seconds("--warmup", spec.warmup_s, allow_zero=True, maximum=MAX_RUN_S)
    check_seconds("--duration", spec.run_s, allow_zero=False, maximum=MAX_RUN_S)
    check_seconds("--deadline", spec.deadline_s, allow_zero=False)
    check_seconds("--connect-timeout", spec.connect_timeout_s, allow_zero=False)
    if spec.duration_s is not None and (spec.steps is not None or spec.passes is not None):
        raise UsageError("--duration and --steps/--passes are alternatives; give one")
    if spec.time_dilation is not None and not 1 <= spec.time_dilation <= MAX_TIME_DILATION:
        raise PacingError(
            f"--time-dilation {spec.time_dilation:g}: must be in [1, {MAX_TIME_DILATION:g}]"
        )
    compute_load.check_mode(spec.compute_load)
    if spec.compute_load not in (compute_load.NONE, compute_load.AUTO) and spec.trace is None:
        raise UsageError(f"--compute-load {spec.compute_load} needs a TRACE (its capture CPU)")
    if spec.compute_load_wait and spec.compute_load == compute_load.NONE:
        raise UsageError("--compute-load-wait waits for a compute load's quotas: not with none")
    if spec.targets is not None:
        if not spec.targets:
            raise ConfigError("--target: expected HOST:PORT[,HOST:PORT...]")
        for target in spec.targets:
            parse_target(target)
    if spec.procs_per_worker is not None:
        processes.check_procs_per_worker(spec.procs_per_worker)
    jobs = [job for job, _ in spec.client_netns]
    if len(set(jobs)) != len(jobs):
        raise UsageError(f"--client-netns: a job given twice ({', '.join(jobs)})")
    if not spec.engine:
        raise UsageError("--engine: expected an engine's name")
