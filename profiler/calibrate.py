"""How fast this machine computes one training step of a model: a compute calibration.

    python -m tf_grpc_bench.profiler.calibrate --workload "resnet50 32x32 batch 4 keras"

prints one JSON object: the workload, the median step in nanoseconds, every
measured step, the median of each kind of work timed apart (``parts_ns``:
forward and backward, the SGD apply, the serialization of every gradient into a
TensorProto as the runtime does to send it), the processes' CPU time over them,
the share of the machine's CPU that went to anything else meanwhile
(``others_cpu_share``: other processes, the hypervisor's steal), and the
TensorFlow version.  The step is the whole local training step a worker of the
trace's job computes (synthetic batch, forward, backward, SGD apply) with no
cluster, after warm-up steps that trace and build it.

A workload of several processes (``resnet50 32x32 batch 4 keras, 2 processes at
once``: a job's workers) is timed by that many processes at once, each with
TensorFlow's default threads, sharing the cores as the job's workers do: each
prepares, then all start together; the figures are the medians over them.

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
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from tf_grpc_bench import host, lifetime
from tf_grpc_bench.calibration import PART_NAMES, CalibrationWorkload
from tf_grpc_bench.errors import BenchError
from tf_grpc_bench.models.registry import build_model, import_keras

#: Steps run before measuring (the first traces and builds the step function).
WARMUP_STEPS = 3
#: Steps measured; the median is the calibration.
MEASURED_STEPS = 20


class _Steps:
    """The compiled functions a calibration times, of one model: the whole local step, and
    its kinds of work apart (``calibration.PART_NAMES``)."""

    def __init__(self, tf: Any, keras: Any, workload: CalibrationWorkload) -> None:
        size = workload.input_size
        model = build_model(workload.model, keras_module=keras, input_shape=(size, size, 3))
        classes = int(model.output_shape[-1])
        optimizer = keras.optimizers.SGD(learning_rate=0.01)
        optimizer.build(model.trainable_variables)
        variables = model.trainable_variables

        @tf.function  # type: ignore[untyped-decorator]
        def forward_backward() -> Any:
            images = tf.random.uniform((workload.batch_size, size, size, 3), dtype=tf.float32)
            labels = tf.random.uniform((workload.batch_size,), maxval=classes, dtype=tf.int64)
            with tf.GradientTape() as tape:
                logits = tf.cast(model(images, training=True), tf.float32)
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
                )
            return loss, tape.gradient(loss, variables)

        @tf.function  # type: ignore[untyped-decorator]
        def apply(gradients: Any) -> Any:
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return tf.constant(0)

        @tf.function  # type: ignore[untyped-decorator]
        def serialize(gradients: Any) -> Any:
            # What the runtime does to every tensor it sends: its bytes into a TensorProto.
            return tf.add_n([tf.strings.length(tf.io.serialize_tensor(g)) for g in gradients])

        @tf.function  # type: ignore[untyped-decorator]
        def whole() -> Any:
            loss, gradients = forward_backward()
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return loss

        self.whole = whole
        self.forward_backward = forward_backward
        self.apply = apply
        self.serialize = serialize

    def time_whole(self) -> int:
        start = time.perf_counter_ns()
        self.whole().numpy()
        return time.perf_counter_ns() - start

    def time_parts(self) -> dict[str, int]:
        """One step's kinds of work, each timed to its end."""
        times = {}
        start = time.perf_counter_ns()
        loss, gradients = self.forward_backward()
        loss.numpy()
        times["forward_backward"] = time.perf_counter_ns() - start
        start = time.perf_counter_ns()
        self.apply(gradients).numpy()
        times["apply"] = time.perf_counter_ns() - start
        start = time.perf_counter_ns()
        self.serialize(gradients).numpy()
        times["serialize"] = time.perf_counter_ns() - start
        return times


def prepare(workload: CalibrationWorkload, *, warmup: int = WARMUP_STEPS) -> tuple[Any, _Steps]:
    """TensorFlow and the workload's functions, traced and warmed up."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    steps = _Steps(tf, import_keras(workload.keras), workload)
    for _ in range(warmup):
        steps.time_whole()
        steps.time_parts()
    return tf, steps


def measure(
    workload: CalibrationWorkload,
    *,
    warmup: int = WARMUP_STEPS,
    steps: int = MEASURED_STEPS,
    prepared: tuple[Any, _Steps] | None = None,
) -> dict[str, Any]:
    """Time ``steps`` local training steps of ``workload`` after ``warmup`` ones, then
    ``steps`` more with their kinds of work timed apart, in this process."""
    tf, functions = prepared or prepare(workload, warmup=warmup)
    machine_begin, cpu_begin = host.read_machine_cpu(), time.process_time_ns()
    durations = [functions.time_whole() for _ in range(steps)]
    parts = [functions.time_parts() for _ in range(steps)]
    cpu_ns = time.process_time_ns() - cpu_begin
    others = host.others_cpu_share(machine_begin, host.read_machine_cpu(), cpu_ns)
    return {
        "workload": workload.text,
        "step_ns": int(statistics.median(durations)),
        "steps_ns": durations,
        "parts_ns": {name: int(statistics.median(p[name] for p in parts)) for name in PART_NAMES},
        "cpu_ns": cpu_ns,
        "others_cpu_share": None if others is None else round(others, 4),
        "tensorflow_version": tf.__version__,
    }


def measure_together(
    workload: CalibrationWorkload, *, steps: int = MEASURED_STEPS, timeout_s: float = 900.0
) -> dict[str, Any]:
    """``workload.processes`` processes timing the workload at once, sharing the cores as a
    job's workers do: each prepares, then all start measuring together; the medians over
    the processes of their steps and parts.  Others' share of the CPU leaves out all of
    them."""
    command = [sys.executable, "-m", "tf_grpc_bench.profiler.calibrate", "--workload",
               workload.text, "--steps", str(steps), "--child"]  # fmt: skip
    children = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lifetime.die_with_parent_preexec(),
        )
        for _ in range(workload.processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise BenchError(f"a calibration process of {workload.text} failed to start")
        machine_begin = host.read_machine_cpu()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.close()
            child.stdin = None  # communicate() has nothing more to send
        printed = [
            json.loads(child.communicate(timeout=timeout_s)[0].splitlines()[-1])
            for child in children
        ]
    except (subprocess.TimeoutExpired, ValueError, IndexError) as error:
        raise BenchError(
            f"timing {workload.text} in {workload.processes} processes failed: {error}"
        ) from None
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    cpu_ns = sum(int(one["cpu_ns"]) for one in printed)
    others = host.others_cpu_share(machine_begin, host.read_machine_cpu(), cpu_ns)
    return {
        "workload": workload.text,
        "step_ns": int(statistics.median(int(one["step_ns"]) for one in printed)),
        "steps_ns": [one["step_ns"] for one in printed],
        "parts_ns": {
            name: int(statistics.median(int(one["parts_ns"][name]) for one in printed))
            for name in PART_NAMES
        },
        "cpu_ns": cpu_ns,
        "others_cpu_share": None if others is None else round(others, 4),
        "processes": workload.processes,
        "tensorflow_version": printed[0]["tensorflow_version"],
    }


def _child(workload: CalibrationWorkload, steps: int) -> dict[str, Any]:
    """One of ``measure_together``'s processes: prepare, say so, wait for the start."""
    prepared = prepare(workload)
    print("ready", flush=True)
    sys.stdin.readline()
    return measure(workload, steps=steps, prepared=prepared)


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
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        workload = CalibrationWorkload.parse(args.workload)
        steps = max(1, args.steps)
        if args.child:
            result = _child(workload, steps)
        elif workload.processes > 1:
            result = measure_together(workload, steps=steps)
        else:
            result = measure(workload, steps=steps)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
