"""Which names and values are secrets: every listed credential masked, every ordinary value
visible, in the plan, in the bootstrap's lines and in the ranks' own output."""

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from container_entry.common import logs
from container_entry.common.masking import (
    MASK,
    MIN_SECRET_LENGTH,
    Masker,
    encoded_forms,
    is_secret_name,
    mask_text,
    secret_values,
)
from container_entry.plan.plan import build_plan
from container_entry.rank.relay import Relay
from container_entry.supervise.torchrun_output import TorchrunOutput
from tests.unit.conftest import make_env

SECRET_NAMES = [
    "HF_TOKEN",
    "hub_token",
    "WANDB_API_KEY",
    "wandbApiKey",
    "openai-api-key",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "db.password",
    "DB_PASSWD",
    "ssh_private_key",
    "google_credentials",
    "client_secret",
    "apikey",
    "AuthToken",
    "secrets",
    "db_passwords",
    "ssh_passphrases",
]
ORDINARY_NAMES = [
    "tokenizer_name",
    "max_tokens",
    "num_tokens",
    "tokens_per_batch",
    "session_name",
    "author",
    "keyword",
    "key_column",
    "secretary_count",
    "passthrough",
    "model_name_or_path",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_credential_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("value", [True, False, 3, 0.5, None, "short", "1234567", ""])
def test_booleans_numbers_and_short_values_are_never_secrets(value):
    assert secret_values([("hf_token", value)]) == []
    assert secret_values([("hf_token", json.dumps(value))]) == []


def test_values_count_decoded_nested_and_by_their_own_key():
    found = secret_values(
        [
            ("openai_api_key", '"sk-0123456789"'),  # SDK v2: JSON-encoded
            ("wandb", '{"api_key": "nested-key-123", "project": "visible-project"}'),
            ("config", {"auth": {"token": "deep-token-456"}, "name": "visible-name"}),
            ("keys", {"hub_token": ["list-token-789", 5]}),
        ]
    )
    assert set(found) == {"sk-0123456789", "nested-key-123", "deep-token-456", "list-token-789"}


def test_masker_masks_text_and_bytes_longest_first():
    masker = Masker(["abcdefgh", "abcdefghij"])
    assert masker.text("x abcdefghij y abcdefgh") == f"x {MASK} y {MASK}"
    assert masker.data("é abcdefgh".encode()) == f"é {MASK}".encode()
    assert not Masker() and Masker(["abcdefgh"])


def test_the_plan_masks_every_secret_and_shows_every_ordinary_value():
    hps = {
        "hf_token": '"hf_abcdefghijklmnop"',
        "wandb": json.dumps({"api_key": "wandb-nested-0123"}),
        "tokenizer_name": '"bert-base-uncased"',
        "max_tokens": "4096",
        "use_auth_token": "true",
        "model_name_or_path": '"/opt/ml/input/data/model"',
    }
    env = make_env(
        hyperparameters=hps,
        environ={"SAGEMAKER_PROGRAM": "t.py", "MY_API_KEY": "env-secret-value-1"},
        resource_config={"current_host": "algo-1", "hosts": ["algo-1", "algo-2"]},
    )
    plan = build_plan(env)
    shown = plan.to_json() + plan.summary()
    for secret in ("hf_abcdefghijklmnop", "wandb-nested-0123", "env-secret-value-1"):
        assert secret not in shown
    for visible in ("bert-base-uncased", "4096", "/opt/ml/input/data/model", "algo-2"):
        assert visible in shown
    assert "--use_auth_token True" in plan.summary()
    shown_env = plan.to_dict()["env"]
    assert shown_env["SM_HP_USE_AUTH_TOKEN"]["value"] == "true"  # a boolean under a secret name
    assert shown_env["SM_HP_HF_TOKEN"]["value"] == MASK
    assert "bert-base-uncased" in shown_env["SM_HPS"]["value"]  # only the secret inside is masked


def test_short_values_under_secret_names_stay_visible_in_the_plan():
    env = make_env(
        hyperparameters={"hf_token": '"abc"'},
        environ={"SAGEMAKER_PROGRAM": "t.py", "DB_PASSWORD": "1234"},
    )
    shown_env = build_plan(env).to_dict()["env"]
    assert shown_env["SM_HP_HF_TOKEN"]["value"] == "abc"


def test_a_dict_named_secrets_is_masked_by_its_name():
    found = secret_values([("secrets", '{"a": "zzzzzzzzzzzz", "b": 7}')])
    assert found == ["zzzzzzzzzzzz"]


def test_command_line_credentials_are_masked_too():
    env = make_env(
        resource_config=None,
        environ={},
        cli_args=("t.py", "--hf_token", "cli-token-abcdef", "--api-key=cli-key-abcdef"),
        scripts_found=("/t.py",),
    )
    plan = build_plan(env)
    assert "cli-token-abcdef" not in plan.summary() and "cli-key-abcdef" not in plan.to_json()


# -- every encoded form ---------------------------------------------------------------------
# Secrets built to break an encoding each. Every one holds an ASCII core (`core-NN`) that every
# encoding below writes unchanged, so any form of it left visible shows that core.
TRICKY = {
    "backslash": "q\\Zr8-Kx$ core-01",
    "double-quote": 'pa"ss"wd core-02',
    "single-quote": "it's core-03",
    "both-quotes": "both'\"quotes core-04",
    "slash": "s3/cr/et/ core-05",
    "e-acute": "hf_s\u00e9cretvalue core-06",
    "umlaut": "gr\u00fc\u00dfe-geheim-\u00fc core-07",
    "cjk": "\u79d8\u5bc6\u306e\u30c8\u30fc\u30af\u30f3 core-08",
    "emoji": "emoji-\U0001f600-\U0001f511 core-09",
    "control": "bell\x07tab\tesc\x1b core-10",
    "newline": "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG core-11\n-----END KEY-----",
    "carriage-return": "first-line-abc\rcore-12-second",
    "shell": "$(rm -rf /)`x`;|& core-13",
    "undecodable-byte": "raw\udcff\udcfebytes core-14",  # an env var that is not UTF-8
    "everything": "a\\b\"c'd/\u00e9\u4e2d\U0001f600\x07\n core-15 \t\r\\u00e9",
}
CORE = re.compile(r"core-\d\d")


def _environ_repr(value: str) -> str:
    """`print(os.environ)` in a rank: the repr of SM_HPS, which holds the value JSON-escaped."""
    return repr({"SM_HPS": json.dumps({"hf_token": value, "epochs": 3}, separators=(",", ":"))})


def _sm(name: str) -> Callable[[str], str]:
    """An SM_* variable as sagemaker-training's own mapping writes it (contract.py)."""

    def show(value: str) -> str:
        from sagemaker_training import mapping

        hps = {"hf_token": value, "wandb": {"api_key": value, "project": "p"}, "epochs": 3}
        args = ["--hf_token", value, "--epochs", "3"]
        values = {"hps": hps, "user_args": args, "training_env": {"hyperparameters": hps}}
        return mapping.to_env_vars(values)[name]

    return show


def _both(read: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda text: json.loads(read(text)) if isinstance(read(text), str) else read(text)


# (how a value is shown, how the shown text is read back): the masked text must read back as
# if the value had been MASK, so the mask covers the whole encoded secret and nothing else
ENCODINGS: dict[str, tuple[Callable[[str], str], Callable[[str], Any]]] = {
    "raw": (lambda v: f"auth failed with key {v}!", lambda t: t),
    "json": (lambda v: json.dumps({"k": v}), json.loads),
    "json-unicode": (lambda v: json.dumps({"k": v}, ensure_ascii=False), json.loads),
    "json-escaped-slash": (lambda v: json.dumps({"k": v}).replace("/", "\\/"), json.loads),
    "SM_HPS": (_sm("SM_HPS"), json.loads),
    "SM_USER_ARGS": (_sm("SM_USER_ARGS"), json.loads),
    "SM_TRAINING_ENV": (_sm("SM_TRAINING_ENV"), json.loads),
    "json-in-json": (
        lambda v: json.dumps(json.dumps({"k": v})),
        lambda t: json.loads(json.loads(t)),
    ),
    "json-in-json-unicode": (
        lambda v: json.dumps(json.dumps({"k": v}, ensure_ascii=False), ensure_ascii=False),
        lambda t: json.loads(json.loads(t)),
    ),
    "repr-dict": (lambda v: str({"k": v}), ast.literal_eval),
    "repr-list": (lambda v: str(["--hf_token", v]), ast.literal_eval),
    "repr-both-quotes": (lambda v: repr(f"'\" {v}"), ast.literal_eval),
    "repr-of-json": (_environ_repr, lambda t: json.loads(ast.literal_eval(t)["SM_HPS"])),
    "json-of-repr": (
        lambda v: json.dumps(repr({"k": v})),
        lambda t: ast.literal_eval(json.loads(t)),
    ),
    "shell": (lambda v: shlex.join(["train.py", "--hf_token", v]), shlex.split),
    "shell-inside": (lambda v: shlex.quote(f"--key='{v}'"), shlex.split),
    "bytes-repr": (lambda v: repr({"k": v.encode("utf-8", "surrogateescape")}), ast.literal_eval),
}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("secret", TRICKY.values(), ids=TRICKY.keys())
def test_every_encoded_form_of_a_secret_is_masked_in_text_and_bytes(secret, encoding):
    show, read = ENCODINGS[encoding]
    masker = Masker([secret])
    shown = show(secret)
    masked = masker.text(shown)
    assert not CORE.search(masked), masked
    assert read(masked) == read(show(MASK)), masked
    data = masker.data(shown.encode("utf-8", "surrogateescape"))
    assert data.decode("utf-8", "surrogateescape") == masked


@pytest.mark.parametrize("secret", TRICKY.values(), ids=TRICKY.keys())
def test_forms_are_registered_once_longest_first_and_never_expanded_again(secret):
    masker = Masker([secret])
    assert secret in masker.secrets and encoded_forms(secret) <= set(masker.secrets)
    assert masker.secrets == sorted(masker.secrets, key=len, reverse=True)
    forms = list(masker.secrets)
    masker.add([secret])
    masker.add([])
    assert masker.secrets == forms  # a form is not a secret of its own: no forms of forms
    assert all(len(form) >= MIN_SECRET_LENGTH for form in forms)


def test_an_ordinary_secret_has_one_form():
    assert encoded_forms("hf_AbCdEf0123456789") == {"hf_AbCdEf0123456789"}
    assert encoded_forms("") == set()
    assert not Masker(["", ""]) and Masker([""]).text("abc") == "abc"


def test_a_multi_line_secret_is_masked_line_by_line_where_output_is_cut_into_lines():
    """torchrun indents a traceback's lines in its report; a relay cuts output into lines."""
    secret = TRICKY["newline"]
    masker = Masker([secret])
    indented = "  traceback : RuntimeError: " + secret.replace("\n", "\n  ")
    assert not CORE.search(masker.text(indented))
    for line in (secret + "\n").splitlines(keepends=True):
        assert not CORE.search(masker.text(line))
    # lines shorter than MIN_SECRET_LENGTH on their own are not masked everywhere
    assert Masker(["short\nx-second-line"]).text("short and long") == "short and long"


@pytest.mark.parametrize(
    "secrets",
    [["abcdefgh", "xxabcdefghyy"], ["xxabcdefghyy", "abcdefgh"]],
    ids=["shorter-first", "longer-first"],
)
def test_a_secret_inside_another_is_masked_whole_in_any_order(secrets):
    masker = Masker(secrets)
    text = "xxabcdefghyy and abcdefgh and xxabcdefgh"
    assert masker.text(text) == f"{MASK} and {MASK} and xx{MASK}"
    assert mask_text(text, secrets) == masker.text(text)


def test_overlapping_secrets_leave_no_part_of_either_visible():
    masker = Masker(["AAAA-BBBB-1", "BBBB-1-CCCC"])
    assert masker.text("<AAAA-BBBB-1-CCCC>") == f"<{MASK}>"
    assert masker.data(b"<AAAA-BBBB-1-CCCC>") == f"<{MASK}>".encode()
    periodic = Masker(["abababab"])
    assert periodic.text("xabababababx") == f"x{MASK}x"  # overlapping occurrences of one


@pytest.mark.parametrize("where", ["start", "end", "alone", "twice", "adjacent"])
def test_a_secret_at_a_line_boundary_is_masked(where):
    secret = TRICKY["everything"].replace("\n", "").replace("\r", "")
    masker = Masker([secret])
    text = {
        "start": f"{secret} rest\n",
        "end": f"line {secret}\nnext",
        "alone": f"{secret}\n",
        "twice": f"{secret}\n{secret}\n",
        "adjacent": f"{secret}{secret}",
    }[where]
    assert not CORE.search(masker.text(text))
    assert not CORE.search(masker.data(text.encode()).decode())


def test_huge_secrets_and_texts_are_masked_quickly():
    secret = ('\u00e9\\"' * 40_000) + " core-99"  # 120 KB of characters that grow when encoded
    # This thread's CPU time, not the wall clock: a stall beside a CPU hog costs no CPU here.
    # Normal: 0.2-0.5 s. The bound stays far above that (load) and far below a scan quadratic
    # in the 5 MB (1.25e13 byte steps: over 400 s even at memcpy speed, 0.035 ns a byte) or in
    # the 600-KB longest form at Python speed (1.8e11 steps: hours).
    started = time.thread_time()
    masker = Masker([secret])
    shown = json.dumps(json.dumps({"k": secret}))
    assert json.loads(json.loads(masker.text(shown))) == {"k": MASK}
    assert masker.data(b"x" * 5_000_000) == b"x" * 5_000_000  # nothing to mask: one scan per form
    took = time.thread_time() - started
    assert took < 30, took


def test_json_inside_a_json_string_counts_decoded_again():
    inner_dict = json.dumps({"api_key": "inner-key-1234", "project": "visible"})
    found = secret_values(
        [
            ("hf_token", json.dumps(json.dumps("hf_inner_secret_1"))),
            ("wandb", json.dumps(inner_dict)),
            ("db_password", json.dumps("12345678")),  # a string sent JSON-encoded: a string
            ("x_token", json.dumps(json.dumps("87654321"))),
        ]
    )
    assert {"hf_inner_secret_1", "inner-key-1234", "12345678", "87654321"} <= set(found)
    assert "visible" not in found


def test_dict_keys_are_masked_too():
    masker = Masker(["key-that-is-a-secret"])
    assert masker.obj({"key-that-is-a-secret": ["key-that-is-a-secret", 3]}) == {MASK: [MASK, 3]}


PLAN_SECRETS = {
    "hf_token": TRICKY["backslash"],
    "db_password": TRICKY["both-quotes"],
    "api_key": TRICKY["cjk"],
    "nested": TRICKY["emoji"],
    "env": TRICKY["e-acute"],
    "cli": TRICKY["everything"],
}


def _shown_plan(cli: bool) -> tuple[str, dict[str, Any]]:
    hps = {
        "hf_token": json.dumps(PLAN_SECRETS["hf_token"]),  # SDK v2: JSON-encoded
        "db_password": PLAN_SECRETS["db_password"],  # SDK v3 / raw API: as it is
        "my_api_key": json.dumps(json.dumps(PLAN_SECRETS["api_key"])),  # encoded twice
        "wandb": json.dumps({"api_key": PLAN_SECRETS["nested"], "project": "visible-project"}),
        "epochs": "3",
    }
    environ = {"SAGEMAKER_PROGRAM": "t.py", "HF_API_TOKEN": PLAN_SECRETS["env"]}
    extra: dict[str, Any] = {}
    if cli:
        extra = {
            "cli_args": ("t.py", "--auth-token", PLAN_SECRETS["cli"], "--epochs", "3"),
            "scripts_found": ("/t.py",),
        }
    plan = build_plan(make_env(hyperparameters=hps, environ=environ, **extra))
    text = plan.to_json() + "\n" + plan.summary()
    return text, json.loads(plan.to_json())


@pytest.mark.parametrize("cli", [False, True], ids=["hyperparameters", "command-line"])
def test_the_plan_shows_no_form_of_any_secret(cli):
    text, shown = _shown_plan(cli)
    assert not CORE.search(text), CORE.findall(text)
    for secret in PLAN_SECRETS.values():
        assert not any(form in text for form in encoded_forms(secret))
    env = {name: item["value"] for name, item in shown["env"].items()}
    args = json.loads(env["SM_USER_ARGS"])
    if not cli:
        hps = json.loads(env["SM_HPS"])
        assert hps["hf_token"] == hps["db_password"] == MASK
        assert hps["wandb"] == {"api_key": MASK, "project": "visible-project"}
        assert json.loads(env["SM_TRAINING_ENV"])["hyperparameters"] == hps
        assert args[args.index("--hf_token") + 1] == MASK
        assert "api_key=****,project=visible-project" in args
    else:
        assert args == ["--auth-token", MASK, "--epochs", "3"]
        assert shown["command"][1:] == ["--auth-token", MASK, "--epochs", "3"]


# -- secrets in streams cut into reads ------------------------------------------------------


def test_held_is_only_the_first_lines_of_a_multi_line_secret():
    masker = Masker(["first-line-of-key\nsecond-line-of-key\nend"])
    assert masker.held(b"output\nfirst-line-of-key\n") == len(b"first-line-of-key\n")
    assert masker.held(b"first-line-of-key\nsecond-line-of-key\n") == len(
        b"first-line-of-key\nsecond-line-of-key\n"
    )
    assert masker.held(b"output\nother line\n") == 0
    assert masker.held(b"") == 0
    assert Masker(["one-line-secret"]).held(b"one-line-secret\n") == 0
    assert Masker(["ab\ncdefghijkl"]).held(b"ab\n") == 0  # too short to tell from output


def _relayed(secret: str, pieces: list[bytes]) -> bytes:
    """What the worker's relay writes to the rank's log for `pieces`, one read each."""
    read, write = os.pipe()
    log = os.pipe()
    relay = Relay(None, log[1], b"[algo-1 rank 0] ", Masker([secret]), True)
    for piece in pieces:
        relay.feed(piece)
    relay.close()
    os.close(log[1])
    written = b""
    while chunk := os.read(log[0], 65536):
        written += chunk
    for fd in (read, write, log[0]):
        os.close(fd)
    return written


@pytest.mark.parametrize("encoding", ["raw", "json", "repr-of-json", "shell"])
@pytest.mark.parametrize("secret", TRICKY.values(), ids=TRICKY.keys())
def test_the_relay_masks_every_form_whatever_the_reads_cut(secret, encoding):
    """The per-rank relay: a rank printing the secret in any form, the reads cut anywhere."""
    show, _ = ENCODINGS[encoding]
    data = ("before\n" + show(secret) + "\nafter\n").encode("utf-8", "surrogateescape")
    for cut in range(1, len(data), max(1, len(data) // 40)):
        written = _relayed(secret, [data[:cut], data[cut:]])
        assert not CORE.search(written.decode("utf-8", "replace")), (cut, written)


def test_a_multi_line_secret_printed_line_by_line_is_masked_in_the_relay():
    """A traceback is written a line at a time: each line of the secret may come in a read
    of its own; its lines are masked on their own then."""
    secret = TRICKY["newline"]
    lines = f"RuntimeError: bad key {secret}\n".encode().splitlines(keepends=True)
    written = _relayed(secret, lines)
    assert not CORE.search(written.decode()) and b"MIIEvQ" not in written


def test_the_torchrun_pump_holds_the_first_lines_of_a_secret_until_its_rest(capfd, monkeypatch):
    """torchrun prints its report a line at a time: the short middle line of a secret that
    arrives in a read of its own is masked with the rest, not shown alone."""
    secret = "first-line-of-key\nshort\nlast-line-of-the-key"
    monkeypatch.setattr(logs, "MASKER", Masker([secret]))
    lines = ["ordinary line", f"message: {secret}", "after"]
    script = (
        "import sys, time\n"
        f"for line in {chr(10).join(lines).splitlines(keepends=True)!r}:\n"
        "    sys.stderr.write(line); sys.stderr.flush(); time.sleep(0.05)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    output = TorchrunOutput(b"[algo-1 rank ")
    output.pump(process)
    process.wait()
    shown = capfd.readouterr().err
    assert shown == f"ordinary line\nmessage: {MASK}\nafter\n"
    assert list(output.tail) == ["ordinary line", f"message: {MASK}", "after"]


def test_lines_held_for_a_secret_s_rest_are_shown_when_the_stream_ends(capfd, monkeypatch):
    monkeypatch.setattr(logs, "MASKER", Masker(["first-line-of-key\nlast-line-of-the-key"]))
    script = "import sys; sys.stderr.write('one\\nkey: first-line-of-key\\n')"
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    output = TorchrunOutput(b"[algo-1 rank ")
    output.pump(process)
    process.wait()
    assert capfd.readouterr().err == f"one\nkey: {MASK}\n"  # a line of a secret on its own
    assert list(output.tail) == ["one", f"key: {MASK}"]


def test_a_secret_read_with_its_line_end_is_masked_without_joining_lines():
    """A token from a file or a Kubernetes secret often ends in a newline: the token is what is
    masked, so the line it ends stays a line of its own."""
    masker = Masker(["hf_token_value_1\n", "  padded-secret-2  "])
    assert masker.text("a hf_token_value_1\nb") == f"a {MASK}\nb"
    assert masker.data(b"x padded-secret-2 y\n") == f"x {MASK} y\n".encode()
    assert json.loads(masker.text(json.dumps({"k": "hf_token_value_1\n"}))) == {"k": MASK + "\n"}
