"""The agent's replies as the laptop reads them: msgspec Structs mirroring ``agent.protocol``.

``supervisor.agent.protocol`` describes every request and reply with TypedDicts (the host side is
standard library only); the Structs here mirror the replies the laptop reads, so a reply is
checked once, where it arrives, instead of with ``.get()`` chains. A listed process decodes into
``model.ProcessInfo`` (the mirror of ``protocol.Process``). Fields the laptop does not read are
left out (msgspec ignores them); defaults cover keys a reply may not carry.

:func:`decode` turns a reply into its Struct or raises ``AgentError`` naming the op and the
field that does not fit.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

from supervisor.agent.protocol import owner_text
from supervisor.errors import AgentError
from supervisor.model import Identity, ProcessInfo

T = TypeVar("T")


def decode(result: Any, shape: type[T], host: str, op: str) -> T:
    """``result`` (the ``result`` of an ``op`` reply from ``host``) as ``shape``."""
    try:
        return msgspec.convert(result, shape, strict=False)
    except msgspec.ValidationError as e:
        raise AgentError(
            f"{host}: malformed {op} reply: {e}",
            "the agent and this runwatch disagree on the protocol; reinstall runwatch",
        ) from None


class Hello(msgspec.Struct, kw_only=True):
    """``protocol.Hello``: the agent's first line."""

    hello: str
    protocol: int
    boot_id: str
    python: str
    uid: int
    user: str
    pid: int
    hostname: str = ""
    executable: str = ""
    has_psutil: bool = False
    proc_source: str = "proc"
    has_nvidia_smi: bool = False
    has_pidfd: bool = False
    has_scanner: bool = False
    ops: list[str] = []


class Processes(msgspec.Struct, kw_only=True):
    """The part of ``protocol.PsResult`` / ``RefreshResult`` the listing reads."""

    processes: list[ProcessInfo] = []


class KillExit(msgspec.Struct, kw_only=True):
    """``protocol.KillExit``."""

    confirmed: bool = False
    code: int | None = None
    after_s: float | None = None


class KillTarget(msgspec.Struct, kw_only=True):
    """``protocol.KillTarget``: one process of a kill."""

    pid: int
    outcome: Literal["terminated", "killed", "already-gone", "refused"]
    detail: str = ""
    role: Literal["run", "child", "holder"] = "run"
    signals: list[str] = []
    exit: KillExit = msgspec.field(default_factory=KillExit)


class Kill(msgspec.Struct, kw_only=True):
    """``protocol.KillResult``."""

    results: list[KillTarget]
    launch_id: str | None = None
    held_by: Literal["cgroup", "token"] | None = None
    confirmed: bool | None = None
    detail: str | None = None


class Probe(msgspec.Struct, kw_only=True):
    """``protocol.ProbeResult``: what re-checking an identity found."""

    state: Literal["alive", "gone", "zombie", "rebooted"]
    alive: bool
    detail: str
    children: list[int] = []
    """Live descendants, when the process is alive."""


class LockHolder(msgspec.Struct, kw_only=True):
    """What a launcher wrote into a lock file: ``launching`` (``agent_pid``), then ``running``
    (``identity`` of the run it started), or ``failed``."""

    state: str | None = None
    identity: Identity | None = None
    agent_pid: int | None = None
    log: str | None = None
    time: float = 0.0
    config_id: str | None = None
    """The key of the config that launched it (None: an older runwatch's lock)."""
    config_path: str | None = None
    run: str | None = None

    def who(self, config_key: str) -> str:
        """``pid N`` (or ``a launch in progress``), and the run and config when they are
        another config's: a refusal names whose run holds the lock."""
        text = f"pid {self.identity.pid}" if self.identity else "a launch in progress"
        if self.config_id and self.config_id != config_key:
            text += owner_text(self.run, self.config_id, self.config_path)
        return text


class LockState(msgspec.Struct, kw_only=True):
    """``protocol.LockState``."""

    lock_path: str
    held: bool
    holder: LockHolder | None = None
    holder_alive: bool = False


class LockStatus(LockState, kw_only=True):
    """``protocol.LockStatusResult``; the top-level fields are those of the first held lock."""

    locks: list[LockState] = []


class Launch(msgspec.Struct, kw_only=True):
    """``protocol.LaunchResult``."""

    started: bool
    lock_path: str = ""
    reason: str | None = None
    detail: str | None = None
    identity: Identity | None = None
    argv_matches: bool = True
    log: str | None = None
    log_offset: int = 0
    log_tail: list[str] = []
    exit_code: int | None = None
    fingerprints: list[str] = []
    warning: str | None = None
    """Other users' processes that could not be inspected for writers (a non-root agent)."""


class GpuHolders(msgspec.Struct, kw_only=True):
    """``protocol.GpuHoldersResult``: GPU MiB per pid (as a string key)."""

    available: bool
    holders: dict[str, float] = {}
    detail: str | None = None


class FileHolder(msgspec.Struct, kw_only=True):
    """``protocol.FileHolder``: a process holding a data file for writing or a lock."""

    pid: int
    uid: int | None = None
    user: str = "?"
    argv: list[str] = []
    how: list[str] = []
    slurm_job: str | None = None


class Uninspected(msgspec.Struct, kw_only=True):
    """``protocol.Uninspected``: another user's processes the agent could not look into."""

    uid: int
    user: str
    pids: list[int] = []


class UnitOnFiles(msgspec.Struct, kw_only=True):
    """``protocol.UnitOnFiles``: a unit started on the files, still running."""

    launch_id: str
    config_id: str = ""
    config_path: str = ""
    run: str = ""
    main_pid: int | None = None
    members: list[int] = []
    path: str = ""


class FileHolders(msgspec.Struct, kw_only=True):
    """``protocol.FileHoldersResult``: who holds a run's data files or locks."""

    pids: list[int] = []
    holders: list[FileHolder] = []
    uninspected: list[Uninspected] = []
    detail: str = ""
    units: list[UnitOnFiles] = []


class ScriptOption(msgspec.Struct, kw_only=True):
    """``protocol.ScriptOption``: one option the script declares, read statically."""

    flags: list[str]
    dest: str
    action: str
    takes_value: bool | None
    type: str | None
    choices: list[str] | None
    choices_unread: bool
    nargs: str | None
    line: int


class FileSample(msgspec.Struct, kw_only=True):
    """``protocol.FileSample``."""

    size: int
    mtime_ns: int
    dev: int
    ino: int
    ctime_ns: int = 0


class ObservedFile(msgspec.Struct, kw_only=True):
    """``protocol.ObservedFile``: how one data file changed while it was watched."""

    path: str
    change: str
    bytes: int
    seconds: float
    before: FileSample | None = None
    after: FileSample | None = None


class ObservedFiles(msgspec.Struct, kw_only=True):
    """``protocol.ObserveFilesResult``."""

    window_s: float
    elapsed_s: float
    changed: bool
    files: list[ObservedFile] = []


class ScriptFlags(msgspec.Struct, kw_only=True):
    """``protocol.ScriptFlagsResult``: the options the client's source declares."""

    path: str
    readable: bool
    found: bool
    reason: str
    options: list[ScriptOption]
    allow_abbrev: bool
    dynamic: int
    known_args: bool
    sha256: str = ""


class ScriptInstalled(msgspec.Struct, kw_only=True):
    """``protocol.ScriptInstallResult``: a run's script replaced on the host."""

    path: str
    old_sha256: str
    new_sha256: str
    kept: str
    mode: int


class ResolvedArgs(msgspec.Struct, kw_only=True):
    """``protocol.ResolveArgsResult``: what a command line means to the client's own parser."""

    path: str
    exact: bool
    reason: str
    error: str | None = None
    values: dict[str, Any] = {}
    unknown: dict[str, str] = {}
    given: list[str] = []
    options: dict[str, str] = {}
    python: str = ""


class ScanFile(msgspec.Struct, kw_only=True):
    """The fields of ``protocol.ScanFile`` that decide what a dataset file is."""

    path: str
    state: str
    error: str | None = None
    format: str | None = None
    expected: str | None = None
    verdict: str | None = None
    verdict_detail: str | None = None
    records: int = 0
    unique_ids: int = 0
    duplicates: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    bad_lines_total: int = 0
    partial_tail_bytes: int = 0
    offset: int = 0
    size: int = 0
    mtime: float | None = None
    finished: bool = False
    stream: str | None = None


class Scan(msgspec.Struct, kw_only=True):
    """``protocol.ScanResult``: one result per requested path."""

    files: dict[str, ScanFile] = {}


class SlurmJob(msgspec.Struct, kw_only=True):
    """``protocol.SlurmJob``: one job or array task as the login node's squeue lists it."""

    job_id: str
    state: str
    comment: str
    submit_time: int | None
    array_job_id: str | None = None
    array_task_id: int | None = None
    reason: str = ""
    nodes: str = ""
    elapsed_s: int | None = None
    time_limit_s: int | None = None
    uid: int | None = None
    name: str = ""
    partition: str = ""
    stdout: str | None = None


class SlurmJobs(msgspec.Struct, kw_only=True):
    """``protocol.SlurmJobsResult``."""

    source: str
    jobs: list[SlurmJob] = []


class SlurmSubmit(msgspec.Struct, kw_only=True):
    """``protocol.SlurmSubmitResult``: submitted (the job as listed after the settle time), or
    refused because a job of the tag is still queued or running."""

    submitted: bool
    job_id: str | None = None
    job: SlurmJob | None = None
    log_tail: list[str] = []
    detail: str | None = None


class SlurmCancel(msgspec.Struct, kw_only=True):
    """``protocol.SlurmCancelResult``."""

    job_id: str
    outcome: Literal["terminated", "killed", "cancelled", "already-gone", "refused", "unconfirmed"]
    detail: str
    signals: list[str]
    state: str
    confirmed: bool
    after_s: float | None
    writers: dict[str, list[int]]
    tasks: list[SlurmCancelTask] = []


class SlurmCancelTask(msgspec.Struct, kw_only=True):
    """``protocol.SlurmCancelTask``."""

    job_id: str
    state: str
    start_time: int | None = None


class SnapshotCheckFile(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotCheckFile``: how one data file would be kept."""

    path: str
    size: int = 0
    method: Literal["reflink", "copy", "empty", "none"] = "none"
    reason: str = ""


class SnapshotCheck(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotCheckResult``."""

    files: list[SnapshotCheckFile] = []
    copy_bytes: int = 0
    unprotected: list[str] = []


class SnapshotEntry(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotEntry``: one kept file (``copy`` empty: it could not be kept)."""

    path: str
    bytes: int = 0
    method: str = ""
    copy: str = ""
    reason: str = ""


class SnapshotTake(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotTakeResult``."""

    id: str = ""
    dir: str = ""
    files: list[SnapshotEntry] = []
    unprotected: list[str] = []
    pruned: list[str] = []


class SnapshotDamage(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotDamage``."""

    path: str
    why: str
    bytes_before: int = 0
    bytes_now: int = 0


class SnapshotVerify(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotVerifyResult``."""

    damaged: list[SnapshotDamage] = []


class SnapshotRestored(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotRestored``."""

    path: str
    source: str = ""
    aside: str | None = None
    bytes: int = 0
    method: str = ""


class SnapshotRestore(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotRestoreResult``."""

    restored: list[SnapshotRestored] = []


class SnapshotInfo(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotInfo``: one snapshot of a run."""

    id: str
    dir: str = ""
    run: str = ""
    reason: str = ""
    time: float = 0.0
    files: list[SnapshotEntry] = []
    unprotected: list[str] = []


class SnapshotList(msgspec.Struct, kw_only=True):
    """``protocol.SnapshotListResult``."""

    snapshots: list[SnapshotInfo] = []
