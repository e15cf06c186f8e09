"""A replay is a typed spec: made once from the flags, given back as flags, planned for a host.

Round trips as properties: any valid ``ReplaySpec`` (and ``ServeSpec``) made
into a command line (``to_argv``) and parsed again (``replay.cli_flags``) is the
same spec.  Planning (``request.plan``) takes the machine as a ``Host``, so
what depends on it (memory, cores, root) is tested with made-up machines.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_trace
from tf_grpc_bench import host, trace_files
from tf_grpc_bench.errors import ConfigError, NetworkError, UsageError
from tf_grpc_bench.replay import cli_flags, request
from tf_grpc_bench.replay.core import benchmarks
from tf_grpc_bench.replay.core.benchmarks import RpcKind
from tf_grpc_bench.replay.core.generators import GeneratorKind
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.core.pacing import Compute, Timing
from tf_grpc_bench.replay.core.whatif import Placement
from tf_grpc_bench.replay.core.workload import Mode
from tf_grpc_bench.replay.network.cli import replay_arguments, serve_arguments
from tf_grpc_bench.replay.placement import role
from tf_grpc_bench.replay.placement.cluster import parse_tf_config
from tf_grpc_bench.replay.spec import DEFAULT_ENGINE, GrpcFlags, ReplaySpec, ServeSpec, flag_of
from tf_grpc_bench.replay.transport.grpc_settings import Compression
from tf_grpc_bench.sizes import SizeCategory

# Not "--" alone: argparse takes that value for its end-of-options marker even after "=".
_words = st.text(alphabet="abcdefghij-_0123456789", min_size=1, max_size=12).filter(
    lambda word: word != "--"
)
_seconds = st.floats(min_value=0.001, max_value=3600.0, allow_nan=False)


def _maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:  # type: ignore[type-arg]
    return st.none() | strategy


@st.composite
def grpc_flags(draw: st.DrawFn) -> GrpcFlags:
    maximum = draw(st.sampled_from([2**31 - 1, 64 << 20, 4 << 20]))
    return GrpcFlags(
        channels=draw(st.integers(1, 256)),
        outstanding=draw(_maybe(st.integers(1, 4096))),
        compression=draw(st.sampled_from(list(Compression))),
        max_message_bytes=maximum,
        chunk_bytes=draw(st.sampled_from([0, 1024, 1 << 20])),
        tls=draw(st.booleans()),
        tls_dir=draw(_maybe(_words)),
        keepalive_ms=draw(st.integers(0, 10**6)),
        keepalive_timeout_ms=draw(st.integers(1, 10**6)),
    )


@st.composite
def replay_specs(draw: st.DrawFn) -> ReplaySpec:
    chosen = draw(st.lists(st.sampled_from(list(Benchmark)), min_size=1, unique=True))
    by_steps = draw(st.booleans())
    return ReplaySpec(
        trace=draw(_maybe(_words.filter(lambda word: not word.startswith("-")))),
        benchmarks=tuple(b for b in Benchmark if b in chosen),
        mode=draw(st.sampled_from(list(Mode))),
        rpc=draw(_maybe(st.sampled_from(list(RpcKind)))),
        generator=draw(_maybe(st.sampled_from(list(GeneratorKind)))),
        categories=draw(
            _maybe(st.lists(st.sampled_from(list(SizeCategory)), min_size=1).map(tuple))
        ),
        skew_bias=draw(_maybe(st.sampled_from(list(SizeCategory)))),
        buffers=draw(_maybe(st.integers(1, 10_000))),
        payloads=draw(_maybe(st.integers(1, 10_000))),
        random_sizes=draw(st.booleans()),
        small_bytes=draw(_maybe(st.integers(1, 1023))),
        large_bytes=draw(_maybe(st.integers(1 << 20, 10 << 20))),
        seed=draw(_maybe(st.integers(-(2**31), 2**31))),
        ps=draw(_maybe(st.integers(1, 64))),
        workers=draw(_maybe(st.integers(1, 64))),
        pair=draw(_maybe(st.just("worker:0,ps:0"))),
        steps=draw(st.integers(1, 100)) if by_steps else None,
        placement=draw(_maybe(st.sampled_from(list(Placement)))),
        scale_tensors=draw(_maybe(st.floats(0.01, 100.0))),
        warmup_s=draw(st.floats(0.0, 3600.0)),
        duration_s=None if by_steps else draw(_maybe(_seconds)),
        runs=draw(st.integers(1, 1000)),
        pacing=draw(_maybe(st.sampled_from(list(Timing)))),
        compute=draw(
            _maybe(
                st.sampled_from(["auto", "here", "recorded", "none"]).map(Compute.parse)
                | st.floats(0.0, 100.0).map(lambda x: Compute.parse(repr(x)))
            )
        ),
        time_dilation=draw(_maybe(st.floats(1.0, 64.0))),
        rate=draw(_maybe(st.floats(0.001, 1e6))),
        speedup=draw(_maybe(st.floats(0.001, 1e3))),
        deadline_s=draw(_seconds),
        connect_timeout_s=draw(_seconds),
        targets=draw(
            _maybe(st.lists(st.just("h0:50001") | st.just("[::1]:2222"), min_size=1).map(tuple))
        ),
        token_file=draw(_maybe(_words)),
        procs_per_server=draw(st.integers(1, 4)),
        procs_per_worker=draw(_maybe(st.integers(1, 64))),
        client_netns=draw(
            st.sampled_from([(), (("ps", "tfgb-a"),), (("ps", "x"), ("chief", "y"))])
        ),
        network_name=draw(st.sampled_from(["", "5gbit"])),
        output_dir=draw(st.sampled_from(["runs", "out/here"])),
        quiet=draw(st.booleans()),
        engine=draw(st.sampled_from(["grpcio", "grpc-cpp"])),
        grpc=draw(grpc_flags()),
    )


@settings(max_examples=300, deadline=None)
@given(spec=replay_specs())
def test_a_spec_made_into_flags_and_parsed_again_is_the_same_spec(spec: ReplaySpec) -> None:
    argv = spec.to_argv()
    assert cli_flags.replay_from_argv(argv) == spec
    # Field by field: every flag in it is one the replay command takes.
    parser = cli_flags.replay_parser()
    flags = {option for action in parser._actions for option in action.option_strings}
    assert all(token.partition("=")[0] in flags for token in argv if token.startswith("--"))


@settings(max_examples=100, deadline=None)
@given(
    port=st.integers(1, 60000),
    servers=st.integers(1, 8),
    mode=st.sampled_from(list(Mode)),
    max_response=_maybe(st.integers(0, 1 << 30)),
    grpc=grpc_flags(),
)
def test_a_serve_spec_made_into_flags_and_parsed_again_is_the_same_spec(
    port: int, servers: int, mode: Mode, max_response: int | None, grpc: GrpcFlags
) -> None:
    spec = ServeSpec(
        host="0.0.0.0",
        port=port,
        mode=mode,
        servers=servers,
        max_response_bytes=max_response,
        token_file="token",
        grpc=grpc,
    )
    parser = argparse.ArgumentParser()
    cli_flags.configure_serve(parser)
    assert cli_flags.serve_spec(parser.parse_args(spec.to_argv())) == spec


def test_defaults_make_no_flags_and_the_flags_name_their_fields() -> None:
    assert ReplaySpec().to_argv() == []
    assert ReplaySpec(procs_per_worker=None).to_argv() == ["--procs-per-worker=auto"]
    assert ReplaySpec(benchmarks=(Benchmark.PS_THROUGHPUT,)).to_argv() == [
        "--benchmark=ps-throughput"
    ]
    assert flag_of("warmup_s") == "--warmup"
    assert flag_of("max_message_bytes") == "--max-message-size"
    assert flag_of("procs_per_worker") == "--procs-per-worker"


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"trace": "x", "synthetic": True}, UsageError, "give a TRACE or --synthetic"),
        ({"runs": 0}, ConfigError, "^--runs must be in 1..1000000, got 0$"),
        ({"warmup_s": float("inf")}, ConfigError, "^--warmup must be in"),
        ({"duration_s": 1.0, "passes": 1}, UsageError, "alternatives"),
        ({"targets": ("nohost",)}, ConfigError, "^--target 'nohost'"),
        ({"time_dilation": 0.5}, ConfigError, "--time-dilation"),
        ({"procs_per_worker": 65}, ConfigError, "--procs-per-worker"),
        ({"client_netns": (("ps", "a"), ("ps", "b"))}, UsageError, "given twice"),
        ({"grpc": {"channels": 0}}, ConfigError, "--channels"),
    ],
)
def test_a_spec_refuses_what_no_machine_could_replay(
    fields: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        if "grpc" in fields:
            GrpcFlags(**fields["grpc"])  # type: ignore[arg-type]
        else:
            ReplaySpec(**fields)  # type: ignore[arg-type]


def test_network_compare_hands_each_replay_the_users_flags_less_its_own() -> None:
    spec = ReplaySpec(
        synthetic=True,
        targets=("h:1",),
        output_dir="elsewhere",
        quiet=True,
        time_dilation=4.0,
        procs_per_server=2,
        grpc=GrpcFlags(tls=True, tls_dir="tls", channels=2),
        runs=3,
    )
    assert replay_arguments(spec) == ["--synthetic", "--runs=3", "--channels=2"]
    assert serve_arguments(spec) == ["--procs-per-server=2", "--channels=2"]


# -- planning, for a made-up machine ---------------------------------------------------------


def _trace_path(tmp_path: Path, **shape: int) -> Path:
    return trace_files.write_trace(make_trace(**shape), tmp_path / "toy.tfgbtrace")


def test_planning_takes_this_machine_as_a_host(tmp_path: Path) -> None:
    path = str(_trace_path(tmp_path, workers=2, ps=1))
    spec = ReplaySpec(trace=path, benchmarks=(Benchmark.PS_THROUGHPUT,), procs_per_worker=None)
    roomy = request.plan(spec, request.Host(name="here", cores=9))
    # auto: the host's 9 cores less the one local server, shared by the 2 workers.
    assert roomy.procs_per_worker == 4
    assert request.plan(spec, request.Host(name="here", cores=1)).procs_per_worker == 1
    # Memory: a host with room for nothing in flight refuses before anything runs.
    tight = host.MemoryRoom(available_bytes=1, bound="a made-up cgroup")
    with pytest.raises(ConfigError, match=r"memory this process may take \(bounded by a made-up"):
        request.plan(spec, request.Host(name="here", memory=tight))
    # Client namespaces need root on the host (and a namespace that is there).
    placed = dataclasses.replace(spec, targets=("h:1",), client_netns=(("ps", "tfgb-none"),))
    with pytest.raises((NetworkError, UsageError)):
        request.plan(placed, request.Host(name="here", root=True))
    assert roomy.config["procs_per_worker"] == "auto"
    # The default engine is auto, resolved where the benchmarks run (``engine_named``).
    assert roomy.engine == DEFAULT_ENGINE == "auto"


def test_planning_names_an_unknown_engine(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--engine 'warp': expected one of grpcio"):
        request.plan(ReplaySpec(synthetic=True, engine="warp"), request.Host(name="here"))


def test_role_shapes_a_synthetic_workload_like_its_cluster_with_replace() -> None:
    placement = parse_tf_config(
        '{"cluster": {"ps": ["a:1", "b:1"], "worker": ["c:1", "d:1", "e:1"]}, '
        '"task": {"type": "worker", "index": 0}}'
    )
    spec = ReplaySpec(synthetic=True, targets=("x:1",))
    shaped = role.shaped_like(placement, spec)
    assert shaped == dataclasses.replace(spec, targets=None, workers=3, ps=2)
    asked = dataclasses.replace(spec, workers=1)
    assert role.shaped_like(placement, asked).workers == 1


def test_every_benchmark_has_a_row_and_all_means_the_table() -> None:
    assert ReplaySpec().benchmarks == tuple(s.benchmark for s in benchmarks.registered())


def test_every_command_is_an_object_its_module_defines_under_the_name_the_table_gives() -> None:
    from tf_grpc_bench import cli

    for names, load in cli.COMMAND_MODULES:
        commands = load()
        assert tuple(command.name for command in commands) == names
        assert all(command.help and callable(command.run) for command in commands)
    assert len(set(cli.COMMAND_NAMES)) == len(cli.COMMAND_NAMES)
