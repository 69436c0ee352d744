"""``docs/reliability.md`` against the code: every test it names exists, and every fault id that
the code and the tests cite (in comments, docstrings and test names) is defined there."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
ID = re.compile(r"\b([PSDECIOTWVXA][0-9]{1,2})\b")
TEST_REF = re.compile(r"(tests/[\w/*]+\.py)::(\w+)")
COMMENTED_ID = re.compile(r"#[^\n]*\b[PSDECIOTWVXA][0-9]{1,2}\b")
ROW_ID = re.compile(r"^\|\s*([PSDECIOTWVXA][0-9]{1,2})\s*\|", re.M)


def defined_ids() -> dict[str, str]:
    """Each id of the doc's tables and the rest of its row."""
    text = DOC.read_text(encoding="utf-8")
    return {m.group(1): text[m.end() : text.find("\n", m.end())] for m in ROW_ID.finditer(text)}


@cache
def functions(path: Path) -> set[str]:
    """The functions one file defines (each file parsed once, however many rows name it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def cited_ids(path: Path) -> set[str]:
    """Ids in the comments, docstrings and test names of one Python file (never in string
    literals or code, where such names are often datasets)."""
    src = path.read_text(encoding="utf-8")
    found: set[str] = set()
    # Tokenizing is the slow part: only a file with an id after a "#" on some line has one in a
    # comment.
    if COMMENTED_ID.search(src):
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                found |= set(ID.findall(tok.string))
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= set(ID.findall(ast.get_docstring(node) or ""))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test_"
        ):
            found |= {m.upper() for m in re.findall(r"(?<=_)([pdse][0-9]{1,2})(?=_|$)", node.name)}
    return found


def test_every_test_the_doc_names_exists() -> None:
    refs = TEST_REF.findall(DOC.read_text(encoding="utf-8"))
    assert len(refs) > 50
    missing = []
    for file, name in refs:
        if "*" in file:  # a family still being written: tests/e2e/test_invariants_*.py
            continue
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
        elif name not in functions(path):
            missing.append(f"{file}::{name} (no such test)")
    assert not missing, "docs/reliability.md names tests that do not exist:\n" + "\n".join(missing)


def test_every_cited_id_is_defined() -> None:
    defined = defined_ids()
    cited: dict[str, list[str]] = {}
    for base in ("supervisor", "tests"):
        for path in sorted((ROOT / base).rglob("*.py")):
            for fault_id in cited_ids(path):
                cited.setdefault(fault_id, []).append(str(path.relative_to(ROOT)))
    assert {"P1", "S3", "D4", "E3"} <= set(cited)
    undefined = {i: where for i, where in cited.items() if i not in defined}
    assert not undefined, f"ids cited but not in docs/reliability.md: {undefined}"


def test_every_id_has_an_outcome_and_a_test() -> None:
    defined = defined_ids()
    assert {f"I{n}" for n in range(1, 13)} <= set(defined)
    assert {f"P{n}" for n in range(1, 11)} <= set(defined)
    for fault_id, row in defined.items():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert len(cells) == 3 and all(cells), f"{fault_id}: fault, outcome and tests: {row!r}"
        pending = fault_id.startswith("I") and cells[2].endswith("(being added)")
        assert TEST_REF.search(cells[2]) or pending, f"{fault_id}: no test named in {cells[2]!r}"
