"""``--set`` / ``--unset`` replace a flag's whole value, whatever it looks like (O10).

A value that starts with ``-`` (``--extra-args "--y 2"``, ``--shift=-x``), the ``=`` form, a flag
given several times, a flag with several values and a flag that takes no value: an override
leaves no stray piece of the old value in the argv, and removes nothing that was not the flag's.
"""

from __future__ import annotations

from pathlib import Path

from supervisor import launchspec
from supervisor.agent import argflags
from supervisor.argv import apply_overrides, flag_spans, parse_sets, parse_unsets, remove_flags
from supervisor.config import load_config
from tests.fixtures_config import write_local_config

BASE = ["python3", "gen.py", "--extra-args", "--y 2", "--model", "m"]


def test_o10_a_value_that_starts_with_a_dash_is_replaced_whole() -> None:
    new = apply_overrides(BASE, parse_sets(["extra-args=--x 1"]))
    assert new == ["python3", "gen.py", "--extra-args=--x 1", "--model", "m"]
    assert "--y 2" not in new
    assert argflags.value(new, "--extra-args") == "--x 1"
    # both sides read the old value as the flag's value, as argparse does (a space in its name)
    assert argflags.value(BASE, "--extra-args") == "--y 2"
    assert remove_flags(BASE, parse_unsets(["extra-args"])) == ["python3", "gen.py", "--model", "m"]


def test_o10_the_equals_form_keeps_its_form_and_any_value() -> None:
    argv = ["gen.py", "--extra-args=--y 2", "--shift=-x", "--temperature=0.6"]
    new = apply_overrides(argv, parse_sets(["extra-args=--x=1", "shift=-z", "temperature=1"]))
    assert new == ["gen.py", "--extra-args=--x=1", "--shift=-z", "--temperature=1"]
    assert remove_flags(argv, ["--extra-args", "--shift"]) == ["gen.py", "--temperature=0.6"]
    # a value that reads as an option is joined to its flag, never left as a flag of its own
    added = apply_overrides(["gen.py"], parse_sets(["extra-args=--x 1", "note=-v", "seed=-3"]))
    assert added == ["gen.py", "--extra-args=--x 1", "--note=-v", "--seed", "-3"]
    assert argflags.values(added, ["--note"]) == ["-v"]


def test_o10_a_repeated_flag_is_replaced_once_and_its_other_occurrences_go() -> None:
    argv = ["gen.py", "--x", "1", "--m", "a", "--x=2", "--x", "--y 3"]
    assert apply_overrides(argv, [("--x", "9")]) == ["gen.py", "--x", "9", "--m", "a"]
    assert remove_flags(argv, ["--x"]) == ["gen.py", "--m", "a"]
    assert apply_overrides(argv, [("--x", None)]) == ["gen.py", "--x", "--m", "a"]


def test_o10_a_flag_with_several_values_loses_them_all() -> None:
    argv = ["gen.py", "--datasets", "B1", "B2", "B3", "--model", "m"]
    assert apply_overrides(argv, [("--datasets", "B4")]) == [
        "gen.py",
        "--datasets",
        "B4",
        "--model",
        "m",
    ]
    assert remove_flags(argv, ["--datasets"]) == ["gen.py", "--model", "m"]


def test_o10_a_flag_that_takes_no_value_never_takes_what_follows() -> None:
    argv = ["gen.py", "--resume", "input.jsonl", "--model", "m"]
    switches = ["--resume"]
    assert apply_overrides(argv, [("--resume", None)], switches) == argv
    assert remove_flags(argv, ["--resume"], switches) == ["gen.py", "input.jsonl", "--model", "m"]
    # removing several flags reads every span on the argv as given
    argv2 = ["gen.py", "--datasets", "B1", "--resume", "in.txt", "--x", "1"]
    assert remove_flags(argv2, ["--resume", "--datasets"], switches) == [
        "gen.py",
        "in.txt",
        "--x",
        "1",
    ]
    assert flag_spans(argv2, "--resume", switches) == [(3, 4)]
    assert flag_spans(argv2, "--resume") == [(3, 5)]


def test_o10_nothing_after_a_bare_double_dash_is_touched() -> None:
    argv = ["gen.py", "--x", "1", "--", "--x", "positional"]
    assert apply_overrides(argv, parse_sets(["x=2", "y=3"])) == [
        "gen.py",
        "--x",
        "2",
        "--y",
        "3",
        "--",
        "--x",
        "positional",
    ]
    assert remove_flags(argv, ["--x"]) == ["gen.py", "--", "--x", "positional"]


def test_o10_a_stored_spec_replaces_the_whole_value_at_every_later_launch(tmp_path: Path) -> None:
    """The launch spec applies the same rule, with the client profile's switches: SpecForge's
    ``--resume`` takes no value, so ``--unset resume`` keeps the argument after it."""
    work = tmp_path / "w"
    work.mkdir()
    argv = [
        "python3",
        "regenerate_train_data.py",
        "--resume",
        "--extra-args",
        "--y 2",
        "--input-file-path",
        "in.jsonl",
        "--output-file-path",
        "out.jsonl",
    ]
    cfg = load_config(
        write_local_config(
            tmp_path / "rw.toml",
            f'[[runs]]\nname = "sf"\nhost = "here"\nworkdir = "{work}"\n'
            f"argv = {str(argv).replace(chr(39), chr(34))}\n",
        )
    )
    run = cfg.run("sf")
    switches = launchspec.switches_of(cfg, run)
    assert "--resume" in switches
    spec = launchspec.LaunchSpec(run="sf").merged(parse_sets(["extra-args=--x 1"]), [])
    assert spec.argv(run.argv, switches) == [
        "python3",
        "regenerate_train_data.py",
        "--resume",
        "--extra-args=--x 1",
        "--input-file-path",
        "in.jsonl",
        "--output-file-path",
        "out.jsonl",
    ]
    launchspec.save(cfg.key, spec)
    assert launchspec.launch_argv(cfg, run) == spec.argv(run.argv, switches)
    unset = launchspec.LaunchSpec(run="sf").merged([], parse_unsets(["resume", "extra-args"]))
    assert unset.argv(run.argv, switches) == [
        "python3",
        "regenerate_train_data.py",
        "--input-file-path",
        "in.jsonl",
        "--output-file-path",
        "out.jsonl",
    ]
