"""Runs on a Slurm cluster, from the laptop: jobs as runs, and the Slurm variants of the plan steps.

A host with ``kind = "slurm"`` is a login node. Its agent lists the user's jobs (``slurm_jobs``)
and scans the runs' data files on the shared filesystem (``scan``) in the same refresh; a job maps
to its run by its tag, the comment ``runwatch:<run>``. The run's state is the scheduler's: running,
pending (with the reason), or stopped once its job ended.

Kill is ``scancel`` with grace, confirmed by the job's terminal state (``slurm_cancel``). Launch
and restart go through the same plan as for processes (format check, fingerprint, data repair);
only the stop (``scancel``), the GPU wait (Slurm frees a job's GPUs with it) and the launch
(``sbatch``, confirmed running or reported pending with its reason) differ:
:func:`plan_steps` gives them to the step runner.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import time
from typing import TYPE_CHECKING, Any, Protocol

from supervisor import display, replies
from supervisor.agent.slurm import ACTIVE_STATES, KILL_CONFIRM_S, TAG_PREFIX, TERMINAL_STATES
from supervisor.argv import apply_overrides
from supervisor.config import Config, HostConfig, RunConfig
from supervisor.errors import OutcomeUnknown
from supervisor.fingerprint import fingerprint_of
from supervisor.model import JobTask, JobView, RunState, Snapshot
from supervisor.plan import StepFailed

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from supervisor.hosts import Host
    from supervisor.plan import Plan, Step

RUNNING_STATES = frozenset(("RUNNING", "COMPLETING", "CONFIGURING"))
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def tag_of(run: str) -> str:
    """The comment that marks a run's jobs: ``runwatch:<run>``."""
    return TAG_PREFIX + run


def is_slurm(hc: HostConfig) -> bool:
    return hc.kind == "slurm"


# --------------------------------------------------------------------------- listing


async def refresh(host: Host, params: dict[str, Any], timeout: float) -> dict[str, Any]:
    """A Slurm host's refresh reply: its jobs (``slurm``) and the scan of the runs' files, in
    one concurrent pair of requests; no process listing (the runs' processes are on compute
    nodes)."""
    scan, jobs = await asyncio.gather(
        host.request("scan", {"files": params.get("files") or []}, timeout=timeout),
        host.request("slurm_jobs", {"all_states": True}, timeout=timeout),
    )
    replies.decode(jobs, replies.SlurmJobs, host.name, "slurm_jobs")
    return {"processes": [], "files": scan.get("files", {}), "gpu": None, "slurm": jobs}


def job_views(reply: dict[str, Any] | None) -> dict[str, JobView]:
    """Run name -> its job, from a ``slurm_jobs`` reply: the active job of the run's tag, else
    the one submitted last. Array tasks are gathered under their array job."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for j in (reply or {}).get("jobs") or []:
        comment = str(j.get("comment") or "")
        if not comment.startswith(TAG_PREFIX):
            continue
        key = str(j.get("array_job_id") or j.get("job_id"))
        groups.setdefault((comment[len(TAG_PREFIX) :], key), []).append(j)
    best: dict[str, JobView] = {}
    for (run, job_id), tasks in groups.items():
        view = _view(job_id, tasks)
        old = best.get(run)
        if old is None or _rank(view) > _rank(old):
            best[run] = view
    return best


def _rank(v: JobView) -> tuple[bool, int]:
    return (v.state in ACTIVE_STATES, v.submit_time or 0)


def _view(job_id: str, tasks: list[dict[str, Any]]) -> JobView:
    tasks = sorted(tasks, key=lambda t: (t.get("array_task_id") is None, t.get("array_task_id")))
    states = [str(t.get("state") or "") for t in tasks]
    state = next(
        (s for s in ("RUNNING", "COMPLETING", "CONFIGURING", "PENDING", "SUSPENDED", "REQUEUED")
         if s in states),
        states[0] if states else "",
    )  # fmt: skip
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


async def cancel(
    host: Host, job: JobView, grace: float, files: list[str], command_timeout: float
) -> dict[str, Any]:
    """``scancel`` the job (every task) with grace; the agent's ``slurm_cancel`` result."""
    timeout = grace + 3 * KILL_CONFIRM_S + command_timeout
    params = {"identity": job.identity, "grace": grace, "files": files}
    out = await host.request("slurm_cancel", params, timeout=timeout)
    replies.decode(out, replies.SlurmCancel, host.name, "slurm_cancel")
    return out


def audit_cancel(host: str, run: str, job: JobView, out: dict[str, Any]) -> dict[str, Any]:
    """Append a cancel to the audit log (action ``kill``, the job's identity)."""
    from supervisor import audit

    return audit.record(
        "kill",
        host=host,
        run=run,
        ok=bool(out.get("confirmed")),
        identity=job.identity,
        steps=[
            {
                "name": f"job {job.job_id}",
                "ok": bool(out.get("confirmed")),
                "detail": f"{out.get('outcome')}: {out.get('detail')}",
            }
        ],
        signals=out.get("signals"),
        state=out.get("state"),
    )


# --------------------------------------------------------------------------- submit


def submit_params(
    config: Config, run: RunConfig, argv: list[str], env: dict[str, str], paths: dict[str, str]
) -> dict[str, Any]:
    """The ``slurm_submit`` request of a run: its argv (or one per dataset for an array), its
    sbatch options, its tag; the script and lock in ``<out>/.runwatch/``."""
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
        "tag": tag_of(run.name),
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

    async def request(
        self, op: str, params: dict[str, Any], timeout: float | None = None
    ) -> Any: ...


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


async def stop_job(runner: _Runner, step: Step) -> None:
    plan = runner.plan
    job: JobView | None = plan.job
    if job is None:
        await runner.set(step, "skipped", "no job of the run is queued or running")
        return
    files = [posixpath.join(plan.paths["out"], ds, plan.run.data_file) for ds in plan.datasets]
    try:
        out = await cancel(
            runner.host, job, plan.run.stop_grace_seconds, files, runner.hc.command_timeout
        )
    except OutcomeUnknown as e:
        # The reply was lost: the cancel is idempotent, and its second answer is the proof.
        await runner.host.connect()
        step.data["lost"] = str(e)
        out = await cancel(runner.host, job, 0.0, files, runner.hc.command_timeout)
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
    config = runner.engine.config
    params = submit_params(config, plan.run, plan.argv, plan.env, plan.paths)
    timeout = float(params["settle_s"]) + 2 * runner.hc.command_timeout
    started = time.time()
    try:
        reply = await runner.request("slurm_submit", params, timeout=timeout)
    except OutcomeUnknown as e:
        reply = await _reconcile(runner, started, str(e))
    replies.decode(reply, replies.SlurmSubmit, runner.hc.name, "slurm_submit")
    step.data["submit"] = reply
    if not reply.get("submitted"):
        raise StepFailed(
            reply.get("detail") or "already queued or running",
            "another runwatch (or a submission in progress) queued it; refresh to see it",
        )
    job = reply.get("job") or {}
    state = str(job.get("state") or "")
    job_id = str(reply.get("job_id"))
    if state in TERMINAL_STATES:
        tail = "\n    ".join(reply.get("log_tail") or []) or "(the output is empty)"
        raise StepFailed(
            f"job {job_id} ended at once ({state}"
            + (f", {job['reason']}" if job.get("reason") else "")
            + f"); last lines of {job.get('stdout')}:\n    {tail}",
            "fix the cause shown in the output, then launch again",
        )
    identity = {
        "job_id": job_id,
        "submit_time": job.get("submit_time"),
        "tag": tag_of(plan.run.name),
    }
    for ds, path in plan.fingerprints.items():
        data = dict(fingerprint_of(plan.run, plan.argv, config), dataset=ds, identity=identity)
        hashes = {ds: plan.prompt_files[ds]} if ds in plan.prompt_files else {}
        await runner.request(
            "write_fingerprint",
            {"path": path, "data": data, "workdir": plan.paths["workdir"], "hash_files": hashes},
        )
    runner.identity = identity
    where = f" on {job['nodes']}" if job.get("nodes") else ""
    why = f" ({job.get('reason') or 'not scheduled yet'})" if state == "PENDING" else ""
    step.detail = f"job {job_id} {state or 'submitted'}{why}{where} (output {job.get('stdout')})"


async def _reconcile(runner: _Runner, started: float, why: str) -> dict[str, Any]:
    """The submission's outcome when its reply was lost: a job of the run's tag submitted since."""
    await runner.host.connect()
    reply = await runner.request("slurm_jobs", {})
    tag = tag_of(runner.plan.run.name)
    mine = [
        j
        for j in reply.get("jobs") or []
        if j.get("comment") == tag and (j.get("submit_time") or 0) >= int(started) - 1
    ]
    if mine:
        job_id = str(mine[0].get("array_job_id") or mine[0].get("job_id"))
        return {"submitted": True, "job_id": job_id, "job": mine[0], "detail": f"reconciled: {why}"}
    return {"submitted": False, "detail": f"the connection dropped during sbatch ({why}) and "
            "no job of the run is queued now"}  # fmt: skip
