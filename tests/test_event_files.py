"""One TensorBoard event file (``replay/output/events.py``) as its bytes say: the records
are read here with the TFRecord framing written out by hand (length, its CRC, the data,
its CRC) and parsed with TensorBoard's own protos, and every histogram bucket is worked out
from the values, not with the code under test."""

from __future__ import annotations

import math
import socket
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.util import tensor_util

from tf_grpc_bench.replay.output.events import EventFile, linear_buckets, log_buckets


def _masked_crc(data: bytes) -> int:
    """The CRC-32C of ``data``, masked as TFRecord masks it, worked out bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _events(path: Path) -> list[event_pb2.Event]:
    data = path.read_bytes()
    events, position = [], 0
    while position < len(data):
        header = data[position : position + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[position + 8 : position + 12])
        assert header_crc == _masked_crc(header)
        body = data[position + 12 : position + 12 + length]
        (body_crc,) = struct.unpack("<I", data[position + 12 + length : position + 16 + length])
        assert body_crc == _masked_crc(body)
        events.append(event_pb2.Event.FromString(body))
        position += 16 + length
    return events


def _only_file(directory: Path) -> Path:
    (path,) = directory.iterdir()
    return path


def test_an_event_file_is_named_by_its_whole_second_host_and_suffix(tmp_path: Path) -> None:
    run = tmp_path / "new" / "run"
    with EventFile(run, 12.75, suffix="label") as events:
        # While it is written, its name lacks "tfevents", so TensorBoard ignores it.
        (open_path,) = run.iterdir()
        assert open_path.name.startswith(".tb-") and open_path.name.endswith(".tmp")
        events.scalar("a", 1.0)
    path = _only_file(run)
    assert path.name == f"events.out.tfevents.0000000012.{socket.gethostname()}.label"
    with EventFile(tmp_path / "default", 3.0):
        pass
    assert _only_file(tmp_path / "default").name == (
        f"events.out.tfevents.0000000003.{socket.gethostname()}.tf-grpc-bench"
    )


def test_the_first_record_is_the_file_version_at_the_wall_time(tmp_path: Path) -> None:
    with EventFile(tmp_path, 1_700_000_000.5):
        pass
    (first,) = _events(_only_file(tmp_path))
    assert first.file_version == "brain.Event:2"
    assert first.wall_time == 1_700_000_000.5
    assert first.step == 0


def test_a_file_left_by_an_error_is_removed_and_never_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), EventFile(tmp_path, 5.0) as events:
        events.scalar("a", 1.0)
        raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
    events = EventFile(tmp_path, 6.0)
    events.discard()
    assert list(tmp_path.iterdir()) == []


def test_scalars_are_float32_tensors_at_their_step_with_their_description(
    tmp_path: Path,
) -> None:
    with EventFile(tmp_path, 100.0) as events:
        events.scalar("rate/mb_per_s", 2.5, step=7, description="what it is")
        events.scalar("no/figure", math.nan, step=8)
        events.scalar("plain", -3.0)
    _, first, second = _events(_only_file(tmp_path))
    assert (first.wall_time, first.step) == (100.0, 7)
    (value,) = first.summary.value
    assert value.tag == "rate/mb_per_s"
    assert value.metadata.plugin_data.plugin_name == "scalars"
    assert value.metadata.summary_description == "what it is"
    assert value.tensor.dtype == 1  # DT_FLOAT: the fast loader drops other dtypes
    assert tensor_util.make_ndarray(value.tensor).item() == 2.5
    assert (second.step, second.summary.value[0].tag) == (0, "plain")
    assert second.summary.value[0].metadata.summary_description == ""
    assert tensor_util.make_ndarray(second.summary.value[0].tensor).item() == -3.0


def test_a_histogram_holds_its_buckets_as_float64_rows(tmp_path: Path) -> None:
    with EventFile(tmp_path, 1.0) as events:
        events.histogram("h/log", [1.0, 3.0, 50.0, 100.0], step=4, description="log")
        events.histogram("h/none", [], step=5)
        events.histogram("h/one", [7.0], step=5)
        events.histogram("h/linear", [0.0, 1.5, 3.0, 30.0], step=6, log=False)
    _, logarithmic, one, linear = _events(_only_file(tmp_path))
    assert (one.step, one.summary.value[0].tag) == (5, "h/one")
    assert tensor_util.make_ndarray(one.summary.value[0].tensor).tolist() == [[7.0, 7.0, 1.0]]
    (value,) = logarithmic.summary.value
    assert (logarithmic.step, value.tag) == (4, "h/log")
    assert value.metadata.plugin_data.plugin_name == "histograms"
    assert value.metadata.display_name == "h/log"
    assert value.metadata.summary_description == "log"
    assert value.tensor.dtype == 2  # DT_DOUBLE
    rows = tensor_util.make_ndarray(value.tensor)
    assert rows.shape == (20, 3)
    assert rows[:, 2].tolist() == _counts({0: 1, 4: 1, 16: 1, 19: 1}, 20)
    (value,) = linear.summary.value
    assert (linear.step, value.tag) == (6, "h/linear")
    assert tensor_util.make_ndarray(value.tensor)[:, 2].tolist() == _counts(
        {0: 1, 1: 1, 3: 1, 29: 1}, 30
    )


def test_an_image_is_width_height_and_png(tmp_path: Path) -> None:
    with EventFile(tmp_path, 1.0) as events:
        events.image("plots/x", b"\x89PNG...", 640, 480, step=2, description="chart")
    _, event = _events(_only_file(tmp_path))
    (value,) = event.summary.value
    assert (event.step, value.tag) == (2, "plots/x")
    assert value.metadata.plugin_data.plugin_name == "images"
    assert value.metadata.display_name == "plots/x"
    assert value.metadata.summary_description == "chart"
    content = image_metadata.parse_plugin_metadata(value.metadata.plugin_data.content)
    assert content.converted_to_tensor
    assert list(value.tensor.string_val) == [b"640", b"480", b"\x89PNG..."]


def _counts(filled: dict[int, int], buckets: int) -> list[float]:
    return [float(filled.get(index, 0)) for index in range(buckets)]


def test_log_buckets_are_ten_a_decade_from_the_smallest_to_the_largest_value() -> None:
    # 1 to 100: two decades, 20 buckets with edges 10 ** (k / 10); 3 is in bucket
    # floor(10 * log10(3)) = 4, 50 in floor(16.99) = 16, 100 in the last (its edge closes it).
    rows = log_buckets(np.array([100.0, 3.0, 1.0, 50.0]))
    assert rows.shape == (20, 3)
    assert rows[0, 0] == 1.0 and rows[-1, 1] == 100.0
    for k in range(20):
        assert rows[k, 0] == pytest.approx(10 ** (k / 10), rel=1e-12)
        assert rows[k, 1] == pytest.approx(10 ** ((k + 1) / 10), rel=1e-12)
    assert rows[:, 2].tolist() == _counts({0: 1, 4: 1, 16: 1, 19: 1}, 20)
    # 0.3 and 7.7 are not exactly powers of ten's logarithms apart: the outer edges are the
    # values themselves, so neither falls outside (1.41 decades: 15 buckets).
    rows = log_buckets(np.array([7.7, 0.3]))
    assert (rows[0, 0], rows[-1, 1]) == (0.3, 7.7)
    assert rows[:, 2].tolist() == _counts({0: 1, 14: 1}, 15)


def test_zeros_and_negatives_go_in_a_first_bucket_at_the_smallest_value() -> None:
    rows = log_buckets(np.array([0.0, -2.0, 0.0, 10.0, 1000.0]))
    assert rows[0].tolist() == [-2.0, -2.0, 3.0]
    assert rows.shape == (1 + 20, 3)
    assert (rows[1, 0], rows[-1, 1]) == (10.0, 1000.0)
    assert rows[1:, 2].tolist() == _counts({0: 1, 19: 1}, 20)
    assert log_buckets(np.array([0.0, 0.0])).tolist() == [[0.0, 0.0, 2.0]]


def test_equal_values_make_one_bucket_and_a_narrow_span_at_least_one() -> None:
    assert log_buckets(np.array([5.0, 5.0, 5.0])).tolist() == [[5.0, 5.0, 3.0]]
    # 100 to 101 is 0.0043 of a decade: ceil(0.043) = 1 bucket.
    assert log_buckets(np.array([100.0, 101.0])).tolist() == [[100.0, 101.0, 2.0]]
    # 1 to 1.3 is 0.114 of a decade: ceil(1.14) = 2 buckets, split at 10 ** 0.057.
    rows = log_buckets(np.array([1.0, 1.1, 1.3]))
    assert rows[:, 2].tolist() == [2.0, 1.0]  # 1.1 is below 1.14
    assert rows[0, 1] == pytest.approx(1.3**0.5, rel=1e-12)
    assert log_buckets(np.array([], dtype=np.float64)).shape == (0, 3)


def test_linear_buckets_are_thirty_equal_widths_from_the_smallest_to_the_largest() -> None:
    rows = linear_buckets(np.array([30.0, 0.0, 1.5, 3.0]))
    assert rows.shape == (30, 3)
    assert rows[:, 0].tolist() == pytest.approx(list(range(30)))
    assert rows[:, 1].tolist() == pytest.approx(list(range(1, 31)))
    assert rows[:, 2].tolist() == _counts({0: 1, 1: 1, 3: 1, 29: 1}, 30)
    assert linear_buckets(np.array([2.0, 2.0])).tolist() == [[2.0, 2.0, 2.0]]


def test_a_summary_histogram_or_image_given_no_step_is_at_step_0_without_a_description(
    tmp_path: Path,
) -> None:
    summary = summary_pb2.Summary()
    summary.value.add(tag="t", simple_value=1.0)
    with EventFile(tmp_path, 1.0) as events:
        events.add(summary)
        events.histogram("h", [1.0, 2.0])
        events.image("i", b"png", 1, 2)
    _, added, histogram, image = _events(_only_file(tmp_path))
    assert (added.step, added.wall_time, added.summary) == (0, 1.0, summary)
    for event in (histogram, image):
        assert event.step == 0
        assert event.summary.value[0].metadata.summary_description == ""
