"""The paper's benchmarks as workloads: the generators' payloads sent in a cycle.

Pure: no gRPC, no clocks, no IO.
"""

from __future__ import annotations

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.generators import GeneratorConfig, generate_payloads
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


def synthetic_workload(
    benchmark: Benchmark,
    generator: GeneratorConfig,
    *,
    mode: Mode,
    ps_count: int = 1,
    worker_count: int = 1,
) -> Workload:
    """The paper's benchmark over the generator's payloads, sent in a cycle.

    * P2P latency: one worker echoes each payload off one ps.
    * P2P bandwidth: one worker pushes each payload to one ps, which acks.
    * PS throughput: every worker sends each payload to every ps as an echo (a
      gradient up, the updated weights of the same size back, as in parameter-
      server training); the calls of one payload to the different ps go out
      together, one outstanding call per (worker, ps) pair by default.
    """
    if ps_count < 1:
        raise ConfigError(f"--ps must be >= 1, got {ps_count}")
    if worker_count < 1:
        raise ConfigError(f"--workers must be >= 1, got {worker_count}")
    payloads = generate_payloads(generator)
    calls: list[Call] = []
    if benchmark is Benchmark.P2P_LATENCY:
        calls = [echo_call(p, mode) for p in payloads]
        ps_count = worker_count = 1
    elif benchmark is Benchmark.P2P_BANDWIDTH:
        calls = [ack_call(p, mode) for p in payloads]
        ps_count = worker_count = 1
    else:
        calls = [
            echo_call(p, mode, server_index=s, worker_index=w)
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
