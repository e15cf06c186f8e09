"""Where the steady-state steps of a capture are (pure): step windows.

Three sources, by what the job gives:

* step markers (``launch.markers``; phase ``steady``): markers with the same
  step number (one per driving task) make one window from the earliest start
  to the latest end (``step_windows``);
* TensorFlow step ids: every RecvTensor (and RecvBuf) request names the step id
  of the function or graph run that needs the tensor, so the calls sharing one
  are one worker-step (``step_id_windows``); asynchronous training, whose steps
  overlap in time, and user jobs without markers;
* collective instance keys: MultiWorkerMirrored's RecvBuf calls all carry step
  id 0, but the collectives' instance keys repeat with a period of one step
  (``collective_windows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tf_grpc_bench.profiler.assembly.tf_messages import (
    MessageDecodeError,
    decode_recv_buf_request,
    decode_recv_tensor_request,
)
from tf_grpc_bench.profiler.launch.markers import StepMarker
from tf_grpc_bench.profiler.recorders.calls import RecordedCall
from tf_grpc_bench.trace import RECV_BUF, RECV_TENSOR


@dataclass(frozen=True, slots=True, kw_only=True)
class StepWindow:
    """One steady-state step's time window (monotonic ns) and its marker step number."""

    number: int
    start_ns: int
    end_ns: int
    #: The TensorFlow step id whose RecvTensor/RecvBuf calls make this step
    #: (user jobs without markers); 0 when the window comes from markers.
    step_id: int = 0


def step_windows(markers: Sequence[StepMarker]) -> list[StepWindow]:
    """Steady-state step windows from step markers, by start time.

    Markers with the same step number (one per driving task: tf1-ps, mwms) are
    one step, from the earliest start to the latest end.
    """
    grouped: dict[int, list[StepMarker]] = {}
    for marker in markers:
        if marker.phase == "steady":
            grouped.setdefault(marker.step, []).append(marker)
    windows = [
        StepWindow(
            number=number,
            start_ns=min(m.start_ns for m in group),
            end_ns=max(m.end_ns for m in group),
        )
        for number, group in grouped.items()
    ]
    return sorted(windows, key=lambda w: (w.start_ns, w.number))


def step_id_of(call: RecordedCall) -> int:
    """The TensorFlow step id a RecvTensor/RecvBuf request names (0: none or unknown)."""
    try:
        if call.method == RECV_TENSOR:
            return decode_recv_tensor_request(call.request_head).step_id
        if call.method == RECV_BUF:
            return decode_recv_buf_request(call.request_head).step_id
    except MessageDecodeError:
        return 0
    return 0


def _involves_ps(call: RecordedCall) -> bool:
    """A RecvTensor whose rendezvous key names a ps task at either end."""
    if call.method != RECV_TENSOR:
        return False
    try:
        key = decode_recv_tensor_request(call.request_head).rendezvous_key
    except MessageDecodeError:
        return False
    return "/job:ps/" in key


def step_id_windows(
    calls: Sequence[RecordedCall],
    *,
    warmup_steps: int = 0,
    start_ns: int | None = None,
    end_ns: int | None = None,
    count: int | None = None,
) -> tuple[list[StepWindow], frozenset[int]]:
    """One window per TensorFlow step id (one worker-step), ordered by first call.

    Every RecvTensor (and RecvBuf) request names the step id of the function
    or graph run that needs the tensor, so the calls sharing one are one
    worker-step.  Only the transfers to or from parameter servers count when
    there are some (other functions, such as the chief fetching a loss, have
    step ids of their own).  Step ids whose first call comes before ``start_ns``, and the
    ``warmup_steps`` first of the others, are start-up; those starting after
    ``end_ns`` are left to teardown.  With ``count``, only the last ``count``
    are steps and any earlier ones start-up (a slow worker's warm-up step
    may start after a fast one's first steady step).  Returns the windows and
    the start-up step ids.  Calls with step id 0 (RecvBuf under MultiWorkerMirrored)
    delimit nothing: ``collective_windows`` finds those steps.
    """
    spans: dict[int, list[int]] = {}
    with_ps = [call for call in calls if _involves_ps(call)]
    for call in with_ps or calls:
        step_id = step_id_of(call)
        if step_id:
            span = spans.get(step_id)
            if span is None:
                spans[step_id] = [call.start_ns, call.end_ns]
            else:
                span[0] = min(span[0], call.start_ns)
                span[1] = max(span[1], call.end_ns)
    ordered = sorted((start, end, step_id) for step_id, (start, end) in spans.items())
    early = [o for o in ordered if start_ns is not None and o[0] < start_ns]
    rest = [o for o in ordered if start_ns is None or o[0] >= start_ns]
    startup = early + rest[:warmup_steps]
    kept = [o for o in rest[warmup_steps:] if end_ns is None or o[0] <= end_ns]
    if count is not None and len(kept) > count:
        startup += kept[: len(kept) - count]
        kept = kept[len(kept) - count :]
    windows = [
        StepWindow(number=number, start_ns=start, end_ns=end, step_id=step_id)
        for number, (start, end, step_id) in enumerate(kept)
    ]
    return windows, frozenset(step_id for _, _, step_id in startup)


def collective_instance_of(call: RecordedCall) -> tuple[int, int] | None:
    """(group key, instance key) of a RecvBuf call, from its buffer's rendezvous key.

    TensorFlow's collectives name a buffer ``group:instance:frame:iteration:...``;
    None for any other call or key.
    """
    if call.method != RECV_BUF:
        return None
    try:
        key = decode_recv_buf_request(call.request_head).buf_rendezvous_key
    except MessageDecodeError:
        return None
    fields = key.split(":")
    if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return int(fields[0]), int(fields[1])


def _buffer_bytes(call: RecordedCall) -> int:
    """The size a RecvBuf request asks for (its response's length if it names none)."""
    try:
        return decode_recv_buf_request(call.request_head).num_bytes or call.response_bytes
    except MessageDecodeError:
        return call.response_bytes


def repeating_tail(signatures: Sequence[object], *, longest_period: int = 256) -> tuple[int, int]:
    """(period, first index) of the longest run at the end of ``signatures`` that
    repeats with one period, at least twice; (0, len) if there is none.

    The run starts where the repetition starts (so a run cut short at the end,
    as when a job is stopped mid-step, still starts on a whole period).  Ties
    go to the shorter period (a run with period K also repeats with 2K).
    """
    count = len(signatures)
    best = (0, count)
    best_length = 0
    for period in range(1, min(longest_period, count // 2) + 1):
        matching = 0
        for index in range(count - 1, period - 1, -1):
            if signatures[index] != signatures[index - period]:
                break
            matching += 1
        length = matching + period
        if matching >= period and length > best_length:
            best, best_length = (period, count - length), length
    return best


def collective_windows(calls: Sequence[RecordedCall], *, warmup_steps: int = 0) -> list[StepWindow]:
    """Steps of a collective (MultiWorkerMirrored) job from its RecvBuf calls.

    Their step ids are all 0, but every collective launch has an instance key
    of its own, counting up, and a synchronous training step launches the same
    collectives each time.  So the instance keys, each summarised by its
    transfers (who to whom, how many bytes), repeat with a period of one step:
    the longest periodic run at the end is the training, each period of
    instance keys one step, everything before it (the initial broadcasts) and
    the first ``warmup_steps`` periods start-up.  A window spans the calls of
    its period's instance keys.  [] when no such run is found.
    """
    transfers: dict[tuple[int, int], list[RecordedCall]] = {}
    for call in calls:
        instance = collective_instance_of(call)
        if instance is not None:
            transfers.setdefault(instance, []).append(call)
    instances = sorted(transfers)
    signatures = [
        tuple(sorted((c.caller_pid or 0, c.callee, _buffer_bytes(c)) for c in transfers[i]))
        for i in instances
    ]
    period, first = repeating_tail(signatures)
    if not period:
        return []
    windows: list[StepWindow] = []
    for start in range(first + warmup_steps * period, len(instances) - period + 1, period):
        block = [c for i in instances[start : start + period] for c in transfers[i]]
        windows.append(
            StepWindow(
                number=len(windows),
                start_ns=min(c.start_ns for c in block),
                end_ns=max(c.end_ns for c in block),
            )
        )
    return windows
