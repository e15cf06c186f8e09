"""The whole machine's CPU over a run, from Linux's /proc/stat: parsing and combining."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tf_grpc_bench.host import (
    PROC_STAT,
    MachineCpuTimes,
    others_cpu_share,
    parse_proc_stat,
    read_machine_cpu,
)
from tf_grpc_bench.replay.core.measurement import RunMeasurement, machine_cpu_busy_share
from tf_grpc_bench.replay.transport.loop import WorkerOutcome, machine_cpu_over

#: A /proc/stat of a 2-core machine (Linux 6.x: ten fields per cpu line).
SAMPLE = """\
cpu  4705 150 1120 16250 520 0 31 7 0 0
cpu0 2355 75 560 8125 260 0 16 4 0 0
cpu1 2350 75 560 8125 260 0 15 3 0 0
intr 114930 43 0 0
ctxt 1990473
btime 1062191376
processes 2915
procs_running 1
procs_blocked 0
softirq 183433 0 21755 12 39 0 0 1 0 0
"""


def test_the_aggregate_cpu_line_gives_busy_and_total_ticks(tmp_path: Path) -> None:
    # busy = user 4705 + nice 150 + system 1120 + irq 0 + softirq 31 + steal 7; guest
    # time is already in user and nice; total adds idle 16250 and iowait 520.
    expected = MachineCpuTimes(busy_ticks=6013, total_ticks=6013 + 16250 + 520)
    assert parse_proc_stat(SAMPLE) == expected
    written = tmp_path / "stat"
    written.write_text(SAMPLE)
    assert read_machine_cpu(written) == expected


def test_a_kernel_reporting_four_fields_counts_the_rest_as_zero() -> None:
    assert parse_proc_stat("cpu  10 2 3 85\n") == MachineCpuTimes(busy_ticks=15, total_ticks=100)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cpu0 1 2 3 4\nintr 5\n", r"^/proc/stat: no aggregate 'cpu' line$"),
        ("cpu  1 2 x 4\n", r"^/proc/stat: the cpu line's fields are not counts: 'cpu  1 2 x 4'$"),
        ("cpu  1 2 3\n", r"^/proc/stat: expected 4 or more counts on the cpu line: 'cpu  1 2 3'$"),
        ("cpu  1 -2 3 4\n", r"^/proc/stat: expected 4 or more counts on the cpu line: "),
    ],
)
def test_a_stat_file_without_a_usable_cpu_line_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_proc_stat(text)


def test_a_missing_or_unreadable_stat_file_reads_as_unknown(tmp_path: Path) -> None:
    assert read_machine_cpu(tmp_path / "absent") is None
    garbled = tmp_path / "stat"
    garbled.write_text("not a stat file\n")
    assert read_machine_cpu(garbled) is None


@pytest.mark.skipif(not PROC_STAT.exists(), reason="no /proc/stat (not Linux)")
def test_the_real_proc_stat_parses_and_its_counters_grow() -> None:
    first = parse_proc_stat(PROC_STAT.read_text())
    assert 0 < first.busy_ticks < first.total_ticks
    # Burn this process's CPU until the kernel's tick counters have moved.
    second = first
    while second.busy_ticks == first.busy_ticks:
        sum(i * i for i in range(100_000))
        time.sleep(0)
        reading = read_machine_cpu()
        assert reading is not None
        second = reading
    assert second.busy_ticks > first.busy_ticks
    assert second.total_ticks - first.total_ticks >= second.busy_ticks - first.busy_ticks


def _outcome(begin: MachineCpuTimes | None, end: MachineCpuTimes | None) -> WorkerOutcome:
    return WorkerOutcome(
        samples=(),
        step_times_ns=(),
        elapsed_ns=1,
        cpu_ns=0,
        machine_cpu_begin=begin,
        machine_cpu_end=end,
    )


def test_a_runs_machine_cpu_spans_the_first_begin_to_the_last_end() -> None:
    times = [MachineCpuTimes(busy_ticks=b, total_ticks=t) for b, t in ((10, 100), (15, 110))]
    later = [MachineCpuTimes(busy_ticks=b, total_ticks=t) for b, t in ((60, 200), (95, 210))]
    outcomes = [_outcome(times[1], later[0]), _outcome(times[0], later[1])]
    assert machine_cpu_over(outcomes) == (95 - 10, 210 - 100)
    assert machine_cpu_over([*outcomes, _outcome(None, None)]) == (0, 0)
    assert machine_cpu_over([_outcome(later[0], times[0])]) == (0, 0)
    assert machine_cpu_over([]) == (0, 0)
    # One reading missing, at either end: unknown.
    assert machine_cpu_over([*outcomes, _outcome(None, later[1])]) == (0, 0)
    assert machine_cpu_over([*outcomes, _outcome(times[0], None)]) == (0, 0)
    # No tick went by: nothing measured; busy counts never go below 0.
    assert machine_cpu_over([_outcome(times[0], times[0])]) == (0, 0)
    fewer = MachineCpuTimes(busy_ticks=5, total_ticks=150)
    assert machine_cpu_over([_outcome(times[0], fewer)]) == (0, 50)


def test_the_busy_share_of_several_runs_weighs_them_by_their_ticks() -> None:
    def run(busy: int, total: int) -> RunMeasurement:
        return RunMeasurement(
            run_index=0,
            duration_ns=1,
            samples=(),
            machine_cpu_busy_ticks=busy,
            machine_cpu_total_ticks=total,
        )

    assert machine_cpu_busy_share([run(90, 100), run(30, 300), run(0, 0)]) == 120 / 400
    assert machine_cpu_busy_share([run(0, 0)]) is None
    # One tick is a measurement (a very short run on a quiet machine).
    assert machine_cpu_busy_share([run(1, 1)]) == 1.0
    assert machine_cpu_busy_share([]) is None
    # An idle run is a measurement too: its ticks count, none of them busy.
    assert machine_cpu_busy_share([run(0, 100)]) == 0.0
    assert machine_cpu_busy_share([run(0, 200), run(50, 200)]) == 50 / 400


def test_others_share_is_the_machine_busy_less_one_process() -> None:
    begin = MachineCpuTimes(busy_ticks=1000, total_ticks=5000)
    end = MachineCpuTimes(busy_ticks=1300, total_ticks=5400)
    # 400 ticks (2 s of 2 cores at 100 Hz), 300 busy, 1.5 s of them (150 ticks) the process's.
    assert others_cpu_share(begin, end, 1_500_000_000, ticks_per_s=100) == pytest.approx(0.375)
    # The process alone: nothing else; a process reading more than the machine: clamped.
    assert others_cpu_share(begin, end, 3_000_000_000, ticks_per_s=100) == 0.0
    assert others_cpu_share(begin, end, 5_000_000_000, ticks_per_s=100) == 0.0
    assert others_cpu_share(None, end, 0) is None
    assert others_cpu_share(begin, begin, 0) is None
