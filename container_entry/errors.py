"""Errors the bootstrap reports to the user as one line, a failure file and an exit code."""

import signal

STOPPED_EXIT_CODE = 128 + signal.SIGTERM  # 143: the shell's code for a SIGTERM'd process


class BootstrapError(Exception):
    """A problem the user can fix (bad input, missing script...): reported in one line.

    `exit_code` is what the container exits with; 2 follows the convention for usage errors so a
    configuration problem is never confused with a worker's own exit code.
    """

    exit_code = 2


class ConfigError(BootstrapError):
    """A configuration file or value is malformed or inconsistent."""


class CodeError(BootstrapError):
    """The user's code cannot be found, fetched or prepared."""


class NetworkError(BootstrapError):
    """A peer host never became reachable, never joined, or a port is taken."""

    exit_code = 3


class DeviceError(BootstrapError):
    """This host's GPUs are not usable as counted (driver, runtime, visibility)."""

    exit_code = 4


class StopRequested(BootstrapError):
    """SIGTERM/SIGINT/SIGHUP before the workers started: exit as a stopped job."""

    exit_code = STOPPED_EXIT_CODE
