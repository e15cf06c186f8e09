"""The profiler: capture the gRPC traffic of real distributed TensorFlow training as a trace.

Commands (thin: flags in, one library call): ``cli`` - ``capture`` and
``capture-job``; ``record_cli`` - ``record`` and ``assemble``.

* ``capture`` - the one capture sequence (``open_recorder``, ``run_and_write``);
  ``training`` - ``capture_training`` for the shipped models; ``userjob`` -
  ``capture_user_job`` for a user's own script; ``metadata`` - what a trace
  records of its run (a launcher job's ``RunMetadata``, the command line);
* ``record`` - one task of a job launched elsewhere, recorded where it runs;
  ``assemble`` - one trace from every task's record folder;
* ``recorders/`` - how bytes are recorded and followed into calls;
* ``assembly/`` - recorded calls -> a trace (pure);
* ``launch/`` - starting, placing and stopping training tasks (emulated hosts,
  ``TF_CONFIG`` identities, user jobs);
* ``task`` - the program every launched TensorFlow task runs;
* ``calibrate`` - the compute calibration, run in a process of its own;
* ``cpu_sampler`` - the machine's and each task's CPU during a capture;
* ``physics`` - checks a trace against parameter-server physics (pure);
* ``progress`` and ``logs`` - the progress report and the profiler's logging.

Only ``task`` and ``calibrate`` import TensorFlow, each in processes of their
own; nothing here imports ``tf_grpc_bench.replay`` (``tests/test_layers.py``).
See docs/design.md#architecture.
"""
