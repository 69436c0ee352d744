"""The engine never imports the UI, and start-up never pays for transformers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

import supervisor


def _modules_after(code: str) -> set[str]:
    probe = textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    import json

    return set(json.loads(out.splitlines()[-1]))


def _engine_modules() -> list[str]:
    import pkgutil

    return sorted(
        m.name
        for m in pkgutil.walk_packages(supervisor.__path__, "supervisor.")
        if not m.name.endswith("__main__")
    )


@pytest.mark.parametrize("module", _engine_modules())
def test_engine_module_never_imports_the_ui(module: str) -> None:
    loaded = _modules_after(f"import {module}")
    assert module in loaded
    ui = sorted(m for m in loaded if m == "textual" or m.startswith(("textual.", "tui")))
    assert ui == [], f"{module} pulled in {ui[:5]}"


def test_cli_start_up_does_not_import_heavy_libraries() -> None:
    loaded = _modules_after("import supervisor.cli")
    heavy = {"transformers", "textual", "asyncssh", "httpx", "torch", "uvicorn"} & loaded
    assert heavy == set()
    # Each command's module is imported when that command runs (supervisor.cli.LazyGroup).
    assert {m for m in loaded if m.startswith("supervisor.cli.")} == {"supervisor.cli._common"}


def test_the_engine_loads_what_a_refresh_does_not_need_on_first_use() -> None:
    loaded = _modules_after("import supervisor.engine")
    later = {
        "supervisor.agent.scan",
        "supervisor.alerts",
        "supervisor.bench.runner",
        "supervisor.compare",
        "supervisor.guard",
        "supervisor.plan",
        "supervisor.samples",
        "supervisor.slurm",
        "supervisor.steps",
        "supervisor.tokens",
        "supervisor.watch",
        "apprise",
        "httpx",
        "asyncssh",
        "prometheus_client",
    }
    assert later & loaded == set()
    # Every name the front door exports is there, lazily loaded or not.
    probe = """
    import supervisor.engine as engine
    from supervisor.bench.runner import Options
    from supervisor.slurm import describe
    missing = [n for n in engine.__all__ if getattr(engine, n, None) is None]
    assert missing == [], missing
    assert engine.BenchOptions is Options and engine.describe_job is describe
    try:
        engine.no_such_name
    except AttributeError:
        pass
    else:
        raise AssertionError("an unknown name resolved")
    """
    _modules_after(probe)


def _contracts() -> dict[str, dict[str, Any]]:
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def test_the_front_door_contract_forbids_every_engine_internal() -> None:
    contract = _contracts()["The front ends use the engine only through its front door"]
    assert contract["source_modules"] == ["tui", "supervisor.cli"]
    forbidden = set(contract["forbidden_modules"])
    allowed = {"engine", "model", "config", "errors", "display", "secrets", "demo", "cli"}
    internals = {m.split(".")[1] for m in _engine_modules()} - allowed
    missing = {f"supervisor.{m}" for m in internals} - forbidden
    assert missing == set(), f"engine modules the front ends could import: {sorted(missing)}"


def test_the_import_contracts_pass() -> None:
    import shutil
    from pathlib import Path

    assert "The engine never imports the UI" in _contracts()
    root = Path(__file__).resolve().parents[2]
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([exe], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout
