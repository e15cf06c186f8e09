"""Replay engines: what executes a planned benchmark (``transport.seam``), found by name.

``registry`` names them; ``grpcio`` is gRPC's Python binding (servers in
processes of their own, point-to-point workers in this process, PS
throughput's workers one process each).
"""
