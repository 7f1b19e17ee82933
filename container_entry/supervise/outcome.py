"""The outcome files SageMaker reads: `<base>/output/success`, or `<base>/output/failure` (its
first 1024 characters become the job's FailureReason) with `failure.json` beside the ranks'
records. Written once; a failure file the user's script wrote during this run is kept.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from container_entry.common.layout import RunDir
from container_entry.common.logs import MASKER, log, masked_text
from container_entry.common.text import escaped, register
from container_entry.supervise.ending import Verdict


class Outcome:
    """Writes the outcome once; keeps a failure file the user's script wrote during this run.
    The only writer of both files: every way a run ends reaches them as a Verdict (`write`)."""

    def __init__(self, base_dir: Path) -> None:
        self.output = base_dir / "output"
        self.record_path = RunDir.of(base_dir).failure_record
        self.started = time.time()
        self.written = False

    def _write(self, name: str | Path, text: str) -> None:
        try:
            path = self.output / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(masked_text(text), encoding="utf-8", errors=register())
        except OSError as error:
            log(f"cannot write {escaped(str(self.output / name))}: {error.strerror}")

    def write(self, verdict: Verdict, record: dict[str, Any] | None = None) -> int:
        """The verdict in the outcome files (`record`: failure.json's); its exit code."""
        if verdict.exit_code == 0:
            self._success()
        else:
            self._failure(verdict.reason, verdict.details, record)
        return verdict.exit_code

    def _success(self) -> None:
        self._write("success", "")
        self.written = True

    def _failure(
        self, reason: str, details: list[str] | None = None, record: dict[str, Any] | None = None
    ) -> None:
        self.written = True
        path = self.output / "failure"
        try:
            if path.stat().st_mtime >= self.started:
                log(f"keeping the failure file the script wrote: {escaped(str(path))}")
                return
        except OSError:
            pass
        text = "\n".join([reason, *(details or [])])
        self._write("failure", text.rstrip("\n") + "\n")
        if record is not None:  # masked before encoding: JSON escapes would hide a secret
            masked = MASKER.obj(record)
            self._write(self.record_path.relative_to(self.output), json.dumps(masked, indent=1))
