"""scripts/build/push.py decisions that need no docker or AWS (most in
scripts/build/push_policy.py): which builds push, which tags move, which repository is used, which
digest is printed."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from scripts.build import push, push_policy

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("environ", "pushed"),
    [
        (
            {
                "CODEBUILD_WEBHOOK_TRIGGER": "branch/main",
                "CODEBUILD_WEBHOOK_HEAD_REF": "refs/heads/main",
            },
            True,
        ),
        (
            {
                "CODEBUILD_WEBHOOK_TRIGGER": "tag/v0.2.0",
                "CODEBUILD_WEBHOOK_HEAD_REF": "refs/tags/v0.2.0",
            },
            True,
        ),
        (
            {
                "CODEBUILD_WEBHOOK_TRIGGER": "branch/feature",
                "CODEBUILD_WEBHOOK_HEAD_REF": "refs/heads/feature",
            },
            False,
        ),
        # A pull request into main names main only as its base: not pushed.
        (
            {
                "CODEBUILD_WEBHOOK_TRIGGER": "pr/7",
                "CODEBUILD_WEBHOOK_HEAD_REF": "refs/heads/main",
                "CODEBUILD_WEBHOOK_BASE_REF": "refs/heads/main",
            },
            False,
        ),
        # Builds started by hand or by a pipeline: CODEBUILD_SOURCE_VERSION only.
        ({"CODEBUILD_SOURCE_VERSION": "main"}, True),
        ({"CODEBUILD_SOURCE_VERSION": "refs/heads/main"}, True),
        ({"CODEBUILD_SOURCE_VERSION": "refs/tags/v1.0.0"}, True),
        ({"CODEBUILD_SOURCE_VERSION": "pr/12"}, False),
        ({"CODEBUILD_SOURCE_VERSION": SHA}, False),  # a bare commit names no branch
        ({}, False),
        ({"CODEBUILD_SOURCE_VERSION": "release", "RELEASE_BRANCH": "release"}, True),
        ({"CODEBUILD_SOURCE_VERSION": "main", "RELEASE_BRANCH": "release"}, False),
    ],
)
def test_push_only_from_the_release_branch_or_a_tag(environ, pushed):
    decision, reason = push_policy.should_push(environ)
    assert decision is pushed, reason


def test_tags_are_revision_version_then_moving():
    assert push_policy.tags_for("0.1.0", "abc1234", "latest") == ["abc1234", "0.1.0", "latest"]
    assert push_policy.tags_for("same", "same", "latest") == ["same", "latest"]
    with pytest.raises(push_policy.PushError, match="no git revision"):
        push_policy.tags_for("0.1.0", "unknown", "latest")
    with pytest.raises(push_policy.PushError, match="not a valid image tag"):
        push_policy.tags_for("0.1.0; rm -rf /", "abc1234", "latest")


@pytest.mark.parametrize(
    ("mutability", "filters", "immutable"),
    [
        ("IMMUTABLE", [], {"0.1.0": True, "latest": True}),
        ("MUTABLE", [], {"0.1.0": False, "latest": False}),
        ("IMMUTABLE_WITH_EXCLUSION", ["latest"], {"0.1.0": True, "latest": False}),
        ("IMMUTABLE_WITH_EXCLUSION", ["dev-*"], {"dev-3": False, "latest": True}),
        ("MUTABLE_WITH_EXCLUSION", ["0.*"], {"0.1.0": True, "latest": False}),
    ],
)
def test_which_tags_ecr_keeps(mutability, filters, immutable):
    repository = {
        "imageTagMutability": mutability,
        "imageTagMutabilityExclusionFilters": [
            {"filterType": "WILDCARD", "filter": f} for f in filters
        ],
    }
    assert {tag: push_policy.tag_is_immutable(repository, tag) for tag in immutable} == immutable


def test_new_repositories_scan_on_push_and_keep_all_but_the_moving_tag():
    settings = push_policy.creation_settings("latest")
    assert settings["imageScanningConfiguration"] == {"scanOnPush": True}
    repository = {**settings}
    assert push_policy.tag_is_immutable(repository, "0.1.0")
    assert not push_policy.tag_is_immutable(repository, "latest")


def test_registry_override_must_be_a_host():
    assert push.override_host("1.dkr.ecr.x.amazonaws.com", {}) == "1.dkr.ecr.x.amazonaws.com"
    assert push.override_host("h", {"ECR_REGISTRY_OVERRIDE": "127.0.0.1:5000"}) == "127.0.0.1:5000"
    with pytest.raises(push.PushError):
        push.override_host("h", {"ECR_REGISTRY_OVERRIDE": "http://x/;"})


def test_push_takes_keywords_only():
    with pytest.raises(TypeError):
        push.push("image", "repository", "", "0.1.0", "abc1234", "latest", {})  # type: ignore[misc]


DIGEST_A, DIGEST_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_the_digest_is_the_one_docker_recorded_for_the_target_repository():
    target = "127.0.0.1:5000/generic/container-entry"
    after = [f"other.example/container-entry@{DIGEST_B}", f"{target}@{DIGEST_A}"]
    assert push_policy.pushed_digest(target, after) == DIGEST_A
    # A repository whose name merely starts with the target's is another repository.
    assert push_policy.pushed_digest(target, [f"{target}-x@{DIGEST_B}", *after]) == DIGEST_A
    # Two digests for the target (an older manifest of the same image): the one this push added.
    both = [f"{target}@{DIGEST_B}", f"{target}@{DIGEST_A}"]
    assert push_policy.pushed_digest(target, both, before=[f"{target}@{DIGEST_B}"]) == DIGEST_A
    with pytest.raises(push_policy.PushError, match="cannot tell the digest"):
        push_policy.pushed_digest(target, both, before=[])
    with pytest.raises(push_policy.PushError, match="cannot tell the digest"):
        push_policy.pushed_digest(target, [f"other.example/container-entry@{DIGEST_B}"])


class FakeEcr:
    """describe_repositories/create_repository answering from a dict, as ECR would; `racing`:
    another run creates the repository between our describe and our create."""

    def __init__(self, repositories: dict[str, dict[str, Any]], racing: bool = False) -> None:
        self.repositories = repositories
        self.racing = racing
        self.created: list[dict[str, Any]] = []

    @staticmethod
    def _error(code: str, operation: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code}}, operation)

    def describe_repositories(self, repositoryNames: list[str]) -> dict[str, Any]:
        (name,) = repositoryNames
        if name not in self.repositories:
            raise self._error("RepositoryNotFoundException", "DescribeRepositories")
        return {"repositories": [self.repositories[name]]}

    def create_repository(self, repositoryName: str, **settings: Any) -> dict[str, Any]:
        if self.racing:
            self.repositories[repositoryName] = repository(repositoryName, "MUTABLE")
        if repositoryName in self.repositories:
            raise self._error("RepositoryAlreadyExistsException", "CreateRepository")
        self.created.append(settings)
        self.repositories[repositoryName] = {
            **repository(repositoryName, settings["imageTagMutability"]),
            **settings,
        }
        return {"repository": self.repositories[repositoryName]}


def repository(name: str, mutability: str) -> dict[str, Any]:
    uri = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{name}"
    return {"repositoryName": name, "repositoryUri": uri, "imageTagMutability": mutability}


def test_a_missing_repository_is_created_scanned_and_immutable(capsys):
    ecr = FakeEcr({})
    created = push.ensure_repository(ecr, "container-entry", "latest")
    assert ecr.created == [push_policy.creation_settings("latest")]
    assert created["imageTagMutability"] == "IMMUTABLE_WITH_EXCLUSION"
    assert "created ECR repository container-entry" in capsys.readouterr().err


def test_an_existing_repository_is_left_as_it_is(capsys):
    ecr = FakeEcr({"container-entry": repository("container-entry", "MUTABLE")})
    found = push.ensure_repository(ecr, "container-entry", "latest")
    assert ecr.created == []
    assert found["imageTagMutability"] == "MUTABLE"
    assert "left as it is" in capsys.readouterr().err


def test_a_repository_another_run_creates_meanwhile_is_used(capsys):
    ecr = FakeEcr({}, racing=True)
    found = push.ensure_repository(ecr, "container-entry", "latest")
    assert ecr.created == []
    assert found["repositoryName"] == "container-entry"
    assert "left as it is" in capsys.readouterr().err


def test_other_ecr_errors_name_what_was_being_done():
    class Denied(FakeEcr):
        def describe_repositories(self, repositoryNames: list[str]) -> dict[str, Any]:
            raise self._error("AccessDeniedException", "DescribeRepositories")

    with pytest.raises(push.PushError, match=r"^ECR repository x: AccessDeniedException"):
        push.ensure_repository(Denied({}), "x", "latest")
