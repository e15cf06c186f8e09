"""The gRPC C++ replay engine (``--engine grpc-cpp``): a native program that speaks the
replay's wire protocol, and the Python that builds, starts and drives it.

The Python side stays the brain: workloads, pacing and the dependency model are
the same objects as the grpcio engine's, and when a call may go is decided by
them alone.  The program (``engine/*.cc``, built on first use by ``build``)
executes: it opens gRPC C++ channels (generic stub, completion queues), sends
each call's request the way TensorFlow sends tensors, waits for the release
times and windows Python gives it, and reports each call's timing back
(``protocol``).  ``driver.NativeDriver`` stands where ``transport.driver.Driver``
stands for the measuring loop; ``servers`` runs the program's server side.
"""
