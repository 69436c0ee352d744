"""Fixtures of the demo workload, for any test: the demo tokenizer, real mock OpenAI-compatible
servers, demo prompts and the reference client as a real process.

- ``demo_tokenizer`` (session): the tiny tokenizer directory, built once into a temporary cache.
- ``demo_cache_env`` (session): environment for subprocesses (``XDG_CACHE_HOME`` pointing at that
  cache), so ``runwatch demo`` or ``python -m supervisor.demo.server`` find the tokenizer built.
- ``mock_server``: factory ``mock_server(**knobs) -> MockServerHandle`` (knobs are
  ``supervisor.demo.server.MockSettings`` fields); each server runs in a thread on a free port,
  ``.url`` ends in ``/v1``, ``.stats()`` gives its counters; all are stopped after the test.
- ``demo_prompts``: factory ``demo_prompts(datasets=("B1",), count=50) -> Path`` writing
  ``<tmp>/prompts/<B>.jsonl``.
- ``spawn``: factory ``spawn(argv, **popen_kwargs) -> Popen`` starting a process in its own session;
  every group still alive after the test is killed.
- ``reference_client_argv(api_base, prompts_dir, output_dir, datasets, *extra)``: the argv of
  ``run_inference.py`` run as a script by the test interpreter.

Waiting on a condition: ``tests.waiting.wait_until``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from supervisor.demo.server import MockServerHandle, MockSettings, serve_in_thread
from supervisor.demo.tokenizer import ensure_demo_tokenizer

REFERENCE_CLIENT = Path(__file__).resolve().parents[1] / "supervisor" / "demo" / "run_inference.py"

T = TypeVar("T")


def reference_client_argv(
    api_base: str, prompts_dir: Path, output_dir: Path, datasets: str, *extra: str
) -> list[str]:
    """``python .../run_inference.py --datasets ... --api-base ...`` plus ``extra`` flags."""
    return [
        sys.executable,
        str(REFERENCE_CLIENT),
        "--datasets",
        datasets,
        "--prompts-dir",
        str(prompts_dir),
        "--output-dir",
        str(output_dir),
        "--api-base",
        api_base,
        "--report-seconds",
        "1",
        *extra,
    ]


@pytest.fixture(scope="session")
def demo_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ``XDG_CACHE_HOME`` holding the built demo tokenizer (``<it>/runwatch/demo-tokenizer``)."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    ensure_demo_tokenizer(cache / "runwatch")
    return cache


@pytest.fixture(scope="session")
def demo_tokenizer(demo_cache_dir: Path) -> Path:
    """The demo tokenizer directory (tokenizer.json + tokenizer_config.json)."""
    return ensure_demo_tokenizer(demo_cache_dir / "runwatch")


@pytest.fixture(scope="session")
def demo_cache_env(demo_cache_dir: Path) -> dict[str, str]:
    """``os.environ`` plus ``XDG_CACHE_HOME`` of the prebuilt tokenizer, for subprocesses."""
    return {**os.environ, "XDG_CACHE_HOME": str(demo_cache_dir)}


@pytest.fixture
def mock_server(demo_tokenizer: Path) -> Iterator[Callable[..., MockServerHandle]]:
    """Factory of real mock servers: ``mock_server(mean_tokens=100, error_429=0.5, ...)``."""
    handles: list[MockServerHandle] = []

    def start(**knobs: Any) -> MockServerHandle:
        knobs.setdefault("tokenizer", str(demo_tokenizer))
        handle = serve_in_thread(MockSettings(**knobs))
        handles.append(handle)
        return handle

    yield start
    for h in handles:
        h.stop()


@pytest.fixture
def demo_prompts(tmp_path: Path) -> Callable[..., Path]:
    """Factory writing deterministic demo prompts: ``demo_prompts(("B1", "B2"), count=50)``."""
    from supervisor.demo.prompts import write_prompts

    def write(datasets: tuple[str, ...] = ("B1",), count: int = 50) -> Path:
        directory = tmp_path / "prompts"
        write_prompts(directory, datasets, count)
        return directory

    return write


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[Any]]]:
    """Factory of real processes in their own session; leftovers are killed (whole group)."""
    procs: list[subprocess.Popen[Any]] = []

    def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(argv, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
