"""The argv side of secret masking as classes (T26-T31): a command line inside one argument
read recursively, a value that starts with ``-``, values attached to one-letter flags and
``NAME=K`` as a flag's value, Python literals, credential variables whose value starts with ``/``
or is a number; and what must stay as written (``-k 5``, ``--sort-key x``, another command's
``-p``, the rest of a command line, valid JSON)."""

from __future__ import annotations

import json
import shlex

import pytest

from supervisor.agent import masking


def _secrets(argv: list[str]) -> set[str]:
    return set(masking.argv_secret_values(argv))


def _hidden(argv: list[str], *values: str) -> str:
    """``argv`` masked, joined; asserts none of ``values`` is in it."""
    shown = "\0".join(masking.mask_argv(argv))
    for value in values:
        assert value not in shown, (value, shown)
    return shown


# ---------------------------------------------------------------- T26: command lines in one item


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["gen.py", "--extra-args", "--api-key {K} --x 1"], "--api-key *** --x 1"),
        (["gen.py", "--server-args=--api-key {K}"], "--server-args=--api-key ***"),
        (["gen.py", "--server-args='--api-key {K}'"], "--server-args='--api-key ***'"),
        (["gen.py", "--engine-args=--api-key={K}"], "--engine-args=--api-key=***"),
        (["gen.py", "--post", "OPENAI_API_KEY={K} python x.py"], "OPENAI_API_KEY=*** python x.py"),
        (["ssh", "h", "cd /w && HF_TOKEN={K} ./run.sh -v"], "cd /w && HF_TOKEN=*** ./run.sh -v"),
        (["gen.py", "--extra-args", '--api-key "{K} --x 1'], '--api-key "***'),  # unclosed quote
        (["gen.py", "--hook", "curl -H 'X-Api-Key: {K}' -d x"], "curl -H 'X-Api-Key: ***' -d x"),
        (["gen.py", "--extra-args=--db-pw {K};echo ok"], "--extra-args=--db-pw ***;echo ok"),
    ],
)
@pytest.mark.parametrize("key", ["cmdline-key-2601", "Sh0rt"])
def test_t26_a_command_line_inside_one_argument_is_read_recursively(
    argv: list[str], kept: str, key: str
) -> None:
    given = [a.replace("{K}", key) for a in argv]
    if len(key) >= masking.MIN_SECRET_LEN:
        assert key in _secrets(given)
    shown = _hidden(given, key)
    assert kept in shown, shown


@pytest.mark.parametrize("quote", ["shlex", "alternating"])
def test_t26_four_nested_shell_levels_are_read(quote: str) -> None:
    key, short = "nested4-key-2602", "n4pw"
    inner = f"python g.py --api-key {key} --db-pw {short} --top-k 5"
    for level in range(4):
        if quote == "shlex":
            inner = "bash -c " + shlex.quote(inner)
        else:
            q = '"' if level % 2 else "'"
            inner = f"bash -c {q}" + inner.replace("\\", "\\\\").replace(q, "\\" + q) + q
    argv = ["bash", "-c", inner]
    assert key in _secrets(argv)
    shown = _hidden(argv, key, short)
    assert "--top-k 5" in shown and "python g.py --api-key ***" in shown


# ---------------------------------------------------------------- T27: a value that starts with -


@pytest.mark.parametrize("value", ["-abcDEF1234567", "--Zz9-secret-2701", "-k9", "-"])
def test_t27_a_secret_value_that_starts_with_a_dash_is_the_flags_value(value: str) -> None:
    for argv in (
        ["gen.py", "--api-key", value, "--model", "m"],
        ["gen.py", "-H", "Authorization", value, "--model", "m"],
    ):
        shown = masking.mask_argv(argv)
        assert shown[-2:] == ["--model", "m"] and value not in shown, shown
        if len(value) >= masking.MIN_SECRET_LEN:
            assert value in _secrets(argv)
    # an option after a secret flag is no value: the flag was given without one
    assert masking.mask_argv(["gen.py", "--api-key", "--model", "m", "-v"]) == [
        "gen.py", "--api-key", "--model", "m", "-v",
    ]  # fmt: skip


# ---------------------------------------------------------------- T28: attached values, NAME=K


def test_t28_values_attached_to_short_flags_and_assignments_as_values() -> None:
    key = "attached-key-2801"
    masking.register_secret_flags(["-p"], ["t28_gen.py"])
    cases = {
        ("python", "t28_gen.py", f"-p{key}"): "-p***",
        ("python", "t28_gen.py", f"-p={key}"): "-p=***",
        ("curl", f"-uuser:{key}"): "-uuser:***",
        ("docker", "run", f"--env=HF_TOKEN={key}"): "--env=HF_TOKEN=***",
        ("docker", "run", "-e", f"HF_TOKEN={key}"): "HF_TOKEN=***",
        ("docker", "run", "--env", f"HF_TOKEN={key}"): "HF_TOKEN=***",
        ("runwatch", "restart", "r", "--set", f"api-key={key}"): "api-key=***",
        ("ssh", "-o", f"ProxyPassword={key}"): "ProxyPassword=***",
        ("env", f"GPG_PASSPHRASE={key} with spaces", "gen.py"): "GPG_PASSPHRASE=***",
        ("gen.py", f"-k{key}"): "-k***",
    }
    for argv, shown in cases.items():
        assert key in _secrets(list(argv)), argv
        assert shown in _hidden(list(argv), key).split("\0"), argv
    # short values where they stand, in a command line too
    assert masking.mask_argv(["python", "t28_gen.py", "-pab1", "-uu:p2"])[2:] == [
        "-p***",
        "-uu:***",
    ]
    line = masking.mask_argv(["bash", "-c", "exec python t28_gen.py -pab1 --x 1"])[2]
    assert line == "exec python t28_gen.py -p*** --x 1"


def test_t28_a_profiles_short_flag_is_secret_only_in_its_scripts_command_line() -> None:
    masking.register_secret_flags(["-X"], ["t28_scoped.py"])
    assert masking.mask_argv(["curl", "-X", "POST", "http://h/v1"]) == [
        "curl", "-X", "POST", "http://h/v1",
    ]  # fmt: skip
    assert masking.mask_argv(["python", "t28_scoped.py", "-X", "val9"])[-1] == "***"
    assert masking.mask_argv(["python", "/w/t28_scoped.py", "-Xval9"])[-1] == "-X***"
    # in one shell line: the script's own command only, not the next one's
    line = masking.mask_argv(["bash", "-c", "t28_scoped.py -X v1 && curl -X POST u"])[2]
    assert line == "t28_scoped.py -X *** && curl -X POST u"
    # before the script's name it is the interpreter's, not the script's
    assert masking.mask_argv(["python", "-X", "dev", "t28_scoped.py"])[2] == "dev"


# ---------------------------------------------------------------- T29: Python and JSON literals


def test_t29_python_literals_are_read_and_json_stays_valid() -> None:
    key = "literal-key-2901"
    for argv, kept in (
        (["gen.py", "--headers", f"{{'Authorization': 'Bearer {key}'}}"], "'Bearer ***'"),
        (["gen.py", "--extra-body", f"{{'api_key': '{key}', 'n': 2}}"], "'api_key': '***'"),
        (["gen.py", "--extra-body", f"{{'auth': {{'token': '{key}'}}}}"], "'token': '***'"),
        (["gen.py", "--headers", f'{{"X-Api-Key": "{key}"}}'], '"X-Api-Key": "***"'),
    ):
        assert key in _secrets(argv), argv
        assert kept in _hidden(argv, key)
    shown = masking.mask_argv(["gen.py", "--headers", '{"X-Api-Key": "abc", "Accept": "json"}'])
    assert json.loads(shown[2]) == {"X-Api-Key": "***", "Accept": "json"}
    shown = masking.mask_argv(["gen.py", "--headers", '{"Authorization": "Bearer abc"}'])
    assert json.loads(shown[2]) == {"Authorization": "Bearer ***"}
    # an empty value stays empty (a kill compares the listed argv with the real one)
    empty = ["gen.py", "--headers", '{"X-Api-Key": ""}']
    assert masking.mask_argv(empty) == empty
    # a broken literal is read as far as it goes, never evaluated
    assert masking.value_secrets("{'api_key': __import__('os').getcwd()}") == []


# ---------------------------------------------------------------- T30: credential variables


def test_t30_credential_values_that_start_with_a_slash_or_are_numbers() -> None:
    env = {
        "HF_TOKEN": "/AbCdEf+gh/Ij12KlM",  # base64 starts with / as often as with any letter
        "SERVICE_TOKEN": "/svc-token-3001",
        "DB_PASSWORD": "20250101987",  # a numeric password
        "OTP_SECRET": "31415926535",
        "SSL_KEY": "/etc/ssl/private/server.key",  # a file
        "API_KEY_PATH": "/root",  # a path by its name
        "TOKEN_BUDGET": "10000000",  # counts
        "AUTH_TIMEOUT": "30000000",
        "TOKEN_LIMIT": "12345678",
        "MAX_TOKENS": "81920000",
        "DB_PASS": "1234",  # under the length floor
        "GOOGLE_APPLICATION_CREDENTIALS": "/tmp",  # an existing directory
    }
    assert sorted(masking.env_secret_values(env)) == sorted(
        ["/AbCdEf+gh/Ij12KlM", "/svc-token-3001", "20250101987", "31415926535"]
    )


# ---------------------------------------------------------------- false masks


@pytest.mark.parametrize(
    "argv",
    [
        ["gen.py", "-k", "5", "--top-k", "40", "-k=0.9"],
        ["gen.py", "--sort-key", "x", "--dataset-key", "prompt", "--input-key", "text"],
        ["gen.py", "--output-key", "out", "--label-key", "y", "--id-key", "sample_id"],
        ["gen.py", "--pass-at-k", "3", "--cookie-jar", "c.txt", "--key-bits", "2048"],
        ["curl", "-k", "https://127.0.0.1:9/v1", "-ksS", "-X", "POST"],
        ["python", "-uB", "gen.py", "--temperature", "-0.5", "--seed", "-1"],
        ["bash", "-c", "python run.py --x 1 --model m; echo done"],
    ],
)
def test_t26_to_t30_what_is_no_secret_stays_as_written(argv: list[str]) -> None:
    assert masking.mask_argv(argv) == argv
    assert not _secrets(argv)


def test_t26_only_the_value_of_an_assignment_in_a_command_line_is_masked() -> None:
    argv = ["bash", "-c", "OPENAI_API_KEY=abc python run.py --x 1"]
    assert masking.mask_argv(argv)[2] == "OPENAI_API_KEY=*** python run.py --x 1"
    argv = ["bash", "-c", "OPENAI_API_KEY=open-key-2603 python run.py --x 1"]
    assert masking.mask_argv(argv)[2] == "OPENAI_API_KEY=*** python run.py --x 1"
    assert masking.argv_secret_values(argv) == ["open-key-2603"]
    # masked_equal still matches what was masked (a kill compares listed argv with the real one)
    for argv in (
        ["gen.py", "--server-args=--api-key abc --x 1"],
        ["gen.py", "--headers", '{"X-Api-Key": "abc"}'],
        ["python", "t28_gen.py", "-pab1"],
    ):
        assert masking.masked_equal(masking.mask_argv(argv), argv)


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["sh", "-c", "python x.py --api-key=$(echo {K}) --x 1"], "--api-key=*** --x 1"),
        (["sh", "-c", "python x.py --api-key `echo {K}` --x 1"], "--api-key *** --x 1"),
        (["gen.py", "--password", "--{K}"], "***"),  # a value like an option, but not one
        (["gen.py", "--api-key", "--deadbeef0123456789abcdef{K}"], "***"),
        (["sh", "-c", "mysql -u root -p{K} db; python x.py -p 80"], "-p*** db; python x.py -p 80"),
        (["redis-cli", "-a", "{K}", "ping"], "***"),
        (["gen.py", "--extra-body={'api_key': '{K}'}"], "--extra-body={'api_key': '***'}"),
        (
            ["python", "-c", "import os; os.environ['HF_TOKEN']='{K}'"],
            "os.environ['HF_TOKEN']='***'",
        ),
        (["gen.py", "--auth-header", "{K}", "--header", "Accept: json"], "Accept: json"),
        (["kubectl", "create", "secret", "x", "--from-literal=password={K}"], "password=***"),
    ],
)
def test_t26_to_t29_fresh_variants_of_each_class(argv: list[str], kept: str) -> None:
    key = "fresh-variant-2610"
    given = [a.replace("{K}", key) for a in argv]
    assert any(key in v for v in _secrets(given)), given
    assert kept in _hidden(given, key).split("\0") or kept in _hidden(given, key)
