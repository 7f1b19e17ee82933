"""Per-rank wrapper that torchrun starts instead of the user's script (`-m container_entry.worker`).

It runs the script unchanged as its child and adds what torchrun lacks: every line tagged with
host and rank and forwarded at once, the full log in a per-rank file, and a result record (exit
status, signal, the exception type and message parsed from the traceback the script printed)
that the bootstrap turns into a failure file. Stdlib only: it starts in milliseconds.

Stop signals: torchrun signals each worker's process group, which holds this wrapper and the
script alike, so the wrapper does not forward them (that would deliver them twice); it only
records that a stop was requested and waits for the script to finish its handler.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

RUN_DIR_ENV = "_CONTAINER_ENTRY_RUN_DIR"
STACKS_ENV = "_CONTAINER_ENTRY_STACKS"  # read by _site/sitecustomize.py in the script's Python
SITE_DIR = str(Path(__file__).resolve().parent / "_site")
CONSOLE_ENV = "_CONTAINER_ENTRY_CONSOLE_RANKS"  # "all" or a comma list of global ranks
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")


_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")  # torch.distributed's excepthook adds it


def parse_exception(stderr_tail: list[str]) -> dict[str, str] | None:
    """The last Python traceback in the output: its exception type and message."""
    stderr_tail = [_RANK_PREFIX.sub("", line) for line in stderr_tail]
    start = None
    for index, line in enumerate(stderr_tail):
        if line.startswith("Traceback (most recent call last):"):
            start = index
    if start is None:
        return None
    for line in stderr_tail[start + 1 :]:
        if line.startswith((" ", "\t")) or not line.strip():
            continue  # frames and source lines are indented
        match = _EXCEPTION_LINE.match(line.rstrip())
        if match:
            return {"type": match.group(1), "message": (match.group(2) or "").strip()}
    return None


def fatal_error(stderr_tail: list[str]) -> str | None:
    """faulthandler's 'Fatal Python error: Segmentation fault' line, if the script crashed."""
    for line in reversed(stderr_tail):
        if line.startswith("Fatal Python error:"):
            return line.split(":", 1)[1].strip()
    return None


def _shown(rank: int) -> bool:
    spec = os.environ.get(CONSOLE_ENV, "all").strip().lower()
    return spec in ("", "all") or str(rank) in {item.strip() for item in spec.split(",")}


@dataclass
class _Sink:
    """Where one stream of the script goes: the console (tagged, if shown) and the rank log."""

    out: IO[str]
    prefix: str
    log: IO[str]
    lock: threading.Lock
    show: bool
    tail: collections.deque[str] | None = None  # kept for the result record (stderr)

    def pump(self, stream: IO[bytes]) -> None:
        """Forward lines as they come: '\\n' or '\\r' ends a line so progress bars show too."""
        pending = b""
        while chunk := os.read(stream.fileno(), 65536):
            pending += chunk
            *lines, pending = re.split(rb"\r\n|\n|\r", pending)
            self.emit(lines)
        if pending:
            self.emit([pending])

    def emit(self, lines: list[bytes]) -> None:
        texts = [line.decode("utf-8", errors="replace") for line in lines]
        with self.lock:
            for text in texts:
                self.log.write(text + "\n")
                if self.show:
                    self.out.write(f"{self.prefix}{text}\n")
            self.log.flush()
            if self.show:
                self.out.flush()
        if self.tail is not None:
            self.tail.extend(texts)


def _write_json(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1))
    temporary.replace(path)  # atomic: the bootstrap never reads half a record


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m container_entry.worker SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script, *args = argv
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    host = os.environ.get("CURRENT_HOST") or os.environ.get("HOSTNAME", "localhost")
    run_dir = Path(os.environ.get(RUN_DIR_ENV) or ".")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    command = [sys.executable, "-u", script, *args] if script.endswith(".py") else [script, *args]
    env = dict(os.environ)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a segfault prints the Python stacks
    # stacks on demand (SIGUSR2) for the teardown report; appended, so a user's PYTHONPATH
    # entries (and their own sitecustomize) still come first
    (run_dir / "stacks").mkdir(exist_ok=True)
    env[STACKS_ENV] = str(run_dir / "stacks" / f"rank-{rank}.txt")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), SITE_DIR) if p)
    for name in (RUN_DIR_ENV, CONSOLE_ENV):
        env.pop(name, None)

    stop: dict[str, object] = {}

    def note_stop(signum: int, _frame: object) -> None:
        stop.setdefault("signal", signal.Signals(signum).name)
        stop.setdefault("at", time.time())

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, note_stop)

    started = time.time()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _write_json(
        run_dir / f"rank-{rank}.pid",
        {"rank": rank, "wrapper": os.getpid(), "child": child.pid, "host": host},
    )
    lock = threading.Lock()
    tail: collections.deque[str] = collections.deque(maxlen=400)
    show = _shown(rank)
    prefix = f"[{host} rank {rank}] "
    with open(run_dir / "logs" / f"rank-{rank}.log", "a", encoding="utf-8") as log:
        sinks = [
            (child.stdout, _Sink(sys.stdout, prefix, log, lock, show)),
            (child.stderr, _Sink(sys.stderr, prefix, log, lock, show, tail)),
        ]
        pumps = [
            threading.Thread(target=sink.pump, args=(stream,), daemon=True)
            for stream, sink in sinks
        ]
        for pump in pumps:
            pump.start()
        status = child.wait()
        for pump in pumps:
            pump.join(timeout=5)

    lines = list(tail)
    _write_json(
        run_dir / f"rank-{rank}.json",
        {
            "host": host,
            "rank": rank,
            "local_rank": local_rank,
            # torchrun's count on this host; a failure with restarts > 0 used them all up
            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
            "returncode": status,
            "signal": signal.Signals(-status).name if status < 0 else None,
            "exception": parse_exception(lines),
            "fatal_error": fatal_error(lines),
            "stop_signal": stop.get("signal"),
            "stop_requested_at": stop.get("at"),
            "started_at": started,
            "ended_at": time.time(),
            "stderr_tail": lines[-40:],
            "log": str(run_dir / "logs" / f"rank-{rank}.log"),
        },
    )
    if status < 0:  # die the same way so torchrun reports the real signal
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
