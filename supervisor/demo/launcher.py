"""``runwatch demo``: two mock servers, three runs, and something to watch.

It starts a slow, capacity-limited, free mock "local GPU" server and a fast, priced mock "API"
server (each ``python -m supervisor.demo.server`` on a free port), writes the demo prompts, seeds
dataset B1 as finished, B2 just under its token budget and B3 with a few lines in the older (legacy)
text format, then launches the three runs of its config ``demo.toml`` (beside this module, shipped
in the wheel; ``configs/demo.toml`` links to it) exactly as configured: the local
one with ``--max-samples`` and no ``--token-budget`` (so B2 goes over its budget within the first
minute and keeps going), the API one with ``--token-budget``, and a SpecForge-style
``regenerate_train_data.py`` (the stand-in, copied in under its real name) writing ONE output file
``out/regen.jsonl`` with reasoning, its error and skipped files beside it.

With ``slurm`` (``runwatch demo --slurm``) this machine is a Slurm login node: the host gets
``kind = "slurm"`` and the runs are submitted as Slurm jobs (``sbatch``, tagged
``runwatch:<run>``), then cancelled with ``scancel`` at the end, their end confirmed.

Then it opens the dashboard on the demo's config when one is registered; headless (or without one)
it prints, every second, what it started and the files being written, as absolute paths with their
line counts. When it ends (time is up, Ctrl-C, SIGTERM, an error) it stops every process it started
- their whole process groups, exit confirmed - so no process and no port is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from types import FrameType
from typing import IO, Any

from supervisor.agent import safefs
from supervisor.config import Config, load_config
from supervisor.errors import RunwatchError


def _shipped(name: str) -> Path:
    """A file of this package, found by ``importlib.resources``: the wheel carries it, so the demo
    works installed as a tool (pipx, uv tool) as from a checkout. The demo starts these files as
    scripts, so the package is a directory on disk."""
    return Path(str(files("supervisor.demo").joinpath(name))).resolve()


TEMPLATE = _shipped("demo.toml")
"""The demo's config, with ``${RUNWATCH_DEMO_*}`` variables; ``configs/demo.toml`` links here."""
CLIENT = _shipped("run_inference.py")
SPECFORGE = _shipped("specforge_regenerate.py")
"""The SpecForge stand-in, copied into the demo dir as ``scripts/regenerate_train_data.py``."""
SPECFORGE_SCRIPT = Path("scripts") / "regenerate_train_data.py"
REGEN_INPUT = Path("sharegpt") / "regen-input.jsonl"
REGEN_PROMPTS = 400
API_KEY_ENV = "RUNWATCH_DEMO_API_KEY"
API_KEY_FILE = "api-key"
"""Where a key the demo made up is kept (mode 0600), so that another terminal can use the mock API
(``runwatch bench api``) without the key ever being printed."""

# Mock speeds: the local GPU is saturated (16 requests share 250 tokens/s); the API is fast.
LOCAL_MOCK = {"decode_tps": 40, "capacity_tps": 250, "mean_tokens": 600, "seed": 1}
API_MOCK = {
    "decode_tps": 300,
    "capacity_tps": 0,
    "mean_tokens": 600,
    "seed": 2,
    "error_429": 0.03,
    "error_500": 0.01,
    "retry_after": 1,
}
PROMPTS_PER_DATASET = 1000
B2_SEED_MARGIN = 1500
"""B2 is seeded this many completion tokens under its budget, so it passes it within a minute."""
LEGACY_SEED_LINES = 5
STOP_GRACE = 5.0


class _Stop(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM/SIGHUP so that clean-up runs.

    A KeyboardInterrupt, because event loops (asyncio, the TUI's) let only that and SystemExit out
    of their callbacks: any other exception raised there would be logged and swallowed.
    """


@dataclass
class Started:
    """A process the demo started: what to show and how to stop it."""

    label: str
    proc: subprocess.Popen[bytes]
    argv: list[str]
    log: Path
    url: str | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)


def _die_with_parent_hook() -> Any:
    """A pre-exec hook asking Linux to SIGTERM the child when the demo itself dies outright.

    libc is loaded here, in the parent: the hook runs between fork and exec, where importing or
    loading anything could deadlock.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return hook


def _spawn(
    label: str,
    argv: list[str],
    cwd: Path,
    log: Path,
    env: Mapping[str, str] | None = None,
    stdout_pipe: bool = False,
) -> Started:
    """Start ``argv`` detached-ish: its own session, stdin /dev/null, output appended to ``log``."""
    try:
        safefs.make_dirs(str(log.parent))
        fd = safefs.open_private(str(log), os.O_WRONLY | os.O_APPEND)
    except safefs.UnsafePath as e:
        raise RunwatchError(f"cannot start {label}: {e.path}: {e.why}", e.fix) from None
    log_file = os.fdopen(fd, "ab")  # owned by the Started record, closed on stop
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else log_file,
            stderr=log_file,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent_hook(),
        )
    except OSError as e:
        log_file.close()
        raise RunwatchError(f"cannot start {label}: {argv[0]}: {e.strerror}") from None
    return Started(label, proc, argv, log, _log_file=log_file)


def _read_url(started: Started, timeout: float = 30.0) -> str:
    """The first stdout line of a mock server: its URL, printed once it listens."""
    assert started.proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(started.proc.stdout, selectors.EVENT_READ)
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(started.proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    finally:
        sel.close()
    line = buf.split(b"\n", 1)[0].decode(errors="replace").strip()
    if not line.startswith("http"):
        raise RunwatchError(
            f"{started.label} did not start (no URL within {timeout:.0f} s)",
            f"see its log: {started.log}",
        )
    return line


def _stop_all(started: list[Started]) -> list[str]:
    """Stop each process group (TERM, then KILL after a grace period) and confirm every exit."""
    problems: list[str] = []
    for s in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for s in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(max(0.0, deadline - time.monotonic()))
    for s in started:
        # KILL the whole group even when the leader is gone: a child of it may still run.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.proc.pid, signal.SIGKILL)
        try:
            s.proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            problems.append(f"{s.label} (pid {s.proc.pid}) did not exit")
        if s.proc.stdout is not None:
            s.proc.stdout.close()
        if s._log_file is not None:
            s._log_file.close()
    return problems


def _stop_strays(cfg: Config, mine: set[int]) -> tuple[int, list[str]]:
    """Stop reference clients a restart from the TUI launched for the demo (not our children)."""
    import psutil

    workdirs = {os.path.realpath(r.workdir) for r in cfg.runs}
    scripts = {str(CLIENT), str(SPECFORGE_SCRIPT)}
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd", "uids"]):
        try:
            argv = p.info["cmdline"] or []
            mine_or_other = p.pid in mine or p.info["uids"].real != os.getuid()
            if mine_or_other or not scripts.intersection(argv):
                continue
            if p.info["cwd"] and os.path.realpath(p.info["cwd"]) in workdirs:
                found.append(p)
        except (psutil.Error, TypeError, AttributeError):
            continue
    for p in found:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    alive = _wait_exited(found, STOP_GRACE)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    alive = _wait_exited(alive, STOP_GRACE)
    return len(found), [f"pid {p.pid} did not exit" for p in alive]


def _wait_exited(procs: list[Any], timeout: float) -> list[Any]:
    """Wait until every process has exited (or is a zombie: dead, its parent reaps it)."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _exited(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)  # polling processes that are not our children: no wait() for them
        alive = [p for p in alive if not _exited(p)]
    return alive


def _exited(p: Any) -> bool:
    """Dead, or a zombie waiting for a parent that is not us to reap it."""
    import psutil

    try:
        return bool(p.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


# --------------------------------------------------------------------------- config


_ENV_REF = re.compile(r"\$\{(RUNWATCH_DEMO_[A-Z_]+)\}")


def demo_env(demo_dir: Path, tokenizer: Path, local_url: str, api_url: str) -> dict[str, str]:
    """The ``${RUNWATCH_DEMO_*}`` values that the demo's config (``TEMPLATE``) refers to."""
    return {
        "RUNWATCH_DEMO_DIR": str(demo_dir),
        "RUNWATCH_DEMO_LOCAL_URL": local_url,
        "RUNWATCH_DEMO_API_URL": api_url,
        "RUNWATCH_DEMO_LOCAL_ADDRESS": _address(local_url),
        "RUNWATCH_DEMO_PYTHON": sys.executable,
        "RUNWATCH_DEMO_CLIENT": str(CLIENT),
        "RUNWATCH_DEMO_TOKENIZER": str(tokenizer),
    }


def _address(url: str) -> str:
    """``http://127.0.0.1:4321/v1`` -> ``127.0.0.1:4321`` (SpecForge's ``--server-address``)."""
    from urllib.parse import urlsplit

    return urlsplit(url).netloc


def _template() -> str:
    try:
        return TEMPLATE.read_text(encoding="utf-8")
    except OSError as e:
        raise RunwatchError(
            f"the demo's config {TEMPLATE} cannot be read: {e.strerror}",
            "reinstall runwatch (pipx reinstall runwatch), or run the demo from a checkout "
            "(make demo)",
        ) from None


def write_resolved_config(env: Mapping[str, str], path: Path, slurm: bool = False) -> Config:
    """Write ``TEMPLATE`` with ``${RUNWATCH_DEMO_*}`` filled in to ``path``; load it.

    With ``slurm``, the host is a Slurm login node (``kind = "slurm"``): its runs are jobs."""

    def sub(m: re.Match[str]) -> str:
        # Inside TOML basic strings: JSON's escaping of quotes, backslashes and controls is valid.
        return json.dumps(env[m.group(1)])[1:-1]

    header = f"# Written by `runwatch demo` from {TEMPLATE}, with its variables filled in.\n"
    text = header + _ENV_REF.sub(sub, _template())
    if slurm:
        text = text.replace("\nlocal = true\n", '\nlocal = true\nkind = "slurm"\n', 1)
    path.write_text(text, encoding="utf-8")
    return load_config(path)


# --------------------------------------------------------------------------- seed data


def _seed(cfg: Config, demo_dir: Path, vocab: Any) -> list[str]:
    """Seed B1 (finished), B2 (just under its budget) and B3 (legacy lines); skip existing files."""
    from supervisor.demo.prompts import prompt_records

    notes = []
    out = demo_dir / "out"
    rng = random.Random(7)
    local = next((r for r in cfg.runs if r.name == "local-gpu"), None)
    max_samples = 400
    if local is not None:
        from supervisor.agent.argflags import value as flag_value

        value = flag_value(local.argv, "--max-samples")
        max_samples = int(value) if value else max_samples

    def length() -> int:
        return max(20, int(rng.lognormvariate(6.2, 0.6)))

    def prompt_tokens(rec: dict[str, Any]) -> int:
        msgs = rec["messages"]
        assert isinstance(msgs, list)
        return int(vocab.count("\n".join(f"{m['role']}: {m['content']}" for m in msgs)))

    def write(name: str, lines: list[dict[str, Any]], note: str) -> None:
        path = out / name / "raw_responses.jsonl"
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".seed.tmp")
        tmp.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
        os.replace(tmp, path)
        notes.append(f"seeded {path}: {note}")

    def current(rec: dict[str, Any]) -> dict[str, Any]:
        n = length()
        ids = vocab.random_ids(rng, n)
        return {
            "sample_id": rec["sample_id"],
            "output_ids": ids,
            "prompt_tokens": prompt_tokens(rec),
            "completion_tokens": n,
            "finish_reason": "stop",
        }

    b1 = [current(r) for r in prompt_records("B1", max_samples)]
    write("B1", b1, f"{len(b1)} lines (finished: --max-samples {max_samples})")
    budget = cfg.datasets["B2"].token_budget if "B2" in cfg.datasets else None
    target = (budget or 50_000) - B2_SEED_MARGIN
    b2: list[dict[str, Any]] = []
    total = 0
    for rec in prompt_records("B2", PROMPTS_PER_DATASET):
        line = current(rec)
        if total + line["completion_tokens"] > target:
            break
        b2.append(line)
        total += line["completion_tokens"]
    write("B2", b2, f"{len(b2)} lines, {total} tokens ({budget} budget)")
    b3 = []
    for rec in prompt_records("B3", LEGACY_SEED_LINES):
        n = length()
        b3.append(
            {
                "sample_id": rec["sample_id"],
                "text": vocab.decode(vocab.random_ids(rng, n)),
                "prompt_tokens": prompt_tokens(rec),
                "completion_tokens": n,
                "finish_reason": "stop",
            }
        )
    write("B3", b3, f"{len(b3)} lines in the legacy text format")
    return notes


# --------------------------------------------------------------------------- watching


class _LineCounter:
    """Counts the lines of a growing file by reading only what was appended since last time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0
        self.ino: int | None = None

    def count(self) -> int | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        if st.st_ino != self.ino or st.st_size < self.offset:
            self.ino, self.offset, self.lines = st.st_ino, 0, 0
        if st.st_size > self.offset:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    self.lines += chunk.count(b"\n")
                    self.offset += len(chunk)
        return self.lines


@dataclass
class Demo:
    """A running demo: its directory, config, and the processes it started."""

    demo_dir: Path
    config_path: Path
    config: Config
    started: list[Started]
    notes: list[str]
    counters: dict[str, _LineCounter] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Run name -> identity of the Slurm job submitted for it (``--slurm``)."""

    def files(self) -> list[Path]:
        from supervisor.clients import single_file
        from supervisor.layout import layout_of

        paths: list[Path] = []
        for run in self.config.runs:
            layout = layout_of(self.config, run)
            paths.extend(Path(p) for p in layout.data_files.values())
            if run.log and not single_file(layout.profile):
                paths.append(Path(layout.log))
        return paths

    def report(self, elapsed: float) -> str:
        lines = [f"[{elapsed:6.1f} s] runwatch demo in {self.demo_dir}"]
        for s in self.started:
            code = s.proc.poll()
            state = "running" if code is None else f"exited ({code})"
            where = f" {s.url}" if s.url else ""
            lines.append(f"  {s.label:<16} pid {s.proc.pid:<7} {state}{where}  log {s.log}")
        if self.jobs:
            from supervisor.agent.slurm import slurm_jobs

            listed = {j["job_id"]: j for j in slurm_jobs({"all_states": True})["jobs"]}
            for run, ident in self.jobs.items():
                job = listed.get(ident["job_id"]) or {}
                lines.append(
                    f"  {'run ' + run:<16} Slurm job {ident['job_id']:<7} "
                    f"{job.get('state') or 'gone'} {job.get('nodes') or ''}".rstrip()
                )
        for path in self.files():
            counter = self.counters.setdefault(str(path), _LineCounter(path))
            n = counter.count()
            lines.append(f"  {'-' if n is None else n:>7} lines  {path}")
        return "\n".join(lines)


def _write_key_file(path: Path, key: str) -> Path:
    """``key`` in ``path``, readable by this user only (created so, never world-readable)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return path


def new_demo(demo_dir: Path) -> Demo:
    """A demo in ``demo_dir`` that has started nothing yet."""
    return Demo(demo_dir, demo_dir / "runwatch.toml", Config(), [], [])


def start_demo(demo: Demo, out: IO[str], slurm: bool = False) -> None:
    """Start the mocks and the runs, recording each process in ``demo.started`` (each Slurm job
    in ``demo.jobs``) as it starts, so that ``stop_demo`` stops them even when a later step
    fails."""
    if slurm:
        _check_slurm()
    from supervisor.demo.prompts import DATASETS, write_prompts, write_sharegpt
    from supervisor.demo.tokenizer import DemoVocab, ensure_demo_tokenizer

    demo_dir = demo.demo_dir
    started = demo.started
    tokenizer = ensure_demo_tokenizer()
    vocab = DemoVocab(tokenizer)
    write_prompts(demo_dir / "prompts", DATASETS, PROMPTS_PER_DATASET)
    write_sharegpt(demo_dir / REGEN_INPUT, "regen", REGEN_PROMPTS)
    (demo_dir / SPECFORGE_SCRIPT).parent.mkdir(parents=True, exist_ok=True)
    (demo_dir / SPECFORGE_SCRIPT).write_bytes(SPECFORGE.read_bytes())
    (demo_dir / "out").mkdir(exist_ok=True)
    key_file = None
    if not os.environ.get(API_KEY_ENV):
        os.environ[API_KEY_ENV] = "demo-" + secrets.token_hex(12)
        key_file = _write_key_file(demo_dir / API_KEY_FILE, os.environ[API_KEY_ENV])

    # The endpoints' models and prices come from the config, read once with placeholder URLs.
    provisional = load_config(
        TEMPLATE,
        env=demo_env(demo_dir, tokenizer, "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"),
    )
    local_ep = provisional.endpoint("local-gpu")
    api_ep = provisional.endpoint("api")
    logs = demo_dir / "logs"
    server = [sys.executable, "-m", "supervisor.demo.server", "--port", "0"]
    server += ["--tokenizer", str(tokenizer)]

    def knobs(values: Mapping[str, float]) -> list[str]:
        return [a for k, v in values.items() for a in (f"--{k.replace('_', '-')}", f"{v:g}")]

    def mock_argv(model: str | None, values: Mapping[str, float]) -> list[str]:
        return [*server, "--model", model or "demo-model", *knobs(values)]

    local_argv = mock_argv(local_ep.model, LOCAL_MOCK)
    api_values = dict(API_MOCK)
    if api_ep.price_in_per_m is not None:
        api_values["price_in"] = api_ep.price_in_per_m
    if api_ep.price_out_per_m is not None:
        api_values["price_out"] = api_ep.price_out_per_m
    api_argv = [*mock_argv(api_ep.model, api_values), "--api-key-env", API_KEY_ENV]
    # The servers run from the demo directory: make sure they import this very package.
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    server_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, path]))}
    for label, argv in (("mock local GPU", local_argv), ("mock API", api_argv)):
        log = logs / f"{label.replace(' ', '-').lower()}.log"
        s = _spawn(label, argv, demo_dir, log, env=server_env, stdout_pipe=True)
        started.append(s)
        s.url = _read_url(s)

    env = demo_env(demo_dir, tokenizer, started[0].url or "", started[1].url or "")
    os.environ.update(env)
    demo.config = write_resolved_config(env, demo.config_path, slurm=slurm)
    demo.notes.extend(_seed(demo.config, demo_dir, vocab))
    for run in demo.config.runs if slurm else []:
        demo.jobs[run.name] = _submit(demo.config, run)
    for run in demo.config.runs if not slurm else []:
        workdir = Path(run.workdir)
        log = workdir / (run.log or f"logs/{run.name}.log")
        run_env = {**os.environ, **run.env}
        started.append(_spawn(f"run {run.name}", list(run.argv), workdir, log, env=run_env))
    print(f"runwatch demo: {demo_dir}", file=out)
    print(f"  config   {demo.config_path}", file=out)
    print(f"  watch it from another terminal: runwatch -c {demo.config_path} status", file=out)
    if key_file is not None:
        print(
            f"  the mock API's key, for `runwatch bench api` there: "
            f"export {API_KEY_ENV}=$(cat {key_file})",
            file=out,
        )
    print(f"  tokenizer {tokenizer}", file=out)
    for note in demo.notes:
        print(f"  {note}", file=out)
    for s in started:
        print(f"  started {s.label}: pid {s.proc.pid}: {' '.join(s.argv)}", file=out)
    for run_name, ident in demo.jobs.items():
        print(f"  submitted run {run_name}: Slurm job {ident['job_id']} ({ident['tag']})", file=out)
    out.flush()


def _check_slurm() -> None:
    """Refuse ``--slurm`` where no Slurm cluster answers (before anything is started)."""
    import shutil

    missing = [c for c in ("sbatch", "squeue", "scancel", "scontrol") if not shutil.which(c)]
    if missing:
        raise RunwatchError(
            f"runwatch demo --slurm: {', '.join(missing)} not found: Slurm is not installed",
            "install slurm-wlm (and a running cluster), or run the demo without --slurm",
        )
    try:
        done = subprocess.run(
            ["sinfo", "--noheader", "-o", "%T"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RunwatchError(f"runwatch demo --slurm: sinfo failed: {e}") from None
    if done.returncode != 0:
        raise RunwatchError(
            f"runwatch demo --slurm: no Slurm cluster answers: {done.stderr.strip()[-300:]}",
            "start slurmctld and slurmd (or set SLURM_CONF), or run the demo without --slurm",
        )


def _submit(cfg: Config, run: Any) -> dict[str, Any]:
    """Submit a demo run as a Slurm job (exactly as ``runwatch launch`` would) and return its
    identity; the API key reaches the job through sbatch's environment, never a file."""
    from supervisor.agent.slurm import slurm_submit, split_tag
    from supervisor.layout import layout_of
    from supervisor.slurm import record_job, submit_params

    params = submit_params(cfg, run, list(run.argv), dict(run.env), layout_of(cfg, run).paths)
    reply = slurm_submit(params)
    if not reply.get("submitted"):
        raise RunwatchError(f"runwatch demo --slurm: {run.name}: {reply.get('detail')}")
    job = reply.get("job") or {}
    # The dashboard shows (and kills) only the jobs runwatch recorded as a run's.
    record_job(cfg, run.name, run.host, reply["job_id"], job.get("submit_time"), "submitted",
               split_tag(params["tag"])[1])  # fmt: skip
    return {"job_id": reply["job_id"], "submit_time": job.get("submit_time"), "tag": params["tag"]}


def _cancel_jobs(demo: Demo) -> list[str]:
    """scancel every job the demo submitted; the problems (a job whose end is not confirmed)."""
    from supervisor.agent.slurm import slurm_cancel

    problems = []
    for run, ident in demo.jobs.items():
        try:
            out = slurm_cancel({"identity": ident, "grace": STOP_GRACE})
        except Exception as e:  # one job that cannot be cancelled must not stop the clean-up
            problems.append(f"Slurm job {ident['job_id']} of run {run}: {e}")
            continue
        if not out.get("confirmed"):
            problems.append(f"Slurm job {ident['job_id']} of run {run}: {out.get('detail')}")
    return problems


def stop_demo(demo: Demo, out: IO[str]) -> bool:
    """Stop everything the demo started; True when every process is confirmed gone."""
    # Relaunched runs first, while the mock servers they talk to are still up: a client that
    # loses its server may exit on its own a moment later, and would then go uncounted.
    problems: list[str] = _cancel_jobs(demo)
    relaunched = 0
    if demo.config.runs:
        relaunched, problems = _stop_strays(demo.config, {s.proc.pid for s in demo.started})
    problems += _stop_all(demo.started)
    for p in problems:
        print(f"runwatch demo: could not stop {p}", file=out)
    if demo.jobs:
        print(f"runwatch demo: cancelled {len(demo.jobs)} Slurm jobs", file=out)
    if demo.started:
        runs = "run" if relaunched == 1 else "runs"
        extra = f" and {relaunched} relaunched {runs}" if relaunched else ""
        print(
            f"runwatch demo: stopped {len(demo.started)} processes{extra}; "
            f"data kept in {demo.demo_dir}",
            file=out,
        )
    out.flush()
    return not problems


@contextlib.contextmanager
def _signals_stop() -> Iterator[list[str]]:
    """SIGTERM and SIGHUP end the demo through the normal clean-up path.

    Yields a list that receives the signal's name, so that whatever exception the interrupted code
    turns ``_Stop`` into (an event loop being torn down mid-step, say) is known to be a stop.
    """
    received: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        raise _Stop(received[-1])

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
            previous[sig] = signal.signal(sig, handler)
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _watch(demo: Demo, seconds: float | None, out: IO[str]) -> None:
    start = time.monotonic()
    tick = 0
    while True:
        elapsed = time.monotonic() - start
        print(demo.report(elapsed), file=out, flush=True)
        if seconds is not None and elapsed >= seconds:
            return
        tick += 1
        next_at = start + tick
        if seconds is not None:
            next_at = min(next_at, start + seconds)
        # Waiting for the next report is the point here (a fixed refresh period), not a sync.
        time.sleep(max(0.0, next_at - time.monotonic()))


def run_demo(
    headless: bool,
    seconds: float | None,
    demo_dir: str | None,
    open_ui: Callable[[str], None] | None = None,
    slurm: bool = False,
) -> None:
    """Run the demo until ``seconds`` pass (None: until Ctrl-C / the UI quits); then clean up.

    ``open_ui`` opens the dashboard on a config path (the console script registers it); without
    it, or with ``headless``, the demo prints what it runs every second instead. ``slurm``: the
    runs are Slurm jobs of this machine's cluster.
    """
    out = sys.stdout
    if demo_dir:
        directory = Path(demo_dir).expanduser().resolve()
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="runwatch-demo-")).resolve()
    demo = new_demo(directory)
    ok = True
    with _signals_stop() as received:
        try:
            start_demo(demo, out, slurm=slurm)
            if not headless and open_ui is not None:
                open_ui(str(demo.config_path))
            else:
                if not headless:
                    print("runwatch demo: no dashboard here; printing instead", file=out)
                _watch(demo, seconds, out)
        except BaseException as e:
            if not (received or isinstance(e, KeyboardInterrupt)):
                raise
            why = received[0] if received else "Ctrl-C"
            print(f"runwatch demo: stopping ({why})", file=out)
        finally:
            # Clean-up runs to the end: a second Ctrl-C or SIGTERM must not cut it short.
            old = {
                sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                ok = stop_demo(demo, out)
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
    if not ok:
        raise RunwatchError("runwatch demo: some processes could not be stopped", "see above")
