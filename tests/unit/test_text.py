"""The one policy for odd text and odd signals (container_entry.common.text,
container_entry.common.exits), enumerated over each class rather than shown on one example: every
byte that is not UTF-8, every control character and line break, unpaired surrogates; every signal
number the kernel has."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from container_entry.common.exits import (
    of_returncode,
    signal_name,
    signal_number,
    stopped_exit_code,
)
from container_entry.common.records import read_json, write_json
from container_entry.common.text import encoded, escaped, printable, quoted
from container_entry.diagnose.failure import describe_exit
from container_entry.supervise.ending import Verdict
from container_entry.supervise.outcome import Outcome

# a name holding each: a byte that is not UTF-8 (os.fsdecode's surrogateescape), each control
# character and line break str.splitlines knows, an unpaired surrogate from JSON ("\ud800")
UNDECODABLE = [f"donn{chr(0xDC00 + byte)}es" for byte in range(0x80, 0x100)]
CONTROL = [f"a{chr(code)}b" for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)]
SURROGATES = ["x\ud800y", "x\udbffy", "x\udc00y", "x\udfffy"]
ODD = UNDECODABLE + CONTROL + SURROGATES


def test_rendering_of_the_usual_suspects():
    assert escaped(os.fsdecode(b"donn\xe9es.csv")) == "donn\\xe9es.csv"
    assert quoted(os.fsdecode(b"\xff\xfe.bin")) == "'\\xff\\xfe.bin'"
    assert (
        escaped("line\nbreak\r\tand \x1b[31mred\x7f") == "line\\nbreak\\r\\tand \\x1b[31mred\\x7f"
    )
    assert escaped("x\ud800y \u2028") == "x\\ud800y \\u2028"
    assert escaped("café ☃ 日本") == "café ☃ 日本"  # text that is fine stays as it is
    assert printable("fine") == "fine" and printable(os.fsdecode(b"\xe9")) == "\\xe9"
    assert encoded(os.fsdecode(b"a\xe9")) == b"a\\xe9"


@pytest.mark.parametrize("name", ODD, ids=[ascii(name) for name in ODD])
def test_every_odd_name_is_one_line_of_valid_utf8_in_every_writer(tmp_path, name):
    """The failure file, failure.json, a record, console and log bytes: written, valid UTF-8;
    in a message the name never breaks its line."""
    assert len(escaped(name).splitlines()) == 1
    escaped(name).encode("utf-8")
    encoded(name).decode("utf-8")
    printable(name).encode("utf-8")

    outcome = Outcome(tmp_path)
    failed = Verdict(2, f"entry script {quoted(name)} not found", [f"  raw {name}"])
    outcome.write(failed, {"why": name})
    failure = (tmp_path / "output" / "failure").read_bytes().decode("utf-8")
    assert failure.startswith(f"entry script {quoted(name)} not found\n")
    record = json.loads(outcome.record_path.read_bytes().decode("utf-8"))
    assert record == {"why": name}

    write_json(tmp_path / "rank-0.json", {"log": name})
    assert read_json(tmp_path / "rank-0.json") == {"log": name}  # JSON escapes: round trip


def test_the_bootstraps_own_output_is_valid_utf8_whatever_it_names():
    """stdout and stderr of `container-entry` (cli._safe_output): a strict UTF-8 locale's
    stdout once raised UnicodeEncodeError on a surrogate; now `\\xNN`."""
    code = (
        "import os\n"
        "from container_entry import cli\n"
        "cli._safe_output()\n"
        "from container_entry.common.logs import log\n"
        "name = os.fsdecode(b'donn\\xe9es') + '\\ud800'\n"
        "log(name)\n"
        "print(name, flush=True)\n"
    )
    env = {**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=env, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"donn\\xe9es\\ud800\n"
    assert result.stderr == b"[container-entry] donn\\xe9es\\ud800\n"


RTMIN, RTMAX = int(signal.SIGRTMIN), int(signal.SIGRTMAX)


@pytest.mark.parametrize("number", range(1, RTMAX + 1))
def test_every_signal_number_is_named_as_kill_l_names_it_and_exits_128_plus_n(number):
    name = signal_name(number)
    assert signal_number(name) == number
    assert describe_exit(-number) == f"signal {name}"
    assert of_returncode(-number) == 128 + number
    shell = subprocess.run(
        ["bash", "-c", f"kill -l {number}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if shell:  # bash names every signal but glibc's reserved 32 and 33
        assert name == f"SIG{shell}"
    else:
        assert name == f"SIG{number}"


def test_real_time_signals_by_name():
    assert signal_name(RTMIN + 2) == "SIGRTMIN+2" and signal_number("SIGRTMIN+2") == RTMIN + 2
    assert signal_name(RTMAX - 1) == "SIGRTMAX-1" and signal_name(RTMAX) == "SIGRTMAX"
    assert describe_exit(-(RTMIN + 2)) == "signal SIGRTMIN+2"
    assert of_returncode(-(RTMIN + 2)) == 128 + RTMIN + 2  # 164 with glibc
    assert signal_number("SIGNOPE") is None and signal_name(200) == "SIG200"


def test_a_stopped_job_exits_as_its_signal_would():
    assert stopped_exit_code("SIGTERM") == 143
    assert stopped_exit_code("SIGINT") == 130
    assert stopped_exit_code("SIGHUP") == 129
    assert stopped_exit_code(None) == 143
