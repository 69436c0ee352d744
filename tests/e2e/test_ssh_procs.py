"""The process-listing and kill tests of ``test_processes`` and ``test_kill``, run again over a real
sshd: the same agent, reached through ``SSHHost`` instead of ``LocalHost``."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from supervisor.ssh import SSHHost
from tests.e2e import test_kill, test_processes

pytestmark = pytest.mark.ssh


@pytest.fixture
async def host(ssh_host_cfg: Any) -> AsyncIterator[SSHHost]:
    """Overrides the LocalHost ``host`` fixture: a connected SSHHost on the session's sshd."""
    h = SSHHost(ssh_host_cfg)
    await h.connect()
    try:
        yield h
    finally:
        await h.close()


def _tests_using_host(module: Any) -> dict[str, Any]:
    return {
        name: fn
        for name, fn in vars(module).items()
        if name.startswith("test_") and callable(fn) and "host" in inspect.signature(fn).parameters
    }


for _module in (test_processes, test_kill):
    globals().update(_tests_using_host(_module))
