"""Which processes are runs, and what they were told: argv matching and flag parsing.

Standard library only, Python >= 3.8 (runs on the host inside the agent).

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

import contextlib
import ipaddress
import os
import posixpath
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from supervisor.agent import argflags
from supervisor.agent.masking import mask_value

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from collections.abc import Set as AbstractSet

    from supervisor.agent.proc import ProcRow

_INTERPRETER = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[a-z]?(\.exe)?$")
# Interpreter options that take the next argument as their value.
_OPTS_WITH_VALUE = frozenset(("-W", "-X", "--check-hash-based-pycs"))


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


def parse_int(value: str | None) -> int | None:
    """An integer from a flag value (``1_000``, ``1,000``, ``1e3``); None when it is none."""
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


REFERENCE_FLAGS = {
    "datasets": ["--datasets", "--dataset"],
    "output_dir": ["--output-dir", "--output_dir", "--out-dir", "--out"],
    "prompts_dir": ["--prompts-dir", "--prompt-dir", "--prompts"],
    "samples": ["--max-samples", "--max_samples"],
    "budget": ["--token-budget", "--token_budget"],
    "concurrency": ["--concurrency", "--max-concurrency"],
    "endpoint": ["--api-base", "--base-url", "--api-url", "--endpoint"],
    "model": ["--model", "--model-name"],
}
"""Flag spellings of the reference client, by meaning: what a run's flags are read with when no
client profile describes its script (the laptop's built-in ``run_inference`` profile has them)."""


def argv_path(value: str) -> str:
    """A path from a command line as the client reads it. No shell expanded it, so a leading
    ``~`` is a directory named ``~`` (``./~/legacy``), which ``os.path.expanduser`` and the agent's
    expansion of configured paths leave alone."""
    return "./" + value if value.startswith("~") else value


def client_path(cwd: str, value: str) -> str:
    """``value`` (a path flag's value, or the client's default for it) as the client resolves it
    from its working directory ``cwd``: relative from ``cwd``, ``~`` literal, normalised. The laptop
    (``supervisor.layout``) and the host (``run_evidence``) both resolve with this."""
    path = posixpath.normpath(posixpath.join(cwd, argv_path(value)))
    # Only a ``~`` of ``cwd`` itself (a configured workdir, expanded by the host) may lead.
    return "./" + path if path.startswith("~") and not cwd.startswith("~") else path


def client_for(script: str, clients: Sequence[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The client (plain-data profile: ``name``, ``scripts``, ``flags``...) whose scripts include
    the basename of ``script``, or None."""
    base = os.path.basename(script)
    for client in clients or ():
        if base in (client.get("scripts") or ()):
            return client
    return None


def parse_flags(
    argv: Sequence[str], start: int = 0, client: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The flags of a run that matter to supervision (``model.RunFlags`` shape).

    ``start`` is the index of the script in argv; only what follows it is read. ``client`` is a
    client profile as plain data (``flags``: meaning -> spellings, ``endpoint_template``); None
    reads the reference client's spellings.
    """
    args = list(argv[start + 1 :])
    names: dict[str, Any] = (client or {}).get("flags") or REFERENCE_FLAGS

    def last(role: str) -> str | None:
        values = argflags.values(args, names.get(role) or ())
        return values[0] if values else None

    datasets: list[str] = []
    for v in argflags.values(args, names.get("datasets") or ()) or []:
        datasets.extend(d for d in v.split(",") if d)
    api_base = last("endpoint")
    if api_base is not None and client is not None:
        api_base = str(client.get("endpoint_template") or "{}").replace("{}", api_base)
    masked_base = mask_value(api_base) if api_base is not None else None
    resume = names.get("resume")
    return {
        "datasets": datasets,
        "max_samples": parse_int(last("samples")),
        "token_budget": parse_int(last("budget")),
        "concurrency": parse_int(last("concurrency")),
        "output_dir": last("output_dir"),
        "api_base": masked_base,
        "model": last("model"),
        "backend": backend_of(api_base),
        "client": client.get("name") if client is not None else None,
        "output_file": last("output_file"),
        "input_file": last("input_file"),
        "prompts_dir": last("prompts_dir"),
        "resume": argflags.has_flag(args, resume) if resume else None,
    }


def ancestors(table: dict[int, ProcRow], pid: int) -> list[int]:
    """Ancestors of ``pid`` in ``table``, nearest first."""
    out: list[int] = []
    seen = {pid}
    row = table.get(pid)
    while row is not None and row.ppid not in seen and row.ppid > 0:
        out.append(row.ppid)
        seen.add(row.ppid)
        row = table.get(row.ppid)
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


# --------------------------------------------------------------------------- evidence


def file_keys(path: str, under: str = "") -> set[tuple[Any, ...]]:
    """A data file's identities: ``("f", dev, ino)`` of the file when it exists and
    ``("d", dev, ino, name)`` of its directory and name (a file not made yet, or made again by a
    move-aside, is still the same place); a bind mount, a link or another spelling of the path
    has the same ones. ``under``: a process's ``/proc/PID/root``, to read an absolute ``path``
    of its mount namespace."""
    keys: set[tuple[Any, ...]] = set()
    with contextlib.suppress(OSError):
        st = os.stat(under + path)
        keys.add(("f", st.st_dev, st.st_ino))
    with contextlib.suppress(OSError):
        d = os.stat(under + (os.path.dirname(path) or "."))
        keys.add(("d", d.st_dev, d.st_ino, os.path.basename(path)))
    return keys


def place_keys(path: str) -> set[tuple[int, int]]:
    """``(dev, inode)`` of the directory ``path`` (empty when it cannot be read)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return {(st.st_dev, st.st_ino)}
    return set()


def place_of(pid: int) -> set[tuple[int, int]]:
    """``(dev, inode)`` of the working directory and the root of ``pid`` (``os.stat`` through
    ``/proc/PID/cwd`` and ``/proc/PID/root``: the directories themselves, whatever path, bind
    mount or mount namespace reaches them); empty when they cannot be read."""
    found: set[tuple[int, int]] = set()
    for link in ("cwd", "root"):
        found |= place_keys(f"/proc/{pid}/{link}")
    return found


class RunFiles:
    """A configured run's places as resolved on this host: ``~`` expanded here, symlinks
    resolved. Built from one entry of the ``runs`` parameter of a listing (``{"name",
    "workdir", "out", "output_dir", "data_file", "files", "locks"}``): ``out`` and ``files`` as
    the laptop's layout resolved them from the run's argv (``~`` of the workdir unexpanded),
    ``output_dir`` the run's key, where a script no profile describes writes without its output
    dir flag (absent: not known)."""

    __slots__ = (
        "data_file",
        "dirs",
        "files",
        "inodes",
        "keys",
        "name",
        "out",
        "output_dir",
        "workdir",
    )

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name = str(spec["name"])
        self.workdir = os.path.realpath(os.path.expanduser(str(spec["workdir"])))
        out = spec.get("out")
        self.out = _under(self.workdir, str(out)) if out else None
        given = spec.get("output_dir")
        self.output_dir = str(given) if given else None
        self.data_file = str(spec.get("data_file") or "raw_responses.jsonl")
        self.files = {_under(self.workdir, str(p)) for p in spec.get("files") or []}
        locks = {_under(self.workdir, str(p)) for p in spec.get("locks") or []}
        self.inodes: set[tuple[int, int]] = set()
        for path in self.files | locks:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                self.inodes.add((st.st_dev, st.st_ino))
        # By identity (:func:`file_keys`): the data files, and their directories.
        self.keys = {k for path in self.files for k in file_keys(path)}
        # A data directory that is the workdir says nothing of a process working there (I2).
        self.dirs = {(k[1], k[2]) for k in self.keys if k[0] == "d"} - place_keys(self.workdir)


def _under(base: str, path: str) -> str:
    """A configured ``path`` (``~`` expanded on this host) resolved against ``base``, symlinks
    resolved."""
    return os.path.realpath(os.path.join(base, os.path.expanduser(path)))


def resolve_runs(specs: Any) -> list[RunFiles]:
    """The ``runs`` parameter of a listing, resolved on this host (bad entries raise ValueError)."""
    if specs is None:
        return []
    if not isinstance(specs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("workdir"), str)
        for r in specs
    ):
        raise ValueError("runs: expected a list of {name, workdir, ...} tables")
    return [RunFiles(r) for r in specs]


def run_evidence(
    cwd: str | None,
    argv: Sequence[str],
    idx: int,
    runs: Sequence[RunFiles],
    inodes: AbstractSet[tuple[int, int]] | None,
    client: dict[str, Any] | None = None,
    pid: int | None = None,
) -> dict[str, list[str]]:
    """Run name -> why a process could be that run, for each run with any evidence. ``cwd``,
    ``argv`` and ``inodes`` (of the files it has open) are the process's:

    * ``argv``: the data files its flags name are the run's data files (or, without a datasets
      flag, its explicit output dir is the run's). The flags are read with its ``client`` profile
      (output dir and datasets, or a single output file) and resolved as the client resolves them
      (``client_path``: from its cwd, ``~`` literal); a flag it lacks is the profile's default
      (``defaults``), and for a script no profile describes the run's ``output_dir`` key;
    * ``fd``: it holds one of the run's data files or locks open (``inodes``: its descriptors and
      mapped files);
    * ``place``: its working directory or root is the directory of one of the run's data files
      (by identity, :func:`place_of`);
    * ``cwd``: its working directory is the run's workdir (never enough on its own).

    With the process's ``pid``, a data path of its argv that is not one of the run's paths is
    compared by identity (:func:`file_keys`, read in its mount namespace): a bind mount or a
    symlinked view of the workdir names the same files (``argv`` and ``identity``; ``place``
    comes with ``identity`` too)."""
    if not runs:
        return {}
    flags = parse_flags(argv, idx, client)
    defaults = (client or {}).get("defaults") or {}
    out_flag = flags.get("output_dir")
    out_file = flags.get("output_file")
    if out_file is None:
        out_file = defaults.get("output_file")
    datasets = flags.get("datasets") or []
    here = os.path.realpath(cwd) if cwd and os.path.isabs(cwd) else None
    inodes = inodes or set()
    found: dict[str, list[str]] = {}

    def resolved(value: str | None) -> str | None:
        if value is None or (here is None and not os.path.isabs(value)):
            return None
        return os.path.realpath(client_path(here or "/", value))

    # What the process's own argv and profile say is the same for every run: resolved once.
    if out_flag is not None:
        argv_out = resolved(out_flag)
    else:
        argv_out = resolved(defaults.get("output_dir")) if client is not None else None
    file_path = resolved(out_file) if out_file else None
    data_paths: dict[tuple[str, str], set[str]] = {}
    place = place_of(pid) if pid is not None else set()
    under = f"/proc/{pid}/root" if pid is not None else None
    identities: dict[str, set[tuple[Any, ...]]] = {}

    def by_identity(paths: AbstractSet[str], run: RunFiles) -> bool:
        """One of ``paths`` (the process's) is one of the run's data files by identity."""
        if under is None:
            return False
        for path in paths:
            if path not in identities:
                identities[path] = file_keys(path, under)
            if identities[path] & run.keys:
                return True
        return False

    for run in runs:
        why: list[str] = []
        p_out = argv_out
        # A script no profile describes writes without its flag where the run's key says.
        declared = run.output_dir if out_flag is None and client is None else None
        if declared is not None and (here or declared.startswith(("/", "~"))):
            p_out = _under(here or "/", declared)
        if out_file:
            if file_path in run.files:
                why.append("argv")
            elif file_path is not None and by_identity({file_path}, run):
                why += ["argv", "identity"]
        elif p_out is not None:
            if datasets:
                key = (p_out, run.data_file)
                if key not in data_paths:
                    data_paths[key] = {
                        os.path.realpath(os.path.join(p_out, d, run.data_file)) for d in datasets
                    }
                if data_paths[key] & run.files:
                    why.append("argv")
                elif by_identity(data_paths[key], run):
                    why += ["argv", "identity"]
            elif out_flag is not None and p_out == run.out:
                why.append("argv")  # no datasets flag: an explicit output dir that is the run's
        if inodes & run.inodes:
            why.append("fd")
        if place & run.dirs:
            why += ["place", "identity"]
        if here is not None and here == run.workdir:
            why.append("cwd")
        if why:
            found[run.name] = why
    return found
