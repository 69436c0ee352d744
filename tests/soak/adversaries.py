"""Runs that do what a supervisor cannot infer: the reference client wrapped so that its process
escapes, renames itself or records the signals it gets, and the SpecForge stand-in.

Each wrapper is written to disk as ``<dir>/run_inference.py`` (the reference profile's script name,
so runwatch reads its flags as the reference client's) and runs the real client
(``supervisor.demo.run_inference``) after arranging its behaviour:

- ``escape``: its SIGTERM (and SIGINT) handler forks a child that calls ``setsid``, closes every
  descriptor and execs a writer that opens, appends and closes the run's data file per record,
  forever; then the handler exits as if the TERM had worked.
- ``daemon``: at start it double-forks a ``setsid`` daemon (descriptors closed) that execs the same
  writer; the client itself runs as usual.
- ``renamed``: at start it re-execs itself under another ``argv[0]`` (``soak-gen-worker``).
- ``twin``: records every signal it catches (time, pid, name) in ``signals.log`` in its working
  directory; TERM, INT, HUP and QUIT then end it as they would have.

The escaped writers' lines are records of their own (``ESC-<pid>-<n>``), not the ledger's: they
are found as growth of the file, never as lost lines.
"""

from __future__ import annotations

import shutil
import site
from pathlib import Path

BEHAVIOURS = ("escape", "daemon", "renamed", "twin")
RENAMED_ARGV0 = "soak-gen-worker"
ESCAPED_PREFIX = "ESC-"

WRITER = r"""
import json, os, sys, time
path, n = sys.argv[1], 0
while True:
    n += 1
    rec = {"sample_id": "ESC-%d-%d" % (os.getpid(), n), "output_ids": [1, 2, 3],
           "prompt_tokens": 3, "completion_tokens": 3, "finish_reason": "stop"}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(rec) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass
    time.sleep(0.3)
"""

WRAPPER = r'''"""A soak adversary: the reference client, {behaviour}."""
import os, signal, sys, time
for p in {paths!r}:
    if p not in sys.path:
        sys.path.insert(0, p)
BEHAVIOUR = {behaviour!r}
WRITER = {writer!r}


def data_file():
    a = sys.argv
    out = a[a.index("--output-dir") + 1]
    first = a[a.index("--datasets") + 1].split(",")[0]
    return os.path.abspath(os.path.join(out, first, "raw_responses.jsonl"))


def exec_writer(path):
    os.closerange(0, 4096)
    os.execv(sys.executable, [sys.executable, "-c", WRITER, path])


if BEHAVIOUR == "renamed" and os.environ.get("SOAK_RENAMED") != "1":
    os.environ["SOAK_RENAMED"] = "1"
    os.execv(sys.executable, [{argv0!r}, os.path.abspath(sys.argv[0])] + sys.argv[1:])

if BEHAVIOUR == "escape":
    def escape(sig, frame):
        path = data_file()
        if os.fork() == 0:
            os.setsid()
            exec_writer(path)
        os._exit(128 + sig)
    signal.signal(signal.SIGTERM, escape)
    signal.signal(signal.SIGINT, escape)

if BEHAVIOUR == "daemon":
    path = data_file()
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            exec_writer(path)
        os._exit(0)
    os.waitpid(first, 0)

if BEHAVIOUR == "twin":
    def record(sig, frame):
        with open("signals.log", "a") as f:
            f.write("%.3f %d %s\n" % (time.time(), os.getpid(), signal.Signals(sig).name))
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            os._exit(128 + sig)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2, signal.SIGALRM, signal.SIGCONT):
        signal.signal(s, record)

from supervisor.demo import run_inference
sys.exit(run_inference.main())
'''


def write_wrapper(directory: Path, behaviour: str, repo: Path) -> Path:
    """The wrapper script of ``behaviour`` at ``directory/run_inference.py``. It finds the repo
    and this interpreter's packages by path, not through the venv: a re-exec under another
    ``argv[0]`` loses the venv's ``sys.path``."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {behaviour!r}: one of {', '.join(BEHAVIOURS)}")
    directory.mkdir(parents=True, exist_ok=True)
    paths = [str(repo), *site.getsitepackages()]
    script = directory / "run_inference.py"
    script.write_text(
        WRAPPER.format(behaviour=behaviour, paths=paths, writer=WRITER, argv0=RENAMED_ARGV0)
    )
    return script


def specforge_workdir(workdir: Path, rows: int, repo: Path) -> None:
    """A workdir for the SpecForge stand-in: the script under its real name and ShareGPT input."""
    import json

    from supervisor.demo.prompts import prompt_records

    script = workdir / "scripts" / "regenerate_train_data.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo / "supervisor" / "demo" / "specforge_regenerate.py", script)
    (workdir / "out").mkdir(exist_ok=True)
    records = prompt_records("S1", rows)
    lines = [json.dumps({"id": r["sample_id"], "conversations": r["messages"]}) for r in records]
    (workdir / "in.jsonl").write_text("".join(line + "\n" for line in lines))


def signals_of(log: Path) -> list[tuple[float, int, str]]:
    """(time, pid, signal name) of each signal a twin recorded."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            try:
                out.append((float(parts[0]), int(parts[1]), parts[2]))
            except ValueError:
                continue
    return out
