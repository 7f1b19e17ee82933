"""Only the job's own hosts take part in the side channel, in real processes.

A real 2-host job on one machine (two real bootstraps, each with one real torchrun gloo worker,
resolving algo-1 and algo-2 through a private /etc/hosts; needs root) trains while strangers,
processes that are not hosts and have no key, connect to the master's side channel
(127.0.0.1:MASTER_PORT+1) one after the other, each sending what ended healthy jobs before (issue
#25): a join with a bad field, 200,000 `[`, a forged failure about algo-2's rank, a failure that
is a string, a 100 MB line without a newline. The job must finish normally on both hosts, and the
master's output must name each refused peer. (Each attack on the Coordinator alone, and that
liveness still works after each: tests/unit/test_coordination.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from container_entry.hosts import LIVENESS_TIMEOUT
from tests.integration.conftest import wait_for
from tests.integration.test_liveness import Host, kill_everything, start_host
from tests.ports import job_port

HOSTS = ("algo-1", "algo-2")
TRAINING = {"steps": "15", "step-seconds": "0.2"}  # 3 s of steps together
ENDLESS = {"steps": "100000", "step-seconds": "0.2"}

CUDA = {
    "host": "algo-2",
    "rank": 1,  # algo-2's rank in this job (one rank per host)
    "local_rank": 0,
    "returncode": -11,
    "signal": "SIGSEGV",
    "exception": {
        "type": "RuntimeError",
        "message": "CUDA error: an illegal memory access was encountered",
    },
}
ATTACKS = {
    "bad join": b'{"type":"join","host":"algo-2","workers":"x"}\n',
    "200,000 [": b"[" * 200_000,
    "forged CUDA failure of algo-2": (
        json.dumps({"type": "failed", "failure": CUDA}) + "\n"
    ).encode(),
    "failure as a string": b'{"type":"failed","failure":"boom"}\n',
    "100 MB line": b"x" * (100 << 20),
}

# the stranger: a plain process, not in the hosts' namespaces, with no key; it sends in 1 MiB
# chunks and reads nothing, then reports its own address and how far it got
STRANGER = r"""
import json, socket, sys, time
port = int(sys.argv[1])
payload = sys.stdin.buffer.read()
started = time.monotonic()
sock = socket.create_connection(("127.0.0.1", port), timeout=10)
address = "{}:{}".format(*sock.getsockname())
sent, cut = 0, False
try:
    view = memoryview(payload)
    while sent < len(view):
        sent += sock.send(view[sent : sent + (1 << 20)])
except TimeoutError:
    pass  # the master stopped reading but kept the connection: not cut off
except OSError:
    cut = True
if not cut:
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass
        cut = True
    except TimeoutError:
        pass
    except OSError:
        cut = True
sock.close()
print(json.dumps({"address": address, "sent": sent, "cut": cut,
                  "seconds": time.monotonic() - started}))
"""


def start(tmp_path, name: str, hosts_file, port: int, hps: dict[str, str]) -> Host:
    """One host's real bootstrap (test_liveness.start_host: 1 gloo worker, failure grace 3 s)."""
    return start_host(tmp_path, name, hosts_file, hps=hps, CONTAINER_ENTRY_MASTER_PORT=str(port))


def stranger(port: int, attack: str) -> dict:
    """Run the stranger against the side channel on `port`; what it saw."""
    done = subprocess.run(
        [sys.executable, "-c", STRANGER, str(port)],
        input=ATTACKS[attack],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def refusals(err: str, address: str) -> list[str]:
    prefix = f"[container-entry] side channel: refused {address} ("
    return [line for line in err.splitlines() if line.startswith(prefix)]


def test_no_stranger_on_the_side_channel_can_touch_a_running_job(tmp_path, hosts_file):
    """Every attack, one stranger after the other, against one running job: each is refused
    on its own (one line naming its address), both hosts train on after each, and the job then
    ends as a success. One job for all: a job is most of this test's CPU (the stranger is a
    plain socket), and an attack that broke it fails the check right after that attack."""
    port = job_port()
    until = tmp_path / "enough"
    hps = {**ENDLESS, "until-file": json.dumps(str(until))}
    hosts = [start(tmp_path, name, hosts_file, port, hps) for name in HOSTS]
    seen: dict[str, dict] = {}
    try:
        if not wait_for(lambda: all(h.ranks_started() for h in hosts), 120):
            pytest.fail("the job did not start:\n" + "\n".join(h.stderr() for h in hosts))
        for attack in ATTACKS:
            seen[attack] = stranger(port + 1, attack)
            alive = [h.name for h in hosts if h.process.poll() is None]
            assert alive == list(HOSTS), (attack, "\n".join(h.stderr() for h in hosts))
        until.touch()  # enough: every rank ends after the same step
        for host in hosts:
            host.process.wait(timeout=120)
    finally:
        kill_everything(hosts, [])
    for host in hosts:
        assert host.process.returncode == 0, host.stderr()
        output = host.tree.output
        assert (output / "success").exists() and not (output / "failure").exists()
        assert "Traceback" not in host.stderr(), host.stderr()
    everything = hosts[0].output.text()  # stderr() is its last 4,000
    for attack, what in seen.items():
        refused = refusals(everything, what["address"])
        assert len(refused) == 1, (attack, hosts[0].stderr())
        assert what["cut"], (attack, what)  # the master closed the stranger's connection
        if attack == "100 MB line":  # cut off after its line limit, not after reading 100 MB
            assert "(a line over 64 KiB)" in refused[0]
            # cut (not a 10-s send timeout: that is no cut) before the 100 MB went; the
            # seconds far from a busy machine's stall
            assert what["sent"] < 100 << 20 and what["seconds"] < 30, what
        print(f"{attack}: {refused[0]} (the stranger sent {what['sent']:,} bytes)")


def test_after_a_stranger_s_failure_message_a_frozen_host_is_still_noticed(tmp_path, hosts_file):
    """Before: `{"type":"failed","failure":"boom"}` killed every listener thread, and a frozen
    algo-2 went unnoticed for 60 s and more. Now: refused, and the freeze is named within the
    liveness bound (docs/liveness.md)."""
    port = job_port()
    hosts = [start(tmp_path, name, hosts_file, port, ENDLESS) for name in HOSTS]
    master, frozen = hosts
    leftovers = []
    try:
        if not wait_for(lambda: all(h.ranks_started() for h in hosts), 120):
            pytest.fail("the job did not start:\n" + "\n".join(h.stderr() for h in hosts))
        seen = stranger(port + 1, "failure as a string")
        assert wait_for(lambda: refusals(master.stderr(), seen["address"]), 5), master.stderr()
        time.sleep(1.0)
        assert master.process.poll() is None and frozen.process.poll() is None
        leftovers = frozen.descendants()
        froze = time.monotonic()
        os.kill(frozen.process.pid, signal.SIGSTOP)
        master.process.wait(timeout=LIVENESS_TIMEOUT + 30)
        took = time.monotonic() - froze
        os.kill(frozen.process.pid, signal.SIGCONT)
    finally:
        kill_everything(hosts, leftovers)
    assert master.process.returncode == 1, master.stderr()
    first = (master.tree.output / "failure").read_text().splitlines()[0]
    assert first.startswith(
        f"host algo-2 stopped answering (no heartbeat for {LIVENESS_TIMEOUT:g} s)"
    ), first
    noticed = master.when("host algo-2 stopped answering")
    assert noticed is not None, master.stderr()
    print(f"frozen algo-2 after a stranger's message: master exited after {took:.1f} s")


def test_hosts_with_different_secrets_start_nothing_and_say_why(tmp_path, hosts_file):
    """CONTAINER_ENTRY_JOB_SECRET must be the same on every host (or unset on all): a host
    with another one cannot join, and both hosts say so before any worker starts."""
    secrets = {"algo-1": "first-job-secret-4f1c9a", "algo-2": "other-job-secret-77d0e3"}
    port = str(job_port())
    hosts = [
        start_host(
            tmp_path,
            name,
            hosts_file,
            hps=TRAINING,
            CONTAINER_ENTRY_MASTER_PORT=port,
            CONTAINER_ENTRY_JOIN_TIMEOUT="4",
            CONTAINER_ENTRY_JOB_SECRET=secrets[name],
        )
        for name in HOSTS
    ]
    try:
        for host in hosts:
            host.process.wait(timeout=60)
    finally:
        kill_everything(hosts, [])
    master, member = hosts
    assert member.process.returncode == 3, member.stderr()
    first = (member.tree.output / "failure").read_text().splitlines()[0]
    assert first.startswith(
        "NetworkError: the master host algo-1 refused this host (not a host of this job: bad "
        "proof): every host must derive the same job key"
    ), first
    assert master.process.returncode == 3, master.stderr()
    first = (master.tree.output / "failure").read_text().splitlines()[0]
    assert "algo-2 never joined the job within 4 s" in first, first
    assert "bad proof, claims algo-2)" in master.stderr()
    for host in hosts:
        assert not list((host.tree.output / "data/container-entry").glob("logs/rank-*.log"))
        assert not any(s in host.stderr() for s in secrets.values())  # masked
