"""One set of results from the documents every task of a ``role`` job sends the gatherer.

Pure: result documents in, merged results out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tf_grpc_bench.cluster import WORKER
from tf_grpc_bench.replay.core.benchmarks import spec_of
from tf_grpc_bench.replay.core.measurement import Benchmark, BenchmarkResult, RunMeasurement
from tf_grpc_bench.replay.output import document as results


def task_order(task: str) -> tuple[bool, str, int]:
    """Order of tasks (``worker:1``) in a merge: workers first, by index, then side clients."""
    job, _, index = task.rpartition(":")
    return job != WORKER, job, int(index)


def merge_worker_documents(
    documents: Mapping[str, results.ResultDocument], *, failures: Mapping[str, str] | None = None
) -> tuple[list[BenchmarkResult], str]:
    """One set of results from the documents of the workers (keyed ``worker:<i>``) and of
    the tasks that ran a side client (``ps:<i>``, ``chief:0``).

    Point-to-point results come from worker 0.  A benchmark every worker replays
    (PS throughput) has run ``k`` merged from every task's run ``k``
    (``merge_runs``).  Returns the results and a reason when the merge is partial
    ("" otherwise).  Pure.
    """
    ordered = sorted(documents.items(), key=lambda item: task_order(item[0]))
    reasons = [f"{task}: {error}" for task, error in sorted((failures or {}).items())]
    merged: list[BenchmarkResult] = []
    first = dict(ordered).get(f"{WORKER}:0")
    if first is not None:
        merged += [r for r in first.benchmarks if spec_of(r.benchmark).point_to_point]
    shared = [
        (task, r)
        for task, document in ordered
        for r in document.benchmarks
        if not spec_of(r.benchmark).point_to_point
    ]
    for benchmark in dict.fromkeys(r.benchmark for _, r in shared):
        parts = [(task, r) for task, r in shared if r.benchmark is benchmark]
        merged.append(merge_runs(benchmark, parts, reasons))
    return merged, "; ".join(reasons)


def merge_runs(
    benchmark: Benchmark, parts: Sequence[tuple[str, BenchmarkResult]], reasons: Sequence[str]
) -> BenchmarkResult:
    """One result of ``benchmark`` from every task's (``parts``, workers first): run ``k``
    merges every task's run ``k``: all samples (each names its client); the longest
    duration (the tasks started together at a barrier, so the aggregate rate is all
    calls over the longest run); client CPU summed; server CPU the largest figure any
    task read (all read the same servers over about the same window).  Partial, with
    ``reasons``, when a task failed."""
    run_count = min(len(r.runs) for _, r in parts)
    runs = []
    for k in range(run_count):
        taken: Sequence[RunMeasurement] = [r.runs[k] for _, r in parts]
        partial = [p for p in taken if p.partial]
        runs.append(
            RunMeasurement(
                run_index=k,
                duration_ns=max(p.duration_ns for p in taken),
                samples=tuple(s for p in taken for s in p.samples),
                step_times_ns=tuple(t for p in taken for t in p.step_times_ns),
                step_compute_ns=tuple(t for p in taken for t in p.step_compute_ns),
                client_cpu_ns=sum(p.client_cpu_ns for p in taken),
                server_cpu_ns=max(p.server_cpu_ns for p in taken),
                partial=bool(partial),
                partial_reason=partial[0].partial_reason if partial else "",
            )
        )
    base = parts[0][1]
    parameters = {k: v for k, v in base.parameters.items() if k not in ("task", "targets")} | {
        "cluster_workers": sum(1 for task, _ in parts if not task_order(task)[0]),
        "targets": ",".join(sorted({str(r.parameters.get("targets", "")) for _, r in parts})),
    }
    partial_runs = [run for run in runs if run.partial]
    return BenchmarkResult(
        benchmark=benchmark,
        workload=base.workload,
        parameters=parameters,
        runs=tuple(runs),
        partial=bool(partial_runs) or bool(reasons),
        partial_reason=(partial_runs[0].partial_reason if partial_runs else "")
        or "; ".join(reasons),
        inexact_sizes=base.inexact_sizes,
    )
