"""GPU counting from `nvidia-smi -L` text and the environment, as CUDA will see the devices.

No GPU exists here: each `nvidia-smi -L` text below stands in for the real tool's output on the
machine named beside it, and the fake /proc and /dev trees for the NVIDIA driver's files."""

import pytest

from container_entry.plan.gpus import count_gpus, cuda_visible, parse_nvidia_smi, read_driver
from container_entry.plan.plan import build_plan
from tests.unit.conftest import NVIDIA_SMI_4, make_env

# an A100 host (p4d-like) with MIG on GPU 0 (two instances) and GPU 1 whole
MIG = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)
  MIG 3g.20gb     Device  0: (UUID: MIG-bbbb)
  MIG 3g.20gb     Device  1: (UUID: MIG-cccc)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-dddd)
"""
# every GPU in MIG mode (what `nvidia-smi mig -cgi ...` on both GPUs leaves)
ALL_MIG = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)
  MIG 3g.20gb     Device  0: (UUID: MIG-bbbb)
  MIG 3g.20gb     Device  1: (UUID: MIG-cccc)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-dddd)
  MIG 7g.40gb     Device  0: (UUID: MIG-eeee)
"""
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]  # of NVIDIA_SMI_4


def count(environ, smi=NVIDIA_SMI_4, **kw):
    return count_gpus(environ, smi, **kw)


@pytest.mark.parametrize(
    ("environ", "smi", "expected", "source"),
    [
        ({}, None, 0, "no nvidia-smi"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, None, 0, "no nvidia-smi"),  # no driver, no GPU
        ({}, NVIDIA_SMI_4, 4, "nvidia-smi -L"),
        ({}, "", 0, "nvidia-smi -L"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, NVIDIA_SMI_4, 2, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": ""}, NVIDIA_SMI_4, 0, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, NVIDIA_SMI_4, 0, "CUDA_VISIBLE_DEVICES"),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, NVIDIA_SMI_4, 4, "nvidia-smi -L"),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, NVIDIA_SMI_4, 0, "NVIDIA_VISIBLE_DEVICES"),
        (
            {"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2,GPU-3"},
            NVIDIA_SMI_4,
            3,
            "NVIDIA_VISIBLE_DEVICES",
        ),
        (
            {"NVIDIA_VISIBLE_DEVICES": "0,1,2", "CUDA_VISIBLE_DEVICES": "1"},
            NVIDIA_SMI_4,
            1,
            "CUDA_VISIBLE_DEVICES",
        ),
    ],
)
def test_count_gpus(environ, smi, expected, source):
    result = count_gpus(environ, smi)
    assert (result.count, result.source) == (expected, source)
    assert result.problems == ()


def test_cuda_stops_at_the_first_invalid_entry():
    result = count({"CUDA_VISIBLE_DEVICES": "0,1,-1,2"})
    assert result.count == 2 and not result.problems
    assert "stops reading at '-1'" in result.warnings[0]
    # strtoul-like: '1gpu' is 1
    assert cuda_visible("1gpu,3", parse_nvidia_smi(NVIDIA_SMI_4)).selected == ("1", "3")


def test_indices_past_the_last_gpu_are_dropped():
    """CUDA_VISIBLE_DEVICES=4,5,6,7 in a container that got host GPUs 4-7: they are 0-3 here."""
    result = count({"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert result.count == 0
    assert "selects no GPU: '4' is no GPU 4 here" in result.problems[0]
    partial = count({"CUDA_VISIBLE_DEVICES": "2,3,4,5,6,7"})
    assert partial.count == 2 and "only 2 GPU(s)" in partial.warnings[0]


def test_a_device_named_twice_shows_none():
    """torch's _parse_visible_devices and CUDA: a repeated device gives an empty set."""
    result = count({"CUDA_VISIBLE_DEVICES": "0,0"})
    assert result.count == 0
    assert result.problems == (
        "CUDA_VISIBLE_DEVICES=0,0 names '0' twice: CUDA then shows no GPU at all",
    )


def test_uuids_and_their_prefixes_select_devices():
    assert count({"CUDA_VISIBLE_DEVICES": f"{UUIDS[2]},{UUIDS[0]}"}).count == 2
    assert count({"CUDA_VISIBLE_DEVICES": "GPU-00000003"}).count == 1  # a unique prefix
    ambiguous = count({"CUDA_VISIBLE_DEVICES": "GPU-0000000"})  # matches all four
    assert ambiguous.count == 0 and "matches more than one device" in ambiguous.problems[0]
    unknown = count({"CUDA_VISIBLE_DEVICES": f"{UUIDS[1]},GPU-ffff"})
    assert unknown.count == 1 and "'GPU-ffff' (matches no device here)" in unknown.warnings[0]
    mixed = count({"CUDA_VISIBLE_DEVICES": f"{UUIDS[1]},2"})  # a list of UUIDs stops at '2'
    assert mixed.count == 1
    assert count({"CUDA_VISIBLE_DEVICES": f"{UUIDS[1]},{UUIDS[1]}"}).count == 0


def test_mig_instances_are_not_counted_as_gpus():
    gpus = parse_nvidia_smi(MIG)
    assert [(g.index, g.mig) for g in gpus] == [(0, ("MIG-bbbb", "MIG-cccc")), (1, ())]


def test_mig_host_plans_the_one_instance_cuda_exposes():
    result = count({}, ALL_MIG)
    assert result.count == 1 and result.source.startswith("MIG")
    assert "3 MIG instances" in result.warnings[0]
    one = count({"CUDA_VISIBLE_DEVICES": "MIG-cccc"}, ALL_MIG)
    assert (one.count, one.warnings, one.problems) == (1, (), ())


def test_mig_next_to_whole_gpus_is_refused():
    result = count({}, MIG)
    assert "with and without MIG" in result.problems[0]
    whole = count({"CUDA_VISIBLE_DEVICES": "1"}, MIG)  # only the whole GPU: fine
    assert (whole.count, whole.problems) == (1, ())


def test_a_failing_query_on_a_gpu_host_is_a_problem_not_a_cpu_host():
    """Stands in for nvidia-smi exiting 9 ('couldn't communicate with the NVIDIA driver')
    where the container has /dev/nvidia0..7."""
    nodes = tuple(f"/dev/nvidia{i}" for i in range(8))
    error = "exit code 9: NVIDIA-SMI has failed because it couldn't communicate with the driver"
    result = count_gpus({}, None, error, nodes)
    assert result.count == 8
    assert "`nvidia-smi -L` failed: exit code 9: NVIDIA-SMI has failed" in result.problems[0]
    missing = count_gpus({}, None, None, nodes)  # the binary is not there at all
    assert "nvidia-smi is not on PATH" in missing.problems[0]
    timeout = count_gpus(
        {}, None, "no answer within 30 s", ("/proc/driver/nvidia/gpus/0000:10:1c.0",)
    )
    assert "no answer within 30 s" in timeout.problems[0]


def test_host_gpus_not_mapped_into_the_container_is_a_cpu_host_with_a_warning():
    """/proc/driver/nvidia/gpus shows the host's GPUs even to a container started without
    --gpus (no /dev/nvidia*, no nvidia-smi): a CPU job, said so."""
    result = count_gpus({}, None, None, ("/proc/driver/nvidia/gpus/0000:10:1c.0",))
    assert (result.count, result.problems) == (0, ())
    assert "none is mapped into this container" in result.warnings[0]
    # NVIDIA_VISIBLE_DEVICES=void: utilities mounted, nvidia-smi says "No devices were found"
    void = count_gpus(
        {"NVIDIA_VISIBLE_DEVICES": "void"},
        None,
        "exit code 6: No devices were found",
        ("/proc/driver/nvidia/gpus/0000:10:1c.0",),
    )
    assert (void.count, void.problems) == (0, ())


def test_driver_evidence_from_fake_proc_and_dev_trees(tmp_path):
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    (proc / "driver" / "nvidia" / "gpus" / "0000:10:1c.0").mkdir(parents=True)
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).touch()
    assert read_driver(proc, dev) == (
        "/proc/driver/nvidia/gpus/0000:10:1c.0",
        "/dev/nvidia0",
        "/dev/nvidia1",
    )
    assert read_driver(tmp_path / "absent", tmp_path / "absent") == ()


def test_plan_refuses_a_gpu_host_whose_query_failed_and_keeps_gpu_defaults():
    env = make_env(
        nvidia_smi=None,
        nvidia_smi_error="exit code 255: Failed to initialize NVML: Driver/library version "
        "mismatch",
        gpu_driver=("/dev/nvidia0", "/dev/nvidia1"),
    )
    plan = build_plan(env)
    assert any("Driver/library version mismatch" in p for p in plan.problems)
    assert plan.backend == "nccl" and plan.num_gpus == 2
    assert "ACCELERATE_USE_CPU" not in plan.env


def test_plan_shows_gpu_warnings():
    plan = build_plan(
        make_env(
            nvidia_smi=NVIDIA_SMI_4,
            environ={"SAGEMAKER_PROGRAM": "t.py", "CUDA_VISIBLE_DEVICES": "0,1,-1,2"},
        )
    )
    assert plan.nproc_per_node == "2" and not plan.problems
    assert any("stops reading at '-1'" in w for w in plan.warnings)
    assert "warning     CUDA_VISIBLE_DEVICES=0,1,-1,2" in plan.summary()
