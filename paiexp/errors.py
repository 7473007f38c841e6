"""The one exception type for user mistakes: reported as a single line, exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (config, overrides, paths). Never shown with a traceback."""
