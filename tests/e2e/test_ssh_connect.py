"""SSH connection faults against a real sshd: S1 (unknown key), S2 (changed key), S8 (refused, DNS,
auth), the insecure flag, ~/.ssh/config aliases and ProxyJump."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.errors import HostError, HostKeyError
from supervisor.ssh import SSHHost
from tests.fixtures_sshd import SshdPool, SshdServer, free_port, key_fingerprint, keygen

pytestmark = pytest.mark.ssh


def _auth_attempted(server: SshdServer) -> bool:
    """Whether the client got as far as offering a key (sshd logs it at LogLevel VERBOSE)."""
    return bool(re.search(r"publickey|Accepted key|Failed ", server.log.read_text()))


def _by_alias(
    pool: SshdPool,
    server: SshdServer,
    entries: dict[str, dict[str, str]],
    alias: str,
    name: str | None = None,
    **overrides: Any,
) -> SSHHost:
    """An SSHHost for ``server`` known only as ``alias`` of an ssh_config holding ``entries``:
    its address, port, user and known hosts all come from that file."""
    cfg_path = pool.write_ssh_config(entries)
    return SSHHost(
        server.host_config(
            name or alias,
            address=alias,
            port=None,
            user=None,
            known_hosts=None,
            ssh_config=str(cfg_path),
            **overrides,
        )
    )


@pytest.fixture
def fresh_sshd(sshd_pool: SshdPool) -> Iterator[SshdServer]:
    server = sshd_pool.start("fresh")
    yield server
    server.stop()


async def test_s1_unknown_host_key_names_host_and_fingerprint(
    fresh_sshd: SshdServer, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = SSHHost(fresh_sshd.host_config("box-s1", known_hosts=str(empty)))
    with pytest.raises(HostKeyError) as info:
        await host.connect()
    msg = str(info.value)
    assert "box-s1" in msg and "unknown host key" in msg
    assert fresh_sshd.fingerprint in msg
    assert f"[127.0.0.1]:{fresh_sshd.port}" in msg
    assert "nothing was sent" in msg
    assert not host.connected
    assert not _auth_attempted(fresh_sshd), fresh_sshd.log.read_text()


async def test_s1_missing_known_hosts_file_is_unknown_key(
    fresh_sshd: SshdServer, tmp_path: Path
) -> None:
    host = SSHHost(fresh_sshd.host_config("box", known_hosts=str(tmp_path / "absent")))
    with pytest.raises(HostKeyError, match="unknown host key") as info:
        await host.connect()
    assert fresh_sshd.fingerprint in str(info.value)
    assert not _auth_attempted(fresh_sshd)


async def test_s2_changed_host_key_shows_both_fingerprints(
    fresh_sshd: SshdServer, tmp_path: Path
) -> None:
    old = tmp_path / "old_host_key"
    keygen(old)
    old_fp = key_fingerprint(Path(str(old) + ".pub"))
    kind, blob = Path(str(old) + ".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{fresh_sshd.port} {kind} {blob}\n")
    host = SSHHost(fresh_sshd.host_config("box-s2", known_hosts=str(kh)))
    with pytest.raises(HostKeyError) as info:
        await host.connect()
    msg = str(info.value)
    assert "HOST KEY CHANGED" in msg and "box-s2" in msg
    assert old_fp in msg and fresh_sshd.fingerprint in msg
    assert old_fp != fresh_sshd.fingerprint
    assert not _auth_attempted(fresh_sshd)


async def test_s2_key_changed_after_sshd_restart(sshd_pool: SshdPool, tmp_path: Path) -> None:
    """The same port answers with a new key after a 'reinstall': hard failure."""
    first = sshd_pool.start("reinstalled")
    kh = tmp_path / "known_hosts"
    kh.write_text(first.known_hosts_line)
    port = first.port
    first.stop()
    second = sshd_pool.start("reinstalled-2", port=port)
    try:
        host = SSHHost(second.host_config("box", known_hosts=str(kh)))
        with pytest.raises(HostKeyError, match="HOST KEY CHANGED") as info:
            await host.connect()
        assert first.fingerprint in str(info.value) and second.fingerprint in str(info.value)
    finally:
        second.stop()


async def test_s8_connection_refused_is_one_clear_line(sshd: SshdServer) -> None:
    port = free_port()
    host = SSHHost(sshd.host_config("box-refused", port=port))
    with pytest.raises(HostError) as info:
        await host.connect()
    assert not isinstance(info.value, HostKeyError)
    assert info.value.message == f"box-refused: connection refused by 127.0.0.1:{port}"
    assert host.last_error == info.value.message


async def test_s8_dns_failure(sshd: SshdServer) -> None:
    host = SSHHost(sshd.host_config("box-dns", address="no-such-host.invalid"))
    with pytest.raises(HostError) as info:
        await host.connect()
    assert info.value.message == "box-dns: cannot resolve host name 'no-such-host.invalid'"


async def test_s8_auth_failure(
    sshd: SshdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no default keys either
    stranger = tmp_path / "stranger_key"
    keygen(stranger)
    host = SSHHost(sshd.host_config("box-auth", identity_files=[str(stranger)]))
    with pytest.raises(HostError) as info:
        await host.connect()
    assert info.value.message == (
        f"box-auth: authentication failed for user {sshd.user!r} at 127.0.0.1:{sshd.port}"
    )
    assert "\n" not in info.value.message


async def test_s8_failures_are_concurrent_and_independent(sshd: SshdServer, tmp_path: Path) -> None:
    """A refused host, a DNS failure and a good host at once: each gets its own answer."""
    bad1 = SSHHost(sshd.host_config("r", port=free_port()))
    bad2 = SSHHost(sshd.host_config("d", address="nowhere.invalid"))
    kh = tmp_path / "kh"
    kh.write_text("")
    bad3 = SSHHost(sshd.host_config("k", known_hosts=str(kh)))
    results = await asyncio.gather(
        bad1.connect(), bad2.connect(), bad3.connect(), return_exceptions=True
    )
    assert [type(r).__name__ for r in results] == ["HostError", "HostError", "HostKeyError"]
    assert "refused" in str(results[0]) and "resolve" in str(results[1])


async def test_insecure_flag_warns_every_connection(
    fresh_sshd: SshdServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = SSHHost(
        fresh_sshd.host_config(
            "box-insecure", known_hosts=str(empty), insecure_skip_host_key_check=True
        )
    )
    with caplog.at_level(logging.WARNING, logger="supervisor.ssh"):
        for _ in range(2):
            await host.connect()
            assert (await host.request("ping"))["pong"] is True
            await host.close()
    err = capsys.readouterr().err
    assert err.count("box-insecure: host key NOT verified") == 2
    assert sum("NOT verified" in r.getMessage() for r in caplog.records) == 2


def test_known_hosts_none_appears_only_behind_the_flag() -> None:
    """S1: no code path turns host-key checking off except the explicit per-host flag."""
    root = Path(__file__).parents[2] / "supervisor"
    for path in root.rglob("*.py"):
        assert "known_hosts=None" not in path.read_text(), path
    source = (root / "ssh.py").read_text()
    assert source.count("known_hosts: Any = None") == 1
    assert "if cfg.insecure_skip_host_key_check:\n            known_hosts: Any = None" in source


async def test_ssh_config_alias_user_port_identity(sshd_pool: SshdPool, sshd: SshdServer) -> None:
    entries = {"gpu-alias": sshd_pool.alias_entry(sshd)}
    host = _by_alias(sshd_pool, sshd, entries, "gpu-alias", name="aliased", identity_files=[])
    try:
        hello = await host.connect()
        assert hello["user"] == sshd.user
        assert (await host.request("ping"))["pong"] is True
        assert host._target == ("127.0.0.1", sshd.port)  # HostName and Port came from the alias
    finally:
        await host.close()


async def test_ssh_config_user_known_hosts_none_does_not_disable_checks(
    sshd_pool: SshdPool, fresh_sshd: SshdServer
) -> None:
    """``UserKnownHostsFile none`` would make asyncssh skip verification; runwatch never does."""
    entry = sshd_pool.alias_entry(fresh_sshd, UserKnownHostsFile="none", StrictHostKeyChecking="no")
    host = _by_alias(sshd_pool, fresh_sshd, {"sneaky": entry}, "sneaky")
    with pytest.raises(HostKeyError, match="unknown host key"):
        await host.connect()
    assert not _auth_attempted(fresh_sshd)


async def test_proxyjump_from_ssh_config(sshd_pool: SshdPool, sshd: SshdServer) -> None:
    target = sshd_pool.start("behind-jump")
    logins_before = sshd.log.read_text().count("Accepted publickey")
    try:
        entries = {
            "jumpbox": sshd_pool.alias_entry(sshd),
            "inner": sshd_pool.alias_entry(target, ProxyJump="jumpbox"),
        }
        host = _by_alias(sshd_pool, target, entries, "inner")
        try:
            await host.connect()
            assert (await host.request("ping"))["pong"] is True
        finally:
            await host.close()
        # The jump host really carried it: one more login on it.
        assert sshd.log.read_text().count("Accepted publickey") == logins_before + 1
    finally:
        target.stop()


async def test_proxyjump_host_key_is_verified_too(
    sshd_pool: SshdPool, sshd: SshdServer, tmp_path: Path
) -> None:
    """The jump host's key is checked like any host's, even if its config entry says
    ``UserKnownHostsFile none``; nothing reaches the target."""
    target = sshd_pool.start("behind-unknown-jump")
    try:
        empty = tmp_path / "empty_known_hosts"
        empty.write_text("")
        entries = {
            "jumpbox": sshd_pool.alias_entry(sshd, UserKnownHostsFile="none"),
            "inner": sshd_pool.alias_entry(target, ProxyJump="jumpbox"),
        }
        host = _by_alias(sshd_pool, target, entries, "inner")
        with pytest.raises(HostKeyError) as info:
            await host.connect()
        msg = str(info.value)
        assert "jump host jumpbox" in msg and "unknown host key" in msg
        assert sshd.fingerprint in msg
        assert not _auth_attempted(target)
    finally:
        target.stop()


def test_parse_proxyjump_hops() -> None:
    from supervisor.ssh import _parse_hop

    assert _parse_hop("jump") == (None, "jump", None)
    assert _parse_hop("me@jump:2222") == ("me", "jump", 2222)
    assert _parse_hop("[::1]:2200") == (None, "::1", 2200)
    assert _parse_hop("a@b@host") == ("a@b", "host", None)
