"""The rules for reading text that several modules share (container_entry/common/text.py): a value
that may be JSON, and whether a message already names a host."""

import pytest

from container_entry.common.text import json_or_raw, names_host


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ('"bert"', "bert"),  # SDK v2 framework estimators JSON-encode each value
        ("3", 3),
        ("true", True),
        ('{"a": [1]}', {"a": [1]}),
        ("True", "True"),  # the generic Estimator's str(): not JSON, kept as sent
        ("bert", "bert"),
        ("", ""),
        ('"\\"sk-x\\""', '"sk-x"'),  # JSON once more inside: decoded once only
    ],
)
def test_json_or_raw(raw, value):
    assert json_or_raw(raw) == value


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("algo-1: lost its network", True),
        ("the master algo-1 went away", True),
        ("no answer from algo-1.", True),  # the end of a sentence
        ("algo-10 went away", False),
        ("algo-1-b went away", False),
        ("x.algo-1 went away", False),
        ("myalgo-1 went away", False),
    ],
)
def test_names_host_as_a_word(text, named):
    assert names_host(text, "algo-1") is named


def test_names_host_takes_the_name_literally():
    assert names_host("on ip-10-0-0-1.ec2 (internal)", "ip-10-0-0-1.ec2")
    assert not names_host("on ip-10-0-0-1Xec2", "ip-10-0-0-1.ec2")  # '.' is not a wildcard
