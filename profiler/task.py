"""One task of a training job, in its own process.

    python -m tf_grpc_bench.profiler.task --plan WORKDIR/plan.json --job worker --index 0

Started by ``launch.job.TrainingJob``; reads the job plan, starts this task's gRPC
server on its bind port with every peer at its advertised address, then serves
(ps and TF2 workers, until stopped) or drives training steps (the tf2-ps chief,
tf1-ps and mwms workers), appending a step marker per step.

Flags are absl's (``--helpfull``); the task logs through ``absl.logging``
(``logs``: ``TF_CPP_MIN_LOG_LEVEL`` sets the verbosity unless ``-v`` is
given).  On failure the last line on stderr starts with ``launch.job.FAILURE_PREFIX``.  A
task that finished its steps leaves with ``os._exit`` after flushing its files:
TensorFlow's teardown can block on peers that the launcher is about to stop.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from absl import app, flags, logging

from tf_grpc_bench.models.registry import build_model, import_keras, variable_infos
from tf_grpc_bench.profiler import logs
from tf_grpc_bench.profiler.launch.config import TrainingConfig
from tf_grpc_bench.profiler.launch.job import FAILURE_PREFIX
from tf_grpc_bench.profiler.launch.markers import MarkerFile
from tf_grpc_bench.profiler.launch.plan import PLAN_VERSION, JobPlan, TaskSpec

_PLAN = flags.DEFINE_string("plan", None, "the job's plan.json", required=True)
_JOB = flags.DEFINE_enum("job", None, ["chief", "ps", "worker"], "this task's job", required=True)
_INDEX = flags.DEFINE_integer(
    "index", None, "this task's index in its job", lower_bound=0, required=True
)
flags.register_validator(  # type: ignore[no-untyped-call]
    _PLAN, lambda path: Path(path).is_file(), "--plan must name an existing file"
)

#: Objects that must outlive a driving task's training loop, because the task
#: then idles while peers may still need it (servers, sessions, strategies).
_KEEP_ALIVE: list[Any] = []

#: How long a non-chief tf1-ps worker sleeps between checks that the chief has
#: initialised the variables (TensorFlow's default, 30 s, outlasts short runs).
TF1_RECOVERY_WAIT_S = 0.5


def _write_json_atomically(path: Path, data: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def _write_job_info(plan: JobPlan, me: TaskSpec, model: Any, tf: ModuleType, keras: Any) -> None:
    config = plan.config
    variables = variable_infos(model)
    trainable = [v for v in variables if v.trainable]
    info = {
        "version": PLAN_VERSION,
        "model": config.model,
        "setup": config.setup,
        "strategy": config.strategy,
        "synchronous": config.synchronous,
        "tensorflow_version": tf.__version__,
        "keras_flavour": config.keras,
        "keras_version": getattr(keras, "__version__", ""),
        "input_shape": list(config.input_shape),
        "batch_size": config.batch_size,
        "classes": config.class_count,
        "optimizer": "SGD",
        "learning_rate": config.learning_rate,
        "seed": config.seed,
        "ps": config.ps,
        "workers": config.workers,
        "warmup_steps": config.warmup_steps,
        "steps": config.steps,
        "trainable_parameters": sum(v.size_bytes // _itemsize(v.dtype) for v in trainable),
        "trainable_bytes": sum(v.size_bytes for v in trainable),
        "total_parameters": sum(v.size_bytes // _itemsize(v.dtype) for v in variables),
        "variables": [v.as_json() for v in variables],
        "tasks": [t.as_json() for t in plan.tasks],
        "driving_tasks": [f"{job}:{index}" for job, index in config.driving_tasks],
        "written_by": me.name,
    }
    _write_json_atomically(plan.job_info_path, info)
    logging.info(
        "task %s built %s: %d trainable parameters",
        me.name,
        config.model,
        info["trainable_parameters"],
    )


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}.get(dtype, 4)


def _finish(plan: JobPlan, me: TaskSpec, markers_written: int) -> None:
    _write_json_atomically(
        plan.finished_path(me.job, me.index),
        {"task": me.name, "markers": markers_written, "end_ns": time.monotonic_ns()},
    )


def _server_def(tf: ModuleType, plan: JobPlan, me: TaskSpec, session_config: Any = None) -> Any:
    """This task's ServerDef: the advertised cluster, but listening on the bind port."""
    server_def = tf.train.ServerDef(
        cluster=tf.train.ClusterSpec(plan.cluster).as_cluster_def(),
        job_name=me.job,
        task_index=me.index,
        protocol="grpc",
        port=me.bind_port,
    )
    if session_config is not None:
        server_def.default_session_config.CopyFrom(session_config)
    return server_def


def _serve(tf: ModuleType, plan: JobPlan, me: TaskSpec) -> None:
    """A ps task, or a TF2 worker: run the gRPC server until stopped."""
    server = tf.distribute.Server(_server_def(tf, plan, me), start=True)
    logging.info("task %s serves on port %d until stopped", me.name, me.bind_port)
    # Not server.join(): a process blocked in it never runs a signal's Python handler, so a
    # SIGTERM that has one (coverage's, which saves a measured task's data) was sat out for
    # the launcher's whole grace and ended in SIGKILL.  The server, held here, serves on
    # its own threads meanwhile.
    while server is not None:
        time.sleep(60)


def _synthetic_batch(tf: ModuleType, config: TrainingConfig) -> tuple[Any, Any]:
    """Random images and labels of the configured shape, made on the current device."""
    batch = config.batch_size
    images = tf.random.uniform((batch, *config.input_shape), dtype=tf.float32)
    labels = tf.random.uniform((batch,), maxval=config.class_count, dtype=tf.int64)
    return images, labels


def _loss(tf: ModuleType, model: Any, images: Any, labels: Any, global_batch: int) -> Any:
    """Mean cross-entropy of the model on one batch, over ``global_batch`` examples."""
    logits = tf.cast(model(images, training=True), tf.float32)
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)


def _model_and_optimizer(config: TrainingConfig, keras: Any) -> tuple[Any, Any]:
    """Built in the caller's strategy scope, the optimizer's variables too (not lazily)."""
    model = build_model(
        config.model, keras_module=keras, input_shape=config.input_shape, classes=config.class_count
    )
    optimizer = keras.optimizers.SGD(learning_rate=config.learning_rate)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _tf2_train_step(
    tf: ModuleType,
    strategy: Any,
    model: Any,
    optimizer: Any,
    config: TrainingConfig,
    global_batch: int,
) -> Any:
    @tf.function  # type: ignore[untyped-decorator]
    def train_step() -> Any:
        def replica_step() -> Any:
            with tf.GradientTape() as tape:
                images, labels = _synthetic_batch(tf, config)
                loss = _loss(tf, model, images, labels, global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(replica_step)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


def _bind_coordinator_port(port: int) -> None:
    """Make this process's eager server (the coordinator's) listen on ``port``.

    ``ParameterServerStrategy`` builds the coordinator's ServerDef itself and
    leaves ``port`` unset, so the server would listen on the coordinator's
    advertised address, which is the proxy's when capturing.  TensorFlow 2.21
    offers no public way to set it: wrap the eager context's two entry points.
    """
    from tensorflow.python.eager import context as eager_context

    context = eager_context.context()
    for name in ("set_server_def", "update_server_def"):
        original = getattr(context, name)

        def with_port(server_def: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            server_def = copy.deepcopy(server_def)
            server_def.port = port
            return _original(server_def, *args, **kwargs)

        setattr(context, name, with_port)


def _run_tf2_chief(plan: JobPlan, me: TaskSpec) -> int:
    import tensorflow as tf

    config = plan.config
    keras = import_keras(config.keras)
    keras.utils.set_random_seed(config.seed)
    if me.advertised_address.rpartition(":")[2] != str(me.bind_port):
        # Only behind a recording proxy does the chief bind elsewhere than it
        # is advertised: leave TensorFlow's private API alone otherwise.
        _bind_coordinator_port(me.bind_port)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(plan.cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    _KEEP_ALIVE.append(coordinator)
    with strategy.scope():
        model, optimizer = _model_and_optimizer(config, keras)
    _write_job_info(plan, me, model, tf, keras)
    train_step = _tf2_train_step(tf, strategy, model, optimizer, config, config.batch_size)
    markers = MarkerFile(plan.markers_path, me.name)

    def one_round(step: int, phase: str) -> None:
        start_ns = time.monotonic_ns()
        for _ in range(config.workers):
            coordinator.schedule(train_step)
        coordinator.join()
        markers.write(step=step, phase=phase, start_ns=start_ns, end_ns=time.monotonic_ns())

    step = 0
    for _ in range(config.warmup_steps):
        one_round(step, "warmup")
        step += 1
    if config.synchronous:
        for _ in range(config.steps):
            one_round(step, "steady")
            step += 1
        return step
    return step + _run_tf2_asynchronous(coordinator, train_step, markers, config, first_step=step)


def _run_tf2_asynchronous(
    coordinator: Any,
    train_step: Any,
    markers: MarkerFile,
    config: TrainingConfig,
    *,
    first_step: int,
) -> int:
    """Keep one step per worker in flight; mark each from scheduling to its result."""
    slots = threading.Semaphore(config.workers)
    errors: list[BaseException] = []

    def await_result(step: int, result: Any, start_ns: int) -> None:
        try:
            result.fetch()
            markers.write(step=step, phase="steady", start_ns=start_ns, end_ns=time.monotonic_ns())
        except BaseException as error:
            errors.append(error)
        finally:
            slots.release()

    waiters = []
    total = config.steps * config.workers
    for step in range(first_step, first_step + total):
        slots.acquire()
        if errors:
            raise errors[0]
        start_ns = time.monotonic_ns()
        result = coordinator.schedule(train_step)
        waiter = threading.Thread(
            target=await_result, args=(step, result, start_ns), name=f"step-{step}", daemon=True
        )
        waiter.start()
        waiters.append(waiter)
    for waiter in waiters:
        waiter.join()
    if errors:
        raise errors[0]
    return total


def _run_mwms_worker(plan: JobPlan, me: TaskSpec) -> int:
    import tensorflow as tf

    config = plan.config
    keras = import_keras(config.keras)
    keras.utils.set_random_seed(config.seed)

    class BoundClusterResolver(tf.distribute.cluster_resolver.SimpleClusterResolver):  # type: ignore[misc]
        """MultiWorkerMirroredStrategy binds its server to a resolver's ``port``."""

        def __init__(self, *args: Any, port: int, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.port = port

    resolver = BoundClusterResolver(
        tf.train.ClusterSpec(plan.cluster),
        task_type="worker",
        task_id=me.index,
        rpc_layer="grpc",
        port=me.bind_port,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    _KEEP_ALIVE.append(strategy)
    with strategy.scope():
        model, optimizer = _model_and_optimizer(config, keras)
    if me.index == 0:
        _write_job_info(plan, me, model, tf, keras)
    train_step = _tf2_train_step(
        tf, strategy, model, optimizer, config, config.batch_size * config.workers
    )
    markers = MarkerFile(plan.markers_path, me.name)
    total = config.warmup_steps + config.steps
    for step in range(total):
        start_ns = time.monotonic_ns()
        float(train_step())  # blocks until the step, all-reduce included, is done
        phase = "warmup" if step < config.warmup_steps else "steady"
        markers.write(step=step, phase=phase, start_ns=start_ns, end_ns=time.monotonic_ns())
    return total


class _QuickSessionCreator:
    """A MonitoredSession session creator whose non-chief workers poll every
    ``TF1_RECOVERY_WAIT_S`` (not 30 s) for the chief to initialise the variables."""

    def __init__(
        self,
        tf: ModuleType,
        *,
        master: str,
        is_chief: bool,
        config: Any,
        max_wait_s: float,
    ) -> None:
        self._tf = tf
        self._master = master
        self._is_chief = is_chief
        self._config = config
        self._max_wait_s = max_wait_s
        self._scaffold = tf.compat.v1.train.Scaffold()

    def create_session(self) -> Any:
        tf, scaffold = self._tf, self._scaffold
        scaffold.finalize()
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=scaffold.local_init_op,
            local_init_feed_dict=scaffold.local_init_feed_dict,
            ready_op=scaffold.ready_op,
            ready_for_local_init_op=scaffold.ready_for_local_init_op,
            graph=tf.compat.v1.get_default_graph(),
            recovery_wait_secs=TF1_RECOVERY_WAIT_S,
        )
        if self._is_chief:
            return manager.prepare_session(
                self._master,
                init_op=scaffold.init_op,
                init_feed_dict=scaffold.init_feed_dict,
                init_fn=scaffold.init_fn,
                config=self._config,
            )
        return manager.wait_for_session(
            self._master, config=self._config, max_wait_secs=self._max_wait_s
        )


def _run_tf1_worker(plan: JobPlan, me: TaskSpec) -> int:
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    config = plan.config
    keras = import_keras(config.keras)
    keras.utils.set_random_seed(config.seed)
    is_chief = me.index == 0
    # A worker needs the ps tasks and itself, not the other workers.
    session_config = tf.compat.v1.ConfigProto(
        device_filters=["/job:ps", f"/job:worker/task:{me.index}"]
    )
    server = tf.distribute.Server(_server_def(tf, plan, me, session_config), start=True)
    _KEEP_ALIVE.append(server)
    cluster = tf.train.ClusterSpec(plan.cluster)
    device_setter = tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{me.index}", cluster=cluster
    )
    hooks = []
    with tf.compat.v1.device(device_setter):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        model = build_model(
            config.model,
            keras_module=keras,
            input_shape=config.input_shape,
            classes=config.class_count,
        )
        images, labels = _synthetic_batch(tf, config)
        loss = _loss(tf, model, images, labels, config.batch_size)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(config.learning_rate)
        if config.synchronous:
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer,
                replicas_to_aggregate=config.workers,
                total_num_replicas=config.workers,
            )
            # No initial tokens: the first update needs a gradient from every worker,
            # so no worker runs ahead before the others have started.
            hooks.append(optimizer.make_session_run_hook(is_chief, num_tokens=0))
        train_op = optimizer.minimize(
            loss, global_step=global_step, var_list=model.trainable_variables
        )
        # Batch normalisation's moving statistics, as Keras' fit would update them.
        updates = model.get_updates_for(images)
        if updates:
            train_op = tf.group(train_op, *updates)
    if is_chief:
        _write_job_info(plan, me, model, tf, keras)
    creator = _QuickSessionCreator(
        tf,
        master=f"grpc://127.0.0.1:{me.bind_port}",
        is_chief=is_chief,
        config=session_config,
        max_wait_s=config.startup_timeout_s,
    )
    session = tf.compat.v1.train.MonitoredSession(
        session_creator=creator, hooks=hooks, stop_grace_period_secs=5
    )
    # The chief's session runs the queue that applies synchronous updates.
    _KEEP_ALIVE.append(session)
    _start_barrier(plan, me)
    markers = MarkerFile(plan.markers_path, me.name)
    total = config.warmup_steps + config.steps
    for step in range(total):
        start_ns = time.monotonic_ns()
        session.run(train_op)
        phase = "warmup" if step < config.warmup_steps else "steady"
        markers.write(step=step, phase=phase, start_ns=start_ns, end_ns=time.monotonic_ns())
    return total


def _start_barrier(plan: JobPlan, me: TaskSpec) -> None:
    """Wait until every driving task has its session, so that all start stepping together.

    Every task runs on this machine, so files in the work directory will do.
    """
    plan.ready_path(me.job, me.index).touch()
    others = [plan.ready_path(job, index) for job, index in plan.config.driving_tasks]
    deadline = time.monotonic() + plan.config.startup_timeout_s
    while not all(path.exists() for path in others):
        if time.monotonic() > deadline:
            missing = [path.name for path in others if not path.exists()]
            raise TimeoutError(f"other workers never became ready: {', '.join(missing)}")
        time.sleep(0.05)


def run_task(plan: JobPlan, me: TaskSpec) -> None:
    """Run this task until the launcher stops it.

    A driving task writes its finished file after its last step and then idles:
    peers may still need it (the tf1-ps chief worker runs the queue that applies
    synchronous updates; an mwms worker is a collective peer).
    """
    setup = plan.config.setup
    if (me.job, me.index) not in plan.config.driving_tasks:
        if setup == "tf1-ps":
            import tensorflow as tf

            tf.compat.v1.disable_eager_execution()
        else:
            import tensorflow as tf
        _serve(tf, plan, me)
        return
    if setup == "tf2-ps":
        written = _run_tf2_chief(plan, me)
    elif setup == "tf1-ps":
        written = _run_tf1_worker(plan, me)
    else:
        written = _run_mwms_worker(plan, me)
    _finish(plan, me, written)
    logging.info("task %s wrote %d step markers; idles until stopped", me.name, written)
    threading.Event().wait()


def run(plan_path: Path, job: str, index: int) -> int:
    """Run task ``job:index`` of the plan at ``plan_path``; the process's exit status.

    Whatever fails ends in one findable line for the launcher on stderr,
    starting with ``FAILURE_PREFIX``, after the traceback.
    """
    name = f"{job}:{index}"
    try:
        plan = JobPlan.read(plan_path)
        me = plan.task(job, index)
        run_task(plan, me)
    except BaseException as error:  # one findable line for the launcher, whatever failed
        logging.exception("task %s failed", name)
        lines = str(error).strip().splitlines()
        summary = lines[0] if lines else ""
        sys.stderr.write(f"{FAILURE_PREFIX} {name}: {type(error).__name__}: {summary}\n")
        return 1
    return 0


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logs.verbosity_from_environment())
    status = run(Path(_PLAN.value), _JOB.value, _INDEX.value)
    sys.stdout.flush()
    sys.stderr.flush()
    # TensorFlow's teardown can block on peers that the launcher is about to stop.
    os._exit(status)


if __name__ == "__main__":
    app.run(main)
