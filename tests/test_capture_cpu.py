"""The capture machine's CPU over a trace's steps: sampled, summarized, recorded, said."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import load_bench_script, make_trace
from tests.result_factory import make_results
from tf_grpc_bench import capture_cpu, trace_files
from tf_grpc_bench.capture_cpu import CaptureCpu
from tf_grpc_bench.critical_path import CapturedSegment
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.profiler.capture import with_capture_cpu
from tf_grpc_bench.profiler.cpu_sampler import CpuSample, CpuSampler, process_ticks, summarize
from tf_grpc_bench.replay import cli as replay_cli
from tf_grpc_bench.replay.output.document import ResultDocument, build_document
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.report import (
    capture_cpu_note,
    format_markdown_table,
    format_table,
)
from tf_grpc_bench.trace import RECV_TENSOR, Rpc, TensorInfo
from tf_grpc_bench.trace_summary import format_summary

SATURATED = CaptureCpu(
    cores=2,
    busy_cores=1.95,
    task_cores=(("ps:0", 0.4), ("worker:0", 0.7), ("worker:1", 0.75)),
    span_ns=4_800_000_000,
)


def _extra(cpu: CaptureCpu, *more: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (*cpu.extra(), *more)


# --------------------------------------------------------------------------
# The trace's entries.


def test_the_entries_read_back_as_written_and_say_what_they_are() -> None:
    extra = SATURATED.extra()
    assert dict(extra) == {
        "capture_cpu_cores": "2",
        "capture_cpu_busy_cores": "1.950",
        "capture_cpu_task_cores": "ps:0=0.400,worker:0=0.700,worker:1=0.750",
        "capture_cpu_span_ns": "4800000000",
    }
    assert capture_cpu.from_extra(extra) == SATURATED
    assert capture_cpu.from_extra((("cpus", "2"),)) is None
    assert SATURATED.tasks_cores == pytest.approx(1.85)
    assert SATURATED.busy_share == pytest.approx(0.975) and SATURATED.contended
    assert SATURATED.text() == (
        "1.95 of 2 cores busy (98%) over 4.8 s of steps; the job's tasks 1.85 "
        "(ps:0 0.40, worker:0 0.70, worker:1 0.75)"
    )
    half = dataclasses.replace(SATURATED, busy_cores=1.0)
    assert not half.contended
    # A task that used nothing is still listed; a job whose tasks were never seen has none.
    idle = dataclasses.replace(SATURATED, task_cores=())
    assert capture_cpu.from_extra(idle.extra()) == idle


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("capture_cpu_cores", "0", "a positive whole number of cores"),
        ("capture_cpu_cores", "two", "a positive whole number of cores"),
        ("capture_cpu_span_ns", "-5", "a positive whole number of nanoseconds"),
        ("capture_cpu_busy_cores", "nan", "cores busy, a number >= 0"),
        ("capture_cpu_busy_cores", "-1", "cores busy, a number >= 0"),
        ("capture_cpu_task_cores", "ps:0=0.4,worker=1", "JOB:INDEX=CORES"),
    ],
)
def test_a_malformed_entry_is_an_error_naming_it(key: str, value: str, expected: str) -> None:
    extra = tuple((k, value if k == key else v) for k, v in SATURATED.extra())
    with pytest.raises(ConfigError, match=f"{key}={value!r}: expected {expected}"):
        capture_cpu.from_extra(extra)
    assert capture_cpu.cpu_line(extra).startswith(f"capture CPU: unreadable (trace metadata {key}")


def test_the_entries_come_together() -> None:
    extra = tuple(item for item in SATURATED.extra() if item[0] != "capture_cpu_span_ns")
    with pytest.raises(ConfigError, match="capture_cpu_span_ns is missing"):
        capture_cpu.from_extra(extra)


def test_inspect_says_how_busy_the_capture_machine_was_and_on_which_link() -> None:
    loopback = capture_cpu.cpu_line(SATURATED.extra())
    assert loopback == (
        f"capture CPU: {SATURATED.text()}; bound by the machine's cores (docs/fidelity.md, Limits)"
    )
    spare = dataclasses.replace(SATURATED, busy_cores=1.2)
    assert capture_cpu.cpu_line(spare.extra()) == f"capture CPU: {spare.text()}"
    assert capture_cpu.cpu_line((("cpus", "2"),)) == ""
    trace = make_trace()
    shown = dataclasses.replace(
        trace, metadata=dataclasses.replace(trace.metadata, extra=SATURATED.extra())
    )
    assert loopback in format_summary(shown).splitlines()
    assert "capture CPU" not in format_summary(trace)


# --------------------------------------------------------------------------
# From samples to averages over the steps.


def _samples(
    seconds: int, *, busy_per_s: int, total_per_s: int, tasks: dict[str, int]
) -> list[CpuSample]:
    """One sample a second from t = 10 s, every counter growing at its rate (ticks/s)."""
    return [
        CpuSample(
            monotonic_ns=(10 + i) * 1_000_000_000,
            busy_ticks=1000 + busy_per_s * i,
            total_ticks=5000 + total_per_s * i,
            task_ticks={name: 7 + rate * i for name, rate in tasks.items()},
        )
        for i in range(seconds + 1)
    ]


def test_the_averages_are_over_the_steps_span_read_between_samples() -> None:
    samples = _samples(10, busy_per_s=150, total_per_s=200, tasks={"ps:0": 50, "worker:0": 100})
    # Two steps, 12.5 s to 14 s and 14 s to 17.25 s: counters read between samples.
    windows = [(12_500_000_000, 14_000_000_000), (14_000_000_000, 17_250_000_000)]
    found = summarize(samples, windows, ["ps:0", "worker:0", "chief:0"], cores=2, ticks_per_s=100)
    assert found is not None
    assert found.cores == 2 and found.span_ns == 4_750_000_000
    assert found.busy_cores == pytest.approx(1.5)
    # chief:0 was never seen: not listed; the others in the order asked.
    assert found.task_cores == (("ps:0", pytest.approx(0.5)), ("worker:0", pytest.approx(1.0)))


def test_a_rate_that_changes_mid_step_is_averaged_over_the_step() -> None:
    quiet = _samples(4, busy_per_s=20, total_per_s=200, tasks={"worker:0": 0})
    busy = [
        dataclasses.replace(
            s,
            monotonic_ns=s.monotonic_ns + 5_000_000_000,
            busy_ticks=quiet[-1].busy_ticks + 200 * (i + 1),
            total_ticks=quiet[-1].total_ticks + 200 * (i + 1),
            task_ticks={"worker:0": 7 + 190 * (i + 1)},
        )
        for i, s in enumerate(quiet)
    ]
    # 2 s quiet (0.2 cores), then 2 s with both cores busy (2.0), worker 1.9 of them.
    found = summarize(quiet + busy, [(12_000_000_000, 16_000_000_000)], ["worker:0"], cores=2)
    assert found is not None
    assert found.busy_cores == pytest.approx(1.1)
    assert found.task_cores == (("worker:0", pytest.approx(0.95 * 100 / os.sysconf("SC_CLK_TCK"))),)


def test_steps_the_samples_do_not_cover_record_nothing() -> None:
    samples = _samples(4, busy_per_s=150, total_per_s=200, tasks={})
    assert summarize(samples, [], ["ps:0"]) is None
    assert summarize(samples[:1], [(10_000_000_000, 11_000_000_000)], ["ps:0"]) is None
    # Covered for 1 s of 4: too little to say.
    assert summarize(samples, [(13_000_000_000, 17_000_000_000)], ["ps:0"]) is None
    # Covered for 3 s of 4: the covered part.
    found = summarize(samples, [(11_000_000_000, 15_000_000_000)], [], cores=2)
    assert found is not None and found.span_ns == 3_000_000_000


def test_a_capture_records_its_steps_cpu_and_leaves_a_trace_without_samples_as_it_is() -> None:
    trace = make_trace()
    origin = 9_000_000_000
    first, last = trace.steps[0], trace.steps[-1]
    samples = [
        CpuSample(
            monotonic_ns=origin + t,
            busy_ticks=int(t * 150 / 1e9),
            total_ticks=int(t * 200 / 1e9),
            task_ticks={"ps:0": int(t * 60 / 1e9)},
        )
        for t in (first.start_ns - 10**9, last.end_ns + 10**9)
    ]
    recorded = with_capture_cpu(trace, samples, origin_ns=origin)
    found = capture_cpu.from_extra(recorded.metadata.extra)
    assert found is not None
    assert found.span_ns == last.end_ns - first.start_ns
    assert found.busy_cores == pytest.approx(0.75 * found.cores, rel=0.01)
    assert [name for name, _ in found.task_cores] == ["ps:0"]
    # The rest of the metadata is kept, in order.
    assert set(trace.metadata.extra) <= set(recorded.metadata.extra)
    assert list(recorded.metadata.extra) == sorted(recorded.metadata.extra)
    assert with_capture_cpu(trace, [], origin_ns=origin) == trace


# --------------------------------------------------------------------------
# Sampling.


def _write_stat(proc: Path, pid: int, *, session: int, ticks: int) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    fields = f"S 1 {session} {session} 0 -1 0 0 0 0 0 {ticks - ticks // 3} {ticks // 3} 0 0"
    (proc / str(pid) / "stat").write_text(f"{pid} (py (worker) x) {fields}\n")


def test_a_tasks_count_is_its_sessions_and_keeps_what_its_ended_processes_used(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu 100 0 50 800 10 0 0 0 0 0\n")
    _write_stat(proc, 500, session=500, ticks=30)  # the task (leads its session)
    _write_stat(proc, 501, session=500, ticks=12)  # something it started
    _write_stat(proc, 900, session=900, ticks=99)  # another session: not the task's
    tasks = {"worker:0": 500}
    sampler = CpuSampler(lambda: tasks, proc=proc)
    first = sampler.sample()
    assert first is not None
    assert (first.busy_ticks, first.total_ticks) == (150, 960)
    assert first.task_ticks == {"worker:0": 42}
    assert process_ticks(500, proc) == 30 and process_ticks(77, proc) is None
    # The child ends after using 20 ticks: its 20 still count.
    _write_stat(proc, 501, session=500, ticks=20)
    assert sampler.sample().task_ticks == {"worker:0": 50}  # type: ignore[union-attr]
    for entry in (proc / "501").iterdir():
        entry.unlink()
    (proc / "501").rmdir()
    _write_stat(proc, 500, session=500, ticks=35)
    assert sampler.sample().task_ticks == {"worker:0": 55}  # type: ignore[union-attr]
    # A task not started yet is left out; the machine unreadable: no sample.
    tasks["ps:0"] = 600
    assert sampler.sample().task_ticks == {"worker:0": 55}  # type: ignore[union-attr]
    # The launcher's table of tasks changing while read (on another thread): the tasks
    # known before are sampled, and the sampler goes on.
    changing_now = [True]

    def launcher_pids() -> dict[str, int]:
        if changing_now[0]:
            raise RuntimeError("dictionary changed size during iteration")
        return dict(tasks)

    changing = CpuSampler(launcher_pids, proc=proc)
    assert changing.sample().task_ticks == {}  # type: ignore[union-attr]
    changing_now[0] = False
    assert changing.sample().task_ticks == {"worker:0": 35}  # type: ignore[union-attr]
    changing_now[0] = True
    tasks["worker:1"] = 900
    assert changing.sample().task_ticks == {"worker:0": 35}  # type: ignore[union-attr]
    (proc / "stat").unlink()
    assert sampler.sample() is None


BURN = textwrap.dedent(
    """
    import time
    begin = time.process_time()
    while time.process_time() - begin < 1.5:
        pass
    """
)


def test_a_real_task_counts_the_cpu_of_a_child_that_ended(tmp_path: Path) -> None:
    # The task is a shell that runs a child burning 1.5 CPU-seconds, then sleeps: the
    # shell itself uses next to nothing.
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    task = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" "{script}"; sleep 0.5'], start_new_session=True
    )
    try:
        sampler = CpuSampler(lambda: {"worker:0": task.pid}, interval_s=0.05)
        sampler.start()
        assert task.wait(timeout=120) == 0
        sampler.stop()
    finally:
        if task.poll() is None:
            os.killpg(task.pid, signal.SIGKILL)
            task.wait()
    hertz = os.sysconf("SC_CLK_TCK")
    counted = sampler.samples[-1].task_ticks["worker:0"] - sampler.samples[0].task_ticks.get(
        "worker:0", 0
    )
    # At most one rescan interval (10 samples) of the child's CPU goes unseen.
    assert counted >= 0.5 * hertz
    # The count only grows.
    ticks = [s.task_ticks.get("worker:0", 0) for s in sampler.samples]
    assert ticks == sorted(ticks)
    assert [s.monotonic_ns for s in sampler.samples] == sorted(
        s.monotonic_ns for s in sampler.samples
    )
    assert sampler.samples[-1].monotonic_ns <= time.monotonic_ns()


def test_the_last_sample_is_taken_at_the_stop() -> None:
    # A job whose last step ended just before it stopped: the samples must reach past it,
    # however long the interval between samples.
    sampler = CpuSampler(dict, interval_s=3600)
    sampler.start()
    time.sleep(0.2)
    stopped_ns = time.monotonic_ns()
    sampler.stop()
    assert len(sampler.samples) == 2
    assert sampler.samples[-1].monotonic_ns >= stopped_ns


# --------------------------------------------------------------------------
# What a replay says of it.


def _replayed(**throughput: str | float) -> ResultDocument:
    found = make_results(runs=2, calls=6)
    found[2] = dataclasses.replace(found[2], parameters={**found[2].parameters, **throughput})
    return build_document(found, config={}, trace_path=None)


def test_a_replay_keeping_compute_of_a_cpu_bound_capture_says_so_below_its_tables() -> None:
    described = dict(capture_cpu.described(SATURATED.extra()))
    assert described == {
        "capture_cpu": f"{SATURATED.text()}, on loopback",
        "capture_cpu_busy_share": 0.975,
        "capture_link": "loopback",
    }
    kept = {"pacing": "dependencies", "compute_scale": 1.0, **described}
    document = _replayed(**kept)
    note = capture_cpu_note(document)
    assert note == (
        f"trace captured bound by its CPU ({SATURATED.text()}, on loopback): its compute gaps "
        "were measured with the cores all busy, and such traces have predicted another link's "
        "training up to 15% short (docs/fidelity.md, Limits); a trace captured on the link in "
        "question (capture --network PROFILE) predicts it better"
    )
    assert format_table(document).splitlines()[-1] == note
    markdown = format_markdown_table([document, document]).splitlines()
    assert markdown.count(note) == 1
    # Nothing to say: cores to spare, no compute kept, or a trace that recorded none.
    assert capture_cpu_note(_replayed(**{**kept, "capture_cpu_busy_share": 0.6})) == ""
    assert capture_cpu_note(_replayed(**{**kept, "compute_scale": 0})) == ""
    assert capture_cpu_note(_replayed(**{**kept, "pacing": "asap"})) == ""
    assert capture_cpu_note(_replayed(pacing="dependencies", compute_scale=1.0)) == ""
    # Replayed on the link it was captured on: that link's contention is the one to keep.
    on_its_link = dataclasses.replace(document, network=NetworkInfo(name="loopback"))
    assert capture_cpu_note(on_its_link) == ""
    elsewhere = dataclasses.replace(document, network=NetworkInfo(name="5gbit"))
    assert capture_cpu_note(elsewhere) == note


def test_a_trace_replay_carries_its_capture_cpu_among_its_parameters(tmp_path: Path) -> None:
    trace = make_trace()
    parser = argparse.ArgumentParser()
    replay_cli.configure_replay(parser)
    recorded = dataclasses.replace(
        trace,
        metadata=dataclasses.replace(trace.metadata, extra=_extra(SATURATED, ("network", "5gbit"))),
    )
    path = trace_files.write_trace(recorded, tmp_path / "cpu.tfgbtrace")
    request = replay_cli.build_request(parser.parse_args([str(path), "--benchmark", "all"]))
    for workload in request.workloads:
        parameters = workload.parameters()
        assert parameters["capture_cpu"] == f"{SATURATED.text()}, on 5gbit"
        assert parameters["capture_cpu_busy_share"] == 0.975
        assert parameters["capture_link"] == "5gbit"
    # A malformed entry stops the replay before anything runs, naming it.
    broken = dataclasses.replace(
        trace,
        metadata=dataclasses.replace(
            trace.metadata,
            extra=tuple((k, "x" if k == "capture_cpu_cores" else v) for k, v in SATURATED.extra()),
        ),
    )
    path = trace_files.write_trace(broken, tmp_path / "broken.tfgbtrace")
    with pytest.raises(ConfigError, match="capture_cpu_cores='x'"):
        replay_cli.build_request(parser.parse_args([str(path), "--benchmark", "all"]))


# --------------------------------------------------------------------------
# bench/fidelity.py's table of captures.


def test_the_fidelity_bench_lays_each_captures_cpu_beside_its_critical_path() -> None:
    fidelity = load_bench_script("fidelity.py", "bench_fidelity")
    training = sys.modules["training"]
    trace = make_trace()
    recorded = dataclasses.replace(
        trace, metadata=dataclasses.replace(trace.metadata, extra=SATURATED.extra())
    )
    facts = training.capture_facts(recorded, "loopback")
    assert facts.cpu == SATURATED
    # The tasks' cores over the span, per step of the trace.
    assert facts.tasks_cpu_per_round_s == pytest.approx(1.85 * 4.8 / len(trace.steps))
    assert facts.path_compute_s is not None and facts.path_communication_s is not None
    bare = training.capture_facts(trace, "5gbit")
    assert bare.cpu is None and bare.tasks_cpu_per_round_s is None
    table = fidelity.capture_table([facts, bare])
    assert table[-3] == "|" + "---|" * 12
    assert table[-2].startswith("| loopback | ") and " 1.95 of 2 | " in table[-2]
    assert table[-1].startswith("| 5gbit | ") and "| - | - |" in table[-1]


def test_the_fidelity_bench_counts_the_path_compute_while_the_worker_was_sending() -> None:
    training = load_bench_script("training.py", "bench_training")
    # Compute 0-10 and 20-30; sends 5-8, 7-12 (merged: 5-12) and 25-40.
    assert training._overlap_ns([(0, 10), (20, 30)], [(7, 12), (5, 8), (25, 40)]) == 5 + 5
    assert training._overlap_ns([(0, 10)], []) == 0
    trace = make_trace()
    facts = training.capture_facts(trace, "loopback")
    assert facts.path_compute_sending_s is not None
    assert 0 <= facts.path_compute_sending_s <= facts.path_compute_s
    # Synthetic traces carry no TF1 sync token.
    assert facts.path_compute_before_token_s == 0


def test_the_fidelity_bench_counts_the_path_compute_right_before_tf1s_sync_token() -> None:
    training = load_bench_script("training.py", "bench_training")

    def pull(edge: str) -> Rpc:
        devices = "/job:ps/replica:0/task:0/device:CPU:0;1;/job:worker/replica:0/task:0/cpu:0"
        key = f"{devices};{edge};0:0"
        return Rpc(
            method=RECV_TENSOR,
            caller_task=1,
            callee_task=0,
            request_bytes=150,
            response_bytes=23,
            tensor=TensorInfo(rendezvous_key=key),
        )

    rpcs = (pull("edge_3815_gradients/conv1/BiasAddGrad"), pull("edge_4040_sync_token_q_Dequeue"))
    segments = (
        CapturedSegment(start_ns=0, end_ns=10, rpc_index=-1),
        CapturedSegment(start_ns=10, end_ns=12, rpc_index=0),  # after 10 of compute: not it
        CapturedSegment(start_ns=12, end_ns=60, rpc_index=-1),
        CapturedSegment(start_ns=60, end_ns=61, rpc_index=1),  # after 48: the token
        CapturedSegment(start_ns=61, end_ns=70, rpc_index=-1),
    )
    assert training._compute_before_token_ns(rpcs, segments) == 48
    assert training._compute_before_token_ns(rpcs[:1] * 2, segments) == 0


def test_the_fidelity_bench_puts_a_capped_run_in_a_section_of_its_own() -> None:
    fidelity = load_bench_script("fidelity.py", "bench_fidelity")
    training = sys.modules["training"]
    assert fidelity.section("resnet50", "tf1-ps", None) == "## Fidelity: resnet50, tf1-ps"
    capped = fidelity.section("resnet50", "tf1-ps", 1.2)
    assert capped == "## Fidelity on a slower machine: resnet50, tf1-ps, 1.2 cores"
    facts = training.capture_facts(make_trace(), "loopback")
    body = fidelity.report([], "tf1-ps", "cmd", "0", "0", facts, cpu_cap=1.2)
    assert body.splitlines()[0] == "## Fidelity on a slower machine: ?, tf1-ps, 1.2 cores"
    assert "capped at 1.2" in body and "`--compute recorded`" in body
    assert "capped" not in fidelity.report([], "tf1-ps", "cmd", "0", "0", facts)
