"""A real single-machine Slurm for the tests: Debian's munge, slurmctld and slurmd.

The daemons are started from a temporary directory with a configuration of
their own (their own ports, state and spool directories, a munge socket and key
of their own), so nothing of the machine's Slurm, if it has one, is used or
touched.  The one node is ``localhost`` (address 127.0.0.1), so every address a
job step's tasks compute from Slurm's node list is on loopback.  It has more CPU
slots than this machine's cores (``CPUs=8``, which ``config_overrides`` lets
slurmd accept), so a 5-task step fits on 2 cores.

Every process the daemons start carries ``MARKER`` in its environment (slurmd
passes its own to slurmstepd; ``srun`` passes the caller's to the tasks), so
that ``leftover_processes`` finds any that outlived the job.  Needs root (the
daemons run as root, ``SlurmUser=root``) and Debian's packages, which
``ensure_installed`` installs with apt-get when they are missing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: Programs the tests run, and the Debian packages that bring them.
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sinfo")
PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
#: Environment variable that tags every process of the test's Slurm.
MARKER = "TF_GRPC_BENCH_SLURM_TEST"
#: Guards against a hang only; nothing is timed.
STARTUP_LIMIT_S = 120.0
STOP_LIMIT_S = 30.0
#: A job in one of these states has ended (``scontrol show job``'s JobState).
JOB_ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
     "BOOT_FAIL", "DEADLINE"}
)  # fmt: skip


def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if shutil.which(name) is None]


def _apt_get(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", *arguments],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def ensure_installed() -> str:
    """Installs Debian's Slurm packages if missing; returns why that was impossible ("" if ok)."""
    if not missing_programs():
        return ""
    if os.geteuid() != 0:
        return f"needs root to install {' '.join(PACKAGES)} (missing: {missing_programs()})"
    if shutil.which("apt-get") is None:
        return f"no apt-get to install {' '.join(PACKAGES)} (missing: {missing_programs()})"
    install = ("install", "-y", "-q", "--no-install-recommends", *PACKAGES)
    result = _apt_get(*install)
    if result.returncode != 0:
        _apt_get("update", "-q")
        result = _apt_get(*install)
    if result.returncode != 0 or missing_programs():
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        return f"apt-get install {' '.join(PACKAGES)} failed: {last}"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(count: int) -> int:
    """A first port P with P..P+count-1 all free on loopback (for ``--port-base``)."""
    for _ in range(100):
        base = 20_000 + secrets.randbelow(30_000)
        sockets = []
        try:
            for offset in range(count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("0.0.0.0", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no block of {count} free ports found")


def _configuration(root: Path, cluster_name: str) -> str:
    return "\n".join(
        [
            f"ClusterName={cluster_name}",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root / 'munge' / 'socket'}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN",
            "PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:8",
            "",
        ]
    )


class Slurm:
    """A running test Slurm: ``environment`` is what ``srun`` and ``sinfo`` need."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster_name = f"tfgb{secrets.token_hex(4)}"
        self.config = root / "slurm.conf"
        self.environment = {**os.environ, "SLURM_CONF": str(self.config), MARKER: str(root)}
        self.processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *command: str) -> None:
        log = (self.root / f"{name}.out").open("wb")
        with log:
            self.processes.append(
                subprocess.Popen(
                    list(command),
                    env=self.environment,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def start(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        for name in ("state", "spool"):
            (self.root / name).mkdir()
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self.root.chmod(0o711)  # munged wants its socket's directories searchable by all
        socket_path = munge / "socket"
        self._start(
            "munged",
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'seed'}",
            f"--log-file={munge / 'munged.log'}",
        )
        self._wait_for("munged's socket", socket_path.exists)
        self.config.write_text(_configuration(self.root, self.cluster_name))
        self._start("slurmctld", "slurmctld", "-D", "-f", str(self.config))
        self._start("slurmd", "slurmd", "-D", "-f", str(self.config), "-N", "localhost")
        self._wait_for("the node to be idle", self._node_idle)

    def _node_idle(self) -> bool:
        result = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"],
            env=self.environment,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        return result.returncode == 0 and result.stdout.strip() == "idle"

    def _wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while not ready():
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a daemon exited ({process.args!r}): {self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"waiting for {what}: {self.logs()}")
            time.sleep(0.2)

    def batch(
        self, arguments: list[str], environment: dict[str, str], limit_s: float
    ) -> subprocess.CompletedProcess[str]:
        """``sbatch ARGUMENTS`` as a user submits it, waited for until the job ends.

        What ``sbatch --wait`` does, but asking twice a second: ``--wait`` asks at
        growing intervals (2, 4, 8 s, ...), which put about 25 s after a 17 s job.
        ``returncode`` is 0 when the job COMPLETED with exit code 0:0; ``stdout``
        holds sbatch's output and the job's last ``scontrol`` record.
        """
        submitted = subprocess.run(
            ["sbatch", "--parsable", *arguments],
            env=environment, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if submitted.returncode != 0:
            return submitted
        job = submitted.stdout.strip().split(";")[0]
        deadline = time.monotonic() + limit_s
        record = ""
        while time.monotonic() < deadline:
            shown = subprocess.run(
                ["scontrol", "--oneliner", "show", "job", job],
                env=environment, capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            record = shown.stdout.strip()
            fields = dict(f.split("=", 1) for f in record.split() if "=" in f)
            if fields.get("JobState", "") in JOB_ENDED:
                ok = fields["JobState"] == "COMPLETED" and fields.get("ExitCode") == "0:0"
                return subprocess.CompletedProcess(
                    submitted.args, 0 if ok else 1, submitted.stdout + record, submitted.stderr
                )
            time.sleep(0.5)
        raise subprocess.TimeoutExpired(submitted.args, limit_s, output=record)

    def logs(self) -> str:
        texts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")):
            with contextlib.suppress(OSError):
                texts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(texts)

    def stop(self) -> None:
        """Stops the daemons it started, by pid, slurmd first."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def tagged_pids(root: Path) -> dict[int, str]:
    """pid -> command line of every live (not zombie) process tagged with this Slurm's marker:
    the daemons (slurmctld's helper slurmscriptd too), slurmstepd and the steps' tasks."""
    tag = f"{MARKER}={root}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if tag in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if "\nState:\tZ" not in (entry / "status").read_text():
                    found[int(entry.name)] = command.strip()
    return found


def leftover_processes(root: Path, *, besides: frozenset[int] = frozenset()) -> list[str]:
    """``pid command`` of every tagged process but ``besides``."""
    return [f"{pid} {command}" for pid, command in tagged_pids(root).items() if pid not in besides]


def wait_for_no_leftovers(root: Path, *, besides: frozenset[int]) -> list[str]:
    """The tagged processes still alive once they had time to exit (slurmstepd ends
    shortly after its tasks)."""
    deadline = time.monotonic() + STOP_LIMIT_S
    while (left := leftover_processes(root, besides=besides)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@contextlib.contextmanager
def running_slurm(root: Path) -> Iterator[Slurm]:
    slurm = Slurm(root)
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()
