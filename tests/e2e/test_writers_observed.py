"""O4: writers observed, not only inferred. A writer that appends without keeping the file open (an
appender that opens, appends and closes per record; a shell loop with ``>>``), run by another Unix
user, is invisible to the descriptors the ``writers`` check reads; the gate's ``quiet`` step sees
the file grow and refuses the start: a launch, a restart after its stop (the run stays stopped), a
Slurm submission. A quiet file, and a restart whose only writer was the run, go ahead.
Real processes, the real agent, a second Unix user, the real single-node Slurm."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from supervisor import quiet
from supervisor.hosts import Host
from supervisor.plan import Step
from tests.e2e.test_agent_package import _fits
from tests.fixtures_actions import (
    DemoRun,
    engine_for,
    launch,
    raw_record,
    restart,
    run_pids,
    runwatch,
    why,
)
from tests.fixtures_procs import FakeRuns
from tests.fixtures_slurm import SlurmCluster
from tests.fixtures_users import OtherUser
from tests.waiting import wait_until

# Opens, appends one whole record and closes, every ~0.3 s: no descriptor outlives a write.
APPENDER = r"""
import json, sys, time
path, prefix = sys.argv[1], sys.argv[2]
n = 0
while True:
    rec = {"sample_id": "%s-%06d" % (prefix, n), "output_ids": [1, 2, 3],
           "prompt_tokens": 3, "completion_tokens": 3, "finish_reason": "stop"}
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
    n += 1
    time.sleep(0.3)  # the writer's own pace
"""
# The same as a shell loop; the record and the path are arguments, never shell text.
SHELL_LOOP = 'while :; do printf "%s\\n" "$1" >> "$2"; sleep 0.3; done'
OTHER = "other"


class Appenders:
    """Writers started by a test; each is killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def python(self, user: OtherUser, path: Path) -> subprocess.Popen[bytes]:
        """The open-append-close writer, as ``user``, into ``path``."""
        return self.start([*user.prefix, user.python, "-c", APPENDER, str(path), OTHER])

    def shell(self, user: OtherUser, path: Path) -> subprocess.Popen[bytes]:
        """The ``>>`` loop, as ``user``, into ``path``."""
        line = raw_record(f"{OTHER}-sh").decode().rstrip("\n")
        return self.start([*user.prefix, "/bin/sh", "-c", SHELL_LOOP, "sh", line, str(path)])

    def of_kind(self, kind: str, user: OtherUser, path: Path) -> subprocess.Popen[bytes]:
        return self.python(user, path) if kind == "open-append-close" else self.shell(user, path)

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=10)
        self.procs.clear()


@pytest.fixture
def appenders() -> Iterator[Appenders]:
    a = Appenders()
    try:
        yield a
    finally:
        a.stop()


def _shared_demo(fake_runs: FakeRuns, url: str, **kw: Any) -> DemoRun:
    """A demo run under a directory every user reaches, its B1 file seeded with two records of
    the run's format and writable by the second user."""
    demo = DemoRun(fake_runs.dir / "observed", url, **kw)
    data = demo.data_file("B1")
    data.parent.mkdir(parents=True)
    data.write_bytes(raw_record("B1-000000") + raw_record("B1-000001"))
    demo.root.chmod(0o755)  # the config's directory: another user may not replace it (T16)
    for d in (demo.workdir, data.parent.parent, data.parent):
        d.chmod(0o777)
    data.chmod(0o666)
    return demo


def _grows(path: Path, than: int) -> bool:
    return path.stat().st_size > than


def _only_the_other_writer_added(before: bytes, after: bytes) -> None:
    """``after`` is ``before`` plus whole records of the other writer, nothing of a run's."""
    assert after.startswith(before) and len(after) > len(before)
    added = [json.loads(line)["sample_id"] for line in after[len(before) :].splitlines()]
    assert added and all(s.startswith(f"{OTHER}-") for s in added), added


def _observed(result: Any) -> Step:
    step = result.failed_step
    assert step is not None and step.name == "quiet", why(result)
    return step


def _audited(state_home: Path) -> list[dict[str, Any]]:
    log = state_home / "audit.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# --------------------------------------------------------------------------- the agent's op


async def test_o4_observe_files_sees_another_users_open_append_close_writer(
    host: Host, fake_runs: FakeRuns, appenders: Appenders, second_user: OtherUser
) -> None:
    data = fake_runs.dir / "B1.jsonl"
    data.write_bytes(raw_record("B1-0"))
    data.chmod(0o666)
    quiet_file = fake_runs.dir / "B2.jsonl"
    quiet_file.write_bytes(raw_record("B2-0"))
    appenders.python(second_user, data)
    size = data.stat().st_size
    wait_until(lambda: _grows(data, size), timeout=30, what="the other writer's first record")

    seen = await host.request(
        "observe_files", {"paths": [str(quiet_file), str(data)], "window_s": 60.0}, timeout=120
    )
    _fits("observe_files", seen)
    assert seen["changed"] is True
    still, grew = seen["files"]
    assert still["change"] == "" and still["bytes"] == 0
    assert grew["change"] == "grew" and grew["bytes"] > 0 and grew["seconds"] > 0, grew
    # the watch ends at the sample that saw the first change, before its window
    assert seen["elapsed_s"] == grew["seconds"] < seen["window_s"] == 60.0, seen
    assert grew["before"]["ino"] == grew["after"]["ino"] == data.stat().st_ino


async def test_o4_observe_files_watches_a_quiet_file_for_the_whole_window(
    host: Host, fake_runs: FakeRuns
) -> None:
    data = fake_runs.dir / "B1.jsonl"
    data.write_bytes(raw_record("B1-0"))
    missing = fake_runs.dir / "B2.jsonl"
    seen = await host.request(
        "observe_files", {"paths": [str(data), str(missing)], "window_s": 1.0}, timeout=30
    )
    _fits("observe_files", seen)
    assert seen["changed"] is False and seen["elapsed_s"] >= 1.0, seen
    assert [(f["change"], f["bytes"]) for f in seen["files"]] == [("", 0), ("", 0)]
    assert seen["files"][1]["before"] is None and seen["files"][1]["after"] is None


async def test_o4_a_long_watch_holds_up_no_other_op(host: Host, fake_runs: FakeRuns) -> None:
    """The agent answers each request on a thread of its own: a ping sent after a 60 s watch is
    answered while the watch still runs (which the records written then end)."""
    data = fake_runs.dir / "B1.jsonl"
    data.write_bytes(raw_record("B1-0"))
    await host.request("ping", {})
    watch = asyncio.ensure_future(
        host.request("observe_files", {"paths": [str(data)], "window_s": 60.0}, timeout=120)
    )
    # Tasks start in the order they were made: the watch is sent before the ping.
    ping = asyncio.ensure_future(host.request("ping", {}, timeout=30))
    assert (await ping)["pong"] is True
    assert not watch.done()
    # The watch may take its first sample only now (the agent's thread was not run yet): a
    # record each half second until it sees one.
    n = 0
    while not watch.done():
        n += 1
        with data.open("ab") as f:
            f.write(raw_record(f"B1-{n}"))
        await asyncio.wait({watch}, timeout=0.5)
    seen = watch.result()
    assert seen["changed"] is True and seen["elapsed_s"] < seen["window_s"] == 60.0, seen
    assert seen["files"][0]["change"] == "grew"


def test_o4_the_window_is_three_record_intervals_between_2_and_30_s() -> None:
    """From the run's history ``(t, records, tokens, alive)``: the pace while it ran."""
    assert quiet.window_for(None) == 2.0
    # a record every 0.1 s (100 per 10 s point): the floor
    fast = [(1000.0 + 10 * i, 100.0 * i, 0.0, 1.0) for i in range(20)]
    assert quiet.record_interval(fast) == pytest.approx(0.1)
    assert quiet.window_for(quiet.record_interval(fast)) == 2.0
    # one record every 4 s: 12 s
    steady = [(1000.0 + 8 * i, 2.0 * i, 0.0, 1.0) for i in range(20)]
    assert quiet.window_for(quiet.record_interval(steady)) == pytest.approx(12.0)
    # one record a minute, seen at 10 s points: capped at 30 s
    slow = [(1000.0 + 10 * i, float(i // 6), 0.0, 1.0) for i in range(60)]
    assert quiet.record_interval(slow) == pytest.approx(60.0)
    assert quiet.window_for(quiet.record_interval(slow)) == 30.0
    # an hour stopped, then a rescan (the count went down): the median stays the running pace
    stopped = [(4000.0, 38.0, 0.0, 0.0), (7600.0, 38.0, 0.0, 0.0)]
    rescan = [(7608.0, 0.0, 0.0, 1.0), (7616.0, 2.0, 0.0, 1.0), (7624.0, 4.0, 0.0, 1.0)]
    assert quiet.record_interval([*steady, *stopped, *rescan]) == pytest.approx(4.0)
    # launched and stopped between two looks: its records say nothing of its pace
    blips = [(1000.0 + 20 * i, 3.0 * i, 0.0, 0.0) for i in range(10)]
    assert quiet.record_interval(blips) is None
    # no growth while it ran, or a history older than the alive column: unknown
    assert quiet.record_interval([(1.0, 5.0, 0.0, 1.0), (11.0, 5.0, 0.0, 1.0)]) is None
    assert quiet.record_interval([(1.0, 5.0, 0.0), (11.0, 9.0, 0.0)]) is None


# --------------------------------------------------------------------------- launch


WRITERS = ["open-append-close", "shell-loop"]


@pytest.mark.parametrize("kind", WRITERS)
async def test_o4_launch_refused_while_another_user_appends(
    kind: str,
    fake_runs: FakeRuns,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    appenders: Appenders,
    second_user: OtherUser,
) -> None:
    demo = _shared_demo(fake_runs, slow_endpoint.url)
    kill_runs_in.append(demo.workdir)
    data = demo.data_file("B1")
    before = data.read_bytes()
    appenders.of_kind(kind, second_user, data)
    wait_until(lambda: _grows(data, len(before)), timeout=30, what="the other writer")
    async with engine_for(demo) as engine:
        result = await launch(engine, "demo")
    assert not result.ok
    step = _observed(result)
    assert f"something else is appending to {data}: " in step.detail
    assert " bytes in " in step.detail and "nothing was launched" in step.detail
    assert "lsof" in step.detail and "stop it, then launch again" in step.detail
    writers = next(s for s in result.steps if s.name == "writers")
    assert writers.state == "ok", why(result)  # the descriptors showed nothing
    assert [s.state for s in result.steps if s.name in ("data-repair", "launch")] == [
        "pending",
        "pending",
    ]
    assert run_pids(demo.workdir) == []
    appenders.stop()
    _only_the_other_writer_added(before, data.read_bytes())
    (entry,) = _audited(state_home)
    assert entry["action"] == "launch" and entry["ok"] is False
    failed = [s for s in entry["steps"] if s["ok"] is False]
    assert [s["name"] for s in failed] == ["quiet"] and "bytes in" in failed[0]["detail"]


@pytest.mark.parametrize("kind", WRITERS)
def test_o4_cli_launch_refused_while_another_user_appends(
    kind: str,
    fake_runs: FakeRuns,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    appenders: Appenders,
    second_user: OtherUser,
) -> None:
    demo = _shared_demo(fake_runs, slow_endpoint.url)
    kill_runs_in.append(demo.workdir)
    data = demo.data_file("B1")
    before = data.read_bytes()
    appenders.of_kind(kind, second_user, data)
    wait_until(lambda: _grows(data, len(before)), timeout=30, what="the other writer")
    out = runwatch("launch", "demo", "-c", str(demo.config_path), "--yes")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "[FAILED] quiet" in out.stdout, out.stdout
    assert f"something else is appending to {data}: " in out.stdout
    assert " bytes in " in out.stdout
    assert run_pids(demo.workdir) == []
    appenders.stop()
    _only_the_other_writer_added(before, data.read_bytes())
    entries = json.loads(runwatch("audit", "--json").stdout)
    assert [(e["action"], e["ok"]) for e in entries] == [("launch", False)]


async def test_o4_a_quiet_file_passes_and_the_launch_goes_ahead(
    fake_runs: FakeRuns, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = _shared_demo(fake_runs, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        result = await launch(engine, "demo")
        assert result.ok and result.identity is not None, why(result)
    step = next(s for s in result.steps if s.name == "quiet")
    assert step.state == "ok", why(result)
    # At least the window asked for: the host watches longer after a recent change (3 x its
    # age), and how recent the fixture's writes are is the machine's pace, not the test's.
    assert step.data["observed"]["asked_s"] == 2.0
    assert step.data["observed"]["window_s"] >= step.data["observed"]["asked_s"]
    assert "no other writer: 2 data file(s) unchanged for " in step.detail, step.detail
    # The step says the window the host watched, and why.
    observed = step.data["observed"]
    if observed["window_s"] > observed["asked_s"]:
        lengthened = "(lengthened from 2.0 s, no record rate known yet, 2 to 30 s: 3 x the time "
        assert lengthened + "since a file last changed, at most 30 s)" in step.detail, step.detail
    else:
        assert "(no record rate known yet, 2 to 30 s)" in step.detail, step.detail
    assert run_pids(demo.workdir) == [int(result.identity["pid"])]


async def test_o4_the_window_follows_the_pace_the_history_recorded(
    fake_runs: FakeRuns, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """A run seen writing a record every 1.2 s: the quiet window is 3.6 s."""
    from supervisor.config import load_config
    from supervisor.history import History, history_path

    demo = _shared_demo(fake_runs, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    seen = History(history_path(load_config(demo.config_path).key))
    now = time.time()
    for i in range(30):
        seen.add("run|local|demo", now - 600 + 12 * i, 10.0 * i, 100.0 * i, 1.0)
    seen.save(now)
    async with engine_for(demo) as engine:
        result = await launch(engine, "demo")
        assert result.ok, why(result)
    step = next(s for s in result.steps if s.name == "quiet")
    # The rule is said whether or not the host lengthened the window after a recent change (how
    # recent the fixture's writes are is the machine's pace, not the test's).
    assert "3 x the run's median record interval of 1.2 s, 2 to 30 s" in step.detail, step.detail
    assert step.data["observed"]["asked_s"] == pytest.approx(3.6)
    assert step.data["observed"]["window_s"] >= step.data["observed"]["asked_s"]


# --------------------------------------------------------------------------- restart


async def test_o4_restart_of_a_live_run_whose_only_writer_is_itself_goes_ahead(
    fake_runs: FakeRuns, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = _shared_demo(fake_runs, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        started = await launch(engine, "demo")
        assert started.ok and started.identity is not None, why(started)
        size = demo.data_file("B1").stat().st_size
        wait_until(lambda: _grows(demo.data_file("B1"), size), timeout=60, what="run's records")
        result = await restart(engine, "demo")
        assert result.ok and result.identity is not None, why(result)
    names = [s.name for s in result.steps]
    assert names.index("stop") < names.index("quiet") < names.index("data-repair")
    step = next(s for s in result.steps if s.name == "quiet")
    assert step.state == "ok" and "unchanged for" in step.detail, why(result)
    assert run_pids(demo.workdir) == [int(result.identity["pid"])]


async def test_o4_restart_refused_after_the_stop_leaves_the_run_stopped(
    fake_runs: FakeRuns,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    appenders: Appenders,
    second_user: OtherUser,
) -> None:
    """The other writer starts once the run is stopped: the relaunch is refused, and no
    rollback starts the old command line beside it (never trade data for uptime)."""
    demo = _shared_demo(fake_runs, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    data = demo.data_file("B1")

    def on_step(step: Step) -> None:
        if step.name == "stop" and step.state == "ok":
            size = data.stat().st_size
            appenders.python(second_user, data)
            wait_until(lambda: _grows(data, size), timeout=30, what="the other writer")

    async with engine_for(demo) as engine:
        started = await launch(engine, "demo")
        assert started.ok and started.identity is not None, why(started)
        old = int(started.identity["pid"])
        result = await restart(engine, "demo", on_step=on_step)
    assert not result.ok
    step = _observed(result)
    assert f"something else is appending to {data}: " in step.detail
    assert "the run is stopped and stays stopped: nothing was launched" in step.detail
    assert "`runwatch launch demo`" in step.detail
    assert result.rollback is None
    assert run_pids(demo.workdir) == [] and old not in run_pids(demo.workdir)
    entry = _audited(state_home)[-1]
    assert entry["action"] == "restart" and entry["ok"] is False and not entry.get("rollback")
    assert not [e for e in _audited(state_home) if e["action"] == "rollback"]


# --------------------------------------------------------------------------- Slurm


async def test_o4_slurm_submission_refused_while_another_user_appends(
    fake_runs: FakeRuns,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    kill_runs_in: list[Path],
    appenders: Appenders,
    second_user: OtherUser,
) -> None:
    """A login node sees the shared filesystem: the growth is seen there, and nothing is
    submitted."""
    demo = _shared_demo(
        fake_runs, slow_endpoint.url, max_samples=300, host_name="login",
        host_toml='[[hosts]]\nname = "login"\nlocal = true\nkind = "slurm"\n',
        run_toml='stop_grace_seconds = 5.0\n[runs.slurm]\npartition = "rw"\ntime = "0:30:00"\n',
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    data = demo.data_file("B1")
    before = data.read_bytes()
    jobs = slurm_env.jobs()
    appenders.python(second_user, data)
    wait_until(lambda: _grows(data, len(before)), timeout=30, what="the other writer")
    async with engine_for(demo) as engine:
        result = await launch(engine, "demo")
    step = _observed(result)
    assert f"something else is appending to {data}: " in step.detail and "bytes in" in step.detail
    assert next(s for s in result.steps if s.name == "launch").state == "pending"
    assert slurm_env.jobs() == jobs
    appenders.stop()
    _only_the_other_writer_added(before, data.read_bytes())
    (entry,) = _audited(state_home)
    assert entry["action"] == "launch" and entry["ok"] is False


async def test_o4_a_file_changed_moments_ago_is_watched_longer_than_a_slow_writers_pace(
    host: Host, fake_runs: FakeRuns
) -> None:
    """A writer that appends every few seconds, slower than the window: the file was changed
    2 s before the watch, so the watch lasts at least 3 x 2 s and sees its next record."""
    data = fake_runs.dir / "B1.jsonl"
    data.write_bytes(raw_record("B1-0"))
    two_s_ago = time.time_ns() - 2_000_000_000
    os.utime(data, ns=(two_s_ago, two_s_ago))
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; time.sleep(2.5); "
            "open(sys.argv[1], 'ab').write(sys.argv[2].encode())",
            str(data),
            raw_record("B1-1").decode(),
        ]
    )
    try:
        seen = await host.request(
            "observe_files",
            {"paths": [str(data)], "window_s": 1.0, "recent_factor": 3.0, "recent_max_s": 30.0},
            timeout=60,
        )
    finally:
        writer.wait(timeout=30)
    assert seen["window_s"] >= 5.9, seen
    assert seen["changed"] is True and seen["files"][0]["change"] == "grew", seen


async def test_o4_an_in_place_rewrite_that_puts_the_mtime_back_is_seen(
    host: Host, fake_runs: FakeRuns
) -> None:
    data = fake_runs.dir / "B1.jsonl"
    data.write_bytes(b'{"finish_reason": "stop"}\n')
    mtime = data.stat().st_mtime_ns
    stop = fake_runs.dir / "rewriter.stop"
    # Rewrites the record in place every half second, putting the mtime back each time, until
    # told to stop: whenever the watch takes its first sample, a rewrite comes after it.
    rewrite = (
        "import os, sys, time\n"
        "p, stop = sys.argv[1], sys.argv[2]\n"
        "st = os.stat(p)\n"
        "while not os.path.exists(stop):\n"
        "    time.sleep(0.5)\n"
        "    data = open(p, 'rb').read()\n"
        "    data = data.swapcase()\n"
        "    open(p, 'r+b').write(data)\n"
        "    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", rewrite, str(data), str(stop)])
    try:
        seen = await host.request(
            "observe_files", {"paths": [str(data)], "window_s": 60.0}, timeout=120
        )
    finally:
        stop.touch()
        writer.wait(timeout=30)
    assert data.read_bytes().lower() == b'{"finish_reason": "stop"}\n'
    assert data.stat().st_mtime_ns == mtime
    assert seen["changed"] is True and seen["files"][0]["change"] == "modified", seen
