"""The one exception type for user mistakes: reported as a single line, exit code 2."""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` as one line of a terminal: every character that would break the line or act
    on the terminal (control, separator and format characters) written as its escape."""
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


class UserError(Exception):
    """Bad input from the user (config, overrides, paths). Never shown with a traceback, and
    always one line: a value quoted in it cannot break it."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class ConfigError(UserError):
    """A mistake in what the Python API was given: its message is the one line the command
    line prints for the same mistake, and nothing was submitted or tracked."""
