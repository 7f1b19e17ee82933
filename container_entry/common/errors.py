"""Errors the bootstrap reports to the user as one line, a failure file and an exit code."""

from __future__ import annotations

from container_entry.common.exits import ExitCode, stopped_exit_code


class BootstrapError(Exception):
    """A problem the user can fix (bad input, missing script...): reported in one line.

    `exit_code` is what the container exits with; 2 follows the convention for usage errors so a
    configuration problem is never confused with a worker's own exit code.
    """

    exit_code: int = ExitCode.BAD_INPUT


class ConfigError(BootstrapError):
    """A configuration file or value is malformed or inconsistent."""


class CodeError(BootstrapError):
    """The user's code cannot be found, fetched or prepared."""


class NetworkError(BootstrapError):
    """A peer host never became reachable, never joined, or a port is taken."""

    exit_code: int = ExitCode.NETWORK


class DeviceError(BootstrapError):
    """This host's GPUs are not usable as counted (driver, runtime, visibility)."""

    exit_code: int = ExitCode.DEVICE


class StopRequested(BootstrapError):
    """SIGTERM/SIGINT/SIGHUP before the workers started: exit as a stopped job (128+N)."""

    exit_code = stopped_exit_code("SIGTERM")

    def __init__(self, message: str, signal_name: str = "SIGTERM") -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = stopped_exit_code(signal_name)
