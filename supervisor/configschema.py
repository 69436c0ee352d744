"""The config file's schema: typed, documented ``msgspec`` structs, one docstring per key.

Every numeric key's bounds are declared on the field itself as ``msgspec.Meta`` constraints
(``Annotated[int, msgspec.Meta(ge=1)]``): ``supervisor.config`` reads them back (through
``msgspec.inspect``) to say what a key allows when a value is out of them. Unknown keys are errors.
Reading and checking a file is ``supervisor.config.load_config``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from supervisor.agent import argflags
from supervisor.agent.argflags import DEFAULT_SCRIPTS
from supervisor.errors import ConfigError
from supervisor.paths import config_key

BudgetPolicy = Literal["warn", "stop", "restart-with-budget"]
HostKind = Literal["processes", "slurm"]
OnExit = Literal["alert", "restart"]

# The bounds of numeric keys, read back by the loader to say what a key allows.
Seconds = Annotated[float, msgspec.Meta(gt=0)]
"""A timeout, interval or duration: 0 would spin or never wait."""
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
"""A grace, backoff, price or threshold: 0 is allowed (none, free, off)."""
Count = Annotated[int, msgspec.Meta(ge=1)]
"""A count of things wanted or allowed at once: at least one."""
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
"""A count that may be zero."""
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
"""A TCP port."""
ValueType = Annotated[
    str | list[str],
    msgspec.Meta(
        description="a type name or a list of strings (choices)",
        extra={"hint": 'for example value_types = { "--n" = "int", "--mode" = ["fast", "slow"] }'},
    ),
]
"""One entry of a client profile's ``value_types``: a type name (``int``, ``float``, ``str``,
``path``) or the choices."""


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: unknown keys are rejected."""


class HostConfig(_Section):
    """A machine runwatch watches: over SSH, or this machine (``local = true``)."""

    name: str
    """The name runs refer to."""
    address: str | None = None
    """Host name, IP or ``~/.ssh/config`` alias (default: ``name``). Ignored when ``local``."""
    local: bool = False
    """This machine: the agent runs as a local subprocess, no SSH."""
    kind: HostKind = "processes"
    """What the runs on this host are: ``processes`` (listed, killed and launched by runwatch
    itself) or ``slurm`` jobs (the host is a login node: runs are listed with ``squeue``, stopped
    with ``scancel`` and launched with ``sbatch``; their data files are read there, on the shared
    filesystem). ``local`` still says how the host is reached."""
    user: str | None = None
    """SSH user (default: from ``~/.ssh/config`` or the local user)."""
    port: Port | None = None
    """SSH port (default: from ``~/.ssh/config`` or 22)."""
    python: str = "python3"
    """The Python interpreter on the host that runs the agent (>= 3.8)."""
    known_hosts: str | None = None
    """known_hosts file to verify the host key against (default ``~/.ssh/known_hosts``)."""
    identity_files: list[str] = []
    """Private keys to offer, in addition to those of ``~/.ssh/config`` and the SSH agent."""
    ssh_config: str | None = None
    """OpenSSH client config file to read (aliases, User, Port, IdentityFile, ProxyJump...).
    Default ``~/.ssh/config``."""
    insecure_skip_host_key_check: bool = False
    """Do NOT verify the host key. Explicit opt-in; runwatch warns every time it connects."""
    show_other_users: bool = False
    """List matching processes of other users too (they are never killable)."""
    only_own_runs: bool = False
    """List only this config's runs: the processes of its own units (those runwatch started for
    it) and those its runs' evidence matches (a run started by hand in its workdir). Other
    processes running a known script (the user's other runs on the machine, another config's
    units) are not listed, so nothing is shown, held to this config's budgets or audited about
    them. The demo sets it, so that it shows only what it started."""
    connect_timeout: Seconds = 10.0
    """Seconds to establish the SSH connection."""
    command_timeout: Seconds = 30.0
    """Overall bound on any single request to the host."""
    keepalive_interval: Seconds = 5.0
    """Seconds between SSH keepalives; a silent peer is detected after interval x count."""
    keepalive_count_max: Count = 3
    """Keepalives without an answer before the connection is declared dead."""


class DatasetConfig(_Section):
    """Limits and inputs of one dataset, shared by every run that writes it."""

    token_budget: Count | None = None
    """Completion tokens wanted for this dataset."""
    max_samples: Count | None = None
    """Responses wanted for this dataset."""
    prompts: str | None = None
    """Prompts file (JSONL), relative to the run's workdir; its line count bounds the samples."""


class SlurmRunConfig(_Section):
    """How a run on a ``kind = "slurm"`` host is submitted (``sbatch`` options)."""

    partition: str | None = None
    """``--partition``."""
    gres: str | None = None
    """``--gres``, e.g. ``gpu:8``."""
    gpus: str | None = None
    """``--gpus``, e.g. ``8`` or ``h100:8``."""
    time: str | None = None
    """``--time`` limit, e.g. ``12:00:00`` or ``2-00:00:00``."""
    nodes: Count | None = None
    """``--nodes``."""
    cpus_per_task: Count | None = None
    """``--cpus-per-task``."""
    array: bool = False
    """One array task per dataset: task ``i`` runs argv with ``--datasets`` set to the i-th
    dataset; the run's state is aggregated over its tasks."""
    array_max_running: Count | None = None
    """At most this many array tasks at once (``--array=0-N%M``)."""
    job_name: str | None = None
    """``--job-name`` (default ``rw-<run>``)."""
    output: str | None = None
    """Output file of the job, relative to workdir unless absolute, with sbatch's patterns
    (default ``<output_dir>/.runwatch/slurm-%j.log``, ``slurm-%A_%a.log`` for arrays)."""
    extra: list[str] = []
    """More ``#SBATCH`` lines, each one option as sbatch reads it (e.g. ``--mem=64G``)."""


class RunConfig(_Section):
    """One data-generation run: a command on a host writing ``<output_dir>/<dataset>/...``."""

    name: str
    host: str
    """Name of a ``[[hosts]]`` entry."""
    workdir: str
    """Directory the command runs in, on the host: absolute, or from the home directory
    (``~/...``). The client resolves its relative paths from it."""
    argv: Annotated[list[str], msgspec.Meta(min_length=1)]
    """The command, as a list of arguments (never a shell string). No shell expands them: a
    ``~`` in a value is a directory named ``~`` under the workdir, as the client sees it."""
    output_dir: str | None = None
    """Where a script that NO client profile describes writes when its argv has no output-dir
    flag (its own default, which runwatch cannot know), relative to ``workdir`` unless absolute.
    Not read for a profiled client: its argv, else its profile's ``path_defaults``, decide."""
    format: str = "raw"
    """Record format the run writes: a built-in profile or a ``[formats.NAME]`` entry."""
    datasets: list[str] = []
    """Datasets of the run (default: parsed from ``--datasets`` in argv)."""
    data_file: str = "raw_responses.jsonl"
    """File name of a dataset's records inside ``<output_dir>/<dataset>/``."""
    log: str | None = None
    """Log file, relative to ``workdir`` unless absolute; launch appends output to it."""
    endpoint: str | None = None
    """Name of the ``[[endpoints]]`` entry this run sends its requests to."""
    budget_policy: BudgetPolicy = "warn"
    """What to do when a dataset passes its token budget with no ``--token-budget`` in argv."""
    stall_seconds: Seconds = 300.0
    """A dataset that has not grown for this long while its writer is alive is stalled."""
    env: dict[str, str] = {}
    """Extra environment variables for the launched command. Prefer ``api_key_env`` for an API
    key; the values of credential-named variables (``*TOKEN*``, ``*KEY*``...) are masked in
    every output."""
    settle_seconds: Seconds = 2.0
    """After a launch, how long the new process must stay alive to count as started."""
    stop_grace_seconds: NonNegative = 10.0
    """A restart's stop: seconds between SIGTERM and SIGKILL."""
    client: str | None = None
    """The generation script's client profile: a built-in (``runwatch clients``) or a
    ``[clients.NAME]`` entry. Default: detected from the script named in ``argv``."""
    slurm: SlurmRunConfig | None = None
    """sbatch options of a run on a ``kind = "slurm"`` host."""
    on_exit: OnExit = "alert"
    """When ``runwatch watch`` sees the run gone without anyone stopping it (not through
    runwatch, not because every dataset is done): ``alert``, or ``restart`` it (through the same
    checks as ``runwatch launch``, audited) after ``restart_backoff_seconds``."""
    restart_backoff_seconds: NonNegative = 10.0
    """Wait before an automatic restart; doubled for each restart already made in the window."""
    restart_max: NonNegativeInt = 3
    """Automatic restarts allowed within ``restart_window_seconds``; one more death gives up
    (alerted, never looped)."""
    restart_window_seconds: Seconds = 3600.0
    """The window ``restart_max`` counts in."""


class EndpointConfig(_Section):
    """An OpenAI-compatible endpoint: the local server or an API."""

    name: str
    kind: Literal["local", "api"]
    base_url: str
    """Base URL including ``/v1``."""
    model: str | None = None
    """Model name sent in requests (default: the first model of ``/v1/models``)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key. Never the key itself."""
    price_in_per_m: NonNegative | None = None
    """USD per million prompt tokens (API endpoints)."""
    price_cached_in_per_m: NonNegative | None = None
    """USD per million prompt tokens the API served from its prompt cache (OpenAI's
    ``usage.prompt_tokens_details.cached_tokens``), when it bills them lower; unset: they cost
    ``price_in_per_m``."""
    price_out_per_m: NonNegative | None = None
    """USD per million completion tokens (API endpoints)."""
    gpu_cost_per_hour: NonNegative | None = None
    """USD per hour of the GPUs behind a local endpoint."""
    max_tokens: Count | None = None
    """max_tokens of the run's requests (used by bench to shape requests like the run's)."""
    temperature: NonNegative | None = None
    """Sampling temperature of the run's requests."""
    concurrency: Count | None = None
    """Concurrency the run uses against this endpoint (bench default)."""
    metrics_url: str | None = None
    """Prometheus endpoint of a local serving engine, fetched by the agent on the host that runs
    the endpoint's runs, over that host's own loopback (``http://`` to the host itself only).
    Default: ``base_url`` without ``/v1``, plus ``/metrics``. SGLang serves it with
    ``--enable-metrics``; vLLM always."""
    stream: bool | None = None
    """Whether the run streams its requests (a bench is used for this endpoint only when its
    streaming mode matches; None: not known, any bench matches)."""


class FormatProfile(_Section):
    """A user-defined record format."""

    id_field: str
    """Key holding the record's unique id."""
    tokens_field: str | None = None
    """Key holding the completion token count."""
    tokens_list_field: str | None = None
    """Key holding a list whose length is the completion token count."""
    text_field: str | None = None
    """Key holding text to count with the configured tokenizer: a string, or a list of chat
    messages (``{role, content}``) whose ``content`` is counted."""
    text_role: str | list[str] | None = None
    """With a ``text_field`` of messages: the role (or list of roles) whose messages are counted,
    e.g. ``"assistant"``; the prompts (``system``, ``user``), tool and reasoning turns of other
    roles are then not. Unset: every message is counted."""
    reasoning_keys: list[str] = []
    """Keys of a counted message holding its reasoning text (``reasoning_content``), counted
    apart, the first one a message has; unlisted reasoning is not counted."""
    prompt_tokens_field: str | None = None
    """Key holding the prompt token count, if any."""
    finish_reason_field: str | None = None
    """Key holding the finish reason, if any."""
    required: list[str] = []
    """Keys every record must have (default: the fields named above)."""


class ClientFlagNames(_Section):
    """The spellings of each flag a client understands, by what the flag means. Empty: none."""

    datasets: list[str] = []
    """Dataset names (a comma list, or several values): one data file per dataset."""
    output_dir: list[str] = []
    """The output directory: a dataset's records are ``<dir>/<dataset>/<data_file>``."""
    output_file: list[str] = []
    """ONE output file: the run has one dataset, named after the file (``regen.jsonl`` -> regen)."""
    input_file: list[str] = []
    """The input (prompts) file of a single-file client; its lines bound the samples."""
    prompts_dir: list[str] = []
    """A directory of ``<dataset>.jsonl`` prompt files."""
    samples: list[str] = []
    """The number of samples wanted (per dataset)."""
    budget: list[str] = []
    """The completion-token budget the client stops at (per dataset)."""
    resume: list[str] = []
    """The flag without value that makes the client keep and extend existing output."""
    concurrency: list[str] = []
    """Requests in flight."""
    endpoint: list[str] = []
    """Where requests go: a base URL, or an address ``endpoint_template`` turns into one."""
    model: list[str] = []
    """The model name sent in requests."""


class ClientProfile(_Section):
    """A generation script: how it is recognised, what its flags mean, how it resumes."""

    scripts: list[str]
    """Script file names that identify the client in a process list."""
    format: str = "raw"
    """Record format of its output: a built-in format or a ``[formats.NAME]`` entry."""
    flags: ClientFlagNames = msgspec.field(default_factory=ClientFlagNames)
    data_file: str = "raw_responses.jsonl"
    """File name of a dataset's records under ``<output_dir>/<dataset>/`` (per-dataset layout)."""
    endpoint_template: str = "{}"
    """How an ``endpoint`` flag value becomes a base URL (``http://{}/v1`` for ``host:port``)."""
    resume: Literal["always", "flag"] = "always"
    """``always``: it keeps and extends existing output; ``flag``: it OVERWRITES its output unless
    given its ``resume`` flag."""
    samples_scope: Literal["total", "invocation"] = "total"
    """Whether ``samples`` counts the dataset's records (``total``) or this invocation's
    submissions after what it skipped on resume (``invocation``)."""
    sidecars: dict[str, str] = {}
    """Files beside the output holding failed or skipped prompts: kind -> name, ``{stem}`` being the
    output file's name without ``.jsonl`` (``error = "{stem}_error.jsonl"``)."""
    input_id: str = ""
    """Key of an input row's id, echoed in the record's id field; empty: the row's 0-based index."""
    volatile: list[str] = []
    """Flags that do not change what is generated (concurrency, resume, addresses...): left out of
    the launch fingerprint."""
    known_flags: list[str] = []
    """Every flag the script accepts (``--set`` is checked against them, and against the options
    its argparse source declares, read statically on the host)."""
    switches: list[str] = []
    """Those of ``known_flags`` that take no value (``--resume``)."""
    secret_flags: list[str] = []
    """Flags whose value is a secret besides those runwatch knows (``--api-key``, ``-k``,
    ``--credentials-json``, credential ``--header`` values...): their values are masked in every
    output (``secret_flags = ["--org-token"]``)."""
    path_defaults: dict[str, str] = {}
    """The value the script itself uses for a path flag its argv does not give (its argparse
    ``default=``): ``path_defaults = { "--output-dir" = "out" }``. Where data goes is read from the
    argv, else from here; a flag that decides where data goes (output dir or file) with neither
    leaves the run's files unknown, and every action on them is refused. Relative to the workdir;
    a ``~`` is literal, as in argv. A flag named here is one of ``known_flags`` (when given), not a
    switch, and of type ``path`` when typed."""
    value_types: dict[str, ValueType] = {}
    """What the value of a flag must be, checked for every ``--set`` before a restart stops
    anything (a flag without a type takes any value): ``"int"`` (argparse ``type=int``: what
    Python's ``int()`` reads), ``"float"`` (``type=float``), ``"str"`` (any value), ``"path"`` (a
    non-empty path), or a list of strings, one of which the value must be exactly (argparse
    ``choices``). Each typed flag must be one of ``known_flags`` (when given) and not a switch:
    ``value_types = { "--max-tokens" = "int", "--reasoning" = ["none", "save", "disable"] }``."""
    value_ranges: dict[str, list[float]] = {}
    """The inclusive range ``[low, high]`` (or ``[low]``: at least low) a numeric flag's value must
    lie in, as the script checks it when it starts (SpecForge refuses a ``--temperature`` outside
    0..1): checked for every ``--set`` with ``value_types``
    (``value_ranges = { "--temperature" = [0.0, 1.0], "--max-tokens" = [1] }``)."""
    defaults: dict[str, str] = {}
    """The script's own default of a flag its argv does not give (its argparse ``default=``), as
    ``runwatch clients`` shows it; where data goes is ``path_defaults``."""
    name: str = ""
    """Set from the table name (not a key of the file)."""


class AlertsConfig(_Section):
    """Where ``runwatch watch`` sends alerts, and which (``[alerts]``)."""

    urls: list[str] = []
    """Apprise URLs (``ntfy://...``, ``slack://...``, ``json://host/path``, ``mailto://...``).
    They often hold tokens: write ``${VAR}`` and set VAR in the environment; shown masked."""
    events: list[str] = []
    """Event kinds to send (default: every kind; see ``runwatch watch --help``)."""
    min_severity: Literal["info", "warning", "critical"] = "info"
    """Events below this severity are shown but not sent."""
    waste_tokens: NonNegativeInt | None = 1_000_000
    """Alert ``waste`` when a dataset's projected tokens past its budget exceed this (on by
    default: a million tokens is hours of a GPU or dollars of an API; write a larger number to
    hear of less)."""
    waste_usd: NonNegative | None = None
    """Alert ``waste`` when a dataset's projected cost past its budget exceeds this (USD)."""
    stall_multiple: NonNegative = 0.0
    """Also call a dataset stalled when its writer is alive and nothing new came for this many
    times its usual interval between records (0: only ``stall_seconds`` of the run)."""
    max_per_minute: Count = 10
    """At most this many messages a minute; the rest wait and go out as one digest."""
    digest_over: NonNegativeInt = 3
    """More events than this at once are sent as one digest message."""
    delivery_timeout_seconds: Seconds = 20.0
    """Seconds one delivery to one URL may take; past it, it is retried with backoff (the
    watcher never waits for a delivery: each URL has a queue and a worker of its own)."""
    failing_minutes: Seconds = 10.0
    """When a URL has failed every delivery for this many minutes, an alert saying so goes to
    the other URLs."""


class ExporterConfig(_Section):
    """The Prometheus exporter of ``runwatch watch`` (``[exporter]``, ``supervisor.exporter``)."""

    listen: str = ""
    """``HOST:PORT`` to serve ``/metrics`` on (``runwatch watch --metrics-listen`` overrides it);
    '' serves nothing. A bare ``PORT`` or ``:PORT`` means ``127.0.0.1:PORT``: any other address
    than loopback must be written out."""
    cert_file: str | None = None
    """PEM certificate: serve HTTPS (with ``key_file``)."""
    key_file: str | None = None
    """PEM private key of ``cert_file``."""
    client_ca_file: str | None = None
    """PEM CA bundle: only scrapers with a client certificate it signed are answered (mTLS)."""
    config_label: str = ""
    """The value of every series' ``config`` label (default: the config file's name without
    ``.toml``)."""


class Config(_Section):
    """The whole configuration file."""

    project: str | None = None
    """The config's identity in runwatch's state dir (launch specs, guard markers, history, the
    watcher's lock, audit records, its units on the hosts). Unset: the config file's resolved
    path, so moving the file starts afresh; set: the name, which survives moving the file (two
    files with one project name share that state)."""
    tokenizer: str | None = None
    """Local directory of a Hugging Face tokenizer. Never downloaded."""
    trust_remote_code: bool = False
    """Allow the tokenizer directory's own Python code to run. Off unless you trust it."""
    refresh_seconds: Seconds = 2.0
    """How often the TUI and ``status --watch`` refresh."""
    scripts: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_SCRIPTS))
    """Script names that identify a run in a process list (matched on an argv element's end)."""
    hosts: list[HostConfig] = []
    runs: list[RunConfig] = []
    datasets: dict[str, DatasetConfig] = {}
    endpoints: list[EndpointConfig] = []
    formats: dict[str, FormatProfile] = {}
    backup_max_bytes: NonNegativeInt = 4 << 30
    """Every start over existing data first snapshots each data file under
    ``<out>/.runwatch/snapshots/<run>/``: a reflink where the filesystem has them (free, no
    limit), else a byte copy of at most this many bytes in all; more is refused before anything
    stops (--force starts without a copy and names what is unprotected)."""
    snapshot_keep: Count = 5
    """Snapshots kept per run (at least 1): the oldest beyond are removed after each new one.
    ``runwatch restore RUN`` lists them and puts one back."""
    clients: dict[str, ClientProfile] = {}
    """User client profiles (``runwatch clients`` lists them with the built-in ones)."""
    aliases: list[list[str]] = []
    """Groups of names of one model (``[["moonshotai/Kimi-K2.5", "kimi-k2.5"]]``): a start
    over data made under one name of a group continues it under another. Names are compared
    case-insensitively anyway; a name is in at most one group."""

    alerts: AlertsConfig = msgspec.field(default_factory=AlertsConfig)
    exporter: ExporterConfig = msgspec.field(default_factory=ExporterConfig)
    path: str = ""
    """Where the config was read from (set by the loader, not a key of the file)."""

    @property
    def key(self) -> str:
        """The config's identity (``paths.config_key`` of its path, or of its ``project``)."""
        return config_key(self.path, self.project)

    def host(self, name: str) -> HostConfig:
        for h in self.hosts:
            if h.name == name:
                return h
        known = ", ".join(h.name for h in self.hosts) or "none"
        raise ConfigError(f"{self.path}: no host named {name!r} (hosts: {known})")

    def run(self, name: str) -> RunConfig:
        for r in self.runs:
            if r.name == name:
                return r
        known = ", ".join(r.name for r in self.runs) or "none"
        raise ConfigError(f"{self.path}: no run named {name!r} (runs: {known})")

    def endpoint(self, name: str) -> EndpointConfig:
        for e in self.endpoints:
            if e.name == name:
                return e
        known = ", ".join(e.name for e in self.endpoints) or "none"
        raise ConfigError(f"{self.path}: no endpoint named {name!r} (endpoints: {known})")

    def run_datasets(self, run: RunConfig) -> list[str]:
        """The datasets a run writes: its ``datasets`` key, else ``--datasets`` of its argv."""
        if run.datasets:
            return list(run.datasets)
        value = argflags.value(run.argv, "--datasets")
        return [d for d in value.split(",") if d] if value else []

    def require_hosts(self) -> None:
        """ConfigError when the config names no host (nothing to watch)."""
        if not self.hosts:
            raise ConfigError(
                f"{self.path}: no [[hosts]] in the config: nothing to watch",
                "add a [[hosts]] entry (local = true for this machine), or try `runwatch demo`",
            )

    def require_runs(self) -> None:
        """ConfigError when the config names no host or no run (nothing to act on)."""
        self.require_hosts()
        if not self.runs:
            raise ConfigError(
                f"{self.path}: no [[runs]] in the config: nothing to check or act on",
                "add a [[runs]] entry (name, host, workdir, argv, datasets)",
            )


def bad_name(name: str) -> str | None:
    """Why ``name`` cannot be a file or directory name inside a directory (None: it can)."""
    if not name:
        return "is empty"
    if name in (".", ".."):
        return f"{name!r} is not a name"
    if "/" in name or "\\" in name:
        return f"{name!r} contains a path separator"
    if "\0" in name:
        return f"{name!r} contains a NUL byte"
    return None
