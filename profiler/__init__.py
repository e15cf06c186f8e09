"""The profiler: capture the gRPC traffic of real distributed TensorFlow training as a trace.

* ``capture`` - the one capture sequence (``open_recorder``, ``run_and_write``)
  and ``capture_training``; ``userjob`` - ``capture_user_job`` for a user's
  own script; ``cli`` - the ``capture`` and ``capture-job`` commands;
  ``progress`` - the progress report and its terminal display;
* ``recorders/`` - how bytes are recorded and followed into calls;
* ``assembly/`` - recorded calls -> a trace (pure);
* ``launch/`` - starting and stopping training tasks on this machine;
* ``task`` - the program every launched TensorFlow task runs;
* ``physics`` - checks a trace against parameter-server physics (pure).

Only ``task`` (in the tasks' own processes) imports TensorFlow.
"""
