"""The frames between the Python side and the engine program: their one description.

Every frame is a little-endian ``u32`` body length, then the body, whose first
byte is the frame's kind.  Fields are little-endian: ``u8``, ``u32``, ``i64``;
``str`` is a ``u32`` length and that many bytes; a list is a ``u32`` count and
its items.  The program reads them in ``engine/common.cc`` (``Decoder``) and the
role's file.  ``PROTOCOL_VERSION`` is checked by the program in each set-up
frame; bump it with any change below.  History: 1, the first; 2, the server's set-up
lists its memory cgroups; 3, samples say whether the window held their call; 4, a step
may be cycled (``R``'s mode 2); 5, the server keeps freed memory; 6, calls say which chunk
of a payload they are, failed calls' statuses too; 7, the client keeps freed memory; 8, an
``X`` with no step under way is answered with an empty ``F``.

Server (``tfgb-engine serve``), Python to program:

* ``S`` set-up: version u32, serialized u8, host str, port u32, shared u8,
  sibling u8, options (list of key str, kind u8 0 int / 1 str, value i64 or
  str), private key PEM str, certificate chain PEM str, root certificates PEM
  str ("" each: no TLS), max response i64 (-1: the send limit), send limit
  i64, has token u8, token str, max sessions u32, threads u32, memory
  cgroups (count u32, then each: folder str, cgroup version u8, name str;
  ``host.memory_cgroups``), kept allocations i64 (``ServerSettings.keep_freed_memory``:
  allocations up to this many bytes come from malloc's heap, which keeps what is freed,
  as ``wire.keep_freed_memory`` makes a grpcio server's; 0: the C library's defaults);
* ``B`` the other processes serving the same port: list of addresses (str);
* ``Q`` stop (so does the pipe closing, and SIGTERM).

Program to Python: ``O`` listening (port u32, sibling address str), ``E`` error
str, ``K`` siblings known, ``Z`` stopped (messages i64, bytes i64 received over
its life).

Client (``tfgb-engine client``), Python to program:

* ``S`` set-up: version u32, serialized u8, streaming u8, channels per server
  u32, deadline ns i64, connect timeout ns i64, window u32 (0: none), session
  str, targets (list of str), options (as the server's), root certificates,
  private key and certificate chain PEM str, methods (list of str), calls (list
  of: method u32, shape u8 (0 echo, 1 ack, 2 pull), server u32, request bytes
  i64, response bytes i64, server window u32 (``NO_LIMIT``: none), buffers
  (list of i64), content i64, tensor name str, padding i64 (these four are what a
  serialized request is made of), chunk index u32, chunk count u32
  (``Call.chunk_index`` of ``chunk_count``: the chunks of one payload, consecutive in
  a step, share the ``--deadline`` the first of them issued got, as
  ``transport.driver.PayloadDeadlines`` gives it; 0 of 1: a whole payload)), kept
  allocations i64 (as the server's: the responses received reuse freed buffers);
* ``R`` a step: stop at ns i64 (-1: none), mode u8 (``STEP_ORDERED`` 0: the
  order's calls once; ``STEP_DEPENDENT`` 1: released by ``D`` frames;
  ``STEP_CYCLED`` 2: the order's calls again, whole, each time they have all
  completed, until the stop time, one ``F`` for all), expected u32 (dependent:
  how many calls will be released), order (list of tag u32, call u32, release
  ns i64 (-1: now)): the calls in issue order, empty when dependent;
* ``D`` releases (dependent steps): list of tag u32, call u32, release ns i64;
* ``X`` stop issuing the step's calls (those in flight still complete; the step's ``F``
  follows); with no step under way (it came after the step's ``F``), answered at once
  with an empty ``F`` (issued 0, no error, no samples), so a side that waits for an ``F``
  after sending it never waits for good;
* ``U`` ask for the program's CPU time; ``Q`` quit (so does the pipe closing).

Program to Python: ``K`` ready, ``E`` error str (set-up failed), ``C`` arrivals
of a dependent step (list of tag u32, end ns i64, in completion order), ``F``
the step finished (issued u32, error str ("" none; a failed call's status, for
Python to word, as ``\x1fstatus\x1fCODE\x1fCHUNK\x1fCHUNKS\x1fTARGET\x1fMETHOD\x1fDETAILS``,
CHUNK of CHUNKS the failed call's chunk index and count),
samples: list of tag u32, start ns i64, end ns i64, release ns i64 (-1: none), held u8
(1: the window held the call back, ``measurement.release_held``)),
``U`` CPU ns i64.

A *tag* is the call's place in its step (what the samples are matched to); a
*call* is its row in the set-up's table (what is sent).  Times are
``CLOCK_MONOTONIC`` ns.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.transport.wire import chunk_failure_message, failure_message

PROTOCOL_VERSION = 8
#: ``R`` frames' modes.
STEP_ORDERED, STEP_DEPENDENT, STEP_CYCLED = 0, 1, 2
#: A call without a window of its own towards its server.
NO_LIMIT = 0xFFFFFFFF

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_ENTRY = struct.Struct("<IIq")
_ARRIVAL = struct.Struct("<Iq")
_SAMPLE = struct.Struct("<IqqqB")

Option = tuple[str, str | int]


class Encoder:
    """A frame body being written: ``Encoder("S").u32(1)...frame()``."""

    def __init__(self, kind: str) -> None:
        self._out = io.BytesIO()
        self._out.write(kind.encode("ascii"))

    def u8(self, value: int) -> Encoder:
        self._out.write(bytes((value,)))
        return self

    def u32(self, value: int) -> Encoder:
        self._out.write(_U32.pack(value))
        return self

    def i64(self, value: int) -> Encoder:
        self._out.write(_I64.pack(value))
        return self

    def text(self, value: str | bytes) -> Encoder:
        data = value.encode() if isinstance(value, str) else value
        self._out.write(_U32.pack(len(data)))
        self._out.write(data)
        return self

    def texts(self, values: Sequence[str | bytes]) -> Encoder:
        self.u32(len(values))
        for value in values:
            self.text(value)
        return self

    def options(self, options: Sequence[Option]) -> Encoder:
        self.u32(len(options))
        for key, value in options:
            self.text(key)
            if isinstance(value, int):
                self.u8(0).i64(value)
            else:
                self.u8(1).text(str(value))
        return self

    def entries(self, entries: Sequence[tuple[int, int, int]]) -> Encoder:
        """(tag, call, release ns) triples."""
        return self.raw(pack_entries(entries))

    def raw(self, data: bytes) -> Encoder:
        """Bytes encoded before (``pack_entries``)."""
        self._out.write(data)
        return self

    def frame(self) -> bytes:
        body = self._out.getvalue()
        return _U32.pack(len(body)) + body


class Decoder:
    """A frame body being read; ``TransportError`` if it ends early."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._at = 1

    @property
    def kind(self) -> str:
        return chr(self._body[0])

    def _take(self, size: int) -> bytes:
        if self._at + size > len(self._body):
            raise TransportError("the gRPC C++ engine sent a frame shorter than its fields")
        data = self._body[self._at : self._at + size]
        self._at += size
        return data

    def u32(self) -> int:
        return int(_U32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def text(self) -> str:
        return self._take(self.u32()).decode("utf-8", errors="replace")

    def arrivals(self) -> list[tuple[int, int]]:
        """(tag, end ns) pairs."""
        count = self.u32()
        data = self._take(count * _ARRIVAL.size)
        return [(int(t), int(e)) for t, e in _ARRIVAL.iter_unpack(data)]

    def samples(self) -> list[tuple[int, int, int, int, int]]:
        """(tag, start ns, end ns, release ns, held) rows."""
        count = self.u32()
        data = self._take(count * _SAMPLE.size)
        return [
            (int(t), int(s), int(e), int(r), int(h)) for t, s, e, r, h in _SAMPLE.iter_unpack(data)
        ]


def pack_entries(entries: Sequence[tuple[int, int, int]]) -> bytes:
    """A list of (tag, call, release ns) triples, encoded (kept by callers that repeat it)."""
    return _U32.pack(len(entries)) + b"".join(_ENTRY.pack(*entry) for entry in entries)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    """An ``F`` frame: how the program's part of a step went."""

    issued: int
    error: str
    #: (tag, start ns, end ns, release ns or -1, held 0/1), monotonic ns.
    samples: tuple[tuple[int, int, int, int, int], ...]

    @classmethod
    def read(cls, frame: Decoder) -> StepReport:
        issued = frame.u32()
        error = worded_error(frame.text())
        return cls(issued=issued, error=error, samples=tuple(frame.samples()))


_STATUS = "\x1fstatus\x1f"


def worded_error(error: str) -> str:
    """An ``F`` frame's error as a user reads it: a failed call's status worded as every
    engine words it (``wire.failure_message``), any other message as it is."""
    if not error.startswith(_STATUS):
        return error
    code_text, chunk, chunks, target, method, details = error[len(_STATUS) :].split("\x1f", 5)
    code = next((c for c in grpc.StatusCode if c.value[0] == int(code_text)), None)
    failure = failure_message(target, method, code, details)
    return chunk_failure_message(failure, code, int(chunk), int(chunks))


def unique_options(options: Sequence[Option]) -> list[Option]:
    """Options with each key once, the first given kept (as grpcio keeps it)."""
    seen: set[str] = set()
    kept = []
    for key, value in options:
        if key not in seen:
            seen.add(key)
            kept.append((key, value))
    return kept
