"""What a user sees in TensorBoard after ``tf-grpc-bench replay``: a real server, default mode.

Two real replays of the shipped ResNet-50 trace (on two network names) go
into one ``runs`` directory, as a user's runs do; ``tensorboard --logdir runs``
is started with no flag but a free port, so it loads with its default Rust
data server, and every dashboard is read through its HTTP API and compared
with the ``results.json`` files the replays wrote.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tf_grpc_bench.replay.output import document as results
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.output.hparams import COMPARISON_HPARAMS, METRICS
from tf_grpc_bench.replay.output.tensorboard import FLAT_STEPS
from tf_grpc_bench.replay.output.timeline import PROFILE_SESSION

from .browser import browser_page, colored_share, keep, serving
from .tensorboard_server import FAST_LOADER_NOTE, TensorBoard, running_tensorboard

COMMAND = str(Path(sys.executable).with_name("tf-grpc-bench"))
NETWORKS = ("loopback", "lab-10g")
#: (scalar tag, path in a benchmark's ``statistics``, divisor to the tag's unit)
FIGURES = (
    ("rpcs/count", ("rpc_count",), 1),
    ("throughput/bandwidth_mb_per_s", ("bandwidth_mb_per_s",), 1),
    ("throughput/rpcs_per_s", ("rpcs_per_s",), 1),
    ("cpu/client_utilization", ("client_cpu_utilization",), 1),
    ("cpu/server_utilization", ("server_cpu_utilization",), 1),
    ("prediction/step_ms", ("prediction", "step_ns"), 1e6),
    ("prediction/compute_ms", ("prediction", "compute_ns"), 1e6),
    *(
        (f"step_time_ms/{stat}", ("step_time_ns", f"{key}_ns"), 1e6)
        for stat, key in (("mean", "mean"), ("p50", "p50"), ("p99", "p99"), ("max", "max"))
    ),
)
LATENCY_STATS = (
    ("mean", "mean"),
    ("p50", "p50"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p99.9", "p999"),
)


def _f32(value: float) -> float:
    return float(np.float32(value))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("tensorboard-runs")
    for network in NETWORKS:
        completed = subprocess.run(
            [COMMAND, "replay", "resnet50-tf2ps", "--steps", "2", "--runs", "2", "--warmup", "0",
             "--network-name", network, "--output-dir", str(base / "runs"), "--quiet"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        assert f"tensorboard --logdir {base / 'runs'}" in completed.stdout
    return base / "runs"


@pytest.fixture(scope="module")
def documents(logdir: Path) -> dict[str, tuple[dict[str, Any], results.ResultDocument]]:
    """Run directory name -> (results.json as JSON, as a document)."""
    found = {}
    for path in sorted(logdir.glob("*/results.json")):
        found[path.parent.name] = (json.loads(path.read_text()), read_document(path))
    assert len(found) == len(NETWORKS)
    return found


@pytest.fixture(scope="module")
def board(
    logdir: Path, documents: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TensorBoard]:
    expected = {
        f"{name}/{label}" for name, (_, document) in documents.items() for label in document.labels
    }
    with running_tensorboard(logdir, tmp_path_factory.mktemp("tensorboard")) as board:

        def loaded() -> bool:
            tags = board.get("data/plugin/scalars/tags")
            return all("rpcs/count" in tags.get(run, {}) for run in expected)

        board.wait_for("every benchmark's scalars", loaded)
        yield board


def _value(statistics: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = statistics
    for key in path:
        value = None if value is None else value.get(key)
    return value


def test_tensorboard_runs_in_its_default_mode_with_the_rust_loader(board: TensorBoard) -> None:
    assert FAST_LOADER_NOTE in board.stderr


def test_run_names_read_as_the_run_and_its_benchmark(
    board: TensorBoard, documents: dict[str, Any]
) -> None:
    runs = set(board.get("data/runs"))
    for name, (_, document) in documents.items():
        assert name in runs  # the document-level run: results table, context
        assert {f"{name}/{label}" for label in document.labels} <= runs
    assert not any("tensorboard" in run for run in runs)


def test_every_scalar_equals_results_json(board: TensorBoard, documents: dict[str, Any]) -> None:
    checked = 0
    for name, (data, document) in documents.items():
        for benchmark, label in zip(data["benchmarks"], document.labels, strict=True):
            run = f"{name}/{label}"
            statistics = benchmark["statistics"]
            expected = {
                tag: _value(statistics, path) / divisor  # type: ignore[operator]
                for tag, path, divisor in FIGURES
                if _value(statistics, path) is not None
            }
            for size, summary in statistics["latency_ns"].items():
                for stat, key in LATENCY_STATS:
                    expected[f"latency_us/{size}/{stat}"] = summary[f"{key}_ns"] / 1e3
            for tag, value in expected.items():
                points = board.get("data/plugin/scalars/scalars", run=run, tag=tag)
                # A flat line (tensorboard.FLAT_STEPS; the server samples up to 1000 points).
                assert [(step, shown) for _, step, shown in points] == [
                    (step, _f32(value)) for step in range(FLAT_STEPS)
                ], tag
                checked += 1
            per_run = board.get("data/plugin/scalars/scalars", run=run, tag="per_run/rpcs_per_s")
            assert [shown for _, _, shown in per_run] == [
                _f32(r["statistics"]["rpcs_per_s"]) for r in benchmark["runs"]
            ]
            per_step = board.get(
                "data/plugin/scalars/scalars", run=run, tag="per_step/communication_time_ms"
            )
            assert [shown for _, _, shown in per_step] == [
                _f32(t / 1e6) for r in benchmark["runs"] for t in r["step_times_ns"]
            ]
    assert checked > 100


def test_hparams_compare_in_order_with_metrics(
    board: TensorBoard, documents: dict[str, Any]
) -> None:
    experiment = board.post("data/plugin/hparams/experiment", {"experimentName": ""})
    infos = experiment["hparamInfos"]
    assert [i["name"] for i in infos[: len(COMPARISON_HPARAMS)]] == [
        name for name, _, _ in COMPARISON_HPARAMS
    ]
    assert [i["displayName"] for i in infos[:5]] == [
        "network",
        "benchmark",
        "rpc",
        "pacing",
        "compute",
    ]
    assert infos[len(COMPARISON_HPARAMS)]["displayName"].startswith("grpc ")
    assert [m["name"]["tag"] for m in experiment["metricInfos"]] == [tag for tag, _ in METRICS]

    groups = board.post(
        "data/plugin/hparams/session_groups",
        {
            "experimentName": "",
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_RUNNING"],
            "colParams": [
                {"hparam": "01 network", "includeInResult": True},
                {"hparam": "02 benchmark", "includeInResult": True},
                {"hparam": "runs", "includeInResult": True},
                *(
                    {"metric": {"tag": tag, "group": ""}, "includeInResult": True}
                    for tag, _ in METRICS
                ),
            ],
            "startIndex": 0,
            "sliceSize": 100,
        },
    )
    rows = {
        (g["hparams"]["01 network"], g["hparams"]["02 benchmark"]): g
        for g in groups["sessionGroups"]
    }
    assert set(rows) == {(n, b) for n in NETWORKS for b in ("p2p-latency", "p2p-bandwidth",
                                                              "ps-throughput")}  # fmt: skip
    for data, _ in documents.values():
        network = data["network"]["name"]
        for benchmark in data["benchmarks"]:
            group = rows[(network, benchmark["benchmark"])]
            assert group["hparams"]["runs"] == "2"  # an integer, shown as one
            metrics = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
            statistics = benchmark["statistics"]
            assert metrics["throughput/bandwidth_mb_per_s"] == pytest.approx(
                _f32(statistics["bandwidth_mb_per_s"])
            )
            assert metrics["latency_us/all/p99"] == pytest.approx(
                _f32(statistics["latency_ns"]["all"]["p99_ns"] / 1e3)
            )
    ps = rows[("lab-10g", "ps-throughput")]
    assert "prediction/step_ms" in {m["name"]["tag"] for m in ps["metricValues"]}


def test_histograms_count_every_sample(board: TensorBoard, documents: dict[str, Any]) -> None:
    for name, (data, document) in documents.items():
        for benchmark, label in zip(data["benchmarks"], document.labels, strict=True):
            run = f"{name}/{label}"
            for tag in ("histogram/message_size_log10_bytes", "histogram/latency_ms"):
                shown = board.get("data/plugin/histograms/histograms", run=run, tag=tag)
                assert [step for _, step, _ in shown] == [r["run_index"] for r in benchmark["runs"]]
                counts = [sum(bucket[2] for bucket in buckets) for _, _, buckets in shown]
                assert counts == [r["samples"]["count"] for r in benchmark["runs"]], tag


def test_text_shows_the_results_table_and_each_benchmark(
    board: TensorBoard, documents: dict[str, Any]
) -> None:
    for name, (_, document) in documents.items():
        (table,) = board.get("data/plugin/text/text", run=name, tag="results")
        # The text dashboard gets the markdown rendered as HTML.
        assert all(f"<td>{label}</td>" in table["text"] for label in document.labels)
        for label in document.labels:
            (summary,) = board.get("data/plugin/text/text", run=f"{name}/{label}", tag="summary")
            assert "<th>class</th>" in summary["text"]


# --------------------------------------------------------------------------
# The step timeline: TensorBoard's Profile tab, and the trace-event JSON.


def _profile_session(name: str, label: str) -> str:
    return f"{name}/{label}/{PROFILE_SESSION}"


def test_profile_tab_lists_each_benchmarks_timeline_with_captured_and_replayed_tasks(
    board: TensorBoard, documents: dict[str, Any]
) -> None:
    sessions = board.get("data/plugin/profile/runs")
    for name, (_, document) in documents.items():
        for label in document.labels:
            session = _profile_session(name, label)
            assert session in sessions
            assert "trace_viewer@" in board.get("data/plugin/profile/run_tools", run=session)
            data = json.loads(
                board.get_bytes(
                    "data/plugin/profile/data", run=session, tag="trace_viewer@", host=label
                )
            )
            processes = [
                e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"
            ]
            # The benchmark's own workers: P2P replays the trace's busiest (worker, ps) pair.
            for side in ("captured", "replayed"):
                worker = re.compile(rf" {side} /job:worker/task:\d+$")
                assert any(worker.search(p) for p in processes), processes
            assert any(e.get("ph") == "X" for e in data["traceEvents"])


def _texts(locator: Any) -> list[str]:
    """The elements' texts, one by one (the viewer's web-component polyfill defeats
    Playwright's all-at-once queries)."""
    return [locator.nth(i).text_content() or "" for i in range(locator.count())]


def _open_trace_viewer(page: Any, board: TensorBoard, session: str) -> Any:
    """The Profile tab as a user clicks it: the session, then the Trace Viewer tool."""
    page.goto(board.url + "#profile")
    plugin = page.frame_locator("iframe").first
    plugin.get_by_text("Sessions").first.wait_for(timeout=120_000)
    # Each choice makes the plugin load (and hide its selectors) for a while: long timeouts.
    plugin.locator("mat-select").nth(0).click(timeout=180_000)
    plugin.locator("mat-option", has_text=session).first.click(timeout=180_000)
    # The chosen session's overview first, then the tool selector (showing the overview).
    plugin.get_by_text("Performance Summary").first.wait_for(timeout=180_000)
    for _ in range(3):
        tools = plugin.get_by_text("Overview Page").or_(plugin.get_by_text("Trace Viewer")).first
        tools.wait_for(state="attached", timeout=180_000)
        time.sleep(2)
        if not tools.is_visible():
            # Choosing another session folds the side panel away: open it, as a user would.
            plugin.get_by_text("menu", exact=True).first.click()
        tools.click(timeout=180_000)
        plugin.locator("mat-option", has_text="Trace Viewer").first.click(timeout=180_000)
        viewer = _drawn_viewer(page, limit_s=90)
        if viewer is not None:
            return viewer
    raise AssertionError("the trace viewer never drew a task")


def _drawn_viewer(page: Any, limit_s: float) -> Any:
    """The trace viewer's frame once it has drawn a task, or None after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for frame in page.frames:
            viewer = "trace_viewer_index" in frame.url and not frame.is_detached()
            if viewer and frame.locator("span.process-track-name").count() > 0:
                return frame
        time.sleep(0.5)
    return None


def test_headless_chromium_shows_the_timeline_in_the_profile_tab(
    board: TensorBoard, documents: dict[str, Any], tmp_path: Path
) -> None:
    name = next(iter(documents))
    with browser_page() as page:
        try:
            viewer = _open_trace_viewer(page, board, _profile_session(name, "ps-throughput"))
        except Exception:
            page.screenshot(path=str(tmp_path / "profile-tab-failure.png"))
            print(f"screenshot of the failure: {tmp_path / 'profile-tab-failure.png'}")
            raise
        headers = _texts(viewer.locator("span.process-track-name"))
        for task in ("captured /job:worker/task:0", "captured /job:ps/task:1",
                     "replayed /job:worker/task:0", "replayed /job:worker/task:1"):  # fmt: skip
            assert any(task in header for header in headers), headers
        collapsed = tmp_path / "profile-tab-collapsed.png"
        page.screenshot(path=str(collapsed))
        keep(collapsed)
        # Expand the replayed worker: its rows (steps, gaps, calls) and coloured slices.
        header = viewer.locator("span.process-track-name", has_text="replayed /job:worker/task:0")
        box = header.bounding_box()
        page.mouse.click(box["x"] - 20, box["y"] + box["height"] / 2)
        viewer.get_by_text("no call in flight").first.wait_for(timeout=60_000)
        for row in ("steps", "calls 1", "calls 2"):
            assert viewer.get_by_text(row, exact=True).count() > 0, row
        expanded = tmp_path / "profile-tab-replayed-worker.png"
        page.screenshot(path=str(expanded))
        keep(expanded)
        below = (300, int(box["y"] + box["height"]), 1580, 990)
        share = colored_share(expanded, below)
        assert share > 0.01, f"{share:.3f} of {expanded} in colour: slices not drawn"
        assert colored_share(collapsed, below) < share


def test_headless_chromium_draws_the_trace_event_json_in_a_trace_viewer(
    documents: dict[str, Any], logdir: Path, tmp_path: Path
) -> None:
    """The JSON in the Trace Event Format viewer that chrome://tracing is (Catapult's, as
    tensorboard-plugin-profile ships it), served from a folder on loopback."""
    import importlib.resources

    name = next(iter(documents))
    static = Path(str(importlib.resources.files("xprof") / "static"))
    site = tmp_path / "site"
    site.mkdir()
    for part in ("trace_viewer_index.html", "trace_viewer_index.js"):
        shutil.copy(static / part, site / part)
    shutil.copy(logdir / name / "timeline" / "ps-throughput.trace.json", site / "t.json")
    with serving(site) as url, browser_page() as page:
        page.goto(
            url + "trace_viewer_index.html?is_streaming=false&is_oss=true&trace_data_url=%2Ft.json"
        )
        tracks = page.locator("span.process-track-name")
        tracks.first.wait_for(timeout=120_000)
        headers = _texts(tracks)
        assert any(h.startswith("captured /job:worker/task:0") for h in headers), headers
        assert any(h.startswith("replayed /job:worker/task:1") for h in headers), headers
        for row in ("steps", "critical path", "calls 1"):
            assert page.get_by_text(row, exact=True).count() > 0, row
        shot = tmp_path / "trace-event-json.png"
        page.screenshot(path=str(shot))
        keep(shot)
        share = colored_share(shot, (300, 120, 1580, 990))
        assert share > 0.01, f"{share:.3f} of {shot} in colour: slices not drawn"


def test_headless_chromium_shows_scalars_and_hparams_in_comparison_order(
    board: TensorBoard, tmp_path: Path
) -> None:
    with browser_page() as page:
        page.goto(board.url + "#scalars")
        page.get_by_text("cpu/client_utilization").first.wait_for(timeout=120_000)
        assert page.get_by_text("No scalar data was found").count() == 0
        scalars = tmp_path / "scalars.png"
        page.screenshot(path=str(scalars))
        keep(scalars)

        page.goto(board.url + "#hparams")
        page.get_by_text("Show Metrics").first.wait_for(timeout=120_000)
        # The hyperparameters' pane lists them top to bottom in comparison order.
        names = [shown for _, shown, _ in COMPARISON_HPARAMS]
        tops = [page.get_by_text(name, exact=True).first.bounding_box()["y"] for name in names]
        assert tops == sorted(tops), dict(zip(names, tops, strict=True))
        assert page.get_by_text("grpc channels", exact=True).first.bounding_box()["y"] > tops[-1]
        for metric in ("small p50 (us)", "MB/s", "predicted step (ms)"):
            assert page.get_by_text(metric, exact=True).count() > 0, metric
        hparams = tmp_path / "hparams.png"
        page.screenshot(path=str(hparams))
        keep(hparams)


def test_a_default_hparams_table_shows_the_figures_users_compare_without_ticking(
    board: TensorBoard, tmp_path: Path
) -> None:
    """The HParams table as it first opens, nothing ticked: its columns (to the right of the
    pane listing what can be ticked) include MB/s, RPCs/s and step p50, and the hparams
    that tell rows apart: network, benchmark, rpc, pacing, compute."""
    shown = (
        "network", "benchmark", "rpc", "pacing", "compute",
        "MB/s", "RPCs/s", "step p50 (ms)", "predicted step (ms)",
    )  # fmt: skip
    with browser_page(width=2600) as page:
        page.goto(board.url + "#hparams")
        page.get_by_text("Show Metrics").first.wait_for(timeout=120_000)
        pane = page.get_by_text("Hyperparameters", exact=True).first.bounding_box()
        header = page.get_by_text("Show Metrics").first.bounding_box()
        columns = {}
        for name in shown:
            found = page.get_by_text(name, exact=True)
            boxes = [found.nth(i).bounding_box() for i in range(found.count())]
            # A column header: on the table's header row, right of the pane's checkboxes.
            columns[name] = [
                box
                for box in boxes
                if box and box["x"] > pane["x"] + 300 and abs(box["y"] - header["y"]) < 40
            ]
        table = tmp_path / "hparams-default-table.png"
        page.screenshot(path=str(table))
        keep(table)
    assert all(columns.values()), {name: bool(boxes) for name, boxes in columns.items()}
    lefts = [columns[name][0]["x"] for name in shown]
    assert lefts == sorted(lefts), dict(zip(shown, lefts, strict=True))
