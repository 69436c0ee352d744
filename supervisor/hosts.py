"""Hosts: one interface for this machine and for SSH hosts, both talking to the same agent.

The agent (the stdlib-only package ``supervisor/agent/``) is started by a constant command,
:func:`bootstrap_argv`, that reads the interpreter path as the first line of its stdin and then
the agent itself as a length-prefixed blob (:func:`bundle_payload`). No value from the config
or from the host ever becomes shell text: the python path is read by ``read -r`` into a variable
and used quoted; everything else is data on stdin.

``LocalHost`` runs that command as a local subprocess; ``supervisor.ssh.SSHHost`` runs it over an
SSH channel. Both subclass :class:`AgentHost`, which owns the channel, the hello and reconnection
on demand.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import shlex
import sys
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from supervisor.agent.protocol import AGENT_LOADER, PsParams, RunSpec
from supervisor.agentclient import AgentClient
from supervisor.channel import AgentChannel, LineReader, LineWriter
from supervisor.errors import ConfigError, HostError, RunwatchError
from supervisor.model import Backend, ProcessInfo

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from supervisor.config import Config, HostConfig

AGENT_PACKAGE = "supervisor.agent"
"""The package shipped to the host: every ``*.py`` file of ``supervisor/agent/``."""
_BUNDLE_PACKAGES = ("supervisor", AGENT_PACKAGE)

# Python inside the bootstrap: no quote, ``$``, backslash, backtick or ``!`` (csh history), so the
# command reads the same under sh, bash, dash, zsh, csh and fish login shells.
_LOADER = AGENT_LOADER
_BOOTSTRAP_SCRIPT = 'IFS= read -r py; exec "$py" -c "' + _LOADER + '"'

_STAGE2 = """\
import sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]  # never import from the login directory
import importlib.util

_SOURCES = %s
_PACKAGES = %s


class _BundleFinder:  # a meta path finder and loader (importlib.abc would cost its own imports)
    def find_spec(self, name, path=None, target=None):
        if name in _SOURCES:
            return importlib.util.spec_from_loader(name, self, is_package=name in _PACKAGES)
        return None

    def create_module(self, spec):
        return None

    def get_source(self, name):  # the waiter is started from its source (agent/unit.py)
        return _SOURCES[name]

    def exec_module(self, module):
        name = module.__name__
        code = compile(_SOURCES[name], "<runwatch>/" + name.replace(".", "/") + ".py", "exec")
        exec(code, module.__dict__)


sys.meta_path.insert(0, _BundleFinder())
import supervisor.agent.firstpass

# The files to count at once, while the rest of the agent is compiled and imported.
supervisor.agent.firstpass.start_early(sys.stdin.buffer.readline())
import supervisor.agent.server

supervisor.agent.server.main()
"""


def bootstrap_argv() -> list[str]:
    """The constant command that starts the agent on a host (the same for every host)."""
    return ["sh", "-c", _BOOTSTRAP_SCRIPT]


def bootstrap_command() -> str:
    """:func:`bootstrap_argv` as one string for an SSH exec request (constant, quoted once)."""
    return shlex.join(bootstrap_argv())


def bundle_sources() -> dict[str, str]:
    """Dotted module name -> source of every module of the bundle: the ``supervisor.agent``
    package (its ``__init__`` and every other ``*.py`` file) under an empty ``supervisor``."""
    package = Path(__file__).parent / "agent"
    sources = {"supervisor": '"""runwatch agent bundle."""\n'}
    for path in sorted(package.glob("*.py")):
        name = AGENT_PACKAGE if path.stem == "__init__" else f"{AGENT_PACKAGE}.{path.stem}"
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def bundle_payload(python: str, count: Sequence[str] = ()) -> bytes:
    """Everything to write to the bootstrap's stdin before the first request.

    The interpreter path (one line), then the length of the agent bundle and the bundle itself,
    then one JSON line ``{"count": [...]}``: the data files whose lines the agent starts counting
    as soon as it runs, before it imports the rest of itself (``firstpass.start_early``), for the
    provisional counts of the first refresh.
    """
    if not python or any(c in python for c in "\n\r\0"):
        raise ConfigError(
            f"python: not an interpreter path: {python!r}",
            "set hosts[].python to the path or name of Python >= 3.8 on the host",
        )
    stage2 = (_STAGE2 % (repr(bundle_sources()), repr(_BUNDLE_PACKAGES))).encode("utf-8")
    early = json.dumps({"count": list(count)}).encode("utf-8") + b"\n"
    return python.encode("utf-8") + b"\n" + str(len(stage2)).encode() + b"\n" + stage2 + early


# --------------------------------------------------------------------------- the interface


@runtime_checkable
class Host(Protocol):
    """A machine runwatch watches, reached through its agent (LocalHost, SSHHost)."""

    name: str
    cfg: HostConfig
    hello: dict[str, Any] | None
    """The agent's hello (boot_id, python, has_psutil, uid, user...) once connected."""

    @property
    def connected(self) -> bool:
        """True while the agent channel is up."""
        ...

    async def connect(self) -> dict[str, Any]:
        """Start the agent (if not running) and return its hello."""
        ...

    async def request(
        self, op: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """One agent request. Raises HostError, AgentError or OutcomeUnknown."""
        ...

    async def close(self) -> None:
        """Stop the agent and drop the connection."""
        ...


class AgentHost(abc.ABC):
    """A host whose transport carries the bootstrap command's stdin/stdout.

    Subclasses implement :meth:`_open_transport` (start ``bootstrap_argv()`` and return its
    stdout reader, stdin writer and a diagnostics callable) and :meth:`_close_transport`.
    ``request`` connects on demand, so a host that dropped reconnects at its next request.
    """

    def __init__(self, cfg: HostConfig, python: str | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.python = python or cfg.python
        self.hello: dict[str, Any] | None = None
        self.count_first: list[str] = []
        """Data files the next agent start counts the lines of at once (see ``bundle_payload``);
        emptied by that start."""
        self._channel: AgentChannel | None = None
        self._connect_lock: asyncio.Lock | None = None

    @abc.abstractmethod
    async def _open_transport(self) -> tuple[LineReader, LineWriter, Callable[[], str]]:
        """Start the bootstrap command; return (stdout reader, stdin writer, diagnostics)."""

    @abc.abstractmethod
    async def _close_transport(self) -> None:
        """Close stdin (the agent then exits) and release the transport."""

    def _hello_timeout(self) -> float:
        return self.cfg.connect_timeout + self.cfg.command_timeout

    @property
    def connected(self) -> bool:
        return self._channel is not None and self._channel.connected

    async def __aenter__(self) -> AgentHost:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> dict[str, Any]:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._channel is not None and self._channel.connected and self.hello is not None:
                return self.hello
            await self._drop()
            reader, writer, diag = await self._open_transport()
            channel = AgentChannel(reader, writer, name=self.name, diagnostics=diag)
            try:
                count, self.count_first = self.count_first, []
                writer.write(bundle_payload(self.python, count))
                await writer.drain()
                hello = await channel.start(self._hello_timeout())
            except RunwatchError:
                await channel.close()
                await self._close_transport()
                raise
            except Exception as e:  # OSError, or the transport's own (asyncssh.ConnectionLost...)
                await channel.close()
                await self._close_transport()
                raise HostError(f"{self.name}: could not start the agent: {e}", diag()) from None
            except BaseException:
                await channel.close()
                await self._close_transport()
                raise
            self._channel = channel
            self.hello = hello
            return hello

    async def request(
        self,
        op: str,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        if not self.connected:
            await self.connect()
        assert self._channel is not None
        bound = self.cfg.command_timeout if timeout is None else timeout
        return await self._channel.request(op, params, bound, on_progress)

    async def _drop(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            await self._close_transport()

    async def close(self) -> None:
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._channel is not None:
                await self._channel.close()
                self._channel = None
            await self._close_transport()


class LocalHost(AgentHost):
    """This machine: the agent runs as a local subprocess of the same bootstrap command.

    The interpreter is ``cfg.python`` unless that is left at its default (``python3``), in which
    case it is this Python (``sys.executable``). ``env`` replaces the agent's environment.
    """

    CLOSE_TIMEOUT = 15.0
    """Seconds ``close`` waits for the agent to finish an in-flight kill before killing it."""

    def __init__(
        self,
        cfg: HostConfig,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        argv: list[str] | None = None,
    ) -> None:
        if python is None and cfg.python == "python3":
            python = sys.executable
        super().__init__(cfg, python)
        self._env = dict(env) if env is not None else None
        self._argv = argv or bootstrap_argv()
        self.proc: asyncio.subprocess.Process | None = None
        self._stderr: deque[bytes] = deque(maxlen=64)
        self._stderr_task: asyncio.Task[None] | None = None

    async def _open_transport(self) -> tuple[LineReader, LineWriter, Callable[[], str]]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                limit=1 << 28,  # a refresh reply is one line; it may be large
                start_new_session=True,  # a Ctrl-C in the terminal is not the agent's to handle
            )
        except OSError as e:
            raise HostError(f"{self.name}: cannot start the agent: {e}") from None
        self.proc = proc
        self._stderr.clear()
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        self._stderr_task = asyncio.get_running_loop().create_task(self._drain_stderr(proc))
        return proc.stdout, proc.stdin, self._stderr_text

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while True:
            chunk = await proc.stderr.read(4096)
            if not chunk:
                return
            self._stderr.append(chunk)

    def _stderr_text(self) -> str:
        text = b"".join(self._stderr).decode("utf-8", "replace").strip()
        return ("agent stderr: " + text[-1500:]) if text else ""

    async def _close_transport(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
            with contextlib.suppress(ConnectionError, OSError):
                await proc.stdin.wait_closed()
        try:
            await asyncio.wait_for(proc.wait(), self.CLOSE_TIMEOUT)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._stderr_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._stderr_task, 1.0)
            self._stderr_task = None

    @property
    def agent_pid(self) -> int | None:
        """The pid of the agent process while it runs."""
        return self.proc.pid if self.proc is not None else None


# --------------------------------------------------------------------------- processes


def process_infos(result: Mapping[str, Any]) -> list[ProcessInfo]:
    """The ``processes`` of a ``ps``/``refresh`` reply as model structs."""
    try:
        return msgspec.convert(result.get("processes") or [], list[ProcessInfo], strict=False)
    except msgspec.ValidationError as e:
        raise HostError(f"the agent sent a malformed process list: {e}") from None


def ps_params(config: Config, cfg: HostConfig) -> PsParams:
    """Parameters of the ``ps`` op for a host of ``config`` (the scripts of every client profile,
    and the profiles' flag spellings the host reads each run's flags with)."""
    from supervisor.clients import all_scripts, wire_all
    from supervisor.secrets import script_secret_flags, secret_flags

    return {
        "scripts": all_scripts(config),
        "clients": wire_all(config),
        "show_other_users": cfg.show_other_users,
        "runs": run_specs(config, cfg.name),
        "secret_env": secret_env_names(config),
        "secret_flags": secret_flags(config),
        "script_secret_flags": script_secret_flags(config),
        "config_id": config.key,
    }


async def list_processes(host: Host, config: Config, pids: Sequence[int] = ()) -> list[ProcessInfo]:
    """The runs on ``host``, each matched to the config run it is (``run``) when one fits;
    ``pids`` (named by the user) listed too whatever their argv, tied to a run by evidence."""
    params = ps_params(config, host.cfg)
    if pids:
        params["pids"] = list(pids)
    result = await AgentClient(host).ps(**params)
    found = process_infos(result)
    assign_runs(found, config, host.name)
    found = own_only(found, host.cfg)
    for p in found:
        set_backend(p, config)
    return found


def own_only(procs: list[ProcessInfo], hc: HostConfig) -> list[ProcessInfo]:
    """``procs`` (runs assigned, :func:`assign_runs`) as the host's config lets it see them:
    with ``only_own_runs``, only the members of this config's units (``UnitRef.mine``) and the
    processes matched to one of its runs without being another config's unit."""
    if not hc.only_own_runs:
        return procs
    return [p for p in procs if (p.unit.mine if p.unit is not None else p.run is not None)]


def set_backend(proc: ProcessInfo, config: Config) -> None:
    """Correct ``flags.backend`` from the config, which knows better than the URL's host.

    The host guesses from ``--api-base`` (loopback and private addresses are ``local``); an API
    reached through a local proxy or tunnel is still an API. Call after ``proc.run`` is matched:
    the endpoint named by its config run decides; for a process of no config run (or of a run
    naming no endpoint), a configured endpoint whose ``base_url`` is its ``--api-base``; else the
    host's guess stands.
    """
    kind = run_backend(config, proc.run) if proc.run is not None else None
    if kind is None:
        base = (proc.flags.api_base or "").rstrip("/")
        ep = next((e for e in config.endpoints if base and e.base_url.rstrip("/") == base), None)
        kind = ep.kind if ep is not None else None
    if kind is not None:
        proc.flags.backend = kind


def run_backend(config: Config, run_name: str) -> Backend | None:
    """``local``/``api``: the ``kind`` of the endpoint config run ``run_name`` names, else None."""
    run = next((r for r in config.runs if r.name == run_name), None)
    if run is None or run.endpoint is None:
        return None
    ep = next((e for e in config.endpoints if e.name == run.endpoint), None)
    return ep.kind if ep is not None else None


STRONG_EVIDENCE = frozenset(("argv", "fd", "place"))
"""Evidence that makes a process a run: its data paths, descriptors on (or mappings of) the
run's files, its working directory or root in the directory of one (by identity)."""


def secret_env_names(config: Config) -> list[str]:
    """``secrets.secret_env_names``: the key variables whose values the host masks."""
    from supervisor.secrets import secret_env_names as names

    return names(config)


def run_specs(config: Config, host_name: str) -> list[RunSpec]:
    """The ``runs`` parameter of a listing: each run of the host with its places as its layout
    resolves them from the argv it launches with (the host expands the workdir's ``~``, see
    ``supervisor.agent.match.RunFiles``)."""
    from supervisor.launchspec import launch_argv
    from supervisor.layout import layout_of

    specs = []
    for run in config.runs:
        if run.host != host_name:
            continue
        layout = layout_of(config, run, launch_argv(config, run))
        spec: RunSpec = {
            "name": run.name,
            "workdir": run.workdir,
            "data_file": run.data_file,
            "locks": list(layout.locks),
            "files": list(layout.data_files.values()),
        }
        if layout.problem is None:
            spec["out"] = layout.out
        if not layout.profiled and run.output_dir is not None:
            spec["output_dir"] = run.output_dir
        specs.append(spec)
    return specs


def run_files(config: Config, run_name: str | None) -> list[str]:
    """The data files and locks of config run ``run_name`` as paths of its host (``~`` left for
    the host to expand); empty for None or an unknown run. A kill passes them, so that whatever
    still holds them once the run is stopped is stopped too."""
    from supervisor.launchspec import launch_argv
    from supervisor.layout import layout_of

    run = next((r for r in config.runs if r.name == run_name), None)
    if run is None:
        return []
    layout = layout_of(config, run, launch_argv(config, run))
    return [*layout.data_files.values(), *layout.locks]


def _strength(proc: ProcessInfo, run_name: str, config: Config) -> int:
    why = set(proc.evidence.get(run_name, ()))
    if "unit" in why:  # runwatch launched it as this run: ownership, not inference
        return 8
    if proc.unit is not None:
        if proc.unit.mine and any(r.name == proc.unit.run for r in config.runs):
            # This config's unit of another of its runs (two runs that share data files, as a
            # rebalance moves datasets between): it is that run, and this one is not running.
            return 0
        # Another config's launch, or this config's under a run name it no longer has, is
        # never this run to act on; started on this run's data files (by identity) it is what
        # writes them.
        return 6 if "files" in why else 0
    return 2 * bool(why & {"fd", "place"}) + ("argv" in why) if why & STRONG_EVIDENCE else 0


def match_run(proc: ProcessInfo, config: Config, host_name: str) -> str | None:
    """The name of the config run ``proc`` could be, or None. The one rule of every front end.

    A process is a run only on evidence the host found that a neighbour cannot fake
    (``evidence``, see ``supervisor.agent.match.run_evidence``): its argv's data paths resolve to
    the run's files, or it holds the run's data files or lock open. Its working directory alone
    never makes it the run. When it could be several runs, the one with the strongest evidence
    (descriptors, then argv), then the first in the config. Whether another process could be the
    same run is
    :func:`assign_runs`'s question.
    """
    best: tuple[int, str] | None = None
    for run in config.runs:
        if run.host != host_name:
            continue
        score = _strength(proc, run.name, config)
        if score and (best is None or score > best[0]):
            best = (score, run.name)
    return best[1] if best else None


def assign_runs(
    procs: list[ProcessInfo], config: Config, host_name: str
) -> dict[str, list[ProcessInfo]]:
    """Set ``run`` of every process (:func:`match_run`) and return, per config run, every
    process with evidence of being it. More than one makes the run ambiguous: every name-based
    action refuses until a pid is named."""
    found: dict[str, list[ProcessInfo]] = {}
    for p in procs:
        p.run = match_run(p, config, host_name)
        for run in config.runs:
            if run.host == host_name and _strength(p, run.name, config):
                found.setdefault(run.name, []).append(p)
    for name, cands in found.items():
        # A run held in a unit is that unit (its own, else one started on its files); a process
        # that only looks like it (same argv, same files) is another writer for the gate to
        # refuse, not a second candidate.
        top = max(_strength(p, name, config) for p in cands)
        held = [p for p in cands if top >= 6 and _strength(p, name, config) == top]
        if held:
            found[name] = held
            for p in cands:
                if p not in held and p.run == name:
                    p.run = None
    return found
