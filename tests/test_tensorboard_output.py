"""TensorBoard output: read back by TensorBoard's own loader and by the tensorboard program."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

from tests.result_factory import make_results
from tf_grpc_bench.replay.output import machine
from tf_grpc_bench.replay.output.document import ResultDocument, build_document
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.tensorboard import log_buckets, write_run
from tf_grpc_bench.sizes import SizeCategory

CREATED = datetime(2026, 11, 29, 12, 30, 5, tzinfo=timezone.utc)


def _document(network: NetworkInfo | None = None, seed: int = 7) -> ResultDocument:
    return build_document(
        make_results(seed=seed, runs=3, calls=30),
        config={"command": "replay", "serialized": False, "warmup_s": 2.0},
        trace_path=None,
        network=network or machine.loopback_network(["127.0.0.1:50001"]),
        created=CREATED,
    )


def _load(directory: Path) -> plugin_event_accumulator.EventAccumulator:
    accumulator = plugin_event_accumulator.EventAccumulator(str(directory))
    accumulator.Reload()
    return accumulator


def _scalar(accumulator: plugin_event_accumulator.EventAccumulator, tag: str) -> dict[int, float]:
    assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars", tag
    return {
        event.step: float(tensor_util.make_ndarray(event.tensor_proto))
        for event in accumulator.Tensors(tag)
    }


def test_tensorboard_loader_reads_back_the_figures_of_the_document(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        run = _load(tmp_path / label)
        assert _scalar(run, "latency_us/all/p50") == {0: result.latency_all.p50_ns / 1e3}
        assert _scalar(run, "latency_us/all/p99.9") == {0: result.latency_all.p999_ns / 1e3}
        for category, summary in result.latency_by_category:
            assert _scalar(run, f"latency_us/{category.value}/p99") == {0: summary.p99_ns / 1e3}
            assert _scalar(run, f"latency_us/{category.value}/mean") == {0: summary.mean_ns / 1e3}
        assert _scalar(run, "throughput/bandwidth_mb_per_s") == {0: result.bandwidth_mb_per_s}
        assert _scalar(run, "throughput/rpcs_per_s") == {0: result.rpcs_per_s}
        assert _scalar(run, "rpcs/count") == {0: result.rpc_count}
        per_run = _scalar(run, "per_run/bandwidth_mb_per_s")
        assert sorted(per_run) == [r.run_index for r in result.runs]
        first = result.runs[0]
        moved = first.request_bytes + first.response_bytes
        assert per_run[0] == pytest.approx(moved / (first.duration_ns / 1e9) / 1e6, rel=1e-12)


def test_size_classes_absent_from_a_benchmark_have_no_scalars(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    bandwidth = _load(tmp_path / "p2p-bandwidth")
    tags = bandwidth.Tags()["tensors"]
    assert "latency_us/large/p50" in tags
    assert "latency_us/small/p50" not in tags
    assert "step_time_ms/mean" not in tags


def test_trace_replay_step_times_are_scalars_and_histograms(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    result = document.benchmarks[2]
    run = _load(tmp_path / "ps-throughput")
    assert _scalar(run, "step_time_ms/mean") == {0: result.step_time.mean_ns / 1e6}
    per_step = _scalar(run, "per_step/communication_time_ms")
    assert list(per_step.values()) == [t / 1e6 for t in result.step_times_ns]
    assert run.SummaryMetadata("histogram/step_time_ms").plugin_data.plugin_name == "histograms"


def test_histograms_count_every_sample_of_each_run(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    result = document.benchmarks[0]
    run = _load(tmp_path / "p2p-latency")
    for tag in ("histogram/message_size_bytes", "histogram/latency_us"):
        assert run.SummaryMetadata(tag).plugin_data.plugin_name == "histograms"
        events = run.Tensors(tag)
        assert [e.step for e in events] == [r.run_index for r in result.runs]
        for event, measured in zip(events, result.runs, strict=True):
            buckets = tensor_util.make_ndarray(event.tensor_proto)
            assert buckets.shape[1] == 3
            assert buckets[:, 2].sum() == measured.rpc_count
    small = run.Tensors(f"histogram/latency_us/{SizeCategory.SMALL.value}")
    assert tensor_util.make_ndarray(small[0].tensor_proto)[:, 2].sum() == sum(
        1 for s in result.runs[0].samples if s.payload_bytes < 1024
    )


def test_log_buckets_cover_every_value_once() -> None:
    values = np.array([0.0, 21, 21, 4096, 600_000, 9_400_000], dtype=np.float64)
    buckets = log_buckets(values)
    assert buckets[:, 2].sum() == values.size
    assert buckets[0, 0] == 0.0 and buckets[-1, 1] == 9_400_000
    assert np.all(buckets[1:, 0] <= buckets[1:, 1])


def test_hparams_and_text_are_written_for_each_benchmark(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        run = _load(tmp_path / label)
        content = run.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data
        assert content.plugin_name == hparams_metadata.PLUGIN_NAME
        start = hparams_metadata.parse_session_start_info_plugin_data(content.content)
        assert start.hparams["benchmark"].string_value == result.benchmark.value
        assert start.hparams["network"].string_value == "loopback"
        assert start.hparams["mode"].string_value == result.parameters["mode"]
        assert start.hparams["serialized"].bool_value is False
        # Config values fill in; the benchmark's own parameters win.
        assert start.hparams["command"].string_value == "replay"
        assert start.hparams["warmup_s"].number_value == result.parameters["warmup_s"]
        assert run.SummaryMetadata("summary").plugin_data.plugin_name == "text"
        text = tensor_util.make_ndarray(run.Tensors("summary")[0].tensor_proto).item().decode()
        assert "| class |" in text and f"| {result.runs[-1].run_index} |" in text
    top = _load(tmp_path)
    table = tensor_util.make_ndarray(top.Tensors("results")[0].tensor_proto).item().decode()
    assert all(f"| {label} |" in table for label in document.labels)


def test_writing_a_document_again_replaces_its_event_files(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    write_run(document, tmp_path)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == 4, files
    assert _scalar(_load(tmp_path / "p2p-latency"), "rpcs/count") == {0: 90}


def test_writing_tensorboard_logs_does_not_import_tensorflow(tmp_path: Path) -> None:
    # tensorflow is installed in the test environment, so only a fresh
    # interpreter can tell whether writing the logs loads it.
    program = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from pathlib import Path
from tests.result_factory import golden_document
from tf_grpc_bench.replay.output.tensorboard import write_run
write_run(golden_document(), Path({str(tmp_path)!r}))
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "tensorflow")
print("tensorflow modules:", loaded)
sys.exit(1 if loaded else 0)
"""
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert (tmp_path / "p2p-latency").is_dir()


def _http_json(url: str, body: dict[str, object] | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data)
    if body is not None:
        request.add_header("Content-Type", "application/json")
        request.add_header("X-XSRF-Protected", "1")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_tensorboard_program_lists_runs_hparams_and_metrics_of_two_networks(
    tmp_path: Path,
) -> None:
    logdir = tmp_path / "logs"
    write_run(_document(), logdir / "loopback")
    veth = NetworkInfo(name="veth-1gbit", emulated_rate_bits_per_s=10**9, emulation="tbf")
    write_run(_document(network=veth, seed=8), logdir / "veth")
    tensorboard = Path(sys.executable).parent / "tensorboard"
    stderr_path = tmp_path / "tensorboard.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [
                str(tensorboard),
                "--logdir",
                str(logdir),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--load_fast=false",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        # Deadlines only guard against a hang; nothing here is timed.
        deadline = time.monotonic() + 180
        url = None
        while url is None:
            assert process.poll() is None, stderr_path.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "tensorboard never said where it serves"
            found = re.search(
                r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+/)",
                stderr_path.read_text(errors="replace"),
            )
            url = found.group(1) if found else None
            time.sleep(0.2)
        expected_runs = {
            f"{net}/{label}" for net in ("loopback", "veth") for label in _document().labels
        }
        while not expected_runs <= set(_http_json(url + "data/runs")):  # type: ignore[arg-type]
            assert time.monotonic() < deadline, "tensorboard never loaded the runs"
            time.sleep(0.5)

        tags = _http_json(url + "data/plugin/scalars/tags")
        assert isinstance(tags, dict)
        assert "throughput/bandwidth_mb_per_s" in tags["veth/p2p-bandwidth"]
        assert "latency_us/small/p99" in tags["loopback/p2p-latency"]

        experiment = _http_json(url + "data/plugin/hparams/experiment", {"experimentName": ""})
        assert isinstance(experiment, dict)
        hparams = {info["name"]: info for info in experiment["hparamInfos"]}
        assert set(hparams["network"]["domainDiscrete"]) == {"loopback", "veth-1gbit"}
        assert set(hparams["benchmark"]["domainDiscrete"]) == {
            "p2p-latency",
            "p2p-bandwidth",
            "ps-throughput",
        }
        metrics = {info["name"]["tag"] for info in experiment["metricInfos"]}
        assert {"throughput/bandwidth_mb_per_s", "latency_us/all/p99"} <= metrics

        groups = _http_json(
            url + "data/plugin/hparams/session_groups",
            {
                "experimentName": "",
                "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_RUNNING"],
                "colParams": [
                    {"hparam": "network", "includeInResult": True},
                    {"hparam": "benchmark", "includeInResult": True},
                    {
                        "metric": {"tag": "throughput/bandwidth_mb_per_s", "group": ""},
                        "includeInResult": True,
                    },
                ],
                "startIndex": 0,
                "sliceSize": 100,
            },
        )
        assert isinstance(groups, dict)
        rows = {
            (g["hparams"]["network"], g["hparams"]["benchmark"]): g["metricValues"]
            for g in groups["sessionGroups"]
        }
        assert len(rows) == 6
        bandwidth = _document().benchmarks[1].bandwidth_mb_per_s
        values = {m["name"]["tag"]: m["value"] for m in rows[("loopback", "p2p-bandwidth")]}
        assert values["throughput/bandwidth_mb_per_s"] == pytest.approx(bandwidth)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
