"""Names whose credential word only qualifies another word (T43): ``--token-level``,
``--cookie-domain``, ``--bucket-inter-token-latency``, ssh's ``StrictHostKeyChecking=no``. Their
value is a secret only when it looks like one; never registered otherwise (a registered
``sequence`` would be masked in every log line), in argv, in text and in an environment."""

from __future__ import annotations

import shlex

import pytest

from supervisor.agent import masking

_PUBLIC = [
    ["python", "-m", "sglang.launch_server", "--bucket-inter-token-latency", "0.001", "0.25"],
    ["python", "train.py", "--token-level", "sequence", "--token-weighting", "uniform"],
    ["python", "serve.py", "--cookie-domain", "example.com", "--cookie-max-age", "3600"],
    ["python", "serve.py", "--session-affinity", "client", "--key-by", "user_id"],
    ["python", "serve.py", "--otp-window", "30", "--otp-digits", "6", "--token-healing", "off"],
    ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "PasswordAuthentication=no", "gpu1"],
    ["bash", "-c", "ssh -o PubkeyAuthentication=yes gpu1 python train.py --token-level seq"],
    ["python", "serve.py", "--secret-scan", "off", "--auth-mode", "none"],
]


@pytest.mark.parametrize("argv", _PUBLIC)
def test_t43_a_qualifying_credential_word_does_not_hide_a_plain_value(argv: list[str]) -> None:
    assert masking.mask_argv(argv) == argv
    assert masking.argv_secret_values(argv) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "x.py", "--token-level", "Zq8vR2mXk4LpT9wB"],
        ["python", "x.py", "--api-key-judge", "Zq8vR2mXk4LpT9wB"],
        ["python", "x.py", "--password-admin", "hunter2x"],
        ["python", "x.py", "--db-pw-prod=hunter2x"],
        ["env", "GITHUB_TOKEN_PROD=Zq8vR2mXk4LpT9wB", "python", "x.py"],
        ["python", "x.py", "--api-key", "plainword"],
        ["python", "x.py", "--hf-token", "plainword"],
        ["python", "x.py", "--api-key-2", "Zq8vR2mXk4LpT9wB"],
        ["python", "x.py", "--private-key-pem", "plainwordsonly"],
    ],
)
def test_t43_a_key_shaped_value_or_a_password_stays_masked(argv: list[str]) -> None:
    secret = argv[-1].partition("=")[2] if "=" in argv[-1] else argv[-1]
    if argv[0] == "env":
        secret = argv[1].partition("=")[2]
    shown = "\0".join(masking.mask_argv(argv))
    assert secret not in shown
    assert secret in masking.argv_secret_values(argv)


def test_t43_in_text_and_in_an_environment_the_same_rule_holds() -> None:
    line = (
        "token_level='sequence', cookie_domain='example.com', otp_window: 30, api_key='k3yV4lu3X'"
    )
    shown = masking.mask_text(line)
    assert "token_level='sequence'" in shown
    assert "cookie_domain='example.com'" in shown
    assert "otp_window: 30" in shown
    assert "k3yV4lu3X" not in shown
    env = {
        "HF_TOKEN_LEVEL": "sequence",
        "SESSION_AFFINITY": "sticky-client",
        "HF_TOKEN": "abcdefgh",
    }
    assert masking.env_secret_values(env) == ["abcdefgh"]


# ------------------------------------------------ T44: pathological argv never crashes nor leaks


@pytest.mark.parametrize(
    "arg",
    ["[" * 100_000, "{" * 100_000, '{"a": ' * 20_000, "[" * 60_000 + "]" * 60_000],
    ids=["open-lists", "open-objects", "open-pairs", "closed-lists"],
)
def test_t44_a_deeply_nested_literal_is_read_without_crashing(arg: str) -> None:
    argv = ["python", "x.py", "--extra-body", arg, "--api-key", "Zq8vR2mXk4LpT9wB"]
    shown = masking.mask_argv(argv)
    assert shown[:4] == argv[:4]
    assert shown[5] == "***"
    assert masking.argv_secret_values(argv) == ["Zq8vR2mXk4LpT9wB"]


@pytest.mark.parametrize("levels", [8, 9, 11])
def test_t44_a_command_line_nested_deeper_than_is_read_still_hides_its_secret(
    levels: int,
) -> None:
    """8: the deepest command line read with its quoting; 9: one more, read as flat words; 11:
    the flat words carry quotes of quotes (``'"'"'``) as at any depth beyond (each level triples
    the line: 11 is 350 kB, 12 would be 1 MB read the same way)."""
    key = "Zq8vR2mXk4LpT9wB"
    inner = f"python gen.py --api-key {key} --model m"
    for _ in range(levels):
        inner = "bash -c " + shlex.quote(inner)
    argv = ["ssh", "gpu1", inner]
    shown = masking.mask_argv(argv)
    assert key not in "".join(shown)
    assert "--model m" in shown[2]
    assert key in masking.argv_secret_values(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["ssh", "-o", "SetEnv=HF_TOKEN={K}", "gpu1"],
        ["ssh", "-oSetEnv=OPENAI_API_KEY={K}", "gpu1"],
        ["python", "x.py", "env=HF_TOKEN={K}"],
        ["torchrun", "--rdzv-endpoint", "admin:{K}@host:29500", "train.py"],
        ["python", "x.py", "--proxy", "bob:{K}@proxy.internal:3128"],
    ],
)
def test_t45_an_assignment_inside_an_assignment_and_bare_userinfo_are_read(
    argv: list[str],
) -> None:
    key = "Zq8vR2mXk4LpT9wB"
    argv = [a.replace("{K}", key) for a in argv]
    shown = masking.mask_argv(argv)
    assert key not in "".join(shown)
    assert key in masking.argv_secret_values(argv)
    assert [a.split("=")[0].split(":")[0] for a in shown] == [
        a.split("=")[0].split(":")[0] for a in argv
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["ssh", "-o", "SetEnv=LANG=C.UTF-8", "git@github.com:org/repo.git"],
        ["docker", "pull", "img@sha256:0123456789abcdef0123456789abcdef"],
        ["rsync", "-a", "out/", "bob@host:/data/out"],
        ["torchrun", "--rdzv-endpoint", "host:29500", "train.py"],
    ],
)
def test_t45_what_only_looks_like_userinfo_stays(argv: list[str]) -> None:
    assert masking.mask_argv(argv) == argv


def test_t45_a_short_password_in_bare_userinfo_is_masked_where_it_stands() -> None:
    shown = masking.mask_argv(["curl", "-x", "bob:pw1@proxy:3128", "https://h"])
    assert shown == ["curl", "-x", "bob:***@proxy:3128", "https://h"]


@pytest.mark.parametrize(
    "line",
    [
        "Using API key {K} for requests",
        "retrying with access token {K} (attempt 2)",
        "proxy admin:{K}@proxy.internal:3128 refused the connection",
        "rdzv endpoint root:{K}@10.0.0.7:29500",
    ],
)
def test_t46_a_key_after_its_name_in_prose_and_bare_userinfo_in_a_log_line(line: str) -> None:
    key = "Zq8vR2mXk4LpT9wB"
    shown = masking.mask_text(line.replace("{K}", key))
    assert key not in shown
    assert "***" in shown


@pytest.mark.parametrize(
    "line",
    [
        "Using API key authentication for requests",
        "the access token expired-at header is missing",
        "mailto:alice@example.com",
        "user:bob@example.com logged in",
        "pushed to git@github.com:org/repo.git",
        "rdzv endpoint gpu1:29500",
    ],
)
def test_t46_prose_and_addresses_that_only_look_like_it_stay(line: str) -> None:
    assert masking.mask_text(line) == line


# ---------------------------------- T47: a credential named with whose or which one it is


@pytest.mark.parametrize(
    "name",
    ["--client-secret-prod", "--api-key-judge", "--db-password-backup", "--hf-token-prod-2",
     "--openai-api-key-eu", "--secret-key-ro"],
)  # fmt: skip
def test_t47_an_owned_credential_is_masked_whatever_its_value(name: str) -> None:
    argv = ["python", "x.py", name, "plainword"]
    assert "plainword" not in masking.mask_argv(argv)
    assert masking.argv_secret_values(argv) == ["plainword"]
    env_name = name.lstrip("-").replace("-", "_").upper()
    assert masking.env_secret_values({env_name: "plainword"}) == ["plainword"]
    assert "plainword" not in masking.mask_text(f"{env_name.lower()}='plainword'")


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "x.py", "--token-level", "sequence", "--secret-scan", "off"],
        ["python", "x.py", "--session-affinity", "client", "--token-healing", "off"],
        ["python", "x.py", "--key-by", "user_id", "--cookie-domain", "example.com"],
    ],
)
def test_t47_a_describing_word_after_a_credential_word_still_shows_a_plain_value(
    argv: list[str],
) -> None:
    assert masking.mask_argv(argv) == argv
