"""Which entry scripts get the preflight in their own Python (preflight_then_script)."""

from __future__ import annotations

import pytest

from container_entry.rank.preflight_then_script import (
    PREFLIGHT_SCRIPT,
    READ_AT_START,
    shares_python,
)


@pytest.mark.parametrize(
    "text",
    [
        b'import os\nos.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]\n',
        b'os.environ.setdefault("NCCL_DEBUG", "INFO")\n',
        b"os.environ['NCCL_SOCKET_IFNAME'] = 'eth0'\n",
        b'os.environ["OMP_NUM_THREADS"] = "4"\nimport torch\n',
        b"os.putenv('MKL_NUM_THREADS', '2')\n",
        b"# set CUDA_VISIBLE_DEVICES before torch\n",  # said only in a comment: still, to be safe
    ],
)
def test_a_script_that_names_a_variable_read_at_start_keeps_its_own_preflight(tmp_path, text):
    script = tmp_path / "train.py"
    script.write_bytes(text)
    assert not shares_python([PREFLIGHT_SCRIPT], str(script))


def test_names_read_at_start_are_all_covered():
    assert {name.decode() for name in READ_AT_START} >= {"CUDA_VISIBLE_DEVICES", "NCCL_"}


@pytest.mark.parametrize(
    ("name", "text", "shares"),
    [
        ("train.py", b"import torch\nprint(torch.__version__)\n", True),
        ("train.py", b"\xff\xfe not utf-8, still Python's to judge\n", True),
        ("run.sh", b"python train.py\n", False),  # not Python: a process of its own
        ("train", b"import torch\n", False),  # no .py: run as a program
    ],
)
def test_other_scripts_share_it_when_they_are_python(tmp_path, name, text, shares):
    script = tmp_path / name
    script.write_bytes(text)
    assert shares_python([PREFLIGHT_SCRIPT], str(script)) is shares


def test_a_script_that_cannot_be_read_keeps_its_own(tmp_path):
    assert not shares_python([PREFLIGHT_SCRIPT], str(tmp_path / "missing.py"))


def test_another_preflight_program_keeps_its_own_process(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    assert shares_python([PREFLIGHT_SCRIPT], str(script))
    assert not shares_python([str(tmp_path / "check.py")], str(script))
