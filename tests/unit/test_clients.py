"""Client profiles: the schema, the built-ins, user profiles in config, detection, the host's
flag reading from plain data, and ``runwatch clients``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor import clients
from supervisor.agent import match
from supervisor.cli import cli
from supervisor.config import load_config
from supervisor.errors import ConfigError
from tests.fixtures_config import write_local_config

SPECFORGE_ARGV = [
    "python3", "scripts/regenerate_train_data.py",
    "--model", "Qwen/Qwen3-8B",
    "--server-address", "localhost:30000", "localhost:30010",
    "--input-file-path", "data/sharegpt.jsonl",
    "--output-file-path", "out/regen.jsonl",
    "--num-samples", "5000",
    "--concurrency", "128",
    "--temperature", "0.8",
    "--resume",
]  # fmt: skip
MODELOPT_ARGV = [
    "python", "server_generate.py",
    "--data_path", "in.jsonl",
    "--output_path", "gen/out.jsonl",
    "--num_threads", "32",
    "--url", "http://10.0.0.5:8000/v1",
    "--api_key", "sk-abcdefghijklmnop1234",
    "--max_tokens", "4096",
]  # fmt: skip


def _config(tmp_path: Path, body: str = "", top: str = "") -> Path:
    return write_local_config(tmp_path / "runwatch.toml", body, top=top)


def test_builtin_profiles_read_their_own_flags_on_the_host_side() -> None:
    spec = clients.wire(clients.BUILTIN_CLIENTS["specforge"])
    # Plain data only: what the stdlib agent receives in request params.
    assert json.loads(json.dumps(spec)) == spec
    idx = match.script_index(SPECFORGE_ARGV, spec["scripts"])
    assert idx == 1
    flags = match.parse_flags(SPECFORGE_ARGV, 1, match.client_for(SPECFORGE_ARGV[1], [dict(spec)]))
    assert flags["client"] == "specforge"
    assert flags["output_file"] == "out/regen.jsonl"
    assert flags["input_file"] == "data/sharegpt.jsonl"
    assert flags["max_samples"] == 5000
    assert flags["concurrency"] == 128
    assert flags["token_budget"] is None
    assert flags["resume"] is True
    assert flags["api_base"] == "http://localhost:30000/v1"
    assert flags["backend"] == "local"
    assert flags["datasets"] == []

    mo = clients.wire(clients.BUILTIN_CLIENTS["modelopt"])
    flags = match.parse_flags(MODELOPT_ARGV, 1, mo)
    assert flags["output_file"] == "gen/out.jsonl"
    assert flags["concurrency"] == 32
    assert flags["max_samples"] is None
    assert flags["resume"] is None  # it has no resume flag: it always resumes
    assert flags["api_base"] == "http://10.0.0.5:8000/v1"


def test_without_resume_flag_the_specforge_profile_reports_the_overwrite() -> None:
    sf = clients.BUILTIN_CLIENTS["specforge"]
    argv = [a for a in SPECFORGE_ARGV if a != "--resume"]
    problem = clients.overwrite_problem(sf, argv)
    assert problem is not None and "--resume" in problem
    assert clients.overwrite_problem(sf, SPECFORGE_ARGV) is None
    assert clients.resume_fix(sf) == "--set resume"
    assert clients.overwrite_problem(clients.BUILTIN_CLIENTS["modelopt"], MODELOPT_ARGV) is None


def test_fingerprint_is_every_flag_but_the_volatile_ones() -> None:
    sf = clients.BUILTIN_CLIENTS["specforge"]
    fp = clients.fingerprint_flags(sf, SPECFORGE_ARGV, ["regenerate_train_data.py"])
    assert fp == {
        "--model": "Qwen/Qwen3-8B",
        "--input-file-path": "data/sharegpt.jsonl",
        "--temperature": "0.8",
    }
    mo = clients.BUILTIN_CLIENTS["modelopt"]
    fp = clients.fingerprint_flags(mo, MODELOPT_ARGV, ["server_generate.py"])
    assert "--api_key" not in fp and "--num_threads" not in fp
    assert fp == {"--data_path": "in.jsonl", "--max_tokens": "4096"}


def test_single_file_names_and_sidecars() -> None:
    sf = clients.BUILTIN_CLIENTS["specforge"]
    assert clients.single_file(sf)
    assert clients.stem("out/regen.jsonl") == "regen"
    assert clients.sidecar_paths(sf, "/w/out/regen.jsonl") == {
        "error": "/w/out/regen_error.jsonl",
        "skipped": "/w/out/regen_skipped.jsonl",
    }
    assert not clients.single_file(clients.BUILTIN_CLIENTS["run_inference"])


def test_a_run_is_detected_from_its_script_and_takes_the_profile_format(tmp_path: Path) -> None:
    cfg = load_config(
        _config(
            tmp_path,
            f"""
[[runs]]
name = "sf"
host = "here"
workdir = "{tmp_path}"
argv = {json.dumps(SPECFORGE_ARGV)}
[[runs]]
name = "ref"
host = "here"
workdir = "{tmp_path}"
argv = ["python3", "run_inference.py", "--datasets", "B1"]
""",
        )
    )
    sf, ref = cfg.run("sf"), cfg.run("ref")
    assert clients.client_of(cfg, sf).name == "specforge"
    assert sf.format == "specforge"  # no format key: the profile's
    assert clients.client_of(cfg, ref).name == "run_inference"
    assert ref.format == "raw"


def test_user_profile_from_config_and_run_naming_it(tmp_path: Path) -> None:
    cfg = load_config(
        _config(
            tmp_path,
            f"""
[[runs]]
name = "mine"
host = "here"
workdir = "{tmp_path}"
argv = ["python", "gen.py", "--out", "x.jsonl", "--n", "10"]
client = "mygen"
format = "raw"

[clients.mygen]
scripts = ["gen.py"]
format = "modelopt"
resume = "flag"
volatile = ["--workers"]
[clients.mygen.flags]
output_file = ["--out"]
samples = ["--n"]
resume = ["--continue"]
""",
        )
    )
    run = cfg.run("mine")
    p = clients.client_of(cfg, run)
    assert p.name == "mygen" and p.resume == "flag"
    assert run.format == "raw"  # an explicit format key wins over the profile's
    assert "gen.py" in clients.all_scripts(cfg)
    flags = clients.read_flags(p, run.argv, clients.all_scripts(cfg))
    assert flags["output_file"] == "x.jsonl" and flags["max_samples"] == 10
    assert flags["resume"] is False
    assert clients.wire_all(cfg)[0]["name"] == "mygen"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            '[clients.x]\nscripts = ["g.py"]\nformat = "raw"\nbogus = 1\n',
            "clients.x.bogus: unknown key",
        ),
        (
            '[clients.x]\nscripts = ["g.py"]\nformat = "nope"\n'
            '[clients.x.flags]\noutput_file = ["--o"]\n',
            "clients.x.format: unknown format 'nope'",
        ),
        (
            '[clients.x]\nscripts = ["g.py"]\n[clients.x.flags]\noutput_file = ["o"]\n',
            "'o' is not a flag name",
        ),
        (
            '[clients.x]\nscripts = ["g.py"]\nresume = "flag"\n'
            '[clients.x.flags]\noutput_file = ["--o"]\n',
            "clients.x.flags.resume: required when resume = 'flag'",
        ),
        (
            '[clients.x]\nscripts = ["g.py"]\n[clients.x.flags]\nsamples = ["--n"]\n',
            "clients.x.flags: name either output_file",
        ),
        (
            '[clients.x]\nscripts = ["g.py"]\nsidecars = {error = "err.jsonl"}\n'
            '[clients.x.flags]\noutput_file = ["--o"]\n',
            "clients.x.sidecars.error: expected a file name with {stem}",
        ),
        (
            '[clients.x.flags]\noutput_file = ["--o"]\n',
            "clients.x.scripts: required key is missing",
        ),
    ],
)
def test_bad_user_profiles_are_errors_naming_the_key(
    tmp_path: Path, body: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, body))
    assert message in str(err.value)


def test_a_run_naming_an_unknown_client_is_an_error(tmp_path: Path) -> None:
    body = f"""
[[runs]]
name = "r"
host = "here"
workdir = "{tmp_path}"
argv = ["python", "x.py"]
client = "specforg"
"""
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, body))
    assert "runs[0].client: unknown client 'specforg'" in str(err.value)
    assert "specforge" in str(err.value)


def test_clients_command_lists_what_each_profile_knows(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        '[clients.mygen]\nscripts = ["gen.py"]\n'
        'value_types = { "--n" = "int", "--mode" = ["a", "b"] }\n'
        '[clients.mygen.flags]\noutput_file = ["--out"]\n',
    )
    result = CliRunner().invoke(cli, ["clients", "-c", str(cfg), "--json"])
    assert result.exit_code == 0, result.output
    data = {c["name"]: c for c in json.loads(result.output)["clients"]}
    assert set(data) == {"run_inference", "specforge", "modelopt", "mygen"}
    assert data["specforge"]["layout"] == "single-file"
    assert data["specforge"]["resume"] == "flag"
    assert data["specforge"]["budget_flag"] is None
    assert data["run_inference"]["budget_flag"] == "--token-budget"
    assert data["mygen"]["source"] == str(cfg)
    assert data["specforge"]["value_types"]["--reasoning"] == ["none", "save", "disable"]
    assert data["modelopt"]["value_types"]["--num_threads"] == "int"
    assert data["mygen"]["value_types"] == {"--n": "int", "--mode": ["a", "b"]}
    text = CliRunner().invoke(cli, ["clients", "-c", str(cfg)])
    assert text.exit_code == 0
    assert "OVERWRITES its output unless given --resume" in text.output
    assert "no budget flag" in text.output
    assert "    --reasoning: one of none/save/disable" in text.output
    assert "    float: --temperature, --top-p, --repetition-penalty" in text.output
    assert "    --mode: one of a/b" in text.output
