"""Emulated networks on one machine: network info, comparisons, the ``network`` command.

The namespaces and link profiles themselves are ``tf_grpc_bench.netns``, shared
with the profiler (``capture --network``).  ``cli`` is the ``network`` command's
flags; ``compare`` runs replays as subprocesses inside the namespaces.  May
import ``core``, ``transport`` and ``output``; never ``throughput``, ``runner``,
``placement`` or ``cli``.
"""
