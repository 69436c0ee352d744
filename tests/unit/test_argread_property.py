"""For every generated argparse parser and argv the gate accepts, the output path and the resume
switch runwatch reads are what the real script's argparse gives (``supervisor/argcheck.py``,
``agent/argresolve.py``). The agent's function is called directly; the script is the same
generated source, executed in-process with the argv as its ``sys.argv``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from supervisor import argcheck
from supervisor.agent import match
from supervisor.agent.argresolve import resolve_in
from supervisor.config import load_config
from supervisor.errors import ConfigError
from supervisor.layout import layout_of
from supervisor.replies import ResolvedArgs
from tests.properties import examples

TOKENS = [
    ["--out", "data/s.jsonl"],
    ["--out=data/s.jsonl"],
    ["-odata/s.jsonl"],
    ["-o", "data/t.jsonl"],
    ["-o=data/e.jsonl"],
    ["--ou", "data/u.jsonl"],
    ["--out"],
    ["--resume"],
    ["--no-resume"],
    ["--res"],
    ["--resume=1"],
    ["--resume-from", "x"],
    ["--outer", "y"],
    ["--"],
    ["@a1.args"],
    ["@a2.args"],
    ["@a3.args"],
    ["-v"],
    ["-vv"],
    ["pos"],
]


@st.composite
def parsers(draw: Any) -> str:
    """The source of a client: its output and resume options in any of argparse's shapes,
    neighbours that abbreviations could reach, sometimes a parser runwatch cannot read exactly."""
    kw = []
    if draw(st.booleans()):
        kw.append("allow_abbrev=False")
    if draw(st.booleans()):
        kw.append('fromfile_prefix_chars="@"')
    lines = ["import argparse", f"p = argparse.ArgumentParser({', '.join(kw)})"]
    out_names = ['"-o", "--out"'] if draw(st.booleans()) else ['"--out"']
    out_kw = draw(
        st.sampled_from(
            [
                'default="data/default.jsonl"',
                "",
                'nargs="?", const="data/const.jsonl", default="data/default.jsonl"',
                'default="data/other.jsonl"',
            ]
        )
    )
    lines.append(f"p.add_argument({', '.join(out_names)}{', ' + out_kw if out_kw else ''})")
    resume = draw(
        st.sampled_from(
            [
                'action="store_true"',
                "action=argparse.BooleanOptionalAction",
                'action="store_const", const=True',
                'action="count"',
                "type=int, default=0",
            ]
        )
    )
    lines.append(f'p.add_argument("--resume", {resume})')
    for extra in draw(
        st.lists(
            st.sampled_from(
                [
                    'p.add_argument("--outer")',
                    'p.add_argument("--resume-from")',
                    'p.add_argument("-v", action="count", default=0)',
                    'p.add_argument("rest", nargs="*")',
                    'for name in ["--zzz"]:\n    p.add_argument(name)',
                ]
            ),
            unique=True,
        )
    ):
        lines.append(extra)
    lines.append("args = p.parse_args()")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    root = tmp_path_factory.mktemp("argread")
    work = root / "work"
    work.mkdir()
    (work / "a1.args").write_text("--out\ndata/file_a.jsonl\n")
    (work / "a2.args").write_text("--resume\n")
    (work / "a3.args").write_text("--no-resume\n")
    cfg = root / "rw.toml"
    cfg.write_text(
        '[[hosts]]\nname = "here"\nlocal = true\n\n'
        f'[[runs]]\nname = "g"\nhost = "here"\nworkdir = "{work}"\n'
        f'argv = {json.dumps([sys.executable, "gen.py"])}\nclient = "mygen"\n\n'
        '[clients.mygen]\nscripts = ["gen.py"]\nformat = "raw"\nresume = "flag"\n'
        'path_defaults = { "--out" = "data/default.jsonl" }\n'
        '[clients.mygen.flags]\noutput_file = ["--out"]\nresume = ["--resume"]\n'
    )
    os.chmod(cfg, 0o600)
    config = load_config(cfg)
    run = next(r for r in config.runs if r.name == "g")
    return config, run, work


def _real(source: str, argv: list[str], work: Path) -> Any:
    """The script's own namespace for ``argv`` (None: its argparse exits)."""
    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["gen.py", *argv]
    os.chdir(work)
    scope: dict[str, Any] = {"__name__": "__main__"}
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, "gen.py", "exec"), scope)
    except SystemExit:
        return None
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
    return scope["args"]


accepted = {"n": 0}


@settings(max_examples=examples(300), deadline=None)
@given(source=parsers(), items=st.lists(st.sampled_from(TOKENS), max_size=5))
@example(
    source='import argparse\np = argparse.ArgumentParser()\np.add_argument("--out")\n'
    'p.add_argument("--resume", action=argparse.BooleanOptionalAction)\nargs = p.parse_args()\n',
    items=[["--out", "data/s.jsonl"], ["--resume"]],
)
def test_what_the_gate_accepts_the_client_reads_the_same_way(
    world: tuple[Any, Any, Path], source: str, items: list[list[str]]
) -> None:
    config, run, work = world
    argv = [a for item in items for a in item]
    try:
        layout = layout_of(config, run, [sys.executable, "gen.py", *argv])
        layout.require_files()
    except ConfigError:
        return  # refused while planned (an abbreviation of --out, no output path)
    reply = msgspec.convert(resolve_in(source.encode(), "gen.py", str(work), argv), ResolvedArgs)
    if not argcheck.check(layout, reply).ok:
        return
    accepted["n"] += 1
    accepted["exact"] = accepted.get("exact", 0) + int(reply.exact)
    real = _real(source, argv, work)
    if real is None:
        # The client exits before it opens anything. Known beforehand only where its parser
        # was read exactly; a canonical argv may still name a flag an unread parser lacks.
        assert not reply.exact, f"accepted an argv the client's argparse rejects: {argv}"
        return
    assert real.out is not None, (argv, source)
    assert match.client_path(layout.workdir, real.out) == next(iter(layout.data_files.values()))
    assert bool(real.resume) == (layout.overwrite_problem() is None), (argv, source)


def test_the_property_saw_accepted_cases() -> None:
    """The property above is not vacuous: some generated cases were accepted and compared."""
    assert accepted["n"] > 0 and accepted.get("exact", 0) > 0, accepted
