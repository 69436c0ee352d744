"""The typed agent client (``supervisor.agentclient``) against the agent itself: one method per op
the agent serves, its keyword arguments the keys of the op's params shape and the keys the
agent's handler reads (both derived from the agent's own dispatch table and sources), requests
through the real agent; and no request is sent anywhere else on the laptop."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor import replies
from supervisor.agent import protocol, server
from supervisor.agent.server import Agent
from supervisor.agentclient import TRANSPORT_ARGS, AgentClient

ROOT = Path(__file__).resolve().parents[2]
AGENT = Agent()


def client_methods() -> dict[str, Callable[..., Any]]:
    return {
        name: fn
        for name, fn in inspect.getmembers(AgentClient, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }


def shape_keys(shape: Any) -> tuple[set[str], set[str]]:
    """The (required, optional) keys of a params TypedDict."""
    return set(shape.__required_keys__), set(shape.__optional_keys__)


def request_args(fn: Callable[..., Any]) -> tuple[set[str], set[str]]:
    """The (required, optional) keyword arguments of a client method that go into the request."""
    required: set[str] = set()
    optional: set[str] = set()
    for name, p in inspect.signature(fn).parameters.items():
        if name == "self" or name in TRANSPORT_ARGS:
            continue
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{fn.__name__}: {name} is positional"
        (required if p.default is inspect.Parameter.empty else optional).add(name)
    return required, optional


# --------------------------------------------------------------------------- what the agent reads


def handler(op: str) -> Callable[..., Any]:
    """The function that answers ``op``, from the agent's dispatch table (``Agent.ops``; the ops
    whose module is imported at their first request from ``server._DEFERRED_OPS``)."""
    if op in server._DEFERRED_OPS:
        module, _, name = server._DEFERRED_OPS[op].partition(":")
        fn: Callable[..., Any] = getattr(
            importlib.import_module("supervisor.agent." + module), name
        )
        return fn
    fn = AGENT.ops[op]
    if isinstance(fn, types.MethodType):
        return fn.__func__
    if fn.__name__ == "<lambda>":  # ``lambda p: module.function(self, p)``
        module_name, name = fn.__code__.co_names[0], fn.__code__.co_names[-1]
        target: Callable[..., Any] = getattr(fn.__globals__[module_name], name)
        return target
    return fn


def _callee(call: ast.Call, scope: Callable[..., Any]) -> Callable[..., Any] | None:
    """The agent function a call in ``scope`` names (``f``, ``module.f``, ``self.f``)."""
    f = call.func
    found: Any = None
    if isinstance(f, ast.Name):
        found = scope.__globals__.get(f.id)
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        if f.value.id == "self":
            found = getattr(Agent, f.attr, None)
        else:
            owner = scope.__globals__.get(f.value.id)
            found = getattr(owner, f.attr, None) if isinstance(owner, types.ModuleType) else None
    if inspect.isfunction(found) and found.__module__.startswith("supervisor.agent."):
        return found
    return None


def keys_read(fn: Callable[..., Any], param: str, seen: set[Any] | None = None) -> set[str]:
    """The keys ``fn`` reads of its argument ``param`` (``params.get("k")``, ``params["k"]``,
    ``param_str(params, "k")``, ``"k" in params``), and those of the agent functions it hands
    ``params`` on to."""
    seen = set() if seen is None else seen
    if (fn, param) in seen:
        return set()
    seen.add((fn, param))
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    keys: set[str] = set()

    def is_params(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == param

    loops: dict[str, set[str]] = {}
    """``for key in ("a", "b")``: the key names a loop variable takes."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.For) or not isinstance(node.target, ast.Name):
            continue
        if isinstance(node.iter, (ast.Tuple, ast.List)):
            values = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
            loops[node.target.id] = {v for v in values if isinstance(v, str)}

    def literal(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        return loops.get(node.id, set()) if isinstance(node, ast.Name) else set()

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_params(node.value):
            keys |= literal(node.slice)
        elif isinstance(node, ast.Compare) and any(is_params(c) for c in node.comparators):
            keys |= literal(node.left)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and is_params(f.value) and f.attr == "get":
                keys |= literal(node.args[0]) if node.args else set()
                continue
            positions = [i for i, a in enumerate(node.args) if is_params(a)]
            if not positions:
                continue
            if isinstance(f, ast.Name) and f.id.startswith("param_") and len(node.args) > 1:
                keys |= literal(node.args[1])  # protocol.param_str(params, "k")
                continue
            callee = _callee(node, fn)
            if callee is None:
                continue
            names = list(inspect.signature(callee).parameters)
            on_self = isinstance(f, ast.Attribute) and ast.unparse(f.value) == "self"
            shift = 1 if on_self else 0  # the method's own ``self`` is not an argument
            for i in positions:
                if i + shift < len(names):
                    keys |= keys_read(callee, names[i + shift], seen)
    return keys


def params_name(fn: Callable[..., Any]) -> str:
    """The handler's argument that holds the request's params (``params`` by convention)."""
    names = list(inspect.signature(fn).parameters)
    assert "params" in names, f"{fn.__qualname__}: no argument named params"
    return "params"


# --------------------------------------------------------------------------- the tests


def test_one_client_method_per_op_the_agent_serves() -> None:
    served = set(AGENT.ops)
    assert served == set(protocol.OP_SHAPES)
    methods = set(client_methods())
    assert methods - served == set(), "client methods for ops the agent does not serve"
    assert served - methods == set(), "ops the agent serves without a client method"


@pytest.mark.parametrize("op", sorted(protocol.OP_SHAPES))
def test_the_method_takes_the_keys_of_the_ops_params_shape(op: str) -> None:
    required, optional = request_args(client_methods()[op])
    shape_required, shape_optional = shape_keys(protocol.OP_SHAPES[op][0])
    assert required == shape_required, f"{op}: required arguments"
    assert optional == shape_optional, f"{op}: optional arguments"
    assert not (TRANSPORT_ARGS & (shape_required | shape_optional)), op


@pytest.mark.parametrize("op", sorted(protocol.OP_SHAPES))
def test_the_agent_reads_exactly_the_keys_the_method_sends(op: str) -> None:
    fn = handler(op)
    read = keys_read(fn, params_name(fn))
    required, optional = request_args(client_methods()[op])
    assert read == required | optional, (
        f"{op}: the agent reads {sorted(read - required - optional)} the client cannot send; "
        f"the client sends {sorted(required | optional - read)} the agent never reads"
    )


def test_the_key_reader_finds_reads_through_helpers() -> None:
    """The derivation itself: ``ps`` reads its keys in a helper (``Agent._list``) and ``kill``
    through ``param_*``-free ``.get`` calls in another module; both are followed."""
    assert {"scripts", "config_id", "runs"} <= keys_read(handler("ps"), "params")
    assert {"identity", "grace", "files"} <= keys_read(handler("kill"), "params")
    assert keys_read(handler("ping"), "params") == set()


class Recorder:
    """A transport that records what the client sends (the shape check above covers the keys;
    this covers what an argument left out becomes)."""

    name = "rec"

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.sent: list[tuple[str, dict[str, Any] | None, float | None]] = []

    async def request(
        self, op: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        self.sent.append((op, params, timeout))
        return self.reply


async def test_arguments_left_out_are_left_out_of_the_request() -> None:
    rec = Recorder({"path": "/x", "exists": False, "size": 0, "lines": []})
    await AgentClient(rec).tail_log(path="/x", lines=5, timeout=3.0)
    await AgentClient(rec).tail_log(path="/y")
    assert rec.sent == [
        ("tail_log", {"path": "/x", "lines": 5}, 3.0),
        ("tail_log", {"path": "/y"}, None),
    ]


async def test_a_reply_that_does_not_fit_its_struct_names_the_op() -> None:
    from supervisor.errors import AgentError

    rec = Recorder({"held": "not a bool"})
    with pytest.raises(AgentError, match="malformed lock_status reply"):
        await AgentClient(rec).lock_status(lock_paths=["/l"])


async def test_the_client_through_the_real_agent(tmp_path: Path) -> None:
    from supervisor.config import HostConfig
    from supervisor.hosts import LocalHost

    log = tmp_path / "run.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    host = LocalHost(HostConfig(name="local", local=True))
    await host.connect()
    try:
        agent = AgentClient(host)
        assert (await agent.ping())["pong"] is True
        tail = await agent.tail_log(path=str(log), lines=3)
        assert tail["lines"] == ["line 7", "line 8", "line 9"]
        lock = await agent.lock_status(lock_paths=[str(tmp_path / "run.lock")])
        assert isinstance(lock, replies.LockStatus) and lock.held is False
        holders = await agent.file_holders(paths=[str(log)])
        assert isinstance(holders, replies.FileHolders) and holders.holders == []
        scan = await agent.scan(files=[{"path": str(log), "format": "raw"}], fresh=True)
        assert scan["files"][str(log)]["state"] == "ok"
    finally:
        await host.close()


# --------------------------------------------------------------------------- the guard


def _laptop_sources() -> Iterator[Path]:
    for top in ("supervisor", "tui"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if (ROOT / "supervisor" / "agent") not in path.parents:
                yield path


TRANSPORTS = {"hosts.py", "ssh.py", "channel.py"}
"""The transports under the client: they pass a request on (``Host.request``,
``AgentChannel.request``), never name an op."""


def stray_requests(source: str, transport: bool = False) -> list[int]:
    """Lines of ``source`` that call ``.request(...)`` (an agent request, typed or not); in a
    transport, only those that name an op (a string as the first argument)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "request"
        and (
            not transport
            or (
                bool(node.args)
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            )
        )
    ]


def test_no_request_is_sent_outside_the_client() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for path in _laptop_sources()
        if path.name != "agentclient.py"
        and (lines := stray_requests(path.read_text(), path.name in TRANSPORTS))
    }
    assert found == {}, "send agent requests through supervisor.agentclient.AgentClient"


def test_the_guard_sees_a_stray_request() -> None:
    stray = 'async def f(h):\n    await h.request(\n        "scan", {})\n'
    assert stray_requests(stray) == [2]
    assert stray_requests(stray, transport=True) == [2]
    passed_on = "async def f(self, op, params):\n    await self._channel.request(op, params)\n"
    assert stray_requests(passed_on) == [2]
    assert stray_requests(passed_on, transport=True) == []
    assert stray_requests("async def f(h):\n    await h.agent.scan(files=[])\n") == []
