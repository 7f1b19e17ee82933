"""What scripts/build/push.py decides without docker or AWS: which names are valid, which tags an
image gets, which of them ECR keeps immutable, which builds push, which digest was pushed; and
PushError, the one line every step of push reports a failure with.

Pure functions only (tests/delivery/test_push_policy.py checks them); push.py does the work.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any

ECR_HOST = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$"
)
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
REPOSITORY = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(?::[0-9]{1,5})?$")


class PushError(Exception):
    """One line for the user; exit status 2. `code`: the AWS error code, if any."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def tags_for(version: str, revision: str, moving_tag: str) -> list[str]:
    if not revision or revision == "unknown":
        raise PushError("no git revision to tag with (not a git checkout?): set REVISION")
    tags = []
    for name, tag in (("revision", revision), ("version", version), ("moving tag", moving_tag)):
        if not TAG.match(tag or ""):
            raise PushError(f"{name} {tag!r} is not a valid image tag")
        if tag not in tags:
            tags.append(tag)
    return tags


def tag_is_immutable(repository: Mapping[str, Any], tag: str) -> bool:
    mutability = repository.get("imageTagMutability", "MUTABLE")
    filters = [f["filter"] for f in repository.get("imageTagMutabilityExclusionFilters", [])]
    excluded = any(fnmatch.fnmatchcase(tag, pattern) for pattern in filters)
    if mutability == "IMMUTABLE":
        return True
    if mutability == "IMMUTABLE_WITH_EXCLUSION":
        return not excluded
    if mutability == "MUTABLE_WITH_EXCLUSION":
        return excluded
    return False


def creation_settings(moving_tag: str) -> dict[str, Any]:
    """Scan on push; every tag immutable except the moving one."""
    return {
        "imageScanningConfiguration": {"scanOnPush": True},
        "imageTagMutability": "IMMUTABLE_WITH_EXCLUSION",
        "imageTagMutabilityExclusionFilters": [{"filterType": "WILDCARD", "filter": moving_tag}],
    }


def pushed_digest(target: str, after: Iterable[str], before: Iterable[str] = ()) -> str:
    """The digest docker recorded for the repository `target` (RepoDigests `after` the push);
    where it holds more than one for it, the one the push added to those `before`."""
    found = [entry for entry in after if entry.rpartition("@")[0] == target]
    if len(found) > 1:
        found = sorted(set(found) - set(before))
    if len(found) != 1:
        raise PushError(f"cannot tell the digest docker pushed to {target} from {found}")
    return found[0].rpartition("@")[2]


def should_push(environ: Mapping[str, str]) -> tuple[bool, str]:
    """CodeBuild: push from the release branch (RELEASE_BRANCH, default main) or a tag.

    Webhook builds name their ref in CODEBUILD_WEBHOOK_TRIGGER (branch/NAME, tag/NAME, pr/N)
    and CODEBUILD_WEBHOOK_HEAD_REF (refs/heads/NAME, refs/tags/NAME); other builds in
    CODEBUILD_SOURCE_VERSION (a branch, refs/..., pr/N, or a commit that names no ref).
    """
    release = environ.get("RELEASE_BRANCH") or "main"
    trigger = environ.get("CODEBUILD_WEBHOOK_TRIGGER", "")
    ref = environ.get("CODEBUILD_WEBHOOK_HEAD_REF") or environ.get("CODEBUILD_SOURCE_VERSION", "")
    if trigger.startswith("pr/") or ref.startswith("pr/"):
        return False, f"pull request build ({trigger or ref}): not pushed"
    if trigger.startswith("tag/") or ref.startswith("refs/tags/"):
        return True, f"tag build ({trigger or ref}): pushed"
    if trigger.startswith("branch/"):
        branch = trigger.removeprefix("branch/")
    else:
        branch = ref.removeprefix("refs/heads/")
    if branch == release:
        return True, f"branch {release}: pushed"
    return False, f"ref {ref or '(none)'!r} is neither branch {release} nor a tag: not pushed"
