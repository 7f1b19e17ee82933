"""A heterogeneous job on three containers, the AWS guide's layout (`data` = [algo-2], `train` =
[algo-3, algo-1]: a group's hosts unsorted), with and without
`sagemaker_distribution_instance_groups`: never one world across groups, the master and ranks
the DLC's toolkit computes (the group's hosts in the file's order), a host outside the
distribution groups running the script once, and no group waiting for another: one group
frozen (its script's processes stopped) while the other finishes. Then `distribution=` for
MPI handed to the base's own toolkit, its command line recorded by a stand-in `mpirun`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from scripts.local.cluster import Cluster
from tests.docker.conftest import REPO, until

PROBE = REPO / "tests" / "scripts" / "group_probe.py"
GUIDE = (("data", ("algo-2",)), ("train", ("algo-3", "algo-1")))
FREEZE = """
import os, signal, sys
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        if int(pid) != os.getpid() and any(a.endswith(b"group_probe.py") for a in argv):
            os.kill(int(pid), getattr(signal, sys.argv[1]))
    except OSError:
        pass
"""


def cluster(image: str, root: Path, work: str, **hyperparameters: str) -> Cluster:
    return Cluster(
        image=image,
        root=root,
        hosts=("algo-1", "algo-2", "algo-3"),
        hyperparameters={"sagemaker_program": '"group_probe.py"', **hyperparameters},
        environment={"WORK_SECONDS": work, "PET_NPROC_PER_NODE": "1"},
        code={PROBE.name: PROBE.read_bytes()},
        groups=GUIDE,
    )


def signal_group(job: Cluster, group: str, sig: str) -> None:
    """SIGSTOP or SIGCONT to the script's processes on every host of `group` (its bootstraps
    stay alive: the side channel's heartbeats go on)."""
    members = dict(GUIDE)[group]
    for host, container in job.containers:
        if host in members:
            container.exec_run(["python3", "-c", FREEZE, sig])


def seen(job: Cluster) -> dict[str, list[dict]]:
    return {
        host: [json.loads(p.read_text()) for p in (job.tree(host) / "output/data").glob("seen-*")]
        for host in job.hosts
    }


def status(job: Cluster) -> dict[str, str]:
    found = {}
    for host, container in job.containers:
        container.reload()
        found[host] = container.status
    return found


def started(job: Cluster, host: str) -> bool:
    logs = (job.tree(host) / "output/data/container-entry/logs").glob("rank-*.log")
    return any("started" in log.read_text() for log in logs)


def test_without_the_key_each_group_is_its_own_world_and_the_data_group_need_not_wait(
    image, tmp_path
):
    job = cluster(image, tmp_path, "data=2,train=15")
    try:
        job.start()
        assert until(lambda: all(started(job, h) for h in job.hosts), 240)
        signal_group(job, "train", "SIGSTOP")  # the training group frozen
        assert until(lambda: status(job)["algo-2"] == "exited", 120), status(job)
        assert status(job)["algo-1"] == status(job)["algo-3"] == "running"
        signal_group(job, "train", "SIGCONT")
        results = job.wait(timeout=240)
    finally:
        job.cleanup()
    assert [r.exit_code for r in results] == [0, 0, 0], [r.logs[-2500:] for r in results]
    facts = seen(job)
    # data: a world of its own (one host, one worker); train: algo-3 first, as the file lists it
    assert facts["algo-2"] == [
        {"host": "algo-2", "group": "data", "rank": "0", "world": "1", "master": "127.0.0.1",
         "is_master": True, "master_hostname": "algo-2", "sum": 1},
    ]  # fmt: skip
    train = {
        f["host"]: (f["rank"], f["world"], f["sum"]) for h in ("algo-1", "algo-3") for f in facts[h]
    }
    assert train == {"algo-3": ("0", "2", 2), "algo-1": ("1", "2", 2)}
    assert {f["master_hostname"] for h in ("algo-1", "algo-3") for f in facts[h]} == {"algo-3"}
    plan_line = next(line for line in results[0].logs.splitlines() if "worlds" in line)
    assert "each group is a world of its own" in plan_line


def test_with_the_key_the_other_groups_run_once_and_the_training_group_need_not_wait(
    image, tmp_path
):
    hps = {"sagemaker_distribution_instance_groups": '["train"]'}
    job = cluster(image, tmp_path, "data=15,train=2", **hps)
    try:
        job.start()
        assert until(lambda: all(started(job, h) for h in job.hosts), 240)
        signal_group(job, "data", "SIGSTOP")  # the data group frozen
        assert until(lambda: status(job)["algo-1"] == "exited", 120), status(job)
        coordinator = job.tree("algo-3") / "output" / "success"
        assert until(coordinator.exists, 60)  # its training done; it serves the side channel on
        assert status(job)["algo-2"] == "running"
        signal_group(job, "data", "SIGCONT")
        results = job.wait(timeout=240)
    finally:
        job.cleanup()
    assert [r.exit_code for r in results] == [0, 0, 0], [r.logs[-2500:] for r in results]
    facts = seen(job)
    # outside the distribution groups: once, as the DLC runs it (its master and port exported)
    assert facts["algo-2"] == [
        {"host": "algo-2", "group": "data", "rank": None, "world": None, "master": "algo-3",
         "is_master": False, "master_hostname": "algo-3"},
    ]  # fmt: skip
    train = {
        f["host"]: (f["rank"], f["world"], f["sum"]) for h in ("algo-1", "algo-3") for f in facts[h]
    }
    assert train == {"algo-3": ("0", "2", 2), "algo-1": ("1", "2", 2)}
    assert "in no DDP world" in results[1].logs
    assert "waiting for the other hosts to finish" in results[2].logs


def test_a_failure_in_one_group_is_the_first_failure_of_every_group(image, tmp_path):
    """The side channel spans the job though the worlds do not: the data group's script
    (algo-2, a world of its own) fails while the training group (algo-3, algo-1) still works;
    every host stops with algo-2's failure as the job's first."""
    job = cluster(image, tmp_path, "data=2,train=120", fail_group='"data"')
    try:
        job.start()
        results = job.wait(timeout=300)
    finally:
        job.cleanup()
    for result in results:
        assert result.exit_code != 0, result.logs[-2500:]
        first = (result.tree / "output" / "failure").read_text().splitlines()[0]
        assert "algo-2" in first and "planted failure in group data" in first, (result.host, first)
    trained = [r.seconds for r in results if r.host != "algo-2"]
    assert max(trained) < 100, trained  # stopped, not left to finish their 120 s of work


FAKE_MPIRUN = """#!/bin/sh
# stands in for Open MPI's mpirun: records the command line the toolkit built, then trains
printf '%s\\n' "$@" > /opt/ml/output/mpirun-argv.txt
exec sleep 100000
"""
FAKE_SSHD = "#!/bin/sh\nexec sleep 100000\n"  # the toolkit's MPI master starts /usr/sbin/sshd


@pytest.fixture(scope="module")
def mpi_image(image, tmp_path_factory) -> str:
    """The image with stand-ins for mpirun and sshd (no MPI here)."""
    context = tmp_path_factory.mktemp("mpi")
    (context / "mpirun").write_text(FAKE_MPIRUN)
    (context / "sshd").write_text(FAKE_SSHD)
    (context / "Dockerfile").write_text(
        f"FROM {image}\n"
        "COPY mpirun /usr/local/bin/mpirun\nCOPY sshd /usr/sbin/sshd\n"
        "RUN chmod 0755 /usr/local/bin/mpirun /usr/sbin/sshd\n"
    )
    tag = "container-entry:test-mpi"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(context)], check=True)
    return tag


def test_distribution_mpi_is_handed_to_the_base_toolkit_unchanged_under_our_stop(
    mpi_image, tmp_path
):
    hps = {
        "sagemaker_program": '"group_probe.py"',
        "sagemaker_mpi_enabled": "true",
        "sagemaker_mpi_num_of_processes_per_host": "2",
        "sagemaker_mpi_custom_mpi_options": '"-x MY_OPTION=1"',
        "epochs": "3",
    }
    job = Cluster(
        image=mpi_image,
        root=tmp_path,
        hosts=("algo-1",),
        hyperparameters=hps,
        code={PROBE.name: PROBE.read_bytes()},
    )
    argv = job.tree("algo-1") / "output" / "mpirun-argv.txt"
    try:
        job.start()
        assert until(argv.exists, 240), status(job)
        time.sleep(1)
        job.stop(timeout=120)
        (result,) = job.wait(timeout=120)
    finally:
        job.cleanup()
    words = argv.read_text().split("\n")
    # the toolkit's own MPI command line: every host at 2 processes, the custom option, the script
    assert words[:5] == ["--host", "algo-1:2", "-np", "2", "--allow-run-as-root"], words
    assert words[words.index("MY_OPTION=1") - 1] == "-x", words
    assert words[-6:] == ["-m", "mpi4py", "group_probe.py", "--epochs", "3", ""], words
    assert "the base image's own SageMaker toolkit, unchanged" in result.logs, result.logs[-3000:]
    assert "distribution= asks for MPI (sagemaker_mpi_enabled)" in result.logs
    assert result.exit_code == 143, result.logs[-3000:]
    assert "job stopped by SIGTERM: the base image's SageMaker toolkit ended" in result.logs
    # the toolkit wrote its own failure file as its mpirun died: the first one written stands
    assert (result.tree / "output" / "failure").read_text().startswith("ExecuteUserScriptError")
