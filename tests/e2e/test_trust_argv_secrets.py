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
    site,
)
from tests.fixtures_actions import pid_alive
from tests.waiting import wait_until

__all__ = ["site"]  # the fixture, used by name

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


def _argv() -> list[str]:
    k = K
    return [
        PY, "leaky_gen.py", "--datasets", "B1", "--output-dir", "out",
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


PUBLIC = [
    "-k", "5", "--sort-key", "x", "--dataset-key", "prompt", "--input-key", "text",
    "--output-key", "out", "--pass-at-k", "3", "--cookie-jar", "c.txt", "-p", "8080",
    "--hook", "OPENAI_API_KEY=abc python run.py --x 1",
]  # fmt: skip
"""A run of another script (its profile declares no ``-p``): shown as written but ``abc``."""


def _add_plain_profile(site: Site) -> None:
    """A second profile, ``plain`` (script ``plain_gen.py``, no secret flags)."""
    shutil.copyfile(CLIENT, site.workdir / "plain_gen.py")
    text = site.config.read_text()
    text += (
        '\n[clients.plain]\nscripts = ["plain_gen.py"]\nformat = "raw"\n'
        'path_defaults = { "--output-dir" = "out" }\n'
        '[clients.plain.flags]\ndatasets = ["--datasets"]\noutput_dir = ["--output-dir"]\n'
    )
    site.config.write_text(text)


def _plain_pids(site: Site) -> list[int]:
    """The ``plain_gen.py`` clients of the site (``Site.client_pids`` counts ``leaky_gen.py``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if b"plain_gen.py" in argv and cwd == str(site.workdir) and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def _shown_argv(ps_json: str, run: str) -> list[str]:
    return next(
        p["argv"]
        for h in json.loads(ps_json)["hosts"]
        for p in h["processes"]
        if p.get("run") == run
    )


async def test_t26_to_t29_argv_secret_forms_reach_no_output_and_public_ones_stay(
    site: Site,
) -> None:
    plain_argv = [PY, "plain_gen.py", "--datasets", "B1", "--output-dir", "out3", *PUBLIC]
    site.write(
        [
            {"name": "forms", "argv": _argv()},
            {"name": "plain", "argv": plain_argv, "client": "plain", "log": "logs/plain.log"},
        ],
        secret_flags=["-p", "--license"],
    )
    _add_plain_profile(site)
    cfg = str(site.config)
    site.rw("dry", "launch", "forms", "-c", cfg, "--dry-run")
    for run in ("forms", "plain"):
        launched = site.rw(f"launch-{run}", "launch", run, "-c", cfg, "--yes", "--json")
        assert json.loads(launched.stdout)["ok"], site.outputs[f"launch-{run}"]
    try:
        await _through_every_output(site, cfg)
    finally:
        for pid in _plain_pids(site):
            os.kill(pid, signal.SIGKILL)
    forms = _shown_argv(site.outputs["ps-json"], "forms")
    plain = _shown_argv(site.outputs["ps-json"], "plain")
    _assert_nowhere(site, K, site.outputs.pop("screen"))
    # The rest of each command line stays readable; JSON stays JSON, masked inside its string.
    assert "--api-key *** --x 1 --db-pw ***" in forms
    assert "OPENAI_API_KEY=*** python x.py --y 2" in forms
    assert any("python g.py --api-key *** --top-k 5" in a for a in forms), forms
    assert forms[forms.index("--api-key") + 1 : forms.index("--api-key") + 4] == [
        "***", "--model", "m1",
    ]  # fmt: skip
    assert "-p***" in forms and "-uuser:***" in forms and "--env=HF_TOKEN=***" in forms
    assert json.loads(forms[forms.index("--json-headers") + 1]) == {
        "X-Api-Key": "***",
        "Accept": "json",
    }
    assert "{'Authorization': 'Bearer ***'}" in forms
    # Another script's -p, and the public names, are shown as written; only abc is masked.
    assert plain[6:] == [*PUBLIC[:-1], "OPENAI_API_KEY=*** python run.py --x 1"], plain
    assert "-p 8080" in site.outputs["ps"] and "--sort-key x" in site.outputs["ps"]
    # The client did get every value: the test is real.
    own = (site.workdir / "out" / ".runwatch" / "run.log").read_text()
    assert not set(K) - set(_leaks(own, K)), set(K) - set(_leaks(own, K))


async def _through_every_output(site: Site, cfg: str) -> None:
    """List, show and kill both runs; every output is kept in ``site.outputs`` (the dashboard's
    as ``screen``)."""
    wait_until(site.client_pids, 30, what="the forms client")
    wait_until(lambda: _plain_pids(site), 30, what="the plain client")
    site.rw("ps-json", "ps", "-c", cfg, "--json")
    site.rw("ps", "ps", "-c", cfg)
    site.rw("status-json", "status", "-c", cfg, "--json")
    site.rw("restart-dry", "restart", "forms", "-c", cfg, "--dry-run")
    screen = await _process_text(site.config, "forms", "plain")
    for run in ("forms", "plain"):
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
    site.write(
        [
            {
                "name": "envs",
                "argv": [PY, "leaky_gen.py", "--datasets", "B1", "--mode", "fail"],
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
