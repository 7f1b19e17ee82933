"""Whether the entry point launches its own workers, and where: such an entry point (a shell
script running torchrun, a Python script calling mp.spawn) must run once per host, as the AWS
DLC runs it, not once per GPU worker, or every worker would start a whole group of its own.

Decided from the code only, never by running it: shell scripts through their commands
(plan/shell_commands, over plan/shell_words), Python scripts through their syntax tree
(plan/python_calls), so a launcher that is only mentioned (in a comment, a string, an `echo`, a
here-document, a variable never run) does not count. A script that runs another file of the
code (`bash run.sh`, `python train.py`, `source env.sh`) is followed into it.

Pure and total: no reading of files (their bytes are given), no exception for any input, and a
bounded amount of work whatever the input (a capped prefix of each file, a bounded depth and
number of files followed), so hostile code can neither crash nor stall the plan.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from container_entry.common.text import escaped
from container_entry.plan.python_calls import python_events
from container_entry.plan.shell_commands import SHELLS, Event, Follow, Launch, script_events
from container_entry.plan.shell_words import Budget

MAX_BYTES = 256 * 1024  # of a file, read at most (environment.read_code_files reads no more)
MAX_SHELL_CHARS = 64 * 1024  # of a shell script, split into commands (shlex: ~2 us a char)
MAX_PYTHON_CHARS = 128 * 1024  # of a Python file, parsed (its statements up to there)
MAX_WORK = 192 * 1024  # characters split or parsed in one search, all files and nestings
MAX_DEPTH = 4  # files followed from the entry, one into the next
MAX_FILES = 64  # files judged in all
MAX_NESTED = 4  # `python -c` code within code
SHEBANG_LINE = 256  # bytes of a `#!` line read
CONTINUING = ("else", "elif", "except", "finally", "case")  # lines that go on a statement


@dataclass(frozen=True)
class Finding:
    """Where the entry point launches workers of its own."""

    launcher: str  # what launches, as a user would name it: "torchrun", "mpirun" ...
    file: str  # the file that launches, as named in `files`
    line: int  # 1-based, of the launching command or call

    def describe(self) -> str:
        """One line, whatever the file is called (odd characters escaped)."""
        return f"{escaped(self.file)} line {self.line} runs {escaped(self.launcher)}"


def find_launcher(entry: str, files: Mapping[str, bytes]) -> Finding | None:
    """The first place where the entry point `entry` (a key of `files`) launches its own
    workers, following the entry into other files of `files` it runs; None when it launches
    none."""
    search = _Search(entry, files)
    name = entry if entry in files else search.names.get(posixpath.normpath(entry))
    return None if name is None else search.file(name, None, 0, ())


class _Search:
    """One entry point's search: the files, and the work done so far."""

    def __init__(self, entry: str, files: Mapping[str, bytes]) -> None:
        self.files = files
        self.folder = posixpath.dirname(entry)
        self.names = {posixpath.normpath(name): name for name in files}
        self.judged: dict[str, int] = {}  # file -> the least depth it was judged at
        self.files_left = MAX_FILES
        self.budget = Budget(MAX_WORK)

    def file(
        self, name: str, language: str | None, depth: int, chain: tuple[str, ...]
    ) -> Finding | None:
        """The first launch in this file, or in a file it runs."""
        if name in chain or self.judged.get(name, MAX_DEPTH + 1) <= depth or not self.files_left:
            return None
        self.judged[name] = depth
        self.files_left -= 1
        data = self.files[name]
        if not isinstance(data, bytes | bytearray | memoryview):
            return None
        language = _language(name, bytes(data[:SHEBANG_LINE])) or language
        if language is None:
            return None
        text = _text(bytes(data[:MAX_BYTES]), language)
        events = self._events(text, language)
        return self._first(events, name, depth, (*chain, name), 0)

    def _first(
        self, events: Iterator[Event], name: str, depth: int, chain: tuple[str, ...], nested: int
    ) -> Finding | None:
        for event in events:
            found = None
            if isinstance(event, Launch):
                return Finding(event.launcher, name, event.line)
            if isinstance(event, Follow):
                target = self._resolve(event.path, name)
                if target is not None and depth < MAX_DEPTH:
                    found = self.file(target, event.language, depth + 1, chain)
            elif nested < MAX_NESTED:
                inner = _shifted(self._events(event.code, "python"), event.line - 1)
                found = self._first(inner, name, depth, chain, nested + 1)
            if found is not None:
                return found
        return None

    def _events(self, text: str, language: str) -> Iterator[Event]:
        if language == "shell":
            return script_events(text, self.budget)
        return iter(python_events(text, self.budget) or ())

    def _resolve(self, path: str, current: str) -> str | None:
        """The file of the code a command names: relative to the entry's folder, to the
        running file's folder or to the code folder; after a part only the shell knows
        (`$(dirname "$0")/run.sh`, `$DIR/run.sh`), the rest; an absolute path by its end."""
        parts = path.split("/")
        unknown = [i for i, part in enumerate(parts) if any(c in part for c in "$`(){}")]
        if unknown or not path.startswith("/"):
            relative = "/".join(parts[unknown[-1] + 1 :] if unknown else parts)
            folders = (self.folder, posixpath.dirname(current), "")
            candidates = [posixpath.join(folder, relative) for folder in folders if relative]
        else:
            candidates = ["/".join(parts[i:]) for i in range(1, len(parts))]
        for candidate in candidates:
            name = self.names.get(posixpath.normpath(candidate))
            if name is not None:
                return name
        return None


def _language(name: str, head: bytes) -> str | None:
    """python or shell, by the file's name, else by its `#!` line; None: neither."""
    if name.endswith(".py"):
        return "python"
    if name.endswith((".sh", ".bash")):
        return "shell"
    head = head.removeprefix(b"\xef\xbb\xbf")
    if not head.startswith(b"#!"):
        return None
    words = head[2:].partition(b"\n")[0].decode("utf-8", "replace").split()
    programs = [posixpath.basename(word) for word in words if not word.startswith("-")]
    if programs and programs[0] == "env":  # #!/usr/bin/env [-S] [NAME=value] python3
        programs = [word for word in programs[1:] if "=" not in word]
    program = programs[0] if programs else ""
    if program.startswith("python"):
        return "python"
    return "shell" if program in SHELLS else None


def _text(data: bytes, language: str) -> str:
    """The file as text (bytes that are not UTF-8 replaced), capped at a line's end."""
    limit = MAX_PYTHON_CHARS if language == "python" else MAX_SHELL_CHARS
    errors = "replace" if language == "python" else "surrogateescape"  # names as os gives them
    text = data.decode("utf-8", errors).removeprefix("\ufeff")
    if language == "shell":
        text = text.replace("\r\n", "\n")
    if len(text) <= limit:
        return text
    if language == "python":
        return text[: _statement_start(text, limit)]
    cut = text.rfind("\n", 0, limit)
    if cut < 0:  # one huge line: up to the end of a word, never in the middle of one
        cut = text.rfind(" ", 0, limit)
    return text[: cut + 1]


def _statement_start(text: str, limit: int) -> int:
    """Where, before limit, a line starts a new statement of the module: a Python file cut
    there still parses (unless a string or a `try` spans the cut)."""
    end = limit
    while (newline := text.rfind("\n", 0, end)) > 0:
        start = newline + 1
        first = text[start : start + 1]
        if (first.isalpha() or first in "_@") and not text.startswith(CONTINUING, start):
            return start
        end = newline
    return limit


def _shifted(events: Iterator[Event], by: int) -> Iterator[Event]:
    for event in events:
        yield dataclasses.replace(event, line=event.line + by)
