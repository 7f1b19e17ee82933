"""buildspec.yml, run phase by phase by tests/delivery/codebuild.py in a real bash, end to end.

The phases call the real Makefile targets (lint, unit tests, build, push) with a real docker
engine and the real local registry; the AWS API is moto's server mode (the one thing
emulated), with ECR_REGISTRY_OVERRIDE sending docker's login and push to the local registry.
"""

from __future__ import annotations

import re

from tests.delivery.codebuild import run_buildspec
from tests.delivery.conftest import REGION, REPO, STANDIN, clean_environment, git_revision

REPOSITORY = "container-entry"  # buildspec.yml's default


def codebuild(aws_api, registry, docker_config, refs: dict[str, str], **variables: str):
    """buildspec.yml end to end; `variables`: more of the CodeBuild project's."""
    aws_api.reset()
    sha = git_revision(None)
    machine = clean_environment(
        DOCKER_CONFIG=str(docker_config),  # empty: the build logs in by itself
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        CODEBUILD_RESOLVED_SOURCE_VERSION=sha,
        CODEBUILD_SOURCE_VERSION=sha,
        **refs,
    )
    project = {  # the CodeBuild project's environment variables
        **aws_api.environment(),
        "ECR_REGISTRY_OVERRIDE": registry.host,
        "BASE_IMAGE": STANDIN,
        "IMAGE": "container-entry-delivery:codebuild",
        **variables,
    }
    result = run_buildspec(REPO / "buildspec.yml", REPO, machine, project, timeout=900)
    return result, sha


def test_main_branch_lints_tests_builds_pushes_and_exports_the_uri(
    image, aws_api, registry, docker_config
):
    refs = {
        "CODEBUILD_WEBHOOK_TRIGGER": "branch/main",
        "CODEBUILD_WEBHOOK_HEAD_REF": "refs/heads/main",
        "CODEBUILD_WEBHOOK_EVENT": "PUSH",
    }
    result, sha = codebuild(aws_api, registry, docker_config, refs)
    assert result.phases == dict.fromkeys(
        ("install", "pre_build", "build", "post_build"), "SUCCEEDED"
    ), result.log[-6000:]
    for command in ("make lint", "make unit", "make login-base build", "make push"):
        assert command in result.log
    uri = result.exported["IMAGE_URI"]
    match = re.fullmatch(rf"{re.escape(registry.host)}/{REPOSITORY}@(sha256:[0-9a-f]{{64}})", uri)
    assert match, result.exported
    digest = match[1]
    assert result.exported["IMAGE_DIGEST"] == digest
    # Tagged with the commit CodeBuild resolved, and the moving tag.
    assert registry.manifest_digest(REPOSITORY, sha[:7]) == digest
    assert registry.manifest_digest(REPOSITORY, "latest") == digest
    (repository,) = aws_api.ecr().describe_repositories()["repositories"]
    assert repository["repositoryName"] == REPOSITORY
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}


def test_pull_request_into_main_is_built_and_tested_but_not_pushed(
    image, aws_api, registry, docker_config
):
    refs = {
        "CODEBUILD_WEBHOOK_TRIGGER": "pr/7",
        "CODEBUILD_WEBHOOK_HEAD_REF": "refs/heads/feature-x",
        "CODEBUILD_WEBHOOK_BASE_REF": "refs/heads/main",
        "CODEBUILD_WEBHOOK_EVENT": "PULL_REQUEST_UPDATED",
    }
    # the whole unit suite runs in the main branch's build above; here a part of it, through
    # the same `make unit` (a second full run beside the suite only doubled its load)
    result, _ = codebuild(aws_api, registry, docker_config, refs, PYTEST_ARGS="-k plan")
    assert result.phases == dict.fromkeys(
        ("install", "pre_build", "build", "post_build"), "SUCCEEDED"
    ), result.log[-6000:]
    for command in ("make lint", "make unit", "make login-base build"):
        assert command in result.log
    assert re.search(r" [1-9]\d* passed in ", result.log), result.log[-6000:]  # the part ran
    assert "pull request build (pr/7): not pushed" in result.log
    assert result.exported == {"IMAGE_URI": "", "IMAGE_DIGEST": ""}
    assert aws_api.ecr().describe_repositories()["repositories"] == []  # ECR never touched
