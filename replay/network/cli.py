"""``tf-grpc-bench network``: emulated networks on one machine (needs root).

Subcommands:

- ``profiles``: the named link profiles and the tbf settings each gets here;
- ``up``: create hosts on a rate-limited link and leave them (for your own runs);
- ``down RUN_ID``: remove one network made by ``up``;
- ``list``: the tool's namespaces, by run;
- ``cleanup``: remove what crashed runs left behind (``--all``: also what ``up`` left up);
- ``compare [TRACE]``: replay across several profiles, one comparison
  (``compare``); takes every flag of ``replay``, which ``replay.cli`` hands
  in with the functions that turn them into a ``ReplaySpec`` and plan it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from tf_grpc_bench import lifetime, trace_files
from tf_grpc_bench.errors import NetworkError, RunInterrupted, UsageError
from tf_grpc_bench.netns import emulated, links, namespaces, topology
from tf_grpc_bench.replay.core import compute_load
from tf_grpc_bench.replay.core.pacing import Pacing, Timing
from tf_grpc_bench.replay.core.workload import Workload
from tf_grpc_bench.replay.network import compare as network_compare
from tf_grpc_bench.replay.output.run_directories import new_run_directory
from tf_grpc_bench.replay.spec import DEFAULT_OUTPUT_DIR, ReplaySpec, ServeSpec
from tf_grpc_bench.replay.transport.loop import RunPlan


class ReplayRequest(Protocol):
    """What ``compare`` reads of a validated replay request (``runner.ReplayRequest``)."""

    @property
    def workloads(self) -> tuple[Workload, ...]: ...

    @property
    def pacings(self) -> tuple[Pacing, ...]: ...

    @property
    def trace_path(self) -> Path | None: ...

    @property
    def plan(self) -> RunPlan: ...


#: Adds a command's flags to a parser (``replay.cli_flags.configure_replay``).
Flags = Callable[[argparse.ArgumentParser], None]
#: Turns ``compare``'s replay flags into a spec, ``--time-dilation auto`` allowed (None).
SpecOf = Callable[[argparse.Namespace], ReplaySpec]
#: Plans a spec on this machine (``request.plan``), validating every flag.
Planner = Callable[[ReplaySpec], ReplayRequest]


def configure_network(parser: argparse.ArgumentParser, *, replay_flags: Flags) -> None:
    """The ``network`` subcommands' flags; ``compare`` also takes ``replay_flags``."""
    commands = parser.add_subparsers(dest="network_command", metavar="SUBCOMMAND", required=True)

    commands.add_parser("profiles", help="list the named link profiles and their tbf settings")

    up = commands.add_parser(
        "up", help="create emulated hosts on a rate-limited link and leave them up"
    )
    up.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    up.add_argument(
        "--profile",
        default="1gbit",
        help=f"link profile: {', '.join(links.PROFILES)}, or a rate like 100mbit, each "
        "optionally followed by :delay=D:jitter=J:loss=P%% (default 1gbit)",
    )
    _timing_flags(up)
    up.add_argument(
        "--subnet", default=topology.DEFAULT_SUBNET, help="private /24 used inside the namespaces"
    )

    down = commands.add_parser("down", help="remove a network made by 'network up'")
    down.add_argument("run_id", metavar="RUN_ID", help="the run id 'network up' printed")

    commands.add_parser("list", help="list the tool's namespaces, by run")

    cleanup = commands.add_parser(
        "cleanup", help="remove namespaces left by crashed runs (not those 'network up' left up)"
    )
    cleanup.add_argument(
        "--all",
        action="store_true",
        help="also remove the networks of runs still in progress and those 'network up' left up",
    )

    compare = commands.add_parser(
        "compare",
        help="replay a trace (or the synthetic default) across several link profiles and compare",
        description="Replay across emulated links, one after the other, and compare the runs: "
        "TensorBoard hparams with the network as a hyperparameter, and a markdown table. "
        "Every flag of 'tf-grpc-bench replay' applies.",
    )
    compare.add_argument(
        "--profiles",
        default="1gbit,10gbit,unlimited",
        help=f"comma-separated link profiles ({', '.join(links.PROFILES)}, or rates "
        "like 100mbit, each optionally followed by :delay=D:jitter=J:loss=P%%; default "
        "1gbit,10gbit,unlimited)",
    )
    _timing_flags(compare)
    replay_flags(compare)


def _timing_flags(parser: argparse.ArgumentParser) -> None:
    """``--delay``, ``--jitter``, ``--loss``: they replace the profile's own figures."""
    parser.add_argument(
        "--delay",
        metavar="DURATION",
        help="one-way delay of every packet, each direction (e.g. 50us, 10ms), by a relay "
        "between two tap devices; replaces the profile's (docs/networks.md)",
    )
    parser.add_argument(
        "--jitter",
        metavar="DURATION",
        help="each packet's delay drawn uniformly from delay +- jitter, packet order kept "
        "(at most the delay)",
    )
    parser.add_argument(
        "--loss",
        metavar="PERCENT",
        help="probability that a packet is lost, e.g. 0.1%% (a BPF filter at each receiver)",
    )


def _with_timing_flags(profile: links.LinkProfile, args: argparse.Namespace) -> links.LinkProfile:
    """``profile`` with ``--delay``, ``--jitter`` and ``--loss`` applied (NetworkError
    naming the flag for a bad value)."""
    return links.with_timing(
        profile,
        delay_ns=None if args.delay is None else links.parse_duration(args.delay, what="--delay"),
        jitter_ns=None
        if args.jitter is None
        else links.parse_duration(args.jitter, what="--jitter"),
        loss=None if args.loss is None else links.parse_loss(args.loss, what="--loss"),
    )


def run_network(args: argparse.Namespace, *, spec_of: SpecOf, plan: Planner) -> int:
    """Run a ``network`` subcommand; ``compare`` validates and passes on the replay flags."""
    command = args.network_command
    if command == "profiles":
        return _profiles()
    if command == "up":
        return _up(args)
    if command == "down":
        return _down(args.run_id)
    if command == "list":
        return _list()
    if command == "cleanup":
        return _cleanup(include_live=args.all)
    if command == "compare":
        return _compare(args, spec_of(args), plan)
    raise NetworkError(f"unknown network subcommand {command!r}")


def _profiles() -> int:
    hz = namespaces.kernel_hz()
    print(
        f"named link profiles (tbf rate on both ends of each link, kernel HZ {hz}; delay "
        "and jitter one way, by a relay; loss at each receiver):"
    )
    rows = [("profile", "rate", "tbf burst", "delay", "jitter", "loss", "stands for")]
    for profile in links.PROFILES.values():
        rate = profile.rate_bits_per_s
        burst = "-" if rate is None else f"{links.token_bucket_for(rate, hz=hz).burst_bytes} B"
        rows.append(
            (
                profile.name,
                "unlimited" if rate is None else links.format_tc_rate(rate),
                burst,
                links.format_duration(profile.delay_ns) if profile.delay_ns else "-",
                links.format_duration(profile.jitter_ns) if profile.jitter_ns else "-",
                links.format_loss(profile.loss) if profile.loss else "-",
                profile.note,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  " + "  ".join([*cells, row[-1]]).rstrip())
    print(
        "any rate such as 100mbit or 2.5gbit is accepted too; any profile takes "
        ":delay=D:jitter=J:loss=P% (or --delay, --jitter, --loss), e.g. 10gbit:delay=50us"
    )
    return 0


def _up(args: argparse.Namespace) -> int:
    profile = _with_timing_flags(links.parse_profile(args.profile), args)
    network = emulated.EmulatedNetwork(
        hosts=args.hosts, profile=profile, subnet=args.subnet, detached=True
    )
    network.up()
    print(f"run {network.run_id}: {len(network.hosts)} hosts, links {profile.describe()}")
    for host in network.hosts:
        print(f"  h{host.index}  {host.namespace:<24} {host.interface} {host.cidr}")
    if network.plan.switch_namespace:
        print(f"  switch {network.plan.switch_namespace}")
    if network.calibration is not None:
        print(
            f"relay's own cost: {network.compensation_ns / 1000:.1f} us one way, measured and "
            "taken off each packet's delay"
        )
    if network.unattainable():
        print(f"warning: {network.unattainable()}")
    first = network.hosts[0]
    print(f"run a command on a host:  ip netns exec {first.namespace} COMMAND")
    print(f"remove it:                tf-grpc-bench network down {network.run_id}")
    return 0


def _down(run_id: str) -> int:
    names = namespaces.remove_run(run_id)
    print(f"removed {len(names)} namespaces of run {run_id}")
    return 0


def _list() -> int:
    by_run = namespaces.namespaces_by_run()
    if not by_run:
        print("no tf-grpc-bench namespaces")
    for run, names in by_run.items():
        print(f"run {run}: {' '.join(names)}")
    return 0


def _cleanup(*, include_live: bool) -> int:
    removed = namespaces.cleanup_leftovers(include_live=include_live)
    if removed:
        print(f"removed {len(removed)} namespaces: {' '.join(removed)}")
    else:
        print("nothing to clean up")
    sys.stdout.flush()
    return 0


def _compare(args: argparse.Namespace, spec: ReplaySpec, plan: Planner) -> int:
    if spec.targets is not None:
        raise UsageError("network compare makes its own targets; drop --target")
    if spec.client_netns:
        raise UsageError(
            "network compare places the clients on its emulated hosts itself; drop --client-netns"
        )
    profiles = tuple(_with_timing_flags(p, args) for p in links.parse_profiles(args.profiles))
    # Validate every replay flag here, before any namespace exists (and without root);
    # a dilation (None: automatic) goes to each profile's replay only where its link is limited.
    request = plan(spec)
    if request.trace_path is not None and not trace_files.is_regular_file(request.trace_path):
        raise UsageError(
            f"{request.trace_path}: network compare replays the trace in a process per "
            "profile, which a pipe cannot feed; give a trace file"
        )
    namespaces.require_root()
    output_dir = new_run_directory(spec.output_dir, "compare")
    config = network_compare.CompareConfig(
        profiles=profiles,
        output_dir=Path(output_dir),
        layout=network_compare.host_layout(request.workloads),
        replay_arguments=tuple(replay_arguments(spec)),
        serve_arguments=tuple(serve_arguments(spec)),
        tls=spec.grpc.tls,
        time_dilation=spec.time_dilation,
        dilatable=all(p.timing is Timing.DEPENDENCIES for p in request.pacings),
    )
    comparison = network_compare.compare_networks(
        config, on_line=(lambda line: None) if spec.quiet else print
    )
    print(comparison.markdown)
    chosen = {
        "compute_load": request.plan.compute_load,
        "compute_load_auto": request.plan.compute_load_auto,
    }
    if load := compute_load.report_line(chosen):
        print(load)  # the mode, and why where auto chose it (each result: its sizing)
    if comparison.dilations:
        print("time dilation (docs/fidelity.md):")
        print("\n".join(comparison.dilations))
    print(f"comparison: {output_dir / network_compare.COMPARISON_FILE}")
    print(f"view:       tensorboard --logdir {output_dir}")
    if comparison.interrupted is not None:
        name = lifetime.signal_name(comparison.interrupted)
        raise RunInterrupted(
            f"interrupted ({name}); the profiles replayed so far are in {output_dir}",
            signum=comparison.interrupted,
        )
    if comparison.failed:
        names = ", ".join(o.profile.name for o in comparison.failed)
        raise NetworkError(f"replay failed on {names}; see {output_dir}")
    return 0


def replay_arguments(spec: ReplaySpec) -> list[str]:
    """The flags each profile's replay gets: ``spec``'s, less what ``compare`` sets itself
    for each profile (targets, output, TLS files, the network's name, the dilation,
    where clients run; the servers' processes go to ``serve``)."""
    own = replace(
        spec,
        targets=None,
        output_dir=DEFAULT_OUTPUT_DIR,
        quiet=False,
        network_name="",
        procs_per_server=1,
        time_dilation=None,
        client_netns=(),
        grpc=replace(spec.grpc, tls=False, tls_dir=None),
    )
    return own.to_argv()


def serve_arguments(spec: ReplaySpec) -> list[str]:
    """The flags each profile's ``serve`` gets (``compare`` sets where, how many and TLS)."""
    return ServeSpec(
        mode=spec.mode,
        procs_per_server=spec.procs_per_server,
        token_file=spec.token_file,
        grpc=replace(spec.grpc, tls=False, tls_dir=None),
        engine=spec.engine,
    ).to_argv()
