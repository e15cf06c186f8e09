"""What a replay writes: the result document, machine probes, statistics, report, TensorBoard.

Also the step timelines, comparison plots, CSV tables, the progress bar
(``progress``) and the ``timeline``/``export`` commands (``cli``).

``document`` is the one place result files are parsed.  May import ``core``
(the measurements it records); never ``transport`` or anything above.
"""
