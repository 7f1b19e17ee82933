"""The preflight in the script's own Python (issue 27): a script sees nothing of it. The same probe
runs with the preflight off (`python -u script.py`, as before) and on (the preflight, then the
script, in one interpreter), on real torchrun with 2 gloo ranks (1 for a script that fails before
any collective); everything it can observe of how it was started must match: `__main__` and its
attributes, sys.argv, sys.path, sys.flags, pickling and multiprocessing's spawn of a function of
`__main__`, a DataLoader with workers, a process group of its own after the preflight's, signal
handlers, warnings filters. So must an uncaught exception (its traceback, the failure file), a
SyntaxError and a script that cannot be opened. The HF Trainer and Accelerate run with the preflight
on in the 2-host tests (tests/integration/test_bootstrap.py, tests/docker)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.integration.conftest import REPO, bootstrap_argv, bootstrap_env, make_tree, run

MAIN_PROBE = REPO / "tests" / "scripts" / "main_probe.py"


def _job(root, preflight: bool, args=(), script=MAIN_PROBE, ranks=2, **env):
    tree = make_tree(root, script=script)
    hps = {"sagemaker_program": json.dumps(script.name)}
    hps.update({f"arg{i}": json.dumps(a) for i, a in enumerate(args)})
    (tree.base / "input/config/hyperparameters.json").write_text(json.dumps(hps))
    environment = bootstrap_env(
        tree,
        PET_NPROC_PER_NODE=str(ranks),
        CONTAINER_ENTRY_PREFLIGHT="true" if preflight else "false",
        **env,
    )
    return tree, run(bootstrap_argv(), environment, timeout=300)


def _facts(result, tree) -> dict[int, dict]:
    found = {}
    for rank in (0, 1):
        log = (tree.output / "data" / "container-entry" / "logs" / f"rank-{rank}.log").read_text()
        lines = [line for line in log.splitlines() if line.startswith("facts: ")]
        assert len(lines) == 1, log[-3000:] + result.stderr[-3000:]
        found[rank] = json.loads(lines[0].removeprefix("facts: "))
    return found


def _comparable(facts: dict, tree) -> dict:
    """The tree's own paths differ between the two runs: written relative to it."""
    text = json.dumps(facts).replace(str(tree.base), "<ml>")
    return json.loads(text)


def test_a_script_sees_the_same_start_with_the_preflight_in_its_python_or_not(tmp_path):
    off_tree, off = _job(tmp_path / "off", preflight=False, args=("x y",))
    assert off.returncode == 0, off.stderr[-3000:]
    on_tree, on = _job(tmp_path / "on", preflight=True, args=("x y",))
    assert on.returncode == 0, on.stderr[-3000:]
    assert "preflight ok on algo-1" in on.stdout + on.stderr
    before, after = _facts(off, off_tree), _facts(on, on_tree)
    for rank in (0, 1):
        # one Python for the preflight and the script: its command line is the runner's
        assert "preflight_then_script.py" in " ".join(after[rank].pop("cmdline"))
        assert after[rank].pop("preflight_ran_here") is True
        assert "preflight_then_script.py" not in " ".join(before[rank].pop("cmdline"))
        assert before[rank].pop("preflight_ran_here") is False
        plain, checked = _comparable(before[rank], off_tree), _comparable(after[rank], on_tree)
        differ = {k: (plain[k], checked.get(k)) for k in plain if plain[k] != checked.get(k)}
        assert checked == plain, differ
        assert plain["main_is_this"] and plain["spawned"] == 9 and plain["pickled"] == 16
        assert plain["all_reduce"] == 2.0 and not plain["initialized_at_start"]
        assert plain["argv"][1:] == ["--arg0", "x y"], plain["argv"]


@pytest.mark.parametrize("case", ["exception", "syntax-error"])
def test_a_script_that_fails_fails_the_same_with_the_preflight_in_its_python(tmp_path, case):
    """The failure file's first line and the rank's record are the same; the traceback is the
    script's own (no frame of ours). One rank: the script fails before any collective, and
    what is compared is that rank's own failure, record and log."""
    script = tmp_path / "broken.py"
    if case == "exception":
        shutil.copy(MAIN_PROBE, script)
        args = ("--die",)
    else:
        script.write_text("def f(:\n    pass\n")
        args = ()
    results = {}
    for preflight in (False, True):
        where = tmp_path / ("on" if preflight else "off")
        tree, result = _job(where, preflight, args=args, script=script, ranks=1)
        assert result.returncode != 0, result.stderr[-3000:]
        failure = (tree.output / "failure").read_text().replace(str(tree.base), "<ml>")
        record = json.loads((tree.output / "data/container-entry/rank-0.json").read_text())
        log = (tree.output / "data/container-entry/logs/rank-0.log").read_text()
        first = failure.splitlines()[0]
        results[preflight] = (result.returncode, first, record, log)
    (code_off, first_off, record_off, log_off), (code_on, first_on, record_on, log_on) = (
        results[False],
        results[True],
    )
    assert (code_on, first_on) == (code_off, first_off)
    assert record_on["exception"] == record_off["exception"]
    assert record_on["stage"] is None and record_off["stage"] is None
    assert "preflight_then_script" not in log_on and "container_entry" not in log_on
    if case == "exception":
        assert record_on["exception"] == {"type": "ValueError", "message": "planted in evaluate"}
        assert 'File "' in log_on and "in evaluate" in log_on
        traceback_on = log_on[log_on.index("Traceback") :]
        traceback_off = log_off[log_off.index("Traceback") :]
        assert traceback_on.replace(str(tmp_path / "on"), "") == traceback_off.replace(
            str(tmp_path / "off"), ""
        )


SCRIPTS = {
    "facts": (
        "import sys, pickle\n"
        "def f(): return 1\n"
        "print(sorted(globals()), __name__, __file__, __spec__, __package__, __cached__)\n"
        "print(type(__loader__).__name__, __loader__.name, __loader__.path)\n"
        "print(sys.argv, sys.path[0], sys.modules['__main__'].__dict__ is globals())\n"
        "print(pickle.loads(pickle.dumps(f))(), __doc__, __annotations__)\n"
    ),
    "docstring-and-annotations": '"""doc"""\nx: int = 1\nprint(__doc__, __annotations__)\n',
    "exception": "def g():\n    raise KeyError('k')\ng()\n",
    "exception-chained": (
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise ValueError('v') from e\n"
    ),
    "exit-code": "import sys\nsys.exit(3)\n",
    "exit-message": "raise SystemExit('bye')\n",
    "keyboard-interrupt": (
        "import atexit\natexit.register(print, 'at exit')\nraise KeyboardInterrupt\n"
    ),
    "syntax-error": "def f(:\n    pass\n",
    "latin-1": b"# -*- coding: latin-1 -*-\nprint('caf\xe9')\n",
    "bom": b"\xef\xbb\xbfprint('bom')\n",
    "atexit": "import atexit\natexit.register(print, 'bye')\nprint('hi')\n",
    "multiprocessing-spawn": (
        "import multiprocessing as mp\n"
        "def sq(x): return x * x\n"
        "if __name__ == '__main__':\n"
        "    with mp.get_context('spawn').Pool(1) as p: print(p.apply(sq, (5,)))\n"
    ),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("how", ["plain", "relative", "symlink", "odd-name"])
def test_run_as_main_is_python_running_the_script(tmp_path, name, how):
    """`run_as_main` against `python -u SCRIPT`: the same stdout, stderr and exit status for
    scripts that inspect their start, fail in each way Python reports, or are encoded oddly;
    named relative to the working folder, reached through a symlink, or by a name that is not
    UTF-8."""
    import os
    import subprocess
    import sys

    body = SCRIPTS[name]
    folder = tmp_path / "code"
    folder.mkdir()
    filename = os.fsdecode(b"caf\xe9 script.py") if how == "odd-name" else "script.py"
    script = folder / filename
    script.write_bytes(body if isinstance(body, bytes) else body.encode())
    if how == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "link.py").symlink_to(script)
        script = elsewhere / "link.py"
    runner = (
        "import sys; from container_entry.rank.preflight_then_script import run_as_main; "
        "run_as_main(sys.argv[1:])"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    results = []
    named = os.path.relpath(script, tmp_path) if how == "relative" else str(script)
    for argv in (
        [sys.executable, "-u", named, "a b"],
        [sys.executable, "-u", "-c", runner, named, "a b"],
    ):
        done = subprocess.run(argv, capture_output=True, cwd=tmp_path, env=env, timeout=60)
        results.append((done.returncode, done.stdout, done.stderr))
    assert results[1] == results[0]


def test_a_script_that_sets_what_cuda_or_nccl_read_at_start_keeps_its_own_preflight(tmp_path):
    """The probe, with one line that names NCCL_DEBUG: the preflight runs in a Python of its
    own (NCCL reads its variables once per process), and the script in a fresh one."""
    script = tmp_path / "nccl_probe.py"
    script.write_text(
        'import os\nos.environ.setdefault("NCCL_DEBUG", "WARN")\n' + MAIN_PROBE.read_text()
    )
    tree, result = _job(tmp_path / "on", preflight=True, script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preflight ok on algo-1" in result.stdout + result.stderr
    for facts in _facts(result, tree).values():
        assert "preflight_then_script.py" not in " ".join(facts["cmdline"])
        assert facts["preflight_ran_here"] is False
