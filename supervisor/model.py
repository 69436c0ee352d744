"""The model the engine builds on every refresh and every front end renders (TUI, CLI, --json).

Plain ``msgspec`` structs: cheap to build, to copy into messages and to encode as JSON. Fields
may be added (with defaults); renaming one is a change to every front end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from supervisor.agent.protocol import owner_text

if TYPE_CHECKING:
    from supervisor.agent.protocol import SlurmJobIdentity

Backend = Literal["local", "api", "unknown"]
RunState = Literal["running", "pending", "stopped", "zombie", "unknown", "ambiguous"]
"""``pending``: a Slurm job of the run waits in the queue; ``ambiguous``: several processes
could each be the run (``RunView.candidates``)."""
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


class UnitRef(msgspec.Struct, kw_only=True):
    """The unit a listed process belongs to (it was started by runwatch; see
    ``supervisor.agent.unit``)."""

    launch_id: str
    held_by: Literal["cgroup", "token"]
    """``cgroup``: a cgroup v2 leaf holds every descendant; ``token``: the launch token in the
    environment and the waiter's subreaper tree do."""
    run: str
    mine: bool = False
    """Launched by this config (another config's run of the same name is not this one)."""
    config_id: str | None = None
    """The key of the config that launched it (None: an older agent's unit)."""
    config_path: str | None = None

    def owner(self) -> str:
        """`` (run 'R' of config PATH; stop it there: `...`)``: whose run it is, for a refusal."""
        return owner_text(self.run, self.config_id, self.config_path)

    def held_text(self, pid: int) -> str:
        """``held by config PATH run 'R' (pid P, unit L)``: the run of another config, or of
        this one under another name, whose unit writes a run's data files."""
        where = self.config_path or f"key {self.config_id or '?'}"
        return f"held by config {where} run {self.run!r} (pid {pid}, unit {self.launch_id})"


class UnitExit(msgspec.Struct, kw_only=True):
    """How a unit's client ended, as its waiter recorded it."""

    code: int | None = None
    signal: int | None = None
    at: float | None = None
    stopped: bool = False
    """runwatch had asked the unit to stop (a kill, a restart, a budget policy) before it ended."""
    failed: dict[str, int | None] | None = None
    """The first orphaned member that died of a signal or a non-zero exit (``pid``, ``code``,
    ``signal``): a worker that crashed after its parent exited 0."""


class UnitInfo(msgspec.Struct, kw_only=True):
    """A unit of this config on a host, running or ended (the agent's ``units``)."""

    launch_id: str
    run: str
    held_by: Literal["cgroup", "token"]
    state: Literal["running", "ended"]
    main_pid: int | None = None
    members: list[int] = []
    exit: UnitExit | None = None
    waiter_alive: bool = False
    tracked: bool = True
    """False once a member killed the waiter of a unit without a cgroup (see ``agent.unit``)."""
    launched_at: float | None = None

    @property
    def ending(self) -> Literal["finished", "died", "stopped", "lost"] | None:
        """How the run ended: ``finished`` (exit 0 by itself), ``died`` (a non-zero exit or a
        signal runwatch did not send), ``stopped`` (runwatch stopped it), ``lost`` (its waiter
        died before the client: the exit is unknown); None while it runs."""
        if self.state != "ended":
            return None
        if self.exit is None:
            return "lost"
        if self.exit.stopped:
            return "stopped"
        return "finished" if self.exit.code == 0 and self.exit.failed is None else "died"


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
    evidence: dict[str, list[str]] = {}
    """Config run name -> what the host found tying this process to that run: ``argv`` (its data
    paths are the run's files), ``fd`` (it holds the run's data files or lock open), ``cwd`` (its
    working directory is the run's workdir: never enough alone), ``unit`` (it is the main
    process of a unit this config launched as that run), ``files`` (the main process of another
    run's unit, of any config, started on the run's data files), ``place`` (its working
    directory or root is a data file's directory), ``identity`` (with ``argv`` or ``place``:
    found by file identity, through a bind mount or a link). See ``hosts.match_run``."""
    unit: UnitRef | None = None
    """The unit holding it, when runwatch started it; its other members are in ``children``."""


class Rates(msgspec.Struct, kw_only=True):
    """Windowed rates of a dataset, from successive scans."""

    req_per_s_1m: float | None = None
    req_per_s_10m: float | None = None
    req_per_s_all: float | None = None
    tok_per_s_1m: float | None = None
    tok_per_s_10m: float | None = None
    tok_per_s_all: float | None = None
    tok_per_s: float | None = None
    """The rate to show and decide on: output tokens/s over ``window_s``; None while the window
    holds fewer than ``rates.MIN_RESPONSES`` responses (too few to say), 0 once the dataset is
    done."""
    tok_per_s_err: float | None = None
    """One standard error of ``tok_per_s``: ``tok_per_s / sqrt(responses)`` (responses arrive
    one at a time, so their count in a window is Poisson-like)."""
    req_per_s: float | None = None
    """Responses/s over the same window."""
    window_s: float | None = None
    """Span the rate is measured over (up to 10 minutes)."""
    responses: int = 0
    """Responses written within the window."""


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


class RunWaste(msgspec.Struct, kw_only=True):
    """What a running run without a budget flag will make past its datasets' budgets if left
    alone: every dataset's waste, the datasets not started included (``rates.run_waste``)."""

    tokens: int = 0
    seconds: float | None = None
    """How long the run takes to make them, at its own rate (None: no rate yet)."""
    cost_usd: float | None = None
    """Their price: the endpoint's output price, else its GPU cost per hour over ``seconds``."""
    datasets: list[str] = []
    """The datasets past (or bound past) their budgets, in the run's order."""
    guessed: list[str] = []
    """Of those, the ones not started whose prompts' lengths are unknown: their tokens are their
    samples to go times the run's average tokens per response so far (a guess: their own answers
    may be longer or shorter)."""
    like: dict[str, str] = {}
    """Of those, the ones not started whose prompts' lengths are known -> the started dataset
    whose prompts are nearest in length: their tokens are their samples to go times its average
    tokens per response, and their samples to budget its budget over that average."""
    message: str = ""
    """One line: ``left alone: +109 M tokens past budgets in B2..B8 (7) over ~59 h, ~$870``."""


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
    """Input ids with neither that the client passed (it answered a later row), or, once the run
    finished by itself short of its limits, every input id with neither."""
    missing_first: list[str | int] = []
    not_reached: int = 0
    """Input ids after the last row answered: not attempted yet (a run still going, or one that
    stopped at its ``--max-samples`` or budget). Never missing."""
    not_reached_first: list[str | int] = []
    in_flight: int = 0
    """Rows just before the last one answered, fewer than the running client's concurrency:
    requests still in flight, not missing."""
    missing_near: list[list[str | int]] = []
    """``[distance to the last row answered, id]`` of the missing rows nearest it."""
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
    """Bytes after the last newline: a record being written, or torn (see ``torn_tail``)."""
    torn_tail: str | None = None
    """Set when the last line is partial and no writer of the run is alive (a record cut short
    by a kill or crash): its size and what the next launch or restart does with it. None while
    the run is running, when a partial last line is the record being written."""
    verdict: Verdict = "empty"
    verdict_detail: str | None = None
    max_samples: int | None = None
    token_budget: int | None = None
    rates: Rates = msgspec.field(default_factory=Rates)
    projection: Projection = msgspec.field(default_factory=Projection)
    over_budget: bool = False
    stalled: bool = False
    history: list[float] = []
    """Tokens/s per interval (10 s and up) over the last minutes, oldest first, from the
    persisted history (for a sparkline)."""
    done: bool = False
    """Nothing more will be written: no live writer, or a stop condition is reached."""
    run_token_budget: int | None = None
    """The run's own ``--token-budget`` (it stops the dataset there; the config's budget does
    not)."""
    idle_s: float = 0.0
    """Seconds since the file last grew (0 before it was seen twice)."""
    reasoning_tokens: int = 0
    """Of ``completion_tokens``, those of reasoning texts (``reasoning_content``)."""
    sidecars: list[SidecarView] = []
    completeness: CompletenessView | None = None
    prompt_chars: float | None = None
    """Mean characters of text per row of its input (the first MiB of it, read on the host):
    how long its prompts are, to project a dataset not started from the started dataset whose
    prompts are nearest in length (``rates.run_waste``). None when its input is unreadable."""
    alarm: str | None = None
    """Data loss seen under the running run (the file shrank or was replaced), with byte counts."""
    provisional: bool = False
    """True while the host's first scan runs: ``records`` is the file's line count (counted at
    once, before the records are parsed) and nothing else is known yet."""


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
    """The job's comment (``runwatch:<run>`` for the jobs runwatch submits): shown, and part of
    what a cancel names; the recorded job ids, not the comment, make a job a run's."""
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
    def identity(self) -> SlurmJobIdentity:
        """What a cancel names: job id, submit time and tag (a reused id is refused)."""
        return {"job_id": self.job_id, "submit_time": self.submit_time, "tag": self.tag}


class RunView(msgspec.Struct, kw_only=True):
    """A configured run (or an unconfigured matching process) and its datasets."""

    name: str
    host: str
    state: RunState = "unknown"
    state_detail: str | None = None
    """Why the state is what it is, when that is not obvious (``host unreachable``)."""
    process: ProcessInfo | None = None
    datasets: list[DatasetView] = []
    configured: bool = True
    client: str | None = None
    """The run's client profile (``runwatch clients``)."""
    budget_flag: str | None = "--token-budget"
    """The client's token-budget flag; None: the client has none (only a stop enforces a budget)."""
    samples_flag: str | None = "--max-samples"
    """The client's flag for the number of samples wanted (None: it has none)."""
    candidates: list[int] = []
    """PIDs of the processes that could each be this run (state ``ambiguous``): actions by run
    name refuse until one is named (``--pid``)."""
    job: JobView | None = None
    """The run's Slurm job (``kind = "slurm"`` hosts): the active one, else the last seen."""

    rates: Rates = msgspec.field(default_factory=Rates)
    """The run's output over a window across all its datasets (never a sum of per-dataset
    windows)."""
    history: list[float] = []
    """The run's tokens/s over the last hours, oldest first (persisted across restarts)."""
    last_rates: Rates | None = None
    """A run that is not running: its rate over the last window while it ran (from the persisted
    history), kept so that a finished run's endpoint is still measured; None when none holds
    enough responses."""
    last_rates_at: float | None = None
    """When ``last_rates`` ends (Unix seconds): the run's last observation while alive."""
    endpoint: str | None = None
    """Name of the ``[[endpoints]]`` entry the run sends its requests to."""
    held_by: Literal["cgroup", "token", "adopted"] | None = None
    """How runwatch holds the running run: a unit it launched (``cgroup`` or ``token``), or a
    process it found and adopted by evidence (``adopted``); None when it is not running."""
    last_unit: UnitInfo | None = None
    """The newest unit this config launched for the run (running or ended)."""
    owner: UnitRef | None = None
    """The unit writing this run's data files when it is another run's: another config's (a
    copy of this config, one naming the same files) or this config's under another name. The
    run is running with its figures; kill, restart and the budget policy go through that run
    (``UnitRef.owner``: its config's command)."""
    waste: RunWaste | None = None
    """Left alone, what the run makes past its datasets' budgets (a running run without its
    client's budget flag, with something past a budget; else None)."""
    script_sha256: str | None = None
    """sha256 of the script of the run's last confirmed launch, as read on the host (from its
    launch spec; None: no launch recorded it)."""

    @property
    def ending(self) -> Literal["finished", "died", "stopped", "lost"] | None:
        """How the run's last launch ended (:attr:`UnitInfo.ending`); None while it runs or
        when runwatch never launched it."""
        return self.last_unit.ending if self.last_unit is not None else None

    @property
    def state_text(self) -> str:
        """``running``, ``unknown (host unreachable)``..."""
        return f"{self.state} ({self.state_detail})" if self.state_detail else self.state


class Quantity(msgspec.Struct, kw_only=True):
    """A serving-engine figure and its recent history."""

    value: float | None = None
    history: list[float] = []


class EndpointMetrics(msgspec.Struct, kw_only=True):
    """An endpoint the runs of a host use: their output from the data files and, for a local
    serving engine (SGLang, vLLM), what it says about itself on its ``/metrics``."""

    name: str
    """The endpoint's name in the config."""
    url: str
    kind: str = "local"
    """``local`` (its ``/metrics`` is read) or ``api`` (only the runs' files measure it)."""
    files_tok_per_s: Quantity = msgspec.field(default_factory=Quantity)
    """Output tokens/s of the running runs of this host that use the endpoint, from their data
    files (each run's window across its datasets, added up), and its history."""
    files_tok_per_s_err: float | None = None
    available: bool = False
    why: str | None = None
    """Why there are no figures: ``connection refused``, ``not enabled: SGLang needs
    --enable-metrics``..."""
    note: str | None = None
    """A caveat of the figures shown: ``/metrics over 4 MiB: read up to its cut``."""
    engine: str | None = None
    """``sglang`` or ``vllm`` (from the metric names)."""
    running: Quantity = msgspec.field(default_factory=Quantity)
    """Requests being decoded."""
    queued: Quantity = msgspec.field(default_factory=Quantity)
    """Requests waiting for a slot."""
    kv_usage: Quantity = msgspec.field(default_factory=Quantity)
    """Fraction of the KV cache in use (0..1)."""
    gen_tok_per_s: Quantity = msgspec.field(default_factory=Quantity)
    """Generated tokens/s from the generation-token counter over ``window_s``."""
    gen_tok_per_s_err: float | None = None
    """Uncertainty of ``gen_tok_per_s`` (the counter is exact; this is its scrape-time jitter)."""
    prompt_tok_per_s: float | None = None
    reported_gen_throughput: float | None = None
    """The engine's own gauge (``sglang:gen_throughput``), when it has one."""
    cache_hit_rate: float | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_window: str | None = None
    """``10 min`` (the histogram's change over the window) or ``since start``."""
    window_s: float | None = None
    generation_tokens_total: float | None = None


class GpuView(msgspec.Struct, kw_only=True):
    """One GPU of a host (``nvidia-smi --query-gpu``)."""

    index: int | None = None
    uuid: str | None = None
    name: str | None = None
    utilization_pct: float | None = None
    memory_used_mb: float | None = None
    memory_total_mb: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    pids: list[int] = []
    runs: list[str] = []
    """Runs whose processes (or their descendants) hold this GPU."""
    history: list[float] = []
    """Utilisation (%) over the last hours."""


class ScanProgress(msgspec.Struct, kw_only=True):
    """How far a host's first scan of its data files is."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


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
    endpoints: list[EndpointMetrics] = []
    """Serving-engine metrics of the local endpoints the host's runs use."""
    gpus: list[GpuView] = []
    gpu_error: str | None = None
    progress: ScanProgress | None = None
    """Set while the host's first scan runs (its datasets are then provisional)."""
    notes: list[str] = []
    """Figures of a reachable host that are stale, with why (``Slurm jobs as of 40 s ago:
    squeue gave no answer within 10 s``)."""


class PlanProgress(msgspec.Struct, kw_only=True):
    """An applied ``runwatch rebalance`` plan against what happens (``supervisor.rebalance``)."""

    applied_at: float
    """When the plan was made (its deadline counts from then)."""
    started_at: float | None = None
    """When its steps began (its projection counts from then)."""
    datasets: list[str] = []
    """The datasets the plan split."""
    deadline_at: float | None = None
    max_usd: float | None = None
    projected_end: float
    """When the plan said the last of its datasets would be done (Unix time)."""
    projected_err: float | None = None
    projected_usd: float | None = None
    expected_end: float | None = None
    """When, by today's rates, the last of them will be done (None once done or unknown)."""
    ended_at: float | None = None
    """When the last of them was written (once all are done)."""
    will_miss: bool = False
    """The deadline will pass (or passed) before the plan's datasets are done."""
    unwritten: list[str] = []
    """The plan's datasets left that no running run writes: they never finish as things are."""
    half_applied: bool = False
    """An apply of the plan was killed half-way (its intent is left, no apply holds the plan
    lock): its runs are not as the plan or as before until ``rebalance --apply --resume``."""
    runs: list[str] = []
    """The runs a half-applied plan began to change (the watcher restarts none of them)."""
    text: str = ""
    """One line for the front ends."""


class Snapshot(msgspec.Struct, kw_only=True):
    """Everything a refresh saw, for every host."""

    time: float
    hosts: list[HostView] = []
    plan: PlanProgress | None = None
    """The progress of the config's applied rebalance plan, when there is one."""
