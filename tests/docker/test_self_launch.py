"""Entry points that launch their own workers, on two containers of the image (the default base's
torch 2.9, accelerate): 2 hosts x 2 workers, each user launcher on its own default port (29500,
the tutorial's 12355), which none of ours takes here. The forms the DLC's users wrote run as on
the DLC's own start (the stand-in's `train`, sagemaker-training's, which runs a script once per
host): the same world, the same ranks on the same hosts. A stop and a crash in a worker, on two
hosts."""

from __future__ import annotations

import json

import pytest

from scripts.local.cluster import Cluster, HostResult
from tests.docker.conftest import REPO, until

SCRIPTS = REPO / "tests" / "scripts" / "self_launch"
DEFAULT_PORT = {"tutorial.py": "12355"}  # each launcher's own default: torchrun's, accelerate's
# the DLC's users' forms, run on the DLC as well; the other forms on ours only
ON_BOTH = ("torchrun.sh", "tutorial.py", "accelerate.sh")
ON_OURS = ("dist_run.sh", "subprocess_run.py")


def job(image: str, root, entry: str, **environment: str) -> Cluster:
    return Cluster(
        image=image,
        root=root,
        hosts=("algo-1", "algo-2"),
        hyperparameters={"sagemaker_program": json.dumps(entry)},
        environment={
            "PET_NPROC_PER_NODE": "2",  # what our launcher would start on a 2-GPU instance
            "NPROC": "2",  # what the user's script asks its launcher for
            "USER_PORT": DEFAULT_PORT.get(entry, "29500"),
            **environment,
        },
        code={path.name: path.read_bytes() for path in SCRIPTS.iterdir() if path.is_file()},
    )


def worlds(results: list[HostResult]) -> dict[str, list[dict]]:
    """Each host's ranks as the user's workers saw them."""
    return {
        r.host: sorted(
            (json.loads(p.read_text()) for p in (r.tree / "output/data/ranks").glob("*.json")),
            key=lambda facts: facts["rank"],
        )
        for r in results
    }


@pytest.mark.parametrize("entry", ON_BOTH + ON_OURS)
def test_each_form_trains_once_per_host_as_on_the_dlc(image, standin, tmp_path, entry):
    ours = job(image, tmp_path / "ours", entry).run(timeout=300)
    logs = "\n".join(f"--- {r.host}\n{r.logs[-3000:]}" for r in ours)
    assert [r.exit_code for r in ours] == [0, 0], logs
    spans = entry not in ("tutorial.py", "accelerate.sh")  # else one world per host
    seen = worlds(ours)
    for index, host in enumerate(("algo-1", "algo-2")):
        first = 2 * index if spans else 0
        assert [facts["rank"] for facts in seen[host]] == [first, first + 1], seen
        assert {facts["world"] for facts in seen[host]} == {4 if spans else 2}, seen
    assert all("launches its own workers" in r.logs for r in ours), logs
    if entry in ON_BOTH:  # the incumbent, on the same files: the same worlds
        dlc = job(standin, tmp_path / "dlc", entry).run(timeout=300)
        assert [r.exit_code for r in dlc] == [0, 0], [r.logs[-3000:] for r in dlc]
        assert worlds(dlc) == seen


def test_a_stop_on_two_hosts_reaches_every_worker_of_the_users_launcher(image, tmp_path):
    cluster = job(image, tmp_path, "torchrun.sh", STEPS="100000")
    try:
        cluster.start()
        logs = [
            cluster.tree(h) / "output/data/container-entry/logs/rank-0.log" for h in cluster.hosts
        ]

        def started() -> int:
            return sum(p.read_text().count("started rank") for p in logs if p.exists())

        assert until(lambda: started() == 4, 240), started()
        cluster.stop(timeout=120)
        results = cluster.wait(timeout=120)
    finally:
        cluster.cleanup()
    assert [r.exit_code for r in results] == [143, 143], [r.logs[-3000:] for r in results]
    for index, result in enumerate(results):
        checkpoints = sorted(p.name for p in (result.tree / "model").glob("checkpoint-*"))
        assert checkpoints == [f"checkpoint-{2 * index}", f"checkpoint-{2 * index + 1}"]
        first = (result.tree / "output/failure").read_text().splitlines()[0]
        assert first.startswith("job stopped by SIGTERM on"), first


def test_a_crash_in_a_worker_on_one_host_is_the_jobs_first_failure_on_both(image, tmp_path):
    results = job(image, tmp_path, "torchrun.sh", CRASH="3", STEPS="40").run(timeout=300)
    assert all(r.exit_code != 0 for r in results), [r.logs[-3000:] for r in results]
    lines = {(r.tree / "output/failure").read_text().splitlines()[0] for r in results}
    assert len(lines) == 1, lines  # every host writes the job's one first failure
    line = lines.pop()
    assert line.startswith("torchrun.sh on algo-2 (once per host): exit code 1: "), line
    assert "worker rank 3 (local 1)" in line and "ValueError: planted failure on rank 3" in line
