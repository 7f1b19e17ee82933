"""`make push REGISTRY=host:port`: a real registry server, then pull the digest back and run it."""

from __future__ import annotations

import json
import re
import subprocess

from tests.delivery.conftest import (
    REPO,
    STANDIN,
    clean_environment,
    git_revision,
    image_id,
    make,
    project_version,
    push_script,
)

REPOSITORY = "generic/container-entry"


def test_make_push_prints_the_digest_that_pulls_back_and_runs(image, registry, docker_config):
    env = clean_environment(DOCKER_CONFIG=str(docker_config))
    # A non-ECR registry: the user logs in once, as for any registry (password on stdin).
    login = subprocess.run(
        ["docker", "login", "--username", registry.username, "--password-stdin", registry.host],
        input=registry.password,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert login.returncode == 0, login.stderr

    revision = git_revision()  # given explicitly: HEAD may move while the test runs
    result = make(
        "push",
        f"REGISTRY={registry.host}",
        f"REPOSITORY={REPOSITORY}",
        f"BASE_IMAGE={STANDIN}",
        f"IMAGE={image}",
        f"REVISION={revision}",
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(rf"{re.escape(registry.host)}/{REPOSITORY}@(sha256:[0-9a-f]{{64}})", last)
    assert match, f"last line is not <repository>@sha256:<digest>: {last!r}"
    digest = match[1]
    assert (REPO / "build" / "image-uri.txt").read_text().strip() == last

    # Every tag (revision, version, moving) resolves to that digest in the registry, and the
    # manifest's config is the image we built.
    for tag in (revision, project_version(), "latest"):
        assert registry.manifest_digest(REPOSITORY, tag) == digest, tag
    assert registry.config_digest(REPOSITORY, digest) == image_id(image)

    # Pull the printed reference back (docker checks the manifest against the digest) and run.
    pulled = subprocess.run(
        ["docker", "pull", last], env=env, capture_output=True, text=True, check=False
    )
    assert pulled.returncode == 0, pulled.stderr
    assert f"Digest: {digest}" in pulled.stdout
    repo_digests = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", last],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert last in json.loads(repo_digests)
    run = subprocess.run(
        ["docker", "run", "--rm", last, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: container-entry")  # our entrypoint, from the pull


def test_push_without_a_login_says_to_log_in(image, registry, docker_config):
    env = clean_environment(DOCKER_CONFIG=str(docker_config))
    result = push_script(
        "push",
        "--image",
        image,
        "--registry",
        registry.host,
        "--repository",
        REPOSITORY,
        "--version",
        "0.0.0-nologin",
        "--revision",
        "nologin",
        env=env,
    )
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("push: error: docker push ")
    assert f"log in first: docker login {registry.host}" in last
    assert registry.manifest_digest(REPOSITORY, "nologin") is None
