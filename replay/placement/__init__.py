"""Replay tasks placed by TF_CONFIG: the cluster spec, the gatherer service, the role of a task.

May import every layer below it (``core``, ``transport``, ``output``,
``network``, ``throughput``, ``runner``); never ``cli``.
"""
