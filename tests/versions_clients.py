"""The version matrix of the client scripts runwatch supervises: every released generation of
SpecForge's ``scripts/regenerate_train_data.py`` and of Model-Optimizer's ``server_generate.py``,
as data: the argparse options of that version (name, type or choices, switch), the lines it
writes to its output file and to its side files, and what a line means.

Facts read from each project's own history (``git log --follow`` of the file, ``git show
COMMIT:PATH``); no code is copied. Each :class:`Generation` names its project, source file and the
commits (with their dates) that bound it; its records are built here the way that version builds
them (the input row, its ``conversations`` rebuilt, the keys it adds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Option = str | list[str]
"""``int``, ``float``, ``str``, ``switch`` (no value), or the choices."""


@dataclass(frozen=True)
class Generation:
    """One generation of a client script: see the module docstring."""

    project: str
    source: str
    version: str
    """The commits (and dates) between which the script wrote this way."""
    options: dict[str, Option]
    records: list[dict[str, Any]]
    """The output file's lines, in order (records, failed-request lines, the end marker)."""
    reasoning: list[str] = field(default_factory=list)
    """The reasoning texts the records hold, in order."""
    answers: list[str] = field(default_factory=list)
    """The assistant contents the records hold, in order."""
    error: list[dict[str, Any]] | None = None
    """Its ``<stem>_error.jsonl`` lines; None: this version writes no such file."""
    skipped: list[dict[str, Any]] | None = None
    """Its ``<stem>_skipped.jsonl`` lines; None: this version writes no such file."""
    failed: list[int] = field(default_factory=list)
    """Input rows the output records as failed requests (Model-Optimizer's id-only lines)."""
    input_rows: int = 6
    finished: bool = False
    """The output ends with the ``{"finished": true}`` marker."""

    @property
    def name(self) -> str:
        return f"{self.project.split('/')[-1]}@{self.version.split(' ')[0]}"


def _conv(i: int, answer: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": f"question {i}"}]
    if answer is not None:
        out.append(answer)
    return out


def _answer(i: int) -> str:
    return f"answer number {i} in a few words"


def _think(i: int) -> str:
    return f"first I consider row {i} then I answer"


# --------------------------------------------------------------------------- SpecForge

SPECFORGE = "sgl-project/SpecForge"
SF_SOURCE = "scripts/regenerate_train_data.py"

_SF_COMMON = {
    "--model": "str",
    "--max-tokens": "int",
    "--temperature": "float",
    "--input-file-path": "str",
    "--output-file-path": "str",
}
_SF_SERVER = {"--concurrency": "int", "--server-address": "str"}
_SF_SAMPLING = {"--top-p": "float", "--top-k": "int", "--repetition-penalty": "float"}


def _sf_record(i: int, reasoning_key: str | None, status: bool) -> dict[str, Any]:
    answer: dict[str, Any] = {"role": "assistant", "content": _answer(i)}
    if reasoning_key is not None:
        answer[reasoning_key] = _think(i)
    row: dict[str, Any] = {"id": f"row-{i}", "conversations": _conv(i, answer)}
    if status:
        row["status"] = "success"
    elif i % 2:
        # Before status the script dropped only the input's LAST assistant turn and appended
        # its answer: earlier turns of a multi-turn row are the input's, not generated.
        row["conversations"] = [
            {"role": "user", "content": f"first question {i}"},
            {"role": "assistant", "content": "the dataset's own earlier answer"},
            *row["conversations"],
        ]
    return row


def _sf(
    version: str,
    options: dict[str, Option],
    *,
    reasoning_key: str | None,
    status: bool,
    error: bool,
    skipped: bool,
) -> Generation:
    done = [0, 1, 2, 4]
    records = [_sf_record(i, reasoning_key, status) for i in done]
    err = (
        [
            {
                "id": "row-3",
                "conversations": [{"role": "assistant", "content": "hi"}],
                "status": "error",
                "error": "Data starts with an assistant message",
            }
        ]
        if error
        else None
    )
    skip = (
        [{"id": "row-5", "conversations": [], "status": "skipped", "error": "empty conversations"}]
        if skipped
        else None
    )
    return Generation(
        project=SPECFORGE,
        source=SF_SOURCE,
        version=version,
        options=options,
        records=records,
        reasoning=[_think(i) for i in done] if reasoning_key else [],
        answers=[_answer(i) for i in done],
        error=err,
        skipped=skip,
    )


SPECFORGE_GENERATIONS = [
    # It launched its own SGLang server and posted batches to /v1/completions; a record is the
    # input row with the answer appended: no status, no side files.
    _sf(
        "a2cb6d84 (2025-09-28) .. 1bfe1451 (2025-10-10)",
        {
            **_SF_COMMON,
            "--batch-size": "int",
            "--port": "int",
            "--tp-size": "int",
            "--dp-size": "int",
            "--mem-fraction-static": "float",
            "--max-running-requests": "int",
            "--auto-launch-server": "switch",
            "--num-samples": "int",
        },
        reasoning_key=None,
        status=False,
        error=False,
        skipped=False,
    ),
    # Servers given by address, requests in flight per server; still no status, a failed request
    # is dropped.
    _sf(
        "7b444a6a (2025-11-18) .. 95cb2aec (2025-11-24)",
        {**_SF_COMMON, **_SF_SERVER},
        reasoning_key=None,
        status=False,
        error=False,
        skipped=False,
    ),
    # status "success" in the output, errors in <stem>_error.jsonl; --is-reasoning-model keeps
    # the reasoning under "thinking"; --resume (2026-02-03) appends after the rows it counts.
    _sf(
        "341abf5b (2025-11-25) .. b4bd576e (2026-02-03)",
        {
            **_SF_COMMON,
            **_SF_SERVER,
            **_SF_SAMPLING,
            "--is-reasoning-model": "switch",
            "--is-gpt-oss": "switch",
            "--num-samples": "int",
            "--resume": "switch",
        },
        reasoning_key="thinking",
        status=True,
        error=True,
        skipped=False,
    ),
    # The same, the reasoning now under "reasoning_content".
    _sf(
        "afa1f4fb (2026-03-17) .. 6d01edb5 (2026-03-17)",
        {
            **_SF_COMMON,
            **_SF_SERVER,
            **_SF_SAMPLING,
            "--is-reasoning-model": "switch",
            "--is-gpt-oss": "switch",
            "--num-samples": "int",
            "--resume": "switch",
        },
        reasoning_key="reasoning_content",
        status=True,
        error=True,
        skipped=False,
    ),
    # --reasoning none/save/disable replaces --is-reasoning-model.
    _sf(
        "7f216c63 (2026-06-05)",
        {
            **_SF_COMMON,
            **_SF_SERVER,
            **_SF_SAMPLING,
            "--reasoning": ["none", "save", "disable"],
            "--is-gpt-oss": "switch",
            "--num-samples": "int",
            "--resume": "switch",
        },
        reasoning_key="reasoning_content",
        status=True,
        error=True,
        skipped=False,
    ),
    # Rows it cannot regenerate go to <stem>_skipped.jsonl (status "skipped"); --resume counts
    # output + error + skipped lines.
    _sf(
        "69e18e6b (2026-07-12) .. 1e759089 (2026-07-13)",
        {
            **_SF_COMMON,
            **_SF_SERVER,
            **_SF_SAMPLING,
            "--reasoning": ["none", "save", "disable"],
            "--is-gpt-oss": "switch",
            "--num-samples": "int",
            "--resume": "switch",
        },
        reasoning_key="reasoning_content",
        status=True,
        error=True,
        skipped=True,
    ),
]

# --------------------------------------------------------------------------- Model-Optimizer

MODELOPT = "NVIDIA/Model-Optimizer"

_MO_OPTIONS: dict[str, Option] = {
    "--data_path": "str",
    "--output_path": "str",
    "--num_threads": "int",
    "--temperature": "float",
    "--max_tokens": "int",
    "--model": "str",
    "--url": "str",
    "--api_key": "str",
    "--log_empty_conversations": "switch",
    "--system_prompt": "str",
}


def _mo(version: str, source: str, chat: Option, truncated: bool) -> Generation:
    """Rows 0..5: 1 and 4 failed (``{"conversation_id": N}``, logged by
    ``--log_empty_conversations``), 3 cut by max_tokens (kept with ``truncated`` by the newest
    version; dropped by the older ones, which leaves only the user turn: a failed row)."""
    records: list[dict[str, Any]] = []
    answers = []
    failed = [1, 4]
    for i in range(6):
        if i in failed or (i == 3 and not truncated):
            records.append({"conversation_id": i})
            continue
        answers.append(_answer(i))
        rec: dict[str, Any] = {
            "conversation_id": i,
            "conversations": _conv(i, {"role": "assistant", "content": _answer(i)}),
        }
        if i == 3:
            rec["truncated"] = True
        records.append(rec)
    records.append({"finished": True})
    return Generation(
        project=MODELOPT,
        source=source,
        version=version,
        options={**_MO_OPTIONS, "--chat": chat},
        records=records,
        answers=answers,
        failed=sorted([*failed, *([] if truncated else [3])]),
        finished=True,
    )


MODELOPT_GENERATIONS = [
    # 0.31.0: --chat is a switch (store_true).
    _mo(
        "7af33d29c (2025-06-05, 0.31.0) .. 37085354c (2025-08-17, 0.35)",
        "examples/speculative_decoding/server_generate.py",
        "switch",
        truncated=False,
    ),
    # --chat type=bool default True (takes any value); moved to scripts/ on 2025-11-19.
    _mo(
        "a6fa34cda (2025-09-08) .. ebc534d76 (2026-04-08, 0.44.0)",
        "examples/speculative_decoding/scripts/server_generate.py",
        "str",
        truncated=False,
    ),
    # A turn cut by max_tokens is kept and the record marked "truncated": true.
    _mo(
        "c4129b6e0 (2026-08-14)",
        "examples/speculative_decoding/scripts/server_generate.py",
        "str",
        truncated=True,
    ),
]

ALL_GENERATIONS = SPECFORGE_GENERATIONS + MODELOPT_GENERATIONS
