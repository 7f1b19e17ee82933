"""The preflight's decisions, without GPUs: the deadline's report from each rank's stage, the
exact matmul operands (TF32 and bf16 simulated on the CPU), bus bandwidth, what NCCL's debug
lines say about EFA, and torch's view of the GPUs (the probe, in this process). Fakes: a dict
standing in for the job's TCPStore, NCCL_DEBUG=INFO lines as NCCL and aws-ofi-nccl print them."""

import json
import time
from pathlib import Path

import pytest
import torch

from container_entry.common.exits import ExitCode
from container_entry.rank import preflight, preflight_checks, preflight_progress, torch_gpus
from container_entry.rank.preflight_checks import (
    PreflightError,
    bus_bandwidth,
    exact_operands,
    fail,
    nccl_network,
    ofi_problem,
    print_failure,
)
from container_entry.rank.preflight_progress import STAGE_KEY, Progress, laggards
from container_entry.rank.torch_gpus import describe_probe


def stage(name, host, local, at=0.0):
    return {"stage": name, "host": host, "local": local, "at": at}


def test_laggards_names_the_rank_stuck_before_joining_not_the_waiting_host():
    stages = {
        0: stage("join", "algo-1", 0),
        1: stage("join", "algo-1", 1),
        2: stage("join", "algo-2", 0),
        3: stage("gpu-matmul", "algo-2", 1, at=100.0),
    }
    host, text = laggards(stages, now=160.0)
    assert host == "algo-2"
    assert text == (
        "rank 3 (local 1) on algo-2 still in 'gpu-matmul' (for 60 s); 3 other rank(s) got "
        "further and waited for it"
    )


def test_laggards_a_rank_that_never_reported():
    host, text = laggards({0: stage("join", "algo-1", 0), 1: None}, now=1.0)
    assert (host, text) == (
        "?",
        "rank 1 never reported; 1 other rank(s) got further and waited for it",
    )


def test_laggards_everyone_stuck_at_the_same_stage():
    stages = {r: stage("all-reduce", f"algo-{r + 1}", 0) for r in range(12)}
    _, text = laggards(stages, now=0.0)
    assert text.endswith("and 4 more still in 'all-reduce'")


class FakeStore:
    """Stands in for the job's TCPStore (check/get/set on keys)."""

    def __init__(self, records):
        self.data = {STAGE_KEY + str(r): json.dumps(v) for r, v in records.items()}

    def check(self, keys):
        return all(key in self.data for key in keys)

    def get(self, key):
        return self.data[key].encode()

    def set(self, key, value):
        self.data[key] = value


def test_watchdog_reports_from_the_store_and_exits(capsys, monkeypatch):
    monkeypatch.setattr(preflight_progress, "GRACE", 0.0)
    store = FakeStore({0: stage("join", "algo-1", 0, time.time()), 1: None})
    progress = Progress(rank=0, local_rank=0, host="algo-1", deadline=0.2)
    progress.store, progress.world, progress.stage = store, 2, "join"
    codes = []
    progress.watch(exit=codes.append).join(timeout=60)
    assert codes == [3]  # a peer never joined (docs/failure-stop-logs.md, exit codes)
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err  # the worker parses it as the exception
    # the worker takes the last line for the exception: the class by its own name
    said = "\nPreflightError: preflight check 'deadline' failed on host ?: no progress within"
    assert said in err
    assert "rank 1 never reported" in err


def test_watchdog_gives_ranks_that_joined_a_grace_period(monkeypatch):
    monkeypatch.setattr(preflight_progress, "GRACE", 30.0)
    joined = Progress(rank=0, local_rank=0, host="algo-1", deadline=0.1)
    joined.stage = "join"
    behind = Progress(rank=1, local_rank=1, host="algo-1", deadline=0.1)
    behind.stage = "gpu-matmul"
    fired = []
    joined.watch(exit=lambda code: fired.append("joined"))
    thread = behind.watch(exit=lambda code: fired.append("behind"))
    thread.join(timeout=60)
    assert fired == ["behind"]  # the stuck rank reports first
    joined.stage = "done"  # lets the first watchdog end


def test_watchdog_without_a_store_says_so(capsys):
    progress = Progress(rank=2, local_rank=0, host="algo-2", deadline=0.1)
    codes = []
    progress.watch(exit=codes.append).join(timeout=60)
    assert "rank 2 (local 0) did not reach the job's store" in capsys.readouterr().err


def test_stall_hook_only_for_its_rank_and_stage(monkeypatch):
    monkeypatch.setenv(preflight_progress.STALL_ENV, "3:gpu-count")
    progress = Progress(rank=1, local_rank=1, host="h", deadline=10)
    progress.store = FakeStore({})
    progress.enter("gpu-count")  # rank 1: no stall
    assert json.loads(progress.store.data[STAGE_KEY + "1"])["stage"] == "gpu-count"


@pytest.mark.parametrize("size", [256, 1024])
def test_exact_operands_are_exact_in_fp32_and_tf32(size):
    a, b = exact_operands(size)
    want = a @ b
    assert int(want.abs().max()) <= size
    assert torch.equal((a.float() @ b.float()), want.float())
    # TF32 keeps 10 mantissa bits of each input: -1/0/1 survive the rounding unchanged
    tf32 = a.float().view(torch.int32) & ~0x1FFF
    assert torch.equal(tf32.view(torch.float32), a.float())


def test_exact_operands_are_exact_in_bf16_where_random_ones_are_not():
    a, b = exact_operands(256, seed=99)
    assert torch.equal((a.bfloat16() @ b.bfloat16()).float(), (a @ b).float())
    # the old check (randn inputs, allclose rtol 1e-3) fails on a bf16/TF32 path
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(512, 512, generator=g)
    assert not torch.allclose((x.bfloat16() @ x.bfloat16()).float(), x @ x, rtol=1e-3, atol=1e-2)


def test_bus_bandwidth_is_nccl_tests_convention():
    assert bus_bandwidth(1 << 30, 1.0, 8) == pytest.approx((1 << 30) * 2 * 7 / 8)
    assert bus_bandwidth(1 << 30, 1.0, 1) == 1 << 30
    assert bus_bandwidth(1, 0.0, 2) == 0.0


SOCKET = [
    "algo-1:51:51 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so",
    "algo-1:51:51 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>",
    "algo-1:51:51 [0] NCCL INFO Using network Socket",
]
OFI = [
    "algo-1:51:51 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.13.2-aws",
    "algo-1:51:51 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
    "algo-1:51:51 [0] NCCL INFO Using network Libfabric",
]
OLD_OFI = [
    "[0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)",
    "[0] NCCL INFO Using network AWS Libfabric",
]


def test_nccl_network_from_debug_lines():
    assert nccl_network(SOCKET) == ("Socket", None)
    assert nccl_network(OFI) == ("Libfabric", "efa")
    assert nccl_network(OLD_OFI) == ("AWS Libfabric", "efa")


def test_ofi_problem_fails_a_silent_socket_fallback():
    devices = ["rdmap16s27"]
    problem = ofi_problem(*nccl_network(SOCKET), devices)
    assert "NCCL uses network 'Socket', not aws-ofi-nccl" in problem
    assert ofi_problem(*nccl_network(OFI), devices) is None
    assert ofi_problem(*nccl_network(OLD_OFI), devices) is None
    assert "provider 'tcp'" in ofi_problem("Libfabric", "tcp", devices)
    assert "never said which network" in ofi_problem(None, None, devices)


def test_describe_probe():
    assert describe_probe({"torch": "2.9.0", "count": 8}, 8) is None
    assert describe_probe({"error": "import torch failed: X"}, 8) == (
        "the GPU check could not run: import torch failed: X"
    )
    line = describe_probe(
        {"torch": "2.9.0", "cuda": "13.0", "count": 4, "names": ["NVIDIA A10G"] * 4}, 8
    )
    assert line.startswith("torch 2.9.0 sees 4 GPUs (NVIDIA A10G), but 8 GPUs were counted")
    assert "NVIDIA driver not found" in line and "CUDA runtime 13.0" in line


class _Statvfs:
    """Stands in for os.statvfs of a /dev/shm of `size` bytes."""

    def __init__(self, size: int) -> None:
        self.f_frsize, self.f_blocks = 4096, size // 4096


@pytest.mark.parametrize(("size", "warned"), [(64 << 20, True), (1 << 30, False), (8 << 30, False)])
def test_the_preflight_warns_about_a_small_dev_shm(monkeypatch, size, warned):
    from container_entry.common import shm

    monkeypatch.setattr(shm.os, "statvfs", lambda path: _Statvfs(size))
    line = preflight_checks.shm_line("algo-2")
    if not warned:
        assert line is None
    else:  # the plan's warning (container_entry.common.shm), on each host
        assert line == f"[container-entry] preflight warning on algo-2: {shm.warning(size)}"
        assert line.startswith("[container-entry] preflight warning on algo-2: /dev/shm is 64 MiB")
        assert "--shm-size=1g (or more) or --ipc=host" in line


def test_stage_seconds_says_where_the_pass_spent_its_time():
    marks = [("import", 10.0), ("connect", 11.25), ("gpu-count", 11.3), ("join", 11.302)]
    assert preflight_progress.stage_seconds(marks, 11.5) == (
        "in 1.50 s: import 1.25 s, connect 0.05 s, join 0.20 s"  # gpu-count: 2 ms, left out
    )
    assert preflight_progress.stage_seconds([("import", 5.0)], 5.001) == "in 0.00 s"


def test_progress_marks_each_stage_once_in_order():
    progress = Progress(rank=0, local_rank=0, host="h", deadline=10)
    for stage in ("connect", "connect", "gpu-count", "join"):
        progress.enter(stage)
    assert [stage for stage, _ in progress.marks] == ["import", "connect", "gpu-count", "join"]
    times = [at for _, at in progress.marks]
    assert times == sorted(times)


def test_exit_codes_are_the_containers():
    """A GPU check fails as this host's GPUs (4), the deadline as a peer that never joined (3),
    any other check 1: docs/failure-stop-logs.md's exit codes, from exits.ExitCode."""
    assert fail("gpu-count", "h", "x").exit_code == ExitCode.DEVICE == 4
    assert fail("gpu-matmul", "h", "x").exit_code == ExitCode.DEVICE
    assert fail("deadline", "h", "x").exit_code == ExitCode.NETWORK == 3
    assert fail("efa-network", "h", "x").exit_code == ExitCode.FAILED == 1
    assert str(fail("all-reduce", "algo-2", "sum 2.0 instead of 3.0")) == (
        "preflight check 'all-reduce' failed on host algo-2: sum 2.0 instead of 3.0"
    )


def test_a_failure_prints_the_traceback_the_worker_parses(capsys):
    from container_entry.rank.rank_end import parse_exception

    try:
        raise fail("gpu-count", "algo-1", "the plan counted 8 GPUs, torch sees 0")
    except PreflightError as error:
        print_failure(error)
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert parse_exception(err.splitlines()) == {
        "type": "PreflightError",
        "message": "preflight check 'gpu-count' failed on host algo-1: the plan counted 8 GPUs, "
        "torch sees 0",
    }


def test_rank_from_torchruns_variables():
    environ = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    environ[preflight.EXPECTED_GPUS_ENV] = "4"
    assert preflight.Rank.from_environ({**environ, "CURRENT_HOST": "algo-2"}) == preflight.Rank(
        host="algo-2", rank=5, local_rank=1, world=8, local_world=4, expected=4
    )
    bare = preflight.Rank.from_environ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    assert (bare.host, bare.local_world, bare.expected) == ("localhost", 1, 0)


def test_the_probe_is_torchs_view_in_this_process():
    """The program check_visible_gpus runs, called here: this venv's torch (no GPU here)."""
    found = torch_gpus.probe()
    assert found["torch"] == torch.__version__ and found["count"] == torch.cuda.device_count()
    assert isinstance(found["warnings"], list)
    assert json.loads(json.dumps(found)) == found  # one JSON line
    assert describe_probe(found, found["count"]) is None


def test_the_preflight_and_the_probe_are_files_the_plan_and_the_check_run():
    from container_entry.rank.preflight_then_script import PREFLIGHT_SCRIPT

    assert Path(preflight.__file__).resolve() == Path(PREFLIGHT_SCRIPT)
    assert Path(torch_gpus.__file__).resolve() == Path(torch_gpus.PROGRAM).resolve()
