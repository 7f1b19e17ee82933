"""Rate-limited log lines about misbehaving peers, so a flood of strangers cannot fill the
log (docs/failure-stop-logs.md: 10 lines, then one every 6 s with a count of the rest)."""

from __future__ import annotations

import time

from container_entry.common.logs import log


class Quota:
    """`burst` lines at once, then one per `every` seconds; what is held back is counted and
    said with the next line."""

    def __init__(self, burst: int = 10, every: float = 6.0) -> None:
        self.burst, self.every = burst, every
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.held = 0

    def log(self, text: str) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) / self.every)
        self.stamp = now
        if self.tokens < 1:
            self.held += 1
            return
        self.tokens -= 1
        if self.held:
            text += f" ({self.held} more side-channel line(s) since were not logged)"
            self.held = 0
        log(f"side channel: {text}")
