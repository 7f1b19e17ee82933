"""Bad input: one clear line naming the file or value, a failure file, a non-zero exit, and
nothing the user put in /opt/ml/model or /opt/ml/checkpoints touched."""

from __future__ import annotations

import pytest

from tests.integration.conftest import bootstrap_argv, bootstrap_env, make_tree, run


def corrupt_resourceconfig(tree):
    (tree.base / "input/config/resourceconfig.json").write_text('{"current_host": "algo-1",')


def corrupt_hyperparameters(tree):
    (tree.base / "input/config/hyperparameters.json").write_text("[1, 2")


def unknown_current_host(tree):
    (tree.base / "input/config/resourceconfig.json").write_text(
        '{"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]}'
    )


def bad_knob(tree):
    (tree.base / "input/config/hyperparameters.json").write_text(
        '{"container_entry_master_port": "\\"http\\""}'
    )


def missing_script(tree):
    (tree.base / "code" / "ddp_probe.py").unlink()


def failing_requirements(tree):
    (tree.base / "code" / "requirements.txt").write_text("this-package-does-not-exist==0.0.0\n")


CASES = [
    (corrupt_resourceconfig, 2, "resourceconfig.json: malformed JSON"),
    (corrupt_hyperparameters, 2, "hyperparameters.json: malformed JSON"),
    (unknown_current_host, 2, "current_host 'algo-3' is not in hosts"),
    (bad_knob, 2, "container_entry_master_port='http'"),
    (missing_script, 2, "entry script 'ddp_probe.py' not found in"),
    (failing_requirements, 2, "requirements.txt: pip install failed"),
]


@pytest.mark.parametrize(("breakage", "code", "message"), CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_input(tmp_path, breakage, code, message):
    tree = make_tree(tmp_path)
    for kept in ("model", "checkpoints"):
        (tree.base / kept).mkdir(exist_ok=True)
        (tree.base / kept / "precious.bin").write_bytes(b"\x00user")
    breakage(tree)
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py", PIP_NO_INDEX="1")
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == code, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    failure = (tree.output / "failure").read_text()
    assert message in failure and failure.count("\n") == 1
    for kept in ("model", "checkpoints"):
        assert (tree.base / kept / "precious.bin").read_bytes() == b"\x00user"
    assert not (tree.output / "success").exists()


def test_failing_worker_exits_with_its_code_and_writes_a_failure_file(tmp_path):
    tree = make_tree(tmp_path, hyperparameters={"exit-code": "3"})
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py", PET_NPROC_PER_NODE="2")
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode != 0
    failure = (tree.output / "failure").read_text()
    assert "algo-1" in failure
    assert not (tree.output / "success").exists()


def test_plan_is_a_dry_run(tmp_path):
    tree = make_tree(tmp_path, hyperparameters={"epochs": "1"})
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py")
    import json
    import sys

    result = run([sys.executable, "-m", "container_entry", "plan"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["hosts"] == ["algo-1"] and plan["user_args"] == ["--epochs", "1"]
    assert not (tree.output / "success").exists() and not (tree.output / "data").exists()


def test_dry_run_knob_makes_train_print_the_plan(tmp_path):
    tree = make_tree(tmp_path, hyperparameters={"container_entry_dry_run": "true", "lr": "0.1"})
    result = run(bootstrap_argv(), bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py"), 60)
    assert result.returncode == 0, result.stderr
    import json

    plan = json.loads(result.stdout)
    assert plan["user_args"] == ["--lr", "0.1"] and plan["env"]["SM_HP_LR"]["value"] == "0.1"
    assert not (tree.output / "success").exists() and not (tree.output / "data").exists()
