"""How fast this machine computes one training step of a model: a compute calibration.

    python -m tf_grpc_bench.profiler.calibrate --workload "resnet50 32x32 batch 4 keras"

prints one JSON object: the workload, the median step in nanoseconds, every
measured step, the process's CPU time over them, the share of the machine's CPU
that went to anything else meanwhile (``others_cpu_share``: other processes,
the hypervisor's steal), and the TensorFlow version.  The step is the whole
local training step a worker of the trace's job computes (synthetic batch,
forward, backward, SGD apply) in one process with no cluster, after warm-up
steps that trace and build it.

A capture runs this before its training (``capture`` records the result in the
trace, ``calibration_workload`` and ``calibration_step_ns``), and a replay on another machine runs
it there (``calibration.measure_here``): the ratio of the two is how much
faster or slower this machine computes that model, and scales the compute the
trace kept.  Only the ratio matters, so both ends measure the same thing the
same way; the absolute figure is not training's compute (training's tasks
share the cores and wait on each other).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from tf_grpc_bench import host
from tf_grpc_bench.calibration import CalibrationWorkload
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.models.registry import build_model, import_keras

#: Steps run before measuring (the first traces and builds the step function).
WARMUP_STEPS = 3
#: Steps measured; the median is the calibration.
MEASURED_STEPS = 20


def _train_step(tf: Any, keras: Any, workload: CalibrationWorkload) -> Any:
    """A compiled local training step of ``workload``'s model (what a worker computes)."""
    size = workload.input_size
    model = build_model(workload.model, keras_module=keras, input_shape=(size, size, 3))
    classes = int(model.output_shape[-1])
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
    optimizer.build(model.trainable_variables)

    @tf.function  # type: ignore[untyped-decorator]
    def step() -> Any:
        images = tf.random.uniform((workload.batch_size, size, size, 3), dtype=tf.float32)
        labels = tf.random.uniform((workload.batch_size,), maxval=classes, dtype=tf.int64)
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    return step


def measure(
    workload: CalibrationWorkload,
    *,
    warmup: int = WARMUP_STEPS,
    steps: int = MEASURED_STEPS,
) -> dict[str, Any]:
    """Time ``steps`` local training steps of ``workload`` after ``warmup`` ones."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    keras = import_keras(workload.keras)
    step = _train_step(tf, keras, workload)
    for _ in range(warmup):
        step().numpy()
    durations = []
    machine_begin, cpu_begin = host.read_machine_cpu(), time.process_time_ns()
    for _ in range(steps):
        start = time.perf_counter_ns()
        step().numpy()
        durations.append(time.perf_counter_ns() - start)
    cpu_ns = time.process_time_ns() - cpu_begin
    others = host.others_cpu_share(machine_begin, host.read_machine_cpu(), cpu_ns)
    return {
        "workload": workload.text,
        "step_ns": int(statistics.median(durations)),
        "steps_ns": durations,
        "cpu_ns": cpu_ns,
        "others_cpu_share": None if others is None else round(others, 4),
        "tensorflow_version": tf.__version__,
    }


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tf_grpc_bench.profiler.calibrate",
        description="Time a local training step of a model on this machine (one JSON line).",
    )
    parser.add_argument(
        "--workload", required=True, help='what to time, e.g. "resnet50 32x32 batch 4 keras"'
    )
    parser.add_argument("--steps", type=int, default=MEASURED_STEPS, help="steps measured")
    args = parser.parse_args(argv)
    try:
        workload = CalibrationWorkload.parse(args.workload)
        result = measure(workload, steps=max(1, args.steps))
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
