"""The script given with ``--script`` (row A16 of ``docs/reliability.md``): read on this
machine, never run, and refused before anything is planned when no Python could run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import newscript
from supervisor.errors import UsageError

PARSER = b'import argparse\np = argparse.ArgumentParser()\np.add_argument("--token-budget")\n'


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (PARSER + b"# \xff\xfe saved in another encoding\n", "byte 0xff on line 4 is not utf-8"),
        (b"# -*- coding: nosuch -*-\n" + PARSER, "unknown encoding: nosuch"),
    ],
    ids=["invalid-utf-8-in-a-comment", "unknown-coding"],
)
def test_a16_a_script_no_python_can_decode_is_refused(
    tmp_path: Path, source: bytes, why: str
) -> None:
    """Its parser reads (``ast.parse`` of the bytes lets a comment's invalid bytes pass), but
    every Python refuses to run it: the run would be stopped for a launch that fails."""
    script = tmp_path / "run_inference.py"
    script.write_bytes(source)
    with pytest.raises(UsageError, match="no Python can run it") as e:
        newscript.load(str(script))
    assert why in str(e.value)
