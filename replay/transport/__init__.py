"""gRPC transport: clients, servers, wire formats, TLS, gRPC settings, the measuring loop.

May import ``core`` and the project's non-replay modules; never ``output``,
``network``, ``placement`` or the top-level modules.
"""
