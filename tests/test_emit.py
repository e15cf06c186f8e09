"""``tf-grpc-bench emit``: manifests valid against the published JobSet and TFJob schemas, whose
pods' TF_CONFIG places every task as ``role`` expects; TF_CONFIG documents for other launchers."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.test_placement import FLAGS, free_ports
from tf_grpc_bench import manifests
from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.replay.core.measurement import Benchmark
from tf_grpc_bench.replay.output.document_reader import read_document
from tf_grpc_bench.replay.placement import cluster
from tf_grpc_bench.replay.placement.cluster import Role

SCHEMAS = Path(__file__).parent / "data" / "k8s-schemas"
JOBSET_SCHEMA = SCHEMAS / "jobset.x-k8s.io_v1alpha2_JobSet.json"
TFJOB_SCHEMA = SCHEMAS / "kubeflow.org_v1_TFJob.json"


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused, as the API server's strict field validation
    (``kubectl apply --validate=strict``, the default) refuses them; objects that keep
    unknown fields (``x-kubernetes-preserve-unknown-fields``) or map names to values
    (``additionalProperties``) are left as they are."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


def validator(path: Path) -> jsonschema.Draft4Validator:
    # OpenAPI v3.0 schemas are JSON Schema draft 4 plus extensions jsonschema ignores.
    schema = strict(json.loads(path.read_text()))
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def emit(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tf_grpc_bench", "emit", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def emitted(*arguments: str) -> dict[str, Any]:
    result = emit(*arguments)
    assert result.returncode == 0, result.stderr
    (document,) = list(yaml.safe_load_all(result.stdout))
    assert isinstance(document, dict)
    return document


REPLAY = ("--", "role", "resnet50-tf2ps", "--benchmark", "ps-throughput")
CAPTURE = ("--", "record", "--", "python", "train.py", "--steps", "20")


@pytest.mark.parametrize("command", [REPLAY, CAPTURE], ids=["role", "record"])
@pytest.mark.parametrize("chief", [True, False], ids=["chief", "no-chief"])
def test_a_jobset_passes_the_published_schema(command: tuple[str, ...], chief: bool) -> None:
    flags = ["--image", "registry.example/tfgb:0.1", "--ps", "2", "--workers", "3"]
    document = emitted("jobset", *flags, *([] if chief else ["--no-chief"]), *command)
    validator(JOBSET_SCHEMA).validate(document)
    assert document["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert document["kind"] == "JobSet"
    jobs = {j["name"]: j["template"]["spec"] for j in document["spec"]["replicatedJobs"]}
    assert {name: spec["completions"] for name, spec in jobs.items()} == {
        **({"chief": 1} if chief else {}),
        "ps": 2,
        "worker": 3,
    }
    assert document["spec"]["network"]["enableDNSHostnames"] is True
    assert document["spec"]["successPolicy"]["targetReplicatedJobs"] == [
        "chief" if chief else "worker"
    ]


def test_a_tfjob_passes_the_published_schema() -> None:
    document = emitted("tfjob", "--image", "tfgb:0.1", "--ps", "2", "--namespace", "ml", *CAPTURE)
    validator(TFJOB_SCHEMA).validate(document)
    replicas = document["spec"]["tfReplicaSpecs"]
    assert {name: spec["replicas"] for name, spec in replicas.items()} == {
        "Chief": 1,
        "PS": 2,
        "Worker": 2,
    }
    for spec in replicas.values():
        (container,) = spec["template"]["spec"]["containers"]
        # The names the TFJob operator looks for.
        assert container["name"] == "tensorflow"
        assert container["ports"][0]["name"] == "tfjob-port"
        assert container["args"] == [
            "record",
            "--out",
            "/results/records",
            "--",
            "python",
            "train.py",
            "--steps",
            "20",
        ]
        assert container["volumeMounts"] == [{"name": "results", "mountPath": "/results"}]
    assert document["metadata"]["namespace"] == "ml"


def test_the_schemas_catch_what_is_wrong() -> None:
    """The validation is not vacuous: a misspelled field or a wrong type fails it."""
    document = emitted("jobset", "--image", "tfgb:0.1", *REPLAY)
    jobset = validator(JOBSET_SCHEMA)
    misspelled = copy.deepcopy(document)
    misspelled["spec"]["replicatedJob"] = misspelled["spec"].pop("replicatedJobs")
    wrong_type = copy.deepcopy(document)
    wrong_type["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = "2"
    bad_enum = copy.deepcopy(document)
    bad_enum["spec"]["successPolicy"]["operator"] = "Every"
    for broken in (misspelled, wrong_type, bad_enum):
        assert not jobset.is_valid(broken)
    tfjob = emitted("tfjob", "--image", "tfgb:0.1", *REPLAY)
    tfjob["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["imag"] = "x"
    assert not validator(TFJOB_SCHEMA).is_valid(tfjob)


def pod_tf_config(document: dict[str, Any], job: str, index: int) -> str:
    """The TF_CONFIG a JobSet pod sees once Kubernetes expanded ``$(TASK_INDEX)``."""
    replicated = next(j for j in document["spec"]["replicatedJobs"] if j["name"] == job)
    pod = replicated["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    path = env["TASK_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    return str(env["TF_CONFIG"]["value"]).replace("$(TASK_INDEX)", str(index))


def test_every_jobset_pod_is_placed_by_its_tf_config_on_its_stable_host_name() -> None:
    document = emitted("jobset", "--name", "bench", "--image", "tfgb:0.1", "--ps", "2", *REPLAY)
    roles = {}
    for job, count in (("chief", 1), ("ps", 2), ("worker", 2)):
        for index in range(count):
            placement = cluster.parse_tf_config(pod_tf_config(document, job, index))
            assert str(placement.task) == f"{job}:{index}"
            # JobSet's host name for pod INDEX of replicated job JOB (job index 0).
            assert placement.address == f"bench-{job}-0-{index}.bench:2222"
            roles[f"{job}:{index}"] = placement.roles
    assert roles == {
        "chief:0": {Role.GATHER},
        "ps:0": {Role.SERVE},
        "ps:1": {Role.SERVE},
        "worker:0": {Role.REPLAY},
        "worker:1": {Role.REPLAY},
    }


def test_role_writes_to_the_volume_unless_told_where() -> None:
    document = emitted("jobset", "--image", "i", "--mount-path", "/data", *REPLAY)
    container = document["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["args"][-2:] == ["--output-dir", "/data/runs"]
    mine = emitted("jobset", "--image", "i", *REPLAY, "--output-dir=/elsewhere")
    container = mine["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["args"][-1] == "--output-dir=/elsewhere"
    assert "/results/runs" not in container["args"]


def test_tf_config_documents_one_per_task(tmp_path: Path) -> None:
    result = emit(
        "tf-config",
        "--ps-hosts",
        "h1:2222,h2:2222",
        "--worker-hosts",
        "h3:2222",
        "--chief-host",
        "h0:2222",
        "--output",
        str(tmp_path / "configs"),
    )
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in (tmp_path / "configs").iterdir())
    assert files == ["chief-0.json", "ps-0.json", "ps-1.json", "worker-0.json"]
    placement = cluster.parse_tf_config((tmp_path / "configs" / "ps-1.json").read_text())
    assert placement.address == "h2:2222"
    assert placement.cluster.as_dict() == {
        "chief": ["h0:2222"],
        "ps": ["h1:2222", "h2:2222"],
        "worker": ["h3:2222"],
    }
    lines = emit("tf-config", "--ps-hosts", "a:1", "--worker-hosts", "b:2").stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["ps:0", "worker:0"]


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        (("jobset", *REPLAY), "--image is required"),
        (("jobset", "--image", "i"), "expected `-- role ...` or `-- record ...`"),
        (("jobset", "--image", "i", "--", "replay"), "expected `-- role ...`"),
        (("tfjob", "--image", "i", "--name", "Bench", *REPLAY), "--name 'Bench': expected a DNS"),
        (("tfjob", "--image", "i", "--claim", "a_b", *REPLAY), "--claim 'a_b'"),
        (("jobset", "--image", "i", "--port", "0", *REPLAY), "--port 0: expected 1..65535"),
        (("jobset", "--image", "i", "--mount-path", "data", *REPLAY), "--mount-path 'data'"),
        (("jobset", "--image", "i", "--ps", "0", *REPLAY), "expected a task count"),
        (("tf-config", "--ps-hosts", "a:1"), "needs --worker-hosts"),
        (("tf-config", "--slurm-jobs", "ps:1", "--ps-hosts", "a:1"), "not both"),
        (("tf-config", "--ps-hosts", "a", "--worker-hosts", "b:1"), "--ps-hosts 'a': 'a' is not"),
        (("tf-config", "--ps-hosts", "a:1", "--worker-hosts", "b:99999"), "'b:99999' is not"),
        # What the YAML would carry differently from what was typed.
        (("jobset", "--image", "i", "--name", "bench\n", *REPLAY), "--name 'bench\\n'"),
        (("tfjob", "--image", "i", "--namespace", "ml\n", *REPLAY), "--namespace 'ml\\n'"),
        (("jobset", "--image", "i", "--namespace", "n" * 64, *REPLAY), "at most 63"),
        (("jobset", "--image", "i", "--claim", "results\n", *REPLAY), "--claim 'results\\n'"),
        (("jobset", "--image", "i", "--claim", "a..b", *REPLAY), "DNS subdomain"),
        (("jobset", "--image", "i\n", *REPLAY), "--image 'i\\n': expected an image reference"),
        (("jobset", "--image", "Registry/Tfgb", *REPLAY), "--image 'Registry/Tfgb'"),
        (("jobset", "--image", "tfgb:", *REPLAY), "--image 'tfgb:'"),
        (("jobset", "--image", "i", "--mount-path", "/a/../b", *REPLAY), "--mount-path '/a/../b'"),
        (("jobset", "--image", "i", "--mount-path", "/data\n", *REPLAY), "--mount-path"),
        # The pods' own flags, refused here as every pod would refuse them at start.
        (
            ("jobset", "--image", "i", "--", "role", "TRACE", "--duration", "inf", "--runs", "0"),
            "the pods' command: --runs must be in 1..",
        ),
        (("jobset", "--image", "i", *REPLAY, "--duration", "inf"), "--duration must be in"),
        (("jobset", "--image", "i", *REPLAY, "--bogus"), "unrecognized arguments: --bogus"),
        (("jobset", "--image", "i", *REPLAY, "--runs", "x"), "argument --runs: invalid int"),
        (("jobset", "--image", "i", *REPLAY, "--target", "h:1"), "drop --target"),
        (("jobset", "--image", "i", *REPLAY, "--job-timeout", "0"), "--job-timeout must be"),
        (("jobset", "--image", "i", *REPLAY, "--benchmark", "p3"), "--benchmark 'p3'"),
        (("jobset", "--image", "i", *REPLAY, "--help"), "the pods' command"),
        (("jobset", "--image", "i", *REPLAY, "--network-name", "a\nb"), "control character"),
        (("tfjob", "--image", "i", "--", "record"), "no command to run"),
        (("tfjob", "--image", "i", "--", "record", "--port-base", "9", "--", "x"), "--slurm-jobs"),
        (("tfjob", "--image", "i", "--", "record", "--task", "x", "--", "y"), "argument --task"),
        # TF_CONFIG documents: every address once, host names as DNS has them.
        (("tf-config", "--ps-hosts", "a:1", "--worker-hosts", "a:1"), "'a:1' is given twice"),
        (("tf-config", "--worker-hosts", "a:1,b:2,a:1"), "'a:1' is given twice"),
        (("tf-config", "--worker-hosts", "b:1", "--chief-host", "b:1"), "'b:1' is given twice"),
        (("tf-config", "--worker-hosts", "b\n:1"), "'b\\n:1' is not 'host:port'"),
        (("tf-config", "--worker-hosts", "b:1", "--chief-host", "c\n:1"), "--chief-host"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(arguments: tuple[str, ...], complaint: str) -> None:
    result = emit(*arguments)
    assert result.returncode == 2
    assert complaint in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_yaml_reads_back_as_the_document_it_was_written_from() -> None:
    document = {
        "a": {"b": [1, True, "yes", "1.0", "null", "", "x: y", "$(V)", "é"], "c": {}},
        "list": [{"k": [], "m": [["n"]]}, "s"],
        "quoted key:": "v",
    }
    assert yaml.safe_load(manifests.to_yaml([document])) == document


def test_a_cluster_without_workers_gets_no_tf_config() -> None:
    with pytest.raises(ConfigError, match="needs worker tasks"):
        manifests.tf_configs({"ps": ["a:1"]})
    # Workers alone (MultiWorkerMirroredStrategy) are a cluster.
    assert list(manifests.tf_configs({"worker": ["a:1", "b:1"]})) == ["worker:0", "worker:1"]


def test_role_tasks_started_with_the_emitted_tf_configs_replay_together(tmp_path: Path) -> None:
    """What another launcher does with ``emit tf-config``: each task gets its document."""
    ps, worker0, worker1 = (f"127.0.0.1:{p}" for p in free_ports(3))
    configs = tmp_path / "configs"
    written = emit(
        "tf-config", "--ps-hosts", ps, "--worker-hosts", f"{worker0},{worker1}", "-o", str(configs)
    )
    assert written.returncode == 0, written.stderr
    processes = {
        path.stem: subprocess.Popen(
            [sys.executable, "-m", "tf_grpc_bench", "role", *FLAGS, "--output-dir", str(tmp_path)],
            env={**os.environ, "TF_CONFIG": path.read_text()},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in sorted(configs.glob("*.json"))
    }
    try:
        outcomes = {task: p.communicate(timeout=300) for task, p in processes.items()}
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    for task, process in processes.items():
        assert process.returncode == 0, f"{task}: {outcomes[task]}"
    assert set(processes) == {"ps-0", "worker-0", "worker-1"}
    (path,) = tmp_path.glob("*/results.json")
    throughput = next(
        r for r in read_document(path).benchmarks if r.benchmark is Benchmark.PS_THROUGHPUT
    )
    assert {s.worker_index for run in throughput.runs for s in run.samples} == {0, 1}
