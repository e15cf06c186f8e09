"""A parameter-server job that moves tensors as TensorFlow does, without TensorFlow.

Started once per task of the cluster in ``TF_CONFIG`` (a ps and workers), as a
launcher or ``tf-grpc-bench record`` starts a training script.  Every task serves
``/tensorflow.WorkerService/RecvTensor`` over real gRPC.  Each step, a worker pulls
its weights from the ps (RecvTensor requests naming the step id and the rendezvous
key, responses carrying a TensorProto's dtype, shape and content), "computes", and
makes its gradients ready; the ps pulls every gradient back with RecvTensor calls it
issued early, which the worker answers once the gradient exists (TensorFlow's
rendezvous).  With ``--markers``, worker 0 (the driving task, as a chief would be)
writes a step marker per step to ``$TF_GRPC_BENCH_STEP_MARKERS``, the first step
as warm-up.  Tasks exit once the job's last step is done.

Usage: ``tensor_exchange_job.py --steps N [--markers]``
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from concurrent import futures

import grpc

METHOD = "/tensorflow.WorkerService/RecvTensor"
#: Variables per worker-step, and the shape of each (float32).
VARIABLES = ((3, 4), (16,), (8, 8), (2, 5))
COMPUTE_S = 0.02


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _key(source: str, destination: str, edge: str) -> str:
    return (
        f"/job:{source}/replica:0/task:0/device:CPU:0;1;"
        f"/job:{destination}/replica:0/task:0/device:CPU:0;{edge};0:0"
    )


def request(step_id: int, key: str) -> bytes:
    return _field(1, step_id) + _field(2, key.encode())


def response(shape: tuple[int, ...]) -> bytes:
    dims = b"".join(_field(2, _field(1, d)) for d in shape)
    count = 1
    for d in shape:
        count *= d
    return _field(1, _field(1, 1) + _field(2, dims) + _field(4, bytes(4 * count)))


def _read_step_id(data: bytes) -> int:
    """The step id: field 1, a varint, first in our requests."""
    assert data[0] == 0x08
    value = shift = 0
    for byte in data[1:]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value
    raise ValueError("truncated step id")


def step_id(worker: int, step: int) -> int:
    return 1000 * (worker + 1) + step


class Gradients:
    """A worker's gradients, ready per step id; the ps's pulls wait for them."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.ready: set[int] = set()
        self.pulled: dict[int, int] = {}

    def serve(self, data: bytes, shape: tuple[int, ...]) -> bytes:
        wanted = _read_step_id(data)
        with self.condition:
            self.condition.wait_for(lambda: wanted in self.ready, timeout=60)
            self.pulled[wanted] = self.pulled.get(wanted, 0) + 1
            self.condition.notify_all()
        return response(shape)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--markers", action="store_true")
    arguments = parser.parse_args()
    config = json.loads(os.environ["TF_CONFIG"])
    cluster, task = config["cluster"], config["task"]
    job, index = task["type"], int(task["index"])
    port = int(cluster[job][index].rsplit(":", 1)[1])
    gradients = Gradients()

    def handle(data: bytes, context: grpc.ServicerContext) -> bytes:
        edge = data.decode("latin-1")
        number = int(edge.split(";edge_", 1)[1].split("_", 1)[0])
        if job == "worker":
            return gradients.serve(data, VARIABLES[number])
        return response(VARIABLES[number])

    handler = grpc.method_handlers_generic_handler(
        "tensorflow.WorkerService",
        {"RecvTensor": grpc.unary_unary_rpc_method_handler(handle)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        if job == "ps":
            _ps(cluster, arguments.steps)
        else:
            _worker(cluster, index, arguments.steps, gradients, arguments.markers)
        time.sleep(0.3)  # the peers' last answers leave before the server goes
    finally:
        server.stop(grace=1).wait()


def _stub(address: str) -> grpc.UnaryUnaryMultiCallable:
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=60)
    return channel.unary_unary(METHOD)


def _ps(cluster: dict[str, list[str]], steps: int) -> None:
    """Pull every worker's gradients of every step, issued early (they wait)."""

    def pull(worker: int) -> None:
        call = _stub(cluster["worker"][worker])
        for step in range(steps):
            pending = [
                call.future(
                    request(
                        step_id(worker, step),
                        _key("worker", "ps", f"edge_{n}_gradient{n}").replace(
                            "/job:worker/replica:0/task:0", f"/job:worker/replica:0/task:{worker}"
                        ),
                    ),
                    timeout=60,
                )
                for n in range(len(VARIABLES))
            ]
            for future in pending:
                future.result()

    threads = [threading.Thread(target=pull, args=(w,)) for w in range(len(cluster["worker"]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _worker(
    cluster: dict[str, list[str]], index: int, steps: int, gradients: Gradients, markers: bool
) -> None:
    call = _stub(cluster["ps"][0])
    path = os.environ.get("TF_GRPC_BENCH_STEP_MARKERS", "")
    for step in range(steps):
        begin = time.monotonic_ns()
        for n in range(len(VARIABLES)):
            key = _key("ps", "worker", f"edge_{n}_weight{n}").replace(
                "/job:worker/replica:0/task:0", f"/job:worker/replica:0/task:{index}"
            )
            call(request(step_id(index, step), key), timeout=60)
        time.sleep(COMPUTE_S)
        wanted = step_id(index, step)
        with gradients.condition:
            gradients.ready.add(wanted)
            gradients.condition.notify_all()
            gradients.condition.wait_for(
                lambda wanted=wanted: gradients.pulled.get(wanted, 0) == len(VARIABLES),
                timeout=60,
            )
        end = time.monotonic_ns()
        if markers and path and index == 0:
            line = {
                "task": f"worker:{index}",
                "step": step,
                "phase": "steady" if step > 0 else "warmup",
                "start_ns": begin,
                "end_ns": end,
            }
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(json.dumps(line) + "\n")
        time.sleep(0.005)


if __name__ == "__main__":
    main()
