"""The paper's message size categories (TF-gRPC-Bench, Table 1).

| category | default size | range            |
|----------|--------------|------------------|
| Small    | 10 B         | [1 B, 1 KiB)     |
| Medium   | 10 KiB       | [1 KiB, 1 MiB)   |
| Large    | 1 MiB        | [1 MiB, 10 MiB]  |

KB and MB are read as 1024 and 1024**2 bytes.  Traces hold messages outside
these ranges (empty control-edge tensors, 40 MB collectives): ``classify``
puts 0 B with Small and anything over 10 MiB with Large, so every message has
exactly one category.
"""

from __future__ import annotations

import enum
import math

KIB = 1024
MIB = 1024 * 1024


class SizeCategory(enum.Enum):
    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"

    @property
    def minimum_bytes(self) -> int:
        """Smallest size of the category's range, inclusive."""
        return _RANGES[self][0]

    @property
    def maximum_bytes(self) -> int:
        """Largest size of the category's range, inclusive."""
        return _RANGES[self][1]

    @property
    def default_bytes(self) -> int:
        """The paper's default buffer size for the category."""
        return _DEFAULTS[self]


_RANGES = {
    SizeCategory.SMALL: (1, KIB - 1),
    SizeCategory.MEDIUM: (KIB, MIB - 1),
    SizeCategory.LARGE: (MIB, 10 * MIB),
}
_DEFAULTS = {
    SizeCategory.SMALL: 10,
    SizeCategory.MEDIUM: 10 * KIB,
    SizeCategory.LARGE: MIB,
}


def classify(size_bytes: int) -> SizeCategory:
    """Return the category of a message of ``size_bytes`` bytes."""
    if size_bytes < 0:
        raise ValueError(f"message size must be >= 0, got {size_bytes}")
    if size_bytes < KIB:
        return SizeCategory.SMALL
    if size_bytes < MIB:
        return SizeCategory.MEDIUM
    return SizeCategory.LARGE


#: Largest size ``parse_size`` accepts (1 TiB): far past any message or buffer the
#: tool can send, small enough that arithmetic on it stays exact.
MAX_SIZE_BYTES = 1024**4


def parse_size(text: str) -> int:
    """Parse ``"10"``, ``"10B"``, ``"10KB"``, ``"1MB"``, ``"1.5MiB"`` into bytes.

    KB/KiB and MB/MiB both mean powers of 1024, as in the paper.  ValueError
    for anything else, a negative or non-finite number, or more than
    ``MAX_SIZE_BYTES``.
    """
    cleaned = text.strip().upper().replace("IB", "B")
    multipliers = {"GB": 1024**3, "MB": MIB, "KB": KIB, "B": 1, "G": 1024**3, "M": MIB, "K": KIB}
    number, multiplier = cleaned, 1
    for suffix, factor in multipliers.items():
        if cleaned.endswith(suffix):
            number, multiplier = cleaned[: -len(suffix)].strip(), factor
            break
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (expected e.g. 10, 10KB, 1MB)") from None
    if not math.isfinite(value):
        raise ValueError(f"not a finite size: {text!r} (expected e.g. 10, 10KB, 1MB)")
    if value < 0:
        raise ValueError(f"size must be >= 0: {text!r}")
    if value * multiplier > MAX_SIZE_BYTES:
        raise ValueError(f"size {text!r} is more than {MAX_SIZE_BYTES // 1024**4} TiB")
    return round(value * multiplier)
