"""Names from an open set: what a benchmark or a pacing timing is called, compared with ``is``.

An ``OpenName`` subclass behaves like an ``enum.Enum`` where code reads it
(``Benchmark.PS_THROUGHPUT``, ``Benchmark("ps-throughput")``, ``.value``,
``for b in Benchmark``, ``b is Benchmark.P2P_LATENCY``), but more names can be
defined at run time: a benchmark or a pacing timing is a row of its table
(``core.benchmarks``, ``core.pacing``), and registering a row defines its name.

One object per name and class (interned), so identity comparisons hold across
pickling (worker processes) and parsing (result documents).  ``Cls(value)``
finds a *listed* name (ValueError otherwise, as an Enum's lookup);
``define`` lists one (or returns it); ``withdraw`` unlists it again (a test's
toy row), keeping the object for whoever still holds it.

Pure: no IO.  Not thread-safe for defining names (tables are filled at import).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

#: What a name may look like: lower case words joined by hyphens (a flag value).
NAME_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

T = TypeVar("T", bound="OpenName")


class _Listing(type):
    """Iterating an ``OpenName`` class gives its listed names, in the order defined."""

    def __iter__(cls) -> Iterator[Any]:
        listed: dict[str, OpenName] = cls._listed  # type: ignore[attr-defined]
        return iter(tuple(listed.values()))

    def __len__(cls) -> int:
        return len(cls._listed)  # type: ignore[attr-defined]


class OpenName(metaclass=_Listing):
    """A name of an open set; subclass once per set (see the module docstring)."""

    __slots__ = ("value",)
    value: str
    _listed: ClassVar[dict[str, Any]]
    _interned: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._listed = {}
        cls._interned = {}

    def __new__(cls: type[T], value: str) -> T:
        listed: T | None = cls._listed.get(value)
        if listed is None:
            raise ValueError(f"{value!r} is not a valid {cls.__name__}")
        return listed

    @classmethod
    def define(cls: type[T], value: str) -> T:
        """The name ``value``, listed (made on first use).  ValueError for a malformed one."""
        known: T | None = cls._interned.get(value)
        if known is None:
            if not isinstance(value, str) or not NAME_PATTERN.match(value):
                raise ValueError(
                    f"{cls.__name__} {value!r}: expected lower-case-words-with-hyphens"
                )
            known = object.__new__(cls)
            object.__setattr__(known, "value", value)
            cls._interned[value] = known
        cls._listed[value] = known
        return known

    @classmethod
    def withdraw(cls: type[T], name: T) -> None:
        """Unlist ``name``: ``Cls(value)`` and iteration no longer give it."""
        cls._listed.pop(name.value, None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Unpickled in a process that never defined it (a spawned worker), it is defined there.
        return type(self).define, (self.value,)

    def __copy__(self: T) -> T:
        return self

    def __deepcopy__(self: T, memo: dict[int, Any]) -> T:
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.value}>"

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.value}"
