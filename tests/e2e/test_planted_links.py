"""Links planted by another user (T48): a dataset directory is 0777 (teams share them), and
another user replaces a data file, a lock or a whole dataset directory by a symbolic link to a
file of root's; or the state dir is reached through another user's link in a world-writable
parent. Nothing runwatch does on the host (repair, move aside, snapshots, tails, locks, a
launch, its own state) ever follows such a link, nor does what it only reads and reports (T49:
scans, first-pass counts, sidecars, input files, the quiet window, a client's options, a run's
workdir): each is refused with the path and the link named, and the file the link points at is
left byte for byte as it was.

Real parts: the agent as a process (``LocalHost``, run as root), a second Unix user
(``second_user``) that plants the links with ``ln``/``os.rename`` in its own processes, real
files in a directory every user reaches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import secrets
from supervisor.agent import slurm as slurmops
from supervisor.agent.protocol import AgentOpError
from supervisor.config import HostConfig
from supervisor.errors import AgentError, UnsafeState
from supervisor.hosts import LocalHost
from supervisor.paths import private_dir, state_dir
from tests.fixtures_data import make_raw
from tests.fixtures_procs import FakeRuns, shared_temp_base
from tests.fixtures_slurm import SlurmCluster
from tests.fixtures_users import OtherUser
from tests.waiting import wait_until

HOLDER = (
    "import sys, time\nf = open(sys.argv[1], 'a')\nprint('holding', flush=True)\ntime.sleep(600)\n"
)
"""A process of root's that holds a file open for writing (a daemon's log), until killed."""
ROOT_CONFIG = b"secret_setting = 4 X"
"""A root config of 20 bytes without a final newline: a 'torn tail' to a naive repair."""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A 0777 directory every user reaches (the team's dataset directory's parent)."""
    d = Path(tempfile.mkdtemp(prefix="runwatch-links-", dir=shared_temp_base()))
    d.chmod(0o777)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of root's, 0600, that no one else may write."""
    f = tmp_path / "root.conf"
    f.write_bytes(ROOT_CONFIG)
    f.chmod(0o600)
    assert len(f.read_bytes()) == 20
    return f


@pytest.fixture
async def agent() -> AsyncIterator[LocalHost]:
    host = LocalHost(HostConfig(name="local", local=True))
    await host.connect()
    try:
        yield host
    finally:
        await host.close()


def as_user(user: OtherUser, *argv: str) -> None:
    subprocess.run([*user.prefix, *argv], check=True, capture_output=True)


def dataset(shared: Path, user: OtherUser, victim: Path) -> tuple[Path, Path]:
    """``<shared>/out/B1`` (0777) where the other user replaced ``raw_responses.jsonl`` by a
    link to ``victim``. Returns (the data file, the dataset directory)."""
    b1 = shared / "out" / "B1"
    b1.mkdir(parents=True)
    for d in (b1.parent, b1):
        d.chmod(0o777)
    data = b1 / "raw_responses.jsonl"
    data.write_bytes(b'{"sample_id": "a"}\n{"sample_id": "b", "tor')  # a torn tail
    as_user(user, "rm", "-f", str(data))
    as_user(user, "ln", "-s", str(victim), str(data))
    assert data.is_symlink() and os.lstat(data).st_uid == user.uid
    return data, b1


def named(text: str, path: Path, link: Path, user: OtherUser) -> None:
    """``text`` refuses ``path`` for the other user's link ``link``."""
    assert f"refusing {path}" in text, text
    assert str(link) in text and f"owned by uid {user.uid}" in text, text
    assert "symbolic link" in text, text


def refused(err: pytest.ExceptionInfo[AgentError], path: Path, link: Path, user: OtherUser) -> None:
    text = str(err.value)
    assert "unsafe-path" in text, text
    named(text, path, link, user)


def snapshot_root(out: Path) -> Path:
    """Where the snapshots of a run writing into ``out`` are kept."""
    return out / ".runwatch" / "snapshots" / "B1"


async def not_kept(
    agent: LocalHost, data: Path, link: Path, user: OtherUser, root: Path
) -> list[dict[str, Any]]:
    """``snapshot_check`` and ``snapshot_take`` of ``data`` report it unprotected for the other
    user's ``link`` (so a start is refused) and keep no copy of it; the snapshots of ``root``."""
    params: dict[str, Any] = {"paths": [str(data)], "root": str(root), "max_bytes": 1 << 20}
    checked = await agent.request("snapshot_check", params)
    [entry] = checked["files"]
    assert entry["method"] == "none", checked
    named(entry["reason"], data, link, user)
    [why] = checked["unprotected"]
    assert why.startswith(f"{data}: "), why
    named(why, data, link, user)
    taken = await agent.request("snapshot_take", dict(params, keep=3, run="B1"))
    assert taken["id"] == "" and taken["files"] == [], taken
    [why] = taken["unprotected"]
    named(why, data, link, user)
    if root.exists():
        copies = [f for f in root.rglob("*") if f.is_file() and f.name != "manifest.json"]
        assert all(ROOT_CONFIG not in f.read_bytes() for f in copies), copies
    listed = await agent.request("snapshot_list", {"root": str(root)})
    snapshots: list[dict[str, Any]] = listed["snapshots"]
    return snapshots


def untouched(victim: Path) -> None:
    assert victim.read_bytes() == ROOT_CONFIG
    assert oct(victim.stat().st_mode & 0o777) == oct(0o600)
    assert not list(victim.parent.glob("root.conf.*")), "a backup or copy was made beside it"


async def test_t48_the_torn_tail_repair_never_truncates_through_another_users_link(
    shared: Path, victim: Path, second_user: OtherUser, agent: LocalHost
) -> None:
    data, b1 = dataset(shared, second_user, victim)
    with pytest.raises(AgentError) as err:
        await agent.request("repair_tail", {"path": str(data)})
    refused(err, data, data, second_user)
    untouched(victim)
    assert not list(b1.glob("*.broken*"))


async def test_t48_move_aside_snapshots_and_tails_refuse_another_users_link(
    shared: Path, victim: Path, second_user: OtherUser, agent: LocalHost
) -> None:
    data, b1 = dataset(shared, second_user, victim)
    with pytest.raises(AgentError) as err:
        await agent.request("move_aside", {"path": str(data), "format": "legacy"})
    refused(err, data, data, second_user)
    assert data.is_symlink() and not list(b1.glob("raw_responses.jsonl.*"))
    root = snapshot_root(b1.parent)
    assert await not_kept(agent, data, data, second_user, root) == []
    assert not root.exists(), "a snapshot directory was made for nothing to keep"
    # a dataset directory that is the other user's link to a directory of root's
    root_dir = victim.parent / "rootdir"
    root_dir.mkdir(mode=0o700)
    (root_dir / data.name).write_bytes(ROOT_CONFIG)
    link = b1.parent / "B2"
    as_user(second_user, "ln", "-s", str(root_dir), str(link))
    assert await not_kept(agent, link / data.name, link, second_user, root) == []
    assert not root.exists(), "a snapshot directory was made for nothing to keep"
    assert os.listdir(root_dir) == [data.name]
    assert (root_dir / data.name).read_bytes() == ROOT_CONFIG
    with pytest.raises(AgentError) as err:
        await agent.request("tail_records", {"path": str(data), "count": 3})
    refused(err, data, data, second_user)
    with pytest.raises(AgentError) as err:
        await agent.request("tail_log", {"path": str(data)})
    assert "symbolic link" in str(err.value) and "secret_setting" not in str(err.value)
    untouched(victim)


async def test_t48_a_dataset_directory_replaced_by_another_users_link_is_refused(
    shared: Path, victim: Path, second_user: OtherUser, agent: LocalHost
) -> None:
    """The parent on the way is the link: ``out/B1`` -> a root directory holding a torn file."""
    out = shared / "out"
    out.mkdir()
    out.chmod(0o777)
    root_dir = victim.parent / "rootdir"
    root_dir.mkdir(mode=0o700)
    target = root_dir / "raw_responses.jsonl"
    target.write_bytes(ROOT_CONFIG)
    link = out / "B1"
    as_user(second_user, "ln", "-s", str(root_dir), str(link))
    data = link / "raw_responses.jsonl"
    for op, params in (
        ("repair_tail", {"path": str(data)}),
        ("move_aside", {"path": str(data), "format": "legacy"}),
        ("tail_records", {"path": str(data)}),
    ):
        with pytest.raises(AgentError) as err:
            await agent.request(op, params)
        refused(err, data, link, second_user)
        assert f"{link} on its way" in str(err.value)
    assert target.read_bytes() == ROOT_CONFIG and sorted(os.listdir(root_dir)) == [target.name]


async def test_t48_a_snapshot_is_never_taken_nor_restored_through_another_users_directory_link(
    shared: Path, victim: Path, second_user: OtherUser, agent: LocalHost
) -> None:
    """A snapshot of ``out/B1/raw_responses.jsonl`` is taken; then the other user moves the
    dataset directory ``out/B1`` away and puts its link to a directory of root's in its place.
    Another snapshot keeps nothing of what the link reaches, the verify names the link, and a
    restore is refused: nothing is created, moved or written in root's directory."""
    out = shared / "out"
    b1 = out / "B1"
    b1.mkdir(parents=True)
    for d in (out, b1):
        d.chmod(0o777)
    data = b1 / "raw_responses.jsonl"
    kept = b'{"sample_id": "a"}\n{"sample_id": "b"}\n'
    data.write_bytes(kept)
    root = snapshot_root(out)
    params: dict[str, Any] = {"paths": [str(data)], "root": str(root), "max_bytes": 1 << 20}
    first = await agent.request("snapshot_take", dict(params, keep=3, run="B1"))
    assert first["id"] and not first["unprotected"], first
    [entry] = first["files"]
    assert Path(entry["copy"]).read_bytes() == kept
    root_dir = victim.parent / "rootdir"
    root_dir.mkdir(mode=0o700)
    moved = out / "B1.moved"
    as_user(second_user, "mv", str(b1), str(moved))
    as_user(second_user, "ln", "-s", str(root_dir), str(b1))
    assert b1.is_symlink() and os.lstat(b1).st_uid == second_user.uid
    verified = await agent.request("snapshot_verify", {"root": str(root), "id": first["id"]})
    [damaged] = verified["damaged"]
    assert damaged["path"] == str(data) and damaged["bytes_now"] == 0, damaged
    named(damaged["why"], data, b1, second_user)
    for extra in ({}, {"damaged_only": True}, {"paths": [str(data)]}):
        # the file is missing behind the link: a restore would create it there
        with pytest.raises(AgentError) as err:
            await agent.request("snapshot_restore", {"root": str(root), "id": first["id"], **extra})
        refused(err, data, b1, second_user)
        assert f"{b1} on its way" in str(err.value)
        assert os.listdir(root_dir) == []
    # root's file behind the link: neither kept in a snapshot nor moved aside nor overwritten
    target = root_dir / data.name
    target.write_bytes(ROOT_CONFIG)
    snapshots = await not_kept(agent, data, b1, second_user, root)
    assert [s["id"] for s in snapshots] == [first["id"]]
    with pytest.raises(AgentError) as err:
        await agent.request("snapshot_restore", {"root": str(root), "id": first["id"]})
    refused(err, data, b1, second_user)
    assert os.listdir(root_dir) == [data.name] and target.read_bytes() == ROOT_CONFIG
    assert sorted(os.listdir(moved)) == [data.name] and (moved / data.name).read_bytes() == kept


async def test_t48_a_launch_over_another_users_link_starts_nothing(
    shared: Path, victim: Path, second_user: OtherUser, agent: LocalHost, tmp_path: Path
) -> None:
    """The client would append into the link's target: the launch is refused before it starts;
    a lock file replaced by a link is refused too."""
    data, b1 = dataset(shared, second_user, victim)
    marker = tmp_path / "started"
    params: dict[str, Any] = {
        "workdir": str(shared),
        "argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"],
        "log": str(tmp_path / "logs" / "run.log"),
        "lock_path": str(tmp_path / "locks" / "run.lock"),
        "data_files": [str(data)],
        "settle_s": 0.2,
    }
    with pytest.raises(AgentError) as err:
        await agent.request("launch", params, timeout=30)
    refused(err, data, data, second_user)
    assert "nothing was started" in str(err.value)
    assert not marker.exists()
    untouched(victim)
    # a lock of the run in the shared directory, swapped for a link to root's file
    lock = b1 / ".runwatch" / "run.lock"
    lock.parent.mkdir()
    lock.parent.chmod(0o777)
    as_user(second_user, "ln", "-s", str(victim), str(lock))
    with pytest.raises(AgentError) as err:
        await agent.request("lock_status", {"lock_path": str(lock)})
    refused(err, lock, lock, second_user)
    with pytest.raises(AgentError) as err:
        await agent.request("launch", dict(params, data_files=[], lock_path=str(lock)), timeout=30)
    assert "unsafe-path" in str(err.value) and str(lock.parent) in str(err.value)
    assert not marker.exists()
    untouched(victim)


async def test_t48_a_swapping_attacker_never_gets_a_repair_through(
    shared: Path, victim: Path, second_user: OtherUser, agent: LocalHost
) -> None:
    """The other user swaps the name between a torn file of its own and a link to root's file,
    as fast as rename(2) goes, while root repairs: every repair either repairs the other user's
    own file or is refused; root's file never changes."""
    b1 = shared / "B1"
    b1.mkdir()
    b1.chmod(0o777)
    data = b1 / "raw_responses.jsonl"
    script = shared / "swap.py"
    script.write_text(
        "import os, sys\n"
        "d, victim = sys.argv[1], sys.argv[2]\n"
        "name = os.path.join(d, 'raw_responses.jsonl')\n"
        "open(os.path.join(d, 'ready'), 'w').close()\n"
        "i = 0\n"
        "while not os.path.exists(os.path.join(d, 'stop')):\n"
        "    i += 1\n"
        "    tmp = os.path.join(d, '.t%d' % i)\n"
        "    if i % 2:\n"
        "        os.symlink(victim, tmp)\n"
        "    else:\n"
        "        with open(tmp, 'wb') as f:\n"
        "            f.write(b'{}\\n{\"torn')\n"
        "    os.rename(tmp, name)\n"
    )
    script.chmod(0o755)
    swapper = subprocess.Popen([*second_user.prefix, second_user.python, str(script), str(b1),
                                str(victim)])  # fmt: skip
    try:
        wait_until(lambda: (b1 / "ready").exists(), timeout=20, what="the swapper started")
        outcomes = {"repaired": 0, "refused": 0, "other": 0}
        for _ in range(150):
            try:
                result = await agent.request("repair_tail", {"path": str(data)})
            except AgentError as e:
                outcomes["refused" if "unsafe-path" in str(e) else "other"] += 1
            else:
                outcomes["repaired" if result["repaired"] else "other"] += 1
        untouched(victim)
        assert outcomes["refused"] > 0, outcomes
    finally:
        (b1 / "stop").touch()
        swapper.wait(timeout=30)


async def test_t48_a_file_with_another_name_is_never_truncated(
    shared: Path, victim: Path, agent: LocalHost
) -> None:
    """A hard link to root's file in the shared directory (where ``fs.protected_hardlinks`` is
    off, anyone may make one): the repair refuses a file with more than one name."""
    b1 = shared / "B1"
    b1.mkdir()
    b1.chmod(0o777)
    data = b1 / "raw_responses.jsonl"
    os.link(victim, data)
    with pytest.raises(AgentError) as err:
        await agent.request("repair_tail", {"path": str(data)})
    assert "unsafe-path" in str(err.value) and "2 hard links" in str(err.value)
    assert victim.read_bytes() == ROOT_CONFIG and not list(b1.glob("*.broken*"))


async def test_t48_links_of_ones_own_are_still_followed(tmp_path: Path, agent: LocalHost) -> None:
    """A dataset directory that is root's own link (data on another disk) is followed."""
    real = tmp_path / "disk" / "B1"
    real.mkdir(parents=True)
    (real / "raw_responses.jsonl").write_bytes(b'{"a": 1}\n{"torn')
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "B1").symlink_to(real)
    result = await agent.request(
        "repair_tail", {"path": str(tmp_path / "out" / "B1" / "raw_responses.jsonl")}
    )
    assert result["repaired"] is True
    assert (real / "raw_responses.jsonl").read_bytes() == b'{"a": 1}\n'


def test_t48_the_state_dir_through_another_users_link_is_refused(
    shared: Path, second_user: OtherUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``XDG_STATE_HOME`` under a world-writable directory where another user put a link (to a
    directory of its own): nothing is created or written through it."""
    theirs = shared / "theirs"
    as_user(second_user, "mkdir", "-m", "777", str(theirs))
    link = shared / "state"
    as_user(second_user, "ln", "-s", str(theirs), str(link))
    monkeypatch.setenv("XDG_STATE_HOME", str(link / "xdg"))
    with pytest.raises(UnsafeState) as err:
        private_dir(state_dir() / "configs" / "k")
    assert str(link) in str(err.value) and f"owned by uid {second_user.uid}" in str(err.value)
    assert list(theirs.iterdir()) == []


def test_t49_the_secret_digests_never_go_through_another_users_link(
    shared: Path, second_user: OtherUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The salted digests of secret values (``secret-digests`` in the state dir) reached through
    the other user's link in a world-writable parent: neither the salt nor a digest is written
    where that user reads them."""
    theirs = shared / "theirs"
    as_user(second_user, "mkdir", "-m", "777", str(theirs))
    link = shared / "state"
    as_user(second_user, "ln", "-s", str(theirs), str(link))
    monkeypatch.setenv("XDG_STATE_HOME", str(link / "xdg"))
    for name in ("_salt", "_seen", "_checked"):  # this process's copy, put back after
        monkeypatch.setattr(secrets, name, getattr(secrets, name))
    monkeypatch.setattr(secrets, "_digests", {n: set(d) for n, d in secrets._digests.items()})
    secrets.remember(["sk-planted-0123456789abcdefghij"])
    assert [p for p in theirs.rglob("*")] == []


def linked_records(shared: Path, user: OtherUser, tmp_path: Path) -> tuple[Path, Path, Path]:
    """``<shared>/out/B1`` (0777) where the other user put links named like a run's data file,
    failed-prompts sidecar and input file, each to a file of root's (0600) holding 3 records.
    Returns (root's file, the data file, the dataset directory)."""
    secret = tmp_path / "root.jsonl"
    make_raw(secret, 3)
    secret.chmod(0o600)
    b1 = shared / "out" / "B1"
    b1.mkdir(parents=True)
    for d in (b1.parent, b1):
        d.chmod(0o777)
    for name in ("raw_responses.jsonl", "failed_prompts.jsonl", "input.jsonl"):
        as_user(user, "ln", "-s", str(secret), str(b1 / name))
    return secret, b1 / "raw_responses.jsonl", b1


async def test_t49_a_scan_never_counts_nor_reports_what_another_users_link_reaches(
    shared: Path, second_user: OtherUser, agent: LocalHost, tmp_path: Path
) -> None:
    """The refresh (its first-pass line counts included), the scan's sidecars and the input
    file of completeness: root's file behind the other user's links is neither counted nor
    reported; the data file's state names the link."""
    secret, data, b1 = linked_records(shared, second_user, tmp_path)
    before = secret.read_bytes()
    spec = {
        "path": str(data),
        "format": "raw",
        "sidecars": {"failed": str(b1 / "failed_prompts.jsonl")},
        "input": {"path": str(b1 / "input.jsonl"), "id": "sample_id"},
    }
    progress: list[dict[str, Any]] = []
    reply = await agent.request(
        "refresh", {"files": [spec], "progress": True, "gpu": False}, on_progress=progress.append
    )
    counted = [p.get("files") or {} for p in progress]
    assert progress and all(str(data) not in files for files in counted), progress
    scanned = reply["files"][str(data)]
    assert scanned["records"] == 0 and scanned["state"] == "unreadable", scanned
    named(scanned["error"], data, data, second_user)
    assert scanned["sidecars"]["failed"]["state"] == "unreadable", scanned["sidecars"]
    assert scanned["sidecars"]["failed"]["lines"] == 0
    completeness = scanned["completeness"]
    assert completeness["input"] == 0, completeness
    named(completeness["error"], b1 / "input.jsonl", b1 / "input.jsonl", second_user)
    again = await agent.request("scan", {"files": [spec], "fresh": True})
    assert again["files"][str(data)]["records"] == 0, again
    assert secret.read_bytes() == before


async def test_t49_observe_and_script_flags_refuse_another_users_link(
    shared: Path, second_user: OtherUser, agent: LocalHost, tmp_path: Path
) -> None:
    """The quiet window's watch of a data file and the reading of a client's options: neither
    reports the file another user's link reaches (its size and inode; the options of a script
    of root's)."""
    _, data, b1 = linked_records(shared, second_user, tmp_path)
    with pytest.raises(AgentError) as err:
        await agent.request("observe_files", {"paths": [str(data)], "window_s": 0.2})
    refused(err, data, data, second_user)
    script = tmp_path / "root_client.py"
    script.write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--root-only')\n"
    )
    link = b1 / "client.py"
    as_user(second_user, "ln", "-s", str(script), str(link))
    flags = await agent.request(
        "script_flags", {"workdir": str(b1), "argv": [sys.executable, "client.py"]}
    )
    assert flags["readable"] is False and "--root-only" not in str(flags), flags
    named(flags["reason"], link, link, second_user)


async def test_t49_a_launch_in_a_workdir_that_is_another_users_link_starts_nothing(
    shared: Path, second_user: OtherUser, agent: LocalHost, tmp_path: Path
) -> None:
    """The run's workdir is the other user's link to a directory of root's: the client's
    relative paths would land there. Refused before anything starts."""
    root_dir = tmp_path / "rootdir"
    root_dir.mkdir(mode=0o700)
    link = shared / "work"
    as_user(second_user, "ln", "-s", str(root_dir), str(link))
    params: dict[str, Any] = {
        "workdir": str(link),
        "argv": [sys.executable, "-c", "open('started', 'w').close()"],
        "log": str(tmp_path / "logs" / "run.log"),
        "lock_path": str(tmp_path / "locks" / "run.lock"),
        "data_files": [],
        "settle_s": 0.2,
    }
    with pytest.raises(AgentError) as err:
        await agent.request("launch", params, timeout=30)
    refused(err, link, link, second_user)
    assert "nothing was started" in str(err.value)
    assert os.listdir(root_dir) == []


def test_t49_a_slurm_job_whose_output_is_under_another_users_link_is_not_submitted(
    shared: Path, second_user: OtherUser, slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    """The job's ``--output`` lies under the other user's link to a directory of root's: its
    directory would be made there and slurmstepd would write the log through the link."""
    root_dir = tmp_path / "rootdir"
    root_dir.mkdir(mode=0o700)
    link = shared / "logs"
    as_user(second_user, "ln", "-s", str(root_dir), str(link))
    tag = "runwatch:planted"
    for output in (link / "job-%j.log", link / "sub" / "job-%j.log"):
        with pytest.raises(AgentOpError) as err:
            slurmops.slurm_submit(
                {
                    "workdir": str(tmp_path), "argv": ["/bin/true"], "tag": tag, "name": "rw-p",
                    "script_path": "job.sh", "lock_path": "submit.lock",
                    "options": {"output": str(output)}, "settle_s": 1.0,
                }
            )  # fmt: skip
        named(str(err.value), output.parent, link, second_user)
        assert "nothing was submitted" in str(err.value)
    assert os.listdir(root_dir) == []
    jobs = slurmops.slurm_jobs({"all_states": True})["jobs"]
    assert not [j for j in jobs if j.get("comment") == tag], jobs


async def test_t49_a_unit_record_forged_behind_another_users_link_is_no_unit(
    shared: Path, second_user: OtherUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's state dir reached through the other user's link in a world-writable parent,
    where that user wrote a unit record of its own: the agent lists no such unit."""
    theirs = shared / "theirs"
    as_user(second_user, "mkdir", "-m", "777", str(theirs))
    units = theirs / "runwatch" / "units"
    as_user(second_user, "mkdir", "-p", str(units))
    forged = {"launch_id": "forged-1", "config_id": "cfg", "run": "B1", "state": "ended",
              "launched_at": time.time(), "ended_at": time.time(), "exit": {"code": 0}}  # fmt: skip
    script = f"import json,sys; open(sys.argv[1], 'w').write(json.dumps({forged!r}))"
    as_user(second_user, second_user.python, "-c", script, str(units / "forged-1.json"))
    link = shared / "state"
    as_user(second_user, "ln", "-s", str(theirs), str(link))
    monkeypatch.setenv("XDG_STATE_HOME", str(link))
    host = LocalHost(HostConfig(name="local", local=True))
    await host.connect()
    try:
        listed = await host.request("units", {"config_id": "cfg"})
    finally:
        await host.close()
    assert listed["units"] == [], listed


async def test_t49_a_kill_never_sweeps_the_holders_of_what_another_users_link_reaches(
    shared: Path, victim: Path, second_user: OtherUser, agent: LocalHost, fake_runs: FakeRuns
) -> None:
    """The run's data file is the other user's link to a file a process of root's (not the
    run) holds open for writing: the kill of the run stops the run, never that process."""
    data, _ = dataset(shared, second_user, victim)
    bystander = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(victim)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert bystander.stdout is not None and bystander.stdout.readline() == "holding\n"
        run = fake_runs.start("--datasets", "B1")
        ps = await agent.request("ps", {"scripts": ["run_inference.py"]})
        [ident] = [p["identity"] for p in ps["processes"] if p["identity"]["pid"] == run.pid]
        killed = await agent.request(
            "kill", {"identity": ident, "grace": 5.0, "files": [str(data)]}, timeout=60
        )
        assert {t["pid"] for t in killed["results"]} == {run.pid}, killed
        assert bystander.poll() is None, "the holder of the link's target was stopped"
    finally:
        bystander.kill()
        bystander.wait(timeout=30)
    untouched(victim)
