"""Errors the bootstrap reports to the user as one line, a failure file and an exit code."""


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
    """A peer host never became reachable."""

    exit_code = 3
