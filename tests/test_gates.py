"""Repository gates: generated code is fresh, lint, format and types are clean."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_FOLDERS = ["src", "replay", "profiler", "models", "protos", "traces", "tests", "bench"]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_generated_protobuf_modules_match_their_proto_files(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "regenerate_protos.sh", copy / "scripts")
    shutil.copytree(ROOT / "protos", copy / "protos", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        ["bash", str(copy / "scripts" / "regenerate_protos.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    stale = [
        p.name
        for p in (ROOT / "protos").iterdir()
        if p.suffix in {".py", ".pyi"}
        and p.name != "__init__.py"
        and not filecmp.cmp(p, copy / "protos" / p.name, shallow=False)
    ]
    assert not stale, f"stale generated files, run scripts/regenerate_protos.sh: {stale}"


def test_ruff_lint_is_clean() -> None:
    result = _run(
        sys.executable, "-m", "ruff", "check", *[f for f in PACKAGE_FOLDERS if (ROOT / f).exists()]
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run(
        sys.executable,
        "-m",
        "ruff",
        "format",
        "--check",
        *[f for f in PACKAGE_FOLDERS if (ROOT / f).exists()],
    )
    assert result.returncode == 0, result.stdout + result.stderr


SUBPACKAGES = {
    "replay": "replay",
    "profiler": "profiler",
    "protos": "protos",
    "models": "models",
    "traces": "traces",
}


def _package_view(tmp_path: Path) -> Path:
    """A view of the installed layout made of symlinks into the repository (mypy cannot
    follow setuptools' editable-install finder); the folder that holds it."""
    view = tmp_path / "view" / "tf_grpc_bench"
    view.mkdir(parents=True)
    for entry in (ROOT / "src" / "tf_grpc_bench").iterdir():
        if entry.name != "__pycache__":
            (view / entry.name).symlink_to(entry)
    for name, folder in SUBPACKAGES.items():
        (view / name).symlink_to(ROOT / folder)
    return view.parent


def _mypy(tmp_path: Path, *what: str, path: str = "") -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
        "--cache-dir", str(tmp_path / "cache"), *what,
    ]  # fmt: skip
    environment = {**os.environ, "MYPYPATH": path} if path else None
    return subprocess.run(
        command, cwd=_package_view(tmp_path), capture_output=True, text=True, check=False,
        env=environment,
    )  # fmt: skip


def test_mypy_is_clean_on_the_package(tmp_path: Path) -> None:
    result = _mypy(tmp_path, "-p", "tf_grpc_bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean_on_the_bench_scripts(tmp_path: Path) -> None:
    # The scripts import the package (from the view) and bench/common.py (a sibling).
    scripts = sorted(str(script) for script in (ROOT / "bench").glob("*.py"))
    result = _mypy(tmp_path, *scripts, path=f"{tmp_path / 'view'}{os.pathsep}{ROOT / 'bench'}")
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_cite_only_what_the_repository_has_and_results_pages_stay_short() -> None:
    # The checks of tests/test_docs.py, here too so that every landing runs them.
    from .test_docs import all_problems

    problems = all_problems()
    assert not problems, "\n".join(problems)
