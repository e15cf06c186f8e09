"""The replay package's layers: what each module may import (``replay/__init__.py`` says why).

Every module's imports are read with ``ast``, including imports inside
functions, so a lazy import cannot cross a layer unseen.  Failures name the
file, the line and the rule broken.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / "replay"
PACKAGE = "tf_grpc_bench.replay"

#: Layer of each top-level part of ``replay/``, lowest first.  A module may
#: import its own layer and lower ones.
LAYERS = {
    "core": 0,
    "transport": 1,
    "native": 1,
    "spec": 2,
    "output": 3,
    "network": 4,
    "throughput": 5,
    "engines": 6,
    "fitting": 7,
    "request": 8,
    "runner": 9,
    "session": 10,
    "serving": 10,
    "placement": 11,
    "cli": 12,
    "cli_flags": 12,
}
#: What ``core`` may import from the project outside itself.
CORE_ALLOWED_PROJECT = (
    "tf_grpc_bench.errors",
    "tf_grpc_bench.sizes",
    "tf_grpc_bench.trace",
    "tf_grpc_bench.dependencies",
    "tf_grpc_bench.dependency_tracker",
    "tf_grpc_bench.trace_mapping",
)
#: Modules that would give ``core`` IO, clocks, concurrency or the network.
CORE_FORBIDDEN = ("grpc", "socket", "time", "os", "threading", "subprocess", "multiprocessing")
#: Never imported by anything in ``replay``: a replay host has no TensorFlow.
REPLAY_FORBIDDEN = ("tf_grpc_bench.profiler", "tensorflow")
#: Never imported by anything in ``profiler``: capture and replay share only the package root.
PROFILER_FORBIDDEN = ("tf_grpc_bench.replay",)
#: Shared by capture and replay (emulated hosts), so it imports neither.
SHARED_FORBIDDEN = ("tf_grpc_bench.replay", "tf_grpc_bench.profiler", "tensorflow")
SHARED_MODULES = ("netns", "lifetime.py", "launchers.py", "host.py")
#: Folders whose functions must stay short (extend as other folders are cleaned up).
SHORT_FUNCTION_FOLDERS = ["replay", "profiler", "src/tf_grpc_bench"]
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPLAY).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _part(module: str) -> str | None:
    """The layer key of a ``tf_grpc_bench.replay`` module (None for the package itself)."""
    rest = module[len(PACKAGE) + 1 :].split(".") if module.startswith(PACKAGE + ".") else []
    return rest[0] if rest else None


def _project_file(module: str) -> Path | None:
    """The file or package folder of a ``tf_grpc_bench`` module, None when it is not one."""
    if _is(module, PACKAGE):
        relative = (
            REPLAY.joinpath(*module[len(PACKAGE) + 1 :].split(".")) if module != PACKAGE else REPLAY
        )
    elif _is(module, "tf_grpc_bench"):
        relative = ROOT.joinpath("src", *module.split("."))
    else:
        return None
    for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(path: Path, text: str) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, names taken from it) for every import in ``text``.

    ``from package import module`` counts as importing ``package.module``.
    """
    tree = ast.parse(text, filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = tuple(alias.name for alias in node.names)
            modules = [n for n in names if _project_file(f"{base}.{n}") is not None]
            for name in modules:
                yield node.lineno, f"{base}.{name}", ()
            others = tuple(n for n in names if n not in modules)
            if others or not modules:
                yield node.lineno, base, others


def _is(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _violations(path: Path, text: str | None = None) -> Iterator[str]:
    """The rules ``path`` (or ``text`` read as if it were ``path``) breaks, one line each."""
    where = path.relative_to(ROOT)
    me = _part(_module_name(path))
    text = path.read_text(encoding="utf-8") if text is None else text
    for line, module, names in _imports(path, text):
        if any(_is(module, forbidden) for forbidden in REPLAY_FORBIDDEN):
            yield f"{where}:{line}: replay must not import {module} (no TensorFlow, no profiler)"
        if me == "core":
            if any(_is(module, forbidden) for forbidden in CORE_FORBIDDEN):
                yield f"{where}:{line}: core is pure and must not import {module}"
            outside = _is(module, "tf_grpc_bench") and not _is(module, PACKAGE + ".core")
            if outside and not any(_is(module, allowed) for allowed in CORE_ALLOWED_PROJECT):
                yield (
                    f"{where}:{line}: core may import only itself and "
                    f"{', '.join(CORE_ALLOWED_PROJECT)}, not {module}"
                )
        theirs = _part(module)
        upward = me is not None and theirs in LAYERS and LAYERS[theirs] > LAYERS[me]
        if upward:
            yield (
                f"{where}:{line}: {me} (layer {LAYERS[me]}) must not import {module} "
                f"({theirs}, layer {LAYERS[theirs]}): a layer imports only lower layers"
            )
        if _is(module, "tf_grpc_bench"):
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    yield (
                        f"{where}:{line}: imports the private name {name} from {module}; "
                        "make it public where it is defined"
                    )


def _replay_modules() -> list[Path]:
    return sorted(p for p in REPLAY.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_replay_module_belongs_to_a_layer() -> None:
    unplaced = [
        str(p.relative_to(ROOT))
        for p in _replay_modules()
        if (part := _part(_module_name(p))) is not None and part not in LAYERS
    ]
    assert not unplaced, f"modules outside every layer (add them to LAYERS): {unplaced}"


def test_no_layer_imports_a_higher_one_and_core_stays_pure() -> None:
    problems = [problem for path in _replay_modules() for problem in _violations(path)]
    assert not problems, "\n".join(problems)


def test_the_checker_sees_upward_impure_and_private_imports_inside_functions() -> None:
    module = REPLAY / "core" / "workload.py"
    text = (
        "def f():\n"
        "    from tf_grpc_bench.replay import runner\n"
        "    import time\n"
        "    from tf_grpc_bench.replay.core.pacing import _hidden\n"
        "    from tf_grpc_bench import trace_files\n"
    )
    problems = list(_violations(module, text))
    assert any(p.startswith("replay/core/workload.py:2:") and "layer" in p for p in problems)
    assert any(p.startswith("replay/core/workload.py:3:") and "pure" in p for p in problems)
    assert any(p.startswith("replay/core/workload.py:4:") and "private" in p for p in problems)
    assert any(p.startswith("replay/core/workload.py:5:") and "trace_files" in p for p in problems)
    allowed = "from tf_grpc_bench import errors, trace\nfrom tf_grpc_bench.sizes import classify\n"
    assert list(_violations(module, allowed)) == []


def _foreign_imports(path: Path, forbidden: tuple[str, ...]) -> Iterator[str]:
    """``path:line: module`` for each import of a module under ``forbidden``.

    Relative imports are not resolved: the package uses absolute ones only.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for module in modules:
            if any(_is(module, f) for f in forbidden):
                yield f"{path.relative_to(ROOT)}:{node.lineno}: {module}"


def test_the_profiler_never_imports_replay_and_shared_modules_import_neither() -> None:
    profiler = sorted(p for p in (ROOT / "profiler").rglob("*.py") if "__pycache__" not in p.parts)
    problems = [p for path in profiler for p in _foreign_imports(path, PROFILER_FORBIDDEN)]
    shared = []
    for name in SHARED_MODULES:
        path = ROOT / "src" / "tf_grpc_bench" / name
        shared += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    problems += [p for path in shared for p in _foreign_imports(path, SHARED_FORBIDDEN)]
    assert not problems, "forbidden imports:\n" + "\n".join(problems)


def test_library_functions_are_short() -> None:
    long_functions = []
    for folder in SHORT_FUNCTION_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        long_functions.append(
                            f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} has "
                            f"{length} lines (at most {MAX_FUNCTION_LINES})"
                        )
    assert not long_functions, "\n".join(long_functions)


# -- argparse only in the command-line modules -----------------------------------------

#: The modules that read command lines (a command's flags, or a ``python -m`` entry);
#: every other module of the package takes typed arguments.
COMMAND_LINE_MODULES = (
    "src/tf_grpc_bench/cli.py",
    "src/tf_grpc_bench/command.py",
    "src/tf_grpc_bench/inspect.py",
    "src/tf_grpc_bench/emit.py",
    "replay/cli.py",
    "replay/cli_flags.py",
    "replay/native/cli.py",
    "replay/network/cli.py",
    "replay/output/cli.py",
    "profiler/cli.py",
    "profiler/record_cli.py",
    "profiler/calibrate.py",
    "profiler/uncaptured.py",
)


def _package_modules() -> list[Path]:
    return sorted(
        path
        for folder in SHORT_FUNCTION_FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts and not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    )


def _argparse_imports(path: Path) -> list[int]:
    """The lines of ``path`` that import argparse (inside functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Import) and any(_is(a.name, "argparse") for a in node.names))
        or (isinstance(node, ast.ImportFrom) and _is(node.module or "", "argparse"))
    ]


def test_only_the_command_line_modules_import_argparse() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports argparse below the command line "
        "(take a typed spec instead)"
        for path in _package_modules()
        if str(path.relative_to(ROOT)) not in COMMAND_LINE_MODULES
        for line in _argparse_imports(path)
    ]
    assert not offenders, "\n".join(offenders)
    # The list names modules that exist and read command lines, and no others.
    listed = [ROOT / name for name in COMMAND_LINE_MODULES]
    assert all(path.exists() for path in listed), [str(p) for p in listed if not p.exists()]


# -- modules stay short ------------------------------------------------------------------

#: Longest module (lines) in the package folders.
MAX_MODULE_LINES = 600
#: Modules still longer, being split by concept.  This list may only shrink: the gate
#: fails for a listed module that is no longer too long (take it off the list).
LONG_MODULES = (
    "profiler/recorders/http2.py",
    "replay/output/timeline.py",
)


def _module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_modules_are_short() -> None:
    long_modules = [
        f"{path.relative_to(ROOT)} has {_module_lines(path)} lines (at most {MAX_MODULE_LINES}; "
        "split it by concept)"
        for path in _package_modules()
        if _module_lines(path) > MAX_MODULE_LINES
        and str(path.relative_to(ROOT)) not in LONG_MODULES
    ]
    assert not long_modules, "\n".join(long_modules)


def test_the_list_of_long_modules_only_shrinks() -> None:
    stale = [
        f"{name}: {'gone' if not (ROOT / name).exists() else 'now short enough'}; "
        "take it off LONG_MODULES"
        for name in LONG_MODULES
        if not (ROOT / name).exists() or _module_lines(ROOT / name) <= MAX_MODULE_LINES
    ]
    assert not stale, "\n".join(stale)


# -- the package root, the profiler's assembly and import cycles ----------------------

#: Where each repository folder is installed (pyproject.toml's ``package-dir``).
INSTALLED_AS = {
    "src/tf_grpc_bench": "tf_grpc_bench",
    "replay": "tf_grpc_bench.replay",
    "profiler": "tf_grpc_bench.profiler",
    "models": "tf_grpc_bench.models",
}
#: Never imported by the package root (``src/tf_grpc_bench``): capture and replay build on
#: it, and a replay host has no TensorFlow.
ROOT_FORBIDDEN = (
    "tf_grpc_bench.replay",
    "tf_grpc_bench.profiler",
    "tensorflow",
    "tf_keras",
    "keras",
)
#: The package's entry point: its command table imports each command's module (one of
#: ``COMMAND_LINE_MODULES``) when that command runs, and no other module of replay or
#: profiler.
ROOT_ENTRY_POINT = "src/tf_grpc_bench/cli.py"
#: Import cycles still to be broken: ``emit`` checks the pods' command lines with the
#: command table (``cli.check_command``) that lists ``emit`` itself.  This list may only
#: shrink: the test fails for a listed cycle that is gone (take it off).
KNOWN_CYCLES: tuple[frozenset[str], ...] = (frozenset({"tf_grpc_bench.cli", "tf_grpc_bench.emit"}),)
#: All the profiler's assembly may import of the project: it stays pure
#: (``profiler/assembly/__init__.py``), records in, a trace out.
ASSEMBLY_ALLOWED_PROJECT = (
    "tf_grpc_bench.errors",
    "tf_grpc_bench.trace",
    "tf_grpc_bench.profiler.assembly",
    "tf_grpc_bench.profiler.recorders.calls",
    "tf_grpc_bench.profiler.launch.markers",
    "tf_grpc_bench.profiler.physics",
)
#: What would give the assembly IO, clocks, processes, the network or TensorFlow.
ASSEMBLY_FORBIDDEN = (*CORE_FORBIDDEN, "tensorflow", "tf_keras", "keras", "absl")


def _installed_module(path: Path) -> str:
    """The import name of a repository file (``replay/core/pacing.py`` ->
    ``tf_grpc_bench.replay.core.pacing``)."""
    for folder, package in INSTALLED_AS.items():
        base = ROOT / folder
        if base == path.parent or base in path.parents:
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise ValueError(f"{path} is in no installed folder")


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _installed_files() -> dict[str, Path]:
    """Every module of the package, by import name."""
    files = {}
    for folder in INSTALLED_AS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and not path.name.endswith(
                ("_pb2.py", "_pb2_grpc.py")
            ):
                files[_installed_module(path)] = path
    return files


def _module_imports(path: Path, text: str, known: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in ``text`` read as ``path``, inside functions too.

    ``from package import name`` is ``package.name`` when that is one of the
    ``known`` modules, else ``package``; relative imports are resolved.
    """
    modules = set(known)
    me = _installed_module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                yield node.lineno, name if name in modules else base


def _forbidden_imports(
    path: Path,
    forbidden: Iterable[str],
    *,
    allowed_project: Iterable[str] | None = None,
    text: str | None = None,
) -> Iterator[str]:
    """``path:line: module`` for each import of a ``forbidden`` module, or, given
    ``allowed_project``, of a project module outside it (``text``: read as ``path``)."""
    files = _installed_files()
    text = path.read_text(encoding="utf-8") if text is None else text
    for line, module in _module_imports(path, text, files):
        banned = any(_is(module, f) for f in forbidden)
        if allowed_project is not None and _is(module, "tf_grpc_bench"):
            banned = banned or not any(_is(module, a) for a in allowed_project)
        if banned:
            yield f"{path.relative_to(ROOT)}:{line}: {module}"


def test_the_package_root_imports_neither_replay_nor_profiler_nor_tensorflow() -> None:
    root = sorted(p for p in (ROOT / "src" / "tf_grpc_bench").rglob("*.py"))
    files = _installed_files()
    commands = {name for name, path in files.items() if _relative(path) in COMMAND_LINE_MODULES}
    problems = [
        p
        for path in root
        for p in _forbidden_imports(path, ROOT_FORBIDDEN)
        if not (_relative(path) == ROOT_ENTRY_POINT and p.rpartition(": ")[2] in commands)
    ]
    assert not problems, (
        "the package root must import none of " + ", ".join(ROOT_FORBIDDEN) + ":\n"
    ) + "\n".join(problems)


def test_the_profilers_assembly_stays_pure() -> None:
    assembly = sorted((ROOT / "profiler" / "assembly").glob("*.py"))
    problems = [
        p
        for path in assembly
        for p in _forbidden_imports(
            path, ASSEMBLY_FORBIDDEN, allowed_project=ASSEMBLY_ALLOWED_PROJECT
        )
    ]
    assert not problems, (
        "profiler/assembly may import only "
        + ", ".join(ASSEMBLY_ALLOWED_PROJECT)
        + " of the project, and none of "
        + ", ".join(ASSEMBLY_FORBIDDEN)
        + ":\n"
        + "\n".join(problems)
    )


def _import_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle (its modules in import order, the first repeated last) for each set of
    modules that import each other, directly or through others (Tarjan's strongly
    connected components)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.get(start, ()))))]
        order[start] = low[start] = len(order)
        stack.append(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in stack:
                    low[node] = min(low[node], order[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    component = []
                    while component[-1:] != [node]:
                        component.append(stack.pop())
                    if len(component) > 1 or node in graph.get(node, ()):
                        components.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return [_cycle_through(component, graph) for component in components]


def _cycle_through(component: list[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """A shortest import path from the component's first module back to itself."""
    members, first = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph.get(node, ())):
                if target == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return [first, *reversed(path[:-1]), first] if node != first else [first, first]
                if target in members and target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {component}")


def _import_graph() -> dict[str, set[str]]:
    files = _installed_files()
    return {
        module: {
            imported
            for _, imported in _module_imports(path, path.read_text(encoding="utf-8"), files)
            if imported in files and imported != module
        }
        for module, path in files.items()
    }


def test_no_modules_import_each_other_in_a_cycle() -> None:
    cycles = _import_cycles(_import_graph())
    new = [cycle for cycle in cycles if frozenset(cycle) not in KNOWN_CYCLES]
    assert not new, "import cycles (lazy imports count too):\n" + "\n".join(
        " -> ".join(cycle) for cycle in new
    )
    gone = [known for known in KNOWN_CYCLES if known not in {frozenset(c) for c in cycles}]
    assert not gone, f"cycles broken, take them off KNOWN_CYCLES: {[sorted(g) for g in gone]}"


def test_the_cycle_root_and_assembly_checkers_see_what_they_guard() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"a"}}
    assert _import_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert _import_cycles({"a": {"b"}, "b": set()}) == []
    lazy = (
        "from . import trace\n"
        "def f():\n"
        "    from tf_grpc_bench.replay.core import workload\n"
        "    import tensorflow as tf\n"
        "    from tf_grpc_bench.profiler.launch import job\n"
    )
    root = ROOT / "src" / "tf_grpc_bench" / "inspect.py"
    assert list(_forbidden_imports(root, ROOT_FORBIDDEN, text=lazy)) == [
        "src/tf_grpc_bench/inspect.py:3: tf_grpc_bench.replay.core.workload",
        "src/tf_grpc_bench/inspect.py:4: tensorflow",
        "src/tf_grpc_bench/inspect.py:5: tf_grpc_bench.profiler.launch.job",
    ]
    assembly = ROOT / "profiler" / "assembly" / "rpcs.py"
    problems = list(
        _forbidden_imports(
            assembly, ASSEMBLY_FORBIDDEN, allowed_project=ASSEMBLY_ALLOWED_PROJECT, text=lazy
        )
    )
    # ``from . import trace`` is the assembly package itself here: allowed.
    assert [p.rpartition(": ")[2] for p in problems] == [
        "tf_grpc_bench.replay.core.workload",
        "tensorflow",
        "tf_grpc_bench.profiler.launch.job",
    ]
    allowed = "from . import steps\nfrom tf_grpc_bench import trace\nimport dataclasses\n"
    assert (
        list(
            _forbidden_imports(
                assembly, ASSEMBLY_FORBIDDEN, allowed_project=ASSEMBLY_ALLOWED_PROJECT, text=allowed
            )
        )
        == []
    )
