"""torchrun's parser of every torch minor from 2.5 on, rebuilt from PyPI without installing torch.

The first run reads a few members of one wheel per version over HTTP Range requests (seconds);
later runs read them from build/torch-launchers. Without network and without that cache the
version tests are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import urllib.request
from pathlib import Path

import pytest

from tests.compat import torch_launchers as tl

CACHE = Path(__file__).resolve().parents[2] / "build" / "torch-launchers"

# Newest patch of every minor from 2.5 (PyPI, 2026-12-03: newest release 2.15.0).
TORCH_VERSIONS = [
    "2.5.1",
    "2.6.0",
    "2.7.1",
    "2.8.0",
    "2.9.1",
    "2.10.0",
    "2.11.0",
    "2.12.1",
    "2.13.0",
    "2.14.1",
    "2.15.0",
]

# Long options a launcher may pass -> first minor that has them (checked on every release from
# 2.5.0 to 2.15.0: no patch release adds or drops one). Each has a `--x-y` and a `--x_y` spelling.
SINCE = {
    "--nnodes": (2, 5),
    "--nproc-per-node": (2, 5),
    "--node-rank": (2, 5),
    "--master-addr": (2, 5),
    "--master-port": (2, 5),
    "--max-restarts": (2, 5),
    "--rdzv-backend": (2, 5),
    "--rdzv-endpoint": (2, 5),
    "--rdzv-id": (2, 5),
    "--rdzv-conf": (2, 5),
    "--local-addr": (2, 5),
    "--monitor-interval": (2, 5),
    "--log-dir": (2, 5),
    "--redirects": (2, 5),
    "--tee": (2, 5),
    "--local-ranks-filter": (2, 5),
    "--start-method": (2, 5),
    "--logs-specs": (2, 5),
    "--no-python": (2, 5),
    "--run-path": (2, 5),
    "--event-log-handler": (2, 8),
    "--numa-binding": (2, 9),
    "--signals-to-handle": (2, 10),
    "--duplicate-stdout-filters": (2, 10),
    "--duplicate-stderr-filters": (2, 10),
    "--virtual-local-rank": (2, 10),
    "--shutdown-timeout": (2, 12),
    "--log-line-prefix-template": (2, 14),
    "--print-completion": (2, 14),
}
SINGLE_SPELLING = {"--nnodes", "--tee", "--redirects", "--standalone", "--role", "--module"}

LAUNCH = [
    "--nnodes", "2",
    "--nproc-per-node", "4",
    "--node-rank", "1",
    "--master-addr", "algo-1",
    "--master-port", "29500",
    "--max-restarts", "3",
    "--rdzv-backend", "c10d",
    "--rdzv-endpoint", "algo-1:29400",
    "--rdzv-id", "job-7",
    "--rdzv-conf", "join_timeout=900,read_timeout=60",
    "--local-addr", "10.0.0.2",
    "-m", "pkg.train",
    "--lr", "0.1", "--nnodes", "9", "-m", "x",
]  # fmt: skip
EXPECTED = {
    "nnodes": "2",
    "nproc_per_node": "4",
    "node_rank": 1,
    "master_addr": "algo-1",
    "master_port": 29500,
    "max_restarts": 3,
    "rdzv_backend": "c10d",
    "rdzv_endpoint": "algo-1:29400",
    "rdzv_id": "job-7",
    "rdzv_conf": "join_timeout=900,read_timeout=60",
    "local_addr": "10.0.0.2",
    "module": True,
    "no_python": False,
    "standalone": False,
    "training_script": "pkg.train",
    "training_script_args": ["--lr", "0.1", "--nnodes", "9", "-m", "x"],
}


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@pytest.fixture(autouse=True)
def no_pet_env(monkeypatch):
    """torchrun's env/check_env actions take defaults from PET_* variables."""
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)


def parser(version: str) -> argparse.ArgumentParser:
    try:
        return tl.parser_for(version, CACHE)
    except tl.FetchError as exc:
        message = f"torch {version} sources neither cached nor fetchable: {exc}"
        if os.environ.get("CI"):  # CI has the package index: these must run there
            pytest.fail(message)
        pytest.skip(message)


def parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | str:
    """The namespace, or the error line argparse prints before exiting 2."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return p.parse_args(argv)
    except SystemExit as exc:
        return f"exit {exc.code}: {err.getvalue().strip().splitlines()[-1]}"


def test_versions_are_newest_patches():
    assert tl.newest_patches(TORCH_VERSIONS) == TORCH_VERSIONS
    assert TORCH_VERSIONS[0].startswith("2.5.")


@pytest.mark.parametrize("version", TORCH_VERSIONS)
def test_launch_line(version):
    p = parser(version)
    ns = parse(p, LAUNCH)
    assert not isinstance(ns, str), ns
    assert {k: getattr(ns, k) for k in EXPECTED} == EXPECTED
    cut = LAUNCH.index("-m")  # torchrun options before, the script's after
    underscored = [
        "--" + a[2:].replace("-", "_") if a.startswith("--") else a for a in LAUNCH[:cut]
    ] + LAUNCH[cut:]
    assert parse(p, underscored) == ns
    script = parse(p, ["--nproc_per_node=1", "train.py", "--epochs", "3"])
    assert (script.training_script, script.training_script_args, script.module) == (
        "train.py", ["--epochs", "3"], False,
    )  # fmt: skip


@pytest.mark.parametrize("version", TORCH_VERSIONS)
def test_options_by_version(version):
    options = tl.long_options(parser(version))
    for option, since in SINCE.items():
        underscore = "--" + option[2:].replace("-", "_")
        spellings = {option} if option in SINGLE_SPELLING else {option, underscore}
        present = _key(version)[:2] >= since
        assert (spellings <= options) == present, (option, version)
        assert (spellings & options == set()) == (not present), (option, version)
    for option in SINGLE_SPELLING:
        assert option in options


@pytest.mark.parametrize("version", ["2.9.0", TORCH_VERSIONS[-1]])
def test_abbreviations_after_the_script(version):
    """allow_abbrev stays True: every token is classified before positionals are consumed, so an
    ambiguous prefix of a torchrun option after the script is an error, an unambiguous one passes
    through, and a ``--`` right after the script is swallowed by it."""
    p = parser(version)
    assert p.allow_abbrev is True
    err = parse(p, ["--nproc-per-node", "1", "-m", "mod", "--log", "info"])
    assert isinstance(err, str) and err.startswith("exit 2: ") and "ambiguous option: --log" in err
    ns = parse(p, ["--nproc-per-node", "1", "-m", "mod", "--master_p", "1", "--nnod", "2"])
    assert ns.training_script_args == ["--master_p", "1", "--nnod", "2"]
    assert (ns.master_port, ns.nnodes) != (1, "2")
    ns = parse(p, ["--nproc-per-node", "1", "-m", "mod", "--", "--log", "info"])
    assert ns.training_script_args == ["--log", "info"]


def test_second_call_needs_no_network(monkeypatch):
    version = TORCH_VERSIONS[-1]
    parser(version)  # fills the cache (or skips)

    def offline(*args, **kwargs):
        raise AssertionError("network used although everything is cached")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    source = tl.fetch_sources(version, CACHE)
    assert (source / tl.RUN).is_file() and (source / tl.ARGPARSE_UTIL).is_file()
    assert (source / "torch/numa/binding.py").is_file()  # --numa-binding's choices, 2.9+
    assert "--print-completion" in tl.long_options(tl.parser_for(version, CACHE))


def test_unreachable_pypi_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tl, "PYPI", "https://127.0.0.1:9/pypi/torch")
    with pytest.raises(tl.FetchError, match=re.escape("cannot reach https://127.0.0.1:9/")):
        tl.fetch_sources("2.9.0", tmp_path)


# ------------------------------------------------------------------------------------------
# The isolation is faithful: the torch installed in .venv against its own sources from PyPI

ARGVS = [
    LAUNCH,
    ["--standalone", "--nproc_per_node=gpu", "train.py"],
    ["--nnodes=1:4", "--rdzv_backend=c10d", "--rdzv_endpoint=h:1", "-r", "3", "-t", "0:1", "s.py"],
    ["--numa-binding", "socket", "--max_restarts=2", "--no-python", "echo", "hi"],
    ["--numa-binding", "bogus", "x.py"],
    ["--nproc-per-node", "1", "-m", "mod", "--log", "info"],
    ["--nproc-per", "2", "--master_ad", "h", "--local-ranks", "0", "x.py", "--lo"],
    ["--start-method", "fork", "--monitor-interval", "0.5", "--log-dir", "/tmp/l", "x.py"],
    ["--signals-to-handle", "SIGTERM,SIGUSR1", "--virtual-local-rank", "x.py", "--", "a"],
    ["--node-rank", "x", "x.py"],
    [],
]


def _describe(p: argparse.ArgumentParser) -> dict:
    parser_fields = ("allow_abbrev", "prefix_chars", "description", "add_help", "exit_on_error")
    parser_fields += ("conflict_handler", "fromfile_prefix_chars", "argument_default")
    fields = ("option_strings", "dest", "nargs", "const", "default", "choices", "required")
    fields += ("help", "metavar")
    return {
        "parser": {k: getattr(p, k) for k in parser_fields},
        "actions": [
            {
                **{f: getattr(a, f) for f in fields},
                "class": type(a).__name__,
                "type": getattr(a.type, "__name__", a.type),
            }
            for a in p._actions
        ],
    }


@pytest.fixture(scope="module")
def installed():
    """(version, torchrun's real get_args_parser) of the torch installed here."""
    torch = pytest.importorskip("torch")
    from torch.distributed.run import get_args_parser

    return torch.__version__.split("+")[0], get_args_parser


def test_isolated_parser_equals_the_installed_one(installed):
    version, get_args_parser = installed
    real, isolated = get_args_parser(), parser(version)
    assert tl.long_options(isolated) == tl.long_options(real)
    assert _describe(isolated) == _describe(real)
    for argv in ARGVS:
        assert parse(isolated, argv) == parse(real, argv), argv


def test_cached_sources_are_the_installed_ones(installed):
    import torch

    version, _ = installed
    root = Path(torch.__file__).parent.parent
    parser(version)
    for member in (tl.RUN, tl.ARGPARSE_UTIL, "torch/numa/binding.py"):
        cached = (CACHE / version / member).read_bytes().replace(b"\r\n", b"\n")
        assert cached == (root / member).read_bytes().replace(b"\r\n", b"\n"), member


def test_unknown_names_are_refused_not_guessed(tmp_path):
    run = tmp_path / "9.9.9" / tl.RUN
    run.parent.mkdir(parents=True)
    (tmp_path / "9.9.9" / tl.ARGPARSE_UTIL).write_text("")
    run.write_text(
        "import torch\nfrom argparse import ArgumentParser\n\n"
        "def get_args_parser():\n"
        "    p = ArgumentParser()\n"
        "    p.add_argument('--x', default=torch.cuda.device_count())\n"
        "    return p\n"
    )
    with pytest.raises(tl.IsolationError, match="uses module torch itself"):
        tl.parser_for("9.9.9", tmp_path)


def test_main_prints_first_versions(capsys):
    if tl.main(["--cache", str(CACHE), "2.9.1", "2.10.0", "2.12.1"]) != 0:
        pytest.skip(f"sources neither cached nor fetchable: {capsys.readouterr().err}")
    lines = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["--nnodes"] == "2.9.1"
    assert lines["--signals_to_handle"] == "2.10.0"
    assert lines["--shutdown-timeout"] == "2.12.1"
