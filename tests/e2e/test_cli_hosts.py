"""``runwatch ps`` and ``runwatch kill`` end to end: the real CLI, agent and processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_actions import runwatch
from tests.fixtures_procs import FakeRun, FakeRuns, alive, gone


def write_config(path: Path, workdir: str) -> Path:
    path.write_text(
        f"""
scripts = ["run_inference.py"]

[[hosts]]
name = "local"
local = true

[[runs]]
name = "eagle3"
host = "local"
workdir = "{workdir}"
argv = ["python3", "run_inference.py", "--datasets", "B1,B2", "--output-dir", "out"]
"""
    )
    return path


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The audit log of these tests goes to a temporary state directory."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def start_run(fake_runs: FakeRuns, *extra: str, **kw: object) -> FakeRun:
    return fake_runs.start("--datasets", "B1,B2", "--output-dir", "out", *extra, **kw)  # type: ignore[arg-type]


def test_ps_json_lists_the_run_matched_to_the_config(fake_runs: FakeRuns, tmp_path: Path) -> None:
    run = start_run(fake_runs, "--api-key", "sk-test-0123456789abcdefghij", children=1)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    out = runwatch("ps", "-c", str(config), "--json")
    assert out.returncode == 0, out.stderr
    assert "sk-test-0123456789abcdefghij" not in out.stdout
    doc = json.loads(out.stdout)
    (host,) = doc["hosts"]
    assert host["name"] == "local" and host["connected"] is True and host["error"] is None
    procs = {p["pid"]: p for p in host["processes"]}
    p = procs[run.pid]
    assert p["run"] == "eagle3"
    assert p["start_time"] == run.start_time
    assert p["uid"] == os.getuid()
    assert p["children"] == run.children
    assert p["flags"]["datasets"] == ["B1", "B2"]
    assert "***" in p["argv"]
    for key in ("user", "gpu_memory_mb", "cpu_percent", "rss_mb", "killable"):
        assert key in p
    text = runwatch("ps", "-c", str(config), "--host", "local")
    assert text.returncode == 0
    assert f"pid {run.pid}" in text.stdout and "eagle3" in text.stdout
    assert "NO --token-budget" in text.stdout


def test_kill_refuses_without_a_terminal_or_yes(fake_runs: FakeRuns, tmp_path: Path) -> None:
    run = start_run(fake_runs)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    out = runwatch("kill", "eagle3", "-c", str(config))
    assert out.returncode == 2
    assert "--yes" in out.stderr
    assert alive(run.pid, run.start_time)


def test_kill_of_an_unknown_run_says_so_before_asking_to_confirm(
    fake_runs: FakeRuns, tmp_path: Path
) -> None:
    """A typo in the run's name is the error, not the missing --yes (which would only lead to
    that error next)."""
    run = start_run(fake_runs)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    out = runwatch("kill", "eagle", "-c", str(config))
    assert out.returncode == 2
    assert "no run named 'eagle'" in out.stderr and "--yes" not in out.stderr, out.stderr
    assert alive(run.pid, run.start_time)


def test_kill_run_by_name_stops_it_and_proves_it(
    fake_runs: FakeRuns, tmp_path: Path, state_home: Path
) -> None:
    run = start_run(fake_runs, ignore_term=True, children=2, child_ignore_term=True)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    out = runwatch("kill", "eagle3", "-c", str(config), "-y", "--grace", "0.2", "--json")
    assert out.returncode == 0, out.stderr
    results = {r["pid"]: r for r in json.loads(out.stdout)["results"]}
    assert set(results) == {run.pid, *run.children}
    assert all(r["outcome"] == "killed" and r["confirmed"] for r in results.values())
    assert gone(run.pid, run.start_time)
    (entry,) = [json.loads(line) for line in (state_home / "runwatch/audit.jsonl").open()]
    assert entry["action"] == "kill" and entry["run"] == "eagle3" and entry["ok"] is True
    assert entry["identity"]["pid"] == run.pid
    # Again: nothing of the run is left to target.
    again = runwatch("kill", "eagle3", "-c", str(config), "--yes")
    assert again.returncode == 1
    assert "not running" in again.stderr


def test_kill_by_pid_refuses_a_decoy_and_other_targets(fake_runs: FakeRuns, tmp_path: Path) -> None:
    run = start_run(fake_runs)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    decoy = fake_runs.decoy(["tail", "-f", "/dev/null", "run_inference.py"])
    out = runwatch("kill", "-c", str(config), "--host", "local", "--pid", str(decoy.pid), "--yes")
    assert out.returncode == 1
    assert "not a run" in out.stderr
    assert decoy.poll() is None
    both = runwatch("kill", "eagle3", "-c", str(config), "--host", "local", "--pid", "1")
    assert both.returncode == 2


def test_kill_by_pid_on_the_only_host_needs_no_host(fake_runs: FakeRuns, tmp_path: Path) -> None:
    """With one host in the config, ``--pid`` alone names the process (``--host`` defaults)."""
    run = start_run(fake_runs)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    out = runwatch("kill", "-c", str(config), "--pid", str(run.pid), "--yes", "--json")
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)["results"]
    assert result["host"] == "local" and result["pid"] == run.pid and result["confirmed"]
    assert gone(run.pid, run.start_time)


def test_kill_by_pid_on_several_hosts_says_which_command_to_run(
    fake_runs: FakeRuns, tmp_path: Path
) -> None:
    """With several hosts, ``--pid`` alone stops nothing and the error lists the hosts and the
    exact command for each; the command given for the right host works as written."""
    from tests.fixtures_sshd import free_port

    run = start_run(fake_runs)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    with config.open("a") as f:
        f.write(f'\n[[hosts]]\nname = "gpu-b"\naddress = "127.0.0.1"\nport = {free_port()}\n')
    out = runwatch("kill", "-c", str(config), "--pid", str(run.pid), "--yes")
    assert out.returncode == 2, out.stderr
    assert "2 hosts (local, gpu-b)" in out.stderr and "--host" in out.stderr, out.stderr
    assert alive(run.pid, run.start_time)
    hinted = f"`runwatch kill -c {config} --host local --pid {run.pid}`"
    assert hinted in out.stderr, out.stderr
    assert f"`runwatch kill -c {config} --host gpu-b --pid {run.pid}`" in out.stderr
    as_json = runwatch("kill", "-c", str(config), "--pid", str(run.pid), "--yes", "--json")
    assert as_json.returncode == 2
    assert "local, gpu-b" in json.loads(as_json.stdout)["error"]
    command = hinted.strip("`").split()[1:]
    done = runwatch(*command, "--yes")
    assert done.returncode == 0, done.stderr
    assert gone(run.pid, run.start_time)


def test_kill_by_pid_after_confirmation(fake_runs: FakeRuns, tmp_path: Path) -> None:
    """With a terminal the identity is shown and a "n" answer leaves the run alone."""
    run = start_run(fake_runs)
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    script = (
        "import os, pty, sys; sys.exit(os.waitstatus_to_exitcode(pty.spawn([sys.executable, "
        f"'-m', 'supervisor.cli', 'kill', '-c', {str(config)!r}, '--host', 'local', '--pid', "
        f"'{run.pid}'])))"
    )
    no = subprocess.run(
        [sys.executable, "-c", script], input="n\n", capture_output=True, text=True, timeout=60
    )
    assert f"pid {run.pid}" in no.stdout and "start" in no.stdout
    # Declining is not an interruption: exit 1 and say nothing was done (as launch/restart do).
    assert no.returncode == 1, no.stdout
    assert "not confirmed: nothing was stopped" in no.stdout
    assert alive(run.pid, run.start_time)
    yes = subprocess.run(
        [sys.executable, "-c", script], input="y\n", capture_output=True, text=True, timeout=60
    )
    assert "terminated" in yes.stdout, yes.stdout
    assert gone(run.pid, run.start_time)


def test_ps_backend_comes_from_the_configured_endpoint(fake_runs: FakeRuns, tmp_path: Path) -> None:
    """An API reached on a loopback address (a proxy, a tunnel, the demo's mock) is an API."""
    run = start_run(fake_runs, "--api-base", "http://127.0.0.1:8999/v1")
    config = write_config(tmp_path / "rw.toml", os.path.dirname(run.argv[1]))
    with config.open("a") as f:
        f.write(
            '\n[[endpoints]]\nname = "proxy"\nkind = "api"\n'
            'base_url = "http://127.0.0.1:8999/v1/"\nmodel = "m"\n'
        )
    out = runwatch("ps", "-c", str(config), "--json")
    assert out.returncode == 0, out.stderr
    (p,) = [p for p in json.loads(out.stdout)["hosts"][0]["processes"] if p["pid"] == run.pid]
    assert p["flags"]["api_base"] == "http://127.0.0.1:8999/v1"
    assert p["flags"]["backend"] == "api"
    text = runwatch("ps", "-c", str(config))
    assert "backend api" in text.stdout and "up " in text.stdout and " MB" in text.stdout


def test_ps_names_an_unreachable_host_once(tmp_path: Path) -> None:
    from tests.fixtures_sshd import free_port

    port = free_port()
    config = tmp_path / "rw.toml"
    config.write_text(
        f'[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\nport = {port}\nconnect_timeout = 5\n'
    )
    out = runwatch("ps", "-c", str(config))
    assert out.returncode == 1
    assert out.stdout == f"gone: unreachable: connection refused by 127.0.0.1:{port}\n"


def test_ps_and_status_name_a_run_not_in_the_config_alike(
    fake_runs: FakeRuns, tmp_path: Path
) -> None:
    """A matching process the config does not name reads "(not in config)" in ps and in status
    alike (issue 38: ps said "(unconfigured)")."""
    run = start_run(fake_runs)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = write_config(tmp_path / "rw.toml", str(elsewhere))
    ps = runwatch("ps", "-c", str(config))
    assert ps.returncode == 0, ps.stderr
    (line,) = [ln for ln in ps.stdout.splitlines() if f"pid {run.pid} " in ln]
    assert "(not in config)" in line, ps.stdout
    status = runwatch("status", "-c", str(config))
    assert status.returncode == 0, status.stderr
    (head,) = [ln for ln in status.stdout.splitlines() if f"pid {run.pid})" in ln]
    assert "(not in config)" in head, status.stdout
    assert "unconfigured" not in ps.stdout + status.stdout
