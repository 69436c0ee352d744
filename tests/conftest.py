"""Shared test set-up. Each area keeps its fixtures in ``tests/fixtures_<area>.py``; they are all
loaded here as plugins so that any test can use any fixture."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import properties

# Started from a background job of a shell (`make test &`), the test processes inherit SIGINT and
# SIGQUIT ignored, and so would every process a test starts and then interrupts, as a user's
# Ctrl-C does: their default dispositions are put back (a handler is reset to the default in
# the children at exec; an ignored signal stays ignored).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

pytest_plugins = sorted(f"tests.{p.stem}" for p in Path(__file__).parent.glob("fixtures_*.py"))

UNIT = Path(__file__).parent / "unit"

properties.load()  # the hypothesis profile: bounded examples unless HYPOTHESIS_PROFILE=long


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tier is the directory: a test under ``tests/unit/`` is marked ``unit``, every other one
    ``e2e`` (``-m unit`` / ``-m e2e`` select one tier) unless it says its tier itself."""
    for item in items:
        if item.get_closest_marker("unit") or item.get_closest_marker("e2e"):
            continue
        item.add_marker(pytest.mark.unit if item.path.is_relative_to(UNIT) else pytest.mark.e2e)


@pytest.fixture(scope="session")
def _test_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory per test process (the demo's tokenizer, built once per process)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _private_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, _test_cache_dir: Path
) -> None:
    """runwatch's state (audit log, launch specs, guard markers, bench history) goes to a private
    directory in every test, its cache to the test process's: a test never reads or writes the
    user's. ``state_home`` and tests that need their own still set theirs."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.setenv("XDG_CACHE_HOME", str(_test_cache_dir))


@pytest.fixture(autouse=True)
def _own_secret_registry() -> Iterator[None]:
    """The secrets a test registers in this process (values, their encodings, profiles' secret
    flags) are forgotten after it: one test's config never masks another's output."""
    from supervisor.agent import masking

    saved = (
        set(masking._REGISTERED),
        list(masking._SORTED),
        set(masking._BASE64),
        set(masking._PROFILE_FLAGS),
    )
    yield
    masking._REGISTERED.clear()
    masking._REGISTERED.update(saved[0])
    masking._SORTED[:] = saved[1]
    masking._BASE64.clear()
    masking._BASE64.update(saved[2])
    masking._PROFILE_FLAGS.clear()
    masking._PROFILE_FLAGS.update(saved[3])
    masking._is_secret_name.cache_clear()
