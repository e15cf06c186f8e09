"""What a replay writes: the result document, machine probes, statistics, report, TensorBoard.

``document`` is the one place result files are parsed.  May import ``core``
(the measurements it records); never ``transport`` or anything above.
"""
