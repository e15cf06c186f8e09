"""Which engine a command runs on: ``--engine auto`` (the default), an explicit choice, a
host without gRPC C++, ``tf-grpc-bench engine``, and clients of one engine against
servers of the other.  Commands run as a user runs them: subprocesses, output, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.native.build import find_library
from tf_grpc_bench.replay.output.document_reader import read_document

from .engines import grpc_cpp_program
from .test_placement import free_ports, start_task

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))
TINY = ["--synthetic", "--benchmark", "p2p-latency", "--duration", "0.2", "--warmup", "0",
        "--runs", "1", "--quiet"]  # fmt: skip


def _run(
    *arguments: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip


def _without_grpc_cpp(tmp_path: Path) -> dict[str, str]:
    """An environment in which pkg-config finds no gRPC C++ and nothing is built yet."""
    empty = tmp_path / "no-pkg-config"
    empty.mkdir()
    return {
        **os.environ,
        "PKG_CONFIG_LIBDIR": str(empty),
        "PKG_CONFIG_PATH": "",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }


def _parameters(stdout: str, cwd: Path) -> dict[str, object]:
    """The first benchmark's parameters of the results the command wrote."""
    line = next(line for line in stdout.splitlines() if line.startswith("results: "))
    document = read_document(cwd / line.removeprefix("results: ").strip())
    return dict(document.benchmarks[0].parameters)


def test_without_grpc_cpp_auto_takes_grpcio_and_says_so_and_an_explicit_choice_is_one_line(
    tmp_path: Path,
) -> None:
    env = _without_grpc_cpp(tmp_path)
    status = _run("engine", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    assert "grpc-cpp: unavailable" in status.stdout and "libgrpc++-dev" in status.stdout
    assert status.stdout.splitlines()[-1] == "--engine auto takes grpcio"

    # auto is the default. Said on stderr only where that is a terminal; the table and the
    # results say it.
    auto = _run("replay", *TINY[:-1], cwd=tmp_path, env=env)
    assert auto.returncode == 0 and auto.stderr == "", auto.stderr
    assert "\nengine:  grpcio (gRPC " in auto.stdout
    assert _parameters(auto.stdout, tmp_path)["engine"] == "grpcio"

    for command in (["replay", *TINY, "--engine", "grpc-cpp"], ["engine", "build"]):
        refused = _run(*command, cwd=tmp_path, env=env)
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert "--engine grpc-cpp" in lines[0] and "apt-get install libgrpc++-dev" in lines[0]
    assert len(list((tmp_path / "runs").glob("*/results.json"))) == 1  # the auto run's alone


def test_with_grpc_cpp_auto_takes_it_says_so_and_the_results_name_it(tmp_path: Path) -> None:
    grpc_cpp_program()  # a skip, saying why, where it cannot be built
    version = find_library().version
    status = _run("engine", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert f"grpc-cpp: built with gRPC C++ {version}" in status.stdout
    assert status.stdout.splitlines()[-1] == "--engine auto takes grpc-cpp"

    for auto in (
        _run("replay", *TINY[:-1], cwd=tmp_path),  # the default
        _run("replay", *TINY[:-1], "--engine", "auto", cwd=tmp_path),
    ):
        assert auto.returncode == 0 and auto.stderr == "", auto.stderr
        assert f"\nengine:  grpc-cpp (gRPC {version})" in auto.stdout
        parameters = _parameters(auto.stdout, tmp_path)
        assert (parameters["engine"], parameters["grpc_version"]) == ("grpc-cpp", version)


def test_a_replay_in_chunks_runs_on_the_engine_auto_takes(tmp_path: Path) -> None:
    # Both engines bound a payload's chunks together by --deadline: --chunk-size sets
    # neither aside.
    grpc_cpp_program()  # a skip, saying why, where it cannot be built
    version = find_library().version
    chunked = [*TINY[:-1], "--categories", "large", "--chunk-size", "256KB"]
    auto = _run("replay", *chunked, cwd=tmp_path)
    assert auto.returncode == 0 and auto.stderr == "", auto.stderr
    assert f"\nengine:  grpc-cpp (gRPC {version})" in auto.stdout
    parameters = _parameters(auto.stdout, tmp_path)
    assert (parameters["engine"], parameters["chunk_bytes"]) == ("grpc-cpp", 256 * 1024)


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``tf-grpc-bench serve --engine NAME`` on a free port: (its engine, its target)."""
    engine = request.param
    if engine == "grpc-cpp":
        grpc_cpp_program()
    server = subprocess.Popen(
        [COMMAND, "serve", "--host", "127.0.0.1", "--port", "0", "--engine", engine],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("serving "), line + (server.stderr.read() if server.stderr else "")
        assert (" with grpc-cpp " in line) == (engine == "grpc-cpp")
        target = line.split(" on ", 1)[1].split()[0]
        yield engine, target
    finally:
        server.terminate()
        server.communicate(timeout=60)


@pytest.mark.parametrize("served", ["grpcio", "grpc-cpp"], indirect=True)
def test_a_client_of_either_engine_replays_against_a_server_of_the_other(
    served: tuple[str, str], tmp_path: Path
) -> None:
    server_engine, target = served
    client_engine = "grpcio" if server_engine == "grpc-cpp" else "grpc-cpp"
    grpc_cpp_program()
    done = _run("replay", *TINY, "--target", target, "--engine", client_engine, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    parameters = _parameters(done.stdout, tmp_path)
    assert parameters["engine"] == client_engine
    expected = find_library().version if client_engine == "grpc-cpp" else None
    if expected is not None:
        assert parameters["grpc_version"] == expected


@pytest.mark.parametrize("ps_engine", ["grpc-cpp", "grpcio"])
def test_a_role_cluster_mixes_engines_task_by_task(ps_engine: str, tmp_path: Path) -> None:
    grpc_cpp_program()
    other = "grpcio" if ps_engine == "grpc-cpp" else "grpc-cpp"
    chief, ps, worker0, worker1 = (f"127.0.0.1:{p}" for p in free_ports(4))
    cluster = {"chief": [chief], "ps": [ps], "worker": [worker0, worker1]}
    # Worker 0 calls the ps across engines, worker 1 with the ps's own.
    engines = {"chief:0": other, "ps:0": ps_engine, "worker:0": other, "worker:1": ps_engine}
    processes = {
        task: start_task(cluster, task, tmp_path, "--engine", engine)
        for task, engine in engines.items()
    }
    outcomes = {}
    try:
        for task, process in processes.items():
            stdout, stderr = process.communicate(timeout=300)
            outcomes[task] = (process.returncode, stdout, stderr)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    for task, (code, stdout, stderr) in outcomes.items():
        assert code == 0, f"{task}: {stdout}{stderr}"
    document = read_document(next(tmp_path.glob("*/results.json")))
    assert not document.partial
    throughput = next(r for r in document.benchmarks if r.benchmark is Benchmark.PS_THROUGHPUT)
    assert {s.worker_index for run in throughput.runs for s in run.samples} == {0, 1}
