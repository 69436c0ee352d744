"""``runwatch scan`` and ``runwatch check`` through the real command line."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli import cli
from supervisor.errors import RunwatchError
from tests.fixtures_config import write_local_config
from tests.fixtures_data import (
    dump,
    legacy_record,
    make_raw,
    modelopt_record,
    query_record,
    raw_record,
    specforge_record,
)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    for name in ("B1", "B2"):
        (out / name).mkdir(parents=True)
    return out


def run(*args: str) -> tuple[int, str]:
    """Invoke the CLI in-process; a RunwatchError becomes its exit status, as ``main`` does."""
    result = CliRunner().invoke(cli, list(args))
    if isinstance(result.exception, RunwatchError):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_scan_directory_json_has_exact_numbers(out_dir: Path) -> None:
    t1 = make_raw(out_dir / "B1" / "raw_responses.jsonl", 120, seed=1, dup_every=10)
    t2 = make_raw(out_dir / "B2" / "raw_responses.jsonl", 40, seed=2)
    code, text = run("scan", str(out_dir), "--json")
    assert code == 0
    files = json.loads(text)["files"]
    assert [Path(f["path"]).parent.name for f in files] == ["B1", "B2"]
    for f, truth in zip(files, (t1, t2), strict=True):
        truth.check(f)
        assert set(f) >= {
            "path",
            "format",
            "verdict",
            "records",
            "unique_ids",
            "duplicates",
            "prompt_tokens",
            "completion_tokens",
            "finish_reasons",
            "bad_lines",
            "partial_tail_bytes",
        }
        assert (f["format"], f["verdict"], f["bad_lines"]) == ("raw", "current", [])


def test_scan_text_is_human(out_dir: Path) -> None:
    rng = random.Random(3)
    path = out_dir / "B1" / "raw_responses.jsonl"
    recs = [raw_record(rng, f"s{i}", tokens=3000) for i in range(400)]
    path.write_bytes(b"".join(dump(r) for r in recs) + b"oops\n" + b'{"sample_id": "t')
    code, text = run("scan", str(path))
    assert code == 0
    assert "raw  corrupt" in text
    assert "400 records · 1.2 M completion tokens" in text
    assert "bad line 401 (offset " in text
    assert "partial last line: 16 bytes (not counted)" in text


def test_scan_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    for args in (["--json"], []):
        code, text = run("scan", str(tmp_path / "nope.jsonl"), *args)
        assert code == 2
        assert f"{tmp_path / 'nope.jsonl'}: no such file or directory" in text
        assert "-> give a data file" in text


def test_scan_empty_directory_is_a_usage_error(tmp_path: Path) -> None:
    code, text = run("scan", str(tmp_path))
    assert code == 2
    assert "no dataset files found" in text


def test_scan_counts_tokenizer_formats_with_tokenizer(tmp_path: Path, demo_tokenizer: Path) -> None:
    from supervisor.tokens import count_tokens, load_tokenizer

    tok_dir = demo_tokenizer  # the session's build of the demo tokenizer, loaded once per process
    rng = random.Random(4)
    recs = [specforge_record(rng, f"sf{i}") for i in range(30)]
    path = tmp_path / "regen.jsonl"
    path.write_bytes(b"".join(dump(r) for r in recs))
    tok = load_tokenizer(tok_dir)
    want = sum(count_tokens(tok, [r["conversations"][-1]["content"] for r in recs]))
    assert want > 0
    code, text = run("scan", str(path), "--tokenizer", str(tok_dir), "--json")
    assert code == 0
    (f,) = json.loads(text)["files"]
    assert (f["format"], f["completion_tokens"], f["records"]) == ("specforge", want, 30)
    code, text = run("scan", str(path), "--json")
    assert json.loads(text)["files"][0]["completion_tokens"] is None
    code, text = run("scan", str(path))
    assert "completion tokens not counted (pass --tokenizer DIR)" in text


def test_check_passes_on_clean_files(out_dir: Path) -> None:
    make_raw(out_dir / "B1" / "raw_responses.jsonl", 30, seed=5)
    make_raw(out_dir / "B2" / "raw_responses.jsonl", 30, seed=6)
    code, text = run("check", str(out_dir), "--format", "raw")
    assert code == 0, text
    assert text.count("ok    ") == 2 and "all files pass" in text


def test_check_fails_on_duplicate_ids_naming_the_count_and_the_first(out_dir: Path) -> None:
    """A client run again without its resume appends the same samples once more: the file's
    records are all well formed, and ``check`` names the duplicates instead of passing."""
    rng = random.Random(12)
    path = out_dir / "B1" / "raw_responses.jsonl"
    first = [raw_record(rng, f"s{i}") for i in range(200)]
    again = [raw_record(rng, f"s{i}") for i in (7, 3, 150)]
    path.write_bytes(b"".join(dump(r) for r in first + again))
    code, text = run("check", str(path), "--format", "raw")
    assert code == 1, text
    assert "all files pass" not in text and "check failed" in text
    assert (
        '3 duplicate ids (records whose id an earlier record has), first: "s7", "s3", "s150"'
        in text
    )
    code, text = run("check", str(path), "--json")
    (f,) = json.loads(text)["files"]
    assert code == 1 and (f["duplicates"], f["duplicate_ids"]) == (3, ["s7", "s3", "s150"])
    assert f["problems"] == [
        '3 duplicate ids (records whose id an earlier record has), first: "s7", "s3", "s150"'
    ]
    ints = out_dir / "B2" / "raw_responses.jsonl"
    ints.write_bytes(b"".join(dump(raw_record(rng, i % 4)) for i in range(6)))  # type: ignore[arg-type]
    code, text = run("check", str(ints), "--json")
    assert json.loads(text)["files"][0]["duplicate_ids"] == [0, 1]


def test_check_fails_on_mixed_format_naming_line_and_keys(out_dir: Path) -> None:
    rng = random.Random(7)
    path = out_dir / "B3.jsonl"
    body = b"".join(dump(raw_record(rng, f"a{i}")) for i in range(5))
    path.write_bytes(body + dump(legacy_record(rng, "old")) + dump(raw_record(rng, "z")))
    code, text = run("check", str(path), "--format", "raw")
    assert code == 1
    assert f"format mixed: line 6 (offset {len(body)}) is raw-legacy, not raw" in text
    assert "missing output_ids; extra text" in text
    code, text = run("check", str(path), "--json")
    data = json.loads(text)
    assert code == 1 and data["ok"] is False
    assert data["files"][0]["problems"][0].startswith("format mixed: line 6")


def test_check_directory_fails_when_its_files_differ_in_format(out_dir: Path) -> None:
    """A directory mixing raw and raw-legacy datasets must not pass file by file."""
    rng = random.Random(9)
    make_raw(out_dir / "B1" / "raw_responses.jsonl", 20, seed=10)
    make_raw(out_dir / "B2" / "raw_responses.jsonl", 20, seed=11)
    (out_dir / "B3").mkdir()
    legacy = out_dir / "B3" / "raw_responses.jsonl"
    legacy.write_bytes(b"".join(dump(legacy_record(rng, f"old{i}")) for i in range(5)))
    code, text = run("check", str(out_dir))
    assert code == 1, text
    assert f"FAIL  {legacy}" in text
    assert "format raw-legacy, while the other files are raw" in text
    assert text.count("ok    ") == 2
    code, text = run("check", str(out_dir), "--format", "raw")  # said which: judged against it
    assert code == 1 and "format legacy: records are raw-legacy, expected raw" in text
    code, text = run("scan", str(out_dir))
    assert code == 0 and "! format raw-legacy, while the other files are raw" in text


def test_check_fails_on_corrupt_line_and_torn_tail(out_dir: Path) -> None:
    path = out_dir / "B1" / "raw_responses.jsonl"
    make_raw(path, 10, seed=8)
    with path.open("ab") as f:
        f.write(b"\x00" * 100 + b"\n" + b'{"sample_id": "x", "outp')
    code, text = run("check", str(path))
    assert code == 1
    assert "1 bad line, first at line 11" in text and "NUL bytes" in text
    assert "partial last line (24 bytes)" in text


def test_check_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    code, text = run("check", str(tmp_path / "x" / "raw_responses.jsonl"))
    assert code == 2
    assert "raw_responses.jsonl: no such file or directory" in text


def test_check_run_from_config(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    (work / "out" / "B2").mkdir(parents=True)
    make_raw(work / "out" / "B1" / "raw_responses.jsonl", 25, seed=9)
    rng = random.Random(10)
    (work / "out" / "B2" / "raw_responses.jsonl").write_bytes(
        b"".join(dump(legacy_record(rng, f"l{i}")) for i in range(3))
    )
    cfg = write_local_config(
        tmp_path / "runwatch.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = ["python3", "run_inference.py", "--datasets", "B1,B2,B3"]
format = "raw"
""",
        python=True,
    )
    code, text = run("-c", str(cfg), "check", "gen")
    assert code == 1, text
    assert "format legacy: records are raw-legacy, expected raw" in text
    assert "not started" in text  # B3 has no file yet: not a problem
    assert "B1/raw_responses.jsonl  raw current, 25 records" in text
    (work / "out" / "B2" / "raw_responses.jsonl").unlink()
    code, text = run("-c", str(cfg), "check", "gen", "--json")
    assert code == 0, text
    assert json.loads(text)["ok"] is True


def test_check_name_means_the_run_even_beside_a_directory_of_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    (work / "out" / "B1").mkdir(parents=True)
    make_raw(work / "out" / "B1" / "raw_responses.jsonl", 7, seed=3)
    cfg = write_local_config(
        tmp_path / "runwatch.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = ["python3", "run_inference.py", "--datasets", "B1"]
format = "raw"
""",
        python=True,
    )
    (tmp_path / "gen").mkdir()  # a directory here named as the run, with no data in it
    monkeypatch.chdir(tmp_path)
    code, text = run("-c", str(cfg), "check", "gen")
    assert code == 0, text
    assert "B1/raw_responses.jsonl  raw current, 7 records" in text
    code, text = run("-c", str(cfg), "check", "./gen")  # the directory, by its path
    assert code != 0 and "no dataset files found" in text, text


def test_check_unknown_run_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[hosts]]\nname = "h"\nlocal = true\n')
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "-c", str(cfg), "check", "nope"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "no run named 'nope'" in proc.stderr


def test_check_exit_status_through_the_entry_point(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"garbage\n")
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "check", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    make_raw(path, 3)
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "check", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_progress_goes_to_stderr_only_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import os
    import select

    import supervisor.cli.data as data

    path = tmp_path / "r.jsonl"
    make_raw(path, 200, seed=11)
    monkeypatch.setattr(data, "PROGRESS_MIN_BYTES", 0)
    master, slave = os.openpty()
    tty = io.TextIOWrapper(io.FileIO(slave, "w"), write_through=True)
    try:
        monkeypatch.setattr(sys, "stderr", tty)
        (r,) = data.scan_paths([str(path)], None, "sample", None)
        # A pty hands over what was written in pieces: read all of it that is there now.
        chunks = []
        while select.select([master], [], [], 0)[0]:
            chunks.append(os.read(master, 65536))
        shown = b"".join(chunks).decode()
    finally:
        tty.close()
        os.close(master)
    assert r["records"] == 200
    assert f"scanning {path}" in shown and "%" in shown
    assert shown.endswith("\r\x1b[K")
    not_a_tty = io.StringIO()
    monkeypatch.setattr(sys, "stderr", not_a_tty)  # not a terminal: nothing written
    data.scan_paths([str(path)], None, "sample", None)
    assert not_a_tty.getvalue() == ""


def test_scan_with_a_user_format_from_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[formats.mine]\nid_field = "uid"\ntokens_field = "n"\n')
    path = tmp_path / "mine.jsonl"
    path.write_bytes(b"".join(dump({"uid": i % 3, "n": i}) for i in range(6)))
    code, text = run("-c", str(cfg), "scan", str(path), "--format", "mine", "--json")
    assert code == 0, text
    (f,) = json.loads(text)["files"]
    assert (f["format"], f["verdict"], f["records"], f["unique_ids"], f["duplicates"]) == (
        "mine",
        "current",
        6,
        3,
        3,
    )
    assert f["completion_tokens"] == 15
    code, text = run("-c", str(cfg), "scan", str(path), "--format", "theirs")
    assert code == 2 and "unknown format 'theirs'" in text


def test_top_level_help_lists_each_command_in_full() -> None:
    code, text = run("--help")
    assert code == 0
    # Whole first sentences, wrapped, never cut with "...".
    assert "..." not in text.split("Commands:")[1]
    flat = " ".join(text.split())
    assert "scan Count records, ids, tokens and bad lines of dataset files (no config needed)" in (
        flat
    )
    assert "``" not in text and "Default: $RUNWATCH_CONFIG" in text


def test_unknown_format_without_a_config_names_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUNWATCH_CONFIG", raising=False)
    make_raw(tmp_path / "B1.jsonl", 3, seed=12)
    code, text = run("scan", "--format", "nope", str(tmp_path / "B1.jsonl"))
    assert code == 2
    assert "unknown format 'nope'" in text and "known formats: raw, raw-legacy" in text
    assert "no config" not in text


def test_scan_explain_says_what_each_field_was_read_as(tmp_path: Path) -> None:
    """``scan --format NAME FILE --explain`` on Model-Optimizer query.py output described by a
    user format, and on built-in formats: the id, the messages counted and not (with why), the
    token fields, the finish reason, and the lines that are not records."""
    rng = random.Random(13)
    config = tmp_path / "runwatch.toml"
    config.write_text(
        '[formats.query]\nid_field = "conversation_id"\ntext_field = "messages"\n'
        'text_role = "assistant"\n'
    )
    rows = [query_record(rng, f"c{i}", thinking=i == 1) for i in range(7)]
    path = tmp_path / "train-00001-00004.jsonl"
    path.write_bytes(b"".join(dump(r) for r in rows) + b'{"conversation_id": "c7", "mess')
    args = ["scan", "--format", "query", str(path), "--explain", "-c", str(config)]
    code, text = run(*args)
    assert code == 0, text
    assert text.splitlines()[0] == f"{path}  format query"
    assert "  line 1 (offset 0): record of format query" in text
    assert '    id             conversation_id = "c0"' in text
    assert (
        '      - [0] system: "You are a careful tutor."  (not counted: text_role is assistant)'
        in text
    )
    assert "(counted: its role is assistant)" in text
    assert "  line 5 (offset " in text and "  line 6 " not in text  # the first five records
    code, text = run(*args, "--json")
    (f,) = json.loads(text)["files"]
    first = f["lines"][0]
    assert (first["kind"], first["format"], first["fields"]["id"]["value"]) == (
        "record",
        "query",
        "c0",
    )
    tokens = first["fields"]["tokens"]
    roles = [(m["role"], m["counted"]) for m in tokens["messages"]]
    assert roles == [(m["role"], m["role"] == "assistant") for m in rows[0]["messages"]]
    assert tokens["counted"] == sum(m["role"] == "assistant" for m in rows[0]["messages"])
    assert len(f["lines"]) == 5

    raw = tmp_path / "raw_responses.jsonl"
    bad = {**raw_record(rng, "s1"), "completion_tokens": "12"}
    raw.write_bytes(dump(raw_record(rng, "s0", tokens=4, finish="length")) + b"\n" + dump(bad))
    code, text = run("scan", "--format", "raw", str(raw), "--explain", "--json")
    lines = json.loads(text)["files"][0]["lines"]
    assert [x["kind"] for x in lines] == ["record", "empty", "record"]
    fields = lines[0]["fields"]
    assert (fields["tokens"]["field"], fields["tokens"]["read_as"]) == ("completion_tokens", 4)
    assert fields["finish_reason"]["read_as"] == "length"
    assert lines[2]["fields"]["tokens"]["why"] == "is a string: a bad line"
    code, text = run("scan", str(raw), "--explain")
    assert "tokens         field: completion_tokens = 4 -> 4" in text
    mo = tmp_path / "generated.jsonl"
    mo.write_bytes(
        dump(modelopt_record(rng, "m0"))
        + dump({"conversation_id": 3})
        + dump({"finished": True})
        + b'{"conversation_id": 4, "conv'
    )
    code, text = run("scan", "--format", "modelopt", str(mo), "--explain", "--json")
    lines = json.loads(text)["files"][0]["lines"]
    assert [x["kind"] for x in lines] == ["record", "failed request", "end marker", "partial"]
    assert lines[0]["fields"]["finish_reason"]["read_as"] == "complete"
    old = tmp_path / "regen.jsonl"
    turns = [{"role": r, "content": f"{r} {i}"} for i, r in enumerate(["user", "assistant"] * 2)]
    old.write_bytes(dump({"id": "s0", "conversations": turns}))  # SpecForge before `status`
    code, text = run("scan", str(old), "--explain", "--json")
    messages = json.loads(text)["files"][0]["lines"][0]["fields"]["tokens"]["messages"]
    assert [m["counted"] for m in messages] == [False, False, False, True]
    assert messages[1]["why"] == (
        "not counted: the record has no 'status', so only its last such turn was generated"
    )
