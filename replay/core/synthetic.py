"""The paper's benchmarks as workloads: the generators' payloads sent in a cycle.

What each benchmark sends is its row's builder (``core.benchmarks``): one
worker echoing off one ps (``pair_echoes``), pushing to one ps
(``pair_pushes``), or every worker echoing off every ps (``all_pairs_echo``),
all made by ``paper_workload``.

Pure: no gRPC, no clocks, no IO.
"""

from __future__ import annotations

from collections.abc import Callable

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.generators import GeneratorConfig, PayloadSpec, generate_payloads
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.workload import (
    Call,
    Mode,
    ParameterValue,
    Workload,
    WorkloadStep,
    ack_call,
    echo_call,
)

#: A call of one payload: (payload, mode, server_index=, worker_index=) -> Call.
CallOf = Callable[..., Call]


def pair_echoes(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> Workload:
    """P2P latency: one worker echoes each payload off one ps (``ps_count`` and
    ``worker_count`` are checked, not used)."""
    return paper_workload(
        benchmark, generator, mode=mode, call=echo_call, ps_count=ps_count,
        worker_count=worker_count, one_pair=True,
    )  # fmt: skip


def pair_pushes(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> Workload:
    """P2P bandwidth: one worker pushes each payload to one ps, which acks."""
    return paper_workload(
        benchmark, generator, mode=mode, call=ack_call, ps_count=ps_count,
        worker_count=worker_count, one_pair=True,
    )  # fmt: skip


def all_pairs_echo(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> Workload:
    """PS throughput: every worker sends each payload to every ps as an echo (a gradient
    up, the updated weights of the same size back, as in parameter-server training);
    the calls of one payload to the different ps go out together, one outstanding call
    per (worker, ps) pair by default."""
    return paper_workload(
        benchmark, generator, mode=mode, call=echo_call, ps_count=ps_count,
        worker_count=worker_count, one_pair=False,
    )  # fmt: skip


def paper_workload(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    call: CallOf,
    ps_count: int = 1,
    worker_count: int = 1,
    one_pair: bool,
) -> Workload:
    """The generator's payloads, each sent as ``call`` from every worker to every ps
    (``one_pair``: from one worker to one ps), in a cycle."""
    if ps_count < 1:
        raise ConfigError(f"--ps must be >= 1, got {ps_count}")
    if worker_count < 1:
        raise ConfigError(f"--workers must be >= 1, got {worker_count}")
    if one_pair:
        ps_count = worker_count = 1
    payloads: tuple[PayloadSpec, ...] = generate_payloads(generator)
    calls = [
        call(p, mode, server_index=s, worker_index=w)
        for w in range(worker_count)
        for p in payloads
        for s in range(ps_count)
    ]
    description: dict[str, ParameterValue] = {
        "generator": generator.kind.value,
        "categories": ",".join(c.value for c in generator.categories),
        "buffers": generator.buffers_per_payload,
        "payloads": generator.payload_count,
        "small_size_bytes": generator.sizes.small_bytes,
        "medium_size_bytes": generator.sizes.medium_bytes,
        "large_size_bytes": generator.sizes.large_bytes,
        "seed": generator.seed,
        "random_sizes": generator.random_sizes,
        "ps": ps_count,
        "workers": worker_count,
        "shape": calls[0].shape.value,
    }
    if generator.kind.value == "skew":
        description["skew_bias"] = generator.effective_skew_bias.value
    return Workload(
        benchmark=benchmark,
        source="synthetic",
        mode=mode,
        steps=(WorkloadStep(index=-1, calls=tuple(calls)),),
        server_count=ps_count,
        worker_count=worker_count,
        description=tuple(description.items()),
    )
