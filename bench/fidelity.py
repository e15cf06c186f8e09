"""Does a replay predict training's step on a link?  Training and replay side by side, in one run.

The project's figure (docs/design.md#figures-the-project-holds-itself-to):
the replayed step predicts training's step on every emulated link where
training is link-bound, within 10%, and says so when the replay itself is the
bound.  For each model and each link profile, this
script (root: it builds network namespaces):

1. captures real distributed training on that emulated link
   (``tf-grpc-bench capture --network PROFILE``: 2 ps on one host, chief and 2
   workers on another, tf2-ps, synchronous) ``--repeats`` times (default 2),
   each beside the same job uncaptured (``--order``), and takes training's step: the
   median of its steady rounds (the captures' own steps), every run's pooled;
2. captures the same job once on loopback (no ``--network``);
3. replays each link trace right after its pair, and the loopback trace once
   a link, across the link's PS throughput
   (``tf-grpc-bench network compare TRACE --profiles PROFILE``, dependencies
   pacing, compute kept) and takes each replay's predicted step
   (``statistics.prediction.step_ns``; the link traces' median);
4. writes the ratios, the link's physical bound (the heavier direction's
   bytes of a round over the link rate, plus twice its one-way delay on a
   delayed link) and the replay's CPU into the
   ``## Fidelity`` section of ``bench/README.md``;
5. keeps the traces (``MODEL-loopback.tfgbtrace``, ``MODEL-PROFILE.tfgbtrace``;
   the second pair's on, ``MODEL-PROFILE-r2.tfgbtrace`` and so on) and every
   replay's run directory (``PROFILE-lo``, ``PROFILE-link``, ``PROFILE-link-r2``) under
   ``--logdir`` (default ``runs/fidelity``), one folder per model and setup,
   so each can be taken apart afterwards (``tf-grpc-bench inspect``,
   ``timeline``), with a ``comparison``
   TensorBoard run per model: step time against link rate for the replay
   (from the loopback trace), training and the link's bound, and latency per
   size class per link (``tensorboard --logdir runs/fidelity``).

Usage: ``sudo .venv/bin/python bench/fidelity.py [--models resnet50,vgg16]
[--setup tf2-ps|tf1-ps] [--profiles 1gbit,...,1gbit:delay=1ms,10gbit:delay=100us] [--steps 8]
[--repeats 2] [--order alternate|uncaptured-first|captured-first] [--cpu-cap CORES]
[--cross-machine TRACES [--pairs FILE] [--replay-duration S]] [--no-readme]
[--logdir runs/fidelity]``
(needs the profiler extra).

On a delayed link, what its relays took in each training run and in the link trace's
replay (their CPU per GB moved, ``relay_use.py``) follows the tables: the relays run
on the cores training uses (docs/fidelity.md, Limits).

Every training shape is run side by side on each link, ``--repeats N`` pairs
in a row: uncaptured (A: ``python -m tf_grpc_bench.profiler.uncaptured``, the same
launcher, tasks and placement with no recorder, its rounds timed by its own step
markers) and captured (B), then the capture's trace replayed (R).  Which training
runs first alternates pair by pair (``--order alternate``, the default: A B R | B A R),
so that a run's place in its pair (the first after a replay, say) weighs on both
sides alike; ``--order uncaptured-first`` (A B R | A B R) or ``captured-first``
keep one order.  The tables give the prediction over both
sides pooled (the median of every run's rounds together: a run weighs by its
rounds), each pair's own ratios, how far apart the uncaptured runs' medians were
(a row where they were over 5% apart, the figure a ratio is judged by, is marked
'reference moved': one pair cannot tell a prediction's error from it) and each
capture's cost (captured over uncaptured round and tasks' CPU per round), each
pair's order and the captures' mean cost per order (a capture costs its round or
more: a cost under 1 in one order is that order's effect).  Each
run's rounds stay ``--steps`` (8): on a link their interquartile range within a
run has been 1-9% of the median (a median of 8 then off by about 2%), while runs of
the same shape have been up to 15-17% apart; more runs narrow that, more rounds do not.

``--cross-machine TRACES`` replays traces captured on other instances (a shipped
trace, an earlier run's) against their jobs trained here (``cross_machine.py``).
Training, uncaptured and captured, and what a capture did: ``training.py``.

Each model and setup gets its own section, ``## Fidelity: MODEL, SETUP``, so
runs of different models do not overwrite each other.

``--cpu-cap CORES`` makes a slower machine out of this one for training: every
capture runs in a CPU cgroup capped at CORES of this machine's CPUs (its
calibration timed inside it), and the replays, uncapped, keep the traces'
compute as recorded (``--compute recorded``; scaling it to this machine would
undo the cap).  Such a run goes to a section of its own, ``## Fidelity on a
slower machine: MODEL, SETUP, CORES cores``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from common import (
    README,
    calibration_cache,
    command_line,
    cpu_cgroup,
    load_average,
    machine_line,
    table_head,
    table_row,
    tf_grpc_bench_command,
    write_section,
)
from relay_use import RelaySampler, RelayUse, relay_table, sampled
from training import (
    CaptureFacts,
    Runs,
    Uncaptured,
    capture,
    capture_facts,
    job_arguments,
    link_bound_seconds,
    percent,
    pooled_uncaptured,
    rounds_seconds,
    run,
    train_uncaptured,
    uncaptured_runs,
)

from tf_grpc_bench import lifetime
from tf_grpc_bench.netns.links import parse_profile
from tf_grpc_bench.replay.network.compare import write_tensorboard_comparison
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.trace import Trace
from tf_grpc_bench.units import format_seconds

SECTION = "## Fidelity: {model}, {setup}"
#: The section of a run whose captures were capped (``--cpu-cap``): a slower machine.
CAPPED_SECTION = "## Fidelity on a slower machine: {model}, {setup}, {cores:g} cores"
#: Warm-up and measured seconds of each replay (one run: the prediction is a median of steps).
REPLAY_WARMUP_S = "4"
REPLAY_DURATION_S = "20"
#: Replay CPU (client plus server cores) above which the replay is taken as its own bound.
CPU_BOUND_CORES = 1.4
#: Side-by-side pairs (uncaptured, captured) per link: each side measured twice.
REPEATS = 2
#: What a pair's uncaptured and captured trainings give (``in_order``).
Plain = TypeVar("Plain")
Captured = TypeVar("Captured")
#: A pair's runs: training uncaptured (A) and captured (B), the replay of a trace (R).
UNCAPTURED, CAPTURED, REPLAY = "A", "B", "R"
#: ``--order``: which training of a pair runs first.  ``alternate`` (the default) swaps it
#: pair by pair (A B | B A), so that an effect of a run's place in its pair (the first run
#: after a replay slower, say) weighs on both sides alike instead of on one.
ORDERS = ("alternate", "uncaptured-first", "captured-first")


def schedule(order: str, repeats: int) -> tuple[tuple[str, ...], ...]:
    """Each pair's runs in the order they are made: its two trainings in ``order``
    (``ORDERS``; alternate: pair 1 uncaptured first, pair 2 captured first, and so on), then
    the replay, which so always follows its pair's capture."""
    if order not in ORDERS:
        raise ValueError(f"--order: one of {', '.join(ORDERS)}, got {order!r}")
    return tuple(
        pair_runs(order == "captured-first" or (order == "alternate" and number % 2 == 1))
        for number in range(repeats)
    )


def pair_runs(captured_first: bool) -> tuple[str, ...]:
    """A pair's runs in the order made: its two trainings, then the replay."""
    trainings = (CAPTURED, UNCAPTURED) if captured_first else (UNCAPTURED, CAPTURED)
    return (*trainings, REPLAY)


def in_order(
    runs: Sequence[str], uncaptured: Callable[[], Plain], captured: Callable[[], Captured]
) -> tuple[Plain, Captured]:
    """A pair's two trainings made in the order of ``runs`` (``schedule``; the replay is the
    caller's): what ``uncaptured`` and ``captured`` returned."""
    if runs.index(UNCAPTURED) < runs.index(CAPTURED):
        plain = uncaptured()
        return plain, captured()
    trace = captured()
    return uncaptured(), trace


def schedule_text(pairs: Sequence[tuple[str, ...]]) -> str:
    """A schedule as the tables spell it: 'A B R | B A R'."""
    return " | ".join(" ".join(runs) for runs in pairs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    step_s: float
    compute_s: float
    cpu_cores: float
    #: Client plus server CPU seconds the replay spent per replayed round (a step of every
    #: worker): over the machine's cores, the shortest round this machine could replay.
    cpu_per_round_s: float | None
    #: The replay's result document (for the TensorBoard comparison).
    document: Path
    #: The time dilation ``network compare`` chose (1: none).
    time_dilation: float = 1.0
    #: The last replay's own step where ``step_s`` is the limit of its dilations
    #: (``comparison.json``'s ``predicted_step_s``), else None.
    last_step_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Repeat:
    """One side-by-side pair on a link: the job uncaptured and captured, in either order
    (``captured_first``), then the replay of the trace that capture made."""

    uncaptured: Uncaptured
    capture: CaptureFacts
    #: The capture's rounds (its trace's steps), in order.
    captured_rounds_s: tuple[float, ...]
    prediction: Prediction | None
    #: A delayed link's relays in the three runs (``relay_use``; uncaptured, captured,
    #: replay, whatever order they ran in); () on a link without relays.
    relays: tuple[RelayUse | None, ...] = ()
    #: The capture ran before the uncaptured training (``schedule``).
    captured_first: bool = False

    @property
    def runs(self) -> tuple[str, ...]:
        """The pair's runs in the order made ('B A R': captured first)."""
        return pair_runs(self.captured_first)

    @property
    def capture_cost(self) -> float:
        """The capture's round over the uncaptured run's (medians of each run's rounds)."""
        return statistics.median(self.captured_rounds_s) / statistics.median(
            self.uncaptured.each_round_s
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    model: str
    profile: str
    #: Training's median round as the capture on the link measured it (with ``repeats``,
    #: the median of every capture's rounds pooled).
    training_s: float
    link_bound_s: float | None
    from_loopback: Prediction | None
    from_link: Prediction | None
    link_capture: CaptureFacts | None = None
    #: The same training with no recorder, beside the capture (None: not run; with
    #: ``repeats``, every uncaptured run's rounds pooled).
    uncaptured: Uncaptured | None = None
    #: A delayed link's relays in the uncaptured training, the capture and the link
    #: trace's replay (``relay_use``); () on a link without relays.
    relays: tuple[RelayUse | None, ...] = ()
    #: The side-by-side pairs on the link, in the order run (``--repeats``).  With them,
    #: ``from_link``, ``link_capture`` and ``relays`` are each repeat's, not the row's.
    repeats: tuple[Repeat, ...] = ()

    @property
    def uncaptured_runs(self) -> Runs | None:
        """The repeats' uncaptured runs (None without repeats)."""
        return uncaptured_runs([r.uncaptured for r in self.repeats]) if self.repeats else None

    @property
    def captured_runs(self) -> Runs | None:
        return Runs(tuple(r.captured_rounds_s for r in self.repeats)) if self.repeats else None

    @property
    def predicted_s(self) -> float | None:
        """The link traces' prediction: the median of the repeats' (None: all failed)."""
        return pooled_step([r.prediction for r in self.repeats])


def pooled_row(
    model: str,
    profile: str,
    repeats: Sequence[Repeat],
    *,
    link_bound_s: float | None,
    from_loopback: Prediction | None,
) -> Row:
    """A link's row from its repeats: training uncaptured and captured each the median of its
    runs' rounds pooled (``training.Runs.median_s``)."""
    return Row(
        model=model,
        profile=profile,
        training_s=Runs(tuple(r.captured_rounds_s for r in repeats)).median_s,
        uncaptured=pooled_uncaptured([r.uncaptured for r in repeats]),
        link_bound_s=link_bound_s,
        from_loopback=from_loopback,
        from_link=None,
        repeats=tuple(repeats),
    )


def pooled_step(predictions: Sequence[Prediction | None]) -> float | None:
    """The median of the predictions that were made (None: none was)."""
    steps = [prediction.step_s for prediction in predictions if prediction is not None]
    return statistics.median(steps) if steps else None


def predict(
    trace_path: Path,
    profile: str,
    output_dir: Path,
    *,
    length: tuple[str, ...] = ("--duration", REPLAY_DURATION_S),
    extra: tuple[str, ...] = (),
) -> Prediction | None:
    """The replay's prediction across ``profile``; ``length`` says how long each run is
    (``--duration S`` or ``--steps N``), ``extra`` adds replay flags (a what-if's)."""
    compare = tf_grpc_bench_command(
        "network", "compare", str(trace_path), "--profiles", profile,
        "--benchmark", "ps-throughput", "--warmup", REPLAY_WARMUP_S,
        *length, "--runs", "1", "--output-dir", str(output_dir),
        # VGG-16's largest tensor (411 MB) is over the 256 MiB default.
        "--max-message-size", "1GB", *extra,
    )  # fmt: skip
    run(compare)
    documents = sorted(output_dir.rglob("results.json"))
    if not documents:
        return None
    document = json.loads(documents[-1].read_text())
    statistics_block = document["benchmarks"][0]["statistics"]
    prediction = statistics_block.get("prediction")
    if not prediction or prediction.get("step_ns") is None:
        return None
    step_s = last_step_s = prediction["step_ns"] / 1e9
    # The comparison's prediction: the limit of its dilated replays where it fitted one.
    for summary in sorted(output_dir.glob("*-compare/comparison.json"))[-1:]:
        (profile_summary,) = json.loads(summary.read_text())["profiles"]
        if profile_summary.get("predicted_step_s") is not None:
            step_s = profile_summary["predicted_step_s"]
    cores = (statistics_block.get("client_cpu_utilization") or 0.0) + (
        statistics_block.get("server_cpu_utilization") or 0.0
    )
    return Prediction(
        step_s=step_s,
        last_step_s=last_step_s if step_s != last_step_s else None,
        cpu_per_round_s=cpu_per_round(document["benchmarks"][0]),
        compute_s=(prediction.get("compute_ns") or 0.0) / 1e9,
        cpu_cores=cores,
        document=documents[-1],
        time_dilation=float(document["benchmarks"][0]["parameters"].get("time_dilation", 1.0)),
    )


def cpu_per_round(benchmark: dict[str, Any]) -> float | None:
    """Client plus server CPU seconds per replayed round: the measured runs' CPU over
    the rounds they replayed (worker-steps over workers)."""
    statistics_block = benchmark["statistics"]
    steps = (statistics_block.get("prediction") or {}).get("steps") or 0
    workers = benchmark["parameters"].get("workers") or 0
    client, server = statistics_block.get("client_cpu_ns"), statistics_block.get("server_cpu_ns")
    if not steps or not workers or client is None or server is None:
        return None
    # A dilated replay's document divides its CPU times by the dilation, as every time.
    dilation = benchmark["parameters"].get("time_dilation", 1.0)
    return float((client + server) * dilation / 1e9 / (steps / workers))


def measure(
    model: str,
    setup: str,
    profiles: list[str],
    steps: int,
    logdir: Path,
    *,
    cpu_cap: float | None = None,
    replay_flags: tuple[str, ...] = (),
    repeats: int = REPEATS,
    order: str = ORDERS[0],
) -> tuple[CaptureFacts, list[Row]]:
    """The loopback capture's facts, and a row per profile: ``repeats`` side-by-side pairs
    on the link, their trainings in ``order`` (``schedule``), each capture's trace replayed
    after its pair, then the loopback trace's replay.  With ``cpu_cap``, every capture runs
    in a CPU cgroup capped at that many cores (a slower machine; its calibration timed
    inside it) and the replays keep the traces' compute as recorded.  ``replay_flags`` go to
    every replay (``--engine``, ``--time-dilation``, ``--compute-load``)."""
    name = f"{model}-{setup}" if cpu_cap is None else f"{model}-{setup}-cap{cpu_cap:g}"
    suffixes = [flag.lstrip("-").replace("=", "-") for flag in replay_flags]
    folder = logdir / "-".join([name, *suffixes])
    loopback_trace = folder / f"{model}-loopback.tfgbtrace"
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        prefix: tuple[str, ...] = ()
        extra: tuple[str, ...] = replay_flags
        if cpu_cap is not None:
            prefix = tuple(stack.enter_context(cpu_cgroup(cpu_cap)))
            # The replays run uncapped: scaling the compute to this machine would undo the cap.
            extra = (*extra, "--compute", "recorded")

        def trained(
            output: Path, profile: str | None, runs: Sequence[str]
        ) -> tuple[Trace, Uncaptured, list[RelayUse | None]]:
            """The job with no recorder and captured, side by side in the order of ``runs``
            (``UNCAPTURED``, ``CAPTURED``); and what a delayed link's relays took in each
            (uncaptured, captured)."""
            delayed = profile is not None and parse_profile(profile).delayed

            def uncaptured() -> tuple[Uncaptured, RelayUse | None]:
                with sampled(delayed) as relays:
                    plain = train_uncaptured(
                        job_arguments(model, setup, steps), profile, prefix=prefix
                    )
                return plain, _use(relays)

            def captured() -> tuple[Trace, RelayUse | None]:
                with sampled(delayed) as relays, contextlib.ExitStack() as capped:
                    if cpu_cap is not None:
                        calibrations = folder / "capped-calibrations.json"
                        capped.enter_context(calibration_cache(calibrations))
                    trace = capture(model, setup, steps, output, profile, prefix=prefix)
                return trace, _use(relays)

            (plain, plain_use), (trace, trace_use) = in_order(runs, uncaptured, captured)
            return trace, plain, [plain_use, trace_use]

        pairs = schedule(order, repeats)
        loopback_capture, loopback_plain, _ = trained(loopback_trace, None, pairs[0])
        loopback = capture_facts(loopback_capture, "loopback", loopback_plain)
        rows = []
        for profile in profiles:
            done: list[Repeat] = []
            bound_s = None
            for number, runs in enumerate(pairs, start=1):
                # Repeat 1 keeps the names a run of one pair has; the others add "-rN".
                suffix = "" if number == 1 else f"-r{number}"
                link_trace = folder / f"{model}-{profile}{suffix}.tfgbtrace"
                link_capture, plain, uses = trained(link_trace, profile, runs)
                with sampled(bool(uses[0])) as relays:
                    from_link = predict(
                        link_trace, profile, folder / f"{profile}-link{suffix}", extra=extra
                    )
                label = profile if repeats == 1 else f"{profile} #{number}"
                done.append(
                    Repeat(
                        uncaptured=plain,
                        capture=capture_facts(link_capture, label, plain),
                        captured_rounds_s=rounds_seconds(link_capture),
                        prediction=from_link,
                        relays=(*uses, _use(relays)) if uses[0] else (),
                        captured_first=runs[0] == CAPTURED,
                    )
                )
                print(done[-1], file=sys.stderr, flush=True)
                if bound_s is None:
                    bound_s = link_bound_seconds(link_capture, profile)
            rows.append(
                pooled_row(
                    model, profile, done, link_bound_s=bound_s,
                    from_loopback=predict(
                        loopback_trace, profile, folder / f"{profile}-lo", extra=extra
                    ),
                )
            )  # fmt: skip
    write_comparison(folder, rows)
    return loopback, rows


def _use(sampler: RelaySampler | None) -> RelayUse | None:
    """What a ``sampled`` block's relays took (None without a sampler)."""
    return None if sampler is None else sampler.use()


def write_comparison(directory: Path, rows: list[Row]) -> None:
    """The TensorBoard comparison of one model: replays from the loopback trace, training."""
    documents = [
        read_document(row.from_loopback.document) for row in rows if row.from_loopback is not None
    ]
    if documents:
        training = {
            row.profile: row.training_s if row.uncaptured is None else row.uncaptured.round_s
            for row in rows
        }
        predicted = {
            row.profile: row.from_loopback.step_s for row in rows if row.from_loopback is not None
        }
        write_tensorboard_comparison(
            directory, documents, training_s=training, predicted_s=predicted
        )


def _cpu_cells(prediction: Prediction | None) -> list[str]:
    if prediction is None or prediction.cpu_per_round_s is None:
        return ["-", "-"]
    cores = os.cpu_count() or 1
    floor = prediction.cpu_per_round_s / cores
    return [f"{prediction.cpu_per_round_s:.2f} s", f"{floor:.2f} s"]


def _prediction_cells(
    prediction: Prediction | None, training_s: float, uncaptured_s: float | None = None
) -> list[str]:
    """The predicted step, and its ratios to uncaptured training and to the captured one
    ("uncaptured / captured"; the captured alone where no uncaptured run was made)."""
    if prediction is None:
        return ["failed", "-"]
    bound = " (replay CPU-bound)" if prediction.cpu_cores >= CPU_BOUND_CORES else ""
    dilated = _dilated(prediction)
    if prediction.last_step_s is not None:
        dilated = f" (limit; x{prediction.time_dilation:g}: {prediction.last_step_s:.2f} s)"
    return [
        f"{prediction.step_s:.2f} s{dilated}",
        _ratios(prediction.step_s, training_s, uncaptured_s) + bound,
    ]


def _dilated(prediction: Prediction) -> str:
    """'(xK)' for a dilated replay, '(limit; xK)' for a limit fitted through dilations."""
    if prediction.last_step_s is not None:
        return f" (limit; x{prediction.time_dilation:g})"
    return f" (x{prediction.time_dilation:g})" if prediction.time_dilation != 1 else ""


def _ratios(step_s: float, captured_s: float, uncaptured_s: float | None) -> str:
    """'**over uncaptured** / over captured' (the captured alone without an uncaptured)."""
    ratio = f"{step_s / captured_s:.2f}"
    return ratio if uncaptured_s is None else f"**{step_s / uncaptured_s:.2f}** / {ratio}"


def _pooled_cells(row: Row) -> list[str]:
    """The link traces' prediction over the repeats (their median) and its ratios to the
    pooled uncaptured and captured training."""
    made = [r.prediction for r in row.repeats if r.prediction is not None]
    step_s = row.predicted_s
    if step_s is None:
        return ["failed", "-"]
    marks = {_dilated(prediction) for prediction in made}
    dilated = marks.pop() if len(marks) == 1 else " (dilations differ: repeats)"
    if len(made) < len(row.repeats):
        dilated += f" ({len(row.repeats) - len(made)} of {len(row.repeats)} failed)"
    bound = any(prediction.cpu_cores >= CPU_BOUND_CORES for prediction in made)
    plain = None if row.uncaptured is None else row.uncaptured.round_s
    ratio = _ratios(step_s, row.training_s, plain)
    return [f"{step_s:.2f} s{dilated}", ratio + (" (replay CPU-bound)" if bound else "")]


def _flagged(cells: list[str], runs: Runs | None) -> list[str]:
    """A prediction's cells, its ratio marked where the reference moved (``flag``)."""
    return [cells[0], cells[1] + flag(runs)] if cells[1] != "-" else cells


def flag(runs: Runs | None) -> str:
    """' (reference moved X)' where the uncaptured runs' medians were further apart than the
    5% a ratio is judged by, else ''."""
    if runs is None or not runs.moved:
        return ""
    return f" (reference moved {percent(runs.spread)})"


def repeats_table(links: Sequence[tuple[str, Sequence[Repeat]]]) -> list[str]:
    """Per link, its repeats in the order run: the uncaptured runs' medians and how far apart
    they were, each run's rounds' spread, the captured runs' medians, each replay's
    prediction and its ratios to its own pair, each capture's cost and each pair's order;
    then the captures' mean cost per order (``order_costs``)."""
    lines = [
        "Each link's repeats, in the order run: the uncaptured runs' medians; the reference's",
        "spread (their largest over their smallest, less 1; over 5%, the ratios above are",
        "marked 'reference moved': one pair could not tell a prediction's error from it) and",
        "each run's rounds' spread (interquartile range over median); the captured runs'",
        "medians; each replay's prediction, over its own pair (uncaptured / captured); each",
        "capture's cost (captured over uncaptured round); and each pair's order (A uncaptured,",
        "B captured: which ran first).",
        "",
        *table_head(
            "link", "uncaptured runs", "reference spread", "rounds' spread", "captured runs",
            "prediction each", "ratio each", "capture cost: round", "order",
        ),
    ]  # fmt: skip
    for link, repeats in links:
        plain = uncaptured_runs([r.uncaptured for r in repeats])
        captured = Runs(tuple(r.captured_rounds_s for r in repeats))
        pairs = list(zip(repeats, plain.medians_s, captured.medians_s, strict=True))
        lines.append(
            table_row(
                link,
                ", ".join(format_seconds(median) for median in plain.medians_s),
                percent(plain.spread),
                ", ".join(percent(spread) for spread in plain.rounds_spreads),
                ", ".join(format_seconds(median) for median in captured.medians_s),
                ", ".join(_step(r.prediction) for r in repeats),
                ", ".join(_each_ratio(r.prediction, u, c) for r, u, c in pairs),
                ", ".join(f"{c / u:.3f}" for _, u, c in pairs),
                ", ".join(" ".join(r.runs[:2]) for r in repeats),
            )
        )
    return [*lines, "", order_costs([r for _, repeats in links for r in repeats])]


def order_costs(repeats: Sequence[Repeat]) -> str:
    """The captures' mean cost (captured over uncaptured round) per pair order, over every
    link's pairs: a capture costs its round or more, so a cost under 1 in one order only is
    the order's effect, not the capture's."""
    groups = [
        (name, [r.capture_cost for r in repeats if r.captured_first == first])
        for name, first in (("uncaptured first (A B)", False), ("captured first (B A)", True))
    ]
    means = [
        f"{name} {statistics.mean(costs):.3f} ({len(costs)} pair{'s' * (len(costs) != 1)})"
        for name, costs in groups
        if costs
    ]
    return f"Capture cost by order, mean over the pairs above: {', '.join(means)}."


def _step(prediction: Prediction | None) -> str:
    return "failed" if prediction is None else f"{prediction.step_s:.2f} s{_dilated(prediction)}"


def _each_ratio(prediction: Prediction | None, uncaptured_s: float, captured_s: float) -> str:
    return "-" if prediction is None else _ratios(prediction.step_s, captured_s, uncaptured_s)


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or not denominator:
        return "-"
    return f"{numerator / denominator:.3f}"


def capture_table(captures: list[CaptureFacts]) -> list[str]:
    """One row per capture: its round, the machine's and the tasks' CPU, the critical path."""
    lines = [
        "Each capture's training (docs/fidelity.md, Limits): its median round; the capture",
        "machine's cores busy over its steps (every process and the kernel's work) and its",
        "tasks' CPU seconds per round (`capture_cpu` in the trace); the captured critical path",
        "per worker-step (`inspect`'s means): compute, of it the time one of the worker's own",
        "answers (a gradient the ps pulled) was leaving it and the stretches right before TF1's",
        "sync token (the ps's apply after the round's last gradient), and communication.",
        "The same training with no recorder, run beside each capture on the same link (just",
        "before or after it: its pair's order; `python -m tf_grpc_bench.profiler.uncaptured`:",
        "the launcher's job, its rounds timed by its step markers): its median round and",
        "tasks' CPU per round, and what the capture cost: captured over uncaptured, round and",
        "tasks' CPU.",
        "",
        *table_head(
            "capture", "round", "cores busy", "tasks' CPU per round", "path compute",
            "of it, worker sending", "of it, before the sync token", "path communication",
            "uncaptured round", "uncaptured tasks' CPU", "capture cost: round", "CPU",
        ),
    ]  # fmt: skip
    for facts in captures:
        busy = "-"
        if facts.cpu is not None:
            busy = f"{facts.cpu.busy_cores:.2f} of {facts.cpu.cores}"
        lines.append(
            table_row(
                facts.link,
                format_seconds(facts.round_s),
                busy,
                format_seconds(facts.tasks_cpu_per_round_s),
                format_seconds(facts.path_compute_s),
                format_seconds(facts.path_compute_sending_s),
                format_seconds(facts.path_compute_before_token_s),
                format_seconds(facts.path_communication_s),
                *_uncaptured_cells(facts),
            )
        )
    return lines


def _uncaptured_cells(facts: CaptureFacts) -> list[str]:
    """The uncaptured run's round and tasks' CPU per round, and the capture's over them."""
    plain = facts.uncaptured
    if plain is None:
        return ["-", "-", "-", "-"]
    return [
        format_seconds(plain.round_s),
        format_seconds(plain.tasks_cpu_per_round_s),
        _ratio(facts.round_s, plain.round_s),
        _ratio(facts.tasks_cpu_per_round_s, plain.tasks_cpu_per_round_s),
    ]


def section(model: str, setup: str, cpu_cap: float | None, replay_flags: Sequence[str] = ()) -> str:
    """The README section of a run; one of its own per engine or dilation asked for."""
    title = (
        SECTION.format(model=model, setup=setup)
        if cpu_cap is None
        else CAPPED_SECTION.format(model=model, setup=setup, cores=cpu_cap)
    )
    return " ".join([title, *replay_flags])


def _repeats_prose(rows: Sequence[Row]) -> list[str]:
    """How a run of repeated pairs pooled them ([] without repeats)."""
    longest = max((row.repeats for row in rows), key=len, default=())
    if not longest:
        return []
    order = schedule_text([r.runs for r in longest])
    return [
        f"Each link: {len(longest)} side-by-side pairs, training uncaptured (A) and captured (B),",
        f"the capture's trace replayed (R) after its pair: {order}",
        "(which training runs first alternates pair by pair unless `--order` says otherwise:",
        "docs/fidelity.md); training is the median of the pairs' rounds pooled, the link",
        "trace's replay the median of the pairs' predictions; the loopback trace is replayed",
        "once a link. '(reference moved X)': the uncaptured runs' medians were X apart, more",
        "than the 5% a ratio is judged by (the repeats' table below).",
        "",
    ]


def report(
    rows: list[Row],
    setup: str,
    command: str,
    before: str,
    after: str,
    loopback: CaptureFacts | None = None,
    *,
    cpu_cap: float | None = None,
    replay_flags: Sequence[str] = (),
) -> str:
    capped = []
    if cpu_cap is not None:
        capped = [
            f"A slower machine: every capture (training) ran in a CPU cgroup capped at {cpu_cap:g}",
            f"of this machine's {os.cpu_count()} CPUs; the replays ran uncapped and kept",
            "the traces' compute as recorded (`--compute recorded`).",
            "",
        ]
    lines = [
        section(rows[0].model if rows else "?", setup, cpu_cap, replay_flags),
        "",
        f"`{command}`",
        "",
        machine_line(before, after),
        "",
        *capped,
        f"Training: median steady round (a step on each of 2 workers, synchronous {setup}, 2 ps on",
        "one emulated host, chief and workers on another) on the link, uncaptured (the same",
        "launcher with no recorder, beside the capture) and captured. Ratios: the",
        "prediction over **uncaptured** training / over captured training. Replay: the",
        "predicted step (dependencies pacing, compute kept) of the PS-throughput replay across",
        "the same link, of a trace captured on loopback and of the one captured on the link,",
        "with network compare's default automatic time dilation: '(xK)' marks a replay run K",
        "times slower on a link K times slower, its times divided by K (docs/fidelity.md);",
        "'(limit; xK: P)': the step's limit as the dilation grows, fitted through the dilated",
        "replays (step = S + c/K), which network compare predicts, and the last one's step P.",
        f"'replay CPU-bound': replay client and server used >= {CPU_BOUND_CORES} of 2 cores.",
        "'replay CPU': the loopback-trace replay's client and server CPU seconds per replayed",
        "round; 'CPU floor': that over this machine's cores, the shortest round it could replay",
        "undilated even with the work spread perfectly (a floor near training's round is what",
        "time dilation is for). 'link bound': the heavier direction's bytes of a round over the",
        "link's rate, plus twice its one-way delay on a delayed link (docs/networks.md).",
        "",
        *_repeats_prose(rows),
        *table_head(
            "model", "link", "training round, uncaptured", "captured", "link bound",
            "replay (loopback trace)", "ratio", "replay (link trace)", "ratio", "replay CPU",
            "CPU floor",
        ),
    ]  # fmt: skip
    for row in rows:
        bound = "-" if row.link_bound_s is None else f"{row.link_bound_s:.2f} s"
        plain = None if row.uncaptured is None else row.uncaptured.round_s
        link_cells = _prediction_cells(row.from_link, row.training_s, plain)
        if row.repeats:
            link_cells = _pooled_cells(row)
        lines.append(
            table_row(
                row.model,
                row.profile,
                format_seconds(plain),
                f"{row.training_s:.2f} s",
                bound,
                *_flagged(
                    _prediction_cells(row.from_loopback, row.training_s, plain),
                    row.uncaptured_runs,
                ),
                *_flagged(link_cells, row.uncaptured_runs),
                *_cpu_cells(row.from_loopback),
            )
        )
    if any(row.repeats for row in rows):
        lines += ["", *repeats_table([(row.profile, row.repeats) for row in rows if row.repeats])]
    captures = [loopback] if loopback is not None else []
    for row in rows:
        captures += [r.capture for r in row.repeats]
        captures += [row.link_capture] if row.link_capture is not None else []
    if captures:
        lines += ["", *capture_table(captures)]
    relayed = [(row.profile, row.relays) for row in rows if row.relays]
    for row in rows:
        relayed += [(r.capture.link, r.relays) for r in row.repeats if r.relays]
    if relayed:
        lines += ["", *relay_table(relayed)]
    return "\n".join(lines)


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's flags; a one-line error (exit 2) for a bad one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet50,vgg16")
    parser.add_argument("--setup", default="tf2-ps", choices=("tf2-ps", "tf1-ps"))
    parser.add_argument(
        "--profiles",
        default="1gbit,2.5gbit,5gbit,10gbit,unlimited,1gbit:delay=1ms,10gbit:delay=100us",
        help="link profiles, with delays as well (docs/networks.md, Profiles)",
    )
    parser.add_argument("--steps", type=int, default=8, help="steady rounds per capture")
    parser.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        metavar="N",
        help="side-by-side pairs (uncaptured, captured) per link, each capture's trace "
        "replayed (with --cross-machine: the trace replayed once per pair)",
    )
    parser.add_argument(
        "--order",
        default=ORDERS[0],
        choices=ORDERS,
        help="which training of each pair runs first: alternate (pair 1 uncaptured, pair 2 "
        "captured, ...), uncaptured-first or captured-first (default: alternate)",
    )
    parser.add_argument(
        "--cpu-cap",
        type=float,
        default=None,
        metavar="CORES",
        help="capture training in a CPU cgroup capped at CORES (a slower machine); "
        "replays keep the recorded compute",
    )
    parser.add_argument(
        "--cross-machine",
        default=None,
        metavar="TRACES",
        help="replay these traces captured on other instances (shipped names or files, "
        "comma-separated) against their jobs trained here (bench/cross_machine.py)",
    )
    parser.add_argument(
        "--pairs",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --cross-machine: merge the measured pairs into FILE (default: the "
        "package's, written with bench/README.md only)",
    )
    parser.add_argument(
        "--replay-duration",
        default=REPLAY_DURATION_S,
        metavar="S",
        help="with --cross-machine: seconds of each replay",
    )
    parser.add_argument(
        "--engine",
        default=None,
        metavar="NAME",
        help="the replays' engine (grpcio, grpc-cpp; default: network compare's, auto)",
    )
    parser.add_argument(
        "--time-dilation",
        default=None,
        metavar="K",
        help="replay at this dilation only (1: none; default: network compare's automatic)",
    )
    parser.add_argument(
        "--compute-load",
        default=None,
        metavar="MODE",
        help="the replays' compute load (auto, none, gaps, uniform; default: network "
        "compare's, auto; docs/fidelity.md, Compute load)",
    )
    parser.add_argument(
        "--compute-load-wait",
        action="store_true",
        help="the replays' rounds wait for their compute load's quotas (docs/fidelity.md, "
        "Compute load)",
    )
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument(
        "--logdir", default="runs/fidelity", help="where the replays' runs and comparisons go"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: at least 1 pair a link is measured, got {args.repeats}")
    if args.steps < 1:
        parser.error(f"--steps: at least 1 round a run is measured, got {args.steps}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    command = command_line("bench/fidelity.py", sys.argv[1:] if argv is None else list(argv))
    replay_flags = tuple(
        f"--{name.replace('_', '-')}={value}"
        for name, value in (
            ("engine", args.engine),
            ("time_dilation", args.time_dilation),
            ("compute_load", args.compute_load),
        )
        if value is not None
    ) + (("--compute-load-wait",) if args.compute_load_wait else ())
    if args.cross_machine:
        from cross_machine import CrossRun, run_cross

        with lifetime.interrupt_on_signals():
            run_cross(
                CrossRun(
                    names=args.cross_machine.split(","), profiles=args.profiles.split(","),
                    steps=args.steps, logdir=Path(args.logdir), command=command,
                    readme=not args.no_readme, pairs_file=args.pairs,
                    replay_s=args.replay_duration, replay_flags=replay_flags,
                    repeats=args.repeats, order=args.order,
                )
            )  # fmt: skip
        return 0
    with lifetime.interrupt_on_signals():
        for model in args.models.split(","):
            before = load_average()
            loopback, rows = measure(
                model, args.setup, args.profiles.split(","), args.steps, Path(args.logdir),
                cpu_cap=args.cpu_cap, replay_flags=replay_flags, repeats=args.repeats,
                order=args.order,
            )  # fmt: skip
            body = report(
                rows, args.setup, command, before, load_average(), loopback,
                cpu_cap=args.cpu_cap, replay_flags=replay_flags,
            )  # fmt: skip
            print(body)
            if not args.no_readme:
                section_title = section(model, args.setup, args.cpu_cap, replay_flags)
                write_section(README, section_title, body)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        signum = lifetime.signal_of(stopped)
        print(f"fidelity: interrupted ({lifetime.signal_name(signum)})", file=sys.stderr)
        sys.exit(lifetime.exit_status(signum))
