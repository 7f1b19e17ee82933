"""What the bootstrap itself prints: one prefix, flushed at once, secrets masked."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from container_entry.masking import Masker

PREFIX = "[container-entry]"
MASKER = Masker()  # every secret the plan found; applied to each line and file we write


def register_secrets(values: Iterable[str]) -> None:
    """Remember credential values so no line or file of the bootstrap ever shows them."""
    MASKER.add(values)


def redact(text: str) -> str:
    return MASKER.text(text)


def log(message: str) -> None:
    for line in redact(message).splitlines() or [""]:
        print(f"{PREFIX} {line}", file=sys.stderr, flush=True)
