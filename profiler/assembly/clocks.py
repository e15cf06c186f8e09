"""Put tasks recorded on different hosts on one clock, from what the wire says (pure).

Every task records its sends with its own host's ``CLOCK_MONOTONIC``, whose
zero is that host's boot.  Within a task its own clock is used as it is; across
tasks all that is known for sure is causality: a call's request was sent
before its server answered it (the server cannot answer a stream that does
not exist yet).  Each such pair says, for the clock offsets ``o`` that put a
task's times on the reference task's clock (``reference = own + o``)::

    request_sent_ns + o[caller] <= response_sent_ns + o[callee]

that is ``o[caller] - o[callee] <= response_sent_ns - request_sent_ns``: one
upper bound per ordered pair of tasks.  Calls in both directions between two
tasks (workers pull weights from a ps, the ps pulls gradients from them)
bound the difference from both sides; bounds chain through third tasks.  The
tightest bounds of every task's offset against the reference are shortest
paths in the graph of these difference constraints (``estimate_offsets``): the
estimate is the middle of the interval, its uncertainty half its width.  A
cycle of negative weight means the records contradict each other (a clock
that jumped, or records of different runs): ``ClockError``.

Tasks known to share a clock (the same kernel: same boot id) get offsets
exactly equal to each other's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tf_grpc_bench.errors import CaptureError

#: ``ClockEstimate.source`` values.
REFERENCE = "reference"
SHARED_CLOCK = "shared-clock"
WIRE = "wire"


class ClockError(CaptureError):
    """The records' clocks cannot be reconciled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Precedence:
    """An event at ``before_ns`` on ``before``'s clock happened before one at ``after_ns``
    on ``after``'s clock (a request sent, then its response sent)."""

    before: str
    before_ns: int
    after: str
    after_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockEstimate:
    """A task's clock offset against the reference: ``reference time = own time + offset_ns``.

    ``lower_ns``/``upper_ns`` bound it (None: no bound on that side, the wire
    did not say); ``offset_ns`` is their middle (the one known bound, or 0, when
    one is missing).  ``constraints`` counts the precedences between this task
    and others.
    """

    task: str
    offset_ns: int
    lower_ns: int | None
    upper_ns: int | None
    source: str
    constraints: int = 0

    @property
    def bounded(self) -> bool:
        return self.lower_ns is not None and self.upper_ns is not None

    @property
    def uncertainty_ns(self) -> int | None:
        """Half the width of [lower, upper], None when a bound is missing."""
        if self.lower_ns is None or self.upper_ns is None:
            return None
        return (self.upper_ns - self.lower_ns + 1) // 2


def estimate_offsets(
    tasks: Sequence[str],
    precedences: Iterable[Precedence],
    *,
    reference: str,
    shared_clocks: Iterable[Iterable[str]] = (),
) -> dict[str, ClockEstimate]:
    """Every task's offset against ``reference`` (see the module docstring).

    ``shared_clocks`` are groups of tasks known to read the same clock (their
    offsets are pinned equal).  Precedences naming tasks not in ``tasks`` are
    ignored.  ClockError if the constraints contradict each other.
    """
    index = {task: number for number, task in enumerate(tasks)}
    if reference not in index:
        raise ClockError(f"reference task {reference} is not among the tasks")
    count = len(tasks)
    infinity = None
    # weight[a][b]: o[b] - o[a] <= weight (an edge a -> b), None if unbounded.
    weight: list[list[int | None]] = [[infinity] * count for _ in range(count)]
    for number in range(count):
        weight[number][number] = 0
    constraints = [0] * count

    def bound(a: int, b: int, value: int) -> None:
        current = weight[a][b]
        if current is None or value < current:
            weight[a][b] = value

    for item in precedences:
        if item.before not in index or item.after not in index:
            continue
        before, after = index[item.before], index[item.after]
        if before == after:
            continue
        # o[before] - o[after] <= after_ns - before_ns: an edge after -> before.
        bound(after, before, item.after_ns - item.before_ns)
        constraints[before] += 1
        constraints[after] += 1
    shared: dict[int, set[int]] = {}
    for group in shared_clocks:
        members = [index[t] for t in group if t in index]
        for a in members:
            shared.setdefault(a, set()).update(members)
            for b in members:
                bound(a, b, 0)
    _shortest_paths(weight)
    for number in range(count):
        if (weight[number][number] or 0) < 0:
            raise ClockError(
                f"the records' clocks contradict each other around task {tasks[number]}: "
                "some response would have been sent before its request (records of "
                "different runs, or a clock that jumped)"
            )
    origin = index[reference]
    estimates = {}
    for task, number in index.items():
        upper = weight[origin][number]
        back = weight[number][origin]
        lower = None if back is None else -back
        if number == origin:
            source = REFERENCE
        elif origin in shared.get(number, ()):
            source = SHARED_CLOCK
        else:
            source = WIRE
        if lower is not None and upper is not None:
            offset = (lower + upper) // 2
        else:
            offset = lower if lower is not None else (upper if upper is not None else 0)
        estimates[task] = ClockEstimate(
            task=task,
            offset_ns=offset,
            lower_ns=lower,
            upper_ns=upper,
            source=source,
            constraints=constraints[number],
        )
    return estimates


def _shortest_paths(weight: list[list[int | None]]) -> None:
    """Floyd-Warshall in place over ``weight`` (None: no edge)."""
    count = len(weight)
    for middle in range(count):
        through = weight[middle]
        for a in range(count):
            first = weight[a][middle]
            if first is None:
                continue
            row = weight[a]
            for b in range(count):
                second = through[b]
                if second is None:
                    continue
                total = first + second
                current = row[b]
                if current is None or total < current:
                    row[b] = total
