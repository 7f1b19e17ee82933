"""scripts/push.py decisions that need no docker or AWS: which builds push, which tags move."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.delivery.conftest import REPO

# scripts/ is not a package: load scripts/push.py by path.
_spec = importlib.util.spec_from_file_location("push_script", REPO / "scripts" / "push.py")
assert _spec and _spec.loader
push = importlib.util.module_from_spec(_spec)
sys.modules["push_script"] = push
_spec.loader.exec_module(push)

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
    decision, reason = push.should_push(environ)
    assert decision is pushed, reason


def test_tags_are_revision_version_then_moving():
    assert push.tags_for("0.1.0", "abc1234", "latest") == ["abc1234", "0.1.0", "latest"]
    assert push.tags_for("same", "same", "latest") == ["same", "latest"]
    with pytest.raises(push.PushError, match="no git revision"):
        push.tags_for("0.1.0", "unknown", "latest")
    with pytest.raises(push.PushError, match="not a valid image tag"):
        push.tags_for("0.1.0; rm -rf /", "abc1234", "latest")


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
    assert {tag: push.tag_is_immutable(repository, tag) for tag in immutable} == immutable


def test_new_repositories_scan_on_push_and_keep_all_but_the_moving_tag():
    settings = push.creation_settings("latest")
    assert settings["imageScanningConfiguration"] == {"scanOnPush": True}
    repository = {**settings}
    assert push.tag_is_immutable(repository, "0.1.0")
    assert not push.tag_is_immutable(repository, "latest")


def test_registry_override_must_be_a_host():
    assert push.override_host("1.dkr.ecr.x.amazonaws.com", {}) == "1.dkr.ecr.x.amazonaws.com"
    assert push.override_host("h", {"ECR_REGISTRY_OVERRIDE": "127.0.0.1:5000"}) == "127.0.0.1:5000"
    with pytest.raises(push.PushError):
        push.override_host("h", {"ECR_REGISTRY_OVERRIDE": "http://x/;"})
