"""Secrets in every form they take, in real processes (real bootstrap, real torchrun): a rank
that prints the SM_* variables (which hold them JSON-escaped), `os.environ` (the repr of that
JSON) or a dict, a script whose `@record` main raises with a token in the message (torchrun then
prints its failure report with that traceback), the `plan` command and DRY_RUN. Every secret
holds characters that each encoding writes differently (backslash, quotes, slash, non-ASCII
letters, emoji, control characters, line ends) around an ASCII core (`core-NN`) that every
encoding writes unchanged: a form left visible anywhere shows its core."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from container_entry.common.masking import MASK, encoded_forms
from tests.integration.conftest import bootstrap_argv, bootstrap_env, make_tree, run
from tests.ports import job_port

CORE = re.compile(r"core-\d\d")

RECORD_SCRIPT = """
import json, os, sys
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    token = sys.argv[sys.argv.index("--hf_token") + 1]
    rank = os.environ["RANK"]
    with open(os.environ["PROBE_RECEIVED"] + rank, "w") as handle:
        json.dump({"hf_token": token, "HF_TOKEN": os.environ["HF_TOKEN"]}, handle)
    print({"hf_token": token, "HF_TOKEN": os.environ["HF_TOKEN"]}, flush=True)
    raise RuntimeError(f"auth failed with key {os.environ['HF_TOKEN']} and {token}")


if __name__ == "__main__":
    main()
"""

PRINT_SCRIPT = """
import json, os, sys
names = ["SM_HPS", "SM_TRAINING_ENV", "SM_USER_ARGS", "SM_HP_HF_TOKEN", "SM_HP_WANDB"]
for name in names:
    print(name + "=" + os.environ[name])
    print(name + "=" + os.environ[name], file=sys.stderr)
print(os.environ)  # the repr of every variable: the JSON ones escaped once more
print(json.dumps(dict(os.environ)))  # JSON inside JSON
print(json.dumps(dict(os.environ), ensure_ascii=False), file=sys.stderr)
print({"argv": sys.argv[1:]})
print([arg.encode("utf-8", "surrogateescape") for arg in sys.argv[1:]])
print(os.environ["SSH_PRIVATE_KEY"])  # a multi-line secret, as it is
with open(os.environ["PROBE_RECEIVED"], "w") as handle:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, handle)
"""

# hyperparameters and environment variables; the values the script must receive as they are
HF_TOKEN = "hf_Sup\"er\\S\u00e9cret'Value-\u4e2d\U0001f600 core-01"
HP_TOKEN = 'q\\Zr8-Kx$ "\u00e9" / core-02'
PASSWORD = 'it\'s \u79d8\u5bc6 "both" core-03'
NESTED = "wandb/\U0001f511\\key\x07 core-04"
TWICE = 'sk-\u00fc\u00df\\"twice" core-05'
ENV_KEY = "tab\there\x1b[0m and \u00e9 core-06"
PEM = (
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC core-07\n"
    "-----END PRIVATE KEY-----"
)


def published(tree, *texts: str) -> dict[str, str]:
    """Everything a user, SageMaker or S3 gets to see: the given console texts and every file
    under <base>/output (failure, failure.json, rank logs and records, stacks, ...)."""
    seen = {f"console {index}": text for index, text in enumerate(texts)}
    for path in sorted(tree.output.rglob("*")):
        if path.is_file():
            seen[str(path.relative_to(tree.base))] = path.read_bytes().decode("utf-8", "replace")
    return seen


def assert_no_form_anywhere(seen: dict[str, str], secrets: list[str]) -> None:
    forms = {form for secret in secrets for form in encoded_forms(secret)}
    for where, text in seen.items():
        assert not CORE.search(text), (where, CORE.findall(text), text[-3000:])
        leaked = [form for form in forms if form in text]
        assert not leaked, (where, leaked)


def test_a_record_decorated_script_s_secret_is_masked_in_torchrun_s_report_too(tmp_path):
    """torch's `@record` writes the rank's traceback to an error file; torchrun prints it in its
    failure report: masked like everything else, and that report (the ChildFailedError
    traceback) is not on the console, where the rank's own lines already say it."""
    script = tmp_path / "record_train.py"
    script.write_text(RECORD_SCRIPT)
    tree = make_tree(tmp_path, hyperparameters={"hf_token": json.dumps(HP_TOKEN)}, script=script)
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM=script.name,
        PET_NPROC_PER_NODE="2",
        CONTAINER_ENTRY_MASTER_PORT=str(job_port()),
        HF_TOKEN=HF_TOKEN,
        PROBE_RECEIVED=str(tmp_path / "received-"),
    )
    result = run(bootstrap_argv(), env, timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    for rank in (0, 1):  # the script got the real values
        received = json.loads((tmp_path / f"received-{rank}").read_text())
        assert received == {"hf_token": HP_TOKEN, "HF_TOKEN": HF_TOKEN}
    seen = published(tree, result.stdout, result.stderr)
    assert_no_form_anywhere(seen, [HF_TOKEN, HP_TOKEN])
    failure = (tree.output / "failure").read_text()
    assert f"RuntimeError: auth failed with key {MASK} and {MASK}" in failure.splitlines()[0]
    assert f"] RuntimeError: auth failed with key {MASK} and {MASK}" in result.stderr
    assert f"{{'hf_token': '{MASK}', 'HF_TOKEN': '{MASK}'}}" in result.stdout
    console = result.stdout + result.stderr
    assert "ChildFailedError" not in console and "Root Cause" not in console, console
    assert "no error file defined for parent" not in console
    record = json.loads((tree.output / "data/container-entry/failure.json").read_text())
    assert record["ranks"]["0"]["exception"] == {
        "type": "RuntimeError",
        "message": f"auth failed with key {MASK} and {MASK}",
    }


def test_a_rank_printing_the_sm_variables_the_plan_and_dry_run_show_no_form_of_a_secret(
    tmp_path,
):
    script = tmp_path / "print_env.py"
    script.write_text(PRINT_SCRIPT)
    hps = {
        "hf_token": json.dumps(HF_TOKEN),  # SDK v2: JSON-encoded
        "db_password": PASSWORD,  # SDK v3 / raw API: as it is
        "wandb": json.dumps({"api_key": NESTED, "project": "visible-project"}),
        "my_api_key": json.dumps(json.dumps(TWICE)),  # a JSON string, JSON-encoded again
        "epochs": "3",
    }
    tree = make_tree(tmp_path, hyperparameters=hps, script=script)
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM=script.name,
        PET_NPROC_PER_NODE="1",
        CONTAINER_ENTRY_MASTER_PORT=str(job_port()),
        HF_API_TOKEN=ENV_KEY,
        SSH_PRIVATE_KEY=PEM,
        PROBE_RECEIVED=str(tmp_path / "received.json"),
    )
    secrets = [HF_TOKEN, PASSWORD, NESTED, TWICE, json.dumps(TWICE), ENV_KEY, PEM]
    result = run(bootstrap_argv(), env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    received = json.loads((tmp_path / "received.json").read_text())
    assert received["argv"][received["argv"].index("--hf_token") + 1] == HF_TOKEN
    assert received["argv"][received["argv"].index("--db_password") + 1] == PASSWORD
    assert received["env"]["SSH_PRIVATE_KEY"] == PEM and received["env"]["HF_API_TOKEN"] == ENV_KEY
    assert json.loads(received["env"]["SM_HPS"])["wandb"]["api_key"] == NESTED

    plan = run([sys.executable, "-m", "container_entry", "plan"], env)
    assert plan.returncode == 0, plan.stderr[-3000:]
    dry = run(bootstrap_argv(), {**env, "CONTAINER_ENTRY_DRY_RUN": "true"})
    assert dry.returncode == 0, dry.stderr[-3000:]
    seen = published(
        tree, result.stdout, result.stderr, plan.stdout, plan.stderr, dry.stdout, dry.stderr
    )
    assert_no_form_anywhere(seen, secrets)

    # the rank's lines and the plan read back as if each secret had been ****
    assert "[container-entry] arguments   " in result.stderr  # the plan block printed at start
    lines = dict(
        line.split("] ", 1)[1].split("=", 1)
        for line in result.stdout.splitlines()
        if re.match(r"^\[algo-1 rank 0\] SM_[A-Z_]+=", line)
    )
    shown_hps = json.loads(lines["SM_HPS"])
    assert shown_hps["hf_token"] == shown_hps["db_password"] == shown_hps["my_api_key"] == MASK
    assert shown_hps["wandb"] == {"api_key": MASK, "project": "visible-project"}
    assert json.loads(lines["SM_TRAINING_ENV"])["hyperparameters"] == shown_hps
    args = json.loads(lines["SM_USER_ARGS"])
    assert args[args.index("--hf_token") + 1] == MASK
    assert json.loads(lines["SM_HP_WANDB"]) == {"api_key": MASK, "project": "visible-project"}
    for text in (plan.stdout, dry.stdout):
        env_vars = {name: item["value"] for name, item in json.loads(text)["env"].items()}
        assert json.loads(env_vars["SM_HPS"]) == shown_hps
        assert json.loads(env_vars["SM_USER_ARGS"]) == args
        assert "visible-project" in env_vars["SM_TRAINING_ENV"]


def test_console_output_of_the_bootstrap_is_valid_utf8_with_secrets_masked(tmp_path):
    """A secret holding a byte that is not UTF-8 (an environment variable is bytes): masked
    as those bytes in the rank's output, and as Python escapes it in the plan."""
    script = tmp_path / "raw_bytes.py"
    script.write_text(
        "import os, sys\n"
        "sys.stdout.buffer.write(b'raw ' + os.environb[b'DB_PASSWORD'] + b'\\n')\n"
        "print(os.environ)\n"
    )
    tree = make_tree(tmp_path, script=script)
    value = b"bytes-\xff\xfe-core-08"
    env = {
        key.encode(): item.encode("utf-8", "surrogateescape")
        for key, item in bootstrap_env(
            tree,
            SAGEMAKER_PROGRAM=script.name,
            PET_NPROC_PER_NODE="1",
            CONTAINER_ENTRY_MASTER_PORT=str(job_port()),
        ).items()
    }
    env[b"DB_PASSWORD"] = value
    result = subprocess.run(
        bootstrap_argv(), env=env, capture_output=True, timeout=180, cwd="/", check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert value not in result.stdout + result.stderr
    assert b"[algo-1 rank 0] raw ****\n" in result.stdout
    seen = published(tree, result.stdout.decode("utf-8", "replace"))
    assert_no_form_anywhere(seen, [value.decode("utf-8", "surrogateescape")])
    assert Path(tree.output / "success").exists()
