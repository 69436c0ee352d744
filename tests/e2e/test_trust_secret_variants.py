"""Issue 21, part 1 again: variants of secret forms, each masked as a class (T20-T25).

Real runs of a client that echoes its command line and prints its secrets encoded
(``tests/leaky_gen.py``) are launched, listed, failed and killed through the real CLI (a separate
process, text and ``--json``), on the local host through the real agent, and watched in the real
dashboard under Pilot; then every output, the audit log, the host's unit records and every file
runwatch keeps under the state dir and the run's ``.runwatch/`` are searched for each value.
The run's own log (``<out>/.runwatch/run.log`` by default) is the client's output: it holds
what the client printed, and is only shown masked.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from rich.console import Console
from textual.widgets import Log

from supervisor.agent import masking
from supervisor.config import load_config
from supervisor.engine import Engine
from tests.fixtures_actions import pid_alive
from tests.fixtures_tui import show_tab
from tests.waiting import wait_for, wait_until
from tui.app import make_app
from tui.screens.run_detail import RunDetailScreen, process_table

RUNWATCH = [sys.executable, "-m", "supervisor.cli"]
CLIENT = Path(__file__).resolve().parents[1] / "leaky_gen.py"
PY = sys.executable


def _toml(value: object) -> str:
    return json.dumps(value)  # JSON strings, lists and numbers are TOML too


@dataclass
class Site:
    """A config with one local host and the ``leaky`` client, its workdir and runwatch's
    environment; every command's output is kept by name."""

    root: Path
    workdir: Path
    env: dict[str, str]
    outputs: dict[str, str] = field(default_factory=dict)
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """Processes the test started itself (not through runwatch's launch)."""

    @property
    def config(self) -> Path:
        return self.root / "runwatch.toml"

    def write(
        self,
        runs: list[dict[str, object]],
        secret_flags: list[str] | None = None,
        known_flags: list[str] | None = None,
    ) -> None:
        text = '[[hosts]]\nname = "local"\nlocal = true\n'
        for given in runs:
            run: dict[str, object] = {
                "host": "local",
                "workdir": str(self.workdir),
                "client": "leaky",
            }
            run.update(given)
            run.setdefault("datasets", ["B1"])
            text += "\n[[runs]]\n"
            for key, value in run.items():
                if value is None:
                    continue
                if isinstance(value, dict):
                    items = ", ".join(f"{k} = {_toml(v)}" for k, v in value.items())
                    text += f"{key} = {{ {items} }}\n"
                else:
                    text += f"{key} = {_toml(value)}\n"
        text += (
            '\n[clients.leaky]\nscripts = ["leaky_gen.py"]\nformat = "raw"\n'
            'path_defaults = { "--output-dir" = "out" }\n'
        )
        if secret_flags is not None:
            text += f"secret_flags = {_toml(secret_flags)}\n"
        if known_flags is not None:
            text += f"known_flags = {_toml(known_flags)}\n"
        text += '[clients.leaky.flags]\ndatasets = ["--datasets"]\noutput_dir = ["--output-dir"]\n'
        self.config.write_text(text)
        self.config.chmod(0o600)

    def rw(self, name: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*RUNWATCH, *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        self.outputs[name] = done.stdout + done.stderr
        if ok:
            assert done.returncode == 0, self.outputs[name]
        return done

    def start(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the workdir, detached (a session of its own), its output to ``log``
        (relative to the workdir), outside runwatch: for a command line the argument reading
        refuses to launch, which runwatch must still list, show and kill masked. The fixture
        stops it at the end."""
        path = self.workdir / log
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as out:
            proc = subprocess.Popen(
                argv, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.started.append(proc)
        return proc

    def kept_files(self) -> dict[str, str]:
        """Every file runwatch keeps (state dir, host unit records, the run's ``.runwatch/``),
        but the run's own log: the client's output."""
        paths = [*(self.root / "state").rglob("*"), *self.workdir.rglob(".runwatch/**/*")]
        return {
            str(p): p.read_bytes().decode("utf-8", "replace")
            for p in paths
            if p.is_file() and p.name != "run.log"
        }

    def client_pids(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if b"leaky_gen.py" in argv and cwd == str(self.workdir) and pid_alive(int(entry)):
                found.append(int(entry))
        return found


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copyfile(CLIENT, workdir / "leaky_gen.py")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    s = Site(tmp_path, workdir, {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    yield s
    for pid in s.client_pids():
        os.kill(pid, signal.SIGKILL)
    for proc in s.started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _leaks(text: str, values: dict[str, str]) -> list[str]:
    return [name for name, value in values.items() if value in text]


def _assert_nowhere(site: Site, values: dict[str, str], screen: str = "") -> None:
    leaks = {name: _leaks(text, values) for name, text in site.outputs.items()}
    leaks = {name: found for name, found in leaks.items() if found}
    assert not leaks, leaks
    assert not _leaks(screen, values), _leaks(screen, values)
    files = site.kept_files()
    assert any("/units/" in p for p in files), "no unit record on the host"
    assert any(p.endswith("audit.jsonl") for p in files)
    for path, data in files.items():
        assert not _leaks(data, values), (path, _leaks(data, values))


async def _process_text(config: Path, *runs: str) -> str:
    """The dashboard's screen and its process table of each of ``runs`` (the command line it
    shows)."""
    engine = Engine(load_config(config))
    app = make_app(engine.config, engine)
    shot = ""
    async with app.run_test(size=(200, 50)) as pilot:
        for run in runs:
            key = f"local/{run}"
            await wait_for(
                lambda key=key: (
                    (found := app.find_run(key)) is not None  # type: ignore[misc]
                    and found[1].process is not None
                ),
                30,
                what=f"the process of {run}",
            )
            app.open_run(key)
            await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the detail")
            shown = app.find_run(key)
            assert shown is not None
            console = Console(file=io.StringIO(), width=600, color_system=None)
            console.print(process_table(shown[1]))
            shot += app.export_screenshot() + console.file.getvalue()  # type: ignore[attr-defined]
            await pilot.press("escape")
            await wait_for(lambda: not isinstance(app.screen, RunDetailScreen), what="back")
    return shot


# ---------------------------------------------------------------- T20: headers and shell strings

SPLIT = {
    "bearer": "split-bearer-2001",  # -H Authorization "Bearer V"
    "xkey": "split-xkey-2002",  # --header X-Api-Key V
    "cookie": "split-cookie-2003",  # --header=Cookie "sid=V"
    "sh_key": "shell-apikey-2004",  # bash -c "... --api-key V"
    "sh_bearer": "shell-bearer-2005",  # bash -c "... -H Authorization 'Bearer V'"
    "sh_env": "shell-envtok-2006",  # bash -c "exec env SERVICE_TOKEN=V ..."
    "sh_hdr": "shell-xauth-2007",  # bash -c "... --header 'X-Auth-Token: V'"
    "short": "Sh0rt9",  # bash -c "... --db-pw Sh0rt9": short, masked where it stands
}
SPLIT_FLAGS = ["--datasets", "--output-dir", "-H", "--header"]
"""The leaky profile's known flags in T20: ``-H`` is one the argument reading can place."""


async def test_t20_credential_headers_in_two_items_and_shell_command_lines_are_masked(
    site: Site,
) -> None:
    s = SPLIT
    inner = (
        f"exec env SERVICE_TOKEN={s['sh_env']} {shlex.quote(PY)} leaky_gen.py --datasets B1 "
        f"--output-dir out2 --api-key {s['sh_key']} -H Authorization 'Bearer {s['sh_bearer']}' "
        f"--header 'X-Auth-Token: {s['sh_hdr']}' --db-pw {s['short']} --max-tokens 64"
    )
    split_argv = [
        PY, "leaky_gen.py", "--datasets", "B1", "--output-dir", "out",
        "-H", "Authorization", f"Bearer {s['bearer']}", "--header", "X-Api-Key", s["xkey"],
        "--header=Cookie", f"sid={s['cookie']}", "-H", "Accept", "application/json",
    ]  # fmt: skip
    shell_argv = ["bash", "-c", inner]
    site.write(
        [
            {"name": "split", "argv": split_argv},
            {
                "name": "shell",
                "argv": shell_argv,
                "log": "logs/shell.log",
                "client": None,  # a shell: its data files are the run's, not read from argv
                "output_dir": "out2",
            },
        ],
        # leaky_gen.py's parser cannot be read exactly (it reads sys.argv itself): the argument
        # reading takes the canonical form, where a short option is one the profile names.
        known_flags=SPLIT_FLAGS,
    )
    cfg = str(site.config)
    # A shell's command line cannot be read: runwatch refuses to launch it, and says so masked.
    _refused_at_preflight(site, "shell")
    shown = json.loads(site.outputs["launch-shell-json"])["argv"]
    assert shown[:2] == ["bash", "-c"] and shown[2].startswith("exec env SERVICE_TOKEN=*** ")
    assert "-H Authorization 'Bearer ***' --header 'X-Auth-Token: ***'" in shown[2], shown
    assert "--db-pw *** --max-tokens 64" in site.outputs["launch-shell"]
    launched = site.rw("launch-split", "launch", "split", "-c", cfg, "--yes", "--json")
    assert json.loads(launched.stdout)["ok"], site.outputs["launch-split"]
    # So the shell is started as its user would, outside runwatch, which lists, shows, refuses
    # to restart and kills it.
    shell = site.start(shell_argv, "logs/shell.log")
    wait_until(lambda: len(site.client_pids()) == 2, 30, what="both clients")
    site.rw("ps-json", "ps", "-c", cfg, "--json")
    site.rw("ps", "ps", "-c", cfg)
    site.rw("status-json", "status", "-c", cfg, "--json")
    assert _shown_run(site.outputs["ps-json"], "shell")[-2:] == ["--max-tokens", "64"]
    site.rw("dry", "restart", "shell", "-c", cfg, "--dry-run", ok=False)
    assert "[FAILED] preflight" in site.outputs["dry"], site.outputs["dry"]
    screen = await _process_text(site.config, "split", "shell")
    for run in ("split", "shell"):
        site.rw(f"kill-{run}", "kill", run, "-c", cfg, "--yes", "--json")
    wait_until(lambda: shell.poll() is not None, 30, what="the shell run killed by runwatch")
    site.rw("audit", "audit", "-c", cfg)
    site.rw("audit-json", "audit", "-c", cfg, "--json")

    # What is not secret stays: the other header, the count, the shell's words.
    assert "Accept" in site.outputs["ps"] and "application/json" in site.outputs["ps"]
    assert "--max-tokens 64" in site.outputs["dry"], site.outputs["dry"]
    assert "Authorization" in screen and "X-Api-Key" in screen
    _assert_nowhere(site, s, screen)
    assert "--db-pw ***" in site.outputs["dry"]
    # The client did get every value (its own log is its output): the test is real.
    own = (site.workdir / "out" / ".runwatch" / "run.log").read_text()
    own += (site.workdir / "logs" / "shell.log").read_text()
    assert not {"bearer", "xkey", "sh_key", "sh_bearer", "short"} - set(_leaks(own, s))


def _refused_at_preflight(site: Site, run: str) -> None:
    """``launch RUN`` (text and ``--json``) is refused at preflight by the argument reading:
    nothing is launched; the outputs are kept as ``launch-RUN`` and ``launch-RUN-json``."""
    cfg = str(site.config)
    text = site.rw(f"launch-{run}", "launch", run, "-c", cfg, "--yes", ok=False)
    assert text.returncode != 0, site.outputs[f"launch-{run}"]
    assert "[FAILED] preflight: the client would not read" in text.stdout, text.stdout
    assert "nothing was stopped or launched" in text.stdout
    done = site.rw(f"launch-{run}-json", "launch", run, "-c", cfg, "--yes", "--json", ok=False)
    reply = json.loads(done.stdout)
    assert not reply["ok"] and reply["identity"] is None, reply
    assert reply["steps"][0]["name"] == "preflight" and reply["steps"][0]["ok"] is False, reply
    assert not site.client_pids()


def _shown_run(ps_json: str, run: str) -> list[str]:
    """The argv ``ps --json`` shows for the process of ``run``."""
    found = [
        p["argv"]
        for h in json.loads(ps_json)["hosts"]
        for p in h["processes"]
        if p.get("run") == run
    ]
    assert len(found) == 1, (run, ps_json)
    return list(found[0])


def test_t20_the_header_and_shell_rules_on_their_own() -> None:
    argv = [
        "curl", "-H", "Authorization", "Bearer split-only-0001", "--header", "x-goog-api-key",
        "goog-key-0002", "-HX-Api-Key: attached-0003", "--header=Proxy-Authorization",
        "Basic prx-0004xyz", "-H", "Accept", "text/plain-0005",
    ]  # fmt: skip
    found = masking.argv_secret_values(argv)
    for value in ("split-only-0001", "goog-key-0002", "attached-0003", "prx-0004xyz"):
        assert value in found, value
    assert "text/plain-0005" not in found
    masked = masking.mask_argv(argv)
    assert masked[3] == "Bearer ***" and masked[6] == "***" and masked[9] == "Basic ***"
    assert masked[-2:] == ["Accept", "text/plain-0005"]
    shell = ["sh", "-c", "env DB_PASS=p4 python gen.py --hf-token t0k; curl -H Cookie 'a b'"]
    assert masking.mask_argv(shell)[2] == (
        "env DB_PASS=*** python gen.py --hf-token ***; curl -H Cookie '***'"
    )
    # A short credential header value where it stands, a name with its colon then the value,
    # a user:password pair; python's own -u is no user.
    short = [
        "curl", "-H", "x-api-key: k1", "--header", "X-Api-Key:", "k2", "-u", "me:p3",
        "--user=me:p4", "-H", "Accept: json", "python", "-u", "gen.py",
    ]  # fmt: skip
    assert masking.mask_argv(short) == [
        "curl", "-H", "x-api-key: ***", "--header", "X-Api-Key:", "***", "-u", "me:***",
        "--user=me:***", "-H", "Accept: json", "python", "-u", "gen.py",
    ]  # fmt: skip
    assert masking.argv_secret_values(["curl", "-u", "me:user-pass-0007"]) == ["user-pass-0007"]
    # A header flag of another name, and a header given as an argument of its own (httpie).
    other = ["http", "--verbose", "X-Api-Key: own-item-0008", "--add-header", "Cookie: s=k5"]
    assert masking.mask_argv(other) == [
        "http",
        "--verbose",
        "X-Api-Key: ***",
        "--add-header",
        "Cookie: ***",
    ]
    assert "own-item-0008" in masking.argv_secret_values(other)
    nested = ["bash", "-c", "sh -c \"python gen.py --api-key 'nested-key-0006' --top-k 5\""]
    assert masking.argv_secret_values(nested) == ["nested-key-0006"]
    assert "--top-k 5" in masking.mask_argv(nested)[2]


# ---------------------------------------------------------------- T21: credential words in names

WORDS = {
    "pwd": "pwd-value-2101",
    "db_pw": "db-pw-value-2102",
    "auth_header": "auth-header-2103",
    "db_password": "db-password-2104",
    "passphrase": "passphrase-2105",
    "client_secret": "client-secret-2106",
    "hf_token": "hf-token-2107",
    "session": "session-cookie-2108",
    "camel": "camel-api-key-2109",
    "env_pass": "env-db-pass-2110",
}
SECRET_NAMES = (
    "--pwd", "--db-pw", "--auth-header", "--db-password", "--passphrase", "--client-secret",
    "--hf-token", "--session", "--sessionToken", "--smtp-pass", "--jwt", "--x-auth",
    "--proxy-passwd", "--vault-creds", "--signing-secret-key", "--login-cookie",
    "--use-auth-token", "--new-password", "--oauth", "--api_key_2", "-password",
)  # fmt: skip
PUBLIC_NAMES = (
    "--max-tokens", "--token-budget", "--num-tokens", "--keep-session", "--api-key-env",
    "--password-file", "--session-dir", "--tokenizer", "--top-k", "--passes", "--gen-tokens",
    "--tokens-per-step", "--sessions", "--auth-type", "--no-auth", "--author", "--keys",
    "--token-limit", "--session-ttl", "--tp", "--eos-token", "--speculative-token-map",
    "--stop-token-ids", "--allow-credentials", "--ssl-keyfile", "--bypass",
)  # fmt: skip


async def test_t21_a_credential_word_anywhere_in_a_flag_name_makes_it_secret(site: Site) -> None:
    w = WORDS
    argv = [
        PY, "leaky_gen.py", "--datasets", "B1", "--output-dir", "out",
        "--pwd", w["pwd"], "--db-pw", w["db_pw"], "--auth-header", w["auth_header"],
        f"--db_password={w['db_password']}", "--passphrase", w["passphrase"],
        "--client-secret", w["client_secret"], "--hf-token", w["hf_token"],
        "--session", w["session"], "--apiKey", w["camel"], "--max-tokens", "640",
        "--token-budget", "90000", "--num-tokens", "77", "--keep-session", "--top-k", "5",
    ]  # fmt: skip
    site.write(
        [
            {
                "name": "words",
                "argv": argv,
                "env": {"DB_PASS": w["env_pass"]},
            }
        ]
    )
    cfg = str(site.config)
    site.rw("launch", "launch", "words", "-c", cfg, "--yes", "--json")
    wait_until(site.client_pids, 30, what="the client")
    ps = site.rw("ps-json", "ps", "-c", cfg, "--json")
    site.rw("ps", "ps", "-c", cfg)
    screen = await _process_text(site.config, "words")
    site.rw("kill", "kill", "words", "-c", cfg, "--yes", "--json")
    site.rw("audit", "audit", "-c", cfg, "--json")

    shown = next(
        p["argv"]
        for h in json.loads(ps.stdout)["hosts"]
        for p in h["processes"]
        if p.get("run") == "words"
    )
    for public, value in (("--max-tokens", "640"), ("--token-budget", "90000")):
        assert shown[shown.index(public) + 1] == value
    assert shown[shown.index("--num-tokens") + 1] == "77"
    assert "--keep-session" in shown and shown[shown.index("--top-k") + 1] == "5"
    assert shown[shown.index("--pwd") + 1] == "***"
    assert "--keep-session --top-k 5" in screen
    _assert_nowhere(site, w, screen)
    # The rule itself, for the names not launched.
    for name in SECRET_NAMES:
        assert masking.mask_argv([name, "v"]) == [name, "***"], name
    for name in PUBLIC_NAMES:
        assert masking.mask_argv([name, "12"]) == [name, "12"], name
    env = {
        "DB_PASS": "db-pass-value-2111", "MYSQL_PWD": "mysql-pwd-2112", "PWD": "/root/work",
        "SSH_PASSPHRASE": "ssh-phrase-2113", "NUM_PASSES": "1000000000",
        "SESSION_MANAGER": "local/box:@/tmp/.ICE-unix/1", "XDG_SESSION_CLASS": "user-session",
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus",
    }  # fmt: skip
    assert sorted(masking.env_secret_values(env)) == [
        "db-pass-value-2111", "mysql-pwd-2112", "ssh-phrase-2113",
    ]  # fmt: skip


# ---------------------------------------------------------------- T22: encodings of a secret


def _encodings(value: str) -> dict[str, str]:
    raw = value.encode()
    std = base64.b64encode(raw).decode()
    safe = base64.urlsafe_b64encode(raw).decode()
    return {
        "value": value,
        "b64": std.rstrip("="),
        "urlsafe": safe.rstrip("="),
        "pair": base64.b64encode(b"svc-usr:" + raw).decode()[12:-4],
        "pct": quote(value, safe=""),
        "pct_slash": quote(value),
        "every": "".join(f"%{b:02x}" for b in raw),
    }


ENV_SECRET = "env/tok+SECRET?2201"


def test_t22_every_encoding_of_a_secret_is_masked_wherever_text_is_shown(site: Site) -> None:
    """The client prints its token base64-encoded (standard, urlsafe, padded or not, inside
    ``user:TOKEN``), percent-encoded, in a URL's fragment and query; the launch fails and shows
    its log tail: none of the forms, in the text or ``--json`` output, the audit log or any file
    runwatch keeps."""
    forms = _encodings(ENV_SECRET)
    site.write(
        [
            {
                "name": "enc",
                "argv": [PY, "leaky_gen.py", "--datasets", "B1", "--output-dir", "out"],
                "env": {"SERVICE_TOKEN": ENV_SECRET, "LEAK_VARS": "SERVICE_TOKEN"},
            }
        ]
    )
    cfg = str(site.config)
    site.rw("launch", "launch", "enc", "-c", cfg, "--yes", "--json")
    wait_until(site.client_pids, 30, what="the client")
    failed = site.rw(
        "fail", "restart", "enc", "-c", cfg, "--yes", "--set", "mode=fail",
        "--allow-change", "mode", ok=False,
    )  # fmt: skip
    assert failed.returncode != 0
    assert "giving up" in site.outputs["fail"] and "leaky client ready" in site.outputs["fail"]
    assert "access_token=***" in site.outputs["fail"], site.outputs["fail"]
    assert "redirect http://127.0.0.1:9/cb#" in site.outputs["fail"]
    wait_until(site.client_pids, 60, what="the rolled-back run")
    site.rw("audit", "audit", "-c", cfg, "--json")
    site.rw("kill", "kill", "enc", "-c", cfg, "--yes")
    own = (site.workdir / "out" / ".runwatch" / "run.log").read_text()
    assert not set(forms) - {"value"} - set(_leaks(own, forms)), _leaks(own, forms)
    _assert_nowhere(site, forms)


def test_t22_the_encoded_forms_are_masked_inside_longer_text() -> None:
    value = "reg-encoded-" + os.urandom(5).hex()
    masking.register([value])
    raw = value.encode()
    for prefix in (b"", b"u:", b"ab:", b"abc:"):
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            blob = enc(prefix + raw + b"!").decode()
            for shown in (blob, blob.rstrip("=")):
                text = f"creds {shown} end"
                assert masking.mask_registered(text) == "creds *** end", (prefix, shown)
                assert json.loads(masking.mask_json_text(json.dumps({"v": text})))["v"] == (
                    "creds *** end"
                )
    for shown in (quote(value + "/x", safe=""), quote_plus(value), raw.hex(), raw.hex().upper()):
        assert value not in masking.mask_registered(shown) and "***" in (
            masking.mask_registered(shown)
        )
    assert masking.mask_text("go http://h/cb#access_token=abc123&state=ok") == (
        "go http://h/cb#access_token=***&state=ok"
    )
    assert masking.value_secrets("http://h/cb#id_token=frag-token-2203") == ["frag-token-2203"]
    assert masking.mask_text("see https://h/x?page=2#section-3") == (
        "see https://h/x?page=2#section-3"
    )


# ---------------------------------------------------------------- T23: a profile's secret flags

PROFILE = {
    "license": "license-seat-2301",  # --license V: a name that says nothing of a secret
    "seed": "tenant-seed-2302",  # --tenant-seed=V
    "misspelt": "licence-typo-2303",  # --licence V: a misspelling of a profile's secret flag
    "short": "Qz7w",  # --seat Qz7w: short, masked where it stands
}
PROFILE_FLAGS = ["--license", "--tenant-seed", "--seat"]


def _profile_argv() -> list[str]:
    p = PROFILE
    return [
        PY, "leaky_gen.py", "--datasets", "B1", "--output-dir", "out", "--license", p["license"],
        f"--tenant-seed={p['seed']}", "--licence", p["misspelt"], "--seat", p["short"],
    ]  # fmt: skip


def test_t23_a_profiles_secret_flags_are_masked_in_the_hosts_unit_records(site: Site) -> None:
    """The host is told the profile's secret flags: its unit record, locks and fingerprints
    (written on the host, read back by later listings) hold ``***``, short values too."""
    site.write([{"name": "prof", "argv": _profile_argv()}], secret_flags=PROFILE_FLAGS)
    cfg = str(site.config)
    site.rw("launch", "launch", "prof", "-c", cfg, "--yes", "--json")
    wait_until(site.client_pids, 30, what="the client")
    ps = site.rw("ps-json", "ps", "-c", cfg, "--json")
    site.rw("status", "status", "-c", cfg, "--json")
    units = [p for p in (site.root / "state").rglob("units/*.json")]
    assert units, "no unit record"
    record = json.loads(units[0].read_text())
    assert record["argv"][-2:] == ["--seat", "***"], record["argv"]
    assert "--tenant-seed=***" in record["argv"]
    shown = next(
        p["argv"]
        for h in json.loads(ps.stdout)["hosts"]
        for p in h["processes"]
        if p.get("run") == "prof"
    )
    assert shown[-2:] == ["--seat", "***"]
    site.rw("kill", "kill", "prof", "-c", cfg, "--yes", "--json")
    site.rw("audit", "audit", "-c", cfg, "--json")
    _assert_nowhere(site, PROFILE)


# ---------------------------------------------------------------- T24: old audit records


def test_t24_old_audit_records_are_masked_when_shown_with_what_is_known_now(site: Site) -> None:
    """Records written before a secret was declared (the profile's ``secret_flags`` added later)
    and a record of an older runwatch whose rules missed a form (``--db-pw``, ``password=`` in
    a detail) are masked when shown: ``audit``, ``--json``, ``--all``, by the config's secrets
    and today's rules; the file itself is never rewritten."""
    site.write([{"name": "prof", "argv": _profile_argv()}])  # no secret_flags yet
    cfg = str(site.config)
    site.rw("launch", "launch", "prof", "-c", cfg, "--yes", "--json")
    wait_until(site.client_pids, 30, what="the client")
    site.rw("kill", "kill", "prof", "-c", cfg, "--yes", "--json")
    log = site.root / "state" / "runwatch" / "audit.jsonl"
    written = log.read_text()
    assert PROFILE["license"] in written  # not known as a secret when it was written
    older = "older-pw-2401"
    key = json.loads(written.splitlines()[0])["config"]
    record = {
        "time": 1.0, "config": key, "action": "launch", "host": "local", "run": "prof",
        "ok": False, "argv": ["gen.py", "--db-pw", older, "--pwd", "Yx5k"],
        "steps": [{"name": "launch", "ok": False, "detail": f"client said password={older}"}],
    }  # fmt: skip
    with open(log, "a") as f:
        f.write(json.dumps(record) + "\n")
    before = log.read_bytes()

    site.write([{"name": "prof", "argv": _profile_argv()}], secret_flags=PROFILE_FLAGS)
    site.outputs.clear()
    site.rw("audit", "audit", "-c", cfg, "--limit", "0")
    site.rw("audit-json", "audit", "-c", cfg, "--json", "--limit", "0")
    site.rw("audit-all", "audit", "-c", cfg, "--all", "--limit", "0")
    site.rw("audit-all-json", "audit", "-c", cfg, "--all", "--json", "--limit", "0")
    records = json.loads(site.outputs["audit-all-json"])
    assert len(records) >= 3
    old = next(r for r in records if r["time"] == 1.0)
    assert old["argv"] == ["gen.py", "--db-pw", "***", "--pwd", "***"]
    assert "FAILED - launch: client said password=***" in site.outputs["audit-all"]
    for r in records:
        if r.get("argv") and "--seat" in r["argv"]:
            assert r["argv"][r["argv"].index("--seat") + 1] == "***"
    leaks = {
        name: _leaks(text, {**PROFILE, "older": older, "older_short": "Yx5k"})
        for name, text in site.outputs.items()
    }
    assert not any(leaks.values()), leaks
    assert log.read_bytes() == before  # shown masked, never rewritten


# ---------------------------------------------------------------- T25: the default launch log


async def test_t25_the_default_launch_log_is_the_clients_output_and_shown_masked(
    site: Site,
) -> None:
    """With no ``log =``, the client's output goes to ``<out>/.runwatch/run.log`` on the host:
    what the client prints (its argv with the profile's secrets, a token's encodings) is there as
    it printed it; the dashboard's Log tab shows it masked."""
    token = "log-env-token-2501"
    site.write(
        [
            {
                "name": "prof",
                "argv": _profile_argv(),
                "env": {"SERVICE_TOKEN": token, "LEAK_VARS": "SERVICE_TOKEN"},
            }
        ],
        secret_flags=PROFILE_FLAGS,
    )
    cfg = str(site.config)
    site.rw("launch", "launch", "prof", "-c", cfg, "--yes", "--json")
    wait_until(site.client_pids, 30, what="the client")
    engine = Engine(load_config(site.config))
    app = make_app(engine.config, engine)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(lambda: app.find_run("local/prof") is not None, 30, what="the run")
        app.open_run("local/prof")
        await wait_for(lambda: isinstance(app.screen, RunDetailScreen), what="the detail")
        await show_tab(pilot, "log")
        view = app.screen.query_one("#log-view", Log)
        await wait_for(
            lambda: any("leaky client ready" in x for x in view.lines), 30, what="the log"
        )
        lines = "\n".join(view.lines)
        shown = lines + app.export_screenshot()
    site.rw("kill", "kill", "prof", "-c", cfg, "--yes")
    values = {**PROFILE, **_encodings(token)}
    assert "--seat ***" in lines and "access_token=***" in lines, lines
    assert not _leaks(shown, values), _leaks(shown, values)
    own = (site.workdir / "out" / ".runwatch" / "run.log").read_text()
    assert PROFILE["license"] in own and _encodings(token)["b64"] in own  # the client's output
    _assert_nowhere(site, values)


def test_t22_a_value_given_once_is_masked_encoded_by_later_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``restart --set api-key=K`` gave K once; a later process that never saw K masks its
    base64, percent and hex forms in a log line (from the digests kept, T8)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    value = "given-once+" + os.urandom(6).hex()
    code = (
        "import sys\n"
        "from supervisor.secrets import note_overrides, mask_text\n"
        "if sys.argv[1] == 'give':\n"
        "    note_overrides([('api-key', sys.argv[2])])\n"
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
    raw = value.encode()
    forms = {
        "urlsafe": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "pct": quote(value, safe=""),
        "hex": raw.hex(),
    }
    digests = (tmp_path / "state" / "runwatch" / "secret-digests").read_text()
    assert not _leaks(digests, {**forms, "value": value})
    line = " ".join(f"{name} {form}," for name, form in forms.items())
    assert child("show", line) == "urlsafe ***, pct ***, hex ***,\n"


def test_t23_runwatchs_own_options_are_never_taken_for_a_profiles_secret_flag() -> None:
    """A profile declares ``--seat`` secret: ``--set`` (runwatch's own option, one letter from it)
    stays visible in the commands runwatch shows; ``--seat`` and a typo of a long secret flag
    (``--tenant-sed``) are masked."""
    from supervisor.agent.masking import mask_argv, register_secret_flags

    register_secret_flags(["--seat", "--tenant-seed"])
    argv = ["runwatch", "launch", "sf", "--set", "resume", "--seat", "SEAT-VALUE-1234"]
    argv += ["--tenant-sed", "TENANT-VALUE-5678", "--unset", "reasoning"]
    shown = mask_argv(argv)
    assert shown[3:5] == ["--set", "resume"] and shown[-2:] == ["--unset", "reasoning"]
    assert "SEAT-VALUE-1234" not in shown and "TENANT-VALUE-5678" not in shown
