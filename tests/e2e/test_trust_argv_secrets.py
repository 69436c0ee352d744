"""Issue 21 again, the argv side: secrets a command line carries in forms the walk missed
(T26-T31), launched, listed, shown and killed through the real CLI, agent and dashboard.

A command line inside one argument (a flag's value, ``--server-args='--api-key K'``, four nested
``bash -c``), a value that starts with ``-``, values attached to one-letter flags (``-pK``,
``-uuser:K``) and ``NAME=K`` as a flag's value, Python dict literals, and credential variables
whose value starts with ``/`` or is a number: none is in ``launch --dry-run``, ``ps``,
``status --json``, ``restart --dry-run``, ``audit``, the dashboard's process table, the host's
unit records, the launch spec, locks and launch records (every file under the state dir and the
run's ``.runwatch/``). What is no secret (``-k 5``, ``--sort-key x``, another script's ``-p``,
the rest of a command line, JSON) is shown as written.

Every form a client's argparse reads is launched through runwatch (``tests/readable_gen.py``,
whose parser the argument reading reads exactly). ``--api-key -K`` is one no argparse reads as a
value, and the canonical form refuses it (and ``-pK``): its launch is refused at preflight, masked,
and the test starts that command line itself for runwatch to list, show and kill.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
from pathlib import Path

from tests.e2e.test_trust_secret_variants import (
    CLIENT,
    PY,
    Site,
    _assert_nowhere,
    _leaks,
    _process_text,
    _refused_at_preflight,
    site,
)
from tests.fixtures_actions import pid_alive
from tests.waiting import wait_until

__all__ = ["site"]  # the fixture, used by name

READABLE = Path(__file__).resolve().parents[1] / "readable_gen.py"

K = {
    "extra": "extra-args-key-2601",  # --extra-args "--api-key K --x 1"
    "server": "server-args-key-2602",  # --server-args='--api-key K'
    "assign": "assign-in-item-2603",  # --post "OPENAI_API_KEY=K python x.py"
    "nested": "four-levels-key-2604",  # bash -c in bash -c in bash -c in bash -c
    "dash": "-dashFirst2701xyz",  # --api-key -K
    "short_attached": "p-attached-2801",  # -pK (a profile's one-letter secret flag)
    "user": "curl-user-pass-2802",  # -uuser:K
    "env_eq": "env-eq-token-2803",  # --env=HF_TOKEN=K
    "env_e": "env-e-token-2804",  # -e HF_TOKEN=K
    "dict_bearer": "dict-bearer-2901",  # --headers "{'Authorization': 'Bearer K'}"
    "dict_key": "dict-api-key-2902",  # --extra-body "{'api_key': 'K'}"
    "short_line": "Sh0rtL",  # --extra-args "--db-pw Sh0rtL": short, masked where it stands
    "short_json": "jk9Q",  # --json-headers '{"X-Api-Key": "jk9Q"}': short, masked in the string
}


def _nested(command: str, levels: int = 4) -> str:
    for _ in range(levels):
        command = "bash -c " + shlex.quote(command)
    return command


def _argv(script: str = "leaky_gen.py", out: str = "out") -> list[str]:
    k = K
    return [
        PY, script, "--datasets", "B1", "--output-dir", out,
        "--extra-args", f"--api-key {k['extra']} --x 1 --db-pw {k['short_line']}",
        f"--server-args='--api-key {k['server']}'",
        "--post", f"OPENAI_API_KEY={k['assign']} python x.py --y 2",
        "--hook", _nested(f"python g.py --api-key {k['nested']} --top-k 5"),
        "--api-key", k["dash"], "--model", "m1",
        f"-p{k['short_attached']}", f"-uuser:{k['user']}",
        f"--env=HF_TOKEN={k['env_eq']}", "-e", f"HF_TOKEN={k['env_e']}",
        "--headers", f"{{'Authorization': 'Bearer {k['dict_bearer']}'}}",
        "--extra-body", f"{{'api_key': '{k['dict_key']}', 'n': 2}}",
        "--json-headers", f'{{"X-Api-Key": "{k["short_json"]}", "Accept": "json"}}',
    ]  # fmt: skip


def _readable_argv() -> list[str]:
    """Every form but ``--api-key -K``, for ``readable_gen.py``: its argparse reads them all
    (``-pK`` and ``-uuser:K`` as ``-p K`` and ``-u user:K``), but refuses a value that starts
    with ``-`` ("expected one argument")."""
    argv = _argv("readable_gen.py")
    i = argv.index("--api-key")
    assert argv[i + 1] == K["dash"]
    return argv[:i] + argv[i + 2 :]


PUBLIC = [
    "-k", "5", "--sort-key", "x", "--dataset-key", "prompt", "--input-key", "text",
    "--output-key", "out", "--pass-at-k", "3", "--cookie-jar", "c.txt", "-p", "8080",
    "--hook", "OPENAI_API_KEY=abc python run.py --x 1",
]  # fmt: skip
"""A run of another script (its profile declares no ``-p``): shown as written but ``abc``."""


def _add_profiles(site: Site) -> None:
    """Two more profiles: ``plain`` (script ``plain_gen.py``, no secret flags; ``-k`` and ``-p``
    named, for the canonical form its parser is read by) and ``readable`` (``readable_gen.py``,
    whose parser the argument reading reads exactly; ``-p`` secret)."""
    shutil.copyfile(CLIENT, site.workdir / "plain_gen.py")
    shutil.copyfile(READABLE, site.workdir / "readable_gen.py")
    text = site.config.read_text()
    text += (
        '\n[clients.plain]\nscripts = ["plain_gen.py"]\nformat = "raw"\n'
        'path_defaults = { "--output-dir" = "out" }\n'
        'known_flags = ["--datasets", "--output-dir", "-k", "-p"]\n'
        '[clients.plain.flags]\ndatasets = ["--datasets"]\noutput_dir = ["--output-dir"]\n'
        '\n[clients.readable]\nscripts = ["readable_gen.py"]\nformat = "raw"\n'
        'path_defaults = { "--output-dir" = "out" }\nsecret_flags = ["-p", "--license"]\n'
        '[clients.readable.flags]\ndatasets = ["--datasets"]\noutput_dir = ["--output-dir"]\n'
    )
    site.config.write_text(text)


def _pids(site: Site, script: bytes) -> list[int]:
    """The live clients running ``script`` in the site's workdir."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if script in argv and cwd == str(site.workdir) and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def _shown_argv(ps_json: str, run: str) -> list[str]:
    return next(
        p["argv"]
        for h in json.loads(ps_json)["hosts"]
        for p in h["processes"]
        if p.get("run") == run
    )


def _assert_forms_masked(shown: list[str]) -> None:
    """The rest of each command line stays readable; JSON stays JSON, masked inside its
    string."""
    assert "--api-key *** --x 1 --db-pw ***" in shown, shown
    assert "OPENAI_API_KEY=*** python x.py --y 2" in shown
    assert any("python g.py --api-key *** --top-k 5" in a for a in shown), shown
    assert "-p***" in shown and "-uuser:***" in shown and "--env=HF_TOKEN=***" in shown, shown
    assert shown[shown.index("-e") + 1] == "HF_TOKEN=***", shown
    assert "--server-args='--api-key ***'" in shown, shown
    assert json.loads(shown[shown.index("--json-headers") + 1]) == {
        "X-Api-Key": "***",
        "Accept": "json",
    }
    assert "{'Authorization': 'Bearer ***'}" in shown
    assert "{'api_key': '***', 'n': 2}" in shown, shown


def _assert_dash_masked(shown: list[str]) -> None:
    """``--api-key -K``: the value that starts with ``-`` is masked, what follows stays."""
    assert shown[shown.index("--api-key") + 1 : shown.index("--api-key") + 4] == [
        "***", "--model", "m1",
    ], shown  # fmt: skip


async def test_t26_to_t29_argv_secret_forms_reach_no_output_and_public_ones_stay(
    site: Site,
) -> None:
    """``forms`` (``readable_gen.py``, every form its argparse reads) is launched through
    runwatch; ``ext`` (``leaky_gen.py``, every form, ``--api-key -K`` too) is a command line the
    argument reading cannot read as its client does, so its launch is refused (masked) and the
    test starts it itself; runwatch lists, shows, refuses to restart and kills both."""
    plain_argv = [PY, "plain_gen.py", "--datasets", "B1", "--output-dir", "out3", *PUBLIC]
    ext_argv = _argv("leaky_gen.py", "out4")
    site.write(
        [
            {"name": "forms", "argv": _readable_argv(), "client": "readable"},
            {"name": "ext", "argv": ext_argv, "log": "logs/ext.log"},
            {"name": "plain", "argv": plain_argv, "client": "plain", "log": "logs/plain.log"},
        ],
        secret_flags=["-p", "--license"],
    )
    _add_profiles(site)
    cfg = str(site.config)
    site.rw("dry", "launch", "forms", "-c", cfg, "--dry-run")
    _refused_at_preflight(site, "ext")
    refused = json.loads(site.outputs["launch-ext-json"])["argv"]
    assert "-p***: a short option with its value attached" in site.outputs["launch-ext"]
    for run in ("forms", "plain"):
        launched = site.rw(f"launch-{run}", "launch", run, "-c", cfg, "--yes", "--json")
        assert json.loads(launched.stdout)["ok"], site.outputs[f"launch-{run}"]
    ext = site.start(ext_argv, "logs/ext.log")
    try:
        await _through_every_output(site, cfg)
        wait_until(lambda: ext.poll() is not None, 30, what="the ext run killed by runwatch")
    finally:
        for pid in _pids(site, b"plain_gen.py") + _pids(site, b"readable_gen.py"):
            os.kill(pid, signal.SIGKILL)
    forms = _shown_argv(site.outputs["ps-json"], "forms")
    shown_ext = _shown_argv(site.outputs["ps-json"], "ext")
    plain = _shown_argv(site.outputs["ps-json"], "plain")
    _assert_nowhere(site, K, site.outputs.pop("screen"))
    for shown in (forms, shown_ext, refused):
        _assert_forms_masked(shown)
    for shown in (shown_ext, refused):
        _assert_dash_masked(shown)
    assert forms[forms.index("--hook") + 2 : forms.index("--hook") + 4] == ["--model", "m1"]
    # Another script's -p, and the public names, are shown as written; only abc is masked.
    assert plain[6:] == [*PUBLIC[:-1], "OPENAI_API_KEY=*** python run.py --x 1"], plain
    assert "-p 8080" in site.outputs["ps"] and "--sort-key x" in site.outputs["ps"]
    # The clients did get every value: the test is real.
    own = (site.workdir / "out" / ".runwatch" / "run.log").read_text()
    assert set(_leaks(own, K)) == set(K) - {"dash"}, set(K) - set(_leaks(own, K))
    own_ext = (site.workdir / "logs" / "ext.log").read_text()
    assert not set(K) - set(_leaks(own_ext, K)), set(K) - set(_leaks(own_ext, K))


async def _through_every_output(site: Site, cfg: str) -> None:
    """List, show and kill the three runs; every output is kept in ``site.outputs`` (the
    dashboard's as ``screen``)."""
    wait_until(lambda: _pids(site, b"readable_gen.py"), 30, what="the forms client")
    wait_until(site.client_pids, 30, what="the ext client")
    wait_until(lambda: _pids(site, b"plain_gen.py"), 30, what="the plain client")
    site.rw("ps-json", "ps", "-c", cfg, "--json")
    site.rw("ps", "ps", "-c", cfg)
    site.rw("status-json", "status", "-c", cfg, "--json")
    site.rw("restart-dry", "restart", "forms", "-c", cfg, "--dry-run")
    site.rw("restart-dry-ext", "restart", "ext", "-c", cfg, "--dry-run", ok=False)
    assert "[FAILED] preflight" in site.outputs["restart-dry-ext"], site.outputs["restart-dry-ext"]
    screen = await _process_text(site.config, "forms", "ext", "plain")
    for run in ("forms", "ext", "plain"):
        site.rw(f"kill-{run}", "kill", run, "-c", cfg, "--yes", "--json")
    site.rw("audit", "audit", "-c", cfg)
    site.rw("audit-json", "audit", "-c", cfg, "--json")
    site.outputs["screen"] = screen


def test_t30_credential_values_that_start_with_a_slash_or_are_numbers_are_masked(
    site: Site,
) -> None:
    """A run's env ``HF_TOKEN=/...`` (a key that starts with ``/``) and ``DB_PASSWORD`` of digits:
    registered; the client prints them and fails, and the launch-failure tail, ``--json``, the
    audit log and every kept file hold neither (nor their encodings)."""
    values = {"slash": "/AbCdEf+gh/Ij12KlM3001", "digits": "2025010198730"}
    # --output-dir given: leaky_gen.py's parser cannot be read exactly, so the argument reading
    # cannot know the default it would use without it.
    argv = [PY, "leaky_gen.py", "--datasets", "B1", "--output-dir", "out", "--mode", "fail"]
    site.write(
        [
            {
                "name": "envs",
                "argv": argv,
                "env": {
                    "HF_TOKEN": values["slash"],
                    "DB_PASSWORD": values["digits"],
                    "TOKEN_BUDGET": "10000000",
                    "LEAK_VARS": "HF_TOKEN,DB_PASSWORD,TOKEN_BUDGET",
                },
            }
        ]
    )
    cfg = str(site.config)
    failed = site.rw("launch", "launch", "envs", "-c", cfg, "--yes", ok=False)
    assert failed.returncode != 0 and "giving up" in site.outputs["launch"], site.outputs
    site.rw("launch-json", "launch", "envs", "-c", cfg, "--yes", "--json", ok=False)
    site.rw("audit", "audit", "-c", cfg, "--json")
    shown = site.outputs["launch"]
    assert "HF_TOKEN raw ***" in shown and "DB_PASSWORD raw ***" in shown, shown
    assert "TOKEN_BUDGET raw 10000000" in shown  # a count stays
    own = (site.workdir / "out" / ".runwatch" / "run.log").read_text()
    assert not set(values) - set(_leaks(own, values))
    _assert_nowhere(site, values)


def test_t26_the_nested_helper_builds_four_levels() -> None:
    """The ``--hook`` value above is four ``bash -c`` levels around the client's command."""
    line = _nested("python g.py", 4)
    depth = 0
    words: list[str] = ["bash", "-c", line]
    while words[:2] == ["bash", "-c"]:
        words = shlex.split(words[2])
        depth += 1
    assert depth == 5 and words == ["python", "g.py"], (depth, words)
