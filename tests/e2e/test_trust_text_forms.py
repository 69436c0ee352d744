"""Issue 21 again: secrets a run prints to its log in forms no one registered (T40, T41, T42).

A real client on the test sshd host prints, just before it dies, a config dump of credential
names and values in every dump form (YAML, ``=``, ``=>``, a Python dict, JSON, a header without
a space, ``Authorization=Bearer``) and provider keys without a name (NVIDIA, Groq, GitHub,
GitLab, Google, Replicate, OpenRouter, Anthropic, Hugging Face, Slack, AWS, a JWT), and lines
that only look like them (counts, ``key: prompt``, a git hash, a uuid). The values are fresh
random ones that no process registered (not in the run's argv nor its environment): only the
patterns can mask them. The run-died alert's log tail, the watcher's event text, the run's log
tail (``Engine.tail_log``), the dashboard's Log tab (under Pilot) and the launch-failure tail of
``runwatch launch`` hold none of the values, and every plain line as it was printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Log

from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.watch import Watcher, WatchLock, watch
from tests import fixtures_actions as actions
from tests.fixtures_actions import host_toml
from tests.fixtures_alerts import Receiver
from tests.fixtures_tui import show_tab
from tests.waiting import wait_for
from tui.app import make_app
from tui.screens.run_detail import RunDetailScreen

pytestmark = pytest.mark.ssh

CLIENT = Path(__file__).resolve().parents[1] / "leaky_gen.py"
PY = sys.executable
ALNUM = string.ascii_letters + string.digits


def _rand(n: int, alphabet: str = ALNUM) -> str:
    rng = random.SystemRandom()
    while True:
        s = "".join(rng.choice(alphabet) for _ in range(n))
        if len(set(alphabet) & set(string.digits)) == 0 or any(c.isdigit() for c in s):
            return s


def _values() -> dict[str, str]:
    """Fresh values: dump-form values (key-like, no prefix) and provider-shaped keys."""
    v = {name: _rand(24) for name in ("yaml", "quoted", "pw", "arrow", "dict", "json", "xapi")}
    v |= {name: _rand(24) for name in ("environ", "pair", "tab", "xml", "tuple", "pem")}
    v["pem"] = _rand(64, ALNUM + "+/")
    v["bearer"] = _rand(32, ALNUM + "-._")
    v["escaped"] = _rand(20)
    v |= {
        "nvidia": "nvapi-" + _rand(64, ALNUM + "-_"),
        "groq": "gsk_" + _rand(52),
        "github_pat": f"github_pat_11{_rand(20)}_{_rand(59)}",
        "ghp": "ghp_" + _rand(36),
        "gitlab": "glpat-" + _rand(20, ALNUM + "-_"),
        "google": "AIza" + _rand(35, ALNUM + "-_"),
        "replicate": "r8_" + _rand(37),
        "openrouter": "sk-or-v1-" + _rand(64, "0123456789abcdef"),
        "anthropic": "sk-ant-api03-" + _rand(93, ALNUM + "-_") + "AA",
        "hf": "hf_" + _rand(34),
        "slack": f"xoxb-{_rand(12, string.digits)}-{_rand(13, string.digits)}-{_rand(24)}",
        "aws_id": "AKIA" + _rand(16, string.ascii_uppercase + "234567"),
        "aws_secret": _rand(18) + "/" + _rand(10) + "+" + _rand(10),
        "jwt": f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI{_rand(30)}.{_rand(43, ALNUM + '-_')}",
    }
    return v


def _leak_lines(v: dict[str, str]) -> tuple[list[str], list[str]]:
    """The lines the client prints last (ten: a run-died alert shows ten), and the plain ones
    among them that must arrive as they are."""
    plain = [
        "plain: max_tokens: 2048 tokens: 123456 token_budget = 10000000 key: prompt "
        "sort_key=length",
        f"plain: --input-key text sample B1-000042 out/B1/raw_responses.jsonl "
        f"commit {os.urandom(20).hex()} run {uuid.uuid4()}",
    ]
    earlier = [  # before the last ten: in the launch-failure tail and the Log tab only
        f"os.environ['OPENAI_API_KEY'] = '{v['environ']}'; setenv(\"HF_TOKEN\", \"{v['pair']}\")",
        f"HF_TOKEN\t{v['tab']}",
        f"<request><api_key>{v['xml']}</api_key></request> auth=('me', '{v['tuple']}')",
        "-----BEGIN PRIVATE KEY-----",
        v["pem"],
        "-----END PRIVATE KEY-----",
    ]
    secret = [
        f"dump: api_key: {v['yaml']} | password = '{v['pw']}' | token => {v['arrow']}",
        f'  openai_api_key: "{v["quoted"]}"',
        f"client kwargs {{'api_key': '{v['dict']}', 'model': 'm'}} body "
        f'{{"apiKey": "{v["json"]}"}} nested "{{\\"hf_token\\": \\"{v["escaped"]}\\"}}"',
        f"sent x-api-key:{v['xapi']} then Authorization=Bearer {v['bearer']}",
        f"keys {v['nvidia']} {v['groq']} {v['github_pat']} {v['ghp']}",
        f"more ({v['gitlab']}), '{v['google']}', [{v['replicate']}] {v['openrouter']}",
        f"and {v['anthropic']} {v['hf']},{v['slack']} {v['jwt']}",
        f"aws {v['aws_id']} {v['aws_secret']}",
    ]
    return earlier + secret + plain, plain


def _leaks(text: str, values: dict[str, str]) -> list[str]:
    return [name for name, value in values.items() if value in text]


def _config(root: Path, ssh_host_cfg: Any, receiver: Receiver) -> Path:
    """Two runs of the leaky client on the sshd host, each in its own workdir: ``gen`` runs
    until told to die, ``failing`` exits at once (a launch that fails)."""
    text = host_toml(ssh_host_cfg)
    for name, mode in (("gen", "run"), ("failing", "fail")):
        work = root / name
        work.mkdir()
        shutil.copyfile(CLIENT, work / "leaky_gen.py")
        argv = [PY, "leaky_gen.py", "--datasets", "B1", "--output-dir", "out"]
        argv += ["--mode", mode, "--print-file", "leaks.txt"]
        text += (
            f'\n[[runs]]\nname = "{name}"\nhost = "{ssh_host_cfg.name}"\n'
            f'workdir = {json.dumps(str(work))}\nclient = "leaky"\n'
            f'argv = {json.dumps(argv)}\ndatasets = ["B1"]\nlog = "logs/run.log"\n'
        )
    text += (
        '\n[clients.leaky]\nscripts = ["leaky_gen.py"]\nformat = "raw"\n'
        'path_defaults = { "--output-dir" = "out" }\n'
        '[clients.leaky.flags]\ndatasets = ["--datasets"]\noutput_dir = ["--output-dir"]\n'
        f"\n[alerts]\nurls = [{json.dumps(receiver.url())}]\n"
    )
    path = root / "runwatch.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


@contextlib.asynccontextmanager
async def _watching(engine: Engine, locks: Path) -> AsyncIterator[tuple[Watcher, list[str]]]:
    """``runwatch watch`` in this process (every 0.3 s) until the block ends."""
    lines: list[str] = []
    stop = asyncio.Event()
    watcher = Watcher(engine, emit=lines.append, interval=0.3)
    task = asyncio.ensure_future(
        watch(engine, stop, lock=WatchLock(str(engine.config.path), locks), watcher=watcher)
    )
    try:
        await wait_for(lambda: watcher.ticks > 0 or task.done(), 30, what="the first refresh")
        yield watcher, lines
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def _gen_pid(engine: Engine) -> int | None:
    for h in engine.last.hosts if engine.last else []:
        for r in h.runs:
            if r.name == "gen" and r.state == "running" and r.process is not None:
                return r.process.identity.pid
    return None


async def test_t40_t41_secrets_a_run_prints_in_any_form_never_leave_through_its_log_tail(
    tmp_path: Path, state_home: Path, ssh_host_cfg: Any, receiver: Receiver
) -> None:
    values = _values()
    printed, plain = _leak_lines(values)
    cfg = _config(tmp_path, ssh_host_cfg, receiver)
    for run in ("gen", "failing"):
        (tmp_path / run / "leaks.txt").write_text("\n".join(printed) + "\n")

    # The launch that fails shows its log tail (runwatch launch, a separate process).
    failed = subprocess.run(
        [PY, "-m", "supervisor.cli", "-c", str(cfg), "launch", "failing", "--yes"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    launch_text = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "giving up" in launch_text, launch_text
    assert not _leaks(launch_text, values), (_leaks(launch_text, values), launch_text)
    assert all(line in launch_text for line in plain), launch_text
    assert "api_key: ***" in launch_text and "x-api-key:***" in launch_text, launch_text
    assert "<api_key>***</api_key>" in launch_text, launch_text  # the earlier lines are there

    # The run that dies: its run-died alert and event carry the last ten lines of its log.
    async with Engine(load_config(cfg)) as engine:
        launched = await actions.launch(engine, "gen")
        assert launched.ok, actions.why(launched)
        async with _watching(engine, tmp_path / "locks") as (_watcher, lines):
            await wait_for(lambda: _gen_pid(engine) is not None, 60, what="the run seen running")
            (tmp_path / "gen" / "die").touch()
            await wait_for(
                lambda: any("Run stopped" in m for m in receiver.messages()),
                90,
                what="the run-died alert",
            )
        tail = await engine.tail_log(ssh_host_cfg.name, "gen", 50)
    screen = await _log_tab(cfg, f"{ssh_host_cfg.name}/gen", plain[-1])
    own = (tmp_path / "gen" / "logs" / "run.log").read_text()
    assert all(value in own for value in values.values())  # the client did print them all

    (alert,) = [m for m in receiver.messages() if "Run stopped" in m]
    assert "last lines of" in alert and all(line in alert for line in plain), alert
    event_text = "\n".join(lines)
    tail_text = "\n".join(tail.lines)
    assert all(line in tail_text for line in plain), tail_text
    assert '  openai_api_key: "***"' in tail.lines, tail_text
    assert "HF_TOKEN\t***" in tail.lines and "-----BEGIN PRIVATE KEY-----" in tail.lines, tail_text
    for name, text in (
        ("launch", launch_text),
        ("alert", alert),
        ("events", event_text),
        ("tail", tail_text),
        ("dashboard", screen),
    ):
        assert not _leaks(text, values), (name, _leaks(text, values), text)
    assert not _clients_in(tmp_path / "gen")  # it died on its own: nothing was killed


async def _log_tab(cfg: Path, key: str, last: str) -> str:
    """The dashboard's Log tab of ``key`` (its lines and the screen) once ``last`` is shown."""
    engine = Engine(load_config(cfg))
    app = make_app(engine.config, engine)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(lambda: app.find_run(key) is not None, 30, what="the run")
        app.open_run(key)
        await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the detail")
        await show_tab(pilot, "log")
        view = app.screen.query_one("#log-view", Log)
        await wait_for(lambda: any(last in x for x in view.lines), 30, what="the log")
        assert '  openai_api_key: "***"' in view.lines, view.lines
        return "\n".join(view.lines) + app.export_screenshot()


def _clients_in(workdir: Path) -> list[int]:
    """Live leaky clients whose working directory is ``workdir``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"leaky_gen.py" in argv and os.readlink(f"/proc/{entry}/cwd") == str(workdir):
                found.append(int(entry))
    return [p for p in found if actions.pid_alive(p)]


@pytest.fixture(autouse=True)
def _no_client_left(tmp_path: Path) -> Iterator[None]:
    yield
    for run in ("gen", "failing"):
        for pid in _clients_in(tmp_path / run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
