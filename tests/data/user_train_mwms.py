"""A user's own MultiWorkerMirroredStrategy script: plain TensorFlow and Keras.

Runs as every worker of a cluster described by TF_CONFIG, as TensorFlow's
multi-worker tutorial does: each worker builds the same small Keras model and
trains it for ``--steps`` synchronous steps, gradients all-reduced with
collectives (RecvBuf).  It writes no step markers.

This file must import nothing from tf-grpc-bench: it stands for a script the
tool did not write.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(256, activation="relu"),
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

    for _ in range(args.steps):
        train_step()


if __name__ == "__main__":
    main()
