"""Fetch the user's code to where the plan says it runs, and install its requirements."""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from pathlib import Path
from urllib.parse import urlparse

from container_entry.common import offspring
from container_entry.common.errors import CodeError
from container_entry.common.logs import log
from container_entry.common.text import escaped, quoted
from container_entry.plan.code_source import CodeKind
from container_entry.plan.plan import Plan


def _safe_extract(archive: Path, target: Path) -> None:
    """Extract a sourcedir tarball with tarfile's "data" filter (what sagemaker-training uses):
    no absolute paths, no member or link that leaves `target`, no devices. sagemaker-training's
    own download helper is not used because importing its modules creates directories."""
    try:
        with tarfile.open(archive) as tar:
            target.mkdir(parents=True, exist_ok=True)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, filter="data")
            else:  # Python 3.11.0-3.11.3 has no filter: the same refusals, by hand
                for member in tar.getmembers():
                    member.name = member.name.lstrip("/")  # as the filter: kept, inside
                    problem = _refused(member, target)
                    if problem:
                        name = quoted(member.name)
                        raise CodeError(f"{archive}: member {name} is refused: {problem}")
                tar.extractall(target)
    except tarfile.TarError as error:
        if not isinstance(error, getattr(tarfile, "FilterError", ())):
            raise _unreadable(archive, error) from None
        refused = getattr(error, "tarinfo", None)  # tarfile.FilterError's
        name = refused.name if refused is not None else "?"
        raise CodeError(f"{archive}: member {quoted(name)} is refused: {error}") from None
    except (OSError, EOFError, zlib.error) as error:
        raise _unreadable(archive, error) from None


def _unreadable(archive: Path, error: BaseException) -> CodeError:
    detail = str(error) or type(error).__name__
    return CodeError(f"{archive}: cannot extract ({detail}): truncated or not a tar.gz?")


def _refused(member: tarfile.TarInfo, target: Path) -> str | None:
    """Why the "data" filter would refuse `member`, for a Python without it."""
    root = target.resolve()
    path = (root / member.name).resolve()
    if not path.is_relative_to(root):
        return "it would be extracted outside the code directory"
    if member.isdev() or member.isfifo():
        return "it is a special file"
    if member.issym() or member.islnk():
        link = ((path.parent if member.issym() else root) / member.linkname).resolve()
        if member.linkname.startswith("/") or not link.is_relative_to(root):
            return f"its link target {quoted(member.linkname)} is outside the code directory"
    return None


def _download_s3(url: str, destination: Path, environ: dict[str, str]) -> None:
    parsed = urlparse(url)
    try:
        import boto3
    except ImportError:
        raise CodeError(f"{url}: boto3 is not installed, cannot fetch code from S3") from None
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name=region)
        client.download_file(parsed.netloc, parsed.path.lstrip("/"), str(destination))
    except Exception as error:  # botocore raises many types; all mean "could not fetch"
        raise CodeError(f"{url}: cannot download ({error})") from None


def prepare(plan: Plan, environ: dict[str, str]) -> Path:
    """Materialise the code directory; returns the entry script's path (checked to exist)."""
    source = plan.code
    code_dir = Path(source.code_dir)
    if source.kind is CodeKind.S3:
        log(f"fetching code from {source.location}")
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "sourcedir.tar.gz"
            _download_s3(source.location, archive, environ)
            _safe_extract(archive, code_dir)
    elif source.kind is CodeKind.ARCHIVE:
        log(f"extracting code from {source.location}")
        _safe_extract(Path(source.location), code_dir)
    script = Path(plan.command[0])
    if not script.is_file():
        where = escaped(str(code_dir))
        if source.kind is not CodeKind.DIRECTORY:
            where += f" (from {escaped(source.location)})"
        try:  # any name may be in there: not UTF-8, a line break, a control character
            found = ", ".join(map(escaped, sorted(os.listdir(code_dir))[:10])) or "empty"
        except OSError:
            found = "directory missing"
        program = quoted(plan.program or "")
        raise CodeError(f"entry script {program} not found in {where}; found: {found}")
    if script.suffix != ".py":
        make_executable(script)
    return script


def make_executable(script: Path) -> None:
    """A command entry point delivered without its run bit (an S3 code channel or an untarred
    sourcedir loses it) is made executable, as the incumbent does."""
    mode = script.stat().st_mode
    if mode & stat.S_IXUSR:
        return
    try:
        script.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as error:
        raise CodeError(
            f"entry script {escaped(str(script))} is not executable and cannot be made so "
            f"({error.strerror})"
        ) from None


def _requirements(plan: Plan) -> Path | None:
    """The requirements file to install: `requirements.txt` in the code folder where it exists;
    under SDK v3, the file SourceCode.requirements names (which must exist), or none."""
    folder = Path(plan.code.code_dir)
    if plan.sdk is None or plan.sdk.requirements == "auto":  # "auto": the SDK's JumpStart rule
        found = folder / "requirements.txt"
        return found if found.is_file() else None
    if plan.sdk.requirements is None:
        return None
    named = folder / plan.sdk.requirements
    if not named.is_file():
        raise CodeError(f"{escaped(str(named))}: not found (SourceCode.requirements)")
    return named


def install_requirements(plan: Plan, python: str) -> None:
    """`pip install -r requirements.txt` once per host, before any worker starts (under SDK v3
    through the SDK's own installer where it shipped one: CodeArtifact's login)."""
    requirements = _requirements(plan) if plan.settings.install_requirements else None
    if requirements is None:
        return
    log(f"installing {escaped(str(requirements))}")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-r", str(requirements)]
    if plan.sdk is not None and plan.sdk.installer:
        pip = [python, plan.sdk.installer, str(requirements)]
    if shutil.which(python) is None and not Path(python).exists():
        raise CodeError(f"{requirements}: no python at {python} to install with")
    result = offspring.run(pip, cwd=plan.code.code_dir)  # relative lines name files there
    if result.returncode != 0:
        raise CodeError(f"{requirements}: pip install failed with exit code {result.returncode}")
