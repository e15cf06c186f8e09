"""bench/common.py, the helpers the bench scripts share (loaded from its file: the
scripts import it as ``common`` with bench/ on the path, which tests do not have)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from .conftest import BENCH, load_bench_script

common = load_bench_script("common.py", "bench_common")

SOCKPERF_OUTPUT = """\
sockperf: == version #3.7-no.git ==
sockperf[CLIENT] send on:sockperf: using recvfrom() to block on socket(s)
\x1b[2;35msockperf: ====> avg-rtt=28.519 (std-dev=5.120)\x1b[0m
sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
sockperf: Summary: Round trip is 28.519 usec
sockperf: Total 34869 observations; each percentile contains 348.69 observations
sockperf: ---> <MAX> observation =  171.205
sockperf: ---> percentile 99.999 =  171.205
sockperf: ---> percentile 99.000 =   44.931
sockperf: ---> percentile 50.000 =   27.378
sockperf: ---> <MIN> observation =   19.861
"""


@pytest.mark.parametrize(
    ("size", "name"),
    [
        (10, "10 B"),
        (14, "14 B"),
        (1024, "1 KiB"),
        (10 * 1024, "10 KiB"),
        (1536, "1536 B"),
        (1 << 20, "1 MiB"),
        (10 << 20, "10 MiB"),
        (1536 * 1024, "1536 KiB"),
    ],
)
def test_size_name_uses_the_largest_unit_that_divides(size: int, name: str) -> None:
    assert common.size_name(size) == name


def test_load_average_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.os, "getloadavg", lambda: (1.234, 0.5, 12.0))
    assert common.load_average() == "1.23 / 0.50 / 12.00"
    assert common.load_average(digits=1, separator=" ") == "1.2 0.5 12.0"


def test_command_line_is_the_script_from_the_repository_root() -> None:
    script = str(BENCH / "replay_vs_raw.py")
    assert common.command_line(script, ["--seconds", "2"]) == (
        ".venv/bin/python bench/replay_vs_raw.py --seconds 2"
    )
    assert common.command_line(script, [], python="python") == "python bench/replay_vs_raw.py"
    assert common.command_line(script, ["a b"]) == ".venv/bin/python bench/replay_vs_raw.py 'a b'"


def test_table_head_and_row() -> None:
    assert common.table_head("ratio", "value") == ["| ratio | value |", "|---|---|"]
    assert common.table_row("a", "1.00") == "| a | 1.00 |"


def test_free_port_can_be_bound() -> None:
    port = common.free_port()
    with socket.socket() as listener:
        listener.bind((common.LOOPBACK, port))


def test_replace_section_creates_replaces_and_appends(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    common.replace_section(readme, "## One", "## One\n\nfirst\n")
    assert readme.read_text() == "# Benchmarks\n\n## One\n\nfirst\n"
    common.replace_section(readme, "## Two", "## Two\n\nsecond")
    common.replace_section(readme, "## One", "## One\n\nagain\n")
    assert readme.read_text() == "# Benchmarks\n\n## One\n\nagain\n\n## Two\n\nsecond\n"
    performance = tmp_path / "performance.md"
    common.replace_section(performance, "## M", "## M\n", title="# Performance")
    assert performance.read_text() == "# Performance\n\n## M\n"


def test_iperf3_commands() -> None:
    assert common.iperf3_server_command(5201) == ["iperf3", "-s", "-1", "-p", "5201"]
    assert common.iperf3_server_command(5201, bind="127.0.0.1")[3:5] == ["-B", "127.0.0.1"]
    client = common.iperf3_client_command("10.0.0.1", 5201, 2.5)
    assert client == ["iperf3", "-c", "10.0.0.1", "-p", "5201", "-J", "-t", "2.5"]
    assert common.iperf3_client_command("h", 1, 2, streams=2)[-2:] == ["-P", "2"]
    report = {"end": {"sum_received": {"bits_per_second": 8e9}}}
    assert common.iperf3_received_bits_per_s(report) == 8e9


def test_parse_sockperf_reads_the_figures_through_its_colours() -> None:
    found = common.parse_sockperf(SOCKPERF_OUTPUT, 14)
    assert found == common.SockperfRoundTrip(
        size_bytes=14, p50_us=27.378, p99_us=44.931, mean_us=28.519, count=34869
    )


def test_parse_sockperf_says_what_is_missing() -> None:
    with pytest.raises(
        RuntimeError, match=r"sockperf -m 14: no mean_us .*\(sockperf: connection refused\)"
    ):
        common.parse_sockperf("sockperf: connection refused\n", 14)


@pytest.mark.netns  # root: makes a CPU cgroup
def test_cpu_cgroup_caps_what_its_prefix_starts_and_goes_away(tmp_path: Path) -> None:
    import subprocess

    with common.cpu_cgroup(0.5) as prefix:
        folder = Path(prefix[-1])
        quota = (
            (folder / "cpu.cfs_quota_us").read_text()
            if (folder / "cpu.cfs_quota_us").exists()
            else (folder / "cpu.max").read_text().split()[0]
        )
        assert int(quota) == common.PERIOD_US // 2
        shown = subprocess.run(
            [*prefix, "cat", "/proc/self/cgroup"], capture_output=True, text=True, check=True
        ).stdout
        assert folder.name in shown
    assert not folder.exists()


def test_calibration_cache_points_commands_at_its_file_and_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from tf_grpc_bench import calibration

    monkeypatch.setenv(calibration.CACHE_ENV, "/before.json")
    with common.calibration_cache(tmp_path / "here.json"):
        assert os.environ[calibration.CACHE_ENV] == str(tmp_path / "here.json")
    assert os.environ[calibration.CACHE_ENV] == "/before.json"
    monkeypatch.delenv(calibration.CACHE_ENV)
    with common.calibration_cache(tmp_path / "here.json"):
        pass
    assert calibration.CACHE_ENV not in os.environ
