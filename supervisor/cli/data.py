"""``runwatch scan`` and ``runwatch check``: dataset files, counted and checked, without a config.

``scan PATH...`` counts records, distinct ids, tokens, finish reasons and bad lines of JSONL files
(a directory means its ``raw_responses.jsonl`` and those of its subdirectories, else its ``*.jsonl``
files). ``check PATH|RUN`` validates every record and exits 0 only when every file is in the
expected format with no bad line and no torn last line; otherwise it lists each problem and exits 1.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import click

from supervisor import display
from supervisor.cli._common import config_option, get_config, json_option, print_json, write_control
from supervisor.config import Config
from supervisor.errors import RunwatchError, UsageError

DATA_FILE = "raw_responses.jsonl"
COMPANION_WORDS = ("error", "skipped")
"""Files beside a dataset that hold failed or skipped prompts (SpecForge), not records."""
JSON_KEYS = (
    "path",
    "state",
    "error",
    "format",
    "expected",
    "verdict",
    "verdict_detail",
    "records",
    "unique_ids",
    "duplicates",
    "duplicate_ids",
    "prompt_tokens",
    "completion_tokens",
    "token_source",
    "finish_reasons",
    "bad_lines",
    "bad_lines_total",
    "partial_tail_bytes",
    "size",
    "finished",
    "companions",
)


def find_files(paths: tuple[str, ...] | list[str]) -> list[str]:
    """Files to scan for each PATH: a file as given; a directory's dataset files."""
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise UsageError(
                f"{p}: no such file or directory",
                f"give a data file (e.g. out/B1/{DATA_FILE}) or a directory that holds them",
            )
        if not path.is_dir():
            out.append(p)
            continue
        found = sorted(path.glob(DATA_FILE)) + sorted(path.glob(f"*/{DATA_FILE}"))
        if not found:
            found = [
                f
                for f in sorted(path.glob("*.jsonl")) + sorted(path.glob("*/*.jsonl"))
                if not any(w in f.name for w in COMPANION_WORDS)
            ]
        if not found:
            raise UsageError(
                f"{p}: no dataset files found",
                f"expected {DATA_FILE} in it or in its subdirectories, or *.jsonl files",
            )
        out.extend(str(f) for f in found)
    return out


def _profile_for(fmt: str | None, config_path: str | None) -> dict[str, Any] | None:
    """A user format from the config, when NAME is not built in."""
    from supervisor.engine import BUILTIN_FORMATS

    if fmt is None or fmt in BUILTIN_FORMATS:
        return None
    import msgspec

    from supervisor.cli._common import DEFAULT_CANDIDATES, resolve_config_path

    path = resolve_config_path(config_path)
    if path == DEFAULT_CANDIDATES[0] and not Path(path).exists():
        # No config to hold user formats: the name is simply not a format.
        raise UsageError(
            f"unknown format {fmt!r}",
            f"known formats: {', '.join(BUILTIN_FORMATS)} (more in a config's [formats])",
        )
    config = get_config(config_path)
    if fmt not in config.formats:
        known = ", ".join([*BUILTIN_FORMATS, *config.formats])
        raise UsageError(f"unknown format {fmt!r}", f"known formats: {known}")
    profile: dict[str, Any] = msgspec.to_builtins(config.formats[fmt])
    return profile


PROGRESS_MIN_BYTES = 64 << 20
"""Scans shorter than this show no progress (they finish before anyone would look)."""


class _Progress:
    """``scanning PATH  45%`` on stderr, redrawn in place, only when stderr is a terminal."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.enabled = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < PROGRESS_MIN_BYTES:
            return
        now = time.monotonic()
        if now - self.last < 0.2:
            return
        self.last = now
        self.shown = True
        write_control(sys.stderr, "\r")
        sys.stderr.write(f"scanning {self.path}  {display.share(done, total):>4}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            write_control(sys.stderr, "\r\x1b[K")
            sys.stderr.flush()


def scan_paths(
    files: list[str],
    fmt: str | None,
    validate: str,
    profile: dict[str, Any] | None,
    tokenizer: Any = None,
    texts: bool = True,
) -> list[dict[str, Any]]:
    """Cold-scan each file to its end; tokenizer formats are counted with ``tokenizer``."""
    from supervisor.engine import scan_local_files

    return scan_local_files(files, fmt, validate, profile, tokenizer, texts, progress=_Progress)


# --------------------------------------------------------------------------- text output


def _records(n: int) -> str:
    return f"{display.count(n)} record{'' if n == 1 else 's'}"


def _describe(r: dict[str, Any]) -> list[str]:
    head = f"{r['path']}  "
    if r["state"] != "ok":
        return [head + f"{r['state']}: {r.get('error') or ''}".rstrip(": ")]
    lines = [head + f"{r.get('format') or 'unknown format'}  {r['verdict']}"]
    counts = f"  {_records(r['records'])}"
    if r["unique_ids"] != r["records"] or r["duplicates"]:
        counts += (
            f" ({display.count(r['unique_ids'])} distinct ids, "
            f"{display.count(r['duplicates'])} duplicates)"
        )
    if r["completion_tokens"] is None:
        counts += " · completion tokens not counted (pass --tokenizer DIR)"
    else:
        counts += f" · {display.compact(r['completion_tokens'])} completion tokens"
    if r["prompt_tokens"]:
        counts += f" · {display.compact(r['prompt_tokens'])} prompt tokens"
    lines.append(counts)
    if r["finish_reasons"]:
        items = sorted(r["finish_reasons"].items(), key=lambda kv: -kv[1])
        lines.append("  finish: " + " · ".join(f"{k} {display.count(v)}" for k, v in items))
    if r.get("verdict_detail") and r["verdict"] != "corrupt":  # corrupt: the bad lines below
        lines.append(f"  {r['verdict_detail']}")
    for b in r["bad_lines"][:5]:
        lines.append(
            f"  bad line {display.count(b['line'])} (offset {display.count(b['offset'])}): "
            f"{b['reason']}"
        )
    more = r.get("bad_lines_total", 0) - min(5, len(r["bad_lines"]))
    if more > 0:
        lines.append(f"  ... and {display.count(more)} more bad lines")
    if r["partial_tail_bytes"]:
        lines.append(
            f"  partial last line: {display.count(r['partial_tail_bytes'])} bytes (not counted)"
        )
    if r.get("finished"):
        lines.append("  finished marker present")
    for c in r.get("companions") or ():
        lines.append(
            f"  beside it: {Path(c['path']).name}  {display.count(c['lines'])} {c['kind']} lines"
        )
    return lines


def explanation_lines(e: dict[str, Any]) -> list[str]:
    """``scan --explain`` of one file, for humans."""
    lines = [f"{e['path']}  format {e['format'] or '(detected per line)'}"]
    for entry in e["lines"]:
        head = f"  line {display.count(entry['line'])} (offset {display.count(entry['offset'])})"
        if entry["kind"] != "record":
            lines.append(f"{head}: {entry['kind']}: {entry['why']}")
            continue
        of = "" if entry["of_format"] else " (without the keys that identify it)"
        lines.append(f"{head}: record of format {entry['format']}{of}")
        if not entry["of_format"]:
            lines.append(
                f"    keys: missing {', '.join(entry['missing_keys']) or 'none'}; "
                f"extra {', '.join(entry['extra_keys']) or 'none'}"
            )
        fields = entry["fields"]
        lines.append(f"    id             {_field_text(fields['id'], 'value')}")
        lines.extend(_tokens_text(fields["tokens"]))
        lines.append(f"    prompt tokens  {_field_text(fields['prompt_tokens'], 'read_as')}")
        lines.append(f"    finish reason  {_field_text(fields['finish_reason'], 'read_as')}")
    if not e["lines"]:
        lines.append("  no lines")
    return lines


def _field_text(f: dict[str, Any], shown: str) -> str:
    if f.get("field") is None:
        return str(f.get("why"))
    text = f"{f['field']}"
    if "value" in f:
        text += f" = {json.dumps(f['value'], ensure_ascii=False)}"
    if shown != "value" and shown in f:
        text += f" -> {json.dumps(f[shown], ensure_ascii=False)}"
    return text + (f"  ({f['why']})" if f.get("why") else "")


def _tokens_text(t: dict[str, Any]) -> list[str]:
    if t["source"] != "tokenizer":
        return [f"    tokens         {t['source']}: {_field_text(t, 'read_as')}"]
    if "messages" not in t:
        texts = t.get("texts") or []
        shown = f" = {json.dumps(texts[0]['text'], ensure_ascii=False)}" if texts else ""
        why = f"  ({t['why']})" if t.get("why") else ""
        return [f"    tokens         tokenizer counts {t['field']}{shown}{why}"]
    out = [
        f"    tokens         tokenizer counts {display.count(t['counted'])} of "
        f"{display.count(len(t['messages']))} messages of {t['field']}"
        + (f", {display.count(t['reasoning'])} reasoning texts apart" if t["reasoning"] else "")
    ]
    for m in t["messages"]:
        mark = "+" if m["counted"] else "-"
        text = json.dumps(m["text"], ensure_ascii=False) if m["text"] is not None else "(none)"
        out.append(f"      {mark} [{m['index']}] {m['role'] or '?'}: {text}  ({m['why']})")
        if "reasoning" in m:
            reasoning = json.dumps(m["reasoning"]["text"], ensure_ascii=False)
            out.append(f"          reasoning under {m['reasoning']['key']}: {reasoning}")
    return out


def _json_file(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in JSON_KEYS}


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", default=None, help="Format the files hold (default: detect).")
@click.option(
    "--tokenizer",
    default=None,
    type=click.Path(file_okay=False),
    help="Local tokenizer directory, for formats whose tokens must be counted.",
)
@click.option(
    "--validate",
    type=click.Choice(["sample", "all"]),
    default="sample",
    show_default=True,
    help="Fully validate a sample of records, or every record.",
)
@click.option(
    "--explain",
    is_flag=True,
    help="For the first records of each file: what each field was read as, and why.",
)
@config_option
@json_option
def scan(
    paths: tuple[str, ...],
    fmt: str | None,
    tokenizer: str | None,
    validate: str,
    explain: bool,
    config_path: str | None,
    as_json: bool,
) -> None:
    """Count records, ids, tokens and bad lines of dataset files (no config needed).

    With --explain, show instead how the format reads the first records of each file (the id,
    the completion tokens or the messages counted, the prompt tokens, the finish reason): a
    check of a [formats.NAME] table against a real file.
    """
    files = find_files(paths)
    profile = _profile_for(fmt, config_path)
    if explain:
        from supervisor.engine import explain_file

        explained = [explain_file(f, fmt, profile) for f in files]
        if as_json:
            print_json({"files": explained})
            return
        click.echo("\n\n".join("\n".join(explanation_lines(e)) for e in explained))
        return
    tok = None
    if tokenizer is not None:
        from supervisor.engine import load_tokenizer

        tok = load_tokenizer(tokenizer)
    results = scan_paths(files, fmt, validate, profile, tok, texts=tok is not None)
    if as_json:
        print_json({"files": [_json_file(r) for r in results]})
        return
    odd = odd_formats(results) if fmt is None else {}
    for i, r in enumerate(results):
        if i:
            click.echo("")
        click.echo("\n".join(_describe(r)))
        if r["path"] in odd:
            click.echo(f"  ! {odd[r['path']]}")


# --------------------------------------------------------------------------- check


def odd_formats(results: list[dict[str, Any]]) -> dict[str, str]:
    """Path -> note, for files whose detected format differs from that of most files given.

    Without ``--format`` each file is judged against its own detected format, so a directory that
    mixes ``raw`` and ``raw-legacy`` datasets would pass file by file; this is what says so.
    """
    from collections import Counter

    formats = Counter(
        r["format"] for r in results if r.get("state", "ok") == "ok" and r.get("format")
    )
    if len(formats) < 2:
        return {}
    common, _ = formats.most_common(1)[0]
    return {
        r["path"]: f"format {r['format']}, while the other files are {common}"
        for r in results
        if r.get("state", "ok") == "ok" and r.get("format") not in (None, common)
    }


def duplicates_problem(r: dict[str, Any]) -> str:
    """``3 duplicate ids (records whose id came before), first: a, b``."""
    n = r["duplicates"]
    first = ", ".join(json.dumps(i, ensure_ascii=False) for i in r.get("duplicate_ids") or ())
    return (
        f"{display.count(n)} duplicate id{'s' if n != 1 else ''} (records whose id an earlier "
        f"record has)" + (f", first: {first}" if first else "")
    )


def problems_of(r: dict[str, Any], missing_ok: bool = False) -> list[str]:
    """What stops a file from passing ``check`` (empty: it passes)."""
    out: list[str] = []
    if r.get("state", "ok") != "ok":
        if r.get("state") == "missing" and missing_ok:
            return []
        return [f"{r.get('state')}: {r.get('error') or 'not scanned'}"]
    verdict = r.get("verdict")
    if verdict not in ("current", "empty", "corrupt"):
        # The bad lines get their own problem below.
        detail = re.sub(r"; \d+ bad lines?, first at .*$", "", r.get("verdict_detail") or "")
        out.append(f"format {verdict}: {detail}".rstrip(": "))
    total = r.get("bad_lines_total", len(r.get("bad_lines") or ()))
    if total:
        first = (r.get("bad_lines") or [{}])[0]
        out.append(
            f"{display.count(total)} bad line{'s' if total != 1 else ''}, first at line "
            f"{display.count(first.get('line', 0))} "
            f"(offset {display.count(first.get('offset', 0))}): {first.get('reason')}"
        )
    if r.get("duplicates"):
        out.append(duplicates_problem(r))
    if r.get("partial_tail_bytes"):
        out.append(
            f"partial last line ({display.count(r['partial_tail_bytes'])} bytes): "
            "a writer is mid-line, or "
            "the file was torn and needs repair before resuming"
        )
    return out


@click.command()
@click.argument("target")
@click.option(
    "--format", "fmt", default=None, help="Format expected (default: detect / the run's)."
)
@config_option
@json_option
def check(target: str, fmt: str | None, config_path: str | None, as_json: bool) -> None:
    """Validate every record of PATH (file or directory) or of every dataset of RUN.

    A name the config gives a run means the run, even where a file of that name is here too
    (write ./NAME for the file).

    Exit 0 only when every file is in the expected format with no bad line; else list each
    problem and exit 1. A RUN's datasets that do not exist yet are not problems, unless none of
    them exists (a check never passes on nothing); a RUN whose data files cannot be determined
    is an error.
    """
    config = _config_naming(target, config_path)
    if config is None and (Path(target).exists() or "/" in target or target.endswith(".jsonl")):
        files = find_files([target])
        profile = _profile_for(fmt, config_path)
        results = scan_paths(files, fmt, "all", profile, texts=False)
        missing_ok = False
    else:
        results = _check_run(target, config or get_config(config_path), fmt)
        missing_ok = True
    odd = odd_formats(results) if fmt is None else {}
    report = []
    ok = True
    for r in results:
        problems = problems_of(r, missing_ok)
        if missing_ok and all(x.get("state") == "missing" for x in results):
            problems.append("nothing to check: none of the run's data files exists yet")
        if r["path"] in odd and not problems:
            problems.append(f"{odd[r['path']]}: pass --format NAME to say which is expected")
        ok = ok and not problems
        report.append((r, problems))
    from supervisor.engine import scan_notes

    if as_json:
        print_json(
            {
                "ok": ok,
                "files": [
                    {
                        **_json_file(r),
                        "failed_lines": r.get("failed_lines", 0),
                        "completeness": r.get("completeness"),
                        "sidecars": r.get("sidecars"),
                        "notes": scan_notes(r),
                        "problems": p,
                    }
                    for r, p in report
                ],
            }
        )
    else:
        for r, p in report:
            records = r.get("records", 0)
            where = r.get("path")
            if not p:
                state = "not started" if r.get("state") == "missing" else r.get("verdict")
                click.echo(
                    f"ok    {where}  {r.get('format') or '-'} {state}, "
                    f"{display.count(records)} records"
                )
            else:
                click.echo(f"FAIL  {where}")
                for line in p:
                    click.echo(f"      - {line}")
            # What status shows of it too: failed rows, completeness, error / skipped files.
            for note in scan_notes(r):
                click.echo(f"      . {note}")
        click.echo("all files pass" if ok else "check failed")
    # sys.exit, not ctx.exit: the entry point runs click with standalone_mode=False, where a
    # click Exit is returned rather than raised.
    sys.exit(0 if ok else 1)


def _config_naming(target: str, config_path: str | None) -> Config | None:
    """The config when ``target`` is one of its runs (a bare name a run has means the run, even
    where a file or directory of that name is here too: ``./NAME`` checks that one)."""
    if "/" in target or target.endswith(".jsonl"):
        return None
    try:
        config = get_config(config_path)
    except RunwatchError:
        return None
    return config if any(r.name == target for r in config.runs) else None


def _check_run(run_name: str, config: Config, fmt: str | None) -> list[dict[str, Any]]:
    import asyncio

    run = config.run(run_name)  # ConfigError naming the known runs (or "runs: none")
    if fmt is not None and fmt != run.format:
        raise UsageError(
            f"run {run_name} writes format {run.format!r}; --format {fmt} does not apply",
            "drop --format, or check the files by PATH",
        )
    from supervisor.engine import Engine

    async def go() -> list[dict[str, Any]]:
        engine = Engine(config)
        try:
            return await engine.check_run(run_name)
        finally:
            await engine.aclose()

    return asyncio.run(go())
