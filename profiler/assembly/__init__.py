"""Assembly: recorded calls -> a validated ``Trace``, pure (no IO, no TensorFlow, no clocks).

* ``tf_messages`` - decode the few fields of TensorFlow's worker-service
  messages a trace needs, from truncated message heads;
* ``rpcs`` - calls -> trace RPCs (caller, callee, tensor, status);
* ``steps`` - where the steady-state steps are: from step markers, step ids
  or collective instance keys (``StepWindow``);
* ``phases`` - start-up, steps and teardown, and the trace (``assemble_trace``).

May import the trace model (``tf_grpc_bench.trace``), errors,
``recorders.calls`` (the ``RecordedCall`` record), ``launch.markers`` (the
``StepMarker`` record) and ``physics`` (the keys it writes into a trace);
nothing that runs processes or sockets (``tests/test_layers.py`` holds this).
"""
