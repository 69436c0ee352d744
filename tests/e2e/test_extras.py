"""Optional parts: a feature whose package is missing says which extra to install, and a plain
``import`` of what most users need never pulls them in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each case: the packages hidden, then code that uses the feature; it prints the error.
_RUN = r"""
import json, sys
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None  # import fails as if the package were not installed
from supervisor.errors import RunwatchError
try:
    exec(sys.argv[2])
except RunwatchError as e:
    print(json.dumps({"message": e.message, "hint": e.hint}))
else:
    print(json.dumps(None))
"""


@pytest.mark.parametrize(
    ("hidden", "code", "extra"),
    [
        (  # a tokenizer whose class only transformers builds
            ["transformers"],
            "from supervisor.tokens import load_tokenizer; load_tokenizer(sys.argv[3])",
            "tokens",
        ),
        (  # a plain fast tokenizer: its tokenizer.json alone, read by the tokenizers library
            ["tokenizers"],
            "from supervisor.tokens import load_tokenizer; load_tokenizer(sys.argv[4])",
            "tokens",
        ),
        (
            ["uvicorn"],
            "from supervisor.demo.server import _uvicorn_server; _uvicorn_server(None)",
            "demo",
        ),
        (
            ["starlette", "starlette.applications"],
            "from supervisor.demo.server import MockSettings, build_app; build_app(MockSettings())",
            "demo",
        ),
        (
            ["tokenizers"],
            "from supervisor.demo.tokenizer import _build_into; _build_into(None)",
            "demo",
        ),
    ],
)
def test_a_missing_optional_package_names_its_extra(
    tmp_path: Path, hidden: list[str], code: str, extra: str
) -> None:
    # Never read: the import fails first.
    for name in ("tok", "fast"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text("{}")
    (tmp_path / "tok" / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    dirs = [str(tmp_path / "tok"), str(tmp_path / "fast")]
    done = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(hidden), code, *dirs],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    err = json.loads(done.stdout)
    assert err is not None, "the feature ran without its package"
    assert hidden[0].split(".")[0] in err["message"]
    assert f"runwatch[{extra}]" in err["hint"]


def test_the_engine_and_the_cli_load_without_the_optional_packages() -> None:
    code = (
        "import sys\n"
        "for n in ('transformers', 'tokenizers', 'uvicorn', 'starlette'):\n"
        "    sys.modules[n] = None\n"
        "import supervisor.engine, tui.cli\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
