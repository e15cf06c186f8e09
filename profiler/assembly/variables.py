"""The model's variables as the traffic shows them, for jobs the tool did not write (pure).

In parameter-server training a worker-step pulls every trainable variable from
the ps tasks (RecvTensor, worker -> ps, the weights in the response) and the ps
tasks pull the gradients back (RecvTensor, ps -> worker), each of the same
dtype and shape as its variable.  So the tensors of one worker-step that went
both ways, matched by dtype and shape, are the variables: ``derive_variables``
takes, over every steady step and worker, the largest such matched set.

Only floating-point tensors count (gradients exist for nothing else: an
optimizer's int64 step counter crosses both ways but is no trainable variable).
What this cannot tell apart: floating-point state updated every step that is
not trained (batch-norm moving statistics) crosses both ways too, and is
counted; a variable a step does not update is not.  The trace says the list
came from the traffic (``physics.VARIABLES_SOURCE_EXTRA``), so a reader knows it was
not the model's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tf_grpc_bench.trace import RECV_TENSOR, Step, Task

#: ``physics.VARIABLES_SOURCE_EXTRA``'s value for a list derived from the traffic.
FROM_TRAFFIC = "traffic: tensors a worker pulled from the ps tasks and pushed back in one step"

VariableKey = tuple[str, tuple[int, ...]]
#: Dtypes a gradient can have: the only ones a trainable variable can have.
TRAINABLE_DTYPES = frozenset(
    {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
)


def derive_variables(steps: Sequence[Step], tasks: Sequence[Task]) -> list[VariableKey]:
    """(dtype, shape) of every variable one worker-step moved both ways, in the order it
    was first pulled; [] when no step moved any (no ps tasks, no tensors)."""
    ps_tasks = {i for i, t in enumerate(tasks) if t.job == "ps"}
    best: list[VariableKey] = []
    best_bytes = 0
    for step in steps:
        for worker in sorted({r.caller_task for r in step.rpcs} - ps_tasks):
            pulled: list[VariableKey] = []
            pushed: Counter[VariableKey] = Counter()
            sizes: dict[VariableKey, int] = {}
            for rpc in step.rpcs:
                tensor = rpc.tensor
                if rpc.method != RECV_TENSOR or tensor is None or not tensor.content_bytes:
                    continue
                key = (tensor.dtype.removesuffix("_ref"), tuple(tensor.shape))
                if key[0] not in TRAINABLE_DTYPES:
                    continue
                sizes[key] = tensor.content_bytes
                if rpc.caller_task == worker and rpc.callee_task in ps_tasks:
                    pulled.append(key)
                elif rpc.callee_task == worker and rpc.caller_task in ps_tasks:
                    pushed[key] += 1
            matched = []
            for key in pulled:
                if pushed[key]:
                    pushed[key] -= 1
                    matched.append(key)
            total = sum(sizes[key] for key in matched)
            if total > best_bytes:
                best, best_bytes = matched, total
    return best


def encode_keys(keys: Sequence[VariableKey]) -> str:
    """``dtype:AxB;...``, as ``physics.encode_variables`` writes ``trainable_variables``."""
    return ";".join(f"{dtype}:{'x'.join(str(d) for d in shape)}" for dtype, shape in keys)


def parameter_count(keys: Sequence[VariableKey]) -> int:
    count = 0
    for _, shape in keys:
        elements = 1
        for dimension in shape:
            elements *= dimension
        count += elements
    return count
