"""The project's own PEP 517 build backend: a pure-Python wheel from pyproject.toml, stdlib only.

Why: the image installs the package into whatever Python the base image has. With setuptools as
the backend, an offline `pip install --no-build-isolation` needs the setuptools and `wheel` the
base happens to ship (a base with an old setuptools and no `wheel` stops at
`invalid command 'bdist_wheel'`). With this backend `pip` alone builds and installs the wheel,
on any base, with no network. It builds exactly what this project is: one pure-Python package,
its console scripts and its dependencies from `[project]`; editable installs (PEP 660) put the
source folder on sys.path through a .pth file.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_TIMESTAMP = (2020, 1, 1, 0, 0, 0)  # fixed: the same source gives the same wheel bytes


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _names() -> tuple[str, str, str]:
    project = _project()
    distribution = project["name"].replace("-", "_")
    return distribution, project["version"], f"{distribution}-{project['version']}.dist-info"


def _metadata() -> str:
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '>=3')}",
    ]
    if "license" in project:
        lines.append(f"License: {project['license'].get('text', '')}")
    lines += [f"Requires-Dist: {requirement}" for requirement in project.get("dependencies", [])]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in requirements]
    return "\n".join(lines) + "\n"


def _entry_points() -> str:
    scripts = _project().get("scripts", {})
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


def _package_files() -> list[Path]:
    """Every file of the import packages that pyproject.toml names, caches excluded."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["wheel-backend"][
        "packages"
    ]
    files = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append(path)
    return files


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(directory: str, contents: dict[str, bytes]) -> str:
    distribution, version, dist_info = _names()
    contents = {
        **contents,
        f"{dist_info}/METADATA": _metadata().encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: container-entry wheel_backend\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist_info}/entry_points.txt": _entry_points().encode(),
    }
    record = "".join(
        f"{name},sha256={_digest(data)},{len(data)}\n" for name, data in contents.items()
    )
    contents[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    name = f"{distribution}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(directory) / name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for member, data in contents.items():
            info = zipfile.ZipInfo(member, _TIMESTAMP)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return name


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []


get_requires_for_build_editable = get_requires_for_build_sdist = get_requires_for_build_wheel


def build_wheel(
    wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None
) -> str:
    files = {path.relative_to(ROOT).as_posix(): path.read_bytes() for path in _package_files()}
    return _write_wheel(wheel_directory, files)


def build_editable(
    wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None
) -> str:
    distribution, _, _ = _names()
    return _write_wheel(wheel_directory, {f"_{distribution}.pth": f"{ROOT}\n".encode()})


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    distribution, version, _ = _names()
    base = f"{distribution}-{version}"
    name = f"{base}.tar.gz"
    members = [ROOT / "pyproject.toml", Path(__file__).resolve(), *_package_files()]
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as sdist:
        for path in members:
            info = sdist.gettarinfo(str(path), f"{base}/{path.relative_to(ROOT).as_posix()}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as handle:
                sdist.addfile(info, handle)
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        sdist.addfile(info, io.BytesIO(pkg_info))
    return name


if __name__ == "__main__":  # `python3 scripts/build/wheel_backend.py DIR`: build the wheel into DIR
    import sys

    target = sys.argv[1] if len(sys.argv) > 1 else "dist"
    os.makedirs(target, exist_ok=True)
    print(Path(target) / build_wheel(target))
