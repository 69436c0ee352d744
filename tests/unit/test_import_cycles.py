"""config <-> clients and hosts <-> ssh import one way (issue 24): checked at run time, beside
the import-linter contracts of pyproject.toml, and the host factory that sits above both."""

from __future__ import annotations

from supervisor.configschema import HostConfig
from supervisor.hostfactory import make_host
from supervisor.hosts import LocalHost
from tests.fresh import modules_after


def test_the_client_profiles_load_without_the_config_loader() -> None:
    loaded = modules_after("import supervisor.clients")
    assert "supervisor.configschema" in loaded
    assert "supervisor.config" not in loaded


def test_hosts_load_without_ssh() -> None:
    loaded = modules_after("import supervisor.hosts")
    assert "supervisor.hosts" in loaded
    assert {"supervisor.ssh", "supervisor.hostfactory", "asyncssh"} & loaded == set()


def test_the_host_factory_builds_a_local_host_without_ssh_and_an_ssh_host_with_it() -> None:
    loaded = modules_after(
        "from supervisor.configschema import HostConfig\n"
        "from supervisor.hostfactory import make_host\n"
        "make_host(HostConfig(name='here', local=True))"
    )
    assert "supervisor.ssh" not in loaded and "asyncssh" not in loaded
    assert isinstance(make_host(HostConfig(name="here", local=True)), LocalHost)
    from supervisor.ssh import SSHHost

    remote = make_host(HostConfig(name="gpu", address="127.0.0.1", port=2222))
    assert isinstance(remote, SSHHost) and remote.name == "gpu"
