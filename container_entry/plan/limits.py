"""What a new process may be given: the kernel's limits on its arguments and environment, which
a huge hyperparameter (SM_HPS, SM_TRAINING_ENV, SM_HP_<NAME>, the script's arguments) can pass.
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_ARG_STRLEN = 131072  # Linux: the most bytes one argv or environment string may hold


def _size(text: str) -> int:
    """Bytes of `text` as the kernel gets it (an undecodable byte is one byte, as it came)."""
    return len(text.encode("utf-8", "surrogateescape"))


def oversized(
    environ: Mapping[str, str], command: Sequence[str], arg_max: int, user: Mapping[str, Any]
) -> str | None:
    """Why the workers could not be started with this environment and command line (the
    kernel's E2BIG), naming the variable or argument; None when they can."""
    biggest = max(user, key=lambda k: len(str(user[k])), default=None)
    culprit = (
        f" (hyperparameter {biggest!r} is {_size(str(user[biggest])):,} bytes)"
        if biggest is not None and _size(str(user[biggest])) > MAX_ARG_STRLEN // 4
        else ""
    )
    for name, value in environ.items():
        size = len(name.encode()) + len(value.encode("utf-8", "surrogateescape")) + 2
        if size > MAX_ARG_STRLEN:
            return (
                f"environment variable {name} is {size:,} bytes, over the kernel's limit of "
                f"{MAX_ARG_STRLEN:,} for one variable{culprit if name.startswith('SM_') else ''}"
            )
    for arg in command:
        size = len(arg.encode("utf-8", "surrogateescape")) + 1
        if size > MAX_ARG_STRLEN:
            return (
                f"script argument {arg[:40]!r}... is {size:,} bytes, over the kernel's limit of "
                f"{MAX_ARG_STRLEN:,} for one argument{culprit}"
            )
    total = sum(len(k) + len(v) + 2 + 8 for k, v in environ.items())
    total += sum(len(a) + 1 + 8 for a in command) + 8192  # what torchrun and Python add
    if total > arg_max:
        return (
            f"the workers' environment and arguments total {total:,} bytes, over the kernel's "
            f"limit of {arg_max:,}{culprit}"
        )
    return None
