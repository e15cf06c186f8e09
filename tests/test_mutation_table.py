"""docs/testing.md's mutation scores are of the code as it is: a module changed since its
row was measured fails here until ``bench/mutation.py <module>`` measures it again.

Also the script's own parts that decide what a score means: the code hash (blind to
comments and docstrings, not to code), our operators (what they swap and flip) and
the hand-made bugs (each still applies to the code it names).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import load_bench_script

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "testing.md"
table = load_bench_script("mutation_table.py", "mutation_table")
targets = load_bench_script("mutation_targets.py", "mutation_targets")
mutation = load_bench_script("mutation.py", "bench_mutation")


def _rows() -> dict[str, object]:
    return {row.module: row for row in table.parse_rows(DOCS.read_text(encoding="utf-8"))}


def test_every_module_of_the_result_path_has_a_row() -> None:
    rows = _rows()
    missing = [
        mutation.row_module(target)
        for target in targets.TARGETS.values()
        if mutation.row_module(target) not in rows
    ]
    assert not missing, f"docs/testing.md has no mutation row for {missing}"


def test_every_measured_row_is_of_the_modules_current_code() -> None:
    stale = []
    for name, target in targets.TARGETS.items():
        row = _rows().get(mutation.row_module(target))
        if row is None or not row.measured:  # type: ignore[attr-defined]
            continue
        code = table.code_hash((ROOT / target.path).read_text(encoding="utf-8"), target.functions)
        if row.code != code:  # type: ignore[attr-defined]
            stale.append(
                f"{target.path} changed since its row (measured at {row.commit}): "  # type: ignore[attr-defined]
                f"nice -n 10 .venv/bin/python bench/mutation.py {name}"
            )
    assert not stale, "\n".join(stale)


def test_the_code_hash_sees_code_and_not_comments_or_docstrings() -> None:
    source = 'def f(a):\n    """What f does."""\n    return a + 1  # one more\n'
    assert table.code_hash(source) == table.code_hash(
        'def f(a):\n    """Another text."""\n    # why\n    return a + 1\n'
    )
    assert table.code_hash(source) != table.code_hash(source.replace("a + 1", "a - 1"))
    assert table.code_hash(source) != table.code_hash(source.replace("(a)", "(b)"))
    # Measured for some functions: the rest of the module may change.
    other = source + "\n\ndef g():\n    return 2\n"
    assert table.code_hash(other, ("f",)) == table.code_hash(source, ("f",))
    assert table.code_hash(other, ("f",)) != table.code_hash(other)


def test_a_method_is_measured_by_its_class_and_name() -> None:
    source = (
        "class C:\n"
        "    def m(self, a):\n"
        '        """What m does."""\n'
        "        return a + 1\n"
        "\n"
        "    def n(self):\n"
        "        return 2\n"
    )
    measured = table.code_hash(source, ("C.m",))
    assert measured == table.code_hash(source.replace("return 2", "return 3"), ("C.m",))
    assert measured == table.code_hash(source.replace("What m does", "Why"), ("C.m",))
    assert measured != table.code_hash(source.replace("a + 1", "a - 1"), ("C.m",))
    # A method of another class, or a top-level function, of the same name is not it.
    assert measured != table.code_hash(source.replace("class C", "class D"), ("C.m",))
    assert table.code_hash(source, ("m",)) == table.code_hash("", ())
    assert mutation.swap_mutants(source.replace("a + 1", "a.start_ns"), ("C.n",)) == []
    assert len(mutation.swap_mutants(source.replace("a + 1", "a.start_ns"), ("C.m",))) == 2
    target = targets.Target(path="replay/x.py", tests=(), functions=("C.m", "f"))
    assert mutation._patterns(target) == [
        "tf_grpc_bench.replay.x.x\u01c1C\u01c1m__mutmut_*",
        "tf_grpc_bench.replay.x.x_f__mutmut_*",
    ]


def test_rows_are_written_and_read_back_as_the_script_keeps_them(tmp_path: Path) -> None:
    page = tmp_path / "scores"
    empty = table.Row(module="replay/x.py (f, g)", tests="test_x.py")
    page.write_text(f"before\n{table.BEGIN}\n{table.END}\nafter\n".replace(
        table.END, "\n".join(table.HEADER) + "\n" + table.END
    ))  # fmt: skip
    table.update(page, empty, ["replay/x.py (f, g)"])
    measured = table.Row(
        module="a.py", mutants="10", killed="9", survived="1", score="90.0%", swaps="2/3",
        tests="test_a.py", commit="abc1234", code="0123456789ab",
    )  # fmt: skip
    table.update(page, measured, ["a.py", "replay/x.py (f, g)"])
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("after\n")
    assert "| `replay/x.py` (f, g) | - | - | - | not measured | - | test_x.py | - | - |" in text
    assert table.parse_rows(text) == [measured, empty]
    assert table.score_value(measured) == 90.0 and table.score_value(empty) is None


def test_our_operators_swap_attributes_of_a_kind_and_flip_offsets() -> None:
    source = (
        "def wait(call, origin, offset_ns):\n"
        "    begin = call.start_ns - origin\n"
        "    return begin + offset_ns, call.request_bytes, start_ns\n"
    )
    found = {(m.line, m.original, m.replacement) for m in mutation.swap_mutants(source)}
    assert found == {
        (2, "start_ns", "response_start_ns"),
        (2, "start_ns", "end_ns"),
        (2, "-", "+"),
        (3, "+", "-"),
        (3, "request_bytes", "response_bytes"),
        (3, "request_bytes", "payload_bytes"),
    }
    flipped = next(m for m in mutation.swap_mutants(source) if m.original == "-")
    assert "call.start_ns + origin" in flipped.apply(source)
    # Limited to some functions: nothing outside them.
    assert mutation.swap_mutants(source, ("other",)) == []


@pytest.mark.parametrize("mutant", targets.HAND_MUTANTS, ids=lambda m: m.name)
def test_each_hand_made_bug_still_applies_to_the_code_it_names(mutant: object) -> None:
    text = (ROOT / mutant.path).read_text(encoding="utf-8")  # type: ignore[attr-defined]
    assert text.count(mutant.original) == 1, mutant.path  # type: ignore[attr-defined]


def test_a_mutant_whose_tests_never_end_counts_killed_at_its_time_limit(tmp_path: Path) -> None:
    # A mutant can make a loop endless (a bound that no longer moves): its tests are stopped
    # at the time limit, and the run says so (None), apart from a pass (0) and a failure (1).
    (tmp_path / "test_mutant.py").write_text(
        "def test_passes():\n    assert True\n\n\n"
        "def test_fails():\n    assert False\n\n\n"
        "def test_never_ends():\n    while True:\n        pass\n"
    )
    run = mutation._pytest
    assert run(tmp_path, ("test_mutant.py::test_passes",), "not netns", 600.0) == 0
    assert run(tmp_path, ("test_mutant.py::test_fails",), "not netns", 600.0) == 1
    assert run(tmp_path, ("test_mutant.py::test_never_ends",), "not netns", 2.0) is None
