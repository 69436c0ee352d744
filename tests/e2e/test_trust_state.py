"""Trust boundaries of runwatch's own state (issue 21, parts 2-4; ids T10 and up).

State per config: two configs with a run of one name share no launch spec, guard marker,
history, watcher lock or audit view, and each watcher sees only its runs. Modes whatever the
umask: every path runwatch creates is 0700/0600, and a state dir, audit log or run log that is a
link, another user's or writable by others is refused with an error naming it and the fix.
Trusted configs: the commands that act refuse a config another user could have written.

Real parts: the reference client against a mock endpoint, launched through the engine or the
CLI, the real agent, real files and a second Unix user (``second_user``).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit, launchspec
from supervisor.config import load_config, untrusted
from supervisor.errors import RunwatchError, UnsafeState
from supervisor.paths import config_key
from supervisor.watch import Watcher, WatchLock
from tests.fixtures_actions import (
    DemoRun,
    engine_for,
    launch,
    over_budget_stop_run,
    restart,
    run_pids,
    runwatch,
    why,
)
from tests.fixtures_procs import FakeRuns, gone
from tests.fixtures_users import OtherUser


def _umask0_runwatch(*args: str) -> subprocess.CompletedProcess[str]:
    """``runwatch ARGS`` as a separate process under umask 000."""
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        preexec_fn=lambda: os.umask(0),
    )


def _modes(root: Path) -> dict[str, str]:
    """Every path under ``root`` (and ``root``) with its mode, links flagged."""
    out = {}
    for p in [root, *root.rglob("*")]:
        st = os.lstat(p)
        kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if p.is_dir() else "file"
        out[str(p)] = f"{kind} {stat.S_IMODE(st.st_mode):04o}"
    return out


# --------------------------------------------------------------------------- state per config


async def test_t10_two_configs_with_one_run_name_share_nothing(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """Config A launches its ``demo`` with ``--set token-budget=50000``; config B's ``demo``
    does not inherit it; each config's state is under its own key, each audit view and each
    watcher lock is its own."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    b = DemoRun(tmp_path / "b", slow_endpoint.url, max_samples=300)
    kill_runs_in += [a.workdir, b.workdir]
    key_a, key_b = a.config.key, b.config.key
    assert key_a != key_b
    async with engine_for(a) as engine_a, engine_for(b) as engine_b:
        ra = await launch(engine_a, "demo", ["token-budget=50000"])
        assert ra.ok, why(ra)
        rb = await launch(engine_b, "demo")
        assert rb.ok, why(rb)
        assert "--token-budget" in ra.identity["argv"]
        assert "--token-budget" not in rb.identity["argv"]  # not inherited from A
        assert launchspec.load(key_a, "demo").sets == [("--token-budget", "50000")]
        assert launchspec.load(key_b, "demo").sets == []
        # each snapshot shows its own config's process as its run, not the other's
        snap_a, snap_b = await engine_a.refresh(), await engine_b.refresh()
        [va] = [r for h in snap_a.hosts for r in h.runs if r.name == "demo"]
        [vb] = [r for h in snap_b.hosts for r in h.runs if r.name == "demo"]
        assert va.process is not None and va.process.identity.pid == ra.identity["pid"]
        assert vb.process is not None and vb.process.identity.pid == rb.identity["pid"]
    # the state of each config is under its key; nothing of A's is kept at B's key
    configs = state_home / "configs"
    assert sorted(p.name for p in configs.iterdir()) == sorted([key_a, key_b])
    spec_b = json.loads((configs / key_b / "launch-spec" / "demo.json").read_text())
    assert "50000" not in json.dumps(spec_b)
    assert not (state_home / "launch-spec").exists()  # the shared per-name layout is gone
    # one audit log, the config's identity on every record, each config reads its own
    records = audit.read()
    assert {r["config"] for r in records} == {key_a, key_b}
    view_b = audit.read(config=key_b)
    assert [(r["action"], r["run"]) for r in view_b] == [("launch", "demo")]
    assert "50000" not in json.dumps(view_b)
    assert all(r["config"] == key_a for r in audit.read(config=key_a))
    # the watcher locks of the two configs are two locks
    lock_a = WatchLock(str(a.config_path), key=key_a)
    lock_b = WatchLock(str(b.config_path), key=key_b)
    try:
        assert lock_a.try_acquire() and lock_b.try_acquire()
        assert not WatchLock(str(a.config_path), key=key_a).try_acquire()  # one per config
    finally:
        lock_a.release()
        lock_b.release()


async def test_t11_each_watcher_sees_only_its_runs(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """A restart of A's ``demo`` by another runwatch is an event of A's watcher (naming A's
    config) and never of B's; B's watcher keeps seeing its own run running."""
    a = DemoRun(tmp_path / "a", slow_endpoint.url, max_samples=300)
    b = DemoRun(tmp_path / "b", slow_endpoint.url, max_samples=300)
    kill_runs_in += [a.workdir, b.workdir]
    lines_a: list[str] = []
    lines_b: list[str] = []
    async with engine_for(a) as engine_a, engine_for(b) as engine_b:
        ra, rb = await launch(engine_a, "demo"), await launch(engine_b, "demo")
        assert ra.ok and rb.ok, why(ra) + why(rb)
        watch_a = Watcher(engine_a, emit=lines_a.append)
        watch_b = Watcher(engine_b, emit=lines_b.append)
        await watch_a.tick()
        await watch_b.tick()
        again = await restart(engine_a, "demo", ["concurrency=1"])
        assert again.ok, why(again)
        events_a = await watch_a.tick()
        events_b = await watch_b.tick()
        snap_b = await engine_b.refresh()
    assert any(e.kind == "restart-done" for e in events_a), events_a
    assert not [e for e in events_b if e.kind.startswith("restart") or e.kind == "run-died"]
    assert str(a.config_path) not in "\n".join(lines_b)
    stops_b = watch_b.stops.expected()
    assert not [k for k in stops_b if str(ra.identity["pid"]) in k]
    assert str(ra.identity["pid"]) in " ".join(watch_a.stops.expected())
    [vb] = [r for h in snap_b.hosts for r in h.runs if r.name == "demo"]
    assert vb.state == "running" and vb.process is not None
    assert vb.process.identity.pid == rb.identity["pid"]


async def test_t12_the_demo_host_lists_only_its_own_runs(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path], spawn: Any
) -> None:
    """With ``only_own_runs`` (the demo's host), a reference client started by hand elsewhere
    and another config's unit are neither listed nor matched; the config's own run is. Without
    it, they are listed."""
    own = DemoRun(
        tmp_path / "own",
        slow_endpoint.url,
        max_samples=300,
        host_toml='[[hosts]]\nname = "local"\nlocal = true\nonly_own_runs = true\n',
    )
    plain = DemoRun(tmp_path / "plain", slow_endpoint.url, max_samples=300)
    stray_dir = tmp_path / "user-run"
    stray_dir.mkdir()
    kill_runs_in += [own.workdir, plain.workdir, stray_dir]
    stray = spawn(
        [*own.argv, "--output-dir", "mine", "--prompts-dir", str(own.workdir / "prompts")],
        cwd=stray_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert load_config(own.config_path).hosts[0].only_own_runs
    async with engine_for(plain) as engine:
        other = await launch(engine, "demo")
        assert other.ok, why(other)
    async with engine_for(own) as engine:
        started = await launch(engine, "demo")
        assert started.ok, why(started)
        listed = [p.identity.pid for p in await engine.list_processes("local")]
        snap = await engine.refresh()
    assert listed == [started.identity["pid"]]
    shown = [p.identity.pid for h in snap.hosts for p in h.processes]
    assert stray.pid not in shown and other.identity["pid"] not in shown
    async with engine_for(plain) as engine:
        everyone = [p.identity.pid for p in await engine.list_processes("local")]
    assert {stray.pid, started.identity["pid"], other.identity["pid"]} <= set(everyone)
    # the demo's own config sets it
    template = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"
    assert "only_own_runs = true" in template.read_text()


# --------------------------------------------------------------------------- modes


async def test_t13_under_umask_000_every_path_runwatch_creates_is_private(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """launch, status, restart and kill through the CLI under umask 000: the state dir (and
    the ``XDG_STATE_HOME`` it made), the run's ``logs/`` and ``<out>/.runwatch`` hold only
    0700 directories and 0600 files, and no link."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    cfg = str(demo.config_path)
    for args in (
        ("launch", "demo", "--yes"),
        ("status", "--json"),
        ("restart", "demo", "--set", "concurrency=1", "--yes"),
        ("guard", "--dry-run"),
        ("kill", "demo", "--yes"),
        ("audit",),
    ):
        out = _umask0_runwatch(args[0], "-c", cfg, *args[1:])
        assert out.returncode == 0, (args, out.stdout + out.stderr)
    assert not run_pids(demo.workdir)
    walked: dict[str, str] = {}
    for root in (state_home.parent, demo.workdir / "logs", demo.workdir / "data" / ".runwatch"):
        walked.update(_modes(root))
    assert str(state_home / "audit.jsonl") in walked
    assert any("/units/" in p for p in walked) and any("launch-spec" in p for p in walked)
    assert any(p.endswith("history.db") for p in walked)
    assert any(p.endswith(".lock") for p in walked) and any(p.endswith("run.log") for p in walked)
    bad = {p: m for p, m in walked.items() if m not in ("dir 0700", "file 0600")}
    assert bad == {}


def test_t14_a_forged_audit_log_of_another_user_is_refused(
    tmp_path: Path, state_home: Path, second_user: OtherUser
) -> None:
    """An ``audit.jsonl`` another user swapped in is neither appended to nor shown: the error
    names it and says what to do."""
    cfg = DemoRun(tmp_path, "http://127.0.0.1:9/v1").config_path
    audit.record("kill", host="local", run="demo", ok=True, config="k")
    forged = state_home / "audit.jsonl"
    forged.unlink()
    forged.write_text(json.dumps({"action": "launch", "run": "FORGED", "ok": True}) + "\n")
    os.chown(forged, second_user.uid, second_user.gid)
    forged.chmod(0o600)
    with pytest.raises(UnsafeState) as err:
        audit.record("kill", host="local", run="demo", ok=True, config="k")
    assert str(forged) in str(err.value) and f"owned by uid {second_user.uid}" in str(err.value)
    assert "FORGED" in forged.read_text() and "kill" not in forged.read_text()
    out = runwatch("audit", "-c", str(cfg), "--all")
    assert out.returncode != 0
    assert "FORGED" not in out.stdout
    text = out.stdout + out.stderr
    assert f"refusing {forged}: it is owned by uid {second_user.uid}" in text
    assert "rm -r" in text or "chown" in text
    # a link in its place is refused as well, and the file it points at is left alone
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    forged.unlink()
    forged.symlink_to(victim)
    with pytest.raises(UnsafeState, match="symbolic link"):
        audit.record("kill", host="local", run="demo", ok=True, config="k")
    assert victim.read_text() == "precious\n"
    # and so is a state dir writable by others
    forged.unlink()
    state_home.chmod(0o777)
    with pytest.raises(UnsafeState) as err:
        audit.record("kill", host="local", run="demo", ok=True, config="k")
    assert f"chmod 700 {state_home}" in str(err.value)
    # and a state dir that is a link (to a directory of another's choosing)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    state_home.rename(tmp_path / "old-state")
    state_home.symlink_to(elsewhere)
    with pytest.raises(UnsafeState, match=f"refusing {state_home}: it is a symbolic link"):
        audit.record("kill", host="local", run="demo", ok=True, config="k")
    assert list(elsewhere.iterdir()) == []


def test_t15_a_symlinked_or_foreign_run_log_is_refused(
    tmp_path: Path,
    state_home: Path,
    second_user: OtherUser,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
) -> None:
    """``logs/run.log`` replaced by a link: the launch is refused naming it, nothing starts
    and the link's target is untouched; a ``logs/`` of another user or writable by others too."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    cfg = str(demo.config_path)
    logs = demo.workdir / "logs"
    logs.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (logs / "run.log").symlink_to(victim)
    out = runwatch("launch", "demo", "-c", cfg, "--yes")
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"refusing {logs / 'run.log'}: it is a symbolic link" in text, text
    assert victim.read_text() == "precious\n" and not run_pids(demo.workdir)
    # the log tail (Log tab, run-died alerts) does not show what the link points at either
    with pytest.raises(RunwatchError, match="it is a symbolic link") as tail_err:
        asyncio.run(_tail(demo))
    assert "precious" not in str(tail_err.value)
    (logs / "run.log").unlink()
    logs.chmod(0o777)
    out = runwatch("launch", "demo", "-c", cfg, "--yes")
    assert out.returncode != 0 and f"chmod 700 {logs}" in out.stdout + out.stderr
    assert not run_pids(demo.workdir)
    logs.chmod(0o700)
    os.chown(logs, second_user.uid, second_user.gid)
    out = runwatch("launch", "demo", "-c", cfg, "--yes")
    assert out.returncode != 0
    assert f"refusing {logs}: it is owned by uid {second_user.uid}" in out.stdout + out.stderr
    assert not run_pids(demo.workdir) and not (logs / "run.log").exists()


async def _tail(demo: DemoRun) -> Any:
    async with engine_for(demo) as engine:
        return await engine.tail_log("local", "demo")


# --------------------------------------------------------------------------- trusted configs

_ACTIONS = (
    ("launch", "demo", "--yes"),
    ("restart", "demo", "--yes"),
    ("kill", "demo", "--yes"),
    ("guard", "--dry-run"),
    ("watch",),
)


def test_t16_a_config_others_could_write_is_refused_for_actions(
    tmp_path: Path, state_home: Path, second_user: OtherUser
) -> None:
    """A 0666 config and one owned by another uid: launch, restart, kill, guard and watch
    refuse it before anything else (exit 2, the path and the fix named); a read-only command
    warns once and goes on."""
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")
    cfg = demo.config_path
    for mode, owner, why_text, fix in (
        (0o666, None, "writable by group or others (mode 0666)", f"chmod go-w {cfg}"),
        (0o644, second_user, f"belongs to uid {second_user.uid}", f"chown {os.geteuid()}"),
    ):
        cfg.chmod(mode)
        if owner is not None:
            os.chown(cfg, owner.uid, owner.gid)
        for args in _ACTIONS:
            out = runwatch(args[0], "-c", str(cfg), *args[1:], timeout=60)
            assert out.returncode == 2, (args, out.stdout + out.stderr)
            text = out.stdout + out.stderr
            assert str(cfg) in text and why_text in text and fix in text, (args, text)
        out = runwatch("audit", "-c", str(cfg))
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stderr.count(why_text) == 1
    assert not (state_home / "audit.jsonl").exists()  # nothing acted
    # a directory others can write (not sticky) lets them replace the config; /tmp-like
    # sticky directories do not
    shared = tmp_path / "shared"
    shared.mkdir()
    moved = shared / "rw.toml"
    moved.write_text(cfg.read_text())
    moved.chmod(0o600)
    shared.chmod(0o777)
    out = runwatch("launch", "demo", "-c", str(moved), "--yes", timeout=60)
    assert out.returncode == 2 and f"its directory {shared} is writable by group or others" in (
        out.stdout + out.stderr
    )
    shared.chmod(0o1777)
    assert untrusted(str(moved)) is None
    os.chown(cfg, os.geteuid(), os.getegid())
    cfg.chmod(0o600)
    out = runwatch("guard", "--dry-run", "-c", str(cfg), timeout=60)
    assert "warning" not in out.stderr and "refusing" not in out.stdout + out.stderr


# --------------------------------------------------------------------------- migration


async def test_t17_state_of_an_older_runwatch_is_never_given_to_a_config(
    tmp_path: Path, state_home: Path, slow_endpoint: Any
) -> None:
    """A launch spec kept per run name by an older runwatch is not applied (it could be any
    config's) and the plan says where it is; audit records without a config are shown only
    by ``--all``, and ``runwatch audit`` says how many there are."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    legacy = state_home / "launch-spec" / "demo.json"
    legacy.parent.mkdir(parents=True, mode=0o700)
    legacy.write_bytes(
        json.dumps({"run": "demo", "sets": [["--token-budget", "777"]], "unsets": []}).encode()
    )
    legacy.chmod(0o600)
    async with engine_for(demo) as engine:
        plan = await engine.plan("demo", action="launch")
    assert "--token-budget" not in plan.argv
    described = "\n".join(plan.describe())
    assert f"note: not applied: {legacy}" in described and "--token-budget" in described
    assert "777" not in described
    assert legacy.read_bytes()  # left in place
    audit.append({"time": 1.0, "action": "kill", "host": "local", "run": "OLD", "ok": True})
    audit.record("kill", host="local", run="NEW", ok=True, config=config_key(str(demo.config_path)))
    out = runwatch("audit", "-c", str(demo.config_path))
    assert out.returncode == 0, out.stderr
    assert "local/NEW" in out.stdout and "OLD" not in out.stdout
    assert "1 record(s) of an older runwatch name no config: --all shows them" in out.stderr
    out = runwatch("audit", "-c", str(demo.config_path), "--all")
    assert "local/OLD" in out.stdout and "local/NEW" in out.stdout


async def test_t19_guard_markers_of_an_older_runwatch_still_count(
    tmp_path: Path, state_home: Path, fake_runs: FakeRuns
) -> None:
    """A budget event an older runwatch acted on (its marker in the shared ``guard/`` dir, keyed
    by host, run, process identity and dataset: unambiguous) is not acted on again; without
    the marker, the same run is stopped, its marker kept under the config's key."""
    from supervisor.engine import Engine

    run, cfg = over_budget_stop_run(tmp_path, fake_runs, seed=5)
    config = load_config(cfg)
    legacy = state_home / "guard"
    legacy.mkdir(parents=True, mode=0o700)
    async with Engine(config) as engine:
        snap = await engine.refresh()
        [event] = engine.budget_events(snap)
        assert event.policy == "stop" and event.run == "gen"
        for key in event.keys:
            (legacy / f"{key}.json").write_text("{}")
        assert engine.budget_events(snap) == []
        assert await engine.enforce_budget(snap) == []
        assert not gone(run.pid, run.start_time)
        for key in event.keys:
            (legacy / f"{key}.json").unlink()
        [outcome] = await engine.enforce_budget(await engine.refresh())
    assert outcome.acted and outcome.ok, outcome.detail
    assert gone(run.pid, run.start_time)
    kept = state_home / "configs" / config.key / "guard"
    assert sorted(p.stem for p in kept.iterdir()) == sorted(event.keys)


def test_t18_a_project_name_is_the_identity_and_survives_a_move(tmp_path: Path) -> None:
    """``project = "name"``: the config's key is the name's, wherever the file is; without it,
    the resolved path's."""
    first = tmp_path / "a" / "rw.toml"
    first.parent.mkdir()
    first.write_text('project = "eagle"\n')
    moved = tmp_path / "b" / "rw.toml"
    moved.parent.mkdir()
    first.rename(moved)
    named = load_config(moved).key
    assert named == config_key("", "eagle") and named == config_key(str(first), "eagle")
    moved.write_text("")
    assert load_config(moved).key == config_key(str(moved)) != named
