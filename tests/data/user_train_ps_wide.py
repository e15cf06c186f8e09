"""A user's parameter-server script whose model is many small variables.

Like ``user_train_ps.py`` (TF2 ParameterServerStrategy, the chief drives
``--rounds`` rounds of one step per worker), but the model is ``--variables``
separate scalar weights, so every step moves that many tensors each way:
many small RecvTensor calls in flight at once, the traffic pattern of a
model with many layers, at a fraction of its bytes and compute.

This file must import nothing from tf-grpc-bench: it stands for a script the
tool did not write.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--variables", type=int, default=400)
    args = parser.parse_args()

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=resolver.task_type,
            task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        )
        # Serve until stopped.  Not server.join(): a process blocked in it never runs a
        # Python SIGTERM handler (the test suite's coverage sets one), so each stop sat out
        # the launcher's grace and ended in SIGKILL (user_train_tf1.py's ps keeps join()).
        while server is not None:
            time.sleep(60)
        return

    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    with strategy.scope():
        weights = [tf.Variable(0.0, name=f"w{i}") for i in range(args.variables)]

    @tf.function
    def train_step():
        def replica_step():
            features = tf.random.uniform((len(weights),))
            with tf.GradientTape() as tape:
                prediction = tf.add_n([w * features[i] for i, w in enumerate(weights)])
                loss = tf.square(prediction - 1.0)
            gradients = tape.gradient(loss, weights)
            for weight, gradient in zip(weights, gradients, strict=True):
                weight.assign_sub(0.01 * gradient)
            return loss

        return strategy.run(replica_step)

    for _ in range(args.rounds):
        for _ in range(workers):
            coordinator.schedule(train_step)
        coordinator.join()
    print("trained", args.rounds, "rounds of", args.variables, "variables on", workers, "workers")


if __name__ == "__main__":
    main()
