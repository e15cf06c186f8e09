"""Mutation testing of the result path, one module at a time: mutmut's operators and our own.

Usage (from the repository root, in the test venv; mutmut comes with the ``test`` extra).
Runs are long and CPU-heavy: on a shared machine run them one module at a time, niced::

    nice -n 10 .venv/bin/python bench/mutation.py report       # one module (or several)
    .venv/bin/python bench/mutation.py --list                  # modules, tests, table state
    .venv/bin/python bench/mutation.py --stale                 # modules whose row is not current
    .venv/bin/python bench/mutation.py --named                 # the hand-made bugs, each caught
    .venv/bin/python bench/mutation.py report --no-swaps       # mutmut's operators only

The modules are ``mutation_targets.TARGETS``: everything from the samples to a figure
a user reads.  mutmut imports the code it mutates by the file's path, so the
repository's folders (``src/tf_grpc_bench``, ``replay/``, ``profiler/``, ... mapped
onto one package by setuptools) cannot be mutated in place.  For each module the
script lays out the installed package as plain folders under
``build/mutation/<module>/src/tf_grpc_bench/`` with a copy of ``tests/``, writes a
``pyproject.toml`` naming the one file to mutate and the few fast test files that
pin it, and runs ``mutmut run`` there (only the named functions' mutants for a
module listing some); mutmut runs, for each mutant, only the selected tests that
call the mutated function.

Then our own operators, for bugs mutmut cannot make (``swap_mutants``): an attribute
read swapped for another of the same kind (a call's start for its end, a request's
bytes for its response's, the p90 for the p99, the caller for the callee), and the
sign of an offset or origin flipped.  Each is put into the laid-out copy and the
module's test files run against it.

The score is killed / (all mutants - skipped), mutmut's and ours together: a mutant
that no selected test reaches counts as a survivor, a timeout as killed.  Every mutant
has a time limit a few times its tests' unmutated time (``TIMEOUT_MULTIPLIER``,
``TIMEOUT_CONSTANT_S``; ``OUR_TIMEOUT_FACTOR`` for the runs this script makes itself):
a mutant that loops forever costs a minute or two, not mutmut's default quarter of an
hour, and is listed as timed out.  mutmut sees
only calls made in the test process: for a module whose functions run in the
processes a test starts (``Target.in_children``: the replay's workers), each mutant
it did not kill is put into the laid-out copy and the module's test files are
run against it, as our operators are.  Each
module's figures go to ``build/mutation/<module>/score.json``, its survivors to
``survivors.txt`` beside it, and its row of the table in docs/testing.md (the commit
measured and the hash of the code; ``mutation_table``).  Exit status: 0 when every
module run reached ``--floor`` (85% by default), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

import mutation_table
from mutation_targets import HAND_MUTANTS, TARGETS, Target

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutation"
DOCS = ROOT / "docs" / "testing.md"
#: Repository folders that become subpackages of ``tf_grpc_bench`` when installed.
SUBPACKAGES = ("replay", "profiler", "protos", "models", "traces")
DEFAULT_FLOOR = 85.0
#: Examples per property test while mutants are tested: a mutant a property catches is
#: usually caught by its first examples; the full counts run in the test suite.
MUTATION_EXAMPLES = 8
#: Set for mutmut's run: the copied tests' conftest then loads TensorFlow before it forks.
PRELOAD = "TF_GRPC_BENCH_MUTATION_PRELOAD"
#: Attributes of one kind: reading one where another was meant gives a wrong figure,
#: not a crash, and mutmut has no operator for it.
SWAP_FAMILIES = (
    ("start_ns", "response_start_ns", "end_ns"),
    ("request_bytes", "response_bytes", "payload_bytes"),
    ("server_index", "worker_index"),
    ("caller_task", "callee_task"),
    ("mean_ns", "min_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns"),
    ("lower_ns", "upper_ns"),
    ("before_ns", "after_ns"),
    ("client_cpu_ns", "server_cpu_ns"),
    ("rpcs_per_s", "bytes_per_s", "bandwidth_mb_per_s"),
    ("step_times_ns", "step_compute_ns"),
    ("machine_cpu_busy_ticks", "machine_cpu_total_ticks"),
    ("latency_ns", "release_lag_ns"),
)
#: Names whose sign decides a figure: ``+ offset`` made ``- offset`` and back.
SIGNED = re.compile(r"offset|origin")
#: mutmut's time limit of a mutant: (the unmutated time of the tests it runs against it +
#: TIMEOUT_CONSTANT_S) x TIMEOUT_MULTIPLIER of wall time, twice that of CPU time.  mutmut's
#: default (x15, + 1 s) let a mutant that loops forever run five minutes and more.
TIMEOUT_MULTIPLIER = 4.0
TIMEOUT_CONSTANT_S = 5.0
#: The runs this script makes itself (our operators, mutants run in the tests' children):
#: this many times the unmutated run of the module's test files, at least a minute.
OUR_TIMEOUT_FACTOR = 4.0
OUR_TIMEOUT_FLOOR_S = 60.0


def _installed_path(repository_path: str) -> Path:
    """Where a repository file sits in the installed package, relative to ``src/``."""
    first, _, rest = repository_path.partition("/")
    if first == "src":
        return Path(rest)
    return Path("tf_grpc_bench") / first / rest


def _module_name(repository_path: str) -> str:
    return str(_installed_path(repository_path).with_suffix("")).replace("/", ".")


def _mangled(function: str) -> str:
    """mutmut's name of a top-level function (``x_<name>``) or a method ``Class.method``
    (``xǁ<class>ǁ<name>``)."""
    owner, _, name = function.rpartition(".")
    return f"x\u01c1{owner}\u01c1{name}" if owner else f"x_{name}"


def _patterns(target: Target) -> list[str]:
    """mutmut's names of the mutants of ``target``'s listed functions (empty: all)."""
    module = _module_name(target.path)
    return [f"{module}.{_mangled(function)}__mutmut_*" for function in target.functions]


def _lay_out(name: str, target: Target) -> Path:
    """A fresh folder holding the package as installed, the tests and mutmut's settings."""
    folder = WORK / name
    if folder.exists():
        shutil.rmtree(folder)
    package = folder / "src" / "tf_grpc_bench"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "build")
    shutil.copytree(ROOT / "src" / "tf_grpc_bench", package, ignore=ignore)
    for subpackage in SUBPACKAGES:
        shutil.copytree(ROOT / subpackage, package / subpackage, ignore=ignore)
    # The tests, and the bench scripts some of them load from their files.
    shutil.copytree(ROOT / "tests", folder / "tests", ignore=ignore)
    shutil.copytree(ROOT / "bench", folder / "bench", ignore=ignore)
    _fewer_examples(folder / "tests")
    mutated = "src/" + str(_installed_path(target.path))
    tests = ", ".join(json.dumps(t) for t in target.tests)
    (folder / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src/tf_grpc_bench"]\n'
        f"only_mutate = [{json.dumps(mutated)}]\n"
        'also_copy = ["bench"]\n'
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}\n"
        f"timeout_constant = {TIMEOUT_CONSTANT_S}\n"
        f"pytest_add_cli_args_test_selection = [{tests}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-x", "-q", '
        f'"-m", {json.dumps(target.markers)}]\n'
        "\n"
        "[tool.pytest.ini_options]\n"
        'addopts = "--strict-markers"\n'
        'markers = ["tensorflow: real TensorFlow", "netns: network namespaces", '
        '"slurm: a single-machine Slurm"]\n'
    )
    return folder


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
            # TensorBoard's event reader loads TensorFlow on first use (seconds): under
            # mutmut, loaded here, once, before it forks a process per mutant, not in each
            # of them (our own mutants run in fresh processes: nothing to share there).
            "\n\nimport os as _os\n\n"
            f'if _os.environ.get("{PRELOAD}"):\n'
            "    try:\n"
            "        from tensorboard.compat import tf as _tf\n\n"
            "        _tf.io  # noqa: B018\n"
            "    except ImportError:\n"
            "        pass\n"
        )


# --------------------------------------------------------------------------
# mutmut's operators.

#: mutmut's exit codes per mutant, by what they mean for the score.
_KILLED = {1, 3, 36, 37, -24, 24, 152, 255}
#: Those of them that say the mutant ran past its time limit (SIGXCPU, mutmut's timeout).
_TIMED_OUT = {36, -24, 24, 152, 255}
_SURVIVED = {0, 5, 33}
_SKIPPED = {34}


def _mutmut_codes(folder: Path, target: Target) -> dict[str, int | None]:
    meta = folder / "mutants" / ("src/" + str(_installed_path(target.path)) + ".meta")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    patterns = _patterns(target)
    if patterns:
        import fnmatch

        codes = {k: c for k, c in codes.items() if any(fnmatch.fnmatch(k, p) for p in patterns)}
    return codes


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


def run_mutmut(folder: Path, target: Target, jobs: int) -> dict[str, list[str]]:
    """mutmut over ``target`` in ``folder``: its mutants' names by outcome."""
    log = folder / "mutmut.log"
    with log.open("w") as output:
        finished = subprocess.run(
            [
                sys.executable,
                "-m",
                "mutmut",
                "run",
                "--max-children",
                str(jobs),
                *_patterns(target),
            ],
            cwd=folder,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", PRELOAD: "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if finished.returncode != 0:
        raise SystemExit(f"mutmut failed on {target.path} (see {log})")
    codes = _mutmut_codes(folder, target)
    outcome: dict[str, list[str]] = {"killed": [], "survived": [], "skipped": [], "timeouts": []}
    unwatched = []
    for key, code in sorted(codes.items()):
        if code in _KILLED:
            outcome["killed"].append(key)
            if code in _TIMED_OUT:
                outcome["timeouts"].append(key)
        elif code in _SKIPPED:
            outcome["skipped"].append(key)
        elif target.in_children:
            # mutmut runs its mutants in the test process only: one that survived there,
            # or that no test reached, may be killed in the processes the tests start.
            unwatched.append(key)
        else:  # survived, not reached (None) or an exit code mutmut calls suspicious
            outcome["survived"].append(key)
    for key in unwatched:
        status = _run_in_children(folder, target, key)
        outcome["survived" if status in (0, 5) else "killed"].append(key)
        if status is None:
            outcome["timeouts"].append(key)
    for kind, listed in (("survivors", outcome["survived"]), ("timeouts", outcome["timeouts"])):
        with (folder / f"{kind}.txt").open("w") as report:
            if listed:
                subprocess.run(
                    [sys.executable, "-c", _SHOW, *listed],
                    cwd=folder,
                    stdout=report,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
    return outcome


def _run_in_children(folder: Path, target: Target, key: str) -> int | None:
    """Put mutmut's mutant ``key`` into the laid-out copy and run the module's test files
    against it in a fresh process, as our own operators are: the processes the tests
    start import the mutated copy.  pytest's exit status, None if it ran out of time."""
    limit = _time_limit(folder, target.tests, target.markers)
    path = folder / "src" / _installed_path(target.path)
    original = path.read_text()
    try:
        subprocess.run(
            [sys.executable, "-m", "mutmut", "apply", key],
            cwd=folder,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            stdout=subprocess.DEVNULL,
            check=True,
        )
        if path.read_text() == original:
            raise SystemExit(f"mutmut did not apply {key} to {path}")
        return _pytest(folder, target.tests, target.markers, limit)
    finally:
        path.write_text(original)


@functools.cache
def _time_limit(folder: Path, tests: tuple[str, ...], markers: str) -> float:
    """How long ``tests`` may run against one mutant this script puts into ``folder``:
    ``OUR_TIMEOUT_FACTOR`` times their unmutated run (timed here, once), at least
    ``OUR_TIMEOUT_FLOOR_S``.  A mutant that runs past it (a loop that no longer ends, a
    replay's worker that hangs) counts as killed, and is listed as timed out."""
    started = time.monotonic()
    if _pytest(folder, tests, markers, 3600) != 0:
        raise SystemExit(f"its tests fail unmutated in {folder}: {' '.join(tests)}")
    return max(OUR_TIMEOUT_FLOOR_S, OUR_TIMEOUT_FACTOR * (time.monotonic() - started))


# --------------------------------------------------------------------------
# Our own operators.


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapMutant:
    """One token of a module replaced: ``line`` (1-based), ``column``, what by what."""

    line: int
    column: int
    original: str
    replacement: str

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        assert text[self.column : self.column + len(self.original)] == self.original
        end = self.column + len(self.original)
        lines[self.line - 1] = text[: self.column] + self.replacement + text[end:]
        return "".join(lines)

    def describe(self, path: str) -> str:
        return f"{path}:{self.line}: {self.original} -> {self.replacement}"


def swap_mutants(source: str, functions: tuple[str, ...] = ()) -> list[SwapMutant]:
    """Every attribute read of ``SWAP_FAMILIES`` swapped for each other of its family, and
    every ``+``/``-`` before a name of an offset or origin flipped (inside ``functions``
    only, if given)."""
    family_of = {name: family for family in SWAP_FAMILIES for name in family}
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)
    ]
    spans = _function_lines(source, functions)
    found = []
    for index, token in enumerate(tokens):
        line, column = token.start
        if spans is not None and not any(a <= line <= b for a, b in spans):
            continue
        previous = tokens[index - 1] if index else None
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.type == tokenize.NAME and token.string in family_of:
            if previous is not None and previous.string == ".":
                found += [
                    SwapMutant(line=line, column=column, original=token.string, replacement=other)
                    for other in family_of[token.string]
                    if other != token.string
                ]
        elif token.type == tokenize.OP and token.string in ("+", "-"):
            binary = previous is not None and (
                previous.type in (tokenize.NAME, tokenize.NUMBER) or previous.string in ")]"
            )
            named = following is not None and following.type == tokenize.NAME
            if binary and named and SIGNED.search(following.string):  # type: ignore[union-attr]
                flipped = "-" if token.string == "+" else "+"
                found.append(
                    SwapMutant(line=line, column=column, original=token.string, replacement=flipped)
                )
    return found


def _function_lines(source: str, functions: tuple[str, ...]) -> list[tuple[int, int]] | None:
    """(first, last) line of each of ``functions`` in ``source``; None for no limit."""
    if not functions:
        return None
    import ast

    tree = ast.parse(source)
    nodes: list[ast.FunctionDef | ast.AsyncFunctionDef] = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name in functions
    ]
    nodes += [n for n in mutation_table.selected_functions(tree, functions) if n not in nodes]
    return [(node.lineno, node.end_lineno or node.lineno) for node in nodes]


def _pytest(folder: Path, tests: tuple[str, ...], markers: str, timeout_s: float) -> int | None:
    """Run ``tests`` in ``folder`` on its plain copy of the package: the exit status, None
    on a timeout.  The tests run in a session of their own, killed whole on a timeout: a
    mutant that hangs a test's child (a replay's worker, a TensorBoard) leaves nothing
    behind holding the output pipe open."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-m", markers, *tests],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(folder / "src"), "PYTHONDONTWRITEBYTECODE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _enclosing_functions(source: str, module: str) -> list[tuple[int, int, str]]:
    """(first line, last line, mutmut's name) of every function mutmut mutates in ``source``:
    top-level functions (``<module>.x_<name>``) and methods (``<module>.xǁ<class>ǁ<name>``)."""
    import ast

    spans = []
    for node in ast.parse(source).body:
        members = [(node, f"x_{getattr(node, 'name', '')}")]
        if isinstance(node, ast.ClassDef):
            members = [
                (item, f"x\u01c1{node.name}\u01c1{getattr(item, 'name', '')}") for item in node.body
            ]
        for item, name in members:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                spans.append((item.lineno, item.end_lineno or item.lineno, f"{module}.{name}"))
    return spans


def _tests_of(folder: Path, target: Target, source: str) -> dict[int, list[str] | None]:
    """For each line of ``source``, the tests mutmut saw call its function, fastest first
    (None: not in a function mutmut knows, run every test file)."""
    stats_path = folder / "mutants" / "mutmut-stats.json"
    if not stats_path.exists():
        return {}
    stats = json.loads(stats_path.read_text())
    by_function = stats["tests_by_mangled_function_name"]
    duration = stats.get("duration_by_test", {})
    # The functions mutmut mutated: it neither mutates nor watches a property or another
    # decorated function, whose tests it therefore cannot name.
    meta = folder / "mutants" / ("src/" + str(_installed_path(target.path)) + ".meta")
    mutated = {
        key.rsplit("__mutmut_", 1)[0] for key in json.loads(meta.read_text())["exit_code_by_key"]
    }
    lines: dict[int, list[str] | None] = {}
    for first, last, name in _enclosing_functions(source, _module_name(target.path)):
        tests: list[str] | None = None
        if name in mutated:
            tests = sorted(by_function.get(name, ()), key=lambda t: duration.get(t, 0.0))
        for line in range(first, last + 1):
            lines[line] = tests
    return lines


def run_swaps(folder: Path, target: Target) -> dict[str, list[str]]:
    """Our operators over ``target``: each mutant put into the laid-out copy in turn and
    the tests that call its function (as mutmut found them; the module's test files
    where mutmut says nothing: outside functions, in a property or another decorated
    function) run against it.  A mutant in a function mutmut saw no test call survives;
    a timeout counts as killed, and is listed as timed out."""
    path = folder / "src" / _installed_path(target.path)
    original = path.read_text()
    limit = _time_limit(folder, target.tests, target.markers)
    tests_of = _tests_of(folder, target, original)
    outcome: dict[str, list[str]] = {"killed": [], "survived": [], "timeouts": []}
    try:
        for mutant in swap_mutants(original, target.functions):
            tests = tests_of.get(mutant.line)
            if target.in_children:
                tests = None  # the tests that matter call it in processes they start
            if tests == []:
                outcome["survived"].append(mutant.describe(target.path))
                continue
            path.write_text(mutant.apply(original))
            status = _pytest(folder, tuple(tests or target.tests), target.markers, limit)
            killed = status is None or status not in (0, 5)
            outcome["killed" if killed else "survived"].append(mutant.describe(target.path))
            if status is None:
                outcome["timeouts"].append(mutant.describe(target.path))
    finally:
        path.write_text(original)
    return outcome


# --------------------------------------------------------------------------
# Runs, the table, the hand-made bugs.


def _git(*arguments: str) -> str:
    return subprocess.run(
        ["git", *arguments], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def run_module(name: str, target: Target, *, jobs: int, swaps: bool) -> dict[str, object]:
    """Mutate one module, run its tests against every mutant; its figures (and its row)."""
    source = (ROOT / target.path).read_text()
    # The commit of the code measured: the last one that changed the module (it stays
    # the same when the branch it was measured on is rebased and merged).
    commit = _git("log", "-1", "--format=%h", "HEAD", "--", target.path)
    if _git("status", "--porcelain", "--", target.path):
        commit += " (uncommitted changes)"
    folder = _lay_out(name, target)
    started = time.monotonic()
    mutmut = run_mutmut(folder, target, jobs)
    ours = run_swaps(folder, target) if swaps else {"killed": [], "survived": [], "timeouts": []}
    killed = len(mutmut["killed"]) + len(ours["killed"])
    survived = len(mutmut["survived"]) + len(ours["survived"])
    result: dict[str, object] = {
        "module": target.path,
        "functions": list(target.functions),
        "mutants": killed + survived + len(mutmut["skipped"]),
        "killed": killed,
        "survived": survived,
        "skipped": len(mutmut["skipped"]),
        "swaps_killed": len(ours["killed"]),
        "swaps": len(ours["killed"]) + len(ours["survived"]),
        "score": mutation_table.percent(killed, killed + survived),
        "tests": list(target.tests),
        "commit": commit,
        "code": mutation_table.code_hash(source, target.functions),
        "seconds": round(time.monotonic() - started),
        "survivors": mutmut["survived"],
        "swap_survivors": ours["survived"],
        # Counted killed: each ran past its time limit (its diff in timeouts.txt).
        "timeouts": mutmut["timeouts"] + ours["timeouts"],
    }
    (folder / "score.json").write_text(json.dumps(result, indent=1) + "\n")
    with (folder / "survivors.txt").open("a") as report:
        report.writelines(f"# swap survived: {line}\n" for line in ours["survived"])
    with (folder / "timeouts.txt").open("a") as report:
        report.writelines(f"# swap timed out: {line}\n" for line in ours["timeouts"])
    return result


def table_row(result: dict[str, object]) -> mutation_table.Row:
    module = str(result["module"])
    functions = result["functions"]
    if functions:
        module += " (" + ", ".join(f"{f}" for f in functions) + ")"  # type: ignore[attr-defined]
    swaps = f"{result['swaps_killed']}/{result['swaps']}" if result["swaps"] else "-"
    return mutation_table.Row(
        module=module,
        mutants=str(result["mutants"]),
        killed=str(result["killed"]),
        survived=str(result["survived"]),
        score=str(result["score"]),
        swaps=swaps,
        tests=", ".join(Path(t).name for t in result["tests"]),  # type: ignore[attr-defined]
        commit=str(result["commit"]),
        code=str(result["code"]),
    )


def row_module(target: Target) -> str:
    """How the table names a target: its path, and its functions when it lists some."""
    return target.path + (f" ({', '.join(target.functions)})" if target.functions else "")


def stale_targets() -> list[str]:
    """The targets whose row is missing or measured another code than the module's now."""
    rows = {row.module: row for row in mutation_table.parse_rows(DOCS.read_text())}
    stale = []
    for name, target in TARGETS.items():
        row = rows.get(row_module(target))
        code = mutation_table.code_hash((ROOT / target.path).read_text(), target.functions)
        if row is None or row.code != code:
            stale.append(name)
    return stale


def run_hand_mutants() -> int:
    """Apply each hand mutant to a copy of the package and run its test file: 0 if all fail."""
    folder = _lay_out("named", TARGETS["trace"])
    survivors = 0
    for mutant in HAND_MUTANTS:
        source = folder / "src" / _installed_path(mutant.path)
        original = source.read_text()
        if original.count(mutant.original) != 1:
            raise SystemExit(f"{mutant.path}: the text to mutate is gone: {mutant.original!r}")
        source.write_text(original.replace(mutant.original, mutant.mutated))
        try:
            finished = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                 "not tensorflow and not netns", mutant.tests],
                cwd=folder,
                env={**os.environ, "PYTHONPATH": str(folder / "src")},
                capture_output=True,
                text=True,
                check=False,
            )  # fmt: skip
        finally:
            source.write_text(original)
        failed = [line for line in finished.stdout.splitlines() if line.startswith("FAILED")]
        caught = finished.returncode == 1 and bool(failed)
        survivors += not caught
        print(f"{'caught' if caught else 'SURVIVED'}: issue {mutant.issue}: {mutant.name}")
        for line in failed:
            print(f"    {line[:160]}", flush=True)
    return 1 if survivors else 0


def _list() -> None:
    rows = {row.module: row for row in mutation_table.parse_rows(DOCS.read_text())}
    stale = set(stale_targets())
    for name, target in TARGETS.items():
        row = rows.get(row_module(target))
        state = (
            "to run"
            if name in stale
            else f"{row.score if row else '?'} at {row.commit if row else '?'}"
        )
        print(f"{name}: {row_module(target)} <- {' '.join(target.tests)} [{state}]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("modules", nargs="*", help=f"any of: {', '.join(TARGETS)}")
    parser.add_argument("--list", action="store_true", help="the modules, tests and rows")
    parser.add_argument("--stale", action="store_true", help="the modules whose row is stale")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--floor", type=float, default=DEFAULT_FLOOR, help="score to reach (%%)")
    parser.add_argument("--no-swaps", action="store_true", help="mutmut's operators only")
    parser.add_argument("--named", action="store_true", help="check the hand-made bugs")
    parser.add_argument("--no-table", action="store_true", help="leave docs/testing.md as it is")
    arguments = parser.parse_args(argv)
    unknown = [m for m in arguments.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module {unknown[0]!r} (expected one of: {', '.join(TARGETS)})")
    if arguments.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {arguments.jobs}")
    if arguments.named:
        return run_hand_mutants()
    if arguments.list:
        _list()
        return 0
    if arguments.stale:
        print(" ".join(stale_targets()))
        return 0
    if not arguments.modules:
        parser.error("name the modules to run (--stale lists those whose row is not current)")
    below = []
    for name in arguments.modules:
        target = TARGETS[name]
        result = run_module(name, target, jobs=arguments.jobs, swaps=not arguments.no_swaps)
        row = table_row(result)
        timeouts = len(result["timeouts"])  # type: ignore[arg-type]
        print(row.render(), f"({result['seconds']} s, {timeouts} timed out)", flush=True)
        if not arguments.no_table:
            mutation_table.update(DOCS, row, [row_module(t) for t in TARGETS.values()])
        if (mutation_table.score_value(row) or 0.0) < arguments.floor:
            below.append(f"below {arguments.floor}%: {target.path} ({row.score})")
    for line in below:
        print(line, file=sys.stderr)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
