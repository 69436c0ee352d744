"""A real single-node Slurm cluster on this machine (Debian's ``slurm-wlm`` and ``munge``).

``SlurmCluster`` starts, in the foreground and in a new session each, ``munged`` with a generated
key, ``slurmctld`` and ``slurmd`` with a generated ``slurm.conf``: free high ports, every state,
spool, pid and log file under a temporary directory, the machine's short host name as the one
node (``NodeAddr=127.0.0.1``), ``proctrack/linuxproc``, ``task/none``, ``select/cons_tres``,
``auth/munge`` through the cluster's own munge socket, no accounting. It waits (polling ``sinfo``,
with a timeout) until the node is idle. Nothing of ``/etc/slurm``, ``/etc/munge`` or ``/run/munge``
is read or written: every client command finds the cluster through ``SLURM_CONF``.

Fixtures:
- ``slurm_cluster``: the session's cluster (skips with a reason where Slurm is absent or this
  user cannot run ``slurmd``; fails when CI=true).
- ``slurm_env``: ``SLURM_CONF`` set in this process's environment for one test, so a LocalHost
  agent (and every command it starts) talks to the cluster.
- ``slurm_sshd``: an sshd whose sessions get ``SLURM_CONF`` (``SetEnv``), as a login node's
  ``/etc/slurm`` would give them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.waiting import wait_until

if TYPE_CHECKING:  # imported by pytest as a plugin after this one
    from tests.fixtures_sshd import SshdPool, SshdServer

DAEMONS = {
    "munged": "/usr/sbin/munged",
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
}
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")
START_TIMEOUT_S = 60.0


def slurm_missing_reason() -> str | None:
    """Why a Slurm cluster cannot be started here, or None when it can."""
    for name, path in DAEMONS.items():
        if not os.access(path, os.X_OK):
            package = "munge" if name == "munged" else "slurm-wlm"
            return f"{path} not found (install {package})"
    for name in CLIENTS:
        if shutil.which(name) is None:
            return f"{name} not found (install slurm-wlm)"
    if os.getuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


class SlurmCluster:
    """munged + slurmctld + slurmd of one node, in a temporary directory."""

    def __init__(self, base: Path | None = None) -> None:
        reason = slurm_missing_reason()
        if reason:
            raise RuntimeError(reason)
        self.dir = Path(tempfile.mkdtemp(prefix="runwatch-slurm-")) if base is None else base
        self.dir.chmod(0o755)  # munged wants its socket's directory reachable by everyone
        self.node = short_hostname()
        self.partition = "rw"
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        (self.dir / "state").mkdir()
        (self.dir / "spool").mkdir()

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client command of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def log(self, name: str) -> str:
        """The last lines a daemon wrote (for failure messages)."""
        text = ""
        for path in (self.dir / f"{name}.log", self.dir / f"{name}.out"):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace")[-3000:]
        return text

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        from tests.fixtures_sshd import free_port  # a plugin loaded after this one

        self._start_munged()
        for attempt in range(3):
            self._write_conf(free_port(), free_port())
            self._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [DAEMONS["slurmd"], "-D", "-f", str(self.conf)])
            try:
                wait_until(
                    self._node_idle, timeout=START_TIMEOUT_S, what="the Slurm node to be idle"
                )
                return
            except AssertionError as e:
                failure = f"{e}\nslurmctld: {self.log('slurmctld')}\nslurmd: {self.log('slurmd')}"
                self._stop("slurmd")
                self._stop("slurmctld")
                if attempt == 2:
                    raise RuntimeError(f"the Slurm cluster did not start: {failure}") from None

    def _start_munged(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._spawn(
            "munged",
            [
                DAEMONS["munged"],
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.dir / 'munged.pid'}",
                f"--log-file={self.dir / 'munged.log'}",
                f"--seed-file={self.dir / 'munged.seed'}",
            ],
        )
        wait_until(
            lambda: self.munge_socket.exists() or self.procs["munged"].poll() is not None,
            timeout=START_TIMEOUT_S,
            what="munged's socket",
        )
        if self.procs["munged"].poll() is not None:
            raise RuntimeError(f"munged exited: {self.log('munged')}")

    def _write_conf(self, ctld_port: int, slurmd_port: int) -> None:
        d = self.dir
        cpus = os.cpu_count() or 1
        lines = [
            "ClusterName=runwatch",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            # Scheduling passes every second (default 60 s): a job submitted while another one
            # still completes starts as soon as the node is free, not a minute later.
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=300",
            "InactiveLimit=0",
            "MailProg=/bin/true",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=FORCE:4",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.dir / f"{name}.out", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self.env,
                start_new_session=True,
            )

    def _node_idle(self) -> bool:
        for name in ("slurmctld", "slurmd"):
            proc = self.procs[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with status {proc.returncode}")
        return self.node_state() == "idle"

    # ------------------------------------------------------------------ clients

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A client command of this cluster (``sbatch``, ``squeue``...)."""
        return subprocess.run(
            list(argv),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
            stdin=subprocess.DEVNULL,
        )

    def node_state(self) -> str:
        out = self.run("sinfo", "--noheader", "-n", self.node, "-o", "%T", check=False)
        return out.stdout.strip().rstrip("*~#")

    def job_state(self, job_id: str) -> str:
        """``RUNNING``, ``PENDING``, ``COMPLETED``... ('' once Slurm forgot the job)."""
        out = self.run("squeue", "--noheader", "-t", "all", "-j", job_id, "-o", "%T", check=False)
        return out.stdout.strip()

    def jobs(self) -> list[str]:
        """Ids of the jobs not yet finished."""
        out = self.run("squeue", "--noheader", "-o", "%i", check=False)
        return out.stdout.split()

    def cancel_all(self) -> None:
        """Cancel every job and wait until none is left running or completing."""
        jobs = self.jobs()
        if jobs:
            self.run("scancel", *jobs, check=False)
            wait_until(lambda: not self.jobs(), timeout=30.0, what="every Slurm job to end")

    # ------------------------------------------------------------------ stop

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            if "slurmctld" in self.procs and "slurmd" in self.procs:
                self.cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            self._stop(name)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm tests cannot run on CI: {reason}")
    pytest.skip(f"needs a real Slurm (slurm-wlm, munge): {reason}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The session's single-node Slurm cluster (tests cancel their own jobs)."""
    reason = slurm_missing_reason()
    if reason:
        _skip_or_fail(reason)
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def slurm_env(
    slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SlurmCluster]:
    """``SLURM_CONF`` in this process's environment for one test (LocalHost agents inherit it);
    every job still queued or running at its end is cancelled, so that the next test finds the
    node free."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    yield slurm_cluster
    slurm_cluster.cancel_all()


@pytest.fixture(scope="session")
def slurm_sshd(sshd_pool: SshdPool, slurm_cluster: SlurmCluster) -> SshdServer:
    """A login node of the cluster: an sshd whose sessions have ``SLURM_CONF`` set."""
    return sshd_pool.start("slurm-login", extra=[f"SetEnv SLURM_CONF={slurm_cluster.conf}"])


@pytest.fixture
def slurm_job_script(tmp_path: Path) -> Path:
    """A batch script that says hello and then waits to be cancelled."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hello from job $SLURM_JOB_ID\nexec sleep 600\n")
    script.chmod(0o755)
    return script


__all__ = ["SlurmCluster", "short_hostname", "slurm_missing_reason"]
