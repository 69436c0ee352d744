"""The host's scan for client profiles: completeness (input ids against record ids), sidecar files
counted by reason, and reasoning texts handed back apart from the answers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from supervisor.agent.promptlengths import MAX_BYTES, PromptLengths
from supervisor.agent.scan import Scanner
from supervisor.completeness import completeness_line, completeness_view, sidecar_views


def _jsonl(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sf(i: int, reasoning: bool = False) -> dict[str, object]:
    answer: dict[str, object] = {"role": "assistant", "content": f"answer {i}"}
    if reasoning:
        answer["reasoning_content"] = f"thinking about {i}"
    return {
        "id": f"s{i}",
        "conversations": [{"role": "user", "content": f"q{i}"}, answer],
        "status": "success",
    }


def test_specforge_completeness_and_sidecars(tmp_path: Path) -> None:
    inp = _jsonl(tmp_path / "in.jsonl", [{"id": f"s{i}", "conversations": []} for i in range(10)])
    out = _jsonl(tmp_path / "regen.jsonl", [_sf(i) for i in (0, 1, 2, 3, 3)] + [_sf(99)])
    err = _jsonl(
        tmp_path / "regen_error.jsonl",
        [
            {"id": "s4", "status": "error", "error": "Connection refused"},
            {"id": "s5", "status": "error", "error": "Connection refused"},
            {"id": "s6", "status": "error", "error": "Data starts with an assistant message"},
        ],
    )
    sidecars = {"error": str(err), "skipped": str(tmp_path / "regen_skipped.jsonl")}
    scanner = Scanner()
    r = scanner.scan(
        str(out),
        fmt="specforge",
        sidecars=sidecars,
        input_file={"path": str(inp), "id": "id"},
    )
    c = r["completeness"]
    assert c["input"] == 10
    assert c["done"] == 4  # s0..s3 (s3 twice: a duplicate)
    assert c["duplicates"] == 1
    assert c["failed"] == 3  # s4, s5, s6 in the error file
    # s7..s9 come after the last row answered (s6): not attempted yet, not missing.
    assert c["missing"] == 0 and c["not_reached_first"] == ["s7", "s8", "s9"]
    assert c["not_in_input"] == 1 and c["not_in_input_first"] == ["s99"]
    assert r["sidecars"]["error"]["lines"] == 3
    assert r["sidecars"]["error"]["reasons"] == {
        "Connection refused": 2,
        "Data starts with an assistant message": 1,
    }
    assert r["sidecars"]["skipped"]["state"] == "missing"
    view = completeness_view(r)
    assert view is not None
    line = completeness_line(view)
    assert "4 / 10 done" in line and "3 failed" in line and "3 not attempted yet" in line
    assert "missing" not in line
    kinds = [s.kind for s in sidecar_views(r)]
    assert kinds == ["error", "skipped"]

    # Incremental: one more error row and one more record are read, nothing twice.
    with err.open("a") as f:
        f.write(json.dumps({"id": "s7", "status": "error", "error": "timeout"}) + "\n")
        f.write('{"id": "s8", "status": "err')  # a partial line waits
    with out.open("a") as f:
        f.write(json.dumps(_sf(9)) + "\n")
    r = scanner.scan(
        str(out), fmt="specforge", sidecars=sidecars, input_file={"path": str(inp), "id": "id"}
    )
    assert r["sidecars"]["error"]["lines"] == 4
    assert r["sidecars"]["error"]["reasons"]["timeout"] == 1
    assert r["completeness"]["done"] == 5
    assert r["completeness"]["failed"] == 4
    assert r["completeness"]["missing_first"] == ["s8"]


def test_modelopt_completeness_by_row_index(tmp_path: Path) -> None:
    inp = _jsonl(tmp_path / "in.jsonl", [{"conversations": []} for _ in range(5)])
    rows = [
        {"conversation_id": i, "conversations": [{"role": "assistant", "content": "x"}]}
        for i in (0, 2, 4)
    ]
    out = _jsonl(tmp_path / "out.jsonl", [*rows, {"finished": True}])
    r = Scanner().scan(str(out), fmt="modelopt", input_file={"path": str(inp), "id": ""})
    c = r["completeness"]
    assert (c["input"], c["done"], c["missing"], c["missing_first"]) == (5, 3, 2, [1, 3])
    assert r["finished"] is True


def test_input_rows_without_the_id_say_so(tmp_path: Path) -> None:
    inp = _jsonl(tmp_path / "in.jsonl", [{"conversations": []}])
    out = _jsonl(tmp_path / "regen.jsonl", [_sf(0)])
    r = Scanner().scan(str(out), fmt="specforge", input_file={"path": str(inp), "id": "id"})
    assert r["completeness"]["error"] == "input line 1 has no 'id'"
    view = completeness_view(r)
    assert view is not None and "completeness unknown" in completeness_line(view)


def test_reasoning_texts_are_handed_back_apart(tmp_path: Path) -> None:
    out = _jsonl(tmp_path / "regen.jsonl", [_sf(0, reasoning=True), _sf(1)])
    r = Scanner().scan(str(out), fmt="specforge")
    assert r["texts"] == ["answer 0", "answer 1"]
    assert r["reasoning_texts"] == ["thinking about 0"]


def test_reasoning_tokens_are_part_of_completion_and_shown_apart(tmp_path: Path) -> None:
    from supervisor import rates

    out = _jsonl(tmp_path / "regen.jsonl", [_sf(0, reasoning=True), _sf(1)])
    scan = Scanner().scan(str(out), fmt="specforge")
    words = lambda texts: sum(len(t.split()) for t in texts)  # noqa: E731 - a stand-in tokenizer
    view = rates.build_dataset_view(
        scan, None, None, rates.RateTracker(), None, False, 0.0, name="regen", count_texts=words
    )
    assert view.completion_tokens == 2 + 2 + 3  # two answers, one reasoning text
    assert view.reasoning_tokens == 3


def test_w16_rows_overtaken_within_the_concurrency_are_in_flight_not_missing(
    tmp_path: Path,
) -> None:
    """A running client with 4 requests in flight answered s4 and s5 before s3: s3 may still
    come; with 2 in flight it cannot be in flight any more (it is missing). Rows after the last
    answer are not attempted yet."""
    from supervisor.completeness import discount_in_flight
    from supervisor.model import DatasetView

    inp = _jsonl(tmp_path / "in.jsonl", [{"id": f"s{i}", "conversations": []} for i in range(10)])
    out = _jsonl(tmp_path / "regen.jsonl", [_sf(i) for i in (0, 1, 2, 4, 5)])
    r = Scanner().scan(str(out), fmt="specforge", input_file={"path": str(inp), "id": "id"})
    c = r["completeness"]
    assert (c["missing"], c["missing_first"], c["not_reached"]) == (1, ["s3"], 4)
    assert c["missing_near"] == [[2, "s3"]]

    def view() -> DatasetView:
        return DatasetView(name="regen", path=str(out), completeness=completeness_view(r))

    four = view()
    discount_in_flight(four, 4)
    assert four.completeness is not None
    assert (four.completeness.missing, four.completeness.in_flight) == (0, 1)
    assert four.completeness.missing_first == []
    line = completeness_line(four.completeness)
    assert "1 in flight" in line and "4 not attempted yet" in line and "missing" not in line
    two = view()
    discount_in_flight(two, 2)
    assert two.completeness is not None
    assert (two.completeness.missing, two.completeness.in_flight) == (1, 0)
    assert "1 missing (s3)" in completeness_line(two.completeness)


def test_prompt_lengths_are_read_from_the_first_mib_of_the_input_only(tmp_path: Path) -> None:
    """The host reads a dataset's prompts to say how long they are, but never the whole of a
    large input: its first MiB of complete rows stands for it (``whole`` false), the id not
    counted as text; a file that is not JSON lines says why."""
    row = {"sample_id": "x" * 50, "messages": [{"role": "user", "content": "w" * 995}]}
    inp = _jsonl(tmp_path / "B3.jsonl", [row] * 2000)  # ~2.1 MiB
    assert inp.stat().st_size > 2 * MAX_BYTES
    r = Scanner().scan(
        str(tmp_path / "B3" / "raw_responses.jsonl"),
        fmt="raw",
        input_file={"path": str(inp), "id": "sample_id"},
    )
    lengths = r["prompt_lengths"]
    assert lengths["mean_chars"] == 4 + 995  # "user" and the content, not the id
    assert lengths["whole"] is False
    assert lengths["rows"] == MAX_BYTES // len(json.dumps(row) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert PromptLengths().of(str(bad), "")["error"] == "line 1 is not JSON"


def test_sidecar_reasons_under_metadata_error(tmp_path: Path) -> None:
    """vLLM speculators' response_regeneration/script.py (HEAD c05b95b, August 2026) writes a
    failed conversation to ``<out>.errors.jsonl`` as ``{"id", "metadata": {"idx", "error":
    repr(e), "generations_completed", "endpoint"}}``: its reasons are read there."""

    def failed(i: int, error: str) -> dict[str, object]:
        meta = {"idx": i, "error": error, "generations_completed": 0, "endpoint": "http://h/v1"}
        return {"id": f"conv-{i}", "metadata": meta}

    refused = "ClientConnectorError(ConnectionKey(host='127.0.0.1', port=8000))"
    err = _jsonl(
        tmp_path / "regen.errors.jsonl",
        [failed(0, refused), failed(1, refused), failed(2, "TimeoutError()")],
    )
    out = _jsonl(tmp_path / "regen.jsonl", [])
    r = Scanner().scan(str(out), fmt="speculators", sidecars={"error": str(err)})
    assert r["sidecars"]["error"]["lines"] == 3
    assert r["sidecars"]["error"]["reasons"] == {refused: 2, "TimeoutError()": 1}
