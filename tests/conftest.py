"""Shared test set-up. Each area keeps its fixtures in ``tests/fixtures_<area>.py``; they are all
loaded here as plugins so that any test can use any fixture."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = sorted(f"tests.{p.stem}" for p in Path(__file__).parent.glob("fixtures_*.py"))
