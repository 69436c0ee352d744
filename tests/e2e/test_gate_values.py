"""The preflight checks every ``--set`` VALUE before anything stops (invariant 5 of
``docs/reliability.md``): real runs of the reference client and the SpecForge stand-in, real
scripts read statically (never run), real config files.

A value of the wrong type would pass the flag-name check, stop a healthy run and die in the
client's argparse; the rollback would bring the old command line back, but the run was down for
nothing. Here such a value is refused with the run untouched: same process (identity), its data
only grown, nothing launched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import audit, clients, launchspec
from supervisor.config import load_config
from supervisor.demo import modelopt_server_generate, run_inference, specforge_regenerate
from supervisor.engine import Engine
from supervisor.model import Identity
from tests.fixtures_actions import (
    API_KEY,
    DemoRun,
    engine_for,
    pid_alive,
    run_pids,
    runwatch,
    why,
)
from tests.fixtures_clients import ClientRun
from tests.fixtures_config import write_local_config
from tests.waiting import wait_until

REFUSED = "the new command line would not start"
NOTHING = "nothing was stopped or launched"


async def _plan_and_run(engine: Any, run: str, action: str, sets: list[str], **kw: Any) -> Any:
    dry_run = kw.pop("dry_run", False)
    plan = await engine.plan(run, action=action, overrides=sets, **kw)
    return await engine.execute(plan, dry_run=dry_run)


async def _identity(engine: Any, run: str) -> Identity:
    snap = await engine.refresh()
    [rv] = [r for h in snap.hosts for r in h.runs if r.name == run]
    assert rv.state == "running" and rv.process is not None, rv
    return rv.process.identity


def _files(root: Path) -> dict[Path, bytes]:
    """Every file under ``root`` (run data, sidecars, locks) and its bytes."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _untouched(before: dict[Path, bytes], root: Path) -> None:
    """Every file there before is still there, its old bytes a prefix of its bytes now (a live
    run appends), and nothing was moved aside or repaired."""
    now = _files(root)
    for path, data in before.items():
        assert path in now, f"{path} is gone"
        assert now[path].startswith(data), f"{path} was rewritten"
    extra = [p.name for p in now if p not in before]
    assert not [n for n in extra if ".broken" in n or "-20" in n], extra


def _refused_at_preflight(result: Any) -> str:
    assert not result.ok, why(result)
    failed = result.failed_step
    assert failed is not None and failed.name == "preflight", why(result)
    assert [s.state for s in result.steps[1:]] == ["pending"] * (len(result.steps) - 1)
    assert REFUSED in failed.detail and NOTHING in failed.detail, failed.detail
    return str(failed.detail)


# --------------------------------------------------------------------------- reference client


async def test_inv5_a_value_of_the_wrong_type_is_refused_before_the_stop(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """A bad int (through the CLI, as a person types it), a bad float, an int given a decimal,
    a key pasted as a value: each refused naming the flag, value, type and where the type comes
    from; the run keeps its process and its data. A good value still restarts."""
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    data = demo.workdir / "data"
    async with engine_for(demo) as engine:
        launched = await _plan_and_run(engine, "demo", "launch", [])
        assert launched.ok, why(launched)
        await asyncio.to_thread(wait_until, lambda: len(demo.complete_ids("B1")) >= 2, 60)
        ident = await _identity(engine, "demo")
        before = _files(data)

        out = await asyncio.to_thread(
            runwatch, "restart", "demo", "-c", str(demo.config_path), "--set", "max-tokens=abc",
            "--yes",
        )  # fmt: skip
        assert out.returncode == 1, out.stdout + out.stderr
        assert (
            "--max-tokens: 'abc' is not an int (type from value_types of the built-in client "
            "profile 'run_inference')" in out.stdout
        ), out.stdout
        assert NOTHING in out.stdout and "stopped at preflight" in out.stderr

        cases = {
            "temperature=hot": "--temperature: 'hot' is not a float",
            "concurrency=2.5": "--concurrency: '2.5' is not an int",
            # a good value beside a bad one does not let the bad one by
            "token-budget=100000000,max-retries=lots": "--max-retries: 'lots' is not an int",
        }
        for sets, expected in cases.items():
            result = await _plan_and_run(engine, "demo", "restart", sets.split(","))
            assert expected in _refused_at_preflight(result)
        # the API key pasted as a value: refused, and never shown
        result = await _plan_and_run(engine, "demo", "restart", [f"max-tokens={API_KEY}"])
        detail = _refused_at_preflight(result)
        assert "--max-tokens: the value given (not shown: it is a secret) is not an int" in detail
        assert API_KEY not in json.dumps(result.to_json())

        assert await _identity(engine, "demo") == ident  # the same process, never signalled
        assert run_pids(demo.workdir) == [ident.pid]
        _untouched(before, data)
        assert API_KEY not in audit.audit_path().read_text()
        refused = [e for e in audit.read() if e["action"] == "restart"]
        assert len(refused) == 5 and not any(e["ok"] for e in refused)
        assert not [e for e in audit.read() if e["action"] in ("kill", "rollback")]

        # a value of the right type still restarts
        good = await _plan_and_run(engine, "demo", "restart", ["token-budget=100000000"])
        assert good.ok, why(good)
        pre = next(s for s in good.steps if s.name == "preflight")
        assert "1 value(s) of the expected type" in pre.detail, pre.detail
        assert good.identity is not None and good.identity["pid"] != ident.pid
        assert not pid_alive(ident.pid)
        assert run_pids(demo.workdir) == [good.identity["pid"]]


# --------------------------------------------------------------------------- SpecForge


def test_inv5_a_choice_outside_the_list_is_refused_before_the_stop(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """SpecForge's ``--reasoning`` takes none, save or disable; ``--num-samples`` an int."""
    run = ClientRun(tmp_path, "specforge", client_server.url, demo_tokenizer)

    async def go() -> None:
        async with Engine(run.config) as engine:
            launched = await _plan_and_run(engine, "sf", "launch", [])
            assert launched.ok, why(launched)
            await asyncio.to_thread(wait_until, lambda: len(run.lines()) >= 2, 60)
            ident = await _identity(engine, "sf")
            before = _files(run.workdir / "out")
            try:
                bad = await _plan_and_run(engine, "sf", "restart", ["reasoning=maybe"])
                assert (
                    "--reasoning: 'maybe' is not one of none, save, disable (type from "
                    "value_types of the built-in client profile 'specforge')"
                ) in _refused_at_preflight(bad)
                bad = await _plan_and_run(engine, "sf", "restart", ["num-samples=many"])
                assert "--num-samples: 'many' is not an int" in _refused_at_preflight(bad)
                bad = await _plan_and_run(engine, "sf", "restart", ["input-file-path="])
                assert "--input-file-path: '' is not a path" in _refused_at_preflight(bad)
                # a listed choice passes the preflight (dry run: nothing changes)
                good = await _plan_and_run(
                    engine, "sf", "restart", ["reasoning=disable"], dry_run=True
                )
                pre = next(s for s in good.steps if s.name == "preflight")
                assert pre.state == "ok", why(good)
                assert await _identity(engine, "sf") == ident
                _untouched(before, run.workdir / "out")
            finally:
                os.kill(ident.pid, signal.SIGKILL)

    asyncio.run(go())


def test_inv5_modelopt_values_are_typed_too(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    run = ClientRun(tmp_path, "modelopt", client_server.url, demo_tokenizer)

    async def go() -> Any:
        async with Engine(run.config) as engine:
            return await _plan_and_run(engine, "mo", "launch", ["num_threads=eight"], dry_run=True)

    detail = _refused_at_preflight(asyncio.run(go()))
    assert "--num_threads: 'eight' is not an int" in detail
    assert "sk-modelopt-secret" not in detail  # the argv's key is never in a message


# --------------------------------------------------------------------------- user profiles

GEN = """
import argparse
p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--n", type=int)
p.add_argument("--mode", default="fast")
p.add_argument("--service-token", type=int)
p.parse_args()
"""


def _user_profile_config(tmp_path: Path, value_types: str) -> Path:
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "gen.py").write_text(GEN)
    argv = [sys.executable, "gen.py", "--out", "out/x.jsonl"]
    return write_local_config(
        tmp_path / "rw.toml",
        f"""
[[runs]]
name = "mine"
host = "here"
workdir = {json.dumps(str(work))}
argv = {json.dumps(argv)}

[clients.mygen]
scripts = ["gen.py"]
known_flags = ["--out", "--n", "--mode", "--service-token"]
{value_types}
[clients.mygen.flags]
output_file = ["--out"]
""",
    )


def test_inv5_a_user_profile_types_its_flags(tmp_path: Path, state_home: Path) -> None:
    cfg = _user_profile_config(
        tmp_path, 'value_types = { "--n" = "int", "--mode" = ["fast", "slow"] }'
    )

    async def go(sets: list[str]) -> Any:
        async with Engine(load_config(cfg)) as engine:
            return await _plan_and_run(engine, "mine", "launch", sets, dry_run=True)

    detail = _refused_at_preflight(asyncio.run(go(["mode=medium", "n=3"])))
    assert (
        f"--mode: 'medium' is not one of fast, slow (type from value_types of the client "
        f"profile 'mygen' in {cfg})"
    ) in detail
    assert "--n" not in detail.replace("--n=", "")  # n=3 is an int: not named
    good = asyncio.run(go(["mode=slow", "n=3"]))
    pre = next(s for s in good.steps if s.name == "preflight")
    assert pre.state == "ok" and "2 value(s) of the expected type" in pre.detail, why(good)
    # --service-token is untyped in the profile: the type=int of gen.py, read statically, checks
    # it (never showing the value of a secret-named flag)
    untyped = _refused_at_preflight(asyncio.run(go(["service-token=x"])))
    assert (
        "--service-token: the value given (not shown: it is a secret) is not an int (type from "
        "gen.py, read statically on here)"
    ) in untyped
    typed = asyncio.run(go(["service-token=7"]))
    assert next(s for s in typed.steps if s.name == "preflight").state == "ok", why(typed)
    # a value kept from an earlier launch (before the type was declared) is checked too
    launchspec.save(load_config(cfg).key, launchspec.LaunchSpec(run="mine", sets=[("--n", "ten")]))
    detail = _refused_at_preflight(asyncio.run(go([])))
    assert "--n: 'ten' is not an int (type from" in detail
    assert "kept in the run's launch spec, --reset drops it" in detail


def test_inv5_a_secret_flag_value_is_refused_without_showing_it(
    tmp_path: Path, state_home: Path
) -> None:
    secret = "s3cr3t-not-a-number"
    cfg = _user_profile_config(tmp_path, 'value_types = { "--service-token" = "int" }')
    for extra in ((), ("--json",)):
        out = runwatch(
            "launch", "mine", "-c", str(cfg), "--set", f"service-token={secret}", "--yes", *extra
        )
        assert out.returncode == 1, out.stdout + out.stderr
        text = out.stdout + out.stderr
        assert secret not in text and "s3cr3t" not in text
        assert "--service-token: the value given (not shown: it is a secret) is not an int" in text
        assert NOTHING in text
    assert secret not in audit.audit_path().read_text()
    assert [e["ok"] for e in audit.read() if e["action"] == "launch"] == [False, False]


@pytest.mark.parametrize(
    ("value_types", "message"),
    [
        (
            'value_types = { "--n" = "integer" }',
            "clients.mygen.value_types.--n: unknown type 'integer'",
        ),
        (
            'value_types = { "--count" = "int" }',
            "clients.mygen.value_types.--count: not one of the profile's known_flags",
        ),
        (
            'value_types = { "--n" = 3 }',
            "clients.mygen.value_types.--n: expected a type name or a list of strings",
        ),
        ('value_types = { "--mode" = [] }', "clients.mygen.value_types.--mode: an empty list"),
    ],
)
def test_inv5_a_bad_value_type_in_a_config_is_a_config_error(
    tmp_path: Path, value_types: str, message: str
) -> None:
    cfg = _user_profile_config(tmp_path, value_types)
    out = runwatch("clients", "-c", str(cfg))
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "\n  -> " in out.stderr  # and what to do


# --------------------------------------------------------------------------- the built-ins


def _stand_in_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield "run_inference", run_inference._parser()
    yield "specforge", specforge_regenerate._parser()
    yield "modelopt", modelopt_server_generate._parser()


def test_inv5_builtin_value_types_are_the_scripts_argparse_types() -> None:
    """Every int, float and choices option of the faithful stand-ins is typed alike in its
    profile, and every typed flag is one the script (or an older version of it, V12) has; the
    profiles themselves are valid."""
    from tests.versions_clients import MODELOPT_GENERATIONS, SPECFORGE_GENERATIONS

    older = {
        "specforge": {f for g in SPECFORGE_GENERATIONS for f in g.options},
        "modelopt": {f for g in MODELOPT_GENERATIONS for f in g.options},
    }
    for name, parser in _stand_in_parsers():
        profile = clients.BUILTIN_CLIENTS[name]
        assert clients.value_types_problems(profile) == []
        options = {o: a for a in parser._actions for o in a.option_strings}
        assert set(profile.value_types) <= set(options) | older.get(name, set()), name
        for flag, action in options.items():
            if flag not in profile.known_flags:
                continue
            expected: Any = None
            if action.choices is not None:
                expected = [str(c) for c in action.choices]
            elif action.type in (int, float):
                expected = action.type.__name__
            if expected is not None:
                assert profile.value_types.get(flag) == expected, (name, flag)
            if flag in profile.value_types and isinstance(profile.value_types[flag], str):
                assert action.type in (None, str, int, float), (name, flag, action.type)


def test_inv5_values_are_read_as_argparse_reads_them() -> None:
    ok: list[tuple[str, clients.ValueType]]
    bad: list[tuple[str, clients.ValueType]]
    ok = [("64", "int"), ("-3", "int"), ("1_000", "int"), (" 7 ", "int"), ("0.7", "float"),
          ("1e-3", "float"), ("5", "float"), ("", "str"), ("x.jsonl", "path"),
          ("save", ["none", "save"])]  # fmt: skip
    for value, vtype in ok:
        assert clients.value_problem(value, vtype) is None, (value, vtype)
        if vtype in ("int", "float"):
            (int if vtype == "int" else float)(value)  # argparse's type= accepts it too
    bad = [("abc", "int"), ("2.5", "int"), ("", "int"), ("hot", "float"), ("", "path"),
           ("Save", ["none", "save"])]  # fmt: skip
    for value, vtype in bad:
        assert clients.value_problem(value, vtype) is not None, (value, vtype)
    # choices of a type=int option (read statically): a number equal to a numeric choice passes
    assert clients.value_problem("01", ["1", "2"], numeric_choices=True) is None
    assert clients.value_problem("01", ["1", "2"]) is not None


# --------------------------------------------------------------------------- no profile: its source

TOOL = """
import argparse
open("ran", "w").close()
p = argparse.ArgumentParser()
p.add_argument("--datasets", required=True)
p.add_argument("--output-dir", default="out")
p.add_argument("--mode", choices=["a", "b"], default="a")
p.add_argument("--level", type=int, choices=[1, 2, 3], default=1)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--ratio", type=float, choices=[0.5, 1.0])
p.add_argument("--output-file-path")
p.parse_args()
"""


def test_inv5_without_a_profile_the_declared_types_and_choices_are_checked(
    tmp_path: Path, state_home: Path
) -> None:
    """A script no profile describes: the int and float types and the choices its argparse
    source declares are checked, read statically (the script is never run: it would leave a
    file ``ran``); a wrong value is refused, and as the parser is read exactly, argparse itself
    refuses it even with --force. An abbreviation argparse would expand is refused even then."""
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    (work / "tool.py").write_text(TOOL)
    argv = [sys.executable, "tool.py", "--datasets", "B1", "--output-dir", "out"]
    cfg = write_local_config(
        tmp_path / "rw.toml",
        f'[[runs]]\nname = "t"\nhost = "here"\nworkdir = {json.dumps(str(work))}\n'
        f"argv = {json.dumps(argv)}\n",
        top='scripts = ["tool.py"]',
    )

    async def go(sets: list[str], force: bool = False) -> Any:
        async with Engine(load_config(cfg)) as engine:
            plan = await engine.plan("t", action="launch", overrides=sets, force=force)
            return await engine.execute(plan, dry_run=True)

    source = "tool.py, read statically on here"
    refused = {
        "mode=c": f"--mode: 'c' is not one of a, b (choices from {source})",
        "batch=many": f"--batch: 'many' is not an int (type from {source})",
        "level=4": f"--level: '4' is not one of 1, 2, 3 (choices from {source})",
        "ratio=0.7": f"--ratio: '0.7' is not one of 0.5, 1.0 (choices from {source})",
    }
    for sets, expected in refused.items():
        detail = _refused_at_preflight(asyncio.run(go([sets])))
        assert expected in detail and "pass --force" in detail, detail
    for accepted in (["mode=b", "level=2"], ["level=02"], ["ratio=1"], ["batch=16"]):
        result = asyncio.run(go(accepted))
        pre = next(s for s in result.steps if s.name == "preflight")
        assert pre.state == "ok", why(result)
        assert f"{len(accepted)} value(s) of the expected type" in pre.detail, pre.detail
    # The parser is read exactly, so argparse itself says the client would exit at once:
    # --force does not start it (it would stop a live run for a relaunch that dies).
    forced = asyncio.run(go(["mode=c"], force=True))
    pre = next(s for s in forced.steps if s.name == "preflight")
    assert pre.state == "failed", why(forced)
    assert "tool.py would refuse this command line: argument --mode: invalid choice: 'c'" in (
        pre.detail
    ), pre.detail
    # --output-file is argparse's abbreviation of --output-file-path: the gate would check
    # other files than those the client writes
    for force in (False, True):
        detail = _refused_at_preflight(asyncio.run(go(["output-file=x.jsonl"], force=force)))
        assert (
            "--output-file: tool.py would take it as an abbreviation of --output-file-path"
            in detail
        )
    assert not (work / "ran").exists()
