"""The pure replay model: workloads, payload generators, pacing, measurements, chunking.

Plain functions over plain data.  May import only the standard library's pure
parts, numpy, ``tf_grpc_bench.errors``, ``tf_grpc_bench.sizes``,
``tf_grpc_bench.trace`` (the trace model) and itself: no gRPC, no sockets,
no clocks, no threads or processes, no files.
"""
