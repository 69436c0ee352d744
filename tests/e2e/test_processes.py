"""Which processes are runs (P3), what the agent says about them, and secrets masked (E3)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from supervisor.agent import gpu, masking, match
from supervisor.agent import proc as procs
from supervisor.agent.argflags import DEFAULT_SCRIPTS
from supervisor.hosts import Host, LocalHost, process_infos
from tests.fixtures_procs import (
    FakeRuns,
    argv_of,
    as_nobody,
    local_host_config,
    runs_by_pid,
    system_python,
)

SCRIPTS = list(DEFAULT_SCRIPTS)


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python3", "run_inference.py", "--datasets", "B1"], 1),
        (["/usr/bin/python3.11", "-u", "/data/eagle3/run_inference.py"], 2),
        (["python", "-X", "dev", "-W", "ignore", "run_inference.py"], 5),
        (["python3", "-Wignore", "-uB", "./run_inference.py"], 3),
        (["pypy3", "server_generate.py"], 1),
        (["/data/run_inference.py", "--x"], 0),  # executed directly
        (["python3", "--", "run_inference.py"], 2),
        # decoys
        (["grep", "run_inference.py"], None),
        (["grep", "-r", "python run_inference.py", "."], None),
        (["tail", "-f", "out/run_inference.py.log"], None),
        (["tail", "-f", "out/B1/raw_responses.jsonl"], None),
        (["vim", "run_inference.py"], None),
        (["less", "run_inference.py"], None),
        (["bash", "-c", "python3 run_inference.py --datasets B1; echo done"], None),
        (["bash", "run_inference.py"], None),
        (["python3", "-c", "import runpy; runpy.run_path('run_inference.py')"], None),
        (["python3", "-uc", "print(1)", "run_inference.py"], None),
        (["python3", "-m", "pdb", "run_inference.py"], None),
        (["python3", "my_run_inference.py"], None),
        (["python3", "run_inference.py.bak"], None),
        (["python3", "tools/check.py", "run_inference.py"], None),
        (["sh", "-c", 'IFS= read -r py; exec "$py" -c "..."'], None),
        ([], None),
    ],
)
def test_script_index_matches_only_an_executed_script(
    argv: list[str], expected: int | None
) -> None:
    assert match.script_index(argv, SCRIPTS) == expected


def test_flags_of_a_run() -> None:
    argv = [
        "python3", "run_inference.py",
        "--datasets", "B1,B2", "B3",
        "--max-samples", "7000",
        "--token-budget=10_000_000",
        "--concurrency", "64",
        "--output-dir", "out",
        "--api-base", "http://127.0.0.1:30000/v1",
        "--model", "moonshotai/Kimi-K2.5",
    ]  # fmt: skip
    flags = match.parse_flags(argv, 1)
    assert flags == {
        "datasets": ["B1", "B2", "B3"],
        "max_samples": 7000,
        "token_budget": 10_000_000,
        "concurrency": 64,
        "output_dir": "out",
        "api_base": "http://127.0.0.1:30000/v1",
        "model": "moonshotai/Kimi-K2.5",
        "backend": "local",
        "client": None,
        "output_file": None,
        "input_file": None,
        "prompts_dir": None,
        "resume": None,
    }
    assert match.parse_flags(["python", "run_inference.py"], 1)["token_budget"] is None


@pytest.mark.parametrize(
    ("base", "backend"),
    [
        ("http://127.0.0.1:30000/v1", "local"),
        ("http://localhost:8000/v1", "local"),
        ("http://[::1]:8000/v1", "local"),
        ("http://10.1.2.3:30000/v1", "local"),
        ("http://192.168.0.7/v1", "local"),
        ("http://gpu-box:30000/v1", "local"),
        ("https://openrouter.ai/api/v1", "api"),
        ("https://api.openai.com/v1", "api"),
        ("https://8.8.8.8/v1", "api"),
        (None, "unknown"),
    ],
)
def test_backend_from_api_base(base: str | None, backend: str) -> None:
    assert match.backend_of(base) == backend


SECRET = "sk-or-v1-0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("argv", "masked"),
    [
        (["--api-key", SECRET], ["--api-key", "***"]),
        ([f"--api-key={SECRET}"], ["--api-key=***"]),
        (["--token", "abc123"], ["--token", "***"]),
        (["--hf-token", "hf_abcdefghijklmnopqrstu"], ["--hf-token", "***"]),
        (["--MY_SECRET", "x"], ["--MY_SECRET", "***"]),
        (["--db-password=hunter2"], ["--db-password=***"]),
        (["--openai_api_key", "zzz"], ["--openai_api_key", "***"]),
        ([SECRET], ["***"]),
        (["--header", f"Authorization: Bearer {SECRET}"], ["--header", "Authorization: ***"]),
        (["-H", "authorization:basic dXNlcjpwYXNz"], ["-H", "authorization:***"]),
        ([f"OPENAI_API_KEY={SECRET}"], ["OPENAI_API_KEY=***"]),
        (["--api-base", "https://user:pw@host/v1"], ["--api-base", "https://user:***@host/v1"]),
        (["--url", "https://h/v1?api_key=abc&x=1"], ["--url", "https://h/v1?api_key=***&x=1"]),
        # not secrets
        (["--token-budget", "10000000"], ["--token-budget", "10000000"]),
        (["--max-tokens", "8192"], ["--max-tokens", "8192"]),
        (["--tokenizer", "/models/kimi"], ["--tokenizer", "/models/kimi"]),
        (["--api-key"], ["--api-key"]),
        (["--api-key", "--model", "m"], ["--api-key", "--model", "m"]),
    ],
)
def test_mask_argv(argv: list[str], masked: list[str]) -> None:
    assert masking.mask_argv(argv) == masked


# --------------------------------------------------------------------------- real processes


async def _ps(host: Host, **params: Any) -> dict[str, Any]:
    return await host.request("ps", {"scripts": SCRIPTS, **params})


async def test_run_is_listed_with_identity_children_and_flags(
    host: Host, fake_runs: FakeRuns
) -> None:
    run = fake_runs.start(
        "--datasets", "B1,B2", "--max-samples", "7000", "--concurrency", "8",
        "--output-dir", "out", "--api-base", "https://openrouter.ai/api/v1",
        children=2,
    )  # fmt: skip
    found = runs_by_pid(await _ps(host))
    assert run.pid in found
    p = found[run.pid]
    assert p["identity"]["start_time"] == run.start_time
    assert p["identity"]["uid"] == os.getuid()
    assert p["identity"]["boot_id"] == procs.boot_id() != ""
    assert p["identity"]["argv"] == run.argv
    assert sorted(p["children"]) == sorted(run.children)
    assert p["flags"]["datasets"] == ["B1", "B2"]
    assert p["flags"]["max_samples"] == 7000
    assert p["flags"]["token_budget"] is None
    assert p["flags"]["backend"] == "api"
    assert p["cwd"] == str(os.path.dirname(run.argv[1]))
    assert p["killable"] is True
    assert p["state"] in ("S", "R")
    assert p["rss_mb"] > 0
    assert p["uptime_s"] >= 0
    assert p["gpu_memory_mb"] is None  # no nvidia-smi here
    # the workers (plain python -c) are children, never runs of their own
    assert not set(run.children) & set(found)
    info = process_infos(await _ps(host))
    assert any(pi.identity.pid == run.pid and pi.flags.max_samples == 7000 for pi in info)


async def test_forked_workers_with_the_same_argv_are_children_not_runs(
    host: Host, fake_runs: FakeRuns
) -> None:
    run = fake_runs.start("--datasets", "B1", children=2, fork=True)
    for child in run.children:  # the premise: workers carry the run's argv
        with open(f"/proc/{child}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[1].endswith(b"run_inference.py")
    found = runs_by_pid(await _ps(host))
    assert run.pid in found
    assert not set(run.children) & set(found)
    assert sorted(found[run.pid]["children"]) == sorted(run.children)


async def test_decoys_are_never_runs(host: Host, fake_runs: FakeRuns) -> None:
    """P3: grep, tail -f, an editor, less, a bash -c wrapper, python -c, the agent itself."""
    run = fake_runs.start("--datasets", "B1")
    script = run.argv[1]
    d = fake_runs.dir
    (d / "out.log").write_text("")
    py = sys.executable
    reader = "import sys; sys.stdin.read()"
    decoys = [
        fake_runs.decoy(["grep", "run_inference.py"]),  # reads the open stdin pipe forever
        fake_runs.decoy(["tail", "-f", str(d / "out.log"), "run_inference.py.log"]),
        fake_runs.decoy(["vim", "-n", "-u", "NONE", script]),
        fake_runs.decoy(
            ["bash", "-c", f"exec -a less {py} -c '{reader}' run_inference.py"],
            expect=["less", "-c", reader, "run_inference.py"],
        ),
        fake_runs.decoy(
            ["bash", "-c", f"exec -a nano {py} -c '{reader}' {script}"],
            expect=["nano", "-c", reader, script],
        ),
        fake_runs.decoy([py, "-c", reader, "run_inference.py", script]),
    ]
    # A bash -c wrapper around a real run: the shell is not a run, the python it starts is.
    wrapped = fake_runs.start("--datasets", "W", prefix=["bash", "-c", '"$@"; echo done', "sh"])
    assert wrapped.popen.pid != wrapped.pid
    assert os.path.basename(argv_of(wrapped.popen.pid)[0]) == "bash"
    found = runs_by_pid(await _ps(host))
    assert run.pid in found
    for decoy in decoys:
        assert decoy.pid not in found, decoy.args
    assert wrapped.popen.pid not in found
    assert wrapped.pid in found
    agent_pid = host.hello["pid"] if host.hello else None
    assert agent_pid not in found


def test_the_caller_and_its_ancestors_are_never_runs(fake_runs: FakeRuns) -> None:
    """A lister whose own process descends from a run never lists that run."""
    run = fake_runs.start(children=1)
    lister = procs.Lister(self_pid=run.children[0])
    assert run.pid not in {p["identity"]["pid"] for p in lister.list_runs(SCRIPTS)}
    assert run.pid in {p["identity"]["pid"] for p in procs.Lister().list_runs(SCRIPTS)}


async def test_configured_scripts_only(host: Host, fake_runs: FakeRuns) -> None:
    other = fake_runs.start(script=fake_runs.script("regenerate_train_data.py"))
    run = fake_runs.start()
    only = runs_by_pid(await host.request("ps", {"scripts": ["run_inference.py"]}))
    assert run.pid in only and other.pid not in only
    both = runs_by_pid(await _ps(host))
    assert {run.pid, other.pid} <= set(both)
    assert both[other.pid]["script"] == "regenerate_train_data.py"


async def test_secrets_never_leave_the_host(host: Host, fake_runs: FakeRuns) -> None:
    """E3: the whole reply (identity, argv, flags) carries no secret from argv."""
    secret = "sk-or-v1-feedfacefeedfacefeedfacefeedface"
    run = fake_runs.start(
        "--api-key", secret, f"--hf-token={secret[6:]}",
        "--api-base", f"https://u:{secret}@openrouter.ai/api/v1",
        "--header", f"Authorization: Bearer {secret}",
    )  # fmt: skip
    result = await _ps(host)
    raw = json.dumps(result)
    assert run.pid in runs_by_pid(result)
    assert secret not in raw and secret[6:] not in raw
    p = runs_by_pid(result)[run.pid]
    assert p["argv_masked"][p["argv_masked"].index("--api-key") + 1] == "***"
    assert p["identity"]["argv"] == p["argv_masked"]
    assert p["flags"]["api_base"] == "https://u:***@openrouter.ai/api/v1"


async def test_other_users_processes(fake_runs: FakeRuns) -> None:
    """P7: another user's run is not listed unless configured, and then is not killable."""
    prefix, python = as_nobody(), system_python()
    if prefix is None or python is None:
        pytest.skip("needs root and setpriv to start a process as user nobody")
    theirs = fake_runs.start("--datasets", "N1", prefix=prefix, python=python)
    mine = fake_runs.start("--datasets", "M1")
    async with LocalHost(local_host_config()) as h:
        default = runs_by_pid(await _ps(h))
        shown = runs_by_pid(await _ps(h, show_other_users=True))
    assert mine.pid in default and theirs.pid not in default
    assert theirs.pid in shown
    assert shown[theirs.pid]["killable"] is False
    assert shown[theirs.pid]["user"] == "nobody"
    assert shown[theirs.pid]["identity"]["uid"] == 65534
    assert shown[mine.pid]["killable"] is True


@pytest.mark.parametrize(
    "python",
    ["/usr/bin/python3", "/root/.pyenv/versions/3.8.18/bin/python3.8"],
    ids=["system-python-no-psutil", "python3.8"],
)
async def test_agent_on_another_python_lists_the_same_identity(
    python: str, fake_runs: FakeRuns
) -> None:
    """The agent is stdlib-only and >= 3.8: the same identity from a Python without psutil."""
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} is not installed here")
    run = fake_runs.start("--datasets", "B1", children=1)
    async with (
        LocalHost(local_host_config(python=python)) as other,
        LocalHost(local_host_config()) as venv,
    ):
        assert other.hello is not None and other.hello["python"] != ""
        a, b = await asyncio.gather(_ps(other), _ps(venv))
    pa, pb = runs_by_pid(a)[run.pid], runs_by_pid(b)[run.pid]
    assert pa["identity"] == pb["identity"]
    assert pa["children"] == pb["children"] == run.children


def test_gpu_memory_parsing() -> None:
    apps = "1234, 20480\n1234, 1024\n999, [N/A]\n\ngarbage\n"
    assert gpu.parse_gpu_apps(apps) == {1234: 21504.0}
    gpus, bad = gpu.parse_gpus("0, NVIDIA H100 80GB HBM3, 70000, 81559, 97\n")
    assert bad == []
    assert gpus == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_used_mb": 70000.0,
            "memory_total_mb": 81559.0,
            "utilization_pct": 97.0,
            "pids": [],
        }
    ]


async def test_gpu_memory_summed_over_descendants(fake_runs: FakeRuns) -> None:
    """With an ``nvidia-smi`` on PATH, a run's GPU memory includes its workers'."""
    run = fake_runs.start(children=2)
    bindir = fake_runs.dir / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    lines = "\\n".join(
        f"{pid}, {mb}" for pid, mb in [(run.pid, 100), *zip(run.children, (200, 300), strict=True)]
    )
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-compute-apps=*) printf '{lines}\\n' ;;\n"
        "  --query-gpu=*) printf '0, Fake GPU, 600, 1000, 50\\n' ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    async with LocalHost(local_host_config(), env=env) as h:
        assert h.hello is not None and h.hello["has_nvidia_smi"] is True
        result = await _ps(h)
    assert runs_by_pid(result)[run.pid]["gpu_memory_mb"] == 600.0
    assert result["gpu"]["gpus"][0]["name"] == "Fake GPU"


async def test_hostile_arguments_are_data(host: Host, fake_runs: FakeRuns) -> None:
    """S5 locally: shell syntax, newlines, non-ASCII and invalid UTF-8 in a run's argv are listed
    exactly, survive JSON, and nothing in them is ever executed."""
    pwned = fake_runs.dir / "pwned"
    hostile = [
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        f"; touch {pwned};",
        "a\nb",
        'it\'s "quoted"',
        "données-日本",
        "--datasets=B1,$(id)",
    ]
    run = fake_runs.start(*hostile)
    raw_run = fake_runs.start("--datasets", "B1", os.fsdecode(b"caf\xff"))
    result = await _ps(host)
    found = runs_by_pid(result)
    assert found[run.pid]["identity"]["argv"][2:] == hostile
    assert found[run.pid]["flags"]["datasets"] == ["B1", "$(id)"]
    assert found[raw_run.pid]["identity"]["argv"][-1] == "caf\\xff"
    json.dumps(result, ensure_ascii=False).encode("utf-8")  # valid text throughout
    from supervisor.kill import kill

    for p in process_infos(result):
        if p.identity.pid in (run.pid, raw_run.pid):
            report = await kill(host, p.identity, grace=5.0)
            assert report.all_gone, report
    assert not pwned.exists()


def test_masking_leaves_lookalikes_alone() -> None:
    argv = ["--datasets", "disk-usage-0123456789abcdef", "--note", "token budget matters"]
    assert masking.mask_argv(argv) == argv
    assert masking.mask_argv(["x", "Bearer abcdefghijk"]) == ["x", "Bearer ***"]
