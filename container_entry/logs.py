"""What the bootstrap itself prints: one prefix, flushed at once, secrets masked."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

from container_entry.secrets import MASK, is_secret_name

PREFIX = "[container-entry]"
_secret_values: list[str] = []


def register_secrets(environ: Mapping[str, str], extra: Iterable[tuple[str, object]] = ()) -> None:
    """Remember values of credential-looking variables so no bootstrap line ever shows them."""
    pairs = list(environ.items()) + [(k, str(v)) for k, v in extra]
    for name, value in pairs:
        if is_secret_name(name) and len(value) >= 4 and value not in _secret_values:
            _secret_values.append(value)
    _secret_values.sort(key=len, reverse=True)


def redact(text: str) -> str:
    for value in _secret_values:
        text = text.replace(value, MASK)
    return text


def log(message: str) -> None:
    for line in redact(message).splitlines() or [""]:
        print(f"{PREFIX} {line}", file=sys.stderr, flush=True)
