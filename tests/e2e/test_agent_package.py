"""The host-side package: it loads with nothing but the standard library (on the oldest Python it
supports too), the import contract names every laptop module, every op has a request and reply
shape in ``protocol``, and the real agent's replies fit those shapes and the laptop's Structs."""

from __future__ import annotations

import glob
import json
import os
import pkgutil
import random
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

import msgspec
import pytest

import supervisor
from supervisor import replies
from supervisor.agent import protocol
from supervisor.agent.server import Agent
from supervisor.hosts import Host, bundle_sources
from tests.fixtures_data import dump, raw_record
from tests.fixtures_procs import FakeRuns

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- standard library only

# Loads the bundle from its text exactly as the host's stage-2 loader does, imports every module
# of it, and prints the modules that importing them added.
_LOAD_ALL = r"""
import importlib.abc, importlib.util, json, sys
sources = json.loads(sys.stdin.read())

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in sources:
            return importlib.util.spec_from_loader(
                name, self, is_package=name in ("supervisor", "supervisor.agent"))
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(compile(sources[module.__name__], module.__name__, "exec"), module.__dict__)

sys.meta_path.insert(0, Finder())
before = set(sys.modules)
for name in sorted(sources):
    importlib.import_module(name)
proc = sys.modules["supervisor.agent.proc"]
print(json.dumps({"added": sorted(set(sys.modules) - before), "psutil": proc.HAS_PSUTIL}))
"""


def _python38() -> str | None:
    """A real Python 3.8 binary (not a pyenv shim, which needs a version file to resolve)."""
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    return found[0] if found else None


@pytest.mark.parametrize("python", ["current", "3.8"])
def test_every_agent_module_loads_with_only_the_standard_library(python: str) -> None:
    exe = sys.executable if python == "current" else _python38()
    if exe is None:
        pytest.skip("no Python 3.8 interpreter on this machine (pyenv 3.8.x)")
    sources = bundle_sources()
    package = {p.stem for p in (ROOT / "supervisor" / "agent").glob("*.py")}
    assert {n.rpartition(".")[2] for n in sources if n.startswith("supervisor.agent.")} | {
        "__init__"
    } == package
    # -I -S: no site-packages, no user site, no PYTHONPATH, not even the current directory.
    done = subprocess.run(
        [exe, "-I", "-S", "-c", _LOAD_ALL],
        input=json.dumps(sources),
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(sources) <= set(out["added"])
    foreign = [
        m
        for m in out["added"]
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "supervisor"
    ]
    assert foreign == []
    assert out["psutil"] is False  # optional: absent here, and the agent still loads


_START_ONLY = r"""
import importlib.util, json, sys
sources = json.loads(sys.stdin.read())

class Finder:
    def find_spec(self, name, path=None, target=None):
        if name in sources:
            return importlib.util.spec_from_loader(
                name, self, is_package=name in ("supervisor", "supervisor.agent"))
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(compile(sources[module.__name__], module.__name__, "exec"), module.__dict__)

sys.meta_path.insert(0, Finder())
from supervisor.agent.server import Agent
agent = Agent()
hello = agent.hello()
agent.ops["refresh"]({"files": []})
loaded = sorted(m for m in sys.modules if m.startswith("supervisor.agent."))
agent.ops["tail_log"]({"path": "/nonexistent/run.log"})
print(json.dumps({"loaded": loaded, "ops": hello["ops"],
                  "after": "supervisor.agent.datafiles" in sys.modules}))
"""


def test_the_agent_starts_and_refreshes_without_the_modules_of_other_ops() -> None:
    """The hello and a refresh import neither launch, data-file repairs, metrics nor Slurm (the
    agent compiles each module it imports from source on every start); an op of theirs imports
    its module at its first request."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _START_ONLY],
        input=json.dumps(bundle_sources()),
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    deferred = {f"supervisor.agent.{m}" for m in ("launch", "datafiles", "metrics", "slurm")}
    assert deferred.isdisjoint(out["loaded"]), out["loaded"]
    assert "supervisor.agent.scan" in out["loaded"]
    assert sorted(out["ops"]) == sorted(protocol.OP_SHAPES)
    assert out["after"] is True


def test_the_import_contract_names_every_laptop_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c.get("source_modules") == ["supervisor.agent"]]
    laptop = {
        f"supervisor.{m.name}"
        for m in pkgutil.iter_modules(supervisor.__path__)
        if m.name != "agent"
    }
    forbidden = set(contract["forbidden_modules"])
    assert laptop <= forbidden, sorted(laptop - forbidden)
    assert {"msgspec", "asyncssh", "textual", "httpx", "tui", "psutil"} <= forbidden
    assert contract["ignore_imports"] == ["supervisor.agent.proc -> psutil"]


# --------------------------------------------------------------------------- shapes


def test_every_op_has_a_typed_request_and_reply() -> None:
    ops = Agent().ops
    assert set(ops) == set(protocol.OP_SHAPES)
    for op, (params, result) in protocol.OP_SHAPES.items():
        assert is_typeddict(params), op
        assert is_typeddict(result), op
        get_type_hints(params)  # every annotation resolves (no name missing from protocol)
        get_type_hints(result)


def _misfit(value: Any, tp: Any, where: str) -> str | None:
    """Why ``value`` does not have the shape ``tp`` (None when it does)."""
    origin = get_origin(tp)
    if tp is Any:
        return None
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return f"{where}: {type(value).__name__}, not a {tp.__name__}"
        hints = get_type_hints(tp)
        missing = set(tp.__required_keys__) - set(value)
        extra = set(value) - set(hints)
        if missing or extra:
            return f"{where}: {tp.__name__} missing {sorted(missing)}, unknown {sorted(extra)}"
        for k, v in value.items():
            why = _misfit(v, hints[k], f"{where}.{k}")
            if why:
                return why
        return None
    if origin in (Union, types.UnionType):
        whys = [_misfit(value, arg, where) for arg in get_args(tp)]
        return None if any(w is None for w in whys) else " / ".join(str(w) for w in whys)
    if origin is list:
        if not isinstance(value, list):
            return f"{where}: {type(value).__name__}, not a list"
        return next(
            (w for i, v in enumerate(value) if (w := _misfit(v, get_args(tp)[0], f"{where}[{i}]"))),
            None,
        )
    if origin is dict:
        if not isinstance(value, dict):
            return f"{where}: {type(value).__name__}, not a dict"
        return next(
            (w for k, v in value.items() if (w := _misfit(v, get_args(tp)[1], f"{where}[{k}]"))),
            None,
        )
    if tp is type(None):
        return None if value is None else f"{where}: {value!r} is not None"
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"{where}: {value!r} is not a number"
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"{where}: {value!r} is not an int"
    return None if isinstance(value, tp) else f"{where}: {value!r} is not a {tp.__name__}"


def _fits(op: str, result: Any) -> None:
    why = _misfit(result, protocol.OP_SHAPES[op][1], op)
    assert why is None, why


def test_the_shape_checker_rejects_what_does_not_fit() -> None:
    ok = {"state": "gone", "alive": False, "children": [], "detail": "x"}
    assert _misfit(ok, protocol.ProbeResult, "probe") is None
    missing = _misfit({k: v for k, v in ok.items() if k != "detail"}, protocol.ProbeResult, "p")
    assert missing is not None and "missing ['detail']" in missing
    assert _misfit({**ok, "detail": None}, protocol.ProbeResult, "p")
    assert _misfit({**ok, "extra": 1}, protocol.ProbeResult, "p")
    assert _misfit({**ok, "children": ["1"]}, protocol.ProbeResult, "p")
    assert _misfit({**ok, "alive": "no"}, protocol.ProbeResult, "p")


@pytest.mark.parametrize(
    ("struct", "shape"),
    [
        (replies.Hello, protocol.Hello),
        (replies.Processes, protocol.PsResult),
        (replies.KillExit, protocol.KillExit),
        (replies.KillTarget, protocol.KillTarget),
        (replies.Kill, protocol.KillResult),
        (replies.Probe, protocol.ProbeResult),
        (replies.LockState, protocol.LockState),
        (replies.LockStatus, protocol.LockStatusResult),
        (replies.Launch, protocol.LaunchResult),
        (replies.GpuHolders, protocol.GpuHoldersResult),
        (replies.ScriptFlags, protocol.ScriptFlagsResult),
        (replies.ScriptOption, protocol.ScriptOption),
        (replies.FileHolders, protocol.FileHoldersResult),
        (replies.FileHolder, protocol.FileHolder),
        (replies.Uninspected, protocol.Uninspected),
        (replies.ScanFile, protocol.ScanFile),
        (replies.Scan, protocol.ScanResult),
    ],
)
def test_each_laptop_struct_mirrors_its_protocol_shape(struct: Any, shape: Any) -> None:
    fields = set(struct.__struct_fields__)
    keys = set(get_type_hints(shape))
    assert fields <= keys, sorted(fields - keys)
    # A field the laptop requires is one the agent always sends.
    n_required = len(struct.__struct_fields__) - len(struct.__struct_defaults__)
    required = set(struct.__struct_fields__[:n_required])
    assert required <= set(shape.__required_keys__), sorted(required - shape.__required_keys__)


async def test_the_real_agent_replies_fit_the_shapes(
    host: Host, fake_runs: FakeRuns, tmp_path: Path
) -> None:
    hello = await host.connect()
    assert _misfit(hello, protocol.Hello, "hello") is None, _misfit(hello, protocol.Hello, "hello")
    assert msgspec.convert(hello, replies.Hello).protocol == protocol.PROTOCOL
    assert sorted(hello["ops"]) == sorted(protocol.OP_SHAPES)

    _fits("ping", await host.request("ping", {}))

    run = fake_runs.start("--datasets", "B1", "--max-samples", "5", children=1)
    data = tmp_path / "B1.jsonl"
    rng = random.Random(1)
    data.write_bytes(b"".join(dump(raw_record(rng, f"r{i}")) for i in range(3)))
    files = [{"path": str(data), "format": "raw"}]
    ps = await host.request("ps", {"scripts": ["run_inference.py"]})
    _fits("ps", ps)
    listed = [
        p for p in msgspec.convert(ps, replies.Processes).processes if p.identity.pid == run.pid
    ]
    assert len(listed) == 1
    refresh = await host.request("refresh", {"scripts": ["run_inference.py"], "files": files})
    _fits("refresh", refresh)
    scan = await host.request("scan", {"files": files, "fresh": True})
    _fits("scan", scan)
    assert msgspec.convert(scan, replies.Scan).files[str(data)].records == 3

    ident = msgspec.to_builtins(listed[0].identity)
    probe = await host.request("probe", {"identity": ident})
    _fits("probe", probe)
    assert msgspec.convert(probe, replies.Probe).alive is True
    killed = await host.request("kill", {"identity": ident, "grace": 5.0})
    _fits("kill", killed)
    targets = msgspec.convert(killed, replies.Kill).results
    assert {t.pid for t in targets} == {run.pid, *run.children}
    assert all(t.exit.confirmed for t in targets)

    workdir = tmp_path / "w"
    workdir.mkdir()
    script = workdir / "job.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    lock = ".runwatch/B1.lock"
    launch = await host.request(
        "launch",
        {
            "workdir": str(workdir),
            "argv": [sys.executable, str(script)],
            "log": "job.log",
            "lock_paths": [lock],
            "settle_s": 0.3,
            "fingerprints": [{"path": ".runwatch/B1.launch.json", "data": {"dataset": "B1"}}],
        },
        timeout=30,
    )
    _fits("launch", launch)
    started = msgspec.convert(launch, replies.Launch)
    assert started.started and started.identity is not None
    try:
        status = await host.request("lock_status", {"lock_paths": [lock], "workdir": str(workdir)})
        _fits("lock_status", status)
        held = msgspec.convert(status, replies.LockStatus)
        assert held.held and held.holder is not None and held.holder.identity == started.identity
        fp = await host.request(
            "read_fingerprint",
            {"paths": {"B1": ".runwatch/B1.launch.json"}, "workdir": str(workdir)},
        )
        _fits("read_fingerprint", fp)
        assert fp["fingerprints"]["B1"]["fingerprint"]["dataset"] == "B1"
        _fits("tail_log", await host.request("tail_log", {"path": str(workdir / "job.log")}))
    finally:
        os.kill(started.identity.pid, 9)

    wrote = await host.request(
        "write_fingerprint", {"path": str(tmp_path / "fp.json"), "data": {"a": 1}}
    )
    _fits("write_fingerprint", wrote)
    _fits("tail_records", await host.request("tail_records", {"path": str(data), "count": 2}))
    with open(data, "a"):  # this test holds the data file open for writing
        held_reply = await host.request("file_holders", {"paths": [str(data)]})
    _fits("file_holders", held_reply)
    assert os.getpid() in msgspec.convert(held_reply, replies.FileHolders).pids
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b'{"a": 1}\n{"a": 2')
    _fits("repair_tail", await host.request("repair_tail", {"path": str(torn)}))
    _fits("move_aside", await host.request("move_aside", {"path": str(torn), "format": "raw"}))
    gpu = await host.request("gpu_holders", {"pids": [os.getpid()]})
    _fits("gpu_holders", gpu)
    msgspec.convert(gpu, replies.GpuHolders)
    (workdir / "gen.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--n', type=int, choices=[1, 2], default=1)\np.parse_args()\n"
    )
    read = await host.request("script_flags", {"workdir": str(workdir), "argv": ["py", "gen.py"]})
    _fits("script_flags", read)
    options = msgspec.convert(read, replies.ScriptFlags).options
    assert [(o.flags, o.type, o.choices) for o in options][1:] == [(["--n"], "int", ["1", "2"])]

    # The ops whose modules the agent imports at their first request and that nothing above
    # asked for: each is answered by its handler (a request error naming the missing
    # parameter, or the tool's own failure), never "unknown op" or an import failure.
    from supervisor.errors import AgentError

    _fits("units", await host.request("units", {}))
    asked = {"ping", "ps", "refresh", "scan", "probe", "kill", "launch", "lock_status", "units"}
    asked |= {"read_fingerprint", "tail_log", "write_fingerprint", "tail_records"}
    asked |= {"file_holders", "repair_tail", "move_aside", "gpu_holders", "script_flags"}
    rest = sorted(set(protocol.OP_SHAPES) - asked)
    assert {"snapshot_take", "slurm_jobs", "slurm_submit", "slurm_cancel"} <= set(rest)
    for op in rest:
        with pytest.raises(AgentError) as failed:
            await host.request(op, {})
        why = str(failed.value)
        assert f"{op} failed (" in why, why
        assert "(exception)" not in why and "(unknown-op)" not in why, why
        assert "Error: No module named" not in why, why


def test_a_reply_that_does_not_fit_is_a_clear_agent_error() -> None:
    from supervisor.errors import AgentError

    with pytest.raises(AgentError, match=r"gpu1: malformed kill reply: .*outcome"):
        replies.decode(
            {"results": [{"pid": 3, "outcome": "vanished"}]}, replies.Kill, "gpu1", "kill"
        )
    assert typing.get_type_hints(protocol.KillTarget)["outcome"] is str


def test_the_agent_uses_nothing_newer_than_python_3_8() -> None:
    """The agent runs on the host's own Python, 3.8 or later: ``vermin`` reads every module
    (syntax, standard-library members, decorators) and finds nothing that needs a newer one.
    Members guarded by ``hasattr`` carry a ``# novermin`` mark."""
    vermin = Path(sys.executable).with_name("vermin")
    if not vermin.exists():
        pytest.fail("vermin is not installed: run `make` (it is in the dev extra)")
    agent = ROOT / "supervisor" / "agent"
    done = subprocess.run(
        [str(vermin), "--no-tips", "--violations", "-t=3.8-", str(agent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Analyzing" in done.stdout  # it read the files
