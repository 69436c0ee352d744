"""The argument reading (``supervisor/argcheck.py``, ``agent/argresolve.py``): a command line
means to the gate what it means to the client's own parser, or the start is refused before
anything stops (rows A1 of ``docs/reliability.md``). Real clients, real files, real launches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.errors import RunwatchError
from supervisor.plan import make_plan
from supervisor.steps import execute
from tests.fixtures_actions import pid_alive, sha256_of, why
from tests.fixtures_config import write_local_config
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("state_home")

GEN = """
import argparse, json, os, time
p = argparse.ArgumentParser(fromfile_prefix_chars="@")
p.add_argument("-o", "--out", default="data/default.jsonl")
p.add_argument("--resume", action=argparse.BooleanOptionalAction)
p.add_argument("--num-samples", type=int, default=3)
args = p.parse_args()
os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
with open(args.out, "a" if args.resume else "w") as f:
    for i in range(args.num_samples):
        rec = {"sample_id": "n-%d-%d" % (os.getpid(), i), "output_ids": [1, 2, 3],
               "prompt_tokens": 3, "completion_tokens": 3, "finish_reason": "stop"}
        f.write(json.dumps(rec) + "\\n")
        f.flush()
time.sleep(3600)
"""

CLICK_GEN = """
import json, time
import click

@click.command()
@click.option("--out", default="data/default.jsonl")
@click.option("--resume/--no-resume", default=False)
def main(out, resume):
    with open(out, "a" if resume else "w") as f:
        f.write(json.dumps({"sample_id": "c", "output_ids": [1], "prompt_tokens": 1,
                            "completion_tokens": 1, "finish_reason": "stop"}) + "\\n")
    time.sleep(3600)

main()
"""


def _records(n: int, legacy: bool = False) -> str:
    key = "text" if legacy else "output_ids"
    val: Any = "old text" if legacy else [7, 8, 9]
    return "".join(
        json.dumps(
            {
                "sample_id": f"old-{i}",
                key: val,
                "prompt_tokens": 3,
                "completion_tokens": 3,
                "finish_reason": "stop",
            }
        )
        + "\n"
        for i in range(n)
    )


def _config(tmp_path: Path, argv: list[str], script: str = "gen.py", source: str = GEN) -> Path:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True, exist_ok=True)
    if script.endswith(".py"):
        (work / script).write_text(source)
    return write_local_config(
        tmp_path / "rw.toml",
        f"""
[[runs]]
name = "g"
host = "here"
workdir = "{work}"
argv = {json.dumps(argv)}
client = "mygen"
settle_seconds = 0.5
stop_grace_seconds = 1.0

[clients.mygen]
scripts = [{json.dumps(script)}]
format = "raw"
resume = "flag"
path_defaults = {{ "--out" = "data/default.jsonl" }}
[clients.mygen.flags]
output_file = ["--out"]
resume = ["--resume"]
samples = ["--num-samples"]
""",
        python=True,
    )


async def _act(
    cfg: Path, action: Literal["launch", "restart"], overrides: Any = (), **kw: Any
) -> Any:
    """The action's result, or the error that refused it while it was planned."""
    async with Engine(load_config(cfg)) as engine:
        try:
            plan = await make_plan(engine, "g", action=action, overrides=overrides, **kw)
        except RunwatchError as e:
            return e
        return await execute(engine, plan)


def _refused_before_anything(result: Any, *texts: str) -> str:
    """The refusal's text: at planning (an abbreviation of a path flag makes the files unknown)
    or at the preflight, before anything stopped."""
    if isinstance(result, RunwatchError):
        for text in texts:
            assert text in str(result), str(result)
        return str(result)
    assert not result.ok, why(result)
    failed = result.failed_step
    assert failed is not None and failed.name == "preflight", why(result)
    for text in texts:
        assert text in failed.detail, failed.detail
    return str(failed.detail)


def _gen_pids(work: Path) -> list[int]:
    import os

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (
            cwd == str(work)
            and state != "Z"
            and any(a.endswith((b"gen.py", b".gen")) for a in argv)
        ):
            found.append(int(entry))
    return found


@pytest.fixture
def stop_gens(tmp_path: Path) -> Any:
    """Every client these tests start is killed at the end."""
    import os
    import signal

    yield
    work = tmp_path / "work"
    for pid in _gen_pids(work):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _gen_pids(work), timeout=10)


PY = sys.executable


def test_a1_resume_then_no_resume_is_refused_on_launch_and_restart(
    tmp_path: Path, stop_gens: None
) -> None:
    """``--resume --no-resume`` with BooleanOptionalAction: argparse takes the last one (no
    resume: the output opened "w"). A launch over 50 records and a restart that adds
    ``--no-resume`` are both refused before anything stops; the data stays byte-identical and
    the live client keeps running."""
    cfg = _config(tmp_path, [PY, "gen.py", "--out", "data/s.jsonl", "--resume"])
    data = tmp_path / "work" / "data" / "s.jsonl"
    data.write_text(_records(50))
    before = sha256_of(data)
    result = asyncio.run(_act(cfg, "launch", ["no-resume"]))
    _refused_before_anything(
        result, "--resume: argparse reads the command line as NOT resuming", "--no-resume"
    )
    assert sha256_of(data) == before and _gen_pids(tmp_path / "work") == []
    first = asyncio.run(_act(cfg, "launch"))
    assert first.ok, why(first)
    pid = int(first.identity["pid"])
    wait_until(lambda: len(data.read_text().splitlines()) == 53)
    grown = sha256_of(data)
    again = asyncio.run(_act(cfg, "restart", ["no-resume"]))
    _refused_before_anything(again, "NOT resuming")
    assert pid_alive(pid) and sha256_of(data) == grown


def test_a1_attached_short_option_is_read_as_the_client_reads_it(
    tmp_path: Path, stop_gens: None
) -> None:
    """``-odata/s.jsonl`` (an attached short option): runwatch's own reading would check the
    profile's default path (missing) and let the client overwrite ``data/s.jsonl``. Refused,
    naming the argument and the canonical rewrite."""
    cfg = _config(tmp_path, [PY, "gen.py", "-odata/s.jsonl"])
    data = tmp_path / "work" / "data" / "s.jsonl"
    data.write_text(_records(50))
    before = sha256_of(data)
    detail = _refused_before_anything(
        asyncio.run(_act(cfg, "launch")),
        "--out: gen.py's argparse resolves it to data/s.jsonl",
        "write it once as --out data/s.jsonl",
    )
    assert "default.jsonl" in detail
    assert sha256_of(data) == before and _gen_pids(tmp_path / "work") == []


def test_a1_format_gate_is_not_pointed_at_the_wrong_file(tmp_path: Path, stop_gens: None) -> None:
    """``--resume -odata/s.jsonl`` over 50 legacy-format lines: the format gate would check the
    default file; the start is refused and the legacy file is untouched."""
    cfg = _config(tmp_path, [PY, "gen.py", "--resume", "-odata/s.jsonl"])
    data = tmp_path / "work" / "data" / "s.jsonl"
    data.write_text(_records(50, legacy=True))
    before = sha256_of(data)
    _refused_before_anything(asyncio.run(_act(cfg, "launch")), "-odata/s.jsonl", "--out")
    assert sha256_of(data) == before and _gen_pids(tmp_path / "work") == []
    # Written canonically, the same command line reaches the format gate, which refuses it.
    cfg = _config(tmp_path, [PY, "gen.py", "--resume", "--out", "data/s.jsonl"])
    result = asyncio.run(_act(cfg, "launch"))
    assert not result.ok and result.failed_step.name == "format-check", why(result)
    assert sha256_of(data) == before


def test_a1_an_args_file_is_read_as_argparse_reads_it(tmp_path: Path, stop_gens: None) -> None:
    """``--out data/fresh.jsonl @run.args`` with ``fromfile_prefix_chars="@"``, the file holding
    ``--out data/s.jsonl``: argparse writes s.jsonl. Refused; s.jsonl untouched."""
    cfg = _config(tmp_path, [PY, "gen.py", "--out", "data/fresh.jsonl", "@run.args"])
    (tmp_path / "work" / "run.args").write_text("--out\ndata/s.jsonl\n")
    data = tmp_path / "work" / "data" / "s.jsonl"
    data.write_text(_records(50))
    before = sha256_of(data)
    _refused_before_anything(
        asyncio.run(_act(cfg, "launch")), "resolves it to data/s.jsonl", "fresh.jsonl"
    )
    assert sha256_of(data) == before and _gen_pids(tmp_path / "work") == []
    assert not (tmp_path / "work" / "data" / "fresh.jsonl").exists()


def test_a1_variants_argparse_resolves_and_the_gate_compares(
    tmp_path: Path, stop_gens: None
) -> None:
    """Abbreviations, ``--flag=value``, repeats, ``--``, a bad ``type=int`` value and a flag
    the script does not have: each refused before anything starts (argparse's own message
    where it rejects the argv); the canonical argv launches and resumes."""
    data = tmp_path / "work" / "data" / "s.jsonl"
    refused = {
        ("--ou", "data/x.jsonl", "--out", "data/s.jsonl", "--resume"): "",
        ("--out", "data/x.jsonl", "--resume", "-o", "data/s.jsonl"): "",
        ("--out", "data/s.jsonl", "--res"): "",  # abbreviation of --resume: argparse resumes
        ("--out", "data/s.jsonl", "--resume", "--num-samples", "many"): "invalid int value",
        ("--out", "data/s.jsonl", "--resume", "--is-reasoning-model"): "unrecognized arguments",
        ("--out", "data/s.jsonl", "--", "--resume"): "unrecognized arguments",
    }
    for args, text in refused.items():
        cfg = _config(tmp_path, [PY, "gen.py", *args])
        data.write_text(_records(50))
        before = sha256_of(data)
        result = asyncio.run(_act(cfg, "launch"))
        _refused_before_anything(result, text)
        assert sha256_of(data) == before and _gen_pids(tmp_path / "work") == [], args
    cfg = _config(tmp_path, [PY, "gen.py", "--out=data/s.jsonl", "--resume"])
    result = asyncio.run(_act(cfg, "launch"))
    assert result.ok, why(result)
    wait_until(lambda: len(data.read_text().splitlines()) == 53)
    pre = next(s for s in result.steps if s.name == "preflight")
    assert "gen.py's own argparse parser" in pre.detail, pre.detail


def test_a1_a_default_from_the_environment_is_not_guessed(tmp_path: Path, stop_gens: None) -> None:
    """``default=os.environ.get(...)`` for the output path: not written literally, so the
    start without ``--out`` is refused (give it explicitly); with it, the start goes on."""
    source = GEN.replace('default="data/default.jsonl"', 'default=os.environ.get("OUT", "x")')
    cfg = _config(tmp_path, [PY, "gen.py", "--resume"], source=source)
    _refused_before_anything(
        asyncio.run(_act(cfg, "launch")), "--out: the value gen.py uses without it is not known"
    )
    assert _gen_pids(tmp_path / "work") == []
    cfg = _config(tmp_path, [PY, "gen.py", "--resume", "--out", "data/s.jsonl"], source=source)
    assert asyncio.run(_act(cfg, "launch")).ok


def test_a1_a_click_client_gets_only_a_canonical_argv(tmp_path: Path, stop_gens: None) -> None:
    """A click script (no argparse to read): ``--resume --no-resume``, an abbreviation, an
    ``@file`` item or a repeated flag is refused before anything starts; ``--out=FILE
    --resume`` launches."""
    pytest.importorskip("click")
    data = tmp_path / "work" / "data" / "s.jsonl"
    for args, text in {
        ("--out", "data/s.jsonl", "--resume", "--no-resume"): "--no-resume: a negation",
        ("--ou", "data/s.jsonl", "--resume"): "--ou in the command line is an abbreviation",
        ("--out", "data/s.jsonl", "--resume", "@more"): "@more: an @file item",
        ("--out", "data/x.jsonl", "--out", "data/s.jsonl", "--resume"): "given more than once",
        ("-odata/s.jsonl", "--resume"): "-odata/s.jsonl: a short option with its value",
    }.items():
        cfg = _config(tmp_path, [PY, "gen.py", *args], source=CLICK_GEN)
        data.write_text(_records(5))
        before = sha256_of(data)
        result = asyncio.run(_act(cfg, "launch"))
        detail = _refused_before_anything(result, text)
        if not isinstance(result, RunwatchError):  # else refused already while planned
            assert "only a canonical argv is accepted" in detail, detail
            assert "gen.py uses click, not argparse" in detail, detail
        assert sha256_of(data) == before and _gen_pids(tmp_path / "work") == []
    cfg = _config(tmp_path, [PY, "gen.py", "--out=data/s.jsonl", "--resume"], source=CLICK_GEN)
    result = asyncio.run(_act(cfg, "launch"))
    assert result.ok, why(result)
    wait_until(lambda: len(data.read_text().splitlines()) == 6)


def test_a1_a_python_m_client_gets_only_a_canonical_argv(tmp_path: Path, stop_gens: None) -> None:
    """``python -m pkg.gen``: no script file in the argv to read, so only a canonical argv
    passes: ``--resume --no-resume`` and ``-oFILE`` are refused, ``--out F --resume`` runs."""
    pkg = tmp_path / "work" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "gen.py").write_text(GEN)
    assert _gen_pids(tmp_path / "work") == []
    data = tmp_path / "work" / "data" / "s.jsonl"
    for args, text in {
        ("--out", "data/s.jsonl", "--resume", "--no-resume"): "a negation of --resume",
        ("--resume", "-odata/s.jsonl"): "a short option with its value attached",
    }.items():
        cfg = _config(tmp_path, [PY, "-m", "pkg.gen", *args], script="pkg.gen")
        data.write_text(_records(5))
        before = sha256_of(data)
        _refused_before_anything(asyncio.run(_act(cfg, "launch")), text)
        assert sha256_of(data) == before and _gen_pids(tmp_path / "work") == []
    cfg = _config(
        tmp_path, [PY, "-m", "pkg.gen", "--out", "data/s.jsonl", "--resume"], script="pkg.gen"
    )
    data.write_text(_records(5))
    result = asyncio.run(_act(cfg, "launch"))
    assert result.ok, why(result)
    wait_until(lambda: len(data.read_text().splitlines()) == 8)


def _specforge_refusal(result: Any) -> str:
    assert not result.ok, why(result)
    failed = result.failed_step
    assert failed is not None and failed.name == "preflight", why(result)
    assert all(s.state == "pending" for s in result.steps[1:]), why(result)
    return str(failed.detail)


def test_a1_specforge_flags_the_installed_version_lacks_are_refused_before_the_stop(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """The SpecForge profile accepts every version's flags; the installed script (the stand-in,
    like HEAD) has no ``--is-reasoning-model``. A restart that adds it is refused by the
    installed script's declared options before the stop (the script decides, not the profile):
    the live job keeps running and its output grows."""
    from tests.fixtures_clients import ClientRun

    run = ClientRun(tmp_path, "specforge", client_server.url, demo_tokenizer, settle=0.05)

    async def go() -> tuple[Any, Any]:
        async with Engine(run.config) as engine:
            launched = await engine.execute(await engine.plan("sf", action="launch"))
            assert launched.ok, why(launched)
            await asyncio.to_thread(wait_until, lambda: len(run.lines()) >= 2, 60)
            plan = await engine.plan("sf", action="restart", overrides=["is-reasoning-model"])
            return launched, await engine.execute(plan)

    try:
        launched, result = asyncio.run(go())
        detail = _specforge_refusal(result)
        assert "--is-reasoning-model: not a flag of the client" in detail, detail
        assert "the installed regenerate_train_data.py does not declare it" in detail, detail
        assert "the client profile 'specforge' lists it" in detail, detail
        assert pid_alive(int(launched.identity["pid"]))
        grown = len(run.lines())
        wait_until(lambda: len(run.lines()) > grown, timeout=60)
    finally:
        for pid in run.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a1_a_specforge_version_without_resume_gets_no_resume_hint(
    tmp_path: Path, client_server: Any, demo_tokenizer: Path
) -> None:
    """An older SpecForge (no ``--resume``): ``--resume`` in the argv is refused with argparse's
    "unrecognized arguments"; without it, over existing output, the overwrite refusal says the
    installed script cannot resume, and never hints ``--set resume``."""
    from tests.fixtures_clients import ClientRun

    run = ClientRun(tmp_path, "specforge", client_server.url, demo_tokenizer)
    script = run.workdir / "scripts" / "regenerate_train_data.py"
    source = script.read_text()
    line = '    data.add_argument("--resume", action="store_true")\n'
    assert line in source
    script.write_text(source.replace(line, "").replace("args.resume", "False"))
    rows = [
        {
            "id": f"B1-{i:06d}",
            "conversations": [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": f"answer {i}"},
            ],
            "status": "success",
        }
        for i in range(5)
    ]
    run.output.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = sha256_of(run.output)

    async def go(unsets: Any) -> Any:
        async with Engine(run.config) as engine:
            plan = await engine.plan("sf", action="launch", unsets=unsets)
            return await engine.execute(plan)

    detail = _specforge_refusal(asyncio.run(go(())))
    assert "unrecognized arguments: --resume" in detail, detail
    assert "if a newer regenerate_train_data.py declares --resume, copy it to" in detail, detail
    result = asyncio.run(go(["resume"]))
    assert not result.ok, why(result)
    text = why(result)
    assert "would overwrite" in text and "has no --resume: it cannot keep this output" in text, text
    assert "--set resume" not in text, text
    assert sha256_of(run.output) == before and run.pids() == []


def test_a1_a_relaunch_that_dies_at_once_is_never_running(tmp_path: Path) -> None:
    """A client that dies at once (here a script no parser read can judge: it exits 2 as an
    argparse error would) with a settle time shorter than its start: the launch fails with the
    exit, never "running", and the run is not left with a live unit."""
    source = "import sys\nsys.stderr.write('usage: gen.py\\nerror: bad\\n')\nsys.exit(2)\n"
    cfg = _config(tmp_path, [PY, "gen.py", "--out", "data/s.jsonl", "--resume"], source=source)
    text = cfg.read_text().replace("settle_seconds = 0.5", "settle_seconds = 0.01")
    cfg.write_text(text)
    for _ in range(3):
        result = asyncio.run(_act(cfg, "launch"))
        assert not result.ok and result.failed_step.name == "launch", why(result)
        assert "exited with status 2" in result.failed_step.detail, why(result)
        assert result.identity is None


def test_a1_the_rollback_goes_through_the_same_reading(tmp_path: Path, stop_gens: None) -> None:
    """A run started by hand as ``--out data/s.jsonl --resume @extra.args`` (the file empty
    then) is restarted on the config's argv with a value the client refuses at run time, so the
    relaunch dies after the stop; meanwhile ``extra.args`` says ``--no-resume``. The rollback
    to the stopped process's command line is refused by the argument reading (it would open the
    output with "w"): nothing is launched, the data byte-identical."""
    import subprocess

    source = GEN.replace(
        "args = p.parse_args()\n",
        "args = p.parse_args()\nif args.num_samples < 1:\n    raise SystemExit('no samples')\n",
    )
    cfg = _config(tmp_path, [PY, "gen.py", "--out", "data/s.jsonl", "--resume"], source=source)
    work = tmp_path / "work"
    data = work / "data" / "s.jsonl"
    data.write_text(_records(50))
    (work / "extra.args").write_text("")
    by_hand = [PY, "gen.py", "--out", "data/s.jsonl", "--resume", "@extra.args"]
    with open(work / "hand.log", "ab") as log:
        proc = subprocess.Popen(
            by_hand, cwd=work, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    wait_until(lambda: len(data.read_text().splitlines()) == 53)
    (work / "extra.args").write_text("--no-resume\n")
    before = sha256_of(data)
    changes = ["num-samples", "resume"]
    result = asyncio.run(_act(cfg, "restart", ["num-samples=0"], allow_change=changes))
    assert not result.ok and result.failed_step.name == "launch", why(result)
    rollback = result.rollback
    assert rollback is not None and not rollback["ok"], why(result)
    assert "ROLLBACK REFUSED" in rollback["detail"], rollback
    assert "NOT resuming" in rollback["detail"], rollback
    assert proc.wait(timeout=30) is not None and _gen_pids(work) == []
    assert sha256_of(data) == before
