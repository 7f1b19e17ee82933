"""The torch version the plan shows: what importlib.metadata says, read without importing it."""

from __future__ import annotations

import subprocess
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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, torch_loaded, metadata_loaded = out.stdout.split()
    assert (version, torch_loaded, metadata_loaded) == (metadata.version("torch"), "False", "False")


def info(folder: Path, name: str, version: str | None) -> None:
    (folder / name).mkdir(parents=True)
    if version is not None:
        headers = f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n\nVersion: no\n"
        (folder / name / "METADATA").write_text(headers)


CASES = {
    # name: (folders along sys.path, each {dist-info name: METADATA version}), what is found
    "one": ([{"torch-2.9.0.dist-info": "2.9.0"}], "2.9.0"),
    "a local version": ([{"torch-2.9.0+cu128.dist-info": "2.9.0+cu128"}], "2.9.0+cu128"),
    "the METADATA's, not the name's": ([{"torch-2.9.0.dist-info": "2.9.0.post1"}], "2.9.0.post1"),
    "the first along the path (a PYTHONPATH in front of the image's)": (
        [{"torch-2.12.0.dist-info": "2.12.0"}, {"torch-2.9.0.dist-info": "2.9.0"}],
        "2.12.0",
    ),
    "others beside it": (
        [
            {
                "torchvision-0.1.dist-info": "0.1",
                "torch_xla-2.1.dist-info": "2.1",
                "torch-2.10.0a0+git1234.dist-info": "2.10.0a0+git1234",
            }
        ],
        "2.10.0a0+git1234",
    ),
    "none: the metadata's": ([{}], "from-metadata"),
    "two in one folder: the metadata's": (
        [{"torch-2.8.0.dist-info": "2.8.0", "torch-2.9.0.dist-info": "2.9.0"}],
        "from-metadata",
    ),
    "no METADATA: the metadata's": ([{"torch-2.9.0.dist-info": None}], "from-metadata"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_version_is_the_one_importlib_metadata_would_find(tmp_path, monkeypatch, case):
    folders, want = CASES[case]
    path = []
    for i, infos in enumerate(folders):
        folder = tmp_path / f"site{i}"
        folder.mkdir()
        for name, version in infos.items():
            info(folder, name, version)
        path.append(str(folder))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), *path])
    monkeypatch.setattr(metadata, "version", lambda name: "from-metadata")
    assert environment._torch_version() == want


def test_no_torch_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])

    def not_found(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_found)
    assert environment._torch_version() is None
