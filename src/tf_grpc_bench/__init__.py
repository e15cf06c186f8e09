"""tf-grpc-bench: capture distributed TensorFlow's tensor traffic, replay it over gRPC.

The distribution installs exactly this one top-level package.  The repository's
folders are its subpackages: ``tf_grpc_bench.replay`` (``replay/``),
``tf_grpc_bench.profiler`` (``profiler/``), ``tf_grpc_bench.protos``
(``protos/``), ``tf_grpc_bench.models`` (``models/``) and
``tf_grpc_bench.traces`` (``traces/``, the shipped traces).
"""

__version__ = "0.1.0"
