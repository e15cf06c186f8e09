"""bench/scaling.py's figures from result documents: per-process CPU and where it binds
(loaded from its file with bench/ on the path, as the script runs)."""

from __future__ import annotations

from typing import Any

from .conftest import load_bench_script

scaling = load_bench_script("scaling.py", "bench_scaling")


def _document(client: float, server: float, cpu_count: int = 2) -> dict[str, Any]:
    statistics = {
        "rpcs_per_s": 1200.0,
        "bandwidth_mb_per_s": 350.0,
        "client_cpu_utilization": client,
        "server_cpu_utilization": server,
        "prediction": {"step_ns": 560_000_000.0},
    }
    return {"machine": {"cpu_count": cpu_count}, "benchmarks": [{"statistics": statistics}]}


def test_cores_are_split_per_worker_and_per_ps_process() -> None:
    row = scaling.loopback_row(_document(client=1.2, server=0.4), workers=4, ps=2)
    assert (row.worker_cores, row.ps_cores, row.total_cores) == (0.3, 0.2, 1.6)
    assert row.step_s == 0.56
    assert row.cpu_bound == ""


def test_cores_per_client_process_count_every_process_of_every_worker() -> None:
    document = _document(client=1.2, server=0.4)
    document["benchmarks"][0]["parameters"] = {"procs_per_worker": 2, "client_processes": 8}
    row = scaling.loopback_row(document, workers=4, ps=2, procs=2)
    assert (row.procs, row.worker_cores, row.total_cores) == (2, 0.15, 1.6)
    text = scaling.report(
        [row], [], [], compute="none", command="bench/scaling.py", before="1", after="2"
    )
    assert "| 4 | 2 | 2 |" in text


def test_a_row_is_cpu_bound_by_the_machine_or_by_one_interpreter() -> None:
    machine = scaling.loopback_row(_document(client=1.0, server=0.8), workers=2, ps=1)
    assert machine.cpu_bound == "machine (1.80 of 2 cores)"
    one_ps = scaling.loopback_row(_document(client=0.3, server=0.95, cpu_count=8), workers=1, ps=1)
    assert one_ps.cpu_bound == "one ps process (0.95 core)"


def test_the_section_has_one_table_per_part_measured() -> None:
    row = scaling.loopback_row(_document(client=0.6, server=0.6), workers=1, ps=1)
    memory = scaling.MemoryRow(
        workers=1, idle_bytes=73 << 20, peak_bytes=369 << 20, threads=69, received_bytes=510**3
    )
    text = scaling.report(
        [row], [memory], [], compute="none", command="bench/scaling.py", before="1", after="2"
    )
    assert text.startswith("## Scaling\n")
    assert "| 1 | 1 | 1,200 | 350 | 0.56 s | 0.60 | 0.60 | 1.20 of 2 | no |" in text
    assert "| 1 | 73 MiB | 369 MiB | 296 MiB | 69 | 0.13 GB |" in text
    assert "What-if on emulated links" not in text
