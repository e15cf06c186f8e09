"""Serving: ``tf-grpc-bench serve``'s ps servers, until a stop signal."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from tf_grpc_bench import lifetime
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.engines.registry import engine_named
from tf_grpc_bench.replay.network import netinfo
from tf_grpc_bench.replay.spec import DEFAULT_ENGINE
from tf_grpc_bench.replay.transport import grpc_settings


def serving_hosts(host: str) -> tuple[str, ...]:
    """What a TLS server certificate must name: the listening host, or every local address."""
    wildcard = host in ("0.0.0.0", "::", "[::]", "")
    return netinfo.local_addresses() if wildcard else (host, *netinfo.local_addresses())


def serve_until_stopped(
    *,
    mode: Mode,
    host: str,
    ports: Sequence[int],
    settings: grpc_settings.GrpcSettings,
    tls_dir: Path | None = None,
    max_response_bytes: int | None = None,
    control_token: str | None = None,
    announce: Callable[[str], None],
    procs_per_server: int = 1,
    engine: str = DEFAULT_ENGINE,
) -> tuple[str, int | None]:
    """Ps servers on ``ports`` until a stop signal (Ctrl-C, SIGTERM, SIGHUP); blocking.

    With ``settings.tls`` the servers' certificate (in ``tls_dir``, made if
    missing) names ``host``, or every local address when it is a wildcard.
    ``announce`` gets the line saying where they listen.  Returns the line
    saying what they did and the signal that stopped them.  Main thread only.
    ``engine`` runs them (``engines.registry``).
    """
    tls_material = None
    if settings.tls:
        from tf_grpc_bench.replay.transport import tls

        tls_material = tls.ensure_material(tls_dir, hosts=serving_hosts(host))
    server_settings = replace(
        grpc_settings.server_settings(settings, tls_material),
        max_response_bytes=max_response_bytes,
        control_token=control_token,
    )
    chosen = engine_named(engine)
    with (
        lifetime.StopSignals() as stop,
        chosen.serving(
            mode=mode,
            host=host,
            ports=ports,
            settings=server_settings,
            procs_per_server=procs_per_server,
        ) as serving,
    ):
        runs_on = "" if chosen.name == "grpcio" else f" with {chosen.name}"
        announce(
            f"serving {mode.value} on {','.join(serving.targets)}{runs_on} "
            f"({_pids(serving.pids)}); Ctrl-C to stop"
        )
        while not stop.event.wait(1.0):
            pass
    received = serving.received()
    summary = "stopped"
    if received is not None:
        summary = f"stopped; received {received[0]} messages, {received[1]} bytes"
    return summary, stop.signum


def _pids(pids: Sequence[int]) -> str:
    return f"pid {pids[0]}" if len(pids) == 1 else f"pids {' '.join(map(str, pids))}"
