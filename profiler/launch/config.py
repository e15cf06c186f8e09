"""What to train and how: the training configuration of a launched job.

Three setups:

``tf2-ps`` (default)
    TF2 ``ParameterServerStrategy`` driven by a ``ClusterCoordinator``: one chief
    (the coordinator, which drives the steps), ``ps`` parameter servers and
    ``workers`` workers.  Variables live on the ps tasks; each scheduled step
    runs on one worker, which pulls the weights and the ps tasks pull its
    gradients.  Keras 3 by default (``tf_keras`` works too).
``tf1-ps``
    TF1 graph-mode parameter-server training, the architecture the paper
    measured: ``tf.compat.v1.train.Server`` per task, variables placed by
    ``replica_device_setter``, ``tf_keras`` model (Keras 3 has no graph mode),
    ``ps`` ps tasks and ``workers`` workers; every worker drives its own steps,
    worker 0 is the chief (initialises the variables).
``mwms``
    TF2 ``MultiWorkerMirroredStrategy``: ``workers`` workers, no ps; every worker
    holds a replica and gradients are all-reduced with collectives (``RecvBuf``).

What a *step* is, and what ``synchronous`` means (``steps`` and
``warmup_steps`` always count steps *per worker*):

* tf2-ps, synchronous: a step is a round: the chief schedules one training
  step per worker, then joins (waits for all of them).  The coordinator hands a
  queued step to whichever worker is idle, so normally, not provably, each
  worker runs one step per round.  One marker per round (task ``chief:0``).
* tf2-ps, asynchronous: warm-up rounds as above, then the chief keeps one step
  per worker in flight without joining; a marker spans one worker-step, from
  scheduling to its result reaching the chief, and markers overlap.
  ``steps * workers`` steady markers, numbered in scheduling order.
* tf1-ps, synchronous: ``SyncReplicasOptimizer`` applies one update per
  ``workers`` gradients, and each worker blocks after pushing its gradient
  until the update is applied.  No initial tokens, so the first update takes a
  gradient from every worker; later, TensorFlow does not insist that the
  gradients come from distinct workers (a fast worker may take a slow one's
  token), only that none is stale.  Each worker marks its own steps.
* tf1-ps, asynchronous: plain SGD; each worker applies its gradients to the ps
  whenever it has them and marks its own steps.
* mwms: synchronous by nature: every step all-reduces every worker's gradients
  before any applies them.  Each worker marks its own steps.
* tf1-ps and mwms workers wait for one another (a file barrier in the work
  directory for tf1-ps, the collectives for mwms) before their first step.

The optimizer is plain SGD everywhere (no slot variables), so in the PS setups
each worker-step moves exactly the trainable variables once each way (weights
to the worker, gradients to the ps), plus, for models with batch normalisation,
the moving statistics' updates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.models.registry import KERAS_FLAVOURS, check_input_size, model_spec

SETUPS = ("tf2-ps", "tf1-ps", "mwms")

#: Most tasks a job may have: each is a TensorFlow process of a few hundred MB.
MAX_TASKS = 32

_STRATEGY_NAMES = {
    "tf2-ps": "tf.distribute.experimental.ParameterServerStrategy",
    "tf1-ps": "tf.compat.v1 replica_device_setter parameter server",
    "mwms": "tf.distribute.MultiWorkerMirroredStrategy",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """What to train and how; validated on construction (ConfigError).

    ``steps`` and ``warmup_steps`` count steps per worker (see the module
    docstring for what a step is in each setup).  ``input_size`` is the image
    side in pixels, default the model's minimum (traffic follows the variables,
    not the image).  ``batch_size`` is per worker.  ``keras_flavour`` defaults to
    ``keras`` for the TF2 setups and ``tf_keras`` for tf1-ps.  Timeouts: no task
    may take longer than ``startup_timeout_s`` to finish its first step, nor
    ``step_timeout_s`` between two step markers.
    """

    model: str
    setup: str = "tf2-ps"
    ps: int = 1
    workers: int = 2
    steps: int = 3
    warmup_steps: int = 1
    batch_size: int = 4
    input_size: int | None = None
    classes: int | None = None
    synchronous: bool = True
    seed: int = 0
    learning_rate: float = 0.01
    keras_flavour: str | None = None
    startup_timeout_s: float = 300.0
    step_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.setup not in SETUPS:
            raise ConfigError(f"unknown setup {self.setup!r}; expected one of {', '.join(SETUPS)}")
        model_spec(self.model)  # ConfigError naming the known models
        if self.input_size is not None:
            check_input_size(self.model, self.input_size)
        if self.classes is not None and self.classes < 1:
            raise ConfigError(f"classes must be >= 1, got {self.classes}")
        _check_cluster_size(self.setup, self.ps, self.workers)
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not (self.startup_timeout_s > 0 and self.step_timeout_s > 0):
            raise ConfigError("startup_timeout_s and step_timeout_s must be > 0")
        if self.setup == "mwms" and not self.synchronous:
            raise ConfigError(
                "setup mwms is synchronous by nature (every step all-reduces the gradients); "
                "asynchronous training needs tf2-ps or tf1-ps"
            )
        if self.keras_flavour is not None and self.keras_flavour not in KERAS_FLAVOURS:
            raise ConfigError(
                f"unknown keras_flavour {self.keras_flavour!r}; expected one of {KERAS_FLAVOURS}"
            )
        if self.setup == "tf1-ps" and self.keras_flavour == "keras":
            raise ConfigError(
                "setup tf1-ps runs in TF1 graph mode, which Keras 3 does not support: "
                "use keras_flavour tf_keras"
            )

    @property
    def image_size(self) -> int:
        """The image side in pixels that will be trained on."""
        return self.input_size or model_spec(self.model).minimum_input_size

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, 3)

    @property
    def class_count(self) -> int:
        return self.classes or model_spec(self.model).default_classes

    @property
    def keras(self) -> str:
        """The Keras flavour the tasks will use."""
        if self.keras_flavour:
            return self.keras_flavour
        return "tf_keras" if self.setup == "tf1-ps" else "keras"

    @property
    def strategy(self) -> str:
        return _STRATEGY_NAMES[self.setup]

    @property
    def jobs(self) -> dict[str, int]:
        """Task count per TensorFlow job name, in start order (servers first)."""
        if self.setup == "tf2-ps":
            return {"ps": self.ps, "worker": self.workers, "chief": 1}
        if self.setup == "tf1-ps":
            return {"ps": self.ps, "worker": self.workers}
        return {"worker": self.workers}

    @property
    def driving_tasks(self) -> tuple[tuple[str, int], ...]:
        """The (job, index) of the tasks that drive steps and write step markers."""
        if self.setup == "tf2-ps":
            return (("chief", 0),)
        return tuple(("worker", i) for i in range(self.workers))

    @property
    def markers_per_driving_task(self) -> int:
        """Step markers each driving task writes in a complete run."""
        if self.setup == "tf2-ps" and not self.synchronous:
            return self.warmup_steps + self.steps * self.workers
        return self.warmup_steps + self.steps

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown training config fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def _check_cluster_size(setup: str, ps: int, workers: int) -> None:
    if workers < 1:
        raise ConfigError(f"setup {setup} needs at least 1 worker, got workers={workers}")
    if setup == "mwms":
        if ps != 0:
            raise ConfigError(
                f"setup mwms has no parameter servers (collectives between workers): "
                f"set ps=0, got ps={ps}"
            )
    elif ps < 1:
        raise ConfigError(f"setup {setup} needs at least 1 parameter server, got ps={ps}")
    total = ps + workers + (1 if setup == "tf2-ps" else 0)
    if total > MAX_TASKS:
        raise ConfigError(f"{total} tasks is too many for one machine (at most {MAX_TASKS})")
