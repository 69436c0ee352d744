"""A tiny tokenizer, built locally on first use (never downloaded), for the demo workload.

It is a byte-level BPE trained with the ``tokenizers`` library on text generated from a built-in
word list, saved as a Hugging Face tokenizer directory (``tokenizer.json`` +
``tokenizer_config.json``) so that ``transformers.AutoTokenizer.from_pretrained(dir)`` loads it
offline, like a real model's tokenizer. The mock server uses it to produce token ids whose decoded
text is the response text; the rest of runwatch counts tokens with it through
``supervisor.tokens``.

The build is idempotent and safe when several processes build at once: each builds into its own
temporary directory and renames it into place; the first rename wins and the others use its result.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from supervisor.extras import require
from supervisor.paths import cache_dir

DIR_NAME = "demo-tokenizer"
VOCAB_SIZE = 2048
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

# Words of the demo's made-up domain; every one of them ends up a single token (with its leading
# space), which lets generated ids decode to readable text that encodes back to the same ids.
WORDS_TEXT = """
the a an of to in on for with by from at as is are was were be been being this that these those
it its we you they he she them our your their which who what when where why how not no yes all
any each every some many more most few less least other such only own same so than too very can
will just should now then also here there into over under after before between through during
model models data dataset datasets token tokens sample samples prompt prompts response responses
train training trained drafter draft target speculative decoding decode decoder encoder layer
layers hidden state states head heads attention weight weights gradient gradients loss optimizer
learning rate batch batches step steps epoch epochs server servers request requests client
clients budget budgets limit limits queue queues worker workers process processes thread threads
memory cache caches kernel kernels matrix vector vectors tensor tensors shape shapes value values
number numbers count counts length lengths sequence sequences context window output outputs input
inputs file files line lines record records format formats field fields check checks result
results error errors retry retries time times second seconds minute minutes hour hours day days
fast slow faster slower quick steady large small long short high low good better best bad worse
first second third last next previous new old same different simple complex clear careful exact
compute computes computed run runs running ran start starts started stop stops stopped finish
finishes finished write writes written read reads make makes made take takes took give gives gave
find finds found keep keeps kept show shows shown grow grows grew measure measures measured
explain explains explained describe describes described consider considers considered compare
compares compared answer answers question questions problem problems solution solutions idea
ideas reason reasons example examples method methods approach approaches system systems design
function functions variable variables program programs code test tests proof proofs theorem
equation equations sum product difference ratio average mean median total part parts whole point
points graph graphs node nodes edge edges tree trees path paths cost costs price prices money
dollar dollars cloud local remote host hosts machine machines network networks disk disks byte
bytes
water river mountain city cities road roads language languages story stories book books history
science music art light sound color colors energy power force motion space world people person
"""
WORDS: list[str] = WORDS_TEXT.split()
"""The demo vocabulary's words (also what demo prompts are made of)."""

_PUNCT = [".", ",", ";", ":", "?", "!"]


def ensure_demo_tokenizer(base: Path | None = None) -> Path:
    """The demo tokenizer directory, built under ``<cache_dir>/demo-tokenizer`` if missing.

    ``base`` overrides the parent directory (tests build into a temporary one). Returns the path of
    the directory, which ``AutoTokenizer.from_pretrained`` and ``tokenizers.Tokenizer.from_file``
    (on its ``tokenizer.json``) both load offline.
    """
    parent = base if base is not None else cache_dir()
    final = parent / DIR_NAME
    if (final / "tokenizer.json").is_file():
        return final
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DIR_NAME}-", dir=parent))
    try:
        _build_into(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process renamed its build into place first (or a stale empty directory is in
            # the way): use the existing build when it is complete, else replace the stale one.
            if not (final / "tokenizer.json").is_file():
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _corpus(lines: int = 6000, seed: int = 20240601) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(6, 24)
        words = [rng.choice(WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        text = " ".join(words)
        if rng.random() < 0.3:
            text += f" {rng.randint(0, 9999)}"
        out.append(text + rng.choice(_PUNCT))
    # Every word a few times on its own, with a leading space, so each becomes one token.
    out.extend(" " + " ".join(WORDS) for _ in range(20))
    return out


def _build_into(directory: Path) -> None:
    tk = require("tokenizers", "the demo's tokenizer", "demo")
    Tokenizer, decoders, models = tk.Tokenizer, tk.decoders, tk.models
    pre_tokenizers, trainers = tk.pre_tokenizers, tk.trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}, indent=2) + "\n"
    )
    (directory / "README").write_text(
        "Tiny byte-level BPE tokenizer of the runwatch demo, built locally; safe to delete.\n"
    )


class DemoVocab:
    """The demo tokenizer plus what generating text needs: the ids of whole-word tokens.

    ``word_ids`` are tokens made of a space and a word; any sequence of them decodes to text that
    encodes back to exactly the same ids, so responses' text and token ids always agree.
    """

    def __init__(self, directory: Path | None = None) -> None:
        Tokenizer = require("tokenizers", "the demo's tokenizer", "demo").Tokenizer

        self.directory = directory if directory is not None else ensure_demo_tokenizer()
        self.tokenizer: Any = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        pieces: dict[int, str] = {}
        words = set(WORDS)
        for token, idx in sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            if not (token.startswith("Ġ") and token[1:] in words):
                continue
            text = " " + token[1:]
            if self.tokenizer.encode(text, add_special_tokens=False).ids == [idx]:
                pieces[idx] = text
        if len(pieces) < 50:
            raise RuntimeError(f"demo tokenizer at {self.directory} has too few word tokens")
        self.word_ids: list[int] = sorted(pieces)
        self.pieces = pieces

    def count(self, text: str) -> int:
        """Number of tokens of ``text``."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (whole-word ids: the concatenation of their pieces)."""
        pieces = self.pieces
        if all(i in pieces for i in ids):
            return "".join(pieces[i] for i in ids)
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def random_ids(self, rng: random.Random, n: int) -> list[int]:
        """``n`` whole-word token ids drawn from ``rng``."""
        return rng.choices(self.word_ids, k=n)
