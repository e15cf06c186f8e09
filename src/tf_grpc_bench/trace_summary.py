"""Text views of a trace: traffic summaries and the table ``inspect`` prints."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from tf_grpc_bench.calibration import calibration_line
from tf_grpc_bench.capture_cpu import cpu_line
from tf_grpc_bench.host import machine_line
from tf_grpc_bench.sizes import SizeCategory, classify
from tf_grpc_bench.trace import Rpc, Trace, payload_bytes
from tf_grpc_bench.units import format_bytes, format_rate


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficSummary:
    """Counts and bytes of a set of RPCs."""

    rpc_count: int
    rpcs_per_method: tuple[tuple[str, int], ...]
    request_bytes: int
    response_bytes: int
    #: Messages (requests and responses that carry data) per size category.
    #: Counted on the larger of request and response: the message that carries the payload.
    category_counts: tuple[tuple[SizeCategory, int], ...]
    duration_ns: int

    @property
    def total_bytes(self) -> int:
        return self.request_bytes + self.response_bytes


def summarize_rpcs(rpcs: Iterable[Rpc], duration_ns: int = 0) -> TrafficSummary:
    rpc_list = list(rpcs)
    methods = Counter(r.short_method for r in rpc_list)
    categories = Counter(classify(payload_bytes(r)) for r in rpc_list)
    return TrafficSummary(
        rpc_count=len(rpc_list),
        rpcs_per_method=tuple(sorted(methods.items())),
        request_bytes=sum(r.request_bytes for r in rpc_list),
        response_bytes=sum(r.response_bytes for r in rpc_list),
        category_counts=tuple((c, categories.get(c, 0)) for c in SizeCategory),
        duration_ns=duration_ns,
    )


def rate_text(recorded: str) -> str:
    """A rate as a trace records it (bit/s, or a word such as ``unlimited``) for people:
    ``1000000000`` -> ``1 Gbit/s``; anything not a number is returned as it is."""
    return format_rate(int(recorded)) if recorded.isdigit() else recorded


def network_line(trace: Trace) -> str | None:
    """The emulated network the trace was captured on (``capture --network``), if any."""
    extra = dict(trace.metadata.extra)
    if "network" not in extra:
        return None
    addresses = ", ".join(f"{t.job}:{t.index} {t.address}" for t in trace.tasks)
    delay = int(extra.get("network_delay_ns", "0") or 0)
    delayed = f", {_microseconds(delay)} one way" if delay else ""
    return (
        f"network: emulated {extra['network']} "
        f"({rate_text(extra.get('network_rate_bits_per_s', '?'))} per link{delayed}), "
        f"layout {extra.get('network_layout', '?')}, {extra.get('network_hosts', '?')} hosts; "
        f"tasks at {addresses}"
    )


def _microseconds(value: int | None) -> str:
    return "?" if value is None else f"{value / 1000:g} us"


def clock_lines(trace: Trace) -> list[str]:
    """The tasks' clock offsets of a trace assembled from several hosts; [] for one clock."""
    alignment = trace.clock_alignment
    if alignment.empty:
        return []
    lines = [f"clocks: on {alignment.reference}'s; {alignment.method}"]
    for item in alignment.tasks:
        if item.source == "reference":
            continue
        where = f" on {item.host}" if item.host else ""
        if item.source == "shared-clock":
            lines.append(f"  {item.task}{where}: the same clock")
            continue
        lines.append(
            f"  {item.task}{where}: {item.offset_ns / 1000:+g} us "
            f"(within {_microseconds(item.lower_ns)} .. {_microseconds(item.upper_ns)}, "
            f"from {item.constraints} exchanges)"
        )
    return lines


def detection_lines(trace: Trace) -> list[str]:
    """How the trace's steps were found and what was set aside; [] if it does not say."""
    detection = trace.step_detection
    if detection.empty:
        return []
    unit = f"{detection.unit}s" if detection.unit else "steps"
    lines = [
        f"steps: {len(trace.steps)} {unit} from {detection.source or '?'} "
        f"({detection.candidates} candidates): {detection.rule}"
    ]
    for item in detection.set_aside:
        runs = f"{item.runs} run{'' if item.runs == 1 else 's'}, " if item.runs else ""
        lines.append(
            f"  set aside to {item.phase}: {item.reason}: {runs}{item.rpcs} RPCs, "
            f"{format_bytes(item.bytes)}"
        )
    return lines


#: Steps a trace needs before ``steadiness_line`` compares its halves.
STEADINESS_MIN_STEPS = 4
#: How many times one half's median step may last the other's before the trace is called unsteady.
UNSTEADY_RATIO = 1.5


def steadiness_line(trace: Trace) -> str | None:
    """A warning when the trace's first and last steps differ in length by ``UNSTEADY_RATIO``
    or more (median of each half), else None: a capture that was still starting up, or a
    machine busier during part of it, which a replay of some of the steps would carry."""
    steps = trace.steps
    if len(steps) < STEADINESS_MIN_STEPS:
        return None
    half = len(steps) // 2
    first = statistics.median(step.duration_ns for step in steps[:half])
    last = statistics.median(step.duration_ns for step in steps[-half:])
    slower_ns, faster_ns = max(first, last), min(first, last)
    if faster_ns <= 0 or slower_ns < UNSTEADY_RATIO * faster_ns:
        return None
    if first > last:
        slower, faster, why = "first", "last", "the capture may still have been starting up"
    else:
        slower, faster, why = "last", "first", "the machine may have been busier towards the end"
    return (
        f"steps unsteady: the {slower} {half} steps' median ({slower_ns / 1e6:.1f} ms) "
        f"is {slower_ns / faster_ns:.1f} times the {faster} {half}'s "
        f"({faster_ns / 1e6:.1f} ms): {why}; a replay begins at the middle step and "
        "predicts from the steps it covers (docs/fidelity.md); more --warmup-steps or --steps "
        "in the capture steady it"
    )


def format_summary(trace: Trace, *, source: str = "") -> str:
    """The text ``tf-grpc-bench inspect`` prints: metadata, then one line per step."""
    meta = trace.metadata
    lines = []
    if source:
        lines.append(f"trace: {source}")
    lines.append(
        f"format version {trace.format_version}; model {meta.model or '?'}; "
        f"strategy {meta.strategy or '?'}; batch {meta.batch_size}; "
        f"input {'x'.join(map(str, meta.input_shape)) or '?'}; "
        f"TensorFlow {meta.tensorflow_version or '?'}"
    )
    if meta.trainable_parameters:
        lines.append(f"trainable parameters: {meta.trainable_parameters:,}")
    if meta.command:
        lines.append("command: " + " ".join(meta.command))
    if meta.capture_method:
        lines.append(f"captured by: {meta.capture_method}")
    lines.extend(
        line
        for line in (machine_line(meta.extra), calibration_line(meta.extra), cpu_line(meta.extra))
        if line
    )
    network = network_line(trace)
    if network:
        lines.append(network)
    lines.append("tasks: " + ", ".join(f"{t.job}:{t.index}" for t in trace.tasks))
    lines.extend(clock_lines(trace))
    lines.extend(detection_lines(trace))
    if trace.partial:
        lines.append(f"PARTIAL trace: {trace.partial_reason or 'capture ended early'}")
    header = (
        f"{'step':>8} {'rpcs':>6} {'request':>10} {'response':>10} "
        f"{'small':>6} {'medium':>6} {'large':>6} {'time ms':>8}  methods"
    )
    lines.append(header)

    def row(label: str, summary: TrafficSummary) -> str:
        counts = dict(summary.category_counts)
        methods = " ".join(f"{name}={count}" for name, count in summary.rpcs_per_method)
        return (
            f"{label:>8} {summary.rpc_count:>6} {format_bytes(summary.request_bytes):>10} "
            f"{format_bytes(summary.response_bytes):>10} {counts[SizeCategory.SMALL]:>6} "
            f"{counts[SizeCategory.MEDIUM]:>6} {counts[SizeCategory.LARGE]:>6} "
            f"{summary.duration_ns / 1e6:>8.1f}  {methods}"
        )

    if trace.startup.rpcs:
        lines.append(
            row(
                "startup",
                summarize_rpcs(trace.startup.rpcs, trace.startup.end_ns - trace.startup.start_ns),
            )
        )
    for step in trace.steps:
        lines.append(row(str(step.index), summarize_rpcs(step.rpcs, step.duration_ns)))
    if trace.teardown.rpcs:
        lines.append(
            row(
                "teardown",
                summarize_rpcs(
                    trace.teardown.rpcs, trace.teardown.end_ns - trace.teardown.start_ns
                ),
            )
        )
    if not trace.steps:
        lines.append("(no steady-state steps)")
    steadiness = steadiness_line(trace)
    if steadiness:
        lines.append(steadiness)
    return "\n".join(lines)
