"""The engine never imports the UI, and start-up never pays for transformers."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import supervisor
from tests import fresh


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after ``code`` (a fork of one server per test
    process, not an interpreter per module: ``tests/fresh.py``)."""
    return fresh.modules_after(textwrap.dedent(code))


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
    # The watcher and its exporter are front ends themselves (``runwatch watch`` runs them).
    allowed = {"engine", "model", "config", "errors", "display", "secrets", "demo", "cli"}
    allowed |= {"watch", "exporter"}
    internals = {m.split(".")[1] for m in _engine_modules()} - allowed
    missing = {f"supervisor.{m}" for m in internals} - forbidden
    assert missing == set(), f"engine modules the front ends could import: {sorted(missing)}"


def test_the_layers_contract_places_every_module() -> None:
    """Every module of the engine is in one layer, the front door alone in its own: a new
    module is placed (and checked) the day it is added."""
    contract = _contracts()[
        "Layers: front ends, the engine, services, backends, foundation, the agent"
    ]
    layers = [{m.strip() for m in layer.split(":")} for layer in contract["layers"]]
    placed = [m for layer in layers for m in layer]
    assert len(placed) == len(set(placed)), "a module is in two layers"
    assert layers[1] == {"supervisor.engine"}
    tops = {".".join(m.split(".")[:2]) for m in _engine_modules()} - {"supervisor.__init__"}
    missing = tops - set(placed)
    assert missing == set(), f"modules in no layer: {sorted(missing)}"
    assert "tui" in layers[0] and layers[-1] == {"supervisor.agent"}


def test_the_import_contracts_pass() -> None:
    import shutil
    from pathlib import Path

    assert "The engine never imports the UI" in _contracts()
    assert {c["type"] for c in _contracts().values()} >= {"layers", "acyclic_siblings"}
    root = Path(__file__).resolve().parents[2]
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([exe], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout


def test_the_architecture_map_names_every_module() -> None:
    """``ARCHITECTURE.md`` names every module and package of the engine (a line per module, in
    its layer's section): the map stays true when a module is added or moved."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`(?:supervisor/)?([a-z_]+)(?:\.py|/)`", text))
    package = root / "supervisor"
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}
    packages = {p.parent.name for p in package.glob("*/__init__.py")}
    missing = (modules | packages) - named
    assert missing == set(), f"modules ARCHITECTURE.md does not name: {sorted(missing)}"


def test_the_supervision_loop_is_written_once() -> None:
    """Refresh, budget policy and events are ``Engine.tick`` (``supervisor.supervision``): no
    front end, and no other module, applies the policy or tracks events of its own."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    own = {"supervisor/engine.py", "supervisor/supervision.py", "supervisor/guard.py"}
    own |= {"supervisor/events.py", "supervisor/stops.py"}  # where they are defined
    loops = re.compile(r"\.enforce_budget\(|\bEventTracker\(|\bStopLedger\(|\.enforce\(")
    found = [
        f"{path.relative_to(root)}:{n}"
        for top in ("supervisor", "tui")
        for path in sorted((root / top).rglob("*.py"))
        if str(path.relative_to(root)) not in own
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if loops.search(line)
    ]
    assert found == [], f"a supervision loop outside Engine.tick: {found}"
