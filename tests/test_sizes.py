"""The paper's size categories at their edges, and sizes as users write them."""

from __future__ import annotations

import re

import pytest

from tf_grpc_bench.sizes import KIB, MIB, SizeCategory, classify, parse_size

SMALL, MEDIUM, LARGE = SizeCategory.SMALL, SizeCategory.MEDIUM, SizeCategory.LARGE


@pytest.mark.parametrize(
    ("size", "category"),
    [
        (0, SMALL),  # an empty control-edge tensor
        (1, SMALL),
        (1023, SMALL),
        (1024, MEDIUM),
        (1_048_575, MEDIUM),
        (1_048_576, LARGE),
        (10_485_760, LARGE),
        (10_485_761, LARGE),  # over the paper's range: still Large
        (47_000_000, LARGE),
    ],
)
def test_every_size_falls_in_its_category_at_the_edges(size: int, category: SizeCategory) -> None:
    assert classify(size) is category


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^message size must be >= 0, got -1$"):
        classify(-1)


def test_the_categories_ranges_and_defaults_are_the_papers() -> None:
    assert (KIB, MIB) == (1024, 1_048_576)
    assert [(c.value, c.minimum_bytes, c.maximum_bytes, c.default_bytes) for c in SizeCategory] == [
        ("small", 1, 1023, 10),
        ("medium", 1024, 1_048_575, 10_240),
        ("large", 1_048_576, 10_485_760, 1_048_576),
    ]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10", 10),
        ("0", 0),
        ("10B", 10),
        (" 10 b ", 10),
        ("10KB", 10_240),
        ("10kib", 10_240),
        ("10K", 10_240),
        ("1MB", 1_048_576),
        ("1.5MiB", 1_572_864),
        ("1m", 1_048_576),
        ("2GB", 2_147_483_648),
        ("1g", 1_073_741_824),
        ("0.5KB", 512),
        ("1.0001KB", 1024),  # rounded to the nearest byte
        ("1.0005KB", 1025),
    ],
)
def test_sizes_are_read_in_powers_of_1024(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "KB", "ten", "1TB", "1..5MB", "MB10"])
def test_text_that_is_not_a_size_is_refused(text: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^not a size: {text!r} \(expected e\.g\. 10, 10KB, 1MB\)$"
    ):
        parse_size(text)


@pytest.mark.parametrize("text", ["-1", "-1KB"])
def test_negative_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=rf"^size must be >= 0: {text!r}$"):
        parse_size(text)


@pytest.mark.parametrize("text", ["nan", "NaN MB", "inf", "-inf", "1e999KB"])
def test_undefined_or_infinite_sizes_are_refused(text: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"^not a finite size: {re.escape(repr(text))} \(expected e\.g\. 10, 10KB, 1MB\)$",
    ):
        parse_size(text)


def test_exactly_a_tebibyte_is_the_largest_size() -> None:
    assert parse_size("1024GB") == parse_size("1099511627776") == 1_099_511_627_776
    with pytest.raises(ValueError, match=r"^size '1099511627777' is more than 1 TiB$"):
        parse_size("1099511627777")


@pytest.mark.parametrize("text", ["2048GB", "1e300", "1025GB"])
def test_sizes_past_a_tebibyte_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=rf"^size {re.escape(repr(text))} is more than 1 TiB$"):
        parse_size(text)
