"""``supervisor.reload`` on real files: a change is seen by the file's identity, size and mtime
(a rename over it too), read through the loader, said item by item, or refused with why once per
version; ``Engine.reconfigure`` keeps the hosts that did not change and closes the others."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from supervisor.config import Config, load_config
from supervisor.engine import Engine
from supervisor.errors import RunwatchError
from supervisor.reload import ConfigFile, changes, unchangeable

BASE = """refresh_seconds = 5

[[hosts]]
name = "a"
local = true

[[hosts]]
name = "b"
local = true

[[runs]]
name = "r1"
host = "a"
workdir = "/tmp"
argv = ["python", "run_inference.py", "--output-dir", "out1"]
output_dir = "out1"
"""

RUN2 = """
[[runs]]
name = "r2"
host = "b"
workdir = "/tmp"
argv = ["python", "run_inference.py", "--output-dir", "out2"]
output_dir = "out2"
"""


def write(path: Path, body: str) -> None:
    """As an editor saves: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(body)
    os.replace(new, path)


def loaded(tmp_path: Path, body: str = BASE) -> tuple[Path, Config]:
    path = tmp_path / "runwatch.toml"
    path.write_text(body)
    return path, load_config(path)


def test_an_unchanged_file_is_not_read_again_and_a_change_is_said_item_by_item(
    tmp_path: Path,
) -> None:
    path, config = loaded(tmp_path)
    watched = ConfigFile(config)
    assert watched.poll(config) is None
    write(path, BASE.replace("refresh_seconds = 5", "refresh_seconds = 7") + RUN2)
    got = watched.poll(config)
    assert got is not None and got.config is not None and got.refused is None
    assert got.changes == ["run r2 added", "refresh_seconds changed"]
    assert got.config.run("r2").host == "b"
    assert watched.poll(got.config) is None  # read once per version


def test_an_edit_in_place_of_the_same_size_is_seen_by_its_mtime(tmp_path: Path) -> None:
    path, config = loaded(tmp_path)
    watched = ConfigFile(config)
    path.write_text(BASE.replace("out1", "out9"))  # same size, same inode
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    got = watched.poll(config)
    assert got is not None and got.changes == ["run r1 changed"]


def test_a_broken_edit_is_refused_once_naming_the_file_and_the_old_config_stays(
    tmp_path: Path,
) -> None:
    path, config = loaded(tmp_path)
    watched = ConfigFile(config)
    write(path, BASE + "\n[[runs]\n")
    got = watched.poll(config)
    assert got is not None and got.config is None
    assert got.refused is not None and str(path) in got.refused
    assert got.refused.endswith("the watcher keeps the config it has")
    assert watched.poll(config) is None  # said once for this version
    write(path, BASE.replace('host = "a"', 'host = "nowhere"'))
    again = watched.poll(config)
    assert again is not None and again.config is None and again.refused is not None
    assert "nowhere" in again.refused


def test_what_a_running_watcher_cannot_follow_is_refused_with_the_fix(tmp_path: Path) -> None:
    path, config = loaded(tmp_path)
    assert unchangeable(config, load_config(path)) == ""
    watched = ConfigFile(config)
    write(path, 'project = "p"\n' + BASE)
    keyed = watched.poll(config)
    assert keyed is not None and keyed.config is None and keyed.refused is not None
    assert "its state key (`project`) cannot change under a running watcher" in keyed.refused
    # Same key, other alert URLs: the outboxes and spools are per URL.
    write(path, BASE + '\n[alerts]\nurls = ["json://127.0.0.1:9/x"]\n')
    alerted = watched.poll(config)
    assert alerted is not None and alerted.config is None and alerted.refused is not None
    assert "[alerts] urls cannot change under a running watcher" in alerted.refused
    assert "restart it (`runwatch watch`)" in alerted.refused


def test_nothing_used_changed_is_said_as_such(tmp_path: Path) -> None:
    _, config = loaded(tmp_path)
    _, same = loaded(tmp_path, BASE + "\n# a comment\n")
    assert changes(config, same) == ["nothing that runwatch uses changed"]


def test_reconfigure_keeps_unchanged_hosts_and_drops_the_others(tmp_path: Path) -> None:
    _, config = loaded(tmp_path, BASE + RUN2)
    body = BASE.replace('name = "b"', 'name = "c"')  # b dropped (with its run), c added
    _, new = loaded(tmp_path, body)

    async def go() -> tuple[object, object, Engine]:
        engine = Engine(config)
        a_before = engine.host("a")
        await engine.reconfigure(new)
        return a_before, engine.host("a"), engine

    a_before, a_after, engine = asyncio.run(go())
    assert a_after is a_before
    assert engine.config is new
    assert engine.host("c") is not None
    with pytest.raises(RunwatchError, match="no host named 'b'"):
        engine.host("b")
