"""One worker's calls through the engine program: ``NativeDriver``, a ``Driver`` for the
measuring loop (``transport.loop.WorkerLoop``).

What Python decides, it decides with the grpcio engine's own code: a call's
release time under recorded and rate pacing (``pacing.release_time_ns``), the
dependency model's releases (``DependencyTracker``, fed with the program's
completions as they happen: ``dependent.DependentStep``), the window (``window_limits``, which
``pacing.may_issue`` is tested to agree with), the steps, their ends, the
worker's other processes (``peers``).  The program waits for those release
times and windows, issues, times each call with ``CLOCK_MONOTONIC`` and reports
it; a sample is made here from the call the report names.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tf_grpc_bench.errors import TransportError
from tf_grpc_bench.replay.core.measurement import CallSample
from tf_grpc_bench.replay.core.messages import pull_request_layout, pull_response_content_bytes
from tf_grpc_bench.replay.core.pacing import (
    OPEN_LOOP_MAX_IN_FLIGHT,
    Pacing,
    Timing,
    release_time_ns,
)
from tf_grpc_bench.replay.core.workload import Call, Mode, Shape, Workload, WorkloadStep
from tf_grpc_bench.replay.native.dependent import DependentStep
from tf_grpc_bench.replay.native.process import EngineProcess
from tf_grpc_bench.replay.native.protocol import (
    NO_LIMIT,
    PROTOCOL_VERSION,
    STEP_CYCLED,
    STEP_ORDERED,
    Encoder,
    StepReport,
    pack_entries,
    unique_options,
)
from tf_grpc_bench.replay.transport.driver import StepOutcome, dependencies_of
from tf_grpc_bench.replay.transport.loop import RunPlan
from tf_grpc_bench.replay.transport.peers import (
    Hold,
    Peers,
    perf_minus_monotonic_ns,
    unheld,
)
from tf_grpc_bench.replay.transport.wire import KEPT_ALLOCATION_BYTES, ChannelSettings, RpcKind

_SHAPES = {Shape.ECHO: 0, Shape.ACK: 1, Shape.PULL: 2}
#: A call's row in the program's table: what is sent, to whom, under which window, and
#: which chunk of its payload it is (index, count: the chunks share one deadline).
Row = tuple[str, Shape, int, int, int, int, tuple[int, ...], int, str, int, int, int]


def window_limits(pacing: Pacing, call: Call) -> tuple[int, int]:
    """The window as the program applies it: (most calls in flight in all, 0 for no
    limit; most *earlier* calls in flight to the call's server, ``NO_LIMIT`` for none).

    A call may go when ``in_flight < first`` (or ``first`` is 0) and
    ``in_flight_to_server <= second``: exactly when ``pacing.may_issue`` says so
    (tests hold the two together).
    """
    if pacing.window is not None:
        return pacing.window, NO_LIMIT
    if pacing.timing in (Timing.RATE, Timing.DEPENDENCIES):
        return OPEN_LOOP_MAX_IN_FLIGHT, NO_LIMIT
    return 0, call.outstanding_at_start


def call_row(call: Call, mode: Mode, pacing: Pacing) -> Row:
    """``call`` as the program's table holds it (equal rows share one entry)."""
    content, name, padding = 0, "", 0
    buffers: tuple[int, ...] = ()
    if mode is Mode.SERIALIZED:
        if call.shape is Shape.PULL:
            content = pull_response_content_bytes(call.response_bytes)
            layout = pull_request_layout(call.request_bytes, content, call.tensor_name)
            name, padding = layout.tensor_name, layout.padding_bytes
        else:
            buffers = tuple(call.buffers)
    return (
        call.method,
        call.shape,
        call.server_index,
        call.request_bytes,
        call.response_bytes,
        window_limits(pacing, call)[1],
        buffers,
        content,
        name,
        padding,
        call.chunk_index,
        call.chunk_count,
    )


class EngineClient:
    """A ``tfgb-engine client`` process set up with one worker's calls (``rows``)."""

    def __init__(
        self,
        program: Path,
        *,
        rows: Sequence[Row],
        targets: Sequence[str],
        mode: Mode,
        settings: ChannelSettings,
        pacing: Pacing,
        deadline_s: float,
        connect_timeout_s: float,
    ) -> None:
        self.process = EngineProcess(program, "client")
        try:
            self.process.send(
                _setup_frame(rows, targets, mode, settings, pacing, deadline_s, connect_timeout_s)
            )
            answer = self.process.receive()
        except BaseException:
            self.process.close()
            raise
        if answer.kind == "E":
            message = answer.text()
            self.process.close()
            raise TransportError(message)
        self._cpu_ns = 0

    def cpu_ns(self) -> int:
        """The program's CPU time so far (the last known, once it has stopped answering)."""
        try:
            self.process.send(Encoder("U").frame())
            while (frame := self.process.receive()).kind != "U":
                pass
            self._cpu_ns = frame.i64()
        except TransportError:
            pass
        return self._cpu_ns

    def close(self) -> None:
        self.process.close()


def _setup_frame(
    rows: Sequence[Row],
    targets: Sequence[str],
    mode: Mode,
    settings: ChannelSettings,
    pacing: Pacing,
    deadline_s: float,
    connect_timeout_s: float,
) -> bytes:
    methods = sorted({row[0] for row in rows})
    method_ids = {method: index for index, method in enumerate(methods)}
    window = window_limits(pacing, _ANY_CALL)[0]
    frame = (
        Encoder("S")
        .u32(PROTOCOL_VERSION)
        .u8(mode is Mode.SERIALIZED)
        .u8(settings.rpc is RpcKind.STREAMING)
        .u32(settings.channels_per_server)
        .i64(round(deadline_s * 1e9))
        .i64(round(connect_timeout_s * 1e9))
        .u32(window)
        .text(settings.session)
        .texts(list(targets))
        .options(unique_options(settings.all_options()))
        .text(settings.root_certificates or b"")
        .text(settings.private_key or b"")
        .text(settings.certificate_chain or b"")
        .texts(methods)
        .u32(len(rows))
    )
    for row in rows:
        method, shape, server, request, response, limit, buffers, content, name, pad = row[:10]
        chunk, chunks = row[10:]
        frame.u32(method_ids[method]).u8(_SHAPES[shape]).u32(server).i64(request).i64(response)
        frame.u32(limit).u32(len(buffers))
        for size in buffers:
            frame.i64(size)
        frame.i64(content).text(name).i64(pad).u32(chunk).u32(chunks)
    return frame.i64(KEPT_ALLOCATION_BYTES).frame()


#: Any call, for the window's first limit (the same for every call of a pacing).
_ANY_CALL = Call(shape=Shape.PULL, method="/any", request_bytes=0, response_bytes=0)


class NativeDriver:
    """Issues a worker's calls through an ``EngineClient`` under a pacing, recording samples.

    Stands where ``transport.driver.Driver`` stands (``run_step``, ``begin_run``,
    ``prepare``, ``pacing``, ``peers``); ``cpu_ns`` is this process's CPU time
    and the program's, for the loop's ``cpu_clock``.  One thread drives it.

    A stop signal (``KeyboardInterrupt``) ends the step early, its calls so far kept: the
    driver tells the program to stop it (``X``) and keeps the ``F`` that follows.  A
    step's ``F`` is waited for with nothing held (nothing of it is taken meanwhile), then
    taken and kept under ``hold`` (a worker process's ``throughput._RunInterrupt.held``,
    the session's ``lifetime.deferred_signals``), so that the interrupt comes before it or
    after its samples are kept, never between: raised there, it lost the step's samples,
    and its ``X`` came after the step had ended.  The program answers such an ``X`` with
    an empty ``F`` (which the next ``cpu_ns`` passes over).
    """

    def __init__(
        self,
        engine: EngineClient,
        steps: Sequence[WorkloadStep],
        mode: Mode,
        pacing: Pacing,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        peers: Peers | None = None,
        deadline_s: float = 60.0,
        hold: Hold = unheld,
    ) -> None:
        """``deadline_s``: each call's deadline (as the program was given it); ``hold``:
        what holds the run's interrupt while a step's frames are read and kept."""
        self.engine = engine
        self.hold = hold
        self.deadline_s = deadline_s
        self.pacing = pacing
        self.peers = peers
        self.clock = clock
        self.on_compute: Callable[[int, int], None] | None = None  # the tracker's gaps
        self._mode = mode
        #: perf_counter_ns - CLOCK_MONOTONIC ns: the program's times are monotonic.
        self._offset = perf_minus_monotonic_ns()
        self._ids = {row: index for index, row in enumerate(rows_of(steps, mode, pacing))}
        #: Per step object (kept alive here): its calls' rows in the program's table.
        self._step_ids: dict[int, tuple[WorkloadStep, tuple[int, ...]]] = {}
        self._issued_in_run = 0
        self._asap_orders: dict[int, tuple[WorkloadStep, bytes]] = {}

    def close(self) -> None:
        self.engine.close()

    def prepare(self, steps: Sequence[WorkloadStep]) -> None:
        """Check that dependencies pacing has what it needs (requests were built at set-up)."""
        if self.pacing.timing is Timing.DEPENDENCIES:
            for step in steps:
                dependencies_of(step)

    def begin_run(self) -> None:
        self._issued_in_run = 0

    def cpu_ns(self) -> int:
        """This process's CPU time and the program's (ns)."""
        return time.process_time_ns() + self.engine.cpu_ns()

    def ids(self, step: WorkloadStep) -> tuple[int, ...]:
        """The rows of ``step``'s calls in the program's table."""
        known = self._step_ids.get(id(step))
        if known is None or known[0] is not step:
            rows = (call_row(call, self._mode, self.pacing) for call in step.calls)
            known = self._step_ids[id(step)] = (step, tuple(self._ids[row] for row in rows))
        return known[1]

    def to_monotonic(self, perf_ns: int) -> int:
        return perf_ns - self._offset

    def to_perf(self, monotonic_ns: int) -> int:
        return monotonic_ns + self._offset

    def run_step(
        self,
        step: WorkloadStep,
        *,
        run_begin_ns: int,
        step_begin_ns: int,
        stop_at_ns: int | None = None,
        give_up_at_ns: int | None = None,
        samples: list[CallSample] | None = None,
    ) -> StepOutcome:
        """As ``Driver.run_step``: issue the step's calls, wait for all, say when the last
        one completed; samples appended as they are reported (so a ``TransportError``
        keeps them).  A call planned past ``give_up_at_ns`` is not waited for: the step
        ends before it, ``cut``."""
        if self.pacing.timing is Timing.DEPENDENCIES:
            replay = DependentStep(self, step, step_begin_ns, give_up_at_ns)
            return replay.run(run_begin_ns, samples)
        peers = self.peers
        if peers is not None:
            peers.begin_step()
            step = peers.local_step(step)
        order, kept = self._order(
            step,
            run_begin_ns=run_begin_ns,
            step_begin_ns=step_begin_ns,
            give_up_at_ns=give_up_at_ns,
        )
        end = self.clock()
        stop = -1 if stop_at_ns is None else self.to_monotonic(stop_at_ns)
        mode = STEP_CYCLED if self._cycles(stop_at_ns) else STEP_ORDERED
        step_frame = Encoder("R").i64(stop).u8(mode).u32(0).raw(order).frame()
        report = self.finish(step.calls, run_begin_ns, samples, step_frame=step_frame)
        self._issued_in_run += report.issued
        end = max([end, *(self.to_perf(sample[2]) for sample in report.samples)])
        if report.error:
            raise TransportError(report.error)
        if peers is not None:
            end = peers.end_step(end)
        # Cut where the next call was planned past the run's last moment, if it got there.
        return StepOutcome(last_end_ns=end, cut=kept < len(step.calls) and report.issued == kept)

    def _cycles(self, stop_at_ns: int | None) -> bool:
        """Whether the program replays the step again itself until ``stop_at_ns``.

        That is what the loop does with a synthetic workload's one step under ``asap``
        pacing (``WorkerLoop``: the next begins when the last call of this one has
        completed, until the stop time; no release times, no step times kept): the
        program does the same, each cycle's calls drained before the next, without a
        frame each way between cycles (a hand-off through this process that would
        stand between every payload of a one-payload workload).  Not with a worker's
        other processes, which agree on every step.
        """
        return stop_at_ns is not None and self.pacing.timing is Timing.ASAP and self.peers is None

    def _order(
        self,
        step: WorkloadStep,
        *,
        run_begin_ns: int,
        step_begin_ns: int,
        give_up_at_ns: int | None,
    ) -> tuple[bytes, int]:
        """The step's calls in issue order with their releases (``pacing.release_time_ns``),
        encoded, up to the first planned past ``give_up_at_ns``; and how many that is.
        Kept per step where the pacing plans no release (closed loop)."""
        if self.pacing.timing is Timing.ASAP:
            cached = self._asap_orders.get(id(step))
            if cached is not None and cached[0] is step:
                return cached[1], len(step.calls)
        order = []
        for number, (call, row) in enumerate(zip(step.calls, self.ids(step), strict=True)):
            release = release_time_ns(
                self.pacing,
                call,
                call_number=self._issued_in_run + number,
                step_begin_ns=step_begin_ns,
                run_begin_ns=run_begin_ns,
            )
            if release is not None and give_up_at_ns is not None and release > give_up_at_ns:
                break
            order.append((number, row, -1 if release is None else self.to_monotonic(release)))
        packed = pack_entries(order)
        if self.pacing.timing is Timing.ASAP:
            self._asap_orders[id(step)] = (step, packed)
        return packed, len(order)

    def stop_step(self) -> None:
        """Tell the program to stop issuing the step's calls (``X``); its ``F`` follows
        (an empty one if the step had ended).  Safe from another thread."""
        with contextlib.suppress(TransportError):  # gone: the reading side says so
            self.engine.process.send(Encoder("X").frame())

    def finish(
        self,
        calls: Sequence[Call],
        run_begin_ns: int,
        samples: list[CallSample] | None,
        *,
        step_frame: bytes = b"",
    ) -> StepReport:
        """Send ``step_frame`` (the step's ``R``, unless sent) and wait for the step's ``F``
        frame; its samples appended to ``samples``.  A stop signal: the step ends early,
        its calls so far kept, and the signal is raised once they are."""
        kept: list[StepReport] = []
        try:
            if step_frame:
                self.engine.process.send(step_frame)
            return self.await_report(calls, run_begin_ns, samples, kept)
        except KeyboardInterrupt:
            if not kept:
                self.stop_step()
                self.await_report(calls, run_begin_ns, samples, kept)
            raise

    def await_report(
        self,
        calls: Sequence[Call],
        run_begin_ns: int,
        samples: list[CallSample] | None,
        kept: list[StepReport],
    ) -> StepReport:
        """The step's ``F`` frame, other frames passed over: waited for with nothing held,
        then taken, its samples kept and it appended to ``kept``, under ``hold``."""
        process = self.engine.process
        while process.await_frame() != "F":
            process.take()
        return self.keep_report(calls, run_begin_ns, samples, kept)

    def keep_report(
        self,
        calls: Sequence[Call],
        run_begin_ns: int,
        samples: list[CallSample] | None,
        kept: list[StepReport],
    ) -> StepReport:
        """Take the ``F`` frame waited for (``EngineProcess.await_frame``), keep its samples
        and append it to ``kept``, the run's interrupt held meanwhile (when it comes out of
        the hold, ``kept`` says the step's calls are in)."""
        with self.hold(_nothing_to_break):
            report = StepReport.read(self.engine.process.take())
            self._keep(report, calls, run_begin_ns, samples)
            kept.append(report)
        return report

    def _keep(
        self,
        report: StepReport,
        calls: Sequence[Call],
        run_begin_ns: int,
        samples: list[CallSample] | None,
    ) -> None:
        if samples is None:
            return
        for tag, start, end, release, held in report.samples:
            call = calls[tag]
            start_ns = self.to_perf(start)
            samples.append(
                CallSample(
                    start_ns=start_ns - run_begin_ns,
                    latency_ns=end - start,
                    request_bytes=call.request_bytes,
                    response_bytes=call.response_bytes,
                    payload_bytes=call.payload_bytes,
                    server_index=call.server_index,
                    worker_index=call.worker_index,
                    step=call.step,
                    release_lag_ns=0 if release < 0 else max(start - release, 0),
                    rpc_index=call.rpc_index,
                    window_held=held,
                )
            )


def _nothing_to_break() -> None:
    """A held frame's taking waits for nothing: an interrupt meanwhile has nothing to end."""


def open_native_driver(
    program: Path,
    workload: Workload,
    targets: Sequence[str],
    pacing: Pacing,
    plan: RunPlan,
    *,
    settings: ChannelSettings,
    peers: Peers | None = None,
    hold: Hold = unheld,
) -> NativeDriver:
    """A driver of ``workload``'s calls (one worker's) on a program of its own, connected
    to ``targets`` and with its requests made (``hold``: ``NativeDriver``'s);
    ``TransportError`` if it cannot be."""
    engine = EngineClient(
        program,
        rows=rows_of(workload.steps, workload.mode, pacing),
        targets=targets,
        mode=workload.mode,
        settings=settings,
        pacing=pacing,
        deadline_s=plan.deadline_s,
        connect_timeout_s=plan.connect_timeout_s,
    )
    try:
        driver = NativeDriver(
            engine,
            workload.steps,
            workload.mode,
            pacing,
            peers=peers,
            deadline_s=plan.deadline_s,
            hold=hold,
        )
        driver.prepare(workload.steps)
    except BaseException:
        engine.close()
        raise
    return driver


def rows_of(steps: Sequence[WorkloadStep], mode: Mode, pacing: Pacing) -> list[Row]:
    """The distinct rows of every call in ``steps``, in a stable order."""
    seen: dict[Row, None] = {}
    for step in steps:
        for call in step.calls:
            seen.setdefault(call_row(call, mode, pacing), None)
    return list(seen)
