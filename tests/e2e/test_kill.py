"""A kill that is never wrong (P1, P2, P4, P5, P6, P7, P8), against real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from supervisor.errors import AgentError, HostError, OutcomeUnknown
from supervisor.hosts import Host, LocalHost, list_processes, process_infos
from supervisor.kill import KillReport, identity_params, kill, kill_or_reconcile, reconcile
from supervisor.model import Identity
from tests.fixtures_actions import runwatch
from tests.fixtures_procs import (
    FakeRun,
    FakeRuns,
    alive,
    as_nobody,
    gone,
    local_host_config,
    start_time_of,
    state_of,
    system_python,
)
from tests.waiting import wait_until

SCRIPTS = ["run_inference.py"]


async def identity_of(host: Host, run: FakeRun, show_other_users: bool = False) -> Identity:
    """The identity the host lists for ``run`` (what a user would kill)."""
    result = await host.request("ps", {"scripts": SCRIPTS, "show_other_users": show_other_users})
    for p in process_infos(result):
        if p.identity.pid == run.pid:
            return p.identity
    raise AssertionError(f"run {run.pid} not listed")


def outcomes(report: KillReport) -> dict[int, str]:
    return {r.pid: r.outcome for r in report.results}


async def test_kill_terminates_the_run_and_every_worker(host: Host, fake_runs: FakeRuns) -> None:
    run = fake_runs.start(children=2)
    ident = await identity_of(host, run)
    report = await kill(host, ident, grace=10.0)
    assert outcomes(report) == {pid: "terminated" for pid in [run.pid, *run.children]}
    assert report.all_gone and not report.refused
    for r in report.results:
        assert r.signals == ["SIGTERM"]
        assert r.confirmed and r.after_s is not None
    assert gone(run.pid, run.start_time)
    for child in run.children:
        assert gone(child)


async def test_p4_ignores_sigterm_so_sigkill_after_grace(host: Host, fake_runs: FakeRuns) -> None:
    run = fake_runs.start(ignore_term=True, children=2, child_ignore_term=True)
    ident = await identity_of(host, run)
    report = await kill(host, ident, grace=0.3)
    assert outcomes(report) == {pid: "killed" for pid in [run.pid, *run.children]}
    assert run.term_count() == 1  # it did get the SIGTERM first
    for r in report.results:
        assert r.signals == ["SIGTERM", "SIGKILL"]
        assert r.confirmed
    assert report.all_gone
    assert gone(run.pid, run.start_time)
    assert all(gone(c) for c in run.children)


async def test_p4_workers_forked_with_the_same_argv_die_too(
    host: Host, fake_runs: FakeRuns
) -> None:
    run = fake_runs.start(ignore_term=True, children=2, fork=True)
    ident = await identity_of(host, run)
    report = await kill(host, ident, grace=0.2)
    assert set(outcomes(report)) == {run.pid, *run.children}
    assert report.all_gone
    assert all(gone(c) for c in run.children)


async def test_p1_pid_reused_is_refused_and_the_decoy_lives(
    host: Host, fake_runs: FakeRuns
) -> None:
    decoy = fake_runs.start("--datasets", "D")
    ident = await identity_of(host, decoy)
    # The listed process had the same pid but started at another time: the pid was reused.
    stale = Identity(
        boot_id=ident.boot_id,
        pid=ident.pid,
        start_time=ident.start_time - 1,
        uid=ident.uid,
        argv=ident.argv,
    )
    report = await kill(host, stale, grace=0.1)
    assert outcomes(report) == {decoy.pid: "refused"}
    assert "PID reused" in report.results[0].detail
    assert report.results[0].signals == []
    assert not report.all_gone
    assert alive(decoy.pid, decoy.start_time)


async def test_argv_changed_is_refused(host: Host, fake_runs: FakeRuns) -> None:
    run = fake_runs.start("--datasets", "B1")
    ident = await identity_of(host, run)
    other = Identity(
        boot_id=ident.boot_id,
        pid=ident.pid,
        start_time=ident.start_time,
        uid=ident.uid,
        argv=(*ident.argv[:-1], "B2"),
    )
    report = await kill(host, other, grace=0.1)
    assert outcomes(report) == {run.pid: "refused"}
    assert "argv changed" in report.results[0].detail
    assert alive(run.pid, run.start_time)


async def test_a_decoy_is_never_killable(host: Host, fake_runs: FakeRuns) -> None:
    """P3: even named by its exact identity, a process that is not a run is refused."""
    decoy = fake_runs.decoy(["tail", "-f", "/dev/null", "run_inference.py"])
    start = start_time_of(decoy.pid)
    assert start is not None
    assert host.hello is not None
    ident = Identity(
        boot_id=host.hello["boot_id"],
        pid=decoy.pid,
        start_time=start,
        uid=os.getuid(),
        argv=("tail", "-f", "/dev/null", "run_inference.py"),
    )
    report = await kill(host, ident, grace=0.1)
    assert outcomes(report) == {decoy.pid: "refused"}
    assert "not a run" in report.results[0].detail
    assert alive(decoy.pid, start)


async def test_the_agent_never_kills_itself(host: Host) -> None:
    assert host.hello is not None
    pid = host.hello["pid"]
    start = start_time_of(pid)
    assert start is not None
    ident = Identity(
        boot_id=host.hello["boot_id"], pid=pid, start_time=start, uid=os.getuid(), argv=("x",)
    )
    report = await kill(host, ident, grace=0.1)
    assert outcomes(report) == {pid: "refused"}
    assert (await host.request("ping"))["pong"] is True


async def test_p2_already_gone_is_success_without_a_signal(host: Host, fake_runs: FakeRuns) -> None:
    run = fake_runs.start()
    ident = await identity_of(host, run)
    os.kill(run.pid, signal.SIGUSR1)  # it exits on its own before the kill arrives
    run.popen.wait(timeout=10)
    report = await kill(host, ident, grace=1.0)
    assert outcomes(report) == {run.pid: "already-gone"}
    assert report.results[0].signals == []
    assert report.results[0].confirmed and report.all_gone


async def test_p5_a_zombie_counts_as_exited(host: Host, fake_runs: FakeRuns) -> None:
    run = fake_runs.start(never_reaped=True)
    ident = await identity_of(host, run)
    os.kill(run.pid, signal.SIGUSR1)
    wait_until(lambda: state_of(run.pid) == "Z", timeout=15)
    report = await kill(host, ident, grace=1.0)
    assert outcomes(report) == {run.pid: "already-gone"}
    assert "zombie" in report.results[0].detail
    assert report.results[0].signals == [] and report.all_gone
    # and a live run whose parent never reaps it is confirmed at its exit, without a retry loop
    run2 = fake_runs.start(never_reaped=True)
    ident2 = await identity_of(host, run2)
    report2 = await kill(host, ident2, grace=5.0)
    assert outcomes(report2) == {run2.pid: "terminated"}
    assert report2.results[0].signals == ["SIGTERM"]
    assert state_of(run2.pid) == "Z"


async def test_p6_host_rebooted_is_refused(host: Host, fake_runs: FakeRuns) -> None:
    run = fake_runs.start()
    ident = await identity_of(host, run)
    before_reboot = Identity(
        boot_id="00000000-0000-0000-0000-000000000000",
        pid=ident.pid,
        start_time=ident.start_time,
        uid=ident.uid,
        argv=ident.argv,
    )
    report = await kill(host, before_reboot, grace=0.1)
    assert outcomes(report) == {run.pid: "refused"}
    assert "rebooted" in report.results[0].detail
    assert alive(run.pid, run.start_time)
    assert (await reconcile(host, before_reboot)).state == "rebooted"


async def test_p7_another_users_run_is_refused(fake_runs: FakeRuns) -> None:
    prefix, python = as_nobody(), system_python()
    if prefix is None or python is None:
        pytest.skip("needs root and setpriv to start a process as user nobody")
    theirs = fake_runs.start(prefix=prefix, python=python)
    async with LocalHost(local_host_config(show_other_users=True)) as h:
        ident = await identity_of(h, theirs, show_other_users=True)
        assert ident.uid == 65534
        report = await kill(h, ident, grace=0.1)
    assert outcomes(report) == {theirs.pid: "refused"}
    assert "another user" in report.results[0].detail
    assert alive(theirs.pid, theirs.start_time)


async def test_a_kill_waiting_out_its_grace_never_blocks_a_ping(
    host: Host, fake_runs: FakeRuns
) -> None:
    run = fake_runs.start(ignore_term=True)
    ident = await identity_of(host, run)
    task = asyncio.create_task(kill(host, ident, grace=60.0))
    await asyncio.to_thread(wait_until, lambda: run.term_count() >= 1, 15)
    pong = await host.request("ping", timeout=10)
    assert pong["pong"] is True
    assert not task.done()  # the kill is still waiting out its grace period
    os.kill(run.pid, signal.SIGUSR1)  # the run exits on its own: the kill sees it at once
    report = await asyncio.wait_for(task, 10)
    assert outcomes(report) == {run.pid: "terminated"}
    assert report.results[0].confirmed


@pytest.mark.parametrize("grace", [float("nan"), float("inf")], ids=["nan", "inf"])
async def test_p4_a_grace_that_is_not_finite_is_refused_before_any_signal(
    host: Host, fake_runs: FakeRuns, grace: float
) -> None:
    """A NaN grace is a deadline no clock passes and an infinite one never comes: the SIGKILL
    of P4 would never be sent to a run that ignores SIGTERM. The host refuses it before any
    signal, whoever sent it."""
    run = fake_runs.start(ignore_term=True)
    ident = await identity_of(host, run)
    params = {"identity": identity_params(ident), "grace": grace}
    with pytest.raises(AgentError, match="finite"):
        await asyncio.wait_for(host.request("kill", params, timeout=20), 30)
    assert run.term_count() == 0
    assert alive(run.pid, run.start_time)


@pytest.mark.parametrize("grace", ["nan", "inf", "-inf"])
def test_p4_runwatch_kill_refuses_a_grace_that_is_not_a_finite_number(
    tmp_path: Path, fake_runs: FakeRuns, grace: str
) -> None:
    """``runwatch kill --grace nan`` (or ``inf``) is refused as a usage error naming the
    option: the run never gets a SIGTERM it ignores with a SIGKILL that never follows."""
    run = fake_runs.start(ignore_term=True)
    config = tmp_path / "runwatch.toml"
    config.write_text('[[hosts]]\nname = "local"\nlocal = true\n')
    out = runwatch("-c", str(config), "kill", "--pid", str(run.pid), "--grace", grace, "--yes")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Invalid value for '--grace'" in out.stderr, out.stderr
    assert run.term_count() == 0
    assert alive(run.pid, run.start_time)


async def test_p8_connection_dropped_mid_kill_is_reconciled_never_repeated(
    fake_runs: FakeRuns,
) -> None:
    run = fake_runs.start(ignore_term=True)
    h = LocalHost(local_host_config())
    try:
        await h.connect()
        ident = await identity_of(h, run)
        task = asyncio.create_task(kill(h, ident, grace=60.0))
        await asyncio.to_thread(wait_until, lambda: run.term_count() >= 1, 15)
        assert h.agent_pid is not None
        os.kill(h.agent_pid, signal.SIGKILL)  # the connection drops right after the kill was sent
        with pytest.raises(OutcomeUnknown):
            await asyncio.wait_for(task, 10)
        # Reconciling re-checks on a new connection; it does not send the kill again.
        state = await reconcile(h, ident)
        assert state.alive and state.state == "alive"
        assert run.term_count() == 1
        with pytest.raises(OutcomeUnknown, match="still running"):
            await _drop_again(h, ident, run)
        assert run.term_count() == 2  # exactly one more SIGTERM: the one explicit retry
        # The run ends; reconciling now says gone, and a repeated kill is harmless.
        os.kill(run.pid, signal.SIGKILL)
        await asyncio.to_thread(wait_until, lambda: gone(run.pid, run.start_time), 15)
        assert (await reconcile(h, ident)).alive is False
        again = await kill(h, ident, grace=1.0)
        assert outcomes(again) == {run.pid: "already-gone"} and again.all_gone
    finally:
        await h.close()


async def _drop_again(h: LocalHost, ident: Identity, run: FakeRun) -> KillReport:
    """kill_or_reconcile whose connection drops after the SIGTERM: it reconciles, finds the run
    alive and raises OutcomeUnknown instead of repeating the kill."""
    before = run.term_count()
    task = asyncio.create_task(kill_or_reconcile(h, ident, grace=60.0))
    await asyncio.to_thread(wait_until, lambda: run.term_count() > before, 15)
    assert h.agent_pid is not None
    os.kill(h.agent_pid, signal.SIGKILL)
    return await asyncio.wait_for(task, 20)


async def test_list_processes_matches_config_runs(host: Host, fake_runs: FakeRuns) -> None:
    from supervisor.config import Config, RunConfig

    run = fake_runs.start("--datasets", "B1,B2", "--output-dir", "out")
    workdir = os.path.dirname(run.argv[1])
    config = Config(
        scripts=SCRIPTS,
        hosts=[host.cfg],
        runs=[
            RunConfig(
                name="other",
                host=host.cfg.name,
                workdir="/elsewhere",
                argv=["python3", "run_inference.py", "--datasets", "X"],
            ),
            RunConfig(
                name="mine",
                host=host.cfg.name,
                workdir=workdir,
                argv=["python3", "run_inference.py", "--datasets", "B1,B2"],
            ),
        ],
    )
    # The same datasets and relative output dir, in another directory: another run.
    twin = fake_runs.start("--datasets", "B1,B2", "--output-dir", "out")
    # Started elsewhere but writing to the run's output directory: the run.
    moved = fake_runs.start(
        "--datasets", "B1,B2", "--output-dir", os.path.join(workdir, "out"), cwd="/"
    )  # fmt: skip
    found = {p.identity.pid: p for p in await list_processes(host, config)}
    assert found[run.pid].run == "mine"
    assert found[twin.pid].run is None
    assert found[moved.pid].run == "mine"


async def test_a_closed_host_reconnects_on_demand(fake_runs: FakeRuns) -> None:
    h = LocalHost(local_host_config())
    await h.connect()
    first = h.agent_pid
    await h.close()
    assert first is not None and gone(first)
    assert not h.connected
    assert (await h.request("ping"))["pong"] is True
    assert h.agent_pid != first
    await h.close()
    with pytest.raises(HostError):
        await LocalHost(local_host_config(python="/nonexistent/python3")).connect()


@pytest.mark.parametrize(
    ("python", "env"),
    [
        ("/root/.pyenv/versions/3.8.18/bin/python3.8", {}),
        (sys.executable, {"RUNWATCH_AGENT_NO_PIDFD": "1"}),
    ],
    ids=["python3.8-pidfd-via-syscall", "no-pidfd-start-time-rechecked"],
)
async def test_kill_on_older_pythons_and_kernels(
    python: str, env: dict[str, str], fake_runs: FakeRuns
) -> None:
    """P4 and P1 through an agent on Python 3.8, and through the fallback without pidfd."""
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} is not installed here")
    run = fake_runs.start(ignore_term=True, children=1, child_ignore_term=True)
    async with LocalHost(local_host_config(python=python), env={**os.environ, **env}) as h:
        assert h.hello is not None
        assert h.hello["has_pidfd"] is (not env)
        ident = await identity_of(h, run)
        stale = Identity(
            boot_id=ident.boot_id,
            pid=ident.pid,
            start_time=ident.start_time + 1,
            uid=ident.uid,
            argv=ident.argv,
        )
        refused = await kill(h, stale, grace=0.1)
        assert outcomes(refused) == {run.pid: "refused"}
        assert alive(run.pid, run.start_time)
        report = await kill(h, ident, grace=0.2)
    assert outcomes(report) == {run.pid: "killed", run.children[0]: "killed"}
    assert report.all_gone
    assert gone(run.pid, run.start_time) and gone(run.children[0])
