"""The engine never imports the UI, and start-up never pays for transformers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
