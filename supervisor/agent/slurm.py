"""Slurm ops of the agent on a login node: list, submit and cancel jobs.

Standard library only and Python >= 3.8: this module travels to the host inside the agent bundle.
Every Slurm command is run as an argv list (never a shell); config values reach ``sbatch`` as
separate arguments or as data in the batch script, where every word of a run's command line is
quoted with ``shlex.quote``.

A job is identified by its job id and its comment: the tag ``runwatch:<run>:<nonce>`` of the jobs
runwatch submits, the nonce drawn by the laptop at submission and recorded with the job id, so
that the job stays the same one when ``scontrol requeue`` gives it a new submit time. A cancel
names id, submit time and comment, and is refused when the job now holding the id differs (an id
reused after a controller restart, a job of another run or of nobody's); the submit time decides
only for a job whose comment holds no nonce (one submitted by hand, or before nonces).
Which jobs are a run's is not decided here: anyone can tag a job, so the laptop keeps the ids it
submitted or adopted and only those are ever cancelled.

Ops (shapes in ``supervisor.agent.protocol``):
- ``slurm_jobs``: the user's jobs (``squeue --json`` where this Slurm has it, else a delimited
  ``--format``), each with state, reason, node list, elapsed and limit, array task, comment,
  name, submit time and (from ``scontrol show job -o``) the expanded output file.
- ``slurm_submit``: write the batch script, ``sbatch`` it with the run's options, read the job
  back and wait up to a settle time for it to run; one submission per tag at a time (a lock), and
  none while a job of the tag is still active.
- ``slurm_cancel``: the pending tasks of an array are cancelled first (``scancel --state=PENDING``,
  no signal: no further task starts), then ``scancel --signal=TERM --full`` of each running task,
  ``--signal=KILL`` after the grace, then a plain ``scancel``; every task's end is reported;
  confirmed when the job has left the queue or reached a final state that no
  flag qualifies (``COMPLETING``: its processes are still being torn down), and no process on
  this machine holds the run's data files for writing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from supervisor.agent import bounded, safefs
from supervisor.agent.datafiles import writers_of
from supervisor.agent.protocol import AgentOpError, param_number, param_str

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

TAG_PREFIX = "runwatch:"
_NONCE = re.compile(r"^[0-9a-f]{16}$")
"""A nonce of a job's comment: 16 lowercase hex digits (``secrets.token_hex(8)``)."""
TERMINAL_STATES = frozenset(
    (
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "SPECIAL_EXIT",
        "REVOKED",
    )
)
ACTIVE_STATES = frozenset(
    (
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETING",
        "CONFIGURING",
        "REQUEUED",
        "RESIZING",
        "STAGE_OUT",
        "STOPPED",
        "SIGNALING",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
    )
)
"""States of a job that has not ended: its processes may still run (or be torn down), or it
may still start."""
FLAG_STATES = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
"""The state flags that Slurm's ``job_state_string`` shows instead of the base state, in its
order (``src/common/slurm_protocol_defs.c``, the same from 22.05 to 25.05): a job cancelled
whose processes are still being torn down is ``COMPLETING``, not ``CANCELLED``."""
KILL_CONFIRM_S = 15.0
"""How long to wait for a terminal state after SIGKILL before a plain ``scancel``."""
COMMAND_TIMEOUT_S = 30.0
COMMAND_MAX_BYTES = 64 << 20
"""Most bytes read from one Slurm command (squeue --json of a busy cluster is a few MiB)."""
_SEP = "\x1f"
"""Field separator of the ``--format`` fallback (ASCII unit separator: never in Slurm's output
of ids, states, times or node lists)."""
# squeue --format fields, free text (name, comment) last: a line with more fields is refused.
_FORMAT_FIELDS = (
    ("job_id", "%i"),
    ("array_job_id", "%F"),
    ("array_task_id", "%K"),
    ("state", "%T"),
    ("reason", "%r"),
    ("nodes", "%N"),
    ("elapsed", "%M"),
    ("time_limit", "%l"),
    ("submit_time", "%V"),
    ("start_time", "%S"),
    ("uid", "%U"),
    ("user", "%u"),
    ("partition", "%P"),
    ("workdir", "%Z"),
    ("name", "%j"),
    ("comment", "%k"),
)
_lock = threading.Lock()
_json_ok: bool | None = None
"""Whether ``squeue --json`` works here (learnt at the first listing)."""


def split_tag(comment: str) -> tuple[str, str | None]:
    """``("runwatch:<run>", nonce)`` of a comment ``runwatch:<run>:<nonce>``; a comment without
    a nonce is ``(comment, None)``."""
    head, sep, tail = comment.rpartition(":")
    if sep and head.startswith(TAG_PREFIX) and len(head) > len(TAG_PREFIX) and _NONCE.match(tail):
        return head, tail
    return comment, None


# --------------------------------------------------------------------------- commands


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT_S
         ) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    """``argv`` run under one deadline for the whole command and a byte cap on its output
    (``agent.bounded``: at either, its process group is killed and it is reaped)."""
    try:
        done = bounded.run(argv, timeout, COMMAND_MAX_BYTES, env)
    except FileNotFoundError:
        raise AgentOpError(
            f"{argv[0]} not found on this host: is it a Slurm login node?", "no-slurm"
        ) from None
    if done.timed_out:
        raise AgentOpError(f"{argv[0]} gave no answer within {timeout:.2g} s", "timeout")
    if done.problem is not None:
        raise AgentOpError(f"{argv[0]}: {done.problem}; its answer was not read", "too-large")
    rc = done.returncode if done.returncode is not None else -1
    return subprocess.CompletedProcess(argv, rc, done.stdout, done.stderr)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


# --------------------------------------------------------------------------- parsing


def parse_duration(text: str) -> int | None:
    """Seconds of a Slurm duration (``[days-]hours:minutes:seconds``, ``M:SS``, minutes); None for
    ``UNLIMITED``, ``INVALID``, ``N/A`` or an empty field."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INVALID", "N/A", "NOT_SET", "NONE"):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        if not d.isdigit():
            return None
        days = int(d)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    nums = [int(p) for p in parts]
    if len(nums) == 1:
        secs = nums[0] * 60 if days == 0 else nums[0] * 3600  # "5" = minutes; "1-5" = hours
    elif len(nums) == 2:
        secs = nums[0] * 60 + nums[1] if days == 0 else nums[0] * 3600 + nums[1] * 60
    else:
        secs = nums[0] * 3600 + nums[1] * 60 + nums[2]
    return days * 86400 + secs


def parse_time(text: str) -> int | None:
    """Unix time of a Slurm timestamp (``2026-11-30T10:28:06``, local time); None for ``N/A``."""
    text = text.strip()
    if not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$", text):
        return None
    return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _job(**values: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "job_id": "",
        "array_job_id": None,
        "array_task_id": None,
        "array_tasks": None,
        "state": "",
        "reason": "",
        "nodes": "",
        "elapsed_s": None,
        "time_limit_s": None,
        "submit_time": None,
        "start_time": None,
        "uid": None,
        "user": "",
        "partition": "",
        "workdir": "",
        "name": "",
        "comment": "",
        "stdout": None,
    }
    job.update(values)
    return job


def _array_fields(job_id: str, array_job: int | None, task: int | None) -> dict[str, Any]:
    """``array_job_id``, ``array_task_id`` and (for the pending rest of an array, shown as
    ``12_[3-7]``) ``array_tasks``."""
    if array_job is None or array_job == 0:
        return {"array_job_id": None, "array_task_id": None, "array_tasks": None}
    m = re.match(r"^\d+_\[(.+)\]$", job_id)
    return {
        "array_job_id": str(array_job),
        "array_task_id": task,
        "array_tasks": m.group(1) if m else None,
    }


def parse_format_lines(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Jobs of ``squeue --noheader --format=`` output made with ``_FORMAT_FIELDS``; and the lines
    refused (a field count that differs: a separator inside a name or comment)."""
    jobs, bad = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(_SEP)
        if len(parts) != len(_FORMAT_FIELDS):
            bad.append(line[:200])
            continue
        f = {name: parts[i].strip() for i, (name, _) in enumerate(_FORMAT_FIELDS)}
        elapsed = parse_duration(f["elapsed"])
        jobs.append(
            _job(
                job_id=f["job_id"],
                state=f["state"],
                reason="" if f["reason"] == "None" else f["reason"],
                nodes="" if f["nodes"] in ("", "(null)") else f["nodes"],
                elapsed_s=elapsed,
                time_limit_s=parse_duration(f["time_limit"]),
                submit_time=parse_time(f["submit_time"]),
                start_time=parse_time(f["start_time"]),
                uid=_int_or_none(f["uid"]),
                user=f["user"],
                partition=f["partition"],
                workdir=f["workdir"],
                name=f["name"],
                comment="" if f["comment"] == "(null)" else f["comment"],
                **_array_fields(
                    f["job_id"],
                    _int_or_none(f["array_job_id"]) if f["array_job_id"] != f["job_id"] else None,
                    _int_or_none(f["array_task_id"]),
                ),
            )
        )
    return jobs, bad


def _json_number(value: Any) -> int | None:
    """A number of squeue's JSON (a plain int, or ``{"set": bool, "number": int}`` in newer
    Slurm); None when unset."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def json_state(value: Any) -> str:
    """A job's state as ``squeue --format=%T`` writes it, from the ``job_state`` of
    ``squeue --json``: a string up to Slurm 23.02 (``"COMPLETING"``), a list from 23.11 on (the
    base state first, then its flags: ``["CANCELLED", "COMPLETING"]``). A flag of
    :data:`FLAG_STATES` wins over the base state, as in ``job_state_string``: a list with
    ``COMPLETING`` in it is a job whose processes are not gone yet."""
    if isinstance(value, list):
        names = [str(v) for v in value]
        flag = next((f for f in FLAG_STATES if f in names), None)
        return flag or (names[0] if names else "")
    return str(value or "")


def parse_json_jobs(data: Any, now: float) -> list[dict[str, Any]]:
    """Jobs of ``squeue --json`` output (Slurm 21.08 and later)."""
    jobs = []
    for j in data.get("jobs") or []:
        if not isinstance(j, dict):
            continue
        job_id = str(j.get("job_id"))
        state = json_state(j.get("job_state"))
        start = _json_number(j.get("start_time"))
        end = _json_number(j.get("end_time"))
        elapsed = None
        if start and state not in ("PENDING",) and start <= now:
            stop = end if state in TERMINAL_STATES and end and end >= start else now
            elapsed = int(stop - start)
        limit = _json_number(j.get("time_limit"))
        array_job = _json_number(j.get("array_job_id"))
        task = _json_number(j.get("array_task_id"))
        array_string = str(j.get("array_task_string") or "")
        shown_id = job_id
        if array_job:
            shown_id = (
                f"{array_job}_{task}" if task is not None else f"{array_job}_[{array_string}]"
            )
        reason = str(j.get("state_reason") or "")
        jobs.append(
            _job(
                job_id=shown_id,
                state=state,
                reason="" if reason == "None" else reason,
                nodes=str(j.get("nodes") or ""),
                elapsed_s=elapsed,
                time_limit_s=limit * 60 if limit is not None else None,
                submit_time=_json_number(j.get("submit_time")),
                start_time=start if start and state != "PENDING" else None,
                uid=_json_number(j.get("user_id")),
                user=str(j.get("user_name") or ""),
                partition=str(j.get("partition") or ""),
                workdir=str(j.get("current_working_directory") or ""),
                name=str(j.get("name") or ""),
                comment=str(j.get("comment") or ""),
                **_array_fields(shown_id, array_job, task),
            )
        )
    return jobs


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol_line(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol show job -o`` line (values may hold spaces)."""
    marks = list(_SCONTROL_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


def _scontrol_jobs(env: dict[str, str] | None, job_id: str | None = None,
                   timeout: float = COMMAND_TIMEOUT_S) -> list[dict[str, str]]:  # fmt: skip
    argv = ["scontrol", "show", "job", "-o"] + ([job_id] if job_id else [])
    done = _run(argv, env, timeout)
    if done.returncode != 0:
        return []
    return [parse_scontrol_line(line) for line in _text(done.stdout).splitlines() if line.strip()]


def _scontrol_key(rec: dict[str, str]) -> str:
    array_job, task = rec.get("ArrayJobId"), rec.get("ArrayTaskId")
    if array_job and task and task.isdigit():
        return f"{array_job}_{task}"
    if array_job and task:
        return f"{array_job}_[{task}]"
    return rec.get("JobId", "")


# --------------------------------------------------------------------------- listing


def _left(deadline: float | None, what: str) -> float:
    """Seconds left before ``deadline`` for ``what`` (the full command timeout without one);
    AgentOpError ``timeout`` when none are."""
    if deadline is None:
        return COMMAND_TIMEOUT_S
    left = deadline - time.monotonic()
    if left <= 0:
        raise AgentOpError(f"{what}: the listing's deadline passed", "timeout")
    return left


def _squeue(env: dict[str, str] | None, params: dict[str, Any], deadline: float | None = None
            ) -> tuple[list[dict[str, Any]], str, list[str]]:  # fmt: skip
    global _json_ok
    scope = [] if params.get("all_users") else ["--user", str(os.getuid())]
    states = ["--states", "all"] if params.get("all_states") else []
    ids = params.get("job_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise AgentOpError("parameter 'job_ids': expected a list of job ids", "bad-params")
    select = ["--jobs", ",".join(ids)] if ids else []
    with _lock:
        use_json = _json_ok is not False and not params.get("force_format")
    if use_json:
        done = _run(["squeue", "--json", *scope, *states, *select], env,
                    _left(deadline, "squeue"))  # fmt: skip
        if done.returncode == 0:
            try:
                data = json.loads(_text(done.stdout))
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("jobs"), list):
                with _lock:
                    _json_ok = True
                jobs = parse_json_jobs(data, time.time())
                return _filter(jobs, params, ids), "json", []
        if ids and b"Invalid job id" in done.stderr:
            return [], "json", []
        with _lock:
            if _json_ok is None:
                _json_ok = False  # this squeue has no --json: use the format from now on
    fmt = _SEP.join(code for _, code in _FORMAT_FIELDS)
    done = _run(["squeue", "--noheader", *scope, *states, *select, "--format", fmt], env,
                _left(deadline, "squeue"))  # fmt: skip
    if done.returncode != 0:
        err = _text(done.stderr).strip()
        if ids and "Invalid job id" in err:
            return [], "format", []
        raise AgentOpError(f"squeue failed: {err[-500:] or done.returncode}", "squeue")
    jobs, bad = parse_format_lines(_text(done.stdout))
    return jobs, "format", bad


def _add_stdout(jobs: list[dict[str, Any]], env: dict[str, str] | None,
                deadline: float | None = None) -> None:  # fmt: skip
    """Each job's output path from ``scontrol`` (left out when scontrol is late: the jobs
    matter more than where they write)."""
    if not jobs:
        return
    try:
        records = _scontrol_jobs(env, timeout=_left(deadline, "scontrol"))
    except AgentOpError:
        return
    by_key = {_scontrol_key(rec): rec for rec in records}
    for j in jobs:
        rec = by_key.get(j["job_id"])
        if rec is not None and rec.get("StdOut"):
            j["stdout"] = rec["StdOut"]


def _filter(jobs: list[dict[str, Any]], params: dict[str, Any], ids: list[str]
            ) -> list[dict[str, Any]]:  # fmt: skip
    """The jobs squeue's options select, applied again here: ``squeue --json`` of some Slurm
    versions (22.05) lists every job it knows whatever the user, state or id asked for."""
    out = []
    for j in jobs:
        if not params.get("all_users") and j["uid"] is not None and j["uid"] != os.getuid():
            continue
        if not params.get("all_states") and j["state"] not in ACTIVE_STATES:
            continue
        if ids and not any(j["job_id"] == i or j["array_job_id"] == i or
                           j["job_id"].startswith(i + "_") for i in ids):  # fmt: skip
            continue
        out.append(j)
    return out


def slurm_jobs(params: dict[str, Any]) -> dict[str, Any]:
    """``{tag_prefix?="runwatch:", with_ids?, all_states?, all_users?, job_ids?, force_format?,
    deadline_s?, in_workdir?}`` -> the jobs: ``{"time", "source": "json" | "format", "jobs":
    [...], "unparsed": [lines]}``.

    Only jobs whose comment starts with ``tag_prefix`` are returned (``""``: every job), and the
    jobs (or arrays) of ``with_ids`` whatever their comment (jobs adopted by a run); with
    ``in_workdir``, only the jobs whose working directory is that directory (the same
    ``(st_dev, st_ino)``, whatever the path squeue gives), whatever their comment. Each job:
    ``job_id`` (``12``, ``12_3`` for an array task, ``12_[4-7]`` for an array's pending rest),
    ``array_job_id``, ``array_task_id``, ``array_tasks``, ``state``, ``reason``, ``nodes``,
    ``elapsed_s``, ``time_limit_s`` (None: unlimited), ``submit_time``, ``start_time`` (unix),
    ``uid``, ``user``, ``partition``, ``workdir``, ``name``, ``comment``, ``stdout``.
    """
    prefix = params.get("tag_prefix", TAG_PREFIX)
    if not isinstance(prefix, str):
        raise AgentOpError("parameter 'tag_prefix': expected a string", "bad-params")
    with_ids = params.get("with_ids") or []
    if not isinstance(with_ids, list) or not all(isinstance(i, str) for i in with_ids):
        raise AgentOpError("parameter 'with_ids': expected a list of job ids", "bad-params")
    limit = params.get("deadline_s")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or not limit > 0):  # fmt: skip
        raise AgentOpError("parameter 'deadline_s': expected a number > 0", "bad-params")
    deadline = None if limit is None else time.monotonic() + float(limit)
    in_workdir = params.get("in_workdir")
    if in_workdir is not None and not isinstance(in_workdir, str):
        raise AgentOpError("parameter 'in_workdir': expected a path", "bad-params")
    jobs, source, bad = _squeue(None, params, deadline)
    if in_workdir is not None:
        jobs = _in_directory(jobs, os.path.expanduser(in_workdir))
    else:
        jobs = [j for j in jobs if j["comment"].startswith(prefix)
                or (j["array_job_id"] or j["job_id"]) in with_ids]  # fmt: skip
    _add_stdout(jobs, None, deadline)
    return {"time": time.time(), "source": source, "jobs": jobs, "unparsed": bad}


def _in_directory(jobs: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """The jobs whose working directory is the directory ``path`` (by identity); none when
    ``path`` is no directory (nothing can run in it)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    seen: dict[str, bool] = {}
    out = []
    for j in jobs:
        where = str(j.get("workdir") or "")
        if where and where not in seen:
            try:
                wst = os.stat(where)
                seen[where] = (wst.st_dev, wst.st_ino) == (st.st_dev, st.st_ino)
            except OSError:
                seen[where] = False
        if where and seen[where]:
            out.append(j)
    return out


# --------------------------------------------------------------------------- submit


def batch_script(argv: list[str], tasks: list[list[str]] | None = None,
                 directives: list[str] | None = None) -> str:  # fmt: skip
    """The batch script of a run: ``#SBATCH`` lines (the run's own extra directives, verbatim)
    and ``exec`` of its command line, every word quoted; with ``tasks``, one command line per
    array task index, chosen by ``$SLURM_ARRAY_TASK_ID``."""
    lines = ["#!/bin/sh"]
    for d in directives or []:
        if not isinstance(d, str) or not d.startswith("-") or any(c in d for c in "\n\r\0"):
            raise AgentOpError(
                f"extra sbatch directive {d!r}: expected one line starting with '-'", "bad-params"
            )
        lines.append(f"#SBATCH {d}")
    lines.append("# written by runwatch: every word below is quoted")
    if tasks:
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        for i, words in enumerate(tasks):
            lines.append(f"  {i}) exec {shlex.join(words)} ;;")
        lines.append('  *) echo "runwatch: no command for array task $SLURM_ARRAY_TASK_ID" >&2;'
                     " exit 2 ;;")  # fmt: skip
        lines.append("esac")
    else:
        lines.append(f"exec {shlex.join(argv)}")
    return "\n".join(lines) + "\n"


_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")


def sbatch_argv(options: dict[str, Any], script: str) -> list[str]:
    """``sbatch --parsable --opt=value ... SCRIPT``: each option one argument, never parsed by a
    shell (``--job-name``, ``--comment``, ``--partition``, ``--gres``, ``--time``...)."""
    argv = ["sbatch", "--parsable"]
    for key, value in options.items():
        if not _OPTION.match(key):
            raise AgentOpError(f"sbatch option {key!r}: not an option name", "bad-params")
        if value is None or value is False:
            continue
        if isinstance(value, bool):
            argv.append(f"--{key}")
            continue
        text = str(value)
        if any(c in text for c in "\n\r\0"):
            raise AgentOpError(f"sbatch option --{key}: value holds a line break", "bad-params")
        argv.append(f"--{key}={text}")
    argv.append(script)
    return argv


def _active_with_tag(tag: str) -> list[dict[str, Any]]:
    """The active jobs tagged for the run of ``tag``, whatever their nonce."""
    run = split_tag(tag)[0]
    jobs, _, _ = _squeue(None, {})
    return [j for j in jobs if split_tag(j["comment"])[0] == run and j["state"] in ACTIVE_STATES]


def _words(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise AgentOpError(f"parameter {key!r}: expected a non-empty list of strings", "bad-params")
    return list(value)


def slurm_submit(params: dict[str, Any]) -> dict[str, Any]:
    """Submit a run as a batch job and confirm it.

    Params: ``workdir``, ``argv`` (or ``tasks``: one argv per array task), ``tag``
    (``runwatch:<run>:<nonce>``, or ``runwatch:<run>``: the job's comment), ``name`` (job name),
    ``script_path`` (where the batch script is written, relative to workdir unless absolute),
    ``lock_path``, ``options`` (sbatch long options without ``--``: ``partition``, ``gres``,
    ``time``, ``output``...), ``directives`` (extra ``#SBATCH`` lines), ``env`` (extra
    environment of the job: passed through sbatch's environment, never written to the script),
    ``settle_s`` (default 5: how long to wait for the job to start).

    Result: ``{"submitted": true, "job": {...}, "script": path}`` with the job as ``slurm_jobs``
    gives it (running, pending with its reason, or ended: then ``log_tail``); or ``{"submitted":
    false, "reason": "already-running", "jobs": [...]}``.
    """
    workdir = os.path.abspath(os.path.expanduser(param_str(params, "workdir")))
    tag = param_str(params, "tag")
    if not tag.startswith(TAG_PREFIX):
        raise AgentOpError(f"tag {tag!r} must start with {TAG_PREFIX!r}", "bad-params")
    name = param_str(params, "name")
    tasks = params.get("tasks")
    argv = _words(params.get("argv"), "argv") if not tasks else []
    task_words = [_words(t, "tasks[]") for t in tasks] if isinstance(tasks, list) else None
    options = params.get("options") or {}
    if not isinstance(options, dict):
        raise AgentOpError("parameter 'options': expected a table", "bad-params")
    env_extra = params.get("env") or {}
    if not isinstance(env_extra, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env_extra.items()
    ):
        raise AgentOpError("parameter 'env': expected a table of strings", "bad-params")
    settle_s = param_number(params, "settle_s", 5.0)
    try:  # the client's relative paths would be another user's choice
        safefs.stat_file(workdir)
    except safefs.UnsafePath as e:
        raise AgentOpError(f"{e}; nothing was submitted", "unsafe-path") from None
    except OSError:
        pass  # missing: said just below
    if not os.path.isdir(workdir):
        raise AgentOpError(f"workdir {workdir} is not a directory", "bad-params")
    script_path = os.path.join(workdir, os.path.expanduser(param_str(params, "script_path")))
    lock_path = os.path.join(workdir, os.path.expanduser(param_str(params, "lock_path")))
    text = batch_script(argv, task_words, params.get("directives") or [])
    try:
        safefs.make_dirs(os.path.dirname(lock_path), private_parents=False)
        fd = safefs.open_private(lock_path, os.O_RDWR)
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two submitters of one run: one after the other
        active = _active_with_tag(tag)
        if active:
            return {
                "submitted": False,
                "reason": "already-running",
                "detail": "job "
                + ", ".join(f"{j['job_id']} ({j['state']})" for j in active)
                + f" is tagged {tag}",
                "jobs": active,
            }
        try:
            safefs.make_dirs(os.path.dirname(script_path), private_parents=False)
        except safefs.UnsafePath as e:
            raise AgentOpError(str(e), "unsafe-path") from None
        for key in ("output", "error"):
            # slurmstepd does not create the directory of the job's output: a job whose output
            # cannot be opened fails at once, with nothing written.
            where = options.get(key)
            if isinstance(where, str) and "%" not in os.path.dirname(where):
                folder = os.path.join(workdir, os.path.dirname(where))
                try:  # never through another user's link (modes as the umask says)
                    safefs.make_shared(folder)
                    safefs.stat_file(folder)  # slurmstepd opens the output through it
                except safefs.UnsafePath as e:
                    raise AgentOpError(f"{e}; nothing was submitted", "unsafe-path") from None
        safefs.write_atomic(script_path, text.encode(), mode=0o700)
        opts = {
            "job-name": name,
            "comment": tag,
            "chdir": workdir,
            "export": "ALL",
            **{str(k): v for k, v in options.items()},
        }
        env = dict(os.environ)
        env.update(env_extra)
        done = _run(sbatch_argv(opts, script_path), env)
        if done.returncode != 0:
            raise AgentOpError(
                f"sbatch refused the job: {_text(done.stderr).strip()[-800:]}", "sbatch"
            )
        job_id = _text(done.stdout).strip().split(";")[0]
        if not job_id.isdigit():
            raise AgentOpError(f"sbatch answered {job_id!r}, not a job id", "sbatch")
    finally:
        os.close(fd)
    job = _settle(job_id, settle_s)
    result: dict[str, Any] = {"submitted": True, "job_id": job_id, "job": job,
                              "script": script_path}  # fmt: skip
    if job is not None and job["state"] in TERMINAL_STATES and job.get("stdout"):
        result["log_tail"] = _tail(job["stdout"], 30)
    return result


def _job_tasks(job_id: str, all_states: bool = True) -> list[dict[str, Any]]:
    jobs, _, _ = _squeue(None, {"job_ids": [job_id], "all_states": all_states})
    return [j for j in jobs if j["job_id"] == job_id or j["array_job_id"] == job_id]


def aggregate_state(tasks: Sequence[Mapping[str, Any]]) -> str:
    """One state for a job and its array tasks: RUNNING if any runs, else PENDING if any waits,
    else the state of any task not ended (one still COMPLETING: the job has not ended), else the
    first ended state ('' for no task)."""
    states = [str(t["state"]) for t in tasks]
    for s in ("RUNNING", "COMPLETING", "CONFIGURING", "PENDING", "SUSPENDED", "REQUEUED"):
        if s in states:
            return s
    alive = [s for s in states if s not in TERMINAL_STATES]
    return (alive or states or [""])[0]


def _settle(job_id: str, settle_s: float) -> dict[str, Any] | None:
    """The job once it runs or ends, or as it is after ``settle_s`` (pending with a reason)."""
    deadline = time.monotonic() + settle_s
    job = None
    while True:
        tasks = _job_tasks(job_id)
        if tasks:
            _add_stdout(tasks, None)
            job = dict(tasks[0], state=aggregate_state(tasks))
            if job["state"] == "RUNNING" or job["state"] in TERMINAL_STATES:
                return job
        if time.monotonic() >= deadline:
            return job
        threading.Event().wait(0.1)


def _tail(path: str, lines: int) -> list[str]:
    try:  # the job's output, never through another user's link
        with os.fdopen(safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - 65536))
            data = f.read()
    except (OSError, safefs.UnsafePath):
        return []
    return _text(data).splitlines()[-lines:]


# --------------------------------------------------------------------------- cancel


def _same_job(ident: dict[str, Any], job: dict[str, Any]) -> str | None:
    """Why ``job`` (now holding the id) is not the job ``ident`` names; None when it is. A comment
    with a nonce is the job's identity (a requeue changes the submit time, not the comment)."""
    nonce = split_tag(str(ident.get("tag") or ""))[1]
    if nonce is None and ident.get("submit_time") != job.get("submit_time"):
        return (
            f"refused: job id {ident.get('job_id')} was reused (submitted at "
            f"{job.get('submit_time')}, listed {ident.get('submit_time')})"
        )
    if ident.get("tag") != job.get("comment"):
        return (
            f"refused: job {ident.get('job_id')} is not tagged {ident.get('tag')!r} "
            f"(comment {job.get('comment')!r}): not this run's job"
        )
    if job.get("uid") is not None and job.get("uid") != os.getuid():
        return f"refused: job {ident.get('job_id')} belongs to uid {job.get('uid')}"
    return None


def _sacct_state(job_id: str) -> str | None:
    """The job's state in Slurm's accounting, where the cluster keeps one (else None)."""
    try:
        done = _run(["sacct", "--noheader", "--parsable2", "-X", "-j", job_id, "-o", "State"],
                    None, timeout=10.0)  # fmt: skip
    except AgentOpError:
        return None
    if done.returncode != 0:
        return None
    states = [s.split()[0] for s in _text(done.stdout).splitlines() if s.strip()]
    return states[0] if states else None


def slurm_cancel(params: dict[str, Any]) -> dict[str, Any]:
    """``{identity: {job_id, submit_time, tag}, grace?=10, files?: [paths]}`` -> cancel the job
    (every array task of it) with grace and confirm it ended.

    Result: ``{"job_id", "outcome": "terminated" | "killed" | "cancelled" | "already-gone" |
    "refused" | "unconfirmed", "detail", "signals": [...], "state", "confirmed": bool,
    "after_s", "writers": {path: [pid]}, "tasks": [{"job_id", "state", "start_time"}]}``: each
    task as listed once the cancel is over (its end, or what is still there).
    """
    ident = params.get("identity")
    if not isinstance(ident, dict) or not isinstance(ident.get("job_id"), str):
        raise AgentOpError(
            "parameter 'identity': expected {job_id, submit_time, tag}", "bad-params"
        )
    job_id = ident["job_id"]
    if not re.match(r"^\d+$", job_id):
        raise AgentOpError(f"job id {job_id!r}: expected the number of a job", "bad-params")
    grace = param_number(params, "grace", 10.0)
    files = params.get("files") or []
    result: dict[str, Any] = {"job_id": job_id, "signals": [], "after_s": None, "writers": {},
                              "tasks": []}  # fmt: skip
    tasks = _job_tasks(job_id)
    head = next((t for t in tasks if t["job_id"] == job_id), tasks[0] if tasks else None)
    if head is None:
        acct = _sacct_state(job_id)
        return dict(result, outcome="already-gone", state=acct or "", confirmed=True,
                    detail="no such job any more (ended and forgotten by slurmctld); "
                    "nothing sent")  # fmt: skip
    why = _same_job(ident, head)
    if why:
        return dict(result, outcome="refused", state=head["state"], confirmed=False, detail=why)
    state = aggregate_state(tasks)
    if state in TERMINAL_STATES:
        return dict(result, outcome="already-gone", state=state, confirmed=True,
                    detail=f"already ended ({state}); nothing sent")  # fmt: skip
    started = time.monotonic()
    outcome = "terminated"
    ran = {t["job_id"] for t in tasks if t["state"] not in _WAITING}  # the tasks seen started
    if state == "COMPLETING":
        # Being torn down already (by another cancel, or at its own end): nothing to send; its
        # end is awaited as long as a cancel of ours would take.
        outcome = "already-gone"
        state = _wait_terminal(job_id, started + max(grace, 0.0) + KILL_CONFIRM_S)
    elif state == "PENDING":
        _scancel([job_id])
        result["signals"].append("cancel")
        outcome = "cancelled"
        state = _wait_terminal(job_id, started + KILL_CONFIRM_S)
    else:
        if any(t["state"] in _WAITING for t in tasks):
            # First no further task may start (a throttled array starts its next one as soon as
            # a running one ends), and a pending task takes no signal: cancelled without one.
            _scancel(["--state=PENDING", job_id])
            result["signals"].append("cancel-pending")
        running = _running(job_id)
        ran.update(running)
        if running:
            _scancel(["--signal=TERM", "--full", *running])
            result["signals"].append("SIGTERM")
            state = _wait_terminal(job_id, started + max(grace, 0.0))
        else:  # every task was still waiting: cancelled without a signal
            outcome = "cancelled"
            state = _wait_terminal(job_id, started + KILL_CONFIRM_S)
        running = _running(job_id) if state not in TERMINAL_STATES and state != "" else []
        ran.update(running)
        if running:
            _scancel(["--signal=KILL", "--full", *running])
            result["signals"].append("SIGKILL")
            outcome = "killed"
            state = _wait_terminal(job_id, time.monotonic() + KILL_CONFIRM_S)
        if state not in TERMINAL_STATES and state != "":
            _scancel([job_id])
            result["signals"].append("cancel")
            state = _wait_terminal(job_id, time.monotonic() + KILL_CONFIRM_S)
    result["after_s"] = round(time.monotonic() - started, 3)
    # A task cancelled while pending is given a start time by Slurm (that of its end): only the
    # tasks seen started are reported with theirs.
    result["tasks"] = [
        {"job_id": t["job_id"], "state": t["state"],
         "start_time": t["start_time"] if t["job_id"] in ran else None}
        for t in _job_tasks(job_id)
    ]  # fmt: skip
    ended = state in TERMINAL_STATES or state == ""
    if state == "":
        state = _sacct_state(job_id) or ""
    writers = _writers(files)
    result["writers"] = writers
    confirmed = ended and not writers
    if not ended:
        return dict(result, outcome="unconfirmed", state=state, confirmed=False,
                    detail=f"still {state} " + ("after scancel" if result["signals"] else
                                                "(its teardown did not end)")
                    + _tasks_text(result["tasks"]))  # fmt: skip
    if writers:
        holders = "; ".join(f"{p}: pid {', '.join(map(str, w))}" for p, w in writers.items())
        return dict(result, outcome="unconfirmed", state=state, confirmed=False,
                    detail=f"job ended ({state}) but processes still write {holders}")  # fmt: skip
    detail = {
        "terminated": "ended after SIGTERM",
        "killed": "ignored SIGTERM; ended after SIGKILL",
        "cancelled": "cancelled while pending",
        "already-gone": "was already being torn down (COMPLETING); nothing sent, then ended",
    }[outcome]
    return dict(result, outcome=outcome, state=state, confirmed=confirmed,
                detail=f"{detail} ({state or 'forgotten by slurmctld'})"
                + _tasks_text(result["tasks"]))  # fmt: skip


_WAITING = frozenset(("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"))
"""Task states of an array's part that has not started (or was requeued and waits again)."""


def _running(job_id: str) -> list[str]:
    """The ids of the job's tasks that have started and not ended (``12_0``; ``12`` for a plain
    job): the ones a signal reaches."""
    return [t["job_id"] for t in _job_tasks(job_id)
            if t["state"] not in _WAITING and t["state"] not in TERMINAL_STATES]  # fmt: skip


def _tasks_text(tasks: list[dict[str, Any]]) -> str:
    """``; tasks: 12_0 CANCELLED, 12_[1-2] CANCELLED (never started)`` for an array ('' else)."""
    if len(tasks) < 2 and not any("_" in str(t["job_id"]) for t in tasks):
        return ""
    return "; tasks: " + ", ".join(
        f"{t['job_id']} {t['state']}" + ("" if t.get("start_time") else " (never started)")
        for t in tasks
    )


def _scancel(args: list[str]) -> None:
    done = _run(["scancel", *args], None)
    err = _text(done.stderr).strip()
    # A job that ended under another cancel ("already completing or completed") or that
    # slurmctld forgot since ("Invalid job id"): nothing to signal; the wait that follows
    # confirms the end from the queue (or from accounting).
    gone = ("already completing or completed", "Invalid job id")
    if done.returncode != 0 and not any(g in err for g in gone):
        raise AgentOpError(f"scancel {' '.join(args)} failed: {err[-500:]}", "scancel")


def _wait_terminal(job_id: str, deadline: float) -> str:
    """The job's aggregated state once every task ended ('' once slurmctld forgot it), or its
    state at ``deadline``."""
    while True:
        tasks = _job_tasks(job_id)
        state = aggregate_state(tasks)
        if state == "" or state in TERMINAL_STATES:
            return state
        if time.monotonic() >= deadline:
            return state
        threading.Event().wait(0.1)


def _writers(files: Any) -> dict[str, list[int]]:
    if not isinstance(files, list):
        return {}
    out = {}
    for path in files:
        if isinstance(path, str):
            pids = writers_of(os.path.expanduser(path))
            if pids:
                out[path] = pids
    return out
