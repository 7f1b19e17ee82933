"""The real SageMaker Python SDK (v2 Estimator, v3 ModelTrainer) as the client, in local mode.

Each SDK lives in its own venv (tests/docker/sdk_venvs.py) and drives our image through its
own docker compose: 2 "instances" x PET_NPROC_PER_NODE=2 gloo workers = a DDP world of 4.
The client runs in a subprocess with that venv's python; fake credentials are enough.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docker.conftest import REPO
from tests.docker.sdk_venvs import (
    ensure_venv,
    local_mode_cleanup,
    members,
    run_client,
    sdk_local_mode,
)

# The user's training script: joins the gloo group, gathers what every rank saw to rank 0,
# which writes it into SM_MODEL_DIR (-> model.tar.gz); every rank writes SM_OUTPUT_DATA_DIR.
TRAIN_PY = """\
import json, os, socket, sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
seen = {
    "rank": rank,
    "world_size": world,
    "all_reduce": total.item(),
    "host": os.environ.get("CURRENT_HOST"),
    "hostname": socket.gethostname(),
    "hosts": json.loads(os.environ["SM_HOSTS"]),
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "train": sorted(os.listdir(os.environ["SM_CHANNEL_TRAIN"])),
}
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(seen, f)
everyone = [None] * world
dist.all_gather_object(everyone, seen)
if rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "ddp.json"), "w") as f:
        json.dump({"world_size": world, "ranks": everyone}, f)
print(f"SDK-PROBE rank {rank}/{world} host {seen['host']} sum {total.item()}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""

SDK_V2_CLIENT = """\
import json, sys
from sagemaker.estimator import Estimator
from sagemaker.local import LocalSession

image, code, data, output, root = sys.argv[1:]
session = LocalSession()
session.config = {"local": {"local_code": True, "container_root": root}}
estimator = Estimator(
    image_uri=image,
    role="arn:aws:iam::111111111111:role/SageMakerRole",
    instance_type="local",
    instance_count=2,
    entry_point="train.py",
    source_dir=code,
    hyperparameters={"epochs": 2, "model-name": "tiny bert", "lr": 0.5},
    environment={"PET_NPROC_PER_NODE": "2"},
    output_path="file://" + output,
    base_job_name="sdk-v2",
    sagemaker_session=session,
)
estimator.fit({"train": "file://" + data}, wait=True, logs=True)
print("CLIENT-RESULT " + json.dumps({"model_data": estimator.model_data}))
"""

SDK_V3_CLIENT = """\
import json, sys
from sagemaker.train import ModelTrainer
from sagemaker.train.configs import Compute, InputData
from sagemaker.train.model_trainer import Mode

image, code, data, root = sys.argv[1:]
trainer = ModelTrainer(
    training_image=image,
    training_mode=Mode.LOCAL_CONTAINER,
    compute=Compute(instance_type="local_cpu", instance_count=2),
    environment={"SAGEMAKER_PROGRAM": "train.py", "PET_NPROC_PER_NODE": "2"},
    hyperparameters={"epochs": 2, "model-name": "tiny bert", "lr": 0.5},
    base_job_name="sdk-v3",
    local_container_root=root,
)
# No source_code: with it the SDK replaces our entrypoint. The code travels as a "code"
# channel, from which the bootstrap runs SAGEMAKER_PROGRAM.
trainer.train(
    input_data_config=[
        InputData(channel_name="code", data_source=code),
        InputData(channel_name="train", data_source=data),
    ],
    wait=True,
)
print("CLIENT-RESULT " + json.dumps({"root": root}))
"""


@pytest.fixture(scope="session")
def sdk2_python() -> Path:
    return ensure_venv("sdk2", REPO / "requirements" / "sdk-v2.txt")


@pytest.fixture(scope="session")
def sdk3_python() -> Path:
    return ensure_venv("sdk3", REPO / "requirements" / "sdk-v3.txt")


@pytest.fixture
def job(tmp_path) -> dict[str, Path]:
    """The user's side of a job: a source dir holding train.py, a train channel."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN_PY)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "hello"}\n')
    return {"code": code, "data": data, "root": tmp_path / "local-mode"}


def check_ddp(model: dict[str, bytes], output: dict[str, bytes], hosts: list[str]) -> None:
    """World of 4 over both hosts, every rank with the same argv, the code and the data."""
    assert list(model) == ["ddp.json"], list(model)
    ddp = json.loads(model["ddp.json"])
    assert ddp["world_size"] == 4
    ranks = ddp["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["world_size"] for r in ranks} == {4}
    assert {r["all_reduce"] for r in ranks} == {10.0}
    assert [r["host"] for r in ranks] == [hosts[0], hosts[0], hosts[1], hosts[1]]
    assert all(r["hosts"] == hosts for r in ranks)
    assert all(
        r["argv"] == ["--epochs", "2", "--lr", "0.5", "--model-name", "tiny bert"] for r in ranks
    ), ranks[0]["argv"]
    assert all(r["train"] == ["train.jsonl"] for r in ranks)
    written = {name for name in output if name.startswith("data/rank-")}
    assert written == {f"data/rank-{i}.json" for i in range(4)}, sorted(output)
    assert "success" in output and "failure" not in output, sorted(output)


def check_containers(found, count: int) -> None:
    logs = "\n".join(f"--- {s}\n{text[-2500:]}" for s, text in found.logs.items())
    assert len(found.exit_codes) == count, found.exit_codes
    assert set(found.exit_codes.values()) == {0}, f"{found.exit_codes}\n{logs}"
    assert all("training finished: all workers exited 0" in t for t in found.logs.values()), logs


def test_sdk_v2_estimator_local_mode_trains_with_ddp(
    image, sdk2_python, docker_client, job, tmp_path
):
    root, output = job["root"], tmp_path / "output"
    root.mkdir()
    with sdk_local_mode(), local_mode_cleanup(docker_client, root) as found:
        result, log = run_client(
            sdk2_python,
            SDK_V2_CLIENT,
            tmp_path,
            image,
            str(job["code"]),
            str(job["data"]),
            str(output),
            str(root),
        )
    check_containers(found, 2)
    assert result["model_data"] == f"file://{output}/model.tar.gz"
    hosts = sorted(found.exit_codes)
    assert [h.rsplit("-", 1)[0] for h in hosts] == ["algo-1", "algo-2"], hosts
    assert log.count("SDK-PROBE rank") == 4, log[-4000:]
    check_ddp(members(output / "model.tar.gz"), members(output / "output.tar.gz"), hosts)
    ranks = json.loads(members(output / "model.tar.gz")["ddp.json"])["ranks"]
    assert {r["cwd"] for r in ranks} == {"/opt/ml/code"}


def test_sdk_v3_model_trainer_local_container_trains_with_ddp(
    image, sdk3_python, docker_client, job, tmp_path
):
    root = job["root"]
    root.mkdir()
    with sdk_local_mode(), local_mode_cleanup(docker_client, root) as found:
        _, log = run_client(
            sdk3_python,
            SDK_V3_CLIENT,
            tmp_path,
            image,
            str(job["code"]),
            str(job["data"]),
            str(root),
        )
    check_containers(found, 2)
    assert sorted(found.exit_codes) == ["algo-1", "algo-2"]
    assert log.count("SDK-PROBE rank") == 4, log[-4000:]
    artifacts = root / "compressed_artifacts"
    check_ddp(
        members(artifacts / "model.tar.gz"),
        members(artifacts / "output.tar.gz"),
        ["algo-1", "algo-2"],
    )
    ranks = json.loads(members(artifacts / "model.tar.gz")["ddp.json"])["ranks"]
    assert {r["cwd"] for r in ranks} == {"/opt/ml/input/data/code"}
