"""Free TCP ports for the gRPC servers of training tasks.

TensorFlow's gRPC server binds its port on every interface and refuses to share
it (it turns ``SO_REUSEPORT`` off), so a port is usable when a socket with
``SO_REUSEADDR`` can bind ``0.0.0.0`` on it: that succeeds while an old
connection of an earlier run lingers in TIME_WAIT and fails while anything
listens there.

Ports are chosen below the kernel's ephemeral range: the ephemeral range is
where outgoing connections take their local ports, so a port chosen there could
be taken by some client between planning and the task's bind.
"""

from __future__ import annotations

import errno
import random
import socket

from tf_grpc_bench.errors import ServeError
from tf_grpc_bench.host import ephemeral_port_low

#: Lowest port ``free_ports`` hands out.
LOWEST_PORT = 10_000


def port_is_free(port: int) -> bool:
    """True if a server could listen on ``port`` on every interface now.

    Not blocking; a port in TIME_WAIT counts as free.  Only a snapshot: nothing
    keeps another process from taking the port afterwards.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", port))
        probe.listen(1)
    except OSError as error:
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            return False
        raise
    finally:
        probe.close()
    return True


def check_ports_free(ports: dict[int, str]) -> None:
    """ServeError naming the first port (and its owner's name) that is in use.

    ``ports`` maps port -> a name for messages, e.g. ``{41000: "worker:0"}``.
    """
    for port, owner in ports.items():
        if not port_is_free(port):
            raise ServeError(
                f"port {port} (for {owner}) is already in use; "
                "stop whatever listens there or let the launcher choose free ports"
            )


def free_ports(count: int, *, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct ports that are free now, below the ephemeral range.

    ``rng`` picks candidates (a fresh unseeded one by default, so concurrent
    callers rarely collide).  ServeError if no free ports can be found.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    chooser = rng or random.Random()
    high = max(ephemeral_port_low() - 1, LOWEST_PORT + 1000)
    chosen: list[int] = []
    attempts = 0
    while len(chosen) < count:
        attempts += 1
        if attempts > 50 * (count + 10):
            raise ServeError(
                f"could not find {count} free TCP ports between {LOWEST_PORT} and {high}"
            )
        port = chooser.randint(LOWEST_PORT, high)
        if port not in chosen and port_is_free(port):
            chosen.append(port)
    return chosen
