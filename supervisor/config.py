"""The configuration: TOML read with ``tomllib`` into typed, documented ``msgspec`` structs.

Unknown keys are errors. Every error names the file, the key path and what was expected, e.g.
``configs/x.toml: runs[0].argv: expected a list of strings, got str``.

String values may refer to environment variables as ``${NAME}`` (the demo uses this for its
directory and ports); an undefined variable is an error naming the key. No value from the config is
ever turned into shell text.
"""

from __future__ import annotations

import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import msgspec

from supervisor.agent import argflags
from supervisor.agent.argflags import DEFAULT_SCRIPTS
from supervisor.errors import ConfigError
from supervisor.paths import config_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BudgetPolicy = Literal["warn", "stop", "restart-with-budget"]
HostKind = Literal["processes", "slurm"]
OnExit = Literal["alert", "restart"]


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
    port: int | None = None
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
    connect_timeout: float = 10.0
    """Seconds to establish the SSH connection."""
    command_timeout: float = 30.0
    """Overall bound on any single request to the host."""
    keepalive_interval: float = 5.0
    """Seconds between SSH keepalives; a silent peer is detected after interval x count."""
    keepalive_count_max: int = 3
    """Keepalives without an answer before the connection is declared dead."""


class DatasetConfig(_Section):
    """Limits and inputs of one dataset, shared by every run that writes it."""

    token_budget: int | None = None
    """Completion tokens wanted for this dataset."""
    max_samples: int | None = None
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
    nodes: int | None = None
    """``--nodes``."""
    cpus_per_task: int | None = None
    """``--cpus-per-task``."""
    array: bool = False
    """One array task per dataset: task ``i`` runs argv with ``--datasets`` set to the i-th
    dataset; the run's state is aggregated over its tasks."""
    array_max_running: int | None = None
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
    argv: list[str]
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
    stall_seconds: float = 300.0
    """A dataset that has not grown for this long while its writer is alive is stalled."""
    env: dict[str, str] = {}
    """Extra environment variables for the launched command. Prefer ``api_key_env`` for an API
    key; the values of credential-named variables (``*TOKEN*``, ``*KEY*``...) are masked in
    every output."""
    settle_seconds: float = 2.0
    """After a launch, how long the new process must stay alive to count as started."""
    stop_grace_seconds: float = 10.0
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
    restart_backoff_seconds: float = 10.0
    """Wait before an automatic restart; doubled for each restart already made in the window."""
    restart_max: int = 3
    """Automatic restarts allowed within ``restart_window_seconds``; one more death gives up
    (alerted, never looped)."""
    restart_window_seconds: float = 3600.0
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
    price_in_per_m: float | None = None
    """USD per million prompt tokens (API endpoints)."""
    price_out_per_m: float | None = None
    """USD per million completion tokens (API endpoints)."""
    gpu_cost_per_hour: float | None = None
    """USD per hour of the GPUs behind a local endpoint."""
    max_tokens: int | None = None
    """max_tokens of the run's requests (used by bench to shape requests like the run's)."""
    temperature: float | None = None
    """Sampling temperature of the run's requests."""
    concurrency: int | None = None
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
    """Key holding text to count with the configured tokenizer."""
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
    value_types: dict[str, str | list[str]] = {}
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
    waste_tokens: int | None = None
    """Alert ``waste`` when a dataset's projected tokens past its budget exceed this."""
    waste_usd: float | None = None
    """Alert ``waste`` when a dataset's projected cost past its budget exceeds this (USD)."""
    stall_multiple: float = 0.0
    """Also call a dataset stalled when its writer is alive and nothing new came for this many
    times its usual interval between records (0: only ``stall_seconds`` of the run)."""
    max_per_minute: int = 10
    """At most this many messages a minute; the rest wait and go out as one digest."""
    digest_over: int = 3
    """More events than this at once are sent as one digest message."""
    delivery_timeout_seconds: float = 20.0
    """Seconds one delivery to one URL may take; past it, it is retried with backoff (the
    watcher never waits for a delivery: each URL has a queue and a worker of its own)."""
    failing_minutes: float = 10.0
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
    refresh_seconds: float = 2.0
    """How often the TUI and ``status --watch`` refresh."""
    scripts: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_SCRIPTS))
    """Script names that identify a run in a process list (matched on an argv element's end)."""
    hosts: list[HostConfig] = []
    runs: list[RunConfig] = []
    datasets: dict[str, DatasetConfig] = {}
    endpoints: list[EndpointConfig] = []
    formats: dict[str, FormatProfile] = {}
    backup_max_bytes: int = 4 << 30
    """Before launching a script no client profile describes onto existing output, runwatch
    copies that output under ``<out>/.runwatch/``; more bytes than this are refused (--force
    launches without a copy)."""
    clients: dict[str, ClientProfile] = {}
    """User client profiles (``runwatch clients`` lists them with the built-in ones)."""

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


# --------------------------------------------------------------------------- loading

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MSGSPEC_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_TYPE_WORDS = {
    "array": "list",
    "object": "table",
    "str": "str",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "null": "nothing",
}


def load_config(
    path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None
) -> Config:
    """Read, expand and validate a config file. Raises ConfigError (exit status 2)."""
    p = Path(path)
    shown = str(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such config file", "pass -c CONFIG or create it") from None
    except OSError as e:
        raise ConfigError(f"{shown}: cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{shown}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{shown}: invalid TOML: {e}") from None
    data = _expand(data, os.environ if env is None else env, shown, "")
    _check_value_type_shapes(data, shown)
    try:
        config = msgspec.convert(data, Config, strict=True)
    except msgspec.ValidationError as e:
        raise ConfigError(_explain(shown, str(e), data)) from None
    config.path = shown
    for cname, client in config.clients.items():
        client.name = cname
    _check_references(config)
    _apply_clients(config, data)
    return config


def untrusted(path: str) -> ConfigError | None:
    """Why the config file at ``path`` cannot be trusted to act (its argv is launched, its
    hosts and runs are stopped), or None: the file (links followed) must belong to the invoking
    user or root and be writable by no one else, and so must the directory holding it, unless
    that directory is sticky (``/tmp``), as OpenSSH's StrictModes asks of ``authorized_keys``."""
    real = os.path.realpath(path)
    me = os.geteuid()
    try:
        st = os.stat(real)
        parent = os.stat(os.path.dirname(real) or ".")
    except OSError:
        return None  # the loader says what is wrong with a missing file
    shown = real if real == os.path.abspath(path) else f"{path} (-> {real})"
    if st.st_uid not in (me, 0):
        return ConfigError(
            f"{shown}: the config belongs to uid {st.st_uid}, not to you (uid {me}) or root: "
            "its command lines would run as you",
            f"read it, then make it yours (cp it to a file of your own, or chown {me} {real})",
        )
    if st.st_mode & 0o022:
        return ConfigError(
            f"{shown}: the config is writable by group or others (mode "
            f"{st.st_mode & 0o7777:04o}): anyone who can write it chooses what runs as you",
            f"read it, then chmod go-w {real}",
        )
    where = os.path.dirname(real) or "."
    if parent.st_uid not in (me, 0) and not parent.st_mode & 0o1000:
        return ConfigError(
            f"{shown}: its directory {where} belongs to uid {parent.st_uid}: its owner can "
            "replace the config",
            "move the config into a directory of your own",
        )
    if parent.st_mode & 0o022 and not parent.st_mode & 0o1000:
        return ConfigError(
            f"{shown}: its directory {where} is writable by group or others (mode "
            f"{parent.st_mode & 0o7777:04o}) without the sticky bit: anyone can replace the config",
            f"chmod go-w {where}, or move the config into a directory of your own",
        )
    return None


def _check_value_type_shapes(data: Any, shown: str) -> None:
    """Each ``clients.NAME.value_types`` entry is a string or a list of strings (checked before
    msgspec, whose message cannot name the client and flag of a table of tables)."""
    table = data.get("clients") if isinstance(data, dict) else None
    for name, client in (table or {}).items() if isinstance(table, dict) else ():
        types = client.get("value_types") if isinstance(client, dict) else None
        if not isinstance(types, dict):
            continue
        for flag, vtype in types.items():
            if isinstance(vtype, str) or (
                isinstance(vtype, list) and all(isinstance(c, str) for c in vtype)
            ):
                continue
            raise ConfigError(
                f"{shown}: clients.{name}.value_types.{flag}: expected a type name or a list "
                f"of strings (choices), got {vtype!r}",
                'for example value_types = { "--n" = "int", "--mode" = ["fast", "slow"] }',
            )


def _expand(value: Any, env: typing.Mapping[str, str], shown: str, key: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in env:
                raise ConfigError(f"{shown}: {key}: environment variable {name} is not set")
            return env[name]

        return _ENV_REF.sub(sub, value)
    if isinstance(value, list):
        return [_expand(v, env, shown, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand(v, env, shown, f"{key}.{k}" if key else k) for k, v in value.items()}
    return value


def _explain(shown: str, message: str, data: Any) -> str:
    """Turn a msgspec validation message into ``file: key.path: what was expected``."""
    m = _MSGSPEC_AT.match(message)
    assert m is not None
    msg, raw_path = m.group("msg"), (m.group("path") or "")
    path = raw_path.lstrip(".")
    unknown = re.match(r"Object contains unknown field `(.+)`", msg)
    missing_key = re.match(r"Object missing required field `(.+)`", msg)
    if "[...]" in path:
        path = _name_table(path, data, unknown, missing_key)
    if unknown:
        key = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        fields = _fields_at(path)
        allowed = f" (allowed: {', '.join(fields)})" if fields else ""
        return f"{shown}: {key}: unknown key{allowed}"
    missing = re.match(r"Object missing required field `(.+)`", msg)
    if missing:
        key = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return f"{shown}: {key}: required key is missing"
    wrong = re.match(r"Expected `(.+?)`, got `(.+?)`", msg)
    if wrong:
        expected = _describe(_type_at(path)) or _TYPE_WORDS.get(wrong.group(1), wrong.group(1))
        got = _TYPE_WORDS.get(wrong.group(2), wrong.group(2))
        return f"{shown}: {path or '(top level)'}: expected {expected}, got {got}"
    enum = re.match(r"Invalid enum value (.+)", msg)
    if enum:
        expected = _describe(_type_at(path)) or "another value"
        return f"{shown}: {path}: expected {expected}, got {enum.group(1)}"
    return f"{shown}: {path or '(top level)'}: {msg[:1].lower()}{msg[1:]}"


def _name_table(
    path: str, data: Any, unknown: re.Match[str] | None, missing: re.Match[str] | None
) -> str:
    """``clients[...].x`` -> ``clients.NAME.x``: msgspec does not name the key of a table of
    tables; it is the one whose entry has the unknown key (or lacks the missing one)."""
    head, _, rest = path.partition("[...]")
    table = data.get(head) if isinstance(data, dict) and "." not in head else None
    if not isinstance(table, dict):
        return path
    parts = [p for p in rest.split(".") if p]
    for name, entry in table.items():
        node: Any = entry
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if (unknown and unknown.group(1) in node) or (missing and missing.group(1) not in node):
            return f"{head}.{name}{rest}"
    return path


_SEGMENT = re.compile(r"\.?([^.\[]+)|\[(\d+)\]")


def _type_at(path: str) -> Any:
    """The declared type at a msgspec error path like ``runs[0].argv`` (None if unknown)."""
    t: Any = Config
    for name, index in _SEGMENT.findall(path):
        t = _strip_optional(t)
        origin = typing.get_origin(t)
        if index:
            if origin is not list:
                return None
            t = typing.get_args(t)[0]
        elif isinstance(t, type) and issubclass(t, msgspec.Struct):
            hints = typing.get_type_hints(t)
            if name not in hints:
                return None
            t = hints[name]
        elif origin is dict:
            t = typing.get_args(t)[1]
        else:
            return None
    return t


def _fields_at(path: str) -> list[str]:
    t = _strip_optional(_type_at(path))
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return [f for f in t.__struct_fields__ if f != "path"]
    return []


def _strip_optional(t: Any) -> Any:
    if typing.get_origin(t) in (Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return t


def _describe(t: Any) -> str | None:
    if t is None:
        return None
    t = _strip_optional(t)
    origin = typing.get_origin(t)
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    if t in names:
        return names[t]
    if origin is list:
        inner = _describe(typing.get_args(t)[0])
        if inner and inner.startswith(("a ", "an ")):
            plural = inner.split(" ", 1)[1] + "s"
            return f"a list of {plural}"
        return "a list"
    if origin is dict:
        return "a table"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(t))
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return "a table"
    return None


def _check_references(config: Config) -> None:
    shown = config.path
    named: dict[str, list[str]] = {
        "hosts": [h.name for h in config.hosts],
        "runs": [r.name for r in config.runs],
        "endpoints": [e.name for e in config.endpoints],
    }
    for section, names in named.items():
        seen: set[str] = set()
        for i, name in enumerate(names):
            if name in seen:
                raise ConfigError(f"{shown}: {section}[{i}].name: duplicate name {name!r}")
            seen.add(name)
    hosts = {h.name for h in config.hosts}
    endpoints = {e.name for e in config.endpoints}
    from supervisor.agent.formats import BUILTIN_FORMATS  # here: formats is bundled into the agent

    formats = set(BUILTIN_FORMATS) | set(config.formats)
    for i, h in enumerate(config.hosts):
        if not h.local and not (h.address or h.name):
            raise ConfigError(f"{shown}: hosts[{i}].address: required for an SSH host")
        if h.port is not None and not 0 < h.port < 65536:
            raise ConfigError(f"{shown}: hosts[{i}].port: expected 1..65535, got {h.port}")
    for i, r in enumerate(config.runs):
        if r.host not in hosts:
            raise ConfigError(
                f"{shown}: runs[{i}].host: no host named {r.host!r}",
                f"hosts defined: {', '.join(sorted(hosts)) or 'none'}",
            )
        if r.endpoint is not None and r.endpoint not in endpoints:
            raise ConfigError(
                f"{shown}: runs[{i}].endpoint: no endpoint named {r.endpoint!r}",
                f"endpoints defined: {', '.join(sorted(endpoints)) or 'none'}",
            )
        if not r.argv:
            raise ConfigError(f"{shown}: runs[{i}].argv: expected a non-empty list of strings")
        if not (r.workdir.startswith(("/", "~")) and "\0" not in r.workdir):
            # The client's relative paths, and a literal ``~`` in its argv, are read from the
            # workdir: a relative one would be relative to wherever runwatch or its agent runs.
            raise ConfigError(
                f"{shown}: runs[{i}].workdir: expected an absolute path or ~/..., "
                f"got {r.workdir!r}",
                "write the directory the command runs in on its host, e.g. /data/run or ~/run",
            )
        if r.format not in formats:
            raise ConfigError(
                f"{shown}: runs[{i}].format: unknown format {r.format!r}",
                f"known: {', '.join(sorted(formats))}",
            )
        _check_slurm(config, i, r)
        for j, d in enumerate(r.datasets):
            why = bad_name(d)
            if why is not None:
                raise ConfigError(
                    f"{shown}: runs[{i}].datasets[{j}]: not a dataset name: {why} "
                    "(it would escape the output dir)"
                )
        why = bad_name(r.data_file)
        if why is not None:
            raise ConfigError(
                f"{shown}: runs[{i}].data_file: not a file name: {why} "
                "(it would escape the dataset directory)"
            )
        if r.restart_max < 0 or r.restart_backoff_seconds < 0 or r.restart_window_seconds <= 0:
            raise ConfigError(
                f"{shown}: runs[{i}]: restart_max and restart_backoff_seconds must be >= 0 and "
                "restart_window_seconds > 0"
            )
    for name, ds in config.datasets.items():
        why = bad_name(name)
        if why is not None:
            raise ConfigError(
                f"{shown}: datasets.{name}: not a dataset name: {why} "
                "(it would escape the output dir)"
            )
        for key in ("token_budget", "max_samples"):
            v = getattr(ds, key)
            if v is not None and v <= 0:
                raise ConfigError(f"{shown}: datasets.{name}.{key}: expected a positive integer")
    for i, e in enumerate(config.endpoints):
        if e.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", e.api_key_env):
            raise ConfigError(
                f"{shown}: endpoints[{i}].api_key_env: "
                "expected the NAME of an environment variable",
                "put the key in the environment, never in the config",
            )
    _check_clients(config, formats)

    _check_numbers(config)
    for name, prof in config.formats.items():
        sources = [prof.tokens_field, prof.tokens_list_field, prof.text_field]
        if sum(s is not None for s in sources) != 1:
            raise ConfigError(
                f"{shown}: formats.{name}: set exactly one of tokens_field, tokens_list_field, "
                "text_field"
            )


def _check_clients(config: Config, formats: set[str]) -> None:
    """Client profiles name known formats and real flags; runs name known clients."""
    # here: clients reads this module's types
    from supervisor.clients import BUILTIN_CLIENTS, path_defaults_problems, value_types_problems

    shown = config.path
    for name, c in config.clients.items():
        key = f"clients.{name}"
        if not c.scripts or not all(c.scripts):
            raise ConfigError(f"{shown}: {key}.scripts: expected a non-empty list of script names")
        if c.format not in formats:
            raise ConfigError(
                f"{shown}: {key}.format: unknown format {c.format!r}",
                f"known: {', '.join(sorted(formats))}",
            )
        named = [f for field in c.flags.__struct_fields__ for f in getattr(c.flags, field)]
        for flag in [*named, *c.volatile, *c.known_flags, *c.switches]:
            if not flag.startswith("-") or "=" in flag or " " in flag:
                raise ConfigError(
                    f"{shown}: {key}: {flag!r} is not a flag name",
                    "flags are spelled as on the command line, e.g. --output-file-path",
                )
        if bool(c.flags.output_file) == bool(c.flags.output_dir or c.flags.datasets):
            raise ConfigError(
                f"{shown}: {key}.flags: name either output_file (one output file) or "
                "output_dir/datasets (a file per dataset)"
            )
        wrong_types = value_types_problems(c)
        if wrong_types:
            problem, hint = wrong_types[0]
            raise ConfigError(f"{shown}: {key}.value_types{problem}", hint)
        wrong_defaults = path_defaults_problems(c)
        if wrong_defaults:
            problem, hint = wrong_defaults[0]
            raise ConfigError(f"{shown}: {key}.path_defaults{problem}", hint)
        if c.resume == "flag" and not c.flags.resume:
            raise ConfigError(f"{shown}: {key}.flags.resume: required when resume = 'flag'")
        if "{}" not in c.endpoint_template:
            raise ConfigError(f"{shown}: {key}.endpoint_template: must contain {{}}")
        for kind, pattern in c.sidecars.items():
            if "{stem}" not in pattern or "/" in pattern:
                raise ConfigError(
                    f"{shown}: {key}.sidecars.{kind}: expected a file name with {{stem}}, "
                    f"got {pattern!r}"
                )
    known = set(BUILTIN_CLIENTS) | set(config.clients)
    for i, r in enumerate(config.runs):
        if r.client is not None and r.client not in known:
            raise ConfigError(
                f"{shown}: runs[{i}].client: unknown client {r.client!r}",
                f"known: {', '.join(sorted(known))} (see runwatch clients)",
            )


def _apply_clients(config: Config, data: Any) -> None:
    """A run without its own ``format`` / ``data_file`` keys takes its client profile's."""
    from supervisor.clients import client_of

    raw_runs = data.get("runs") if isinstance(data, dict) else None
    for i, r in enumerate(config.runs):
        given = raw_runs[i] if isinstance(raw_runs, list) and i < len(raw_runs) else {}
        profile = client_of(config, r)
        if "format" not in given:
            r.format = profile.format
        if "data_file" not in given:
            r.data_file = profile.data_file


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(?i:unlimited|infinite)$")


def _check_slurm(config: Config, i: int, run: RunConfig) -> None:
    shown = config.path
    kind = config.host(run.host).kind
    if run.slurm is not None and kind != "slurm":
        raise ConfigError(
            f"{shown}: runs[{i}].slurm: host {run.host!r} is not a Slurm host",
            'set kind = "slurm" on the host, or remove the [runs.slurm] table',
        )
    sl = run.slurm
    if sl is None:
        return
    for key in ("partition", "gres", "gpus", "job_name", "output"):
        value = getattr(sl, key)
        if value is not None and (not value or any(c in value for c in "\n\r\0")):
            raise ConfigError(f"{shown}: runs[{i}].slurm.{key}: expected one non-empty line")
    if sl.time is not None and not _SLURM_TIME.match(sl.time):
        raise ConfigError(
            f"{shown}: runs[{i}].slurm.time: not a Slurm time limit: {sl.time!r}",
            "use minutes, HH:MM:SS or D-HH:MM:SS",
        )
    for key in ("nodes", "cpus_per_task", "array_max_running"):
        value = getattr(sl, key)
        if value is not None and value <= 0:
            raise ConfigError(f"{shown}: runs[{i}].slurm.{key}: expected a positive integer")
    for j, line in enumerate(sl.extra):
        if not line.startswith("-") or any(c in line for c in "\n\r\0"):
            raise ConfigError(
                f"{shown}: runs[{i}].slurm.extra[{j}]: expected one sbatch option line "
                f"starting with '-', got {line!r}"
            )
    if sl.array and len(config.run_datasets(run)) < 1:
        raise ConfigError(
            f"{shown}: runs[{i}].slurm.array: the run names no datasets",
            "list them in datasets = [...] or --datasets in argv",
        )


_POSITIVE = "a number > 0"
_NON_NEGATIVE = "a number >= 0"
_NUMBER_RULES: dict[str, dict[str, str]] = {
    "": {"refresh_seconds": _POSITIVE},
    "hosts": {
        "connect_timeout": _POSITIVE,
        "command_timeout": _POSITIVE,
        "keepalive_interval": _POSITIVE,
        "keepalive_count_max": _POSITIVE,
    },
    "runs": {
        "stall_seconds": _POSITIVE,
        "settle_seconds": _POSITIVE,
        "stop_grace_seconds": _NON_NEGATIVE,
    },
    "endpoints": {
        "price_in_per_m": _NON_NEGATIVE,
        "price_out_per_m": _NON_NEGATIVE,
        "gpu_cost_per_hour": _NON_NEGATIVE,
        "max_tokens": _POSITIVE,
        "temperature": _NON_NEGATIVE,
        "concurrency": _POSITIVE,
    },
    "alerts": {"delivery_timeout_seconds": _POSITIVE, "failing_minutes": _POSITIVE},
}
"""Bounds of the numeric keys, by section (timeouts, graces and intervals are never negative;
an interval or timeout of 0 would spin or never wait)."""


def _check_numbers(config: Config) -> None:
    """Every number is finite (TOML allows nan and inf) and within its key's bounds."""
    sections: list[tuple[str, str, Any]] = [("", "", config)]
    sections += [("hosts", f"hosts[{i}].", h) for i, h in enumerate(config.hosts)]
    sections += [("runs", f"runs[{i}].", r) for i, r in enumerate(config.runs)]
    sections += [("endpoints", f"endpoints[{i}].", e) for i, e in enumerate(config.endpoints)]
    sections += [("alerts", "alerts.", config.alerts)]
    for section, prefix, struct in sections:
        rules = _NUMBER_RULES[section]
        for key in struct.__struct_fields__:
            value = getattr(struct, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            rule = rules.get(key)
            bad = value != value or value in (float("inf"), float("-inf"))
            if rule == _POSITIVE:
                bad = bad or value <= 0
            elif rule == _NON_NEGATIVE:
                bad = bad or value < 0
            if bad:
                raise ConfigError(
                    f"{config.path}: {prefix}{key}: expected {rule or 'a finite number'}, "
                    f"got {value}"
                )
