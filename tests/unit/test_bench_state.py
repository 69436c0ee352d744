"""Benchmarks never touch the user's own state: every script under ``tests/perf/`` that runs
runwatch's code points ``XDG_STATE_HOME`` and ``XDG_CACHE_HOME`` into its temporary directory
before it starts anything (the demo's tokenizer, the history, the audit log live there)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PERF = Path(__file__).resolve().parents[1] / "perf"


def _runs_runwatch(tree: ast.Module) -> bool:
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    return any(m.split(".")[0] in ("supervisor", "tui", "demofleet", "livefleet") for m in names)


def _environ_keys_set(tree: ast.Module) -> set[str]:
    """The keys of ``os.environ[KEY] = ...`` assignments."""
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and ast.unparse(target.value) == "os.environ"
                    and isinstance(target.slice, ast.Constant)
                ):
                    keys.add(str(target.slice.value))
    return keys


@pytest.mark.parametrize("script", [*sorted(PERF.glob("bench_*.py")), PERF / "memwatch.py"])
def test_every_benchmark_keeps_runwatch_state_in_its_temp_dir(script: Path) -> None:
    tree = ast.parse(script.read_text())
    if not _runs_runwatch(tree):
        pytest.skip(f"{script.name} runs no runwatch code")
    missing = {"XDG_STATE_HOME", "XDG_CACHE_HOME"} - _environ_keys_set(tree)
    assert not missing, f"{script.name} leaves {sorted(missing)} at the user's own"
