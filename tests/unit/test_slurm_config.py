"""``kind = "slurm"`` hosts and ``[runs.slurm]`` tables: typed, validated, unknown keys refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.errors import ConfigError

HOST = '[[hosts]]\nname = "login"\naddress = "login.example"\nkind = "slurm"\n'
RUN = '[[runs]]\nname = "gen"\nhost = "login"\nworkdir = "/w"\nargv = ["python3", "run_inference.py", "--datasets", "B1,B2"]\n'  # noqa: E501


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "rw.toml"
    path.write_text(text)
    return load_config(path)


def test_a_slurm_run_loads(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        HOST + RUN + '[runs.slurm]\npartition = "gpu"\ngres = "gpu:8"\ntime = "2-00:00:00"\n'
        "nodes = 1\ncpus_per_task = 16\narray = true\narray_max_running = 2\n"
        'extra = ["--mem=64G"]\n',
    )
    run = config.runs[0]  # type: ignore[attr-defined]
    assert config.hosts[0].kind == "slurm"  # type: ignore[attr-defined]
    assert run.slurm.partition == "gpu" and run.slurm.array and run.slurm.extra == ["--mem=64G"]


def test_hosts_default_to_processes(tmp_path: Path) -> None:
    config = _load(tmp_path, '[[hosts]]\nname = "box"\n')
    assert config.hosts[0].kind == "processes"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            '[runs.slurm]\npartiton = "gpu"\n',
            "runs[0].slurm.partiton: unknown key (allowed: partition",
        ),
        ('[runs.slurm]\ntime = "tomorrow"\n', "runs[0].slurm.time: not a Slurm time limit"),
        (
            '[runs.slurm]\nextra = ["mem=1G"]\n',
            "runs[0].slurm.extra[0]: expected one sbatch option",
        ),
        ('[runs.slurm]\nextra = ["--mem=1G\\nrm -rf ~"]\n', "runs[0].slurm.extra[0]"),
        (
            '[runs.slurm]\ngres = "gpu:8\\n#SBATCH --x"\n',
            "runs[0].slurm.gres: expected one non-empty",
        ),
        ("[runs.slurm]\nnodes = 0\n", "runs[0].slurm.nodes: expected an integer >= 1, got 0"),
        ('[runs.slurm]\nnodes = "2"\n', "runs[0].slurm.nodes: expected an integer >= 1, got str"),
    ],
)
def test_bad_slurm_tables_are_refused(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, HOST + RUN + table)
    assert message in str(err.value)


def test_slurm_table_needs_a_slurm_host(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runs\[0\]\.slurm: host 'login' is not a Slurm host"):
        _load(tmp_path, HOST.replace('kind = "slurm"\n', "") + RUN + "[runs.slurm]\nnodes = 1\n")


def test_unknown_host_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"hosts\[0\]\.kind: expected one of 'processes'"):
        _load(tmp_path, HOST.replace('"slurm"', '"pbs"'))
