"""What TensorBoard's HParams dashboard shows of a result: hparams in comparison order, metrics.

Pure: from a result document to hparam values and to the experiment
configuration (``Experiment`` proto) TensorBoard reads.

Order.  TensorBoard sorts hyperparameters by name wherever it lists them
(``backend_context._sort_and_reduce_to_hparams_limit`` runs even on a written
configuration), so the order users compare runs by is carried by the names:
``COMPARISON_HPARAMS`` are numbered (``01 network`` ... ``08 mode``,
``09 grpc ...`` for every gRPC setting), and every other parameter keeps its
own name, which sorts after them.  The configuration gives each a display
name without the number.

What is ticked.  The dashboard shows the first five hparams and the first
five metrics of the configuration and leaves the rest for the user to tick:
the first five hparams are network, benchmark, rpc, pacing and compute, and
the first metrics are those a user compares runs by (MB/s, RPCs/s, step p50,
predicted step), then the latencies.

Values.  The dashboard shows every number as a float (``1890.0``) and cannot
tell an integer from a float, so every value that is not a boolean is written
as text: ``1890``, ``2.5``, ``1 Gbit/s``.

Why one configuration per document, all alike.  TensorBoard reads one
experiment configuration per logdir and, with several (one per result
document under ``--logdir runs``), picks one arbitrarily.  Every document of
this tool writes the same metrics and the same comparison hparams with no
value domains, so whichever is picked shows every session; only parameters
that exist in some documents and not in the picked one's (a synthetic
generator's settings next to a trace replay) go unlisted as columns.
Everything is in ``results.json`` regardless.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata

from tf_grpc_bench.replay.core import benchmarks
from tf_grpc_bench.replay.core.measurement import BenchmarkResult
from tf_grpc_bench.replay.output.document import ParameterValue, ResultDocument
from tf_grpc_bench.units import format_rate

#: The hyperparameters users compare runs by, in that order: (name, display name, description).
COMPARISON_HPARAMS = (
    ("01 network", "network", "network the run went over (--network-name, or what was found)"),
    # The registered benchmarks' names (``benchmark_names``).
    ("02 benchmark", "benchmark", ""),
    ("03 rpc", "rpc", "unary or streaming, as the calls travelled"),
    ("04 pacing", "pacing", "dependencies, asap, recorded or rate"),
    ("05 compute", "compute", "dependencies pacing: recorded, none or a scale; '-' otherwise"),
    ("06 link rate", "link rate", "emulated link rate (tbf); 'unlimited' when not emulated"),
    ("07 trace", "trace", "model of the replayed trace, or 'synthetic'"),
    ("08 mode", "mode", "non-serialized (raw bytes) or serialized (protobuf)"),
)
#: A comparison hparam's numbered name by its display name (``HPARAM["rpc"]`` is ``03 rpc``).
HPARAM = {shown: name for name, shown, _ in COMPARISON_HPARAMS}
#: Prefix of the gRPC settings' names: they sort right after the comparison hparams.
GRPC_PREFIX = "09 grpc "
#: Parameters left out of the hparams: the same facts are in other columns or in
#: ``results.json`` (the channel description string, the trace path).
LEFT_OUT = frozenset({"grpc", "trace", "benchmark", "mode", "rpc", "pacing", "compute_scale"})

#: The metrics of every session: (scalar tag, display name).  The dashboard ticks the
#: first five: the figures runs are compared by, then the median latency.
METRICS = (
    ("throughput/bandwidth_mb_per_s", "MB/s"),
    ("throughput/rpcs_per_s", "RPCs/s"),
    ("step_time_ms/p50", "step p50 (ms)"),
    ("prediction/step_ms", "predicted step (ms)"),
    ("latency_us/all/p50", "all p50 (us)"),
    ("latency_us/all/p99", "all p99 (us)"),
    *(
        (f"latency_us/{size}/{stat}", f"{size} {stat} (us)")
        for size in ("small", "medium", "large")
        for stat in ("p50", "p99")
    ),
    ("cpu/client_utilization", "client CPU (cores)"),
    ("cpu/server_utilization", "server CPU (cores)"),
)


def benchmark_names() -> str:
    """``p2p-latency, p2p-bandwidth or ps-throughput``: every registered benchmark."""
    names = benchmarks.names()
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def as_text(value: ParameterValue) -> str | bool:
    """A parameter as the dashboard should show it: booleans stay, the rest is text."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else str(value)
    return str(value)


def compute_mode(parameters: Mapping[str, ParameterValue]) -> str:
    """``recorded``, ``none`` or the scale, under dependencies pacing; ``-`` otherwise."""
    if parameters.get("pacing") != "dependencies":
        return "-"
    scale = parameters.get("compute_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        return str(scale)
    if scale == 1:
        return "recorded"
    return "none" if scale == 0 else f"{scale:g}"


def hparam_values(
    document: ResultDocument, result: BenchmarkResult, label: str
) -> dict[str, str | bool]:
    """The hparams of one benchmark's session, comparison ones first (see the module docstring)."""
    parameters: dict[str, ParameterValue] = {**document.config, **result.parameters}
    network = document.network
    trace = document.trace
    values: dict[str, str | bool] = {
        HPARAM["network"]: network.name if network else "unrecorded",
        HPARAM["benchmark"]: result.benchmark.value,
        HPARAM["rpc"]: as_text(parameters.get("rpc", "unary")),
        HPARAM["pacing"]: as_text(parameters.get("pacing", "")),
        HPARAM["compute"]: compute_mode(parameters),
        HPARAM["link rate"]: (
            format_rate(network.emulated_rate_bits_per_s) if network else "unrecorded"
        ),
        HPARAM["trace"]: (trace.model or Path(trace.path).name) if trace else "synthetic",
        HPARAM["mode"]: as_text(parameters.get("mode", "")),
    }
    for name, value in parameters.items():
        if _is_grpc_setting(name):
            values[GRPC_PREFIX + name[len("grpc_") :]] = as_text(value)
    for name, value in sorted(parameters.items()):
        if not _is_grpc_setting(name) and name not in LEFT_OUT:
            values[name] = as_text(value)
    values.update(
        label=label,
        workload=result.workload,
        trace_sha256=trace.sha256[:12] if trace else "",
        host=document.machine.hostname,
        created_utc=document.created_utc,
        partial=result.partial or any(run.partial for run in result.runs),
    )
    return values


def _is_grpc_setting(name: str) -> bool:
    """``grpc_channels`` (``GrpcSettings.as_parameters``) or a raw ``grpc.`` channel option."""
    return name.startswith(("grpc_", "grpc."))


def _info(name: str, value: str | bool) -> api_pb2.HParamInfo:
    for numbered, shown, description in COMPARISON_HPARAMS:
        if name == numbered:
            description = description or benchmark_names()
            return api_pb2.HParamInfo(
                name=name, display_name=shown, description=description, type=_type(value)
            )
    shown = "grpc " + name.removeprefix(GRPC_PREFIX) if name.startswith(GRPC_PREFIX) else name
    return api_pb2.HParamInfo(name=name, display_name=shown, type=_type(value))


def _type(value: str | bool) -> api_pb2.DataType:
    return api_pb2.DATA_TYPE_BOOL if isinstance(value, bool) else api_pb2.DATA_TYPE_STRING


def experiment_summary(values: Mapping[str, str | bool]) -> summary_pb2.Summary:
    """The experiment configuration: ``values``' hparams (no domains) and ``METRICS``."""
    experiment = api_pb2.Experiment(
        hparam_infos=[_info(name, value) for name, value in values.items()],
        metric_infos=[
            api_pb2.MetricInfo(name=api_pb2.MetricName(group="", tag=tag), display_name=shown)
            for tag, shown in METRICS
        ],
    )
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=hparams_metadata.EXPERIMENT_TAG,
        metadata=hparams_metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(experiment=experiment)
        ),
        tensor=hparams_metadata.NULL_TENSOR,
    )
    return summary
