"""Each benchmark a row: what it sends, how it is paced and run unless told otherwise.

The table holds one frozen ``BenchmarkSpec`` per benchmark: its name (the
``--benchmark`` value and the results' label), the defaults a synthetic and a
trace workload get (RPC kind, window, timing), the builders of its workloads,
and the facts the runner, ``role``, ``network compare`` and the outputs read
instead of asking which benchmark it is: whether one worker calls one ps
(``point_to_point``), whether it is measured from one process per worker,
whether it makes one call at a time whatever ``--outstanding`` says, whether
its step is the one compared with training's.

The paper's three (``docs/design.md``): p2p-latency, p2p-bandwidth and
ps-throughput, in the order ``--benchmark all`` runs them.  A fourth is one
``register`` call with its own builders (a test registers a toy one).

Pure: the table and its lookups; the builders are ``core.workload``'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay.core.generators import GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Timing
from tf_grpc_bench.replay.core.synthetic import all_pairs_echo, pair_echoes, pair_pushes
from tf_grpc_bench.replay.core.trace_workload import cluster_workload, pair_workload
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import WHOLE_STEPS, WholeSteps

#: Messages in flight on a stream for synthetic P2P bandwidth (measured in
#: ``docs/performance.md``).
STREAMING_BANDWIDTH_WINDOW = 1


class RpcKind(enum.Enum):
    """How echo and ack calls travel: one unary call each, or messages on a stream."""

    UNARY = "unary"
    STREAMING = "streaming"

    @classmethod
    def parse(cls, text: str, *, flag: str = "--rpc") -> RpcKind:
        try:
            return cls(text.strip().lower())
        except ValueError:
            names = ", ".join(kind.value for kind in cls)
            raise ConfigError(f"{flag} {text!r}: expected one of {names}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Defaults:
    """What a benchmark does with one kind of workload unless told otherwise."""

    rpc: RpcKind = RpcKind.UNARY
    #: Calls in flight per worker on unary calls; None: the recorded concurrency
    #: (synthetic: one call per (worker, ps) pair).
    window: int | None = 1
    #: The same when its calls travel on streams (``--rpc streaming``).
    streaming_window: int | None = 1
    timing: Timing = Timing.ASAP


class SyntheticBuilder(Protocol):
    """A benchmark's workload over the paper's generators."""

    def __call__(
        self,
        benchmark: Benchmark,
        generator: GeneratorConfig,
        *,
        mode: Mode,
        ps_count: int = 1,
        worker_count: int = 1,
    ) -> Workload: ...


class TraceBuilder(Protocol):
    """A benchmark's workload from a trace; ``pair`` is the P2P pair's trace task indices."""

    def __call__(
        self,
        trace: Trace,
        benchmark: Benchmark,
        *,
        mode: Mode,
        pair: tuple[int, int] | None = None,
        source: str = "trace",
        whole_steps: WholeSteps = WHOLE_STEPS,
    ) -> Workload: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchmarkSpec:
    """One benchmark: a row of the table (see the module docstring)."""

    #: ``--benchmark`` value, result label, TensorBoard's hparam.
    name: str
    #: One line: what it does and what it reports (help texts, hparams' description).
    summary: str
    synthetic: Defaults
    trace: Defaults
    build_synthetic: SyntheticBuilder
    build_trace: TraceBuilder
    #: One worker calls one ps (the paper's P2P benchmarks): ``role`` runs it on worker 0
    #: alone.  False: every worker calls every ps, ``role`` runs it on every worker at
    #: once and merges their runs, and a trace's side clients and stand-ins take part.
    point_to_point: bool
    #: Measured from one process per worker (``throughput``), not from this process.
    worker_processes: bool = False
    #: One call at a time whatever ``--outstanding`` says.
    one_call_at_a_time: bool = False
    #: Its step is the one compared with training's (``network compare``, comparisons).
    step_benchmark: bool = False

    @property
    def benchmark(self) -> Benchmark:
        return Benchmark(self.name)

    def defaults(self, source: str) -> Defaults:
        """The defaults of a ``source`` ("synthetic" or "trace") workload."""
        return self.synthetic if source == "synthetic" else self.trace


_TABLE: dict[Benchmark, BenchmarkSpec] = {}


def default_window(workload: Workload, rpc: RpcKind = RpcKind.UNARY) -> int | None:
    """Calls in flight ``workload``'s benchmark allows unless told otherwise (None: the
    recorded concurrency), as its row says.

    Latency: one call at a time.  Bandwidth: one outstanding call for the
    paper's synthetic benchmark (send, wait for the ack, send again), or
    ``STREAMING_BANDWIDTH_WINDOW`` messages on a stream; the recorded
    concurrency for a trace.  Throughput: the recorded concurrency
    (synthetic: one call in flight per (worker, ps) pair, all ps at once).
    """
    defaults = spec_of(workload.benchmark).defaults(workload.source)
    return defaults.streaming_window if rpc is RpcKind.STREAMING else defaults.window


def default_rpc(workload: Workload) -> RpcKind:
    """The RPC kind ``workload``'s benchmark uses unless told otherwise (its row):
    streaming for synthetic P2P bandwidth (measured faster and cheaper per MB,
    ``docs/performance.md``), unary for everything else (the paper's and TensorFlow's
    one call per tensor)."""
    return spec_of(workload.benchmark).defaults(workload.source).rpc


def synthetic_workload(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> Workload:
    """``benchmark``'s workload over the paper's generators (its row's builder)."""
    return spec_of(benchmark).build_synthetic(
        benchmark, generator, mode=mode, ps_count=ps_count, worker_count=worker_count
    )


def trace_workload(
    trace: Trace,
    benchmark: Benchmark,
    *,
    mode: Mode,
    pair: tuple[int, int] | None = None,
    source: str = "trace",
    whole_steps: WholeSteps = WHOLE_STEPS,
) -> Workload:
    """``benchmark``'s workload from ``trace`` (its row's builder)."""
    return spec_of(benchmark).build_trace(
        trace, benchmark, mode=mode, pair=pair, source=source, whole_steps=whole_steps
    )


def register(spec: BenchmarkSpec) -> Benchmark:
    """Add a benchmark row (runs after the others under ``--benchmark all``)."""
    benchmark = Benchmark.define(spec.name)
    if benchmark in _TABLE:
        raise ValueError(f"a benchmark named {spec.name!r} is already registered")
    _TABLE[benchmark] = spec
    return benchmark


def withdraw(benchmark: Benchmark) -> None:
    """Remove a benchmark row (a test's own)."""
    _TABLE.pop(benchmark, None)
    Benchmark.withdraw(benchmark)


def spec_of(benchmark: Benchmark) -> BenchmarkSpec:
    """The row of ``benchmark``; ConfigError for one without (defined elsewhere)."""
    try:
        return _TABLE[benchmark]
    except KeyError:
        raise ConfigError(f"benchmark {benchmark.value!r}: not registered here") from None


def registered() -> tuple[BenchmarkSpec, ...]:
    """Every row, in the order ``--benchmark all`` runs them."""
    return tuple(_TABLE.values())


def names() -> tuple[str, ...]:
    return tuple(spec.name for spec in _TABLE.values())


def step_benchmark() -> BenchmarkSpec:
    """The benchmark whose step is compared with training's."""
    return next(spec for spec in _TABLE.values() if spec.step_benchmark)


def parse_benchmarks(text: str, *, flag: str = "--benchmark") -> tuple[Benchmark, ...]:
    """``all`` or comma-separated names, in table order; UsageError for an unknown name."""
    if text.strip() == "all":
        return tuple(spec.benchmark for spec in _TABLE.values())
    chosen = []
    for name in (part.strip() for part in text.split(",")):
        try:
            benchmark = Benchmark(name)
        except ValueError:
            raise UsageError(
                f"{flag} {name!r}: expected all or one of {', '.join(names())}"
            ) from None
        chosen.append(benchmark)
    return tuple(spec.benchmark for spec in _TABLE.values() if spec.benchmark in chosen)


# --------------------------------------------------------------------------
# The paper's three (their names are ``Benchmark``'s constants).

register(
    BenchmarkSpec(
        name="p2p-latency",
        summary="one worker calls one ps, one call at a time, the ps echoes: round-trip time",
        synthetic=Defaults(),
        trace=Defaults(),
        build_synthetic=pair_echoes,
        build_trace=pair_workload,
        point_to_point=True,
        one_call_at_a_time=True,
    )
)
register(
    BenchmarkSpec(
        name="p2p-bandwidth",
        summary="one worker sends to one ps, which acknowledges: MB/s",
        synthetic=Defaults(
            rpc=RpcKind.STREAMING, window=1, streaming_window=STREAMING_BANDWIDTH_WINDOW
        ),
        trace=Defaults(window=None, streaming_window=None),
        build_synthetic=pair_pushes,
        build_trace=pair_workload,
        point_to_point=True,
    )
)
register(
    BenchmarkSpec(
        name="ps-throughput",
        summary="every worker calls every ps: aggregate RPCs/s, replayed step time",
        synthetic=Defaults(window=None, streaming_window=None),
        trace=Defaults(window=None, streaming_window=None, timing=Timing.DEPENDENCIES),
        build_synthetic=all_pairs_echo,
        build_trace=cluster_workload,
        point_to_point=False,
        worker_processes=True,
        step_benchmark=True,
    )
)
