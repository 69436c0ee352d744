"""runwatch installed as a tool: the wheel built from this checkout, installed into a fresh venv
outside the repo, runs ``runwatch --version`` and ``runwatch demo`` from a directory outside it
(issue 38: the demo's config was not in the wheel, so an installed ``runwatch demo`` failed).

The wheel is built with this venv's build backend and the venv gets the wheel alone
(``--no-build-isolation``, ``--no-deps``: nothing is downloaded); its dependencies come
from this interpreter's site-packages through a ``.pth`` file written after the install, so pip
never sees this checkout's own editable install, and the ``supervisor`` it imports is the wheel's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert r.returncode == 0, f"{argv}: {r.stdout}{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` directory of a fresh venv holding the wheel of this checkout."""
    root = tmp_path_factory.mktemp("installed")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",  # the build backend of this venv: nothing downloaded
            "-q",
            "-w",
            str(root / "dist"),
            str(REPO),
        ]
    )
    (wheel,) = (root / "dist").glob("runwatch-*.whl")
    venv = root / "venv"
    _run(
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)]
    )
    python = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ]
    )
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    (Path(purelib.stdout.strip()) / "runwatch-test-deps.pth").write_text(
        sysconfig.get_path("purelib") + "\n"
    )
    return venv / "bin"


def _env(tmp_path: Path, demo_cache_env: dict[str, str]) -> dict[str, str]:
    """No PYTHONPATH (it would import the checkout); every XDG dir and the temp dir in tmp."""
    env = {k: v for k, v in demo_cache_env.items() if k != "PYTHONPATH"}
    for name in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR"):
        env[name] = str(tmp_path / name.lower())
        Path(env[name]).mkdir()
    return env


def test_installed_wheel_runs_the_demo_outside_the_repo(
    installed: Path, tmp_path: Path, demo_cache_env: dict[str, str]
) -> None:
    env = _env(tmp_path, demo_cache_env)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    where = _run(
        [
            str(installed / "python"),
            "-c",
            "import supervisor, tui; print(supervisor.__file__, tui.__file__)",
        ],
        cwd=cwd,
        env=env,
    )
    assert all(Path(p).is_relative_to(installed.parent) for p in where.stdout.split()), where.stdout
    version = _run([str(installed / "runwatch"), "--version"], cwd=cwd, env=env)
    assert re.fullmatch(r"runwatch, version \d+\.\d+\.\d+\S*\n", version.stdout)
    demo_dir = tmp_path / "demo"
    r = _run(
        [
            str(installed / "runwatch"),
            "demo",
            "--headless",
            "--seconds",
            "15",
            "--dir",
            str(demo_dir),
        ],
        cwd=cwd,
        env=env,
    )
    out = r.stdout
    assert "stopped 5 processes" in out, out + r.stderr
    # The client started from the wheel, not from the checkout.
    assert str(installed.parent) in re.search(r"started run api: pid \d+: (.*)", out).group(1)  # type: ignore[union-attr]
    # Live figures: B5 did not exist before the demo; its last report counts the API run's lines.
    last = out.rsplit("runwatch demo in", 1)[1]
    b5 = re.search(rf"(\d+) lines  {re.escape(str(demo_dir / 'out/B5/raw_responses.jsonl'))}", last)
    assert b5 is not None and int(b5.group(1)) > 0, last
    # And the agent the wheel carries answers: status reads B5 through it, as many records.
    status = _run(
        [str(installed / "runwatch"), "-c", str(demo_dir / "runwatch.toml"), "status", "--json"],
        cwd=cwd,
        env=env,
    )
    (host,) = json.loads(status.stdout)["hosts"]
    assert host["connected"] and host["error"] is None, host
    records = {d["name"]: d["records"] for run in host["runs"] for d in run["datasets"]}
    assert records["B5"] >= int(b5.group(1)), records
