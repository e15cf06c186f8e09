from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Payload(_message.Message):
    __slots__ = ("buffers",)
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    buffers: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, buffers: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("received_bytes",)
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    received_bytes: int
    def __init__(self, received_bytes: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("response_bytes", "tensor_name", "padding")
    RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENSOR_NAME_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    response_bytes: int
    tensor_name: str
    padding: bytes
    def __init__(self, response_bytes: _Optional[int] = ..., tensor_name: _Optional[str] = ..., padding: _Optional[bytes] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    def __init__(self, content: _Optional[bytes] = ...) -> None: ...
