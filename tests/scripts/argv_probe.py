"""Records exactly what the script received (argv, selected env) and optionally misbehaves.

PROBE_ACTION (environment): "ok" (default), "print-secret" (prints and raises with the value that
follows the argument named by PROBE_KEY_ARG in its own argv), "exit-message" (sys.exit with a
message), "strict" (argparse that refuses unknown arguments, as HfArgumentParser does).
"""

import json
import os
import sys

rank = os.environ.get("RANK", "0")
out = os.environ.get("SM_OUTPUT_DATA_DIR", ".")
with open(os.path.join(out, f"argv-rank-{rank}.json"), "w", encoding="utf-8") as handle:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd()}, handle)
action = os.environ.get("PROBE_ACTION", "ok")
if action == "print-secret":
    args = sys.argv[1:]
    secret = args[args.index(os.environ["PROBE_KEY_ARG"]) + 1]
    print(f"using key {secret} now", flush=True)
    raise RuntimeError(f"auth failed with key {secret}")
if action == "exit-message":
    sys.exit("fatal: the data channel is empty")
if action == "strict":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, required=True)
    parser.parse_args()
print(f"argv probe rank {rank}: {len(sys.argv) - 1} arguments", flush=True)
