"""The liveness simulation's table (scripts/simulate/hosts.py) from recorded measurements; the
runs themselves need root and namespaces (`make bench-liveness`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from scripts.simulate import hosts as simulate_hosts
from scripts.simulate.job import Network, Plan

SNAPSHOT = Path(__file__).parent / "snapshots" / "simulate-hosts.md"


def job(hosts: int, scenario: str, noticed: float, **more: object) -> dict:
    """One run's measurements as run_job returns them."""
    survivors = hosts - 1
    return {
        "hosts": hosts,
        "scenario": scenario,
        "start_s": 1.5 + hosts / 10,
        "master_rss_mb": 30.5 + hosts,
        "master_threads": 6,
        "noticed_by": f"{survivors}/{survivors}",
        "noticed_max_s": noticed,
        "noticed_median_s": noticed / 2,
        "exited_max_s": noticed + 2.04,
        "survivors_exited": survivors,
        "survivors_nonzero": survivors,
        "reasons": ["algo-2 stopped"],
        **more,
    }


# two host counts; a failed start, a fault nobody noticed, a scenario not run for one count
RESULTS = [
    job(2, "relay", 0.31),
    job(2, "kill", 0.12),
    job(2, "freeze", 6.5),
    {"hosts": 2, "scenario": "disconnect", "error": "ip: not found"},
    job(2, "freeze-master", 7.25),
    job(16, "relay", 0.45, noticed_by="14/15", survivors_nonzero=14),
    job(16, "kill", 0.2),
    job(16, "freeze", 6.75, exited_max_s=None),
    job(16, "freeze-master", 9.0, noticed_by="0/15", noticed_max_s=None, noticed_median_s=None),
]


def test_the_block_renders_as_the_snapshot(tmp_path, monkeypatch):
    """The block written into docs/liveness.md, byte for byte, and the measurements as JSON;
    regenerate after a deliberate change with UPDATE_SNAPSHOTS=1 and review the diff."""
    measured = {(r["hosts"], r["scenario"]): r for r in RESULTS}

    def run_job(count: int, scenario: str, *_: object) -> dict:
        if (count, scenario) not in measured:
            raise RuntimeError(f"the job of {count} did not start: timeout")
        return dict(measured[(count, scenario)])

    monkeypatch.setattr(simulate_hosts, "run_job", run_job)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(simulate_hosts.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    gmtime = time.gmtime
    monkeypatch.setattr(time, "gmtime", lambda *_: gmtime(1764840000))
    page = tmp_path / "liveness.md"
    page.write_text(
        f"# Liveness\n\n{simulate_hosts.DOCS_BEGIN}\nold\n{simulate_hosts.DOCS_END}\nmore\n"
    )
    argv = ["--hosts", "2", "16", "--write-docs", str(page), "--json", str(tmp_path / "r.json")]
    assert simulate_hosts.main(argv) == 0
    saved = json.loads((tmp_path / "r.json").read_text())
    assert [r["scenario"] for r in saved[:5]] == list(simulate_hosts.SCENARIOS)
    assert saved[8] == {
        "hosts": 16,
        "scenario": "disconnect",
        "error": "the job of 16 did not start: timeout",
    }
    text = page.read_text()
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), f"block changed: UPDATE_SNAPSHOTS=1 and review {SNAPSHOT}"


def test_it_needs_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert simulate_hosts.main(["--hosts", "2"]) == 2
    assert "needs root and unshare" in capsys.readouterr().err


def test_the_plan_orders_hosts_by_name_as_the_bootstrap_does():
    """Master first, the fault on the last host (the master for freeze-master), a failing
    rank on the middle one; only the host cut off resolves across the veth pair."""
    kill, relay = Plan(16, "kill"), Plan(16, "relay")
    assert kill.master == "algo-1" and kill.victim == kill.target == "algo-9"
    assert relay.target == "algo-2" and Plan(16, "freeze-master").target == "algo-1"
    assert "10.252.0.2" not in kill.hosts_file()
    cut = Plan(3, "disconnect")
    assert cut.hosts_file().splitlines()[1:] == [
        "127.0.0.1 algo-1",
        "127.0.0.1 algo-2",
        f"{Network.THERE} algo-3",
    ]
    assert cut.cut_hosts_file().splitlines()[1:] == [
        f"{Network.HERE} algo-1",
        f"{Network.HERE} algo-2",
        f"{Network.THERE} algo-3",
    ]
