"""The agent's wire protocol: constants, the error class and the shape of every op.

Standard library only, Python >= 3.8 (this module travels to the host with the package).

A request is one JSON line ``{"id": int, "op": str, "params": {...}}``; the reply is ``{"id": int,
"ok": true, "result": {...}}`` or ``{"id": int, "ok": false, "error": str, "kind": str}``. Once
ready the agent prints ``{"id": 0, "ok": true, "result": Hello}``. For each op below, ``<Op>Params``
is the shape of ``params`` and ``<Op>Result`` the shape of ``result``; :data:`OP_SHAPES` maps every
op name to the pair. The laptop sends every request through one typed method per op
(``supervisor.agentclient``) and decodes replies against the same shapes (``supervisor.replies``).

An op raises :class:`AgentOpError` (with a ``kind``) for a request it cannot carry out; expected
outcomes such as "already running" are results, not errors.
"""

from __future__ import annotations

import math
import shlex
from typing import Any, TypedDict

PROTOCOL = 1
AGENT_LOADER = "import sys;b=sys.stdin.buffer;exec(b.read(int(b.readline())))"
"""The agent's command line is ``PYTHON -c AGENT_LOADER`` (``hosts.bootstrap_argv``): a kill never
signals a process with it (another runwatch's agent holds a run's lock while it launches)."""
"""Version of this protocol, sent in the hello."""
DURABLE_OPS = frozenset(
    (
        "kill",
        "unit_stop",
        "launch",
        "repair_tail",
        "move_aside",
        "snapshot_take",
        "snapshot_restore",
        "write_fingerprint",
        "slurm_submit",
        "slurm_cancel",
    )
)
"""Ops that act on the host: finished even when stdin closes mid-way."""
KILL_CONFIRM_S = 5.0
"""How long the agent waits for the exit after SIGKILL before reporting it unconfirmed (state D)."""
MASK = "***"
"""What a masked secret is replaced by."""
SIDECAR_DIR = ".runwatch"
"""runwatch's own files in a run's output dir: ``<dataset>.lock``, ``<dataset>.launch.json``."""
LOCK_NAME = "run.lock"
"""Lock of a run whose datasets are unknown."""
FINGERPRINT_NAME = "launch.json"
"""Fingerprint of a run whose datasets are unknown."""
FINGERPRINT_VERSION = 1
"""Version written into every launch fingerprint."""


def owner_text(run: object, config_id: object, config_path: object) -> str:
    """`` (run 'R' of config PATH; stop it there: `runwatch -c PATH kill R`)`` for a lock or
    launch record written by a launch of ``run`` by a config (empty when it names no run): every
    refusal names whose run holds a dataset and how to stop it."""
    if not run:
        return ""
    where = str(config_path or "") or "key {}".format(config_id or "?")
    cmd = "runwatch -c {} kill {}".format(
        shlex.quote(str(config_path or "")) if config_path else "ITS_CONFIG", shlex.quote(str(run))
    )
    return f" (run {str(run)!r} of config {where}; stop it there: `{cmd}`)"


class AgentOpError(Exception):
    """A request the host cannot carry out. ``kind`` names the reason for the laptop
    (``bad-params``, ``bad-request``, ``missing``, ``unreadable``, ``writer-alive``, ``io``...)."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------- reading params


def param_str(params: dict[str, Any], key: str, default: str | None = None) -> str:
    value = params.get(key, default)
    if not isinstance(value, str) or not value:
        raise AgentOpError(f"parameter {key!r}: expected a non-empty string", "bad-params")
    return value


def param_str_list(params: dict[str, Any], key: str) -> list[str]:
    value = params.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise AgentOpError(f"parameter {key!r}: expected a non-empty list of strings", "bad-params")
    return list(value)


def param_str_dict(params: dict[str, Any], key: str) -> dict[str, str]:
    value = params.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise AgentOpError(f"parameter {key!r}: expected a table of strings", "bad-params")
    return dict(value)


def param_flag_table(params: dict[str, Any], key: str, kind: str) -> dict[str, list[str]]:
    """``params[key]``: a table of script names to lists of flags (empty when absent)."""
    value = params.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(f, str) for f in v)
        for k, v in value.items()
    ):
        raise AgentOpError(f"parameter {key!r}: expected a table of lists of flags", kind)
    return {k: list(v) for k, v in value.items()}


def param_number(params: dict[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)  # a NaN grace would never end, nor send SIGKILL
        or value < 0
    ):
        raise AgentOpError(
            f"parameter {key!r}: expected a finite non-negative number", "bad-params"
        )
    return float(value)


# --------------------------------------------------------------------------- shapes
# Annotations stay strings (``from __future__ import annotations``), so ``X | None`` is fine on
# Python 3.8. ``total=False`` marks keys a request may leave out or a reply may not carry.


class Identity(TypedDict):
    """What pins a process across PID reuse and reboots; ``argv`` is masked."""

    boot_id: str
    pid: int
    start_time: int
    uid: int
    argv: list[str]


class Hello(TypedDict):
    """The agent's first line (``id`` 0)."""

    hello: str
    protocol: int
    boot_id: str
    python: str
    executable: str
    has_psutil: bool
    proc_source: str
    has_nvidia_smi: bool
    has_pidfd: bool
    has_scanner: bool
    uid: int
    user: str
    pid: int
    hostname: str
    ops: list[str]


class PingParams(TypedDict, total=False):
    pass


class PingResult(TypedDict):
    pong: bool
    time: float


class RunFlags(TypedDict):
    """The flags of a run that matter to supervision (``match.parse_flags``)."""

    datasets: list[str]
    max_samples: int | None
    token_budget: int | None
    concurrency: int | None
    output_dir: str | None
    api_base: str | None
    model: str | None
    backend: str
    client: str | None
    """The client profile the flags were read with (None: the reference client's spellings)."""
    output_file: str | None
    input_file: str | None
    prompts_dir: str | None
    resume: bool | None
    """Whether the client's resume flag is given (None: the client has none)."""


class ClientSpec(TypedDict, total=False):
    """What the host needs of a client profile to read a run's flags (``clients.wire``)."""

    name: str
    scripts: list[str]
    flags: dict[str, list[str]]
    """Meaning (``datasets``, ``output_file``, ``samples``...) -> the flag's spellings."""
    endpoint_template: str
    defaults: dict[str, str]
    """Meaning (``output_dir``, ``output_file``, ``input_file``, ``prompts_dir``) -> the value the
    client uses when its argv gives none (a path, relative to its cwd, ``~`` literal)."""


class _ProcessRequired(TypedDict):
    identity: Identity
    user: str
    argv_masked: list[str]
    children: list[int]
    flags: RunFlags
    gpu_memory_mb: float | None
    run: str | None
    killable: bool
    script: str


class Process(_ProcessRequired, total=False):
    """One listed run (``proc.process_record`` plus what the lister read)."""

    uptime_s: float
    cpu_percent: float
    rss_mb: float
    state: str
    cwd: str | None
    ppid: int
    threads: int
    evidence: dict[str, list[str]]
    """Config run name -> ``argv`` / ``fd`` / ``cwd``: what ties the process to that run
    (``match.run_evidence``; ``cwd`` alone never makes it the run)."""


class GpuInfo(TypedDict, total=False):
    index: int | None
    name: str
    memory_used_mb: float | None
    memory_total_mb: float | None
    utilization_pct: float | None
    uuid: str
    power_w: float | None
    temperature_c: float | None
    pids: list[int]
    """Compute processes on this GPU (``--query-compute-apps``)."""


class GpuSummary(TypedDict, total=False):
    gpus: list[GpuInfo]
    error: str


class RunSpec(TypedDict, total=False):
    """A configured run's places as the laptop's layout resolves them from its argv (a ``~``
    leading a path is the configured workdir's: the host expands it)."""

    name: str
    workdir: str
    out: str
    """Its output directory (absent: not known)."""
    output_dir: str
    """Its ``output_dir`` key, for a script no profile describes (absent: none)."""
    data_file: str
    files: list[str]
    """Its data files."""
    locks: list[str]


class PsParams(TypedDict, total=False):
    scripts: list[str]
    clients: list[ClientSpec]
    show_other_users: bool
    gpu: bool
    runs: list[RunSpec]
    secret_env: list[str]
    """Names of the key variables: their values (in each process's environment or the agent's)
    are masked in the argv of every listed process."""
    secret_flags: list[str]
    """The profiles' secret flags (``secret_flags``): their values are masked in every listed
    argv, as those of built-in secret flags."""
    script_secret_flags: dict[str, list[str]]
    """Script name -> the one-letter secret flags (``-p``) of its profiles: secret only in that
    script's command lines (``masking.register_secret_flags``)."""
    config_id: str
    """The listing config's identity: the units it launched are listed (``units``)."""
    pids: list[int]
    """Processes the user named (``kill RUN --pid``): listed whatever their argv, with their
    evidence of being one of ``runs``."""


class PsResult(TypedDict):
    time: float
    boot_id: str
    processes: list[Process]
    gpu: GpuSummary | None
    units: list[UnitInfo]
    """The units the listing's ``config_id`` launched on this host, running or ended."""


class _FileSpecRequired(TypedDict):
    path: str


class FileSpec(_FileSpecRequired, total=False):
    """One file to scan."""

    format: str
    validate: str
    profile: dict[str, Any]
    expected: str
    texts: int
    sidecars: dict[str, str]
    """Kind (``error``, ``skipped``) -> path of a file of failed or skipped prompts."""
    input: InputSpec


class InputSpec(TypedDict):
    """The input file whose rows a data file's records answer (``completeness``)."""

    path: str
    id: str
    """Key of a row's id, echoed in the record's id field; ``""``: the row's 0-based index."""


class SidecarScan(TypedDict, total=False):
    path: str
    state: str
    lines: int
    reasons: dict[str, int]
    """Reason (a row's ``error``) -> rows, the most frequent first."""
    other_reasons: int
    size: int


class Completeness(TypedDict, total=False):
    input_path: str
    input: int
    """Distinct ids of the input."""
    error: str | None
    duplicates: int
    input_duplicates: int
    done: int
    failed: int
    """Input ids only in a sidecar (error or skipped) or in a failed-request line."""
    missing: int
    """Input ids the client passed (a later row is answered) without an answer."""
    missing_first: list[Any]
    missing_near: list[list[Any]]
    """``[distance to the last row answered, id]`` of the missing rows nearest it (at most
    256): a running client's requests in flight are among them."""
    not_reached: int
    """Input ids after the last answered row: not attempted yet."""
    not_reached_first: list[Any]
    not_in_input: int
    not_in_input_first: list[Any]


class PromptLengths(TypedDict, total=False):
    """How long an input's rows are (``agent.promptlengths``): ``mean_chars`` of the text of
    the ``rows`` read (all of them when ``whole``), or ``error``."""

    path: str
    rows: int
    mean_chars: float
    whole: bool
    error: str


class BadLine(TypedDict, total=False):
    offset: int
    line: int
    reason: str


class _ScanFileRequired(TypedDict):
    path: str
    state: str


class ScanFile(_ScanFileRequired, total=False):
    """The scanner's result for one file (``scan.Scanner.scan``); ``state`` is ``ok``,
    ``missing``, ``unreadable``, ``not-a-file`` or ``error`` (then ``error`` says why)."""

    error: str | None
    format: str | None
    expected: str | None
    verdict: str
    verdict_detail: str | None
    records: int
    unique_ids: int
    duplicates: int
    duplicate_ids: list[Any]
    """The first ids seen again (at most 10; ``duplicates`` is the exact count)."""
    failed_lines: int
    """Lines recording a failed request (Model-Optimizer's ``{"conversation_id": N}``)."""
    prompt_tokens: int
    completion_tokens: int
    token_source: str | None
    texts_records: int
    finish_reasons: dict[str, int]
    formats: dict[str, int]
    kinds: dict[str, int]
    first_offending: Any
    bad_lines: list[BadLine]
    bad_lines_total: int
    partial_tail_bytes: int
    lines: int
    offset: int
    size: int
    mtime: float | None
    validated: int
    finished: bool
    stream: str | None
    texts: list[str]
    reasoning_texts: list[str]
    texts_more: bool
    companions: list[Any]
    sidecars: dict[str, SidecarScan]
    completeness: Completeness
    prompt_lengths: PromptLengths
    rescan_reason: str | None
    bytes_read: int
    scan_seconds: float


class MetricsSpec(TypedDict):
    """A serving engine's Prometheus endpoint on the host (``http://`` to the host itself)."""

    name: str
    url: str


class _MetricsFetchRequired(TypedDict):
    ok: bool


class MetricsFetch(_MetricsFetchRequired, total=False):
    """One ``/metrics`` fetch (``agent.metrics.fetch_one``): the text, or why there is none."""

    text: str
    truncated: bool
    max_bytes: int
    """The cap the text was cut at, when ``truncated`` (at its last whole line)."""
    seconds: float
    time: float
    error: str
    status: int
    kind: str
    """``refused-url``, ``http``, ``refused``, ``timeout`` or ``network``."""


class RefreshParams(PsParams, total=False):
    files: list[FileSpec]
    metrics: list[MetricsSpec]
    progress: bool
    """Send progress lines (:class:`Progress`) while the files are scanned."""


class LineCount(TypedDict):
    """A file's newlines and size, counted before its first scan (a provisional count)."""

    lines: int
    size: int


class _ProgressRequired(TypedDict):
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


class Progress(_ProgressRequired, total=False):
    """An interim line ``{"id": <request id>, "progress": Progress}`` of a request that asked for
    progress; the reply follows. The first one holds ``files`` (provisional line counts of the
    files not scanned before, by path) and ``processes`` (as in the result)."""

    files: dict[str, LineCount]
    processes: list[Process]


class _RefreshResultRequired(PsResult):
    files: dict[str, ScanFile]


class RefreshResult(_RefreshResultRequired, total=False):
    metrics: dict[str, MetricsFetch]
    """Endpoint name -> its fetch, for each ``metrics`` spec asked for."""


class ScanParams(TypedDict, total=False):
    files: list[FileSpec]
    fresh: bool
    session: str
    """With ``fresh``: the scanner of this name goes on where its last call stopped (a file whose
    texts filled a reply, ``texts_more``, is read on by the next call); dropped once no file has
    more, or when too many are open."""


class ScanResult(TypedDict):
    time: float
    files: dict[str, ScanFile]


class _KillParamsRequired(TypedDict):
    identity: Identity


class KillParams(_KillParamsRequired, total=False):
    grace: float
    scripts: list[str]
    files: list[str]
    """The run's data files and locks: whatever holds them (data files for writing) after the
    grace period is stopped too, before the kill confirms."""
    writer: bool
    """The user named the process as a writer of the run (``kill RUN --pid``): it may execute
    no configured script, but then it must hold one of ``files`` open for writing now."""


class KillExit(TypedDict):
    confirmed: bool
    code: int | None
    after_s: float | None


class KillTarget(TypedDict):
    """One process of a kill; ``outcome`` is ``terminated``, ``killed``, ``already-gone`` or
    ``refused``, ``role`` is ``run``, ``child`` (a descendant, a member of the run's session or
    group, a fork made during the kill) or ``holder`` (held the run's data files or lock)."""

    pid: int
    role: str
    outcome: str
    detail: str
    signals: list[str]
    exit: KillExit


class _KillResultRequired(TypedDict):
    results: list[KillTarget]


class KillResult(_KillResultRequired, total=False):
    """With ``launch_id``, ``held_by``, ``confirmed`` and ``detail`` when the process was a
    member of a unit runwatch started: the whole unit was stopped (``unit_stop``)."""

    launch_id: str
    held_by: str
    confirmed: bool
    detail: str


class ProbeParams(TypedDict):
    identity: Identity


class ProbeResult(TypedDict):
    """``state``: ``alive``, ``gone``, ``zombie`` or ``rebooted``."""

    state: str
    alive: bool
    children: list[int]
    detail: str


class FingerprintSpec(TypedDict, total=False):
    path: str
    data: dict[str, Any]
    hash_files: dict[str, str]
    workdir: str


class _LaunchParamsRequired(TypedDict):
    workdir: str
    argv: list[str]
    log: str


class LaunchParams(_LaunchParamsRequired, total=False):
    env: dict[str, str]
    secret_env: list[str]
    secret_flags: list[str]
    """The profiles' secret flags: masked in the unit record, locks, fingerprints and replies."""
    script_secret_flags: dict[str, list[str]]
    """Script name -> its profiles' one-letter secret flags (as in ``PsParams``)."""
    lock_path: str
    lock_paths: list[str]
    settle_s: float
    lock_wait_s: float
    tail_lines: int
    fingerprint: FingerprintSpec
    fingerprints: list[FingerprintSpec]
    data_files: list[str]
    """Refused (``writer-alive``) while any process holds one of them open for writing."""
    config_id: str
    """The launching config's identity, part of the launch token (``unit.TOKEN_VAR``)."""
    run: str
    """The run's name, part of the launch token."""
    config_path: str
    """The launching config's path: written in the locks, so a refusal names it."""


class FileHolder(TypedDict):
    """A process holding a data file for writing (``how``: ``write``) or a lock (``open``)."""

    pid: int
    uid: int | None
    user: str
    argv: list[str]
    how: list[str]
    slurm_job: str | None
    """The Slurm job it belongs to (its ``SLURM_JOB_ID``, an array's job id), on a node that is
    both login node and compute node; None for any other process."""


class Uninspected(TypedDict):
    """Processes of another user whose descriptors a non-root agent cannot read."""

    uid: int
    user: str
    pids: list[int]


class _FileHoldersRequired(TypedDict):
    paths: list[str]


class FileHoldersParams(_FileHoldersRequired, total=False):
    locks: list[str]
    workdir: str


class UnitOnFiles(TypedDict):
    """A unit that still runs and was started on one of the files (``unit.units_on``)."""

    launch_id: str
    config_id: str
    config_path: str
    run: str
    main_pid: int | None
    members: list[int]
    path: str


class FileHoldersResult(TypedDict):
    pids: list[int]
    holders: list[FileHolder]
    uninspected: list[Uninspected]
    detail: str
    """Who holds them, and which users' processes could not be inspected ('' when neither)."""
    units: list[UnitOnFiles]
    """The units of any run and config started on the files that still run, whatever their
    members hold open."""


class _LaunchResultRequired(TypedDict):
    started: bool
    lock_path: str


class LaunchResult(_LaunchResultRequired, total=False):
    """``started`` true, or false with ``reason`` ``already-running`` (``holder``),
    ``writer-alive`` (``holders``), ``exited`` (``exit_code``, ``log_tail``) or ``exec-failed``
    (``detail``). ``uninspected``/``warning``: other users' processes that could not be looked
    at."""

    reason: str
    detail: str
    identity: Identity
    argv_matches: bool
    log: str
    log_offset: int
    log_tail: list[str]
    exit_code: int | None
    holder: dict[str, Any] | None
    fingerprints: list[str]
    holders: list[FileHolder]
    uninspected: list[Uninspected]
    warning: str
    launch_id: str
    """The unit the run was started in (``units``, ``unit_stop``)."""
    held_by: str
    """How the unit holds its processes: ``cgroup`` or ``token``."""


class UnitExit(TypedDict):
    """How a unit's client ended: its exit code or signal, when, and whether runwatch had asked
    it to stop (``stopped``)."""

    code: int | None
    signal: int | None
    at: float | None
    stopped: bool
    failed: dict[str, Any] | None
    """The first orphaned descendant the waiter reaped that died of a signal or a non-zero exit
    (``{pid, code, signal}``)."""


class _UnitInfoRequired(TypedDict):
    """One unit: ``state`` ``running`` (it has members), ``ending`` (its waiter is reaping the
    last ones) or ``ended``; ``main_pid`` the client (or its oldest member once it exited)."""

    launch_id: str
    config_id: str
    config_path: str | None
    """The launching config's path (None: a unit of an older agent)."""
    run: str
    held_by: str
    state: str
    main_pid: int | None
    members: list[int]
    exit: UnitExit | None
    waiter_alive: bool
    tracked: bool
    """False when a member killed the waiter of a unit without a cgroup: a member that left its
    tree and dropped the token can no longer be found."""
    launched_at: float | None
    argv: list[str]
    workdir: str | None


class UnitInfo(_UnitInfoRequired, total=False):
    writes: list[str]
    """In a listing's units (``ps``, ``refresh``): the runs of the listing whose data files the
    running unit was started on, by identity, whatever its config and its run's name."""


class UnitsParams(TypedDict, total=False):
    config_id: str


class UnitsResult(TypedDict):
    units: list[UnitInfo]


class _UnitStopRequired(TypedDict):
    launch_id: str


class UnitStopParams(_UnitStopRequired, total=False):
    grace: float


class UnitStopResult(TypedDict):
    """``confirmed``: the unit is empty (its cgroup, its waiter's tree and its token holders)."""

    launch_id: str
    held_by: str
    confirmed: bool
    detail: str
    results: list[KillTarget]


class LockStatusParams(TypedDict, total=False):
    lock_path: str
    lock_paths: list[str]
    workdir: str


class LockState(TypedDict):
    lock_path: str
    held: bool
    holder: dict[str, Any] | None
    holder_alive: bool


class LockStatusResult(LockState):
    """The top-level ``lock_path``/``holder`` are those of the first held lock."""

    locks: list[LockState]


class _PathParams(TypedDict):
    path: str


class RepairTailParams(_PathParams):
    pass


class _RepairTailRequired(TypedDict):
    path: str
    repaired: bool


class RepairTailResult(_RepairTailRequired, total=False):
    reason: str
    backup: str
    sha256: str
    size_before: int
    size_after: int
    removed_bytes: int


class MoveAsideParams(_PathParams, total=False):
    format: str
    timestamp: str


class _MoveAsideRequired(TypedDict):
    path: str
    moved: bool
    to: str | None


class MoveAsideResult(_MoveAsideRequired, total=False):
    reason: str
    size: int
    inode: int


class _SnapshotRootParams(TypedDict):
    root: str
    """``<out>/.runwatch/snapshots/<run>``: the run's snapshots."""


class _SnapshotPathsParams(_SnapshotRootParams):
    paths: list[str]
    max_bytes: int
    """Bytes a byte copy (no reflink) may take in all."""


class SnapshotCheckParams(_SnapshotPathsParams, total=False):
    pass


class SnapshotCheckFile(TypedDict, total=False):
    path: str
    size: int
    method: str
    """``reflink``, ``copy``, ``empty`` (nothing to keep) or ``none`` (it cannot be kept)."""
    reason: str


class SnapshotCheckResult(TypedDict):
    files: list[SnapshotCheckFile]
    copy_bytes: int
    unprotected: list[str]


class _SnapshotTakeRequired(_SnapshotPathsParams):
    keep: int
    """Snapshots of the root kept (the oldest beyond are removed)."""


class SnapshotTakeParams(_SnapshotTakeRequired, total=False):
    run: str
    reason: str


class SnapshotEntry(TypedDict, total=False):
    path: str
    copy: str
    bytes: int
    dev: int
    ino: int
    mode: int
    uid: int
    gid: int
    method: str
    """``reflink``, ``copy_file_range``, ``copy`` or ``none``."""
    sha256: str
    complete: int
    """Bytes up to the last newline when kept: what a start must not lose."""
    head: str
    """SHA-256 of the first ``snapshots.WINDOW`` bytes, and of the last (``tail``)."""
    tail: str
    reason: str


class SnapshotTakeResult(TypedDict):
    id: str
    """The snapshot's directory name; empty when there was nothing to keep."""
    dir: str
    files: list[SnapshotEntry]
    unprotected: list[str]
    pruned: list[str]


class SnapshotVerifyParams(_SnapshotRootParams):
    id: str


class SnapshotDamage(TypedDict):
    path: str
    why: str
    bytes_before: int
    bytes_now: int


class SnapshotVerifyResult(TypedDict):
    damaged: list[SnapshotDamage]


class SnapshotRestoreParams(SnapshotVerifyParams, total=False):
    paths: list[str]
    damaged_only: bool


class SnapshotRestored(TypedDict):
    path: str
    source: str
    """The snapshot's copy it was made from."""
    aside: str | None
    """Where the file found in its place was moved (``<file>.after-<stamp>``)."""
    bytes: int
    method: str


class SnapshotRestoreResult(TypedDict):
    restored: list[SnapshotRestored]


class SnapshotListParams(_SnapshotRootParams, total=False):
    pass


class SnapshotInfo(TypedDict):
    id: str
    dir: str
    run: str
    reason: str
    time: float
    files: list[SnapshotEntry]
    unprotected: list[str]


class SnapshotListResult(TypedDict):
    snapshots: list[SnapshotInfo]


class FileHash(TypedDict, total=False):
    path: str
    sha256: str | None
    size: int
    error: str


class ReadFingerprintParams(TypedDict, total=False):
    path: str
    paths: dict[str, str]
    workdir: str
    hash_files: dict[str, str]


class StoredFingerprint(TypedDict):
    path: str
    exists: bool
    fingerprint: dict[str, Any] | None
    error: str | None
    live_pids: list[int]
    """The live processes of the launch that wrote it (its process and its unit's members)."""


class ReadFingerprintResult(TypedDict, total=False):
    """One sidecar (``path`` ...) or several (``fingerprints``), and the current ``hashes``."""

    path: str
    exists: bool
    fingerprint: dict[str, Any] | None
    error: str | None
    fingerprints: dict[str, StoredFingerprint]
    hashes: dict[str, FileHash]


class _WriteFingerprintRequired(TypedDict):
    path: str
    data: dict[str, Any]


class WriteFingerprintParams(_WriteFingerprintRequired, total=False):
    workdir: str
    hash_files: dict[str, str]


class WriteFingerprintResult(TypedDict):
    path: str
    fingerprint: dict[str, Any]


class TailLogParams(_PathParams, total=False):
    workdir: str
    lines: int
    max_bytes: int


class TailLogResult(TypedDict):
    path: str
    exists: bool
    size: int
    lines: list[str]


class TailRecordsParams(_PathParams, total=False):
    workdir: str
    count: int
    max_bytes: int


class TailRecordsResult(TypedDict):
    path: str
    exists: bool
    size: int
    records: list[dict[str, Any]]
    bad_lines: int
    complete: bool


class GpuHoldersParams(TypedDict, total=False):
    pids: list[int]


class _GpuHoldersRequired(TypedDict):
    available: bool
    holders: dict[str, float]


class GpuHoldersResult(_GpuHoldersRequired, total=False):
    detail: str | None


class _ObserveFilesRequired(TypedDict):
    paths: list[str]


class ObserveFilesParams(_ObserveFilesRequired, total=False):
    workdir: str
    window_s: float
    """How long to watch (at most ``observe.MAX_WINDOW_S``)."""
    interval_s: float
    full: bool
    """Watch the whole window even after a change (default: return at the first)."""
    recent_factor: float
    """Watch a file changed ``age`` seconds before the watch for at least ``recent_factor *
    age`` (up to ``recent_max_s``): a writer that touched it moments ago, slower than the
    window, is waited for."""
    recent_max_s: float


class FileSample(TypedDict):
    size: int
    mtime_ns: int
    dev: int
    ino: int
    ctime_ns: int
    """The inode's change time: an in-place rewrite that restores the mtime still moves it."""


class ObservedFile(TypedDict):
    path: str
    resolved: str
    change: str
    """``grew``, ``shrank``, ``replaced``, ``created``, ``removed``, ``modified``, or ''."""
    bytes: int
    """Size at the change (or the end) minus size at the start (a missing file: 0)."""
    seconds: float
    """From the first sample to the one that saw the change (or the end of the watch)."""
    before: FileSample | None
    after: FileSample | None


class ObserveFilesResult(TypedDict):
    window_s: float
    elapsed_s: float
    changed: bool
    files: list[ObservedFile]


# --------------------------------------------------------------------------- Slurm (agent/slurm.py)


class SlurmJob(TypedDict):
    """One job (or array task) as ``squeue`` lists it; times are unix seconds."""

    job_id: str
    """``12``; ``12_3`` for an array task; ``12_[4-7]`` for the pending rest of an array."""
    array_job_id: str | None
    array_task_id: int | None
    array_tasks: str | None
    """Task ids still pending in this line (``4-7``), for the pending rest of an array."""
    state: str
    """``PENDING``, ``RUNNING``, ``COMPLETING``, ``COMPLETED``, ``CANCELLED``, ``FAILED``..."""
    reason: str
    """Why it waits (``Resources``, ``Priority``, ``JobHeldUser``...); '' when none."""
    nodes: str
    elapsed_s: int | None
    time_limit_s: int | None
    """None: no limit."""
    submit_time: int | None
    start_time: int | None
    uid: int | None
    user: str
    partition: str
    workdir: str
    name: str
    comment: str
    """The tag ``runwatch:<run>`` of the jobs runwatch submits (anyone can write it: the
    laptop's record of the submitted and adopted ids, not the tag, makes a job a run's)."""
    stdout: str | None
    """The job's output file, expanded (``scontrol show job`` StdOut)."""


class SlurmJobIdentity(TypedDict):
    """What pins a job across job id reuse: a cancel names all of it. ``tag`` is the job's
    comment; one with a nonce (``runwatch:<run>:<nonce>``) pins the job without its submit time,
    which a requeue changes."""

    job_id: str
    submit_time: int | None
    tag: str


class SlurmJobsParams(TypedDict, total=False):
    tag_prefix: str
    with_ids: list[str]
    """Jobs listed whatever their comment: the ones a run adopted."""
    all_states: bool
    all_users: bool
    job_ids: list[str]
    force_format: bool
    deadline_s: float
    in_workdir: str
    """Only the jobs whose working directory is this directory (by identity), any comment."""
    """Seconds the whole listing may take (squeue, its fallback, scontrol for the output paths);
    past it the op fails with kind ``timeout`` and its children are killed."""


class SlurmJobsResult(TypedDict):
    time: float
    source: str
    """``json`` (``squeue --json``) or ``format`` (the delimited fallback)."""
    jobs: list[SlurmJob]
    unparsed: list[str]


class _SlurmSubmitRequired(TypedDict):
    workdir: str
    tag: str
    name: str
    script_path: str
    lock_path: str


class SlurmSubmitParams(_SlurmSubmitRequired, total=False):
    argv: list[str]
    tasks: list[list[str]]
    """One argv per array task (index = ``$SLURM_ARRAY_TASK_ID``), instead of ``argv``."""
    options: dict[str, Any]
    directives: list[str]
    env: dict[str, str]
    settle_s: float


class _SlurmSubmitResultRequired(TypedDict):
    submitted: bool


class SlurmSubmitResult(_SlurmSubmitResultRequired, total=False):
    job_id: str
    job: SlurmJob | None
    script: str
    log_tail: list[str]
    reason: str
    detail: str
    jobs: list[SlurmJob]


class _SlurmCancelRequired(TypedDict):
    identity: SlurmJobIdentity


class SlurmCancelParams(_SlurmCancelRequired, total=False):
    grace: float
    files: list[str]


class SlurmCancelResult(TypedDict):
    job_id: str
    outcome: str
    """``terminated``, ``killed``, ``cancelled``, ``already-gone``, ``refused``, ``unconfirmed``."""
    detail: str
    signals: list[str]
    state: str
    confirmed: bool
    after_s: float | None
    writers: dict[str, list[int]]
    tasks: list[SlurmCancelTask]
    """Each task as listed once the cancel is over (empty when nothing was sent)."""


class SlurmCancelTask(TypedDict):
    """A job's task after a cancel: ``12_0`` (``12`` for a plain job, ``12_[3-5]`` for a pending
    rest), its state, and when it started (None: it never did, cancelled while pending)."""

    job_id: str
    state: str
    start_time: int | None


class _ScriptFlagsParamsRequired(TypedDict):
    workdir: str
    argv: list[str]
    """The run's command up to its script (interpreter and script, or the script alone when it
    is executed directly). The script is read, never run."""


class ScriptFlagsParams(_ScriptFlagsParamsRequired, total=False):
    search_path: str
    """``PATH`` of the launch's environment (where a script executed by name is found)."""


class ScriptOption(TypedDict):
    """One ``add_argument`` call with option strings, as written in the script."""

    flags: list[str]
    """Its option strings (``-n``, ``--num-samples``; ``--no-X`` too for BooleanOptionalAction)."""
    dest: str
    """``dest=``, else argparse's own; empty when ``dest=`` is not a literal."""
    action: str
    """argparse's action name (``store``, ``store_true``, ``count``, ``append``...),
    ``boolean_optional``, ``custom`` (another class) or ``unknown`` (``**kwargs``)."""
    takes_value: bool | None
    """True: needs a value; False: takes none; None: either, or not known."""
    type: str | None
    """``int``, ``float``, ``str``, ``bool``, ``unknown`` (any other converter); None: not given
    (the value stays a string)."""
    choices: list[str] | None
    """Literal choices as command-line text; None: none given, or not literal."""
    choices_unread: bool
    """``choices=`` is given but not written literally."""
    nargs: str | None
    """``nargs`` as text (``?``, ``*``, ``+``, ``2``, ``...``; ``unknown`` when not literal)."""
    default: str | int | float | bool | None
    """Literal ``default=`` (masked when secret); meaningful only with ``has_default``."""
    has_default: bool
    required: bool | None
    """Literal ``required=``; None when not literal."""
    line: int


class ScriptFlagsResult(TypedDict):
    path: str
    """The file read (or tried)."""
    readable: bool
    found: bool
    """The script declares its options with argparse (``options`` is what it declares)."""
    reason: str
    """Why ``found`` is false; empty when it is true."""
    options: list[ScriptOption]
    allow_abbrev: bool
    """False only when every parser is built with ``allow_abbrev=False``."""
    dynamic: int
    """``add_argument`` calls whose option strings are not written literally."""
    positionals: int
    known_args: bool
    """The script calls ``parse_known_args``: it may pass undeclared flags on."""
    sha256: str
    """sha256 of the bytes read (empty when none could be)."""


class _ScriptInstallParamsRequired(TypedDict):
    path: str
    """The script on the host (absolute), as ``script_flags`` found it."""
    expect_sha256: str
    """Its sha256 when the laptop read it: another is refused (``changed``), nothing replaced."""


class ScriptInstallParams(_ScriptInstallParamsRequired, total=False):
    source_b64: str
    """The new script's bytes, base64."""
    from_path: str
    """Instead of ``source_b64``: a copy kept on the host (a rollback puts it back)."""
    from_sha256: str
    """The sha256 ``from_path`` must have."""
    keep: bool
    """Keep the old script as ``<path>.runwatch-<sha12>`` first (default true)."""
    check: bool
    """Write nothing: only whether the script is still the one read and its directory takes a
    new file (the preflight, before the stop; no ``source_b64`` then)."""


class ScriptInstallResult(TypedDict):
    path: str
    old_sha256: str
    new_sha256: str
    """Read back from the file installed (empty with ``check``)."""
    kept: str
    """Where the old script was kept (empty without ``keep``, and with ``check``)."""
    mode: int


class _ResolveArgsParamsRequired(TypedDict):
    workdir: str
    argv: list[str]
    """The run's command up to its script, as for ``script_flags``."""
    args: list[str]
    """What follows the script: the argv the client's parser is given."""


class ResolveArgsParams(_ResolveArgsParamsRequired, total=False):
    search_path: str
    """``PATH`` of the launch's environment (where a script executed by name is found)."""


class ResolveArgsResult(TypedDict):
    """What a command line means to the client's own argparse parser (``agent/argresolve``)."""

    path: str
    exact: bool
    """The parser was read exactly and argparse itself resolved ``args`` with it."""
    reason: str
    """Why ``exact`` is false."""
    error: str | None
    """argparse's own message when it rejects ``args`` (the client would exit with it)."""
    values: dict[str, Any]
    """Dest -> the value argparse resolved (paths as text)."""
    unknown: dict[str, str]
    """Dest -> why its value is not known (a default not written literally)."""
    given: list[str]
    """The dests the argv itself set (the others hold their defaults)."""
    options: dict[str, str]
    """Every option string of the parser -> its dest."""
    python: str
    """The host's Python version, whose argparse resolved ``args``."""


OP_SHAPES: dict[str, tuple[type, type]] = {
    "ping": (PingParams, PingResult),
    "ps": (PsParams, PsResult),
    "refresh": (RefreshParams, RefreshResult),
    "scan": (ScanParams, ScanResult),
    "kill": (KillParams, KillResult),
    "probe": (ProbeParams, ProbeResult),
    "units": (UnitsParams, UnitsResult),
    "unit_stop": (UnitStopParams, UnitStopResult),
    "launch": (LaunchParams, LaunchResult),
    "lock_status": (LockStatusParams, LockStatusResult),
    "repair_tail": (RepairTailParams, RepairTailResult),
    "move_aside": (MoveAsideParams, MoveAsideResult),
    "snapshot_check": (SnapshotCheckParams, SnapshotCheckResult),
    "snapshot_take": (SnapshotTakeParams, SnapshotTakeResult),
    "snapshot_verify": (SnapshotVerifyParams, SnapshotVerifyResult),
    "snapshot_restore": (SnapshotRestoreParams, SnapshotRestoreResult),
    "snapshot_list": (SnapshotListParams, SnapshotListResult),
    "read_fingerprint": (ReadFingerprintParams, ReadFingerprintResult),
    "write_fingerprint": (WriteFingerprintParams, WriteFingerprintResult),
    "tail_log": (TailLogParams, TailLogResult),
    "tail_records": (TailRecordsParams, TailRecordsResult),
    "gpu_holders": (GpuHoldersParams, GpuHoldersResult),
    "file_holders": (FileHoldersParams, FileHoldersResult),
    "observe_files": (ObserveFilesParams, ObserveFilesResult),
    "slurm_jobs": (SlurmJobsParams, SlurmJobsResult),
    "slurm_submit": (SlurmSubmitParams, SlurmSubmitResult),
    "slurm_cancel": (SlurmCancelParams, SlurmCancelResult),
    "script_flags": (ScriptFlagsParams, ScriptFlagsResult),
    "resolve_args": (ResolveArgsParams, ResolveArgsResult),
    "script_install": (ScriptInstallParams, ScriptInstallResult),
}
"""Op name -> (params shape, result shape)."""
