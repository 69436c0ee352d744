"""The model the engine builds on every refresh and every front end renders (TUI, CLI, --json).

Plain ``msgspec`` structs: cheap to build, to copy into messages and to encode as JSON. Fields
may be added (with defaults); renaming one is a change to every front end.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Backend = Literal["local", "api", "unknown"]
RunState = Literal["running", "pending", "stopped", "zombie", "unknown"]
"""``pending``: a Slurm job of the run waits in the queue."""
Verdict = Literal["current", "legacy", "mixed", "unknown", "corrupt", "empty", "missing", "error"]


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """What makes a process this process: a kill names all of it and the agent checks all of it."""

    boot_id: str
    pid: int
    start_time: int
    """Start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    uid: int
    argv: tuple[str, ...]


class RunFlags(msgspec.Struct, kw_only=True):
    """The flags of a run's argv that matter to supervision."""

    datasets: list[str] = []
    max_samples: int | None = None
    token_budget: int | None = None
    concurrency: int | None = None
    output_dir: str | None = None
    api_base: str | None = None
    model: str | None = None
    backend: Backend = "unknown"
    client: str | None = None
    """The client profile the flags were read with (``supervisor.clients``)."""
    output_file: str | None = None
    """The one output file of a single-file client."""
    input_file: str | None = None
    prompts_dir: str | None = None
    resume: bool | None = None
    """Whether the client's resume flag is given (None: the client has none)."""


class ProcessInfo(msgspec.Struct, kw_only=True):
    """One matching process on a host, as listed by the agent."""

    identity: Identity
    user: str
    uptime_s: float
    cpu_percent: float
    rss_mb: float
    state: str
    """Kernel state letter or psutil status (``R``, ``S``, ``Z``...)."""
    cwd: str | None = None
    argv_masked: list[str] = []
    """argv with secrets (API keys, tokens) replaced by ``***``."""
    children: list[int] = []
    """PIDs of every descendant."""
    flags: RunFlags = msgspec.field(default_factory=RunFlags)
    gpu_memory_mb: float | None = None
    """GPU memory held by the process and its descendants (None: no nvidia-smi on the host)."""
    run: str | None = None
    """Name of the config run this process is, when it could be matched."""
    killable: bool = True
    """False for processes of other users."""


class Rates(msgspec.Struct, kw_only=True):
    """Windowed rates of a dataset, from successive scans."""

    req_per_s_1m: float | None = None
    req_per_s_10m: float | None = None
    req_per_s_all: float | None = None
    tok_per_s_1m: float | None = None
    tok_per_s_10m: float | None = None
    tok_per_s_all: float | None = None


class Projection(msgspec.Struct, kw_only=True):
    """What a dataset will still make before it stops, and what is waste."""

    stop_reason: str | None = None
    """Which stop condition comes first: ``max_samples``, ``token_budget``, ``prompts``, or None."""
    eta_s: float | None = None
    over_budget_tokens: int = 0
    """Tokens already past the budget."""
    remaining_samples: int | None = None
    remaining_tokens: int | None = None
    remaining_s: float | None = None
    waste_tokens: int = 0
    """Tokens past the budget, so far plus projected, when the run has no --token-budget."""
    waste_cost_usd: float | None = None
    message: str | None = None
    """One line for humans: ``10.7 M / 10 M, +14 M projected over 7 h - no --token-budget``."""
    etas: dict[str, float] = {}
    """Seconds until each stop condition is reached (``max_samples``, ``token_budget``,
    ``prompts``), and until the config budget is passed (``budget``), where a rate is known."""


class SidecarView(msgspec.Struct, kw_only=True):
    """A file beside a dataset holding the prompts that failed or were skipped (SpecForge)."""

    kind: str
    """``error`` or ``skipped``."""
    path: str
    state: str = "ok"
    lines: int = 0
    reasons: dict[str, int] = {}
    """Reason -> rows, the most frequent first (the rest summed in ``other_reasons``)."""
    other_reasons: int = 0


class CompletenessView(msgspec.Struct, kw_only=True):
    """The input's ids against the output's: what is done, failed, missing or foreign."""

    input: int = 0
    """Distinct ids of the input file."""
    done: int = 0
    """Input ids with a record."""
    failed: int = 0
    """Input ids only in an error or skipped file."""
    missing: int = 0
    """Input ids with neither."""
    missing_first: list[str | int] = []
    not_in_input: int = 0
    """Record ids the input does not hold."""
    not_in_input_first: list[str | int] = []
    duplicates: int = 0
    """Records whose id was already seen."""
    error: str | None = None
    """Why the input ids could not be read (then only ``input`` may be known)."""


class DatasetView(msgspec.Struct, kw_only=True):
    """One dataset of one run, as the front ends show it."""

    name: str
    path: str
    state: Literal["ok", "missing", "unreadable", "not-a-file", "error"] = "ok"
    error: str | None = None
    records: int = 0
    unique_ids: int = 0
    duplicates: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: dict[str, int] = {}
    bad_lines: int = 0
    partial_tail_bytes: int = 0
    verdict: Verdict = "empty"
    verdict_detail: str | None = None
    max_samples: int | None = None
    token_budget: int | None = None
    rates: Rates = msgspec.field(default_factory=Rates)
    projection: Projection = msgspec.field(default_factory=Projection)
    over_budget: bool = False
    stalled: bool = False
    history: list[float] = []
    """Tokens/s per interval over the last minutes, oldest first (for a sparkline)."""
    reasoning_tokens: int = 0
    """Of ``completion_tokens``, those of reasoning texts (``reasoning_content``)."""
    sidecars: list[SidecarView] = []
    completeness: CompletenessView | None = None
    alarm: str | None = None
    """Data loss seen under the running run (the file shrank or was replaced), with byte counts."""


class JobTask(msgspec.Struct, kw_only=True):
    """One task of a Slurm job array (or the job itself), as ``squeue`` lists it."""

    job_id: str
    """``12``, ``12_3`` (array task 3) or ``12_[4-7]`` (tasks still pending)."""
    task: int | None = None
    state: str = ""
    reason: str = ""
    nodes: str = ""
    elapsed_s: int | None = None
    stdout: str | None = None


class JobView(msgspec.Struct, kw_only=True):
    """The Slurm job of a run on a ``kind = "slurm"`` host, with the scheduler's state."""

    job_id: str
    """The job id (of the whole array, for an array job)."""
    submit_time: int | None
    tag: str
    """``runwatch:<run>``: the job's comment, which maps it to its run."""
    name: str = ""
    state: str = ""
    """Slurm's state, aggregated over the tasks: RUNNING if any runs, else PENDING if any waits,
    else the ended state (COMPLETED, CANCELLED, FAILED, TIMEOUT...)."""
    reason: str = ""
    """Why it waits (``Resources``, ``Priority``...), '' when it does not."""
    nodes: str = ""
    elapsed_s: int | None = None
    time_limit_s: int | None = None
    """None: no limit."""
    partition: str = ""
    stdout: str | None = None
    """The job's output file (of the first task for an array)."""
    tasks: list[JobTask] = []
    """The array's tasks (one entry for a plain job)."""

    @property
    def identity(self) -> dict[str, object]:
        """What a cancel names: job id, submit time and tag (a reused id is refused)."""
        return {"job_id": self.job_id, "submit_time": self.submit_time, "tag": self.tag}


class RunView(msgspec.Struct, kw_only=True):
    """A configured run (or an unconfigured matching process) and its datasets."""

    name: str
    host: str
    state: RunState = "unknown"
    process: ProcessInfo | None = None
    datasets: list[DatasetView] = []
    configured: bool = True
    client: str | None = None
    """The run's client profile (``runwatch clients``)."""
    budget_flag: str | None = "--token-budget"
    """The client's token-budget flag; None: the client has none (only a stop enforces a budget)."""
    job: JobView | None = None
    """The run's Slurm job (``kind = "slurm"`` hosts): the active one, else the last seen."""


class HostView(msgspec.Struct, kw_only=True):
    """A host and what was seen on it at the last successful refresh."""

    name: str
    connected: bool = False
    stale: bool = False
    """True when the values shown are from an earlier refresh (the host is unreachable now)."""
    error: str | None = None
    rtt_ms: float | None = None
    last_ok: float | None = None
    """Unix time of the last successful refresh."""
    has_gpu: bool = False
    runs: list[RunView] = []
    processes: list[ProcessInfo] = []


class Snapshot(msgspec.Struct, kw_only=True):
    """Everything a refresh saw, for every host."""

    time: float
    hosts: list[HostView] = []
