"""Emulated networks on one machine: Linux network namespaces joined by links.

Shared by replay (``tf-grpc-bench network``) and capture (``capture --network``,
which runs each training task inside an emulated host), so it imports neither.

Each emulated host is a network namespace named ``tfgb-<run id>-h<i>``.  Two
hosts are joined by one link (point to point); three or more each get a link
to a bridge ``br0`` inside a switch namespace ``tfgb-<run id>-sw``, like hosts
cabled to one switch.  Every link is rate-limited on both ends with a
token-bucket filter (``tc qdisc ... tbf``).  Addresses come from a private
subnet that exists only inside these namespaces: traffic never leaves the
machine and no route of the root namespace changes.

The modules, by concept:

- ``links``: what a link is (``LinkProfile``), the named profiles, how
  profiles are written, and the token bucket that shapes a rate;
- ``topology``: the pure plan of a network (hosts, namespaces, addresses and
  the ``ip``/``tc`` commands that build it);
- ``namespaces``: operations on the machine's namespaces (run a command,
  list, enter, delete, clean up what crashed runs left);
- ``emulated``: ``EmulatedNetwork``, a network brought up and torn down
  around a ``with`` block, and the processes started inside its hosts;
- ``relay`` (and ``relay.c``): the process that gives a link its delay and
  jitter, and its statistics;
- ``calibration``: the relays' own cost, measured when a network with relays
  comes up, and taken off each packet's delay;
- ``state``: what a running network leaves in ``/run`` for the processes
  inside it (each host's link record, each relay's statistics).

Everything that touches the machine needs root.
"""
