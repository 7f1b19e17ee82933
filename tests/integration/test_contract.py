"""The launch contract in real processes (real bootstrap, real torchrun of the installed torch):
any hyperparameter reaches the script byte for byte, reserved keys never do, every way a script
fails is named in the failure file's first line, secrets never leave the process in clear, and
the `docker run` forms a new user types work."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container_entry.plan import hyperparameters
from tests.integration.conftest import (
    REPO,
    bootstrap_argv,
    bootstrap_env,
    launcher_of,
    make_tree,
    ranks_started,
    run,
    wait_for,
)

ARGV_PROBE = REPO / "tests" / "scripts" / "argv_probe.py"
FAULT = REPO / "tests" / "scripts" / "fault_probe.py"


def probe_env(tree, **extra):
    return bootstrap_env(tree, SAGEMAKER_PROGRAM="argv_probe.py", PET_NPROC_PER_NODE="1", **extra)


def received(tree, rank: int = 0) -> list[str]:
    return json.loads((tree.output / "data" / f"argv-rank-{rank}.json").read_text())["argv"]


def first_line(tree) -> str:
    return (tree.output / "failure").read_text().splitlines()[0]


def torchrun_option_prefixes() -> list[str]:
    """Every prefix of every long option of the installed torchrun, as torchrun defines them."""
    from torch.distributed.run import get_args_parser

    options = {s for a in get_args_parser()._actions for s in a.option_strings if s[:2] == "--"}
    return sorted({o[2:][:n] for o in options for n in range(1, len(o) - 1)})


def test_every_prefix_of_every_torchrun_option_reaches_the_script_byte_for_byte(tmp_path):
    names = torchrun_option_prefixes()
    assert {"log", "local", "node", "max", "nproc", "rdzv", "master", "shutdown"} <= set(names)
    hps = {name: json.dumps(f"value of {name}") for name in names}
    hps["odd"] = json.dumps(" spaces\ttabs\nnewline é ünïcödé $(x) `y` '\" --nnodes 9")
    tree = make_tree(tmp_path, hyperparameters=hps, script=ARGV_PROBE)
    result = run(bootstrap_argv(), probe_env(tree), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = hyperparameters.to_args(hyperparameters.split(hps).user)
    assert received(tree) == expected
    assert len(expected) == 2 * (len(names) + 1)


def test_reserved_hyperparameters_never_reach_a_strict_script(tmp_path):
    from sagemaker_training import params

    hps = {key: json.dumps("x") for key in params.SAGEMAKER_HYPERPARAMETERS}
    hps.pop("sagemaker_submit_directory")  # "x" is no code directory
    hps.update(
        {
            "sagemaker_program": '"argv_probe.py"',
            "sagemaker_container_log_level": "10",
            "_tuning_objective_metric": '"eval_loss"',  # every tuning job adds it
            "sagemaker_distributed_dataparallel_enabled": "false",
            "epochs": "2",
        }
    )
    tree = make_tree(tmp_path, hyperparameters=hps, script=ARGV_PROBE)
    env = bootstrap_env(tree, PET_NPROC_PER_NODE="1", PROBE_ACTION="strict")
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert received(tree) == ["--epochs", "2"]
    plan = json.loads(run([sys.executable, "-m", "container_entry", "plan"], env).stdout)
    sm = {name: item["value"] for name, item in plan["env"].items()}
    assert json.loads(sm["SM_HPS"]) == {"epochs": 2}
    assert not any(name.startswith("SM_HP__") for name in sm)
    assert json.loads(sm["SM_FRAMEWORK_PARAMS"]) == {
        "sagemaker_distributed_dataparallel_enabled": False
    }
    assert json.loads(sm["SM_TRAINING_ENV"])["log_level"] == 10  # as sagemaker-training
    assert json.loads(sm["SM_USER_ARGS"]) == ["--epochs", "2"]


TAB_SOURCE = "if True:\n\tx = 1\n        y = 2\n"
SCRIPT_FAILURES = [
    (
        "syntax",
        {"train.py": "def (:\n"},
        1,
        "exit code 1: SyntaxError: invalid syntax (train.py, line 1)",
    ),
    (
        "indentation",
        {"train.py": "if True:\nprint(1)\n"},
        1,
        "exit code 1: IndentationError: expected an indented block after 'if' statement on "
        "line 1 (train.py, line 2)",
    ),
    ("tab", {"train.py": TAB_SOURCE}, 1, "exit code 1: TabError: inconsistent use of tabs"),
    (
        "syntax-in-module",
        {"train.py": "import helper\n", "helper.py": "x = = 1\n"},
        1,
        "exit code 1: SyntaxError: invalid syntax (helper.py, line 1)",
    ),
    (
        "exit-message",
        {"train.py": "import sys\nsys.exit('fatal: the data channel is empty')\n"},
        1,
        "exit code 1: fatal: the data channel is empty",
    ),
    (
        "usage-error",
        {"train.py": "import argparse\nargparse.ArgumentParser().parse_args(['--nope'])\n"},
        2,
        "exit code 2: train.py: error: unrecognized arguments: --nope",
    ),
    (
        "no-interpreter-line",
        {"train.sh": "echo this has no interpreter line\n"},
        126,
        "exit code 126: ExecError: cannot execute",
    ),
    (
        "missing-interpreter",
        {"train.sh": "#!/usr/bin/no-such-interpreter\necho hi\n"},
        127,
        "exit code 127: ExecError: cannot execute",
    ),
]


@pytest.mark.parametrize(
    ("name", "files", "code", "expected"), SCRIPT_FAILURES, ids=[c[0] for c in SCRIPT_FAILURES]
)
def test_every_way_a_script_fails_is_named_in_the_first_line(tmp_path, name, files, code, expected):
    tree = make_tree(tmp_path, script=None)
    for file_name, source in files.items():
        (tree.base / "code" / file_name).write_text(source)
    entry = next(iter(files))
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM=entry, PET_NPROC_PER_NODE="1")
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == code, result.stderr[-3000:]
    line = first_line(tree)
    assert line.startswith(f"rank 0 (local 0) on algo-1: {expected}"), line
    assert "error_file" not in line and "Traceback" not in line
    if name == "missing-interpreter":
        assert "'/usr/bin/no-such-interpreter'" in line and "was not found" in line


def test_a_command_entry_point_without_its_run_bit_is_made_executable(tmp_path):
    tree = make_tree(tmp_path, script=None)
    script = tree.base / "code" / "train.sh"
    script.write_text(
        '#!/bin/sh\necho "shell entry point ran with $*" > "$SM_OUTPUT_DATA_DIR/ran"\n'
    )
    script.chmod(0o644)  # what an untarred sourcedir or an S3 code channel delivers
    tree.base.joinpath("input/config/hyperparameters.json").write_text('{"epochs": "1"}')
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="train.sh", PET_NPROC_PER_NODE="1")
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tree.output / "data" / "ran").read_text() == "shell entry point ran with --epochs 1\n"


def test_secrets_are_masked_everywhere_and_only_secrets(tmp_path):
    secret, nested = "sk-live-0123456789abcdef", "nested-wandb-key-987654"
    hps = {
        "openai_api_key": json.dumps(secret),  # SDK v2 encoding: '"sk-..."'
        "wandb": json.dumps({"api_key": nested, "project": "visible-project"}),
        "tokenizer_name": json.dumps("bert-base-uncased"),
        "max_tokens": "4096",
        "use_auth_token": "true",
    }
    tree = make_tree(tmp_path, hyperparameters=hps, script=ARGV_PROBE)
    # the script takes the key from its own arguments: only the decoded hyperparameter can have
    # registered it for masking (no environment variable holds it)
    env = probe_env(tree, PROBE_ACTION="print-secret", PROBE_KEY_ARG="--openai_api_key")
    assert not any(secret in value for value in env.values())
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert received(tree)[received(tree).index("--openai_api_key") + 1] == secret  # script has it
    plan = run([sys.executable, "-m", "container_entry", "plan"], env).stdout
    run_dir = tree.output / "data" / "container-entry"
    published = {
        "console": result.stdout + result.stderr,
        "plan": plan,
        "failure": (tree.output / "failure").read_text(),
        "failure.json": (run_dir / "failure.json").read_text(),
        "rank record": (run_dir / "rank-0.json").read_text(),
        "rank log": (run_dir / "logs" / "rank-0.log").read_text(),
    }
    for where, text in published.items():
        assert secret not in text and nested not in text, where
    assert "RuntimeError: auth failed with key ****" in published["failure"]
    assert "using key **** now" in published["rank log"]
    for visible in ("--tokenizer_name bert-base-uncased", "--max_tokens 4096", "visible-project"):
        assert visible in published["console"], visible
    assert "--use_auth_token True" in published["console"]  # a boolean is never a secret


def test_train_with_a_relative_script_finds_it_in_the_code_directory(tmp_path):
    """`docker run -v "$PWD":/opt/ml/code IMAGE train train.py --epochs 1` (cwd is /)."""
    tree = make_tree(tmp_path, script=ARGV_PROBE)
    (tree.base / "input/config/resourceconfig.json").unlink()  # plain docker run: local mode
    env = bootstrap_env(tree, PET_NPROC_PER_NODE="1")
    result = run(bootstrap_argv("argv_probe.py", "--epochs", "1"), env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert received(tree) == ["--epochs", "1"]
    assert f"code        {tree.base}/code/argv_probe.py " in result.stderr
    missing = run(bootstrap_argv("nope.py"), env, timeout=60)
    assert missing.returncode == 2
    assert f"looked for /nope.py and {tree.base}/code/nope.py" in first_line(tree)


def test_plan_without_a_script_prints_what_it_resolved_and_the_problem(tmp_path):
    tree = make_tree(tmp_path, script=None)
    result = run([sys.executable, "-m", "container_entry", "plan"], bootstrap_env(tree))
    assert result.returncode == 2
    plan = json.loads(result.stdout)
    assert plan["topology"]["hosts"] == ["algo-1"] and plan["command"][0] == "<entry script>"
    assert plan["problems"] and "no entry script" in plan["problems"][0]
    assert "SM_MODEL_DIR" in plan["env"]


def _planted(tmp_path: Path, target: str, only_call: int = 1) -> dict[str, str]:
    """A sitecustomize that makes `target` (module:attribute) raise on its Nth call in the
    bootstrap's own process: an unexpected defect, planted without touching the product."""
    site = tmp_path / "plant"
    site.mkdir()
    module, attribute = target.split(":")
    owner, _, method = attribute.partition(".")
    (site / "sitecustomize.py").write_text(
        f"""
import os
if os.environ.get("RANK") is None:  # the bootstrap, not a worker
    import importlib
    module = importlib.import_module({module!r})
    owner = getattr(module, {owner!r}) if {method!r} else module
    name = {method!r} or {owner!r}
    original = getattr(owner, name)
    calls = []
    def planted(*args, **kwargs):
        calls.append(1)
        if len(calls) == {only_call}:
            raise RuntimeError("planted defect")
        return original(*args, **kwargs)
    setattr(owner, name, planted)
"""
    )
    return {"PYTHONPATH": str(site)}


def test_an_unexpected_exception_is_one_line_a_failure_file_and_exit_70(tmp_path):
    tree = make_tree(tmp_path, script=ARGV_PROBE)
    env = probe_env(tree, **_planted(tmp_path, "container_entry.supervise.user_code:prepare"))
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == 70, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert first_line(tree) == "internal error: RuntimeError: planted defect"
    traceback_files = list((tree.output / "data" / "container-entry").glob("internal-error-*.txt"))
    assert traceback_files and "planted defect" in traceback_files[0].read_text()


TRAINING = "training"  # a stop once every rank started, not at a fixed moment


def handles_sigterm(pid: int, timeout: float = 10.0) -> bool:
    """Wait until the process caught SIGTERM (its SigCgt mask): the bootstrap's first act.
    Before it, as PID 1 in a container the kernel drops the signal, and here it kills."""
    from container_entry.common.workers import catches

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if catches(pid, signal.SIGTERM):
            return True
        time.sleep(0.001)
    return False


@pytest.mark.parametrize("release", ["newest", "2.9.0"])
def test_stop_at_any_moment_of_the_start_is_a_stopped_job(tmp_path, request, release):
    """SIGTERM at every phase (reading, preparing, launching, rendezvous, training): always 143
    and a failure file, never a traceback, a hang or a survivor; on the newest torch (torchrun
    told --shutdown-timeout), and planned for torch 2.9 (no such flag) with the .venv's."""
    python, extra = launcher_of(request, release, tmp_path / "fake-torch")
    # fixed moments, each stopping whatever phase it hits (a loaded machine moves them, so they
    # assert only what holds at any phase); the last waits for the event instead: training, both
    # ranks started (a fixed 5 s was no phase at all where the start took longer)
    delays: list[float | str] = [0.0, 0.05, 0.15, 0.3, 0.5, 0.8, 1.2, 1.8, 2.5, 3.5, TRAINING]
    for index, delay in enumerate(delays):
        tree = make_tree(tmp_path / str(index), script=FAULT)
        hps = {"steps": "1000", "step-seconds": "0.1", "checkpoint-on-term": "true"}
        tree.base.joinpath("input/config/hyperparameters.json").write_text(json.dumps(hps))
        env = bootstrap_env(
            tree, SAGEMAKER_PROGRAM="fault_probe.py", PET_NPROC_PER_NODE="2", **extra
        )
        process = subprocess.Popen(
            bootstrap_argv(python=python),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # so that a failed case leaves nothing behind
        )
        assert handles_sigterm(process.pid)
        if delay == TRAINING:
            if not wait_for(lambda tree=tree: ranks_started(tree), 120):
                os.killpg(process.pid, signal.SIGKILL)
                pytest.fail(f"the ranks never started:\n{process.communicate()[1][-4000:]}")
        else:
            time.sleep(delay)
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the next tests need the master port
            _, err = process.communicate()
            pytest.fail(f"SIGTERM after {delay} s: still running 60 s later:\n{err[-4000:]}")
        assert process.returncode == 143, (delay, err[-2000:])
        assert time.monotonic() - started < 30, delay
        assert "Traceback" not in err, (delay, err[-6000:])
        line = first_line(tree)
        assert "stopped by SIGTERM" in line, (delay, line)
        if delay == TRAINING:  # the plan said who delivers the stop
            assert "a stop reaches the ranks from the bootstrap (100 s grace)" in err
        logs = (tree.output / "data" / "container-entry" / "logs").glob("rank-*.log")
        for path in logs:
            for pid in re.findall(r"started rank \d+ pid (\d+)", path.read_text()):
                stat = Path(f"/proc/{pid}/stat")
                assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"
        # nor anything else the bootstrap started (torchrun's interpreter, started before the
        # join, included): its session is empty
        assert session_members(process.pid) == [], delay


def session_members(sid: int) -> list[str]:
    """The live processes of session `sid`, as 'pid command'."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = stat.with_name("cmdline").read_bytes().replace(b"\0", b" ")[:120]
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.append(f"{stat.parent.name} {command.decode(errors='replace')}")
    return found


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"train.py": "def (:\n"}, "SyntaxError: invalid syntax (train.py, line 1)"),
        ({"train.py": "import no_such_module_here\n"}, "ModuleNotFoundError: No module named"),
        ({"train.py": "import argparse\nargparse.ArgumentParser().parse_args()\n"}, None),
    ],
    ids=["syntax", "import", "usage"],
)
def test_failures_that_would_repeat_do_not_use_up_the_restarts(tmp_path, files, expected):
    tree = make_tree(tmp_path, script=None)
    for name, source in files.items():
        (tree.base / "code" / name).write_text(source)
    hps = {"container_entry_max_restarts": "3", "unexpected": "1"}
    tree.base.joinpath("input/config/hyperparameters.json").write_text(json.dumps(hps))
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="train.py", PET_NPROC_PER_NODE="1")
    started = time.monotonic()
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode in (1, 2), result.stderr[-3000:]
    line = first_line(tree)
    assert "(not restarted: " in line and "restart)" not in line.split("(not restarted")[0], line
    if expected:
        assert expected in line, line
    assert time.monotonic() - started < 60
