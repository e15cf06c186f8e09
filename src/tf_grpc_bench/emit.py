"""``tf-grpc-bench emit jobset|tfjob|tf-config``: what a cluster needs to start a job.

``jobset`` and ``tfjob`` write a Kubernetes manifest (YAML) whose pods run
``tf-grpc-bench ARGS`` (ARGS after ``--``: ``role ...`` or ``record ...``)
with TF_CONFIG, writing to a volume; ``tf-config`` writes the TF_CONFIG
document of every task of a cluster, for any other launcher
(``tf_grpc_bench.manifests`` builds them).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tf_grpc_bench import launchers, manifests
from tf_grpc_bench.cli import check_command
from tf_grpc_bench.command import Command
from tf_grpc_bench.errors import BenchError, ConfigError, UsageError

KINDS = ("jobset", "tfjob", "tf-config")


def _count(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"expected a task count in 1..1024, got {text!r}")
    return int(text)


def configure_emit(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(
        dest="kind", metavar="KIND", required=True, parser_class=type(parser)
    )
    for kind, help_text in (
        ("jobset", "a JobSet whose pods run tf-grpc-bench with TF_CONFIG"),
        ("tfjob", "a Kubeflow TFJob whose pods run tf-grpc-bench"),
    ):
        _configure_pods(kinds.add_parser(kind, help=help_text, description=help_text))
    help_text = "one TF_CONFIG document per task of a cluster"
    plain = kinds.add_parser("tf-config", help=help_text, description=help_text)
    plain.add_argument("--ps-hosts", metavar="HOST:PORT,...", help="the ps tasks' addresses")
    plain.add_argument("--worker-hosts", metavar="HOST:PORT,...", help="the workers' addresses")
    plain.add_argument("--chief-host", metavar="HOST:PORT", help="the chief's address")
    plain.add_argument(
        "--slurm-jobs",
        metavar="JOB:N,...",
        help="instead of the hosts: inside an srun task, print this task's TF_CONFIG, laid "
        "out from Slurm's environment as TensorFlow's SlurmClusterResolver does "
        "(e.g. ps:1,worker:2,chief:1)",
    )
    plain.add_argument(
        "--port-base",
        type=int,
        default=launchers.DEFAULT_PORT_BASE,
        metavar="PORT",
        help=f"with --slurm-jobs: a node's tasks on PORT, PORT+1, ... "
        f"(default {launchers.DEFAULT_PORT_BASE})",
    )
    plain.add_argument(
        "--output",
        "-o",
        default="-",
        help="directory to write one JOB-INDEX.json per task to (default: one "
        "'JOB:INDEX TF_CONFIG' line per task on stdout); with --slurm-jobs, the file to write "
        "this task's TF_CONFIG to (default: stdout)",
    )


def _configure_pods(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="tf-grpc-bench", help="the job's name (a DNS label)")
    parser.add_argument("--image", help="container image with tf-grpc-bench installed (required)")
    parser.add_argument("--ps", type=_count, default=1, help="ps tasks (default 1)")
    parser.add_argument("--workers", type=_count, default=2, help="worker tasks (default 2)")
    parser.add_argument(
        "--no-chief", dest="chief", action="store_false", help="no chief task (worker 0 gathers)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=manifests.DEFAULT_PORT,
        help=f"every task's port (default {manifests.DEFAULT_PORT})",
    )
    parser.add_argument(
        "--claim",
        default="tf-grpc-bench-results",
        help="PersistentVolumeClaim every pod mounts, ReadWriteMany "
        "(default tf-grpc-bench-results)",
    )
    parser.add_argument(
        "--mount-path",
        default=manifests.DEFAULT_MOUNT_PATH,
        help=f"where the pods mount it (default {manifests.DEFAULT_MOUNT_PATH})",
    )
    parser.add_argument("--namespace", default="", help="the manifest's namespace (default: none)")
    parser.add_argument("--output", "-o", default="-", help="file to write (default: stdout)")
    parser.add_argument(
        "pod_command",
        nargs=argparse.REMAINDER,
        metavar="-- role|record ...",
        help="what every pod runs after 'tf-grpc-bench': role (a replay) or record (a capture)",
    )


def run_emit(args: argparse.Namespace) -> int:
    if args.kind == "tf-config":
        return _emit_tf_configs(args)
    command = list(args.pod_command)
    if command and command[0] == "--":
        command = command[1:]
    if not args.image:
        raise UsageError(f"emit {args.kind}: --image is required (an image with tf-grpc-bench)")
    job = manifests.make_pod_job(
        name=args.name,
        image=args.image,
        ps=args.ps,
        workers=args.workers,
        chief=args.chief,
        arguments=tuple(command),
        claim=args.claim,
        mount_path=args.mount_path,
        port=args.port,
        namespace=args.namespace,
    )
    _check_pod_command(manifests.pod_arguments(job))
    document = manifests.jobset(job) if args.kind == "jobset" else manifests.tfjob(job)
    _write(manifests.to_yaml([document]), args.output)
    return 0


def _check_pod_command(arguments: Sequence[str]) -> None:
    """Refuse here what every pod would refuse at start: its arguments parsed and checked
    as ``tf-grpc-bench`` will parse and check them in the pod."""
    try:
        check_command(arguments)
    except BenchError as error:
        raise type(error)(f"the pods' command: {error}") from None


def _write(text: str, output: str) -> None:
    if output == "-":
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"--output {output}: cannot write ({error.strerror})") from None


def _emit_slurm_tf_config(args: argparse.Namespace) -> int:
    """This srun task's TF_CONFIG (one line), for a command that reads TF_CONFIG."""
    if args.ps_hosts or args.worker_hosts or args.chief_host:
        raise UsageError("emit tf-config: give --slurm-jobs or the hosts, not both")
    step = launchers.read_slurm_step(os.environ)
    task = launchers.slurm_placement(
        step, launchers.parse_jobs(args.slurm_jobs), port_base=args.port_base
    )
    text = manifests.tf_configs(task.cluster_dict())[f"{task.job}:{task.index}"]
    _write(text + "\n", args.output)
    return 0


def _emit_tf_configs(args: argparse.Namespace) -> int:
    if args.slurm_jobs is not None:
        return _emit_slurm_tf_config(args)
    if not args.worker_hosts:
        raise UsageError("emit tf-config needs --worker-hosts (and --ps-hosts for a ps job)")
    cluster = {
        "chief": [] if not args.chief_host else [args.chief_host],
        "ps": []
        if not args.ps_hosts
        else manifests.parse_address_list(args.ps_hosts, flag="--ps-hosts"),
        "worker": manifests.parse_address_list(args.worker_hosts, flag="--worker-hosts"),
    }
    if args.chief_host:
        manifests.parse_address_list(args.chief_host, flag="--chief-host")
    documents = manifests.tf_configs(cluster)
    if args.output == "-":
        for task, text in documents.items():
            sys.stdout.write(f"{task} {text}\n")
        return 0
    directory = Path(args.output)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for task, text in documents.items():
            (directory / f"{task.replace(':', '-')}.json").write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"--output {directory}: cannot write ({error.strerror})") from None
    print(f"{len(documents)} TF_CONFIG documents in {directory}")
    return 0


#: ``tf-grpc-bench emit``.
COMMANDS = (
    Command(
        name="emit",
        help="write a JobSet, a TFJob or TF_CONFIG documents for a replay or a capture",
        add_arguments=configure_emit,
        run=run_emit,
    ),
)
