"""A plain TF2 ParameterServerStrategy script that takes its role as flags, not TF_CONFIG.

``--job ps --task 0 --cluster '{"ps": [...], ...}'``, as many users' scripts do:
ps and worker tasks start a server and serve until stopped; the chief
coordinates ``--rounds`` rounds of one step per worker.  It never reads
TF_CONFIG.  This file must import nothing from tf-grpc-bench: it stands for a
script the tool did not write.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--task", type=int, required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = tf.train.ClusterSpec(json.loads(args.cluster))

    if args.job in ("ps", "worker"):
        server = tf.distribute.Server(
            spec, job_name=args.job, task_index=args.task, protocol="grpc", start=True
        )
        # Serve until stopped.  Not server.join(): a process blocked in it never runs a
        # Python SIGTERM handler (the test suite's coverage sets one), so each stop sat out
        # the launcher's grace and ended in SIGKILL (user_train_tf1.py's ps keeps join()).
        while server is not None:
            time.sleep(60)
        return

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=args.job, task_id=args.task, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers = len(spec.as_dict()["worker"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32), keras.layers.Dense(4)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)

    @tf.function
    def train_step():
        def replica_step():
            features = tf.random.uniform((4, 8))
            labels = tf.random.uniform((4,), maxval=4, dtype=tf.int32)
            with tf.GradientTape() as tape:
                logits = model(features, training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
                )
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        return strategy.run(replica_step)

    for _ in range(args.rounds):
        for _ in range(workers):
            coordinator.schedule(train_step)
        coordinator.join()
    print("trained", args.rounds, "rounds on", workers, "workers")


if __name__ == "__main__":
    main()
