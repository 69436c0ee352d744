"""Every test keeps runwatch's state (the engine's rate history, audit, bench history) in a
private directory, never the user's: ``XDG_STATE_HOME`` points into the test's own temporary
directories unless the test sets its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _private_state(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
    yield
