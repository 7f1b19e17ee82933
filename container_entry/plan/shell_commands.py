"""What one shell command runs: a launcher of workers, another file of the code, or code given
on its command line; the rules plan/launchers applies to shell scripts and to the commands a
Python script starts.

A command is judged by its command word as bash finds it: after `NAME=value` prefixes, reserved
words (`if`, `then`, `!`, `{` ...) and the wrappers that run the rest of their line (`exec`,
`env`, `nohup`, `sudo` ...), with the script's own variables expanded (`$LAUNCHER train.py`,
`eval "$CMD"`). Only a command that runs counts: `echo torchrun`, `which torchrun` or
`command -v torchrun` name it without running it.
"""

from __future__ import annotations

import dataclasses
import posixpath
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from container_entry.common.workers import SHELLS
from container_entry.plan.shell_words import Budget, Command, commands

# command word -> the launcher, as a user names it
PROGRAMS = {
    "torchrun": "torchrun",
    "deepspeed": "deepspeed",
    "mpirun": "mpirun",
    "mpiexec": "mpiexec",
    "mpiexec.hydra": "mpiexec",
    "orterun": "mpirun",
    "horovodrun": "horovodrun",
    "accelerate-launch": "accelerate launch",
}
# `python -m MODULE` -> the launcher
MODULES = {
    "torch.distributed.run": "python -m torch.distributed.run",
    "torch.distributed.launch": "torch.distributed.launch",
    "accelerate.commands.launch": "accelerate launch",
    "deepspeed": "deepspeed",
    "deepspeed.launcher.runner": "deepspeed",
    "horovod.runner.launch": "horovodrun",
}
RESERVED = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "coproc"}
# wrapper -> (its options that take a value, how many operands come before the command)
WRAPPERS: Mapping[str, tuple[frozenset[str], int]] = {
    "exec": (frozenset({"-a"}), 0),
    "env": (frozenset({"-u", "--unset", "-C", "--chdir"}), 0),
    "nohup": (frozenset(), 0),
    "time": (frozenset(), 0),
    "command": (frozenset(), 0),
    "builtin": (frozenset(), 0),
    "nice": (frozenset({"-n", "--adjustment"}), 0),
    "stdbuf": (frozenset({"-i", "-o", "-e", "--input", "--output", "--error"}), 0),
    "setsid": (frozenset(), 0),
    "sudo": (frozenset({"-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U", "-T"}), 0),
    "timeout": (frozenset({"-s", "--signal", "-k", "--kill-after"}), 1),
    "taskset": (frozenset(), 1),
    "numactl": (frozenset({"-N", "-m", "-C", "-p", "-i", "--cpunodebind", "--membind"}), 0),
}
RUNNERS = {"uv", "poetry", "pipenv", "conda", "mamba", "micromamba", "pixi"}  # `X run CMD`
RUNNER_VALUES = frozenset({"-n", "-p", "--name", "--prefix", "--cwd", "--with", "--python"})
INFORMATIONAL = {"-h", "--help", "-V", "--version"}  # a launcher that only says something
SCRIPT_SUFFIXES = (".sh", ".bash", ".py")
MAX_NESTING = 6  # eval inside bash -c inside eval ...
MAX_EXPANSIONS = 16  # wrappers and variables unwrapped for one command
MAX_VALUE = 4096  # characters of a variable's value kept (X=$X$X doubles it each time)
MAX_EXPANDED = 64 * 1024  # characters that variables add to one command
MAX_REFERENCES = 64  # variables put in one word
MAX_VARIABLES = 512  # variables a script may set


@dataclass(frozen=True)
class Launch:
    """The command launches workers."""

    launcher: str
    line: int


@dataclass(frozen=True)
class Follow:
    """The command runs this file, if the code has it (`python` or `shell`: how it is run)."""

    path: str
    line: int
    language: str | None = None


@dataclass(frozen=True)
class Nested:
    """Python code given on the command line (`python -c CODE`), judged as a Python file."""

    code: str
    line: int


Event = Launch | Follow | Nested


@dataclass
class _Shell:
    """One shell's state as its script goes: its variables, its budget, how deep it is."""

    budget: Budget
    variables: dict[str, str]
    nesting: int = 0
    folder: str = ""  # where `cd` went, relative to where the script started ("": unknown)

    def child(self, share: bool) -> _Shell:
        """The shell that runs an `eval` (sharing the variables) or a `bash -c` (a copy)."""
        variables = self.variables if share else dict(self.variables)
        return _Shell(self.budget, variables, self.nesting + 1, self.folder)

    def cd(self, args: Sequence[str]) -> None:
        target = next((arg for arg in args if not arg.startswith("-")), "")
        known = target and not target.startswith("/") and "$" not in target
        self.folder = posixpath.normpath(posixpath.join(self.folder, target)) if known else ""

    def follow(self, path: str, line: int, language: str | None = None) -> Follow:
        """The file a command runs, as named from where the script started."""
        if self.folder and not path.startswith(("/", "$")):
            path = posixpath.join(self.folder, path)
        return Follow(path, line, language)


def script_events(text: str, budget: Budget) -> Iterator[Event]:
    """What a shell text runs, command by command, each event at its line in the text."""
    return _script(text, _Shell(budget, {}))


def argv_events(argv: Sequence[str], line: int, budget: Budget) -> Iterator[Event]:
    """What a command line given as a list (a Python `subprocess` call) runs."""
    return _judge(Command(tuple(argv), (line,) * len(argv)), _Shell(budget, {}))


def _script(text: str, shell: _Shell) -> Iterator[Event]:
    for command in commands(text, shell.budget):
        yield from _judge(command, shell)


def _judge(command: Command, shell: _Shell) -> Iterator[Event]:
    variables = shell.variables
    words, lines = _expanded(command, variables)
    if words and all(_assignment(word) for word in words):
        _assign(words, variables)
        return
    words, lines = _unwrapped(words, lines)
    if not words:
        return
    name, line, args = posixpath.basename(words[0]), lines[0], words[1:]
    if name in ("export", "declare", "local", "readonly", "typeset"):
        _assign([word for word in args if _assignment(word)], variables)
    elif name in ("cd", "pushd"):
        shell.cd(args)
    elif name in PROGRAMS:
        if not _informational(args):
            yield Launch(PROGRAMS[name], line)
    elif name == "accelerate":
        if next((arg for arg in args if not arg.startswith("-")), None) == "launch":
            yield Launch("accelerate launch", line)
    elif _is_python(name) or words[0].startswith("$"):
        yield from _python(args, line, shell)
    elif name in SHELLS or name in ("source", ".", "eval"):
        if shell.nesting < MAX_NESTING:
            yield from _shell(name, args, line, shell)
    elif words[0].endswith(SCRIPT_SUFFIXES) or "/" in words[0]:
        yield shell.follow(words[0], line)


def _informational(args: Sequence[str]) -> bool:
    """`torchrun --help`: the launcher only says something and launches nothing."""
    return bool(args) and all(arg in INFORMATIONAL for arg in args)


def _is_python(name: str) -> bool:
    """python, python3, python3.11 ..."""
    version = name.removeprefix("python")
    return name.startswith("python") and all(c.isdigit() or c == "." for c in version)


def _python(args: Sequence[str], line: int, shell: _Shell) -> Iterator[Event]:
    """`python [options] -m MODULE | -c CODE | SCRIPT`: a launcher module, or what runs."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if arg == "--" or not arg.startswith("-") or arg == "-":
            if arg == "--":
                i += 1
            if i < len(args) and args[i] != "-":
                yield shell.follow(args[i], line, "python")
            return
        flags = arg[1:] if not arg.startswith("--") else ""
        for j, flag in enumerate(flags):
            if flag in "mcWX":
                value = flags[j + 1 :] or (args[i + 1] if i + 1 < len(args) else "")
                if flag in "mc":
                    yield from _python_option(flag, value, args[i + 1 :], line, shell)
                    return
                i += 0 if flags[j + 1 :] else 1
                break
        i += 1


def _python_option(
    flag: str, value: str, rest: Sequence[str], line: int, shell: _Shell
) -> Iterator[Event]:
    if flag == "c":
        yield Nested(value, line)
    elif value in MODULES:
        if not _informational(rest[1:] if rest and rest[0] == value else rest):
            yield Launch(MODULES[value], line)
    elif value:  # a module of the code itself
        yield shell.follow(value.replace(".", "/") + ".py", line, "python")
        yield shell.follow(value.replace(".", "/") + "/__main__.py", line, "python")


def _shell(name: str, args: Sequence[str], line: int, shell: _Shell) -> Iterator[Event]:
    """`bash [options] SCRIPT`, `bash -c TEXT`, `source SCRIPT`, `eval WORDS`."""
    if name == "eval":
        yield from _shifted(_script(" ".join(args), shell.child(share=True)), line - 1)
        return
    text_follows, i = False, 0
    while i < len(args) and name not in ("source", "."):
        arg = args[i]
        if not arg.startswith(("-", "+")) or arg in ("-", "--"):
            break
        if arg in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 1
        text_follows = text_follows or (not arg.startswith("--") and "c" in arg)
        i += 1
    if args[i : i + 1] == ["--"]:
        i += 1
    if i >= len(args):
        return
    if text_follows:
        yield from _shifted(_script(args[i], shell.child(share=False)), line - 1)
    else:
        yield shell.follow(args[i], line, "shell")


def _shifted(events: Iterator[Event], by: int) -> Iterator[Event]:
    for event in events:
        yield dataclasses.replace(event, line=event.line + by)


def _unwrapped(words: list[str], lines: list[int]) -> tuple[list[str], list[int]]:
    """The command without its prefixes: from its command word on ([] if it runs nothing)."""
    for _ in range(MAX_EXPANSIONS):
        skip = _prefix_length(words, lines)
        if skip is None:
            return [], []
        if skip == 0:
            return words, lines
        words, lines = words[skip:], lines[skip:]
    return words, lines


def _prefix_length(words: list[str], lines: list[int]) -> int | None:
    """How many words come before the command word here; None: the command runs nothing."""
    if not words:
        return 0
    first, name = words[0], posixpath.basename(words[0])
    if _assignment(first) or first in RESERVED:
        return 1
    if first == "function":
        return 2
    if name == "command" and len(words) > 1 and words[1] in ("-v", "-V"):
        return None
    if name in RUNNERS:
        run = next((i for i, word in enumerate(words) if word == "run"), None)
        return 0 if run is None else run + 1 + _options(words[run + 1 :], RUNNER_VALUES, 0)
    if name == "env":
        for i, word in enumerate(words[1:], 1):
            if word in ("-S", "--split-string") and i + 1 < len(words):
                words[i + 1 : i + 2] = words[i + 1].split()
                lines[i + 1 : i + 2] = [lines[i + 1]] * (len(words) - len(lines) + 1)
                return i + 1
            if not word.startswith("-"):
                break
    if name in WRAPPERS:
        values, operands = WRAPPERS[name]
        return 1 + _options(words[1:], values, operands, name in ("env", "sudo"))
    return 0


def _options(words: Sequence[str], values: frozenset[str], operands: int, env: bool = False) -> int:
    """How many words a wrapper's options (and NAME=value settings, for env and sudo) and its
    operands take, before the command it runs."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            i += 1
            break
        if word in values:
            i += 2
        elif (word.startswith("-") and len(word) > 1) or (env and _assignment(word)):
            i += 1
        else:
            break
    return min(i + operands, len(words))


def _assignment(word: str) -> bool:
    name, equals, _ = word.partition("=")
    return bool(equals) and name.removesuffix("+").isidentifier()


def _assign(words: Sequence[str], variables: dict[str, str]) -> None:
    """NAME=value, in order (a later one sees an earlier one); a long value is cut short."""
    for word in words:
        name, _, value = word.partition("=")
        name = name.removesuffix("+")
        if name in variables or len(variables) < MAX_VARIABLES:
            variables[name] = (_value(value, variables) or value)[:MAX_VALUE]


def _expanded(command: Command, variables: Mapping[str, str]) -> tuple[list[str], list[int]]:
    """Variables expanded: a word that is only `$X` (or `${X}`, `${X[@]}`) becomes the words of
    X's value; in other words, known variables are put in place."""
    words: list[str] = []
    lines: list[int] = []
    room = MAX_EXPANDED
    for word, line in zip(command.words, command.lines, strict=True):
        value = _value(word, variables) if room > 0 else None
        room -= len(value or "")
        if value is None:
            words.append(word)
            lines.append(line)
        elif _reference(word):
            values = value.split()
            words += values
            lines += [line] * len(values)
        else:
            words.append(value)
            lines.append(line)
    return words, lines


def _value(text: str, variables: Mapping[str, str]) -> str | None:
    """The text with the script's variables in place; None where it is only a reference to a
    variable the script never set (and has no `${X:-default}`)."""
    reference = _reference(text)
    if reference is None:
        return _substituted(text, variables)
    name, default = reference
    if name in variables:
        return variables[name]
    return None if default is None else _substituted(default, variables)


def _reference(word: str) -> tuple[str, str | None] | None:
    """(X, its default), where the word is `$X`, `${X}`, `${X[@]}` (`[*]`, `[0]`) or
    `${X:-default}` (`${X-default}`)."""
    if word.startswith("${") and word.endswith("}"):
        name, dash, default = word[2:-1].partition("-")
        name = name.removesuffix(":")
        for index in ("[@]", "[*]", "[0]"):
            name = name.removesuffix(index)
        return (name, default if dash else None) if name.isidentifier() else None
    name = word[1:]
    return (name, None) if word.startswith("$") and name.isidentifier() else None


def _substituted(text: str, variables: Mapping[str, str]) -> str:
    if "$" not in text or text.count("$") > MAX_REFERENCES:
        return text
    return string.Template(text).safe_substitute(variables)
