"""``runwatch tui`` on the command line: help, config errors, and no UI import at start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _runwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_tui_help_names_its_options() -> None:
    out = _runwatch("tui", "--help")
    assert out.returncode == 0, out.stderr
    assert "--refresh" in out.stdout and "--config" in out.stdout


def test_tui_with_a_missing_config_is_one_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    out = _runwatch("tui", "-c", str(missing))
    assert out.returncode == 2
    assert f"{missing}: no such config file" in out.stderr
    assert "Traceback" not in out.stderr


def test_tui_rejects_a_refresh_faster_than_the_floor() -> None:
    out = _runwatch("tui", "--refresh", "0.01")
    assert out.returncode == 2
    assert "--refresh" in out.stderr


def test_the_console_script_does_not_import_textual_at_start_up() -> None:
    probe = (
        "import sys, tui.cli; print(any(m.startswith(('tui.app', 'textual')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
