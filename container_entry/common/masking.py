"""Which values are secrets, and masking them in everything the job prints or writes.

A name is a credential when one of its words (split on `_`, `-`, `.`, spaces and camelCase) is a
credential word (`token`, `secret`, `password`, ...) or two of them form one (`api key`,
`access key`, `private key`): `HF_TOKEN`, `wandbApiKey` and `db.password` are credentials,
`tokenizer_name`, `max_tokens` and `session_name` are not. A value is masked only when it could
be a credential at all: a string of at least MIN_SECRET_LENGTH characters, never a boolean or a
number (`use_auth_token=True` stays visible). Values nested in dicts and lists count by their
own key. Stdlib only: the per-rank worker masks its lines with it too.

A secret rarely appears only as itself: SM_HPS, SM_TRAINING_ENV and SM_USER_ARGS hold it
JSON-escaped, a printed dict or `os.environ` shows it as Python writes a string literal, and
those nest (`print(os.environ)` shows the repr of SM_HPS's JSON). So a Masker registers every
such form of each secret once, when the secret is added (`encoded_forms`), and masks them all,
in text and in the UTF-8 bytes the worker relays.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from container_entry.common.text import json_or_raw

MASK = "****"
MIN_SECRET_LENGTH = 8
# Plurals name collections of credentials (`secrets`, `passwords`), except `tokens`, which in
# ML names counts text (`max_tokens`, `num_tokens`).
_WORDS = frozenset(
    {
        *("token", "secret", "secrets", "password", "passwords", "passwd", "passwds"),
        *("passphrase", "passphrases", "credential", "credentials"),
    }
)
_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")})
_JOINED = frozenset({"apikey", "accesskey", "privatekey", "authtoken", "secretkey"})
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def name_words(name: str) -> list[str]:
    return [word.lower() for word in _SPLIT.split(name) if word]


def is_secret_name(name: str) -> bool:
    words = name_words(str(name))
    return any(word in _WORDS or word in _JOINED for word in words) or any(
        pair in _PAIRS for pair in itertools.pairwise(words)
    )


def could_be_secret(value: Any) -> bool:
    """Booleans, numbers and short strings are never treated as secrets."""
    return isinstance(value, str) and len(value) >= MIN_SECRET_LENGTH


def secret_values(pairs: Iterable[tuple[str, Any]]) -> list[str]:
    """Every credential value in (name, value) pairs, nested values included, longest first.

    A value that arrives JSON-encoded (SDK v2 sends '"sk-..."') counts decoded, and a JSON
    string that holds JSON once more (SDK v2 encoding a value that was JSON already) counts
    decoded again. These are the values themselves; a Masker adds every encoded form of them
    (`encoded_forms`).
    """
    found: set[str] = set()

    def visit(name: str, value: Any, inherited: bool) -> None:
        secret = inherited or is_secret_name(name)
        if isinstance(value, str):
            decoded = json_or_raw(value)
            if not isinstance(decoded, str):  # a JSON number, bool, object or list
                visit(name, decoded, secret)
                return
            if secret and could_be_secret(decoded):
                found.add(decoded)  # '"sk-..."' as SDK v2 sends it contains it too
            # a JSON string literal whose text is a JSON string, object or list: that counts
            # too (a number inside stays the string it was sent as)
            inner = json_or_raw(decoded) if decoded != value else decoded
            if inner != decoded and isinstance(inner, str | Mapping | list):
                visit(name, decoded, secret)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(str(key), item, secret)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(name, item, secret)

    for name, value in pairs:
        visit(str(name), value, False)
    return sorted(found, key=len, reverse=True)


# -- the forms a secret takes in output ------------------------------------------------------
# Each takes a string and returns how it looks inside a larger encoded text, so a secret is
# found wherever it sits in that text (between the quotes of a JSON string, a Python literal).


def _json_ascii(text: str) -> str:
    """Inside a JSON string as json.dumps writes it (SM_HPS, SM_TRAINING_ENV, SM_USER_ARGS,
    SM_HP_<dict>, failure.json): backslash, quote and control characters escaped, every
    non-ASCII letter as `\\u00e9` (an emoji as a surrogate pair)."""
    return json.dumps(text)[1:-1]


def _json_unicode(text: str) -> str:
    """The same with ensure_ascii=False: non-ASCII letters stay as they are."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _repr(text: str) -> str:
    """Inside a Python literal (a printed dict, list or os.environ): backslash and control
    characters escaped (`\\x07`); a quote not, as a literal holding only one kind uses the
    other for its own quotes."""
    return repr(text)[1:-1]


def _repr_quoted(text: str) -> str:
    """Inside a Python literal that holds both quote characters: `'` escaped as `\\'`."""
    return repr("\"'" + text)[4:-1]


_ENCODERS: tuple[Callable[[str], str], ...] = (_json_ascii, _json_unicode, _repr, _repr_quoted)


def _shell(text: str) -> str:
    """Inside a `shlex.quote`d argument: each `'` becomes `'"'"'`."""
    return text.replace("'", "'\"'\"'")


def _bytes_reprs(text: str) -> set[str]:
    """Inside a printed bytes literal (b'...', as HTTP libraries log headers): UTF-8 as `\\xc3`."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return set()
    return {repr(data)[2:-1], repr(b"\"'" + data)[5:-1]}


def encoded_forms(secret: str) -> set[str]:
    """`secret` and every form the bootstrap, torch or a rank's Python writes it in.

    - itself (without white space around it, when that leaves MIN_SECRET_LENGTH characters);
    - JSON-escaped, ensure_ascii True and False (the SM_* variables, failure.json, torch's
      error file), and with `/` as `\\/` (encoders that escape it);
    - Python's repr, with `'` escaped or not (a printed dict, list, os.environ);
    - two of those nested (JSON inside JSON: a JSON string that holds SM_TRAINING_ENV;
      the repr of JSON: `print(os.environ)` shows SM_HPS that way);
    - shell-quoted (`shlex.quote`);
    - a printed bytes literal of its UTF-8;
    - each line after the first indented by two spaces, as torch's failure report shows a
      rank's traceback;
    - its line ends as the worker's relay writes them (`\\r` and `\\r\\n` become `\\n`), and
      each of its lines of at least MIN_SECRET_LENGTH characters on its own: a multi-line
      secret (a PEM key) is masked line by line too, wherever output is cut into lines
      (`Masker.held` says what to hold back instead).
    """
    if not secret:
        return set()
    if len(secret.strip()) >= MIN_SECRET_LENGTH:  # a token read with its line end: the token
        secret = secret.strip()  # (masking the line end too would join two lines)
    forms = {secret}
    level = {encode(secret) for encode in _ENCODERS}
    forms |= level
    forms |= {encode(form) for form in level for encode in _ENCODERS}
    forms |= {form.replace("/", "\\/") for form in (_json_ascii(secret), _json_unicode(secret))}
    forms.add(_shell(secret))
    forms |= _bytes_reprs(secret)
    forms.add(secret.replace("\n", "\n  "))  # in torch's failure report, a rank's traceback
    forms |= {f.replace("\r\n", "\n").replace("\r", "\n") for f in list(forms) if "\r" in f}
    for form in (secret, _shell(secret)):
        lines = {line.strip() for line in _LINE_BREAK.split(form)}
        forms |= {line for line in lines if len(line) >= MIN_SECRET_LENGTH}
    return forms


def _line_starts(form: bytes) -> set[bytes]:
    """The starts of a multi-line form that end at one of its line ends, each long enough to
    tell apart from ordinary output (MIN_SECRET_LENGTH characters besides white space)."""
    starts = set()
    for end, byte in enumerate(form[:-1]):
        if byte in b"\n\r" and len(form[: end + 1].strip()) >= MIN_SECRET_LENGTH:
            starts.add(form[: end + 1])
    return starts


def _utf8_forms(form: str) -> set[bytes]:
    """`form` as bytes in a UTF-8 stream: surrogate escapes (undecodable bytes of the
    environment) as the bytes they stand for; a lone surrogate as Python writes it with
    `backslashreplace` and with `surrogatepass`."""
    try:
        return {form.encode("utf-8", "surrogateescape")}
    except UnicodeEncodeError:
        return {form.encode("utf-8", "surrogatepass"), form.encode("utf-8", "backslashreplace")}


_T = TypeVar("_T", str, bytes)


def _masked(text: _T, forms: Sequence[_T], mask: _T) -> _T:
    """Every occurrence of every form replaced by one mask; overlapping or touching occurrences
    (a secret inside another, two secrets that share characters) become one mask, so no part
    of either is left visible whatever the order."""
    present = [form for form in forms if form in text]
    if not present:
        return text
    spans: list[tuple[int, int]] = []
    for form in present:
        start = text.find(form)
        while start != -1:
            spans.append((start, start + len(form)))
            start = text.find(form, start + 1)
    spans.sort()
    parts: list[_T] = []
    done = 0  # text[:done] is handled
    begin, end = spans[0]
    for start, stop in spans[1:]:
        if start <= end:
            end = max(end, stop)
            continue
        parts += [text[done:begin], mask]
        done, (begin, end) = end, (start, stop)
    parts += [text[done:begin], mask, text[end:]]
    return text[:0].join(parts)


def mask_text(text: str, secrets: Sequence[str]) -> str:
    """`text` with every occurrence of the given strings (use a Masker for every encoded form
    of a secret) replaced by MASK."""
    return _masked(text, [secret for secret in secrets if secret], MASK)


def masked_object(obj: Any, secrets: Sequence[str]) -> Any:
    """Mask every secret inside the strings of a JSON-like structure, keys included (SM_HPS
    embeds them); masked before it is encoded, as `Masker` forms match encoded text too."""
    if isinstance(obj, str):
        return mask_text(obj, secrets)
    if isinstance(obj, dict):
        return {masked_object(k, secrets): masked_object(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [masked_object(v, secrets) for v in obj]
    return obj


# Printable ASCII that no encoding above changes (all but `"`, `'`, `/` and `\\`): a run of it
# in a secret is in most of its forms as it is, so one search for it rules out all of them.
_PLAIN_RUN = re.compile(r"[\x20\x21\x23-\x26\x28-\x2e\x30-\x5b\x5d-\x7e]+")


def _anchor(text: str) -> str:
    """The longest plain run in `text`; empty when it has none."""
    return max(_PLAIN_RUN.findall(text), key=len, default="")


class Masker:
    """Masks registered secrets in text, and in bytes for the worker's line relay, in every
    form (`encoded_forms`): registering a secret adds them all, longest first.

    The forms of one secret are searched for only where their anchor (the secret's longest
    plain run, which they hold unchanged) occurs: output with no secret in it costs about one
    search per secret, however many forms it has."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets: list[str] = []  # every form of every secret, longest first
        self._groups: dict[str, set[str]] = {}  # anchor -> the forms that hold it
        self._text: list[tuple[str, list[str]]] = []
        self._bytes: list[tuple[bytes, list[bytes]]] = []
        self._starts: list[bytes] = []  # the first lines of multi-line forms (held)
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        for secret in secrets:
            if not isinstance(secret, str) or not secret:
                continue
            anchor = _anchor(secret)
            for form in encoded_forms(secret):
                key = anchor if anchor and anchor in form else _anchor(form) or form
                self._groups.setdefault(key, set()).add(form)
        forms = {form for group in self._groups.values() for form in group}
        self.secrets = sorted(forms, key=_longest_first)
        self._text = [
            (key, sorted(group, key=_longest_first)) for key, group in self._groups.items()
        ]
        self._bytes = []
        for key, group in self._groups.items():
            encoded = {data for form in group for data in _utf8_forms(form)}
            if _PLAIN_RUN.fullmatch(key):  # ASCII: in every encoding of every form
                self._bytes.append((key.encode("ascii"), sorted(encoded, key=_longest_first)))
            else:
                self._bytes += [(data, [data]) for data in encoded]
        starts = {
            start for _, group in self._bytes for form in group for start in _line_starts(form)
        }
        self._starts = sorted(starts, key=_longest_first)

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, text: str) -> str:
        return _masked(text, [f for key, group in self._text if key in text for f in group], MASK)

    def data(self, data: bytes) -> bytes:
        found = [form for key, group in self._bytes if key in data for form in group]
        return _masked(data, found, MASK.encode())

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` (whole lines of a stream) to hold back until
        more arrives: they are the first lines of a multi-line secret, whose rest a stream cut
        into reads may bring next. 0 when no secret spans lines, or the end looks like none."""
        for start in self._starts:
            if data.endswith(start):
                return len(start)
        return 0

    def obj(self, obj: Any) -> Any:
        return masked_object(obj, self.secrets)


def _longest_first(form: _T) -> tuple[int, _T]:
    return -len(form), form


def argv_pairs(args: Sequence[str]) -> list[tuple[str, str]]:
    """(name, value) for `--name value` and `--name=value` in a command line, so a credential
    passed as an argument (`train train.py --hf_token ...`) is masked like a hyperparameter."""
    pairs = []
    for index, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, equals, value = arg.lstrip("-").partition("=")
        if equals:
            pairs.append((name, value))
        elif index + 1 < len(args):
            pairs.append((name, args[index + 1]))
    return pairs
