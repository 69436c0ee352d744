"""Issue 21, parts 1 and 5: secrets masked by value in every output, text from hosts shown as data.

A real client that is careless with secrets (``tests/secretive_gen.py``: sixteen secret values
in its argv, its run's ``env`` and runwatch's own environment, all printed again to its log in
other shapes, plus escape sequences) is launched, restarted, made to fail, dies by itself under
``runwatch watch`` (alerts to a real apprise ``json://`` receiver), is launched again, watched in
the real dashboard under Pilot and killed, all through the real CLI. Then every file under the
state dir and the run's ``.runwatch/``, every output, the dashboard's screen and log, the
watcher's output and every alert payload are searched: no secret value occurs anywhere, and no
escape sequence arrives raw. None of the values is key-shaped: only knowing the value masks it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Log

from supervisor.agent import masking
from supervisor.config import load_config
from supervisor.engine import Engine
from tests.fixtures_actions import pid_alive
from tests.fixtures_alerts import Receiver
from tests.fixtures_tui import show_tab
from tests.waiting import wait_for, wait_until
from tui.app import make_app
from tui.screens.run_detail import RunDetailScreen, process_table

RUNWATCH = [sys.executable, "-m", "supervisor.cli"]
CLIENT = Path(__file__).resolve().parents[1] / "secretive_gen.py"

SECRETS = {
    "api_key_env": "apikeyenv-VAL-1111",  # the endpoint's api_key_env, in runwatch's environment
    "header": "hdr-xapikey-2222",  # --header "x-api-key: V"
    "bearer": "bearer-tok-3333",  # -H "Authorization: Bearer V"
    "cookie": "cookie-session-4444",  # --header "Cookie: sid=V"
    "keys1": "multi-key-one-5555",  # --api-keys A,B (each item)
    "keys2": "multi-key-two-6666",
    "json": "json-client-secret-7777",  # --credentials-json '{"client_secret": "V"}'
    "short_k": "short-k-flag-8888",  # -k V
    "url": "url-password-9999",  # --api-base http://user:V@host/v1
    "kv": "kv-password-AAAA",  # --extra "user=a;password=V"
    "run_env": "run-env-token-BBBB",  # the run's env MY_SERVICE_TOKEN
    "hf": "laptop-hf-token-CCCC",  # HF_TOKEN in runwatch's environment
    "openai": "laptop-openai-DDDD",  # OPENAI_API_KEY in runwatch's environment
    "profile": "profile-secret-EEEE",  # --org-token, a secret flag of the client's profile
    "hf_flag": "hf-token-flag-FFFF",  # --hf-token V
    "set": "set-api-key-GGGG",  # restart --set api-key=V
    "misspelt": "misspelt-key-HHHH",  # restart --set api-ky=V (did you mean --api-key)
}
NOTE = "\x1b[31mNOTE-IN-ARGV[bold]not-markup[/bold]"


def _toml(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def _write_config(root: Path, workdir: Path, alert_url: str) -> Path:
    s = SECRETS
    argv = [
        sys.executable, "secretive_gen.py", "--datasets", "B1", "--output-dir", "out",
        "--api-base", f"http://user:{s['url']}@127.0.0.1:9/v1",
        "--header", f"x-api-key: {s['header']}", "-H", f"Authorization: Bearer {s['bearer']}",
        "--header", f"Cookie: sid={s['cookie']}", "--api-keys", f"{s['keys1']},{s['keys2']}",
        "--credentials-json", json.dumps({"client_secret": s["json"]}), "-k", s["short_k"],
        "--hf-token", s["hf_flag"], "--org-token", s["profile"],
        "--extra", f"user=a;password={s['kv']}", "--note", NOTE,
    ]  # fmt: skip
    path = root / "runwatch.toml"
    path.write_text(
        f"""
[[hosts]]
name = "local"
local = true

[[endpoints]]
name = "api"
kind = "api"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "RW_SECRET_API_KEY"

[[runs]]
name = "gen"
host = "local"
workdir = {_toml(str(workdir))}
argv = [{", ".join(_toml(a) for a in argv)}]
endpoint = "api"
client = "secretive"
log = "logs/run.log"
env = {{ MY_SERVICE_TOKEN = {_toml(s["run_env"])} }}

[clients.secretive]
scripts = ["secretive_gen.py"]
format = "raw"
secret_flags = ["--org-token"]
[clients.secretive.flags]
datasets = ["--datasets"]
output_dir = ["--output-dir"]

[alerts]
urls = [{_toml(alert_url)}]
"""
    )
    return path


def _client_pids(workdir: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if b"secretive_gen.py" in argv and cwd == str(workdir) and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def _records(workdir: Path) -> int:
    try:
        return len((workdir / "out" / "B1" / "raw_responses.jsonl").read_bytes().splitlines())
    except FileNotFoundError:
        return 0


def _leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


@pytest.fixture
def secret_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """runwatch's environment: its state dir and three secrets (also in this process, for the
    dashboard, which runs here)."""
    values = {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "RW_SECRET_API_KEY": SECRETS["api_key_env"],
        "HF_TOKEN": SECRETS["hf"],
        "OPENAI_API_KEY": SECRETS["openai"],
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return {**os.environ, **values}


async def test_t1_no_secret_form_reaches_any_output_file_screen_or_alert(
    tmp_path: Path, secret_env: dict[str, str], receiver: Receiver
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copyfile(CLIENT, workdir / "secretive_gen.py")
    config = _write_config(tmp_path, workdir, receiver.url())
    cfg = str(config)
    outputs: dict[str, str] = {}

    def rw(name: str, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*RUNWATCH, *args],
            env=secret_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        outputs[name] = done.stdout + done.stderr
        return done

    watch_out = tmp_path / "watch.out"
    with open(watch_out, "wb") as f:
        watcher = subprocess.Popen(
            [*RUNWATCH, "-c", cfg, "watch", "--interval", "0.5"],
            env=secret_env,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        launched = rw("launch", "launch", "gen", "-c", cfg, "--yes", "--json")
        assert launched.returncode == 0, outputs["launch"]
        first = json.loads(launched.stdout)["identity"]["pid"]
        wait_until(lambda: _records(workdir) >= 2, 30, what="records of the first launch")
        for cmd in ("ps", "status"):
            assert rw(cmd + "-json", cmd, "-c", cfg, "--json").returncode == 0, outputs[
                cmd + "-json"
            ]
            assert rw(cmd, cmd, "-c", cfg).returncode == 0, outputs[cmd]
        # The argv's escape sequence is data: escaped in the text listing.
        assert "\\x1b[31mNOTE-IN-ARGV" in outputs["ps"]

        # A restart that sets a secret flag and a misspelled count flag (shown as it is).
        restarted = rw(
            "restart", "restart", "gen", "-c", cfg, "--yes", "--json",
            "--set", "max_token=128", "--set", f"api-key={SECRETS['set']}",
            "--allow-change", "max_token", "--allow-change", "api-key",
        )  # fmt: skip
        assert restarted.returncode == 0, outputs["restart"]
        assert not pid_alive(first)
        assert "128" in json.loads(restarted.stdout)["argv"]
        text = rw("restart-dry", "restart", "gen", "-c", cfg, "--dry-run", "--set", "max_token=128")
        assert "--max_token 128" in text.stdout, outputs["restart-dry"]
        # A misspelled secret flag: refused by the preflight, its value masked all the same.
        rw(
            "misspelt", "restart", "gen", "-c", cfg, "--dry-run", "--set",
            f"api-ky={SECRETS['misspelt']}",
        )  # fmt: skip
        assert "api-ky" in outputs["misspelt"]

        # A restart whose new command fails: the launch failure shows the client's log tail.
        failed = rw(
            "fail", "restart", "gen", "-c", cfg, "--yes", "--set", "mode=fail",
            "--allow-change", "mode", "--allow-change", "api-key",
        )  # fmt: skip
        assert failed.returncode != 0, outputs["fail"]
        assert "giving up" in outputs["fail"]
        assert "\\x1b]0;owned-title\\x07" in outputs["fail"]  # the log's escape, escaped

        # The run dies by itself under the watcher: one alert with its log's last lines.
        wait_until(lambda: _client_pids(workdir), 60, what="the rolled-back run")
        (workdir / "die").write_text("")
        wait_until(lambda: not _client_pids(workdir), 30, what="the client dying")
        wait_until(
            lambda: any("Run stopped" in m for m in receiver.messages()), 60, what="the alert"
        )
        (workdir / "die").unlink()

        again = rw(
            "launch-again", "restart", "gen", "-c", cfg, "--yes", "--allow-change", "api-key"
        )
        assert again.returncode == 0, outputs["launch-again"]
        wait_until(lambda: _client_pids(workdir), 30, what="the relaunched run")

        # The dashboard: the run's detail and its log, escaped and masked.
        engine = Engine(load_config(config))
        app = make_app(engine.config, engine)
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(lambda: app.find_run("local/gen") is not None, 30, what="the run")
            app.open_run("local/gen")
            await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the detail")
            shot = app.export_screenshot()
            shown_run = app.find_run("local/gen")
            assert shown_run is not None
            console = Console(file=io.StringIO(), width=400, color_system=None)
            console.print(process_table(shown_run[1]))
            process_text = console.file.getvalue()  # type: ignore[attr-defined]
            shot += process_text
            await show_tab(pilot, "log")
            view = app.screen.query_one("#log-view", Log)
            await wait_for(
                lambda: any("max_token" in x for x in view.lines), 30, what="the log in the view"
            )
            log_lines = list(view.lines)
            shot += app.export_screenshot()
        outputs["dashboard"] = shot + "\n".join(log_lines)
        assert "\\x1b]0;owned-title\\x07" in "\n".join(log_lines)
        assert not any("\x1b" in x for x in log_lines)
        assert "\\x1b[31mNOTE-IN-ARGV" in process_text  # the argv's escape, shown as text
        assert "NOTE-IN-ARGV[bold]not-markup[/bold]" in process_text  # never markup

        assert rw("kill", "kill", "gen", "-c", cfg, "--yes", "--json").returncode == 0, outputs[
            "kill"
        ]
        wait_until(lambda: not _client_pids(workdir), 30, what="the killed run gone")
        assert rw("audit-json", "audit", "--json").returncode == 0
        assert rw("audit", "audit").returncode == 0
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(60)
        for pid in _client_pids(workdir):
            os.kill(pid, signal.SIGKILL)
    outputs["watch"] = watch_out.read_text()
    outputs["alerts"] = json.dumps(receiver.bodies)

    # The client printed every secret to its own log (its data, not runwatch's): the test is real.
    own_log = (workdir / "logs" / "run.log").read_text()
    assert len(_leaks(own_log)) >= 12, _leaks(own_log)

    leaks = {name: _leaks(text) for name, text in outputs.items() if _leaks(text)}
    assert not leaks, leaks
    for name, output in outputs.items():
        assert "\x1b" not in output or name == "dashboard", f"a raw escape in {name}"
    state = tmp_path / "state"
    private = [*state.rglob("*"), *(workdir / "out").rglob(".runwatch/**/*")]
    files = [p for p in private if p.is_file()]
    assert any(p.name == "audit.jsonl" for p in files)
    assert any(p.parent.name == ".runwatch" for p in files)
    for p in files:
        data = p.read_bytes().decode("utf-8", "replace")
        assert not _leaks(data), (p, _leaks(data))
    assert len(receiver.bodies) >= 1
    assert "max_token=128" in outputs["dashboard"]  # a count, shown


def test_t2_secret_forms_are_registered_by_value_and_names_never_masked() -> None:
    argv = [
        "gen.py", "--header", "x-api-key: hdr-value-0001", "-H", "Cookie: sid=cookie-v-0002",
        "--api-keys", "first-key-0003,second-key-0004", "-k", "short-flag-0005",
        "--credentials-json", '{"client_secret": "json-sec-0006", "project": "public-proj"}',
        "--db", "postgres://me:url-pass-0007@db/x", "--extra", "user=a;password=kv-pass-0008",
        "--set", "max_token=128", "--max-tokens", "512", "--token-budget", "90000",
        "--api-key-env", "OPENAI_API_KEY", "--org-token", "org-tok-0009",
    ]  # fmt: skip
    found = masking.argv_secret_values(argv, ["--org-token"])
    for value in (
        "hdr-value-0001", "sid=cookie-v-0002", "first-key-0003", "second-key-0004",
        "short-flag-0005", "json-sec-0006", "url-pass-0007", "kv-pass-0008", "org-tok-0009",
    ):  # fmt: skip
        assert value in found, value
    assert not {"public-proj", "128", "512", "90000", "OPENAI_API_KEY"} & set(found)
    env = {
        "MY_SERVICE_TOKEN": "svc-token-0010", "DB_PASSWORD": "db-pass-0011",
        "MAX_TOKENS": "100000000", "NUM_TOKENS": "200000000", "TOKENIZERS_PARALLELISM": "false",
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/creds.json", "SHORT_KEY": "abc",
        "TOKEN_BUDGET": "10000000", "GIT_AUTHOR_NAME": "Ada Lovelace", "AUTH_HOST": "localhost",
    }  # fmt: skip
    assert sorted(masking.env_secret_values(env)) == ["db-pass-0011", "svc-token-0010"]
    # A misspelled flag takes the class of its "did you mean" target; names stay whole.
    assert masking.mask_text("--set api-ky=K9 --set max_token=128") == (
        "--set api-ky=*** --set max_token=128"
    )
    assert masking.mask_argv(["gen.py", "--api-kye", "K9", "--max_token", "128"]) == [
        "gen.py", "--api-kye", "***", "--max_token", "128",
    ]  # fmt: skip
    for misspelt in ("--my-api-ky", "--hf-tokn", "--db-pasword", "--client-secrt"):
        assert masking.mask_argv([misspelt, "value"]) == [misspelt, "***"], misspelt
    for count in ("--max-tokens", "--gen-tokens", "--token-buget", "--top-k", "--passes"):
        assert masking.mask_argv([count, "12"]) == [count, "12"], count
    # A misspelling of a profile's secret flag is secret too.
    assert masking.argv_secret_values(["--org-tokn", "org-value-0012"], ["--org-token"]) == [
        "org-value-0012"
    ]


def test_t8_a_value_given_once_is_masked_by_later_processes_from_its_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``restart --set api-key=K`` is the only place K was ever given: the process that knew it
    keeps its salted digest (never K), and a later process masks K in a log line it never saw
    given; words of the same length that are not K stay."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    value = "given-once-" + os.urandom(6).hex()
    code = (
        "import sys\n"
        "from supervisor.secrets import note_overrides, mask_text\n"
        "if sys.argv[1] == 'give':\n"
        "    note_overrides([('api-key', sys.argv[2]), ('max_token', '128')])\n"
        "else:\n"
        "    print(mask_text(sys.argv[2]))\n"
    )

    def child(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
            check=True, env={**os.environ},
        )  # fmt: skip
        return done.stdout

    child("give", value)
    digests = tmp_path / "state" / "runwatch" / "secret-digests"
    assert value not in digests.read_text()
    assert digests.stat().st_mode & 0o777 == 0o600
    other = "x" * len(value)
    shown = child("show", f"client sent {value}, then {other} and max_token=128")
    assert shown == f"client sent ***, then {other} and max_token=128\n"
