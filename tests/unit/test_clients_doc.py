"""``docs/clients.md`` against the schema: every key a format or client profile table accepts
(read from the schema's types) has its row, every built-in format is described, and every
example config of the page loads."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from supervisor.agent.formats import BUILTIN_FORMATS
from supervisor.config import NOT_IN_FILE, load_config
from supervisor.configschema import ClientFlagNames, ClientProfile, FormatProfile

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
SECTIONS = {
    FormatProfile: "## Record formats: `[formats.NAME]`",
    ClientProfile: "## Client profiles: `[clients.NAME]`",
    ClientFlagNames: "### `[clients.NAME.flags]`",
}


def section(heading: str) -> str:
    """The text under ``heading`` up to the next heading of any level."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(heading + "\n") + len(heading)
    after = re.search(r"^#{1,6} ", text[start:], re.M)
    return text[start : start + after.start()] if after else text[start:]


@pytest.mark.parametrize("struct", list(SECTIONS), ids=lambda s: s.__name__)
def test_every_key_of_the_schema_has_its_row(struct: type[msgspec.Struct]) -> None:
    keys = [f.encode_name for f in msgspec.structs.fields(struct)]
    keys = [k for k in keys if k not in NOT_IN_FILE.get(struct, frozenset())]
    assert keys
    text = section(SECTIONS[struct])
    missing = [k for k in keys if f"\n| `{k}` | " not in text]
    assert missing == [], f"keys of {struct.__name__} without a row in {DOC.name}"


def test_every_built_in_format_is_described() -> None:
    text = section("## Built-in record formats")
    assert [f for f in BUILTIN_FORMATS if f"\n| `{f}` | " not in text] == []


def test_the_examples_load(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 3
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.toml"
        path.write_text(block)
        load_config(path, env={})
    config = load_config(path, env={})  # the worked example: a run of a described client
    run = config.run("regen")
    assert (run.format, config.clients[run.client or ""].sidecars) == (
        "speculators",
        {"error": "{stem}.errors.jsonl"},
    )
