"""Fetching the user's code: sourcedir tarballs extracted with every escape refused (with
tarfile's "data" filter, and by hand where the Python predates it), entry points made
executable."""

from __future__ import annotations

import io
import os
import stat
import sys
import tarfile
from types import SimpleNamespace

import pytest

from container_entry.common.errors import CodeError
from container_entry.plan.code_source import CodeKind
from container_entry.supervise import user_code


def archive(tmp_path, *members: tarfile.TarInfo):
    path = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


ESCAPES = [
    member("../escape.py"),
    member("a/../../escape.py"),
    member("link", tarfile.SYMTYPE, "/etc/passwd"),
    member("link", tarfile.SYMTYPE, "../../outside"),
    member("hard", tarfile.LNKTYPE, "../outside"),
    member("device", tarfile.CHRTYPE),
    member("pipe", tarfile.FIFOTYPE),
]


@pytest.fixture(params=["data filter", "by hand"])
def extraction(request, monkeypatch):
    """Both ways user_code extracts: tarfile's data filter, and by hand where this Python has
    none (3.11.0-3.11.3, Debian 12's 3.11.2 among them), which every Python can be made to be."""
    if request.param == "by hand":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip(f"Python {sys.version.split()[0]} has no tarfile.data_filter to test")
    return request.param


@pytest.mark.parametrize("bad", ESCAPES, ids=[f"{m.name}->{m.linkname}" for m in ESCAPES])
def test_every_member_that_escapes_or_is_special_is_refused(tmp_path, extraction, bad):
    path = archive(tmp_path, member("train.py"), bad)
    target = tmp_path / "code"
    with pytest.raises(CodeError, match=r"sourcedir\.tar\.gz: member .* is refused"):
        user_code._safe_extract(path, target)
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "outside").exists()


def test_links_inside_the_tree_are_kept(tmp_path, extraction):
    path = archive(
        tmp_path,
        member("pkg/real.py"),
        member("pkg/alias.py", tarfile.SYMTYPE, "real.py"),
        member("train.py"),
    )
    target = tmp_path / "code"
    user_code._safe_extract(path, target)
    assert (target / "pkg" / "alias.py").resolve() == (target / "pkg" / "real.py").resolve()
    assert (target / "train.py").read_bytes() == b"x"


def test_an_absolute_member_is_extracted_inside_the_code_directory(tmp_path, extraction):
    path = archive(tmp_path, member("/etc/escape.py"), member("train.py"))
    target = tmp_path / "code"
    user_code._safe_extract(path, target)
    assert (target / "etc" / "escape.py").read_bytes() == b"x"


def test_a_truncated_archive_is_one_line(tmp_path):
    path = archive(tmp_path, member("train.py"))
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(CodeError, match=r"cannot extract .*truncated or not a tar\.gz"):
        user_code._safe_extract(path, tmp_path / "code")


def test_a_command_entry_point_gets_its_run_bit(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    user_code.make_executable(script)
    assert script.stat().st_mode & stat.S_IXUSR


NAMES = [
    b"donn\xe9es.csv",
    b"\xff\xfe.bin",
    b"caf\xc3",
    b"\xed\xa0\x80.txt",
    b"new\nline",
    b"\x1b[31m",
]


def test_a_missing_entry_script_is_one_line_whatever_else_the_folder_holds(tmp_path):
    """Names that are not UTF-8, hold a line break or a terminal escape: listed escaped, in one
    line (the raw names once ended in a UnicodeEncodeError of ours)."""
    code = tmp_path / "code"
    code.mkdir()
    for name in NAMES:
        with open(os.fsencode(code) + b"/" + name, "wb"):
            pass
    program = os.fsdecode(b"tr\xe9in.py")
    plan = SimpleNamespace(
        code=SimpleNamespace(kind=CodeKind.DIRECTORY, code_dir=str(code), location=str(code)),
        command=[str(code / program)],
        program=program,
    )
    with pytest.raises(CodeError) as raised:
        user_code.prepare(plan, {})
    message = str(raised.value)
    assert message.startswith(f"entry script 'tr\\xe9in.py' not found in {code}; found: ")
    assert len(message.splitlines()) == 1
    message.encode("utf-8")  # strict: nothing unwritable left in it
    for shown in ("donn\\xe9es.csv", "\\xff\\xfe.bin", "caf\\xc3", "\\xed\\xa0\\x80.txt"):
        assert shown in message
    assert "new\\nline" in message and "\\x1b[31m" in message
