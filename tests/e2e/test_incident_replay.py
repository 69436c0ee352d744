"""The founding incident replayed end to end (issue 36; row A19 of ``docs/reliability.md``):
budget, new script, then the API, each in one command that works, over a real sshd, the demo's
mock servers and the real CLI and watcher.

The incident, scaled down so that it runs in about a minute (time by ~1/40, tokens by ~1/35):

============================  ==============================  ===============================
                              the incident                    here
============================  ==============================  ===============================
answers                       ~3,500 tokens (B1 shorter)      100 tokens (B1's 40)
budget per dataset            10 M tokens                     20,000 tokens
B1                            done, under its budget          240 of 240 samples, 9,600 tokens
B2                            2,916 responses, 107 %          214 responses, 21,400 (107 %)
B3, B4                        not started                     not started
local GPUs                    0.2 req/s x 3,500 = 700 tok/s   100 tok/s (1 req/s), $15 / h
API                           30.3 k tok/s, $0.60 / $1.42     1,000 tok/s, $0.60 / $1.42 per M
the API's share               33 min                          ~40 s
`compare` after the switch    5 min (15 % of the API's time)  6 s
============================  ==============================  ===============================

The host's script is the old one, without ``--token-budget``; the newer one is on the laptop.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.rebalance import RESTART_S
from tests.e2e.test_watch_cli import start
from tests.e2e.test_watch_reload import edit, events, run_block
from tests.fixtures_actions import (
    API_KEY,
    KEY_ENV,
    RUN_INFERENCE,
    DemoRun,
    bench_endpoint,
    host_toml,
    old_script,
    pid_alive,
    pids_by_run,
    raw_record,
    rebalance_applied,
    runwatch,
    status_json,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.ssh, pytest.mark.usefixtures("state_home")]

DATASETS = ("B1", "B2", "B3", "B4")
TOKENS = 100
BUDGET = 20_000
SAMPLES = 240
LOCAL_TPS = 100.0
API_TPS = 1000.0
PRICE_IN, PRICE_OUT = 0.60, 1.42
AFTER_SWITCH_S = 6.0
"""The incident's five minutes after the switch, scaled (15 % of the API's share)."""


def _prewritten(demo: DemoRun) -> dict[str, bytes]:
    """B1 done with short answers, B2 past its budget (107 %): the bytes of each file."""
    shapes = {"B1": (SAMPLES, 40), "B2": (214, TOKENS)}
    written = {}
    for ds, (count, tokens) in shapes.items():
        path = demo.data_file(ds)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(raw_record(f"{ds}-{i:06d}", tokens) for i in range(count)))
        written[ds] = path.read_bytes()
    return written


def _api_run(demo: DemoRun, api_url: str) -> str:
    """What the operator added for the switch: the API run (B3 and B4 with the budget flag,
    on the newer script) and the API's endpoint with its prices."""
    block = run_block(demo, "api-run").replace('endpoint = "mock"', 'endpoint = "api"')
    block = block.replace('"logs/run.log"', '"logs/api.log"')
    block = block.replace(
        json.dumps(demo.argv[demo.argv.index("--api-base") + 1]), json.dumps(api_url)
    )
    block = block.replace('"B1,B2,B3,B4"', '"B3,B4"').replace(
        '"--concurrency", "4"', '"--concurrency", "8"'
    )
    block = block.replace('"--report-seconds"', f'"--token-budget", "{BUDGET}", "--report-seconds"')
    return (
        block
        + f'\n[[endpoints]]\nname = "api"\nkind = "api"\nbase_url = "{api_url}"\n'
        + f'api_key_env = "{KEY_ENV}"\nprice_in_per_m = {PRICE_IN}\nprice_out_per_m = {PRICE_OUT}\n'
    )


def _over_budget_command(out: Path) -> list[str]:
    found = [e for e in events(out, "over-budget") if e.get("dataset") == "B2"]
    return shlex.split(found[0]["command"]) if found else []


@pytest.mark.serial  # its time is compared with the plan's: alone, the pace it measured holds
def test_a19_the_incident_replayed_budget_new_script_then_the_api(
    tmp_path: Path,
    mock_server: Any,
    ssh_host_cfg: Any,
    kill_after: list[int],
    spawn: Callable[..., Any],
) -> None:
    local = mock_server(
        capacity_tps=LOCAL_TPS, mean_tokens=TOKENS, length_sigma=0.2, seed=1, api_key=API_KEY
    )
    api = mock_server(
        capacity_tps=API_TPS, mean_tokens=TOKENS, length_sigma=0.2, seed=2, api_key=API_KEY,
        price_in=PRICE_IN, price_out=PRICE_OUT,
    )  # fmt: skip
    demo = DemoRun(
        tmp_path,
        local.url,
        datasets=DATASETS,
        max_samples=SAMPLES,
        prompts=SAMPLES,
        concurrency=4,
        budgets=dict.fromkeys(DATASETS, BUDGET),
        host_toml=host_toml(ssh_host_cfg),
        host_name=ssh_host_cfg.name,
        endpoint_toml='kind = "local"\ngpu_cost_per_hour = 15.0',
    )
    old = old_script(demo).encode()
    script = demo.workdir / "run_inference.py"
    cfg = demo.config_path
    before = _prewritten(demo)
    # As the incident's run was started: without a budget flag, over a budget already passed.
    launched = runwatch("-c", str(cfg), "launch", "demo", "--force", "--yes", "--json")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    pid = int(json.loads(launched.stdout)["identity"]["pid"])
    kill_after.append(pid)
    out = tmp_path / "watch.out"
    watcher = start(spawn, cfg, out, "--json")

    # 1. The over-budget alert's command, run as given, on the old script: refused before the
    # stop, naming the fix; the run keeps its pid, its data as it was.
    command = wait_until(lambda: _over_budget_command(out), 90, what="the over-budget alert")
    assert command[0] == "runwatch" and command[-2:] == ["--set", f"token-budget={BUDGET}"]
    refused = runwatch(*command[1:], "--yes")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, text
    assert "[FAILED] preflight" in text and "nothing was stopped" in text, text
    assert "run the same command again with --script PATH" in text, text
    assert pid_alive(pid) and script.read_bytes() == old
    assert demo.data_file("B1").read_bytes() == before["B1"]
    assert demo.data_file("B2").read_bytes()[: len(before["B2"])] == before["B2"]

    # 2. The same command with --script: the new script installed, the budget set.
    fixed = runwatch(*command[1:], "--script", str(RUN_INFERENCE), "--yes", "--json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    restarted = int(json.loads(fixed.stdout)["identity"]["pid"])
    kill_after.append(restarted)
    assert not pid_alive(pid) and script.read_bytes() == RUN_INFERENCE.read_bytes()
    argv = psutil.Process(restarted).cmdline()
    assert argv[argv.index("--token-budget") + 1] == str(BUDGET), argv
    assert demo.data_file("B1").read_bytes() == before["B1"]
    wait_until(lambda: len(demo.complete_ids("B3")) >= 4, 60, what="the local run on B3")

    # 3. The switch: the API run added to the config (the watcher takes it), the API measured.
    edit(cfg, cfg.read_text() + "\n" + _api_run(demo, api.url))
    wait_until(lambda: events(out, "config-reloaded"), 60, what="the watcher's reload")
    assert "run api-run added" in events(out, "config-reloaded")[0]["message"]
    bench_endpoint(cfg, "api", str(demo.workdir / "prompts" / "B3.jsonl"), requests=48)

    # 4. rebalance --by 1h --apply: the API run launched and running, the local run stopped.
    code, applied = rebalance_applied(cfg, "--by", "1h")
    assert code == 0 and applied.get("ok") is True, applied
    switched = time.time()
    result = applied["plan"]
    steps = {(st["run"], st["action"]) for st in result["steps"]}
    assert steps == {("demo", "stop"), ("api-run", "launch")}, result["steps"]
    pids = pids_by_run(cfg)
    assert pids["demo"] is None and pids["api-run"] is not None, pids
    kill_after.append(int(pids["api-run"]))
    assert not pid_alive(restarted)

    # 5. compare, five minutes (scaled) after the switch: the API's live rate within its error
    # bar (two standard errors) of the rate the API really keeps from then on.
    wait_until(lambda: time.time() >= switched + AFTER_SWITCH_S, 30, what="the scaled 5 min")
    p = runwatch("-c", str(cfg), "compare", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    rates = {e["endpoint"]: e for e in json.loads(p.stdout)["rates"]}
    measured, err = rates["api"]["out_tok_per_s"], rates["api"]["out_tok_per_s_err"]
    assert measured is not None and err, rates["api"]
    t0, tokens0 = time.monotonic(), api.stats()["completion_tokens"]
    wait_until(lambda: time.monotonic() >= t0 + 10.0, 30, what="ten seconds of the API")
    true = (api.stats()["completion_tokens"] - tokens0) / (time.monotonic() - t0)
    print(f"\ncompare: api {measured:.0f} ± {err:.0f} tok/s, true {true:.0f} tok/s")
    assert abs(measured - true) <= 2 * err, (measured, err, true, rates["api"]["source"])

    # The API run finishes its share; the watcher started before the switch says all done.
    wait_until(lambda: events(out, "all-done"), 180, what="the watcher's all-done")
    final = status_json(cfg)
    assert pids_by_run(cfg)["demo"] is None
    ends = {ds: demo.data_file(ds).stat().st_mtime for ds in DATASETS}
    for ds in ("B3", "B4"):
        ids = demo.complete_ids(ds)
        assert len(ids) == len(set(ids)), ds
    stepped = {o["run"]: o["at"] for o in applied["steps"] if o["ok"]}
    took = max(
        max(ends[d] for d in sh["datasets"]) - stepped.get(sh["run"], switched) + RESTART_S
        for sh in result["plan"]["shares"]
        if sh["datasets"] and sh["run"] == "api-run"
    )
    projected = result["plan"]["seconds"]
    print(f"rebalance: took {took:.1f} s, projected {projected:.1f} s")
    assert took == pytest.approx(projected, rel=0.10), (took, result["plan"], final["plan"])
    watcher.terminate()
    assert watcher.wait(30) == 0
