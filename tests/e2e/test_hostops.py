"""Host-side ops called in-process, on real files and real processes."""

from __future__ import annotations

import ast
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import datafiles, gpu, launch, masking, proc
from supervisor.agent.protocol import FINGERPRINT_VERSION, OP_SHAPES, AgentOpError, LaunchResult
from supervisor.agent.server import Agent
from tests.fixtures_actions import pid_alive, sha256_of
from tests.waiting import wait_until

SECRET = "sk-test-0123456789abcdef"


def _launch_params(tmp_path: Path, workload: Path, python_exe: str, **kw: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "workdir": str(tmp_path),
        "argv": [python_exe, str(workload), "--max-samples", "7"],
        "env": {"RW_TEST_KEY": SECRET, "RW_STOP_FILE": str(tmp_path / "stop")},
        "secret_env": ["RW_TEST_KEY"],
        "log": "logs/run.log",
        "lock_path": "out/.runwatch/run.lock",
        "settle_s": 0.3,
    }
    params.update(kw)
    return {k: v for k, v in params.items() if v is not None}


@pytest.mark.parametrize("module", [datafiles, gpu, launch, masking, proc])
def test_the_module_is_python_38_syntax(module: Any) -> None:
    source = Path(module.__file__).read_text()
    ast.parse(source, feature_version=(3, 8))
    tree = ast.parse(source)
    imported = {
        n.names[0].name if isinstance(n, ast.Import) else (n.module or "")
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    # the agent package carries only the standard library and its own modules
    assert all(m.startswith("supervisor.agent") for m in imported if m.startswith("supervisor"))
    assert {"msgspec", "click"}.isdisjoint(imported)
    assert "psutil" not in imported or module is proc  # optional there, never elsewhere


def test_launch_is_detached_locked_and_confirmed(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    result = launch.launch(_launch_params(tmp_path, workload, python_exe))
    assert result["started"] is True, result
    ident = result["identity"]
    pid = ident["pid"]
    kill_after.append(pid)
    assert pid_alive(pid)
    assert ident["argv"] == [python_exe, str(workload), "--max-samples", "7"]
    assert result["argv_matches"] is True
    assert ident["uid"] == os.getuid()
    assert ident["boot_id"] == proc.boot_id() != ""
    # new session, stdin from /dev/null, output appended to the log
    assert os.getsid(pid) == pid != os.getsid(0)
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    log = tmp_path / "logs" / "run.log"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(log)
    wait_until(lambda: "key present" in log.read_text(), timeout=15)
    # the key is in the child's environment, never in its argv nor in what the op returns
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert f"RW_TEST_KEY={SECRET}".encode() in environ.split(b"\0")
    assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert SECRET not in json.dumps(result)
    # the lock is held by the child and names it
    status = launch.lock_status({"lock_path": str(tmp_path / "out/.runwatch/run.lock")})
    assert status["held"] is True and status["holder_alive"] is True
    holder = status["holder"]
    assert holder is not None
    assert holder["identity"]["pid"] == pid
    assert holder["identity"]["start_time"] == ident["start_time"]


def test_second_launch_is_already_running_with_the_holder(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    first = launch.launch(_launch_params(tmp_path, workload, python_exe))
    assert first["started"], first
    kill_after.append(first["identity"]["pid"])
    second = launch.launch(_launch_params(tmp_path, workload, python_exe, lock_wait_s=0.2))
    assert second["started"] is False
    assert second["reason"] == "already-running"
    assert second["holder"] is not None
    assert second["holder"]["identity"]["pid"] == first["identity"]["pid"]
    assert f"pid {first['identity']['pid']}" in second["detail"]
    assert "already running" in second["detail"]


def test_lock_is_released_when_the_run_ends_and_a_relaunch_works(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    lock = str(tmp_path / "out/.runwatch/run.lock")
    first = launch.launch(_launch_params(tmp_path, workload, python_exe))
    pid = first["identity"]["pid"]
    kill_after.append(pid)
    (tmp_path / "stop").write_text("")
    wait_until(lambda: not pid_alive(pid), timeout=15)
    wait_until(lambda: not launch.lock_status({"lock_path": lock})["held"], timeout=15)
    (tmp_path / "stop").unlink()
    again = launch.launch(_launch_params(tmp_path, workload, python_exe))
    assert again["started"], again
    kill_after.append(again["identity"]["pid"])
    assert again["identity"]["pid"] != pid
    log = (tmp_path / "logs" / "run.log").read_text()
    # appended, not overwritten
    assert log.count("workload started") == 2 and "workload stopping" in log


def test_concurrent_launches_start_exactly_one(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    results: list[LaunchResult] = []
    barrier = threading.Barrier(4)

    def go() -> None:
        barrier.wait()
        results.append(launch.launch(_launch_params(tmp_path, workload, python_exe)))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    started = [r for r in results if r["started"]]
    kill_after.extend(r["identity"]["pid"] for r in started)
    assert len(started) == 1
    refused = [r for r in results if not r["started"]]
    assert len(refused) == 3
    assert {r["reason"] for r in refused} == {"already-running"}
    holders = [r["holder"] for r in refused]
    assert None not in holders
    assert {h["identity"]["pid"] for h in holders if h} == {started[0]["identity"]["pid"]}


def test_a_run_that_dies_at_once_is_reported_with_its_log(tmp_path: Path, python_exe: str) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "run.log").write_text("an older launch's line\n")
    code = f"import sys; print('loading', flush=True); print('boom {SECRET}'); sys.exit(3)"
    result = launch.launch(
        {
            "workdir": str(tmp_path),
            "argv": [python_exe, "-c", code],
            "env": {"RW_TEST_KEY": SECRET},
            "secret_env": ["RW_TEST_KEY"],
            "log": "logs/run.log",
            "lock_path": "out/.runwatch/run.lock",
            "settle_s": 10,
        }
    )
    assert result["started"] is False
    assert result["reason"] == "exited" and result["exit_code"] == 3
    # only this launch's lines, secrets masked
    assert result["log_tail"] == ["loading", "boom ***"]
    assert not launch.lock_status({"lock_path": str(tmp_path / "out/.runwatch/run.lock")})["held"]


def test_a_missing_program_is_exec_failed_and_frees_the_lock(tmp_path: Path) -> None:
    params = {
        "workdir": str(tmp_path),
        "argv": [str(tmp_path / "no-such-program"), "--x"],
        "log": "run.log",
        "lock_path": "out/.runwatch/run.lock",
    }
    result = launch.launch(params)
    assert result["started"] is False and result["reason"] == "exec-failed"
    assert "no-such-program" in result["detail"]
    assert not launch.lock_status({"lock_path": str(tmp_path / "out/.runwatch/run.lock")})["held"]


@pytest.mark.parametrize(
    "params",
    [
        {"argv": "python3 x.py"},
        {"argv": []},
        {"argv": ["python3", 3]},
        {"env": {"A": 1}},
        {"workdir": "/nonexistent/dir"},
        {"settle_s": -1},
    ],
)
def test_launch_rejects_bad_params(tmp_path: Path, params: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "workdir": str(tmp_path),
        "argv": ["true"],
        "log": "run.log",
        "lock_path": "run.lock",
    }
    base.update(params)
    with pytest.raises(AgentOpError) as e:
        launch.launch(base)
    assert e.value.kind == "bad-params"


def test_hostile_strings_are_data(tmp_path: Path, python_exe: str) -> None:
    pwned = tmp_path / "pwned"
    hostile = f"; touch {pwned} $(touch {pwned}) `touch {pwned}`"
    weird_dir = tmp_path / "dir with spaces and ünïcode; $(x)"
    weird_dir.mkdir()
    code = "import sys; print(repr(sys.argv[1:]))"
    result = launch.launch(
        {
            "workdir": str(weird_dir),
            "argv": [python_exe, "-c", code, hostile, "-leading", "new\nline"],
            "log": "log; rm -rf ~.txt",
            "lock_path": ".runwatch/run.lock",
            "settle_s": 10,
        }
    )
    assert result["reason"] == "exited" and result["exit_code"] == 0
    assert not pwned.exists()
    assert (weird_dir / "log; rm -rf ~.txt").read_text().strip() == repr(
        [hostile, "-leading", "new\nline"]
    )


# --------------------------------------------------------------------------- repair_tail


def test_repair_tail_keeps_a_byte_identical_backup(tmp_path: Path) -> None:
    f = tmp_path / "raw_responses.jsonl"
    complete = b'{"sample_id": "a"}\n{"sample_id": "b"}\n'
    f.write_bytes(complete + b'{"sample_id": "c", "outp')
    before = sha256_of(f)
    result = datafiles.repair_tail({"path": str(f)})
    assert result["repaired"] is True
    backup = Path(result["backup"])
    assert backup.name == "raw_responses.jsonl.broken"
    assert sha256_of(backup) == before == result["sha256"]
    assert f.read_bytes() == complete
    assert result["removed_bytes"] == len(b'{"sample_id": "c", "outp')
    assert result["size_after"] == len(complete)
    # a second torn tail later never overwrites the first backup
    with f.open("ab") as out:
        out.write(b'{"sample_id": "d"')
    second = datafiles.repair_tail({"path": str(f)})
    assert Path(second["backup"]).name == "raw_responses.jsonl.broken.2"
    assert sha256_of(backup) == before
    assert f.read_bytes() == complete


@pytest.mark.parametrize(("content", "reason"), [(b"", "empty"), (b'{"a": 1}\n', "clean")])
def test_repair_tail_leaves_clean_files_alone(tmp_path: Path, content: bytes, reason: str) -> None:
    f = tmp_path / "d.jsonl"
    f.write_bytes(content)
    result = datafiles.repair_tail({"path": str(f)})
    assert result["repaired"] is False and result["reason"] == reason
    assert f.read_bytes() == content
    assert not list(tmp_path.glob("*.broken*"))


def test_repair_tail_without_any_newline_truncates_to_empty(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'{"partial": tru')
    result = datafiles.repair_tail({"path": str(f)})
    assert result["repaired"] and f.read_bytes() == b""
    assert Path(result["backup"]).read_bytes() == b'{"partial": tru'


def test_repair_tail_is_refused_while_a_writer_is_alive(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'{"a": 1}\n{"b"')
    with f.open("ab") as writer:
        with pytest.raises(AgentOpError) as e:
            datafiles.repair_tail({"path": str(f)})
        assert e.value.kind == "writer-alive"
        assert str(os.getpid()) in str(e.value)
        writer.write(b"")
    assert f.read_bytes() == b'{"a": 1}\n{"b"'
    assert not list(tmp_path.glob("*.broken*"))
    # readers do not count as writers
    with f.open("rb"):
        assert datafiles.repair_tail({"path": str(f)})["repaired"]


def test_repair_tail_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AgentOpError) as e:
        datafiles.repair_tail({"path": str(tmp_path / "nope.jsonl")})
    assert e.value.kind == "missing"


# --------------------------------------------------------------------------- move_aside


def test_move_aside_renames_and_keeps_every_byte(tmp_path: Path) -> None:
    f = tmp_path / "B3" / "raw_responses.jsonl"
    f.parent.mkdir()
    f.write_bytes(b'{"sample_id": "x", "text": "legacy"}\n')
    digest = sha256_of(f)
    result = datafiles.move_aside({"path": str(f), "format": "raw-legacy", "timestamp": "T1"})
    assert result["moved"] is True and result["to"] is not None
    target = Path(result["to"])
    assert target.name == "raw_responses.jsonl.raw-legacy-T1"
    assert not f.exists() and sha256_of(target) == digest
    # a second move with the same stamp never overwrites the first
    f.write_bytes(b"second\n")
    again = datafiles.move_aside({"path": str(f), "format": "raw-legacy", "timestamp": "T1"})
    assert again["to"] is not None
    assert Path(again["to"]).name == "raw_responses.jsonl.raw-legacy-T1.2"
    assert sha256_of(target) == digest
    assert Path(again["to"]).read_bytes() == b"second\n"


def test_move_aside_is_refused_while_a_writer_is_alive(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_bytes(b"x\n")
    with f.open("ab"):
        with pytest.raises(AgentOpError) as e:
            datafiles.move_aside({"path": str(f), "format": "legacy"})
        assert e.value.kind == "writer-alive"
    assert f.read_bytes() == b"x\n" and len(list(tmp_path.iterdir())) == 1


def test_move_aside_default_stamp_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("x\n")
    moved = datafiles.move_aside({"path": str(f), "format": "mixed"})
    assert moved["to"] is not None
    assert Path(moved["to"]).name.startswith("d.jsonl.mixed-20")
    assert datafiles.move_aside({"path": str(f), "format": "mixed"})["moved"] is False
    with pytest.raises(AgentOpError):
        datafiles.move_aside({"path": str(f), "format": "../evil"})


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_round_trip_with_prompt_hashes(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "B1.jsonl").write_text('{"prompt": "hi"}\n')
    sidecar = "out/.runwatch/launch.json"
    data = {
        "argv": ["python3", "run_inference.py", "--api-key", SECRET, "--temperature", "0.6"],
        "model": "m",
        "sampling": {"temperature": "0.6"},
        "format": "raw",
    }
    files = {"B1": "prompts/B1.jsonl", "B2": "prompts/B2.jsonl"}
    written = launch.write_fingerprint(
        {"path": sidecar, "workdir": str(tmp_path), "data": data, "hash_files": files}
    )
    fp = written["fingerprint"]
    assert fp["version"] == FINGERPRINT_VERSION
    assert fp["prompts"]["B1"]["sha256"] == sha256_of(tmp_path / "prompts" / "B1.jsonl")
    assert fp["prompts"]["B2"]["sha256"] is None and fp["prompts"]["B2"]["error"]
    assert SECRET not in (tmp_path / sidecar).read_text()
    got = launch.read_fingerprint({"path": sidecar, "workdir": str(tmp_path), "hash_files": files})
    assert got["exists"] and got["fingerprint"] == json.loads((tmp_path / sidecar).read_text())
    assert got["hashes"]["B1"]["sha256"] == fp["prompts"]["B1"]["sha256"]
    (tmp_path / "prompts" / "B1.jsonl").write_text('{"prompt": "changed"}\n')
    changed = launch.read_fingerprint(
        {"path": sidecar, "workdir": str(tmp_path), "hash_files": files}
    )
    assert changed["hashes"]["B1"]["sha256"] != fp["prompts"]["B1"]["sha256"]


def test_read_fingerprint_missing_and_corrupt(tmp_path: Path) -> None:
    missing = launch.read_fingerprint({"path": str(tmp_path / "launch.json")})
    assert missing["exists"] is False and missing["fingerprint"] is None
    (tmp_path / "launch.json").write_text("{not json")
    corrupt = launch.read_fingerprint({"path": str(tmp_path / "launch.json")})
    error = corrupt["error"]
    assert corrupt["exists"] and corrupt["fingerprint"] is None and error and "not JSON" in error


def test_launch_writes_the_fingerprint_once_confirmed(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    params = _launch_params(
        tmp_path,
        workload,
        python_exe,
        fingerprint={
            "path": "out/.runwatch/launch.json",
            "data": {"argv": ["x"], "model": "m", "sampling": {}, "format": "raw"},
        },
    )
    result = launch.launch(params)
    kill_after.append(result["identity"]["pid"])
    stored = json.loads((tmp_path / "out/.runwatch/launch.json").read_text())
    assert stored["identity"]["pid"] == result["identity"]["pid"]
    assert stored["model"] == "m"


# --------------------------------------------------------------------------- tail and masks


def test_tail_log_is_bounded_and_masked(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)) + f"auth {SECRET}\n")
    result = datafiles.tail_log({"path": str(log), "lines": 3})
    assert result["lines"] == ["line 998", "line 999", "auth ***"]
    small = datafiles.tail_log({"path": str(log), "lines": 1000, "max_bytes": 40})
    assert small["lines"][-1] == "auth ***" and len(small["lines"]) < 5
    assert all(line.startswith(("line ", "auth")) for line in small["lines"])
    assert datafiles.tail_log({"path": str(tmp_path / "none.log")})["exists"] is False


def test_mask_argv() -> None:
    argv = ["x", "--api-key", SECRET, "--token=abc", "--token-budget", "10000000", "ok"]
    assert masking.mask_argv(argv) == [
        "x",
        "--api-key",
        "***",
        "--token=***",
        "--token-budget",
        "10000000",
        "ok",
    ]
    assert masking.mask_argv(["--x", "pre-hidden-val-post"], ["hidden-val"]) == [
        "--x",
        "pre-***-post",
    ]
    # A value shorter than 8 characters is never registered: masking it would hide common words.
    assert masking.mask_argv(["--x", "pre-hidden-post"], ["hidden"]) == ["--x", "pre-hidden-post"]
    assert masking.mask_text("Authorization: Bearer abcdefghijkl") == "Authorization: ***"
    assert masking.mask_text("using Bearer abcdefghijkl") == "using Bearer ***"
    assert masking.mask_text("token budget None, max tokens 5") == "token budget None, max tokens 5"
    assert masking.mask_text(f"key={SECRET}") == "key=***"


def test_ops_table_names_every_op() -> None:
    assert set(Agent().ops) == set(OP_SHAPES)


def test_is_alive_checks_start_time(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    result = launch.launch(_launch_params(tmp_path, workload, python_exe))
    ident = result["identity"]
    kill_after.append(ident["pid"])
    assert proc.is_alive(dict(ident))
    assert not proc.is_alive(dict(ident, start_time=ident["start_time"] + 1))
    os.killpg(ident["pid"], signal.SIGKILL)
    wait_until(lambda: not proc.is_alive(dict(ident)), timeout=15)


def test_gpu_holders_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = gpu.gpu_holders({"pids": [1, 2]})
    assert result == {"available": False, "holders": {}, "detail": None}
    with pytest.raises(AgentOpError):
        gpu.gpu_holders({"pids": ["1"]})


def test_gpu_holders_reads_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in --query-compute-apps*) printf "11, 500\\n12, 250\\n";; '
        '*) printf "0, H100, 750, 80000, 3\\n";; esac\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert gpu.gpu_holders({"pids": [12, 13]}) == {"available": True, "holders": {"12": 250.0}}
    assert gpu.gpu_holders({})["holders"] == {"11": 500.0, "12": 250.0}


# --------------------------------------------------------------------------- through the agent


async def test_ops_through_the_agent(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    from supervisor.config import HostConfig
    from supervisor.errors import AgentError
    from supervisor.hosts import LocalHost

    host = LocalHost(HostConfig(name="local", local=True))
    hello = await host.connect()
    try:
        assert set(OP_SHAPES) == set(hello["ops"])
        params = _launch_params(tmp_path, workload, python_exe)
        result = await host.request("launch", params, timeout=30)
        assert result["started"] is True
        pid = result["identity"]["pid"]
        kill_after.append(pid)
        again = await host.request("launch", dict(params, lock_wait_s=0.2), timeout=30)
        assert again["reason"] == "already-running"
        assert again["holder"]["identity"]["pid"] == pid
        status = await host.request(
            "lock_status", {"lock_path": params["lock_path"], "workdir": str(tmp_path)}
        )
        assert status["held"] and status["holder_alive"]
        wait_until(lambda: "key present" in (tmp_path / "logs/run.log").read_text(), timeout=15)
        tail = await host.request("tail_log", {"path": str(tmp_path / "logs/run.log"), "lines": 5})
        assert any("workload started" in line for line in tail["lines"])
        # the workload holds its log open for writing: a repair of it is refused
        log = tmp_path / "logs/run.log"
        with log.open("ab") as f:
            f.write(b"partial line without newline")
        with pytest.raises(AgentError) as e:
            await host.request("repair_tail", {"path": str(log)})
        assert "writer-alive" in str(e.value) and str(pid) in str(e.value)
        assert log.read_bytes().endswith(b"partial line without newline")
        moved = await host.request("move_aside", {"path": str(tmp_path / "nothing"), "format": "x"})
        assert moved["moved"] is False
        with pytest.raises(AgentError) as bad:
            await host.request("launch", {"workdir": str(tmp_path), "argv": "ls"})
        assert "bad-params" in str(bad.value)
    finally:
        await host.close()
    # the agent is gone; the run it launched is not (it is in its own session)
    assert pid_alive(pid)


def test_one_lock_per_dataset(
    tmp_path: Path, workload: Path, python_exe: str, kill_after: list[int]
) -> None:
    side = "out/.runwatch"
    first = launch.launch(
        _launch_params(
            tmp_path,
            workload,
            python_exe,
            lock_path=None,
            lock_paths=[f"{side}/B1.lock", f"{side}/B2.lock"],
        )
    )
    assert first["started"], first
    kill_after.append(first["identity"]["pid"])
    # another run sharing the output dir but writing other datasets is not blocked
    other = launch.launch(
        _launch_params(
            tmp_path, workload, python_exe, lock_path=None, lock_paths=[f"{side}/B3.lock"]
        )
    )
    assert other["started"], other
    kill_after.append(other["identity"]["pid"])
    # a third writing B2 (and B4) is: B2's writer is named, B4's lock is left free
    third = launch.launch(
        _launch_params(
            tmp_path,
            workload,
            python_exe,
            lock_path=None,
            lock_paths=[f"{side}/B4.lock", f"{side}/B2.lock"],
            lock_wait_s=0.2,
        )
    )
    assert third["reason"] == "already-running"
    assert third["lock_path"] == str(tmp_path / side / "B2.lock")
    assert third["holder"] is not None
    assert third["holder"]["identity"]["pid"] == first["identity"]["pid"]
    status = launch.lock_status(
        {"workdir": str(tmp_path), "lock_paths": [f"{side}/B4.lock", f"{side}/B1.lock"]}
    )
    assert status["held"] and status["holder"] is not None
    assert status["holder"]["identity"]["pid"] == first["identity"]["pid"]
    assert [lk["held"] for lk in status["locks"]] == [True, False]  # sorted: B1, B4
    for lock in ("B1", "B2"):
        holder = json.loads((tmp_path / side / f"{lock}.lock").read_text())
        assert holder["identity"]["pid"] == first["identity"]["pid"]


def test_read_many_fingerprints(tmp_path: Path) -> None:
    for ds in ("B1", "B2"):
        launch.write_fingerprint(
            {"path": f".runwatch/{ds}.launch.json", "workdir": str(tmp_path), "data": {"model": ds}}
        )
    got = launch.read_fingerprint(
        {
            "workdir": str(tmp_path),
            "paths": {
                "B1": ".runwatch/B1.launch.json",
                "B2": ".runwatch/B2.launch.json",
                "B3": ".runwatch/B3.launch.json",
            },
        }
    )
    fps = got["fingerprints"]
    fp1, fp2 = fps["B1"]["fingerprint"], fps["B2"]["fingerprint"]
    assert fp1 is not None and fp2 is not None
    assert fp1["model"] == "B1" and fp2["model"] == "B2"
    assert fps["B3"]["exists"] is False and fps["B3"]["fingerprint"] is None
