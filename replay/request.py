"""From a ``ReplaySpec`` to a ``ReplayRequest``: the workloads, their pacing, the run plan.

``plan(spec, host)`` reads the trace (or builds the paper's synthetic
workloads), derives a what-if cluster, brings the trace's compute to this
machine (``--compute auto``/``here``), fits the workloads to this host
(``fitting``) and says in ``config`` what the results record of the request.
Everything it needs of this machine comes in ``host`` (``Host``: its name,
memory, cores, whether it is root, how it times a model's step), so planning
is tested without the machine; ``this_host()`` probes the real one.  It reads
the files the spec names (the trace, the servers' token file) and checks
that ``--client-netns``'s namespaces exist.

Raises UsageError, ConfigError or TraceError, one line naming the flag.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tf_grpc_bench import calibration, capture_cpu, compute_scale, host, trace_files
from tf_grpc_bench.bounds import NS_PER_S
from tf_grpc_bench.errors import ConfigError, UsageError
from tf_grpc_bench.replay import fitting
from tf_grpc_bench.replay.core import compute_load, planning, whatif
from tf_grpc_bench.replay.core.benchmarks import RpcKind
from tf_grpc_bench.replay.core.generators import BufferSizes, GeneratorConfig
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import (
    COMPUTE_HERE,
    MAX_COMPUTE_SCALE,
    Pacing,
    PacingChoice,
    Timing,
    check_source,
)
from tf_grpc_bench.replay.core.workload import Mode, Workload
from tf_grpc_bench.replay.engines.registry import check_engine_name
from tf_grpc_bench.replay.spec import SYNTHETIC_FIELDS, TRACE_FIELDS, ReplaySpec
from tf_grpc_bench.replay.transport import grpc_settings
from tf_grpc_bench.replay.transport.loop import RunPlan
from tf_grpc_bench.replay.transport.wire import read_token_file
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.trace_mapping import WHOLE_STEPS, WholeSteps


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """What planning needs of the machine a replay runs on."""

    #: As a trace captured here names it (``host.this_machine``).
    name: str
    #: Memory this process may take for messages in flight (``host.memory_room``); None:
    #: unknown.
    memory: host.MemoryRoom | None = None
    #: Cores this process may use.
    cores: int = 1
    #: May enter network namespaces.
    root: bool = False
    #: Times a model's training step here (``calibration.measure_here``), for ``--compute``.
    measure_step: Callable[[str, calibration.CalibrationWorkload], calibration.StepHere] = field(
        default=calibration.measure_here, compare=False
    )


def this_host() -> Host:
    """This machine, probed."""
    return Host(
        name=host.this_machine(),
        memory=host.memory_room(),
        cores=fitting.usable_cores(),
        root=os.geteuid() == 0,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRequest:
    """What ``replay`` was asked to do, validated."""

    benchmarks: tuple[Benchmark, ...]
    trace_path: Path | None
    workloads: tuple[Workload, ...]
    pacings: tuple[Pacing, ...]
    #: How each workload's echo and ack calls travel.
    rpcs: tuple[RpcKind, ...]
    plan: RunPlan
    mode: Mode
    targets: tuple[str, ...] | None
    grpc: grpc_settings.GrpcSettings
    config: dict[str, str | int | float | bool]
    #: The gRPC settings as result parameters.
    grpc_parameters: dict[str, str | int | float | bool]
    #: The servers' control-call token (``--token-file``); never recorded.
    control_token: str | None = field(default=None, repr=False)
    #: A what-if replay: the cluster asked about and the trace it was derived from
    #: (``core.whatif``); None for the captured cluster.
    what_if: whatif.Derivation | None = None
    #: Client processes per worker of benchmarks measured from worker processes
    #: (``--procs-per-worker``, resolved).
    procs_per_worker: int = 1
    #: Job -> named network namespace its clients run in (``--client-netns``).
    client_namespaces: tuple[tuple[str, str], ...] = ()
    #: Servers started here: processes per ps server (``--procs-per-server``).
    procs_per_server: int = 1
    #: The engine that runs the servers started here and the benchmarks' workers.
    engine: str = "grpcio"


def run_label(request: ReplayRequest) -> str:
    """The name a run directory of ``request`` starts with: where and what."""
    where = "remote" if request.targets is not None else "loopback"
    what = request.trace_path.stem if request.trace_path is not None else "synthetic"
    if request.what_if is not None:
        what += f"-whatif-{request.what_if.workers}w{request.what_if.ps}ps"
    return f"{where}-{what}"


def resolve_trace(spec: ReplaySpec) -> Path | None:
    """The trace file ``spec`` replays: its TRACE, the shipped default trace, or None for
    the paper's synthetic workloads (``--synthetic``, or no trace shipped)."""
    if spec.trace is not None:
        from tf_grpc_bench.inspect import resolve_trace_argument

        return resolve_trace_argument(spec.trace)
    if spec.synthetic:
        return None
    return trace_files.default_trace_path()


def plan(
    spec: ReplaySpec, here: Host, *, whole_steps: WholeSteps = WHOLE_STEPS, one_task: bool = False
) -> ReplayRequest:
    """The request ``spec`` asks for on ``here``.  Raises UsageError/ConfigError/TraceError.

    ``whole_steps``: which calls beyond worker <-> ps a trace replay makes.  Given
    ``--target``s too few for the chief-to-worker calls' stand-in servers (the
    trace's ps tasks only, say), those calls are dropped (and counted) instead.
    ``one_task``: one task of a job (``role``), where ``--compute-load auto`` runs none.
    """
    check_engine_name(spec.engine)
    trace_path = resolve_trace(spec)
    settings = spec.grpc.settings()
    config = _config(spec, settings)
    derivation = to_here = None
    if trace_path is None:
        workloads = _synthetic_workloads(spec)
        config["workload"] = "synthetic"
    else:
        workloads, derivation, to_here = _replayed_trace(spec, trace_path, here, whole_steps)
        config["workload"] = "trace" if derivation is None else "what-if"
        if derivation is not None:
            # Flat, for TensorBoard's HParams; the document's what_if says it in full.
            config["what_if_placement"] = derivation.placement
            config["what_if_scale_tensors"] = derivation.scale_tensors
        config["trace"] = str(trace_path)
    planned = fitting.plan_workloads(
        workloads,
        settings=settings,
        targets=spec.targets,
        rpc=spec.rpc,
        pacing=pacing_choice(spec, to_here),
        memory=here.memory,
    )
    load = chosen_load(spec, planned, traced=trace_path is not None, one_task=one_task)
    return _request(spec, here, planned, trace_path, config, derivation, load)


def _request(
    spec: ReplaySpec,
    here: Host,
    planned: fitting.Planned,
    trace_path: Path | None,
    config: dict[str, str | int | float | bool],
    derivation: whatif.Derivation | None,
    load: tuple[str, str],
) -> ReplayRequest:
    fitting.check_procs_per_server(spec.procs_per_server, planned.workloads, spec.targets)
    servers = 0
    if spec.targets is None:
        servers = max(w.server_count for w in planned.workloads) * spec.procs_per_server
    procs_per_worker = fitting.procs_per_worker_for(
        spec.procs_per_worker,
        planned.workloads,
        planned.pacings,
        server_processes=servers,
        cores=here.cores,
    )
    config["procs_per_worker"] = (
        "auto" if spec.procs_per_worker is None else str(spec.procs_per_worker)
    )
    namespaces = fitting.check_client_namespaces(
        spec.client_netns, planned.workloads, spec.targets, root=here.root
    )
    if namespaces:
        config["client_netns"] = fitting.format_client_namespaces(dict(namespaces))
    settings = spec.grpc.settings()
    grpc_parameters = _grpc_parameters(spec, settings)
    return ReplayRequest(
        benchmarks=spec.benchmarks,
        trace_path=trace_path,
        workloads=planned.workloads,
        pacings=planned.pacings,
        rpcs=planned.rpcs,
        plan=run_plan(spec, load),
        mode=spec.mode,
        targets=spec.targets,
        grpc=settings,
        config=config,
        grpc_parameters=grpc_parameters,
        control_token=None if spec.token_file is None else read_token_file(spec.token_file),
        what_if=derivation,
        procs_per_worker=procs_per_worker,
        procs_per_server=spec.procs_per_server,
        client_namespaces=namespaces,
        engine=spec.engine,
    )


def _grpc_parameters(
    spec: ReplaySpec, settings: grpc_settings.GrpcSettings
) -> dict[str, str | int | float | bool]:
    parameters: dict[str, str | int | float | bool] = dict(settings.as_parameters())
    if spec.grpc.outstanding is None:
        # Each benchmark records its own window ("outstanding"): 1 or the trace's.
        parameters.pop("grpc_outstanding_rpcs", None)
    return parameters


def _config(
    spec: ReplaySpec, settings: grpc_settings.GrpcSettings
) -> dict[str, str | int | float | bool]:
    """What the results record of the request, before its workloads are known."""
    plan = run_plan(spec)
    return {
        "benchmark": ",".join(b.value for b in spec.benchmarks),
        "mode": spec.mode.value,
        "rpc": "default" if spec.rpc is None else spec.rpc.value,
        "pacing": "default" if spec.pacing is None else spec.pacing.value,
        "warmup_s": plan.warmup_ns / NS_PER_S,
        "duration_s": plan.duration_ns / NS_PER_S,
        "runs": spec.runs,
        "deadline_s": plan.deadline_s,
        "targets": ",".join(spec.targets) if spec.targets else "loopback",
        **_grpc_parameters(spec, settings),
    }


def run_plan(spec: ReplaySpec, load: tuple[str, str] | None = None) -> RunPlan:
    """How long and how often: the times asked are the predicted training's, so a dilated
    run takes that many times longer (``--time-dilation``); ``load``: the compute load
    chosen and why (``compute_load.choose``; None: the spec's, ``auto`` read as none)."""
    dilation = spec.time_dilation or 1.0
    if load is None:
        asked = spec.compute_load
        load = (compute_load.NONE if asked == compute_load.AUTO else asked, "")
    return RunPlan(
        warmup_ns=round(spec.warmup_s * NS_PER_S * dilation),
        duration_ns=round(spec.run_s * NS_PER_S * dilation),
        runs=spec.runs,
        steps=spec.steps,
        passes=spec.passes,
        deadline_s=spec.deadline_s * dilation,
        connect_timeout_s=spec.connect_timeout_s,
        time_dilation=dilation,
        compute_load=load[0],
        compute_load_auto=load[1],
        compute_load_wait=spec.compute_load_wait,
    )


def chosen_load(
    spec: ReplaySpec, planned: fitting.Planned, *, traced: bool, one_task: bool = False
) -> tuple[str, str]:
    """The compute load ``spec`` asks for, ``auto`` chosen (``compute_load.choose``): a
    load where a ps-throughput benchmark is paced by the dependencies of a trace that
    records its capture CPU."""
    paced = any(
        workload.benchmark == Benchmark.PS_THROUGHPUT and pacing.timing is Timing.DEPENDENCIES
        for workload, pacing in zip(planned.workloads, planned.pacings, strict=True)
    )
    return compute_load.choose(
        spec.compute_load,
        trace=traced,
        paced=paced,
        capture_cpu=any(compute_load.tasks_cores_of(w) is not None for w in planned.workloads),
        one_task=one_task,
    )


def _synthetic_workloads(spec: ReplaySpec) -> list[Workload]:
    for flag in spec.given(TRACE_FIELDS):
        raise UsageError(f"{flag} applies to trace replays, not to --synthetic workloads")
    if spec.pacing is not None:
        check_source(spec.pacing, "synthetic")
    return planning.synthetic_workloads(
        spec.benchmarks,
        generator_config(spec),
        mode=spec.mode,
        ps_count=spec.ps if spec.ps is not None else 1,
        worker_count=spec.workers if spec.workers is not None else 1,
    )


def generator_config(spec: ReplaySpec) -> GeneratorConfig:
    """The paper's generators as ``spec`` sets them (their defaults elsewhere)."""
    defaults = GeneratorConfig()
    sizes = {
        f"{category}_bytes": getattr(spec, f"{category}_bytes")
        for category in ("small", "medium", "large")
        if getattr(spec, f"{category}_bytes") is not None
    }
    return GeneratorConfig(
        kind=spec.generator or defaults.kind,
        categories=spec.categories if spec.categories is not None else defaults.categories,
        buffers_per_payload=spec.buffers or defaults.buffers_per_payload,
        sizes=BufferSizes(**sizes),
        seed=spec.seed if spec.seed is not None else defaults.seed,
        random_sizes=spec.random_sizes,
        skew_bias=spec.skew_bias,
        payload_count=spec.payloads or defaults.payload_count,
    )


def _replayed_trace(
    spec: ReplaySpec, trace_path: Path, here: Host, whole_steps: WholeSteps
) -> tuple[list[Workload], whatif.Derivation | None, compute_scale.ComputeToHere | None]:
    """The trace's workloads (``trace_workloads``; without the stand-in servers of the
    chief's calls when the targets are too few for them), and its compute brought to
    this machine (``compute_to_here``), which their results name."""
    trace = trace_files.read_trace(trace_path)
    workloads, derivation = trace_workloads(spec, trace, trace_path, whole_steps)
    if spec.targets is not None and len(spec.targets) < max(w.server_count for w in workloads):
        without_stand_ins = replace(whole_steps, stand_in_servers=False)
        workloads, derivation = trace_workloads(spec, trace, trace_path, without_stand_ins)
    to_here = compute_to_here(spec, trace, workloads, here)
    if to_here is not None:
        entry = ("compute_calibration", to_here.description)
        workloads = [replace(w, description=(*w.description, entry)) for w in workloads]
    return workloads, derivation, to_here


def trace_workloads(
    spec: ReplaySpec, trace: Trace, trace_path: Path, whole_steps: WholeSteps = WHOLE_STEPS
) -> tuple[list[Workload], whatif.Derivation | None]:
    """The trace's workloads, of the what-if cluster the spec asks for if any, and how
    that cluster was derived (None for the captured one)."""
    for flag in spec.given(SYNTHETIC_FIELDS):
        raise UsageError(
            f"{flag} shapes the synthetic workload; a trace brings its own "
            "(add --synthetic to use the generators)"
        )
    workloads, derivation = planning.trace_workloads(
        trace,
        spec.benchmarks,
        mode=spec.mode,
        source=str(trace_path),
        trace_name=trace_path.stem,
        what_if=what_if_of(spec, trace),
        pair=spec.pair,
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
    return _with_load_sizing(spec, trace, trace_path, workloads), derivation


def _with_load_sizing(
    spec: ReplaySpec, trace: Trace, trace_path: Path, workloads: list[Workload]
) -> list[Workload]:
    """With ``--compute-load`` (``auto`` too), the workloads carry the capture's tasks'
    cores busy (what sizes the load, ``core.compute_load``); a trace recording none is a
    ConfigError for ``gaps`` and ``uniform``."""
    if spec.compute_load == compute_load.NONE:
        return workloads
    recorded = capture_cpu.from_extra(trace.metadata.extra)
    if recorded is None and spec.compute_load == compute_load.AUTO:
        return workloads
    if recorded is None:
        raise ConfigError(
            f"--compute-load {spec.compute_load}: {trace_path} records no capture CPU "
            f"({capture_cpu.TASKS_EXTRA}; captured before 2026-12-04 or by hand): "
            "capture it again, or give --compute-load none"
        )
    entry = (compute_load.TASKS_CORES_ENTRY, round(recorded.tasks_cores, 3))
    return [replace(w, description=(*w.description, entry)) for w in workloads]


def what_if_of(spec: ReplaySpec, trace: Trace) -> whatif.WhatIf | None:
    """The cluster ``--workers``/``--ps``/``--placement``/``--scale-tensors`` ask a trace
    replay about (the captured one where a flag is not given), or None without them."""
    return planning.what_if_of(
        trace,
        workers=spec.workers,
        ps=spec.ps,
        placement=spec.placement,
        scale_tensors=spec.scale_tensors,
    )


def compute_to_here(
    spec: ReplaySpec, trace: Trace, workloads: Sequence[Workload], here: Host
) -> compute_scale.ComputeToHere | None:
    """``--compute auto`` (the default) or ``here``: the scale taking the trace's compute to
    this machine, for the workloads that keep compute (dependencies pacing); None otherwise."""
    if spec.compute is not None and not spec.compute.to_this_machine:
        return None
    choice = PacingChoice(timing=spec.pacing)
    if not any(fitting.timing_for(w, choice) is Timing.DEPENDENCIES for w in workloads):
        return None
    return compute_scale.compute_to_here(
        trace.metadata.extra,
        here.name,
        required=spec.compute is not None and spec.compute.word == COMPUTE_HERE,
        max_scale=MAX_COMPUTE_SCALE,
        measure=here.measure_step,
    )


def pacing_choice(
    spec: ReplaySpec, to_here: compute_scale.ComputeToHere | None = None
) -> PacingChoice:
    """The pacing ``spec`` asks for, with ``--compute auto``'s scale (``to_here``)."""
    scale = to_here.scale if to_here is not None else None
    compute = spec.compute
    explicit: float | None = None
    if compute is not None and compute.word != "auto":
        # here: the scale to this machine (None: no workload paces dependencies, which
        # the pacing's rules report for --compute).
        explicit = (
            (scale if scale is not None else 1.0) if compute.to_this_machine else compute.scale
        )
    return PacingChoice(
        timing=spec.pacing,
        rate_per_s=spec.rate,
        speedup=spec.speedup,
        compute_scale=explicit,
        default_compute_scale=scale,
        outstanding=spec.grpc.outstanding,
        time_dilation=spec.time_dilation or 1.0,
    )
