"""Code blocks of the docs, and how each is run or checked (tests/docs/test_docs.py).

The convention (README.md and docs/*.md):

- A fenced block whose language is `bash`/`sh`/`shell`, `python` or `dockerfile` is executable;
  any other language (`text`, `json`, none, ...) is not code and is ignored.
- Every executable block has a marker on the line directly before its opening fence:
  `<!-- doc: run -->`, `<!-- doc: run in=<repo dir> timeout=<seconds> -->`: run as written in
  a fresh temp copy of <dir> (default: an empty temp dir), must exit 0 within the timeout
  (600 s by default);
  `<!-- doc: check aws — <reason> -->` (also `gpu`, `ci`): cannot run here, still checked
  (shell parses and its `make` targets exist; Python compiles, imports resolve and SDK calls
  bind to the installed SDK's signatures; Dockerfile lints and derives from our image; `ci`:
  `.ci/run` runs exactly these commands).
- Before running or checking, the image URI (`<account>.dkr.ecr.<region>.amazonaws.com/
  container-entry[:tag|@sha256:digest]`, local `container-entry:latest`) becomes the test
  image, role ARNs a fake one, `s3://bucket/path` a local `file://` directory. Nothing else.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/*.md")
CHECKER = Path(__file__).with_name("sdk_check.py")
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
HADOLINT = REPO / ".venv" / "bin" / "hadolint"
CI_SCRIPT = REPO / ".ci" / "run"
FAKE_ROLE = "arn:aws:iam::111111111111:role/local"
DEFAULT_TIMEOUT = 600

SHELL = frozenset({"bash", "sh", "shell"})
PYTHON = frozenset({"python"})
DOCKERFILE = frozenset({"dockerfile"})
EXECUTABLE = SHELL | PYTHON | DOCKERFILE
CHECK_SCOPES = ("aws", "gpu", "ci")

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
MARKER = re.compile(r"^\s*<!--\s*doc:(?P<body>.*?)-->\s*$")
ANY_MARKER = re.compile(r"<!--\s*doc:")
DASH = "(?:\u2014|\u2013|--|-)"  # em dash as written; en dash, -- and - as typed
CHECK_BODY = re.compile(rf"^check\s+(?P<scope>\S+)\s*{DASH}\s*(?P<reason>\S.*)$")


# ---------------------------------------------------------------------------- extraction
@dataclass(frozen=True)
class Marker:
    kind: str  # "run" or "check"
    scope: str | None = None  # check: aws, gpu, ci
    reason: str = ""
    directory: str | None = None  # run: in=
    timeout: int = DEFAULT_TIMEOUT  # run: timeout=


@dataclass(frozen=True)
class Block:
    file: str  # repo-relative path of the markdown file
    line: int  # 1-based line of the opening fence (of the marker, for a stray marker)
    lang: str
    code: str  # dedented by the fence's indentation
    marker: Marker | None
    problem: str | None = None  # set: the block itself breaks the convention

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def parse_marker(body: str) -> Marker:
    """A marker's text after `doc:`; ValueError naming what is wrong."""
    body = body.strip()
    words = body.split()
    if words and words[0] == "run":
        directory, timeout = None, DEFAULT_TIMEOUT
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep or not value:
                raise ValueError(f"run takes in=<dir> timeout=<seconds>, not {word!r}")
            if key == "in":
                directory = value
            elif key == "timeout" and value.isdigit() and int(value) > 0:
                timeout = int(value)
            else:
                raise ValueError(f"run takes in=<dir> timeout=<seconds>, not {word!r}")
        return Marker("run", directory=directory, timeout=timeout)
    match = CHECK_BODY.match(body)
    if match and match["scope"] in CHECK_SCOPES:
        return Marker("check", scope=match["scope"], reason=match["reason"].strip())
    raise ValueError(
        f"unknown marker {body!r}: use `run [in=<dir>] [timeout=<s>]` or "
        f"`check aws|gpu|ci — <reason>`"
    )


def extract(text: str, file: str) -> list[Block]:
    """Executable blocks of one markdown text, and every break of the convention as a Block
    with `problem` set (missing/unknown marker, marker without a fence, unclosed fence)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        opening = FENCE.match(line)
        if not opening:
            if ANY_MARKER.search(line):
                following = lines[index + 1] if index + 1 < len(lines) else ""
                if not FENCE.match(following):
                    blocks.append(
                        Block(
                            file,
                            index + 1,
                            "",
                            "",
                            None,
                            f"{file}:{index + 1}: doc marker not followed by a code fence on the "
                            f"next line",
                        )
                    )
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        lang = (opening["info"].split() or [""])[0].strip("{}.").lower()
        start = index
        body: list[str] = []
        index += 1
        closed = False
        while index < len(lines):
            closing = re.match(r"^[ \t]*(`{3,}|~{3,})[ \t]*$", lines[index])
            if closing and closing[1][0] == fence[0] and len(closing[1]) >= len(fence):
                closed = True
                break
            body.append(dedent_line(lines[index], len(indent)))
            index += 1
        index += 1
        where = f"{file}:{start + 1}"
        code = "\n".join(body) + "\n"
        if not closed:
            blocks.append(Block(file, start + 1, lang, code, None, f"{where}: fence never closed"))
            continue
        previous = lines[start - 1] if start > 0 else ""
        marker_match = MARKER.match(previous)
        if lang not in EXECUTABLE:
            if marker_match:
                blocks.append(
                    Block(
                        file,
                        start + 1,
                        lang,
                        code,
                        None,
                        f"{where}: doc marker on a {lang or 'plain'} block, which is not "
                        f"executable (only {', '.join(sorted(EXECUTABLE))} are)",
                    )
                )
            continue
        if not marker_match:
            problem = (
                f"{where}: {lang} block without a marker: put `<!-- doc: run -->` or "
                f"`<!-- doc: check aws|gpu|ci — <reason> -->` on the line before its fence"
            )
            blocks.append(Block(file, start + 1, lang, code, None, problem))
            continue
        try:
            marker = parse_marker(marker_match["body"])
        except ValueError as exc:
            blocks.append(Block(file, start + 1, lang, code, None, f"{where}: {exc}"))
            continue
        blocks.append(Block(file, start + 1, lang, code, marker))
    return blocks


def dedent_line(line: str, width: int) -> str:
    strip = 0
    while strip < width and strip < len(line) and line[strip] in " \t":
        strip += 1
    return line[strip:]


def doc_files(repo: Path = REPO) -> list[Path]:
    found: list[Path] = []
    for pattern in DOCS:
        found.extend(sorted(repo.glob(pattern)))
    return found


def collect(repo: Path = REPO) -> list[Block]:
    blocks: list[Block] = []
    for path in doc_files(repo):
        blocks.extend(extract(path.read_text(encoding="utf-8"), str(path.relative_to(repo))))
    return blocks


# ---------------------------------------------------------------------------- substitution
PLACEHOLDER = r"<[^<>\s]+>"
ECR_IMAGE = re.compile(
    rf"(?:\d{{12}}|{PLACEHOLDER})\.dkr\.ecr\.(?:[a-z]{{2}}(?:-[a-z]+)+-\d|{PLACEHOLDER})"
    rf"\.amazonaws\.com(?:\.cn)?/container-entry"
    rf"(?::(?:{PLACEHOLDER}|\w[\w.-]*)|@sha256:(?:[0-9a-f]{{64}}|{PLACEHOLDER}|\.\.\.))?"
    rf"(?![\w/-])"
)
LOCAL_IMAGE = re.compile(r"(?<![\w./:@-])container-entry:latest(?![\w.-])")
ROLE_ARN = re.compile(
    rf"arn:aws:iam::(?:\d{{12}}|{PLACEHOLDER}):role/(?:{PLACEHOLDER}|[\w+=,.@/-]+)"
)
S3_URI = re.compile(
    rf"s3://(?P<bucket>{PLACEHOLDER}|[a-z0-9][a-z0-9.-]*[a-z0-9])(?P<path>/[^\s\"'`),\]}}]*)?"
)


def substitute(code: str, image: str, s3_root: Path) -> tuple[str, list[Path]]:
    """The block with the image, role ARN and S3 URIs replaced; the local directories the
    S3 URIs became (a path whose last part has a dot, e.g. sourcedir.tar.gz: its parent)."""
    code = ECR_IMAGE.sub(image, code)
    code = LOCAL_IMAGE.sub(image, code)
    code = ROLE_ARN.sub(FAKE_ROLE, code)
    directories: list[Path] = []

    def local(match: re.Match) -> str:
        bucket = match["bucket"].strip("<>")
        path = match["path"] or "/"
        target = s3_root / bucket / path.strip("/")
        directory = target.parent if "." in target.name and path.strip("/") else target
        directories.append(directory)
        return f"file://{s3_root}/{bucket}{path}"

    return S3_URI.sub(local, code), directories


# ---------------------------------------------------------------------------- shell
CONTROL = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&", "\n"})
KEYWORDS = frozenset({"then", "do", "else", "elif", "if", "while", "until", "!", "time", "{"})
MAKE_OPTIONS_WITH_ARG = frozenset({"-C", "-f", "-I", "-o", "-W", "--directory", "--file"})
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def simple_commands(code: str) -> list[list[str]]:
    """The shell's simple commands as word lists (best effort: no expansion, no heredocs),
    leading VAR=value assignments and keywords dropped."""
    joined = re.sub(r"\\\n", " ", code)
    commands: list[list[str]] = []
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:  # unbalanced quotes on the line: bash -n judges the syntax
            continue
        current: list[str] = []
        for token in [*tokens, ";"]:
            if token in CONTROL:
                while current and (current[0] in KEYWORDS or ASSIGNMENT.match(current[0])):
                    current.pop(0)
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
    return commands


@dataclass(frozen=True)
class MakeCall:
    targets: tuple[str, ...]
    variables: tuple[str, ...]
    directory: str | None


def make_calls(code: str) -> list[MakeCall]:
    calls = []
    for words in simple_commands(code):
        if os.path.basename(words[0]) != "make":
            continue
        targets, variables, directory = [], [], None
        args = iter(words[1:])
        for word in args:
            if word in MAKE_OPTIONS_WITH_ARG:
                value = next(args, None)
                if word in ("-C", "--directory"):
                    directory = value
            elif word.startswith("--directory="):
                directory = word.split("=", 1)[1]
            elif word.startswith("-"):
                continue
            elif ASSIGNMENT.match(word):
                variables.append(word)
            elif word.isdigit():  # -j N
                continue
            else:
                targets.append(word)
        calls.append(MakeCall(tuple(targets), tuple(variables), directory))
    return calls


@functools.cache
def make_database(directory: Path) -> str:
    result = subprocess.run(
        ["make", "-pn", "-C", str(directory), "--no-print-directory", "-f", "Makefile"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.stdout


def check_make(call: MakeCall, where: str, repo: Path = REPO) -> list[str]:
    """Every target of `make ...` exists: `make -n` succeeds, or at least `make -pn` lists it."""
    directory = (repo / call.directory) if call.directory else repo
    if not (directory / "Makefile").exists():
        return [f"{where}: make {' '.join(call.targets)}: no Makefile in {directory}"]
    problems = []
    for target in call.targets or ("",):
        command = ["make", "-n", "--no-print-directory", "-C", str(directory), *call.variables]
        result = subprocess.run(
            [*command, *([target] if target else [])],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=run_env(),
        )
        if result.returncode == 0 or not target:
            continue
        if re.search(rf"^{re.escape(target)}:", make_database(directory), re.M):
            continue
        problems.append(
            f"{where}: `make {target}` names no target of {directory / 'Makefile'}: "
            f"{result.stderr.strip()[-400:]}"
        )
    return problems


def check_shell(block: Block, code: str) -> list[str]:
    result = subprocess.run(
        ["bash", "-n", "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        return [f"{block.where}: bash -n: {result.stderr.strip()}"]
    problems: list[str] = []
    for call in make_calls(code):
        problems.extend(check_make(call, block.where))
    return problems


def check_ci(block: Block, code: str, ci_script: Path = CI_SCRIPT) -> list[str]:
    """A `check ci` block: every command in it is one that the CI script runs (the CI command
    may add VAR=value arguments after it), and its make targets exist."""
    problems = check_shell(block, code)
    if not ci_script.exists():
        return [*problems, f"{block.where}: check ci, but {ci_script} does not exist"]
    ran = simple_commands(ci_script.read_text())
    wanted = simple_commands(code)
    if not wanted:
        problems.append(f"{block.where}: check ci block runs no command")
    for words in wanted:
        if not any(command[: len(words)] == words for command in ran):
            runs = "; ".join(" ".join(c) for c in ran if c[0] == words[0]) or "nothing like it"
            problems.append(
                f"{block.where}: `{' '.join(words)}` is not what {ci_script.name} runs ({runs})"
            )
    return problems


def runs_test_suite(code: str) -> bool:
    """`make test` or pytest: a run block doing that would start the suite inside itself."""
    for words in simple_commands(code):
        if os.path.basename(words[0]) == "make" and "test" in words[1:]:
            return True
        if "pytest" in words[:3] or os.path.basename(words[0]) in ("pytest", "py.test"):
            return True
    return False


# ---------------------------------------------------------------------------- python
def sdk_flavor(code: str) -> str | None:
    """ "v3" for sagemaker.train / sagemaker.core imports, "v2" for any other sagemaker
    import, None without one (the dev venv)."""
    try:
        modules = [
            name
            for node in ast.walk(ast.parse(code))
            for name in (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
        ]
    except SyntaxError:
        modules = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", code, re.M)
    sdk = [m for m in modules if m == "sagemaker" or m.startswith("sagemaker.")]
    if any(m.startswith(("sagemaker.train", "sagemaker.core")) for m in sdk):
        return "v3"
    return "v2" if sdk else None


def python_for(flavor: str | None) -> Path:
    if flavor is None:
        return VENV_PYTHON
    from tests.docker.sdk_venvs import ensure_venv

    name, lock = {"v2": ("sdk2", "sdk-v2.txt"), "v3": ("sdk3", "sdk-v3.txt")}[flavor]
    return ensure_venv(name, REPO / "requirements" / lock)


def check_python(block: Block, code: str, python: Path) -> list[str]:
    """Compiles; in `python`'s venv every import resolves and every SDK call binds."""
    return check_python_blocks([(block, code)], python)[0]


def check_python_blocks(blocks: list[tuple[Block, str]], python: Path) -> list[list[str]]:
    """check_python for several blocks with one start of `python` (importing an SDK takes
    seconds)."""
    results: list[list[str] | None] = []
    for block, code in blocks:
        try:
            compile(code, block.where, "exec")
            results.append(None)
        except SyntaxError as exc:
            results.append([f"{block.file}:{block.line + (exc.lineno or 0)}: {exc.msg}"])
    pending = [i for i, found in enumerate(results) if found is None]
    if not pending:
        return [found or [] for found in results]
    result = subprocess.run(
        [str(python), "-I", str(CHECKER)],  # -I: neither cwd nor tests/docs on sys.path
        input=json.dumps([blocks[i][1] for i in pending]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=sdk_env(),
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("DOC-CHECK ")]
    if result.returncode != 0 or not lines:
        failed = f"the SDK check failed to run:\n{result.stderr[-3000:]}"
        for i in pending:
            results[i] = [f"{blocks[i][0].where}: {failed}"]
        return [found or [] for found in results]
    for i, found in zip(pending, json.loads(lines[-1].removeprefix("DOC-CHECK ")), strict=True):
        block = blocks[i][0]
        results[i] = [doc_line(block, problem) for problem in found]
    return [found or [] for found in results]


def doc_line(block: Block, problem: str) -> str:
    """`line N: message` of the checker as `<file>:<line in the doc>: message`."""
    match = re.match(r"line (\d+): (.*)", problem, re.S)
    if not match:
        return f"{block.where}: {problem}"
    return f"{block.file}:{block.line + int(match[1])}: {match[2]}"


def sdk_env(tmp: Path | None = None) -> dict[str, str]:
    """Fake credentials and no AWS config, as tests/docker/test_sdk_clients.py runs the SDKs."""
    env = {k: v for k, v in run_env().items() if not k.startswith(("AWS_", "PYTHON", "VIRTUAL"))}
    env.update(
        AWS_ACCESS_KEY_ID="AKIAFAKEFAKEFAKEFAKE",
        AWS_SECRET_ACCESS_KEY="fake-secret-key",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        SAGEMAKER_SUPPRESS_V2_WARNING="1",
        PYTHONUNBUFFERED="1",
    )
    if tmp is not None:
        env.update(
            AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        )
    else:
        env.update(AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    return env


# ---------------------------------------------------------------------------- dockerfile
def from_images(dockerfile: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    images = []
    for line in joined.splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            rest = [w for w in words[1:] if not w.startswith("--")]
            if rest:
                images.append(rest[0])
    return images


def check_dockerfile(block: Block, code: str, image: str) -> list[str]:
    """hadolint finds no error, and the final stage derives from our (substituted) image."""
    problems = []
    images = from_images(code)
    if not images or images[-1] != image:
        problems.append(
            f"{block.where}: the final FROM ({images[-1] if images else 'none'}) is not our "
            f"image: use <account>.dkr.ecr.<region>.amazonaws.com/container-entry@sha256:<digest>"
            f" (or :<tag>, or container-entry:latest)"
        )
    result = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "error", "-"],
        input=code,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        problems.append(f"{block.where}: hadolint:\n{(result.stdout + result.stderr).strip()}")
    return problems


# ---------------------------------------------------------------------------- running
def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["REPO"] = str(REPO)
    return env


@functools.cache
def needs_docker(block: Block) -> bool:
    """Whether running the block needs the engine and our image (so the `image` fixture)."""
    if block.marker is None or block.marker.kind != "run":
        return False
    if block.lang in DOCKERFILE:
        return True
    if re.search(r"\bdocker(-compose)?\b|container-entry:|\.dkr\.ecr\.", block.code):
        return True
    if block.lang in PYTHON:
        return sdk_flavor(block.code) is not None  # SDK local mode runs docker compose
    return any(make_uses_docker(call) for call in make_calls(block.code))


def make_uses_docker(call: MakeCall) -> bool:
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO), *call.variables, *call.targets],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=run_env(),
    )
    return result.returncode != 0 or "docker" in result.stdout


def working_copy(directory: str | None, destination: Path, repo: Path = REPO) -> Path:
    """A fresh copy of the repo directory (its git-visible files, modification times kept) at
    `destination`, or an empty directory. A copy of the repo root also links `.venv` and
    `build`, the state `make venv`/`make standin` leave, so make does not redo them."""
    destination.mkdir(parents=True)
    if directory is None:
        return destination
    source = (repo / directory).resolve()
    if not source.is_dir() or not source.is_relative_to(repo.resolve()):
        raise ValueError(f"in={directory}: not a directory of the repository")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
        cwd=source,
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            path = source / name
            if not path.exists() and not path.is_symlink():
                continue  # deleted in the work tree
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target, follow_symlinks=False)
    else:  # not a git checkout
        shutil.copytree(
            source,
            destination,
            symlinks=True,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(".git", ".venv", "build", "__pycache__"),
        )
    if source == repo.resolve():
        # make in the copy would rebuild a stale venv through the link, and `pip install -e .`
        # would then point the repo's venv at the copy: refuse instead.
        stale = subprocess.run(
            ["make", "-q", "-C", str(repo), ".venv/.done"], capture_output=True, check=False
        )
        if (repo / ".venv").exists() and stale.returncode != 0:
            raise ValueError("the repo's .venv is out of date: run `make venv` first")
        for name in (".venv", "build"):
            if (repo / name).exists():
                (destination / name).symlink_to(repo / name)
    return destination


def run_command(command: list[str], cwd: Path, env: dict, timeout: int) -> tuple[int | None, str]:
    """Exit status (None: timed out, process group killed) and combined output."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output


def run_block(block: Block, code: str, workdir: Path, tmp: Path, image: str | None) -> list[str]:
    """Run a `run` block as written (after substitution); its problems (none: exit 0)."""
    assert block.marker is not None
    timeout = block.marker.timeout
    env = run_env()
    scratch = tmp / "tmpdir"  # the SDK's local mode puts its compose projects under TMPDIR
    scratch.mkdir(exist_ok=True)
    env["TMPDIR"] = str(scratch)
    if block.lang in SHELL:
        status, output = run_command(
            ["bash", "-euo", "pipefail", "-c", code], workdir, env, timeout
        )
    elif block.lang in PYTHON:
        flavor = sdk_flavor(code)
        if flavor is not None:
            env = {**sdk_env(tmp), "TMPDIR": str(scratch)}
        status, output = run_command([str(python_for(flavor)), "-c", code], workdir, env, timeout)
    else:
        dockerfile = tmp / "Dockerfile.doc"
        dockerfile.write_text(code)
        tag = f"container-entry-doctest:{uuid.uuid4().hex[:12]}"
        try:
            status, output = run_command(
                ["docker", "build", "-f", str(dockerfile), "-t", tag, str(workdir)],
                workdir,
                env,
                timeout,
            )
        finally:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
    if status == 0:
        return []
    what = f"timed out after {timeout} s" if status is None else f"exited {status}"
    return [f"{block.where}: {block.lang} block {what}:\n{output[-6000:]}"]


# ---------------------------------------------------------------------------- one block
def verify(block: Block, tmp: Path, image: str, docker_client=None) -> list[str]:
    """Everything wrong with one block: its convention problem, or what running or checking
    it (after substitution) found. `docker_client`: clean up SDK local-mode containers."""
    if block.problem is not None:
        return [block.problem]
    assert block.marker is not None
    code, s3_directories = substitute(block.code, image, tmp / "s3")
    marker = block.marker
    if marker.kind == "run":
        if runs_test_suite(code):
            return [f"{block.where}: a run block must not start the test suite (mark it check ci)"]
        for directory in s3_directories:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            workdir = working_copy(marker.directory, tmp / "work")
        except ValueError as exc:
            return [f"{block.where}: {exc}"]
        if docker_client is None or "sagemaker" not in code.lower():
            return run_block(block, code, workdir, tmp, image)
        # an SDK's local mode: its turn, and its containers and network removed after it (a
        # cleanup beside another SDK job could remove that job's network just made)
        from tests.docker.sdk_venvs import local_mode_cleanup, sdk_local_mode

        with sdk_local_mode(), local_mode_cleanup(docker_client, tmp):
            return run_block(block, code, workdir, tmp, image)
    if marker.scope == "ci":
        if block.lang not in SHELL:
            return [f"{block.where}: check ci marks the CI's shell command, not {block.lang}"]
        return check_ci(block, code)
    if block.lang in SHELL:
        return check_shell(block, code)
    if block.lang in PYTHON:
        return check_python(block, code, python_for(sdk_flavor(code)))
    return check_dockerfile(block, code, image)
