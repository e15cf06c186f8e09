"""The replay package's layers: what each module may import (``replay/__init__.py`` says why).

Every module's imports are read with ``ast``, including imports inside
functions, so a lazy import cannot cross a layer unseen.  Failures name the
file, the line and the rule broken.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
    "profiler/capture.py",
    "profiler/recorders/http2.py",
    "profiler/recorders/wiretap.py",
    "replay/output/timeline.py",
    "src/tf_grpc_bench/trace.py",
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
