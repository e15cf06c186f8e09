"""Mutation testing of the modules that decide results, one module at a time, with mutmut.

Usage (from the repository root, in the test venv; mutmut comes with the ``test`` extra)::

    .venv/bin/python bench/mutation.py                 # every listed module, one after another
    .venv/bin/python bench/mutation.py generators trace  # only these
    .venv/bin/python bench/mutation.py --list            # the modules and the tests each one runs
    .venv/bin/python bench/mutation.py physics --survivors  # also print every survivor's diff

mutmut imports the code it mutates by the file's path, so the repository's
folders (``src/tf_grpc_bench``, ``replay/``, ``profiler/``, ... mapped onto one
package by setuptools) cannot be mutated in place.  For each module the script
lays out the installed package as plain folders under
``build/mutation/<module>/src/tf_grpc_bench/`` with a copy of ``tests/``, writes a
``pyproject.toml`` naming the one file to mutate and the few fast test files
that pin it, and runs ``mutmut run`` there.  mutmut then runs, for each
mutant, only the selected tests that call the mutated function.

The score is killed / (all mutants - skipped): a mutant that no selected test
reaches counts as a survivor, a timeout as killed.  Each module's figures go to
``build/mutation/<module>/score.json``, its surviving mutants to
``survivors.txt`` beside it; the table at the end is what docs/testing.md
shows.  Exit status: 0 when every module run reached ``--floor`` (85% by
default), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutation"
#: Repository folders that become subpackages of ``tf_grpc_bench`` when installed.
SUBPACKAGES = ("replay", "profiler", "protos", "models", "traces")
DEFAULT_FLOOR = 85.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One module to mutate: its path in the repository and the test files that pin it."""

    path: str
    tests: tuple[str, ...]
    #: Which of the tests run (pytest -m): by default neither TensorFlow nor namespaces.
    markers: str = "not tensorflow and not netns"


#: The modules that decide results, with the fast tests that pin each.  Keep a
#: module's test list to files that run in seconds without TensorFlow or root.
TARGETS: dict[str, Target] = {
    "trace": Target(path="src/tf_grpc_bench/trace.py", tests=("tests/test_trace.py",)),
    "sizes": Target(path="src/tf_grpc_bench/sizes.py", tests=("tests/test_sizes.py",)),
    "generators": Target(path="replay/core/generators.py", tests=("tests/test_generators.py",)),
    "workload": Target(
        path="replay/core/workload.py", tests=("tests/test_workload.py", "tests/test_chunking.py")
    ),
    "messages": Target(path="replay/core/messages.py", tests=("tests/test_workload.py",)),
    "trace_workload": Target(
        path="replay/core/trace_workload.py", tests=("tests/test_workload.py",)
    ),
    "trace_mapping": Target(
        path="src/tf_grpc_bench/trace_mapping.py", tests=("tests/test_workload.py",)
    ),
    "pacing": Target(path="replay/core/pacing.py", tests=("tests/test_pacing.py",)),
    "dependencies": Target(
        path="src/tf_grpc_bench/dependencies.py", tests=("tests/test_dependencies.py",)
    ),
    "dependency_tracker": Target(
        path="src/tf_grpc_bench/dependency_tracker.py", tests=("tests/test_dependencies.py",)
    ),
    "critical_path": Target(
        path="src/tf_grpc_bench/critical_path.py",
        tests=("tests/test_dependencies.py", "tests/test_workload.py"),
    ),
    "measurement": Target(
        path="replay/core/measurement.py",
        tests=("tests/test_measurement.py", "tests/test_machine_cpu.py"),
    ),
    "chunking": Target(path="replay/core/chunking.py", tests=("tests/test_chunking.py",)),
    "statistics": Target(path="replay/output/statistics.py", tests=("tests/test_measurement.py",)),
    "document": Target(path="replay/output/document.py", tests=("tests/test_document.py",)),
    "document_reader": Target(
        path="replay/output/document_reader.py", tests=("tests/test_document.py",)
    ),
    "document_writer": Target(
        path="replay/output/document_writer.py", tests=("tests/test_document.py",)
    ),
    "prediction": Target(path="replay/output/prediction.py", tests=("tests/test_document.py",)),
    "run_directories": Target(
        path="replay/output/run_directories.py", tests=("tests/test_document.py",)
    ),
    "physics": Target(path="profiler/physics.py", tests=("tests/test_physics.py",)),
    "http2": Target(path="profiler/recorders/http2.py", tests=("tests/test_http2_follower.py",)),
    "calls": Target(path="profiler/recorders/calls.py", tests=("tests/test_calls.py",)),
    "rpcs": Target(
        path="profiler/assembly/rpcs.py", tests=("tests/test_assembly.py", "tests/test_capture.py")
    ),
    "steps": Target(
        path="profiler/assembly/steps.py",
        tests=("tests/test_steps.py", "tests/test_assembly.py", "tests/test_capture.py"),
    ),
    # Its tests decode messages that TensorFlow's own protobuf modules wrote (imported,
    # nothing trained): they run too.
    "tf_messages": Target(
        path="profiler/assembly/tf_messages.py",
        tests=("tests/test_tf_messages.py",),
        markers="not netns",
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class HandMutant:
    """A small bug put in by hand (issue 15), and the test file that must catch it."""

    name: str
    path: str
    original: str
    mutated: str
    tests: str


#: The bugs that once survived the suite; ``--named`` checks that each is now caught.
HAND_MUTANTS = (
    HandMutant(
        name="trace: a binary trace's version checked with > max instead of not in",
        path="src/tf_grpc_bench/trace.py",
        original="    if message.format_version not in READABLE_VERSIONS:",
        mutated="    if message.format_version > max(READABLE_VERSIONS):",
        tests="tests/test_trace.py",
    ),
    HandMutant(
        name="trace: a JSON trace's version checked with > max instead of not in",
        path="src/tf_grpc_bench/trace.py",
        original="    if version not in READABLE_VERSIONS:",
        mutated="    if version > max(READABLE_VERSIONS):",
        tests="tests/test_trace.py",
    ),
    HandMutant(
        name="generators: two-category skew 3:1 instead of 2:1",
        path="replay/core/generators.py",
        original="        return tuple(zip(ordered, SKEW_SHARES, strict=False))",
        mutated="        return tuple(zip(ordered, SKEW_SHARES if len(ordered) != 2 else (6, 2), "
        "strict=False))",
        tests="tests/test_generators.py",
    ),
    HandMutant(
        name="generators: the deal order reversed",
        path="replay/core/generators.py",
        original="key=lambda i: (deficits[i], -i))",
        mutated="key=lambda i: (deficits[i], i))",
        tests="tests/test_generators.py",
    ),
    HandMutant(
        name="physics: extra bytes never flagged (-err > tol)",
        path="profiler/physics.py",
        original="        if abs(self.relative_error) > tolerance:",
        mutated="        if -self.relative_error > tolerance:",
        tests="tests/test_physics.py",
    ),
    HandMutant(
        name="physics: tolerance widened from 0.01 to 0.2",
        path="profiler/physics.py",
        original="DEFAULT_TOLERANCE = 0.01",
        mutated="DEFAULT_TOLERANCE = 0.2",
        tests="tests/test_physics.py",
    ),
    HandMutant(
        name="run measurement: lost server statistics with `and partial`",
        path="replay/transport/loop.py",
        original="    if stats is None and not partial:",
        mutated="    if stats is None and partial:",
        tests="tests/test_run_measurement.py",
    ),
    HandMutant(
        name="http2: padding checked with > left instead of > left - 1",
        path="profiler/recorders/http2.py",
        original="                if padding > self._left - 1:",
        mutated="                if padding > self._left:",
        tests="tests/test_http2_follower.py",
    ),
)


def run_hand_mutants() -> int:
    """Apply each hand mutant to a copy of the package and run its test file: 0 if all fail."""
    folder = _lay_out("named", Target(path="src/tf_grpc_bench/trace.py", tests=()), sys.executable)
    survivors = 0
    for mutant in HAND_MUTANTS:
        source = folder / "src" / _installed_path(mutant.path)
        original = source.read_text()
        if original.count(mutant.original) != 1:
            raise SystemExit(f"{mutant.path}: the text to mutate is gone: {mutant.original!r}")
        source.write_text(original.replace(mutant.original, mutant.mutated))
        try:
            finished = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-p",
                    "no:cacheprovider",
                    mutant.tests,
                ],
                cwd=folder,
                env={**os.environ, "PYTHONPATH": str(folder / "src")},
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            source.write_text(original)
        failed = [line for line in finished.stdout.splitlines() if line.startswith("FAILED")]
        caught = finished.returncode == 1 and bool(failed)
        survivors += not caught
        print(f"{'caught' if caught else 'SURVIVED'}: {mutant.name}", flush=True)
        if failed:
            print(f"    {failed[0][:150]}", flush=True)
    return 1 if survivors else 0


#: mutmut's exit codes per mutant, by what they mean for the score.
_KILLED = {1, 3, 36, 37, -24, 24, 152, 255}
_SURVIVED = {0, 5, 33}
_SKIPPED = {34}


def _installed_path(repository_path: str) -> Path:
    """Where a repository file sits in the installed package, relative to ``src/``."""
    first, _, rest = repository_path.partition("/")
    if first == "src":
        return Path(rest)
    return Path("tf_grpc_bench") / first / rest


def _lay_out(name: str, target: Target, python: str) -> Path:
    """A fresh folder holding the package as installed, the tests and mutmut's settings."""
    folder = WORK / name
    if folder.exists():
        shutil.rmtree(folder)
    package = folder / "src" / "tf_grpc_bench"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "build")
    shutil.copytree(ROOT / "src" / "tf_grpc_bench", package, ignore=ignore)
    for subpackage in SUBPACKAGES:
        shutil.copytree(ROOT / subpackage, package / subpackage, ignore=ignore)
    shutil.copytree(ROOT / "tests", folder / "tests", ignore=ignore)
    _fewer_examples(folder / "tests")
    mutated = "src/" + str(_installed_path(target.path))
    tests = ", ".join(json.dumps(t) for t in target.tests)
    (folder / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src/tf_grpc_bench"]\n'
        f"only_mutate = [{json.dumps(mutated)}]\n"
        f"pytest_add_cli_args_test_selection = [{tests}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-x", "-q", '
        f'"-m", {json.dumps(target.markers)}]\n'
        "\n"
        "[tool.pytest.ini_options]\n"
        'addopts = "--strict-markers"\n'
        'markers = ["tensorflow: real TensorFlow", "netns: network namespaces"]\n'
    )
    del python
    return folder


#: Examples per property test while mutants are tested: a mutant a property catches is
#: usually caught by its first examples; the full counts run in the test suite.
MUTATION_EXAMPLES = 8


def _fewer_examples(tests: Path) -> None:
    """Property tests of the copied suite draw ``MUTATION_EXAMPLES`` examples each."""
    for path in tests.glob("*.py"):
        text = path.read_text()
        fewer = re.sub(r"max_examples=\d+", f"max_examples={MUTATION_EXAMPLES}", text)
        if fewer != text:
            path.write_text(fewer)
    with (tests / "conftest.py").open("a") as conftest:
        conftest.write(
            "\n\nimport hypothesis as _hypothesis\n\n"
            "_hypothesis.settings.register_profile(\n"
            f'    "mutation", max_examples={MUTATION_EXAMPLES}, deadline=None, database=None\n'
            ")\n"
            '_hypothesis.settings.load_profile("mutation")\n'
        )


def _score(folder: Path, target: Target) -> dict[str, object]:
    meta = folder / "mutants" / ("src/" + str(_installed_path(target.path)) + ".meta")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    killed = sorted(k for k, c in codes.items() if c in _KILLED)
    survived = sorted(k for k, c in codes.items() if c in _SURVIVED or c is None)
    skipped = sorted(k for k, c in codes.items() if c in _SKIPPED)
    other = sorted(k for k in codes if k not in {*killed, *survived, *skipped})
    counted = len(codes) - len(skipped)
    return {
        "module": target.path,
        "mutants": len(codes),
        "killed": len(killed),
        "survived": len(survived),
        "skipped": len(skipped),
        "suspicious": len(other),
        "score_percent": round(100.0 * len(killed) / counted, 1) if counted else 100.0,
        "survivors": survived + other,
    }


#: Prints the diff of each mutant named on the command line, in one process.
_SHOW = """
import sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
from mutmut.stats import status_by_exit_code
for name in sys.argv[1:]:
    data = find_mutant(name)
    print(f"# {name}: {status_by_exit_code[data.exit_code_by_key[name]]}")
    print(get_diff_for_mutant(name, path=data.path))
    print()
"""


def _write_survivors(folder: Path, survivors: list[str]) -> None:
    """``survivors.txt``: every surviving mutant's diff (what ``mutmut show`` prints)."""
    with (folder / "survivors.txt").open("w") as report:
        if survivors:
            subprocess.run(
                [sys.executable, "-c", _SHOW, *survivors],
                cwd=folder,
                stdout=report,
                stderr=subprocess.STDOUT,
                check=False,
            )


def run_module(name: str, target: Target, *, jobs: int, show: bool) -> dict[str, object]:
    """Mutate one module and run its tests against every mutant; return its figures."""
    python = sys.executable
    folder = _lay_out(name, target, python)
    mutmut = [python, "-m", "mutmut"]
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    log = folder / "mutmut.log"
    with log.open("w") as output:
        finished = subprocess.run(
            [*mutmut, "run", "--max-children", str(jobs)],
            cwd=folder,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if finished.returncode != 0:
        raise SystemExit(f"mutmut failed on {target.path} (see {log})")
    result = _score(folder, target)
    result["seconds"] = round(time.monotonic() - started)
    result["tests"] = list(target.tests)
    (folder / "score.json").write_text(json.dumps(result, indent=1) + "\n")
    _write_survivors(folder, result["survivors"])  # type: ignore[arg-type]
    if show:
        print((folder / "survivors.txt").read_text())
    return result


def _table(results: list[dict[str, object]]) -> str:
    lines = [
        "| module | mutants | killed | survived | score | tests | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tests = ", ".join(Path(t).name for t in r["tests"])  # type: ignore[attr-defined]
        lines.append(
            f"| `{r['module']}` | {r['mutants']} | {r['killed']} | "
            f"{int(r['survived']) + int(r['suspicious'])} | {r['score_percent']}% | "  # type: ignore[call-overload]
            f"{tests} | {r['seconds']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("modules", nargs="*", help=f"any of: {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests")
    parser.add_argument(
        "--jobs", type=int, default=2, help="mutants tested at once (default: 2, the cores here)"
    )
    parser.add_argument("--floor", type=float, default=DEFAULT_FLOOR, help="score to reach (%%)")
    parser.add_argument("--survivors", action="store_true", help="print every survivor's diff")
    parser.add_argument(
        "--table",
        action="store_true",
        help="instead: the table of each module's last run (build/mutation/*/score.json)",
    )
    parser.add_argument(
        "--named",
        action="store_true",
        help="instead: check that each of issue 15's hand-made mutants is caught",
    )
    arguments = parser.parse_args(argv)
    unknown = [m for m in arguments.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module {unknown[0]!r} (expected one of: {', '.join(TARGETS)})")
    if arguments.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {arguments.jobs}")
    if arguments.named:
        return run_hand_mutants()
    names = arguments.modules or list(TARGETS)
    if arguments.table:
        stored = [WORK / name / "score.json" for name in names]
        print(_table([json.loads(path.read_text()) for path in stored if path.exists()]))
        return 0
    if arguments.list:
        for name in names:
            print(f"{name}: {TARGETS[name].path} <- {' '.join(TARGETS[name].tests)}")
        return 0
    results = []
    for name in names:
        result = run_module(name, TARGETS[name], jobs=arguments.jobs, show=arguments.survivors)
        print(
            f"{name}: {result['killed']}/{result['mutants']} killed, "
            f"{result['score_percent']}% ({result['seconds']} s)",
            flush=True,
        )
        results.append(result)
    print(_table(results))
    below = [r for r in results if float(r["score_percent"]) < arguments.floor]  # type: ignore[arg-type]
    for r in below:
        print(f"below {arguments.floor}%: {r['module']} ({r['score_percent']}%)", file=sys.stderr)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
