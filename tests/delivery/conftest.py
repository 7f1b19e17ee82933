"""Delivery fixtures: a real registry server, a local AWS API, the image built on the stand-in.

- `registry`: Debian's docker-registry (the distribution project's registry server) on a free
  loopback port, with htpasswd auth whose only user is the one the ECR API's token names, so a
  push succeeds only after a login with that token.
- `aws_api`: moto's server mode (.venv/bin/moto_server) as the AWS API endpoint. AWS is the
  one thing emulated in these tests; docker, the registry, make and bash are real.
- `image`: `make build` of docker/Dockerfile on the offline DLC stand-in.
In CI (CI set) a missing engine or tool is a failure, never a skip.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import LEAN_BASE, LEAN_IMAGE, unavailable
from tests.ports import job_port

__all__ = ["LEAN_BASE", "LEAN_IMAGE", "unavailable"]
STANDIN = LEAN_BASE  # the base the delivery tests build on (tests/delivery/lean-base.Dockerfile)


@pytest.fixture(scope="session")
def image(lean_image) -> str:
    """Delivery pushes the image built on the lean base: pushing the 8 GB DLC stand-in would
    cost minutes and test nothing more about delivery."""
    return lean_image


REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
REGION = "us-east-1"
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)


def wait_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:  # any HTTP answer (401 included) means it serves
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout} s: {log.read_text()[-2000:]}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without any AWS_* or CI build refs, plus `extra`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWS_", "CODEBUILD_", "ECR_REGISTRY_OVERRIDE", "DOCKER_CONFIG"))
    }
    env.update(extra)
    return env


# --------------------------------------------------------------------------- AWS API (moto)


@dataclass
class AwsApi:
    endpoint: str

    def environment(self) -> dict[str, str]:
        """Credentials moto accepts (fake), region, endpoint: what a configured user has."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def ecr(self):
        import boto3

        return boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
        ).client("ecr", endpoint_url=self.endpoint)

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).close()


@pytest.fixture(scope="session")
def aws_api(tmp_path_factory) -> Iterator[AwsApi]:
    server = VENV_BIN / "moto_server"
    if not server.exists():
        unavailable(f"{server} missing: make venv")
    port = job_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{endpoint}/moto-api/", process, log)
        yield AwsApi(endpoint)
    finally:
        stop(process)


# --------------------------------------------------------------------------- registry


@dataclass
class Registry:
    host: str
    username: str
    password: str

    def _request(self, path: str, method: str = "GET") -> tuple[dict[str, str], bytes]:
        credentials = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        request = urllib.request.Request(
            f"http://{self.host}{path}",
            method=method,
            headers={"Authorization": f"Basic {credentials}", "Accept": MANIFEST_TYPES},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(response.headers), response.read()

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest the registry serves for repository:reference (None: no such tag)."""
        try:
            headers, _ = self._request(f"/v2/{repository}/manifests/{reference}", "HEAD")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise
        return headers["Docker-Content-Digest"]

    def config_digest(self, repository: str, reference: str) -> str:
        _, body = self._request(f"/v2/{repository}/manifests/{reference}")
        return json.loads(body)["config"]["digest"]

    def anonymous_status(self) -> int:
        try:
            urllib.request.urlopen(f"http://{self.host}/v2/", timeout=10).close()
        except urllib.error.HTTPError as error:
            return error.code
        return 200


@pytest.fixture(scope="session")
def registry(aws_api, tmp_path_factory) -> Iterator[Registry]:
    """A registry whose one account is the user:password inside the ECR API's token."""
    binary = shutil.which("docker-registry")
    if not binary:
        unavailable("docker-registry (Debian package) missing: scripts/build/ensure-docker.sh")
    import bcrypt

    token = aws_api.ecr().get_authorization_token()["authorizationData"][0]
    username, _, password = base64.b64decode(token["authorizationToken"]).decode().partition(":")
    root = tmp_path_factory.mktemp("registry")
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()
    (root / "htpasswd").write_text(f"{username}:{hashed}\n")
    port = job_port()
    (root / "config.yml").write_text(
        "\n".join(
            [
                "version: 0.1",
                "log: {level: warn}",
                "storage:",
                f"  filesystem: {{rootdirectory: {root / 'data'}}}",
                "  delete: {enabled: true}",
                f"http: {{addr: '127.0.0.1:{port}'}}",
                f"auth: {{htpasswd: {{realm: delivery-tests, path: {root / 'htpasswd'}}}}}",
                "",
            ]
        )
    )
    log = root / "registry.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [binary, "serve", str(root / "config.yml")], stdout=out, stderr=out
        )
    host = f"127.0.0.1:{port}"
    try:
        wait_http(f"http://{host}/v2/", process, log)
        yield Registry(host, username, password)
    finally:
        stop(process)
        untag_references(host)


def untag_references(host: str) -> None:
    """Remove the local tags this session's pushes made (the image itself stays)."""
    listed = subprocess.run(
        ["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    tags = [line for line in listed.stdout.splitlines() if line.startswith(f"{host}/")]
    if tags:
        subprocess.run(["docker", "rmi", *tags], capture_output=True, check=False)


@pytest.fixture
def docker_config(tmp_path) -> Path:
    """An empty docker client config: no registry login carried in from elsewhere."""
    directory = tmp_path / "docker-config"
    directory.mkdir()
    return directory


def image_id(reference: str) -> str:
    return subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", reference],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def git_revision(length: int | None = 7) -> str:
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    return sha[:length] if length else sha


def project_version() -> str:
    """The version the Makefile tags with (pyproject.toml's)."""
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def make(
    *args: str, env: Mapping[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"make {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def push_script(
    *args: str, env: Mapping[str, str], timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build" / "push.py"), *args],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
