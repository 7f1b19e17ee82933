"""The API for training scripts, stable across releases: `from container_entry.hang import
report_progress` (docs/failure-stop-logs.md, "Hang watchdog"). A script that works silently for
long (an evaluation, a quiet data pass) calls it, or touches CONTAINER_ENTRY_PROGRESS_FILE, to
count as alive; a no-op outside container-entry. The watchdog itself is diagnose/hang.py.
"""

from container_entry.diagnose.hang import PROGRESS_ENV, report_progress

__all__ = ["PROGRESS_ENV", "report_progress"]
