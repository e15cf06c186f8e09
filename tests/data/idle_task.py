"""A stand-in for a training task of ``capture-job``: it listens on its cluster address
and waits, doing nothing (tests of signals and orphans need processes, not training).

With ``IDLE_TASK_NOISE=N`` it first writes N lines of TensorFlow-like start-up logging
to stderr; with ``IDLE_TASK_DIE=SIGNAL`` it then kills itself with that signal.
Imports nothing from tf_grpc_bench.
"""

import json
import os
import signal
import socket
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
address = config["cluster"][task["type"]][task["index"]]
listener = socket.create_server(("127.0.0.1", int(address.rpartition(":")[2])))
for number in range(int(os.environ.get("IDLE_TASK_NOISE", "0"))):
    sys.stderr.write(
        f"2026-12-01 03:12:45.{number:06d}: I tensorflow/core/platform/cpu_feature_guard.cc:210] "
        "This TensorFlow binary is optimized to use available CPU instructions in "
        "performance-critical operations.\n"
    )
    sys.stderr.write(
        f"I0000 00:00:1764559000.{number:06d} 4242 grpc_server_lib.cc:467] Started server with "
        "target: grpc://localhost:1234\n"
    )
sys.stderr.flush()
if os.environ.get("IDLE_TASK_DIE"):
    os.kill(os.getpid(), getattr(signal, os.environ["IDLE_TASK_DIE"]))
time.sleep(600)
