"""``runwatch status``: exact counts over SSH and locally, --json, --watch, a host that is down."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from supervisor import display
from supervisor.cli import cli
from supervisor.cli.status import CLEAR, fit_screen, render
from supervisor.model import DatasetView, HostView, Projection, RunView, Snapshot
from tests.fixtures_data import make_raw
from tests.fixtures_procs import FakeRuns, interrupted
from tests.fixtures_sshd import SshdServer, free_port

ARGV = ["python3", "run_inference.py", "--datasets", "B1,B2", "--max-samples", "7000"]


def _q(value: Any) -> str:
    return json.dumps(value)


def write_config(path: Path, hosts: list[dict[str, Any]], runs: list[dict[str, Any]]) -> Path:
    lines = []
    for h in hosts:
        lines.append("[[hosts]]")
        lines.extend(f"{k} = {_q(v)}" for k, v in h.items())
        lines.append("")
    for r in runs:
        lines.append("[[runs]]")
        lines.extend(f"{k} = {_q(v)}" for k, v in r.items())
        lines.append("")
    lines += ["[datasets.B1]", "token_budget = 500", "max_samples = 7000", ""]
    lines += ["[datasets.B2]", "token_budget = 10000000", ""]
    path.write_text("\n".join(lines))
    return path


def ssh_host_table(server: SshdServer, name: str, **kw: Any) -> dict[str, Any]:
    table = {
        "name": name,
        "address": server.host,
        "port": server.port,
        "user": server.user,
        "known_hosts": str(server.known_hosts),
        "identity_files": [str(server.client_key)],
        "python": sys.executable,
        "ssh_config": str(server.dir / "empty_ssh_config"),
        "connect_timeout": 5.0,
    }
    table.update(kw)
    return table


def _run_block(text: str, run: str) -> list[str]:
    """The lines of one run in ``status`` text: its header and the indented lines under it."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {run}  "))
    block = [lines[start]]
    for ln in lines[start + 1 :]:
        if not ln.startswith("    "):
            break
        block.append(ln)
    return block


@pytest.fixture
def dataset_dir(tmp_path: Path) -> tuple[Path, Any]:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 64, seed=11, dup_every=9)
    return work, truth


@pytest.mark.ssh
def test_status_json_over_ssh_gives_exact_counts(
    sshd: SshdServer, tmp_path: Path, dataset_dir: tuple[Path, Any], fake_runs: FakeRuns
) -> None:
    work, truth = dataset_dir
    fake_runs.start(*ARGV[2:], cwd=work)
    cfg = write_config(
        tmp_path / "rw.toml",
        [ssh_host_table(sshd, "gpu")],
        [{"name": "gen", "host": "gpu", "workdir": str(work), "argv": ARGV}],
    )
    result = CliRunner().invoke(cli, ["status", "-c", str(cfg), "--json"])
    assert result.exit_code == 0, result.output
    snap = msgspec.json.decode(result.stdout.encode(), type=Snapshot)
    (host,) = snap.hosts
    assert host.connected and host.error is None
    (run,) = [r for r in host.runs if r.configured]  # other runs may exist on this machine
    assert run.state == "running" and run.process is not None
    b1, b2 = run.datasets
    assert (b1.records, b1.unique_ids, b1.duplicates) == (
        truth.records,
        len(truth.ids),
        truth.duplicates,
    )
    assert b1.completion_tokens == truth.completion_tokens
    assert b1.prompt_tokens == truth.prompt_tokens
    assert b1.finish_reasons == dict(truth.finish_reasons)
    assert b1.over_budget and b1.token_budget == 500
    assert b2.state == "missing"


@pytest.mark.ssh
def test_status_text_over_ssh(
    sshd: SshdServer, tmp_path: Path, dataset_dir: tuple[Path, Any]
) -> None:
    work, truth = dataset_dir
    cfg = write_config(
        tmp_path / "rw.toml",
        [ssh_host_table(sshd, "gpu")],
        [{"name": "gen", "host": "gpu", "workdir": str(work), "argv": ARGV}],
    )
    result = CliRunner().invoke(cli, ["status", "-c", str(cfg)])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith("gpu  connected  rtt ")
    assert "  gen  stopped" in text
    block = _run_block(text, "gen")  # other runs of this machine may write a B1 too
    (b1_line,) = [ln for ln in block if ln.strip().startswith("B1 ")]
    assert f"{len(truth.ids)}/7,000" in b1_line
    assert display.compact(truth.completion_tokens) in b1_line
    b1_note = block[block.index(b1_line) + 1]
    assert b1_note.startswith(f"      ! [OVER BUDGET, {truth.duplicates} dup] ")
    (b2_line,) = [ln for ln in block if ln.strip().startswith("B2 ")]
    assert "not started" in b2_line


@pytest.mark.ssh
def test_status_with_a_host_down_exits_1_and_shows_the_rest(
    sshd: SshdServer, tmp_path: Path, dataset_dir: tuple[Path, Any]
) -> None:
    work, truth = dataset_dir
    port = free_port()
    cfg = write_config(
        tmp_path / "rw.toml",
        [ssh_host_table(sshd, "gpu"), ssh_host_table(sshd, "gone", port=port)],
        [
            {"name": "gen", "host": "gpu", "workdir": str(work), "argv": ARGV},
            {"name": "other", "host": "gone", "workdir": str(work), "argv": ARGV},
        ],
    )
    result = CliRunner().invoke(cli, ["status", "-c", str(cfg)])
    assert result.exit_code == 1
    assert "gpu  connected" in result.stdout
    assert f"gone  DISCONNECTED\n  error: gone: connection refused by 127.0.0.1:{port}" in (
        result.stdout
    )
    assert display.compact(truth.completion_tokens) in result.stdout


def test_status_watch_redraws_until_ctrl_c(tmp_path: Path, dataset_dir: tuple[Path, Any]) -> None:
    work, truth = dataset_dir
    cfg = write_config(
        tmp_path / "rw.toml",
        [{"name": "here", "local": True}],
        [{"name": "gen", "host": "here", "workdir": str(work), "argv": ARGV}],
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "status", "-c", str(cfg), "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
    )
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while seen.count(CLEAR.encode()) < 3 and time.monotonic() < deadline:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
        assert seen.count(CLEAR.encode()) >= 3, seen.decode(errors="replace")
    finally:
        _, err = interrupted(proc)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err
    frame = seen.decode().split(CLEAR)[-2]
    assert frame.startswith("here  connected")
    assert display.compact(truth.completion_tokens) in frame


def test_render_shows_projection_and_stale_host() -> None:
    ds = DatasetView(
        name="B2",
        path="/d/out/B2/raw_responses.jsonl",
        records=2912,
        unique_ids=2912,
        completion_tokens=10_700_000,
        token_budget=10_000_000,
        max_samples=7000,
        over_budget=True,
        verdict="current",
        projection=Projection(
            eta_s=25_200.0, message="10.7 M / 10 M, +14 M projected over 7 h - no --token-budget"
        ),
    )
    now = 1_000_000.0
    snap = Snapshot(
        time=now,
        hosts=[
            HostView(
                name="gpu-box",
                connected=False,
                stale=True,
                error="gpu-box: connection lost during refresh: Keepalive timeout",
                last_ok=now - 42,
                runs=[RunView(name="eagle3-kimi", host="gpu-box", state="unknown", datasets=[ds])],
            )
        ],
    )
    text = render(snap)
    assert "gpu-box  DISCONNECTED  (stale: last ok 42 s ago)" in text
    assert "error: gpu-box: connection lost during refresh: Keepalive timeout" in text
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("B2 ")]
    assert "2,912/7,000" in line and "10.7 M" in line and "107%" in line
    assert " 7 h  current" in line
    assert "! [OVER BUDGET] 10.7 M / 10 M, +14 M projected over 7 h - no --token-budget" in text


def _view(name: str, **kw: Any) -> DatasetView:
    return DatasetView(name=name, path=f"/d/out/{name}/raw_responses.jsonl", **kw)


def test_render_fits_80_columns_and_says_only_what_the_columns_do_not() -> None:
    from supervisor.model import Rates

    rates = Rates(
        req_per_s_1m=0.5,
        tok_per_s_1m=2315.6,
        req_per_s_all=0.5,
        tok_per_s_all=2315.6,
        req_per_s=0.5,
        tok_per_s=2315.6,
    )
    datasets = [
        # finished: the note would only repeat the columns
        _view(
            "B1",
            records=400,
            unique_ids=400,
            completion_tokens=239_677,
            token_budget=300_000,
            max_samples=400,
            verdict="current",
            projection=Projection(eta_s=0.0, message="239.7 k / 300 k"),
            rates=rates,
        ),
        _view(
            "B2",
            records=2912,
            unique_ids=2912,
            completion_tokens=10_700_000,
            token_budget=10_000_000,
            max_samples=7000,
            verdict="current",
            over_budget=True,
            projection=Projection(eta_s=85_000.0, message="10.7 M / 10 M, +14 M projected"),
            rates=rates,
        ),
        _view(
            "B4",
            state="missing",
            error="no such file",
            verdict="missing",
            verdict_detail="no such file",
            token_budget=100_000,
            max_samples=400,
        ),
    ]
    from supervisor.model import Identity, ProcessInfo

    proc = ProcessInfo(
        identity=Identity(boot_id="b", pid=4242, start_time=1, uid=0, argv=("run_inference.py",)),
        user="u",
        uptime_s=694.0,
        cpu_percent=1.0,
        rss_mb=39.4,
        state="S",
    )
    snap = Snapshot(
        time=0.0,
        hosts=[
            HostView(
                name="h",
                connected=True,
                runs=[
                    RunView(name="r", host="h", state="running", process=proc, datasets=datasets)
                ],
            )
        ],
    )
    text = render(snap)
    # The warning comes before what a narrow terminal cuts off.
    assert "  r  running  no --token-budget  pid 4242  up 12 min" in text
    assert max(len(ln) for ln in text.splitlines()) <= 80
    lines = text.splitlines()
    (b1,) = [ln for ln in lines if ln.strip().startswith("B1 ")]
    assert "240 k" in b1 and b1.split()[-2] == "done"
    assert "! 240 k / 300 k" not in text  # nothing the columns do not say
    (b2,) = [ln for ln in lines if ln.strip().startswith("B2 ")]
    assert "2,316" in b2 and "0.50" in b2 and " 1 d  current" in b2  # 23 h 36 min, to the hour
    assert "! [OVER BUDGET] 10.7 M / 10 M, +14 M projected" in text
    (b4,) = [ln for ln in lines if ln.strip().startswith("B4 ")]
    assert b4.endswith("not started")
    assert "no such file" not in text  # a dataset not reached yet is not an error
    assert "rates and ETA need" not in text


def test_one_shot_render_says_how_to_get_rates() -> None:
    ds = _view("B1", records=3, unique_ids=3, completion_tokens=30, verdict="current")
    snap = Snapshot(
        time=0.0,
        hosts=[
            HostView(
                name="h",
                connected=True,
                runs=[RunView(name="r", host="h", state="running", datasets=[ds])],
            )
        ],
    )
    assert "rates and ETA need a second refresh: runwatch status --watch 2" in render(snap)
    assert "rates and ETA need" not in render(snap, rates_hint=False)
    snap.hosts[0].runs[0].state = "stopped"  # nothing moves: no rate to wait for
    assert "rates and ETA need" not in render(snap)


def test_watch_frames_are_cut_to_the_terminal() -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    cut = fit_screen(text, 24).splitlines()
    assert len(cut) == 23 and cut[0] == "line 0" and cut[21] == "line 21"
    assert cut[-1] == "... 78 more lines: enlarge the terminal, or --json"
    assert fit_screen("a\nb\n", 24) == "a\nb\n"
    assert fit_screen("x" * 100 + "\nshort\n", 24, 80) == "x" * 79 + "…\nshort\n"


def test_no_config_anywhere_says_where_it_looked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RUNWATCH_CONFIG"}
    p = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "status"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).parents[2])},
        timeout=60,
    )
    assert p.returncode == 2
    assert p.stderr.startswith(
        "runwatch: no config: no -c PATH, $RUNWATCH_CONFIG is not set, and there is no "
        f"runwatch.toml or configs/runwatch.toml in {tmp_path}\n"
    )
    assert "runwatch demo" in p.stderr and "Traceback" not in p.stderr


def test_a_process_not_in_the_config_gets_no_config_budget(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    """``[datasets.B2]`` budgets the configured run's B2: a stranger's process writing a dataset
    of that name elsewhere is not held to it (only to its own ``--token-budget``)."""
    from tests.fixtures_actions import runwatch

    dirs = {}
    for name in ("ours", "stranger", "capped"):
        (tmp_path / name / "out" / "B2").mkdir(parents=True)
        dirs[name] = tmp_path / name
        truth = make_raw(tmp_path / name / "out" / "B2" / "raw_responses.jsonl", 20, seed=4)
    assert truth.completion_tokens > 300
    config = tmp_path / "rw.toml"
    config.write_text(
        '[[hosts]]\nname = "here"\nlocal = true\n\n'
        f'[[runs]]\nname = "ours"\nhost = "here"\nworkdir = {_q(str(dirs["ours"]))}\n'
        'argv = ["python3", "run_inference.py", "--datasets", "B2", "--output-dir", "out"]\n\n'
        "[datasets.B2]\ntoken_budget = 300\n"
    )
    stranger = fake_runs.start("--datasets", "B2", "--output-dir", "out", cwd=dirs["stranger"])
    capped = fake_runs.start(
        "--datasets", "B2", "--output-dir", "out", "--token-budget", "200", cwd=dirs["capped"]
    )
    out = runwatch("status", "-c", str(config), "--json")
    assert out.returncode == 0, out.stderr
    (host,) = json.loads(out.stdout)["hosts"]
    runs = {r["name"]: r for r in host["runs"]}
    (ours,) = runs["ours"]["datasets"]
    assert ours["token_budget"] == 300 and ours["over_budget"] is True
    (theirs,) = runs[f"run_inference.py (pid {stranger.pid})"]["datasets"]
    assert theirs["name"] == "B2" and theirs["completion_tokens"] == truth.completion_tokens
    assert theirs["token_budget"] is None and theirs["over_budget"] is False
    # A process's own --token-budget is its budget, configured or not.
    (own,) = runs[f"run_inference.py (pid {capped.pid})"]["datasets"]
    assert own["token_budget"] == 200 and own["over_budget"] is True
    text = runwatch("status", "-c", str(config))
    assert text.returncode == 0, text.stderr
    block = _run_block(text.stdout, f"run_inference.py (pid {stranger.pid})")
    assert "(not in config)" in block[0]
    (row,) = [ln for ln in block if ln.lstrip().startswith("B2 ")]
    assert row.split()[3] == "-", row  # the budget column: none
    assert "OVER BUDGET" not in "\n".join(block), block
    assert "OVER BUDGET" in "\n".join(_run_block(text.stdout, "ours"))


def test_a_stopped_run_names_its_torn_last_line_and_a_running_one_does_not(
    tmp_path: Path, fake_runs: FakeRuns
) -> None:
    """A partial last line with no writer alive is a torn record: status says so per dataset,
    with its bytes and what the next launch or restart does; while the run runs it is the
    record being written and nothing is said."""
    from tests.fixtures_actions import runwatch
    from tests.fixtures_data import raw_record

    work = tmp_path / "work"
    for ds in ("B1", "B2"):
        (work / "out" / ds).mkdir(parents=True)
        make_raw(work / "out" / ds / "raw_responses.jsonl", 5, seed=3)
    torn = work / "out" / "B2" / "raw_responses.jsonl"
    tail = json.dumps(raw_record(random.Random(1), "s9"))[:37].encode()
    with torn.open("ab") as f:
        f.write(tail)
    before = torn.read_bytes()
    config = write_config(
        tmp_path / "rw.toml",
        [{"name": "here", "local": True}],
        [
            {
                "name": "gen",
                "host": "here",
                "workdir": str(work),
                "argv": [*ARGV, "--output-dir", "out"],
            }
        ],
    )
    out = runwatch("status", "-c", str(config), "--json")
    assert out.returncode == 0, out.stderr
    (run,) = [r for r in json.loads(out.stdout)["hosts"][0]["runs"] if r["name"] == "gen"]
    assert run["state"] == "stopped"
    b1, b2 = run["datasets"]
    assert b1["partial_tail_bytes"] == 0 and b1["torn_tail"] is None
    assert b2["partial_tail_bytes"] == len(tail)
    assert b2["torn_tail"] == (
        f"torn last line: {len(tail)} bytes, no final newline (the run stopped mid-record); "
        "the next launch or restart cuts it off, keeping a byte-identical copy in "
        "raw_responses.jsonl.broken"
    )
    text = runwatch("status", "-c", str(config))
    block = _run_block(text.stdout, "gen")
    notes = [ln for ln in block if "torn last line" in ln]
    assert notes == [f"      ! {b2['torn_tail']}"], block
    # The note follows the B2 row (it is about that dataset).
    (b2_row,) = [i for i, ln in enumerate(block) if ln.lstrip().startswith("B2 ")]
    assert block[b2_row + 1] == notes[0]
    assert torn.read_bytes() == before  # status reads, never repairs
    # The same file under a live writer: the partial line is the record being written.
    proc = fake_runs.start(*ARGV[2:], "--output-dir", "out", cwd=work)
    out = runwatch("status", "-c", str(config), "--json")
    (run,) = [r for r in json.loads(out.stdout)["hosts"][0]["runs"] if r["name"] == "gen"]
    assert run["state"] == "running" and run["process"]["identity"]["pid"] == proc.pid
    assert run["datasets"][1]["partial_tail_bytes"] == len(tail)
    assert run["datasets"][1]["torn_tail"] is None
    text = runwatch("status", "-c", str(config))
    assert "torn" not in text.stdout, text.stdout
