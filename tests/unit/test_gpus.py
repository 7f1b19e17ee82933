import pytest

from container_entry.gpus import count_gpus, parse_nvidia_smi
from tests.unit.conftest import NVIDIA_SMI_4

MIG = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)
  MIG 3g.20gb     Device  0: (UUID: MIG-bbbb)
  MIG 3g.20gb     Device  1: (UUID: MIG-cccc)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-dddd)
"""


@pytest.mark.parametrize(
    ("environ", "smi", "count", "source"),
    [
        ({}, None, 0, "no nvidia-smi"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, None, 0, "no nvidia-smi"),  # no driver, no GPU
        ({}, NVIDIA_SMI_4, 4, "nvidia-smi -L"),
        ({}, "", 0, "nvidia-smi -L"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, NVIDIA_SMI_4, 2, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": ""}, NVIDIA_SMI_4, 0, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, NVIDIA_SMI_4, 0, "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, NVIDIA_SMI_4, 4, "nvidia-smi -L"),
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
def test_count_gpus(environ, smi, count, source):
    result = count_gpus(environ, smi)
    assert (result.count, result.source) == (count, source)


def test_mig_children_are_not_counted():
    assert parse_nvidia_smi(MIG) == 2
