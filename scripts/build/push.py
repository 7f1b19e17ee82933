#!/usr/bin/env python3
"""Tag the built image and push it to Amazon ECR or any other registry; log in for the base.

    python -m scripts.build.push push --image container-entry:0.1.0 --version 0.1.0 \
        --revision 39844fc [--repository container-entry] [--registry HOST[:PORT]]
        [--moving-tag latest] [--uri-file build/image-uri.txt]
    python -m scripts.build.push login-base --base-image <BASE_IMAGE>
    python -m scripts.build.push should-push   (CodeBuild: exit 0 when this build's ref is pushed)

It imports only its sibling push_policy.py (the decisions; this file does the work), so
`python scripts/build/push.py ...` works as well (the buildspec runs it so).

`make push` and `make login-base` call it (see `make help`); the buildspec calls `should-push`.

push, ECR (no --registry): the repository is created when missing (scan on push; tags
immutable except the moving tag), docker logs in with a token from the ECR API, and the image
is pushed as <revision>, <version> and the moving tag. An immutable tag that ECR already holds
is kept, not pushed again (a version is published once). The last line printed (stdout) is
<repository>@sha256:<digest>, the value to paste as `image_uri`: the digest docker recorded
for that repository when it pushed (the image's RepoDigests).

push, any other registry (--registry): the same tags and output; no ECR calls, so log in
first (`docker login HOST`) if the registry wants credentials.

login-base: a base image that is not on this machine and lives in ECR (the DLCs do) needs a
docker login to its account's registry before `docker build` can pull it.

Environment:
  AWS_REGION / AWS_PROFILE / AWS_ACCESS_KEY_ID ...   the usual AWS settings (boto3)
  AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_ECR)         the ECR API endpoint (tests: moto server)
  ECR_REGISTRY_OVERRIDE=HOST[:PORT]                  send docker's login/push for ECR to this
      registry instead of <account>.dkr.ecr.<region>.amazonaws.com (the ECR API cannot take
      a docker push when it is emulated; tests point this at a local registry server)

Values reach docker and AWS as argv elements or API parameters, never through a shell;
the registry password goes to `docker login` on stdin.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING or __package__:  # python -m scripts.build.push (make push), or imported
    from scripts.build import push_policy as policy
    from scripts.build.push_policy import PushError
else:  # python scripts/build/push.py (the buildspec): the sibling file
    import push_policy as policy
    from push_policy import PushError

OVERRIDE_VARIABLE = "ECR_REGISTRY_OVERRIDE"
CREDENTIALS_HINT = (
    "set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run with an "
    "instance/task role"
)


def note(message: str) -> None:
    print(f"push: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- docker


def docker(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["docker", *args], input=stdin, capture_output=True, text=True, check=False
        )
    except FileNotFoundError as error:
        raise PushError(
            "the docker CLI is not installed (scripts/build/ensure-docker.sh)"
        ) from error


def image_exists(image: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", image).returncode == 0


def docker_login(host: str, username: str, password: str) -> None:
    result = docker("login", "--username", username, "--password-stdin", host, stdin=password)
    if result.returncode != 0:
        raise PushError(f"docker login {host} failed: {last_line(result.stderr)}")
    note(f"docker logged in to {host}")


def docker_push(reference: str) -> None:
    """Push one tag, docker's progress to stderr."""
    process = subprocess.Popen(
        ["docker", "push", reference],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        print(f"    {lines[-1]}", file=sys.stderr, flush=True)
    if process.wait() != 0:
        output = "\n".join(lines)
        hint = ""
        if re.search(r"unauthorized|authentication required|no basic auth", output, re.I):
            hint = f" (log in first: docker login {reference.split('/', 1)[0]})"
        raise PushError(f"docker push {reference} failed: {last_line(output)}{hint}")


def repo_digests(image: str) -> list[str]:
    """The image's RepoDigests: `repository@sha256:...` for each repository docker has pushed
    it to or pulled it from."""
    result = docker("image", "inspect", "--format", "{{json .RepoDigests}}", image)
    if result.returncode != 0:
        raise PushError(f"docker image inspect {image} failed: {last_line(result.stderr)}")
    return json.loads(result.stdout) or []


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


# --------------------------------------------------------------------------- AWS


def aws(what: str, call: Callable[..., Any], **kwargs: Any) -> Any:
    """Run one AWS API call; every failure becomes one line naming what was being done."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
    )

    try:
        return call(**kwargs)
    except (NoCredentialsError, PartialCredentialsError) as error:
        raise PushError(f"{what}: no AWS credentials found ({CREDENTIALS_HINT})") from error
    except NoRegionError as error:
        raise PushError(f"{what}: no AWS region (set AWS_REGION)") from error
    except ClientError as error:
        info = error.response.get("Error", {})
        code = str(info.get("Code", ""))
        raise PushError(f"{what}: {code}: {info.get('Message')}", code) from error
    except BotoCoreError as error:
        raise PushError(f"{what}: {error}") from error


def aws_unless(absent: str, what: str, call: Callable[..., Any], **kwargs: Any) -> Any:
    """`aws()`, but None when the call fails with the error code `absent`."""
    try:
        return aws(what, call, **kwargs)
    except PushError as error:
        if error.code == absent:
            return None
        raise


def ecr_client(region: str | None = None) -> Any:
    """ECR client for `region`, else AWS_REGION (as the AWS CLI), else boto3's own lookup."""
    import boto3
    from botocore.exceptions import NoRegionError

    region = region or os.environ.get("AWS_REGION") or None
    try:
        return boto3.session.Session().client("ecr", region_name=region)
    except NoRegionError as error:
        raise PushError("no AWS region for the ECR API (set AWS_REGION)") from error


def ecr_login(ecr: Any, host: str, what: str) -> None:
    """docker login to `host` with a token from GetAuthorizationToken (valid 12 hours)."""
    data = aws(what, ecr.get_authorization_token)["authorizationData"][0]
    username, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    if not password:
        raise PushError(f"{what}: the ECR authorization token is not user:password")
    docker_login(host, username, password)


def override_host(host: str, environ: Mapping[str, str]) -> str:
    override = environ.get(OVERRIDE_VARIABLE, "").strip()
    if not override:
        return host
    if not policy.REGISTRY.match(override):
        raise PushError(f"{OVERRIDE_VARIABLE}={override!r} is not HOST or HOST:PORT")
    note(f"{OVERRIDE_VARIABLE}: docker talks to {override} instead of {host}")
    return override


def find_repository(ecr: Any, name: str) -> dict[str, Any] | None:
    found = aws_unless(
        "RepositoryNotFoundException",
        f"ECR repository {name}",
        ecr.describe_repositories,
        repositoryNames=[name],
    )
    return found["repositories"][0] if found else None


def create_repository(ecr: Any, name: str, moving_tag: str) -> dict[str, Any] | None:
    """The new repository (push_policy.creation_settings); None if it exists (a concurrent run)."""
    created = aws_unless(
        "RepositoryAlreadyExistsException",
        f"creating ECR repository {name}",
        ecr.create_repository,
        repositoryName=name,
        **policy.creation_settings(moving_tag),
    )
    return created["repository"] if created else None


def ensure_repository(ecr: Any, name: str, moving_tag: str) -> dict[str, Any]:
    """The ECR repository `name`, created when missing; an existing one is left as it is."""
    what = f"ECR repository {name}"
    existing = find_repository(ecr, name)
    created = None if existing else create_repository(ecr, name, moving_tag)
    if created:
        note(
            f"created {what}: scan on push, tags immutable except {moving_tag!r} "
            f"({created['repositoryUri']})"
        )
        return created
    repository = existing or find_repository(ecr, name)  # a concurrent run created it
    if repository is None:
        raise PushError(f"{what}: neither found nor created (deleted meanwhile?)")
    scan = repository.get("imageScanningConfiguration", {}).get("scanOnPush")
    note(
        f"{what} exists ({repository['repositoryUri']}; scan on push: {scan}, "
        f"tags: {repository.get('imageTagMutability')}); left as it is"
    )
    return repository


def ecr_tag_digest(ecr: Any, repository: Mapping[str, Any], tag: str) -> str | None:
    images = aws_unless(
        "ImageNotFoundException",
        f"looking up tag {tag} in ECR repository {repository['repositoryName']}",
        ecr.describe_images,
        registryId=repository["registryId"],
        repositoryName=repository["repositoryName"],
        imageIds=[{"imageTag": tag}],
    )
    details = images.get("imageDetails", []) if images else []
    return details[0]["imageDigest"] if details else None


# --------------------------------------------------------------------------- commands


def push(
    *,
    image: str,
    repository: str,
    registry: str,
    version: str,
    revision: str,
    moving_tag: str,
    environ: Mapping[str, str],
) -> str:
    """Tag and push; return <repository>@sha256:<digest>."""
    tags = policy.tags_for(version, revision, moving_tag)
    if not policy.REPOSITORY.match(repository):
        raise PushError(f"repository {repository!r} is not a valid repository name")
    if registry and not policy.REGISTRY.match(registry):
        raise PushError(f"registry {registry!r} is not HOST or HOST:PORT")
    if not image_exists(image):
        raise PushError(f"no local image {image}: build it first (make build IMAGE={image})")

    keep: dict[str, str] = {}
    if registry:
        target = f"{registry}/{repository}"
    else:
        ecr = ecr_client()
        ecr_repository = ensure_repository(ecr, repository, moving_tag)
        host, _, path = ecr_repository["repositoryUri"].partition("/")
        host_for_docker = override_host(host, environ)
        ecr_login(ecr, host_for_docker, f"logging in to ECR registry {host}")
        target = f"{host_for_docker}/{path}"
        for tag in tags:
            if policy.tag_is_immutable(ecr_repository, tag):
                existing = ecr_tag_digest(ecr, ecr_repository, tag)
                if existing:
                    keep[tag] = existing

    before = repo_digests(image)
    pushed = []
    for tag in tags:
        if tag in keep:
            note(f"tag {tag} already holds {keep[tag]} and is immutable: kept, not pushed")
            continue
        reference = f"{target}:{tag}"
        tagged = docker("tag", image, reference)
        if tagged.returncode != 0:
            raise PushError(f"docker tag {image} {reference} failed: {last_line(tagged.stderr)}")
        note(f"pushing {reference}")
        docker_push(reference)
        pushed.append(tag)
    if not pushed:
        raise PushError(
            f"nothing pushed: every tag ({', '.join(tags)}) already exists in {target} and is "
            "immutable; bump the version or use a new commit"
        )
    digest = policy.pushed_digest(target, repo_digests(image), before)
    note(f"pushed {', '.join(pushed)} -> {digest}")
    return f"{target}@{digest}"


def login_base(base_image: str, environ: Mapping[str, str]) -> None:
    if not base_image:
        raise PushError("no base image given (BASE_IMAGE)")
    if image_exists(base_image):
        note(f"base {base_image} is on this machine: no registry login needed")
        return
    host = base_image.split("/", 1)[0]
    match = policy.ECR_HOST.match(host)
    if not match:
        note(f"base {base_image} is not in ECR: docker pulls it with your docker credentials")
        return
    host_for_docker = override_host(host, environ)
    what = f"the base image {base_image} needs a login to its ECR registry {host}"
    ecr_login(ecr_client(match["region"]), host_for_docker, what)


# --------------------------------------------------------------------------- main


def parse(argv: Iterable[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("push", help="tag IMAGE and push it to ECR or --registry")
    run.add_argument("--image", required=True, help="local image to push")
    run.add_argument("--repository", default="container-entry", help="repository name")
    run.add_argument("--registry", default="", help="HOST[:PORT] of a non-ECR registry")
    run.add_argument("--version", required=True, help="version tag (immutable in ECR)")
    run.add_argument("--revision", required=True, help="git revision tag (immutable in ECR)")
    run.add_argument("--moving-tag", default="latest", help="tag moved to every push")
    run.add_argument("--uri-file", type=Path, help="also write the pushed URI@digest here")
    base = commands.add_parser("login-base", help="docker login for an ECR base image")
    base.add_argument("--base-image", required=True)
    commands.add_parser("should-push", help="CodeBuild: exit 0 if this build's ref is pushed")
    return parser.parse_args(list(argv))


def fail(message: str) -> NoReturn:
    print(f"push: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def main(argv: Iterable[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    environ = os.environ
    try:
        if args.command == "push":
            uri = push(
                image=args.image, repository=args.repository, registry=args.registry,
                version=args.version, revision=args.revision, moving_tag=args.moving_tag,
                environ=environ,
            )  # fmt: skip
            if args.uri_file:
                args.uri_file.parent.mkdir(parents=True, exist_ok=True)
                args.uri_file.write_text(uri + "\n")
            print(uri, flush=True)
        elif args.command == "login-base":
            login_base(args.base_image, environ)
        else:
            decision, reason = policy.should_push(environ)
            note(reason)
            return 0 if decision else 1
    except PushError as error:
        fail(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
