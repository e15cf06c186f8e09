"""``tf-grpc-bench record`` and ``assemble``: capture a job whose tasks run on several hosts.

Thin entry points: flags -> ``record.record_task`` (run on every host, by the
launcher, in place of the training command) and ``assemble.assemble_records``
(run once, on the folders of every task).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tf_grpc_bench import launchers, trace_files, trace_summary
from tf_grpc_bench.command import Command
from tf_grpc_bench.errors import CaptureError, TraceError, UsageError
from tf_grpc_bench.files import check_writable
from tf_grpc_bench.profiler import logs
from tf_grpc_bench.profiler.assemble import CLOCK_MODES, Labels, assemble_records
from tf_grpc_bench.profiler.launch.identity import SLURM, identify_task
from tf_grpc_bench.profiler.metadata import command_line
from tf_grpc_bench.profiler.record import record_task


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def _task_index(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a task index (0, 1, ...), got {text!r}")
    return int(text)


def configure_record(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "%(prog)s --out DIR [--job JOB --task N --cluster JSON | --slurm-jobs JOB:N,...] "
        "[--end-step] -- COMMAND [ARGS...]"
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where this task's records go (a folder <job>-<index> is made in it)",
    )
    parser.add_argument(
        "--job", default="", help="this task's job, when TF_CONFIG is not set (ps, worker, ...)"
    )
    parser.add_argument(
        "--task", type=_task_index, default=None, metavar="N", help="this task's index, likewise"
    )
    parser.add_argument(
        "--cluster",
        default="",
        metavar="JSON",
        help="the cluster, likewise: JSON, a TF_CONFIG document, or @FILE",
    )
    parser.add_argument(
        "--slurm-jobs",
        default="",
        metavar="JOB:N,...",
        help="under srun, without TF_CONFIG: this task from srun's environment, laid out as "
        "TensorFlow's SlurmClusterResolver does (and as role --slurm-jobs): the jobs and their "
        "task counts, e.g. ps:1,worker:2,chief:1 (they must add up to srun -n; ranks go to the "
        "jobs in order of their names); the command gets this task's TF_CONFIG",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=None,
        metavar="PORT",
        help="with --slurm-jobs: a node's tasks listen on PORT, PORT+1, ... "
        f"(default {launchers.DEFAULT_PORT_BASE}, TensorFlow's)",
    )
    parser.add_argument(
        "--end-step",
        action="store_true",
        help="under srun: once the command has ended by itself, send SIGTERM to every task of "
        "the job step (scancel), which their record passes on: for a job whose servers serve "
        "until stopped (TF2 parameter-server training: the chief's end ends the ps and workers)",
    )
    parser.add_argument(
        "job_command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="the task's command, after '--'; {job}, {task}, {cluster} and {port} in it "
        "are replaced by this task's",
    )


def check_record(args: argparse.Namespace) -> list[str]:
    """The task's command, once the flags that need no host are checked (UsageError)."""
    command = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to run: put it after '--', e.g. -- python train.py")
    if args.port_base is not None and not args.slurm_jobs:
        raise UsageError("--port-base lays out a Slurm step: give it with --slurm-jobs")
    return command


def run_record(args: argparse.Namespace) -> int:
    command = check_record(args)
    task = identify_task(
        os.environ,
        job=args.job,
        index=args.task,
        cluster=args.cluster,
        slurm_jobs=args.slurm_jobs,
        port_base=launchers.DEFAULT_PORT_BASE if args.port_base is None else args.port_base,
    )
    environment = dict(os.environ)
    if task.source == SLURM:
        # Placed by Slurm, the command learns its task as TensorFlow's strategies do;
        # a script that takes its role as flags gets them from the placeholders.
        environment["TF_CONFIG"] = task.tf_config()
    logs.configure()
    status = record_task(
        Path(args.out), command, task, environment=environment, end_step=args.end_step
    )
    return status


def configure_assemble(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "records", nargs="+", metavar="DIR", help="record --out directories, or task folders"
    )
    parser.add_argument("--output", "-o", required=True, metavar="TRACE", help="the trace file")
    parser.add_argument(
        "--warmup-steps",
        type=_count,
        default=1,
        help="training runs found in the traffic (worker-steps) to keep as start-up (default 1)",
    )
    parser.add_argument(
        "--clocks",
        choices=CLOCK_MODES,
        default="auto",
        help="auto: tasks on one kernel share its clock, the others are placed by the wire; "
        "wire: every task placed by the wire",
    )
    parser.add_argument("--model", default="", help="model name to record in the trace")
    parser.add_argument("--strategy", default="", help="strategy name to record in the trace")
    parser.add_argument(
        "--batch-size", type=_count, default=0, help="batch size to record in the trace"
    )
    parser.add_argument(
        "--async", dest="synchronous", action="store_false", help="record as asynchronous"
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="print only errors")


def run_assemble(args: argparse.Namespace) -> int:
    output = Path(args.output)
    check_writable(output, error=TraceError, what="trace")
    logs.configure()
    trace = assemble_records(
        [Path(p) for p in args.records],
        warmup_steps=args.warmup_steps,
        clocks=args.clocks,
        labels=Labels(
            model=args.model,
            strategy=args.strategy,
            batch_size=args.batch_size,
            synchronous=args.synchronous,
            command=command_line(),
        ),
    )
    trace_files.write_trace(trace, output)
    if not args.quiet:
        sys.stdout.write(trace_summary.format_summary(trace) + "\n")
    if not trace.steps:
        raise CaptureError(
            f"no training step found in the records (trace written to {output}, marked partial)"
            if trace.partial
            else f"no training step found in the records (trace written to {output})"
        )
    if not args.quiet:
        sys.stdout.write(f"{len(trace.steps)} steady steps; trace written to {output}\n")
    return 0


#: ``tf-grpc-bench record`` and ``assemble``.
COMMANDS = (
    Command(
        name="record",
        help="run one task of a job launched elsewhere, recording its traffic to a folder",
        add_arguments=configure_record,
        run=run_record,
        check=check_record,
    ),
    Command(
        name="assemble",
        help="one trace from the record folders of every task of a job",
        add_arguments=configure_assemble,
        run=run_assemble,
    ),
)
