"""The documentation cites what the repository has, and the measured-results pages stay short.

A doc (README.md, docs/, bench/README.md, traces/README.md) that links a file,
names a repository path (``replay/core/pacing.py``, ``bench/fidelity.py``) or a
bare Markdown file (``design.md``) must name one that exists; a link or citation
with an anchor (``docs/design.md#architecture``) must name a heading of that
file.  Code cites docs the same way (``docs/design.md#replaying-a-trace`` in a
docstring), so citations of ``docs/*.md`` in the package's sources are checked
too.  docs/fidelity.md and bench/README.md state the current rules and the
latest measured tables; history goes to docs/history.md or stays in git, and a
size limit keeps it so.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The docs whose citations are checked.
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "bench" / "README.md",
        ROOT / "traces" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
#: Sources whose citations of docs/*.md are checked.
SOURCE_FOLDERS = ("replay", "profiler", "src", "bench", "scripts", "tests", "models")
#: Docs that hold measured results and must stay short enough to read.
SHORT_DOCS = {"docs/fidelity.md": 400, "bench/README.md": 400}
#: Top-level folders of the repository a citation can name.
TOP_FOLDERS = (
    "replay",
    "profiler",
    "src",
    "bench",
    "tests",
    "docs",
    "scripts",
    "traces",
    "protos",
    "models",
    "examples",
    r"\.ci",
)
#: A repository path in prose: a top-level folder, then path characters.  Not
#: preceded by a path character, so ``/tmp/bench/x`` or ``capture/replay`` are not taken.
PATH_CITATION = re.compile(
    r"(?<![\w./~$-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w.*/<>{}\[\]-]*(?:#[\w-]+)?)"
)
#: A Markdown link's target.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: A bare Markdown file name (``NOTES.md``), not part of a path.
BARE_MARKDOWN = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
#: Markdown files the tool writes (``network compare``'s ``comparison.md``), not the repository's.
WRITTEN_MARKDOWN = frozenset({"comparison.md"})
#: A citation of a doc from code: ``docs/name.md`` with an optional anchor.
DOC_CITATION = re.compile(r"(?<![\w./-])((?:docs|bench)/[\w-]+\.md(?:#[\w-]+)?)")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _problem(target: str, base: Path, where: str) -> str | None:
    """Why ``target`` (a path relative to ``base``, maybe with ``#anchor``) is no citation."""
    path_text, _, anchor = target.partition("#")
    path_text = path_text.rstrip(".,;:")
    if any(mark in path_text for mark in "<>{}[]"):
        return None  # a placeholder (``runs/<time>-<label>/``), not a file
    if "*" in path_text:
        if not list(base.glob(path_text)):
            return f"{where}: {path_text} matches no file"
        return None
    path = (base / path_text).resolve()
    if not path.exists():
        return f"{where}: {path_text} does not exist"
    if anchor and path.suffix == ".md" and anchor not in _anchors(path):
        return f"{where}: {path_text} has no heading #{anchor}"
    return None


def _citations(doc: Path) -> Iterator[tuple[int, str, Path]]:
    """(line, target, base folder) of every link and repository path in a doc."""
    in_code = False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            in_code = not in_code
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            if target.startswith("#"):
                yield number, doc.name + target, doc.parent
            else:
                yield number, target, doc.parent
        if in_code:
            continue  # commands in examples name files they write (``--output traces/x``)
        for match in PATH_CITATION.finditer(LINK.sub("", line)):
            yield number, match.group(1), ROOT


@functools.cache
def _markdown_names() -> frozenset[str]:
    """Every Markdown file name the repository has, and those the tool writes."""
    names = set(WRITTEN_MARKDOWN)
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"]
        names.update(name for name in files if name.endswith(".md"))
        if Path(folder) == ROOT:
            subfolders[:] = [d for d in subfolders if not d.endswith(".egg-info")]
    return frozenset(names)


def doc_problems(doc: Path) -> list[str]:
    """Each citation in ``doc`` of a path, heading or Markdown name the repository lacks."""
    where = doc.relative_to(ROOT)
    problems = [
        problem
        for line, target, base in _citations(doc)
        if (problem := _problem(target, base, f"{where}:{line}")) is not None
    ]
    names = _markdown_names()
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        for match in BARE_MARKDOWN.finditer(line):
            if match.group(1) not in names:
                problems.append(f"{where}:{number}: {match.group(1)} is not in the repository")
    return problems


def code_problems() -> list[str]:
    """Each citation in the sources of a doc, heading or Markdown name the repository lacks."""
    problems: list[str] = []
    names = _markdown_names()
    for folder in SOURCE_FOLDERS:
        for source in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in source.parts or source == Path(__file__):
                continue
            text = source.read_text(encoding="utf-8")
            for number, line in enumerate(text.splitlines(), start=1):
                where = f"{source.relative_to(ROOT)}:{number}"
                for match in DOC_CITATION.finditer(line):
                    if (problem := _problem(match.group(1), ROOT, where)) is not None:
                        problems.append(problem)
                for match in BARE_MARKDOWN.finditer(line):
                    if match.group(1) not in names:
                        problems.append(f"{where}: {match.group(1)} is not in the repository")
    return problems


def length_problems(root: Path = ROOT) -> list[str]:
    """Each measured-results page under ``root`` over its line limit."""
    problems = []
    for name, limit in sorted(SHORT_DOCS.items()):
        lines = len((root / name).read_text(encoding="utf-8").splitlines())
        if lines > limit:
            problems.append(
                f"{name} has {lines} lines, over {limit}: keep the current rules and the latest "
                "table per bench; move superseded runs to docs/history.md (condensed) or leave "
                "them to git"
            )
    return problems


def all_problems() -> list[str]:
    """Everything this module checks, for the repository gates (``tests/test_gates.py``)."""
    return [p for doc in DOCS for p in doc_problems(doc)] + code_problems() + length_problems()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_doc_cites_only_files_and_headings_the_repository_has(doc: Path) -> None:
    problems = doc_problems(doc)
    assert not problems, "\n".join(problems)


def test_code_cites_only_docs_and_headings_the_repository_has() -> None:
    problems = code_problems()
    assert not problems, "\n".join(problems)


def test_the_measured_results_pages_stay_short() -> None:
    problems = length_problems()
    assert not problems, "\n".join(problems)


def test_the_checker_finds_a_missing_path_a_missing_heading_and_a_bare_name(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("# Page\n## Real heading\n", encoding="utf-8")
    assert _problem("page.md#real-heading", tmp_path, "x") is None
    assert (
        _problem("page.md#no-such-heading", tmp_path, "x")
        == "x: page.md has no heading #no-such-heading"
    )
    assert _problem("gone.md", tmp_path, "x") == "x: gone.md does not exist"
    assert _problem("runs/<time>-<label>/results.json", tmp_path, "x") is None
    assert _slug("Training's causality") == "trainings-causality"
    line = "see replay/core/pacing.py, `bench/fidelity.py` and /tmp/bench/x or capture/replay"
    assert [m.group(1) for m in PATH_CITATION.finditer(line)] == [
        "replay/core/pacing.py",
        "bench/fidelity.py",
    ]
    assert [m.group(1) for m in BARE_MARKDOWN.finditer("NOTES.md and docs/design.md")] == [
        "NOTES.md"
    ]
    for name, lines in (("docs/fidelity.md", 400), ("bench/README.md", 401)):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("line\n" * lines, encoding="utf-8")
    assert [p.split(" has ")[0] for p in length_problems(tmp_path)] == ["bench/README.md"]
