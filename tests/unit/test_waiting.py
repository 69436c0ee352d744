"""The tests' one way to wait: a timeout bounds a hang and is lengthened on a loaded machine
(``CI=true`` or ``RUNWATCH_TEST_WAIT_SCALE``), never asserted as a speed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import fresh, waiting

ROOT = Path(__file__).resolve().parents[2]


def scale_with(env: dict[str, str]) -> float:
    """``waiting.SCALE`` in a fresh interpreter whose environment has ``env`` (and no other CI
    or scale setting)."""
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "RUNWATCH_TEST_WAIT_SCALE")}
    code = "from tests import waiting; print(waiting.SCALE)"
    return float(fresh.run(code, cwd=ROOT, env={**base, **env}, check=True).stdout)


def test_ci_lengthens_every_wait_and_the_variable_says_by_how_much() -> None:
    assert scale_with({}) == 1.0
    assert scale_with({"CI": "true"}) == 3.0
    assert scale_with({"CI": "true", "RUNWATCH_TEST_WAIT_SCALE": "5"}) == 5.0
    assert scale_with({"RUNWATCH_TEST_WAIT_SCALE": "0.1"}) == 1.0  # never shorter than written


def test_a_wait_that_times_out_names_the_scaled_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "SCALE", 2.0)
    with pytest.raises(AssertionError, match=r"timed out after 0\.1 s waiting for nothing"):
        waiting.wait_until(lambda: None, timeout=0.05, what="nothing")
    assert waiting.wait_until(lambda: "here", timeout=0.05) == "here"
