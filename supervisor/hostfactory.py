"""The :class:`~supervisor.hosts.Host` for a ``[[hosts]]`` entry: this machine or SSH.

Above both ``hosts`` (the interface, ``LocalHost``) and ``ssh`` (``SSHHost``, a subclass of
``hosts.AgentHost``), so that the dependency goes one way: ``ssh`` -> ``hosts``, never back.
"""

from __future__ import annotations

from supervisor.configschema import HostConfig
from supervisor.errors import HostError
from supervisor.hosts import Host, LocalHost


def make_host(cfg: HostConfig) -> Host:
    """LocalHost for ``local = true``, else SSHHost (asyncssh is only imported then)."""
    if cfg.local:
        return LocalHost(cfg)
    try:
        from supervisor.ssh import SSHHost  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError as e:
        if e.name != "supervisor.ssh":
            raise
        raise HostError(f"{cfg.name}: SSH hosts are not supported by this build") from None
    host: Host = SSHHost(cfg)
    return host
