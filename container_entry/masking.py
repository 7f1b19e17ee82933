"""Which values are secrets, and masking them in everything the job prints or writes.

A name is a credential when one of its words (split on `_`, `-`, `.`, spaces and camelCase) is a
credential word (`token`, `secret`, `password`, ...) or two of them form one (`api key`,
`access key`, `private key`): `HF_TOKEN`, `wandbApiKey` and `db.password` are credentials,
`tokenizer_name`, `max_tokens` and `session_name` are not. A value is masked only when it could
be a credential at all: a string of at least MIN_SECRET_LENGTH characters, never a boolean or a
number (`use_auth_token=True` stays visible). Values nested in dicts and lists count by their
own key. Stdlib only: the per-rank worker masks its lines with it too.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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

    A value that arrives JSON-encoded (SDK v2 sends '"sk-..."') counts decoded.
    """
    found: set[str] = set()

    def visit(name: str, value: Any, inherited: bool) -> None:
        secret = inherited or is_secret_name(name)
        if isinstance(value, str):
            decoded = _decoded(value)
            if not isinstance(decoded, str):  # a JSON number, bool, object or list
                visit(name, decoded, secret)
            elif secret and could_be_secret(decoded):
                found.add(decoded)  # '"sk-..."' as SDK v2 sends it contains it too
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(str(key), item, secret)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(name, item, secret)

    for name, value in pairs:
        visit(str(name), value, False)
    return sorted(found, key=len, reverse=True)


def _decoded(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def mask_text(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact(obj: Any, secrets: Sequence[str]) -> Any:
    """Mask every secret inside the strings of a JSON-like structure (SM_HPS embeds them)."""
    if isinstance(obj, str):
        return mask_text(obj, secrets)
    if isinstance(obj, dict):
        return {k: redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v, secrets) for v in obj]
    return obj


class Masker:
    """Masks registered secret values in text; bytes too, for the worker's line relay."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets: list[str] = []
        self._bytes: list[bytes] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        merged = set(self.secrets) | {s for s in secrets if s}
        self.secrets = sorted(merged, key=len, reverse=True)
        self._bytes = [s.encode("utf-8", "surrogateescape") for s in self.secrets]

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, text: str) -> str:
        return mask_text(text, self.secrets)

    def data(self, data: bytes) -> bytes:
        for secret in self._bytes:
            if secret in data:
                data = data.replace(secret, MASK.encode())
        return data

    def obj(self, obj: Any) -> Any:
        return redact(obj, self.secrets)
