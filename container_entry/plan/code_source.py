"""Which entry script runs and where its code comes from: part of the plan, pure like it.

The script is named on the command line (`train SCRIPT ARGS...`), by SAGEMAKER_PROGRAM or by
the hyperparameter sagemaker_program; its code is a directory, an archive or an S3 prefix named
by sagemaker_submit_directory (or SAGEMAKER_SUBMIT_DIRECTORY), else the `code` channel, else
<base>/code. Fetching it is user_code's.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from container_entry.plan.environment import Environment, script_candidates

UNRESOLVED = "<entry script>"  # the script's place in a plan that names none


class CodeKind(StrEnum):
    """Where the code comes from; its value is what the plan prints."""

    DIRECTORY = "directory"  # used where it is
    S3 = "s3"  # fetched from S3 (sagemaker_submit_directory), then extracted
    ARCHIVE = "archive"  # a .tar.gz, extracted
    CLI = "cli"  # a script named on the command line


@dataclass(frozen=True)
class CodeSource:
    kind: CodeKind
    location: str  # where the code comes from
    code_dir: str  # where the entry script runs from (cwd of the workers)


def entry_program(env: Environment, sagemaker_hps: Mapping[str, Any]) -> str | None:
    """The entry script as named (None: not named at all)."""
    if env.sdk is not None:
        return env.sdk.entry_script
    if env.cli_args:
        return env.cli_args[0]
    program = env.environ.get("SAGEMAKER_PROGRAM") or sagemaker_hps.get("sagemaker_program")
    return program if isinstance(program, str) and program else None


def _named_on_command_line(env: Environment, name: str) -> tuple[CodeSource, str | None]:
    """A script named on the command line: the first candidate that exists."""
    candidates = script_candidates(env.cwd, str(env.base_dir / "code"), name)
    found = next((path for path in candidates if path in env.scripts_found), None)
    script = found or candidates[0]
    problem = None
    if found is None:
        problem = f"entry script {name!r} not found: looked for {' and '.join(candidates)}"
    directory = posixpath.dirname(script)
    return CodeSource(CodeKind.CLI, name, directory), problem


def _sdk_source(env: Environment) -> CodeSource:
    """SDK v3's code: the `code` channel, where its start cds (extracting a .tar.gz
    source_dir there first), else the working directory."""
    assert env.sdk is not None
    channel = posixpath.join(str(env.base_dir), "input", "data", "code")
    folder = channel if env.sdk.source_dir else env.cwd
    if env.sdk.archive:
        return CodeSource(CodeKind.ARCHIVE, posixpath.join(folder, env.sdk.archive), folder)
    return CodeSource(CodeKind.DIRECTORY, folder, folder)


def _source(env: Environment, program: str, sagemaker_hps: Mapping[str, Any]) -> CodeSource:
    """The code of a script named by SAGEMAKER_PROGRAM or sagemaker_program."""
    base = str(env.base_dir)
    extracted = posixpath.join(base, "code")
    submit = sagemaker_hps.get("sagemaker_submit_directory") or env.environ.get(
        "SAGEMAKER_SUBMIT_DIRECTORY"
    )
    if submit:
        submit = str(submit)
        if submit.startswith("s3://"):
            return CodeSource(CodeKind.S3, submit, extracted)
        if submit.endswith((".tar.gz", ".tgz")):
            return CodeSource(CodeKind.ARCHIVE, submit, extracted)
        return CodeSource(CodeKind.DIRECTORY, submit, submit)
    channel = posixpath.join(base, "input", "data", "code")
    if env.code_channel_entries:
        archives = [e for e in env.code_channel_entries if e.endswith((".tar.gz", ".tgz"))]
        if program not in env.code_channel_entries and archives:
            return CodeSource(CodeKind.ARCHIVE, posixpath.join(channel, archives[0]), extracted)
        return CodeSource(CodeKind.DIRECTORY, channel, channel)
    return CodeSource(CodeKind.DIRECTORY, extracted, extracted)


def locate_code(
    env: Environment, program: str | None, sagemaker_hps: Mapping[str, Any]
) -> tuple[CodeSource, str, list[str]]:
    """Where the code comes from, the entry script's path, and why it cannot run, if so."""
    if program is None:
        code_dir = str(env.base_dir / "code")
        missing = (
            "no entry script: set SAGEMAKER_PROGRAM or hyperparameter sagemaker_program, "
            "or run `train SCRIPT [ARGS...]`"
        )
        return CodeSource(CodeKind.DIRECTORY, code_dir, code_dir), UNRESOLVED, [missing]
    if env.cli_args:
        code, problem = _named_on_command_line(env, program)
        script = posixpath.join(code.code_dir, posixpath.basename(program))
        return code, script, [problem] if problem else []
    code = _sdk_source(env) if env.sdk else _source(env, program, sagemaker_hps)
    return code, posixpath.join(code.code_dir, program), []
