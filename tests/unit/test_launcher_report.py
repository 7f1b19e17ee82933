# ruff: noqa: E501, W291 - launchers' output as they print it: long lines, a trailing blank
"""Which worker failed, from what an entry point's own launcher printed (rank/launcher_report.py):
torchrun's "Root Cause" block, torch.multiprocessing.spawn's exceptions, torch's elastic agent
logging a function worker's traceback, and that worker's exception, not the launcher's."""

from __future__ import annotations

import pytest

from container_entry.rank.launcher_report import worker_failure

TORCHRUN_TAIL = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/ml/code/train.py", line 9, in <module>
[rank0]:     dist.all_reduce(t)
[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:1702
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/ml/code/train.py", line 13, in <module>
[rank1]:     raise ValueError(f"planted failure on rank {r}")
[rank1]: ValueError: planted failure on rank 1
E1207 16:45:12.000000 8725 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_16:45:12
  host      : ip-10-0-0-1.ec2.internal
  rank      : 3 (local_rank: 1)
  exitcode  : CODE (pid: 8769)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

SPAWN_RAISED = """\
Traceback (most recent call last):
  File "/opt/ml/code/tutorial.py", line 31, in <module>
    mp.spawn(train, args=(world_size,), nprocs=world_size, join=True)
  File "/usr/local/lib/python3.12/site-packages/torch/multiprocessing/spawn.py", line 340, in spawn
    return start_processes(fn, args, nprocs, join, daemon, start_method="spawn")
torch.multiprocessing.spawn.ProcessRaisedException: 

-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/site-packages/torch/multiprocessing/spawn.py", line 90, in _wrap
    fn(i, *args)
  File "/opt/ml/code/tutorial.py", line 22, in train
    raise ValueError(f"planted failure on rank {rank}")
ValueError: planted failure on rank 1
"""

SPAWN_EXITED = """\
Traceback (most recent call last):
  File "/opt/ml/code/tutorial.py", line 31, in <module>
    mp.spawn(train, nprocs=2)
torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 3
"""

ELASTIC_FUNCTION = """\
E1207 17:41:58.964000 14656 torch/distributed/elastic/multiprocessing/api.py:836] -- Process 1 terminated with the following error:
E1207 17:41:58.964000 14656 torch/distributed/elastic/multiprocessing/api.py:836] Traceback (most recent call last):
E1207 17:41:58.964000 14656 torch/distributed/elastic/multiprocessing/api.py:836]   File "/opt/ml/code/worker.py", line 41, in main
E1207 17:41:58.964000 14656 torch/distributed/elastic/multiprocessing/api.py:836]     raise ValueError(f"planted failure on rank {rank}")
E1207 17:41:58.964000 14656 torch/distributed/elastic/multiprocessing/api.py:836] ValueError: planted failure on rank 1
Traceback (most recent call last):
  File "/opt/ml/code/elastic.py", line 20, in <module>
    elastic_launch(config, worker.main)()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
main FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 14663)
============================================================
"""


@pytest.mark.parametrize(
    ("tail", "worker", "exception"),
    [
        (TORCHRUN_TAIL.replace("CODE", "1"), "worker rank 3 (local 1): exit code 1", None),
        (TORCHRUN_TAIL.replace("CODE", "-9"), "worker rank 3 (local 1): signal SIGKILL", None),
        (SPAWN_RAISED, "process 1 of torch.multiprocessing.spawn",
         {"type": "ValueError", "message": "planted failure on rank 1"}),
        (SPAWN_EXITED, "process 0 of torch.multiprocessing.spawn: exit code 3", None),
        (ELASTIC_FUNCTION, "worker rank 1 (local 1): exit code 1",
         {"type": "ValueError", "message": "planted failure on rank 1"}),
        ("bash: torchrun: command not found\n", None, None),
        ("", None, None),
    ],
)  # fmt: skip
def test_the_worker_its_launcher_names_and_what_it_died_of(tail, worker, exception):
    found, died_of = worker_failure(tail.splitlines())
    assert found == worker
    if exception is not None:
        assert died_of == exception


def test_the_named_ranks_own_exception_not_its_peers_broken_connection():
    """torchrun names rank 3; rank 1's traceback is the one tagged `[rank1]:` here, so the
    named rank's lines are missing: the exception is then the last one that names no broken
    connection (a consequence), never the launcher's ChildFailedError."""
    _, died_of = worker_failure(TORCHRUN_TAIL.replace("CODE", "1").splitlines())
    assert died_of == {"type": "ValueError", "message": "planted failure on rank 1"}
    tagged = TORCHRUN_TAIL.replace("CODE", "1").replace("rank      : 3", "rank      : 0")
    _, died_of = worker_failure(tagged.splitlines())
    assert died_of is not None and died_of["type"] == "RuntimeError"  # rank 0's own lines
