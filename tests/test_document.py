"""Result documents: round trips, self-description, refusal of bad files, golden files."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.result_factory import GOLDEN_MACHINE, golden_document, make_results, make_run
from tf_grpc_bench import trace_files
from tf_grpc_bench.errors import ResultError, UnsupportedResultVersionError
from tf_grpc_bench.replay.core.measurement import (
    Benchmark,
    BenchmarkResult,
    CallSample,
    RunMeasurement,
    machine_cpu_busy_share,
)
from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output import machine
from tf_grpc_bench.replay.output.document import FORMAT_VERSION, ResultDocument, build_document
from tf_grpc_bench.replay.output.document_reader import (
    document_from_json_dict,
    loads_document,
    read_document,
)
from tf_grpc_bench.replay.output.document_writer import dumps_document, write_document
from tf_grpc_bench.replay.output.machine import NetworkInfo
from tf_grpc_bench.replay.output.prediction import (
    prediction_json,
    replay_bound_verdict,
    replay_cpu_cores,
    replay_lateness_share,
)
from tf_grpc_bench.replay.output.run_directories import discard_run_directory, new_run_directory
from tf_grpc_bench.sizes import SizeCategory

DATA = Path(__file__).parent / "data"
CREATED = datetime(2026, 11, 29, 12, 30, 5, tzinfo=timezone.utc)


def _document(**overrides: object) -> ResultDocument:
    arguments: dict[str, object] = {
        "config": {"command": "replay", "runs": 3, "warmup_s": 2.0, "serialized": False},
        "trace_path": None,
        "network": machine.loopback_network(["127.0.0.1:50001"]),
        "created": CREATED,
    }
    arguments.update(overrides)
    return build_document(make_results(), **arguments)  # type: ignore[arg-type]


def _single_line_error(error: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_document_read_back_equals_the_document_written(tmp_path: Path) -> None:
    document = _document()
    path = write_document(document, tmp_path / "results.json")
    back = read_document(path)
    assert back == document
    for original, read in zip(document.benchmarks, back.benchmarks, strict=True):
        assert read.runs == original.runs
        assert read.parameters == original.parameters
        assert read.latency_by_category == original.latency_by_category
        assert read.bandwidth_mb_per_s == original.bandwidth_mb_per_s
        assert read.step_times_ns == original.step_times_ns


def test_round_trip_keeps_integer_float_and_bool_parameters_apart(tmp_path: Path) -> None:
    document = _document(config={"runs": 1, "warmup_s": 1.0, "serialized": True, "mode": "x"})
    back = read_document(write_document(document, tmp_path / "r.json"))
    assert [type(v) for v in back.config.values()] == [int, float, bool, str]


def test_document_describes_machine_tool_time_and_network() -> None:
    document = _document()
    data = json.loads(dumps_document(document))
    assert data["format"] == "tf-grpc-bench-results"
    assert data["format_version"] == FORMAT_VERSION
    assert data["tool_version"]
    assert data["created_utc"] == "2026-11-29T12:30:05.000Z"
    machine = data["machine"]
    assert machine["cpu_count"] >= 1
    assert machine["memory_bytes"] > 0
    assert machine["grpcio_version"] and machine["protobuf_version"] and machine["numpy_version"]
    assert data["network"]["name"] == "loopback"
    assert data["network"]["interfaces"][0]["name"] == "lo"
    assert data["network"]["interfaces"][0]["mtu_bytes"] > 0


def test_document_records_the_trace_path_hash_and_model(small_trace_file: Path) -> None:
    document = _document(trace_path=small_trace_file)
    assert document.trace is not None
    assert document.trace.sha256 == trace_files.file_sha256(small_trace_file)
    assert document.trace.model == "toy"
    assert document.trace.step_count == 2
    assert Path(document.trace.path) == small_trace_file.resolve()


def test_raw_samples_and_derived_statistics_are_both_in_the_file() -> None:
    document = _document()
    data = json.loads(dumps_document(document))
    result = document.benchmarks[0]
    written = data["benchmarks"][0]
    run = result.runs[0]
    samples = written["runs"][0]["samples"]
    assert samples["count"] == run.rpc_count
    assert samples["latency_ns"] == [s.latency_ns for s in run.samples]
    assert samples["payload_bytes"] == [s.payload_bytes for s in run.samples]
    assert samples["start_ns"] == [s.start_ns for s in run.samples]
    statistics = written["statistics"]
    assert statistics["latency_ns"]["all"]["p99_ns"] == result.latency_all.p99_ns
    large = dict(result.latency_by_category)[SizeCategory.LARGE]
    assert statistics["latency_ns"]["large"]["p50_ns"] == large.p50_ns
    assert statistics["bandwidth_mb_per_s"] == result.bandwidth_mb_per_s
    assert statistics["rpcs_per_s"] == result.rpcs_per_s
    throughput = data["benchmarks"][2]
    assert throughput["runs"][0]["step_times_ns"] == list(
        document.benchmarks[2].runs[0].step_times_ns
    )
    assert throughput["statistics"]["step_time_ns"]["count"] == len(
        document.benchmarks[2].step_times_ns
    )
    # No step times in synthetic runs: statistics are null, not NaN (not JSON).
    assert statistics["step_time_ns"]["mean_ns"] is None


def test_a_partial_benchmark_makes_the_document_partial_with_its_reason() -> None:
    full = make_results(runs=2, calls=5)
    broken = make_run(run_index=1, sizes=(10,), calls=3, rng=np.random.default_rng(1), partial=True)
    full[0] = dataclasses.replace(full[0], runs=(full[0].runs[0], broken))
    document = build_document(full, config={}, trace_path=None, created=CREATED)
    assert document.partial
    assert document.partial_reason == "p2p-latency: server stopped answering"


def test_caller_can_mark_the_document_partial() -> None:
    document = _document(partial=True, partial_reason="interrupted by the user")
    assert document.partial and document.partial_reason == "interrupted by the user"
    assert not _document().partial


def test_non_scalar_parameter_is_refused_naming_it() -> None:
    with pytest.raises(ResultError, match="'sizes'") as error:
        _document(config={"sizes": [10, 20]})
    _single_line_error(error)


def test_unknown_format_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    data = json.loads(dumps_document(_document()))
    data["format_version"] = 99
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UnsupportedResultVersionError, match="format_version 99") as error:
        read_document(path)
    message = _single_line_error(error)
    assert str(path) in message and "99" in message


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_document_is_refused_in_one_line(tmp_path: Path, keep: float) -> None:
    text = dumps_document(_document())
    path = tmp_path / "cut.json"
    path.write_text(text[: int(len(text) * keep)])
    with pytest.raises(ResultError, match="truncated") as error:
        read_document(path)
    assert str(path) in _single_line_error(error)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"{ not json", "not valid JSON"),
        (b'{"format": "tf-grpc-bench-trace", "format_version": 1}', "not a tf-grpc-bench result"),
        (b"[1, 2, 3]", "not a tf-grpc-bench result"),
    ],
)
def test_corrupt_document_is_refused_in_one_line(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ResultError, match=expected) as error:
        read_document(path)
    assert str(path) in _single_line_error(error)


def test_field_of_the_wrong_type_is_named_by_its_path(tmp_path: Path) -> None:
    data = json.loads(dumps_document(_document()))
    data["benchmarks"][1]["runs"][0]["samples"]["latency_ns"][2] = "fast"
    path = tmp_path / "typed.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match=r"benchmarks\[1\]\.runs\[0\]\.samples\.latency_ns\[2\]"):
        read_document(path)


def test_sample_columns_of_different_lengths_are_refused(tmp_path: Path) -> None:
    data = json.loads(dumps_document(_document()))
    data["benchmarks"][0]["runs"][0]["samples"]["step"].pop()
    path = tmp_path / "ragged.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match=r"samples\.step"):
        read_document(path)


def test_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ResultError, match="no such result file"):
        read_document(tmp_path / "absent.json")


def test_write_replaces_the_file_atomically_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_document(_document(), path)
    write_document(_document(partial=True, partial_reason="second"), path)
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    assert read_document(path).partial_reason == "second"


def test_write_to_an_impossible_path_is_a_one_line_result_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ResultError, match="cannot write results") as error:
        write_document(_document(), blocker / "results.json")
    _single_line_error(error)


def test_golden_v1_document_is_still_readable() -> None:
    document = read_document(DATA / "results-v1.json")
    assert document.format_version == 1
    assert document.machine == GOLDEN_MACHINE
    assert document.labels == ("p2p-latency", "p2p-bandwidth", "ps-throughput")
    assert [r.rpc_count for r in document.benchmarks] == [12, 12, 12]
    assert document.partial and document.benchmarks[2].runs[-1].partial
    assert document.trace is not None and document.trace.model == "resnet50"
    assert document.network is not None and document.network.name == "loopback"
    # The statistics stored in the file agree with those recomputed from its raw samples.
    stored = json.loads((DATA / "results-v1.json").read_text())
    for result, written in zip(document.benchmarks, stored["benchmarks"], strict=True):
        statistics = written["statistics"]
        assert statistics["latency_ns"]["all"]["p50_ns"] == pytest.approx(result.latency_all.p50_ns)
        assert statistics["rpcs_per_s"] == pytest.approx(result.rpcs_per_s)
        assert statistics["bandwidth_mb_per_s"] == pytest.approx(result.bandwidth_mb_per_s)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_documents_before_version_5_read_with_the_machines_cpu_unknown(version: int) -> None:
    document = read_document(DATA / f"results-v{version}.json")
    runs = [run for result in document.benchmarks for run in result.runs]
    assert runs and all(
        run.machine_cpu_busy_ticks == run.machine_cpu_total_ticks == 0 for run in runs
    )
    assert machine_cpu_busy_share(runs) is None


@pytest.mark.parametrize("version", [1, 2, 3])
def test_documents_before_version_4_read_with_unknown_trace_rpcs(version: int) -> None:
    document = read_document(DATA / f"results-v{version}.json")
    assert document.format_version == version
    samples = [s for result in document.benchmarks for run in result.runs for s in run.samples]
    assert samples and all(sample.rpc_index == -1 for sample in samples)


def test_golden_v2_document_is_still_readable_without_inexact_sizes() -> None:
    document = read_document(DATA / "results-v2.json")
    assert document.format_version == 2
    assert all(result.inexact_sizes is None for result in document.benchmarks)
    assert document.benchmarks[2].step_compute_ns  # a version 2 field, kept


def test_inexact_sizes_round_trip_and_are_said_in_the_table() -> None:
    from tf_grpc_bench.replay.output.report import format_table

    document = read_document(DATA / f"results-v{FORMAT_VERSION}.json")
    assert document.benchmarks[0].inexact_sizes == golden_document().benchmarks[0].inexact_sizes
    assert (
        "sizes not exact: p2p-latency: 5 traced message sizes per pass cannot be encoded "
        "exactly in serialized mode (2 B -> 0 B x5): 120 B replayed for 130 B traced"
    ) in format_table(document).splitlines()


@pytest.mark.parametrize(
    ("replay_cores", "machine_share", "bound", "evidence"),
    [
        (1.39, None, False, "replay client and server processes used 1.39 of 2 cores"),
        (
            1.4,
            None,
            True,
            "replay client and server processes used 1.40 of 2 cores (the step may be the "
            "replay's CPU, not the link)",
        ),
        (
            0.6,
            0.89,
            False,
            "replay client and server processes used 0.60 of 2 cores; the machine's cores "
            "were 89% busy (1.78 of 2, every process)",
        ),
        # Other processes' load is evidence, not a verdict: the replay's own kept up.
        (
            0.6,
            0.9,
            False,
            "replay client and server processes used 0.60 of 2 cores; the machine's cores "
            "were 90% busy (1.80 of 2, every process) (other processes kept the machine "
            "busy; the replay's own processes did not bind the step, so it is not flagged)",
        ),
        (
            1.5,
            0.95,
            True,
            "replay client and server processes used 1.50 of 2 cores; the machine's cores "
            "were 95% busy (1.90 of 2, every process) (the step may be the replay's CPU, "
            "not the link)",
        ),
    ],
)
def test_replay_bound_flags_the_replays_own_cpu_and_reports_a_busy_machine(
    replay_cores: float, machine_share: float | None, bound: bool, evidence: str
) -> None:
    assert replay_bound_verdict(replay_cores, 2, machine_share) == (bound, evidence)


@pytest.mark.parametrize(
    ("share", "bound", "words"),
    [
        # The replay's own lateness can have added 5% to a client's steps.
        (0.05, True, "(the replay did not keep up with its own plan: the step may be"),
        (0.0499999, False, ""),
        (None, False, ""),
    ],
)
def test_the_replays_own_lateness_bounds_a_prediction_and_the_p90_lag_does_not(
    share: float | None, bound: bool, words: str
) -> None:
    # A p90 lag of half the step: calls waiting for those released with them to be sent.
    verdict, evidence = replay_bound_verdict(
        0.4, 2, 0.95, lag_p90_ns=1e9, step_ns=2e9, lateness_share=share
    )
    assert verdict is bound
    assert words in evidence
    assert "went up to 1000.000 ms late (p90, 50.0% of the step)" in evidence
    if share is not None:
        assert f"can have added up to {100 * share:.1f}% to a client's steps" in evidence
    # Unbound, a busy machine is only evidence.
    assert bound or "other processes kept the machine busy" in evidence
    # The lateness is judged whatever the step and the p90 lag.
    assert replay_bound_verdict(0.4, 2, None, lateness_share=share)[0] is bound


def test_a_late_replays_evidence_gives_the_lag_and_its_share_of_the_step() -> None:
    assert replay_bound_verdict(0.4, 2, None, lag_p90_ns=2e9, step_ns=4e9, lateness_share=0.25) == (
        True,
        "replay client and server processes used 0.40 of 2 cores; the calls the window did "
        "not hold went up to 2000.000 ms late (p90, 50.0% of the step); the replay's own "
        "lateness (its calls at the head of its queue) can have added up to 25.0% to a "
        "client's steps (the replay did not keep up with its own plan: the step may be its "
        "lateness)",
    )


def test_under_a_compute_load_lateness_is_evidence_and_the_replays_cpu_still_flags() -> None:
    late, evidence = replay_bound_verdict(0.4, 2, None, lateness_share=0.25, compute_load=True)
    assert late is False
    assert evidence == (
        "replay client and server processes used 0.40 of 2 cores; the replay's own lateness "
        "(its calls at the head of its queue) can have added up to 25.0% to a client's steps "
        "(under the compute load: the contention it adds for the cores, as training's compute "
        "added it, so it is not flagged)"
    )
    # Its own CPU binds it whatever the load.
    busy, evidence = replay_bound_verdict(1.5, 2, None, lateness_share=0.25, compute_load=True)
    assert busy is True
    assert evidence.endswith("(the step may be the replay's CPU, not the link)")
    # Punctual under the load: nothing said of the load.
    punctual = replay_bound_verdict(0.4, 2, None, lateness_share=0.01, compute_load=True)
    assert punctual == (False, replay_bound_verdict(0.4, 2, None, lateness_share=0.01)[1])
    assert "compute load" not in punctual[1]


def test_a_late_replay_is_bound_only_by_the_calls_the_window_did_not_hold() -> None:
    document = golden_document()
    throughput = document.benchmarks[2]

    def with_lags(held: int) -> dict[str, Any]:
        # Calls 5 ms late, one of the twelve 500 ms, each alone at the head of its queue
        # (the replay's own lateness, much more than 5% of the runs): held by the window
        # or not.
        runs = tuple(
            dataclasses.replace(
                run,
                client_cpu_ns=0,
                server_cpu_ns=0,
                samples=tuple(
                    dataclasses.replace(
                        s,
                        release_lag_ns=500_000_000 if (run.run_index, n) == (0, 0) else 5_000_000,
                        window_held=held,
                    )
                    for n, s in enumerate(run.samples)
                ),
            )
            for run in throughput.runs
        )
        changed = dataclasses.replace(
            document,
            benchmarks=(*document.benchmarks[:2], dataclasses.replace(throughput, runs=runs)),
        )
        prediction: dict[str, Any] = json.loads(dumps_document(changed))["benchmarks"][2][
            "statistics"
        ]["prediction"]
        return prediction

    late = with_lags(held=0)
    assert late["replay_bound"] is True and late["unheld_release_lag_p90_ns"] == 5_000_000
    # Held back by the window, the calls were late because of the link: not the machine.
    held = with_lags(held=1)
    assert held["replay_bound"] is False and held["unheld_release_lag_p90_ns"] is None


def _burst_run(
    head_lag_ns: int, *, held: int = 0, client: int = 0, bursts: int = 100
) -> RunMeasurement:
    """A 1 s run of one client: every 10 ms a burst of 20 calls released together, its
    first issued ``head_lag_ns`` late (held by the window or not), each next 50 us after
    the one before (the calls wait for those released with them to be sent)."""
    samples = []
    for burst in range(bursts):
        release = burst * 10_000_000
        for n in range(20):
            lag = head_lag_ns + 50_000 * n
            samples.append(
                CallSample(
                    start_ns=release + lag,
                    latency_ns=1_000,
                    request_bytes=1,
                    response_bytes=1,
                    payload_bytes=1,
                    worker_index=client,
                    release_lag_ns=lag,
                    window_held=held if n == 0 else 0,
                )
            )
    return RunMeasurement(run_index=0, duration_ns=1_000_000_000, samples=tuple(samples))


def test_calls_waiting_for_the_burst_released_with_them_are_not_the_replays_lateness() -> None:
    # Heads on time: the queued calls (up to 0.95 ms late, a p90 of 0.85 ms) count nothing.
    assert replay_lateness_share([_burst_run(0)]) == 0.0
    # Each head 0.6 ms late: 100 of them, 60 ms of a 1 s run, whatever queued behind.
    assert replay_lateness_share([_burst_run(600_000)]) == pytest.approx(0.06)
    # A head the window held was late because of the link.
    assert replay_lateness_share([_burst_run(600_000, held=1)]) == 0.0


def test_the_lateness_is_the_latest_clients_over_all_runs() -> None:
    late, early = _burst_run(400_000), _burst_run(100_000, client=1)
    second = dataclasses.replace(_burst_run(800_000, bursts=50), run_index=1)
    # Client 0: 40 ms + 40 ms over 2 s; client 1: 10 ms over 2 s.
    merged = dataclasses.replace(late, samples=late.samples + early.samples)
    assert replay_lateness_share([merged, second]) == pytest.approx(0.04)
    # A run without samples still counts its time.
    empty = RunMeasurement(run_index=2, duration_ns=2_000_000_000, samples=())
    assert replay_lateness_share([empty, merged, second]) == pytest.approx(0.02)
    assert replay_lateness_share([]) is None
    assert replay_lateness_share([dataclasses.replace(empty, duration_ns=5)]) is None
    assert replay_lateness_share([dataclasses.replace(late, duration_ns=0)]) is None
    # The shortest run is measured against too.
    assert replay_lateness_share([dataclasses.replace(late, duration_ns=1)]) == 40_000_000


def test_a_call_released_after_the_queue_emptied_heads_a_queue_of_its_own() -> None:
    def sample(start: int, lag: int) -> CallSample:
        return CallSample(
            start_ns=start,
            latency_ns=1,
            request_bytes=1,
            response_bytes=1,
            payload_bytes=1,
            release_lag_ns=lag,
        )

    # Released at 0 (30 late, a head) and 10 (going at 30 too: queued behind it), at 30
    # (the calls before it went at 30, no earlier: queued, going at 31), at 32 (they had
    # all gone: a head, 3 late) and at 50 (nothing waiting: a head, 1 late); given out of
    # order.
    samples = (sample(35, 3), sample(30, 30), sample(51, 1), sample(30, 20), sample(31, 1))
    run = RunMeasurement(run_index=0, duration_ns=1_000, samples=samples)
    assert replay_lateness_share([run]) == pytest.approx((30 + 3 + 1) / 1_000)


def test_a_starved_replay_is_bound_by_its_lateness_a_healthy_one_is_not() -> None:
    document = golden_document()
    throughput = document.benchmarks[2]

    def prediction(head_lag_ns: int) -> dict[str, Any]:
        run = dataclasses.replace(
            _burst_run(head_lag_ns),
            client_cpu_ns=0,
            server_cpu_ns=0,
            step_times_ns=throughput.runs[0].step_times_ns,
            step_compute_ns=throughput.runs[0].step_compute_ns,
        )
        changed = dataclasses.replace(
            document,
            benchmarks=(*document.benchmarks[:2], dataclasses.replace(throughput, runs=(run,))),
        )
        found: dict[str, Any] = json.loads(dumps_document(changed))["benchmarks"][2]["statistics"][
            "prediction"
        ]
        return found

    assert prediction(0)["replay_bound"] is False
    starved = prediction(2_000_000)
    assert starved["replay_bound"] is True
    assert "can have added up to 20.0% to a client's steps" in starved["replay_bound_evidence"]
    # The same lateness under a compute load is the load's contention, not flagged.
    throughput = dataclasses.replace(
        throughput, parameters={**throughput.parameters, "compute_load": "gaps"}
    )
    loaded = prediction(2_000_000)
    assert loaded["replay_bound"] is False
    assert "under the compute load" in loaded["replay_bound_evidence"]
    throughput = dataclasses.replace(
        throughput, parameters={**throughput.parameters, "compute_load": "none"}
    )
    assert prediction(2_000_000)["replay_bound"] is True


def _p90_by_hand(values: list[int]) -> float:
    ordered = sorted(values)
    position = 0.9 * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def test_the_bounding_lag_is_the_p90_of_the_calls_the_window_did_not_hold() -> None:
    document = golden_document()
    throughput = document.benchmarks[2]
    counter = iter(range(10**6))
    runs = []
    for run in throughput.runs:
        samples = []
        for sample in run.samples:
            number = next(counter)
            # Every third call held, and 1 s late: the window's, not the replay's lateness.
            held = number % 3 == 2
            lag = 10**9 if held else (number * number) % 7919 * 1000
            samples.append(dataclasses.replace(sample, release_lag_ns=lag, window_held=int(held)))
        runs.append(dataclasses.replace(run, samples=tuple(samples)))
    changed = dataclasses.replace(
        document,
        benchmarks=(*document.benchmarks[:2], dataclasses.replace(throughput, runs=tuple(runs))),
    )
    prediction = json.loads(dumps_document(changed))["benchmarks"][2]["statistics"]["prediction"]
    unheld = [s.release_lag_ns for run in runs for s in run.samples if not s.window_held]
    # Distinct lags, so the p90 is neither the p99 nor the largest.
    assert len(set(unheld)) == len(unheld) >= 5
    assert prediction["unheld_release_lag_p90_ns"] == pytest.approx(_p90_by_hand(unheld))


def test_the_evidence_gives_the_lag_in_ms_and_as_a_share_of_the_step() -> None:
    bound, evidence = replay_bound_verdict(0.1, 2, None, lag_p90_ns=1e9, step_ns=2e9)
    assert bound is False
    assert evidence == (
        "replay client and server processes used 0.10 of 2 cores; the calls the window did not "
        "hold went up to 1000.000 ms late (p90, 50.0% of the step)"
    )
    bound, evidence = replay_bound_verdict(0.1, 2, None, lag_p90_ns=3e6, step_ns=2e9)
    assert bound is False
    assert evidence == (
        "replay client and server processes used 0.10 of 2 cores; the calls the window did not "
        "hold went up to 3.000 ms late (p90, 0.1% of the step)"
    )


def test_no_prediction_without_the_critical_paths_compute_whatever_steps_were_timed() -> None:
    from tf_grpc_bench.replay.output.prediction import _median_or_none, prediction_json

    throughput = golden_document().benchmarks[2]
    timed = dataclasses.replace(
        throughput,
        runs=tuple(dataclasses.replace(run, step_compute_ns=()) for run in throughput.runs),
    )
    assert timed.step_times_ns and prediction_json(timed, 2) is None
    assert prediction_json(throughput, 2) is not None
    assert _median_or_none(()) is None and _median_or_none((1, 3)) == 2.0


@pytest.mark.parametrize(
    ("replay_cores", "cpu_count", "bound"),
    [(0.0, 0, False), (0.5, 0, False), (0.7, 1, True), (0.69, 1, False), (1.4, 2, True)],
)
def test_the_replays_own_cores_bound_a_prediction_from_one_core_up(
    replay_cores: float, cpu_count: int, bound: bool
) -> None:
    # No core count known (0) never flags; one core is a machine like any other.
    assert replay_bound_verdict(replay_cores, cpu_count, None) == (
        bound,
        f"replay client and server processes used {replay_cores:.2f} of {cpu_count} cores"
        + (" (the step may be the replay's CPU, not the link)" if bound else ""),
    )


def test_a_replay_that_measured_no_time_used_no_cores() -> None:
    result = make_results(runs=1, calls=2)[0]
    timeless = dataclasses.replace(
        result, runs=(dataclasses.replace(result.runs[0], duration_ns=0, client_cpu_ns=5),)
    )
    assert replay_cpu_cores(timeless) == 0.0
    assert replay_cpu_cores(
        dataclasses.replace(
            result,
            runs=(dataclasses.replace(result.runs[0], client_cpu_ns=3, server_cpu_ns=1,
                                      duration_ns=8),),
        )
    ) == 0.5  # fmt: skip


def test_steps_replayed_without_dependencies_pacing_predict_nothing() -> None:
    result = make_results(runs=1, calls=2)[0]
    paced_by_rate = dataclasses.replace(
        result, runs=(dataclasses.replace(result.runs[0], step_times_ns=(10, 30, 20)),)
    )
    assert prediction_json(paced_by_rate, 2) is None
    by_dependencies = dataclasses.replace(
        result,
        runs=(
            dataclasses.replace(
                result.runs[0], step_times_ns=(10, 30, 20), step_compute_ns=(4, 6, 8)
            ),
        ),
    )
    predicted = prediction_json(by_dependencies, 2)
    assert predicted is not None
    assert (predicted["step_ns"], predicted["compute_ns"], predicted["communication_ns"]) == (
        20.0,
        6.0,
        12.0,
    )
    assert predicted["steps"] == 3


def test_a_busy_machine_does_not_flag_a_prediction_whose_replay_used_little_cpu() -> None:
    document = golden_document()
    throughput = document.benchmarks[2]
    # The golden runs: the replay used 1.40 of 2 cores, the machine 93 and 94 of 100 ticks.
    assert machine_cpu_busy_share(throughput.runs) == pytest.approx(0.935)
    quiet = dataclasses.replace(
        throughput,
        runs=tuple(
            dataclasses.replace(run, client_cpu_ns=run.duration_ns // 10, server_cpu_ns=0)
            for run in throughput.runs
        ),
    )
    changed = dataclasses.replace(document, benchmarks=(*document.benchmarks[:2], quiet))
    prediction = json.loads(dumps_document(changed))["benchmarks"][2]["statistics"]["prediction"]
    assert prediction["replay_bound"] is False
    assert "used 0.10 of 2 cores" in prediction["replay_bound_evidence"]
    assert "other processes kept the machine busy" in prediction["replay_bound_evidence"]
    assert prediction["machine_cpu_busy_share"] == pytest.approx(0.935)


def test_current_writer_reproduces_the_newest_golden_document_exactly() -> None:
    golden = DATA / f"results-v{FORMAT_VERSION}.json"
    assert dumps_document(golden_document()) == golden.read_text()


def test_benchmark_labels_are_unique_when_a_benchmark_repeats() -> None:
    result = make_results(runs=1, calls=2)[0]
    trace_run = dataclasses.replace(result, workload="trace")
    labels = results.benchmark_labels([result, trace_run, trace_run])
    assert labels == ("p2p-latency-synthetic", "p2p-latency-trace", "p2p-latency-trace-2")


def test_new_run_directories_are_unique_and_named_by_utc_time_and_label(tmp_path: Path) -> None:
    first = new_run_directory(tmp_path / "runs", "veth 1gbit/x", now=CREATED)
    second = new_run_directory(tmp_path / "runs", "veth 1gbit/x", now=CREATED)
    assert first.name == "20261129T123005Z-veth-1gbit-x"
    assert second.name == "20261129T123005Z-veth-1gbit-x-2"
    assert first.is_dir() and second.is_dir()
    assert new_run_directory(tmp_path / "runs", now=CREATED).name == "20261129T123005Z"


def test_network_info_refuses_a_negative_rate() -> None:
    with pytest.raises(ValueError, match="emulated_rate_bits_per_s"):
        NetworkInfo(name="veth", emulated_rate_bits_per_s=-1)


def test_empty_document_of_a_run_that_failed_early_round_trips(tmp_path: Path) -> None:
    document = build_document(
        [], config={}, trace_path=None, partial=True, partial_reason="server never came up"
    )
    back = read_document(write_document(document, tmp_path / "r.json"))
    assert back == document and back.benchmarks == ()


def test_statistics_of_an_empty_run_are_not_a_number_but_the_document_still_writes(
    tmp_path: Path,
) -> None:
    empty = BenchmarkResult(
        benchmark=Benchmark.P2P_LATENCY,
        workload="synthetic",
        parameters={},
        runs=(
            dataclasses.replace(make_results(runs=1, calls=1)[0].runs[0], samples=(), partial=True),
        ),
        partial=True,
        partial_reason="no response",
    )
    document = build_document([empty], config={}, trace_path=None)
    back = read_document(write_document(document, tmp_path / "r.json"))
    assert math.isnan(back.benchmarks[0].latency_all.p50_ns)
    assert back.benchmarks[0].runs == empty.runs


@pytest.mark.parametrize(("cpu_share", "bound"), [(0.69, False), (0.71, True)])
def test_a_prediction_is_flagged_replay_bound_when_the_replay_kept_the_cores_busy(
    cpu_share: float, bound: bool
) -> None:
    document = golden_document()
    throughput = document.benchmarks[2]
    cores = GOLDEN_MACHINE.cpu_count
    runs = tuple(
        dataclasses.replace(
            run,
            client_cpu_ns=round(run.duration_ns * cores * cpu_share / 2),
            server_cpu_ns=round(run.duration_ns * cores * cpu_share / 2),
            # The machine as busy as the replay made it: nothing else ran.
            machine_cpu_busy_ticks=round(100 * cpu_share),
            machine_cpu_total_ticks=100,
        )
        for run in throughput.runs
    )
    changed = dataclasses.replace(
        document,
        benchmarks=(*document.benchmarks[:2], dataclasses.replace(throughput, runs=runs)),
    )
    prediction = json.loads(dumps_document(changed))["benchmarks"][2]["statistics"]["prediction"]
    assert prediction["replay_bound"] is bound
    assert f"used {cores * cpu_share:.2f} of {cores} cores" in prediction["replay_bound_evidence"]
    assert prediction["replay_cpu_cores"] == pytest.approx(cores * cpu_share, abs=0.01)
    assert prediction["machine_cpu_busy_share"] == round(100 * cpu_share) / 100
    # Without dependencies pacing there is no prediction at all.
    assert json.loads(dumps_document(changed))["benchmarks"][0]["statistics"]["prediction"] is None


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_documents_before_version_5_read_as_no_what_if(version: int) -> None:
    assert read_document(DATA / f"results-v{version}.json").what_if is None


def test_a_what_if_document_round_trips_and_says_so_in_the_table(tmp_path: Path) -> None:
    from tf_grpc_bench.replay.output.report import format_table

    document = golden_document()
    assert document.what_if is not None
    back = read_document(write_document(document, tmp_path / "r.json"))
    assert back == document
    assert document.what_if.describe() in format_table(back).splitlines()


def test_a_what_if_with_a_bad_placement_is_refused_naming_it(tmp_path: Path) -> None:
    data = json.loads(dumps_document(golden_document()))
    data["what_if"]["placement"] = "sideways"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match="what_if") as error:
        read_document(path)
    _single_line_error(error)


def _golden_v4() -> dict:
    return json.loads((DATA / "results-v4.json").read_text())


#: Where each object of the golden document sits, as the reader names it in errors.
_OBJECTS = {
    "document": lambda d: d,
    "machine": lambda d: d["machine"],
    "trace": lambda d: d["trace"],
    "network": lambda d: d["network"],
    "benchmarks[0]": lambda d: d["benchmarks"][0],
    "benchmarks[0].runs[0]": lambda d: d["benchmarks"][0]["runs"][0],
    "benchmarks[0].runs[0].samples": lambda d: d["benchmarks"][0]["runs"][0]["samples"],
}
#: Fields the reader does not read: the derived statistics (recomputed from the
#: samples), the format's own name and version (checked before any field, with
#: messages of their own), what a version-4 reader takes as optional.
_NOT_READ = {
    ("document", "format"),
    ("document", "format_version"),
    ("benchmarks[0]", "statistics"),
    ("benchmarks[0].runs[0]", "statistics"),
}
_FIELDS = [
    (where, key)
    for where, get in _OBJECTS.items()
    for key in get(_golden_v4())
    if (where, key) not in _NOT_READ
]


@pytest.mark.parametrize(("where", "key"), _FIELDS, ids=[f"{w}.{k}" for w, k in _FIELDS])
def test_every_field_missing_or_of_the_wrong_type_is_named_by_its_path(
    where: str, key: str
) -> None:
    document = _golden_v4()
    del _OBJECTS[where](document)[key]
    prefix = "golden.json: invalid result document: "
    if (where, key) in {("document", "trace"), ("document", "network")}:
        loads_document(json.dumps(document), source="golden.json")  # optional: null if absent
    else:
        with pytest.raises(ResultError) as missing:
            loads_document(json.dumps(document), source="golden.json")
        assert str(missing.value) == f"{prefix}{where}: missing field {key!r}"
    document = _golden_v4()
    value = _OBJECTS[where](document)[key]
    # A value of another type: an object where the field is none, else a string.
    _OBJECTS[where](document)[key] = "x" if isinstance(value, dict | list) else {"x": 1}
    if value is None:
        return  # a null field (trace, network, a rate) takes no type to be wrong about
    with pytest.raises(ResultError) as wrong:
        loads_document(json.dumps(document), source="golden.json")
    # The document's own objects are named by their key alone ("trace: ...").
    top_object = where == "document" and key in {"trace", "network"}
    path = key if top_object else f"{where}.{key}"
    assert str(wrong.value).startswith(f"{prefix}{path}"), str(wrong.value)


def test_partial_benchmarks_and_runs_read_back_partial_with_their_reasons() -> None:
    document = _golden_v4()
    benchmark = document["benchmarks"][0]
    benchmark["partial"], benchmark["partial_reason"] = True, "server 1 stopped answering"
    benchmark["runs"][0]["partial"] = True
    benchmark["runs"][0]["partial_reason"] = "interrupted by SIGTERM"
    read = loads_document(json.dumps(document))
    assert (read.benchmarks[0].partial, read.benchmarks[0].partial_reason) == (
        True,
        "server 1 stopped answering",
    )
    run = read.benchmarks[0].runs[0]
    assert (run.partial, run.partial_reason) == (True, "interrupted by SIGTERM")
    assert [r.partial for r in read.benchmarks[0].runs[1:]] == [False] * (
        len(read.benchmarks[0].runs) - 1
    )


def test_an_unknown_benchmark_and_a_run_that_is_no_object_are_named() -> None:
    document = _golden_v4()
    document["benchmarks"][0]["benchmark"] = "p2p-telepathy"
    with pytest.raises(ResultError) as unknown:
        loads_document(json.dumps(document), source="r.json")
    assert str(unknown.value) == (
        "r.json: invalid result document: benchmarks[0].benchmark: unknown benchmark "
        "'p2p-telepathy' (known: p2p-latency, p2p-bandwidth, ps-throughput)"
    )
    document = _golden_v4()
    document["benchmarks"][0]["runs"][0] = 7
    with pytest.raises(ResultError, match=r"^r\.json: invalid result document: "):
        loads_document(json.dumps(document), source="r.json")
    with pytest.raises(ResultError) as not_object:
        loads_document(json.dumps(document), source="r.json")
    assert str(not_object.value).endswith(": benchmarks[0].runs[0]: expected an object")
    document = _golden_v4()
    document["benchmarks"][0] = []
    with pytest.raises(ResultError) as not_object:
        loads_document(json.dumps(document), source="r.json")
    assert str(not_object.value).endswith(": benchmarks[0]: expected an object")


@pytest.mark.parametrize(
    ("path", "key"),
    [("what_if", "workers"), ("what_if", "placement"), ("what_if", "derived_from"),
     ("what_if.derived_from", "trace"), ("what_if.derived_from", "ps")],
)  # fmt: skip
def test_a_what_if_field_missing_is_named_by_its_path(path: str, key: str) -> None:
    document = json.loads(dumps_document(golden_document()))
    holder = document["what_if"] if path == "what_if" else document["what_if"]["derived_from"]
    del holder[key]
    with pytest.raises(ResultError) as missing:
        loads_document(json.dumps(document), source="r.json")
    assert str(missing.value) == f"r.json: invalid result document: {path}: missing field {key!r}"


def test_a_discarded_run_directory_takes_its_base_only_if_the_run_made_it(tmp_path: Path) -> None:
    made = new_run_directory(tmp_path / "a" / "runs", "x")  # two levels made
    (made / "events.out.tfevents.1").write_bytes(b"\0")
    discard_run_directory(made, base_existed=False)
    assert not (tmp_path / "a" / "runs").exists() and (tmp_path / "a").is_dir()
    kept = tmp_path / "kept"
    kept.mkdir()
    run = new_run_directory(kept, "y")
    discard_run_directory(run, base_existed=True)
    assert kept.is_dir() and list(kept.iterdir()) == []
    # A base that holds other runs stays, whatever the caller thought.
    other = new_run_directory(kept, "z")
    third = new_run_directory(kept, "w")
    discard_run_directory(third, base_existed=False)
    assert list(kept.iterdir()) == [other]


def test_a_built_document_keeps_its_what_if() -> None:
    what_if = golden_document().what_if
    assert what_if is not None
    document = build_document(
        make_results(),
        config={},
        trace_path=None,
        machine=GOLDEN_MACHINE,
        created=CREATED,
        what_if=what_if,
    )
    assert document.what_if == what_if
    plain = build_document(
        make_results(), config={}, trace_path=None, machine=GOLDEN_MACHINE, created=CREATED
    )
    assert plain.what_if is None


# The newest format's fields, each read and named by the reader: its network's interfaces,
# relays and emulation, the inexact sizes, the what-if and the trace's partial reason.


def _golden_newest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"results-v{FORMAT_VERSION}.json").read_text())
    return data


_NEWEST_OBJECTS = {
    **_OBJECTS,
    "network.interfaces[0]": lambda d: d["network"]["interfaces"][0],
    "network.relays[0]": lambda d: d["network"]["relays"][0],
    "benchmarks[0].inexact_sizes": lambda d: d["benchmarks"][0]["inexact_sizes"],
    "what_if": lambda d: d["what_if"],
    "what_if.derived_from": lambda d: d["what_if"]["derived_from"],
}
#: Optional at the top (null if absent); the what-if's scale is checked as a number first.
_OPTIONAL = {("document", "trace"), ("document", "network"), ("document", "what_if")}
_NEWEST_FIELDS = [
    (where, key)
    for where, get in _NEWEST_OBJECTS.items()
    for key in get(_golden_newest())
    if (where, key) not in _NOT_READ
]


@pytest.mark.parametrize(
    ("where", "key"), _NEWEST_FIELDS, ids=[f"{w}.{k}" for w, k in _NEWEST_FIELDS]
)
def test_every_field_of_the_newest_format_missing_or_mistyped_is_named_by_its_path(
    where: str, key: str
) -> None:
    prefix = "golden.json: invalid result document: "
    document = _golden_newest()
    del _NEWEST_OBJECTS[where](document)[key]
    if (where, key) in _OPTIONAL:
        loads_document(json.dumps(document), source="golden.json")
    else:
        with pytest.raises(ResultError) as missing:
            loads_document(json.dumps(document), source="golden.json")
        expected = f"{where}: missing field {key!r}"
        if (where, key) == ("what_if", "scale_tensors"):
            expected = "what_if.scale_tensors: expected a number"
        assert str(missing.value) == prefix + expected
    document = _golden_newest()
    value = _NEWEST_OBJECTS[where](document)[key]
    wrong: object = "x" if isinstance(value, dict | list) else {"x": 1}
    _NEWEST_OBJECTS[where](document)[key] = wrong
    if value is None:
        return
    with pytest.raises(ResultError) as mistyped:
        loads_document(json.dumps(document), source="golden.json")
    top_object = where == "document" and (where, key) in _OPTIONAL
    path = key if top_object else f"{where}.{key}"
    assert str(mistyped.value).startswith(f"{prefix}{path}"), str(mistyped.value)


def _refusal(document: dict[str, Any], source: str = "r.json") -> str:
    with pytest.raises(ResultError) as refused:
        loads_document(json.dumps(document), source=source)
    message = _single_line_error(refused)
    assert message.startswith(f"{source}: invalid result document: "), message
    return message.removeprefix(f"{source}: invalid result document: ")


def test_each_wrong_value_is_quoted_in_its_refusal() -> None:
    long = "y" * 50  # quoted to 40 characters of its JSON
    cases: list[tuple[Any, str]] = [
        (lambda d: d["machine"].__setitem__("cpu_count", long),
         f'machine.cpu_count: expected an integer, got "{long[:39]}'),
        (lambda d: d["benchmarks"][0].__setitem__("partial", long),
         f'benchmarks[0].partial: expected true or false, got "{long[:39]}'),
        (lambda d: d["network"].__setitem__("emulated_loss", long),
         f'network.emulated_loss: expected a number, got "{long[:39]}'),
        (lambda d: d["network"].__setitem__("emulated_loss", True),
         "network.emulated_loss: expected a number, got true"),
        (lambda d: d["benchmarks"][0]["runs"][0].__setitem__("step_times_ns", [3, long]),
         f'benchmarks[0].runs[0].step_times_ns[1]: expected an integer, got "{long[:39]}'),
        (lambda d: d["config"].__setitem__("runs", [long]),
         f'document.config.runs: expected a string, number or boolean, got ["{long[:38]}'),
        (lambda d: d["benchmarks"][0].__setitem__("runs", 3),
         "benchmarks[0].runs: expected a list, got int"),
        (lambda d: d.__setitem__("machine", 3), "document.machine: expected an object, got int"),
        (lambda d: d.__setitem__("tool_version", 3),
         "document.tool_version: expected a string, got int"),
        (lambda d: d["what_if"].__setitem__("scale_tensors", True),
         "what_if.scale_tensors: expected a number"),
        (lambda d: d.__setitem__("what_if", [1]), "what_if: expected an object or null"),
        (lambda d: d["what_if"].__setitem__("workers", 0),
         "what_if: what_if.workers must be >= 1, got 0"),
        (lambda d: d["network"]["relays"].__setitem__(0, 7),
         "network.relays[0]: expected an object"),
        (lambda d: d["network"]["interfaces"].__setitem__(0, 7),
         "network.interfaces[0]: expected an object"),
        (lambda d: d["network"].__setitem__("addresses", ["127.0.0.1:1", 7]),
         "network.addresses: expected a list of strings"),
        (lambda d: d["benchmarks"][0]["inexact_sizes"].__setitem__("calls_per_pass", 0),
         "benchmarks[0].inexact_sizes: calls_per_pass must be >= 1, got 0"),
        (lambda d: d["benchmarks"][0]["runs"][0]["samples"]["latency_ns"].__setitem__(1, -1),
         "benchmarks[0].runs[0].samples[1]: latency_ns must be >= 0, got -1"),
        (lambda d: d["benchmarks"][0]["runs"][0].__setitem__("machine_cpu_busy_ticks", 5),
         "benchmarks[0].runs[0]: machine_cpu_busy_ticks 5 must be within 0 .. "
         "machine_cpu_total_ticks 0"),
    ]  # fmt: skip
    for change, expected in cases:
        document = _golden_newest()
        change(document)
        assert _refusal(document) == expected


@pytest.mark.parametrize("bucket", [[1, 2, 3], [1], [1, True], [1.5, 2], "x"])
def test_a_relays_histogram_bucket_is_two_integers(bucket: object) -> None:
    document = _golden_newest()
    document["network"]["relays"][0]["late_histogram"][2] = bucket
    assert _refusal(document) == "network.relays[0].late_histogram[2]: expected [lower_ns, count]"


@pytest.mark.parametrize("version", range(1, FORMAT_VERSION + 1))
def test_each_format_version_reads_the_fields_it_has_from_that_version_on(version: int) -> None:
    document = read_document(DATA / f"results-v{version}.json")
    assert (document.benchmarks[0].inexact_sizes is not None) == (version >= 3)
    busy_share = machine_cpu_busy_share(document.benchmarks[2].runs)
    assert busy_share == (pytest.approx(0.935) if version >= 5 else None)
    assert (document.what_if is not None) == (version >= 5)
    assert document.network is not None and document.trace is not None
    emulation = (
        document.network.emulated_delay_ns,
        document.network.emulated_jitter_ns,
        document.network.emulated_loss,
        len(document.network.relays),
    )
    assert emulation == ((50_000, 10_000, 0.001, 1) if version >= 6 else (0, 0, 0.0, 0))
    assert document.trace.partial_reason == (
        "the job looks hung: its tasks exchanged nothing for 120 s" if version >= 7 else ""
    )


def test_a_reader_error_names_results_when_no_file_is_given(tmp_path: Path) -> None:
    with pytest.raises(ResultError) as not_json:
        loads_document('{"format": NaN}')
    assert (
        str(not_json.value)
        == "results: result document is not valid JSON (NaN is not a JSON number)"
    )
    document = _golden_newest()
    del document["machine"]
    with pytest.raises(ResultError) as invalid:
        document_from_json_dict(document)
    assert (
        str(invalid.value) == "results: invalid result document: document: missing field 'machine'"
    )
    with pytest.raises(ResultError) as directory:
        read_document(tmp_path)
    assert str(directory.value) == f"{tmp_path}: is a directory, expected a result file"
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    with pytest.raises(ResultError) as unreadable:
        read_document(loop)
    assert str(unreadable.value) == f"{loop}: cannot read (Too many levels of symbolic links)"


def test_a_value_the_results_own_types_refuse_is_named_with_the_file() -> None:
    document = _golden_newest()
    document["network"]["emulated_rate_bits_per_s"] = -1
    assert _refusal(document) == "NetworkInfo.emulated_rate_bits_per_s must be >= 0, got -1"


def test_a_run_directory_that_cannot_be_made_leaves_no_parent_it_made(tmp_path: Path) -> None:
    base = tmp_path / "a" / "b" / ("x" * 300)  # a name longer than any file system takes
    with pytest.raises(ResultError) as refused:
        new_run_directory(base, "y")
    assert str(refused.value) == f"{base}: cannot create a run directory (File name too long)"
    assert not (tmp_path / "a").exists() and tmp_path.is_dir()
    # A run directory already gone is discarded without complaint.
    discard_run_directory(tmp_path / "gone", base_existed=True)
    assert tmp_path.is_dir()
