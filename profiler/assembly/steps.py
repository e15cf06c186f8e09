"""Where the steady-state steps of a capture are (pure): step windows.

A step is what training does, not a count: a TensorFlow *run* (the calls
sharing one step id: every RecvTensor, RecvBuf, RunGraph and CleanupGraph
request names the step id of the function or graph run it serves) is a
training step when it moves the model's variables, tensors pulled by a worker
and the same dtypes and shapes pushed back (weights and gradients;
``training_runs``).  Session-start checks, variable initialisation, global-step
reads and queue runners move tensors one way or none, so they are set aside
however many there are.  ``find_steps`` applies that rule to every job, then
takes the steps from what the job gives:

* step markers (``launch.markers``; phase ``steady``): markers with the same
  step number (one per driving task) make one window from the earliest start
  to the latest end (``step_windows``);
* no markers, or asynchronous training (whose steps overlap in time): each
  training run is a step, one worker-step (``find_runs``);
* collective instance keys: MultiWorkerMirrored's RecvBuf calls all carry step
  id 0, but the collectives' instance keys repeat with a period of one step
  (``collective_windows``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tf_grpc_bench.profiler.assembly.tf_messages import (
    MessageDecodeError,
    decode_graph_step_id,
    decode_recv_buf_request,
    decode_recv_tensor_request,
    decode_recv_tensor_response,
    parse_rendezvous_key,
    task_of_device,
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
    #: The TensorFlow step id whose calls make this step (a run found by
    #: ``find_steps``); 0 when the window comes from markers or collectives.
    step_id: int = 0
    #: The task whose run it is (``job:index``), "" if the window is not one run's.
    task: str = ""
    #: The collective launches, (group key, instance key), whose calls make this
    #: step (``collective_windows``); empty for other windows.
    instances: frozenset[tuple[int, int]] = frozenset()


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
    """The TensorFlow step id (run) a call's request names: RecvTensor, RecvBuf,
    RunGraph and CleanupGraph requests carry one (0: none or unknown)."""
    try:
        if call.method == RECV_TENSOR:
            return decode_recv_tensor_request(call.request_head).step_id
        if call.method == RECV_BUF:
            return decode_recv_buf_request(call.request_head).step_id
        return decode_graph_step_id(call.method, call.request_head)
    except MessageDecodeError:
        return 0


# --------------------------------------------------------------------------
# TensorFlow runs, and which of them are training steps.

#: (dtype, shape) of a tensor, ``_ref`` dropped (TF1 reads a ref variable as its value).
TensorKey = tuple[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One TensorFlow run (one step id) and what its tensor transfers moved.

    ``task`` is the task the run belongs to (``job:index``): the non-ps task
    at the end of most of its transfers (the worker whose step it is), "" if
    it made none.  ``start_ns``/``end_ns`` span its transfers (all its calls
    if it made none).  ``variable_bytes`` are the content bytes of the
    tensors that went both ways between ``task`` and its peers with the same
    dtype and shape, counted once: a variable pulled and its gradient pushed
    back, as training does; a readiness check or a global-step read moves
    tensors one way only.
    """

    step_id: int
    task: str
    start_ns: int
    end_ns: int
    transfers: int
    variable_bytes: int


#: A run is a training step when it moves at least this share of the variable
#: bytes of the run that moved the most (runs that move some by chance, such as
#: a statistics update recomputed by a queue runner, move a few percent).
TRAINING_SHARE = 0.1
#: Why traffic was kept out of the steps (``trace.SetAside.reason``).
MOVED_NO_VARIABLES = "moved no variables"
WARMUP_STEP = "warm-up step"
OUTSIDE_MARKERS = "outside the steady step markers"
SESSION_SETUP = "session and graph set-up"
BEFORE_FIRST_STEP = "before the first step"
AFTER_LAST_STEP = "after the last step"

#: Calls that set up or tear down sessions and graphs: never part of a step,
#: whenever they happen (a worker that joins late registers its graphs while
#: the others train).
SESSION_METHODS = frozenset(
    {
        "/tensorflow.WorkerService/GetStatus",
        "/tensorflow.WorkerService/CreateWorkerSession",
        "/tensorflow.WorkerService/DeleteWorkerSession",
        "/tensorflow.WorkerService/RegisterGraph",
        "/tensorflow.WorkerService/DeregisterGraph",
        "/tensorflow.WorkerService/CleanupAll",
        "/tensorflow.eager.EagerService/CreateContext",
        "/tensorflow.eager.EagerService/UpdateContext",
        "/tensorflow.eager.EagerService/CloseContext",
    }
)


@dataclass(frozen=True, slots=True)
class _Transfer:
    """One RecvTensor as a run sees it: tasks at both ends, the tensor, its size."""

    source: str
    destination: str
    key: TensorKey
    content_bytes: int
    start_ns: int
    end_ns: int


def _transfer(call: RecordedCall) -> _Transfer | None:
    """A RecvTensor call's ends (from its rendezvous key) and tensor; None if unreadable."""
    try:
        request = decode_recv_tensor_request(call.request_head)
        response = decode_recv_tensor_response(call.response_head)
    except MessageDecodeError:
        return None
    key = parse_rendezvous_key(request.rendezvous_key)
    if key is None:
        return None
    source, destination = task_of_device(key.src_device), task_of_device(key.dst_device)
    if source is None or destination is None or source == destination:
        return None
    tensor = response.tensor
    dtype = tensor.dtype.removesuffix("_ref") if tensor else ""
    shape = tensor.shape if tensor and tensor.shape is not None else ()
    return _Transfer(
        source=f"{source[0]}:{source[1]}",
        destination=f"{destination[0]}:{destination[1]}",
        key=(dtype, tuple(shape)),
        content_bytes=tensor.content_bytes if tensor else 0,
        start_ns=call.start_ns,
        end_ns=call.end_ns,
    )


def _run_task(transfers: Sequence[_Transfer]) -> str:
    """The task most of a run's transfers start or end at, non-ps tasks first."""
    ends = Counter(end for t in transfers for end in (t.source, t.destination))
    candidates = [task for task in ends if not task.startswith("ps:")] or list(ends)
    return max(sorted(candidates), key=lambda task: ends[task]) if candidates else ""


def _variable_bytes(task: str, transfers: Sequence[_Transfer]) -> int:
    """Bytes of the tensors that went to ``task`` and came back with the same dtype and shape."""
    incoming: Counter[TensorKey] = Counter()
    outgoing: Counter[TensorKey] = Counter()
    sizes: dict[TensorKey, int] = {}
    for transfer in transfers:
        if not transfer.content_bytes:
            continue  # control edges and empty tensors carry no variable
        sizes[transfer.key] = transfer.content_bytes
        if transfer.destination == task:
            incoming[transfer.key] += 1
        elif transfer.source == task:
            outgoing[transfer.key] += 1
    return sum(min(count, outgoing[key]) * sizes[key] for key, count in incoming.items())


def find_runs(calls: Sequence[RecordedCall]) -> list[Run]:
    """Every TensorFlow run the calls name by step id, ordered by start.

    MultiWorkerMirrored's RecvBuf calls carry step id 0 and make no run.
    """
    members: dict[int, list[RecordedCall]] = {}
    for call in calls:
        step_id = step_id_of(call)
        if step_id:
            members.setdefault(step_id, []).append(call)
    runs = []
    for step_id, group in members.items():
        transfers = [t for c in group if c.method == RECV_TENSOR if (t := _transfer(c))]
        task = _run_task(transfers)
        mine = [t for t in transfers if task in (t.source, t.destination)]
        spans = [(t.start_ns, t.end_ns) for t in mine] or [(c.start_ns, c.end_ns) for c in group]
        runs.append(
            Run(
                step_id=step_id,
                task=task,
                start_ns=min(start for start, _ in spans),
                end_ns=max(end for _, end in spans),
                transfers=len(mine),
                variable_bytes=_variable_bytes(task, mine),
            )
        )
    return sorted(runs, key=lambda r: (r.start_ns, r.step_id))


def training_runs(runs: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """(training steps, the others): a run trains when it moves the model's variables,
    at least ``TRAINING_SHARE`` of the variable bytes of the run that moved the most."""
    largest = max((r.variable_bytes for r in runs), default=0)
    training = [r for r in runs if largest and r.variable_bytes >= largest * TRAINING_SHARE]
    chosen = {r.step_id for r in training}
    return training, [r for r in runs if r.step_id not in chosen]


def run_windows(runs: Sequence[Run]) -> list[StepWindow]:
    """One window per run, numbered in order."""
    return [
        StepWindow(
            number=number, start_ns=r.start_ns, end_ns=r.end_ns, step_id=r.step_id, task=r.task
        )
        for number, r in enumerate(runs)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class FoundSteps:
    """Where a capture's steps are, and what was kept out of them.

    ``set_aside_runs`` maps the step id of every run that is no step to why
    (``MOVED_NO_VARIABLES``, ``WARMUP_STEP``, ``OUTSIDE_MARKERS``).
    """

    windows: tuple[StepWindow, ...]
    set_aside_runs: Mapping[int, str]
    #: "markers", "step-id" or "collective-instance" (``trace.StepDetection.source``).
    source: str
    rule: str
    candidates: int


_RUN_RULE = (
    "a step is a TensorFlow run that moves the model's variables (tensors pulled by a "
    "worker and the same dtypes and shapes pushed back: weights and gradients), at least "
    f"{TRAINING_SHARE:.0%} of the largest run's"
)


def find_steps(
    calls: Sequence[RecordedCall],
    *,
    markers: Sequence[StepMarker] = (),
    warmup_steps: int = 0,
    per_run: bool = False,
    need_markers: bool = False,
) -> FoundSteps:
    """The steps of a capture (pure).

    Every run that moves no variables (``training_runs``) is set aside,
    whatever marks the steps.  Steady ``markers`` give the steps, unless
    ``per_run`` (asynchronous training, whose steps overlap): then each
    training run within the steady markers' span is a step, as many as the
    steady markers (the earliest others are warm-up).  Without markers each
    training run is a step, the first ``warmup_steps`` of them warm-up; a
    job with no runs (MultiWorkerMirrored) gets its steps from the periods of
    its collectives (``collective_windows``).  With ``need_markers`` (the
    launcher's jobs, which always mark their steps) there are no steps
    without steady markers.
    """
    runs = find_runs(calls)
    training, idle = training_runs(runs)
    aside = {r.step_id: MOVED_NO_VARIABLES for r in idle}
    steady = step_windows(markers)
    if need_markers and not steady:
        return FoundSteps(
            windows=(),
            set_aside_runs=aside,
            source="markers",
            rule="a step is what the job's step markers span; it wrote none",
            candidates=0,
        )
    if steady and not per_run:
        return FoundSteps(
            windows=tuple(steady),
            set_aside_runs=aside,
            source="markers",
            rule=(
                "a step is what the job's step markers of one step number span, less the "
                "TensorFlow runs that move no variables (weights pulled, gradients of the same "
                "dtypes and shapes pushed back)"
            ),
            candidates=len(steady),
        )
    if steady:
        first, last = steady[0].start_ns, max(w.end_ns for w in steady)
        count = sum(1 for m in markers if m.phase == "steady")
        inside = [r for r in training if first <= r.start_ns <= last]
        kept = inside[-count:] if count else inside
        chosen = {r.step_id for r in kept}
        aside.update((r.step_id, OUTSIDE_MARKERS) for r in training if r.step_id not in chosen)
        return FoundSteps(
            windows=tuple(run_windows(kept)),
            set_aside_runs=aside,
            source="step-id",
            rule=_RUN_RULE + ", within the steady step markers, as many as they are",
            candidates=len(runs),
        )
    collective = None if training else _collective_steps(calls, aside, warmup_steps)
    if collective is not None:
        return collective
    aside.update((r.step_id, WARMUP_STEP) for r in training[:warmup_steps])
    return FoundSteps(
        windows=tuple(run_windows(training[warmup_steps:])),
        set_aside_runs=aside,
        source="step-id",
        rule=_RUN_RULE + f"; the first {warmup_steps} training runs are warm-up",
        candidates=len(runs),
    )


def _collective_steps(
    calls: Sequence[RecordedCall], aside: Mapping[int, str], warmup_steps: int
) -> FoundSteps | None:
    """The steps of a collective job (``collective_windows``), the first ``warmup_steps``
    periods left to start-up; None if its collectives do not repeat."""
    periods = collective_windows(calls)
    if not periods:
        return None
    return FoundSteps(
        windows=tuple(
            dataclasses.replace(w, number=n) for n, w in enumerate(periods[warmup_steps:])
        ),
        set_aside_runs=aside,
        source="collective-instance",
        rule=(
            "a step is one period of the collectives' instance keys, which repeat with the "
            f"training's steps; what comes before and the first {warmup_steps} periods are "
            "start-up"
        ),
        candidates=len(periods),
    )


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
    its period's instance keys, and names them: the periods of two workers
    overlap in time, so a call goes to its step by its instance key, not its
    time (``phases.split_traffic``).  [] when no such run is found.
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
        keys = instances[start : start + period]
        block = [c for i in keys for c in transfers[i]]
        windows.append(
            StepWindow(
                number=len(windows),
                start_ns=min(c.start_ns for c in block),
                end_ns=max(c.end_ns for c in block),
                instances=frozenset(keys),
            )
        )
    return windows
