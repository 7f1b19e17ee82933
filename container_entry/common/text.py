"""The one policy for the text the bootstrap writes, whatever names it holds.

File names, paths, environment values and arguments reach Python as `str` with every byte that
is not UTF-8 as a lone surrogate (PEP 383: `donn\\xe9es.csv` is 'donn\\udce9es.csv'), and JSON
may carry unpaired surrogates (`"\\ud800"`) too; a strict UTF-8 writer fails on both. So
everything the bootstrap writes as text (its stdout and stderr, the failure file, failure.json,
records, tracebacks) goes through the ESCAPE error handler: such a byte is written as `\\xNN`,
another lone surrogate as `\\udNNN`. What results is always valid UTF-8 (SageMaker reads the
failure file as text), never a crash, and the byte is still readable. A name put in a one-line
message goes through `quoted` (or `escaped`): the same, plus control characters escaped, so no
name can break a line. Bytes a rank printed are relayed unchanged.

The handler is registered with Python's codecs the first time it is needed (`register`), never
at import. Stdlib only: the per-rank wrapper uses it too. Beside it, two rules for reading text
that more than one module needs: `json_or_raw` (a value that may be JSON) and `names_host`.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

TRACEBACK = "Traceback (most recent call last):"  # the first line of a Python traceback

ESCAPE = "container-entry-escape"  # the error handler for every text the bootstrap writes


def _escape(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return "".join(map(_escaped_char, error.object[error.start : error.end])), error.end


def _escaped_char(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}"


_registered = False


def register() -> str:
    """The ESCAPE handler, registered with codecs once; its name, for `errors=`."""
    global _registered
    if not _registered:
        codecs.register_error(ESCAPE, _escape)
        _registered = True
    return ESCAPE


# what could end a line (str.splitlines' breaks, all of C0 and C1) or not be text at all
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` as it is written: lone surrogates as `\\xNN` / `\\udNNN` (valid UTF-8 anywhere)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", register()).decode("utf-8")
    return text


def escaped(text: str) -> str:
    """A name, path or value inside a one-line message: undecodable bytes as `\\xNN`, control
    characters and line breaks as `\\n`, `\\x1b`, ...; everything else as it is."""
    return _UNSAFE.sub(lambda match: _escaped_char(match.group()), text)


def quoted(text: str) -> str:
    """`escaped` in quotes: 'donn\\xe9es.csv'."""
    return f"'{escaped(text)}'"


def encoded(text: str) -> bytes:
    """Text of ours as bytes for a console or a log: UTF-8, lone surrogates as `\\xNN`."""
    return text.encode("utf-8", register())


def json_or_raw(text: str) -> Any:
    """`text` decoded as JSON, or `text` itself when it is not JSON: sagemaker-training's rule for
    a hyperparameter's value ('"bert"' is 'bert', '3' is 3, 'True' stays 'True'); the masking of
    secrets reads values by the same rule."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def names_host(text: str, host: str) -> bool:
    """Whether `text` names `host` as a word: algo-1 is named by 'on algo-1: ...' and 'on
    algo-1.', not by algo-10, algo-1-b or x.algo-1."""
    return re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", text) is not None
