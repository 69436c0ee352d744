"""O6 of ``docs/reliability.md``: the client is never executed except to launch it. The flags of a
new command line are read from the client's argparse source, statically on the host
(``supervisor/agent/argspec.py``), or from its profile; here on real files and real processes.

The stand-in sources below are written in the styles of SpecForge's
``scripts/regenerate_train_data.py`` (a ``parse_arguments()`` function, argument groups,
parenthesised multi-line help, ``choices`` without a type, ``nargs="+"``) and Model-Optimizer's
``examples/speculative_decoding/scripts/server_generate.py`` (a parser built and parsed at module
level, ``type=bool``, a key as a default): importing either would parse the argv, which is why
they are read and never run.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

from supervisor import flagcheck
from supervisor.agent import argspec
from supervisor.agent.protocol import MASK
from supervisor.config import load_config
from supervisor.demo import modelopt_server_generate, run_inference, specforge_regenerate
from supervisor.engine import Engine
from supervisor.replies import ScriptFlags
from tests.fixtures_config import write_local_config
from tests.waiting import wait_until


def _read(tmp_path: Path, source: str, name: str = "gen.py") -> dict[str, Any]:
    (tmp_path / name).write_text(source)
    result = argspec.script_flags({"workdir": str(tmp_path), "argv": [sys.executable, name]})
    return dict(result)


def _by_flag(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f: o for o in result["options"] for f in o["flags"]}


SPECFORGE_STYLE = '''
"""Regenerate answers with a served model (a stand-in)."""
import argparse
import json


def parse_arguments():
    parser = argparse.ArgumentParser(description="regenerate")
    model = parser.add_argument_group("model")
    model.add_argument("--model", type=str, required=True)
    model.add_argument(
        "--reasoning",
        choices=["none", "save", "disable"],
        default="none",
        help=(
            "how reasoning is kept: "
            "--reasoning none keeps nothing"
        ),
    )
    model.add_argument("--is-gpt-oss", action="store_true", help="a GPT-OSS model")
    sampling = parser.add_argument_group("sampling parameters")
    sampling.add_argument("--temperature", type=float, default=0.7)
    sampling.add_argument("--top-k", type=int, default=None, help="sent via extra_body")
    data = parser.add_argument_group("data")
    data.add_argument("--output-file-path", type=str, required=True, help="where")
    data.add_argument("--resume", action="store_true")
    server = parser.add_argument_group("sglang server")
    server.add_argument("--server-address", type=str, nargs="+", help="host:port ...")
    return parser.parse_args()


def main():
    args = parse_arguments()
    with (
        open(args.output_file_path, "a") as out,
        open(args.output_file_path + ".log", "a") as log,
    ):
        out.write(json.dumps(vars(args)) + "\n")
        log.write("done\n")


if __name__ == "__main__":
    main()
'''

MODELOPT_STYLE = """
import argparse
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--data_path", type=str, help="input")
parser.add_argument("--num_threads", type=int, default=256, help="batch size")
parser.add_argument("--chat", default=True, type=bool, help="chat mode")
parser.add_argument("--url", type=str, default="http://localhost:8000/v1")
parser.add_argument("--api_key", type=str, default="token-abc123", help="API key (if any)")
parser.add_argument("--log_empty_conversations", action="store_true")
parser.add_argument("--system_prompt", nargs="+", type=str, default="")
args = parser.parse_args()
open(args.data_path).close()
sys.exit(0)
"""


def test_o6_specforge_style_is_read_statically(tmp_path: Path) -> None:
    result = _read(tmp_path, SPECFORGE_STYLE, "regenerate_train_data.py")
    assert result["found"] and result["readable"] and result["reason"] == ""
    opts = _by_flag(result)
    assert list(opts) == [
        "-h", "--help", "--model", "--reasoning", "--is-gpt-oss", "--temperature", "--top-k",
        "--output-file-path", "--resume", "--server-address",
    ]  # fmt: skip
    assert opts["--model"]["type"] == "str" and opts["--model"]["required"] is True
    assert opts["--reasoning"]["choices"] == ["none", "save", "disable"]
    assert opts["--reasoning"]["type"] is None and opts["--reasoning"]["default"] == "none"
    assert opts["--is-gpt-oss"]["action"] == "store_true"
    assert (
        opts["--is-gpt-oss"]["takes_value"] is False
        and opts["--is-gpt-oss"]["dest"] == "is_gpt_oss"
    )
    assert opts["--temperature"]["type"] == "float" and opts["--temperature"]["default"] == 0.7
    assert opts["--top-k"]["type"] == "int" and opts["--top-k"]["has_default"]
    assert opts["--server-address"]["nargs"] == "+" and opts["--server-address"]["takes_value"]
    # a flag named in a help text is not a flag
    assert "--reasoning none" not in opts and result["allow_abbrev"] is True


def test_o6_a_newer_syntax_than_the_agents_python_is_read_call_by_call(tmp_path: Path) -> None:
    """SpecForge's script opens its files in a parenthesised ``with`` (Python >= 3.9): an agent
    on Python 3.8 cannot parse the file whole, so it parses each argparse call alone."""
    python38 = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    if not python38:
        pytest.skip("no Python 3.8 interpreter on this machine (pyenv 3.8.x)")
    script = tmp_path / "regenerate_train_data.py"
    script.write_text(SPECFORGE_STYLE)
    root = Path(argspec.__file__).resolve().parents[2]
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from supervisor.agent import argspec; "
        "req = {'workdir': sys.argv[2], 'argv': ['py', sys.argv[3]]}; "
        "print(json.dumps(argspec.script_flags(req)))"
    )
    done = subprocess.run(
        [python38[-1], "-I", "-S", "-c", code, str(root), str(tmp_path), script.name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    old = json.loads(done.stdout)
    assert old["found"], old["reason"]
    assert old == _read(tmp_path, SPECFORGE_STYLE, script.name)  # what a newer Python reads
    opts = _by_flag(old)
    assert opts["--reasoning"]["choices"] == ["none", "save", "disable"]
    line = next(n for n, t in enumerate(SPECFORGE_STYLE.split("\n"), 1) if '"--temperature"' in t)
    assert opts["--temperature"]["type"] == "float" and opts["--temperature"]["line"] == line
    # a file that is broken, not newer, still says so
    (tmp_path / "broken.py").write_text("import argparse\np = argparse.ArgumentParser(\n")
    done = subprocess.run(
        [python38[-1], "-I", "-S", "-c", code, str(root), str(tmp_path), "broken.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    broken = json.loads(done.stdout)
    assert not broken["found"] and "is not Python 3.8 can parse" in broken["reason"]


def test_o6_modelopt_style_is_read_statically_and_its_key_default_masked(
    tmp_path: Path,
) -> None:
    result = _read(tmp_path, MODELOPT_STYLE, "server_generate.py")
    assert result["found"], result["reason"]
    opts = _by_flag(result)
    assert opts["--num_threads"]["type"] == "int" and opts["--num_threads"]["default"] == 256
    # type=bool takes any value (bool("False") is True): reported as bool, never as a check
    assert opts["--chat"]["type"] == "bool" and opts["--chat"]["takes_value"] is True
    assert opts["--api_key"]["default"] == MASK
    assert "token-abc123" not in json.dumps(result)
    assert opts["--url"]["default"] == "http://localhost:8000/v1"
    assert opts["--system_prompt"]["nargs"] == "+" and opts["--system_prompt"]["default"] == ""
    assert opts["--log_empty_conversations"]["takes_value"] is False


def test_o6_the_static_read_agrees_with_argparse_on_the_demo_clients() -> None:
    """The stand-ins runwatch ships, read statically, declare what their parsers hold."""
    scripts = {
        run_inference: run_inference._parser(),
        specforge_regenerate: specforge_regenerate._parser(),
        modelopt_server_generate: modelopt_server_generate._parser(),
    }
    for module, parser in scripts.items():
        path = Path(str(module.__file__))
        result = argspec.script_flags({"workdir": str(path.parent), "argv": ["py", path.name]})
        assert result["found"], result["reason"]
        read = {tuple(o["flags"]): o for o in result["options"]}
        actions = {tuple(a.option_strings): a for a in parser._actions if a.option_strings}
        assert set(read) == set(actions), path.name
        for flags, action in actions.items():
            o = read[flags]
            assert o["dest"] == action.dest, flags
            assert o["type"] == (getattr(action.type, "__name__", None)), flags
            choices = None if action.choices is None else [str(c) for c in action.choices]
            assert o["choices"] == choices, flags
            assert o["takes_value"] is (action.nargs != 0), flags


GROUPS = """
import argparse

parser = argparse.ArgumentParser(allow_abbrev=False)
io = parser.add_argument_group("io")
io.add_argument("-o", "--out", dest="output_path", default="out.jsonl")
exclusive = parser.add_mutually_exclusive_group()
exclusive.add_argument("--fast", action="store_const", const=1, dest="speed")
exclusive.add_argument("--slow", action="store_const", const=0, dest="speed")
parser.add_argument("--top-p", type=float, choices=[0.5, 0.9, 1.0], default=1.0)
parser.add_argument("--level", type=int, choices=range(1, 4))
parser.add_argument("--shard", type=lambda s: int(s) % 8)
parser.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True)
parser.add_argument("--verbose", "-v", action="count", default=0)
parser.add_argument("--tag", action="append", nargs="?")
parser.add_argument("input")
sub = parser.add_subparsers(dest="cmd")
gen = sub.add_parser("gen", allow_abbrev=False)
gen.add_argument("--seed", type=int)
score = sub.add_parser("score", allow_abbrev=False)
score.add_argument("--seed", type=str, choices=["a", "b"])
extra = {"type": int}
parser.add_argument("--spread", **extra)
for name in ("alpha", "beta"):
    parser.add_argument("--" + name)
parser.parse_known_args()
"""


def test_o6_groups_dest_float_choices_and_a_flag_declared_twice(tmp_path: Path) -> None:
    result = _read(tmp_path, GROUPS)
    assert result["found"] and result["allow_abbrev"] is False
    assert result["dynamic"] == 1 and result["positionals"] == 1 and result["known_args"]
    opts = _by_flag(result)
    assert opts["-o"] is opts["--out"] and opts["--out"]["dest"] == "output_path"
    assert opts["--fast"]["dest"] == opts["--slow"]["dest"] == "speed"
    assert opts["--fast"]["takes_value"] is False
    assert opts["--top-p"]["type"] == "float" and opts["--top-p"]["choices"] == [
        "0.5",
        "0.9",
        "1.0",
    ]
    assert opts["--level"]["choices"] == ["1", "2", "3"]
    assert opts["--shard"]["type"] == "unknown"
    assert opts["--no-cache"] is opts["--cache"] and opts["--cache"]["action"] == "boolean_optional"
    assert opts["--verbose"]["action"] == "count" and opts["--verbose"]["takes_value"] is False
    assert opts["--tag"]["takes_value"] is None  # nargs="?": a value or none
    assert opts["--spread"]["type"] == "unknown" and opts["--spread"]["choices_unread"]
    assert "input" not in opts and "--alpha" not in opts
    # --seed is declared twice, an int in one subcommand and a choice in the other: merged,
    # nothing is assumed of its type
    seeds = [o for o in result["options"] if o["flags"] == ["--seed"]]
    assert [(o["type"], o["choices"]) for o in seeds] == [("int", None), ("str", ["a", "b"])]
    merged = flagcheck.declared(msgspec.convert(result, ScriptFlags))
    assert merged["--seed"] == flagcheck.Declared(True, "unknown", None, choices_unread=True)
    assert merged["--top-p"].choices == ("0.5", "0.9", "1.0")


def test_o6_the_verdict_says_which_source_confirms_or_denies(tmp_path: Path) -> None:
    """The preflight's verdict on the GROUPS script, read statically: abbreviations are not
    flags where every parser turns them off; the notes say what the read may have missed; the
    profile confirms what the source does not declare; a value is checked where either types
    it, the profile's type first."""
    read = flagcheck.ScriptRead(
        script="gen.py",
        host="h",
        reply=msgspec.convert(_read(tmp_path, GROUPS), ScriptFlags),
    )
    none = flagcheck.ProfileFlags(name="p", known=None)

    def check(sets: list[tuple[str, str | None]], profile: Any = none) -> Any:
        return flagcheck.check(
            [f for f, _ in sets], sets, lambda f: False, profile, read, lambda f, v: repr(v)
        )

    out = check([("--to", "1.0"), ("--top-p", "0.7"), ("--level", "02"), ("--fast", None)])
    assert out.confirmed == ["--top-p", "--level", "--fast"] and out.problems == []
    [unconfirmed] = out.unconfirmed
    # allow_abbrev=False: --to is no abbreviation of --top-p here, just not a flag
    assert unconfirmed.startswith(
        "--to: not a flag of the client (did you mean --top-p?): gen.py does not declare it"
    )
    assert "1 of its add_argument calls name options not written literally" in unconfirmed
    assert "parse_known_args" in unconfirmed
    assert out.unsure == [
        "--top-p: '0.7' is not one of 0.5, 0.9, 1.0 (choices from gen.py, read statically on h)"
    ]
    assert out.typed == 1 and out.sources == ["gen.py, read statically on h"]  # --level 02
    out = check([("--fast", "1"), ("--out", None), ("--seed", "x")])
    assert out.problems == [
        "--fast: takes no value (--set fast)",
        "--out: needs a value (--set out=VALUE)",
    ]
    assert out.typed == 0 and out.unsure == []  # --seed: two types, none assumed
    profile = flagcheck.ProfileFlags(
        name="mine",
        known=frozenset(["--retries", "--top-p"]),
        types={"--top-p": ["0.7"]},
        type_source="value_types of mine",
    )
    out = check([("--retries", "3"), ("--top-p", "0.7"), ("--tpo-p", "1")], profile)
    assert out.confirmed == ["--retries", "--top-p"] and out.unsure == [] and out.typed == 1
    # GROUPS names options not written literally: the profile fills in, and says why
    assert out.sources == [
        "gen.py, read statically on h",
        "the client profile 'mine', as 1 of gen.py's add_argument calls name options not "
        "written literally",
    ]
    assert out.unconfirmed[0].startswith(
        "--tpo-p: not a flag of the client (did you mean --top-p?): gen.py does not declare it"
    )
    assert "nor does the client profile 'mine' list it" in out.unconfirmed[0]
    unread = flagcheck.ScriptRead(script="gen.py", host="h", reply=None, reason="gone")
    out = flagcheck.check(
        ["--x"], [("--x", "1")], lambda f: True, profile, unread, lambda f, v: repr(v)
    )
    assert out.unconfirmed == [
        "--x: not a flag of the client profile 'mine', and could not read gen.py's flags "
        "statically: gone"
    ]
    out = flagcheck.check(
        ["--retries"], [("--retries", "3")], lambda f: True, profile, unread, lambda f, v: repr(v)
    )
    assert out.confirmed == ["--retries"] and out.problems == out.unconfirmed == []
    assert out.sources == [
        "the client profile 'mine', as could not read gen.py's flags statically: gone"
    ]
    # A script read whole decides: a flag the profile lists but it lacks is refused, --force or
    # not; removing such a flag is what it needs.
    old = tmp_path / "old"
    old.mkdir()
    whole = flagcheck.ScriptRead(
        script="gen.py",
        host="h",
        reply=msgspec.convert(
            _read(old, "import argparse\np = argparse.ArgumentParser()\n"
                  "p.add_argument('--out')\np.parse_args()\n"),
            ScriptFlags,
        ),
    )  # fmt: skip
    out = flagcheck.check(
        ["--retries"], [("--retries", "3")], lambda f: False, profile, whole, lambda f, v: repr(v)
    )
    assert out.confirmed == [] and out.unconfirmed == [] and out.missing == ["--retries"]
    assert out.problems == [
        "--retries: not a flag of the client: the installed gen.py does not declare it (read "
        "statically on h; the client profile 'mine' lists it, but the installed script decides)"
    ]
    out = flagcheck.check(["--retries"], [], lambda f: False, profile, whole, lambda f, v: repr(v))
    assert out.confirmed == ["--retries"] and out.problems == out.unconfirmed == []


def test_o6_what_cannot_be_read_says_why(tmp_path: Path) -> None:
    cases = {
        "broken.py": ("import argparse\np = argparse.ArgumentParser(\n", "is not Python 3."),
        "clicked.py": (
            "import click\n\n@click.command()\n@click.option('--n', type=int)\n"
            "def main(n):\n    pass\n",
            "uses click, not argparse",
        ),
        "handmade.py": ("import sys\nn = sys.argv[sys.argv.index('--n') + 1]\n", "sys.argv"),
        "elsewhere.py": (
            "import argparse\nfrom mylib import add_args\np = argparse.ArgumentParser()\n"
            "add_args(p)\np.parse_args()\n",
            "declares no option in itself",
        ),
        "binary.py": ("\0\0ELF", "is not Python 3."),
        "deep.py": ("x = " + "+".join(["1"] * 100_000) + "\n", "nested too deeply"),
    }
    for name, (source, why) in cases.items():
        result = _read(tmp_path, source, name)
        assert result["readable"] and not result["found"], name
        assert why in result["reason"] and str(tmp_path / name) in result["reason"], result
    missing = argspec.script_flags({"workdir": str(tmp_path), "argv": ["python3", "nope.py"]})
    assert not missing["readable"] and not missing["found"]
    assert missing["reason"] == f"cannot open {tmp_path / 'nope.py'}: No such file or directory"
    (tmp_path / "dir.py").mkdir()
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    for name in ("dir.py", "fifo.py"):  # a FIFO does not block the agent
        special = argspec.script_flags({"workdir": str(tmp_path), "argv": ["python3", name]})
        assert not special["readable"] and "not a regular file" in special["reason"], special
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (argspec.MAX_SOURCE_BYTES + 1))
    too_big = argspec.script_flags({"workdir": str(tmp_path), "argv": ["python3", "big.py"]})
    assert not too_big["readable"] and "larger than" in too_big["reason"]


def test_o6_the_script_is_found_as_the_launch_finds_it(tmp_path: Path) -> None:
    """Relative to the workdir (``~`` literal: no shell expands an argv), or on the launch's
    PATH when executed by name."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "gen-tool"
    tool.write_text(
        "#!/usr/bin/env python3\nimport argparse\nargparse.ArgumentParser().add_argument('--x')\n"
    )
    tool.chmod(0o755)
    found = argspec.script_flags(
        {"workdir": str(tmp_path), "argv": ["gen-tool"], "search_path": str(bin_dir)}
    )
    assert found["path"] == str(tool) and "--x" in _by_flag(dict(found))
    elsewhere = argspec.script_flags(
        {"workdir": str(tmp_path), "argv": ["gen-tool"], "search_path": "/nonexistent"}
    )
    assert not elsewhere["readable"] and elsewhere["reason"] == (
        "no executable gen-tool on the launch's PATH"
    )
    direct = argspec.script_flags({"workdir": str(tmp_path), "argv": ["bin/gen-tool"]})
    assert direct["path"] == str(tool) and direct["found"]
    tilde = argspec.script_flags({"workdir": str(tmp_path), "argv": ["python3", "~/gen.py"]})
    assert tilde["path"] == str(tmp_path / "~" / "gen.py") and not tilde["readable"]


# --------------------------------------------------------------------------- a real run

HANDMADE = """
import json
import os
import signal
import sys

# A client that parses its argv by hand: whatever it is given (--help included), it starts
# working, leaving a marker and appending 50 records to its dataset.
here = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(here, "markers"), exist_ok=True)
open(os.path.join(here, "markers", str(os.getpid())), "w").close()
args = sys.argv[1:]
def value(flag, default):
    return args[args.index(flag) + 1] if flag in args else default
dataset = value("--datasets", "B1")
path = os.path.join(value("--output-dir", "out"), dataset, "raw_responses.jsonl")
os.makedirs(os.path.dirname(path), exist_ok=True)
start = sum(1 for _ in open(path)) if os.path.exists(path) else 0
with open(path, "a") as f:
    for i in range(start, start + 50):
        rec = {"sample_id": "%s-%06d" % (dataset, i), "output_ids": [1, 2],
               "prompt_tokens": 3, "completion_tokens": 2, "finish_reason": "stop"}
        f.write(json.dumps(rec) + "\\n")
signal.pause()
"""


def _markers(work: Path) -> list[int]:
    d = work / "markers"
    return sorted(int(p.name) for p in d.iterdir()) if d.is_dir() else []


def _kill_markers(work: Path) -> None:
    for pid in _markers(work):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"handmade.py" in cmdline:
            os.kill(pid, signal.SIGKILL)


def test_o6_a_client_that_ignores_help_is_never_run_by_the_gate(
    tmp_path: Path, state_home: Path
) -> None:
    """``launch``/``restart --set some-flag=V`` of a client that parses its argv by hand: refused
    before anything runs (no process of it started, its dataset byte-identical), because its
    flags cannot be read statically; ``--force`` lets the preflight by, saying what it did not
    check. Asking its ``--help`` would have appended 50 records."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "handmade.py").write_text(HANDMADE)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    argv = [sys.executable, "handmade.py", "--datasets", "B1", "--output-dir", "out"]
    cfg = write_local_config(
        tmp_path / "rw.toml",
        f'[[runs]]\nname = "hm"\nhost = "here"\nworkdir = {json.dumps(str(work))}\n'
        f"argv = {json.dumps(argv)}\n",
        top='scripts = ["handmade.py"]',
    )
    refused_why = (
        f"could not read handmade.py's flags statically: {work / 'handmade.py'} reads sys.argv "
        "itself"
    )

    async def plan(action: Literal["launch", "restart"], sets: list[str], **kw: Any) -> Any:
        dry_run = kw.pop("dry_run", False)
        async with Engine(load_config(cfg)) as engine:
            p = await engine.plan("hm", action=action, overrides=sets, **kw)
            return await engine.execute(p, dry_run=dry_run)

    try:
        # not running: a launch with a new flag is refused, nothing started
        result = asyncio.run(plan("launch", ["some-flag=V"]))
        pre = result.steps[0]
        assert not result.ok and pre.name == "preflight" and pre.state == "failed", pre
        assert f"--some-flag: cannot be confirmed: {refused_why}" in pre.detail, pre.detail
        assert "pass --force to launch anyway" in pre.detail
        assert _markers(work) == [] and not data.exists()

        # launched as configured (no flag to check): it runs once and writes its 50 records
        started = asyncio.run(plan("launch", []))
        assert started.ok, [s.to_json() for s in started.steps]
        wait_until(lambda: data.exists() and data.read_bytes().count(b"\n") == 50, timeout=30)
        [pid] = _markers(work)
        before = data.read_bytes()

        # running: a restart with a new flag is refused before the stop; nothing else ran
        result = asyncio.run(plan("restart", ["some-flag=V"]))
        assert not result.ok and result.failed_step is not None
        assert result.failed_step.name == "preflight", result.failed_step
        assert refused_why in result.failed_step.detail
        assert [s.state for s in result.steps[1:]] == ["pending"] * (len(result.steps) - 1)
        forced = asyncio.run(plan("restart", ["some-flag=V"], force=True, dry_run=True))
        pre = forced.steps[0]
        assert pre.state == "ok" and "NOT checked (--force): --some-flag" in pre.detail, pre
        assert _markers(work) == [pid] and Path(f"/proc/{pid}").exists()
        assert data.read_bytes() == before
    finally:
        _kill_markers(work)
