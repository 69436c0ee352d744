"""Record formats: detection on realistic samples of each profile, user profiles, and the agent
bundle constraints (standard library only, Python 3.8 syntax)."""

from __future__ import annotations

import ast
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

import supervisor.agent.completeness as completeness
import supervisor.agent.follow as follow
import supervisor.agent.formats as formats
import supervisor.agent.idset as idset
import supervisor.agent.promptlengths as promptlengths
import supervisor.agent.safefs as safefs
import supervisor.agent.scan as scan
from supervisor.agent.formats import (
    BUILTIN_FORMATS,
    PROFILES,
    detect,
    get_profile,
    profile_from_dict,
)
from supervisor.agent.scan import Scanner
from supervisor.config import FormatProfile
from tests.fixtures_data import (
    dump,
    legacy_record,
    modelopt_record,
    query_record,
    raw_record,
    specforge_record,
    speculators_record,
)

RNG = random.Random(50)


def test_builtin_names_match_profiles() -> None:
    assert set(BUILTIN_FORMATS) == set(PROFILES)


@pytest.mark.parametrize(
    ("name", "record"),
    [
        ("raw", raw_record(RNG, "a")),
        ("raw-legacy", legacy_record(RNG, "a")),
        ("specforge", specforge_record(RNG, "a")),
        ("modelopt", modelopt_record(RNG, "a")),
        ("speculators", speculators_record(RNG, "a")),
    ],
)
def test_detect_each_profile(name: str, record: dict[str, Any]) -> None:
    found = detect(record)
    assert found is not None and found.name == name


def test_detect_unknown_record() -> None:
    assert detect({"prompt": "x", "answer": "y"}) is None


def test_raw_file_detected_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "raw_responses.jsonl"
    recs = [raw_record(RNG, f"r{i}") for i in range(20)]
    path.write_bytes(b"".join(dump(r) for r in recs))
    r = Scanner().scan(str(path), validate="all")
    assert (r["format"], r["verdict"], r["token_source"]) == ("raw", "current", "field")
    assert r["completion_tokens"] == sum(len(x["output_ids"]) for x in recs)


def test_specforge_texts_for_the_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "regenerated.jsonl"
    recs = [specforge_record(RNG, f"sf{i}") for i in range(15)]
    path.write_bytes(b"".join(dump(r) for r in recs))
    r = Scanner().scan(str(path))
    assert (r["format"], r["verdict"], r["token_source"]) == ("specforge", "current", "tokenizer")
    assert r["records"] == 15
    assert r["completion_tokens"] == 0  # counted on the laptop from the texts
    assert r["texts"] == [x["conversations"][-1]["content"] for x in recs]
    statuses: dict[str, int] = {}
    for x in recs:
        statuses[x["status"]] = statuses.get(x["status"], 0) + 1
    assert r["finish_reasons"] == statuses


def test_texts_are_handed_back_once_and_bounded_per_call(tmp_path: Path) -> None:
    path = tmp_path / "regenerated.jsonl"
    recs = [specforge_record(RNG, f"sf{i}") for i in range(200)]
    path.write_bytes(b"".join(dump(r) for r in recs))
    scanner = Scanner(max_text_bytes=300)
    texts: list[str] = []
    calls = 0
    while True:
        r = scanner.scan(str(path))
        texts += r["texts"]
        calls += 1
        assert len(r["texts"]) <= 300 // 10 + 1
        if not r["texts_more"]:
            break
        assert r["partial_tail_bytes"] == 0
    assert calls > 5
    assert texts == [x["conversations"][-1]["content"] for x in recs]
    assert r["records"] == 200
    assert scanner.scan(str(path))["texts"] == []
    without = Scanner().scan(str(path), texts=False)
    assert without["texts"] == [] and without["texts_records"] == 200


def test_modelopt_finished_marker(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    recs = [modelopt_record(RNG, f"c{i}", truncated=i % 4 == 0) for i in range(12)]
    path.write_bytes(b"".join(dump(r) for r in recs))
    r = Scanner().scan(str(path))
    assert (r["format"], r["verdict"], r["finished"]) == ("modelopt", "current", False)
    assert r["finish_reasons"] == {"truncated": 3, "complete": 9}
    with path.open("ab") as f:
        f.write(dump({"finished": True}))
    r = Scanner().scan(str(path))
    assert (r["records"], r["finished"], r["bad_lines"], r["verdict"]) == (12, True, [], "current")


def test_speculators_counts_from_usage_and_validates_arrays(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    recs = [speculators_record(RNG, f"v{i}") for i in range(10)]
    bad = speculators_record(RNG, "broken")
    bad["loss_mask"] = bad["loss_mask"][:-1]
    path.write_bytes(b"".join(dump(r) for r in recs) + dump(bad))
    r = Scanner().scan(str(path), validate="all")
    assert (r["format"], r["verdict"]) == ("speculators", "corrupt")
    assert r["records"] == 10
    assert r["completion_tokens"] == sum(x["metadata"]["usage"]["completion_tokens"] for x in recs)
    assert r["prompt_tokens"] == sum(x["metadata"]["usage"]["prompt_tokens"] for x in recs)
    assert "input_ids has" in r["bad_lines"][0]["reason"]
    assert r["bad_lines"][0]["line"] == 11


def test_user_profile_from_config(tmp_path: Path) -> None:
    prof = FormatProfile(
        id_field="uid",
        tokens_field="usage.output_tokens",
        prompt_tokens_field="usage.input_tokens",
        finish_reason_field="stop",
    )
    import msgspec

    as_dict = msgspec.to_builtins(prof)
    path = tmp_path / "mine.jsonl"
    recs = [
        {
            "uid": i % 5,
            "answer": "x",
            "usage": {"input_tokens": 3, "output_tokens": i},
            "stop": "eos",
        }
        for i in range(9)
    ]
    path.write_bytes(b"".join(dump(x) for x in recs))
    r = Scanner().scan(str(path), fmt="mine", profile=as_dict)
    assert (r["format"], r["verdict"]) == ("mine", "current")
    assert (r["records"], r["unique_ids"], r["duplicates"]) == (9, 5, 4)
    assert (r["completion_tokens"], r["prompt_tokens"]) == (36, 27)
    assert r["finish_reasons"] == {"eos": 9}


def test_user_profile_with_a_token_list(tmp_path: Path) -> None:
    p = profile_from_dict("toks", {"id_field": "k", "tokens_list_field": "tokens"})
    assert p.big_lists == ("tokens",) and p.token_source == "list"
    path = tmp_path / "t.jsonl"
    recs = [{"k": f"k{i}", "tokens": list(range(i))} for i in range(7)]
    path.write_bytes(b"".join(dump(x) for x in recs))
    for validate in ("none", "sample", "all"):
        r = Scanner().scan(
            str(path),
            fmt="toks",
            profile={"id_field": "k", "tokens_list_field": "tokens"},
            validate=validate,
        )
        assert r["completion_tokens"] == sum(range(7)), validate


def test_user_profile_with_text_for_the_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(dump({"q": 1, "out": "hello world"}) + dump({"q": 2, "out": "bye"}))
    r = Scanner().scan(str(path), fmt="t", profile={"id_field": "q", "text_field": "out"})
    assert r["texts"] == ["hello world", "bye"] and r["token_source"] == "tokenizer"


def test_profile_errors() -> None:
    with pytest.raises(ValueError, match="unknown format 'nope'"):
        get_profile("nope")
    with pytest.raises(ValueError, match="id_field"):
        profile_from_dict("x", {"tokens_field": "n"})


def test_expected_format_applies_to_auto_detected_files(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(dump(specforge_record(RNG, "a")) + dump(raw_record(RNG, "b")))
    r = Scanner().scan(str(path))
    assert (r["expected"], r["verdict"]) == ("specforge", "mixed")
    assert r["first_offending"]["format"] == "raw"


# --------------------------------------------------------------------------- agent bundle


@pytest.mark.parametrize("module", [formats, follow, completeness, idset, promptlengths, scan])
def test_agent_modules_parse_as_python_38(module: Any) -> None:
    source = Path(module.__file__).read_text()
    ast.parse(source, feature_version=(3, 8))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Match):  # pragma: no cover - the parse above already fails
            pytest.fail("match statement")


@pytest.mark.parametrize("module", [formats, follow, scan])
def test_agent_modules_import_only_the_standard_library(module: Any) -> None:
    tree = ast.parse(Path(module.__file__).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    for name in names:
        top = name.split(".")[0]
        if top == "supervisor":
            assert name in (
                "supervisor.agent",  # ``from supervisor.agent import safefs``
                "supervisor.agent.formats",
                "supervisor.agent.follow",
                "supervisor.agent.completeness",
                "supervisor.agent.idset",
                "supervisor.agent.promptlengths",
                "supervisor.agent.safefs",
            ), name
        else:
            assert top in sys.stdlib_module_names or top == "__future__", name


def _python38() -> str | None:
    import glob
    import shutil

    found = shutil.which("python3.8") or next(
        iter(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python")))), None
    )
    return found


@pytest.mark.parametrize("python", ["current", "3.8"])
def test_agent_modules_load_from_source_alone(tmp_path: Path, python: str) -> None:
    """As the agent loader does: register the scanner's modules (and ``safefs``, through which
    they open files) from their text, nothing else; on the
    oldest Python the agent supports too, when this machine has one."""
    import subprocess

    exe = sys.executable if python == "current" else _python38()
    if exe is None:
        pytest.skip("no Python 3.8 interpreter on this machine (python3.8 or pyenv 3.8.x)")

    code = (
        "import sys, types, json\n"
        "for name, path in json.loads(sys.argv[1]):\n"
        "    m = types.ModuleType(name); sys.modules[name] = m\n"
        "    exec(compile(open(path).read(), path, 'exec'), m.__dict__)\n"
        "r = sys.modules['supervisor.agent.scan'].Scanner(chunk_size=5).scan(sys.argv[2], "
        "validate='all')\n"
        "print(json.dumps([r['records'], r['completion_tokens'], r['bad_lines_total']]))\n"
    )
    path = tmp_path / "r.jsonl"
    recs = [raw_record(RNG, f"z{i}") for i in range(5)]
    path.write_bytes(b"".join(dump(r) for r in recs) + b"bad\n")
    mods = json.dumps(
        [
            ["supervisor", "/dev/null"],
            ["supervisor.agent", "/dev/null"],
            ["supervisor.agent.safefs", safefs.__file__],
            ["supervisor.agent.formats", formats.__file__],
            ["supervisor.agent.follow", follow.__file__],
            ["supervisor.agent.idset", idset.__file__],
            ["supervisor.agent.completeness", completeness.__file__],
            ["supervisor.agent.promptlengths", promptlengths.__file__],
            ["supervisor.agent.scan", scan.__file__],
        ]
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, mods, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert json.loads(out) == [5, sum(r["completion_tokens"] for r in recs), 1]


def test_specforge_error_and_skipped_files_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "regenerated.jsonl"
    path.write_bytes(b"".join(dump(specforge_record(RNG, f"s{i}")) for i in range(4)))
    (tmp_path / "regenerated_error.jsonl").write_bytes(b'{"id": "a"}\n{"id": "b"}\n')
    (tmp_path / "skipped.jsonl").write_bytes(b'{"id": "c"}\n')
    (tmp_path / "notes.txt").write_bytes(b"x\n")
    scanner = Scanner()
    r = scanner.scan(str(path))
    assert r["companions"] == [
        {"path": str(tmp_path / "regenerated_error.jsonl"), "kind": "error", "lines": 2},
        {"path": str(tmp_path / "skipped.jsonl"), "kind": "skipped", "lines": 1},
    ]
    with (tmp_path / "skipped.jsonl").open("ab") as f:
        f.write(b'{"id": "d"}\n')
    assert [c["lines"] for c in scanner.scan(str(path))["companions"]] == [2, 2]


def test_unknown_records_before_the_first_known_one_make_it_mixed(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(
        dump({"prompt": "p"}) + dump(raw_record(RNG, "a")) + dump(raw_record(RNG, "b"))
    )
    r = Scanner().scan(str(path))
    assert (r["expected"], r["verdict"]) == ("raw", "mixed")
    assert r["first_offending"] == {
        "line": 1,
        "offset": 0,
        "format": None,
        "missing": [
            "sample_id",
            "output_ids",
            "prompt_tokens",
            "completion_tokens",
            "finish_reason",
        ],
        "extra": ["prompt"],
    }


def test_user_format_counts_only_the_text_role_of_messages(tmp_path: Path) -> None:
    """A format of chat messages (Model-Optimizer query.py's output) counts the assistant turns
    only, their reasoning apart when named: the prompts are not completion tokens."""
    import msgspec

    rows = [query_record(RNG, f"c{i}", thinking=i % 2 == 1) for i in range(12)]
    path = tmp_path / "train-00001-00004.jsonl"
    path.write_bytes(b"".join(dump(r) for r in rows))
    prof = FormatProfile(id_field="conversation_id", text_field="messages", text_role="assistant")
    r = Scanner().scan(str(path), fmt="query", profile=msgspec.to_builtins(prof))
    answers = [m["content"] for x in rows for m in x["messages"] if m["role"] == "assistant"]
    assert (r["format"], r["verdict"], r["records"]) == ("query", "current", 12)
    assert r["texts"] == answers
    several = {"id_field": "conversation_id", "text_field": "messages"}
    tools = [{"role": "tool", "content": "result"}, {"role": "reasoning", "content": "hidden"}]
    path.write_bytes(dump({**rows[0], "messages": rows[0]["messages"] + tools}))
    r = Scanner().scan(str(path), fmt="q", profile={**several, "text_role": ["assistant", "tool"]})
    assert r["texts"] == [
        *(m["content"] for m in rows[0]["messages"] if m["role"] == "assistant"),
        "result",
    ]
    with_reasoning = {"role": "assistant", "content": "a", "reasoning_content": "r"}
    path.write_bytes(dump({"conversation_id": 1, "messages": [with_reasoning]}))
    prof = FormatProfile(
        id_field="conversation_id",
        text_field="messages",
        text_role="assistant",
        reasoning_keys=["reasoning_content"],
    )
    r = Scanner().scan(str(path), fmt="q", profile=msgspec.to_builtins(prof))
    assert (r["texts"], r["reasoning_texts"]) == (["a"], ["r"])
