"""The ``script_install`` op on real files (rows A15, A17 of ``docs/reliability.md``): the
host's script is replaced only when it is still the one read, keeping its mode and the old one
beside it; a kept copy is put back only when it is the one kept."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest

from supervisor.agent.protocol import AgentOpError
from supervisor.agent.scriptcopy import script_install


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a15_the_script_is_replaced_keeping_its_mode_and_the_old_one(tmp_path: Path) -> None:
    script = tmp_path / "gen.py"
    script.write_bytes(b"old\n")
    script.chmod(0o751)
    done = script_install(
        {"path": str(script), "expect_sha256": _sha(b"old\n"), "source_b64": _b64(b"new\n")}
    )
    assert script.read_bytes() == b"new\n" and os.stat(script).st_mode & 0o777 == 0o751
    old_sha = _sha(b"old\n")
    kept = tmp_path / f"gen.py.runwatch-{old_sha[:12]}"
    assert done["kept"] == str(kept) and kept.read_bytes() == b"old\n"
    assert (done["old_sha256"], done["new_sha256"]) == (_sha(b"old\n"), _sha(b"new\n"))
    back = script_install(
        {
            "path": str(script),
            "expect_sha256": _sha(b"new\n"),
            "from_path": str(kept),
            "from_sha256": _sha(b"old\n"),
            "keep": False,
        }
    )
    assert script.read_bytes() == b"old\n" and back["new_sha256"] == _sha(b"old\n")
    assert os.stat(script).st_mode & 0o777 == 0o751


def test_a15_a_script_changed_since_it_was_read_is_not_replaced(tmp_path: Path) -> None:
    script = tmp_path / "gen.py"
    script.write_bytes(b"edited on the host\n")
    with pytest.raises(AgentOpError, match="changed since runwatch read it") as e:
        script_install(
            {"path": str(script), "expect_sha256": _sha(b"old\n"), "source_b64": _b64(b"new\n")}
        )
    assert e.value.kind == "changed"
    assert script.read_bytes() == b"edited on the host\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.py"]


def test_a17_a_kept_copy_that_is_not_the_one_kept_is_not_put_back(tmp_path: Path) -> None:
    script, kept = tmp_path / "gen.py", tmp_path / "gen.py.runwatch-0123456789ab"
    script.write_bytes(b"new\n")
    kept.write_bytes(b"something else\n")
    with pytest.raises(AgentOpError, match="is not the script kept before"):
        script_install(
            {
                "path": str(script),
                "expect_sha256": _sha(b"new\n"),
                "from_path": str(kept),
                "from_sha256": _sha(b"old\n"),
                "keep": False,
            }
        )
    assert script.read_bytes() == b"new\n"


def test_a16_a_check_writes_nothing_and_says_whether_the_script_could_be_replaced(
    tmp_path: Path,
) -> None:
    """``check`` (the preflight's, before the stop) takes no new bytes and leaves the directory
    as it was; a script changed since it was read is refused there as the copy would be."""
    script = tmp_path / "gen.py"
    script.write_bytes(b"old\n")
    script.chmod(0o751)
    done = script_install({"path": str(script), "expect_sha256": _sha(b"old\n"), "check": True})
    assert (done["old_sha256"], done["new_sha256"], done["kept"]) == (_sha(b"old\n"), "", "")
    assert done["mode"] == 0o751
    assert script.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.py"]
    with pytest.raises(AgentOpError, match="changed since runwatch read it"):
        script_install({"path": str(script), "expect_sha256": _sha(b"new\n"), "check": True})


@pytest.mark.parametrize("check", [True, False], ids=["check", "install"])
def test_a17_a_script_that_is_a_link_is_not_replaced_by_a_file(tmp_path: Path, check: bool) -> None:
    """The run's script is the user's own link into a checkout: replacing it would put a file
    where the link was (no rollback puts the link back) and leave the checkout's file as it
    was. Refused, naming the link's target; the link and its target untouched."""
    (tmp_path / "repo").mkdir()
    target = tmp_path / "repo" / "gen.py"
    target.write_bytes(b"old\n")
    script = tmp_path / "gen.py"
    script.symlink_to("repo/gen.py")
    params = {"path": str(script), "expect_sha256": _sha(b"old\n"), "check": check}
    if not check:
        params["source_b64"] = _b64(b"new\n")
    with pytest.raises(AgentOpError, match="is a symbolic link") as e:
        script_install(params)
    assert str(target) in str(e.value)
    assert script.is_symlink() and os.readlink(script) == "repo/gen.py"
    assert target.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.py", "repo"]
