"""`make run`: the image on a local machine's GPUs with the user's script, no shell involved.

SCRIPT (a path under the current directory) and ARGS arrive as environment variables; ARGS is
split with shlex (quotes honoured, nothing evaluated) and passed to docker as an argv list.
"""

import os
import shlex
import sys
from pathlib import Path


def main() -> int:
    image = os.environ["RUN_IMAGE"]
    script = Path(os.environ["RUN_SCRIPT"])
    if not script.is_file():
        print(f"make run: SCRIPT={script} is not a file", file=sys.stderr)
        return 2
    cwd = Path.cwd()
    try:
        relative = script.resolve().relative_to(cwd)
    except ValueError:
        print(
            f"make run: SCRIPT={script} must be under {cwd} (mounted at /opt/ml/code)",
            file=sys.stderr,
        )
        return 2
    argv = [
        "docker",
        "run",
        "--rm",
        "--shm-size",
        "1g",
        "-v",
        f"{cwd}:/opt/ml/code",
        "-w",
        "/opt/ml/code",
    ]
    if os.environ.get("RUN_GPUS", "all") != "none":
        argv += ["--gpus", os.environ.get("RUN_GPUS", "all")]
    argv += [
        image,
        "train",
        f"/opt/ml/code/{relative}",
        *shlex.split(os.environ.get("RUN_ARGS", "")),
    ]
    print("+ " + shlex.join(argv), flush=True)
    os.execvp(argv[0], argv)
    return 127


if __name__ == "__main__":
    sys.exit(main())
