"""The soak's own parts, on real processes: the plan is the seed's alone, the writer scan sees
writers (and only writers), and a decoy records the signals it gets."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.soak import procs
from tests.soak.decoys import Neighbourhood
from tests.soak.run import INVALID_SETS, make_plan
from tests.waiting import wait_until


def test_the_plan_depends_on_the_seed_alone() -> None:
    runs = ["local", "remote"]
    a = [f.describe() for f in make_plan(11, 200, runs)]
    assert a == [f.describe() for f in make_plan(11, 200, runs)]
    assert a != [f.describe() for f in make_plan(12, 200, runs)]
    restarts = [f for f in make_plan(11, 200, runs) if f.kind == "restart"]
    for f in restarts:
        keys = [s.split("=")[0] for s in f.params["sets"]]
        assert len(keys) == len(set(keys)), f.describe()  # no --set overrides another
        assert f.params["invalid"] == any(s in INVALID_SETS for s in f.params["sets"])
    assert any(f.params["invalid"] for f in restarts)
    assert any(not f.params["invalid"] for f in restarts)


def test_writers_are_found_by_inode_and_readers_are_not(tmp_path: Path) -> None:
    data = tmp_path / "out" / "raw_responses.jsonl"
    data.parent.mkdir()
    data.write_bytes(b'{"sample_id": "a"}\n')
    hold = "import sys, time\nf = open(sys.argv[1], sys.argv[2])\nprint('open', flush=True)\n"
    hold += "sys.stdin.read()\n"
    procs_: list[subprocess.Popen[bytes]] = []
    try:
        for mode in ("ab", "rb"):
            p = subprocess.Popen(
                [sys.executable, "-c", hold, str(data), mode],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            procs_.append(p)
            assert p.stdout is not None and p.stdout.readline() == b"open\n"
        found = procs.writers_under(str(tmp_path), "raw_responses.jsonl")
        st = data.stat()
        writers = found[(st.st_dev, st.st_ino)]
        assert [w.pid for w in writers] == [procs_[0].pid]
        assert writers[0].argv[-1] == "ab" and int(writers[0].flags, 8) & os.O_APPEND
    finally:
        for p in procs_:
            p.kill()
            p.wait(10)
            for s in (p.stdin, p.stdout):
                if s is not None:
                    s.close()


def test_a_decoy_records_a_signal_and_retiring_it_records_nothing(tmp_path: Path) -> None:
    hood = Neighbourhood(tmp_path)
    try:
        decoy = hood.python_lookalike(tmp_path, "A1,A2")
        assert "run_inference.py" in decoy.argv and procs.alive(decoy.pid, decoy.start)
        wait_until(lambda: procs.stat(decoy.pid) is not None and _handles_term(decoy.pid))
        os.kill(decoy.pid, signal.SIGTERM)
        wait_until(lambda: "SIGTERM" in decoy.record.read_text())
        assert decoy.proc.poll() is None  # caught, still alive
        decoy.retire()
        assert decoy.retired and decoy.proc.returncode == -signal.SIGKILL
        assert decoy.record.read_text().count("\n") == 1
    finally:
        hood.close()


def _handles_term(pid: int) -> bool:
    """The process has a handler for SIGTERM (bit 15 of SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_a_ledger_line_in_no_file_is_a_lost_line_with_its_offset(tmp_path: Path) -> None:
    import hashlib
    import json
    import time

    from tests.soak.run import Run, Soak

    soak = Soak(tmp_path, seed=1, minutes=1, interval=5)
    run = Run("r", "here", tmp_path / "work", ["A1"], tmp_path / "work" / "ledger.jsonl")
    soak.runs = {"r": run}
    data = run.data_file()
    data.parent.mkdir(parents=True)
    lines = [json.dumps({"sample_id": f"A1-{i}"}).encode() + b"\n" for i in range(3)]
    data.write_bytes(b"".join(lines))
    st = data.stat()
    entries, offset = [], 0
    for i, line in enumerate(lines):
        entries.append(
            {
                "sample_id": f"A1-{i}",
                "file": str(data),
                "dev": st.st_dev,
                "ino": st.st_ino,
                "offset": offset,
                "length": len(line),
                "sha1": hashlib.sha1(line).hexdigest(),
                "time": time.time(),
            }
        )
        offset += len(line)
    run.ledger.write_text("".join(json.dumps(e) + "\n" for e in entries))
    # the first line moved to a backup beside the file is kept; the last one is gone
    (data.parent / "raw_responses.jsonl.broken").write_bytes(lines[0])
    data.write_bytes(lines[1])
    stats = soak.check_ledgers()
    assert stats == {"r ledger lines": 3, "r found": 2, "r lost": 1}
    [lost] = soak.violations.items
    assert lost["kind"] == "line-lost" and lost["ledger_entry"]["sample_id"] == "A1-2"
    assert lost["ledger_entry"]["offset"] == len(lines[0]) + len(lines[1])
    assert "size" in lost["at_offset_now"]


# ------------------------------------------------------------------ the issue-20 invariants


def _soak(tmp_path: Path) -> Any:
    from tests.soak.run import Soak

    return Soak(tmp_path, seed=1, minutes=1, interval=5)


def _action(argv: list[str], rc: int, output: str, run: str) -> Any:
    import time

    from tests.soak.run import Action

    now = time.time()
    argv = ["python", "-c", "cfg", *argv]
    return Action("test", argv, now - 1, run=run, ended=now, rc=rc, output=output)


def _spawn(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Any:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


APPENDER = (
    "import sys, time\n"
    "while True:\n"
    "    with open(sys.argv[1], 'a') as f:\n"
    "        f.write('x\\n')\n"
    "    time.sleep(0.1)\n"
)


def test_an_escaped_writer_alive_after_a_confirmed_kill_is_a_violation(tmp_path: Path) -> None:
    """A process holding the killed run's launch token, appending to its file: reported with
    its pid and the growth; the same kill reported as failed is not checked; a run of the same
    name in another config (another soak) is not this one."""
    from tests.soak.run import Run

    soak = _soak(tmp_path)
    run = Run("esc", "here", tmp_path / "work", ["E1"], tmp_path / "work" / "ledger.jsonl")
    soak.runs = {"esc": run}
    soak.config_ids.add("cfg0")
    run.data_file().parent.mkdir(parents=True)
    token = {"RUNWATCH_LAUNCH": "cfg0:esc:L1"}
    escaped = _spawn([sys.executable, "-c", APPENDER, str(run.data_file())], tmp_path, token)
    other = _spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path,
                   {"RUNWATCH_LAUNCH": "cfg9:esc:L9"})  # fmt: skip
    try:
        wait_until(lambda: run.data_file().exists() and procs.launch_token(escaped.pid))
        wait_until(lambda: procs.launch_token(other.pid))
        failed = _action(["kill", "esc", "--yes"], 1, "kill esc: not confirmed", "esc")
        soak.check_escapes(run, failed, {("cfg0", "L1")}, [])
        assert soak.violations.items == []
        kill = _action(["kill", "esc", "--yes"], 0, "esc: exit confirmed", "esc")
        soak.check_escapes(run, kill, {("cfg0", "L1")}, [])
        [v] = soak.violations.items
        assert v["kind"] == "escaped-writer"
        assert [m["pid"] for m in v["alive"]] == [escaped.pid]
        assert v["alive"][0]["held"] == ["token cfg0:esc:L1"]
        assert str(run.data_file()) in v["grew"]
    finally:
        for p in (escaped, other):
            p.kill()
            p.wait(10)


def test_a_restart_whose_stop_left_the_old_launch_alive_is_a_violation(tmp_path: Path) -> None:
    """After a restart past its stop, a holder of the OLD launch's token is a violation; one of
    the new launch's is the relaunch."""
    from tests.soak.run import Run

    soak = _soak(tmp_path)
    run = Run("r", "here", tmp_path / "work", ["A1"], tmp_path / "work" / "ledger.jsonl")
    soak.runs = {"r": run}
    soak.config_ids.add("cfg0")
    old = _spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path,
                 {"RUNWATCH_LAUNCH": "cfg0:r:OLD"})  # fmt: skip
    new = _spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path,
                 {"RUNWATCH_LAUNCH": "cfg0:r:NEW"})  # fmt: skip
    gone = _spawn([sys.executable, "-c", "pass"], tmp_path)
    gone.wait(10)
    try:
        wait_until(lambda: procs.launch_token(old.pid) and procs.launch_token(new.pid))
        restart = _action(["restart", "r", "--yes"], 1, "restart r: stopped at launch", "r")
        soak.check_escapes(run, restart, {("cfg0", "OLD")}, [(gone.pid, 0, [])])
        [v] = soak.violations.items
        assert v["kind"] == "escaped-writer" and [m["pid"] for m in v["alive"]] == [old.pid]
        assert v["grew"] == {}  # a restart's relaunch writes: growth is not checked
    finally:
        for p in (old, new):
            p.kill()
            p.wait(10)


def test_a_twin_signalled_while_runwatch_acts_on_the_other_is_a_violation(tmp_path: Path) -> None:
    import time

    from tests.soak.run import Run

    soak = _soak(tmp_path)
    runs = {}
    for name in ("twin-a", "twin-b"):
        work = tmp_path / name
        work.mkdir()
        runs[name] = Run(name, "here", work, ["T1"], work / "ledger.jsonl", behaviour="twin")
    soak.runs = runs
    kill_a = _action(["kill", "twin-a", "--yes"], 0, "", "twin-a")
    soak.history.append(kill_a)
    now = time.time()
    (runs["twin-a"].workdir / "signals.log").write_text(f"{now:.3f} 101 SIGTERM\n")
    soak.check_twins()
    assert soak.violations.items == []  # the twin runwatch acted on
    (runs["twin-b"].workdir / "signals.log").write_text(f"{now:.3f} 202 SIGTERM\n")
    soak.check_twins()
    [v] = soak.violations.items
    assert v["kind"] == "twin-signalled" and v["run"] == "twin-b" and v["pid"] == 202


def test_a_twin_process_that_ends_with_no_command_on_it_is_a_violation(tmp_path: Path) -> None:
    from tests.soak.run import Run

    soak = _soak(tmp_path)
    work = tmp_path / "twin-b"
    work.mkdir()
    run = Run("twin-b", "here", work, ["T1"], work / "l.jsonl", "ledger/ledger.jsonl", "twin")
    soak.runs = {"twin-b": run}
    argv = [sys.executable, "-c", "import sys; sys.stdin.read()", "--ledger", run.ledger_arg]
    p = subprocess.Popen(argv, cwd=work, stdin=subprocess.PIPE)
    try:
        wait_until(lambda: [x for x, _, _ in run.processes()] == [p.pid])
        soak.check_twins()
        assert soak.violations.items == []
    finally:
        p.kill()
        p.wait(10)
        assert p.stdin is not None
        p.stdin.close()
    soak.check_twins()
    [v] = soak.violations.items
    assert v["kind"] == "twin-signalled" and v["pid"] == p.pid and "ended" in v["summary"]


def test_a_flag_resume_output_that_loses_lines_is_a_violation(tmp_path: Path) -> None:
    """Growth is fine, the soak's own move aside is fine, an overwrite (mode "w") is not."""
    from tests.soak.run import Run

    soak = _soak(tmp_path)
    work = tmp_path / "sf"
    run = Run("sf", "here", work, ["regen.jsonl"], work / "none", behaviour="specforge")
    soak.runs = {"sf": run}
    out = run.data_file()
    out.parent.mkdir(parents=True)
    out.write_bytes(b'{"id": 1}\n{"id": 2}\n{"id": 3}\n')
    soak.check_outputs()
    with open(out, "ab") as f:
        f.write(b'{"id": 4}\n{"id"')  # a line being written is not yet a line
    soak.check_outputs()
    st = out.stat()
    soak.archived.add((st.st_dev, st.st_ino))
    out.rename(tmp_path / "archived.jsonl")
    out.write_bytes(b'{"id": 5}\n{"id": 6}\n')
    soak.check_outputs()
    assert soak.violations.items == []
    with open(out, "w") as f:  # what the client does without --resume
        f.write('{"id": 7}\n')
    soak.check_outputs()
    [v] = soak.violations.items
    assert v["kind"] == "output-shrank" and "shrank from 20 to 10 bytes" in v["summary"]


def test_a_run_started_while_an_appender_writes_its_file_is_a_violation(tmp_path: Path) -> None:
    """A real shell ``>>`` loop on the run's data file: the run's process started before it is
    not reported; one started while it appends is."""
    from tests.soak.run import Run

    soak = _soak(tmp_path)
    run = Run("local", "here", tmp_path / "work", ["A1"], tmp_path / "work" / "ledger.jsonl")
    soak.runs = {"local": run}
    run.data_file().parent.mkdir(parents=True)
    run.data_file().touch()
    argv = [sys.executable, "-c", "import sys; sys.stdin.read()", "--ledger", str(run.ledger)]
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(subprocess.Popen(argv, cwd=run.workdir, stdin=subprocess.PIPE))
        wait_until(lambda: len(run.processes()) == 1)
        decoy = soak.hood.appender("oac-shell", run.data_file())
        wait_until(lambda: len(soak.hood.append_times(decoy)) >= 12, timeout=30)
        assert run.data_file().read_text().count("SH-") >= 12
        soak.check_beside_appenders()
        assert soak.violations.items == []
        started.append(subprocess.Popen(argv, cwd=run.workdir, stdin=subprocess.PIPE))
        wait_until(lambda: len(run.processes()) == 2)
        soak.check_beside_appenders()
        [v] = soak.violations.items
        assert v["kind"] == "launched-beside-writer" and v["pid"] == started[1].pid
        assert v["appender"]["pid"] == decoy.pid and len(v["appends"]) >= 2
    finally:
        soak.hood.close()
        for p in started:
            p.kill()
            p.wait(10)
            assert p.stdin is not None
            p.stdin.close()


def _adversary(tmp_path: Path, behaviour: str) -> tuple[Path, list[str]]:
    """A wrapper of ``behaviour`` and the client argv it runs with (an endpoint that refuses
    connections: the client retries, so it stays up without a server)."""
    from tests.soak import adversaries
    from tests.soak.run import REPO

    script = adversaries.write_wrapper(tmp_path / "bin", behaviour, REPO)
    work = tmp_path / "work"
    (work / "prompts").mkdir(parents=True)
    (work / "out" / "E1").mkdir(parents=True)  # the escaped writer creates no directory
    (work / "prompts" / "E1.jsonl").write_text('{"sample_id": "E1-0", "prompt": "hi"}\n')
    argv = [sys.executable, str(script), "--datasets", "E1", "--output-dir", "out"]
    argv += ["--api-base", "http://127.0.0.1:9/v1", "--model", "m", "--ledger", "l.jsonl"]
    return work, argv


def _writers_of(path: Path) -> list[int]:
    """Live escaped writers (the adversaries' exec'd writer) of ``path``."""
    return [p for p in procs.pids() if str(path) in procs.argv(p) and procs.alive(p)]


def _session(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def test_the_escape_adversary_leaves_a_setsid_writer_behind_on_sigterm(tmp_path: Path) -> None:
    work, argv = _adversary(tmp_path, "escape")
    data = work / "out" / "E1" / "raw_responses.jsonl"
    p = _spawn(argv, work)
    try:
        wait_until(lambda: _handles_term(p.pid))
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(10) == 128 + signal.SIGTERM
        [writer] = wait_until(lambda: _writers_of(data))
        assert _session(writer) == writer != p.pid  # its own session, not the run's group
        # It holds nothing open between records (while it appends, the file is its fd 0).
        wait_until(lambda: os.listdir(f"/proc/{writer}/fd") == [])
        wait_until(lambda: data.exists() and data.read_text().count('"ESC-') >= 2)
    finally:
        for pid in _writers_of(data):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _writers_of(data))


def test_the_daemon_adversary_double_forks_a_writer_and_runs_on(tmp_path: Path) -> None:
    work, argv = _adversary(tmp_path, "daemon")
    data = work / "out" / "E1" / "raw_responses.jsonl"
    p = _spawn(argv, work)
    try:
        [writer] = wait_until(lambda: _writers_of(data))
        # A session of its own whose leader (the first child) is gone: no terminal, no group.
        assert _session(writer) != _session(p.pid) and procs.alive(p.pid)
        wait_until(lambda: not procs.alive(_session(writer)))
        ppid = int(Path(f"/proc/{writer}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid != p.pid  # orphaned by the double fork
        wait_until(lambda: data.exists() and data.read_text().count('"ESC-') >= 2)
    finally:
        p.kill()
        p.wait(10)
        for pid in _writers_of(data):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _writers_of(data))


def test_the_renamed_adversary_runs_the_client_under_another_argv0(tmp_path: Path) -> None:
    from tests.soak.adversaries import RENAMED_ARGV0
    from tests.soak.run import Run

    work, argv = _adversary(tmp_path, "renamed")
    run = Run("n", "here", work, ["E1"], work / "l.jsonl", "l.jsonl", "renamed")
    p = _spawn(argv, work)
    try:
        wait_until(lambda: procs.argv(p.pid)[:1] == [RENAMED_ARGV0])
        assert procs.argv(p.pid)[1:] == argv[1:]  # the same process, re-executed
        wait_until(lambda: [x for x, _, _ in run.processes()] == [p.pid])
    finally:
        p.kill()
        p.wait(10)


# --------------------------------------------------------------- lifecycle invariants


class _Found:
    """Collects the violations a check reports."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, kind: str, summary: str, evidence: dict[str, Any], key: Any = None) -> None:
        self.items.append((kind, summary, evidence))

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.items]


def _death(run: str = "phoenix", pid: int = 100, t: float = 1000.0, **kw: Any) -> dict[str, Any]:
    return {"run": run, "pid": pid, "time": t, "signal": "SIGKILL", "restart": True,
            "backoff": 6.0, "watcher_killed": False, **kw}  # fmt: skip


def _died_alert(run: str, pid: int) -> str:
    return (
        f"runwatch critical: {run}\nRun stopped (pid {pid}) on here: died (signal 9, SIGKILL), "
        "not stopped through runwatch, datasets not done."
    )


def test_a_death_alerted_after_two_refreshes_or_never_is_unalerted() -> None:
    from tests.soak import lifecycle

    deaths = [_death(pid=1, t=100.0), _death(pid=2, t=200.0), _death(pid=3, t=300.0)]
    deaths.append(_death(pid=4, t=400.0))  # the soak ended: no refresh after it
    ticks = [101.0, 103.0, 105.0, 201.0, 203.0, 205.0, 301.0, 303.0, 305.0]
    received = [
        (103.5, _died_alert("phoenix", 1)),  # before the 2nd refresh after it + 1 s
        (204.5, _died_alert("phoenix", 2)),  # 1.5 s after the 2nd refresh: late
        (301.0, _died_alert("phoenix", 33)),  # another pid: not pid 3's alert
        (301.0, "runwatch info: phoenix\nRun finished by itself (pid 3) on here."),
        (404.5, _died_alert("phoenix", 4)),  # 2 x 2 s + 0.5 s
    ]
    found = _Found()
    latencies = lifecycle.check_deaths_alerted(deaths, received, ticks, 2.0, found)
    assert found.kinds() == ["death-unalerted", "death-unalerted"]
    assert [e["death"]["pid"] for _, _, e in found.items] == [2, 3]
    assert "after 4.5 s" in found.items[0][1] and "never" in found.items[1][1]
    assert latencies == [3.5, 4.5, 4.5]
    late = [(405.5, _died_alert("phoenix", 4))]
    assert _collect(lifecycle.check_deaths_alerted, deaths[3:], late, ticks, 2.0) == [
        "death-unalerted"
    ]


def _collect(check: Any, *args: Any) -> list[str]:
    found = _Found()
    check(*args, found)
    return found.kinds()


def _died_event(run: str, pid: int) -> dict[str, Any]:
    return {"kind": "run-died", "run": run, "host": "here", "key": f"run-died|here|{run}|{pid}",
            "message": f"Run stopped (pid {pid}) on here: gone, ...", "time": 1.0}  # fmt: skip


def test_run_died_for_a_finished_or_stopped_process_is_false() -> None:
    from tests.soak import lifecycle

    deaths = [_death(pid=1)]
    quiet = [
        {"run": "finisher", "pid": 2, "how": "finished", "from": 0.0, "until": None},
        {"run": "local", "pid": 3, "how": "stopped", "from": 0.0, "until": 1.0},
    ]
    events = [_died_event("phoenix", 1), _died_event("finisher", 2), _died_event("local", 3)]
    events.append(_died_event("finisher", 2))  # the same event twice: one violation
    events.append(_died_event("remote", 4))  # not the soak's doing: returned, not judged
    found = _Found()
    other = lifecycle.check_run_died(events, deaths, quiet, found)
    assert found.kinds() == ["false-run-died", "false-run-died"]
    assert "finished by itself" in found.items[0][1] and "through runwatch" in found.items[1][1]
    assert [lifecycle.died_pid(e) for e in other] == [4]
    assert not _collect(lifecycle.check_run_died, events[:1], deaths, quiet)


def test_a_data_loss_alarm_the_soak_did_not_cause_is_false() -> None:
    from tests.soak import lifecycle

    changes = [{"kind": "rotate-rename", "path": "/w/out/A1/raw.jsonl", "t_start": 100.0,
                "t_end": 100.1}]  # fmt: skip
    events = [
        {"kind": "data-shrank", "title": "local A1", "key": "a", "time": 102.0,
         "message": "/w/out/A1/raw.jsonl shrank from 10 to 0 records"},  # the soak's rotation
        {"kind": "data-shrank", "title": "local A2", "key": "b", "time": 102.0,
         "message": "/w/out/A2/raw.jsonl shrank from 10 to 0 records"},  # another file
        {"kind": "stalled", "title": "local A2", "key": "c", "time": 102.0, "message": "x"},
    ]  # fmt: skip
    audit = [
        {"action": "data-loss", "path": "/w/out/A1/raw.jsonl", "time": 101.0},
        {"action": "data-loss", "path": "/w/out/A1/raw.jsonl", "time": 500.0},  # long after
        {"action": "move-aside", "path": "/w/out/A2/raw.jsonl", "time": 101.0},
    ]
    found = _Found()
    explained = lifecycle.check_data_loss(events, audit, changes, found)
    assert found.kinds() == ["false-data-loss", "false-data-loss"]
    assert "A2" in found.items[0][1] and found.items[1][2]["audit"]["time"] == 500.0
    assert explained == 2


def _restart(run: str, t: float, ok: bool = True, pid: int = 9) -> dict[str, Any]:
    by = f"root@box, pid {pid}, runwatch watch"
    return {"action": "auto-restart", "run": run, "time": t, "ok": ok, "by": by,
            "detail": "on_exit = restart"}  # fmt: skip


def test_a_death_not_restarted_per_policy_or_a_stop_restarted_is_a_policy_violation() -> None:
    from tests.soak import lifecycle

    deaths = [
        _death(pid=1, t=100.0, next=200.0),  # restarted at 108: on time
        _death(pid=2, t=200.0, next=300.0),  # restarted at 202: before its backoff
        _death(pid=3, t=300.0),  # never restarted
        _death(pid=4, t=400.0, watcher_killed=True),  # intent-dropped judges it
        _death(run="mortal", pid=5, t=500.0, restart=False),  # on_exit = alert
    ]
    windows = [
        {"run": "finisher", "pid": 6, "how": "finished", "from": 600.0, "until": 700.0},
        {"run": "mortal", "pid": 5, "how": "died (on_exit = alert)", "from": 500.0,
         "until": 515.0},
    ]  # fmt: skip
    restarts = [_restart("phoenix", 108.0), _restart("phoenix", 202.0), _restart("finisher", 650.0)]
    restarts.append(_restart("mortal", 720.0))  # after the soak launched it again: not judged
    found = _Found()
    delays = lifecycle.check_restart_policy(deaths, windows, restarts, found)
    assert found.kinds() == ["restart-policy"] * 3
    summaries = [s for _, s, _ in found.items]
    assert "pid 2" in summaries[0] and "before its backoff" in summaries[0]
    assert "pid 3" in summaries[1] and "not restarted" in summaries[1]
    assert "finisher pid 6 finished" in summaries[2]
    assert delays == [8.0]
    assert lifecycle.auto_restarts([{"action": "auto-restart", "detail": "gave up after 3"}]) == []


def test_an_intent_neither_carried_out_nor_abandoned_by_the_next_watcher_is_dropped() -> None:
    from tests.soak import lifecycle

    def kill(pid: int, t: float) -> dict[str, Any]:
        return {"run": "phoenix", "pid": pid, "intent": {"not_before": t + 4.0}, "killed": t,
                "restarted": t + 1.0, "new_pid": 50 + pid}  # fmt: skip

    kills = [kill(1, 100.0), kill(2, 200.0), kill(3, 300.0), kill(4, 400.0)]
    restarts = [
        _restart("phoenix", 105.0, pid=51),  # by the new watcher: carried out
        _restart("phoenix", 205.0, pid=99),  # by another process: not the new watcher's
        _restart("phoenix", 400.0 + 4.0 + lifecycle.INTENT_BOUND_S + 5, pid=54),  # too late
    ]
    events = [{"kind": "restart-abandoned", "run": "phoenix", "time": 301.5}]
    found = _Found()
    done = lifecycle.check_intents(kills, restarts, events, found)
    assert found.kinds() == ["intent-dropped", "intent-dropped"]
    assert [e["kill"]["pid"] for _, _, e in found.items] == [2, 4]
    assert done == 1


def test_watch_silent_uses_the_refresh_seconds_the_watcher_states(tmp_path: Path) -> None:
    import json

    from tests.soak.watcher import Generation, SoakWatcher

    watch = SoakWatcher(tmp_path)
    try:
        proc = subprocess.Popen([sys.executable, "-c", ""])
        proc.wait(30)
        out = tmp_path / "w.jsonl"
        lines = [
            {"note": "watching 1 host(s), 1 run(s) every 5 s; alerts to none", "time": 0.0},
            {"tick": 0, "time": 1.0},
            {"tick": 1, "time": 10.0},  # 9 s: within 2 x 5 s
            {"tick": 2, "time": 21.0},  # 11 s: silent
        ]
        out.write_text("".join(json.dumps(x) + "\n" for x in lines))
        gen = Generation(0, proc, out, tmp_path / "w.err", 0.0, stopped=True)
        (tmp_path / "w.err").write_text("")
        assert gen.refresh_s() == 5.0
        watch.gens.append(gen)
        found = _Found()
        figures = watch.check(found)
        assert found.kinds() == ["watch-silent"]
        assert found.items[0][2]["gap_s"] == 11.0 and figures["refresh_seconds"] == 5.0
        # A watcher the soak SIGKILLed is no death, and its silence up to the kill counts.
        gen.stopped, gen.killed = False, 40.0
        found = _Found()
        watch.check(found)
        assert found.kinds() == ["watch-silent", "watch-silent"]
        assert found.items[1][2]["gap_s"] == 19.0
    finally:
        watch.close()


def test_a_watchers_own_child_alive_after_it_ended_is_an_orphan(tmp_path: Path) -> None:
    import json
    import time

    from tests.soak import watcher as soak_watcher
    from tests.soak.watcher import Generation, SoakWatcher

    watch = SoakWatcher(tmp_path)
    # A watcher that leaves a child behind (as an agent that does not see its stdin close would),
    # and launches a "run" (a launch token) that must live on.
    leave = (
        "import os, subprocess, sys\n"
        "a = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "env = dict(os.environ, RUNWATCH_LAUNCH='cfg:run:launch')\n"
        "b = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env=env)\n"
        "print(a.pid, b.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", leave], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    child, run = (int(x) for x in proc.stdout.readline().split())
    try:
        out = tmp_path / "w.jsonl"
        out.write_text(json.dumps({"tick": 0, "time": time.time()}) + "\n")
        (tmp_path / "w.err").write_text("")
        watch.gens.append(Generation(0, proc, out, tmp_path / "w.err", 0.0))
        soak_watcher.ORPHAN_GRACE_S = 0.5
        wait_until(lambda: procs.launch_token(run) == "cfg:run:launch")  # its exec is done
        watch.kill()
        assert [c[0] for c in watch.gens[0].children] == [child]  # the run is not its own
        found = _Found()
        watch.check(found)
        assert found.kinds() == ["query-orphan"]
        assert found.items[0][2]["processes"][0]["pid"] == child
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: not procs.alive(child))
        found = _Found()
        watch.check(found)
        assert found.kinds() == []
    finally:
        soak_watcher.ORPHAN_GRACE_S = 10.0
        for pid in (child, run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        watch.close()
