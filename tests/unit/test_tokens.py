"""Token counting with a local tokenizer directory, and the demo tokenizer build."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.demo.tokenizer import DemoVocab, ensure_demo_tokenizer
from supervisor.errors import ConfigError, RunwatchError
from supervisor.tokens import count_tokens, decode_preview, load_tokenizer
from tests import fresh


def test_loads_the_demo_tokenizer(demo_tokenizer: Path) -> None:
    tok = load_tokenizer(demo_tokenizer)
    assert load_tokenizer(str(demo_tokenizer)) is tok  # loaded once per process
    vocab = DemoVocab(demo_tokenizer)
    texts = ["", "The model trains a drafter.", " tokens tokens tokens", "héllo wörld 123"]
    assert count_tokens(tok, texts) == [vocab.count(t) for t in texts]
    assert count_tokens(tok, []) == []


def test_counts_agree_with_the_mock_servers_ids(demo_tokenizer: Path) -> None:
    import random

    vocab = DemoVocab(demo_tokenizer)
    ids = vocab.random_ids(random.Random(1), 500)
    text = vocab.decode(ids)
    assert count_tokens(load_tokenizer(demo_tokenizer), [text]) == [500]


def test_decode_preview_cuts_long_outputs(demo_tokenizer: Path) -> None:
    tok = load_tokenizer(demo_tokenizer)
    vocab = DemoVocab(demo_tokenizer)
    ids = vocab.word_ids[:30]
    assert decode_preview(tok, ids) == vocab.decode(ids)
    short = decode_preview(tok, ids, limit=5)
    assert short == vocab.decode(ids[:5]) + "…"


def test_missing_directory_is_a_clear_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_tokenizer(tmp_path / "nope")
    assert "does not exist" in str(e.value)
    assert "never downloads" in str(e.value)


def test_a_file_or_an_empty_directory_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        load_tokenizer(f)
    with pytest.raises(ConfigError, match="holds no tokenizer files"):
        load_tokenizer(tmp_path)


def test_a_broken_tokenizer_directory_is_a_runwatch_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{ not json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Nope"}))
    with pytest.raises(RunwatchError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path)


def test_importing_tokens_does_not_import_transformers() -> None:
    code = "import sys, supervisor.tokens; print('transformers' in sys.modules)"
    assert fresh.run(code, check=True).stdout.strip() == "False"


def test_the_demo_tokenizer_loads_without_importing_transformers(demo_tokenizer: Path) -> None:
    """Its directory is a tokenizer.json and nothing that changes it: ``tokenizers`` alone."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from supervisor.tokens import count_tokens, decode_preview, load_tokenizer
        tok = load_tokenizer({str(demo_tokenizer)!r})
        counts = count_tokens(tok, ["The model trains a drafter.", "héllo wörld 123"])
        print(json.dumps([counts, "transformers" in sys.modules, "tokenizers" in sys.modules]))
        """
    )
    vocab = DemoVocab(demo_tokenizer)
    want = [vocab.count("The model trains a drafter."), vocab.count("héllo wörld 123")]
    assert json.loads(fresh.run(code, check=True).stdout) == [want, False, True]


@pytest.mark.parametrize(
    "change",
    [
        {"tokenizer_class": "GPT2TokenizerFast"},
        {"add_prefix_space": True},
        {"clean_up_tokenization_spaces": True},
        {"additional_special_tokens": ["<|not-in-the-file|>"]},
    ],
)
def test_a_tokenizer_that_needs_transformers_is_loaded_by_it(
    demo_tokenizer: Path, tmp_path: Path, change: dict[str, object]
) -> None:
    import shutil

    d = tmp_path / "tok"
    shutil.copytree(demo_tokenizer, d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
    code = textwrap.dedent(
        f"""
        import sys
        from supervisor.tokens import count_tokens, load_tokenizer
        tok = load_tokenizer({str(d)!r})
        print(count_tokens(tok, ["The model trains a drafter."]), "transformers" in sys.modules)
        """
    )
    out = fresh.run(code, check=True).stdout.split()
    assert out[-1] == "True"


def test_demo_tokenizer_build_is_idempotent(tmp_path: Path) -> None:
    first = ensure_demo_tokenizer(tmp_path)
    stamp = (first / "tokenizer.json").stat().st_mtime_ns
    assert ensure_demo_tokenizer(tmp_path) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-tokenizer"]


def test_two_processes_building_at_once_both_get_a_complete_tokenizer(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from supervisor.demo.tokenizer import ensure_demo_tokenizer, DemoVocab
        d = ensure_demo_tokenizer(Path({str(tmp_path)!r}))
        print(d, len(DemoVocab(d).word_ids))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {o[0] for o in outs} == {str(tmp_path / "demo-tokenizer")}
    assert len({o[1] for o in outs}) == 1
    # No temporary build directories are left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-tokenizer"]


def test_the_demo_tokenizer_is_built_without_network(demo_tokenizer: Path) -> None:
    config = json.loads((demo_tokenizer / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (demo_tokenizer / "tokenizer.json").stat().st_size > 10_000
