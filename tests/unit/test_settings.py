"""Settings: one typed record; the README's table and --help come from the same table."""

import re
from pathlib import Path

import pytest

from container_entry.cli import usage
from container_entry.common.errors import ConfigError
from container_entry.plan import settings

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_rows() -> list[tuple[str, str, str]]:
    text = README.read_text()
    table = text[text.index("| setting | default | meaning |") :].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        name, default, meaning = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((name.strip("`"), default, meaning))
    return rows


def test_readme_table_is_the_settings_table():
    assert readme_rows() == settings.table()


def test_help_lists_every_setting():
    text = usage()
    for name, default, _ in settings.table():
        assert re.search(rf"^  {name}\s+{re.escape(default)}\s", text, re.M), name


def test_defaults_and_precedence():
    assert settings.resolve({}, {}) == settings.Settings()
    resolved = settings.resolve(
        {"CONTAINER_ENTRY_MASTER_PORT": "2222"}, {"master_port": "1111", "max_restarts": 3}
    )
    assert (resolved.master_port, resolved.max_restarts) == (2222, 3)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("JOIN_TIMEOUT", "nan"),
        ("JOIN_TIMEOUT", "inf"),
        ("HOST_WAIT_TIMEOUT", "-1"),
        ("STOP_GRACE_PERIOD", "0"),
        ("FAILURE_GRACE_PERIOD", "1e400"),
        ("MASTER_PORT", "65535"),
        ("MASTER_PORT", "0"),
        ("MAX_RESTARTS", "-1"),
        ("MAX_RESTARTS", "1.5"),
        ("INSTALL_REQUIREMENTS", "maybe"),
        ("PREFLIGHT", "sometimes"),
        ("CONSOLE_RANKS", "0,x"),
        ("CONSOLE_RANKS", ""),
        ("STRAGGLER_INTERVAL", "0.01"),
        ("STRAGGLER_INTERVAL", "-5"),
        ("STRAGGLER_INTERVAL", "nan"),
        ("STRAGGLER_INTERVAL", ""),
    ],
)
def test_bad_values_are_one_line_naming_the_variable(name, raw):
    with pytest.raises(ConfigError, match=f"CONTAINER_ENTRY_{name}="):
        settings.resolve({f"CONTAINER_ENTRY_{name}": raw}, {})


def test_booleans_from_hyperparameters_decode():
    assert settings.resolve({}, {"install_requirements": False}).install_requirements is False
    assert settings.resolve({}, {"dry_run": "true"}).dry_run is True
