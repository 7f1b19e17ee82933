"""The bootstrap's own lines: one prefix per line, secrets masked, stderr only."""

from __future__ import annotations

import pytest

from container_entry.common import logs


@pytest.fixture(autouse=True)
def fresh_masker(monkeypatch):
    monkeypatch.setattr(logs, "MASKER", type(logs.MASKER)())


def test_every_line_of_a_message_gets_the_prefix_on_stderr(capsys):
    logs.log("plan\nhosts 2\n")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "[container-entry] plan\n[container-entry] hosts 2\n"
    logs.log("")
    assert capsys.readouterr().err == "[container-entry] \n"


def test_a_registered_secret_never_appears_in_a_line_or_a_redacted_text(capsys):
    logs.register_secrets(["hf_abcdefghijkl"])
    logs.log("token hf_abcdefghijkl rejected\nagain: hf_abcdefghijkl")
    err = capsys.readouterr().err
    assert "hf_abcdefghijkl" not in err and err.count("****") == 2
    assert logs.masked_text("x=hf_abcdefghijkl") == "x=****"
