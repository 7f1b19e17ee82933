"""The SM_* variables, formatted by sagemaker-training's own `mapping.to_env_vars`: what a script
written for the incumbent reads, with the reserved hyperparameters left out as it leaves them."""

from __future__ import annotations

import json
from pathlib import Path

from container_entry.plan.cluster import Topology
from container_entry.plan.contract import sm_env


def test_sm_variables_as_sagemaker_training_exports_them():
    topology = Topology(
        source="sagemaker",
        hosts=("algo-1", "algo-2"),
        current_host="algo-2",
        node_rank=1,
        master_addr="algo-1",
        network_interface="eth1",
        instance_type="ml.g5.12xlarge",
    )
    env = sm_env(
        base_dir=Path("/opt/ml"),
        topology=topology,
        user_hyperparameters={"epochs": 3, "model": "bert", "flags": {"a": 1}},
        sagemaker_hyperparameters={
            "sagemaker_container_log_level": 10,
            "sagemaker_distributed_dataparallel_enabled": False,
            "_tuning_objective_metric": "eval_loss",
        },
        user_args=["--epochs", "3", "--flags", "{'a': 1}", "--model", "bert"],
        program="train.py",
        module_dir="/opt/ml/code",
        channels={"train": "/opt/ml/input/data/train"},
        resource_config={"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]},
        input_data_config={"train": {"TrainingInputMode": "File"}},
        num_gpus=4,
        num_cpus=48,
        environ={},
    )
    assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2"]
    assert env["SM_CURRENT_HOST"] == "algo-2" and env["SM_NETWORK_INTERFACE_NAME"] == "eth1"
    assert env["SM_NUM_GPUS"] == "4" and env["SM_NUM_CPUS"] == "48"
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.g5.12xlarge"
    assert env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert json.loads(env["SM_CHANNELS"]) == ["train"]
    assert env["SM_HP_EPOCHS"] == "3" and env["SM_HP_MODEL"] == "bert"
    assert json.loads(env["SM_HP_FLAGS"]) == {"a": 1}
    assert json.loads(env["SM_HPS"]) == {"epochs": 3, "model": "bert", "flags": {"a": 1}}
    assert json.loads(env["SM_USER_ARGS"])[:2] == ["--epochs", "3"]
    assert env["SM_MODULE_NAME"] == "train" and env["SM_USER_ENTRY_POINT"] == "train.py"
    assert env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data"
    # the keys sagemaker-training reserves (log level, tuning metric) are its own; another
    # sagemaker_* key is a framework parameter
    assert json.loads(env["SM_FRAMEWORK_PARAMS"]) == {
        "sagemaker_distributed_dataparallel_enabled": False
    }
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["log_level"] == 10 and training_env["current_host"] == "algo-2"
    assert training_env["is_hetero"] is False
