"""Check a captured trace against the physics of parameter-server training.

In parameter-server training each worker-step moves every trainable variable
exactly once each way: the worker pulls the weights from the ps tasks, and the
ps tasks pull the worker's gradients.  So a steady-state step of ``W``
worker-steps moves ``2 x trainable bytes x W`` bytes of tensor content
(``2 x parameters x 4 B x W`` for float32), and for each worker the tensors it
pulled from the ps tasks, and those the ps tasks pulled from it, are the
trainable variables, by dtype and shape, a whole number of times.

A step's *worker-steps* are ``W`` when it is a round (synchronous training:
tf2-ps rounds, tf1-ps and MultiWorkerMirrored steps counted per step number),
1 when it is a worker-step (``trace.step_unit``: asynchronous training, a
user job's training runs).  MultiWorkerMirrored moves gradients by all-reduce
instead (``RecvBuf``); its expected bytes use the ring all-reduce law
``2 x (W - 1) x trainable bytes`` and no per-variable check applies.

Pure: works on a ``Trace`` (which records its trainable variables in
``metadata.extra["trainable_variables"]``) and optionally the launcher's
``job.json``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tf_grpc_bench.trace import RECV_BUF, RECV_TENSOR, WORKER_STEP, Rpc, Step, Trace
from tf_grpc_bench.units import format_bytes

#: Allowed relative difference between measured and expected bytes per step.
DEFAULT_TOLERANCE = 0.01

#: Key of the trainable-variable list in RunMetadata.extra.
VARIABLES_EXTRA = "trainable_variables"
#: Key saying where that list came from when not from the model (the traffic:
#: ``assembly.variables``); absent when it came from the model.
VARIABLES_SOURCE_EXTRA = "trainable_variables_source"

_ITEMSIZE = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
}

VariableKey = tuple[str, tuple[int, ...]]


def encode_variables(variables: Sequence[Mapping[str, Any]]) -> str:
    """The compact text kept in ``metadata.extra``: ``dtype:AxB;dtype:C;...`` (trainable only)."""
    parts = []
    for variable in variables:
        if variable.get("trainable", True):
            shape = "x".join(str(int(d)) for d in variable["shape"])
            parts.append(f"{variable['dtype']}:{shape}")
    return ";".join(parts)


def decode_variables(text: str) -> list[VariableKey]:
    """Inverse of ``encode_variables``: (dtype, shape) per trainable variable."""
    keys: list[VariableKey] = []
    for part in filter(None, text.split(";")):
        dtype, _, shape = part.partition(":")
        keys.append((dtype, tuple(int(d) for d in shape.split("x")) if shape else ()))
    return keys


def _variable_bytes(key: VariableKey) -> int:
    count = 1
    for dim in key[1]:
        count *= dim
    return count * _ITEMSIZE.get(key[0], 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCrossings:
    """How often one worker's variables crossed in one step, each way.

    ``pulled``/``pushed`` count whole copies of the trainable variable set
    (weights to the worker, gradients to the ps tasks).  ``extra_pulls``/
    ``extra_pushes`` count the other non-empty tensors that crossed: state
    that is not a trainable variable (batch-norm statistics, the optimizer's
    step counter) and variables beyond the whole copies.
    """

    worker: str
    pulled: int
    pushed: int
    extra_pulls: int = 0
    extra_pushes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPhysics:
    """One step: tensor bytes moved against the expectation, and the crossings."""

    index: int
    tensor_bytes: int
    expected_bytes: int
    worker_steps: int
    crossings: tuple[WorkerCrossings, ...] = ()

    @property
    def relative_error(self) -> float:
        if not self.expected_bytes:
            return 0.0 if not self.tensor_bytes else float("inf")
        return (self.tensor_bytes - self.expected_bytes) / self.expected_bytes

    def problems(self, tolerance: float) -> list[str]:
        found = []
        if abs(self.relative_error) > tolerance:
            found.append(
                f"step {self.index}: {self.tensor_bytes:,} B of tensors, expected "
                f"{self.expected_bytes:,} B ({self.relative_error:+.2%})"
            )
        if self.crossings:
            pulled = sum(c.pulled for c in self.crossings)
            pushed = sum(c.pushed for c in self.crossings)
            if pulled != self.worker_steps or pushed != self.worker_steps:
                found.append(
                    f"step {self.index}: variables pulled {pulled}x and pushed {pushed}x, "
                    f"expected {self.worker_steps}x each way"
                )
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class PhysicsReport:
    """Every steady step of a trace checked against the expected traffic."""

    model: str
    strategy: str
    workers: int
    trainable_parameters: int
    trainable_bytes: int
    variables: int
    tolerance: float
    steps: tuple[StepPhysics, ...]
    #: Why nothing could be checked (the trainable variables are unknown); "" if checked.
    unchecked_reason: str = ""
    #: Where the variables came from when not from the model ("" when they did).
    variables_source: str = ""

    @property
    def problems(self) -> list[str]:
        if self.unchecked_reason:
            return [f"cannot check: {self.unchecked_reason}"]
        found = [p for step in self.steps for p in step.problems(self.tolerance)]
        if not self.steps:
            found.append("the trace has no steady-state steps")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        """A short text report (one line per step), as traces/README.md shows it."""
        lines = [
            f"model {self.model}, {self.strategy}, {self.workers} workers: "
            f"{self.trainable_parameters:,} trainable parameters in {self.variables} variables "
            f"({format_bytes(self.trainable_bytes)})"
        ]
        if self.variables_source:
            lines.append(f"variables from the {self.variables_source}")
        for step in self.steps:
            crossing = ""
            if step.crossings:
                pulled = sum(c.pulled for c in step.crossings)
                pushed = sum(c.pushed for c in step.crossings)
                extra = sum(c.extra_pulls + c.extra_pushes for c in step.crossings)
                crossing = f"; variables pulled {pulled}x, pushed {pushed}x; {extra} other tensors"
            lines.append(
                f"step {step.index}: {step.tensor_bytes:,} B moved, expected "
                f"{step.expected_bytes:,} B ({step.relative_error:+.3%}){crossing}"
            )
        if self.unchecked_reason:
            lines.append(f"cannot check: {self.unchecked_reason}")
        elif not self.steps:
            lines.append("cannot check: the trace has no steady-state steps")
        else:
            lines.append("OK" if self.ok else "MISMATCH: " + "; ".join(self.problems))
        return "\n".join(lines)


def _tensor_bytes(rpcs: Sequence[Rpc]) -> int:
    return sum(
        r.tensor.content_bytes
        for r in rpcs
        if r.tensor is not None and r.method in (RECV_TENSOR, RECV_BUF)
    )


def _copies(seen: Counter[VariableKey], expected: Counter[VariableKey]) -> tuple[int, int]:
    """Whole copies of ``expected`` in ``seen``, and how many tensors were beyond them."""
    if not expected:
        return 0, sum(seen.values())
    copies = min(seen[key] // count for key, count in expected.items())
    return copies, sum(seen.values()) - copies * sum(expected.values())


def _crossings(
    step: Step, trace: Trace, variables: Counter[VariableKey]
) -> tuple[WorkerCrossings, ...]:
    ps_tasks = set(trace.tasks_of_job("ps"))
    result = []
    for worker in trace.tasks_of_job("worker"):
        pulls: Counter[VariableKey] = Counter()
        pushes: Counter[VariableKey] = Counter()
        for rpc in step.rpcs:
            tensor = rpc.tensor
            if rpc.method != RECV_TENSOR or tensor is None or not tensor.content_bytes:
                continue
            key = (tensor.dtype, tuple(tensor.shape))
            if rpc.caller_task == worker and rpc.callee_task in ps_tasks:
                pulls[key] += 1
            elif rpc.callee_task == worker and rpc.caller_task in ps_tasks:
                pushes[key] += 1
        pulled, extra_pulls = _copies(pulls, variables)
        pushed, extra_pushes = _copies(pushes, variables)
        result.append(
            WorkerCrossings(
                worker=trace.task_name(worker),
                pulled=pulled,
                pushed=pushed,
                extra_pulls=extra_pulls,
                extra_pushes=extra_pushes,
            )
        )
    return tuple(result)


def check_physics(
    trace: Trace,
    job_info: Mapping[str, Any] | None = None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> PhysicsReport:
    """Check every steady step of ``trace`` (see the module docstring).

    The trainable variables come from ``job_info["variables"]`` when given,
    else from the trace's metadata (the model's, or for a job the tool did not
    write those its traffic shows: ``assembly.variables``, named in
    ``variables_source``).  When neither has them (no ps tasks, an older
    ``capture-job`` trace), the report checks nothing, is not ``ok`` and says
    why (``unchecked_reason``).
    """
    meta = trace.metadata
    extra = dict(meta.extra)
    if job_info is not None and job_info.get("variables"):
        keys = decode_variables(encode_variables(job_info["variables"]))
        source = ""
    elif extra.get(VARIABLES_EXTRA):
        keys = decode_variables(extra[VARIABLES_EXTRA])
        source = extra.get(VARIABLES_SOURCE_EXTRA, "")
    else:
        return PhysicsReport(
            model=meta.model,
            strategy=meta.strategy,
            workers=len(trace.tasks_of_job("worker")),
            trainable_parameters=0,
            trainable_bytes=0,
            variables=0,
            tolerance=tolerance,
            steps=(),
            unchecked_reason=(
                "the trace does not record the model's trainable variables (none crossed "
                "both ways between a worker and a ps task, or the trace predates recording "
                "them from the traffic); pass them as "
                'check_physics(trace, {"variables": [{"dtype": "float32", "shape": [...]}, ...]})'
            ),
        )
    variables = Counter(keys)
    trainable_bytes = sum(_variable_bytes(k) for k in keys)
    workers = len(trace.tasks_of_job("worker"))
    mirrored = meta.strategy == "multi-worker-mirrored"
    # A step is a round of every worker, except a worker-step (asynchronous
    # training, a user job's training run): one worker's step.  Version 1
    # traces of the launcher's asynchronous tf2-ps said so by their strategy.
    one_worker = trace.step_unit == WORKER_STEP or (
        meta.strategy == "tf2-parameter-server" and not meta.synchronous
    )
    per_step_workers = 1 if one_worker else workers
    if mirrored:
        expected = 2 * max(workers - 1, 0) * trainable_bytes
    else:
        expected = 2 * trainable_bytes * per_step_workers
    steps = tuple(
        StepPhysics(
            index=step.index,
            tensor_bytes=_tensor_bytes(step.rpcs),
            expected_bytes=expected,
            worker_steps=per_step_workers,
            crossings=() if mirrored else _crossings(step, trace, variables),
        )
        for step in trace.steps
    )
    return PhysicsReport(
        model=meta.model,
        strategy=meta.strategy,
        workers=workers,
        trainable_parameters=sum(_variable_bytes(k) // _ITEMSIZE.get(k[0], 4) for k in keys),
        trainable_bytes=trainable_bytes,
        variables=len(keys),
        tolerance=tolerance,
        steps=steps,
        variables_source=source,
    )
