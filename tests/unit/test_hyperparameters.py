import pytest

from container_entry.common.errors import ConfigError
from container_entry.plan import hyperparameters as hp

# The same user intent as each client encodes it in hyperparameters.json.
ENCODINGS = {
    "sdk_v2_framework": {"epochs": "3", "lr": "0.001", "model": '"bert"', "fp16": "true"},
    "generic_estimator_str": {"epochs": "3", "lr": "0.001", "model": "bert", "fp16": "True"},
    "sdk_v3_raw": {"epochs": "3", "lr": "0.001", "model": "bert", "fp16": "true"},
    "raw_api": {"epochs": "3", "lr": "1e-3", "model": "bert", "fp16": "TRUE"},
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_every_encoding_reaches_the_script_as_the_incumbent_renders_it(encoding):
    args = hp.to_args(hp.split(ENCODINGS[encoding]).user)
    assert args[0:2] == ["--epochs", "3"]
    assert args[args.index("--model") + 1] == "bert"  # never '"bert"' with quotes
    assert args[args.index("--fp16") + 1] in ("true", "True", "TRUE")
    assert float(args[args.index("--lr") + 1]) == 0.001


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        ('"bert"', "bert"),
        ("3", 3),
        ("0.5", 0.5),
        ("true", True),
        ("True", "True"),
        ('{"a": 1}', {"a": 1}),
        ("[1, 2]", [1, 2]),
        ("not json {", "not json {"),
        ("", ""),
        (7, 7),
    ],
)
def test_decode(raw, decoded):
    assert hp.decode(raw) == decoded


def test_reserved_keys_are_consumed_not_passed():
    split = hp.split(
        {
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": '"s3://b/k/sourcedir.tar.gz"',
            "sagemaker_torch_distributed_enabled": "true",
            "container_entry_master_port": "1234",
            "epochs": "2",
        }
    )
    assert split.user == {"epochs": 2}
    assert split.sagemaker["sagemaker_program"] == "train.py"
    assert split.settings == {"master_port": 1234}
    assert hp.to_args(split.user) == ["--epochs", "2"]


def test_one_letter_keys_and_sorting_match_the_incumbent():
    assert hp.to_args({"z": 1, "b": "x", "alpha": 2}) == ["--alpha", "2", "-b", "x", "-z", "1"]


@pytest.mark.parametrize(
    "hostile",
    ["a b  c", 'it\'s "quoted"', "$(touch /tmp/pwned)", "`id`", "line1\nline2", "; rm -rf /", ""],
)
def test_hostile_values_stay_literal(hostile):
    # SDK v3 / raw API strings reach the script byte for byte, as one argv element
    assert hp.to_args(hp.split({"v": hostile}).user) == ["-v", hostile]


@pytest.mark.parametrize(
    ("key", "problem"),
    [("", "is empty"), ("a=b", "contains '='"), ("a\0b", "NUL"), ("\ud800x", "lone surrogate")],
)
def test_unusable_names_are_errors_naming_the_key(key, problem):
    with pytest.raises(ConfigError, match=problem) as raised:
        hp.split({key: "1"})
    assert str(raised.value).startswith("hyperparameters.json: hyperparameter name ")


@pytest.mark.parametrize(("value", "problem"), [('"a\u0000b"', "NUL"), ('"\ud800"', "surrogate")])
def test_values_no_process_can_receive_are_errors_naming_the_key(value, problem):
    with pytest.raises(ConfigError, match=f"hyperparameter 'note' .*{problem}"):
        hp.to_args(hp.split({"note": value}).user)


def test_tuning_jobs_objective_metric_and_every_reserved_key_never_reach_the_script():
    from sagemaker_training import params

    raw = {key: '"x"' for key in params.SAGEMAKER_HYPERPARAMETERS}
    raw["_tuning_objective_metric"] = '"eval_loss"'
    split = hp.split({**raw, "epochs": "1"})
    assert split.user == {"epochs": 1}
    assert set(params.SAGEMAKER_HYPERPARAMETERS) <= set(split.sagemaker)
