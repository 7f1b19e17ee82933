"""torch's first import in a rank runs with Python's cyclic GC paused (the rank's
sitecustomize), and everything the script can see is as Python leaves it.

Each case is a real Python started as the rank wrapper starts a script (our sitecustomize
first on PYTHONPATH) with the venv's real torch, beside the same script without it, so a
missing pause fails the comparison (torch's import runs hundreds of collections)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from container_entry.common.programs import SITE_DIR

# counts the collections that start during the import, then reports what the script sees
SCRIPT = r"""
import gc, importlib.util, json, sys
before = sys.argv[1]
if before == "user disabled the GC":
    gc.disable()
if before == "a library looked torch up first":
    assert importlib.util.find_spec("torch") is not None  # as transformers does at its import
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info))
import torch.distributed
gc.callbacks.clear()
loader = torch.__spec__.loader
print(json.dumps({
    "collections": len(collections),
    "enabled": gc.isenabled(),
    "hooks": [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_TorchImport"],
    "loader_patched": "exec_module" in vars(loader),
    "torch": torch.__name__ == "torch" and torch.distributed.is_available(),
}))
"""
CASES = ["GC on", "user disabled the GC", "a library looked torch up first"]


def run(before: str, site: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site:
        env["PYTHONPATH"] = SITE_DIR
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, before], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("before", CASES)
def test_torchs_first_import_in_a_rank_runs_with_the_gc_paused_and_leaves_it_as_it_was(before):
    plain, ours = run(before, site=False), run(before, site=True)
    assert ours["torch"] and plain["torch"]
    assert ours["enabled"] is plain["enabled"] is (before != "user disabled the GC")
    assert ours["hooks"] == [] and not ours["loader_patched"]  # nothing of ours stays behind
    if before == "user disabled the GC":
        assert ours["collections"] == plain["collections"] == 0
    else:
        assert plain["collections"] > 50, plain  # the comparison can fail
        assert ours["collections"] <= 2, (ours, plain)
