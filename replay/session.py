"""A replay session: a whole ``ReplayRequest`` carried out and recorded.

``execute`` starts the servers (unless the request has targets) with the
request's engine and runs its benchmarks one after the other
(``runner.run_benchmark``); ``record`` writes what it measured (result
document, TensorBoard logs, step timelines): the library behind ``replay``
and ``network compare``'s replays (``role`` runs the benchmarks of its task
itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from tf_grpc_bench import lifetime, trace_files
from tf_grpc_bench.replay.core.measurement import BenchmarkResult
from tf_grpc_bench.replay.core.whatif import derive_trace
from tf_grpc_bench.replay.engines.registry import engine_named
from tf_grpc_bench.replay.network import netinfo
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_writer import write_document
from tf_grpc_bench.replay.request import ReplayRequest
from tf_grpc_bench.replay.runner import run_benchmark
from tf_grpc_bench.replay.transport import grpc_settings
from tf_grpc_bench.replay.transport.loop import ProgressCallback, interrupted_reason
from tf_grpc_bench.replay.transport.seam import Engine
from tf_grpc_bench.replay.transport.wire import ServerSettings


@contextlib.contextmanager
def replay_servers(
    request: ReplayRequest, server_settings: ServerSettings, engine: Engine
) -> Iterator[tuple[tuple[str, ...], bool]]:
    """The targets to replay against: given, or servers ``engine`` starts here (stopped
    afterwards)."""
    if request.targets is not None:
        yield request.targets, False
        return
    count = max(w.server_count for w in request.workloads)
    with engine.local_servers(
        count,
        mode=request.mode,
        settings=server_settings,
        procs_per_server=request.procs_per_server,
    ) as targets:
        yield targets, True


@dataclass(frozen=True, slots=True, kw_only=True)
class Executed:
    """What ``execute`` measured, against which targets."""

    results: tuple[BenchmarkResult, ...]
    targets: tuple[str, ...]
    #: Whether the targets were servers started here.
    local: bool
    #: Why the replay stopped between benchmarks when no result says so itself
    #: (a stop signal after one benchmark ended); "" otherwise.
    stopped_reason: str = ""


def execute(
    request: ReplayRequest,
    *,
    tls_dir: Path | None = None,
    on_progress: ProgressCallback | None = None,
) -> Executed:
    """Run the requested benchmarks against the given targets or servers started here.

    Stops after a benchmark that ended partial (its servers are likely gone).
    A stop signal (``KeyboardInterrupt``) ends the benchmark under way with
    what it measured; one between benchmarks keeps those done, and one before
    anything was measured propagates.
    """
    material = None
    if request.grpc.tls:
        # cryptography is imported only by runs that use TLS.
        from tf_grpc_bench.replay.transport import tls

        material = tls.ensure_material(tls_dir)
    channel_settings = replace(
        grpc_settings.channel_settings(request.grpc, material),
        control_token=request.control_token,
    )
    server_settings = replace(
        grpc_settings.server_settings(request.grpc, material),
        control_token=request.control_token,
    )
    engine = engine_named(request.engine)
    measured: list[BenchmarkResult] = []
    targets: tuple[str, ...] = ()
    local = False
    try:
        with replay_servers(request, server_settings, engine) as (targets, local):
            for workload, pacing, rpc in zip(
                request.workloads, request.pacings, request.rpcs, strict=True
            ):
                result = run_benchmark(
                    workload,
                    targets,
                    pacing=pacing,
                    plan=request.plan,
                    settings=replace(channel_settings, rpc=rpc),
                    parameters=request.grpc_parameters,
                    on_progress=on_progress,
                    procs_per_worker=request.procs_per_worker,
                    client_namespaces=dict(request.client_namespaces),
                    engine=engine,
                )
                measured.append(result)
                if result.partial:
                    break
    except KeyboardInterrupt as interrupt:
        if not measured:
            raise
        reason = interrupted_reason(lifetime.signal_of(interrupt))
        return Executed(
            results=tuple(measured),
            targets=targets,
            local=local,
            stopped_reason=f"{reason} after {measured[-1].benchmark.value}",
        )
    return Executed(results=tuple(measured), targets=targets, local=local)


def record(
    request: ReplayRequest,
    executed: Executed,
    run_directory: Path,
    *,
    network_name: str = "",
) -> results.ResultDocument:
    """Write the result document, TensorBoard logs and timelines of a replay into ``run_directory``.

    The timelines (``output.timeline``): each benchmark's first measured steps
    next to the trace's, as trace-event JSON in ``<run>/timeline/`` and for
    TensorBoard's Profile tab.  Stop signals wait until all are written
    (``lifetime.deferred_signals``).
    """
    with lifetime.deferred_signals():
        # The TensorBoard writer is imported only when there is something to write (a
        # while, on a loaded machine: a stop signal then waits too).
        from tf_grpc_bench.replay.output import tensorboard, timeline

        network = netinfo.describe_network(executed.targets, name=network_name)
        network = netinfo.undilated(network, request.plan.time_dilation)
        document = results.build_document(
            executed.results,
            config=request.config,
            trace_path=request.trace_path,
            network=network,
            what_if=request.what_if,
        )
        if executed.stopped_reason:
            reasons = (document.partial_reason, executed.stopped_reason)
            document = replace(
                document, partial=True, partial_reason="; ".join(r for r in reasons if r)
            )
        write_document(document, run_directory / results.RESULTS_FILE_NAME)
        tensorboard.write_run(document, run_directory)
        trace = None if request.trace_path is None else trace_files.read_trace(request.trace_path)
        if trace is not None and request.what_if is not None:
            # The replayed calls index the derived trace's RPCs.
            trace = derive_trace(trace, request.what_if.asked())
        timeline.write_run_timelines(document, run_directory, trace)
    return document
