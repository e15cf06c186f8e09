"""Replay captured TensorFlow gRPC traffic as the TF-gRPC-Bench micro-benchmarks.

The package is layered; a module imports only from its own layer or lower ones
(``tests/test_layers.py`` enforces this, lowest first):

0. ``core``: the workload model, generators, pacing, measurements, chunking,
   and planning (workloads of a request, the checks that they fit a host).
   Pure: no gRPC, no sockets, no clocks, no processes or threads, no IO.
1. ``transport``: gRPC clients and servers, the wire formats, TLS, gRPC
   settings, and the measuring loop the runner and the throughput workers share.
   ``native``, beside it: the gRPC C++ engine (its program's sources, build,
   frames, driver and servers).
2. ``output``: the result document (the one parse point of result files),
   machine probes, statistics, the text report, TensorBoard logs, step
   timelines, comparison plots, CSV tables, the progress bar, and the
   ``timeline`` and ``export`` commands over result documents.
3. ``network``: emulated networks (the namespaces and link profiles are
   ``tf_grpc_bench.netns``, shared with the profiler), what the network under
   a run is, comparisons across profiles, and their CLI.
4. ``throughput.py``: PS throughput's worker processes.
5. ``runner.py``: plans a replay request (each workload's RPC kind and
   pacing, the checks against this host's memory and threads), runs its
   benchmarks, records them, and serves (``serve``): the library behind every
   replay command.
6. ``placement``: a replay task placed by TF_CONFIG (cluster, gather, role);
   it runs the runner, so it sits above it.
7. ``cli.py``: flag tables and flags -> request for ``serve``, ``replay``,
   ``role`` and ``network``, and one-line errors for bad flags; what a
   request does or checks lives below it.  Nothing imports it.

Nothing in ``replay`` imports ``tf_grpc_bench.profiler`` or TensorFlow, and no
module imports another module's ``_private`` names.
"""
