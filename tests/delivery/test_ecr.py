"""The ECR path of scripts/build/push.py against moto's server mode as the AWS API.

AWS is the only thing emulated: moto answers the ECR API (CreateRepository,
GetAuthorizationToken, ...), but its ECR cannot take a docker push, so the docker login and
push go to the real local registry (ECR_REGISTRY_OVERRIDE), whose only account is the
user:password inside the token moto hands out: the push works only if the script decoded the
token and logged docker in with it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.delivery.conftest import (
    REGION,
    STANDIN,
    clean_environment,
    git_revision,
    project_version,
    push_script,
)

REPOSITORY = "container-entry"
DLC_BASE = f"123456789012.dkr.ecr.{REGION}.amazonaws.com/huggingface-pytorch-training:2.9.0-gpu"


@pytest.fixture(scope="module")
def revision() -> str:
    return git_revision()


@pytest.fixture(scope="module")
def ecr_env(aws_api, registry, tmp_path_factory) -> dict[str, str]:
    aws_api.reset()
    config = tmp_path_factory.mktemp("docker-config-ecr")  # empty: no login beforehand
    return clean_environment(
        **aws_api.environment(), ECR_REGISTRY_OVERRIDE=registry.host, DOCKER_CONFIG=str(config)
    )


def ecr_push(image: str, env: dict[str, str], revision: str) -> subprocess.CompletedProcess:
    return push_script(
        "push",
        "--image",
        image,
        "--repository",
        REPOSITORY,
        "--version",
        project_version(),
        "--revision",
        revision,
        env=env,
    )


def pushed_digest(result: subprocess.CompletedProcess, host: str) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # stdout holds only the image URI
    match = re.fullmatch(rf"{re.escape(host)}/{REPOSITORY}@(sha256:[0-9a-f]{{64}})", lines[0])
    assert match, lines[0]
    return match[1]


@pytest.fixture(scope="module")
def first_push(image, ecr_env, registry, revision) -> tuple[subprocess.CompletedProcess, str]:
    assert registry.anonymous_status() == 401  # the registry refuses anyone not logged in
    result = ecr_push(image, ecr_env, revision)
    return result, pushed_digest(result, registry.host)


def test_first_push_creates_the_repository_logs_in_and_pushes(
    first_push, aws_api, registry, ecr_env, revision
):
    result, digest = first_push
    (repository,) = aws_api.ecr().describe_repositories()["repositories"]
    assert repository["repositoryName"] == REPOSITORY
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}
    # Version and revision tags immutable; only the moving tag may move.
    assert repository["imageTagMutability"] == "IMMUTABLE_WITH_EXCLUSION"
    assert repository["imageTagMutabilityExclusionFilters"] == [
        {"filterType": "WILDCARD", "filter": "latest"}
    ]
    assert f"created ECR repository {REPOSITORY}" in result.stderr
    # The script logged docker in (the config started empty).
    config = json.loads((Path(ecr_env["DOCKER_CONFIG"]) / "config.json").read_text())
    assert registry.host in config["auths"]
    for tag in (revision, project_version(), "latest"):
        assert registry.manifest_digest(REPOSITORY, tag) == digest, tag


def test_second_run_is_idempotent(first_push, image, aws_api, registry, ecr_env, revision):
    _, digest = first_push
    before = aws_api.ecr().describe_repositories()["repositories"]
    again = ecr_push(image, ecr_env, revision)
    assert pushed_digest(again, registry.host) == digest
    assert f"ECR repository {REPOSITORY} exists" in again.stderr
    assert "created" not in again.stderr
    assert aws_api.ecr().describe_repositories()["repositories"] == before


def test_an_immutable_tag_ecr_already_holds_is_kept(first_push, image, aws_api, registry, ecr_env):
    _, digest = first_push
    version = project_version()
    # ECR already holds the version tag (an earlier release): put there through the API.
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": 2,
            "digest": "sha256:" + "1" * 64,
        },
        "layers": [],
    }
    held = aws_api.ecr().put_image(
        repositoryName=REPOSITORY, imageManifest=json.dumps(manifest), imageTag=version
    )["image"]["imageId"]["imageDigest"]
    result = ecr_push(image, ecr_env, "next-commit")
    assert pushed_digest(result, registry.host) == digest
    assert f"tag {version} already holds {held} and is immutable: kept" in result.stderr
    assert f"pushing {registry.host}/{REPOSITORY}:{version}" not in result.stderr
    assert registry.manifest_digest(REPOSITORY, "next-commit") == digest


def no_credentials_env(tmp_path, **extra: str) -> dict[str, str]:
    """No AWS credentials anywhere boto3 looks (env, files, instance metadata)."""
    return clean_environment(
        HOME=str(tmp_path),
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        DOCKER_CONFIG=str(tmp_path),
        **extra,
    )


def test_missing_credentials_give_one_clear_line(image, tmp_path):
    env = no_credentials_env(tmp_path, AWS_REGION=REGION)
    pushed = push_script(
        "push", "--image", image, "--version", "1", "--revision", "abc1234", env=env, timeout=60
    )
    base = push_script("login-base", "--base-image", DLC_BASE, env=env, timeout=60)
    for result, names in ((pushed, f"ECR repository {REPOSITORY}"), (base, DLC_BASE)):
        assert result.returncode == 2
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("push: error: ")
        assert names in lines[0]
        assert "no AWS credentials found (set AWS_PROFILE, or AWS_ACCESS_KEY_ID" in lines[0]

    env = no_credentials_env(tmp_path)  # no region either
    no_region = push_script(
        "push", "--image", image, "--version", "1", "--revision", "abc1234", env=env, timeout=60
    )
    assert no_region.returncode == 2
    assert no_region.stderr.strip().splitlines() == [
        "push: error: no AWS region for the ECR API (set AWS_REGION)"
    ]


def test_login_base_logs_in_to_the_base_registry_only_when_needed(
    first_push, aws_api, registry, tmp_path
):
    # A base already on this machine needs no registry, and no credentials.
    local = push_script("login-base", "--base-image", STANDIN, env=no_credentials_env(tmp_path))
    assert local.returncode == 0 and "on this machine" in local.stderr

    # A DLC base that is not here: docker logs in to its ECR registry (here the local one).
    config = tmp_path / "docker-config"
    config.mkdir()
    env = clean_environment(
        **aws_api.environment(), ECR_REGISTRY_OVERRIDE=registry.host, DOCKER_CONFIG=str(config)
    )
    reference = f"{registry.host}/{REPOSITORY}:latest"
    pull = ["docker", "pull", reference]
    refused = subprocess.run(pull, env=env, capture_output=True, text=True, check=False)
    assert refused.returncode != 0  # not logged in yet
    result = push_script("login-base", "--base-image", DLC_BASE, env=env)
    assert result.returncode == 0, result.stderr
    pulled = subprocess.run(pull, env=env, capture_output=True, text=True, check=False)
    assert pulled.returncode == 0, pulled.stderr
