"""Shell text as simple commands and their words, split the way bash splits them, so that what a
script runs is judged from its commands (plan/shell_commands), never from patterns over lines:
a launcher's name in a comment, a quote or a here-document is then no command.

shlex does the quoting and escaping; it is no shell, so this module adds what bash does and
shlex does not:
- a newline ends a command (it is an operator here, like `;`), and a comment keeps its newline;
- backslash-newline joins two lines (outside single quotes);
- `#` starts a comment only where a word could start (`$#` and `${x#y}` are words);
- each word knows its line (shlex's own count goes wrong with a newline operator);
- here-document bodies are skipped unread;
- `( )`, `$( )`, backquotes and `NAME=( ... )` arrays; redirections and their targets dropped;
- an unclosed quote spoils its own line only: reading goes on from the next one.
"""

from __future__ import annotations

import bisect
import shlex
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import NamedTuple

OPERATORS = "();<>|&\n"
MAX_NESTING = 8  # substitutions inside quoted words inside substitutions ...
_SUBSTITUTED = "(...)"  # what a `$( )` leaves in its word: a value nobody knows


@dataclass(frozen=True)
class Command:
    """One simple command: its words (quotes removed) and the line of each."""

    words: tuple[str, ...]
    lines: tuple[int, ...]


class Budget:
    """The characters one search may still split, nested texts included, so that hostile text
    (substitutions within substitutions, a long variable run by a thousand `eval`s) costs a
    bounded time."""

    def __init__(self, chars: int) -> None:
        self.left = chars

    def take(self, text: str) -> str:
        """As much of the text as the budget still allows (all of it, while it lasts)."""
        allowed = text[: max(self.left, 0)]
        self.left -= len(allowed)
        return allowed


class Token(NamedTuple):
    text: str
    operator: bool
    start: int  # offset in the text of its first character
    end: int  # offset of the character that ended it


class _Lexer(shlex.shlex):
    """shlex, where `#` starts a comment only between words, as in bash."""

    state: str | None  # shlex's own: " " between words, "a" in a word, "c" in an operator, ...

    @property
    def commenters(self) -> str:
        return "" if self.state == "a" else "#"

    @commenters.setter
    def commenters(self, value: str) -> None:
        """shlex sets its `#` at the start; the property above decides instead."""


class _Source:
    """The text as the lexer reads it, one character at a time, with every position known:
    a line continuation is skipped before the lexer sees it, a comment is read up to (not
    through) its newline, and `first` is where the token being read began."""

    def __init__(self, text: str, start: int) -> None:
        self.text, self.pos = text, start
        self.last = start  # the last character read
        self.first = -1  # the last character read between words that was not a blank
        self.lexer: _Lexer | None = None

    def read(self, size: int = 1, /) -> str:
        text, pos = self.text, self.pos
        state = self.lexer.state if self.lexer else " "
        if state not in ("'", "\\"):
            while text.startswith("\\\n", pos):
                pos += 2
        char = text[pos : pos + 1]
        self.last, self.pos = pos, pos + len(char)
        if state == " " and char and char not in " \t\r\f\v":
            self.first = pos
        return char

    def readline(self) -> str:
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end < 0 else end
        comment, self.pos = self.text[self.pos : end], end
        return comment

    def close(self) -> None:
        """Nothing to close: shlex's protocol."""


def tokens(text: str) -> Iterator[Token]:
    """Words and operators, in order; a here-document's body or a line with an unclosed quote
    ends one lexer's run, and a fresh one starts after it."""
    pos = 0
    while pos < len(text):
        pos = yield from _run(text, pos)


def _run(text: str, start: int) -> Generator[Token, None, int]:
    source = _Source(text, start)
    lexer = _Lexer(source, posix=True, punctuation_chars=OPERATORS)
    source.lexer = lexer
    lexer.whitespace, lexer.whitespace_split = " \t\r\f\v", True
    heredocs: list[tuple[str, bool]] = []  # (delimiter, tabs stripped) awaiting their bodies
    awaiting: tuple[int, bool] | None = None  # after a `<<`: where it ended, whether `<<-`
    while True:
        carried, source.first = source.last, -1  # a pushed-back character starts the token
        try:
            value = lexer.get_token()
        except ValueError:  # an unclosed quote or a trailing backslash: skip its line
            begin = source.first if source.first >= 0 else carried
            yield Token("\n", True, begin, begin)
            return _next_line(text, begin)
        if value is None:
            return len(text)
        begin = source.first if source.first >= 0 else carried
        token = Token(value, text[begin : begin + 1] in OPERATORS, begin, source.last)
        if awaiting is not None and not token.operator:
            awaiting = _delimiter(token, awaiting, heredocs)
            continue
        awaiting = None
        if token.operator and "<<" in value and "<<<" not in value:
            awaiting = (token.end, False)
        elif token.operator and "\n" in value and heredocs:
            newline = text.find("\n", token.start)
            yield token._replace(text=value[: value.index("\n") + 1])
            return _after_heredocs(text, newline + 1, heredocs)
        yield token


def _delimiter(
    token: Token, awaiting: tuple[int, bool], heredocs: list[tuple[str, bool]]
) -> tuple[int, bool] | None:
    """Take a here-document's delimiter (`<<-` strips tabs from its lines); still awaiting it
    after a `<<-` written with a blank before the word."""
    end, dash = awaiting
    value = token.text
    if token.start == end and value.startswith("-") and not dash:
        dash, value = True, value[1:]
    if not value:
        return token.end, dash
    heredocs.append((value, dash))
    return None


def _next_line(text: str, pos: int) -> int:
    newline = text.find("\n", pos)
    return len(text) if newline < 0 else newline + 1


def _after_heredocs(text: str, pos: int, heredocs: list[tuple[str, bool]]) -> int:
    """Where the text goes on after the bodies of these here-documents, which start at pos."""
    for delimiter, strip_tabs in heredocs:
        while pos < len(text):
            end = _next_line(text, pos)
            line = text[pos:end].rstrip("\n")
            pos = end
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                break
    return pos


def commands(text: str, budget: Budget, first_line: int = 1, nesting: int = 0) -> Iterator[Command]:
    """The simple commands of a shell text, in the order they start; the commands inside a
    substitution come before the command whose word it is, as bash runs them."""
    text = budget.take(text)
    newlines = []
    found = text.find("\n")
    while found >= 0:
        newlines.append(found)
        found = text.find("\n", found + 1)
    grouper = _Grouper(budget, nesting)
    for token in tokens(text):
        line = bisect.bisect_right(newlines, token.start) + first_line
        if token.operator:
            yield from grouper.operator(token, line)
        else:
            yield from grouper.word(token, line)
    yield from grouper.finish()


class _Frame(NamedTuple):
    words: list[str]
    lines: list[int]
    kind: str  # "(" a subshell, "$(" a substitution, "`" a backquoted one


class _Grouper:
    """Tokens into simple commands: separators end one, brackets nest, redirections go."""

    def __init__(self, budget: Budget, nesting: int) -> None:
        self.budget, self.nesting = budget, nesting
        self.words: list[str] = []
        self.lines: list[int] = []
        self.frames: list[_Frame] = []
        self.target = False  # the next word is a redirection's target
        self.array: list[str] | None = None  # `NAME=` and the values of `NAME=( ... )` so far
        self.array_line = 0
        self.glue = -1  # where a word would continue the last one (after `$( )`)
        self.previous: Token | None = None

    def word(self, token: Token, line: int) -> Iterator[Command]:
        previous, self.previous = self.previous, token
        if self.target:
            self.target = False
            return
        if self.array is not None:
            self.array.append(token.text)
            return
        if self.nesting < MAX_NESTING:
            for offset, inner in _substitutions(token.text):
                yield from commands(inner, self.budget, line + offset, self.nesting + 1)
        if token.text.count("`") % 2:
            yield from self._backquoted(token.text, line)
        elif token.start == self.glue and self.words and previous and previous.operator:
            self.words[-1] += token.text
        else:
            self.words.append(token.text)
            self.lines.append(line)

    def operator(self, token: Token, line: int) -> Iterator[Command]:
        previous, self.previous = self.previous, token
        adjacent = previous is not None and not previous.operator and previous.end == token.start
        text, i = token.text, 0
        while i < len(text):
            char = text[i]
            if self.array is not None:  # inside `NAME=( ... )` only `)` counts
                if char == ")":
                    self._end_array()
                i += 1
                continue
            if char in "<>" or text.startswith("&>", i):
                i = self._redirection(text, i, adjacent, line)
                continue
            if char == "(":
                yield from self._open(adjacent and i == 0)
            elif char == ")":
                yield from self._close(token.end)
            else:
                yield from self._flush()
            i += 1

    def finish(self) -> Iterator[Command]:
        if self.array is not None:
            self._end_array()
        while self.frames:
            yield from self._close(-1)
        yield from self._flush()

    def _redirection(self, text: str, i: int, adjacent: bool, line: int) -> int:
        """Drop the redirection (and its file descriptor); the next word is its target, but a
        here-document's delimiter the lexer has already taken."""
        end = i
        while end < len(text) and text[end] in "<>&|":
            end += 1
        if adjacent and i == 0 and self.words and self.words[-1].isdigit():
            self.words.pop()
            self.lines.pop()
        if end < len(text) and text[end] == "(" and end == i + 1:  # <( ) and >( )
            self.words.append(text[i] + _SUBSTITUTED)
            self.lines.append(line)
            self._push("$(")
            return end + 1
        operator = text[i:end]
        self.target = not ("<<" in operator and "<<<" not in operator)
        return end

    def _open(self, adjacent: bool) -> Iterator[Command]:
        last = self.words[-1] if adjacent and self.words else ""
        if last.endswith("$"):
            self.words[-1] = last[:-1] + "$" + _SUBSTITUTED
            self._push("$(")
        elif last.endswith("=") and last.rstrip("+=").isidentifier():
            self.array, self.array_line = [self.words.pop()], self.lines.pop()
        else:
            yield from self._flush()
            self._push("(")

    def _close(self, end: int) -> Iterator[Command]:
        yield from self._flush()
        if self.frames:
            frame = self.frames.pop()
            self.words, self.lines = frame.words, frame.lines
            self.glue = end if frame.kind != "(" else -1

    def _end_array(self) -> None:
        """`NAME=( a b )` ends: one word, `NAME=a b`, its values split again where it is used."""
        if self.array:
            self.words.append(self.array[0] + " ".join(self.array[1:]))
            self.lines.append(self.array_line)
        self.array = None

    def _backquoted(self, word: str, line: int) -> Iterator[Command]:
        """A word with an unpaired backquote opens or closes a substitution across words."""
        parts = word.split("`")
        for i, part in enumerate(parts):
            if i and self.frames and self.frames[-1].kind == "`":
                yield from self._close(-1)
                if part and self.words:
                    self.words[-1] += part
                continue
            if i and parts[i - 1] and self.words:
                self.words[-1] += "`" + _SUBSTITUTED
                self._push("`")
            elif i:
                self.words.append("`" + _SUBSTITUTED)
                self.lines.append(line)
                self._push("`")
            if part:
                self.words.append(part)
                self.lines.append(line)

    def _push(self, kind: str) -> None:
        self.frames.append(_Frame(self.words, self.lines, kind))
        self.words, self.lines = [], []

    def _flush(self) -> Iterator[Command]:
        if self.words:
            yield Command(tuple(self.words), tuple(self.lines))
        self.words, self.lines = [], []


def _substitutions(word: str) -> Iterator[tuple[int, str]]:
    """The texts of the `$( )` and paired backquotes inside one word (a quoted one, where
    the lexer kept them whole), each with the lines before it in the word."""
    start, lines, counted = word.find("$("), 0, 0
    while start >= 0:
        depth, end = 0, start + 1
        while end < len(word):
            depth += {"(": 1, ")": -1}.get(word[end], 0)
            if depth == 0:
                break
            end += 1
        lines, counted = lines + word.count("\n", counted, start), start
        yield lines, word[start + 2 : end]
        start = word.find("$(", end)
    if word.count("`") % 2:
        return
    start, lines, counted = word.find("`"), 0, 0
    while start >= 0:
        end = word.find("`", start + 1)
        lines, counted = lines + word.count("\n", counted, start), start
        yield lines, word[start + 1 : end]
        start = word.find("`", end + 1)
