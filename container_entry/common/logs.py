"""What the bootstrap itself prints: one prefix, flushed at once, secrets masked."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable

from container_entry.common.masking import Masker

# every line of ours starts with it: the bootstrap's, and those we print into a rank's own output
# (the preflight's, the rank wrapper's, the script's exit teardown), which a failure's hint and
# last words must never take for the script's (`ours`)
PREFIX = "[container-entry]"
# every secret the plan found, in every form it is shown in (masking.encoded_forms): applied to
# each line and file we write and to torchrun's output (supervise.torchrun_output)
MASKER = Masker()


def register_secrets(values: Iterable[str]) -> None:
    """Remember credential values so no line or file of the bootstrap ever shows them, in any
    form: as they are, JSON-escaped (SM_HPS, ...), as Python writes them, shell-quoted."""
    MASKER.add(values)


def ours(line: str) -> bool:
    """A line we printed, not the script (PREFIX)."""
    return line.lstrip().startswith(PREFIX)


def masked_text(text: str) -> str:
    return MASKER.text(text)


def log(message: str) -> None:
    """Each line prefixed, masked, and written in one batch under the console's lock, so it
    never lands inside a rank's line longer than a pipe takes at once (console.locked_write)."""
    from container_entry.common.console import locked_write
    from container_entry.common.text import encoded

    text = "".join(f"{PREFIX} {line}\n" for line in masked_text(message).splitlines() or [""])
    stream = sys.stderr
    if stream is None:  # no stderr at all: the failure file still says it
        return
    shared = stream is sys.__stderr__  # else replaced (a test's capture): no console to share
    if not shared:
        print(text, end="", file=stream, flush=True)
        return
    with contextlib.suppress(OSError, ValueError):  # a console nobody reads: the failure file
        stream.flush()  # still says it
        locked_write(2, encoded(text))
