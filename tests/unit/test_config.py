"""Config loading: every kind of mistake gives one message naming the file, the key and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.agent.argflags import value as flag_value
from supervisor.config import Config, load_config
from supervisor.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

GOOD = """
tokenizer = "/models/tok"
[[hosts]]
name = "gpu-box"
address = "gpu-box"
[[hosts]]
name = "laptop"
local = true
[[runs]]
name = "eagle3-b"
host = "gpu-box"
workdir = "/data/eagle3"
argv = ["python3", "run_inference.py", "--datasets", "B1,B2", "--max-samples", "7000"]
endpoint = "openrouter"
[datasets.B2]
token_budget = 10_000_000
max_samples = 7000
[[endpoints]]
name = "openrouter"
kind = "api"
base_url = "https://openrouter.ai/api/v1"
api_key_env = "OPENROUTER_API_KEY"
price_in_per_m = 0.60
price_out_per_m = 2.50
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "x.toml"
    p.write_text(text)
    return p


def error_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p, env=env or {})
    message = str(info.value)
    assert message.startswith(f"{p}: "), message
    return message[len(str(p)) + 2 :]


def test_good_config_is_typed(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), env={})
    assert isinstance(config, Config)
    assert config.trust_remote_code is False
    assert config.host("laptop").local is True
    run = config.run("eagle3-b")
    assert run.output_dir is None and run.format == "raw" and run.budget_policy == "warn"
    assert config.run_datasets(run) == ["B1", "B2"]
    assert config.datasets["B2"].token_budget == 10_000_000
    assert config.endpoint("openrouter").price_out_per_m == 2.50
    assert "run_inference.py" in config.scripts


def test_wrong_type_names_key_and_expected_type(tmp_path: Path) -> None:
    text = GOOD.replace(
        'argv = ["python3", "run_inference.py", "--datasets", "B1,B2", "--max-samples", "7000"]',
        'argv = "python3 run_inference.py"',
    )
    assert error_of(tmp_path, text) == "runs[0].argv: expected a non-empty list of strings, got str"


def test_unknown_key_is_rejected_with_the_allowed_keys(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace('kind = "api"', 'kind = "api"\nprice_per_m = 1'))
    assert message.startswith("endpoints[0].price_per_m: unknown key (allowed: name, kind,")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    assert error_of(tmp_path, "refresh = 2\n" + GOOD).startswith("refresh: unknown key")


def test_missing_required_key(tmp_path: Path) -> None:
    text = GOOD.replace('workdir = "/data/eagle3"\n', "")
    assert error_of(tmp_path, text) == "runs[0].workdir: required key is missing"


def test_bad_literal(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace('kind = "api"', 'kind = "cloud"'))
    assert message.startswith("endpoints[0].kind: "), message
    assert "local" in message and "api" in message


def test_dangling_host_reference(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace('host = "gpu-box"', 'host = "gpu-bx"'))
    assert message.startswith("runs[0].host: no host named 'gpu-bx'")
    assert "gpu-box" in message


def test_dangling_endpoint_reference(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace('endpoint = "openrouter"', 'endpoint = "nope"'))
    assert message.startswith("runs[0].endpoint: no endpoint named 'nope'")


def test_duplicate_names(tmp_path: Path) -> None:
    text = GOOD.replace('name = "laptop"', 'name = "gpu-box"')
    assert error_of(tmp_path, text) == "hosts[1].name: duplicate name 'gpu-box'"


def test_unknown_format(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace('endpoint = "openrouter"', 'format = "rawx"'))
    assert message.startswith("runs[0].format: unknown format 'rawx'")


def test_api_key_itself_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace('"OPENROUTER_API_KEY"', '"sk-or-v1-abc123"')
    message = error_of(tmp_path, text)
    assert message.startswith("endpoints[0].api_key_env: expected the NAME of an environment")


def test_negative_budget(tmp_path: Path) -> None:
    text = GOOD.replace("token_budget = 10_000_000", "token_budget = -5")
    assert error_of(tmp_path, text) == "datasets.B2.token_budget: expected an integer >= 1, got -5"


def test_bad_port(tmp_path: Path) -> None:
    text = GOOD.replace('address = "gpu-box"', 'address = "gpu-box"\nport = 70000')
    assert (
        error_of(tmp_path, text) == "hosts[0].port: expected an integer from 1 to 65535, got 70000"
    )


def test_invalid_toml(tmp_path: Path) -> None:
    assert error_of(tmp_path, "[[hosts]\nname=").startswith("invalid TOML: ")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.toml")


def test_env_expansion_and_undefined_variable(tmp_path: Path) -> None:
    text = GOOD.replace('workdir = "/data/eagle3"', 'workdir = "${DEMO_DIR}/w"')
    config = load_config(write(tmp_path, text), env={"DEMO_DIR": "/tmp/d"})
    assert config.run("eagle3-b").workdir == "/tmp/d/w"
    assert error_of(tmp_path, text) == "runs[0].workdir: environment variable DEMO_DIR is not set"


def test_user_format_needs_exactly_one_token_source(tmp_path: Path) -> None:
    text = GOOD + '\n[formats.mine]\nid_field = "uid"\ntokens_field = "n"\ntext_field = "t"\n'
    assert error_of(tmp_path, text).startswith("formats.mine: set exactly one of")


def test_user_format_roles_need_a_text_field(tmp_path: Path) -> None:
    text = (
        GOOD + '\n[formats.mine]\nid_field = "uid"\ntokens_field = "n"\ntext_role = "assistant"\n'
    )
    assert error_of(tmp_path, text).startswith("formats.mine: text_role and reasoning_keys apply")
    good = GOOD + '\n[formats.q]\nid_field = "id"\ntext_field = "messages"\n'
    config = load_config(write(tmp_path, good + 'text_role = ["assistant", "tool"]\n'))
    assert config.formats["q"].text_role == ["assistant", "tool"]


def test_flag_value_forms() -> None:
    argv = ["x", "--max-samples", "5", "--token-budget=10", "--max-samples", "7"]
    assert flag_value(argv, "--max-samples") == "7"
    assert flag_value(argv, "--token-budget") == "10"
    assert flag_value(argv, "--concurrency") is None


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.toml")))
def test_shipped_configs_load(name: str) -> None:
    env = {
        k: f"/tmp/{k.lower()}"
        for k in (
            "RUNWATCH_DEMO_DIR",
            "RUNWATCH_DEMO_LOCAL_URL",
            "RUNWATCH_DEMO_API_URL",
            "RUNWATCH_DEMO_LOCAL_ADDRESS",
            "RUNWATCH_DEMO_PYTHON",
            "RUNWATCH_DEMO_CLIENT",
            "RUNWATCH_DEMO_TOKENIZER",
        )
    }
    config = load_config(REPO / "configs" / name, env=env)
    assert config.runs, "a shipped config with no run shows nothing"


def test_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace('kind = "api"', 'kind = "api"\nbogus = 1'))
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "-c", str(p), "status"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{p}: endpoints[0].bogus: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr
