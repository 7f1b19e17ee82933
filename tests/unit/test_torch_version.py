"""The torch version the plan shows, read without importing torch or importlib.metadata."""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from pathlib import Path

import pytest

from container_entry.plan import environment


def test_the_installed_torch_reads_as_its_metadata_says():
    assert environment._torch_version() == metadata.version("torch")


def test_reading_it_imports_neither_torch_nor_the_metadata_library():
    code = (
        "import sys; from container_entry.plan.environment import _torch_version; "
        "v = _torch_version(); "
        "print(v, 'torch' in sys.modules, 'importlib.metadata' in sys.modules)"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, torch_loaded, metadata_loaded = out.stdout.split()
    assert (version, torch_loaded, metadata_loaded) == (metadata.version("torch"), "False", "False")


def _fake_site(tmp_path: Path, monkeypatch, infos: list[str]) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    for name in infos:
        (tmp_path / name).mkdir()
    spec = importlib.util.spec_from_file_location("torch", tmp_path / "torch" / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "torch" else None)


@pytest.mark.parametrize(
    ("infos", "want"),
    [
        (["torch-2.9.0.dist-info"], "2.9.0"),
        (["torch-2.9.0+cu128.dist-info"], "2.9.0+cu128"),
        (["torch-2.10.0a0+git1234.dist-info", "torchvision-0.1.dist-info"], "2.10.0a0+git1234"),
    ],
)
def test_the_folder_name_is_the_version(tmp_path, monkeypatch, infos, want):
    _fake_site(tmp_path, monkeypatch, infos)
    assert environment._torch_version() == want


@pytest.mark.parametrize(
    "infos", [[], ["torch-2.8.0.dist-info", "torch-2.9.0.dist-info"]], ids=["none", "two"]
)
def test_no_single_folder_falls_back_to_the_metadata(tmp_path, monkeypatch, infos):
    _fake_site(tmp_path, monkeypatch, infos)
    monkeypatch.setattr(metadata, "version", lambda name: "from-metadata")
    assert environment._torch_version() == "from-metadata"


def test_no_torch_is_none(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert environment._torch_version() is None
