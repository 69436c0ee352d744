"""Runs on a Slurm cluster, from the laptop: jobs as runs, and the Slurm variants of the plan steps.

A host with ``kind = "slurm"`` is a login node. Its agent lists the user's jobs (``slurm_jobs``)
and scans the runs' data files on the shared filesystem (``scan``) in the same refresh. On Slurm
the job is the run's unit (Slurm holds its processes in the node's cgroup), and a run's jobs are
the ones runwatch submitted for it or that it adopted (``runwatch adopt RUN --job ID``): their
ids are kept in the state dir per config and run (:func:`record_job`). The comment
``runwatch:<run>:<nonce>`` that submitted jobs carry is shown, never trusted on its own: anyone
can write it, so a job that carries it without being recorded is shown as not the run's and never
cancelled. A recorded job is the run's while the job holding its id carries the nonce recorded
with it (the submit time, which ``scontrol requeue`` changes, does not decide); a job recorded
without a nonce (adopted, or recorded before nonces) is the run's while its submit time is the
recorded one. The
run's state is the scheduler's: running, pending (with the reason), or stopped once its job ended.

Kill is ``scancel`` with grace, confirmed by the job's end (``slurm_cancel``); actions on one
run (kill, adopt, the plan's stop and launch) hold the run's lock in the state dir, so they
happen one after the other, and every cancel is audited, a failed one too. Launch and restart go
through the same plan as for processes (format check, fingerprint, data repair); only the stop
(``scancel``), the GPU wait (Slurm frees a job's GPUs with it) and the launch (``sbatch``,
confirmed running or reported pending with its reason) differ: :func:`plan_steps` gives them to
the step runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import posixpath
import re
import secrets
import shlex
import time
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import msgspec

from supervisor import display, replies, runlock
from supervisor.agent.slurm import (
    ACTIVE_STATES,
    KILL_CONFIRM_S,
    TAG_PREFIX,
    TERMINAL_STATES,
    aggregate_state,
    split_tag,
)
from supervisor.agentclient import AgentClient, as_data
from supervisor.argv import apply_overrides
from supervisor.config import Config, HostConfig, RunConfig
from supervisor.errors import AgentError, OutcomeUnknown, RunwatchError, StepFailed, UsageError
from supervisor.fingerprint import fingerprint_of
from supervisor.model import JobTask, JobView, RunState, Snapshot
from supervisor.paths import private_dir, state_dir, write_private

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from pathlib import Path

    from supervisor.agent.protocol import SlurmSubmitResult
    from supervisor.hosts import Host
    from supervisor.plan import Plan, Step

RUNNING_STATES = frozenset(
    ("RUNNING", "COMPLETING", "CONFIGURING", "RESIZING", "SIGNALING", "STOPPED", "STAGE_OUT")
)
"""States in which the job's processes may still write: a job being torn down (``COMPLETING``)
or stopped (``STOPPED``) still has them."""
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def tag_of(run: str) -> str:
    """The comment runwatch gives a run's jobs: ``runwatch:<run>`` (shown, never trusted)."""
    return TAG_PREFIX + run


def is_slurm(hc: HostConfig) -> bool:
    return hc.kind == "slurm"


# --------------------------------------------------------------------------- ownership

KEEP_JOBS = 20
"""Job ids kept per run and host, the newest: far more than a run has jobs in the queue."""


class OwnedJob(msgspec.Struct, kw_only=True):
    """A job that runwatch submitted for a run, or that the run adopted."""

    run: str
    host: str
    job_id: str
    submit_time: int | None
    """As listed when it was recorded: a job now holding the id with another submit time is
    someone else's (an id reused after a controller restart)."""
    how: Literal["submitted", "adopted"]
    time: float
    nonce: str | None = None
    """The nonce of the comment runwatch gave the job at submission (``runwatch:<run>:<nonce>``):
    with one, the job is this record's while its comment holds it, whatever its submit time."""


class _Owned(msgspec.Struct, kw_only=True):
    config: str
    """The config's resolved path (what the key of the directory is the hash of)."""
    jobs: list[OwnedJob] = []


def _state(config: Config) -> Path:
    return state_dir() / "slurm" / config.key


def _jobs_file(config: Config) -> Path:
    """``state_dir()/slurm/<config key>/jobs.json``."""
    return _state(config) / "jobs.json"


def _load(config: Config) -> _Owned:
    path = _jobs_file(config)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _Owned(config=os.path.realpath(config.path) if config.path else "")
    except OSError as e:
        raise RunwatchError(f"{path}: cannot read the run's Slurm jobs: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    try:
        return msgspec.json.decode(raw, type=_Owned)
    except msgspec.DecodeError as e:
        raise RunwatchError(
            f"{path}: the record of the Slurm jobs runwatch submitted is damaged: {e}",
            "look at it; a job not recorded any more can be taken back with `runwatch adopt`",
        ) from None


def owned_jobs(config: Config, host: str) -> dict[str, OwnedJob]:
    """Job id -> its record, for the jobs on ``host`` that runs of ``config`` submitted or
    adopted (the newest record of an id)."""
    return {j.job_id: j for j in _load(config).jobs if j.host == host}


def record_job(
    config: Config,
    run: str,
    host: str,
    job_id: str,
    submit_time: int | None,
    how: Literal["submitted", "adopted"],
    nonce: str | None = None,
) -> OwnedJob:
    """Keep ``job_id`` as ``run``'s on ``host`` (written at once, 0600, atomically)."""
    rec = OwnedJob(run=run, host=host, job_id=job_id, submit_time=submit_time, how=how,
                   time=time.time(), nonce=nonce)  # fmt: skip
    lock = private_dir(_state(config)) / "jobs.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two runs of one config submitting: no lost record
        owned = _load(config)
        jobs = [j for j in owned.jobs if (j.host, j.job_id) != (host, job_id)] + [rec]
        mine = [j for j in jobs if (j.run, j.host) == (run, host)]
        dropped = {id(j) for j in mine[: max(0, len(mine) - KEEP_JOBS)]}
        owned.jobs = [j for j in jobs if id(j) not in dropped]
        write_private(_jobs_file(config), msgspec.json.encode(owned) + b"\n")
    finally:
        os.close(fd)
    return rec


def run_lock(
    config: Config,
    run: str,
    wait_s: float,
    on_wait: Callable[[str], None] | None = None,
    action: str = "slurm",
) -> contextlib.AbstractAsyncContextManager[None]:
    """Hold the lock of ``run`` (``supervisor.runlock``): one action on a run at a time, from any
    runwatch of this user, processes and jobs alike."""
    return runlock.hold(config, run, wait_s, action, on_wait)


# --------------------------------------------------------------------------- listing


JOBS_DEADLINE_S = 10.0
"""Seconds the listing of a refresh may take on the login node (squeue, scontrol), whatever the
command timeout; past it the last listing is shown, marked stale."""


async def refresh(
    host: Host,
    params: dict[str, Any],
    timeout: float,
    owned: Mapping[str, OwnedJob],
    last: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Slurm host's refresh reply: its jobs (``slurm``: the tagged ones and those of
    ``owned``, which an adopted job may not be) and the scan of the runs' files, in one
    concurrent pair of requests; no process listing (the runs' processes are on compute
    nodes).

    The listing has a deadline of its own (:data:`JOBS_DEADLINE_S`, at most half the command
    timeout): a squeue that hangs or floods fails that listing only, and ``last`` (the last
    good one) is shown instead, with ``notes`` saying how old and why; without a last one the
    refresh fails."""
    deadline = min(JOBS_DEADLINE_S, timeout / 2)
    agent = AgentClient(host)
    listing = agent.slurm_jobs(
        all_states=True, with_ids=sorted(owned), deadline_s=deadline, timeout=timeout
    )
    listed = asyncio.ensure_future(listing)
    try:
        scan = await agent.scan(files=params.get("files") or [], timeout=timeout)
    except BaseException:
        listed.cancel()
        raise
    await asyncio.wait([listed])
    notes: list[str] = []
    try:
        jobs: Mapping[str, Any] = listed.result()
    except AgentError as e:
        if last is None:
            raise
        age = time.time() - float(last.get("time") or 0)
        reason = str(e).split("): ", 1)[-1].removeprefix("AgentOpError: ")
        notes.append(f"Slurm jobs as of {display.duration(age)} ago: {reason}")
        jobs = dict(last)
    replies.decode(jobs, replies.SlurmJobs, host.name, "slurm_jobs")
    return {
        "processes": [],
        "files": scan.get("files", {}),
        "gpu": None,
        "slurm": jobs,
        "notes": notes,
    }


class HostJobs(NamedTuple):
    """The jobs of a login node's listing, by run."""

    runs: dict[str, JobView]
    """Run name -> its job: of the jobs it submitted or adopted, the active one, else the one
    submitted last."""
    foreign: dict[str, list[JobView]]
    """Run name -> the jobs that carry its tag but that it neither submitted nor adopted."""


def job_views(reply: Mapping[str, Any] | None, owned: Mapping[str, OwnedJob]) -> HostJobs:
    """The runs' jobs in a ``slurm_jobs`` reply: a job is a run's when ``owned`` records its id
    (and its submit time, where one was recorded) for that run; a tag alone makes it foreign.
    Array tasks are gathered under their array job."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for j in (reply or {}).get("jobs") or []:
        groups.setdefault(str(j.get("array_job_id") or j.get("job_id")), []).append(j)
    runs: dict[str, JobView] = {}
    foreign: dict[str, list[JobView]] = {}
    for job_id, tasks in groups.items():
        view = _view(job_id, tasks)
        run = owner(tasks[0], owned)
        if run is not None:
            old = runs.get(run)
            if old is None or _rank(view) > _rank(old):
                runs[run] = view
        elif view.tag.startswith(TAG_PREFIX):
            foreign.setdefault(split_tag(view.tag)[0][len(TAG_PREFIX) :], []).append(view)
    return HostJobs(runs, foreign)


def owner(job: Mapping[str, Any], owned: Mapping[str, OwnedJob]) -> str | None:
    """The run that submitted or adopted ``job`` (one line of a ``slurm_jobs`` reply), if any."""
    rec = owned.get(str(job.get("array_job_id") or job.get("job_id")))
    return rec.run if rec is not None and is_recorded(rec, job) else None


def is_recorded(rec: OwnedJob, job: Mapping[str, Any]) -> bool:
    """Whether ``job`` (holding ``rec``'s id) is the job ``rec`` recorded: its comment holds the
    recorded nonce; for a record without one, its submit time is the recorded one."""
    if rec.nonce is not None:
        return split_tag(str(job.get("comment") or ""))[1] == rec.nonce
    return rec.submit_time in (None, job.get("submit_time"))


def not_ours(jobs: list[JobView]) -> str | None:
    """What a run's detail says of the active jobs that carry its tag without being its own."""
    shown = [
        f"job {v.job_id} tagged {v.tag}, not submitted or adopted by this runwatch"
        for v in jobs
        if v.state in ACTIVE_STATES
    ]
    return "; ".join(shown) or None


def _rank(v: JobView) -> tuple[bool, int]:
    return (v.state in ACTIVE_STATES, v.submit_time or 0)


def _view(job_id: str, tasks: Sequence[Mapping[str, Any]]) -> JobView:
    tasks = sorted(tasks, key=lambda t: (t.get("array_task_id") is None, t.get("array_task_id")))
    state = aggregate_state(tasks)
    head = tasks[0]
    waiting = [t for t in tasks if t.get("state") == "PENDING" and t.get("reason")]
    elapsed = [int(t["elapsed_s"]) for t in tasks if isinstance(t.get("elapsed_s"), int)]
    nodes = sorted({str(t.get("nodes")) for t in tasks if t.get("nodes")})
    return JobView(
        job_id=job_id,
        submit_time=head.get("submit_time"),
        tag=str(head.get("comment") or ""),
        name=str(head.get("name") or ""),
        state=state,
        reason=str(waiting[0]["reason"]) if waiting and state == "PENDING" else "",
        nodes=",".join(nodes),
        elapsed_s=max(elapsed) if elapsed else None,
        time_limit_s=head.get("time_limit_s"),
        partition=str(head.get("partition") or ""),
        stdout=next((t.get("stdout") for t in tasks if t.get("stdout")), None),
        tasks=[
            JobTask(
                job_id=str(t.get("job_id")),
                task=t.get("array_task_id"),
                state=str(t.get("state") or ""),
                reason=str(t.get("reason") or ""),
                nodes=str(t.get("nodes") or ""),
                elapsed_s=t.get("elapsed_s"),
                stdout=t.get("stdout"),
            )
            for t in tasks
        ],
    )


def run_state(job: JobView | None) -> RunState:
    """``running`` while a task runs, ``pending`` while it waits, else ``stopped``."""
    if job is None:
        return "stopped"
    if job.state in RUNNING_STATES:
        return "running"
    if job.state in ACTIVE_STATES:
        return "pending"
    return "stopped"


def dataset_alive(job: JobView | None, dataset: str, datasets: list[str]) -> bool:
    """Whether the writer of ``dataset`` runs: its array task, or the whole job."""
    if job is None:
        return False
    for t in job.tasks:
        if t.task is not None and t.task < len(datasets) and datasets[t.task] == dataset:
            return t.state in RUNNING_STATES
    if any(t.job_id.endswith("]") or t.task is not None for t in job.tasks):
        return False  # an array whose task for this dataset is still pending (or unknown)
    return job.state in RUNNING_STATES


def job_output(snapshot: Snapshot | None, run: str) -> str | None:
    """The output file of a run's job in ``snapshot`` (its first array task's), if known."""
    for h in snapshot.hosts if snapshot is not None else []:
        for r in h.runs:
            if r.name == run and r.job is not None:
                return r.job.stdout
    return None


def describe(job: JobView) -> str:
    """``job 12 RUNNING on vm, 42 s of 2 h`` / ``job 12 PENDING (Resources)``."""
    text = f"job {job.job_id} {job.state}"
    if job.reason:
        text += f" ({job.reason})"
    if job.nodes:
        text += f" on {job.nodes}"
    if job.elapsed_s is not None:
        limit = display.duration(job.time_limit_s) if job.time_limit_s is not None else "no limit"
        text += f", {display.duration(job.elapsed_s)} of {limit}"
    if len(job.tasks) > 1:
        counts: dict[str, int] = {}
        for t in job.tasks:
            counts[t.state] = counts.get(t.state, 0) + 1
        text += " [" + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) + "]"
    return text


# --------------------------------------------------------------------------- cancel


def cancel_timeout(grace: float, command_timeout: float) -> float:
    """How long one ``slurm_cancel`` may take: the grace, three confirmation waits, a command."""
    return grace + 3 * KILL_CONFIRM_S + command_timeout


async def cancel(
    host: Host, job: JobView, grace: float, files: list[str], command_timeout: float
) -> dict[str, Any]:
    """``scancel`` the job (every task) with grace; the agent's ``slurm_cancel`` result."""
    out = await AgentClient(host).slurm_cancel(
        identity=job.identity,
        grace=grace,
        files=files,
        timeout=cancel_timeout(grace, command_timeout),
    )
    replies.decode(out, replies.SlurmCancel, host.name, "slurm_cancel")
    return as_data(out)


async def host_jobs(config: Config, host: Host, hc: HostConfig) -> HostJobs:
    """The runs' jobs on a login node as its queue holds them now (ended ones included)."""
    owned = owned_jobs(config, hc.name)
    reply = await AgentClient(host).slurm_jobs(
        all_states=True, with_ids=sorted(owned), timeout=hc.command_timeout
    )
    replies.decode(reply, replies.SlurmJobs, hc.name, "slurm_jobs")
    return job_views(reply, owned)


async def cancel_run(
    config: Config,
    host: Host,
    run: RunConfig,
    grace: float,
    files: list[str],
    *,
    expect: str | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``scancel`` the run's job with grace and confirm its end: the agent's ``slurm_cancel``
    result.

    Under the run's lock, from a listing made under it, so that concurrent kills of one run
    act one after the other (the later ones find the job ended: ``already-gone``). The job is
    the run's queued or running one, or ``expect`` (the id of the job the caller showed) in
    whatever state it is now; ``expect=""``: the caller showed none, so none is cancelled. A job
    that carries the run's tag without being the run's is refused. Every attempt is audited,
    failures included; "no job at all" is not an attempt."""
    hc = config.host(run.host)
    timeout = cancel_timeout(grace, hc.command_timeout)
    async with run_lock(config, run.name, timeout + hc.command_timeout, on_wait):
        try:
            jobs = await host_jobs(config, host, hc)
        except BaseException as e:
            audit_cancel(config.key, hc.name, run.name, None, _failure(e, "listing the queue"))
            raise
        job = jobs.runs.get(run.name)
        active = job is not None and job.state in ACTIVE_STATES
        if job is not None and active and expect is not None and job.job_id != expect:
            raise RunwatchError(
                f"run {run.name}: its job is now {describe(job)}, not the one shown"
                + (f" (job {expect})" if expect else "")
                + ": nothing cancelled",
                "look again (`runwatch status`), then kill again",
            )
        if job is None or (not active and job.job_id != expect):
            _refuse_foreign(config.key, hc.name, run.name, jobs.foreign.get(run.name, []))
            raise RunwatchError(
                f"run {run.name!r} has no queued or running Slurm job",
                f"see `runwatch status {run.name}` or `runwatch ps --host {hc.name}`",
            )
        try:
            out = await cancel(host, job, grace, files, hc.command_timeout)
        except BaseException as e:
            audit_cancel(config.key, hc.name, run.name, job, _failure(e, "scancel"))
            raise
        audit_cancel(config.key, hc.name, run.name, job, out)
        return out


def _refuse_foreign(config: str, host: str, run: str, foreign: list[JobView]) -> None:
    """Refuse (audited) to cancel the active jobs that only carry ``run``'s tag."""
    active = [v for v in foreign if v.state in ACTIVE_STATES]
    if not active:
        return
    ids = ", ".join(v.job_id for v in active)
    detail = (
        f"job {ids} tagged {tag_of(run)}, not submitted or adopted by this runwatch: "
        "not cancelled (anyone can tag a job)"
    )
    for v in active:
        audit_cancel(
            config, host, run, v, {"outcome": "refused", "detail": detail, "confirmed": False}
        )
    raise RunwatchError(
        f"run {run}: {detail}",
        f"if it is the run's, take it with `runwatch adopt {run} --job {active[0].job_id}`, "
        "then kill again",
    )


def _failure(e: BaseException, what: str) -> dict[str, Any]:
    text = str(e).strip().split("\n", 1)[0] or type(e).__name__
    return {"outcome": "error", "detail": f"{what} failed: {text}", "confirmed": False}


def audit_cancel(
    config: str, host: str, run: str, job: JobView | None, out: dict[str, Any]
) -> dict[str, Any]:
    """Append a cancel to the audit log (action ``kill``, the job's identity; None when it
    failed before a job was found)."""
    from supervisor import audit

    return audit.record(
        "kill",
        config=config,
        host=host,
        run=run,
        ok=bool(out.get("confirmed")),
        identity=job.identity if job is not None else None,
        steps=[
            {
                "name": f"job {job.job_id}" if job is not None else "slurm_jobs",
                "ok": bool(out.get("confirmed")),
                "detail": f"{out.get('outcome')}: {out.get('detail')}",
            }
        ],
        outcome=out.get("outcome"),
        signals=out.get("signals"),
        state=out.get("state"),
    )


# --------------------------------------------------------------------------- adopt


async def find_job(config: Config, host: Host, run: RunConfig, job_id: str) -> JobView:
    """The job ``job_id`` of the run's login node, checked for adoption by ``run``: a job of
    this user, queued or running, not recorded for any run yet, while ``run`` has no other
    active job."""
    if not re.fullmatch(r"[0-9]+", job_id):
        raise UsageError(
            f"--job {job_id!r}: expected the number of a job",
            "an array is adopted whole: give its job id (12, not 12_3)",
        )
    hc = config.host(run.host)
    owned = owned_jobs(config, hc.name)
    reply = await AgentClient(host).slurm_jobs(
        tag_prefix="", all_states=True, timeout=hc.command_timeout
    )
    replies.decode(reply, replies.SlurmJobs, hc.name, "slurm_jobs")
    tasks = [j for j in reply.get("jobs") or []
             if str(j.get("array_job_id") or j.get("job_id")) == job_id]  # fmt: skip
    if not tasks:
        raise RunwatchError(
            f"no job {job_id} of yours in the queue of {hc.name}",
            "check the id with `squeue --me`; another user's job cannot be adopted",
        )
    view = _view(job_id, tasks)
    rec = owned.get(job_id)
    if rec is not None and is_recorded(rec, tasks[0]):
        raise RunwatchError(
            f"job {job_id} is already run {rec.run}'s ({rec.how})",
            "nothing to adopt" if rec.run == run.name else f"it stays {rec.run}'s",
        )
    mine = job_views(reply, owned).runs.get(run.name)
    if view.state not in ACTIVE_STATES:
        raise RunwatchError(f"job {job_id} has ended ({view.state}): nothing to adopt")
    if mine is not None and mine.state in ACTIVE_STATES:
        raise RunwatchError(
            f"run {run.name} already has {describe(mine)}",
            f"one job per run: stop it first (`runwatch kill {run.name}`)",
        )
    return view


async def adopt(config: Config, host: Host, run: RunConfig, shown: JobView) -> dict[str, Any]:
    """Record ``shown`` (as :func:`find_job` gave it) as ``run``'s job, under the run's lock
    and after checking again that the job holding the id is still the one shown; audited
    (action ``adopt``). Returns ``{"run", "job_id", "submit_time", "tag", "detail"}``."""
    from supervisor import audit

    hc = config.host(run.host)
    async with run_lock(config, run.name, 2 * hc.command_timeout):
        now = await find_job(config, host, run, shown.job_id)
        if now.submit_time != shown.submit_time:
            raise RunwatchError(
                f"job {shown.job_id} is not the job shown any more (submitted at "
                f"{now.submit_time}, shown {shown.submit_time}): nothing adopted",
                f"look again: `runwatch adopt {run.name} --job {shown.job_id}`",
            )
        # A comment with a nonce (a job runwatch submitted whose record was lost) pins the job
        # from now on, as a submission's does.
        record_job(config, run.name, hc.name, now.job_id, now.submit_time, "adopted",
                   split_tag(now.tag)[1])  # fmt: skip
    detail = f"{describe(now)}, comment {now.tag!r}, name {now.name!r}: adopted as {run.name}'s"
    audit.record(
        "adopt",
        config=config.key,
        host=hc.name,
        run=run.name,
        ok=True,
        identity=now.identity,
        steps=[{"name": f"job {now.job_id}", "ok": True, "detail": detail}],
    )
    return {"run": run.name, "job_id": now.job_id, "submit_time": now.submit_time,
            "tag": now.tag, "detail": detail}  # fmt: skip


# --------------------------------------------------------------------------- submit


def submit_params(
    config: Config, run: RunConfig, argv: list[str], env: dict[str, str], paths: dict[str, str]
) -> dict[str, Any]:
    """The ``slurm_submit`` request of a run: its argv (or one per dataset for an array), its
    sbatch options, its tag with a new nonce; the script and lock in ``<out>/.runwatch/``."""
    sl = run.slurm
    datasets = config.run_datasets(run)
    array = sl is not None and sl.array and len(datasets) > 0
    side = posixpath.join(paths["out"], ".runwatch")
    safe = _SAFE.sub("_", run.name)
    default_out = posixpath.join(side, "slurm-%A_%a.log" if array else "slurm-%j.log")
    output = sl.output if sl is not None and sl.output else None
    if output is None:
        output = run.log if run.log and not array else default_out
    options: dict[str, Any] = {"output": posixpath.join(paths["workdir"], output)}
    if sl is not None:
        for key, value in (
            ("partition", sl.partition),
            ("gres", sl.gres),
            ("gpus", sl.gpus),
            ("time", sl.time),
            ("nodes", sl.nodes),
            ("cpus-per-task", sl.cpus_per_task),
        ):
            if value is not None:
                options[key] = value
    params: dict[str, Any] = {
        "workdir": paths["workdir"],
        # The nonce is the job's identity for runwatch: recorded with its id, it survives a
        # requeue (which changes the submit time).
        "tag": f"{tag_of(run.name)}:{secrets.token_hex(8)}",
        "name": (sl.job_name if sl is not None and sl.job_name else f"rw-{run.name}"),
        "script_path": posixpath.join(side, f"{safe}.sbatch"),
        "lock_path": posixpath.join(side, f"{safe}.submit.lock"),
        "options": options,
        "directives": list(sl.extra) if sl is not None else [],
        "env": env,
        "settle_s": max(run.settle_seconds, 1.0),
    }
    if array:
        assert sl is not None
        spec = f"0-{len(datasets) - 1}"
        if sl.array_max_running:
            spec += f"%{sl.array_max_running}"
        options["array"] = spec
        params["tasks"] = [apply_overrides(argv, [("--datasets", ds)]) for ds in datasets]
    else:
        params["argv"] = argv
    return params


# --------------------------------------------------------------------------- plan steps


class _Runner(Protocol):
    """What the Slurm steps use of ``supervisor.steps``' step runner."""

    engine: Any
    plan: Plan
    host: Any
    hc: HostConfig
    identity: dict[str, Any] | None

    async def set(self, step: Step, state: Any, detail: str = "") -> None: ...

    async def read_args(self, step: Step) -> str:
        """The argument reading of the plan's command line; raises StepFailed on a refusal."""
        ...

    @property
    def agent(self) -> AgentClient: ...


def plan_steps(runner: _Runner) -> dict[str, Callable[[Step], Awaitable[None]]]:
    """The Slurm variants of a plan's ``stop``, ``gpu-release`` and ``launch`` steps."""

    async def stop(step: Step) -> None:
        await stop_job(runner, step)

    async def gpu_release(step: Step) -> None:
        await runner.set(step, "skipped", "Slurm frees the job's GPUs when the job ends")

    async def launch(step: Step) -> None:
        await submit(runner, step)

    return {"stop": stop, "gpu-release": gpu_release, "launch": launch}


def would(plan: Plan, name: str) -> str | None:
    """What a dry run's Slurm step would do (None: as for processes)."""
    if name == "stop":
        if plan.job is None:
            return "no job of the run is queued or running"
        return f"would scancel job {plan.job.job_id} (TERM, KILL after the grace) and confirm"
    if name == "gpu-release":
        return "Slurm frees the job's GPUs when the job ends"
    if name == "launch":
        return "would sbatch the run as a job tagged " + tag_of(plan.run.name)
    return None


def login_kill(hc: HostConfig, pid: int) -> str:
    """The command that stops process ``pid`` of the login node ``hc``, run from here."""
    if hc.local:
        return f"kill {pid}"
    where = shlex.quote(f"{hc.user}@{hc.address or hc.name}" if hc.user else hc.address or hc.name)
    port = f" -p {hc.port}" if hc.port else ""
    return f"ssh{port} {where} kill {pid}"


async def workdir_jobs(runner: _Runner) -> None:
    """The writers step's question to Slurm: a job of this user that is active in the run's
    workdir (the same directory, by identity) and is neither the run's own job nor another run's
    of this config writing other files may write the run's files: the launch is refused naming
    the job and the command that stops it (or adopts it, when it is the run's)."""
    plan = runner.plan
    config, hc = runner.engine.config, runner.hc
    owned = owned_jobs(config, hc.name)
    reply = await runner.agent.slurm_jobs(
        in_workdir=plan.paths["workdir"], timeout=hc.command_timeout
    )
    replies.decode(reply, replies.SlurmJobs, hc.name, "slurm_jobs")
    mine = plan.job.job_id if plan.job is not None else None
    files = set(plan.layout.data_files.values())
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for j in reply.get("jobs") or []:
        if j.get("state") in ACTIVE_STATES:
            groups.setdefault(str(j.get("array_job_id") or j.get("job_id")), []).append(j)
    others = []
    for job_id, tasks in sorted(groups.items()):
        run = owner(tasks[0], owned)
        if job_id == mine:
            continue
        if run is not None and run != plan.run.name and not files & _data_files(config, run):
            continue  # another run of this config in a shared workdir, writing its own files
        others.append(_view(job_id, tasks))
    if not others:
        return
    who = "; ".join(f"{describe(v)}, name {v.name!r}, comment {v.tag!r}" for v in others)
    run = shlex.quote(plan.run.name)
    ids = " ".join(v.job_id for v in others)
    raise StepFailed(
        f"one writer per data file: Slurm job of yours in the run's workdir "
        f"{plan.paths['workdir']}: {who}; nothing was stopped or submitted",
        f"stop it first (`scancel {ids}` on {hc.name}), or, if it is this run's, "
        f"`runwatch adopt {run} --job {others[0].job_id}` and restart the run",
    )


def _data_files(config: Config, run: str) -> set[str]:
    """The data files of the config's run ``run`` (all of them, unknown: a run the config no
    longer has)."""
    from supervisor.layout import layout_of

    rc = next((r for r in config.runs if r.name == run), None)
    return set(layout_of(config, rc).data_files.values()) if rc is not None else {"*unknown*"}


async def stop_job(runner: _Runner, step: Step) -> None:
    plan = runner.plan
    job: JobView | None = plan.job
    if job is None:
        await runner.set(step, "skipped", "no job of the run is queued or running")
        return
    files = [posixpath.join(plan.paths["out"], ds, plan.run.data_file) for ds in plan.datasets]
    grace, command_timeout = plan.run.stop_grace_seconds, runner.hc.command_timeout
    config = runner.engine.config
    async with run_lock(config, plan.run.name, cancel_timeout(grace, command_timeout)):
        try:
            out = await cancel(runner.host, job, grace, files, command_timeout)
        except OutcomeUnknown as e:
            # The reply was lost: the cancel is idempotent, and its second answer is the proof.
            await runner.host.connect()
            step.data["lost"] = str(e)
            out = await cancel(runner.host, job, 0.0, files, command_timeout)
    step.data["cancel"] = out
    if out.get("outcome") == "refused":
        raise StepFailed(
            f"scancel refused: {out.get('detail')}",
            "the job listed is no longer the run's; refresh and check the queue",
        )
    if not out.get("confirmed"):
        raise StepFailed(
            f"job {job.job_id}: {out.get('detail')}",
            "nothing was launched; look at the job with squeue / scontrol show job",
        )
    step.detail = f"job {job.job_id}: {out.get('outcome')} - {out.get('detail')}; end confirmed"


async def submit(runner: _Runner, step: Step) -> None:
    plan = runner.plan
    # The argument reading again right before the submission, as every process start has it
    # in its gate.
    await runner.read_args(step)
    config = runner.engine.config
    params = submit_params(config, plan.run, plan.argv, plan.env, plan.paths)
    timeout = float(params["settle_s"]) + 2 * runner.hc.command_timeout
    # Another action on the run may be a cancel: wait as long as one takes, then this submission.
    wait = cancel_timeout(plan.run.stop_grace_seconds, runner.hc.command_timeout) + timeout
    async with run_lock(config, plan.run.name, wait):
        try:
            reply = await runner.agent.slurm_submit(**params, timeout=timeout)
        except OutcomeUnknown as e:
            reply = await _reconcile(runner, params["tag"], str(e))
        replies.decode(reply, replies.SlurmSubmit, runner.hc.name, "slurm_submit")
        step.data["submit"] = reply
        if not reply.get("submitted"):
            raise StepFailed(
                reply.get("detail") or "already queued or running",
                "no second job is submitted while one carries the run's tag (another runwatch's, "
                f"a submission in progress, or someone's): if it is the run's, `runwatch adopt "
                f"{plan.run.name} --job ID`; refresh to see it",
            )
        job: Mapping[str, Any] = reply.get("job") or {}
        job_id = str(reply.get("job_id"))
        # Recorded before anything else: from now on this job, and no other of its tag, is
        # the run's.
        record_job(config, plan.run.name, runner.hc.name, job_id, job.get("submit_time"),
                   "submitted", split_tag(params["tag"])[1])  # fmt: skip
    state = str(job.get("state") or "")
    if state in TERMINAL_STATES:
        tail = "\n    ".join(reply.get("log_tail") or []) or "(the output is empty)"
        raise StepFailed(
            f"job {job_id} ended at once ({state}"
            + (f", {job['reason']}" if job.get("reason") else "")
            + f"); last lines of {job.get('stdout')}:\n    {tail}",
            "fix the cause shown in the output, then launch again",
        )
    identity = {"job_id": job_id, "submit_time": job.get("submit_time"), "tag": params["tag"]}
    for ds, path in plan.fingerprints.items():
        data = dict(fingerprint_of(plan.run, plan.argv, config), dataset=ds, identity=identity)
        hashes = {ds: plan.prompt_files[ds]} if ds in plan.prompt_files else {}
        await runner.agent.write_fingerprint(
            path=path, data=data, workdir=plan.paths["workdir"], hash_files=hashes
        )
    runner.identity = identity
    where = f" on {job['nodes']}" if job.get("nodes") else ""
    why = f" ({job.get('reason') or 'not scheduled yet'})" if state == "PENDING" else ""
    step.detail = f"job {job_id} {state or 'submitted'}{why}{where} (output {job.get('stdout')})"


async def _reconcile(runner: _Runner, tag: str, why: str) -> SlurmSubmitResult:
    """The submission's outcome when its reply was lost: the job whose comment is this
    submission's ``tag`` (its nonce is this submission's alone)."""
    await runner.host.connect()
    reply = await runner.agent.slurm_jobs()
    mine = [j for j in reply.get("jobs") or [] if j.get("comment") == tag]
    if mine:
        job_id = str(mine[0].get("array_job_id") or mine[0].get("job_id"))
        return {"submitted": True, "job_id": job_id, "job": mine[0], "detail": f"reconciled: {why}"}
    return {"submitted": False, "detail": f"the connection dropped during sbatch ({why}) and "
            "no job of the run is queued now"}  # fmt: skip
