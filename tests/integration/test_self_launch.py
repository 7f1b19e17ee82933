"""Entry points that launch their own workers, in real processes: the bootstrap runs each once per
host, as the DLC runs it, never inside our workers (issue: scripts that launch their own
workers). Every form of tests/scripts/self_launch/ on 1 and 2 hosts, 1 and 2 workers per host:
the user's world forms exactly as its launcher asked (no duplicate training, no port taken by
ours), every host exits 0; a stop mid-training ends each form with 143 and every worker's
checkpoint written; a crash in one of the user's workers is named in our failure file.

Two hosts run as two bootstraps on this machine, each resolving algo-1/algo-2 to 127.0.0.1 in
a mount namespace of its own (conftest.with_hosts_file); a launcher whose world stays on its
host (the tutorial's mp.spawn, `accelerate launch` without machines) then takes a port per
host. NPROC stands for the GPU count the user's script reads, PET_NPROC_PER_NODE for the
workers our launcher would have started per host (one per GPU).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import (
    REPO,
    MlTree,
    bootstrap_argv,
    bootstrap_env,
    make_tree,
    wait_for,
    with_hosts_file,
)
from tests.ports import job_port

SCRIPTS = REPO / "tests" / "scripts" / "self_launch"
# entry point -> whether its world spans the hosts (else one world per host); each is taken
# for a launcher by the detection (plan/launchers.py)
FORMS = {
    "torchrun.sh": True,
    "dist_run.sh": True,
    "launch_use_env.sh": True,
    "variable.sh": True,
    "accelerate.sh": False,
    "tutorial.py": False,
    "subprocess_run.py": True,
    "elastic.py": False,
}
# the overrides' cases: one the detection misses, one it takes for a launcher wrongly
SPANS = {**FORMS, "hidden.py": False, "spawn_helper.py": False}
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
)


@dataclass
class Host:
    tree: MlTree
    process: subprocess.Popen

    def finish(self, timeout: float = 240) -> tuple[int, str]:
        _, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err

    def ranks(self) -> list[dict]:
        return self.tree.summaries("ranks/rank-*.json")

    def first_line(self) -> str:
        return (self.tree.output / "failure").read_text().splitlines()[0]

    def started(self) -> int:
        log = self.tree.output / "data" / "container-entry" / "logs" / "rank-0.log"
        try:
            return log.read_text().count("started rank")
        except OSError:
            return 0


def start_job(
    tmp_path: Path,
    entry: str,
    hosts: int,
    nproc: int,
    hosts_file: Path,
    files: Mapping[str, str] | None = None,
    **extra: str,
) -> list[Host]:
    """The job's bootstraps, one per host, the user's scripts (and `files`) in each code
    folder."""
    names = tuple(f"algo-{i + 1}" for i in range(hosts))
    spans = SPANS[entry]
    shared = str(job_port())
    started = []
    for name in names:
        tree = make_tree(tmp_path, current_host=name, hosts=names, script=None)
        shutil.rmtree(tree.base / "code")
        shutil.copytree(SCRIPTS, tree.base / "code")
        for name, text in (files or {}).items():
            (tree.base / "code" / name).write_text(text)
        settings = {
            "SAGEMAKER_PROGRAM": entry,
            "PET_NPROC_PER_NODE": str(nproc),
            "NPROC": str(nproc),
            "USER_PORT": shared if spans else str(job_port()),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        }
        env = bootstrap_env(tree, **{**settings, **extra})
        # algo-N resolves as on SageMaker, one host too (a script names its master)
        argv = with_hosts_file(bootstrap_argv(), hosts_file)
        process = subprocess.Popen(
            argv, env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        started.append(Host(tree, process))
    return started


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("entry", sorted(FORMS))
def test_the_users_world_forms_as_its_launcher_asked(tmp_path, hosts_file, entry, hosts, nproc):
    job = start_job(tmp_path, entry, hosts, nproc, hosts_file)
    results = [host.finish() for host in job]
    assert [code for code, _ in results] == [0] * hosts, [err[-3000:] for _, err in results]
    world = nproc * hosts if FORMS[entry] else nproc
    for index, (host, (_, err)) in enumerate(zip(job, results, strict=True)):
        assert "the entry point launches its own workers" in err, err[-3000:]
        assert f"{entry} line" in err  # the plan names the file and line that launches
        ranks = sorted(host.ranks(), key=lambda facts: facts["rank"])
        first = index * nproc if FORMS[entry] else 0
        # exactly its own workers, once: no copy of the user's launcher per worker of ours
        assert [facts["rank"] for facts in ranks] == list(range(first, first + nproc)), ranks
        assert all(facts["world"] == world and facts["sum"] == world for facts in ranks), ranks
        assert (host.tree.output / "success").exists()


@pytest.mark.parametrize("entry", ["torchrun.sh", "accelerate.sh"])
def test_the_entry_point_gets_the_dlcs_environment_not_torchruns(tmp_path, hosts_file, entry):
    """What a user's launcher reads: the SM_* contract, MASTER_ADDR/MASTER_PORT as the DLC's
    toolkit exports them (its master, 7777), the user's own PET_* values; none of the
    per-rank variables of our torchrun, which would make its launcher a client of ours."""
    (host,) = start_job(tmp_path, entry, 1, 2, hosts_file, PET_MONITOR_INTERVAL="0.5")
    code, err = host.finish()
    assert code == 0, err[-3000:]
    seen = dict(
        line.split("=", 1)
        for line in (host.tree.output / "data" / "entry-env.txt").read_text().splitlines()
        if "=" in line
    )
    assert not [name for name in TORCHRUN_VARIABLES if name in seen]
    assert not [name for name in seen if name.startswith("TORCHELASTIC_")]
    assert (seen["MASTER_ADDR"], seen["MASTER_PORT"]) == ("algo-1", "7777")
    assert seen["PET_NPROC_PER_NODE"] == "2" and seen["PET_MONITOR_INTERVAL"] == "0.5"
    assert seen["SM_CURRENT_HOST"] == "algo-1" and json.loads(seen["SM_HOSTS"]) == ["algo-1"]


def test_the_users_launcher_may_take_our_own_master_port(tmp_path, hosts_file):
    """Our torchrun, hosting the entry point once, listens on a port the kernel picks: the
    user's launcher may take the port our DDP workers would have used (29500 by default)."""
    port = str(job_port())
    (host,) = start_job(
        tmp_path, "torchrun.sh", 1, 2, hosts_file, USER_PORT=port, CONTAINER_ENTRY_MASTER_PORT=port
    )
    code, err = host.finish()
    assert code == 0, err[-3000:]
    assert len(host.ranks()) == 2


@pytest.mark.parametrize("entry", sorted(FORMS))
def test_a_stop_mid_training_ends_each_form_with_143_and_every_checkpoint(
    tmp_path, hosts_file, entry
):
    (host,) = start_job(tmp_path, entry, 1, 2, hosts_file, STEPS="100000")
    assert wait_for(lambda: host.started() >= 2 or host.process.poll() is not None, 120)
    host.process.send_signal(signal.SIGTERM)
    code, err = host.finish(timeout=120)
    assert code == 143, err[-3000:]
    checkpoints = sorted(p.name for p in (host.tree.base / "model").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-0", "checkpoint-1"], err[-3000:]
    assert host.first_line().startswith("job stopped by SIGTERM on algo-1"), host.first_line()


# what the failure file names of the worker that crashed, by the launcher that reported it
CRASHED = {
    "tutorial.py": "process 1 of torch.multiprocessing.spawn",
    "accelerate.sh": "worker rank 1 (local 1)",
}


@pytest.mark.parametrize("entry", sorted(FORMS))
def test_a_crash_in_one_of_the_users_workers_is_named(tmp_path, hosts_file, entry):
    (host,) = start_job(tmp_path, entry, 1, 2, hosts_file, CRASH="1")
    code, err = host.finish()
    assert code != 0, err[-3000:]
    line = host.first_line()
    assert line.startswith(f"{entry} on algo-1 (once per host): "), line
    assert CRASHED.get(entry, "worker rank 1 (local 1)") in line, line
    assert "ValueError: planted failure on rank 1" in line, line
    assert line.endswith("[first failure]")


def test_a_launcher_the_detection_misses_runs_once_when_the_setting_says_so(tmp_path, hosts_file):
    (missed,) = start_job(tmp_path / "auto", "hidden.py", 1, 2, hosts_file)
    code, err = missed.finish()
    assert code != 0  # under our 2 workers: two copies of its launcher on one port
    (forced,) = start_job(
        tmp_path / "once", "hidden.py", 1, 2, hosts_file, CONTAINER_ENTRY_LAUNCH="once"
    )
    code, err = forced.finish()
    assert code == 0, err[-3000:]
    assert "CONTAINER_ENTRY_LAUNCH=once (forced)" in err
    assert sorted(facts["rank"] for facts in forced.ranks()) == [0, 1]


def test_a_script_wrongly_taken_for_a_launcher_runs_in_our_workers_when_the_setting_says_so(
    tmp_path, hosts_file
):
    (taken,) = start_job(tmp_path / "auto", "spawn_helper.py", 1, 2, hosts_file)
    code, err = taken.finish()
    assert code == 0 and "spawn_helper.py line" in err, err[-3000:]
    assert [facts["world"] for facts in taken.ranks()] == [1]  # once: no DDP of 2 workers
    (forced,) = start_job(
        tmp_path / "ddp", "spawn_helper.py", 1, 2, hosts_file, CONTAINER_ENTRY_LAUNCH="ddp"
    )
    code, err = forced.finish()
    assert code == 0, err[-3000:]
    assert "CONTAINER_ENTRY_LAUNCH=ddp (forced)" in err
    assert sorted((f["rank"], f["world"]) for f in forced.ranks()) == [(0, 2), (1, 2)]
