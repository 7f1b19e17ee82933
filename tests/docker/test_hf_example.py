"""An end-to-end job shaped like Hugging Face's examples, through SageMaker SDK v2 local mode.

examples/hf_clm_style.py (HfArgumentParser, `--do_train True`, `datasets`' text loader, Trainer,
save_model to /opt/ml/model) runs in an image derived from ours, 2 instances x
PET_NPROC_PER_NODE=2 gloo workers, with the hyperparameters HF's SageMaker examples pass; the
model+tokenizer folder (examples/make_tiny_lm.py, generated in that image: the job's library
versions) arrives as a `model` channel and the text as a `train` channel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.docker import test_sdk_clients as sdk
from tests.docker.conftest import IMAGE, REPO
from tests.docker.sdk_venvs import local_mode_cleanup, sdk_local_mode

pytestmark = pytest.mark.docker

DERIVED = f"{IMAGE}-hf-clm"

# What a user's image on ours adds: no packages (datasets and evaluate come with the DLC, and with
# the stand-in as with the DLC), only an ENV. The job is offline: the model and tokenizer arrive
# as a channel, so an accidental hub call fails at once instead of waiting on the network.
DOCKERFILE = f"""\
FROM {IMAGE}
ENV HF_HUB_OFFLINE=1
"""

HYPERPARAMETERS = {
    "model_name_or_path": "/opt/ml/input/data/model",
    "train_file": "/opt/ml/input/data/train/train.txt",
    "do_train": True,
    "output_dir": "/opt/ml/model",
    "num_train_epochs": 2,
    "per_device_train_batch_size": 4,
    "learning_rate": 1e-2,
    "block_size": 32,
    "logging_steps": 5,
    "save_strategy": "no",
    "report_to": "none",
}

CLIENT = f"""\
import json, sys
from sagemaker.estimator import Estimator
from sagemaker.local import LocalSession

image, code, train, model, output, root = sys.argv[1:]
session = LocalSession()
session.config = {{"local": {{"local_code": True, "container_root": root}}}}
estimator = Estimator(
    image_uri=image,
    role="arn:aws:iam::111111111111:role/SageMakerRole",
    instance_type="local",
    instance_count=2,
    entry_point="hf_clm_style.py",
    source_dir=code,
    hyperparameters={HYPERPARAMETERS!r},
    environment={{"PET_NPROC_PER_NODE": "2"}},
    output_path="file://" + output,
    base_job_name="hf-clm",
    sagemaker_session=session,
)
estimator.fit({{"train": "file://" + train, "model": "file://" + model}}, wait=True, logs=True)
print("CLIENT-RESULT " + json.dumps({{"model_data": estimator.model_data}}))
"""

PROCESS = re.compile(
    r"Process rank: (\d+), local rank: (\d+), device: (\S+), n_gpu: (\d+), "
    r"distributed training: (True|False), world size: (\d+)"
)
LOSS = re.compile(r"""['"]loss['"]: '?([0-9.]+)""")

sdk2_python = sdk.sdk2_python  # the SDK v2 venv fixture


@pytest.fixture(scope="module")
def derived_image(image, tmp_path_factory) -> str:
    context = tmp_path_factory.mktemp("derived")
    (context / "Dockerfile").write_text(DOCKERFILE)
    subprocess.run(
        ["docker", "build", "-q", "-t", DERIVED, str(context)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return DERIVED


@pytest.fixture(scope="module")
def tiny_lm(derived_image, tmp_path_factory):
    """train/train.txt and model/ from examples/make_tiny_lm.py, run in the job's image."""
    out = tmp_path_factory.mktemp("tiny-lm")
    subprocess.run(
        [
            "docker", "run", "--rm", "--network", "none",
            "--user", f"{os.getuid()}:{os.getgid()}", "-e", "HF_HOME=/tmp/hf",
            "-v", f"{REPO / 'examples'}:/src:ro", "-v", f"{out}:/out",
            "--entrypoint", "python3", derived_image, "/src/make_tiny_lm.py", "/out",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return out


def test_hf_clm_style_script_trains_as_ddp_on_two_instances(
    derived_image, tiny_lm, sdk2_python, docker_client, tmp_path
):
    code, root, output = tmp_path / "code", tmp_path / "local-mode", tmp_path / "output"
    code.mkdir()
    root.mkdir()
    shutil.copy(REPO / "examples" / "hf_clm_style.py", code)
    with sdk_local_mode(), local_mode_cleanup(docker_client, root) as found:
        result, log = sdk.run_client(
            sdk2_python,
            CLIENT,
            tmp_path,
            derived_image,
            str(code),
            str(tiny_lm / "train"),
            str(tiny_lm / "model"),
            str(output),
            str(root),
        )
    (tmp_path / "client.log").write_text(log)  # kept with pytest's tmp dirs for a look
    sdk.check_containers(found, 2)
    assert result["model_data"] == f"file://{output}/model.tar.gz"

    # Every process: one line, DDP over the world of 4, two local ranks per host.
    processes = PROCESS.findall(log)
    assert sorted(int(p[0]) for p in processes) == [0, 1, 2, 3], processes or log[-6000:]
    assert sorted(int(p[1]) for p in processes) == [0, 0, 1, 1], processes
    assert {(p[4], p[5]) for p in processes} == {("True", "4")}, processes

    losses = [float(value) for value in LOSS.findall(log)]
    assert len(losses) >= 3, log[-6000:]
    assert losses[-1] < 0.5 * losses[0], losses
    assert re.search(r"train loss: first [0-9.]+, last [0-9.]+", log), log[-6000:]

    model = sdk.members(output / "model.tar.gz")
    expected = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"}
    assert expected <= set(model), sorted(model)
    assert not any(name.startswith("checkpoint-") for name in model), sorted(model)
    # The trained weights, not the ones the model channel brought.
    assert model["model.safetensors"] != (tiny_lm / "model" / "model.safetensors").read_bytes()
