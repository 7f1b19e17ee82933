"""SDK v3's own start (`ModelTrainer(source_code=...)`): when container-entry takes it over.

The shapes below are our own minimal descriptions of what sagemaker-train 1.0-1.27 leaves in
its `sm_drivers` channel (read from its source, not copied): the lines `judge` relies on.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from container_entry.common.errors import ConfigError
from container_entry.plan import sdk_driver
from container_entry.plan.plan import build_plan
from container_entry.plan.sdk_driver import DriverFiles, Handling, SdkJob, judge
from tests.unit.conftest import NVIDIA_SMI_4, make_env

BASE = Path("/opt/ml")
START = sdk_driver.sdk_start(BASE)
SHELL = ("/bin/bash", "-c", START)
ENV_LINES = (
    "python3 /opt/ml/input/data/sm_drivers/scripts/environment.py\n"
    "source /opt/ml/input/sm_training.env\n"
    "cd /opt/ml/input/data/code\n"
)
BASIC = "python3 /opt/ml/input/data/sm_drivers/distributed_drivers/basic_script_driver.py\n"
TORCHRUN = "python3 /opt/ml/input/data/sm_drivers/distributed_drivers/torchrun_driver.py\n"
MPI = "python3 /opt/ml/input/data/sm_drivers/distributed_drivers/mpi_driver.py\n"
COMMAND_NEW = "CMD=$(cat <<'EOF'\npython x.py\nEOF\n)\neval \"$CMD\"\n"  # 1.2x
COMMAND_OLD = 'CMD="python x.py"\neval $CMD\n'  # 1.0-1.1x
SOURCE = {"source_dir": "src", "entry_script": "train.py", "requirements": None, "command": None}


def files(driver: str = BASIC, source=SOURCE, distributed=None, **changes) -> DriverFiles:
    built = DriverFiles(
        train_script="#!/bin/bash\nset -e\n" + ENV_LINES + driver,
        source_code=json.dumps(source) if isinstance(source, dict) else source,
        distributed=json.dumps(distributed if distributed is not None else {}),
        environment_script=True,
        installer=True,
    )
    return replace(built, **changes)


# (name, shell argv, files, opted out, verdict, a phrase of the line printed)
CASES = [
    ("plain entry_script", SHELL, files(), False, Handling.TAKE_OVER, "one worker per GPU"),
    ("bash named bash", ("bash", "-c", START), files(), False, Handling.TAKE_OVER, "launcher"),
    ("trailing newline", ("/bin/bash", "-c", START + "\n"), files(), False, Handling.TAKE_OVER, ""),
    (
        "torchrun N",
        SHELL,
        files(TORCHRUN, distributed={"process_count_per_node": 2, "smp": None}),
        False,
        Handling.TAKE_OVER,
        "Torchrun(process_count_per_node=2)",
    ),
    (
        "torchrun unset",
        SHELL,
        files(TORCHRUN, distributed={"process_count_per_node": None, "smp": None}),
        False,
        Handling.TAKE_OVER,
        "one worker per GPU",
    ),
    ("opted out", SHELL, files(), True, Handling.SDK, "CONTAINER_ENTRY_SDK_DRIVER=sdk"),
    ("command= (1.2x)", SHELL, files(COMMAND_NEW), False, Handling.SDK, "command="),
    ("command= (1.0)", SHELL, files(COMMAND_OLD), False, Handling.SDK, "command="),
    (
        "MPI",
        SHELL,
        files(MPI, distributed={"process_count_per_node": 2, "mpi_additional_options": []}),
        False,
        Handling.SDK,
        "MPI",
    ),
    # not the layout this release knows: the SDK's start runs, and the line says why
    ("any shell's name", ("/bin/sh", "-c", START), files(), False, Handling.TAKE_OVER, ""),
    ("login shell", ("/bin/bash", "-lc", START), files(), False, Handling.UNRECOGNISED, "started"),
    ("extra argument", (*SHELL, "x"), files(), False, Handling.UNRECOGNISED, "started as"),
    (
        "other path",
        ("/bin/bash", "-c", START.replace("sm_drivers", "sm_drivers_v4")),
        files(),
        False,
        Handling.UNRECOGNISED,
        "shell command",
    ),
    (
        "other command",
        ("/bin/bash", "-c", "cat /opt/ml/input/data/sm_drivers/sm_train.sh"),
        files(),
        False,
        Handling.UNRECOGNISED,
        "shell command",
    ),
    ("no sm_train.sh", SHELL, files(train_script=None), False, Handling.UNRECOGNISED, "missing"),
    (
        "no environment.py",
        SHELL,
        files(environment_script=False),
        False,
        Handling.UNRECOGNISED,
        "environment.py is missing",
    ),
    (
        "environment set another way",
        SHELL,
        files(train_script="#!/bin/bash\n" + BASIC),
        False,
        Handling.UNRECOGNISED,
        "environment",
    ),
    (
        "unknown driver",
        SHELL,
        files("python3 /opt/ml/input/data/sm_drivers/distributed_drivers/ray_driver.py\n"),
        False,
        Handling.UNRECOGNISED,
        "no driver",
    ),
    ("two drivers", SHELL, files(BASIC + TORCHRUN), False, Handling.UNRECOGNISED, "several"),
    ("no sourcecode.json", SHELL, files(source_code=None), False, Handling.UNRECOGNISED, "missing"),
    ("malformed sourcecode", SHELL, files(source="{"), False, Handling.UNRECOGNISED, "JSON object"),
    ("sourcecode a list", SHELL, files(source="[]"), False, Handling.UNRECOGNISED, "JSON object"),
    (
        "no entry_script",
        SHELL,
        files(source={**SOURCE, "entry_script": None}),
        False,
        Handling.UNRECOGNISED,
        "no entry_script",
    ),
    (
        "empty entry_script",
        SHELL,
        files(source={**SOURCE, "entry_script": " "}),
        False,
        Handling.UNRECOGNISED,
        "no entry_script",
    ),
    (
        "entry_script not a string",
        SHELL,
        files(source={**SOURCE, "entry_script": 7}),
        False,
        Handling.UNRECOGNISED,
        "no entry_script",
    ),
    (
        "requirements not a string",
        SHELL,
        files(source={**SOURCE, "requirements": ["a"]}),
        False,
        Handling.UNRECOGNISED,
        "requirements",
    ),
    (
        "distributed.json missing",
        SHELL,
        replace(files(), distributed=None),
        False,
        Handling.UNRECOGNISED,
        "distributed.json",
    ),
    (
        "plain driver with a distributed config",
        SHELL,
        files(distributed={"process_count_per_node": 2}),
        False,
        Handling.UNRECOGNISED,
        "not empty",
    ),
    *[
        (
            f"torchrun count {count!r}",
            SHELL,
            files(TORCHRUN, distributed={"process_count_per_node": count}),
            False,
            Handling.UNRECOGNISED,
            "positive integer",
        )
        for count in (0, -1, "2", 2.5, True)
    ],
]


@pytest.mark.parametrize(
    ("shell", "found", "opted", "verdict", "phrase"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_when_container_entry_takes_the_sdk_start_over(shell, found, opted, verdict, phrase):
    decision = judge(shell, found, BASE, opted_out=opted)
    assert decision.verdict is verdict, decision.why
    assert phrase in decision.why
    assert "\n" not in decision.why  # one line at the job's start
    assert (decision.job is not None) == (verdict is Handling.TAKE_OVER)
    if verdict is Handling.UNRECOGNISED:
        assert "the SDK's own start runs" in decision.why


def test_the_job_taken_over_is_what_the_sdk_would_run():
    job = judge(
        SHELL,
        files(
            TORCHRUN,
            source={
                **SOURCE,
                "source_dir": "s3://b/code/sourcedir.tar.gz",
                "requirements": "r.txt",
            },
            distributed={"process_count_per_node": 3, "smp": None},
        ),
        BASE,
    ).job
    assert job == SdkJob(
        entry_script="train.py",
        source_dir=True,
        archive="sourcedir.tar.gz",
        requirements="r.txt",
        processes_per_host=3,
        distributed="torchrun",
        installer="/opt/ml/input/data/sm_drivers/scripts/install_requirements.py",
    )
    older = judge(SHELL, files(installer=False, source={"entry_script": "t.sh"}), BASE).job
    assert older is not None
    assert (older.installer, older.source_dir, older.archive) == (None, False, None)


def test_names_in_the_line_are_escaped():
    shell = ("/bin/bash", "-c", "echo sm_drivers \x1b[31m\udcff")
    why = judge(shell, files(), BASE).why
    assert "\x1b" not in why and "\udcff" not in why
    why.encode("utf-8")


@pytest.mark.parametrize(
    ("environ", "hyperparameters", "out"),
    [
        ({}, {}, False),
        ({"CONTAINER_ENTRY_SDK_DRIVER": "sdk"}, {}, True),
        ({"CONTAINER_ENTRY_SDK_DRIVER": " SDK "}, {}, True),
        (
            {"CONTAINER_ENTRY_SDK_DRIVER": "container-entry"},
            {"container_entry_sdk_driver": "sdk"},
            False,
        ),
        ({}, {"container_entry_sdk_driver": "sdk"}, True),
        ({"CONTAINER_ENTRY_SDK_DRIVER": "bogus"}, {}, False),  # the plan names it (exit 2)
    ],
)
def test_the_opt_out(environ, hyperparameters, out):
    assert sdk_driver.opted_out(environ, hyperparameters) is out


# hyperparameters.json as ModelTrainer writes it (safe_serialize: strings raw, the rest JSON),
# and as other callers do; the arguments the SDK's drivers render from it
ARGS = [
    ({"epochs": "2", "lr": "0.5"}, ["--epochs", "2", "--lr", "0.5"]),
    ({"z": "1", "a": "2"}, ["--z", "1", "--a", "2"]),  # the file's order, not sorted
    ({"k": "v"}, ["--k", "v"]),  # one letter: still two dashes
    ({"name": "tiny bert"}, ["--name", "tiny bert"]),
    ({"name": '"quoted"'}, ["--name", "quoted"]),
    ({"flag": "true"}, ["--flag", "true"]),
    ({"flag": "True"}, ["--flag", "True"]),
    ({"big": "1e3"}, ["--big", "1000.0"]),
    ({"nan": "NaN"}, ["--nan", "NaN"]),
    ({"zero": "01"}, ["--zero", "01"]),
    ({"d": '{"a":1,"b":[1,2]}'}, ["--d", '{"a": 1, "b": [1, 2]}']),
    ({"l": "[1,2]"}, ["--l", "[1, 2]"]),
    ({"n": "null"}, ["--n", "null"]),
    ({"e": ""}, ["--e", ""]),
    ({"u": "caf\u00e9 \u2603"}, ["--u", "caf\u00e9 \u2603"]),
    ({"raw": 3}, ["--raw", "3"]),
    ({"container_entry_hang_timeout": "60", "x": "1"}, ["--x", "1"]),  # ours: consumed
    ({"sagemaker_program": "t.py"}, ["--sagemaker_program", "t.py"]),  # passed, as the SDK
]


@pytest.mark.parametrize(("raw", "expected"), ARGS)
def test_hyperparameters_reach_the_script_as_the_sdk_passes_them(raw, expected):
    assert sdk_driver.script_args(raw, "container_entry_") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("export SM_A='1'\nexport SM_B='[\"x\", \"y\"]'\n", {"SM_A": "1", "SM_B": '["x", "y"]'}),
        ("export SM_HP_Q='it's'\n", {"SM_HP_Q": "it's"}),
        ("export SM_HP_N='a\nb'\nexport SM_C='3'\n", {"SM_HP_N": "a\nb", "SM_C": "3"}),
        ("export SM_E=''\n", {"SM_E": ""}),
        ("export SM_LAST='x'", {"SM_LAST": "x"}),
        ("export PATH='/evil'\nexport SM_OK='1'\n", {"SM_OK": "1"}),
        (
            "export SM_HP_X='v\nexport LD_PRELOAD='/x.so'\n",
            {"SM_HP_X": "v\nexport LD_PRELOAD='/x.so"},
        ),
        ("garbage\n", {}),
        ("", {}),
    ],
)
def test_the_sdk_environment_file_is_read_without_a_shell(text, expected):
    assert sdk_driver.parse_env_file(text) == expected


def sdk_env(job: SdkJob, **overrides):
    values = {
        "environ": {"TRAINING_JOB_NAME": "job"},
        "cwd": "/workdir",
        "sdk": job,
        "hyperparameters": {"epochs": "2", "sagemaker_program": "other.py", "b": "true"},
        "sdk_env": {
            "SM_HPS": '{"epochs": 2}',
            "SM_HOST_COUNT": "1",
            "SM_MODEL_DIR": "/opt/ml/model",
        },
    }
    values.update(overrides)
    return make_env(**values)


JOB = SdkJob("train.py", True, None, None, None, "none")


def test_the_plan_runs_the_sdk_entry_script_from_the_code_channel():
    plan = build_plan(sdk_env(JOB))
    channel = "/opt/ml/input/data/code"
    assert plan.command == (
        f"{channel}/train.py",
        "--epochs",
        "2",
        "--sagemaker_program",
        "other.py",
        "--b",
        "true",
    )
    assert (plan.code.kind, plan.code.code_dir, plan.program) == ("directory", channel, "train.py")
    assert plan.sdk == JOB
    assert "sdk         SageMaker SDK v3 SourceCode(entry_script='train.py')" in plan.summary()


def test_the_sdk_variables_win_over_ours_and_the_users_over_both():
    plan = build_plan(sdk_env(JOB, environ={"TRAINING_JOB_NAME": "j", "SM_HOST_COUNT": "9"}))
    assert plan.env["SM_HPS"].value == '{"epochs": 2}'
    assert "environment.py" in plan.env["SM_HPS"].reason
    assert "SM_HOST_COUNT" not in plan.env and "SM_HOST_COUNT" in plan.user_env_kept
    assert plan.env["SM_CHANNEL_TRAIN"].value == "/opt/ml/input/data/train"  # ours, beside


def test_an_archive_source_dir_is_extracted_where_the_sdk_extracts_it():
    plan = build_plan(sdk_env(replace(JOB, archive="sourcedir.tar.gz")))
    channel = "/opt/ml/input/data/code"
    assert (plan.code.kind, plan.code.location) == ("archive", f"{channel}/sourcedir.tar.gz")
    assert plan.command[0] == f"{channel}/train.py"


def test_without_source_dir_the_script_runs_from_the_working_directory():
    plan = build_plan(sdk_env(replace(JOB, source_dir=False, entry_script="sub/t.sh")))
    assert plan.command[0] == "/workdir/sub/t.sh"


@pytest.mark.parametrize(
    ("processes", "environ", "nproc", "source"),
    [
        (None, {}, "4", "nvidia-smi"),
        (2, {}, "2", "SDK v3 Torchrun(process_count_per_node)"),
        (2, {"PET_NPROC_PER_NODE": "3"}, "3", "PET_NPROC_PER_NODE"),
    ],
)
def test_torchrun_process_count(processes, environ, nproc, source):
    job = replace(JOB, distributed="torchrun", processes_per_host=processes)
    plan = build_plan(
        sdk_env(job, environ={"TRAINING_JOB_NAME": "j", **environ}, nvidia_smi=NVIDIA_SMI_4)
    )
    assert plan.nproc_per_node == nproc
    assert source in plan.nproc_source
    assert "NCCL_PROTO" not in plan.env  # the SDK's driver forces simple; we do not


def test_a_bad_hyperparameter_is_still_one_line():
    with pytest.raises(ConfigError, match="NUL"):
        build_plan(sdk_env(JOB, hyperparameters={"x": "a\0b"}))


def test_a_secret_hyperparameter_is_masked_in_the_plan():
    plan = build_plan(sdk_env(JOB, hyperparameters={"hf_token": "hf_abcdefghijkl"}))
    assert "hf_abcdefghijkl" not in plan.to_json()
    assert "hf_abcdefghijkl" not in plan.summary()


def test_the_image_sets_the_bash_env_the_bootstrap_knows():
    text = (Path(__file__).resolve().parents[2] / "docker" / "Dockerfile").read_text()
    value = re.search(r'^ENV BASH_ENV="(.*)"$', text, re.M)
    assert value is not None
    assert value.group(1).replace("\\$", "$") == sdk_driver.IMAGE_BASH_ENV


@pytest.mark.parametrize(
    ("environ", "left"),
    [
        ({"BASH_ENV": sdk_driver.IMAGE_BASH_ENV, "A": "1"}, {"A": "1"}),
        ({"BASH_ENV": "/home/me/.bashenv"}, {"BASH_ENV": "/home/me/.bashenv"}),  # the user's
        ({"BASH_ENV": ""}, {"BASH_ENV": ""}),
        ({}, {}),
    ],
)
def test_nothing_the_bootstrap_starts_inherits_the_images_bash_env(environ, left):
    sdk_driver.drop_image_bash_env(environ)
    assert environ == left
