"""The checkout's venv as a copy of the machine's cached one (scripts/build/dev_venv.py), on
real files: what the copy shares with the cache (hard links) and what it never does (the files
naming the venv's path, anything written into the copy later)."""

from __future__ import annotations

import os
import subprocess
import sys

from scripts.build import dev_venv


def fake_venv(root, name="dev-venv-0123"):
    venv = root / "cache" / name
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "site").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = python3 -m venv {venv}\n")
    tool = venv / "bin" / "tool"
    tool.write_text(f"#!{venv}/bin/python\nimport sys\n")
    tool.chmod(0o755)
    (venv / "bin" / "activate").write_text(f'VIRTUAL_ENV="{venv}"\n')
    (venv / "bin" / "native").write_bytes(b"\x7fELF\0" + str(venv).encode() + b"\0rest")
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "lib" / "site" / "module.py").write_text("VALUE = 1\n")
    (venv / dev_venv.STAMP).write_text("key\n")
    return venv


def test_the_copy_names_itself_and_shares_only_what_never_changes(tmp_path):
    source = fake_venv(tmp_path)
    target = tmp_path / "checkout" / ".venv"
    target.parent.mkdir()
    dev_venv.copy(source, target)
    for name in ("pyvenv.cfg", "bin/tool", "bin/activate"):
        text = (target / name).read_text()
        assert str(target) in text and str(source) not in text, (name, text)
        assert str(source) in (source / name).read_text()  # the cache's own stays
        assert not os.path.samefile(source / name, target / name)
    assert os.access(target / "bin" / "tool", os.X_OK)
    # a binary keeps its bytes; everything else is the cache's file itself
    assert (target / "bin" / "native").read_bytes() == (source / "bin" / "native").read_bytes()
    assert os.path.samefile(source / "lib/site/module.py", target / "lib/site/module.py")
    assert (target / "bin" / "python").is_symlink()
    assert not (target / dev_venv.STAMP).exists()  # a copy is never taken for the cache
    assert not (target.parent / ".venv.partial").exists()
    # what pip and Python write later are new files: the cache never sees them
    (target / "lib" / "site" / "editable.pth").write_text("/checkout\n")
    assert not (source / "lib" / "site" / "editable.pth").exists()
    # made again over an old copy: replaced whole
    (target / "stale").write_text("x")
    dev_venv.copy(source, target)
    assert not (target / "stale").exists()


def test_the_cache_is_keyed_by_the_lock_and_the_interpreter(tmp_path):
    lock = tmp_path / "dev.txt"
    lock.write_text("pytest==9.0.3\n")
    first = dev_venv.digest(lock)
    lock.write_text("pytest==9.0.2\n")
    assert dev_venv.digest(lock) != first


def test_a_wrong_call_says_how_to_call_it():
    result = subprocess.run(
        [sys.executable, "-m", "scripts.build.dev_venv"],
        capture_output=True,
        text=True,
        cwd=dev_venv.REPO,
        check=False,
    )
    assert result.returncode == 2 and "usage:" in result.stderr and "VENV_DIR" in result.stderr
