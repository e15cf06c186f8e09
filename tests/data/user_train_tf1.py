"""A user's own TF1 graph-mode parameter-server script: plain TensorFlow and tf_keras.

Runs as every task of a cluster described by TF_CONFIG, the way TensorFlow 1's
distributed guide does it: ps tasks serve until they are stopped; every
worker builds the model with ``replica_device_setter`` (variables on the ps
tasks), and trains it with ``MonitoredTrainingSession`` until the global step
reaches ``--steps`` (worker 0 is the chief: it initialises the variables, the
others wait for it), or, with ``--local-steps N``, for N runs of its own.
Asynchronous by default; ``--sync`` aggregates one gradient of every worker per
update with ``SyncReplicasOptimizer``.

``--model small`` (default) is a small dense network with batch
normalisation (its moving statistics are state that is not trainable);
``--model resnet50`` is tf_keras' ResNet-50.  ``--report DIR`` makes each
worker write how many training runs it made and the model's variables.

This file must import nothing from tf-grpc-bench: it stands for a script the
tool did not write.  It writes no step markers.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
import tf_keras


def build_model(name: str, input_size: int) -> tf_keras.Model:
    if name == "resnet50":
        return tf_keras.applications.ResNet50(
            weights=None, input_shape=(input_size, input_size, 3), classes=10
        )
    return tf_keras.Sequential(
        [
            tf_keras.Input((input_size,)),
            tf_keras.layers.Dense(128),
            tf_keras.layers.BatchNormalization(),
            tf_keras.layers.ReLU(),
            tf_keras.layers.Dense(10),
        ]
    )


def shorten_recovery_wait(seconds: float) -> None:
    """A non-chief worker checks every 30 s whether the chief has initialised the
    variables (SessionManager's default); a short run wants quicker checks."""
    original = tf.compat.v1.train.SessionManager.__init__

    def init(self, *args, **kwargs):
        kwargs.setdefault("recovery_wait_secs", seconds)
        original(self, *args, **kwargs)

    tf.compat.v1.train.SessionManager.__init__ = init


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8, help="global steps to train")
    parser.add_argument("--local-steps", type=int, default=0, help="training runs per worker")
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--model", choices=("small", "resnet50"), default="small")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--input-size", type=int, default=0)
    parser.add_argument("--report", default="")
    args = parser.parse_args()

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    server = tf.distribute.Server(
        cluster, job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc"
    )
    if resolver.task_type == "ps":
        server.join()
        return

    tf.compat.v1.disable_eager_execution()
    shorten_recovery_wait(1.0)
    index = resolver.task_id
    workers = cluster.num_tasks("worker")
    is_chief = index == 0
    input_size = args.input_size or (32 if args.model == "resnet50" else 16)
    setter = tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{index}", cluster=cluster
    )
    hooks = [] if args.local_steps else [tf.compat.v1.train.StopAtStepHook(last_step=args.steps)]
    with tf.compat.v1.device(setter):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        model = build_model(args.model, input_size)
        shape = (args.batch_size, *model.input_shape[1:])
        features = tf.random.uniform(shape)
        labels = tf.random.uniform((args.batch_size,), maxval=10, dtype=tf.int32)
        logits = model(features, training=True)
        loss = tf.reduce_mean(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01)
        if args.sync:
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=workers, total_num_replicas=workers
            )
            hooks.append(optimizer.make_session_run_hook(is_chief))
        with tf.control_dependencies(model.get_updates_for(features)):
            train_op = optimizer.minimize(
                loss, global_step=global_step, var_list=model.trainable_variables
            )

    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"])
    runs = 0
    # With --sync the chief's queue runner still waits for gradients when the
    # training ends; the session gives it 120 s to stop unless told otherwise.
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=is_chief, hooks=hooks, config=config,
        save_checkpoint_secs=None, save_summaries_steps=None, log_step_count_steps=None,
        stop_grace_period_secs=5,
    ) as session:  # fmt: skip
        while not session.should_stop() and not (args.local_steps and runs >= args.local_steps):
            session.run(train_op)
            runs += 1

    if args.report:
        with open(os.path.join(args.report, f"worker-{index}.json"), "w") as stream:
            json.dump(
                {
                    "train_runs": runs,
                    "variables": [
                        {
                            "shape": [int(d) for d in v.shape],
                            "dtype": v.dtype.base_dtype.name,
                            "trainable": v.trainable,
                        }
                        for v in model.variables
                    ],
                },
                stream,
            )
    print("worker", index, "made", runs, "training runs")


if __name__ == "__main__":
    main()
