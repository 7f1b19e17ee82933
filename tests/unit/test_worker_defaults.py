"""The workers' defaults (container_entry/plan/worker_defaults.py) and the facts they come from.

No GPU, EFA device or DLC image exists here: fake /sys, /proc and /opt trees stand in for
the machine's device files and the image's aws-ofi-nccl and libfabric installs, and
`NVIDIA_SMI_4` for `nvidia-smi -L` on a 4-GPU host. Snapshots: UPDATE_SNAPSHOTS=1 rewrites them
after a deliberate change; review the diff."""

import json
import os
from pathlib import Path

import pytest

from container_entry.common import shm
from container_entry.plan.machine import (
    read_efa_devices,
    read_efa_software,
    read_nccl_conf,
    read_physical_cores,
)
from container_entry.plan.plan import build_plan
from container_entry.plan.worker_defaults import flight_recorder, version_tuple
from tests.unit.conftest import NVIDIA_SMI_4, make_env

SNAPSHOT = Path(__file__).parent / "snapshots" / "worker-defaults-efa.json"
P4D = {
    "current_host": "algo-1",
    "hosts": ["algo-1", "algo-2"],
    "network_interface_name": "eth0",
    "current_instance_type": "ml.p4d.24xlarge",
}


def fake_sys(root, devices):
    """A /sys tree: class/infiniband/<dev>/device/driver -> .../drivers/<driver>."""
    for name, driver in devices.items():
        drivers = root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        device = root / "class" / "infiniband" / name / "device"
        device.mkdir(parents=True)
        os.symlink(drivers, device / "driver")
    return root


def fake_opt(root, ofi=None, libfabric=None, plugin_dir="amazon/ofi-nccl", installer=False):
    """An /opt tree as the EFA installer and aws-ofi-nccl leave it: the plugin library embeds
    "Initializing aws-ofi-nccl <version>" among its bytes; libfabric's version is in its
    pkg-config file, or only in the installer's package list."""
    if ofi:
        lib = root / plugin_dir / "lib"
        lib.mkdir(parents=True)
        blob = b"\x7fELF" + os.urandom(3000) + f"Initializing aws-ofi-nccl {ofi}\0".encode()
        (lib / "libnccl-net.so").write_bytes(blob + os.urandom(2000))
    if libfabric and not installer:
        pc = root / "amazon" / "efa" / "lib" / "pkgconfig"
        pc.mkdir(parents=True)
        (pc / "libfabric.pc").write_text(f"Name: libfabric\nVersion: {libfabric}\n")
    if libfabric and installer:
        (root / "amazon").mkdir(parents=True, exist_ok=True)
        (root / "amazon" / "efa_installed_packages").write_text(
            "# EFA installer version: 1.38.0\n# Debug packages installed: no\n"
            f"# Packages installed:\nefa-config_1.17_all libfabric-aws_{libfabric}_amd64\n"
        )
    return root


def test_efa_is_detected_from_the_device_tree(tmp_path):
    root = fake_sys(tmp_path, {"rdmap16s27": "efa", "rdmap32s27": "efa", "mlx5_0": "mlx5_core"})
    assert read_efa_devices(root) == ("rdmap16s27", "rdmap32s27")
    assert read_efa_devices(tmp_path / "absent") == ()


@pytest.mark.parametrize(
    ("ofi", "libfabric", "kw", "expected"),
    [
        ("1.13.2-aws", "1.22.0amzn4.0", {}, ("1.13.2-aws", "1.22.0amzn4.0")),
        ("1.5.0", "1.11.2amzn1.1", {"installer": True}, ("1.5.0", "1.11.2amzn1.1")),
        ("1.9.1-aws", None, {"plugin_dir": "aws-ofi-nccl"}, ("1.9.1-aws", None)),
        (None, None, {}, (None, None)),
    ],
)
def test_efa_software_versions_are_read_from_the_image(tmp_path, ofi, libfabric, kw, expected):
    assert read_efa_software(fake_opt(tmp_path, ofi, libfabric, **kw)) == expected


def efa_plan(tmp_path, ofi, libfabric, kernel="6.1.0-1034-aws", instance=P4D, environ=None):
    """A plan for a p4d-like host: EFA devices, plugin versions and kernel from fake trees."""
    opt = fake_opt(tmp_path / "opt", ofi, libfabric)
    devices = read_efa_devices(fake_sys(tmp_path / "sys", {"rdmap16s27": "efa"}))
    found_ofi, found_fabric = read_efa_software(opt)
    env = make_env(
        resource_config=instance,
        nvidia_smi=NVIDIA_SMI_4,
        efa_devices=devices,
        ofi_nccl_version=found_ofi,
        libfabric_version=found_fabric,
        kernel_release=kernel,
        environ=environ or {"SAGEMAKER_PROGRAM": "t.py"},
    )
    return build_plan(env)


EFA_NAMES = (
    "FI_PROVIDER",
    "NCCL_PROTO",
    "FI_EFA_USE_HUGE_PAGE",
    "FI_EFA_USE_DEVICE_RDMA",
    "FI_EFA_FORK_SAFE",
    "RDMAV_FORK_SAFE",
)
CASES = {
    "current-dlc": ("1.13.2-aws", "1.22.0amzn4.0", "6.1.0-1034-aws"),
    "ofi-1.7-old-libfabric": ("1.7.4-aws", "1.17.1amzn1.0", "5.15.0-1051-aws"),
    "ofi-1.6": ("1.6.0", "1.16.1amzn1.0", "5.15.0-1051-aws"),
    "ofi-1.5-old-kernel": ("1.5.0", "1.11.2amzn1.1", "5.10.210-201.852.amzn2.x86_64"),
    "no-plugin": (None, "1.22.0amzn4.0", "6.1.0-1034-aws"),
}


def test_efa_presets_per_plugin_version_snapshot(tmp_path):
    rendered = {}
    for name, (ofi, libfabric, kernel) in CASES.items():
        plan = efa_plan(tmp_path / name, ofi, libfabric, kernel)
        rendered[name] = {
            "env": {k: [v.value, v.reason] for k, v in plan.env.items() if k in EFA_NAMES},
            "warnings": list(plan.warnings),
        }
    text = json.dumps(rendered, indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), (
        f"EFA presets changed: UPDATE_SNAPSHOTS=1, review {SNAPSHOT}"
    )


def test_efa_presets_follow_the_cheatsheet(tmp_path):
    current = efa_plan(tmp_path / "a", "1.13.2-aws", "1.22.0amzn4.0").env
    assert {k for k in current if k in EFA_NAMES} == {"FI_EFA_USE_HUGE_PAGE"}
    assert (
        "aws-ofi-nccl 1.13.2-aws, libfabric 1.22.0amzn4.0" in current["FI_EFA_USE_HUGE_PAGE"].reason
    )
    old = efa_plan(tmp_path / "b", "1.5.0", "1.11.2amzn1.1", kernel="5.10.210").env
    assert old["FI_PROVIDER"].value == "efa" and old["NCCL_PROTO"].value == "simple"
    assert "1.5.0" in old["NCCL_PROTO"].reason
    assert old["FI_EFA_USE_DEVICE_RDMA"].value == "1"
    assert old["FI_EFA_FORK_SAFE"].reason.startswith("kernel 5.10.210")
    # an instance without GPUDirect RDMA never gets FI_EFA_USE_DEVICE_RDMA
    g5 = {**P4D, "current_instance_type": "ml.g5.48xlarge"}
    assert (
        "FI_EFA_USE_DEVICE_RDMA" not in efa_plan(tmp_path / "c", "1.6.0", "1.16.1", instance=g5).env
    )
    for case in (current, old):
        assert "RDMAV_FORK_SAFE" not in case


def test_efa_values_never_override_the_user(tmp_path):
    plan = efa_plan(
        tmp_path,
        "1.5.0",
        "1.11.2",
        environ={"SAGEMAKER_PROGRAM": "t.py", "FI_PROVIDER": "tcp"},
    )
    assert "FI_PROVIDER" not in plan.env and "FI_PROVIDER" in plan.user_env_kept


def test_no_efa_variables_without_efa_devices():
    plain = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4, ofi_nccl_version="1.13.2-aws"))
    assert not any(name in plain.env for name in EFA_NAMES)


def test_threads_are_physical_cores_per_worker_on_gpu_hosts():
    # a p5-like host: 96 cores, 192 hyperthreads, 8 GPUs -> 12, not 24
    p5 = make_env(
        cpu_count=192, physical_cores=96, nvidia_smi="\n".join(f"GPU {i}: H100" for i in range(8))
    )
    threads = build_plan(p5).env["OMP_NUM_THREADS"]
    assert threads.value == "12" and "96 physical cores / 8 workers" in threads.reason
    unknown = make_env(cpu_count=48, nvidia_smi=NVIDIA_SMI_4)  # topology unreadable
    assert build_plan(unknown).env["OMP_NUM_THREADS"].value == "12"
    cpu = make_env(cpu_count=8, physical_cores=4)  # CPU hosts keep logical cores (thread benchmark)
    assert build_plan(cpu).env["OMP_NUM_THREADS"].value == "8"
    pet = make_env(cpu_count=8, environ={"SAGEMAKER_PROGRAM": "t.py", "PET_NPROC_PER_NODE": "2"})
    assert build_plan(pet).env["OMP_NUM_THREADS"].value == "4"
    user = make_env(environ={"SAGEMAKER_PROGRAM": "t.py", "OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in build_plan(user).env


def test_nccl_debug_defaults_to_warn_over_the_dlcs_nccl_conf():
    """/etc/nccl.conf of the DLC (its EFA installer appends NCCL_DEBUG=INFO)."""
    plan = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4, nccl_conf={"NCCL_DEBUG": "INFO"}))
    assert plan.env["NCCL_DEBUG"].value == "WARN"
    assert "instead of NCCL_DEBUG=INFO from /etc/nccl.conf" in plan.env["NCCL_DEBUG"].reason
    mine = make_env(
        nvidia_smi=NVIDIA_SMI_4, environ={"SAGEMAKER_PROGRAM": "t", "NCCL_DEBUG": "INFO"}
    )
    assert "NCCL_DEBUG" not in build_plan(mine).env
    assert "NCCL_DEBUG" not in build_plan(make_env()).env  # no GPU, no NCCL


def test_nccl_conf_is_read_from_a_fake_file(tmp_path):
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_DEBUG=INFO\n# comment\nNCCL_SOCKET_IFNAME=^docker0,lo\n\n")
    assert read_nccl_conf(conf) == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "^docker0,lo"}
    assert read_nccl_conf(tmp_path / "absent") == {}


def test_async_error_handling_is_left_to_torch():
    """torch's default (3, SkipCleanUp) stays: neither name is set, whatever the version."""
    for version in ("2.5.1", "2.9.0", "2.15.0"):
        env = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4, torch_version=version)).env
        assert not {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"} & set(env)


@pytest.mark.parametrize(
    ("version", "gpu", "expected"),
    [
        # 2.5: TORCH_NCCL_* names only; ring buffer 0, no dump on timeout by default
        (
            "2.5.1",
            True,
            {
                "TORCH_NCCL_TRACE_BUFFER_SIZE",
                "TORCH_NCCL_DUMP_ON_TIMEOUT",
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
            },
        ),
        ("2.5.1", False, set()),  # gloo is not recorded before 2.9
        # 2.9.0 (the default DLC): FlightRecorder reads TORCH_FR_BUFFER_SIZE first, default 0;
        # the legacy TORCH_NCCL_TRACE_BUFFER_SIZE draws a warning from torch 2.11 on
        ("2.9.0+cu130", True, {"TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"}),
        ("2.9.0", False, {"TORCH_FR_BUFFER_SIZE"}),  # gloo's collectives recorded too
        ("2.11.0", True, {"TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"}),
        # 2.13+: the ring buffer defaults to 2000; only the dump location changes something
        ("2.13.0", True, {"TORCH_FR_DUMP_TEMP_FILE"}),
        ("2.15.0", True, {"TORCH_FR_DUMP_TEMP_FILE"}),
        ("2.15.0", False, set()),
        (None, True, set()),
    ],
)
def test_flight_recorder_only_what_changes_something(version, gpu, expected):
    env = flight_recorder(version, "/run/nccl_trace_rank_", gpu=gpu)
    assert set(env) == expected
    # never a name torch 2.11+ calls deprecated, never the debug-info pipe (not used)
    if (version_tuple(version) or (0,)) >= (2, 9):
        assert not {n for n in env if n.startswith("TORCH_NCCL_")}
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" not in env


def test_flight_recorder_aliases_are_user_values():
    environ = {
        "SAGEMAKER_PROGRAM": "t.py",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "0",  # the legacy name: the user turned it off
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/trace_",
    }
    plan = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4, environ=environ, torch_version="2.9.0"))
    assert "TORCH_FR_BUFFER_SIZE" not in plan.env and "TORCH_FR_DUMP_TEMP_FILE" not in plan.env
    assert {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} <= set(
        plan.user_env_kept
    )


def test_nccl_diagnostics_and_host_identity_on_gpu_hosts_only():
    gpu = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4)).env
    assert gpu["NCCL_HOSTID"].value == "algo-1"
    assert gpu["TORCH_FR_DUMP_TEMP_FILE"].value.startswith("/opt/ml/output/data/container-entry/")
    cpu = build_plan(make_env()).env
    cpu_nccl = {n for n in cpu if n.startswith(("NCCL_", "TORCH_NCCL", "TORCH_FR"))}
    # from resourceconfig, as before; and gloo's collectives recorded (torch 2.9 by default)
    assert cpu_nccl == {"NCCL_SOCKET_IFNAME", "TORCH_FR_BUFFER_SIZE"}


def test_socket_interface_only_when_it_exists_here():
    config = {
        "current_host": "algo-1",
        "hosts": ["algo-1", "algo-2"],
        "network_interface_name": "ethwe",
    }  # what SDK v3 local mode writes
    missing = build_plan(make_env(resource_config=config, interfaces=("eth0", "lo")))
    assert "GLOO_SOCKET_IFNAME" not in missing.env and "NCCL_SOCKET_IFNAME" not in missing.env
    present = build_plan(make_env(resource_config=config, interfaces=("ethwe", "lo")))
    assert present.env["GLOO_SOCKET_IFNAME"].value == "ethwe"


def test_small_shm_is_a_plan_warning_naming_size_and_fix():
    plan = build_plan(make_env(shm_bytes=64 << 20))  # docker run's default
    assert any(w.startswith("/dev/shm is 64 MiB, below 1.0 GiB") for w in plan.warnings)
    assert "--shm-size=1g" in plan.warnings[0] and "--ipc=host" in plan.warnings[0]
    assert "warning     /dev/shm is 64 MiB" in plan.summary()
    assert not plan.problems
    assert shm.warning(8 << 30) is None and shm.warning(None) is None
    assert shm.warning(64 << 20) == plan.warnings[0]  # one text, the preflight's too


def test_shm_size_is_read_with_statvfs(tmp_path):
    assert shm.read_bytes(str(tmp_path)) > 0
    assert shm.read_bytes(str(tmp_path / "absent")) is None
    assert shm.too_small(64 << 20) and not shm.too_small(1 << 30) and not shm.too_small(None)


def fake_cpus(root, topology):
    """sysfs cpu topology: {cpu: (package, core)}."""
    for cpu, (package, core) in topology.items():
        folder = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return root


def test_physical_cores_from_sysfs_and_cpuinfo(tmp_path):
    # 2 sockets x 2 cores x 2 hyperthreads: cpu N and N+4 share a core
    topology = {cpu: (cpu // 2 % 2, cpu % 2) for cpu in range(8)}
    sys_root = fake_cpus(tmp_path / "sys", topology)
    assert read_physical_cores(set(range(8)), sys_root, tmp_path / "none") == 4
    assert read_physical_cores({0, 4}, sys_root, tmp_path / "none") == 1  # siblings of one core
    cpuinfo = "\n\n".join(
        f"processor\t: {cpu}\nphysical id\t: {package}\ncore id\t\t: {core}"
        for cpu, (package, core) in topology.items()
    )
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(cpuinfo + "\n")
    assert read_physical_cores(set(range(8)), tmp_path / "nosys", proc) == 4
    assert read_physical_cores({0, 1}, tmp_path / "nosys", tmp_path / "noproc") is None


def test_version_tuple():
    assert version_tuple("1.13.2-aws") == (1, 13, 2)
    assert version_tuple("1.22.0amzn4.0") == (1, 22, 0)
    assert version_tuple("2.9") == (2, 9, 0)
    assert version_tuple(None) is None and version_tuple("unknown") is None
