"""One model identity (row A13 of ``docs/reliability.md``): a start over data made under one model
id continues it under the same id written in another case (SGLang's ``moonshotai/Kimi-K2.5``,
OpenRouter's ``moonshotai/kimi-k2.5``) or under a name the config's ``aliases`` groups with it, and
says so; any other model is refused before the stop, naming both ways out. A real launch
writes the fingerprint, the later restarts are checked against it by the real gate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.errors import ConfigError
from tests.fixtures_actions import DemoRun, launch, restart, why

pytestmark = pytest.mark.usefixtures("state_home")

SGLANG = "moonshotai/Kimi-K2.5"


def _fingerprint_step(demo: DemoRun, model: str) -> Any:
    async def go() -> Any:
        async with Engine(demo.config) as engine:
            return await restart(engine, "demo", [f"model={model}"], dry_run=True)

    result = asyncio.run(go())
    return next(s for s in result.steps if s.name == "fingerprint")


def test_a13_a_model_id_in_another_case_or_an_alias_is_the_same_model(
    tmp_path: Path, slow_endpoint: Any, kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, datasets=("B1",), max_samples=300)
    kill_runs_in.append(demo.workdir)

    async def first() -> Any:
        async with Engine(demo.config) as engine:
            return await launch(engine, "demo", [f"model={SGLANG}"])

    launched = asyncio.run(first())
    assert launched.ok, why(launched)
    same = _fingerprint_step(demo, "moonshotai/kimi-k2.5")
    assert same.state == "ok", same.detail
    assert "the same model (model ids differ only in case)" in same.detail, same.detail
    other = _fingerprint_step(demo, "kimi-k2.5-openrouter")
    assert other.state == "failed", other.detail
    assert "not one model by case or the config's aliases" in other.detail, other.detail
    assert "aliases" in other.detail.split("->", 2)[-1], other.detail  # the hint names them
    text = demo.config_path.read_text()
    demo.config_path.write_text(f'aliases = [["{SGLANG}", "kimi-k2.5-openrouter"]]\n' + text)
    aliased = _fingerprint_step(demo, "kimi-k2.5-openrouter")
    assert aliased.state == "ok", aliased.detail
    assert f"the same model (aliases '{SGLANG}' = 'kimi-k2.5-openrouter')" in aliased.detail, (
        aliased.detail
    )


@pytest.mark.parametrize(
    ("aliases", "wrong"),
    [
        ('[["only-one"]]', "two names or more"),
        ('[["a", "b"], ["B", "c"]]', r"'b' is in aliases\[0\] too"),
    ],
)
def test_a13_the_aliases_key_is_checked(tmp_path: Path, aliases: str, wrong: str) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")
    demo.config_path.write_text(f"aliases = {aliases}\n" + demo.config_path.read_text())
    with pytest.raises(ConfigError, match=wrong):
        load_config(demo.config_path)
