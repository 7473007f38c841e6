"""The one exception type for user mistakes: reported as a single line, exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (config, overrides, paths). Never shown with a traceback."""


class ConfigError(UserError):
    """A mistake in what the Python API was given: its message is the one line the command
    line prints for the same mistake, and nothing was submitted or tracked."""
