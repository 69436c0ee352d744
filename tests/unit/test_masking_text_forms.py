"""Free text masked by pattern, as a class (T40-T42): a credential-named name and its value in
every way a log or a config dump writes them, provider key shapes printed without a name, and
the words that only look like them (counts, ``sort_key=length``, hashes, uuids) shown as they are.
Nothing here is registered: only the patterns can mask it."""

from __future__ import annotations

import base64
import string
import uuid
from hashlib import sha1, sha256

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.agent import masking
from supervisor.agent.protocol import MASK
from tests.properties import examples

ALNUM = string.ascii_letters + string.digits
K = "Zq8vR2mXk4LpT9wB7nYc"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (f"api_key: {K}", "api_key: ***"),
        (f'  openai_api_key: "{K}"', '  openai_api_key: "***"'),
        (f"password = '{K}'", "password = '***'"),
        (f"token => {K}", "token => ***"),
        (f"{{'api_key': '{K}', 'n': 1}}", "{'api_key': '***', 'n': 1}"),
        (f'{{"apiKey": "{K}"}}', '{"apiKey": "***"}'),
        (f"x-api-key:{K}", "x-api-key:***"),
        (f"Authorization=Bearer {K}", "Authorization=***"),
        (f'payload {{\\"api_key\\": \\"{K}\\"}}', 'payload {\\"api_key\\": \\"***\\"}'),
        (f"'cfg\\napi_key: {K}'", "'cfg\\napi_key: ***'"),
        (f"args: --hf-token={K}", "args: --hf-token=***"),
        (f"n=1,client_secret={K};x=2", "n=1,client_secret=***;x=2"),
        (f"self.api_key = {K}", "self.api_key = ***"),
        (f"token: Bearer {K}", "token: Bearer ***"),
        (f"API key: {K}", "API key: ***"),
        (f"your access token is {K}", "your access token is ***"),
        (f"key={K}", "key=***"),
        ("x-api-key:b0Rq8vR2mXk4LpT9w3", "x-api-key:***"),
        ("token: u123456789", "token: ***"),
        ("password: hunter", "password: ***"),
        ("db_password=hunter2.x api_key = self._key", "db_password=*** api_key = self._key"),
        (f"grep -k {K}", "grep -k ***"),
        (f"<api_key>{K}</api_key> <n>1</n>", "<api_key>***</api_key> <n>1</n>"),
        (f"GET /x?q=1&api_key%3D{K}", "GET /x?q=1&api_key%3D***"),
        (f'api_key": "{K}", "model": "m"}}', 'api_key": "***", "model": "m"}'),
        (f'api_key": "{K}', 'api_key": ***'),
        ("  MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj", "  ***"),
        ("api_key=rZq8vR2mXk4LpT9w", "api_key=***"),
        ("db password: 20481024", "db password: ***"),
        (f"hf_token := b'{K}'", "hf_token := b'***'"),
        (f"auth=('user', '{K}')", "auth=***"),
        (f"os.environ['OPENAI_API_KEY'] = '{K}'", "os.environ['OPENAI_API_KEY'] = '***'"),
        (f'config["api_key"]="{K}"', 'config["api_key"]="***"'),
        (f'setenv("HF_TOKEN", "{K}")', 'setenv("HF_TOKEN", "***")'),
        (f'[("api_key", "{K}"), ("model", "m")]', '[("api_key", "***"), ("model", "m")]'),
        (f"HF_TOKEN\t{K}", "HF_TOKEN\t***"),
        # A value that begins like a pair of its own (found by the long property profile).
        ("api_key\t_KY=0000000=", "api_key\t***"),
        (f"token {K} accepted", "token *** accepted"),
        (f"{{APIKey:{K} Model:m}}", "{APIKey:*** Model:m}"),
        (f"Ocp-Apim-Subscription-Key: {K}", "Ocp-Apim-Subscription-Key: ***"),
    ],
)
def test_t40_a_secret_name_and_its_value_in_any_dump_form(text: str, masked: str) -> None:
    assert masking.mask_text(text) == masked


NAMES = ["api_key", "OPENAI_API_KEY", "apiKey", "x-api-key", "hf_token", "client_secret",
         "db_password", "authToken", "secret", "groq_key", "access-token"]  # fmt: skip
FORMS = ["{n}: {v}", "{n}:{v}", "{n}\t{v}", '("{n}", "{v}")', "cfg['{n}'] = '{v}'",
         "{n}=({v})", '{n}: "{v}"', "{n} = '{v}'", "{n} => {v}", "{n}={v}",
         '"{n}": "{v}"', "'{n}': '{v}'", '{{"{n}": "{v}", "x": 1}}', "--{n} {v}", "--{n}={v}",
         "  {n}: {v}  # from env", 'print({{\\"{n}\\": \\"{v}\\"}})']  # fmt: skip
key_values = st.text(alphabet=ALNUM + "-_./+=", min_size=12, max_size=60).filter(
    lambda v: masking._key_like(v) and v[0] not in "-./=+"
)


@settings(max_examples=examples(300), deadline=None)
@given(
    name=st.sampled_from(NAMES),
    form=st.sampled_from(FORMS),
    value=key_values,
    before=st.sampled_from(["", "INFO cfg ", "2026-12-01 12:00:00 ", "dump: "]),
)
def test_t40_any_secret_name_form_and_key_value_is_masked(
    name: str, form: str, value: str, before: str
) -> None:
    text = before + form.format(n=name, v=value)
    # exactly the value goes (a bracketed value with its brackets): the name and quotes stay
    expected = before + form.replace("({v})", "{v}").format(n=name, v=MASK)
    assert masking.mask_text(text) == expected


def _body(n: int, alphabet: str = ALNUM) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, min_size=n, max_size=n)


SHAPES = {
    "nvidia": st.builds("nvapi-{}".format, _body(64, ALNUM + "-_")),
    "groq": st.builds("gsk_{}".format, _body(52)),
    "github fine-grained": st.builds("github_pat_{}_{}".format, _body(22), _body(59)),
    "github": st.builds("{}_{}".format, st.sampled_from(["ghp", "gho", "ghs", "ghu"]), _body(36)),
    "gitlab": st.builds("glpat-{}".format, _body(20, ALNUM + "-_")),
    "google": st.builds("AIza{}".format, _body(35, ALNUM + "-_")),
    "replicate": st.builds("r8_{}".format, _body(37)),
    "openrouter": st.builds("sk-or-v1-{}".format, _body(64, "0123456789abcdef")),
    "anthropic": st.builds("sk-ant-api03-{}AA".format, _body(93, ALNUM + "-_")),
    "huggingface": st.builds("hf_{}".format, _body(34, string.ascii_letters)),
    "slack": st.builds(
        "xoxb-{}-{}-{}".format, _body(12, "0123456789"), _body(13, "0123456789"), _body(24)
    ),
    "aws key id": st.builds("AKIA{}".format, _body(16, string.ascii_uppercase + "234567")),
    "perplexity": st.builds("pplx-{}".format, _body(48)),
    "xai": st.builds("xai-{}".format, _body(80)),
    "jwt": st.builds(
        lambda a, b: "eyJhbGciOiJIUzI1NiJ9." + a + "." + b,
        _body(40, ALNUM + "-_"),
        _body(43, ALNUM + "-_"),
    ),
}


@settings(max_examples=examples(200), deadline=None)
@given(
    kind=st.sampled_from(sorted(SHAPES)),
    data=st.data(),
    around=st.sampled_from(["{}", "using {} now", "({})", "'{}'", "key={}", "[{}]", "{},x"]),
)
def test_t41_a_provider_key_printed_without_a_name_is_masked(
    kind: str, data: st.DataObject, around: str
) -> None:
    key = data.draw(SHAPES[kind])
    assert key not in masking.mask_text(around.format(key)), kind


@settings(max_examples=examples(100), deadline=None)
@given(secret=_body(40, ALNUM + "/+"), kid=_body(16, string.ascii_uppercase + "234567"))
def test_t41_an_aws_secret_key_next_to_its_key_id_is_masked(secret: str, kid: str) -> None:
    if not masking._AWS_SECRET.fullmatch(secret):
        return  # one case only, or no digit nor sign: not the shape of an AWS secret
    for text in (f"AKIA{kid} {secret}", f"aws creds: {secret}", f"AWS_SECRET={secret}"):
        shown = masking.mask_text(text)
        assert secret not in shown and kid not in shown


PLAIN = [
    "max_tokens: 2048",
    "tokens: 123456",
    "token_budget = 10000000",
    "key: prompt",
    "sort_key=length",
    "--input-key text",
    "--sort-key length --key-field sample_id",
    "sample B1-000042 done: sample_id=B1-000042",
    "path: /models/kimi/tokenizer.json",
    "{'token': 151643, 'logprob': -0.25}",
    "api_key: None",
    "api_key: $OPENAI_API_KEY",
    "--api-key-env OPENAI_API_KEY",
    "auth: failed for user bob",
    "session: 3 pass: 2 of 5",
    "Primary key: id",
    "hf_transfer_enabled: true",
    "top_k=50 key=value keys: 3",
    "INFO:root:token accepted",
    "the data/Batch12/shards/OutputFilesForModelX1 file",
    '["token", "logprob"] key=[1, 2, 3] token_ids=[1, 2]',
    "api_key: <redacted> HF_TOKEN not set",
    "session 20261201-abcdef12 started; key Qwen2.5-7B-Instruct",
    "3f2a9b7c1d0e4f5a6b7c8d9e0f1a2b3c4d5e6f7a3f2a9b7c1d0e4f5a6b7c8d9e0f",
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "<max_tokens>2048</max_tokens> <key>prompt</key>",
    "Token: The model reads the API key is stored in the vault; Auth: ok",
    "the access token is invalid; API key: Use an environment variable",
    "a registered secret base64-encoded; what looks like a secret: `max_tokens: 2048`",
    # a traceback's source lines and an agent's error message
    "parameter 'secret_flags': expected a list of flags",
    "    words = rng.choices(WORDS, k=n)",
    "    self._done_figure[dkey] = figure",
    '    token = f"{config_id}:{run}:{launch_id}"',
    "    per_token = rate.cost_per_request / rate.completion_per_request",
    "CREDENTIAL_HEADERS = frozenset(",
    "def _masked_pair(m: re.Match[str], secret: bool) -> str:",
    "    api_key = self._key; token => ...",
]


@pytest.mark.parametrize("text", PLAIN)
def test_t42_what_only_looks_like_a_secret_is_shown_as_it_is(text: str) -> None:
    assert masking.mask_text(text) == text


@settings(max_examples=examples(200), deadline=None)
@given(
    raw=st.binary(min_size=1, max_size=64),
    form=st.sampled_from(["commit {h}", "sha256:{s}", "uuid {u}", "ckpt-{h}.pt", "id={u}"]),
    name=st.sampled_from(["max_tokens", "tokens", "token_budget", "num_tokens", "prompt_tokens"]),
    count=st.integers(min_value=0, max_value=10**12),
)
def test_t42_hashes_uuids_and_counts_are_never_masked(
    raw: bytes, form: str, name: str, count: int
) -> None:
    u = str(uuid.UUID(bytes=sha256(raw).digest()[:16]))
    text = form.format(h=sha1(raw).hexdigest(), s=sha256(raw).hexdigest(), u=u)
    assert masking.mask_text(text) == text
    for line in (f"{name}: {count}", f"{name}={count}", f'"{name}": {count}', f"--{name} {count}"):
        assert masking.mask_text(line) == line


@settings(max_examples=examples(60), deadline=None)
@given(value=key_values, form=st.sampled_from(FORMS), name=st.sampled_from(["note", "data"]))
def test_t42_the_new_forms_keep_registered_encodings_masked(
    value: str, form: str, name: str
) -> None:
    """T22 again under the new forms: a registered value's base64 after a name that is no
    credential (``note: b64(K)``) is masked by value."""
    masking.register([value])
    encoded = base64.b64encode(value.encode()).decode()
    shown = masking.mask_text(form.format(n=name, v=encoded))
    assert value not in shown and encoded.rstrip("=") not in shown


def test_t40_a_profiles_secret_flag_is_never_only_weakly_secret() -> None:
    """A profile's secret flag names no credential word (``--seat``): its value is masked
    whatever it looks like, short or a plain word; a public ``--sort-key`` keeps its word."""
    masking.register_secret_flags(["--seat", "--tenant-seed"])
    text = "argv --seat Qz7w --tenant-seed=plain --sort-key length"
    assert masking.mask_text(text) == "argv --seat *** --tenant-seed=*** --sort-key length"


def test_t40_audit_details_and_events_are_masked_with_the_same_rules() -> None:
    """What is stored (an audit record of an older runwatch) and what is alerted (an event's
    detail and its log lines) go through the same free-text rules."""
    from supervisor.events import Event
    from supervisor.secrets import mask_record

    gsk = "gsk_" + "Q7" * 26
    record = {"op": "launch", "detail": f"client said api_key: {K}", "steps": [f"env {gsk}"]}
    assert mask_record(record) == {
        "op": "launch",
        "detail": "client said api_key: ***",
        "steps": ["env ***"],
    }
    ev = Event(
        kind="run-died",
        severity="critical",
        host="h",
        run="r",
        title="r",
        message=f"Run stopped; token => {K}",
        key="r",
        time=0.0,
        lines=[f"x-api-key:{K}", "key: prompt"],
    )
    assert ev.lines == ["x-api-key:***", "key: prompt"]
    assert ev.message == "Run stopped; token => ***"
