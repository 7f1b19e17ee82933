"""The image, started the way SageMaker and users start it, on a real docker engine."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time

from scripts.local.cluster import Cluster
from tests.docker.conftest import REPO

TRAINER = REPO / "examples" / "hf_trainer_tiny.py"


def docker_run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "run", "--rm", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_two_hosts_train_with_ddp_and_no_distribution_flag(image, train_data, tmp_path):
    cluster = Cluster(
        image=image,
        root=tmp_path,
        hosts=("algo-1", "algo-2"),
        hyperparameters={  # SDK v2 framework encoding; no sagemaker_*distributed* key at all
            "epochs": "3",
            "learning-rate": "0.005",
            "model-type": '"bert"',
            "sagemaker_program": '"hf_trainer_tiny.py"',
            "sagemaker_submit_directory": '"/opt/ml/code"',
            "sagemaker_region": '"us-east-1"',
        },
        environment={"PET_NPROC_PER_NODE": "2"},
        channels={"train": {"data.jsonl": train_data}},
        code={"hf_trainer_tiny.py": TRAINER.read_bytes()},
        shm_size=None,  # docker's default 64 MiB, as a plain `docker run` gives
    )
    results = cluster.run(timeout=400)
    logs = "\n".join(f"--- {r.host}\n{r.logs[-3000:]}" for r in results)
    assert [r.exit_code for r in results] == [0, 0], logs

    ranks = {}
    for result in results:
        assert (result.tree / "output" / "success").exists()
        assert not (result.tree / "output" / "failure").exists()
        for path in (result.tree / "output" / "data").glob("rank-*.json"):
            summary = json.loads(path.read_text())
            ranks[summary["rank"]] = summary
            assert summary["host"] == result.host
            assert summary["world_size"] == 4 and summary["args_world_size"] == 4
            assert "DISTRIBUTED" in summary["parallel_mode"].upper()
            assert summary["data"].endswith("data.jsonl")
    assert sorted(ranks) == [0, 1, 2, 3], logs
    first = ranks[0]
    assert math.isfinite(first["last_loss"]) and first["last_loss"] < first["first_loss"]
    assert all(r["argv"] == first["argv"] for r in ranks.values())

    algo1, algo2 = (r.tree / "model" for r in results)
    assert len(list(algo1.glob("*.safetensors"))) == 1
    assert list(algo2.iterdir()) == []
    for result in results:  # what the CPU preflight checks, in its own words
        assert "preflight: no GPU on this host; all_reduce across 2 hosts" in result.logs
        # docker's default /dev/shm, checked by the preflight on every host
        assert f"preflight warning on {result.host}: /dev/shm is 64 MiB" in result.logs
        # output/data is uploaded with the job: logs and records, no pid or empty stack files
        kept = sorted(
            str(p.relative_to(result.tree / "output/data"))
            for p in (result.tree / "output/data/container-entry").rglob("*")
            if p.is_file()
        )
        assert kept and not [k for k in kept if k.endswith(".pid") or "stacks" in k], kept


def test_torchrun_rejecting_our_command_line_is_one_line_naming_the_torch(image, tmp_path):
    """A torch whose metadata claims 2.12 (so the plan passes --shutdown-timeout) in front of
    the image's real torch 2.9 launcher: what a user sees when our flag table is wrong."""
    fake = tmp_path / "fake" / "torch-2.12.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n")
    (tmp_path / "hello.py").write_text("print('never runs')\n")
    result = docker_run(
        *("-e", "PYTHONPATH=/fake", "-v", f"{tmp_path / 'fake'}:/fake:ro"),
        *("-v", f"{tmp_path}:/code:ro", image, "train", "/code/hello.py"),
    )
    assert result.returncode == 70, result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if "failed:" in line]
    assert len(failed) == 1 and re.fullmatch(
        r"\[container-entry\] failed: internal error: torchrun \(torch 2\.12\.0\) on \S+ "
        r"rejected the command line container-entry built: unrecognized arguments: "
        r"--shutdown-timeout",
        failed[0],
    ), result.stderr[-3000:]
    assert "usage:" not in result.stderr and "never runs" not in result.stdout


def test_docker_run_without_opt_ml_runs_the_script_from_the_command_line(image, tmp_path):
    (tmp_path / "hello.py").write_text(
        "import os, sys\n"
        "print('HELLO', os.environ['RANK'], os.environ['WORLD_SIZE'], sys.argv[1:])\n"
    )
    result = docker_run(
        "-v", f"{tmp_path}:/code:ro", image, "train", "/code/hello.py", "--x", "a b", "$(id)"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "HELLO 0 1 ['--x', 'a b', '$(id)']" in result.stdout
    assert "mode        local" in result.stderr


def test_no_arguments_and_passthrough_commands(image):
    no_args = docker_run(image)
    assert no_args.returncode == 2 and "no entry script" in no_args.stderr
    python = docker_run(image, "python3", "-c", "import sys; print('py', sys.argv[1:])", "x y")
    assert python.stdout.strip() == "py ['x y']"
    shell = docker_run(image, "bash", "-c", 'echo "$0"', "literal $(id)")
    assert shell.stdout.strip() == "literal $(id)"
    plan = docker_run("-e", "SAGEMAKER_PROGRAM=x.py", image, "plan")
    assert json.loads(plan.stdout)["topology"]["source"] == "local"


def test_derived_image_runs_with_no_arguments(image, tmp_path):
    (tmp_path / "job.py").write_text(
        "import os, sys\n"
        "env = os.environ\n"
        "sys.stdout.write(f\"DERIVED {env['WORLD_SIZE']} {env['SM_MODEL_DIR']}\\n\")\n"
    )
    (tmp_path / "Dockerfile").write_text(
        f"FROM {image}\nCOPY job.py /opt/ml/code/job.py\nENV SAGEMAKER_PROGRAM=job.py\n"
    )
    subprocess.run(
        ["docker", "build", "-q", "-t", "container-entry-derived:test", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    result = docker_run("-e", "PET_NPROC_PER_NODE=2", "container-entry-derived:test")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("DERIVED 2 /opt/ml/model") == 2


def test_image_labels_and_layers(image, standin, docker_client):
    ours = docker_client.images.get(image)
    labels = ours.labels
    assert labels["org.opencontainers.image.base.name"] == standin
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert labels["org.opencontainers.image.revision"] == head  # `make build`'s default
    assert labels["org.opencontainers.image.version"]
    assert ours.attrs["Config"]["Entrypoint"] == [
        "env",
        "--block-signal=INT,TERM,HUP",
        "container-entry",
    ]
    added = ours.attrs["Size"] - docker_client.images.get(standin).attrs["Size"]
    assert added < 5_000_000, f"our layers add {added} bytes"


SHM_FILLER = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
# what DataLoader workers and NCCL do: put tensors in /dev/shm; 96 MiB per rank
path = f"/dev/shm/filler-{dist.get_rank()}"
with open(path, "wb") as handle:
    for _ in range(96):
        handle.write(b"x" * (1 << 20))
        handle.flush()
print("FILLED", dist.get_rank(), flush=True)
dist.barrier()
os.unlink(path)
"""


def test_docker_s_64_mib_shm_is_warned_about_and_named_when_a_rank_runs_out(image, tmp_path):
    """docker run's real /dev/shm (64 MiB): the plan warns at start naming the size and the
    fix, and a rank that fills it fails with a failure file whose hint says --shm-size; with
    --shm-size=1g the same job runs, with no warning."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "fill.py").write_text(SHM_FILLER)
    (tmp_path / "out").mkdir()
    common = ("-e", "PET_NPROC_PER_NODE=2", "-v", f"{tmp_path}/code:/code:ro")
    small = docker_run(*common, "-v", f"{tmp_path}/out:/opt/ml/output", image, "train",
                       "/code/fill.py")  # fmt: skip
    assert small.returncode != 0, small.stderr[-3000:]
    assert "warning     /dev/shm is 64 MiB" in small.stderr, small.stderr[-3000:]
    assert "--shm-size=1g" in small.stderr
    failure = (tmp_path / "out" / "failure").read_text()
    assert "--shm-size" in failure.splitlines()[0], failure
    large = docker_run("--shm-size=1g", *common, image, "train", "/code/fill.py")
    assert large.returncode == 0, large.stderr[-3000:]
    assert "/dev/shm is" not in large.stderr
    assert large.stdout.count("FILLED") == 2


def test_container_entry_stacks_in_a_live_container(image, tmp_path):
    """`docker exec CONTAINER container-entry stacks` (an SSM session on SageMaker): the function
    each rank is in, tagged by rank, while the job runs on; the job then finishes normally."""
    (tmp_path / "loop.py").write_text(
        "import os, time\n"
        "def train_loop():\n"
        "    for step in range(60):\n"
        "        print(f'step {step}', flush=True)\n"
        "        time.sleep(0.25)\n"
        "train_loop()\n"
    )
    name = f"ce-stacks-{tmp_path.name}"[:60]
    started = subprocess.run(
        [
            *("docker", "run", "-d", "--name", name, "-e", "PET_NPROC_PER_NODE=2"),
            *("-v", f"{tmp_path}:/opt/ml/code:ro", image, "train", "loop.py"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    container = started.stdout.strip()
    try:
        deadline = time.monotonic() + 120
        logs = ""
        while time.monotonic() < deadline:
            logs = subprocess.run(
                ["docker", "logs", container], capture_output=True, text=True, check=False
            ).stdout
            if all(f"rank {r}] step 3" in logs for r in (0, 1)):
                break
            time.sleep(0.5)
        shown = subprocess.run(
            ["docker", "exec", container, "container-entry", "stacks"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        exit_code = subprocess.run(
            ["docker", "wait", container], capture_output=True, text=True, timeout=120, check=True
        ).stdout.strip()
        logs = subprocess.run(
            ["docker", "logs", container], capture_output=True, text=True, check=False
        )
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    for rank in (0, 1):
        lines = [line for line in shown.stdout.splitlines() if f" rank {rank}] " in line]
        assert any(line.endswith(" in train_loop") for line in lines), shown.stdout
        assert lines[-1].endswith(f"stacks/rank-{rank}.txt)"), shown.stdout
    assert exit_code == "0", logs.stderr[-3000:]
    assert "rank 1] step 59" in logs.stdout  # it ran on to the end


def test_the_disk_check_counts_the_stand_in_as_built_only_where_this_checkout_built_it(
    standin, tmp_path
):
    """`make test` and `make demo` check free disk first (scripts/build/disk_space.py); a fresh
    clone beside a stand-in image built by another checkout stages 4 GB of wheels again
    (the lock gives it the same image), so it asks for those, not for the built figure and
    not for a whole build."""
    from scripts.build.disk_space import Standin, standin_state

    assert standin_state(REPO, standin) is Standin.BUILT_HERE  # the fixture built it here
    assert standin_state(tmp_path, standin) is Standin.IMAGE_ONLY  # a fresh clone: no record
    record = tmp_path / "build" / "logs" / "smoke.ok"
    record.parent.mkdir(parents=True)
    for text in ("", "\n", "sha256:" + "0" * 64 + " sum\n", "\x00\xff garbage"):
        record.write_text(text, errors="surrogateescape")
        assert standin_state(tmp_path, standin) is Standin.IMAGE_ONLY, repr(text)
    record.write_bytes(b"\xff\xfe not utf-8")
    assert standin_state(tmp_path, standin) is Standin.IMAGE_ONLY
    record.write_bytes((REPO / "build" / "logs" / "smoke.ok").read_bytes())
    assert standin_state(tmp_path, standin) is Standin.BUILT_HERE
    missing = "container-entry/no-such-image:none"
    assert standin_state(tmp_path, missing) is Standin.ABSENT
