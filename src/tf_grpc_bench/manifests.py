"""What a cluster needs to run a capture or a replay: Kubernetes manifests and TF_CONFIG documents.

Every task of a job runs ``tf-grpc-bench`` with the same arguments (``role``
for a replay, ``record`` for a capture) and learns its place from
``TF_CONFIG``, as TensorFlow's own tasks do.  Three ways to start them:

- a **JobSet** (``jobset.x-k8s.io/v1alpha2``, the Kubernetes SIG's API for
  groups of Jobs): one replicated job per TensorFlow job (``chief``, ``ps``,
  ``worker``), each an Indexed Job with one pod per task; JobSet's network
  settings give every pod a stable host name
  (``NAME-JOB-0-INDEX.NAME``) behind a headless service it creates; every pod's
  ``TF_CONFIG`` names those hosts, its own task index filled in by Kubernetes
  from the Job's completion-index annotation (``$(TASK_INDEX)``);
- a Kubeflow **TFJob** (``kubeflow.org/v1``), whose operator makes the
  services and sets ``TF_CONFIG`` itself (its container must be called
  ``tensorflow`` and its port ``tfjob-port``);
- plain **TF_CONFIG** documents, one per task, for any other launcher.

Every pod mounts one volume (a PersistentVolumeClaim, which must exist and be
writable by every pod: ``ReadWriteMany``) where ``role`` writes its results and
``record`` its records.  Pure: plain data in, plain data or text out.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tf_grpc_bench.errors import ConfigError

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
TFJOB_API_VERSION = "kubeflow.org/v1"
#: TensorFlow's usual server port; every pod has its own address, so one port serves all.
DEFAULT_PORT = 2222
DEFAULT_MOUNT_PATH = "/results"
#: The Job controller's annotation holding a pod's index in an Indexed Job.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: The subcommands a pod may run.
POD_COMMANDS = ("role", "record")
#: TFJob's replica types for TensorFlow's job names.
TFJOB_REPLICA_TYPES = {"chief": "Chief", "ps": "PS", "worker": "Worker"}
#: Longest job name: pod host names ``NAME-worker-0-INDEX`` must stay within 63 characters.
MAX_NAME_LENGTH = 40

#: Longest DNS label (RFC 1123) and DNS subdomain, Kubernetes' limits for names.
MAX_LABEL_LENGTH = 63
MAX_SUBDOMAIN_LENGTH = 253
#: Longest image repository name (the reference grammar's limit, tag and digest excluded).
MAX_IMAGE_NAME_LENGTH = 255

# Every pattern is matched whole (``fullmatch``): ``$`` would let a trailing newline through.
#: RFC 1035 label: what a JobSet's name becomes (its headless service and pod host names).
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?", re.ASCII)
#: RFC 1123 label: a namespace.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
#: RFC 1123 subdomain: dot-separated labels, a PersistentVolumeClaim's name.
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)
_HOST = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]", re.ASCII)
# A container image reference, the grammar container registries and runtimes share:
# [DOMAIN[:PORT]/]PATH[:TAG][@DIGEST], the path's components lower case.
_IMAGE_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][-A-Za-z0-9]*[A-Za-z0-9])"
_IMAGE_DOMAIN = rf"{_IMAGE_DOMAIN_PART}(?:\.{_IMAGE_DOMAIN_PART})*|\[[0-9A-Fa-f:]+\]"
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?P<name>(?:(?:{_IMAGE_DOMAIN})(?::[0-9]+)?/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?",
    re.ASCII,
)


def has_control_character(text: str) -> bool:
    """Whether ``text`` holds a newline, tab or any other control character."""
    return any(unicodedata.category(c) == "Cc" for c in text)


def _check_dns_name(flag: str, value: str, pattern: re.Pattern[str], what: str, limit: int) -> None:
    if not pattern.fullmatch(value) or len(value) > limit:
        raise ValueError(f"{flag} {value!r}: expected {what} of at most {limit} characters")


def _check_image(image: str) -> None:
    match = _IMAGE.fullmatch(image)
    if not match or len(match.group("name")) > MAX_IMAGE_NAME_LENGTH:
        raise ValueError(
            f"--image {image!r}: expected an image reference, [REGISTRY[:PORT]/]PATH[:TAG]"
            "[@DIGEST] with a lower-case path (e.g. registry.example/tf-grpc-bench:0.1)"
        )


def _check_mount_path(path: str) -> None:
    if (
        not path.startswith("/")
        or has_control_character(path)
        or ".." in path.split("/")
        or ":" in path
    ):
        raise ValueError(
            f"--mount-path {path!r}: expected an absolute path without '..', ':' or "
            "control characters"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PodJob:
    """A job of TensorFlow tasks to run as pods, each running ``tf-grpc-bench ARGUMENTS``."""

    name: str
    image: str
    ps: int
    workers: int
    chief: bool
    arguments: tuple[str, ...]
    claim: str
    mount_path: str = DEFAULT_MOUNT_PATH
    port: int = DEFAULT_PORT
    namespace: str = ""

    def __post_init__(self) -> None:
        _check_dns_name(
            "--name",
            self.name,
            _DNS_1035_LABEL,
            "a DNS label (a-z, 0-9, '-', starting with a letter)",
            MAX_NAME_LENGTH,
        )
        if self.namespace:
            _check_dns_name(
                "--namespace",
                self.namespace,
                _DNS_LABEL,
                "a DNS label (a-z, 0-9, '-')",
                MAX_LABEL_LENGTH,
            )
        _check_dns_name(
            "--claim",
            self.claim,
            _DNS_SUBDOMAIN,
            "a DNS subdomain (DNS labels of a-z, 0-9, '-', joined by '.')",
            MAX_SUBDOMAIN_LENGTH,
        )
        _check_image(self.image)
        if self.ps < 1 or self.workers < 1:
            raise ValueError(f"--ps {self.ps}, --workers {self.workers}: each must be >= 1")
        if not 0 < self.port < 65_536:
            raise ValueError(f"--port {self.port}: expected 1..65535")
        _check_mount_path(self.mount_path)
        if not self.arguments or self.arguments[0] not in POD_COMMANDS:
            raise ValueError(
                "the pods' command: expected `-- role ...` or `-- record ...` after the flags, "
                f"got {' '.join(self.arguments) or 'nothing'}"
            )
        for argument in self.arguments:
            if has_control_character(argument):
                raise ValueError(
                    f"the pods' command: argument {argument!r} holds a control character"
                )

    @property
    def jobs(self) -> tuple[tuple[str, int], ...]:
        """(job name, task count), chief first as TensorFlow lists them."""
        chief = (("chief", 1),) if self.chief else ()
        return (*chief, ("ps", self.ps), ("worker", self.workers))

    @property
    def success_job(self) -> str:
        """The job whose end ends the whole job: the chief, else the workers (worker 0 is
        TensorFlow's chief then).  A training job's ps tasks never end on their own."""
        return "chief" if self.chief else "worker"


def make_pod_job(**fields: Any) -> PodJob:
    """PodJob, its ValueError turned into ConfigError (a one-line message naming the flag)."""
    try:
        return PodJob(**fields)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def pod_arguments(job: PodJob) -> list[str]:
    """The pods' ``tf-grpc-bench`` arguments, writing to the volume unless told where.

    ``role`` gets ``--output-dir MOUNT/runs``; ``record`` gets ``--out
    MOUNT/records`` (inserted before a ``--`` that starts the wrapped command).
    """
    arguments = list(job.arguments)
    command, rest = arguments[0], arguments[1:]
    wrapped_at = rest.index("--") if "--" in rest else len(rest)
    own = rest[:wrapped_at]
    if command == "role" and not any(a.split("=")[0] == "--output-dir" for a in own):
        return [command, *rest, "--output-dir", f"{job.mount_path}/runs"]
    if command == "record" and not any(a.split("=")[0] == "--out" for a in own):
        return [command, *own, "--out", f"{job.mount_path}/records", *rest[wrapped_at:]]
    return arguments


def jobset_hosts(job: PodJob) -> dict[str, list[str]]:
    """The cluster of a JobSet's pods: their stable DNS names and the port."""
    return {
        name: [f"{job.name}-{name}-0-{index}.{job.name}:{job.port}" for index in range(count)]
        for name, count in job.jobs
    }


def _container(job: PodJob, *, name: str, port_name: str, env: list[Any]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": job.image,
        "command": ["tf-grpc-bench"],
        "args": pod_arguments(job),
        "ports": [{"name": port_name, "containerPort": job.port, "protocol": "TCP"}],
        "volumeMounts": [{"name": "results", "mountPath": job.mount_path}],
    }
    if env:
        container["env"] = env
    return container


def _volumes(job: PodJob) -> list[dict[str, Any]]:
    return [{"name": "results", "persistentVolumeClaim": {"claimName": job.claim}}]


def _metadata(job: PodJob) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": job.name,
        "labels": {"app.kubernetes.io/name": "tf-grpc-bench", "tf-grpc-bench/job": job.name},
    }
    if job.namespace:
        metadata["namespace"] = job.namespace
    return metadata


def _jobset_env(job: PodJob, task_type: str) -> list[dict[str, Any]]:
    """TASK_INDEX from the pod's completion index, then TF_CONFIG naming it (Kubernetes
    expands ``$(TASK_INDEX)`` because it is defined earlier in the list)."""
    cluster = json.dumps(jobset_hosts(job), sort_keys=True)
    tf_config = (
        f'{{"cluster": {cluster}, "task": {{"type": "{task_type}", "index": $(TASK_INDEX)}}}}'
    )
    annotation = f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
    return [
        {"name": "TASK_INDEX", "valueFrom": {"fieldRef": {"fieldPath": annotation}}},
        {"name": "TF_CONFIG", "value": tf_config},
    ]


def jobset(job: PodJob) -> dict[str, Any]:
    """A JobSet running every task of ``job`` as a pod with a stable host name."""
    replicated = []
    for name, count in job.jobs:
        container = _container(
            job, name="tf-grpc-bench", port_name="tf-grpc", env=_jobset_env(job, name)
        )
        pod = {"restartPolicy": "Never", "containers": [container], "volumes": _volumes(job)}
        replicated.append(
            {
                "name": name,
                "replicas": 1,
                "template": {
                    "spec": {
                        "parallelism": count,
                        "completions": count,
                        "completionMode": "Indexed",
                        "backoffLimit": 0,
                        "template": {"spec": pod},
                    }
                },
            }
        )
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": _metadata(job),
        "spec": {
            # A headless service named after the job, every pod NAME-JOB-0-INDEX.NAME.
            "network": {
                "enableDNSHostnames": True,
                "subdomain": job.name,
                "publishNotReadyAddresses": True,
            },
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [job.success_job]},
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": replicated,
        },
    }


def tfjob(job: PodJob) -> dict[str, Any]:
    """A Kubeflow TFJob: the operator sets every pod's TF_CONFIG."""
    replicas = {}
    for name, count in job.jobs:
        container = _container(job, name="tensorflow", port_name="tfjob-port", env=[])
        replicas[TFJOB_REPLICA_TYPES[name]] = {
            "replicas": count,
            "restartPolicy": "Never",
            "template": {"spec": {"containers": [container], "volumes": _volumes(job)}},
        }
    return {
        "apiVersion": TFJOB_API_VERSION,
        "kind": "TFJob",
        "metadata": _metadata(job),
        "spec": {
            # The ps pods of a training job never end: stop them when the chief is done.
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
            "tfReplicaSpecs": replicas,
        },
    }


def parse_address_list(text: str, *, flag: str) -> list[str]:
    """``h0:2222,h1:2222`` -> addresses, each checked as ``host:port``."""
    addresses = [item.strip() for item in text.split(",")]
    for address in addresses:
        host, _, port = address.rpartition(":")
        if (
            not _HOST.fullmatch(host)
            or not port.isascii()
            or not port.isdigit()
            or not 0 < int(port) < 65_536
        ):
            raise ConfigError(f"{flag} {text!r}: {address!r} is not 'host:port'")
    return addresses


def tf_configs(cluster: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """``job:index`` -> the TF_CONFIG document of that task (JSON text), for every task."""
    if not cluster.get("worker"):
        raise ConfigError("tf-config: a cluster needs worker tasks")
    if len(cluster.get("chief", ())) > 1:
        raise ConfigError("tf-config: --chief: there must be at most one chief task")
    plain = {name: list(addresses) for name, addresses in cluster.items() if addresses}
    seen: set[str] = set()
    for address in (a for addresses in plain.values() for a in addresses):
        if address in seen:
            raise ConfigError(f"tf-config: {address!r} is given twice (each task needs its own)")
        seen.add(address)
    return {
        f"{name}:{index}": json.dumps(
            {"cluster": plain, "task": {"type": name, "index": index}}, sort_keys=True
        )
        for name, addresses in plain.items()
        for index in range(len(addresses))
    }


# -- YAML -----------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*$")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # A JSON string is a YAML double-quoted scalar: never read as a number, bool or null.
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) else json.dumps(key)


def _block(value: Any, indent: int) -> list[str]:
    """The lines of ``value`` in YAML block style at ``indent`` spaces."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Mapping | list) and item:
                lines.append(f"{pad}{_key(key)}:")
                lines += _block(item, indent + 2)
            else:
                lines.append(f"{pad}{_key(key)}: {_inline(item)}")
    else:
        for item in value:
            if isinstance(item, Mapping | list) and item:
                nested = _block(item, indent + 2)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines += nested[1:]
            else:
                lines.append(f"{pad}- {_inline(item)}")
    return lines


def _inline(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(documents: Sequence[Mapping[str, Any]]) -> str:
    """YAML text of ``documents`` (``---`` between them): block style, every string quoted."""
    return "---\n".join("\n".join(_block(document, 0)) + "\n" for document in documents)
