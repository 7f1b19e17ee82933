"""What the image's SDK v3 hook (BASH_ENV, docker/sdk-hook.bash) costs every other process.

    python -m scripts.bench.sdk_hook --image container-entry:bench [--calls 400 --rounds 7]
    python -m scripts.bench.sdk_hook --instructions   (this machine's bash, valgrind)

Inside one container of the image, each kind of start is timed `--calls` times in a row, with
the image's BASH_ENV and without it (`env -u BASH_ENV`), the two alternated round after round;
the table gives the median time per start of each and their ratio. Kinds: `bash -c :` (any
bash command that is not PID 1: BASH_ENV expands to a name that does not exist), a bash script
(BASH_ENV expands to nothing), `sh -c :` (dash never reads it), `python3 -c pass`, and `bash -c
:` reading the hook itself, which only a PID 1 `bash -c` does (the SDK's start, or `docker run
--entrypoint bash IMAGE -c ...`). Wall time is noisy; `--instructions` counts what this
machine's bash executes (valgrind's callgrind: the same count on every run) with the image's
BASH_ENV value (read from docker/Dockerfile) and without. docs/benchmarks.md ("SDK v3 hook")
has a run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK = "/etc/container-entry/pid1"
DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "Dockerfile"
KINDS = {
    "bash -c : (not PID 1)": "bash -c :",
    "bash script.sh": "bash /tmp/script.sh",
    "sh -c :": "sh -c :",
    "python3 -c pass": "python3 -c pass",
}
# the same `bash -c :`, made to read the hook as a PID 1 `bash -c` does (BASH_ENV = the file)
AS_PID1 = "bash -c : reading the hook (PID 1 only)"

LOOP = r"""
echo : > /tmp/script.sh
with="$BASH_ENV"
time_it() {  # label, variant, command...: nanoseconds for $CALLS starts
    local label=$1 variant=$2; shift 2
    local start end
    start=$(date +%s%N)
    for _ in $(seq "$CALLS"); do "$@"; done
    end=$(date +%s%N)
    echo "T|$label|$variant|$((end - start))"
}
for round in $(seq "$ROUNDS"); do
    while IFS='|' read -r label command; do
        # shellcheck disable=SC2086
        if [ $((round % 2)) = 0 ]; then
            time_it "$label" with env BASH_ENV="$with" $command
            time_it "$label" without env -u BASH_ENV $command
        else
            time_it "$label" without env -u BASH_ENV $command
            time_it "$label" with env BASH_ENV="$with" $command
        fi
    done <<EOF
$KINDS
EOF
    if [ $((round % 2)) = 0 ]; then
        time_it "$AS_PID1" with env BASH_ENV="$HOOK" bash -c :
        time_it "$AS_PID1" without env -u BASH_ENV bash -c :
    else
        time_it "$AS_PID1" without env -u BASH_ENV bash -c :
        time_it "$AS_PID1" with env BASH_ENV="$HOOK" bash -c :
    fi
done
"""


def measure(image: str, calls: int, rounds: int) -> dict[tuple[str, str], list[float]]:
    """Milliseconds per start, per (kind, with/without), one figure per round."""
    kinds = "\n".join(f"{label}|{command}" for label, command in KINDS.items())
    result = subprocess.run(
        [
            "docker", "run", "--rm", "--entrypoint", "bash",
            "-e", f"CALLS={calls}", "-e", f"ROUNDS={rounds}", "-e", f"KINDS={kinds}",
            "-e", f"HOOK={HOOK}", "-e", f"AS_PID1={AS_PID1}",
            image, "-c", LOOP,
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        sys.exit(f"docker run failed ({result.returncode}): {result.stderr[-2000:]}")
    figures: dict[tuple[str, str], list[float]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("T|"):
            _, label, variant, nanoseconds = line.split("|")
            figures.setdefault((label, variant), []).append(int(nanoseconds) / calls / 1e6)
    return figures


def table(figures: dict[tuple[str, str], list[float]], calls: int, rounds: int) -> str:
    lines = [
        f"| start ({calls} in a row, median of {rounds} rounds) | with BASH_ENV (ms) "
        "| without (ms) | ratio |",
        "|---|---|---|---|",
    ]
    for label in [*KINDS, AS_PID1]:
        with_ = statistics.median(figures[(label, "with")])
        without = statistics.median(figures[(label, "without")])
        lines.append(f"| `{label}` | {with_:.3f} | {without:.3f} | {with_ / without:.3f} |")
    return "\n".join(lines)


def image_bash_env() -> str:
    """BASH_ENV's value as docker/Dockerfile sets it (Docker's `\\$` escapes undone)."""
    found = re.search(r'^ENV BASH_ENV="(.*)"$', DOCKERFILE.read_text(), re.M)
    if found is None:
        sys.exit(f"{DOCKERFILE}: no ENV BASH_ENV line")
    return found.group(1).replace("\\$", "$")


def instructions(argv: list[str], bash_env: str | None) -> int:
    """Instructions `argv` executes in user space (callgrind), with BASH_ENV or without."""
    env = {k: v for k, v in os.environ.items() if k != "BASH_ENV"}
    if bash_env is not None:
        env["BASH_ENV"] = bash_env
    result = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = re.search(r"refs:\s+([\d,]+)", result.stderr)
    if found is None:
        sys.exit(f"valgrind gave no count: {result.stderr[-1000:]}")
    return int(found.group(1).replace(",", ""))


def instruction_table() -> str:
    if shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (apt-get install valgrind)")
    value = image_bash_env()
    version = subprocess.run(["bash", "--version"], capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "script.sh"
        script.write_text(":\n")
        kinds = {"bash -c :": ["bash", "-c", ":"], "bash script.sh": ["bash", str(script)]}
        lines = [
            f"{version.splitlines()[0]}; BASH_ENV={value}",
            "",
            "| start | with BASH_ENV (instructions) | without | ratio |",
            "|---|---|---|---|",
        ]
        for label, argv in kinds.items():
            with_, without = instructions(argv, value), instructions(argv, None)
            lines.append(f"| `{label}` | {with_:,} | {without:,} | {with_ / without:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="time the starts inside a container of this image")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--instructions", action="store_true", help="count with valgrind here")
    args = parser.parse_args(argv)
    if not args.image and not args.instructions:
        parser.error("--image IMAGE and/or --instructions")
    if args.instructions:
        print(instruction_table())
    if args.image:
        print(table(measure(args.image, args.calls, args.rounds), args.calls, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
