import json
from pathlib import Path

import pytest

from container_entry.common.errors import ConfigError
from container_entry.plan.plan import build_plan
from container_entry.rank import preflight
from tests.unit.conftest import NVIDIA_SMI_4, make_env

TWO_HOSTS = {
    "current_host": "algo-2",
    "hosts": ["algo-1", "algo-2"],
    "network_interface_name": "eth0",
}


def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_gpu_host_gets_one_worker_per_gpu_and_nccl():
    plan = build_plan(make_env(resource_config=TWO_HOSTS, nvidia_smi=NVIDIA_SMI_4))
    assert (plan.nproc_per_node, plan.backend, plan.topology.node_rank) == ("4", "nccl", 1)
    assert flag(plan.argv, "--nproc-per-node") == "4"
    assert flag(plan.argv, "--nnodes") == "2"
    assert flag(plan.argv, "--master-addr") == "algo-1"
    assert plan.argv[:3] == ("/opt/venv/bin/python", "-m", "torch.distributed.run")
    assert plan.env["NCCL_HOSTID"].value == "algo-2"
    assert plan.env["NCCL_SOCKET_IFNAME"].value == "eth0"


def test_cpu_host_gets_one_gloo_worker():
    plan = build_plan(make_env())
    assert (plan.nproc_per_node, plan.backend, plan.num_gpus) == ("1", "gloo", 0)
    assert "NCCL_HOSTID" not in plan.env


@pytest.mark.parametrize(
    ("pet", "value", "absent_flag"),
    [
        ("PET_NPROC_PER_NODE", "2", "--nproc-per-node"),
        ("PET_MASTER_PORT", "4242", "--master-port"),
        ("PET_MASTER_ADDR", "10.0.0.5", "--master-addr"),
        ("PET_NNODES", "1:2", "--nnodes"),
        ("PET_MAX_RESTARTS", "3", "--max-restarts"),
    ],
)
def test_pet_variables_win_and_are_never_overridden_on_the_command_line(pet, value, absent_flag):
    environ = {"SAGEMAKER_PROGRAM": "train.py", pet: value}
    plan = build_plan(make_env(environ=environ, nvidia_smi=NVIDIA_SMI_4))
    assert absent_flag not in plan.argv  # torchrun reads PET_* itself; a flag would beat it
    assert pet in plan.user_env_kept
    assert pet not in plan.env


def test_no_restarts_keeps_torchruns_static_rendezvous():
    plan = build_plan(make_env(resource_config=TWO_HOSTS))
    assert (flag(plan.argv, "--node-rank"), flag(plan.argv, "--master-port")) == ("1", "29500")
    assert flag(plan.argv, "--max-restarts") == "0"
    assert "--rdzv-backend" not in plan.argv
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.env


@pytest.mark.parametrize(("current", "is_host"), [("algo-1", "true"), ("algo-2", "false")])
def test_restarts_switch_to_c10d_rendezvous_with_a_fresh_store_per_attempt(current, is_host):
    config = {**TWO_HOSTS, "current_host": current}
    hps = {"container_entry_max_restarts": 2, "sagemaker_job_name": "job-7"}
    plan = build_plan(make_env(resource_config=config, hyperparameters=hps))
    assert plan.max_restarts == 2
    assert flag(plan.argv, "--max-restarts") == "2"
    assert flag(plan.argv, "--rdzv-backend") == "c10d"
    assert flag(plan.argv, "--rdzv-endpoint") == "algo-1:29500"
    assert flag(plan.argv, "--rdzv-id") == "job-7"
    assert flag(plan.argv, "--rdzv-conf") == f"is_host={is_host}"  # node rank 0 hosts the store
    assert flag(plan.argv, "--local-addr") == current
    assert "--node-rank" not in plan.argv and "--master-addr" not in plan.argv
    assert plan.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"].value == "1"


def test_restarts_on_one_host_rendezvous_on_loopback():
    plan = build_plan(make_env(environ={"SAGEMAKER_PROGRAM": "t.py", "PET_MAX_RESTARTS": "1"}))
    assert flag(plan.argv, "--rdzv-endpoint") == "127.0.0.1:29500"
    assert flag(plan.argv, "--local-addr") == "127.0.0.1"
    assert flag(plan.argv, "--rdzv-id") == "container-entry"


def test_restarts_in_a_torchrun_style_cluster_leave_the_advertised_address_to_torch():
    environ = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "job-master-0",
        "PET_MAX_RESTARTS": "1",
    }
    plan = build_plan(make_env(resource_config=None, environ=environ, cli_args=("t.py",)))
    assert flag(plan.argv, "--rdzv-conf") == "is_host=false"
    assert "--local-addr" not in plan.argv  # its host names are placeholders, not addresses


def test_pet_values_are_what_the_plan_reports():
    environ = {"SAGEMAKER_PROGRAM": "t.py", "PET_NPROC_PER_NODE": "2", "PET_MASTER_PORT": "4242"}
    plan = build_plan(make_env(environ=environ))
    assert (plan.nproc_per_node, plan.nproc_source, plan.master_port) == (
        "2",
        "PET_NPROC_PER_NODE",
        4242,
    )


def test_user_environment_is_never_overwritten():
    environ = {
        "SAGEMAKER_PROGRAM": "train.py",
        "SM_MODEL_DIR": "/mine",
        "NCCL_SOCKET_IFNAME": "ib0",
        "PYTHONUNBUFFERED": "0",
    }
    plan = build_plan(make_env(environ=environ, nvidia_smi=NVIDIA_SMI_4))
    for name in ("SM_MODEL_DIR", "NCCL_SOCKET_IFNAME", "PYTHONUNBUFFERED"):
        assert name not in plan.env
        assert name in plan.user_env_kept


def test_sagemaker_contract_variables():
    env = make_env(
        resource_config=TWO_HOSTS,
        hyperparameters={"epochs": "2", "model_name": '"bert"', "sagemaker_program": '"t.py"'},
        environ={"TRAINING_JOB_NAME": "job-1"},
    )
    values = {k: v.value for k, v in build_plan(env).env.items()}
    assert values["SM_MODEL_DIR"] == "/opt/ml/model"
    assert values["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert json.loads(values["SM_HOSTS"]) == ["algo-1", "algo-2"]
    assert values["SM_CURRENT_HOST"] == values["CURRENT_HOST"] == "algo-2"
    assert json.loads(values["SM_HPS"]) == {"epochs": 2, "model_name": "bert"}
    assert values["SM_HP_EPOCHS"] == "2" and values["SM_HP_MODEL_NAME"] == "bert"
    assert values["SM_NUM_GPUS"] == "0" and values["SM_NUM_CPUS"] == "8"
    assert json.loads(values["SM_USER_ARGS"]) == ["--epochs", "2", "--model_name", "bert"]
    assert json.loads(values["SM_TRAINING_ENV"])["current_host"] == "algo-2"
    assert values["SAGEMAKER_JOB_NAME"] == "job-1"
    assert values["SM_USER_ENTRY_POINT"] == "t.py"


@pytest.mark.parametrize(
    "hostile", ["a b", "$(touch /tmp/x)", "'; rm -rf / #", 'say "hi"', "two\nlines"]
)
def test_hostile_hyperparameters_are_single_literal_argv_elements(hostile):
    plan = build_plan(make_env(hyperparameters={"note": json.dumps(hostile)}))
    assert plan.command[-2:] == ("--note", hostile)
    assert "--note" not in plan.argv  # never seen by torchrun's parser


def test_program_from_hyperparameter_and_missing_program():
    env = make_env(environ={}, hyperparameters={"sagemaker_program": '"fit.py"'})
    assert build_plan(env).command[0] == "/opt/ml/code/fit.py"
    missing = build_plan(make_env(environ={}))
    assert missing.problems and "no entry script" in missing.problems[0]
    assert missing.command[0] == "<entry script>"


@pytest.mark.parametrize(
    ("hps", "environ", "channel", "kind", "location", "code_dir"),
    [
        ({}, {}, (), "directory", "/opt/ml/code", "/opt/ml/code"),
        (
            {"sagemaker_submit_directory": '"s3://bkt/job/source/sourcedir.tar.gz"'},
            {},
            (),
            "s3",
            "s3://bkt/job/source/sourcedir.tar.gz",
            "/opt/ml/code",
        ),
        (
            {"sagemaker_submit_directory": '"/opt/ml/code"'},
            {},
            (),
            "directory",
            "/opt/ml/code",
            "/opt/ml/code",
        ),
        (
            {"sagemaker_submit_directory": '"/tmp/src.tar.gz"'},
            {},
            (),
            "archive",
            "/tmp/src.tar.gz",
            "/opt/ml/code",
        ),
        (
            {},
            {},
            ("sourcedir.tar.gz",),
            "archive",
            "/opt/ml/input/data/code/sourcedir.tar.gz",
            "/opt/ml/code",
        ),
        (
            {},
            {},
            ("train.py", "util.py"),
            "directory",
            "/opt/ml/input/data/code",
            "/opt/ml/input/data/code",
        ),
        (
            {},
            {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://b/k.tar.gz"},
            ("train.py",),
            "s3",
            "s3://b/k.tar.gz",
            "/opt/ml/code",
        ),
    ],
    ids=["baked", "s3", "local-dir", "local-tar", "channel-tar", "channel-dir", "env-s3"],
)
def test_code_source(hps, environ, channel, kind, location, code_dir):
    env = make_env(
        hyperparameters=hps,
        environ={"SAGEMAKER_PROGRAM": "train.py", **environ},
        code_channel_entries=channel,
    )
    code = build_plan(env).code
    assert (code.kind, code.location, code.code_dir) == (kind, location, code_dir)


def test_local_cli_script_and_args():
    env = make_env(
        resource_config=None,
        environ={},
        cwd="/work",
        cli_args=("src/fit.py", "--lr", "0.1", "x y"),
        scripts_found=("/work/src/fit.py",),
    )
    plan = build_plan(env)
    assert plan.topology.source == "local" and not plan.problems
    assert plan.code.code_dir == "/work/src"
    assert plan.command == ("/work/src/fit.py", "--lr", "0.1", "x y")


def test_every_rank_runs_through_the_worker_wrapper():
    plan = build_plan(make_env(environ={"SAGEMAKER_PROGRAM": "run.sh"}))
    assert plan.argv[-2:] == ("-m", "container_entry.worker")
    assert plan.command == ("/opt/ml/code/run.sh",)


def test_knobs_env_beats_hyperparameter_and_prefix_is_consumed():
    env = make_env(
        hyperparameters={"container_entry_master_port": "1111", "epochs": "1"},
        environ={"SAGEMAKER_PROGRAM": "t.py", "CONTAINER_ENTRY_MASTER_PORT": "2222"},
    )
    plan = build_plan(env)
    assert plan.master_port == 2222
    assert "--container_entry_master_port" not in plan.argv
    assert plan.user_args == ("--epochs", "1")


@pytest.mark.parametrize(
    ("hps", "environ", "message"),
    [
        ({"container_entry_master_port": '"abc"'}, {}, "container_entry_master_port='abc'"),
        ({"container_entry_master_port": "70000"}, {}, "not a TCP port"),
        ({"container_entry_nope": "1"}, {}, "unknown hyperparameter container_entry_nope"),
        ({}, {"CONTAINER_ENTRY_HOST_WAIT_TIMEOUT": "-1"}, "CONTAINER_ENTRY_HOST_WAIT_TIMEOUT"),
        ({}, {"CONTAINER_ENTRY_TYPO": "1"}, "unknown environment variable CONTAINER_ENTRY_TYPO"),
    ],
)
def test_bad_knob_values_name_the_value(hps, environ, message):
    env = make_env(hyperparameters=hps, environ={"SAGEMAKER_PROGRAM": "t.py", **environ})
    with pytest.raises(ConfigError, match=message):
        build_plan(env)


def test_secrets_are_masked_in_json_and_summary():
    env = make_env(
        hyperparameters={"hf_token": '"hf_SECRETVALUE"', "epochs": "1"},
        environ={"SAGEMAKER_PROGRAM": "t.py"},
    )
    plan = build_plan(env)
    assert "hf_SECRETVALUE" in plan.command  # the script still gets it
    text = plan.to_json() + plan.summary()
    assert "hf_SECRETVALUE" not in text
    assert json.loads(plan.to_json())["hyperparameters"]["hf_token"] == "****"


def test_plan_json_has_the_documented_keys():
    data = json.loads(build_plan(make_env()).to_json())
    for key in (
        "topology",
        "master_addr",
        "master_port",
        "nproc_per_node",
        "argv",
        "command",
        "env",
        "hyperparameters",
        "torch_version",
        "problems",
    ):
        assert key in data
    for key in ("hosts", "node_rank", "current_host", "source"):
        assert key in data["topology"]
    assert all({"value", "reason"} <= set(item) for item in data["env"].values())


def test_cpu_host_tells_hf_trainer_and_accelerate_to_run_ddp_on_cpu():
    assert build_plan(make_env()).env["ACCELERATE_USE_CPU"].value == "true"
    assert "ACCELERATE_USE_CPU" not in build_plan(make_env(nvidia_smi=NVIDIA_SMI_4)).env
    user = build_plan(make_env(environ={"SAGEMAKER_PROGRAM": "t.py", "ACCELERATE_USE_CPU": "no"}))
    assert "ACCELERATE_USE_CPU" not in user.env and "ACCELERATE_USE_CPU" in user.user_env_kept


@pytest.mark.parametrize(
    ("knob", "hosts", "on"),
    [("auto", 1, False), ("auto", 2, True), ("true", 1, True), ("false", 2, False)],
)
def test_preflight_is_on_by_default_for_multi_host_jobs_only(knob, hosts, on):
    names = [f"algo-{i + 1}" for i in range(hosts)]
    env = make_env(
        resource_config={"current_host": "algo-1", "hosts": names},
        environ={"SAGEMAKER_PROGRAM": "t.py", "CONTAINER_ENTRY_PREFLIGHT": knob},
    )
    plan = build_plan(env)
    # in the job's own launch: each rank's slot runs it before the script
    assert bool(plan.preflight) is on
    if on:
        assert plan.preflight == (str(Path(preflight.__file__).resolve()),)
    assert plan.argv[-2:] == ("-m", "container_entry.worker")


def test_hosts_sharing_one_machine_divide_its_cores():
    env = make_env(resource_config=TWO_HOSTS, cpu_count=8, boot_id="kernel-1")
    plan = build_plan(env)
    assert plan.env["OMP_NUM_THREADS"].value == "8"  # one CPU worker: all 8 cores
    shared = plan.sharing_machine(hosts=2, workers=2)
    assert shared.env["OMP_NUM_THREADS"].value == "4"
    assert "2 hosts of this job share this machine" in shared.env["OMP_NUM_THREADS"].reason
    assert plan.sharing_machine(hosts=1, workers=1) is plan
    user = build_plan(
        make_env(
            resource_config=TWO_HOSTS, environ={"SAGEMAKER_PROGRAM": "t.py", "OMP_NUM_THREADS": "3"}
        )
    )
    assert user.sharing_machine(hosts=2, workers=2) is user  # the user's value wins


@pytest.mark.parametrize(
    "flag", ["sagemaker_torch_distributed_enabled", "sagemaker_pytorchddp_enabled"]
)
def test_the_processes_per_host_sdk_v2_writes_are_our_workers_per_host(flag):
    """`distribution={"torch_distributed": {"enabled": True}, ...}` with `processes_per_host`
    (SDK v2 writes sagemaker_mpi_num_of_processes_per_host): the DLC's toolkit honours it, so do
    we, over the GPU count; a value that is no positive integer is one line naming it."""
    hps = {flag: True, "sagemaker_mpi_num_of_processes_per_host": 2}
    plan = build_plan(make_env(hyperparameters=hps, nvidia_smi=NVIDIA_SMI_4))
    assert (
        plan.nproc_per_node == "2"
        and "sagemaker_mpi_num_of_processes_per_host" in plan.nproc_source
    )
    for bad in (0, -1, "two", True, 1.5):
        with pytest.raises(ConfigError, match=r"sagemaker_mpi_num_of_processes_per_host="):
            build_plan(
                make_env(hyperparameters={**hps, "sagemaker_mpi_num_of_processes_per_host": bad})
            )
