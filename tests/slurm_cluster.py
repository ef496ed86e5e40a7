"""A real single-node Slurm cluster of the tests' own: munged, slurmctld and slurmd in a temporary directory.

Debian's ``slurm-wlm`` and ``munge``, as root, everything on loopback
(``NoInAddrAny``, ``NodeAddr=127.0.0.1``, ports picked free), no cgroups
(``proctrack/linuxproc``, ``task/none``), no accounting. The node declares
``CPUS`` CPUs whatever the machine has (``SlurmdParameters=config_overrides``),
so a world of 4 fits on 2 cores. Client commands and pgnb's launcher find it
through ``SLURM_CONF`` (the caller puts it in the environment). Every daemon
is stopped by the pid it wrote, and the directory removed.

Used by tests/test_slurm.py and by the ``slurm_cold`` benchmark case.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from pgnb.procs.processes import process_running as _running  # a zombie (init need not reap) is gone

DAEMONS = ("munged", "slurmctld", "slurmd")
CPUS = 8
PARTITION = "debug"
#: What a run without the Debian packages is told (one line).
MISSING = "needs root and Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)"


def available() -> bool:
    """Whether a cluster can be started here: root, and the daemons and client commands installed."""
    tools = (*DAEMONS, "sbatch", "squeue", "scancel", "srun")
    return os.geteuid() == 0 and all(shutil.which(t) or os.path.exists(f"/usr/sbin/{t}") for t in tools)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


SLURM_CONF = """\
ClusterName=pgnbtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
MinJobAge=120
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={partition} Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """``SlurmCluster().start()``; ``.conf`` is its slurm.conf, ``.env`` what a client needs; ``.stop()``."""

    def __init__(self) -> None:
        # munged wants every directory above its socket searchable by all: not a 0700 pytest tmp_path
        self.dir = tempfile.mkdtemp(prefix="pgnb-slurm-")
        os.chmod(self.dir, 0o711)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = {"SLURM_CONF": self.conf}

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def start(self, timeout: float = 20.0) -> SlurmCluster:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        for sub in ("state", "spool"):
            os.mkdir(self._path(sub), 0o700)
        key = self._path("munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(os.urandom(1024))
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(dir=self.dir, ctld_port=_free_port(), slurmd_port=_free_port(),
                                      cpus=CPUS, partition=PARTITION))
        env = {**os.environ, **self.env}
        subprocess.run([_daemon("munged"), f"--socket={self._path('munge.sock')}", f"--key-file={key}",
                        f"--log-file={self._path('munged.log')}", f"--pid-file={self._path('munged.pid')}",
                        f"--seed-file={self._path('munged.seed')}", "--num-threads=2"],
                       check=True, capture_output=True, timeout=10)
        # each daemon forks into the background and writes its pid file; -i: no state from before
        subprocess.run([_daemon("slurmctld"), "-i", "-f", self.conf], env=env, check=True,
                       capture_output=True, timeout=10)
        subprocess.run([_daemon("slurmd"), "-N", "localhost", "-f", self.conf], env=env, check=True,
                       capture_output=True, timeout=10)
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=10)
            if out.stdout.strip() == "idle":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test Slurm node is not idle after {timeout:g} s: "
                                   f"{out.stdout.strip() or out.stderr.strip()}; see {self.dir}")
            time.sleep(0.1)

    def pids(self) -> dict[str, int]:
        """Each daemon's pid, as its pid file says (those that wrote one)."""
        out = {}
        for name in DAEMONS:
            try:
                with open(self._path(f"{name}.pid")) as f:
                    out[name] = int(f.read().strip())
            except (OSError, ValueError):
                pass
        return out

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (``sbatch``, ``squeue``, ``scancel``, ...)."""
        return subprocess.run(list(cmd), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=30)

    def log(self) -> str:
        """What slurmctld has logged so far (every RPC it served: submissions, cancels, ...)."""
        with open(self._path("slurmctld.log"), errors="replace") as f:
            return f.read()

    def jobs(self) -> list[str]:
        """The jobs still pending, running or completing: ``"ID STATE"`` each."""
        out = self.run("squeue", "-h", "-o", "%i %T")
        return out.stdout.split("\n")[:-1] if out.returncode == 0 else [f"squeue failed: {out.stderr.strip()}"]

    def stop(self) -> None:
        """Every job cancelled, then every daemon stopped by pid (slurmd first, munged last); the directory removed."""
        pids = self.pids()
        if "slurmctld" in pids and _running(pids["slurmctld"]):
            self.run("scancel", "-u", "root")  # every job of this cluster (its own SLURM_CONF)
            deadline = time.monotonic() + 5
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.1)
        for name in reversed(DAEMONS):
            pid = pids.get(name)
            if pid is None or not _running(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 3
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

