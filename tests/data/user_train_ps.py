"""A user's own distributed training script: plain TensorFlow and Keras, nothing else.

Runs as every task of a TF2 ParameterServerStrategy cluster described by
TF_CONFIG, the way TensorFlow's parameter-server tutorial does it: ps and
worker tasks serve until they are stopped; the chief (the coordinator) builds
a small Keras model, trains it for ``--rounds`` rounds (one step per worker
each), and writes the shapes of its trainable variables to ``--variables``.

This file must import nothing from tf-grpc-bench: it stands for a script the
tool did not write.
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
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--variables", default="")
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
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)

    @tf.function
    def train_step():
        def replica_step():
            features = tf.random.uniform((8, 16))
            labels = tf.random.uniform((8,), maxval=10, dtype=tf.int32)
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
    if args.variables:
        with open(args.variables, "w") as stream:
            json.dump(
                [
                    {
                        "shape": [int(d) for d in v.shape],
                        "dtype": v.dtype.name if hasattr(v.dtype, "name") else str(v.dtype),
                    }
                    for v in model.trainable_variables
                ],
                stream,
            )
    print("trained", args.rounds, "rounds on", workers, "workers")


if __name__ == "__main__":
    main()
