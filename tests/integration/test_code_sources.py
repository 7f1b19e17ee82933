"""User code fetched from a real S3-compatible server (moto in server mode, started here:
AWS itself cannot exist in a test) and from a `code` input channel."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.integration.conftest import PROBE, bootstrap_argv, bootstrap_env, make_tree, run
from tests.ports import job_port


def sourcedir_tar(extra: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(PROBE, arcname="ddp_probe.py")
        for name, text in (extra or {}).items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def s3_endpoint():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    assert server, "moto[server] is a test dependency (requirements/dev.txt)"
    process = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def test_sourcedir_tar_gz_from_s3(tmp_path, s3_endpoint):
    """The host downloads the code once, before torchrun: one rank runs it (one torch)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        **{
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "region_name": "us-east-1",
        },
    )
    client.create_bucket(Bucket="jobs")
    client.put_object(
        Bucket="jobs",
        Key="job-1/source/sourcedir.tar.gz",
        Body=sourcedir_tar({"helper.txt": "from s3"}),
    )
    tree = make_tree(
        tmp_path,
        script=None,
        hyperparameters={
            "sagemaker_program": '"ddp_probe.py"',
            "sagemaker_submit_directory": '"s3://jobs/job-1/source/sourcedir.tar.gz"',
            "epochs": "1",
        },
    )
    env = bootstrap_env(tree, AWS_ENDPOINT_URL=s3_endpoint, PET_NPROC_PER_NODE="1", **AWS)
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tree.base / "code" / "helper.txt").read_text() == "from s3"
    summaries = tree.summaries("probe-rank-*.json")
    assert [s["world_size"] for s in summaries] == [1]
    assert summaries[0]["argv"] == ["--epochs", "1"]
    assert "testing" not in result.stderr  # the credentials are never printed


def test_missing_s3_object_is_one_clear_line(tmp_path, s3_endpoint):
    tree = make_tree(
        tmp_path,
        script=None,
        hyperparameters={
            "sagemaker_program": '"ddp_probe.py"',
            "sagemaker_submit_directory": '"s3://nobucket/missing.tar.gz"',
        },
    )
    env = bootstrap_env(tree, AWS_ENDPOINT_URL=s3_endpoint, **AWS)
    result = run(bootstrap_argv(), env, timeout=60)
    assert result.returncode == 2
    assert "s3://nobucket/missing.tar.gz: cannot download" in (tree.output / "failure").read_text()


def test_code_channel_with_sourcedir_and_requirements(tmp_path):
    tree = make_tree(tmp_path, script=None)
    channel = tree.base / "input" / "data" / "code"
    channel.mkdir(parents=True)
    (channel / "sourcedir.tar.gz").write_bytes(sourcedir_tar({"requirements.txt": "\n"}))
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="ddp_probe.py")
    result = run(bootstrap_argv(), env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "installing" in result.stderr and "requirements.txt" in result.stderr
    assert tree.summaries("probe-rank-*.json")[0]["world_size"] == 1


def self_launching_tar() -> bytes:
    """The tutorial's mp.spawn entry point and its worker (tests/scripts/self_launch)."""
    folder = PROBE.parent / "self_launch"
    return sourcedir_tar({n: (folder / n).read_text() for n in ("tutorial.py", "worker.py")})


@pytest.mark.parametrize("source", ["s3", "code channel"])
def test_an_entry_point_that_launches_is_found_once_its_code_is_here(tmp_path, source, request):
    """The launch is decided where the code is: after the fetch from S3 or the `code` channel,
    the tutorial's mp.spawn runs once on this host of 2 workers of ours (its own 2 workers),
    and the plan names the file and line that launches."""
    tree = make_tree(tmp_path, script=None)
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM="tutorial.py",
        PET_NPROC_PER_NODE="2",
        NPROC="2",
        USER_PORT=str(job_port()),
    )
    if source == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="jobs")
        client.put_object(Bucket="jobs", Key="src.tar.gz", Body=self_launching_tar())
        hps = {"sagemaker_submit_directory": '"s3://jobs/src.tar.gz"'}
        (tree.base / "input/config/hyperparameters.json").write_text(json.dumps(hps))
        env.update(AWS_ENDPOINT_URL=endpoint, **AWS)
    else:
        channel = tree.base / "input" / "data" / "code"
        channel.mkdir(parents=True)
        (channel / "sourcedir.tar.gz").write_bytes(self_launching_tar())
    result = run(bootstrap_argv(), env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the entry point launches its own workers" in result.stderr, result.stderr[-3000:]
    assert "tutorial.py line 11 runs torch.multiprocessing.spawn" in result.stderr
    ranks = sorted(s["rank"] for s in tree.summaries("ranks/rank-*.json"))
    assert ranks == [0, 1], ranks  # its own two workers, once: not a copy per worker of ours


def test_tar_member_escaping_the_code_dir_is_refused(tmp_path):
    tree = make_tree(tmp_path, script=None)
    channel = tree.base / "input" / "data" / "code"
    channel.mkdir(parents=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../escape.py")
        tar.addfile(info, io.BytesIO(b""))
    (channel / "sourcedir.tar.gz").write_bytes(buffer.getvalue())
    result = run(bootstrap_argv(), bootstrap_env(tree, SAGEMAKER_PROGRAM="x.py"), timeout=60)
    assert result.returncode == 2
    assert "member '../../escape.py' is refused" in (tree.output / "failure").read_text()
