"""Which names and values are secrets: every listed credential masked, every ordinary value
visible, in the plan, in the bootstrap's lines and in the ranks' own output."""

import json

import pytest

from container_entry.masking import MASK, Masker, is_secret_name, secret_values
from container_entry.plan import build_plan
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
