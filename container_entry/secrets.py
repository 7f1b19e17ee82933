"""Masking of credential-looking values in everything the bootstrap itself prints."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MASK = "****"
_SECRET_NAME = re.compile(
    r"(secret|passw(or)?d|token|credential|api_?key|access_?key|private_?key|session|auth)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def mask_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: (MASK if is_secret_name(k) and v not in ("", None) else v) for k, v in values.items()
    }


def mask_argv(argv: Sequence[str]) -> list[str]:
    """Mask the value that follows a secret-looking `--flag`, and `--flag=value` forms."""
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            masked.append(MASK)
            hide_next = False
            continue
        if arg.startswith("-") and "=" in arg:
            flag, _, _ = arg.partition("=")
            masked.append(f"{flag}={MASK}" if is_secret_name(flag) else arg)
            continue
        masked.append(arg)
        hide_next = arg.startswith("-") and is_secret_name(arg)
    return masked


def secret_values(values: Mapping[str, Any]) -> list[str]:
    """The values of credential-looking names, longest first, for replacing inside text."""
    found = {str(v) for k, v in values.items() if is_secret_name(k) and len(str(v)) >= 4}
    return sorted(found, key=len, reverse=True)


def redact(obj: Any, secrets: Sequence[str]) -> Any:
    """Replace every secret inside strings of a JSON-like structure (SM_HPS embeds them)."""
    if isinstance(obj, str):
        for secret in secrets:
            obj = obj.replace(secret, MASK)
        return obj
    if isinstance(obj, dict):
        return {k: redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v, secrets) for v in obj]
    return obj
