"""The paper's payload generators: which buffers ("iovec buffers") make up each payload.

A payload is a tuple of buffer sizes in bytes (``PayloadSpec``); what bytes
the buffers hold does not matter to the benchmarks, only their sizes.  Three
generators decide the size category of each buffer:

``uniform``
    The chosen categories in turn (round-robin), continuing from one payload to
    the next: over any run of buffers, the counts of two categories differ by
    at most one.  With one chosen category every buffer has that category.

``random``
    Each buffer's category is drawn independently and uniformly from the chosen
    categories by a ``numpy.random.Generator`` seeded with ``seed``: the same
    configuration gives the same payloads on every machine.  (The paper names
    the generator but gives no law and no seed.)

``skew``
    Biased to one category.  With all three categories chosen the bias category
    gets 60% of the buffers, the next 30%, the last 10%; "next" is the category
    nearest the bias in size, the larger one on a tie.  So Large bias (the
    default) gives Large 60 / Medium 30 / Small 10, Small bias gives Small 60 /
    Medium 30 / Large 10, Medium bias gives Medium 60 / Large 30 / Small 10.
    With two categories chosen the weights are 60:30 (2/3 and 1/3); with one,
    100%.  Categories are dealt deterministically (smooth weighted round-robin:
    each buffer goes to the category furthest below its share so far), so every
    prefix of the buffer sequence is within one buffer of the exact proportions
    and a 10-buffer payload is exactly 6/3/1.

Buffer sizes: each buffer has its category's configured size (the paper's 10 B,
10 KiB, 1 MiB by default), or, with ``random_sizes``, a size drawn uniformly
from the category's whole range by the same seeded generator.

Pure: no IO, no clocks; randomness only from the seeded generator.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.sizes import SizeCategory

#: Buffer sizes of one payload, in bytes, in order.
PayloadSpec = tuple[int, ...]

#: The skew generator's shares, in tenths, from the bias category outwards.
SKEW_SHARES = (6, 3, 1)

_SIZE_ORDER = (SizeCategory.SMALL, SizeCategory.MEDIUM, SizeCategory.LARGE)


class GeneratorKind(enum.Enum):
    UNIFORM = "uniform"
    RANDOM = "random"
    SKEW = "skew"


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferSizes:
    """The size used for a buffer of each category (``--small-size`` ...), in bytes."""

    small_bytes: int = SizeCategory.SMALL.default_bytes
    medium_bytes: int = SizeCategory.MEDIUM.default_bytes
    large_bytes: int = SizeCategory.LARGE.default_bytes

    def __post_init__(self) -> None:
        for category in _SIZE_ORDER:
            size = self.size_of(category)
            if not category.minimum_bytes <= size <= category.maximum_bytes:
                raise ConfigError(
                    f"--{category.value}-size: {size} B is outside the {category.value} range "
                    f"[{category.minimum_bytes}, {category.maximum_bytes}] B"
                )

    def size_of(self, category: SizeCategory) -> int:
        return {
            SizeCategory.SMALL: self.small_bytes,
            SizeCategory.MEDIUM: self.medium_bytes,
            SizeCategory.LARGE: self.large_bytes,
        }[category]


#: Most buffers in one payload (the paper uses 10), and payloads in a cycle; the
#: generators build every buffer's size up front, so their product is bounded too.
MAX_BUFFERS_PER_PAYLOAD = 10_000
MAX_PAYLOADS = 10_000
MAX_BUFFERS = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratorConfig:
    """Everything that decides a synthetic workload's payloads."""

    kind: GeneratorKind = GeneratorKind.UNIFORM
    #: Chosen categories; duplicates are removed and the order is Small, Medium, Large.
    categories: tuple[SizeCategory, ...] = _SIZE_ORDER
    buffers_per_payload: int = 10
    sizes: BufferSizes = field(default_factory=BufferSizes)
    #: Seed of the generator used by ``random`` and by ``random_sizes``.
    seed: int = 0
    #: Draw each buffer's size uniformly from its category's range.
    random_sizes: bool = False
    #: The skew generator's favoured category; None means Large, or the largest chosen.
    skew_bias: SizeCategory | None = None
    #: How many payloads to generate; the benchmarks send them in a cycle.
    payload_count: int = 10

    def __post_init__(self) -> None:
        ordered = tuple(c for c in _SIZE_ORDER if c in set(self.categories))
        if not ordered:
            raise ConfigError("--categories: choose at least one of small, medium, large")
        object.__setattr__(self, "categories", ordered)
        if not 1 <= self.buffers_per_payload <= MAX_BUFFERS_PER_PAYLOAD:
            raise ConfigError(
                f"--buffers must be in 1..{MAX_BUFFERS_PER_PAYLOAD}, got {self.buffers_per_payload}"
            )
        if not 1 <= self.payload_count <= MAX_PAYLOADS:
            raise ConfigError(f"--payloads must be in 1..{MAX_PAYLOADS}, got {self.payload_count}")
        if self.buffers_per_payload * self.payload_count > MAX_BUFFERS:
            raise ConfigError(
                f"--buffers {self.buffers_per_payload} x --payloads {self.payload_count} is "
                f"more than {MAX_BUFFERS} buffers to generate"
            )
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")
        if self.skew_bias is not None:
            if self.kind is not GeneratorKind.SKEW:
                raise ConfigError("--skew-bias applies only to --generator skew")
            if self.skew_bias not in ordered:
                raise ConfigError(
                    f"--skew-bias {self.skew_bias.value} is not one of the chosen --categories "
                    f"({','.join(c.value for c in ordered)})"
                )

    @property
    def effective_skew_bias(self) -> SizeCategory:
        if self.skew_bias is not None:
            return self.skew_bias
        return self.categories[-1]

    def skew_shares(self) -> tuple[tuple[SizeCategory, int], ...]:
        """(category, share in tenths) from the bias outwards, for the chosen categories."""
        bias = self.effective_skew_bias
        position = _SIZE_ORDER.index(bias)
        # Nearest in size first; on a tie the larger (higher position) first.
        ordered = sorted(
            self.categories,
            key=lambda c: (abs(_SIZE_ORDER.index(c) - position), -_SIZE_ORDER.index(c)),
        )
        return tuple(zip(ordered, SKEW_SHARES, strict=False))


def _uniform_categories(config: GeneratorConfig, count: int) -> list[SizeCategory]:
    chosen = config.categories
    return [chosen[i % len(chosen)] for i in range(count)]


def _skew_categories(config: GeneratorConfig, count: int) -> list[SizeCategory]:
    shares = config.skew_shares()
    total = sum(share for _, share in shares)
    counts = [0] * len(shares)
    result = []
    for number in range(1, count + 1):
        # Deficit against the exact share after `number` buffers, in tenths of a buffer;
        # the largest deficit wins, the earlier (more favoured) category on a tie.
        deficits = [share * number - total * counts[i] for i, (_, share) in enumerate(shares)]
        chosen = max(range(len(shares)), key=lambda i: (deficits[i], -i))
        counts[chosen] += 1
        result.append(shares[chosen][0])
    return result


def category_sequence(
    config: GeneratorConfig, count: int, rng: np.random.Generator | None = None
) -> list[SizeCategory]:
    """The categories of the first ``count`` buffers the generator deals."""
    if config.kind is GeneratorKind.UNIFORM:
        return _uniform_categories(config, count)
    if config.kind is GeneratorKind.SKEW:
        return _skew_categories(config, count)
    generator = rng if rng is not None else np.random.default_rng(config.seed)
    draws = generator.integers(0, len(config.categories), size=count)
    return [config.categories[int(i)] for i in draws]


def generate_payloads(config: GeneratorConfig) -> tuple[PayloadSpec, ...]:
    """The ``payload_count`` payloads of a synthetic workload.

    Deterministic for a given configuration (the seed included).
    """
    rng = np.random.default_rng(config.seed)
    count = config.payload_count * config.buffers_per_payload
    categories = category_sequence(config, count, rng)
    if config.random_sizes:
        sizes = [
            int(rng.integers(category.minimum_bytes, category.maximum_bytes + 1))
            for category in categories
        ]
    else:
        sizes = [config.sizes.size_of(category) for category in categories]
    per = config.buffers_per_payload
    return tuple(tuple(sizes[i : i + per]) for i in range(0, count, per))
