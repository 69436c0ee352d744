"""Host-side process listing: which processes are runs, who they are, and what they were told.

Standard library only and Python >= 3.8: this module travels to the host inside the agent bundle
(see ``supervisor.hosts.bundle_payload``). It reads ``/proc`` on Linux; where ``/proc`` is absent
it uses psutil when the host has it. On Linux ``/proc`` is read even when psutil is installed: a
process identity is defined in ``/proc`` terms (start time in clock ticks since boot, boot id) and
psutil only exposes the start time as a float of wall-clock seconds, which cannot be compared
exactly.

What is a run. A process is a run when it *executes* a configured script:

* ``argv[0]``'s basename is a Python interpreter (``python``, ``python3.11``, ``pypy3``...) and
  the first argument after the interpreter's own options is a path whose basename equals the
  script name (``python -u /data/run_inference.py --datasets B1``); ``-c`` and ``-m`` end the
  search (``python -c "...run_inference.py..."`` runs a string, not the script); or
* ``argv[0]``'s basename equals the script name (a script executed directly).

So ``grep run_inference.py``, ``tail -f run_inference.py.log``, ``vim run_inference.py``, ``bash -c
'python run_inference.py; ...'`` (the shell itself; its child python *is* a run), and the agent
(``python -c LOADER``) are never runs. A matching process whose ancestor is itself a run (a forked
worker with the same argv) is listed as that run's child, not as a second run. The caller's own
process and its ancestors are never runs.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import shutil
import subprocess
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

try:  # optional on the host
    import psutil  # type: ignore[import-untyped,unused-ignore]

    HAS_PSUTIL = True
except ImportError:  # pragma: no cover - depends on the host
    psutil = None  # type: ignore[assignment,unused-ignore]
    HAS_PSUTIL = False

MASK = "***"
DEFAULT_SCRIPTS = ("run_inference.py", "regenerate_train_data.py", "server_generate.py")
PROC = "/proc"

_INTERPRETER = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[a-z]?(\.exe)?$")
# Interpreter options that take the next argument as their value.
_OPTS_WITH_VALUE = frozenset(("-W", "-X", "--check-hash-based-pycs"))

# --------------------------------------------------------------------------- masking

_SECRET_WORDS = re.compile(r"(key|token|secret|passw(or)?d|credential|auth)", re.I)
# Flag names that contain a secret word but hold counts or paths of public things.
_NOT_SECRET_NAME = re.compile(
    r"(budget|max|min|num|count|limit|tokenizer|tokens$|per_|_per|length|len$|keyword|monkey"
    r"|author(?!iz))",
    re.I,
)
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(sk-[A-Za-z0-9_\-]{12,}|sk_(live|test)_[A-Za-z0-9]{8,}|hf_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{16,}|xox[abpr]-[A-Za-z0-9\-]{8,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,})"
)
_AUTH_HEADER = re.compile(r"(?i)((?:proxy-)?authorization\s*:\s*)(.+)")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}")
_URL_QUERY_SECRET = re.compile(r"(?i)([?&][^=&#]*(?:key|token|secret|password|sig)[^=&#]*=)[^&#]*")


def _is_secret_name(name: str) -> bool:
    norm = name.lstrip("-").replace("-", "_")
    return bool(_SECRET_WORDS.search(norm)) and not _NOT_SECRET_NAME.search(norm)


def mask_value(text: str) -> str:
    """Mask key-shaped substrings, ``Authorization:`` values, URL passwords and query secrets."""
    m = _AUTH_HEADER.search(text)
    if m:
        return text[: m.start(2)] + MASK
    text = _SECRET_VALUE.sub(MASK, text)
    text = _BEARER.sub(lambda mm: mm.group(1) + " " + MASK, text)
    if "://" in text:
        text = _mask_url(text)
    return text


# Free text: ``NAME=value`` and ``--name=value`` (value quoted or up to a space, comma, ``;``,
# ``&``), ``--name value``, ``"name": "value"`` (JSON, Python reprs), URLs inside the text.
_TEXT_AUTH = re.compile(r"(?i)((?:proxy-)?authorization\s*[:=]\s*)\S.*")
_TEXT_ASSIGN = re.compile(
    r"""(?<![\w.\-])((?:--?)?[A-Za-z_][\w\-]*)(\s*=\s*)("[^"]*"|'[^']*'|[^\s,;&]+)"""
)
_TEXT_FLAG = re.compile(r"(?<!\S)(--?[A-Za-z][\w\-]*)(\s+)(?!-)(\S+)")
_TEXT_QUOTED = re.compile(r"""(["'])([A-Za-z_][\w\-]*)\1(\s*:\s*)(["'])(.*?)\4""")
_TEXT_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")


def mask_text(text: str) -> str:
    """Free text (a log line, an error message) with its secrets masked.

    Masks the values of secret-named assignments and flags (``OPENAI_API_KEY=...``,
    ``TOKEN=...``, ``--api-key ...``, ``--hf-token=...``, ``"api_key": "..."``), key-shaped tokens
    anywhere (``sk-...``, ``hf_...``), ``Bearer``/``Basic`` tokens, ``Authorization`` values and
    URL credentials. Words are never masked for what they are: ``token budget None``,
    ``max_tokens=8192`` and ``--token-budget 10`` stay as they are.
    """
    text = _TEXT_AUTH.sub(lambda m: m.group(1) + MASK, text)
    text = _TEXT_ASSIGN.sub(
        lambda m: m.group(1) + m.group(2) + MASK if _is_secret_name(m.group(1)) else m.group(0),
        text,
    )
    text = _TEXT_FLAG.sub(
        lambda m: m.group(1) + m.group(2) + MASK if _is_secret_name(m.group(1)) else m.group(0),
        text,
    )
    text = _TEXT_QUOTED.sub(
        lambda m: (
            m.group(0)[: m.start(5) - m.start(0)] + MASK + m.group(4)
            if _is_secret_name(m.group(2))
            else m.group(0)
        ),
        text,
    )
    text = _SECRET_VALUE.sub(MASK, text)
    text = _BEARER.sub(lambda mm: mm.group(1) + " " + MASK, text)
    if "://" in text:
        text = _TEXT_URL.sub(lambda m: _mask_url(m.group(0)), text)
    return text


def _mask_url(text: str) -> str:
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    netloc = parts.netloc
    if "@" in netloc:
        creds, _, hostpart = netloc.rpartition("@")
        user = creds.split(":", 1)[0]
        netloc = (user + ":" + MASK if ":" in creds else MASK) + "@" + hostpart
    query = _URL_QUERY_SECRET.sub(lambda mm: mm.group(1) + MASK, "?" + parts.query)[1:]
    if netloc == parts.netloc and query == parts.query:
        return text
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def mask_argv(argv: Sequence[str]) -> list[str]:
    """argv with secrets replaced by ``***``; everything else unchanged.

    Masks the value of any flag whose name holds KEY/TOKEN/SECRET/PASSWORD/AUTH/CREDENTIAL
    (``--api-key X``, ``--api-key=X``, ``--hf-token X``, ``OPENAI_API_KEY=X``) except names that
    are counts (``--token-budget``, ``--max-tokens``), key-shaped values anywhere (``sk-...``,
    ``hf_...``), ``Authorization:`` header values, ``Bearer`` tokens and URL credentials.
    """
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            mask_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(MASK)
                continue
        if arg.startswith("-") and len(arg) > 1:
            name, eq, _value = arg.partition("=")
            if _is_secret_name(name):
                if eq:
                    out.append(name + "=" + MASK)
                else:
                    out.append(arg)
                    mask_next = True
                continue
        elif "=" in arg and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", arg):
            name, _, _value = arg.partition("=")
            if _is_secret_name(name):
                out.append(name + "=" + MASK)
                continue
        out.append(mask_value(arg))
    return out


# --------------------------------------------------------------------------- matching and flags


def script_index(argv: Sequence[str], scripts: Iterable[str]) -> int | None:
    """Index of the argv element that is the executed script, or None when not a run."""
    names = set(scripts)
    if not argv or not names:
        return None
    first = os.path.basename(argv[0])
    if first in names:
        return 0
    if not _INTERPRETER.match(first):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in _OPTS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("--"):
            i += 1
            continue
        if arg.startswith("-") and arg != "-":
            # A cluster of short options (``-uB``, ``-Wignore``, ``-uc CODE``).
            step = 1
            for j, ch in enumerate(arg[1:], start=1):
                if ch in "cm":
                    return None  # runs a string or a module, not a script file
                if ch in "WX":
                    step = 2 if j == len(arg) - 1 else 1
                    break
            i += step
            continue
        break
    if i < len(argv) and os.path.basename(argv[i]) in names:
        return i
    return None


def _flag(args: Sequence[str], names: Sequence[str]) -> str | None:
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
    return found


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    v = value.strip().replace("_", "").replace(",", "")
    try:
        return int(v)
    except ValueError:
        pass
    try:
        f = float(v)
    except ValueError:
        return None
    return int(f) if f == f and abs(f) != float("inf") else None


def backend_of(api_base: str | None) -> str:
    """``local`` for loopback, private-network and single-label hosts; ``api`` otherwise."""
    if not api_base:
        return "unknown"
    try:
        host = urlsplit(api_base if "://" in api_base else "http://" + api_base).hostname
    except ValueError:
        return "unknown"
    if not host:
        return "unknown"
    host = host.lower()
    if host in ("localhost", "localhost.localdomain") or host.endswith(
        (".localhost", ".local", ".lan", ".internal", ".home.arpa")
    ):
        return "local"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "local" if "." not in host else "api"
    return "local" if ip.is_loopback or ip.is_private or ip.is_link_local else "api"


def parse_flags(argv: Sequence[str], start: int = 0) -> dict[str, Any]:
    """The flags of a run that matter to supervision (``model.RunFlags`` shape).

    ``start`` is the index of the script in argv; only what follows it is read.
    """
    args = list(argv[start + 1 :])
    datasets: list[str] = []
    for i, arg in enumerate(args):
        values: list[str] = []
        if arg == "--datasets" or arg == "--dataset":
            for nxt in args[i + 1 :]:
                if nxt.startswith("-"):
                    break
                values.append(nxt)
            datasets = []
        elif arg.startswith(("--datasets=", "--dataset=")):
            values = [arg.split("=", 1)[1]]
            datasets = []
        for v in values:
            datasets.extend(d for d in v.split(",") if d)
    api_base = _flag(args, ("--api-base", "--base-url", "--api-url", "--endpoint"))
    masked_base = mask_value(api_base) if api_base is not None else None
    return {
        "datasets": datasets,
        "max_samples": _int(_flag(args, ("--max-samples", "--max_samples"))),
        "token_budget": _int(_flag(args, ("--token-budget", "--token_budget"))),
        "concurrency": _int(_flag(args, ("--concurrency", "--max-concurrency"))),
        "output_dir": _flag(args, ("--output-dir", "--output_dir", "--out-dir", "--out")),
        "api_base": masked_base,
        "model": _flag(args, ("--model", "--model-name")),
        "backend": backend_of(api_base),
    }


# --------------------------------------------------------------------------- reading processes


def clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 100


CLK_TCK = clock_ticks()


def boot_id() -> str:
    """The kernel's boot id (changes on every boot); empty where the kernel has none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def uses_proc() -> bool:
    return os.path.exists(PROC + "/self/stat")


class Stat:
    """The fields of ``/proc/PID/stat`` the listing uses."""

    __slots__ = ("ppid", "rss_pages", "start_time", "state", "stime", "threads", "utime")

    def __init__(self, raw: bytes) -> None:
        # comm may contain spaces and parentheses: the fields start after the LAST ')'.
        fields = raw[raw.rfind(b")") + 2 :].split()
        self.state = fields[0].decode("ascii", "replace")
        self.ppid = int(fields[1])
        self.utime = int(fields[11])
        self.stime = int(fields[12])
        self.threads = int(fields[17])
        self.start_time = int(fields[19])
        self.rss_pages = int(fields[21])


def read_stat(pid: int) -> Stat | None:
    """``/proc/PID/stat`` parsed, or None when the process is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            return Stat(f.read())
    except (OSError, IndexError, ValueError):
        return None


def read_argv(pid: int) -> list[str] | None:
    """argv of a process (None when gone; empty for kernel threads and zombies)."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if not raw:
        return []
    parts = raw.split(b"\0")
    if parts[-1] == b"":
        parts.pop()
    # backslashreplace: always valid text for JSON, and the same string on every read.
    return [p.decode("utf-8", "backslashreplace") for p in parts]


def read_uid(pid: int) -> int | None:
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def uptime_s() -> float:
    try:
        with open(PROC + "/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class ProcRow:
    """One process of the host as seen in one pass."""

    __slots__ = ("argv", "pid", "ppid")

    def __init__(self, pid: int, ppid: int, argv: list[str]) -> None:
        self.pid = pid
        self.ppid = ppid
        self.argv = argv


def process_table() -> dict[int, ProcRow]:
    """Every process of the host: pid -> (ppid, argv); those that vanish mid-read are skipped."""
    table: dict[int, ProcRow] = {}
    if uses_proc():
        for name in os.listdir(PROC):
            if not name.isdigit():
                continue
            pid = int(name)
            st = read_stat(pid)
            if st is None:
                continue
            argv = read_argv(pid)
            if argv is None:
                continue
            table[pid] = ProcRow(pid, st.ppid, argv)
        return table
    if psutil is None:  # pragma: no cover - neither /proc nor psutil
        raise RuntimeError("cannot list processes: no /proc and no psutil on this host")
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):  # pragma: no cover - non-Linux
        info = p.info
        table[info["pid"]] = ProcRow(info["pid"], info["ppid"] or 0, list(info["cmdline"] or []))
    return table


def descendants(table: dict[int, ProcRow], pid: int) -> list[int]:
    """Every descendant of ``pid`` in ``table``, breadth first."""
    kids: dict[int, list[int]] = {}
    for row in table.values():
        kids.setdefault(row.ppid, []).append(row.pid)
    out: list[int] = []
    queue = list(kids.get(pid, []))
    seen = {pid}
    while queue:
        p = queue.pop(0)
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        queue.extend(kids.get(p, []))
    return out


def ancestors(table: dict[int, ProcRow], pid: int) -> list[int]:
    out: list[int] = []
    seen = {pid}
    row = table.get(pid)
    while row is not None and row.ppid not in seen and row.ppid > 0:
        out.append(row.ppid)
        seen.add(row.ppid)
        row = table.get(row.ppid)
    return out


def ancestors_live(pid: int) -> list[int]:
    """Ancestors of ``pid`` read directly from /proc (for the agent's own chain)."""
    out: list[int] = []
    seen = {pid}
    st = read_stat(pid)
    while st is not None and st.ppid > 0 and st.ppid not in seen:
        out.append(st.ppid)
        seen.add(st.ppid)
        st = read_stat(st.ppid)
    return out


def find_runs(
    table: dict[int, ProcRow], scripts: Sequence[str], exclude: Iterable[int] = ()
) -> list[tuple[int, int]]:
    """``(pid, script index)`` of every run in ``table``; ``exclude`` (self and ancestors) never.

    A matching process with a matching ancestor is a worker of that run, not a run.
    """
    excluded = set(exclude)
    matches: dict[int, int] = {}
    for row in table.values():
        idx = script_index(row.argv, scripts)
        if idx is not None and row.pid not in excluded:
            matches[row.pid] = idx
    return sorted(
        (pid, idx)
        for pid, idx in matches.items()
        if not any(a in matches for a in ancestors(table, pid))
    )


# --------------------------------------------------------------------------- GPU


def parse_gpu_apps(text: str) -> dict[int, float]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` -> MiB."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            pid = int(parts[0])
            mem = float(parts[1])
        except ValueError:
            continue  # "[N/A]" or "[Not Supported]"
        out[pid] = out.get(pid, 0.0) + mem
    return out


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu ...``."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue

        def num(s: str) -> float | None:
            try:
                return float(s)
            except ValueError:
                return None

        gpus.append(
            {
                "index": _int(parts[0]),
                "name": parts[1],
                "memory_used_mb": num(parts[2]),
                "memory_total_mb": num(parts[3]),
                "utilization_pct": num(parts[4]),
            }
        )
    return gpus


def nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def query_gpu(timeout: float = 5.0) -> tuple[dict[int, float] | None, dict[str, Any] | None]:
    """(GPU MiB per pid, GPU summary) from nvidia-smi; (None, None) when the host has none."""
    exe = nvidia_smi()
    if exe is None:
        return None, None

    def run(*args: str) -> str | None:
        try:
            done = subprocess.run(
                [exe, *args],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        return done.stdout.decode("utf-8", "replace")

    apps = run("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    gpus = run(
        "--query-gpu=index,name,memory.used,memory.total,utilization.gpu",
        "--format=csv,noheader,nounits",
    )
    if apps is None and gpus is None:
        return None, {"error": "nvidia-smi failed"}
    return parse_gpu_apps(apps or ""), {"gpus": parse_gpus(gpus or "")}


# --------------------------------------------------------------------------- listing


class Lister:
    """Lists runs across refreshes (keeps the CPU time of each process to compute CPU %)."""

    def __init__(self, self_pid: int | None = None) -> None:
        self.self_pid = os.getpid() if self_pid is None else self_pid
        self.boot_id = boot_id()
        self._cpu: dict[tuple[int, int], tuple[float, float]] = {}

    def excluded(self) -> set[int]:
        return {self.self_pid, *ancestors_live(self.self_pid)}

    def list_runs(
        self,
        scripts: Sequence[str] = DEFAULT_SCRIPTS,
        show_other_users: bool = False,
        gpu_per_pid: dict[int, float] | None = None,
    ) -> list[dict[str, Any]]:
        """ProcessInfo-shaped dicts of every run on the host."""
        if not uses_proc():  # pragma: no cover - non-Linux hosts
            return self._list_psutil(scripts, show_other_users, gpu_per_pid)
        table = process_table()
        my_uid = os.getuid()
        now_boot = uptime_s()
        now = time.monotonic()
        out: list[dict[str, Any]] = []
        seen: set[tuple[int, int]] = set()
        for pid, idx in find_runs(table, scripts, self.excluded()):
            st = read_stat(pid)
            uid = read_uid(pid)
            if st is None or uid is None:
                continue  # exited while listing
            if uid != my_uid and not show_other_users:
                continue
            argv = table[pid].argv
            kids = descendants(table, pid)
            cpu_s = (st.utime + st.stime) / CLK_TCK
            started_s = st.start_time / CLK_TCK
            age = max(now_boot - started_s, 0.0)
            key = (pid, st.start_time)
            seen.add(key)
            prev = self._cpu.get(key)
            if prev is not None and now > prev[1]:
                cpu_pct = 100.0 * (cpu_s - prev[0]) / (now - prev[1])
            else:
                cpu_pct = 100.0 * cpu_s / age if age > 0 else 0.0
            self._cpu[key] = (cpu_s, now)
            try:
                cwd: str | None = os.readlink(f"{PROC}/{pid}/cwd")
            except OSError:
                cwd = None
            record = process_record(
                self.boot_id, pid, st.start_time, uid, my_uid, argv, idx, kids, gpu_per_pid
            )
            record.update(
                uptime_s=round(age, 2),
                cpu_percent=round(max(cpu_pct, 0.0), 1),
                rss_mb=round(st.rss_pages * _page_size() / 1048576.0, 1),
                state=st.state,
                cwd=cwd,
                ppid=st.ppid,
                threads=st.threads,
            )
            out.append(record)
        for key in list(self._cpu):
            if key not in seen:
                del self._cpu[key]
        return out

    def _list_psutil(  # pragma: no cover - non-Linux hosts
        self,
        scripts: Sequence[str],
        show_other_users: bool,
        gpu_per_pid: dict[int, float] | None,
    ) -> list[dict[str, Any]]:
        assert psutil is not None
        table = process_table()
        my_uid = os.getuid()
        boot = psutil.boot_time()
        out: list[dict[str, Any]] = []
        for pid, idx in find_runs(table, scripts, self.excluded()):
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    uid = p.uids().real
                    created = p.create_time()
                    mem = p.memory_info().rss
                    state = p.status()
                    cpu = p.cpu_percent(None)
                    try:
                        cwd: str | None = p.cwd()
                    except psutil.Error:
                        cwd = None
            except psutil.Error:
                continue
            if uid != my_uid and not show_other_users:
                continue
            argv = table[pid].argv
            kids = descendants(table, pid)
            start = psutil_start_ticks(created, boot)
            record = process_record(
                self.boot_id, pid, start, uid, my_uid, argv, idx, kids, gpu_per_pid
            )
            record.update(
                uptime_s=round(max(time.time() - created, 0.0), 2),
                cpu_percent=cpu,
                rss_mb=round(mem / 1048576.0, 1),
                state=state,
                cwd=cwd,
            )
            out.append(record)
        return out


def process_record(
    boot_id: str,
    pid: int,
    start_time: int,
    uid: int,
    my_uid: int,
    argv: list[str],
    idx: int,
    kids: list[int],
    gpu_per_pid: dict[int, float] | None,
) -> dict[str, Any]:
    """The parts of a listed run that do not depend on where they were read (/proc or psutil).

    The identity carries the masked argv, so secrets never leave the host.
    """
    masked = mask_argv(argv)
    gpu = None
    if gpu_per_pid is not None:
        gpu = sum(gpu_per_pid.get(p, 0.0) for p in [pid, *kids])
    return {
        "identity": {
            "boot_id": boot_id,
            "pid": pid,
            "start_time": start_time,
            "uid": uid,
            "argv": masked,
        },
        "user": user_name(uid),
        "argv_masked": masked,
        "children": kids,
        "flags": parse_flags(argv, idx),
        "gpu_memory_mb": gpu,
        "run": None,
        "killable": uid == my_uid,
        "script": os.path.basename(argv[idx]),
    }


def psutil_start_ticks(create_time: float, boot_time: float) -> int:
    """Start time in clock ticks from psutil's wall-clock floats (hosts without /proc)."""
    return round((create_time - boot_time) * CLK_TCK)


def _page_size() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 4096
