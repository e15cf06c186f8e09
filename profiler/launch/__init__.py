"""Launch: run training tasks on this machine, one process (group) per task.

* ``config`` - what to train and how (``TrainingConfig``, the setups);
* ``plan`` - the task plan: ports, addresses, ``plan.json`` (``TaskSpec``,
  ``JobPlan``, ``plan_tasks``);
* ``markers`` - the step-marker file format (``StepMarker``, ``MarkerFile``);
* ``job`` - a launched job's processes (``TrainingJob``);
* ``user_job`` - a user's own job (``UserJob``, its ``TF_CONFIG``, ``UserTasks``);
* ``processes`` - stopping process groups, reading log tails;
* ``ports`` - free TCP ports for the tasks' servers.

May import errors, ``tf_grpc_bench.models.registry`` (model names and
sizes), ``profiler.progress`` and each other; never ``recorders``,
``assembly`` or TensorFlow (the tasks import it in their own processes,
``profiler.task``).
"""
