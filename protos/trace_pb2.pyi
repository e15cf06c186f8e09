from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Trace(_message.Message):
    __slots__ = ("format_version", "metadata", "tasks", "startup", "steps", "teardown", "partial", "partial_reason", "step_detection", "clock_alignment")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    STARTUP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TEARDOWN_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_DETECTION_FIELD_NUMBER: _ClassVar[int]
    CLOCK_ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    metadata: RunMetadata
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    startup: Phase
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    teardown: Phase
    partial: bool
    partial_reason: str
    step_detection: StepDetection
    clock_alignment: ClockAlignment
    def __init__(self, format_version: _Optional[int] = ..., metadata: _Optional[_Union[RunMetadata, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., startup: _Optional[_Union[Phase, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., teardown: _Optional[_Union[Phase, _Mapping]] = ..., partial: _Optional[bool] = ..., partial_reason: _Optional[str] = ..., step_detection: _Optional[_Union[StepDetection, _Mapping]] = ..., clock_alignment: _Optional[_Union[ClockAlignment, _Mapping]] = ...) -> None: ...

class ClockAlignment(_message.Message):
    __slots__ = ("reference", "method", "tasks")
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    reference: str
    method: str
    tasks: _containers.RepeatedCompositeFieldContainer[ClockOffset]
    def __init__(self, reference: _Optional[str] = ..., method: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[ClockOffset, _Mapping]]] = ...) -> None: ...

class ClockOffset(_message.Message):
    __slots__ = ("task", "host", "offset_ns", "lower_ns", "upper_ns", "has_lower", "has_upper", "source", "constraints")
    TASK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    LOWER_NS_FIELD_NUMBER: _ClassVar[int]
    UPPER_NS_FIELD_NUMBER: _ClassVar[int]
    HAS_LOWER_FIELD_NUMBER: _ClassVar[int]
    HAS_UPPER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    task: str
    host: str
    offset_ns: int
    lower_ns: int
    upper_ns: int
    has_lower: bool
    has_upper: bool
    source: str
    constraints: int
    def __init__(self, task: _Optional[str] = ..., host: _Optional[str] = ..., offset_ns: _Optional[int] = ..., lower_ns: _Optional[int] = ..., upper_ns: _Optional[int] = ..., has_lower: _Optional[bool] = ..., has_upper: _Optional[bool] = ..., source: _Optional[str] = ..., constraints: _Optional[int] = ...) -> None: ...

class StepDetection(_message.Message):
    __slots__ = ("source", "unit", "rule", "candidates", "set_aside")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SET_ASIDE_FIELD_NUMBER: _ClassVar[int]
    source: str
    unit: str
    rule: str
    candidates: int
    set_aside: _containers.RepeatedCompositeFieldContainer[SetAside]
    def __init__(self, source: _Optional[str] = ..., unit: _Optional[str] = ..., rule: _Optional[str] = ..., candidates: _Optional[int] = ..., set_aside: _Optional[_Iterable[_Union[SetAside, _Mapping]]] = ...) -> None: ...

class SetAside(_message.Message):
    __slots__ = ("reason", "phase", "runs", "rpcs", "bytes")
    REASON_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    RPCS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    reason: str
    phase: str
    runs: int
    rpcs: int
    bytes: int
    def __init__(self, reason: _Optional[str] = ..., phase: _Optional[str] = ..., runs: _Optional[int] = ..., rpcs: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class RunMetadata(_message.Message):
    __slots__ = ("model", "tensorflow_version", "strategy", "synchronous", "batch_size", "input_shape", "trainable_parameters", "capture_method", "host", "command", "tool_version", "created_utc", "extra")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TENSORFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    SYNCHRONOUS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_METHOD_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UTC_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    model: str
    tensorflow_version: str
    strategy: str
    synchronous: bool
    batch_size: int
    input_shape: _containers.RepeatedScalarFieldContainer[int]
    trainable_parameters: int
    capture_method: str
    host: str
    command: _containers.RepeatedScalarFieldContainer[str]
    tool_version: str
    created_utc: str
    extra: _containers.ScalarMap[str, str]
    def __init__(self, model: _Optional[str] = ..., tensorflow_version: _Optional[str] = ..., strategy: _Optional[str] = ..., synchronous: _Optional[bool] = ..., batch_size: _Optional[int] = ..., input_shape: _Optional[_Iterable[int]] = ..., trainable_parameters: _Optional[int] = ..., capture_method: _Optional[str] = ..., host: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., tool_version: _Optional[str] = ..., created_utc: _Optional[str] = ..., extra: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("job", "index", "address")
    JOB_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    job: str
    index: int
    address: str
    def __init__(self, job: _Optional[str] = ..., index: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class Phase(_message.Message):
    __slots__ = ("start_ns", "end_ns", "rpcs")
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    RPCS_FIELD_NUMBER: _ClassVar[int]
    start_ns: int
    end_ns: int
    rpcs: _containers.RepeatedCompositeFieldContainer[Rpc]
    def __init__(self, start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., rpcs: _Optional[_Iterable[_Union[Rpc, _Mapping]]] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("index", "start_ns", "end_ns", "rpcs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    RPCS_FIELD_NUMBER: _ClassVar[int]
    index: int
    start_ns: int
    end_ns: int
    rpcs: _containers.RepeatedCompositeFieldContainer[Rpc]
    def __init__(self, index: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., rpcs: _Optional[_Iterable[_Union[Rpc, _Mapping]]] = ...) -> None: ...

class Rpc(_message.Message):
    __slots__ = ("method", "caller_task", "callee_task", "request_bytes", "response_bytes", "start_ns", "response_start_ns", "end_ns", "tensor", "outstanding_at_start", "status_code")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CALLER_TASK_FIELD_NUMBER: _ClassVar[int]
    CALLEE_TASK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_AT_START_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    method: str
    caller_task: int
    callee_task: int
    request_bytes: int
    response_bytes: int
    start_ns: int
    response_start_ns: int
    end_ns: int
    tensor: TensorInfo
    outstanding_at_start: int
    status_code: int
    def __init__(self, method: _Optional[str] = ..., caller_task: _Optional[int] = ..., callee_task: _Optional[int] = ..., request_bytes: _Optional[int] = ..., response_bytes: _Optional[int] = ..., start_ns: _Optional[int] = ..., response_start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., tensor: _Optional[_Union[TensorInfo, _Mapping]] = ..., outstanding_at_start: _Optional[int] = ..., status_code: _Optional[int] = ...) -> None: ...

class TensorInfo(_message.Message):
    __slots__ = ("rendezvous_key", "dtype", "shape", "content_bytes")
    RENDEZVOUS_KEY_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    rendezvous_key: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    content_bytes: int
    def __init__(self, rendezvous_key: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., content_bytes: _Optional[int] = ...) -> None: ...
