"""Replay captured TensorFlow gRPC traffic as the TF-gRPC-Bench micro-benchmarks.

The package is layered; a module imports only from its own layer or lower ones
(``tests/test_layers.py`` enforces this, lowest first):

0. ``core``: the workload model, generators, pacing (a table of timings),
   measurements, chunking, the table of benchmarks (``benchmarks``: each a
   row), and planning (workloads of a request, the checks that they fit a
   host).  Pure: no gRPC, no sockets, no clocks, no processes or threads, no IO.
1. ``transport``: gRPC clients and servers, the wire formats, TLS, gRPC
   settings, the measuring loop the runner and the throughput workers share,
   and the engine seam (``seam``: what an engine is given and returns).
   ``native``, beside it: the gRPC C++ engine (its program's sources, build,
   frames, driver and servers).
2. ``spec.py``: what a replay or a server is asked (``ReplaySpec``,
   ``ServeSpec``): typed, validated, given back as flags (``to_argv``).
3. ``output``: the result document (the one parse point of result files),
   machine probes, statistics, the text report, TensorBoard logs, step
   timelines, comparison plots, CSV tables, the progress bar, and the
   ``timeline`` and ``export`` commands over result documents.
4. ``network``: emulated networks (the namespaces and link profiles are
   ``tf_grpc_bench.netns``, shared with the profiler), what the network under
   a run is, comparisons across profiles, and their CLI.
5. ``throughput.py``: workers in processes of their own (PS throughput).
6. ``engines``: the engines by name; ``grpcio``, gRPC's Python binding.
7. ``fitting.py``: each workload's RPC kind and pacing, and the checks that the
   workloads fit this host (memory, threads, processes, namespaces).
8. ``request.py``: ``plan(spec, host)``: a spec and a machine to a request.
9. ``runner.py``: one benchmark's protocol (warm-up, runs) around an engine's
   workers.
10. ``session.py`` (a whole request carried out and recorded) and
    ``serving.py`` (``serve``'s servers until a stop signal).
11. ``placement``: a replay task placed by TF_CONFIG (cluster, gather, merge,
    role); it runs the runner, so it sits above it.
12. ``cli.py`` and ``cli_flags.py``: the flag tables, flags -> specs, and the
    ``serve``, ``replay``, ``role`` and ``network`` commands; the only replay
    modules besides ``network/cli.py`` and ``output/cli.py`` that read command
    lines.  Nothing imports them.

Nothing in ``replay`` imports ``tf_grpc_bench.profiler`` or TensorFlow, and no
module imports another module's ``_private`` names.
"""
