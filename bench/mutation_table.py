"""The mutation scores table of docs/testing.md: one row per module of the result path,
each with the commit it was measured on and the hash of the code it measured.

The table sits between ``BEGIN`` and ``END`` (HTML comments, invisible on the page).
A row is written by ``bench/mutation.py`` after it measured a module; a module not
measured on its current code has a row saying so.  ``code_hash`` hashes the module's
syntax tree without docstrings (only the functions or methods measured, for a module
measured for some), so comments and docstrings may change without a new run, and any change
to the code needs one (``tests/test_mutation_table.py`` fails
until it is made).
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

BEGIN = "<!-- mutation scores: written by bench/mutation.py -->"
END = "<!-- end of mutation scores -->"
HEADER = (
    "| module | mutants | killed | survived | score | swaps killed | test files | commit | code |",
    "|---|---|---|---|---|---|---|---|---|",
)
#: What a row of a module not measured on its current code says in its score column.
NOT_MEASURED = "not measured"


def selected_functions(
    tree: ast.Module, functions: tuple[str, ...]
) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The definitions ``functions`` names in ``tree``, in the module's order: a top-level
    function by its name, a method by ``Class.method``."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in functions:
            found.append(node)
        elif isinstance(node, ast.ClassDef):
            found += [
                item
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and f"{node.name}.{item.name}" in functions
            ]
    return found


def code_hash(source: str, functions: tuple[str, ...] = ()) -> str:
    """12 hex digits of the SHA-256 of ``source``'s syntax tree, docstrings left out; of
    the named ``functions`` only, when given (a module measured for those: top-level
    functions by name, methods as ``Class.method``)."""
    tree = ast.parse(source)
    if functions:
        tree.body = list(selected_functions(tree, functions))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One module's line of the table (its figures as shown)."""

    module: str
    mutants: str = "-"
    killed: str = "-"
    survived: str = "-"
    score: str = NOT_MEASURED
    swaps: str = "-"
    tests: str = ""
    commit: str = "-"
    code: str = "-"

    @property
    def measured(self) -> bool:
        return self.code != "-"

    def render(self) -> str:
        path, _, functions = self.module.partition(" (")
        cells = (
            f"`{path}`" + (f" ({functions}" if functions else ""),
            self.mutants,
            self.killed,
            self.survived,
            self.score,
            self.swaps,
            self.tests,
            self.commit,
            f"`{self.code}`" if self.measured else "-",
        )
        return "| " + " | ".join(cells) + " |"


def parse_rows(document: str) -> list[Row]:
    """The rows of the table in ``document`` (docs/testing.md's text).  ValueError if the
    table or one of its rows is not as ``render`` writes it."""
    if BEGIN not in document or END not in document:
        raise ValueError("no mutation scores table (its BEGIN and END comments)")
    table = document.split(BEGIN, 1)[1].split(END, 1)[0].strip().splitlines()
    if tuple(table[:2]) != HEADER:
        raise ValueError("the mutation scores table's header is not the script's")
    rows = []
    for line in table[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != len(HEADER[0].strip("|").split("|")):
            raise ValueError(f"not a row of the mutation scores table: {line}")
        rows.append(
            Row(
                module=cells[0].replace("`", ""),
                mutants=cells[1],
                killed=cells[2],
                survived=cells[3],
                score=cells[4],
                swaps=cells[5],
                tests=cells[6],
                commit=cells[7],
                code=cells[8].strip("`"),
            )
        )
    return rows


def with_rows(document: str, rows: list[Row]) -> str:
    """``document`` with its table holding ``rows``, in that order."""
    before, rest = document.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    table = "\n".join([*HEADER, *(row.render() for row in rows)])
    return f"{before}{BEGIN}\n{table}\n{END}{after}"


def update(path: Path, row: Row, order: list[str]) -> None:
    """Put ``row`` into the table of the file at ``path`` (replacing the module's row),
    the rows in ``order`` (module paths) first."""
    document = path.read_text(encoding="utf-8")
    rows = {r.module: r for r in parse_rows(document)}
    rows[row.module] = row

    def rank(item: Row) -> tuple[int, str]:
        return (order.index(item.module) if item.module in order else len(order), item.module)

    path.write_text(with_rows(document, sorted(rows.values(), key=rank)), encoding="utf-8")


def percent(killed: int, counted: int) -> str:
    return f"{100.0 * killed / counted:.1f}%" if counted else "100.0%"


_SCORE = re.compile(r"^(?P<value>[0-9]+(?:\.[0-9]+)?)%$")


def score_value(row: Row) -> float | None:
    """A measured row's score in percent, None if not measured."""
    found = _SCORE.match(row.score)
    return float(found["value"]) if found else None
