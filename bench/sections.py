"""Rewrite one ``## `` section of a Markdown file and keep the rest: how every bench
script writes its figures into bench/README.md (or docs/performance.md).

Used as ``from sections import replace_section`` by the scripts next to it
(they run as ``python bench/<script>.py``, so this folder is on the path).
"""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, heading: str, body: str, *, title: str = "# Benchmarks") -> None:
    """Put ``body`` (which starts with the ``heading`` line) in place of the section of
    ``path`` that starts with ``heading``, up to the next ``## `` heading; append it
    if the file has no such section, and create the file (with ``title``) if needed."""
    text = path.read_text(encoding="utf-8") if path.exists() else f"{title}\n"
    body = body.rstrip("\n") + "\n"
    start = text.find(heading + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        following = text.find("\n## ", start + len(heading))
        rest = "" if following < 0 else "\n" + text[following + 1 :]
        text = text[:start] + body + rest
    path.write_text(text, encoding="utf-8")
