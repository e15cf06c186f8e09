"""One replay across several emulated links, compared side by side.

For each link profile: build two hosts on a link of that rate
(``emulated.EmulatedNetwork``), start ``tf-grpc-bench serve`` in host 0, run
``tf-grpc-bench replay --target <host 0>`` in host 1 (so the client reads and
records its own link: interface, MTU, tbf rate), then tear the network down;
``network.hosts`` says which servers and clients go to which host.  The
replay's and the servers' flags are the user's (``CompareConfig``, made with
``ReplaySpec.to_argv``).  Every profile's run directory goes under one directory, so
``tensorboard --logdir <that directory>`` shows them in one HParams view with
the network as a hyperparameter, next to a ``comparison`` run that plots step
time against link rate and latency per network (``output.comparison``); a
markdown table of all of them is written beside them (``comparison.md``) and
returned.

Servers and clients run as subprocesses under ``ip netns exec``: a process
cannot move its gRPC threads between namespaces, a new process starts inside
one.  A profile whose replay fails is kept as a failure (its partial results,
if any, are still listed) and the next profile runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tf_grpc_bench import lifetime
from tf_grpc_bench.errors import ResultError
from tf_grpc_bench.netns import emulated, links, namespaces
from tf_grpc_bench.replay.core.benchmarks import step_benchmark
from tf_grpc_bench.replay.network.dilation import (
    CONVERGED_STEP_CHANGE,
    DilatedPrediction,
    DilatedReplay,
    settled,
)
from tf_grpc_bench.replay.network.dilation import DilationLimit as DilationLimit
from tf_grpc_bench.replay.network.dilation import dilated_prediction as dilated_prediction
from tf_grpc_bench.replay.network.dilation import dilation_limit as dilation_limit
from tf_grpc_bench.replay.network.hosts import ONE_PS as ONE_PS
from tf_grpc_bench.replay.network.hosts import PS_JOB as PS_JOB
from tf_grpc_bench.replay.network.hosts import SERVE_PORT as SERVE_PORT
from tf_grpc_bench.replay.network.hosts import HostLayout as HostLayout
from tf_grpc_bench.replay.network.hosts import client_placement as client_placement
from tf_grpc_bench.replay.network.hosts import host_layout as host_layout
from tf_grpc_bench.replay.network.hosts import serving_addresses as serving_addresses
from tf_grpc_bench.replay.network.hosts import start_servers as start_servers
from tf_grpc_bench.replay.network.hosts import tool_command
from tf_grpc_bench.replay.output import comparison, report, timeline
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.prediction import prediction_json

COMPARISON_FILE = "comparison.md"
#: How long an interrupted (or overdue) replay gets to write its partial results.
_INTERRUPT_GRACE_S = 30.0
_RESULTS_LINE = re.compile(r"^results:\s+(?P<path>\S.*)$", re.MULTILINE)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareConfig:
    """What to compare.  ``replay_arguments`` and ``serve_arguments`` are flags
    of ``tf-grpc-bench replay`` / ``serve`` passed through unchanged (trace,
    benchmark, durations, mode, gRPC settings ...)."""

    profiles: tuple[links.LinkProfile, ...]
    output_dir: Path
    #: Which servers and clients go to which host (``host_layout``).
    layout: HostLayout = ONE_PS
    replay_arguments: tuple[str, ...] = ()
    serve_arguments: tuple[str, ...] = ()
    #: When set, TLS files (made for both hosts' addresses) live here and both sides use them.
    tls: bool = False
    #: Seconds allowed for the servers to come up, and for each replay.
    serve_timeout_s: float = 60.0
    replay_timeout_s: float = 3600.0
    #: Time dilation of the replays on rate-limited links (``pacing`` module): a
    #: factor, or None for automatic (``next_dilation``, ``converged``: undilated,
    #: then doubled until the predicted step stops moving).
    time_dilation: float | None = None
    #: Whether every replayed benchmark is dependency-paced (a trace's PS throughput),
    #: the only pacing a dilation applies to: automatic dilation is off otherwise.
    dilatable: bool = True

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError("no profiles to compare")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOutcome:
    """One profile's replay: its result document (None if none was written)."""

    profile: links.LinkProfile
    results_path: Path | None
    document: results.ResultDocument | None
    error: str = ""
    #: The time dilation of this replay (1: none); the link was shaped this many times slower.
    time_dilation: float = 1.0
    #: Automatic dilation: the dilations replayed before this one and the step each
    #: predicted (their run directories are kept beside this one's).
    tried: tuple[tuple[float, float | None], ...] = ()
    #: Automatic dilation: every replay's dilation, step, spread over its runs and
    #: verdict, in the order replayed (this one last).
    replays: tuple[DilatedReplay, ...] = ()
    #: Automatic dilation: what its replays predict (``dilation.dilated_prediction``);
    #: None without two replays.
    decision: DilatedPrediction | None = None

    @property
    def limit(self) -> DilationLimit | None:
        """The fit ``S + c/K`` the prediction is, when the dilated replays differed by
        more than their spread; else None."""
        return None if self.decision is None else self.decision.limit

    @property
    def predicted_step_s(self) -> float | None:
        """The step this profile's replays predict: automatic dilation's decision where
        there is one, else the (last) replay's step."""
        return self.decision.step_s if self.decision is not None else _step_s(self.document)


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    output_dir: Path
    outcomes: tuple[ProfileOutcome, ...]
    markdown: str
    #: The stop signal that ended the comparison early (the profiles done are kept).
    interrupted: int | None = None
    #: Per dilated profile, how it was dilated and the step predicted (``comparison.md``).
    dilations: tuple[str, ...] = ()

    @property
    def failed(self) -> tuple[ProfileOutcome, ...]:
        return tuple(o for o in self.outcomes if o.error)


#: Automatic time dilation: the share of the machine's cores busy while the replay
#: communicated that its progress lines call busy, and the largest dilation it tries.
AUTO_DILATION_CPU_SHARE = 0.5
MAX_AUTO_DILATION = 16.0
COMPARISON_JSON = "comparison.json"


def _prediction(document: results.ResultDocument | None) -> dict[str, Any] | None:
    """The prediction of ``document``'s first dependency-paced benchmark, else None."""
    if document is None:
        return None
    for result in document.benchmarks:
        prediction = prediction_json(result, document.machine.cpu_count)
        if prediction is not None:
            return prediction
    return None


def communicating_cores(prediction: dict[str, Any], cpu_count: int) -> float:
    """Cores the replay kept busy while its step communicated: its CPU per step
    (``replay_cpu_cores`` x the step) over the critical path's communication, at
    most the machine's ``cpu_count``.

    The replay's CPU comes with its transfers, not with the compute it sleeps
    through, so its average over the whole step hides the bursts in which it
    holds up the link (VGG-16 at 2.5 Gbit/s: 0.97 of 2 cores on average, 1.10
    over the communication).  Transfers off the critical path can overlap the
    compute, hence the cap.  Without a split of the step, the average.
    """
    cores = float(prediction["replay_cpu_cores"] or 0.0)
    step, communication = prediction["step_ns"], prediction["communication_ns"]
    if not step or not communication or step < communication:
        return cores
    return min(float(max(cores, cpu_count)), cores * float(step) / float(communication))


def next_dilation(document: results.ResultDocument | None, dilation: float) -> float | None:
    """The dilation to replay again with after a replay at ``dilation`` wrote ``document``:
    twice ``dilation``, at most ``MAX_AUTO_DILATION``; None when ``document`` holds no
    prediction or the dilation is already the largest.

    Every limited link is replayed once more, dilated, whatever the CPU figures say:
    they are averages, and a replay that holds the link up only in bursts (at a large
    tensor) keeps few cores busy on average.  ``converged`` then says whether the
    prediction depended on the replay's speed.  Doubling is also as far as aiming at
    ``AUTO_DILATION_CPU_SHARE`` of the cores could go: the replay cannot keep more
    than all of them busy.
    """
    if _prediction(document) is None or dilation >= MAX_AUTO_DILATION:
        return None
    return min(MAX_AUTO_DILATION, 2 * dilation)


def cpu_busy(document: results.ResultDocument | None) -> bool:
    """Whether the replay that wrote ``document`` kept ``AUTO_DILATION_CPU_SHARE`` of the
    cores or more busy while it communicated, or was bound by its machine."""
    prediction = _prediction(document)
    if prediction is None or document is None:
        return False
    aimed_cores = AUTO_DILATION_CPU_SHARE * max(1, document.machine.cpu_count)
    cores = communicating_cores(prediction, document.machine.cpu_count)
    return cores >= aimed_cores or bool(prediction["replay_bound"])


def _busy(document: results.ResultDocument | None) -> str:
    """How busy the replay that wrote ``document`` kept its machine, for a progress line."""
    prediction = _prediction(document)
    if prediction is None or document is None:
        return "said nothing of its CPU"
    cores = prediction["replay_cpu_cores"] or 0.0
    text = (
        f"kept {cores:.2f} of {document.machine.cpu_count} cores busy "
        f"({communicating_cores(prediction, document.machine.cpu_count):.2f} while it communicated)"
    )
    return text + (" (bound by its machine)" if prediction["replay_bound"] else "")


def replay_point(dilation: float, document: results.ResultDocument | None) -> DilatedReplay | None:
    """The replay at ``dilation`` that wrote ``document``, for automatic dilation: its
    predicted step, the range of its runs' median steps (None with fewer than two runs
    with steps) and whether its own processes bound it (``replay_bound``: their CPU or
    their lateness); None when it predicts no step."""
    prediction = _prediction(document)
    if prediction is None or document is None or prediction["step_ns"] is None:
        return None
    first = next(r for r in document.benchmarks if r.step_compute_ns)
    per_run = [statistics.median(run.step_times_ns) for run in first.runs if run.step_times_ns]
    return DilatedReplay(
        time_dilation=dilation,
        step_s=float(prediction["step_ns"]) / 1e9,
        spread_s=(max(per_run) - min(per_run)) / 1e9 if len(per_run) >= 2 else None,
        busy=bool(prediction["replay_bound"]),
    )


def _replay_profile(
    config: CompareConfig, profile: links.LinkProfile, on_line: Callable[[str], None]
) -> ProfileOutcome:
    """``profile``'s replay: at ``config.time_dilation``, or, automatically (a limited
    link only), undilated, then dilated (``next_dilation``) until the last two replays'
    steps differ by no more than their spread over runs and the last did not keep its
    machine busy (``dilation.settled``) or the dilation reaches ``MAX_AUTO_DILATION``;
    what they predict is ``dilation.dilated_prediction``."""
    if not (profile.limited or profile.delayed):
        if config.time_dilation not in (None, 1.0):
            on_line(f"{profile.name}: no rate limit or delay to dilate; replaying undilated")
        return _run_profile(config, profile, on_line, 1.0)
    dilation = config.time_dilation or 1.0
    outcome = _run_profile(config, profile, on_line, dilation)
    tried: list[tuple[float, float | None]] = []
    replays: list[DilatedReplay] = []
    while config.time_dilation is None and not outcome.error:
        point = replay_point(dilation, outcome.document)
        if point is not None:
            replays.append(point)
            if point.spread_s is None and len(replays) == 1 and config.dilatable:
                on_line(
                    f"{profile.name}: one run per replay: no spread over runs is measured, "
                    f"{100 * CONVERGED_STEP_CHANGE:g}% of the step stands in for it (--runs 3 "
                    "or more measures it)"
                )
        following = next_dilation(outcome.document, dilation)
        if following is None or settled(replays):
            break
        busy = _busy(outcome.document)
        if not config.dilatable:
            if cpu_busy(outcome.document):
                step = step_benchmark().name
                on_line(
                    f"{profile.name}: the replay {busy}; time dilation applies to a trace's "
                    f"{step} replay alone (--benchmark {step})"
                )
            break
        predicted = (
            "" if point is None else f"predicted a {point.step_s:.3f} s step{_spread(point)} and "
        )
        on_line(
            f"{profile.name}: at time dilation {dilation:g} the replay {predicted}{busy}; "
            f"replaying again at time dilation {following:g} (does the step depend on the "
            "replay's own speed?)"
        )
        tried.append((dilation, _step_s(outcome.document)))
        dilation = following
        outcome = _run_profile(config, profile, on_line, dilation)
    decision = None if outcome.error or len(replays) < 2 else dilated_prediction(replays)
    if decision is not None:
        on_line(f"{profile.name}: {decision.basis}")
    return replace(outcome, tried=tuple(tried), replays=tuple(replays), decision=decision)


def _spread(point: DilatedReplay) -> str:
    """A replay's spread over its runs, for a progress line ("" with one run)."""
    return "" if point.spread_s is None else f" (its runs within {point.spread_s:.3f} s)"


def _step_s(document: results.ResultDocument | None) -> float | None:
    """The predicted step of ``document`` in seconds, None if it predicts none."""
    prediction = _prediction(document)
    if prediction is None or prediction["step_ns"] is None:
        return None
    return float(prediction["step_ns"]) / 1e9


def _run_profile(
    config: CompareConfig,
    profile: links.LinkProfile,
    on_line: Callable[[str], None],
    dilation: float,
) -> ProfileOutcome:
    profile_dir = config.output_dir / profile.name
    shaped = profile
    dilation_arguments: list[str] = []
    if dilation != 1.0 and (profile.limited or profile.delayed):
        # The link K times slower: its rate divided by K, its delay and jitter K times longer.
        shaped = profile.dilated(dilation)
        dilation_arguments = ["--time-dilation", f"{dilation:g}"]
    with emulated.EmulatedNetwork(hosts=2, profile=shaped) as network:
        client_host = network.hosts[1]
        tls_arguments: list[str] = []
        if config.tls:
            from tf_grpc_bench.replay.transport import tls

            tls_dir = config.output_dir / "tls"
            tls.ensure_tls_files(tls_dir, hosts=serving_addresses(network))
            tls_arguments = ["--tls", "--tls-dir", str(tls_dir)]
        targets, _servers = start_servers(
            network,
            config.layout,
            [*config.serve_arguments, *tls_arguments],
            timeout_s=config.serve_timeout_s,
        )
        replay = network.spawn(
            client_host,
            tool_command(
                "replay",
                *config.replay_arguments,
                *dilation_arguments,
                *tls_arguments,
                *client_placement(network, config.layout),
                "--target",
                ",".join(targets),
                "--network-name",
                profile.name,
                "--output-dir",
                str(profile_dir),
                "--quiet",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdout, stderr, interrupted = _finish(replay, config.replay_timeout_s * dilation)
    for line in stdout.splitlines():
        on_line(f"{profile.name}: {line}")
    outcome = replace(_outcome(profile, stdout, stderr, replay.returncode), time_dilation=dilation)
    if interrupted is not None:
        raise ProfileInterrupted(outcome, interrupted)
    return outcome


class ProfileInterrupted(KeyboardInterrupt):
    """A stop signal ended a profile's replay: what it wrote, and the signal."""

    def __init__(self, outcome: ProfileOutcome, interrupt: KeyboardInterrupt) -> None:
        super().__init__(str(interrupt))
        self.outcome = outcome
        self.signum = lifetime.signal_of(interrupt)


def _finish(
    replay: subprocess.Popen[str], timeout_s: float
) -> tuple[str, str, KeyboardInterrupt | None]:
    """The replay's output once it ended.  A stop signal here is passed on to the replay
    (in its own process group, so it hears nothing of the terminal), which then writes
    its partial results; a second one stops waiting."""
    try:
        stdout, stderr = replay.communicate(timeout=timeout_s)
        return stdout, stderr, None
    except subprocess.TimeoutExpired:
        replay.terminate()
        stdout, stderr = _within_grace(replay, "SIGTERM")
        return stdout, stderr + f"\nreplay did not finish within {timeout_s:g} s\n", None
    except KeyboardInterrupt as interrupt:
        signum = lifetime.signal_of(interrupt)
        with contextlib.suppress(ProcessLookupError):
            replay.send_signal(signum)
        stdout, stderr = _within_grace(replay, lifetime.signal_name(signum))
        return stdout, stderr, interrupt


def _within_grace(replay: subprocess.Popen[str], sent: str) -> tuple[str, str]:
    """The output of a replay told to stop (``sent``), once it ended: given
    ``_INTERRUPT_GRACE_S`` to write its partial results, then killed with its
    process group (its last stderr line then says so)."""
    try:
        return replay.communicate(timeout=_INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replay.pid, signal.SIGKILL)
        stdout, stderr = replay.communicate()
        late = f"replay did not stop within {_INTERRUPT_GRACE_S:g} s of {sent}: killed"
        return stdout, f"{stderr}\n{late}"


def _outcome(
    profile: links.LinkProfile, stdout: str, stderr: str, returncode: int | None
) -> ProfileOutcome:
    match = _RESULTS_LINE.search(stdout)
    path = Path(match["path"].strip()) if match else None
    document = None
    if path is not None:
        try:
            document = read_document(path)
        except ResultError as unreadable:
            return ProfileOutcome(
                profile=profile, results_path=path, document=None, error=str(unreadable)
            )
    failure = ""
    if returncode != 0:
        lines = stderr.strip().splitlines()
        failure = lines[-1] if lines else f"replay exited with status {returncode}"
    return ProfileOutcome(profile=profile, results_path=path, document=document, error=failure)


def compare_networks(
    config: CompareConfig, *, on_line: Callable[[str], None] = lambda _line: None
) -> Comparison:
    """Replay once per profile, each on a fresh emulated network; blocking.

    Needs root (NetworkError otherwise, before anything is made).  Writes
    ``comparison.md`` into ``config.output_dir``.
    """
    namespaces.require_root()
    config.output_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[ProfileOutcome] = []
    interrupted: int | None = None
    for profile in config.profiles:
        on_line(f"{profile.name}: network up, replaying")
        try:
            outcome = _replay_profile(config, profile, on_line)
        except ProfileInterrupted as cut_short:
            outcomes.append(cut_short.outcome)
            interrupted = cut_short.signum
            break
        except KeyboardInterrupt as interrupt:
            interrupted = lifetime.signal_of(interrupt)
            break
        if outcome.error:
            on_line(f"{profile.name}: failed: {outcome.error}")
        outcomes.append(outcome)
    documents = [o.document for o in outcomes if o.document is not None]
    markdown = report.format_markdown_table(documents) if documents else "(no results)"
    failures = [f"- {o.profile.name}: {o.error}" for o in outcomes if o.error]
    dilations = [_dilation_line(o) for o in outcomes if o.time_dilation != 1 or o.tried]
    behind = [f"- {o.profile.name}: {_relay_behind(o)}" for o in outcomes if _relay_behind(o)]
    if behind:
        on_line("links whose relay fell behind their profile (delays longer than asked):")
        for line in behind:
            on_line(line)
    stopped = (
        [] if interrupted is None else ["", f"Interrupted ({lifetime.signal_name(interrupted)})."]
    )
    text = "\n".join(
        [
            f"# Network comparison ({', '.join(p.name for p in config.profiles)})",
            "",
            markdown,
            *(["", "Time dilation (docs/fidelity.md):", *dilations] if dilations else []),
            *(["", "Failed:", *failures] if failures else []),
            *(["", "Relays that fell behind their profile:", *behind] if behind else []),
            *stopped,
            "",
        ]
    )
    with lifetime.deferred_signals():
        (config.output_dir / COMPARISON_FILE).write_text(text, encoding="utf-8")
        (config.output_dir / COMPARISON_JSON).write_text(
            json.dumps(comparison_json(outcomes, interrupted), indent=1) + "\n", encoding="utf-8"
        )
        if documents:
            predicted = {
                o.profile.name: o.decision.step_s for o in outcomes if o.decision is not None
            }
            write_tensorboard_comparison(config.output_dir, documents, predicted_s=predicted)
    return Comparison(
        output_dir=config.output_dir,
        outcomes=tuple(outcomes),
        markdown=markdown,
        interrupted=interrupted,
        dilations=tuple(dilations),
    )


def _relay_behind(outcome: ProfileOutcome) -> str:
    """Why the link's relay did not hold the profile over the replay ("" if it did)."""
    network = None if outcome.document is None else outcome.document.network
    return "" if network is None else network.relay_behind


def comparison_json(
    outcomes: Sequence[ProfileOutcome], interrupted: int | None = None
) -> dict[str, Any]:
    """``comparison.json``: per profile, its replays' steps (with their spread over runs
    and verdict, under automatic dilation) and the step they predict (``predicted_step_s``:
    automatic dilation's decision, ``prediction_basis`` saying why, else the replay's step)."""

    def replay_json(outcome: ProfileOutcome, k: float, step: float | None) -> dict[str, Any]:
        point = next((r for r in outcome.replays if r.time_dilation == k), None)
        return {
            "time_dilation": k,
            "step_s": step,
            "spread_s": None if point is None else point.spread_s,
            "busy": None if point is None else point.busy,
        }

    def profile_json(outcome: ProfileOutcome) -> dict[str, Any]:
        limit = outcome.limit
        replays = [*outcome.tried, (outcome.time_dilation, _step_s(outcome.document))]
        return {
            "profile": outcome.profile.name,
            "rate_bits_per_s": outcome.profile.rate_bits_per_s,
            "delay_ns": outcome.profile.delay_ns,
            "jitter_ns": outcome.profile.jitter_ns,
            "loss": outcome.profile.loss,
            "relay_behind": _relay_behind(outcome),
            "results": None if outcome.results_path is None else str(outcome.results_path),
            "error": outcome.error,
            "time_dilation": outcome.time_dilation,
            "replays": [replay_json(outcome, k, step) for k, step in replays],
            "step_s": _step_s(outcome.document),
            "predicted_step_s": outcome.predicted_step_s,
            "prediction_basis": "" if outcome.decision is None else outcome.decision.basis,
            "limit": None
            if limit is None
            else {
                "step_s": limit.step_s,
                "overhead_s": limit.overhead_s,
                "extrapolated": limit.extrapolated,
                "time_dilations": [k for k, _ in limit.points],
            },
        }

    return {
        "format": "tf-grpc-bench network comparison",
        # 1: first version; 2 (2026-12): each profile gains delay_ns, jitter_ns, loss
        # and relay_behind; 3 (2026-12): each replay gains spread_s (the range of its
        # runs' median steps) and busy (its replay_bound), each profile prediction_basis.
        "format_version": 3,
        "interrupted": None if interrupted is None else lifetime.signal_name(interrupted),
        "profiles": [profile_json(o) for o in outcomes],
    }


def _dilation_line(outcome: ProfileOutcome) -> str:
    """How ``outcome``'s replay was dilated, for ``comparison.md``."""
    line = (
        f"- {outcome.profile.name}: replayed {outcome.time_dilation:g} times slower, on a "
        f"{outcome.profile.dilated(outcome.time_dilation).describe()} link with compute "
        f"{outcome.time_dilation:g} times longer; every time above is divided by "
        f"{outcome.time_dilation:g}"
    )
    if outcome.tried:
        tried = ", ".join(
            f"{'?' if step is None else f'{step:.3f} s'} at {k:g}" for k, step in outcome.tried
        )
        line += f" (predicted before: {tried})"
    if outcome.decision is not None:
        line += f"; {outcome.decision.basis}"
    return line


def write_tensorboard_comparison(
    output_dir: Path,
    documents: Sequence[results.ResultDocument],
    training_s: Mapping[str, float] | None = None,
    predicted_s: Mapping[str, float] | None = None,
) -> Path:
    """The ``comparison`` TensorBoard run beside the profiles' runs (``output.comparison``):
    step time against link rate (replay, ``training_s`` by network name, the link's bound),
    latency per size class per network.  The replay's step of a network in
    ``predicted_s`` is that (the limit of its dilated replays), else its document's."""
    trace = None
    # The link's bound needs the trace; the rest does not.
    with contextlib.suppress(ResultError):
        trace = timeline.replayed_trace(documents[0])
    points = comparison.link_points(
        documents, trace=trace, training_s=training_s, predicted_s=predicted_s
    )
    return comparison.write_comparison(
        output_dir, documents, points=points, wall_time_s=time.time()
    )
