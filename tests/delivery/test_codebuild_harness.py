"""The buildspec harness keeps CodeBuild's rules (a real bash, small made-up buildspecs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.delivery.codebuild import BuildspecError, run_buildspec


def run(tmp_path: Path, text: str, **overrides: str):
    spec = tmp_path / "buildspec.yml"
    spec.write_text(text)
    return run_buildspec(spec, tmp_path, {"PATH": os.environ["PATH"]}, overrides, timeout=60)


def test_one_shell_carries_exports_and_cwd_and_overrides_win(tmp_path):
    result = run(
        tmp_path,
        """
version: 0.2
env:
  variables: {FROM_SPEC: spec, OVERRIDDEN: spec}
  exported-variables: [OUT, FROM_SPEC, OVERRIDDEN, NEVER_SET]
phases:
  install:
    commands:
      - export STEP=install
      - mkdir -p sub && cd sub
  build:
    commands:
      - |
        if [ "$STEP" = install ]; then
          export OUT="$(basename "$PWD"):$CODEBUILD_BUILD_SUCCEEDING:$CODEBUILD_SRC_DIR"
        fi
""",
        OVERRIDDEN="project",
    )
    assert result.phases == {"install": "SUCCEEDED", "build": "SUCCEEDED"}, result.log
    assert result.exported == {
        "OUT": f"sub:1:{tmp_path}",
        "FROM_SPEC": "spec",
        "OVERRIDDEN": "project",
        "NEVER_SET": "",
    }


def test_failed_build_still_runs_post_build_with_succeeding_0(tmp_path):
    result = run(
        tmp_path,
        """
version: 0.2
env:
  exported-variables: [SEEN, AFTER]
phases:
  build:
    commands:
      - "false"
      - export AFTER=ran
    finally:
      - echo finally-ran
  post_build:
    commands:
      - export SEEN="$CODEBUILD_BUILD_SUCCEEDING"
""",
    )
    assert result.phases == {"build": "FAILED", "post_build": "SUCCEEDED"}
    assert not result.succeeded
    assert result.exported == {"SEEN": "0", "AFTER": ""}
    assert "finally-ran" in result.log


def test_failed_pre_build_ends_the_build(tmp_path):
    result = run(
        tmp_path,
        """
version: 0.2
phases:
  pre_build:
    commands: ["exit_code() { return 3; }", exit_code]
  build:
    commands: [touch built]
  post_build:
    commands: [touch posted]
""",
    )
    assert result.phases == {
        "pre_build": "FAILED",
        "build": "SKIPPED",
        "post_build": "SKIPPED",
    }
    assert not (tmp_path / "built").exists() and not (tmp_path / "posted").exists()


def test_unsupported_buildspecs_are_refused(tmp_path):
    with pytest.raises(BuildspecError, match=r"version 0\.2"):
        run(tmp_path, "version: 0.1\nphases: {}\n")
    with pytest.raises(BuildspecError, match="parameter-store"):
        run(tmp_path, "version: 0.2\nenv: {parameter-store: {A: /a}}\nphases: {}\n")
