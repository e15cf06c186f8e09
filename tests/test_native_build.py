"""Native parts of several C++ sources built on first use into a cache keyed by everything
that decides them (``tf_grpc_bench.native``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tf_grpc_bench import native
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.native import NativeSource

HELLO = '#include <cstdio>\nconst char* shout();\nint main() { std::printf("%s\\n", shout()); }\n'


def _program(tmp_path: Path, text: str, *, key: str = "") -> NativeSource:
    source = tmp_path / "hello.cc"
    source.write_text(text)
    helper = tmp_path / "shout.cc"
    helper.write_text('#include "shout.h"\nconst char* shout() { return LOUD; }\n')
    header = tmp_path / "shout.h"
    if not header.exists():
        header.write_text('#define LOUD "HELLO"\n')
    return NativeSource(
        name="hello",
        source=source,
        more_sources=(helper,),
        headers=(header,),
        kind="executable",
        language="c++",
        extra_compile_flags=("-std=c++17",),
        key=key,
        purpose="the greeting",
        alternative="--quiet needs none",
    )


def _output(program: Path) -> str:
    return subprocess.run([program], capture_output=True, text=True, check=True).stdout


def test_a_program_of_several_sources_is_built_once_and_again_when_anything_it_is_made_of_changes(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    part = _program(tmp_path, HELLO)
    built = native.build(part, error=ConfigError, cache=cache)
    assert _output(built) == "HELLO\n"
    stamp = built.stat().st_mtime_ns
    assert native.build(part, error=ConfigError, cache=cache) == built
    assert built.stat().st_mtime_ns == stamp
    edited = native.build(
        _program(tmp_path, HELLO.replace('"%s\\n"', '"%s!\\n"')), error=ConfigError, cache=cache
    )
    assert edited != built and _output(edited) == "HELLO!\n"
    (tmp_path / "shout.h").write_text('#define LOUD "HI"\n')
    header_changed = native.build(_program(tmp_path, HELLO), error=ConfigError, cache=cache)
    assert header_changed not in (built, edited) and _output(header_changed) == "HI\n"
    # What else decides the build (a library's version) is part of the key too.
    assert native.built_path(_program(tmp_path, HELLO, key="lib 2"), cache) != header_changed
    # Nothing half-made is left beside what was built.
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        p.name for p in (built, edited, header_changed)
    )


def test_a_failed_build_and_a_missing_compiler_are_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = _program(tmp_path, "int main() { return not_declared; }\n")
    with pytest.raises(ConfigError, match=r"^building the greeting with .* failed: .*not_decl"):
        native.build(broken, error=ConfigError, cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(ConfigError, match=r"^cannot run the C\+\+ compiler .*--quiet needs none"):
        native.build(_program(tmp_path, HELLO), error=ConfigError, cache=tmp_path / "other")
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"needs a C\+\+ compiler .* \(set CXX, or install g\+\+"):
        native.build(_program(tmp_path, HELLO), error=ConfigError, cache=tmp_path / "third")
