"""The programs the bootstrap starts by module name or by path: one home for each, so the part
that decides a command line (plan) and the parts that start it (supervise, rank) name the same
file. Programs run by path import nothing of the package at their start (their own folder leaves
sys.path first); the rank wrapper is `python -m`, torchrun's own way to start a module.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
WORKER_MODULE = "container_entry.worker"  # what torchrun runs in each rank's slot (`-m`)
RANK_RUNNER = str(PACKAGE / "rank" / "preflight_then_script.py")  # the preflight, the script
PREFLIGHT_SCRIPT = str(PACKAGE / "rank" / "preflight.py")
SITE_DIR = str(PACKAGE / "rank" / "_site")  # on each script's PYTHONPATH: sitecustomize, alone
TORCHRUN_MAIN = str(PACKAGE / "supervise" / "_torchrun_main.py")  # torchrun, started early
TORCHRUN_MODULE = "torch.distributed.run"  # `python -m` of it is torchrun
# every process of the job starts unbuffered unless the user said otherwise (live logs): the
# plan adds it, and torchrun's interpreter, started before the plan exists, starts with it
UNBUFFERED = ("PYTHONUNBUFFERED", "1")
