"""The pure replay model: workloads, payload generators, pacing, measurements, chunking.

``planning`` turns what a request asks for into workloads (synthetic, trace,
what-if) and holds the pure checks that they fit a host (message sizes,
processes, targets, bytes in flight against a given amount of memory).

Plain functions over plain data.  May import only the standard library's pure
parts, numpy, ``tf_grpc_bench.errors``, ``tf_grpc_bench.sizes``,
``tf_grpc_bench.trace`` (the trace model), ``tf_grpc_bench.trace_mapping`` (a
trace as a replay sees it), ``tf_grpc_bench.dependencies`` (training's
dependency model) and itself: no gRPC, no sockets, no clocks, no threads or
processes, no files.
"""
