"""O7: every path of a run's command line is resolved as the client resolves it. No shell expands
argv, so ``--output-dir '~/legacy'`` is ``<workdir>/~/legacy``; a path flag the argv lacks is the
client's own default (its profile's ``path_defaults``), and where the profile has none the files
are unknown and every action refused; the laptop's gate and the host's matching agree. Real
processes (the reference client, launched through the gate), real files, the real agent, the CLI.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from supervisor import clients
from supervisor.config import Config, HostConfig, RunConfig, load_config
from supervisor.errors import ConfigError
from supervisor.hosts import LocalHost, list_processes
from supervisor.layout import layout_of
from supervisor.plan import make_plan
from supervisor.steps import execute
from tests.fixtures_actions import (
    RUN_INFERENCE,
    DemoRun,
    engine_for,
    raw_record,
    run_pids,
    runwatch,
    sha256_of,
    why,
    write_legacy,
)
from tests.fixtures_procs import FakeRuns
from tests.waiting import wait_until

DEMO = Path(__file__).resolve().parents[2] / "supervisor" / "demo"


def _current(path: Path, count: int) -> None:
    """A new data file of ``count`` complete records in the current (raw) format."""
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(raw_record(f"B1-{i:06d}") for i in range(count)))


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


async def _launch(engine: Any, run: str = "demo", **kw: Any) -> Any:
    return await execute(engine, await make_plan(engine, run, action="launch", **kw))


async def _wait_lines(path: Path, more_than: int) -> None:
    import asyncio

    await asyncio.to_thread(wait_until, lambda: _lines(path) > more_than, 60.0)


def step_state(result: Any, name: str) -> str:
    return str(next(s.state for s in result.steps if s.name == name))


def _stop(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- ~ is literal


async def test_o7_tilde_in_argv_is_a_directory_under_the_workdir_not_home(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--set output-dir='~/legacy'``: the client writes ``<workdir>/~/legacy`` (no shell expands
    its argv), so that is what the format check reads: legacy records there are refused although
    ``$HOME/legacy`` holds current ones; nothing starts and neither file changes."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",))
    kill_runs_in.append(demo.workdir)
    in_home = home / "legacy" / "B1" / "raw_responses.jsonl"
    literal = demo.workdir / "~" / "legacy" / "B1" / "raw_responses.jsonl"
    _current(in_home, 3)
    write_legacy(literal, 4)
    before = {p: sha256_of(p) for p in (in_home, literal)}
    async with engine_for(demo) as engine:
        plan = await make_plan(engine, "demo", action="launch", overrides=["output-dir=~/legacy"])
        assert plan.argv[plan.argv.index("--output-dir") + 1] == "~/legacy"
        assert plan.layout.data_files == {"B1": str(literal)}
        assert plan.paths["out"] == str(demo.workdir / "~" / "legacy")
        result = await execute(engine, plan)
    assert not result.ok
    failed = result.failed_step
    assert failed is not None and failed.name == "format-check", why(result)
    assert str(literal) in failed.detail and "legacy" in failed.detail
    assert str(in_home) not in failed.detail
    assert run_pids(demo.workdir) == []
    assert {p: sha256_of(p) for p in before} == before


async def test_o7_tilde_in_argv_passes_when_the_literal_directory_is_current(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reverse: legacy records in ``$HOME/legacy``, current ones in ``<workdir>/~/legacy``.
    The gate passes, and the real client appends to ``<workdir>/~/legacy``, never to
    ``$HOME/legacy``; the host matches the launched process to the run by its argv."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=300)
    kill_runs_in.append(demo.workdir)
    in_home = home / "legacy" / "B1" / "raw_responses.jsonl"
    literal = demo.workdir / "~" / "legacy" / "B1" / "raw_responses.jsonl"
    write_legacy(in_home, 4)
    _current(literal, 3)
    home_digest = sha256_of(in_home)
    prefix = literal.read_bytes()
    async with engine_for(demo) as engine:
        result = await _launch(engine, overrides=["output-dir=~/legacy"])
        assert result.ok, why(result)
        assert result.identity is not None
        pid = int(result.identity["pid"])
        await _wait_lines(literal, 4)
        snap = await engine.refresh()
        [rv] = [r for h in snap.hosts for r in h.runs if r.name == "demo"]
        assert rv.process is not None and rv.process.identity.pid == pid
        # Launched by runwatch: held by its unit (the host-side matching by argv of a run
        # started by hand is tested below, by the same rule).
        assert rv.process.evidence["demo"] == ["unit"] and rv.held_by in ("cgroup", "token")
        [ds] = rv.datasets
        assert ds.path == str(literal)
    assert literal.read_bytes().startswith(prefix)
    assert sha256_of(in_home) == home_digest
    assert not (demo.workdir / "data").exists()


# --------------------------------------------------------------------------- unset: the default


async def test_o7_unset_output_dir_checks_the_reference_clients_own_default(
    tmp_path: Path, state_home: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    """``--unset output-dir`` on a run whose config says ``output_dir = "data"``: the reference
    client writes to its default ``out``, so the gate checks ``<workdir>/out`` (legacy there:
    refused), not the config's directory; once it is clean the real client writes there."""
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=300)
    kill_runs_in.append(demo.workdir)
    default = demo.workdir / "out" / "B1" / "raw_responses.jsonl"
    write_legacy(default, 4)
    async with engine_for(demo) as engine:
        plan = await make_plan(engine, "demo", action="launch", unsets=["output-dir"])
        assert "--output-dir" not in plan.argv
        assert plan.layout.data_files == {"B1": str(default)}
        refused = await execute(engine, plan)
        assert not refused.ok and refused.failed_step is not None
        assert refused.failed_step.name == "format-check", why(refused)
        assert str(default) in refused.failed_step.detail
        assert run_pids(demo.workdir) == []
        default.unlink()
        result = await _launch(engine, unsets=["output-dir"])
        assert result.ok, why(result)
        await _wait_lines(default, 1)
    assert not demo.data_file("B1").exists()


def _mygen(workdir: Path, default: str) -> Path:
    """The reference client under another name, whose ``--output-dir`` default is ``default``."""
    src = RUN_INFERENCE.read_text()
    spelled = 'p.add_argument("--output-dir", default="out"'
    assert src.count(spelled) == 1
    script = workdir / "mygen.py"
    script.write_text(src.replace(spelled, f'p.add_argument("--output-dir", default="{default}"'))
    return script


def _profile_toml(name: str, path_defaults: dict[str, str] | None) -> str:
    ref = clients.BUILTIN_CLIENTS["run_inference"]
    lines = [
        f"[clients.{name}]",
        'scripts = ["mygen.py"]',
        f"known_flags = {json.dumps(ref.known_flags)}",
        f"switches = {json.dumps(ref.switches)}",
    ]
    if path_defaults is not None:
        table = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in path_defaults.items())
        lines.append(f"path_defaults = {{ {table} }}")
    lines.append(f"[clients.{name}.flags]")
    for role in ("datasets", "output_dir", "prompts_dir", "samples", "endpoint", "model"):
        lines.append(f"{role} = {json.dumps(getattr(ref.flags, role))}")
    return "\n".join(lines) + "\n"


def _mygen_demo(tmp_path: Path, url: str, path_defaults: dict[str, str] | None) -> DemoRun:
    demo = DemoRun(tmp_path, url, datasets=("B1",), max_samples=300)
    script = _mygen(demo.workdir, "outputs")
    text = demo.config_path.read_text().replace(json.dumps(str(RUN_INFERENCE)), '"mygen.py"')
    assert str(RUN_INFERENCE) not in text and str(script.name) in text
    demo.config_path.write_text(_profile_toml("mygen", path_defaults) + text)
    return demo


async def test_o7_unset_output_dir_checks_a_user_profiles_default(
    tmp_path: Path, state_home: Path, slow_endpoint: Any
) -> None:
    """A ``[clients.mygen]`` profile whose ``path_defaults`` say ``--output-dir`` is ``outputs``
    (as its script's argparse does): ``--unset output-dir`` checks ``<workdir>/outputs``, and the
    script, launched without the flag, writes there."""
    demo = _mygen_demo(tmp_path, slow_endpoint.url, {"--output-dir": "outputs"})
    default = demo.workdir / "outputs" / "B1" / "raw_responses.jsonl"
    write_legacy(default, 4)
    pid = None
    try:
        async with engine_for(demo) as engine:
            refused = await _launch(engine, unsets=["output-dir"])
            assert not refused.ok and refused.failed_step is not None
            assert refused.failed_step.name == "format-check", why(refused)
            assert str(default) in refused.failed_step.detail
            default.unlink()
            result = await _launch(engine, unsets=["output-dir"])
            assert result.ok, why(result)
            assert result.identity is not None
            pid = int(result.identity["pid"])
            await _wait_lines(default, 1)
    finally:
        _stop(pid)
    assert not demo.data_file("B1").exists()


def test_o7_a_profile_without_a_default_refuses_an_unset_output_flag(
    tmp_path: Path, state_home: Path
) -> None:
    """No default in the profile and no flag in the argv: the files are unknown, never guessed
    from the config's ``output_dir``; launch, restart and check refuse saying how to declare it,
    and status says the files are unknown. The same for SpecForge's required output file."""
    demo = _mygen_demo(tmp_path, "http://127.0.0.1:9/v1", None)
    cfg = str(demo.config_path)
    for args in (
        ("launch", "demo", "--unset", "output-dir", "--dry-run"),
        ("restart", "demo", "--unset", "output-dir", "--yes"),
    ):
        out = runwatch(*args, "-c", cfg)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "cannot determine the run's data files" in out.stderr
        assert "no --output-dir in its argv" in out.stderr
        assert "mygen profile has no default" in out.stderr and "path_defaults" in out.stderr
    assert not (demo.workdir / "data").exists() and not (demo.workdir / "outputs").exists()
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[[hosts]]\nname = "here"\nlocal = true\n[[runs]]\nname = "regen"\nhost = "here"\n'
        f'workdir = "{tmp_path}"\n'
        'argv = ["python3", "regenerate_train_data.py", "--model", "m", "--input-file-path", '
        '"in.jsonl", "--output-file-path", "out/regen.jsonl", "--resume"]\n'
    )
    out = runwatch("launch", "regen", "--unset", "output-file-path", "--dry-run", "-c", str(spec))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no --output-file-path in its argv" in out.stderr, out.stderr
    # A run configured without the flag is shown with its files unknown.
    before = demo.config_path.read_text()
    text = before.replace('"--output-dir", "data", ', "")
    assert text != before
    demo.config_path.write_text(text)
    out = runwatch("status", "-c", cfg, "--json")
    [run] = [r for r in json.loads(out.stdout)["hosts"][0]["runs"] if r["name"] == "demo"]
    assert run["datasets"] == []
    assert run["state_detail"].startswith("data files unknown: no --output-dir in its argv")


def test_o7_argv_output_dir_wins_over_the_config_key_and_only_an_unprofiled_script_reads_it(
    tmp_path: Path,
) -> None:
    """A relative ``--output-dir data`` in a run whose ``output_dir`` key is ``out``: the layout
    follows the argv. The key says where a script NO profile describes writes without the flag;
    without the key that script's files are unknown."""
    work = tmp_path / "w"
    base = '[[hosts]]\nname = "here"\nlocal = true\n[[runs]]\nname = "gen"\nhost = "here"\n'
    base += f'workdir = "{work}"\n'

    def layout(argv: list[str], extra: str = "", top: str = "") -> Any:
        path = tmp_path / "rw.toml"
        path.write_text(f"{top}\n{base}argv = {json.dumps(argv)}\n{extra}")
        config = load_config(path)
        return layout_of(config, config.run("gen"))

    ref = ["python3", "run_inference.py", "--datasets", "B1"]
    got = layout([*ref, "--output-dir", "data"], 'output_dir = "out"')
    assert got.data_files == {"B1": str(work / "data" / "B1" / "raw_responses.jsonl")}
    got = layout(ref, 'output_dir = "elsewhere"')  # the client's default, not the key
    assert got.out == str(work / "out") and got.prompt_files == {"B1": "prompts/B1.jsonl"}
    mine = ["python3", "gen.py", "--datasets", "B1"]
    got = layout(mine, 'output_dir = "mine"', top='scripts = ["gen.py"]')
    assert not got.profiled and got.out == str(work / "mine")
    got = layout(mine, top='scripts = ["gen.py"]')
    assert got.problem is not None and got.data_files == {}
    assert "no client profile says where gen.py writes" in got.problem
    with pytest.raises(ConfigError) as err:
        got.require_files()
    assert "[clients.NAME]" in (err.value.hint or "") and "output_dir" in (err.value.hint or "")


# --------------------------------------------------------------------------- the host agrees


async def test_o7_the_host_matches_processes_by_paths_resolved_as_the_client_does(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent resolves a process's argv paths from its cwd with a literal ``~`` and its
    profile's defaults, as the laptop's layout does: the run (``--output-dir ~/legacy`` in
    ``w``) is the process in ``w`` and the one naming ``w/~/legacy`` from elsewhere, never a
    process writing ``$HOME/legacy`` or ``~/legacy`` of another cwd; a run without the flag is
    the process whose default ``out`` lands in its workdir; a script no profile describes writes
    without the flag where its run's ``output_dir`` key says."""
    home = tmp_path / "home"
    work = tmp_path / "w"
    other = tmp_path / "other"
    for d in (home, work, other, tmp_path / "v", tmp_path / "u"):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    tilde = ("--datasets", "B1", "--output-dir", "~/legacy")
    config = Config(
        scripts=["run_inference.py", "gen.py"],
        hosts=[HostConfig(name="local", local=True, command_timeout=30.0)],
        runs=[
            RunConfig(
                name="gen",
                host="local",
                workdir=str(work),
                argv=["python3", "run_inference.py", *tilde],
            ),
            RunConfig(
                name="plain",
                host="local",
                workdir=str(tmp_path / "v"),
                argv=["python3", "run_inference.py", "--datasets", "B2"],
            ),
            RunConfig(
                name="mine",
                host="local",
                workdir=str(tmp_path / "u"),
                argv=["python3", "gen.py", "--datasets", "B3"],
                output_dir="o",
            ),
        ],
    )
    assert layout_of(config, config.runs[0]).out == str(work / "~" / "legacy")
    gen = fake_runs.script("gen.py")
    procs = {
        "in_workdir": fake_runs.start(*tilde, cwd=work),
        "absolute": fake_runs.start(
            "--datasets", "B1", "--output-dir", str(work / "~" / "legacy"), cwd=other
        ),
        "home": fake_runs.start("--datasets", "B1", "--output-dir", str(home / "legacy"), cwd=work),
        "other_cwd": fake_runs.start(*tilde, cwd=other),
        "default": fake_runs.start("--datasets", "B2", cwd=tmp_path / "v"),
        "default_elsewhere": fake_runs.start("--datasets", "B2", cwd=other),
        "unprofiled": fake_runs.start("--datasets", "B3", cwd=tmp_path / "u", script=gen),
        "unprofiled_elsewhere": fake_runs.start("--datasets", "B3", cwd=other, script=gen),
    }  # fmt: skip
    host = LocalHost(config.hosts[0])
    try:
        listed = {p.identity.pid: p for p in await list_processes(host, config)}
    finally:
        await host.close()
    got = {name: listed[p.pid] for name, p in procs.items()}
    assert got["in_workdir"].run == "gen" and "argv" in got["in_workdir"].evidence["gen"]
    assert got["absolute"].run == "gen" and got["absolute"].evidence["gen"] == ["argv"]
    # Its cwd is the workdir, but it writes $HOME/legacy: no argv evidence.
    assert "argv" not in got["home"].evidence.get("gen", [])
    assert got["other_cwd"].run is None and "gen" not in got["other_cwd"].evidence
    assert got["default"].run == "plain" and "argv" in got["default"].evidence["plain"]
    assert "plain" not in got["default_elsewhere"].evidence
    assert got["unprofiled"].run == "mine" and "argv" in got["unprofiled"].evidence["mine"]
    assert "mine" not in got["unprofiled_elsewhere"].evidence


# --------------------------------------------------------------------------- profiles


def _argparse_defaults(script: Path) -> dict[str, object]:
    """``--flag`` -> its ``default=`` (None when absent or required), read statically."""
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(script.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        if not node.args or not isinstance(node.args[0], ast.Constant):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        value = ast.literal_eval(kw["default"]) if "default" in kw else None
        found[str(node.args[0].value)] = value
    return found


def test_o7_built_in_path_defaults_are_their_scripts_argparse_defaults() -> None:
    """Each built-in profile's ``path_defaults`` is what its script's argparse uses for every
    path flag (the reference client; the stand-ins of SpecForge's and Model-Optimizer's scripts,
    whose input and output paths are required or None): a flag with no usable default has none."""
    scripts = {
        "run_inference": DEMO / "run_inference.py",
        "specforge": DEMO / "specforge_regenerate.py",
        "modelopt": DEMO / "modelopt_server_generate.py",
    }
    for name, script in scripts.items():
        profile = clients.BUILTIN_CLIENTS[name]
        defaults = _argparse_defaults(script)
        path_flags = [f for f, t in profile.value_types.items() if t == "path"]
        assert path_flags, name
        for flag in path_flags:
            want = defaults[flag]
            assert profile.path_defaults.get(flag) == (want if isinstance(want, str) else None)
        assert set(profile.path_defaults) <= set(path_flags)
    wire = clients.wire(clients.BUILTIN_CLIENTS["run_inference"])
    assert wire["defaults"] == {"output_dir": "out", "prompts_dir": "prompts"}
    assert clients.wire(clients.BUILTIN_CLIENTS["specforge"])["defaults"] == {}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('path_defaults = { "out" = "x" }', "'out' is not a flag name"),
        ('path_defaults = { "--out" = "" }', "'' is not a path"),
        ('path_defaults = { "--other" = "x" }', "not one of the profile's known_flags"),
        ('path_defaults = { "--resume" = "x" }', "a switch has no path"),
        ('path_defaults = { "--n" = "3" }', "its value_types entry is not path"),
    ],
)
def test_o7_path_defaults_are_validated(tmp_path: Path, table: str, message: str) -> None:
    cfg = tmp_path / "rw.toml"
    cfg.write_text(
        '[clients.mine]\nscripts = ["gen.py"]\nknown_flags = ["--out", "--n", "--resume"]\n'
        f'switches = ["--resume"]\nvalue_types = {{ "--n" = "int" }}\n{table}\n'
        '[clients.mine.flags]\noutput_file = ["--out"]\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert "clients.mine.path_defaults" in str(err.value) and message in str(err.value)


def test_o7_a_relative_workdir_is_a_config_error(tmp_path: Path) -> None:
    """The client's relative paths and a literal ``~`` of its argv are read from the workdir: one
    that is itself relative would be relative to wherever runwatch runs."""
    cfg = tmp_path / "rw.toml"
    for workdir in ("work", ".", ""):
        cfg.write_text(
            '[[hosts]]\nname = "here"\nlocal = true\n[[runs]]\nname = "gen"\nhost = "here"\n'
            f'workdir = "{workdir}"\nargv = ["python3", "run_inference.py", "--datasets", "B1"]\n'
        )
        with pytest.raises(ConfigError) as err:
            load_config(cfg)
        assert "runs[0].workdir: expected an absolute path or ~/..." in str(err.value)
    cfg.write_text(cfg.read_text().replace('workdir = ""', 'workdir = "~/work"'))
    assert load_config(cfg).runs[0].workdir == "~/work"


def test_o7_describe_shows_path_defaults() -> None:
    [info] = [i for i in clients.list_clients(Config()) if i.name == "run_inference"]
    assert "  path defaults: --output-dir out, --prompts-dir prompts" in clients.describe(info)
    [info] = [i for i in clients.list_clients(Config()) if i.name == "specforge"]
    assert any(line.startswith("  path defaults: none") for line in clients.describe(info))


# --------------------------------------------------------------------------- a remote host


@pytest.mark.ssh
async def test_o7_over_ssh_the_gate_reads_the_literal_tilde_directory_on_the_host(
    tmp_path: Path, state_home: Path, ssh_host_cfg: Any
) -> None:
    """Over the real sshd the host's agent reads what the laptop's layout names: legacy records
    in ``<workdir>/~/legacy`` refuse ``--set output-dir=~/legacy``, current ones pass."""
    from supervisor.engine import Engine
    from tests.fixtures_actions import host_toml

    work = tmp_path / "work"
    work.mkdir()
    cfg = tmp_path / "rw.toml"
    argv = ["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "data"]
    cfg.write_text(
        host_toml(ssh_host_cfg) + f'[[runs]]\nname = "gen"\nhost = "{ssh_host_cfg.name}"\n'
        f"workdir = {json.dumps(str(work))}\nargv = {json.dumps(argv)}\n"
    )
    literal = work / "~" / "legacy" / "B1" / "raw_responses.jsonl"
    write_legacy(literal, 3)
    async with Engine(load_config(cfg)) as engine:
        plan = await make_plan(engine, "gen", action="launch", overrides=["output-dir=~/legacy"])
        assert plan.layout.data_files == {"B1": str(literal)}
        refused = await execute(engine, plan, dry_run=True)
        literal.write_bytes(raw_record("B1-000000"))
        passed = await execute(
            engine,
            await make_plan(engine, "gen", action="launch", overrides=["output-dir=~/legacy"]),
            dry_run=True,
        )
    failed = refused.failed_step
    assert failed is not None and failed.name == "format-check", why(refused)
    assert str(literal) in failed.detail
    assert step_state(passed, "format-check") == "ok", why(passed)


def test_o7_a_remote_workdirs_tilde_is_the_hosts_home_and_the_argvs_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """For a remote host the laptop leaves the configured workdir's ``~`` to the host and joins
    the argv's ``~`` under it; the agent's ``resolve`` expands only the leading one."""
    from supervisor.agent.datafiles import resolve

    run = RunConfig(
        name="r",
        host="far",
        workdir="~/w",
        argv=["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "~/legacy"],
        log="~/logs/r.log",
    )
    config = Config(hosts=[HostConfig(name="far", address="far.example")], runs=[run])
    layout = layout_of(config, run)
    [path] = layout.data_files.values()
    assert path == "~/w/~/legacy/B1/raw_responses.jsonl"
    assert layout.log == "~/logs/r.log"  # a config value: the host's home
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve(path) == f"{tmp_path}/w/~/legacy/B1/raw_responses.jsonl"
    assert resolve(layout.log) == f"{tmp_path}/logs/r.log"


def test_o7_an_abbreviated_path_flag_in_the_argv_is_refused_never_read_as_absent(
    tmp_path: Path, state_home: Path
) -> None:
    """argparse expands ``--output-d`` to ``--output-dir``: read as an unknown flag, the gate
    would check the default ``out/`` while the client appends into ``legacy/``. The files are
    unknown instead, and launch refuses saying which flag to write in full."""
    legacy = tmp_path / "legacy" / "B1" / "raw_responses.jsonl"
    legacy.parent.mkdir(parents=True)
    legacy.write_text('{"sample_id": 0, "text": "legacy"}\n')
    spec = tmp_path / "abbr.toml"
    spec.write_text(
        '[[hosts]]\nname = "here"\nlocal = true\n[[runs]]\nname = "ab"\nhost = "here"\n'
        f'workdir = "{tmp_path}"\n'
        'argv = ["python3", "run_inference.py", "--datasets", "B1", "--output-d", "legacy"]\n'
    )
    out = runwatch("launch", "ab", "--dry-run", "-c", str(spec))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--output-d in the command line is an abbreviation of --output-dir" in out.stderr
    assert "write --output-dir in full" in out.stderr
    assert legacy.read_text() == '{"sample_id": 0, "text": "legacy"}\n'
    cfg = load_config(spec)
    assert (
        layout_of(cfg, cfg.run("ab"), [*cfg.run("ab").argv[:-2], "--output-dir", "x"]).problem
        is None
    )
