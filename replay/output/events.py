"""TensorBoard event files, written without TensorFlow, in the forms every loader reads.

One ``EventFile`` is one ``events.out.tfevents...`` file of one TensorBoard
run (a directory).  What goes in is what TensorBoard's own summary functions
produce, so both of TensorBoard's loaders read it:

- scalars are float32 tensors with the scalar plugin's metadata, exactly
  ``tensorboard.plugins.scalar.summary_v2.scalar_pb``.  TensorBoard's default
  loader (the Rust ``tensorboard-data-server``, "fast loading") drops scalar
  tensors of any other dtype: float64 scalars show only with
  ``--load_fast=false``;
- histograms are float64 ``[k, 3]`` tensors (left edge, right edge, count)
  with the histogram plugin's metadata (what ``histogram_pb`` writes);
- images are the image plugin's string tensor ``[width, height, png]``;
- text and any other ``Summary`` go in as given.

Nothing here imports TensorFlow: protos, plugin metadata and record framing
come from the ``tensorboard`` package (``EventFileWriter`` is not used: it
goes through ``tensorboard.compat.tf``, which imports TensorFlow whenever it
is installed).
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

#: Buckets per decade in the logarithmic histograms.
BUCKETS_PER_DECADE = 10
#: Buckets of a histogram whose values are already logarithms (or span little).
LINEAR_BUCKETS = 30


class EventFile:
    """One TensorBoard event file, written under a temporary name and renamed on close.

    Not thread-safe.  The final name ``events.out.tfevents.<time>.<host>.<suffix>``
    depends only on ``wall_time_s`` and ``suffix``, so writing the same
    document again replaces its event files instead of adding duplicates.
    Raises ``OSError`` when the directory cannot be written.
    """

    def __init__(self, directory: Path, wall_time_s: float, suffix: str = "tf-grpc-bench") -> None:
        self._wall_time_s = wall_time_s
        self._final = directory / (
            f"events.out.tfevents.{int(wall_time_s):010d}.{socket.gethostname()}.{suffix}"
        )
        directory.mkdir(parents=True, exist_ok=True)
        # The temporary name lacks "tfevents", so a running TensorBoard ignores it.
        descriptor, self._temporary = tempfile.mkstemp(dir=directory, prefix=".tb-", suffix=".tmp")
        self._records = RecordWriter(os.fdopen(descriptor, "wb"))
        self._write(event_pb2.Event(wall_time=wall_time_s, file_version="brain.Event:2"))

    def __enter__(self) -> EventFile:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()

    def _write(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def add(self, summary: summary_pb2.Summary, step: int = 0) -> None:
        self._write(event_pb2.Event(wall_time=self._wall_time_s, step=step, summary=summary))

    def scalar(self, tag: str, value: float, step: int = 0, description: str = "") -> None:
        """A float32 scalar; NaN (a figure that does not apply) is left out."""
        if math.isnan(value):
            return
        self.add(scalar_summary.scalar_pb(tag, float(value), description or None), step)

    def histogram(
        self,
        tag: str,
        values: Sequence[float],
        step: int = 0,
        *,
        log: bool = True,
        description: str = "",
    ) -> None:
        """Buckets of ``values`` (``log_buckets`` or, with ``log=False``, equal widths)."""
        if len(values) == 0:
            return
        array = np.asarray(values, dtype=np.float64)
        buckets = log_buckets(array) if log else linear_buckets(array)
        summary = summary_pb2.Summary()
        summary.value.add(
            tag=tag,
            metadata=histogram_metadata.create_summary_metadata(
                display_name=tag, description=description
            ),
            tensor=tensor_util.make_tensor_proto(buckets, dtype=np.float64),
        )
        self.add(summary, step)

    def image(
        self, tag: str, png: bytes, width: int, height: int, step: int = 0, description: str = ""
    ) -> None:
        """One PNG image (the image plugin's ``[width, height, png]`` string tensor)."""
        summary = summary_pb2.Summary()
        summary.value.add(
            tag=tag,
            metadata=image_metadata.create_summary_metadata(
                display_name=tag, description=description, converted_to_tensor=True
            ),
            tensor=tensor_util.make_tensor_proto(
                [str(width).encode(), str(height).encode(), png], dtype=np.object_
            ),
        )
        self.add(summary, step)

    def close(self) -> None:
        self._records.close()
        os.replace(self._temporary, self._final)

    def discard(self) -> None:
        self._records.close()
        Path(self._temporary).unlink(missing_ok=True)


def log_buckets(values: np.ndarray) -> np.ndarray:
    """Histogram buckets as TensorBoard's histogram plugin stores them: rows of
    (left edge, right edge, count), edges spaced ``BUCKETS_PER_DECADE`` per
    decade between the smallest and largest value.  Zeros and negatives go in
    a first bucket [min, min]."""
    positive = values[values > 0]
    rows: list[tuple[float, float, float]] = []
    non_positive = values.size - positive.size
    if non_positive:
        low = float(values.min())
        rows.append((low, low, float(non_positive)))
    if positive.size:
        low, high = float(positive.min()), float(positive.max())
        if low == high:
            rows.append((low, high, float(positive.size)))
        else:
            decades = math.log10(high) - math.log10(low)
            count = max(1, math.ceil(decades * BUCKETS_PER_DECADE))
            edges = np.logspace(math.log10(low), math.log10(high), count + 1)
            edges[0], edges[-1] = low, high
            counts, _ = np.histogram(positive, bins=edges)
            rows += [(float(edges[i]), float(edges[i + 1]), float(counts[i])) for i in range(count)]
    return np.asarray(rows, dtype=np.float64).reshape(-1, 3)


def linear_buckets(values: np.ndarray) -> np.ndarray:
    """``LINEAR_BUCKETS`` equal-width buckets from the smallest to the largest value."""
    low, high = float(values.min()), float(values.max())
    if low == high:
        return np.asarray([[low, high, float(values.size)]], dtype=np.float64)
    counts, edges = np.histogram(values, bins=LINEAR_BUCKETS, range=(low, high))
    return np.column_stack([edges[:-1], edges[1:], counts.astype(np.float64)])
