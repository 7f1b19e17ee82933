"""SDK v3's own way of shipping code, `ModelTrainer(source_code=SourceCode(...))`, in local mode.

The real SDK (requirements/sdk-v3.txt, sagemaker 3.27 / sagemaker-train 1.27) replaces the
image's entrypoint with `/bin/bash -c ".../sm_train.sh"`; the image's bash hook hands that start
to our launcher (container_entry/plan/sdk_driver.py). The client runs in its own venv with fake AWS
credentials (AWS itself cannot exist here); the containers are the SDK's own docker compose.
"""

from __future__ import annotations

import json
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from tests.docker.conftest import REPO
from tests.docker.sdk_venvs import (
    CLIENT_TIMEOUT,
    client_env,
    ensure_venv,
    local_mode_cleanup,
    members,
    run_client,
    sdk_local_mode,
)

SECRET = "hf_sdkv3SecretValue42"
HYPERPARAMETERS = {"epochs": 2, "model-name": "tiny bert", "lr": 0.5, "hf_token": SECRET}
SDK_ARGS = ["--epochs", "2", "--model-name", "tiny bert", "--lr", "0.5", "--hf_token", SECRET]
SM_NAMES = (
    "SM_HOST_COUNT",
    "SM_CURRENT_HOST_RANK",
    "SM_MASTER_ADDR",
    "SM_ENTRY_SCRIPT",
    "SM_SOURCE_DIR",
    "SM_HPS",
    "SM_HP_MODEL_NAME",
    "SM_NUM_GPUS",
    "SM_CHANNEL_TRAIN",
)

# The user's script: one gloo world; what each rank saw goes to SM_OUTPUT_DATA_DIR (in the
# SDK's output.tar.gz). PROBE_MODE=fail: the last rank raises; stop: READY, then on SIGTERM a
# 5 s checkpoint written to SM_OUTPUT_DATA_DIR before the rank exits.
TRAIN_PY = f"""\
import json, os, signal, sys, time

import torch
import torch.distributed as dist

mode = os.environ.get("PROBE_MODE", "ok")
out = os.environ["SM_OUTPUT_DATA_DIR"]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
try:
    import tinydep
    dep = tinydep.VALUE
except ImportError:
    dep = None
seen = {{
    "rank": rank,
    "world_size": world,
    "all_reduce": total.item(),
    "host": os.environ.get("CURRENT_HOST"),
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "local_rank": os.environ.get("LOCAL_RANK"),
    "bash_env": os.environ.get("BASH_ENV"),
    "tinydep": dep,
    "sm": {{name: os.environ.get(name) for name in {SM_NAMES!r}}},
}}
with open(os.path.join(out, f"rank-{{rank}}.json"), "w") as f:
    json.dump(seen, f)
print("SDK-PROBE", rank, world, "hps", os.environ["SM_HPS"], flush=True)
if mode == "fail" and rank == world - 1:
    raise ValueError("planted failure")
if mode == "stop":
    def checkpoint(signum, frame):
        time.sleep(5)
        with open(os.path.join(out, f"checkpoint-rank-{{rank}}.txt"), "w") as f:
            f.write("saved")
        sys.exit(0)
    signal.signal(signal.SIGTERM, checkpoint)
    print("SDK-READY", rank, flush=True)
    while True:
        time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
"""

CMD_PY = """\
import json, os, sys
seen = {"argv": sys.argv[1:], "local_rank": os.environ.get("LOCAL_RANK"),
        "hps": os.environ.get("SM_HPS"), "bash_env": os.environ.get("BASH_ENV")}
print("CMD-PROBE " + json.dumps(seen), flush=True)
"""

CLIENT = """\
import json, sys
from sagemaker.train import ModelTrainer
from sagemaker.train.configs import Compute, InputData, SourceCode
from sagemaker.train.distributed import Torchrun
from sagemaker.train.model_trainer import Mode

job = json.loads(sys.argv[1])
distributed = job.pop("torchrun", None)
trainer = ModelTrainer(
    training_image=job["image"],
    training_mode=Mode.LOCAL_CONTAINER,
    compute=Compute(instance_type="local_cpu", instance_count=job["instances"]),
    hyperparameters=job["hyperparameters"],
    environment=job["environment"],
    source_code=SourceCode(**job["source_code"]),
    distributed=Torchrun(process_count_per_node=distributed) if distributed else None,
    base_job_name="sdk-v3-source",
    local_container_root=job["root"],
)
trainer.train(input_data_config=[InputData(channel_name="train", data_source=job["data"])])
print("CLIENT-RESULT " + json.dumps({"root": job["root"]}))
"""


def tiny_wheel(folder: Path) -> str:
    """A pure-Python wheel (no index can be reached from a container here)."""
    name = "tinydep-0.1-py3-none-any.whl"
    with zipfile.ZipFile(folder / name, "w") as wheel:
        wheel.writestr("tinydep.py", 'VALUE = "tinydep ok"\n')
        info = "tinydep-0.1.dist-info"
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinydep\nVersion: 0.1\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return name


@pytest.fixture(scope="session")
def sdk3_python() -> Path:
    return ensure_venv("sdk3", REPO / "requirements" / "sdk-v3.txt")


@pytest.fixture
def sdk_job(tmp_path, image):
    """The user's side: a source dir (train.py, cmd_probe.py, a requirements file with a local
    wheel), a train channel; a job description the client turns into a ModelTrainer."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(TRAIN_PY)
    (src / "cmd_probe.py").write_text(CMD_PY)
    (src / "requirements.txt").write_text(f"./{tiny_wheel(src)}\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "hello"}\n')
    root = tmp_path / "local-mode"
    root.mkdir()
    return {
        "image": image,
        "root": str(root),
        "data": str(data),
        "instances": 1,
        "hyperparameters": HYPERPARAMETERS,
        "environment": {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        "source_code": {"source_dir": str(src), "entry_script": "train.py"},
    }


def train(python: Path, docker_client, job: dict, tmp_path: Path, *, ok: bool = True):
    """One local-mode job: (containers' exit codes and logs, client output, output files)."""
    root = Path(job["root"])
    with sdk_local_mode(), local_mode_cleanup(docker_client, root) as found:
        _, output = run_client(python, CLIENT, tmp_path, json.dumps(job), check=ok)
    archive = root / "compressed_artifacts" / "output.tar.gz"
    return found, output, members(archive) if archive.exists() else {}


def logs_of(found) -> str:
    return "\n".join(f"--- {s}\n{text}" for s, text in sorted(found.logs.items()))


def ranks(files: dict[str, bytes]) -> list[dict]:
    seen = [json.loads(v) for k, v in files.items() if k.startswith("data/rank-")]
    return sorted(seen, key=lambda r: r["rank"])


def test_entry_script_on_two_hosts_is_one_ddp_world_through_our_launcher(
    image, sdk3_python, docker_client, sdk_job, tmp_path
):
    # no launcher setting at all: one gloo worker per CPU-only host, one world across both
    sdk_job.update(instances=2)
    sdk_job["source_code"]["requirements"] = "requirements.txt"
    found, _, files = train(sdk3_python, docker_client, sdk_job, tmp_path)
    logs = logs_of(found)
    assert found.exit_codes == {"algo-1": 0, "algo-2": 0}, logs
    seen = ranks(files)
    assert [r["rank"] for r in seen] == [0, 1], logs
    assert {r["world_size"] for r in seen} == {2} and {r["all_reduce"] for r in seen} == {3.0}
    assert [r["host"] for r in seen] == ["algo-1", "algo-2"]
    assert all(r["argv"] == SDK_ARGS for r in seen), seen[0]["argv"]  # the SDK's own rendering
    assert {r["cwd"] for r in seen} == {"/opt/ml/input/data/code"}
    assert {r["tinydep"] for r in seen} == {"tinydep ok"}  # SourceCode.requirements
    assert {r["bash_env"] for r in seen} == {None}  # the image's hook is not the ranks'
    for text in found.logs.values():
        assert text.count("installing /opt/ml/input/data/code/requirements.txt") == 1, text
        assert "container-entry's launcher runs it" in text
        assert "training finished: all workers exited 0" in text
        assert "hang        declared after max(30 min" in text  # the watchdog, as on v2
    sm = {r["rank"]: r["sm"] for r in seen}  # what the SDK's environment.py sets
    assert [sm[r]["SM_CURRENT_HOST_RANK"] for r in range(2)] == ["0", "1"]
    assert {s["SM_HOST_COUNT"] for s in sm.values()} == {"2"}
    assert {s["SM_MASTER_ADDR"] for s in sm.values()} == {"algo-1"}
    assert {s["SM_ENTRY_SCRIPT"] for s in sm.values()} == {"train.py"}
    assert {s["SM_SOURCE_DIR"] for s in sm.values()} == {"/opt/ml/input/data/code"}
    assert {s["SM_HP_MODEL_NAME"] for s in sm.values()} == {"tiny bert"}
    assert {s["SM_CHANNEL_TRAIN"] for s in sm.values()} == {"/opt/ml/input/data/train"}
    assert json.loads(sm[0]["SM_HPS"]) == HYPERPARAMETERS
    assert "[algo-2 rank 1] SDK-PROBE 1 2" in logs  # our tagged live logs
    assert SECRET not in logs and "****" in logs  # the rank printed SM_HPS: masked
    assert "success" in files and "failure" not in files


def test_torchrun_process_count_runs_through_our_launcher(
    image, sdk3_python, docker_client, sdk_job, tmp_path
):
    sdk_job["torchrun"] = 2
    sdk_job["source_code"]["requirements"] = "requirements.txt"
    found, _, files = train(sdk3_python, docker_client, sdk_job, tmp_path)
    logs = logs_of(found)
    assert found.exit_codes == {"algo-1": 0}, logs
    seen = ranks(files)
    assert [(r["rank"], r["world_size"], r["local_rank"]) for r in seen] == [
        (0, 2, "0"),
        (1, 2, "1"),
    ], logs
    assert {r["tinydep"] for r in seen} == {"tinydep ok"}
    assert logs.count("installing /opt/ml/input/data/code/requirements.txt") == 1  # not per rank
    assert "Torchrun(process_count_per_node=2): container-entry's launcher runs it" in logs
    assert "workers     2 per host (SDK v3 Torchrun(process_count_per_node))" in logs
    assert "Running Torchrun Driver" not in logs  # the SDK's driver never ran


def test_a_failing_rank_gets_our_failure_file(image, sdk3_python, docker_client, sdk_job, tmp_path):
    sdk_job["environment"].update(PROBE_MODE="fail", PET_NPROC_PER_NODE="2")
    found, _, files = train(sdk3_python, docker_client, sdk_job, tmp_path, ok=False)
    logs = logs_of(found)
    assert found.exit_codes == {"algo-1": 1}, logs
    failure = files["failure"].decode()
    first = failure.splitlines()[0]
    assert "rank 1" in first and "ValueError: planted failure" in first, failure
    assert "Training Execution failed" not in failure  # not the SDK's driver's words
    assert "data/container-entry/failure.json" in files  # beside every rank's record


def test_a_stop_reaches_the_ranks_and_their_checkpoint_is_written(
    image, sdk3_python, docker_client, sdk_job, tmp_path
):
    sdk_job["environment"].update(PROBE_MODE="stop", PET_NPROC_PER_NODE="2")
    root = Path(sdk_job["root"])
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    label = "com.docker.compose.project.working_dir"
    with sdk_local_mode(), local_mode_cleanup(docker_client, root) as found:
        client = subprocess.Popen(
            [str(sdk3_python), str(script), json.dumps(sdk_job)],
            cwd=tmp_path,
            env=client_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + CLIENT_TIMEOUT
            container = None
            while time.monotonic() < deadline:
                listed = docker_client.containers.list(filters={"label": label})
                mine = [c for c in listed if c.labels.get(label, "").startswith(str(root))]
                if mine and mine[0].logs().decode(errors="replace").count("SDK-READY") == 2:
                    container = mine[0]
                    break
                assert client.poll() is None, client.communicate()[0][-4000:]
                time.sleep(0.5)
            assert container is not None, "the ranks never became ready"
            started = time.monotonic()
            container.stop(timeout=60)  # docker stop: SIGTERM, SIGKILL after 60 s
            stopped_in = time.monotonic() - started
            client.communicate(timeout=CLIENT_TIMEOUT)
        finally:
            if client.poll() is None:
                client.kill()
    logs = logs_of(found)
    assert found.exit_codes == {"algo-1": 143}, logs
    assert stopped_in < 30, f"{stopped_in:.1f} s: the stop was not taken at once"
    files = members(root / "compressed_artifacts" / "output.tar.gz")
    assert files.get("data/checkpoint-rank-0.txt") == b"saved", sorted(files)
    assert files.get("data/checkpoint-rank-1.txt") == b"saved", sorted(files)
    assert "SIGTERM" in files["failure"].decode().splitlines()[0], files["failure"]


def test_a_command_runs_as_the_sdk_runs_it(image, sdk3_python, docker_client, sdk_job, tmp_path):
    sdk_job["source_code"] = {
        "source_dir": sdk_job["source_code"]["source_dir"],
        "command": "python cmd_probe.py",
        "args": ["--x", "a b", "$HOME"],
    }
    found, _, _ = train(sdk3_python, docker_client, sdk_job, tmp_path)
    logs = logs_of(found)
    assert found.exit_codes == {"algo-1": 0}, logs
    lines = [line for line in logs.splitlines() if "CMD-PROBE " in line]
    assert len(lines) == 1, logs  # once: no launcher of ours
    seen = json.loads(lines[0].split("CMD-PROBE ", 1)[1])
    assert seen["argv"] == ["--x", "a b", "$HOME"] and seen["local_rank"] is None
    assert seen["bash_env"] is None  # the SDK's environment, without the image's hook
    assert json.loads(seen["hps"]) == HYPERPARAMETERS  # the SDK's own environment
    assert "SourceCode(command=...): the command runs as the SDK runs it" in logs
    assert "Executing command:" in logs  # the SDK's sm_train.sh ran it
    assert "[container-entry] plan" not in logs
