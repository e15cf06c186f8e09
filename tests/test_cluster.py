"""TF_CONFIG and cluster specs, read as TensorFlow reads them, mapped to replay roles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tf_grpc_bench.cluster import TaskId, split_address
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.placement import cluster
from tf_grpc_bench.replay.placement.cluster import Role

CLUSTER = {
    "chief": ["h0:2222"],
    "ps": ["h1:2222", "h2:2222"],
    "worker": ["h3:2222", "h4:2222"],
}


def tf_config(task_type: str, index: int, spec: dict[str, object] | None = None) -> str:
    return json.dumps({"cluster": spec or CLUSTER, "task": {"type": task_type, "index": index}})


def test_ps_tasks_serve_workers_replay_and_the_chief_gathers() -> None:
    roles = {
        (t, i): cluster.parse_tf_config(tf_config(t, i)).roles
        for t, i in [("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    }
    assert roles[("chief", 0)] == {Role.GATHER}
    assert roles[("ps", 0)] == roles[("ps", 1)] == {Role.SERVE}
    assert roles[("worker", 0)] == roles[("worker", 1)] == {Role.REPLAY}


def test_without_a_chief_worker_zero_replays_and_gathers() -> None:
    spec = {"ps": ["h1:1"], "worker": ["h2:1", "h3:1"]}
    placement = cluster.parse_tf_config(tf_config("worker", 0, spec))
    assert placement.roles == {Role.REPLAY, Role.GATHER}
    assert placement.gatherer == TaskId(type="worker", index=0)
    assert placement.gatherer_address == "h2:1"
    assert cluster.parse_tf_config(tf_config("worker", 1, spec)).roles == {Role.REPLAY}


def test_placement_exposes_addresses_and_round_trips_through_tf_config() -> None:
    placement = cluster.parse_tf_config(tf_config("worker", 1))
    assert placement.address == "h4:2222"
    assert placement.ps_addresses == ("h1:2222", "h2:2222")
    assert placement.worker_count == 2
    assert placement.gatherer_address == "h0:2222"
    assert cluster.parse_tf_config(placement.tf_config()) == placement


def test_a_job_given_as_an_index_object_is_read_like_a_list() -> None:
    spec = {"ps": {"1": "b:2", "0": "a:1"}, "worker": ["c:3"]}
    placement = cluster.parse_tf_config(tf_config("ps", 1, spec))
    assert placement.ps_addresses == ("a:1", "b:2")


def test_evaluator_outside_the_cluster_has_no_role() -> None:
    placement = cluster.parse_tf_config(tf_config("evaluator", 0))
    assert placement.roles == frozenset()
    assert placement.address == ""


def test_environment_variable_is_read_and_flags_override_it() -> None:
    env = {"TF_CONFIG": tf_config("worker", 0)}
    assert cluster.resolve_placement(environ=env) == cluster.parse_tf_config(env["TF_CONFIG"])
    overridden = cluster.resolve_placement(task="ps:1", environ=env)
    assert overridden is not None and overridden.task == TaskId(type="ps", index=1)
    assert cluster.resolve_placement(environ={}) is None


def test_cluster_flag_takes_json_a_file_or_a_whole_tf_config(tmp_path: Path) -> None:
    bare = json.dumps(CLUSTER)
    from_flag = cluster.resolve_placement(cluster=bare, task="worker:1", environ={})
    path = tmp_path / "cluster.json"
    path.write_text(tf_config("worker", 1))
    from_file = cluster.resolve_placement(cluster=str(path), environ={})
    assert from_flag == from_file
    assert from_flag is not None and from_flag.address == "h4:2222"


def test_ipv6_addresses_are_accepted() -> None:
    spec = {"ps": ["[::1]:5000"], "worker": ["[fe80::1]:5001"]}
    assert cluster.parse_tf_config(tf_config("ps", 0, spec)).address == "[::1]:5000"
    assert split_address("[::1]:5000", where="x") == ("::1", 5000)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{not json", r"TF_CONFIG: not valid JSON"),
        ("[]", r"TF_CONFIG: expected a JSON object"),
        (json.dumps({"task": {"type": "ps", "index": 0}}), r"TF_CONFIG: cluster: missing"),
        (json.dumps({"cluster": CLUSTER}), r"TF_CONFIG: task: missing"),
        (tf_config("master", 0), r"task\.type: expected one of chief, worker, ps, evaluator"),
        (tf_config("worker", 2), r"task index 2 is out of range: worker has 2 tasks"),
        (tf_config("worker", -1), r"task\.index: expected an integer >= 0"),
        (tf_config("ps", 0, {"ps": ["a:1"], "worker": ["b:1"], "master": ["c:1"]}), "master"),
        (tf_config("ps", 0, {"ps": ["a:1"], "worker": ["nope"]}), r"cluster\.worker\[0\]"),
        (tf_config("ps", 0, {"ps": ["a:99999"], "worker": ["b:1"]}), r"cluster\.ps\[0\]"),
        (tf_config("ps", 0, {"ps": ["a:1"], "worker": []}), r"cluster\.worker: expected a non"),
        (tf_config("ps", 0, {"ps": ["a:1"]}), r"at least one worker task"),
        (tf_config("worker", 0, {"worker": ["a:1"]}), r"at least one ps task"),
        (tf_config("ps", 0, {"ps": {"0": "a:1", "2": "b:1"}, "worker": ["c:1"]}), r"0\.\.1"),
        (
            tf_config("ps", 0, {"chief": ["a:1", "b:1"], "ps": ["c:1"], "worker": ["d:1"]}),
            r"cluster\.chief: there must be at most one chief",
        ),
        (
            json.dumps({"cluster": CLUSTER, "task": {"type": "ps"}, "rpc_layer": "grpc+verbs"}),
            r"rpc_layer: only 'grpc'",
        ),
    ],
)
def test_invalid_tf_config_gives_one_line_naming_the_field(document: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        cluster.resolve_placement(environ={"TF_CONFIG": document})
    assert "\n" not in str(caught.value)


def test_bad_task_flag_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--task 'worker'"):
        cluster.parse_task_flag("worker")
    with pytest.raises(ConfigError, match=r"--cluster /no/such/file"):
        cluster.resolve_placement(cluster="/no/such/file", task="ps:0", environ={})
