"""The suite's own parallel layout (tests/conftest.py): under `make test`'s `--dist loadgroup`,
the tests of a module that share something run on one worker. The groups must be marked before
pytest-xdist reads them: marked after (a conftest hook runs after the worker's own unless it
asks to go first), they were silently ignored, and every worker built the module fixtures
again (the GPU check's 45 s self-test on each of 4 workers, each docker module's cluster)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# a cheap module with a module-scoped fixture (`installed`) shared by two of its tests
MODULE = "tests/compat/test_torch_launchers.py"
SHARING = (
    "test_isolated_parser_equals_the_installed_one",
    "test_cached_sources_are_the_installed_ones",
)


def test_a_module_s_tests_that_share_a_module_fixture_run_on_one_worker(tmp_path):
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v"),
            *("-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), MODULE),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", done.stdout, re.MULTILINE)
    sharing = [
        (worker, nodeid) for worker, nodeid in ran if nodeid.split("::")[1].startswith(SHARING)
    ]
    assert len(sharing) == len(SHARING), done.stdout[-3000:]
    assert all(nodeid.endswith(f"@{MODULE}") for _, nodeid in sharing), sharing
    assert len({worker for worker, _ in sharing}) == 1, sharing


def test_each_module_is_spread_over_the_run_and_a_grouped_module_is_one_block_first():
    """`make test`'s order (tests/conftest.py `interleaved`): the tests that wait sit in a few
    modules, so in file order, and in turns once the short modules had run out, they ran side
    by side and left the CPUs idle. The k-th of a module's n tests goes at (k + 0.5) / n."""
    from tests.conftest import interleaved

    items = ["a1", "a2", "a3", "g1", "g2", "b1", "c1", "c2"]
    order = interleaved(items, lambda item: Path(item[0]), {Path("g")})  # type: ignore[arg-type]
    # a at 1/6, 3/6, 5/6; b at 1/2; c at 1/4, 3/4; a tie goes to the module seen first
    assert order == ["g1", "g2", "a1", "c1", "a2", "b1", "c2", "a3"]
