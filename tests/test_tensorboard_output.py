"""TensorBoard output as its Python loader reads it (a real server: test_tensorboard_server)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util import tensor_util

from tests.result_factory import make_results
from tf_grpc_bench.replay.output import machine
from tf_grpc_bench.replay.output.document import ResultDocument, TraceInfo, build_document
from tf_grpc_bench.replay.output.events import log_buckets
from tf_grpc_bench.replay.output.hparams import (
    COMPARISON_HPARAMS,
    as_text,
    compute_mode,
    experiment_summary,
    hparam_values,
)
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.tensorboard import FLAT_STEPS, write_run
from tf_grpc_bench.sizes import SizeCategory
from tf_grpc_bench.units import format_rate

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
    # Every value of every tag (the loader's default keeps a sample of 10 per tag).
    accumulator = plugin_event_accumulator.EventAccumulator(
        str(directory), size_guidance={"tensors": 0}
    )
    accumulator.Reload()
    return accumulator


def _scalar(accumulator: plugin_event_accumulator.EventAccumulator, tag: str) -> dict[int, float]:
    """The scalar's values by step; each must be a float32 tensor (what the Rust loader reads)."""
    assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars", tag
    events = accumulator.Tensors(tag)
    assert all(event.tensor_proto.dtype == types_pb2.DT_FLOAT for event in events), tag
    return {event.step: float(tensor_util.make_ndarray(event.tensor_proto)) for event in events}


def _f32(value: float) -> float:
    return float(np.float32(value))


def _flat(value: float) -> dict[int, float]:
    """A figure over all runs as written: the same value at every step of ``FLAT_STEPS``."""
    return dict.fromkeys(range(FLAT_STEPS), value)


def test_tensorboard_loader_reads_back_the_figures_of_the_document(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    for result, label in zip(document.benchmarks, document.labels, strict=True):
        run = _load(tmp_path / label)
        assert _scalar(run, "latency_us/all/p50") == _flat(_f32(result.latency_all.p50_ns / 1e3))
        assert _scalar(run, "latency_us/all/p99.9") == _flat(_f32(result.latency_all.p999_ns / 1e3))
        for category, summary in result.latency_by_category:
            assert _scalar(run, f"latency_us/{category.value}/p99") == _flat(
                _f32(summary.p99_ns / 1e3)
            )
            assert _scalar(run, f"latency_us/{category.value}/mean") == _flat(
                _f32(summary.mean_ns / 1e3)
            )
        assert _scalar(run, "throughput/bandwidth_mb_per_s") == _flat(
            _f32(result.bandwidth_mb_per_s)
        )
        assert _scalar(run, "throughput/rpcs_per_s") == _flat(_f32(result.rpcs_per_s))
        assert _scalar(run, "rpcs/count") == _flat(result.rpc_count)
        per_run = _scalar(run, "per_run/bandwidth_mb_per_s")
        assert sorted(per_run) == [r.run_index for r in result.runs]
        first = result.runs[0]
        moved = first.request_bytes + first.response_bytes
        assert per_run[0] == _f32(moved / (first.duration_ns / 1e9) / 1e6)


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
    assert _scalar(run, "step_time_ms/mean") == _flat(_f32(result.step_time.mean_ns / 1e6))
    per_step = _scalar(run, "per_step/communication_time_ms")
    assert list(per_step.values()) == [_f32(t / 1e6) for t in result.step_times_ns]
    assert run.SummaryMetadata("histogram/step_time_ms").plugin_data.plugin_name == "histograms"


def test_histograms_count_every_sample_of_each_run(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    result = document.benchmarks[0]
    run = _load(tmp_path / "p2p-latency")
    for tag in ("histogram/message_size_log10_bytes", "histogram/latency_ms"):
        assert run.SummaryMetadata(tag).plugin_data.plugin_name == "histograms"
        events = run.Tensors(tag)
        assert [e.step for e in events] == [r.run_index for r in result.runs]
        for event, measured in zip(events, result.runs, strict=True):
            buckets = tensor_util.make_ndarray(event.tensor_proto)
            assert buckets.shape[1] == 3
            assert buckets[:, 2].sum() == measured.rpc_count
    small = run.Tensors(f"histogram/latency_ms/{SizeCategory.SMALL.value}")
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
        assert start.group_name == f"{tmp_path.name}/{label}"
        assert start.hparams["02 benchmark"].string_value == result.benchmark.value
        assert start.hparams["01 network"].string_value == "loopback"
        assert start.hparams["06 link rate"].string_value == "unlimited"
        assert start.hparams["08 mode"].string_value == result.parameters["mode"]
        assert start.hparams["serialized"].bool_value is False
        # Config values fill in; the benchmark's own parameters win; numbers are text.
        assert start.hparams["command"].string_value == "replay"
        assert start.hparams["runs"].string_value == "3"
        assert start.hparams["09 grpc max_receive_message_length"].string_value == "67108864"
        assert start.hparams["warmup_s"].string_value == "0"
        assert run.SummaryMetadata("summary").plugin_data.plugin_name == "text"
        text = tensor_util.make_ndarray(run.Tensors("summary")[0].tensor_proto).item().decode()
        assert "| class |" in text and f"| {result.runs[-1].run_index} |" in text
    top = _load(tmp_path)
    table = tensor_util.make_ndarray(top.Tensors("results")[0].tensor_proto).item().decode()
    assert all(f"| {label} |" in table for label in document.labels)


def test_the_experiment_lists_comparison_hparams_first_and_the_metrics(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    top = _load(tmp_path)
    content = top.SummaryMetadata(hparams_metadata.EXPERIMENT_TAG).plugin_data.content
    experiment = hparams_metadata.parse_experiment_plugin_data(content)
    names = [info.name for info in experiment.hparam_infos]
    # TensorBoard lists hparams sorted by name: the names carry the order.
    assert sorted(names)[: len(COMPARISON_HPARAMS)] == [n for n, _, _ in COMPARISON_HPARAMS]
    shown = {info.name: info.display_name for info in experiment.hparam_infos}
    assert [shown[n] for n, _, _ in COMPARISON_HPARAMS] == [
        "network", "benchmark", "rpc", "pacing", "compute", "link rate", "trace", "mode"
    ]  # fmt: skip
    grpc = sorted(n for n in names if n.startswith("09 grpc "))
    assert grpc and sorted(names).index(grpc[0]) == len(COMPARISON_HPARAMS)
    metrics = [info.name.tag for info in experiment.metric_infos]
    # The dashboard ticks the first five of each: those a user compares runs by.
    assert metrics[:5] == [
        "throughput/bandwidth_mb_per_s", "throughput/rpcs_per_s", "step_time_ms/p50",
        "prediction/step_ms", "latency_us/all/p50",
    ]  # fmt: skip
    assert {"latency_us/small/p99", "cpu/server_utilization"} <= set(metrics)


def test_writing_a_document_again_replaces_its_event_files(tmp_path: Path) -> None:
    document = _document()
    write_run(document, tmp_path)
    write_run(document, tmp_path)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == 4, files
    assert _scalar(_load(tmp_path / "p2p-latency"), "rpcs/count") == _flat(90)


def test_writing_tensorboard_logs_does_not_import_tensorflow(tmp_path: Path) -> None:
    # tensorflow is installed in the test environment, so only a fresh
    # interpreter can tell whether writing the logs loads it.
    program = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from pathlib import Path
from tests.result_factory import golden_document
from tf_grpc_bench.replay.output.tensorboard import FLAT_STEPS, write_run
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


@pytest.mark.parametrize(
    ("bits_per_s", "shown"),
    [(0, "unlimited"), (-1, "unlimited"), (10**9, "1 Gbit/s"), (2_500_000_000, "2.5 Gbit/s"),
     (999_999_999, "1000 Mbit/s"), (10**6, "1 Mbit/s"), (64_000, "64 kbit/s"), (999, "999 bit/s"),
     (1000, "1 kbit/s"), (1, "1 bit/s")],
)  # fmt: skip
def test_link_rates_read_in_their_largest_whole_unit(bits_per_s: int, shown: str) -> None:
    assert format_rate(bits_per_s) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, True), (False, False), ("x", "x"), (3, "3"), (2.5, "2.5"), (2.0, "2"),
     (1e-7, "1e-07"), (float("inf"), "inf"), (float("nan"), "nan")],
)  # fmt: skip
def test_parameters_show_as_text_and_booleans_stay(value: object, shown: object) -> None:
    assert as_text(value) == shown  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parameters", "shown"),
    [({"pacing": "asap", "compute_scale": 0.0}, "-"), ({"pacing": "dependencies"}, "recorded"),
     ({"pacing": "dependencies", "compute_scale": 1}, "recorded"),
     ({"pacing": "dependencies", "compute_scale": 0}, "none"),
     ({"pacing": "dependencies", "compute_scale": 0.5}, "0.5"),
     ({"pacing": "dependencies", "compute_scale": True}, "True"),
     ({"pacing": "dependencies", "compute_scale": "here"}, "here")],
)  # fmt: skip
def test_the_compute_column_says_whose_compute_the_step_keeps(
    parameters: dict[str, object], shown: str
) -> None:
    assert compute_mode(parameters) == shown  # type: ignore[arg-type]


def test_grpc_settings_and_raw_channel_options_sort_after_the_comparison_columns(
    tmp_path: Path,
) -> None:
    document = _document()
    result = dataclasses.replace(
        document.benchmarks[0],
        parameters={
            **document.benchmarks[0].parameters,
            "grpc_compression": "gzip",
            "grpc.keepalive_time_ms": 1000,
            "grpcx": "kept",
            "trace": "/x.tfgbtrace",
        },
    )
    values = hparam_values(document, result, "p2p-latency")
    assert values["09 grpc compression"] == "gzip"
    assert values["09 grpc keepalive_time_ms"] == "1000"
    assert values["grpcx"] == "kept" and "trace" not in values and "grpc" not in values
    summary = experiment_summary(values)
    content = summary.value[0].metadata.plugin_data.content
    experiment = hparams_metadata.parse_experiment_plugin_data(content)
    infos = {info.name: info for info in experiment.hparam_infos}
    assert infos["09 grpc compression"].display_name == "grpc compression"
    assert infos["grpcx"].display_name == "grpcx"
    assert infos["02 benchmark"].description == "p2p-latency, p2p-bandwidth or ps-throughput"
    assert infos["serialized"].type == api_pb2.DATA_TYPE_BOOL
    assert infos["01 network"].type == api_pb2.DATA_TYPE_STRING
    assert [m.display_name for m in experiment.metric_infos][:4] == [
        "MB/s", "RPCs/s", "step p50 (ms)", "predicted step (ms)",
    ]  # fmt: skip
    # Every metric is a scalar of the session's own run: no group (subdirectory) before its tag.
    assert {m.name.group for m in experiment.metric_infos} == {""}


def test_a_document_that_says_little_still_names_every_comparison_column() -> None:
    """No network, no trace, no rpc, pacing or mode parameters: each column says so."""
    bare = dataclasses.replace(make_results(runs=1, calls=3)[0], parameters={})
    document = build_document([bare], config={}, trace_path=None, created=CREATED)
    values = hparam_values(document, bare, "p2p-latency")
    assert {name: values[name] for name, _, _ in COMPARISON_HPARAMS} == {
        "01 network": "unrecorded", "02 benchmark": "p2p-latency", "03 rpc": "unary",
        "04 pacing": "", "05 compute": "-", "06 link rate": "unrecorded",
        "07 trace": "synthetic", "08 mode": "",
    }  # fmt: skip
    unnamed = TraceInfo(
        path="/traces/odd.tfgbtrace", sha256="1" * 64, model="", strategy="",
        tensorflow_version="", format_version=3, step_count=1,
    )  # fmt: skip
    traced = dataclasses.replace(document, trace=unnamed)
    assert hparam_values(traced, bare, "x")["07 trace"] == "odd.tfgbtrace"
    assert hparam_values(traced, bare, "x")["trace_sha256"] == "111111111111"
    assert values["trace_sha256"] == "" and values["partial"] is False
    # The rpc the calls travelled as; a run stopped early marks its session partial.
    streamed = dataclasses.replace(
        bare,
        parameters={"rpc": "streaming"},
        runs=(dataclasses.replace(bare.runs[0], partial=True),),
    )
    assert not streamed.partial
    streamed_values = hparam_values(document, streamed, "x")
    assert (streamed_values["03 rpc"], streamed_values["partial"]) == ("streaming", True)
    summary = experiment_summary(values)
    assert summary.value[0].tensor == hparams_metadata.NULL_TENSOR
    assert summary.value[0].tag == hparams_metadata.EXPERIMENT_TAG
