import os

from container_entry.environment import read_efa_devices
from container_entry.plan import build_plan
from tests.unit.conftest import NVIDIA_SMI_4, make_env


def fake_sys(root, devices):
    """A /sys tree: class/infiniband/<dev>/device/driver -> .../drivers/<driver>."""
    for name, driver in devices.items():
        drivers = root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        device = root / "class" / "infiniband" / name / "device"
        device.mkdir(parents=True)
        os.symlink(drivers, device / "driver")
    return root


def test_efa_is_detected_from_the_device_tree(tmp_path):
    root = fake_sys(tmp_path, {"rdmap16s27": "efa", "rdmap32s27": "efa", "mlx5_0": "mlx5_core"})
    assert read_efa_devices(root) == ("rdmap16s27", "rdmap32s27")
    assert read_efa_devices(tmp_path / "absent") == ()


def test_efa_variables_only_with_efa_devices_and_never_over_user_values():
    plain = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4))
    assert "FI_PROVIDER" not in plain.env
    efa = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4, efa_devices=("rdmap16s27",)))
    assert efa.env["FI_PROVIDER"].value == "efa"
    assert "rdmap16s27" in efa.env["FI_PROVIDER"].reason
    mine = build_plan(
        make_env(
            nvidia_smi=NVIDIA_SMI_4,
            efa_devices=("rdmap16s27",),
            environ={"SAGEMAKER_PROGRAM": "t.py", "FI_PROVIDER": "tcp"},
        )
    )
    assert "FI_PROVIDER" not in mine.env and "FI_PROVIDER" in mine.user_env_kept


def test_threads_follow_cores_per_worker_unless_set():
    assert (
        build_plan(make_env(cpu_count=48, nvidia_smi=NVIDIA_SMI_4)).env["OMP_NUM_THREADS"].value
        == "12"
    )
    pet = make_env(cpu_count=8, environ={"SAGEMAKER_PROGRAM": "t.py", "PET_NPROC_PER_NODE": "2"})
    assert build_plan(pet).env["OMP_NUM_THREADS"].value == "4"
    user = make_env(environ={"SAGEMAKER_PROGRAM": "t.py", "OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in build_plan(user).env


def test_nccl_diagnostics_and_host_identity_on_gpu_hosts_only():
    gpu = build_plan(make_env(nvidia_smi=NVIDIA_SMI_4)).env
    for name in (
        "NCCL_HOSTID",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
    ):
        assert name in gpu
    assert gpu["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].value.startswith(
        "/opt/ml/output/data/container-entry/"
    )
    cpu = build_plan(make_env()).env
    assert not any(name.startswith(("NCCL_HOSTID", "TORCH_NCCL")) for name in cpu)


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
