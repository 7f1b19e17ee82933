"""Bad input: one clear line naming the file or value, a failure file, a non-zero exit, and
nothing the user put in /opt/ml/model or /opt/ml/checkpoints touched."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.integration.conftest import PROBE, bootstrap_argv, bootstrap_env, make_tree, run
from tests.ports import job_port


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


def invalid_utf8(name):
    def breakage(tree):
        path = tree.base / "input/config" / name
        path.write_bytes(path.read_bytes()[:-1] + b', "x": "\xff\xfe"}')

    breakage.__name__ = f"invalid_utf8_{name.split('.')[0]}"
    return breakage


def hyperparameter(key, value):
    def breakage(tree):
        (tree.base / "input/config/hyperparameters.json").write_text(json.dumps({key: value}))

    breakage.__name__ = f"hyperparameter_{key[:12]}"
    return breakage


def environment(name, value):
    def breakage(tree):
        tree.extra_env[name] = value

    breakage.__name__ = f"env_{name}"
    return breakage


def truncated_sourcedir(tree):
    (tree.base / "code" / "ddp_probe.py").unlink()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(str(PROBE), arcname="ddp_probe.py")
    channel = tree.base / "input" / "data" / "code"
    channel.mkdir(parents=True)
    (channel / "sourcedir.tar.gz").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])


CASES = [
    (corrupt_resourceconfig, 2, "resourceconfig.json: malformed JSON"),
    (corrupt_hyperparameters, 2, "hyperparameters.json: malformed JSON"),
    (unknown_current_host, 2, "current_host 'algo-3' is not in hosts"),
    (bad_knob, 2, "container_entry_master_port='http'"),
    (missing_script, 2, "entry script 'ddp_probe.py' not found in"),
    (failing_requirements, 2, "requirements.txt: pip install failed"),
    *(
        (invalid_utf8(name), 2, f"{name}: not valid UTF-8 (byte 0xff at offset")
        for name in ("resourceconfig.json", "hyperparameters.json", "inputdataconfig.json")
    ),
    (environment("PET_MASTER_PORT", "abc"), 2, "PET_MASTER_PORT='abc': not an integer"),
    (environment("PET_MAX_RESTARTS", "-1"), 2, "PET_MAX_RESTARTS='-1': must be between"),
    (environment("PET_NPROC_PER_NODE", "lots"), 2, "PET_NPROC_PER_NODE='lots': a positive"),
    (
        environment("CONTAINER_ENTRY_JOIN_TIMEOUT", "nan"),
        2,
        "CONTAINER_ENTRY_JOIN_TIMEOUT='nan': must be a finite number",
    ),
    (
        environment("CONTAINER_ENTRY_STOP_GRACE_PERIOD", "inf"),
        2,
        "CONTAINER_ENTRY_STOP_GRACE_PERIOD='inf': must be a finite number",
    ),
    (hyperparameter("a=b", "1"), 2, "hyperparameter name 'a=b' contains '='"),
    (hyperparameter("note", json.dumps("a\u0000b")), 2, "hyperparameter 'note' contains a NUL"),
    (
        hyperparameter("big", json.dumps("x" * 200_000)),
        2,
        "environment variable SM_HPS is 200,",
    ),
    (truncated_sourcedir, 2, "sourcedir.tar.gz: cannot extract"),
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


PLAN_CASES = [
    case for case in CASES if case[0].__name__.startswith(("invalid_utf8", "env_", "hyper"))
]


@pytest.mark.parametrize(
    ("breakage", "code", "message"), PLAN_CASES, ids=[c[0].__name__ for c in PLAN_CASES]
)
def test_bad_input_in_plan_is_one_line_too(tmp_path, breakage, code, message):
    tree = make_tree(tmp_path)
    breakage(tree)
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py")
    result = run([sys.executable, "-m", "container_entry", "plan"], env, timeout=60)
    assert result.returncode == code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert message in result.stderr + result.stdout


def test_failing_worker_exits_with_its_code_and_writes_a_failure_file(tmp_path):
    """One rank: the check is the job's exit and its failure file, of any failing rank."""
    tree = make_tree(tmp_path, hyperparameters={"exit-code": "3"})
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py", PET_NPROC_PER_NODE="1")
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
    assert plan["topology"]["hosts"] == ["algo-1"] and plan["user_args"] == ["--epochs", "1"]
    assert not (tree.output / "success").exists() and not (tree.output / "data").exists()


def test_dry_run_knob_makes_train_print_the_plan(tmp_path):
    tree = make_tree(tmp_path, hyperparameters={"container_entry_dry_run": "true", "lr": "0.1"})
    result = run(bootstrap_argv(), bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py"), 60)
    assert result.returncode == 0, result.stderr
    import json

    plan = json.loads(result.stdout)
    assert plan["user_args"] == ["--lr", "0.1"] and plan["env"]["SM_HP_LR"]["value"] == "0.1"
    assert not (tree.output / "success").exists() and not (tree.output / "data").exists()


def test_a_nul_in_a_hyperparameter_is_one_line_also_when_the_script_is_on_the_command_line(
    tmp_path,
):
    """`train script.py ARGS` ignores hyperparameters.json for the arguments, but its values still
    become SM_HP_<NAME> variables: a NUL there is the same one line, never a launch crash."""
    tree = make_tree(tmp_path)
    hyperparameter("note", json.dumps("a\u0000b"))(tree)
    env = bootstrap_env(tree)
    result = run(bootstrap_argv(str(tree.base / "code" / "ddp_probe.py"), "--x", "1"), env, 120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    failure = (tree.output / "failure").read_text()
    assert "hyperparameter 'note' contains a NUL" in failure and failure.count("\n") == 1


# Names that are not UTF-8 (each a different way to be invalid), or that hold a line break
ODD_NAMES = {
    b"donn\xe9es.csv": "donn\\xe9es.csv",  # Latin-1
    b"\xff\xfe.bin": "\\xff\\xfe.bin",  # never valid
    b"caf\xc3": "caf\\xc3",  # a truncated sequence
    b"\xed\xa0\x80.txt": "\\xed\\xa0\\x80.txt",  # an encoded surrogate
    b"\xc0\xaf.txt": "\\xc0\\xaf.txt",  # an overlong '/'
    b"two\nlines.txt": "two\\nlines.txt",  # valid, but it would break the line
}


def run_bytes(argv: list[str], env: dict) -> tuple[int, str, str]:
    """The bootstrap's exit code and its stdout and stderr; every line of its own (not a
    rank's: those are the rank's bytes, relayed unchanged) must be valid UTF-8."""
    result = subprocess.run(argv, env=env, capture_output=True, timeout=120, cwd="/", check=False)
    for line in (result.stdout + result.stderr).splitlines():
        if not line.startswith(b"[algo-1 rank "):
            line.decode("utf-8")
    out, err = (stream.decode("utf-8", "replace") for stream in (result.stdout, result.stderr))
    return result.returncode, out, err


@pytest.mark.parametrize("name", list(ODD_NAMES), ids=ascii)
def test_a_missing_entry_script_beside_a_name_that_is_not_utf8_is_bad_input(tmp_path, name):
    """The folder listing in the error once crashed our own writers (UnicodeEncodeError,
    exit 1, our traceback, an empty failure file): now exit 2, one line naming the script
    and the file as `\\xNN`, a failure file with that line."""
    tree = make_tree(tmp_path)
    (tree.base / "code" / "ddp_probe.py").unlink()
    with open(os.fsencode(tree.base / "code") + b"/" + name, "wb"):
        pass
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM="ddp_probe.py",
        PIP_NO_INDEX="1",
        CONTAINER_ENTRY_MASTER_PORT=str(job_port()),  # not 29500: other jobs may hold it
    )
    code, _, err = run_bytes(bootstrap_argv(), env)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err[-2000:]
    assert "entry script 'ddp_probe.py' not found in" in errors[0] and ODD_NAMES[name] in errors[0]
    failure = (tree.output / "failure").read_bytes().decode("utf-8")
    assert failure.count("\n") == 1 and errors[0].split("error: ")[1] in failure


ECHO = b"""
import os, sys
print("argv", [os.fsencode(a) for a in sys.argv[1:]], os.environb.get(b"ODD_VALUE"))
sys.stdout.buffer.write(b"raw \\xe9\\xff from the rank\\n")
if "--fail" in sys.argv:
    sys.stderr.buffer.write(b"fatal: cannot read donn\\xe9es.csv\\n")
    sys.exit(3)
"""


def odd_job(tmp_path, *, script: bytes, program: bytes | None = None, hps=None, folder=b"job"):
    """A one-rank job whose script, program name, environment or base folder hold bytes that
    are not UTF-8; the environment as bytes, as a container gets it."""
    root = os.fsdecode(os.fsencode(tmp_path) + b"/" + folder)
    tree = make_tree(Path(root), script=None, hyperparameters=hps)
    with open(os.fsencode(tree.base / "code") + b"/" + script, "wb") as handle:
        handle.write(ECHO if script.endswith(b".py") else b"echo no interpreter line\n")
    env = bootstrap_env(tree, PET_NPROC_PER_NODE="1", CONTAINER_ENTRY_MASTER_PORT=str(job_port()))
    environ = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    environ[b"SAGEMAKER_PROGRAM"] = program or script
    environ[b"ODD_VALUE"] = b"\xe9\xff"
    return tree, environ


def test_an_entry_script_whose_name_is_not_utf8_runs_and_its_bytes_pass_unchanged(tmp_path):
    tree, env = odd_job(tmp_path, script=b"tr\xe9in.py", hps={"note": json.dumps("a b")})
    result = subprocess.run(bootstrap_argv(), env=env, capture_output=True, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    assert b"[algo-1 rank 0] raw \xe9\xff from the rank\n" in result.stdout
    assert b"[b'--note', b'a b'] b'\\xe9\\xff'" in result.stdout
    assert (tree.output / "success").exists()


def test_a_failure_in_a_folder_whose_name_is_not_utf8_is_reported_in_valid_utf8(tmp_path):
    """The base folder itself (so every path the bootstrap names) holds a byte that is not
    UTF-8 and a line break; the rank fails with such bytes in its last words."""
    tree, env = odd_job(
        tmp_path, script=b"tr\xe9in.py", hps={"fail": json.dumps("1")}, folder=b"d\xe9j\xe0\nvu"
    )
    code, _, err = run_bytes(bootstrap_argv(), env)
    assert code == 3, err[-2000:]
    assert "Traceback" not in err
    failure = (tree.output / "failure").read_bytes().decode("utf-8").splitlines()
    assert failure[0] == (
        "rank 0 (local 0) on algo-1: exit code 3: fatal: cannot read donn\ufffdes.csv "
        "[first failure]"
    )
    assert failure[-1].startswith("per-rank logs and records: ")
    assert "d\\xe9j\\xe0\\nvu" in failure[-1]
    record = json.loads((tree.output / "data/container-entry/rank-0.json").read_text())
    log = b"d\xe9j\xe0\nvu/algo-1/ml/output/data/container-entry/logs/rank-0.log"
    assert os.fsencode(record["log"]).endswith(log)


@pytest.mark.parametrize(
    ("script", "program", "code", "text"),
    [
        (b"ok.py", b"tr\xe9in.py", 2, "entry script 'tr\\xe9in.py' not found in"),
        (b"r\xe9n.sh", None, 126, "cannot execute "),
    ],
    ids=["missing", "not-executable"],
)
def test_an_entry_script_whose_name_is_not_utf8_fails_in_one_line(
    tmp_path, script, program, code, text
):
    tree, env = odd_job(tmp_path, script=script, program=program)
    returncode, _, err = run_bytes(bootstrap_argv(), env)
    assert returncode == code, err[-2000:]
    assert "Traceback" not in err
    first = (tree.output / "failure").read_bytes().decode("utf-8").splitlines()[0]
    assert text in first, first
    if code == 126:
        assert "r\\xe9n.sh: Exec format error" in first, first


def test_a_hyperparameter_value_holding_a_byte_that_is_not_utf8_is_passed_on(tmp_path):
    """JSON's "\\udce9" is how an undecodable byte reaches a value (surrogateescape)."""
    tree, env = odd_job(tmp_path, script=b"echo.py")
    (tree.base / "input/config/hyperparameters.json").write_text('{"note": "caf\\udce9"}')
    result = subprocess.run(bootstrap_argv(), env=env, capture_output=True, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    assert b"[b'--note', b'caf\\xe9']" in result.stdout
