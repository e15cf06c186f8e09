"""Emulated networks on one machine: namespaces, link profiles, network info, comparisons.

``cli`` is the ``network`` command's flags; ``compare`` runs replays as
subprocesses inside the namespaces.  May import ``core``, ``transport`` and
``output``; never ``throughput``, ``runner``, ``placement`` or ``cli``.
"""
