"""The bad-input corpus: every subcommand given nonsense, as a new user or a hostile one would.

Each case runs the command line in this process (``tf_grpc_bench.cli.main``:
the same parsing, checks and exit statuses as the installed command, without
a Python start-up per case) and asserts what the README promises: a non-zero
exit status of the right kind, exactly one line on stderr naming the culprit,
no traceback, and nothing left behind (no file in the working directory, no
child process, no listening socket).  Cases that need a file (a damaged or
hostile trace, a directory in the way) name it as ``{placeholder}``, made by
``_materials``.  The signal and process cases, which need real processes,
are in ``test_reliability_faults.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tf_grpc_bench import trace_files, trace_format
from tf_grpc_bench.cli import main
from tf_grpc_bench.trace_format import MAX_TRACE_BYTES

from .conftest import make_trace

#: Exit statuses (``errors``): usage/config/trace 2, transport/serve 3, capture 4, network 5.
USAGE, TRANSPORT, CAPTURE, NETWORK = 2, 3, 4, 5


@dataclass(frozen=True)
class Case:
    """One bad command line: what it must exit with and name."""

    name: str
    argv: tuple[str, ...]
    code: int
    culprit: str

    def __str__(self) -> str:
        return self.name


def _case(name: str, argv: str, code: int, culprit: str) -> Case:
    return Case(name=name, argv=tuple(argv.split()), code=code, culprit=culprit)


# Synthetic replays: every numeric flag at the edges (finite, range, type).
_SYNTHETIC = [
    ("duration-inf", "--duration inf", "--duration"),
    ("duration-nan", "--duration nan", "--duration"),
    ("duration-1e300", "--duration 1e300", "--duration"),
    ("duration-negative", "--duration -1", "--duration"),
    ("duration-zero", "--duration 0", "--duration"),
    ("duration-word", "--duration long", "--duration"),
    ("warmup-inf", "--warmup inf", "--warmup"),
    ("warmup-negative", "--warmup -1", "--warmup"),
    ("warmup-1e300", "--warmup 1e300", "--warmup"),
    ("deadline-inf", "--deadline inf", "--deadline"),
    ("deadline-zero", "--deadline 0", "--deadline"),
    ("deadline-nan", "--deadline nan", "--deadline"),
    ("connect-timeout-inf", "--connect-timeout inf", "--connect-timeout"),
    ("connect-timeout-negative", "--connect-timeout -5", "--connect-timeout"),
    ("chunk-size-inf", "--chunk-size inf", "--chunk-size"),
    ("chunk-size-nan", "--chunk-size nan", "--chunk-size"),
    ("chunk-size-tiny", "--chunk-size 10B", "--chunk-size"),
    ("chunk-size-2tib", "--chunk-size 2048GB", "--chunk-size"),
    ("chunk-size-over-limit", "--chunk-size 64MB --max-message-size 32MB", "--chunk-size"),
    ("max-message-size-inf", "--max-message-size inf", "--max-message-size"),
    ("max-message-size-tiny", "--max-message-size 1KB", "--max-message-size"),
    ("max-message-size-3gb", "--max-message-size 3GB", "--max-message-size"),
    ("max-message-size-word", "--max-message-size big", "--max-message-size"),
    ("max-message-size-1e300", "--max-message-size 1e300", "--max-message-size"),
    ("small-size-inf", "--small-size inf", "--small-size"),
    ("small-size-negative", "--small-size -5", "--small-size"),
    ("small-size-out-of-range", "--small-size 2KB", "--small-size"),
    ("medium-size-out-of-range", "--medium-size 10B", "--medium-size"),
    ("large-size-20mb", "--large-size 20MB", "--large-size"),
    ("large-size-nan", "--large-size nan", "--large-size"),
    ("large-size-1e12", "--large-size 1e12 --chunk-size 1MB", "--large-size"),
    ("runs-zero", "--runs 0", "--runs"),
    ("runs-negative", "--runs -1", "--runs"),
    ("runs-huge", "--runs 10000000000", "--runs"),
    ("runs-float", "--runs 2.5", "--runs"),
    ("ps-zero", "--ps 0", "--ps"),
    ("ps-1000", "--ps 1000", "--ps"),
    ("workers-1000", "--workers 1000", "--workers"),
    ("workers-negative", "--workers -2", "--workers"),
    ("procs-per-server-zero", "--procs-per-server 0", "--procs-per-server"),
    ("procs-per-server-1000", "--procs-per-server 1000", "--procs-per-server"),
    ("procs-per-server-float", "--procs-per-server 1.5", "--procs-per-server"),
    (
        "procs-per-server-with-target",
        "--procs-per-server 2 --target 127.0.0.1:1",
        "--procs-per-server",
    ),
    ("procs-per-worker-zero", "--procs-per-worker 0", "--procs-per-worker"),
    ("procs-per-worker-negative", "--procs-per-worker -1", "--procs-per-worker"),
    ("procs-per-worker-1000", "--procs-per-worker 1000", "--procs-per-worker"),
    ("procs-per-worker-float", "--procs-per-worker 1.5", "--procs-per-worker"),
    ("procs-per-worker-word", "--procs-per-worker many", "--procs-per-worker"),
    (
        "procs-per-worker-times-workers",
        "--benchmark ps-throughput --workers 8 --procs-per-worker 9",
        "--procs-per-worker",
    ),
    (
        "procs-per-worker-with-rate",
        "--benchmark ps-throughput --pacing rate --rate 10 --procs-per-worker 2",
        "--procs-per-worker",
    ),
    ("buffers-zero", "--buffers 0", "--buffers"),
    ("buffers-1e9", "--buffers 1000000000", "--buffers"),
    ("payloads-zero", "--payloads 0", "--payloads"),
    ("payloads-100000", "--payloads 100000", "--payloads"),
    ("buffers-times-payloads", "--buffers 10000 --payloads 1000", "--buffers"),
    (
        "payload-over-message-limit",
        "--buffers 10000 --categories large --large-size 10MB",
        "--max-message-size",
    ),
    (
        "chunks-too-many",
        "--buffers 2000 --categories large --large-size 10MB --max-message-size 2047MB "
        "--chunk-size 1KB",
        "--chunk-size",
    ),
    (
        "in-flight-over-memory",
        "--benchmark ps-throughput --buffers 200 --categories large --large-size 10MB "
        "--max-message-size 2047MB --ps 64 --workers 64",
        "memory",
    ),
    ("categories-unknown", "--categories tiny", "--categories"),
    ("categories-empty", "--categories ,", "--categories"),
    ("generator-unknown", "--generator zipf", "--generator"),
    ("skew-bias-without-skew", "--skew-bias large", "--skew-bias"),
    ("seed-negative", "--seed -1", "--seed"),
    ("rate-inf", "--pacing rate --rate inf", "--rate"),
    ("rate-nan", "--pacing rate --rate nan", "--rate"),
    ("rate-zero", "--pacing rate --rate 0", "--rate"),
    ("rate-without-pacing", "--rate 5", "--rate"),
    ("pacing-rate-without-rate", "--pacing rate", "--rate"),
    ("pacing-recorded-synthetic", "--pacing recorded", "--pacing recorded"),
    ("pacing-dependencies-synthetic", "--pacing dependencies", "--pacing dependencies"),
    ("speedup-without-recorded", "--speedup 2", "--speedup"),
    ("steps-synthetic", "--steps 3", "--steps"),
    ("passes-synthetic", "--passes 2", "--passes"),
    ("outstanding-zero", "--outstanding 0", "--outstanding"),
    ("outstanding-huge", "--outstanding 100000", "--outstanding"),
    ("channels-zero", "--channels 0", "--channels"),
    ("channels-1000", "--channels 1000", "--channels"),
    ("compression-unknown", "--compression lz4", "--compression"),
    ("keepalive-negative", "--keepalive-ms -1", "--keepalive-ms"),
    ("keepalive-huge", "--keepalive-ms 99999999999", "--keepalive-ms"),
    ("keepalive-timeout-zero", "--keepalive-timeout-ms 0", "--keepalive-timeout-ms"),
    ("rpc-unknown", "--rpc datagram", "--rpc"),
    ("rpc-streaming-too-many-channels", "--rpc streaming --channels 70", "--channels"),
    ("benchmark-unknown", "--benchmark p2p-everything", "--benchmark"),
    ("target-no-port", "--target nowhere", "--target"),
    ("target-port-too-big", "--target localhost:99999", "--target"),
    ("target-unbalanced-brackets", "--target [::1:80", "--target"),
    ("target-only-commas", "--target ,", "--target"),
    ("mode-unknown", "--mode fast", "--mode"),
    ("output-dir-is-a-file", "--output-dir {file}", "{file}"),
    ("output-dir-read-only", "--output-dir /proc/tfgb-runs", "/proc"),
    (
        "output-dir-checked-before-connecting",
        "--output-dir {file} --target 127.0.0.1:{free_port} --connect-timeout 0.5",
        "{file}",
    ),
]

# A shipped trace's ps-throughput replay against as many targets as it has servers
# (2 ps tasks, 2 stand-ins); nothing listens there, and nothing gets that far.
_FOUR_TARGETS = "resnet50-tf2ps --benchmark ps-throughput --target " + ",".join(
    ["127.0.0.1:{free_port}"] * 4
)

# Trace replays: damaged and hostile traces, and flags that do not fit a trace.
_TRACE = [
    ("trace-missing", "{dir}/missing.tfgbtrace", USAGE, "missing.tfgbtrace"),
    ("trace-unknown-name", "no-such-shipped-trace", USAGE, "no-such-shipped-trace"),
    ("trace-empty", "{empty}", USAGE, "{empty}"),
    ("trace-truncated", "{truncated}", USAGE, "{truncated}"),
    ("trace-bit-flipped", "{corrupt}", USAGE, "{corrupt}"),
    ("trace-not-a-trace", "{text}", USAGE, "{text}"),
    ("trace-a-directory", "{dir}", USAGE, "{dir}"),
    ("trace-future-version", "{future}", USAGE, "format_version"),
    ("trace-decompression-bomb", "{bomb}", USAGE, "decompresses to more than"),
    ("trace-and-synthetic", "{trace} --synthetic", USAGE, "--synthetic"),
    ("trace-duration-and-steps", "{trace} --duration 10 --steps 2", USAGE, "--steps"),
    ("trace-steps-and-passes", "{trace} --steps 2 --passes 2", USAGE, "--passes"),
    ("trace-steps-zero", "{trace} --steps 0", USAGE, "--steps"),
    ("trace-passes-zero", "{trace} --passes 0", USAGE, "--passes"),
    ("trace-passes-huge", "{trace} --passes 10000000000", USAGE, "--passes"),
    ("trace-generator", "{trace} --generator skew", USAGE, "--generator"),
    ("trace-buffers", "{trace} --buffers 5", USAGE, "--buffers"),
    ("trace-rpc-streaming", "{trace} --rpc streaming", USAGE, "--rpc"),
    ("trace-compute-word", "{trace} --benchmark ps-throughput --compute fast", USAGE, "--compute"),
    (
        "trace-compute-negative",
        "{trace} --benchmark ps-throughput --compute -1",
        USAGE,
        "--compute",
    ),
    ("trace-compute-huge", "{trace} --benchmark ps-throughput --compute 1000", USAGE, "--compute"),
    ("trace-compute-with-asap", "{trace} --pacing asap --compute none", USAGE, "--compute"),
    ("trace-compute-here-with-asap", "{trace} --pacing asap --compute here", USAGE, "--compute"),
    (
        "trace-compute-here-uncalibrated",
        "{trace} --benchmark ps-throughput --compute here",
        USAGE,
        "no compute calibration",
    ),
    (
        "trace-calibration-malformed",
        "{miscalibrated} --benchmark ps-throughput",
        USAGE,
        "calibration_step_ns='fast'",
    ),
    ("trace-speedup-inf", "{trace} --pacing recorded --speedup inf", USAGE, "--speedup"),
    ("trace-speedup-zero", "{trace} --pacing recorded --speedup 0", USAGE, "--speedup"),
    ("trace-speedup-nan", "{trace} --pacing recorded --speedup nan", USAGE, "--speedup"),
    ("trace-rate-inf", "{trace} --pacing rate --rate inf", USAGE, "--rate"),
    ("trace-pair-unknown-task", "{trace} --pair worker:9,ps:0", USAGE, "worker:9"),
    ("trace-pair-nonsense", "{trace} --pair nonsense", USAGE, "--pair"),
    (
        "trace-terabyte-messages-chunked",
        "{huge} --benchmark p2p-latency --chunk-size 64KB",
        USAGE,
        "--chunk-size",
    ),
    ("trace-terabyte-messages", "{huge} --benchmark p2p-latency", USAGE, "--max-message-size"),
    (
        "trace-messages-in-flight-over-memory",
        "{wide} --benchmark p2p-bandwidth --outstanding 200",
        USAGE,
        "in flight",
    ),
    (
        "trace-client-netns-without-target",
        "resnet50-tf2ps --benchmark ps-throughput --client-netns ps=tfgb-x",
        USAGE,
        "--client-netns",
    ),
    ("trace-client-netns-nonsense", f"{_FOUR_TARGETS} --client-netns ps", USAGE, "--client-netns"),
    ("trace-client-netns-twice", f"{_FOUR_TARGETS} --client-netns ps=a,ps=b", USAGE, "twice"),
    ("trace-client-netns-unknown-job", f"{_FOUR_TARGETS} --client-netns boss=x", USAGE, "boss"),
    (
        "trace-client-netns-missing-namespace",
        f"{_FOUR_TARGETS} --client-netns ps=tfgb-none",
        NETWORK,
        "tfgb-none",
    ),
    ("trace-too-many-workers", "{crowd} --benchmark ps-throughput", USAGE, "workers"),
    ("trace-too-many-ps", "{farm} --benchmark p2p-latency", USAGE, "ps servers"),
    (
        "trace-unreachable-target",
        "{trace} --benchmark p2p-latency --target 127.0.0.1:{free_port} --connect-timeout 0.5",
        TRANSPORT,
        "no replay server",
    ),
]

_SERVE = [
    ("serve-400-servers", "--servers 400 --port 52000", USAGE, "--servers"),
    ("serve-zero-servers", "--servers 0", USAGE, "--servers"),
    ("serve-zero-procs-per-server", "--procs-per-server 0", USAGE, "--procs-per-server"),
    ("serve-procs-per-server-negative", "--procs-per-server -1", USAGE, "--procs-per-server"),
    ("serve-procs-per-server-word", "--procs-per-server two", USAGE, "--procs-per-server"),
    (
        "serve-servers-times-procs",
        "--servers 8 --port 52000 --procs-per-server 9",
        USAGE,
        "--procs-per-server",
    ),
    ("serve-port-too-big", "--port 70000", USAGE, "--port"),
    ("serve-port-negative", "--port -1", USAGE, "--port"),
    ("serve-several-on-port-0", "--servers 2 --port 0", USAGE, "--port"),
    ("serve-ports-past-65535", "--servers 2 --port 65535", USAGE, "65535"),
    ("serve-port-in-use", "--host 127.0.0.1 --port {busy_port}", TRANSPORT, "{busy_port}"),
    ("serve-max-message-size-inf", "--max-message-size inf", USAGE, "--max-message-size"),
    ("serve-chunk-size-nan", "--chunk-size nan", USAGE, "--chunk-size"),
    ("serve-keepalive-negative", "--keepalive-ms -1", USAGE, "--keepalive-ms"),
    ("serve-mode-unknown", "--mode fast", USAGE, "--mode"),
    ("serve-channels-zero", "--channels 0", USAGE, "--channels"),
    ("serve-port-word", "--port http", USAGE, "--port"),
]

_INSPECT = [
    ("inspect-missing", "{dir}/missing.tfgbtrace", USAGE, "missing.tfgbtrace"),
    ("inspect-not-a-trace", "{text}", USAGE, "{text}"),
    ("inspect-bomb", "{bomb}", USAGE, "decompresses to more than"),
    ("inspect-truncated", "{truncated}", USAGE, "{truncated}"),
]

_CAPTURE = [
    ("capture-model-unknown", "--model nonsense", USAGE, "nonsense"),
    ("capture-setup-unknown", "--setup tf3", USAGE, "--setup"),
    ("capture-too-many-ps", "--ps 100", USAGE, "too many"),
    ("capture-no-workers", "--workers 0", USAGE, "worker"),
    ("capture-steps-zero", "--steps 0", USAGE, "steps"),
    ("capture-steps-huge", "--steps 99999999", USAGE, "--steps"),
    ("capture-batch-zero", "--batch-size 0", USAGE, "batch"),
    ("capture-batch-word", "--batch-size many", USAGE, "--batch-size"),
    ("capture-timeout-inf", "--timeout inf", USAGE, "--timeout"),
    ("capture-timeout-negative", "--timeout -1", USAGE, "--timeout"),
    ("capture-step-timeout-nan", "--step-timeout nan", USAGE, "--step-timeout"),
    ("capture-output-a-directory", "--model tiny -o {dir}", USAGE, "{dir}"),
    ("capture-output-read-only", "--model tiny -o /proc/tfgb/t.tfgbtrace", USAGE, "/proc"),
    (
        "capture-workdir-a-file",
        "--model tiny -o {dir}/t.tfgbtrace --workdir {file}",
        CAPTURE,
        "{file}",
    ),
    ("capture-layout-without-network", "--layout one-per-host", USAGE, "--layout"),
    ("capture-network-unknown", "--network 5furlongs", USAGE, "5furlongs"),
    ("capture-recorder-unknown", "--recorder tcpdump", USAGE, "--recorder"),
    ("capture-keras-unknown", "--keras jax", USAGE, "--keras"),
    ("capture-input-size-tiny", "--model inceptionv3 --input-size 8", USAGE, "input"),
]

_CLUSTER = json.dumps(
    {"ps": ["localhost:{free_port}"], "worker": ["localhost:{free_port2}"]}, separators=(",", ":")
)
_CAPTURE_JOB = [
    ("capture-job-no-cluster", "-- true", USAGE, "--cluster"),
    ("capture-job-cluster-not-json", "--cluster nonsense -- true", USAGE, "not JSON"),
    ("capture-job-cluster-wrong-shape", '--cluster {"ps":"x"} -- true', USAGE, "cluster"),
    ("capture-job-cluster-file-missing", "--cluster @{dir}/none.json -- true", USAGE, "none.json"),
    ("capture-job-no-command", f"--cluster {_CLUSTER}", USAGE, "no command"),
    (
        "capture-job-address-twice",
        '--cluster {"ps":["localhost:2222"],"worker":["localhost:2222"]} -- true',
        USAGE,
        "twice",
    ),
    ("capture-job-not-host-port", '--cluster {"ps":["localhost"]} -- true', USAGE, "host:port"),
    ("capture-job-too-many-tasks", "--cluster {crowd_cluster} -- true", USAGE, "too many"),
    (
        "capture-job-another-machine",
        '--cluster {"ps":["192.0.2.10:2222"]} -- true',
        USAGE,
        "not an address of this machine",
    ),
    ("capture-job-driver-unknown", f"--cluster {_CLUSTER} --driver chief -- true", USAGE, "chief"),
    ("capture-job-timeout-inf", f"--cluster {_CLUSTER} --timeout inf -- true", USAGE, "--timeout"),
    ("capture-job-output-a-directory", f"--cluster {_CLUSTER} -o {{dir}} -- true", USAGE, "{dir}"),
    (
        "capture-job-warmup-negative",
        f"--cluster {_CLUSTER} --warmup-steps -1 -- true",
        USAGE,
        "--warmup-steps",
    ),
    ("capture-job-batch-word", f"--cluster {_CLUSTER} --batch-size abc -- true", USAGE, "--batch"),
]

_ROLE_CLUSTER = json.dumps(
    {"ps": ["localhost:{free_port}"], "worker": ["localhost:{free_port2}"]}, separators=(",", ":")
)
_ROLE = [
    ("role-no-placement", "--synthetic", USAGE, "TF_CONFIG"),
    ("role-target", f"--cluster {_ROLE_CLUSTER} --task ps:0 --target x:1", USAGE, "--target"),
    (
        "role-client-netns",
        f"--cluster {_ROLE_CLUSTER} --task ps:0 --client-netns ps=x",
        USAGE,
        "--client-netns",
    ),
    (
        "role-job-timeout-inf",
        f"--cluster {_ROLE_CLUSTER} --task ps:0 --job-timeout inf",
        USAGE,
        "--job-timeout",
    ),
    (
        "role-job-timeout-zero",
        f"--cluster {_ROLE_CLUSTER} --task ps:0 --job-timeout 0",
        USAGE,
        "--job-timeout",
    ),
    ("role-cluster-not-json", "--cluster {{ --task ps:0", USAGE, "--cluster"),
    ("role-task-nonsense", f"--cluster {_ROLE_CLUSTER} --task boss", USAGE, "--task"),
    ("role-task-not-in-cluster", f"--cluster {_ROLE_CLUSTER} --task worker:5", USAGE, "--task"),
    (
        "role-ps-checks-runs",
        f"--cluster {_ROLE_CLUSTER} --task ps:0 --synthetic --runs 0 --job-timeout 2",
        USAGE,
        "--runs",
    ),
    (
        "role-cluster-too-small",
        f"--cluster {_ROLE_CLUSTER} --task worker:0 --synthetic --ps 3 --job-timeout 2",
        USAGE,
        "the cluster has 1",
    ),
    (
        "role-duration-inf",
        f"--cluster {_ROLE_CLUSTER} --task worker:0 --synthetic --duration inf",
        USAGE,
        "--duration",
    ),
]

_NETWORK = [
    ("network-subnet-everything", "up --subnet 0.0.0.0/0", NETWORK, "--subnet"),
    ("network-subnet-public", "up --subnet 8.8.8.0/24", NETWORK, "--subnet"),
    ("network-subnet-nonsense", "up --subnet banana", NETWORK, "--subnet"),
    ("network-subnet-too-small", "up --subnet 10.0.0.0/30 --hosts 3", NETWORK, "--subnet"),
    ("network-one-host", "up --hosts 1", NETWORK, "--hosts"),
    ("network-1000-hosts", "up --hosts 1000", NETWORK, "--hosts"),
    ("network-profile-unknown", "up --profile 5furlongs", NETWORK, "5furlongs"),
    ("network-down-bad-id", "down ../../etc", NETWORK, "RUN_ID"),
    ("network-no-subcommand", "", USAGE, "SUBCOMMAND"),
    ("network-compare-profiles", "compare --profiles warp", NETWORK, "warp"),
    ("network-compare-target", "compare --target x:1", USAGE, "--target"),
    ("network-compare-client-netns", "compare --client-netns ps=x", USAGE, "--client-netns"),
    ("network-compare-duration-inf", "compare --synthetic --duration inf", USAGE, "--duration"),
]

_TIMELINE = [
    ("timeline-missing", "{dir}/missing.tfgbtrace", USAGE, "missing.tfgbtrace"),
    ("timeline-not-a-trace", "{text}", USAGE, "{text}"),
    ("timeline-steps-zero", "{trace} --steps 0", USAGE, "--steps"),
    ("timeline-steps-word", "{trace} --steps many", USAGE, "--steps"),
    ("timeline-run-of-a-trace", "{trace} --run 1", USAGE, "--run"),
    ("timeline-folder-without-results", "{dir}", USAGE, "results.json"),
    ("timeline-results-missing", "{dir}/results.json", USAGE, "no such result file"),
]

_EXPORT = [
    ("export-a-trace", "{trace} --csv tables", USAGE, "RUN"),
    ("export-without-csv", "{dir}", USAGE, "--csv"),
    ("export-folder-without-results", "{dir} --csv tables", USAGE, "results.json"),
    ("export-results-missing", "{dir}/results.json --csv tables", USAGE, "no such result file"),
]

CASES = [
    *(_case(f"replay-{n}", f"replay --synthetic {a}", USAGE, c) for n, a, c in _SYNTHETIC),
    *(_case(f"replay-{n}", f"replay {a}", code, c) for n, a, code, c in _TRACE),
    *(_case(n, f"serve {a}", code, c) for n, a, code, c in _SERVE),
    *(_case(n, f"inspect {a}", code, c) for n, a, code, c in _INSPECT),
    *(_case(n, f"capture {a}", code, c) for n, a, code, c in _CAPTURE),
    *(_case(n, f"capture-job {a}", code, c) for n, a, code, c in _CAPTURE_JOB),
    *(_case(n, f"role {a}", code, c) for n, a, code, c in _ROLE),
    *(_case(n, f"network {a}", code, c) for n, a, code, c in _NETWORK),
    *(_case(n, f"timeline {a}", code, c) for n, a, code, c in _TIMELINE),
    *(_case(n, f"export {a}", code, c) for n, a, code, c in _EXPORT),
    _case("unknown-command", "teleport", USAGE, "teleport"),
    _case("unknown-flag", "replay --synthetic --turbo", USAGE, "--turbo"),
]


def test_the_corpus_covers_every_subcommand_with_at_least_100_cases() -> None:
    assert len(CASES) >= 100
    assert len({case.name for case in CASES}) == len(CASES)
    commands = {case.argv[0] for case in CASES}
    assert commands >= {
        "replay", "serve", "inspect", "capture", "capture-job", "role", "network", "timeline",
        "export",
    }  # fmt: skip


# --------------------------------------------------------------------------
# The inputs the cases name.


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _bomb(path: Path) -> None:
    """A valid-looking trace of a few hundred KB that decompresses past the limit."""
    compressor = zlib.compressobj(9)
    block = bytes(16 << 20)
    with path.open("wb") as stream:
        stream.write(trace_format.MAGIC)
        for _ in range(MAX_TRACE_BYTES // len(block) + 1):
            stream.write(compressor.compress(block))
        stream.write(compressor.flush())


def _future(path: Path) -> None:
    message = trace_format.trace_to_proto(make_trace())
    message.format_version = 99
    path.write_bytes(trace_format.MAGIC + zlib.compress(message.SerializeToString()))


def _bit_flipped(path: Path) -> None:
    _trace_with(path)
    data = path.read_bytes()
    path.write_bytes(data[:20] + bytes(b ^ 0xFF for b in data[20:40]) + data[40:])


def _trace_with(path: Path, **shape: object) -> None:
    trace_files.write_trace(make_trace(**shape), path)  # type: ignore[arg-type]


def _miscalibrated(path: Path) -> None:
    """A trace from another machine whose compute calibration is not a number."""
    trace = make_trace(steps=2)
    extra = (("calibration_step_ns", "fast"), ("calibration_workload", "tiny 8x8 batch 4 keras"))
    metadata = dataclasses.replace(trace.metadata, extra=(("cpu_model", "Other CPU"), *extra))
    trace_files.write_trace(dataclasses.replace(trace, metadata=metadata), path)


#: Placeholder -> how to make it under the case's directory (files are made outside the
#: working directory, so that "nothing left behind" sees only what the command makes).
_MAKERS: dict[str, Callable[[Path], object]] = {
    "trace": lambda p: _trace_with(p, steps=2),
    "miscalibrated": _miscalibrated,
    "empty": lambda p: p.write_bytes(b""),
    "truncated": lambda p: p.write_bytes(trace_format.MAGIC + b"\x78\x9c\x01"),
    "corrupt": lambda p: _bit_flipped(p),
    "text": lambda p: p.write_text("hello, not a trace\n"),
    "future": _future,
    "bomb": _bomb,
    # 10**12-byte tensors: past any message limit, and chunks past counting.
    "huge": lambda p: _trace_with(p, steps=1, sizes=(10**12,)),
    # 200 distinct 2 GB tensors in one step: 400 GB in flight with --outstanding 200.
    "wide": lambda p: _trace_with(p, steps=1, sizes=tuple(2_000_000_000 - i for i in range(200))),
    "crowd": lambda p: _trace_with(p, steps=1, workers=100, sizes=(21,)),
    "farm": lambda p: _trace_with(p, steps=1, ps=100, sizes=(21,)),
    "file": lambda p: p.write_text("a file where a folder is expected\n"),
    "dir": lambda p: p.mkdir(),
}


@pytest.fixture(scope="module")
def materials(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("materials")
    made: dict[str, str] = {}
    for name, make in _MAKERS.items():
        path = folder / (name if name == "dir" else f"{name}.tfgbtrace")
        make(path)
        made[name] = str(path)
    made["crowd_cluster"] = json.dumps(
        {"worker": [f"localhost:{20000 + i}" for i in range(40)]}, separators=(",", ":")
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        made["busy_port"] = str(busy.getsockname()[1])
        made["free_port"] = str(_free_port())
        made["free_port2"] = str(_free_port())
        yield made


def _filled(text: str, materials: dict[str, str]) -> str:
    for name, value in materials.items():
        text = text.replace(f"{{{name}}}", value)
    return text


# --------------------------------------------------------------------------
# Nothing left behind: files, child processes, listening sockets.


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                found.add(int(entry.name))
    return found


def _listening_inodes() -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        inodes |= {line.split()[9] for line in lines if line.split()[3] == "0A"}
    return inodes


def _my_listening_sockets() -> set[str]:
    listening = _listening_inodes()
    mine = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in listening:
            mine.add(target)
    return mine


def _files(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_is_one_line_naming_the_culprit_and_leaves_nothing_behind(
    case: Case,
    materials: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    argv = [_filled(argument, materials) for argument in case.argv]
    culprit = _filled(case.culprit, materials)
    before = (_files(tmp_path), _children(), _my_listening_sockets())
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert code == case.code, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert culprit in err, err
    assert "Traceback" not in err
    assert (_files(tmp_path), _children(), _my_listening_sockets()) == before
