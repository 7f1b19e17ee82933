"""The host that serves torchrun's rendezvous store leaves last (supervise/_torchrun_main.py), on
real torchrun agents with real torch: two "hosts" on this machine, node 0 serving the store.

torch's exit barrier lets every agent go once the last one checks in. The store's host, woken
by the last agent's check-in, could exit before that agent's own wait reached the store, or
before c10d's rendezvous shutdown wrote to it: "Error waiting on exit barrier ... Failed to
recv" with a traceback, on a job that succeeded (pytorch/pytorch#69520; CI saw it once in
~2000 tests). A busy host widens that window; here the other agent widens it for certain: it is
the last to arrive (its rank works longer), then sleeps between its check-in and its wait, or
before its rendezvous shutdown (`slow_agent.py`, a wrapper around our own torchrun main).
Every store request that agent makes after the barrier is covered, for static rendezvous
(no restarts) and c10d's (restarts). An agent that dies after the barrier only delays the
host's exit, within LEAVE_SECONDS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container_entry.common.programs import TORCHRUN_MAIN
from container_entry.supervise import _torchrun_main
from container_entry.supervise.prestart import Prestarted
from tests.ports import job_port

SLOW_AGENT = """\
import os, runpy, sys, time
import torch.distributed.elastic.utils.store as store_util
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

HOW, SECONDS = os.environ["SLOW_HOW"], 2.0
checked_in, barrier = store_util._barrier_nonblocking, store_util.barrier
shutdown = dynamic_rendezvous.DynamicRendezvousHandler.shutdown

def slow_check_in(*args, **kwargs):
    key = checked_in(*args, **kwargs)
    if HOW == "between check-in and wait":
        time.sleep(SECONDS)
    return key

def slow_shutdown(self):
    if HOW == "before the rendezvous shutdown":
        time.sleep(SECONDS)
    return shutdown(self)

def dies_after(*args, **kwargs):
    barrier(*args, **kwargs)
    if HOW == "dies after the barrier":
        os._exit(0)

store_util._barrier_nonblocking = slow_check_in
store_util.barrier = dies_after
dynamic_rendezvous.DynamicRendezvousHandler.shutdown = slow_shutdown
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# node 1's rank works longer: its agent is the barrier's last, the one that checks in then waits
SCRIPT = """\
import os, time
time.sleep(1.5 if os.environ["GROUP_RANK"] == "1" else 0.0)
print("rank done", os.environ["RANK"], flush=True)
"""

CASES = {
    "static, the last agent slow between check-in and wait": (0, "between check-in and wait"),
    "c10d, the last agent slow between check-in and wait": (1, "between check-in and wait"),
    "c10d, the last agent slow before its rendezvous shutdown": (
        1,
        "before the rendezvous shutdown",
    ),
}


def torchrun_args(node_rank: int, port: int, restarts: int, script: Path) -> list[str]:
    if restarts == 0:
        meet = ["--node-rank", str(node_rank), "--master-addr", "127.0.0.1"]
        meet += ["--master-port", str(port), "--max-restarts", "0"]
    else:
        meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        meet += ["--rdzv-id", f"exit-{port}", "--max-restarts", str(restarts)]
        meet += ["--rdzv-conf", f"is_host={'true' if node_rank == 0 else 'false'}"]
        meet += ["--local-addr", "127.0.0.1"]
    return ["--nnodes", "2", "--nproc-per-node", "1", *meet, str(script)]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as the plan sets it
    return env


def slow_agent(tmp_path: Path, args: list[str], how: str) -> subprocess.Popen:
    """Node 1's torchrun: our own main (TORCHRUN_MAIN), with torch slowed where `how` says."""
    wrapper = tmp_path / "slow_agent.py"
    wrapper.write_text(SLOW_AGENT)
    read, write = os.pipe()
    env = {**environment(), "SLOW_HOW": how}
    process = subprocess.Popen(
        [sys.executable, str(wrapper), TORCHRUN_MAIN, str(read), str(os.getpid())],
        env=env,
        stderr=subprocess.PIPE,
        pass_fds=(read,),
    )
    os.close(read)
    launch = {"args": args, "env": env, "cwd": str(tmp_path), "path": []}
    os.write(write, json.dumps(launch).encode())
    os.close(write)
    return process


def run_pair(tmp_path: Path, restarts: int, how: str) -> tuple[tuple[int, str], ...]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = job_port()
    host = Prestarted(sys.executable, environment())  # the product's own path, node 0
    head = [sys.executable, "-m", "torch.distributed.run"]
    served = host.launch(
        [*head, *torchrun_args(0, port, restarts, script)], environment(), str(tmp_path)
    )
    other = slow_agent(tmp_path, torchrun_args(1, port, restarts, script), how)
    results = []
    for process in (served, other):
        try:
            _, err = process.communicate(timeout=120)
        finally:
            process.kill()
        results.append((process.returncode, err.decode(errors="replace")))
    return tuple(results)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_store_host_leaves_after_every_agent_is_done_with_its_store(tmp_path, case):
    restarts, how = CASES[case]
    (host_code, host_err), (other_code, other_err) = run_pair(tmp_path, restarts, how)
    for code, err in ((host_code, host_err), (other_code, other_err)):
        assert code == 0, err
        for symptom in ("Traceback", "Failed to recv", "exit barrier", "failed to shutdown"):
            assert symptom not in err, err


def test_an_agent_that_dies_after_the_barrier_delays_the_host_only_within_its_bound(tmp_path):
    started = time.monotonic()
    (host_code, host_err), (other_code, _) = run_pair(tmp_path, 0, "dies after the barrier")
    assert other_code == 0
    assert host_code == 0, host_err
    assert "Traceback" not in host_err, host_err
    # it waited for the check-out that never came, then went: nothing else held it
    assert time.monotonic() - started >= _torchrun_main.LEAVE_SECONDS


def test_only_a_process_listening_on_the_stores_port_is_its_host(tmp_path):
    """`serves` reads this process's own sockets: a client of the same port is not the host."""
    from torch.distributed import PrefixStore, TCPStore

    port = job_port()
    server = TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False)
    prefixed = PrefixStore("torchelastic/agent", PrefixStore("round/0", server))
    assert _torchrun_main.serves(server) and _torchrun_main.serves(prefixed)
    client_code = (
        "import sys; from torch.distributed import TCPStore;"
        "from container_entry.supervise._torchrun_main import serves;"
        f"s = TCPStore('127.0.0.1', {port}, 1, is_master=False);"
        "sys.exit(3 if serves(s) else 0)"
    )
    client = subprocess.run([sys.executable, "-c", client_code], timeout=120)
    assert client.returncode == 0
