"""accelerate's notebook_launcher over a training function, as a notebook turned into a script
does: torch's elastic agent in this process, NPROC workers, one world per host on the port the
test picked."""

import os

import worker
from accelerate import notebook_launcher

if __name__ == "__main__":
    nproc = int(os.environ.get("NPROC", "2"))
    notebook_launcher(
        worker.main, num_processes=nproc, use_port=os.environ["USER_PORT"], master_addr="127.0.0.1"
    )
