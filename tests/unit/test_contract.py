"""The SM_* variables against sagemaker-training 5.1.4's own `Environment`, run for real.

Each configuration's files are written where the toolkit reads them (a temporary
SAGEMAKER_BASE_DIR), and one subprocess of the dev venv's Python runs
`Environment().to_env_vars()` on each in turn; the plan is built from the same files, on the
same machine facts (nvidia-smi, neuron-ls, smddprun: absent, or fakes put first on PATH), and
the variables a script sees compared key for key and value for value. So the table checks the
real toolkit, not values typed by hand. The deliberate differences (docs/sm-contract.md) are
asserted where they arise: SM_CHECKPOINT_DIR, the container_entry_* settings, local mode,
`world_master`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from container_entry.plan import contract, gpus, hyperparameters
from container_entry.plan.environment import read_environment
from container_entry.plan.machine import read_neuron_cores
from container_entry.plan.plan import Plan, build_plan
from tests.sm_contract import assert_the_dlcs, run_toolkit
from tests.unit.conftest import make_env

ONE = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}
TWO = {
    "current_host": "algo-2",
    "current_instance_type": "ml.g5.12xlarge",
    "hosts": ["algo-1", "algo-2"],
    "network_interface_name": "eth1",
}
# the AWS guide's heterogeneous cluster: its group's hosts unsorted
HETERO = {
    "current_host": "algo-1",
    "current_instance_type": "ml.p4d.24xlarge",
    "current_group_name": "train",
    "hosts": ["algo-1", "algo-2", "algo-3"],
    "instance_groups": [
        {"instance_group_name": "data", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-2"]},
        {
            "instance_group_name": "train",
            "instance_type": "ml.p4d.24xlarge",
            "hosts": ["algo-3", "algo-1"],
        },
    ],
    "network_interface_name": "eth0",
}
HETERO_DATA = {**HETERO, "current_host": "algo-2", "current_group_name": "data"}
ONE_GROUP = {
    **TWO,
    "current_group_name": "homogeneousCluster",
    "instance_groups": [
        {
            "instance_group_name": "homogeneousCluster",
            "instance_type": "ml.g5.12xlarge",
            "hosts": ["algo-1", "algo-2"],
        }
    ],
}
TRAIN = {"train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}}
CHANNELS = {
    **TRAIN,
    "val-set": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"},
    "data.v2": {"TrainingInputMode": "FastFile"},
    "Images": {"TrainingInputMode": "File", "ContentType": "image/png"},
    "code": {"TrainingInputMode": "File"},
}
# SDK v2 framework estimators JSON-encode every value
SDK_V2 = {
    "epochs": "3",
    "model": '"bert"',
    "fp16": "true",
    "opts": '{"a": 1, "b": [1, 2]}',
    "sagemaker_program": '"train.py"',
    "sagemaker_submit_directory": '"s3://bucket/job-1/source/sourcedir.tar.gz"',
    "sagemaker_container_log_level": "20",
    "sagemaker_job_name": '"job-1"',
    "sagemaker_region": '"us-east-1"',
}
SDK_V3 = {"epochs": "3", "model": "bert", "lr": "0.001", "sagemaker_program": "train.py"}
GENERIC = {  # the generic Estimator's str()
    "epochs": "3",
    "use_fp16": "True",
    "name": "bert",
    "items": "['a', 'b']",
    "nothing": "None",
}
TORCHRUN = {"sagemaker_torch_distributed_enabled": "true", "sagemaker_program": '"train.py"'}


def config(rc: Any = ONE, hps: Any = None, idc: Any = TRAIN, **environ: str) -> dict[str, Any]:
    return {"rc": rc, "hps": SDK_V2 if hps is None else hps, "idc": idc, "environ": environ}


CONFIGS: dict[str, dict[str, Any]] = {
    "one-host-sdk-v2": config(TRAINING_JOB_NAME="job-1"),
    "two-hosts-sdk-v3": config(TWO, SDK_V3),
    "three-hosts-unsorted-generic": config(
        {"current_host": "algo-1", "hosts": ["algo-2", "algo-3", "algo-1"]},
        GENERIC,
        SAGEMAKER_PROGRAM="train.py",
    ),
    "raw-api-values": config(TWO, {"n": 3, "flag": True, "sagemaker_program": "t.py"}),
    "hetero-no-flag": config(HETERO, SDK_V2),
    "hetero-torchrun-no-group-key": config(HETERO, TORCHRUN),
    "hetero-group-key": config(
        HETERO, {**TORCHRUN, "sagemaker_distribution_instance_groups": '["train"]'}
    ),
    "hetero-data-host-group-key": config(
        HETERO_DATA,
        {"sagemaker_mpi_enabled": "true", "sagemaker_distribution_instance_groups": '["train"]'},
    ),
    "hetero-group-key-raw-string": config(
        HETERO, {"sagemaker_distribution_instance_groups": "train"}
    ),
    "groups-without-current-name": config(
        {k: v for k, v in HETERO.items() if k != "current_group_name"}, TORCHRUN
    ),
    "one-group": config(ONE_GROUP, TORCHRUN),
    **{
        f"flag-{flag}": config(TWO, {f"sagemaker_{flag}_enabled": "true", "epochs": "1"})
        for flag in ("torch_distributed", "pytorch_ddp", "mpi", "distributed_dataparallel")
    },
    "flag-false-generic": config(TWO, {"sagemaker_mpi_enabled": "False"}),  # a truthy string
    "flag-false-json": config(TWO, {"sagemaker_mpi_enabled": "false"}),
    "no-channels": config(idc={}),
    "channels-every-form": config(TWO, idc=CHANNELS),
    "mp-parameters": config(
        TWO,
        {**TORCHRUN, "mp_parameters": '{"partitions": 2}'},
        SM_HP_MP_PARAMETERS='{"partitions":2}',
    ),
    "mp-parameters-empty": config(TWO, {"mp_parameters": "{}"}, SM_HP_MP_PARAMETERS="{}"),
    "tuning-metric": config(hps={**SDK_V2, "_tuning_objective_metric": '"eval_loss"'}),
    "topology": config(
        {**TWO, "topology": [{"hostName": "algo-1", "capacityUnitId": "cu-1"}]}, SDK_V3
    ),
    "trn2": config({**ONE, "current_instance_type": "ml.trn2.48xlarge"}, SDK_V3),
    "program-from-env": config(
        hps={**SDK_V2, "sagemaker_container_log_level": "10"},
        SAGEMAKER_PROGRAM="other.py",
        SAGEMAKER_TRAINING_MODULE="sagemaker_pytorch_container.training:main",
        CUDA_VISIBLE_DEVICES="0",
    ),
    "program-nowhere": config(TWO, {"epochs": "1"}),
    "settings-consumed": config(
        TWO, {**SDK_V3, "container_entry_hang_timeout": "600", "container_entry_max_restarts": "0"}
    ),
    "local-mode": config(None, {"epochs": "1"}, SAGEMAKER_PROGRAM="train.py"),
}

FAKE_SMI = """#!/bin/sh
echo "GPU 0: NVIDIA A10G (UUID: GPU-00000000-aaaa-bbbb-cccc-dddddddddddd)"
echo "  MIG 1g.5gb     Device  0: (UUID: MIG-00000000-aaaa-bbbb-cccc-dddddddddddd)"
echo "GPU 1: NVIDIA A10G (UUID: GPU-00000001-aaaa-bbbb-cccc-dddddddddddd)"
"""
TRN2 = "ml.trn2.48xlarge"
FAKE_NEURON_LS = '#!/bin/sh\necho \'[{"nc_count": 2}, {"nc_count": 2, "x": 1}]\'\n'


@pytest.fixture(scope="module", params=["bare", "tools"])
def machine(request, tmp_path_factory) -> dict[str, Any]:
    """The toolkit's results on every configuration and the environ they ran under: on this
    machine as it is ("bare"), and with fake nvidia-smi, neuron-ls and smddprun first on PATH."""
    root = tmp_path_factory.mktemp(request.param)
    base = root / "opt" / "ml"
    (base / "input" / "config").mkdir(parents=True)
    path = os.environ.get("PATH", "")
    if request.param == "tools":
        tools = root / "bin"
        tools.mkdir()
        for name, text in (("nvidia-smi", FAKE_SMI), ("neuron-ls", FAKE_NEURON_LS)):
            (tools / name).write_text(text)
        (tools / "smddprun").write_text("#!/bin/sh\n")
        for tool in tools.iterdir():
            tool.chmod(0o755)
        path = f"{tools}:{path}"
    environ = {
        "PATH": path,
        "HOME": str(root),
        "AWS_REGION": "us-east-1",
        "SAGEMAKER_BASE_DIR": str(base),
    }
    results = run_toolkit(CONFIGS, root, environ)
    return {"kind": request.param, "environ": environ, "results": results}


def our_view(machine: dict[str, Any], name: str, monkeypatch) -> tuple[dict[str, str], Plan]:
    """The SM_* variables a script sees under our image: the plan's, on the same files and
    the same machine facts (read by our own readers, under the same PATH)."""
    spec, environ = CONFIGS[name], {**machine["environ"], **CONFIGS[name]["environ"]}
    monkeypatch.setenv("PATH", environ["PATH"])
    rc = spec["rc"]
    env = make_env(
        base_dir=Path(environ["SAGEMAKER_BASE_DIR"]),
        environ=environ,
        resource_config=rc,
        hyperparameters=spec["hps"],
        input_data_config=spec["idc"] or {},
        nvidia_smi=gpus.query_nvidia_smi().output,
        all_cpus=os.cpu_count(),
        neuron_cores=read_neuron_cores((rc or {}).get("current_instance_type", "local")),
        smddprun=shutil.which("smddprun") is not None,
        smddpmprun=shutil.which("smddpmprun") is not None,
        hostname=socket.gethostname(),
    )
    plan = build_plan(env)
    added = {k: v.value for k, v in plan.env.items() if k.startswith("SM_")}
    return {**{k: v for k, v in environ.items() if k.startswith("SM_")}, **added}, plan


def dlc_view(machine: dict[str, Any], name: str) -> dict[str, str]:
    """What a script sees under the DLC: the container's SM_* and to_env_vars over them."""
    environ = CONFIGS[name]["environ"]
    return {**{k: v for k, v in environ.items() if k.startswith("SM_")}, **machine["results"][name]}


@pytest.mark.parametrize("name", sorted(n for n in CONFIGS if n != "local-mode"))
def test_every_sm_variable_is_the_toolkits(machine, name, monkeypatch):
    dlc = dlc_view(machine, name)
    assert "error" not in dlc, dlc
    ours, plan = our_view(machine, name, monkeypatch)
    assert_the_dlcs(
        ours,
        dlc,
        hyperparameters=CONFIGS[name]["hps"],
        base=machine["environ"]["SAGEMAKER_BASE_DIR"],
        world_rank0=plan.topology.world[0] if plan.topology.world else None,
        torch_version=plan.torch_version,
    )


def test_the_table_covers_what_it_claims(machine):
    """The configurations reach the values they are there for (on the toolkit's own side)."""
    results = machine["results"]
    env = {
        name: json.loads(r["SM_TRAINING_ENV"]) for name, r in results.items() if "error" not in r
    }
    assert env["hetero-group-key"]["distribution_hosts"] == ["algo-3", "algo-1"]
    assert env["hetero-group-key"]["master_hostname"] == "algo-3"
    assert env["hetero-data-host-group-key"]["is_master"] is False
    assert env["hetero-torchrun-no-group-key"]["distribution_instance_groups"] == ["train"]
    assert env["hetero-no-flag"]["distribution_hosts"] == []
    assert env["groups-without-current-name"]["current_instance_group_hosts"] == []
    assert env["three-hosts-unsorted-generic"]["hosts"] == ["algo-2", "algo-3", "algo-1"]
    assert env["program-nowhere"]["module_name"] == "None"
    assert env["mp-parameters"]["is_modelparallel_enabled"] is True
    assert env["mp-parameters-empty"]["is_modelparallel_enabled"] is False
    assert env["one-host-sdk-v2"]["is_modelparallel_enabled"] is None
    assert env["flag-false-generic"]["distribution_instance_groups"] == ["homogeneousCluster"]
    assert "SM_TOPOLOGY" in results["topology"] and "SM_TOPOLOGY" not in results["two-hosts-sdk-v3"]
    assert env["trn2"]["num_neurons"] == 64
    if machine["kind"] == "tools":
        assert env["program-from-env"]["num_gpus"] == 2  # CUDA_VISIBLE_DEVICES=0 aside
        assert env["one-host-sdk-v2"]["num_neurons"] == 4
        assert env["one-host-sdk-v2"]["is_smddprun_installed"] is True


def test_local_mode_synthesizes_what_the_dlc_cannot_run_without(machine, monkeypatch, tmp_path):
    """No resourceconfig.json (a plain `docker run`): the toolkit fails; we name this host and
    every channel folder found, as before."""
    assert machine["results"]["local-mode"] == {"error": "FileNotFoundError"}
    monkeypatch.setenv("PATH", machine["environ"]["PATH"])
    env = make_env(
        resource_config=None,
        hyperparameters={"epochs": "1"},
        input_data_config={},
        local_channels=("images", "train"),
        environ={"SAGEMAKER_PROGRAM": "train.py"},
    )
    sm = {k: v.value for k, v in build_plan(env).env.items()}
    assert (
        json.loads(sm["SM_HOSTS"]) == ["container-abc"] and sm["SM_CURRENT_HOST"] == "container-abc"
    )
    assert json.loads(sm["SM_CHANNELS"]) == ["images", "train"]
    assert sm["SM_CHANNEL_IMAGES"] == "/opt/ml/input/data/images"
    training = json.loads(sm["SM_TRAINING_ENV"])
    assert training["master_hostname"] == "container-abc" and training["is_master"] is True
    assert json.loads(sm["SM_CURRENT_INSTANCE_GROUP_HOSTS"]) == ["container-abc"]
    assert json.loads(sm["SM_RESOURCE_CONFIG"]) == contract.local_resource_config(
        ["container-abc"], "container-abc"
    )


def test_world_master_names_our_rank_0_and_changes_nothing_else():
    """Where our launcher forms a world the DLC would not, is_master and master_hostname name
    our world's rank-0 host; every other value stays the DLC's."""
    inputs: dict[str, Any] = {
        "base_dir": "/opt/ml",
        "resource_config": HETERO,
        "input_data_config": TRAIN,
        "hyperparameters": hyperparameters.split(
            {**TORCHRUN, "sagemaker_distribution_instance_groups": '["train"]'}
        ),
        "environ": {},
        "machine": contract.Machine(),
    }
    dlc = contract.training_env(**inputs)
    ours = contract.training_env(**inputs, world_master="algo-1")
    assert (dlc["master_hostname"], dlc["is_master"]) == ("algo-3", False)
    assert (ours["master_hostname"], ours["is_master"]) == ("algo-1", True)
    assert {k for k in dlc if dlc[k] != ours[k]} == {"master_hostname", "is_master"}
    variables = contract.sm_env(**inputs, user_args=[], world_master="algo-1")
    assert json.loads(variables["SM_TRAINING_ENV"]) == ours


def test_num_gpus_counts_what_nvidia_smi_lists_whatever_cuda_visible_devices_says():
    smi = "\n".join(f"GPU {i}: NVIDIA A10G (UUID: GPU-{i})" for i in range(4))
    env = make_env(
        nvidia_smi=smi, environ={"SAGEMAKER_PROGRAM": "t.py", "CUDA_VISIBLE_DEVICES": "0"}
    )
    plan = build_plan(env)
    assert plan.num_gpus == 1 and plan.env["SM_NUM_GPUS"].value == "4"


def test_neuron_cores_as_the_toolkit_counts_them(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert read_neuron_cores("ml.trn2.48xlarge") == 64
    assert read_neuron_cores("local") == 0  # no neuron-ls
    tool = tmp_path / "neuron-ls"
    for output, count in (('[{"nc_count": 8}, {"nc_count": 8}]', 16), ("not json", 0), ("{}", 0)):
        tool.write_text(f"#!/bin/sh\necho '{output}'\n")
        tool.chmod(0o755)
        assert read_neuron_cores("ml.trn1.32xlarge") == count
    tool.write_text("#!/bin/sh\nexit 1\n")
    assert read_neuron_cores("ml.trn1.32xlarge") == 0


def test_read_environment_reads_the_toolkits_machine_facts(tmp_path, monkeypatch):
    """Every CPU of the machine (not the affinity), smddprun/smddpmprun on PATH, NeuronCores
    for the instance type of resourceconfig.json."""
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({**ONE, "current_instance_type": "x"}))
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in (("smddpmprun", "#!/bin/sh\n"), ("neuron-ls", FAKE_NEURON_LS)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    env = read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path)})
    assert env.all_cpus == os.cpu_count()
    assert (env.smddprun, env.smddpmprun, env.neuron_cores) == (False, True, 4)
    (config / "resourceconfig.json").write_text(json.dumps({**ONE, "current_instance_type": TRN2}))
    assert read_environment({"SAGEMAKER_BASE_DIR": str(tmp_path)}).neuron_cores == 64
