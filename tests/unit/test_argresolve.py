"""``agent/argresolve.py``: a parser read exactly resolves an argv as the script's own argparse
does; anything runwatch cannot read exactly says so, and never guesses (rows A1, A3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.agent.argresolve import MAX_ARGS_FILE_DEPTH, resolve_in

HEAD = "import argparse\np = argparse.ArgumentParser({kw})\n"


def _src(body: str, kw: str = "") -> bytes:
    return (HEAD.format(kw=kw) + body + "args = p.parse_args()\n").encode()


@pytest.mark.parametrize(
    ("body", "kw", "argv", "dest", "value"),
    [
        ('p.add_argument("--output-dir")\n', "", ["--output-d", "x"], "output_dir", "x"),
        ('p.add_argument("--out")\n', "", ["--out=a", "--out", "b"], "out", "b"),
        ('p.add_argument("-o", "--out")\n', "", ["-ob"], "out", "b"),
        ('p.add_argument("-o", "--out")\n', "", ["-o=b"], "out", "b"),
        ('p.add_argument("--out", action="append")\n', "", ["--out", "a", "--out", "b"], "out",
         ["a", "b"]),
        ('p.add_argument("--r", action="store_const", const=7)\n', "", ["--r"], "r", 7),
        ('p.add_argument("--n", type=int, default="5")\n', "", [], "n", 5),
        ('p.add_argument("--resume", action=argparse.BooleanOptionalAction)\n', "",
         ["--resume", "--no-resume"], "resume", False),
        ('p.add_argument("rest", nargs="*")\np.add_argument("--out")\n', "",
         ["--out", "a", "--", "--out", "b"], "rest", ["--out", "b"]),
        ('p.add_argument("--out")\n', 'fromfile_prefix_chars="@"', ["--out", "a", "@f"], "out",
         "from-file"),
        ('p.set_defaults(out="d")\np.add_argument("--x")\n', "", [], "out", "d"),
    ],
)  # fmt: skip
def test_an_exact_parser_resolves_as_argparse_does(
    tmp_path: Path, body: str, kw: str, argv: list[str], dest: str, value: object
) -> None:
    (tmp_path / "f").write_text("--out\nfrom-file\n")
    r = resolve_in(_src(body, kw), "g.py", str(tmp_path), argv)
    assert r["exact"] and r["error"] is None, r
    assert r["values"][dest] == value, r


@pytest.mark.parametrize(
    ("body", "kw", "argv", "message"),
    [
        ('p.add_argument("--output-dir")\n', "allow_abbrev=False", ["--output-d", "x"],
         "unrecognized arguments: --output-d"),
        ('p.add_argument("--n", type=int)\n', "", ["--n", "x"], "invalid int value: 'x'"),
        ('p.add_argument("--out", required=True)\n', "", [], "required: --out"),
        ('g = p.add_mutually_exclusive_group()\ng.add_argument("--a", action="store_true")\n'
         'g.add_argument("--b", action="store_true")\n', "", ["--a", "--b"], "not allowed with"),
        ('p.add_argument("--out")\n', 'fromfile_prefix_chars="@"', ["@missing"], "cannot open"),
        ('p.add_argument("--out")\n', 'fromfile_prefix_chars="@"', ["@loop"],
         f"nested deeper than {MAX_ARGS_FILE_DEPTH}"),
        ('p.add_argument("--out")\n', "", ["--help"], "print it and exit"),
    ],
)  # fmt: skip
def test_an_argv_argparse_rejects_gives_its_message(
    tmp_path: Path, body: str, kw: str, argv: list[str], message: str
) -> None:
    (tmp_path / "loop").write_text("@loop\n")
    r = resolve_in(_src(body, kw), "g.py", str(tmp_path), argv)
    assert r["exact"] and r["error"] is not None and message in r["error"], r


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import click\n@click.command()\ndef main(): pass\n", "uses click"),
        ("import argparse\np = argparse.ArgumentParser()\nfor f in ['--a']:\n"
         "    p.add_argument(f)\np.parse_args()\n", "cannot place"),
        ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--a', action=A)\n"
         "p.parse_args()\n", "not one of argparse's own"),
        ("import argparse\nclass A(argparse.Action): pass\np = argparse.ArgumentParser()\n"
         "p.parse_args()\n", "a class of its own"),
        ("import argparse\np = argparse.ArgumentParser()\ns = p.add_subparsers()\n"
         "p.parse_args()\n", "add_subparsers"),
        ("import argparse\nb = argparse.ArgumentParser()\n"
         "p = argparse.ArgumentParser(parents=[b])\np.parse_args()\n", "2 ArgumentParser calls"),
        ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--a')\n"
         "p.parse_known_args()\n", "parse_known_args"),
        ("import argparse, sys\nsys.argv.append('--x')\np = argparse.ArgumentParser()\n"
         "p.parse_args()\n", "reads sys.argv"),
        ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--a')\n"
         "exec('p.add_argument(\"--b\")')\np.parse_args()\n", "exec"),
        ("import argparse\ndef main(argv=None):\n    p = argparse.ArgumentParser()\n"
         "    p.add_argument('--a')\n    p.parse_args(argv)\nmain(['--a', 'x'])\n", "may not be"),
        ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--a', type=Foo)\n"
         "p.parse_args()\n", "type is not"),
        ("import argparse\np = argparse.ArgumentParser()\nadd(p)\np.parse_args()\n",
         "handed to another call"),
        ("import argparse\np = argparse.ArgumentParser(fromfile_prefix_chars='@')\n"
         "p.convert_arg_line_to_args = str.split\np.parse_args()\n", "convert_arg_line_to_args"),
        ("#!/bin/sh\nexec python gen.py \"$@\"\n", "not Python"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_exactly_says_why(source: str, why: str) -> None:
    r = resolve_in(source.encode(), "g.py", "/", [])
    assert not r["exact"] and why in r["reason"], r


def test_a_default_not_written_literally_is_unknown_not_guessed() -> None:
    body = 'import os\np.add_argument("--out", default=os.environ.get("OUT", "x"))\n'
    r = resolve_in(_src(body), "g.py", "/", [])
    assert r["exact"] and "out" in r["unknown"] and "out" not in r["values"], r
    r = resolve_in(_src(body), "g.py", "/", ["--out", "y"])
    assert r["values"]["out"] == "y" and r["given"] == ["out"], r


def test_main_argv_none_called_without_it_is_the_command_line() -> None:
    source = (
        "import argparse\ndef main(argv=None):\n    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--a')\n    return p.parse_args(argv)\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    r = resolve_in(source.encode(), "g.py", "/", ["--a", "x"])
    assert r["exact"] and r["values"] == {"a": "x"}, r


def test_a_secret_in_the_namespace_never_leaves_the_host() -> None:
    body = 'p.add_argument("--api-key")\np.add_argument("--out")\n'
    key = "sk-" + "a1b2c3d4" * 4
    r = resolve_in(_src(body), "g.py", "/", ["--api-key", key, "--out", "data/x.jsonl"])
    assert key not in repr(r) and r["values"]["out"] == "data/x.jsonl", r
